package relay

import (
	"context"
	"database/sql"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/outboxgen/outboxgen/runtime/dialect"
	"github.com/outboxgen/outboxgen/runtime/driver"
)

// A publish that hangs holds back its own key only: with one slot
// (Concurrency 1) and batches of 10, every other key is claimed, published
// and recorded sent while it hangs, and the hung key's later rows wait
// for it; then the key goes out in order.
func TestSlowPublishHoldsBackOnlyItsKey(t *testing.T) {
	forEachDialect(t, func(t *testing.T, db *sql.DB, d dialect.Dialect, drv driver.Driver) {
		var evs []ev
		for i := range 4 {
			for k := range 50 {
				evs = append(evs, ev{Key: fmt.Sprintf("k%02d", k)})
			}
			if i < 3 {
				evs = append(evs, ev{Key: "slow"})
			}
		}
		ins := insertEvents(t, db, d, evs...)
		var slow []string
		for _, e := range ins {
			if e.Key == "slow" {
				slow = append(slow, e.ID)
			}
		}
		pub := newRecPub(t)
		unblock := make(chan struct{})
		var once sync.Once
		t.Cleanup(func() { once.Do(func() { close(unblock) }) })
		pub.setFail(func(m *message.Message) error {
			if m.UUID == slow[0] {
				<-unblock // far longer than SlowPublish
			}
			return nil
		})
		opts := testOptions(pub, "pipe")
		opts.Concurrency = 1
		opts.BatchSize = 10
		opts.MaxInFlight = 40
		failOnPollErrors(t, &opts)
		stop := runRelay(t, mustRelay(t, drv, opts))
		others := len(ins) - len(slow)
		waitFor(t, "every other key sent while the slow publish hangs", func() bool {
			return count(t, db, "status = 1") == others
		})
		for _, id := range slow[1:] {
			if n := pub.attemptsOf(id); n != 0 {
				t.Fatalf("row %s of the slow key published %d times before its head", id, n)
			}
		}
		if s := state(t, db, d, slow[0]); s.Status != 0 || s.LeaseOwner.String != "pipe" {
			t.Fatalf("hung head: %+v, want pending and leased while it publishes", s)
		}
		once.Do(func() { close(unblock) })
		waitFor(t, "all sent", func() bool { return count(t, db, "status = 1") == len(ins) })
		stop()
		byKey := map[string][]string{}
		for _, e := range ins {
			byKey[e.Key] = append(byKey[e.Key], e.ID)
		}
		got := pub.firstOrderByKey()
		for k, want := range byKey {
			if !slices.Equal(got[k], want) {
				t.Fatalf("key %s published in order %v, want %v", k, got[k], want)
			}
		}
	})
}

// While a publish outlasts the lease several times over, the heartbeat
// keeps its row (and the rows published and waiting to be recorded)
// leased: a second relay never publishes them, and nothing is published
// twice.
func TestHeartbeatCoversRowsInFlight(t *testing.T) {
	forEachDialect(t, func(t *testing.T, db *sql.DB, d dialect.Dialect, drv driver.Driver) {
		var evs []ev
		for k := range 30 {
			evs = append(evs, ev{Key: fmt.Sprintf("k%d", k)}, ev{Key: fmt.Sprintf("k%d", k)})
		}
		ins := insertEvents(t, db, d, evs...)
		pub := newRecPub(t)
		pub.setFail(func(m *message.Message) error {
			if m.UUID == ins[0].ID {
				time.Sleep(2500 * time.Millisecond) // the lease is 900 ms
			}
			return nil
		})
		mk := func(id string) *Relay {
			opts := testOptions(pub, id)
			opts.LeaseDuration = 900 * time.Millisecond
			opts.ShutdownTimeout = 300 * time.Millisecond
			opts.BatchSize = 8
			failOnPollErrors(t, &opts)
			return mustRelay(t, drv, opts)
		}
		stopA := runRelay(t, mk("a"))
		waitFor(t, "the slow publish started", func() bool { return pub.attemptsOf(ins[0].ID) == 1 })
		stopB := runRelay(t, mk("b"))
		waitFor(t, "all sent", func() bool { return count(t, db, "status = 1") == len(ins) })
		stopA()
		stopB()
		for _, e := range ins {
			if n := pub.attemptsOf(e.ID); n != 1 {
				t.Fatalf("event %s (key %s) published %d times, want once", e.ID, e.Key, n)
			}
		}
	})
}

// recordCounter counts how the relay records results.
type recordCounter struct {
	driver.Driver
	mu                                sync.Mutex
	claims, claimsWithRecord, records int
	markSent, markRetry, release      int
}

func (c *recordCounter) Claim(ctx context.Context, p driver.ClaimParams) ([]driver.Row, error) {
	c.mu.Lock()
	c.claims++
	if !p.Record.Empty() {
		c.claimsWithRecord++
	}
	c.mu.Unlock()
	return c.Driver.Claim(ctx, p)
}

func (c *recordCounter) Record(ctx context.Context, owner string, r driver.Results) (driver.Recorded, error) {
	c.mu.Lock()
	c.records++
	c.mu.Unlock()
	return c.Driver.Record(ctx, owner, r)
}

func (c *recordCounter) MarkSent(ctx context.Context, owner string, ids []int64) (int64, error) {
	c.mu.Lock()
	c.markSent++
	c.mu.Unlock()
	return c.Driver.MarkSent(ctx, owner, ids)
}

func (c *recordCounter) MarkRetry(ctx context.Context, owner string, fs []driver.Failure, maxAttempts int) (int64, []int64, error) {
	c.mu.Lock()
	c.markRetry++
	c.mu.Unlock()
	return c.Driver.MarkRetry(ctx, owner, fs, maxAttempts)
}

func (c *recordCounter) Release(ctx context.Context, owner string, ids []int64) (int64, error) {
	c.mu.Lock()
	c.release++
	c.mu.Unlock()
	return c.Driver.Release(ctx, owner, ids)
}

// Draining a backlog, the relay records each batch's results with a later
// claim (one transaction) rather than with statements of their own.
func TestResultsRecordedWithNextClaim(t *testing.T) {
	forEachDialect(t, func(t *testing.T, db *sql.DB, d dialect.Dialect, drv driver.Driver) {
		var evs []ev
		for i := range 600 {
			evs = append(evs, ev{Key: fmt.Sprintf("k%d", i%60)})
		}
		ins := insertEvents(t, db, d, evs...)
		cd := &recordCounter{Driver: drv}
		pub := newRecPub(t)
		opts := testOptions(pub, "rec")
		failOnPollErrors(t, &opts)
		n, err := mustRelay(t, cd, opts).RunOnce(context.Background())
		if err != nil || n != len(ins) {
			t.Fatalf("RunOnce = %d, %v; want %d", n, err, len(ins))
		}
		if c := count(t, db, "status = 1"); c != len(ins) {
			t.Fatalf("%d rows sent, want %d", c, len(ins))
		}
		cd.mu.Lock()
		defer cd.mu.Unlock()
		if cd.markSent+cd.markRetry+cd.release != 0 || cd.claimsWithRecord == 0 {
			t.Fatalf("claims %d (with results %d), records alone %d, MarkSent %d, MarkRetry %d, Release %d: want results recorded with claims",
				cd.claims, cd.claimsWithRecord, cd.records, cd.markSent, cd.markRetry, cd.release)
		}
		t.Logf("claims %d (with results %d), records alone %d", cd.claims, cd.claimsWithRecord, cd.records)
	})
}
