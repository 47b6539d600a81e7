package relay

// TestPollingRelayStress (review helper-104): a randomized stress of the
// polling relay on every dialect: three relays with parallel claims and
// short leases, one of them restarted mid-batch now and then; transient
// and permanent broker failures; slow publishes (long enough for
// PostgreSQL's holds behind slow rows, and for leases to lapse); an
// operator requeuing FAILED rows; unordered events mixed into ordered
// keys; writers committing while the relays run. Checked: every
// committed event is sent in the end, and per key the first successful
// publishes of its ordered events come in id order. Up to about 80 s for the
// four dialects, so `go test -short` (make test) skips it; run it with
//
//	go test ./runtime/relay -run TestPollingRelayStress -timeout 10m
//
// (OUTBOXGEN_STRESS_LOG=1 prints the relays' warnings).

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/outboxgen/outboxgen/runtime/dialect"
	"github.com/outboxgen/outboxgen/runtime/driver"
	"github.com/outboxgen/outboxgen/runtime/outbox"
)

func TestPollingRelayStress(t *testing.T) {
	if testing.Short() {
		t.Skip("a stress test of about 80 s: run it without -short")
	}
	forEachDialect(t, func(t *testing.T, db *sql.DB, d dialect.Dialect, drv driver.Driver) {
		pub := newRecPub(t)
		var chaos atomic.Bool
		chaos.Store(true)
		var rngMu sync.Mutex
		rng := rand.New(rand.NewPCG(104, uint64(len(d))))
		roll := func() float64 {
			rngMu.Lock()
			defer rngMu.Unlock()
			return rng.Float64()
		}
		pub.setFail(func(m *message.Message) error {
			if !chaos.Load() {
				return nil
			}
			x := roll()
			switch {
			case x < 0.04:
				time.Sleep(time.Duration(450+roll()*roll()*2600) * time.Millisecond) // slow, then ok
				return nil
			case x < 0.12:
				return errors.New("transient (injected)")
			case x < 0.125:
				return Permanent(errors.New("permanent (injected)"))
			}
			return nil
		})
		h := &errLog{}
		logger := slog.New(h)
		var stops []func()
		var newRelay0 func() *Relay // relay 0, restarted now and then
		for i := range 3 {
			opts := testOptions(pub, fmt.Sprintf("stress-%d", i))
			opts.BatchSize = 7
			opts.MaxInFlight = 28
			opts.ParallelClaims = 3
			opts.Concurrency = 4
			opts.LeaseDuration = 2 * time.Second
			opts.ShutdownTimeout = time.Second
			opts.MaxAttempts = 3
			opts.HoldRecheck = 300 * time.Millisecond
			opts.Backoff = func(int) time.Duration { return time.Duration(roll()*80) * time.Millisecond }
			opts.EventTypes = []outbox.EventType{{Name: "VIEWED", Ordered: false}}
			opts.Logger = logger
			if os.Getenv("OUTBOXGEN_STRESS_LOG") != "" {
				opts.Logger = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
			}
			mk := func() *Relay { return mustRelay(t, drv, opts) }
			if i == 0 {
				newRelay0 = mk
			}
			stops = append(stops, runRelay(t, mk()))
		}
		// Restart relay 0 now and then while the chaos lasts (a shutdown
		// mid-batch, then a new Run with the same InstanceID).
		var rsWG sync.WaitGroup
		rsWG.Add(1)
		go func() {
			defer rsWG.Done()
			for chaos.Load() {
				time.Sleep(time.Duration(300+roll()*700) * time.Millisecond)
				stops[0]()
				stops[0] = runRelay(t, newRelay0())
			}
		}()
		// The operator: requeue FAILED rows now and then.
		ctx, cancel := context.WithCancel(context.Background())
		var reqWG sync.WaitGroup
		reqWG.Add(1)
		go func() {
			defer reqWG.Done()
			for ctx.Err() == nil {
				time.Sleep(150 * time.Millisecond)
				evs, err := drv.FindEvents(ctx, driver.EventFilter{Status: int(driver.Failed), Limit: 500})
				if err != nil || len(evs) == 0 {
					continue
				}
				ids := make([]int64, len(evs))
				for i, e := range evs {
					ids[i] = e.ID
				}
				if _, err := drv.Requeue(ctx, ids); err != nil && ctx.Err() == nil {
					t.Logf("requeue: %v", err)
				}
			}
		}()
		// Writers: each owns its keys and inserts one transaction after
		// another, so per key the ids grow with commit order.
		w := outbox.MustNewWriter(d, table)
		const writers, txs = 8, 150
		var total atomic.Int64
		var wg sync.WaitGroup
		for wi := range writers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				r := rand.New(rand.NewPCG(uint64(wi), 104))
				// write inserts one transaction of 1 to 4 events.
				write := func(j int) (int, error) {
					tx, err := db.Begin()
					if err != nil {
						return 0, err
					}
					n := 1 + r.IntN(4)
					for range n {
						typ := "ORDER_PAID"
						if r.IntN(5) == 0 {
							typ = "VIEWED"
						}
						key := fmt.Sprintf("w%d-k%d", wi, r.IntN(3))
						if _, err := w.Insert(context.Background(), tx, outbox.Event{Type: typ, Topic: "orders", Key: key, Version: 1, Payload: map[string]int{"j": j}}); err != nil {
							tx.Rollback()
							return 0, err
						}
					}
					return n, tx.Commit()
				}
				for j := range txs {
					n, err := write(j)
					// SQLite refuses a deferred transaction's first write
					// at once, without waiting, when another connection
					// wrote since it began reading (SQLITE_BUSY): as an
					// application would, write it again.
					for try := 0; err != nil && d == dialect.SQLite && strings.Contains(err.Error(), "SQLITE_BUSY") && try < 50; try++ {
						time.Sleep(time.Duration(1+r.IntN(10)) * time.Millisecond)
						n, err = write(j)
					}
					if err != nil {
						t.Error(err)
						return
					}
					total.Add(int64(n))
					time.Sleep(time.Duration(r.IntN(20)) * time.Millisecond)
				}
			}()
		}
		wg.Wait()
		time.Sleep(4 * time.Second)
		chaos.Store(false)
		rsWG.Wait()
		deadline := time.Now().Add(60 * time.Second)
		for count(t, db, "status = 1") != int(total.Load()) {
			if time.Now().After(deadline) {
				var pending, failed, leased int
				pending, failed = count(t, db, "status = 0"), count(t, db, "status = 2")
				leased = count(t, db, "status = 0 AND lease_owner IS NOT NULL")
				t.Fatalf("not all sent after 60s: %d of %d sent; pending %d (with lease_owner %d), failed %d",
					count(t, db, "status = 1"), total.Load(), pending, leased, failed)
			}
			time.Sleep(50 * time.Millisecond)
		}
		cancel()
		reqWG.Wait()
		for _, s := range stops {
			s()
		}
		// Per key, ordered events: first successes in id order.
		seen := map[string]bool{}
		last := map[string]int64{}
		bad := 0
		for _, s := range pub.successes() {
			if seen[s.Msg.UUID] {
				continue
			}
			seen[s.Msg.UUID] = true
			if s.Msg.Metadata.Get(MetadataType) != "ORDER_PAID" {
				continue
			}
			k := s.Msg.Metadata.Get(MetadataKey)
			seq, _ := strconv.ParseInt(s.Msg.Metadata.Get(MetadataSequence), 10, 64)
			if seq < last[k] {
				bad++
				if bad < 10 {
					t.Errorf("key %s: row %d first published after row %d", k, seq, last[k])
				}
			}
			last[k] = max(last[k], seq)
		}
		h.mu.Lock()
		n := 0
		for _, m := range h.msgs {
			if strings.Contains(m, "relay poll failed") || strings.Contains(m, "lease lost") || strings.Contains(m, "recording") {
				n++
				if n < 10 {
					t.Logf("log: %s", m)
				}
			}
		}
		h.mu.Unlock()
		t.Logf("%s: %d events, %d publishes attempted, %d out of order, %d notable logs", d, total.Load(), pub.totalAttempts(), bad, n)
	})
}
