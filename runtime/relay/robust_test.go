package relay

import (
	"context"
	"database/sql"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/outboxgen/outboxgen/runtime/dialect"
	"github.com/outboxgen/outboxgen/runtime/driver"
)

// A broker outage longer than the backoff schedule: with MaxAttempts 2 and
// a millisecond backoff, charging every failed publish would turn the
// backlog FAILED within two polls. The circuit breaker charges nothing;
// after recovery everything drains, in order per key.
func TestBreakerOutage(t *testing.T) {
	forEachDialect(t, func(t *testing.T, db *sql.DB, d dialect.Dialect, drv driver.Driver) {
		pub := newRecPub(t)
		var evs []ev
		for _, k := range keys("k", 20) {
			evs = append(evs, ev{Key: k}, ev{Key: k}, ev{Key: k})
		}
		ins := insertEvents(t, db, d, evs...)
		const outage = 60 // failed attempts before the broker comes back
		var mu sync.Mutex
		failed := 0
		pub.setFail(func(*message.Message) error {
			mu.Lock()
			defer mu.Unlock()
			if failed < outage {
				failed++
				return errBrokerDown
			}
			return nil
		})
		opts := testOptions(pub, "outage")
		h := &errLog{info: true}
		opts.Logger = slog.New(h)
		opts.MaxAttempts = 2
		opts.BatchSize = 25
		r := mustRelay(t, drv, opts)
		stop := runRelay(t, r)
		waitFor(t, "backlog drained", func() bool {
			if n := count(t, db, "status = 2"); n > 0 {
				t.Fatalf("%d rows FAILED during the outage", n)
			}
			return count(t, db, "status = 1") == len(ins)
		})
		stop()
		if got := count(t, db, "retry_count > 0 OR status = 2"); got != 0 {
			t.Fatalf("%d rows charged or FAILED by the outage", got)
		}
		if got := pub.totalAttempts(); got < outage+len(ins) {
			t.Fatalf("%d attempts, want at least %d", got, outage+len(ins))
		}
		checkKeyOrder(t, pub, ins)
		if !h.has("circuit breaker open") || !h.has("circuit breaker closed") {
			t.Fatalf("breaker state changes not logged: %v", h.msgs)
		}
	})
}

// A publish that never returns, even when its context is cancelled, does
// not hold Run past ShutdownTimeout: it is abandoned, its row stays leased
// (nothing records it, even after it returns), the rest is recorded.
func TestShutdownAbandonsHungPublish(t *testing.T) {
	forEachDialect(t, func(t *testing.T, db *sql.DB, d dialect.Dialect, drv driver.Driver) {
		pub := newRecPub(t)
		ins := insertEvents(t, db, d, ev{Key: "a"}, ev{Key: "a"}, ev{Key: "b"})
		started := make(chan struct{})
		unblock := make(chan struct{})
		pub.setFail(func(m *message.Message) error {
			if m.UUID == ins[0].ID {
				close(started)
				<-unblock // a broker client ignoring the message context
			}
			return nil
		})
		opts := testOptions(pub, "hung")
		opts.Concurrency = 2
		opts.ShutdownTimeout = 300 * time.Millisecond
		r := mustRelay(t, drv, opts)
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- r.Run(ctx) }()
		<-started
		waitFor(t, "the other key published", func() bool { return pub.successCount()[ins[2].ID] == 1 })
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Fatal(err)
			}
		case <-time.After(30 * time.Second): // a hang guard, not a timing
			close(unblock)
			t.Fatal("Run did not return while a publish hung")
		}
		close(unblock)
		waitFor(t, "the hung publish returned", func() bool { return pub.successCount()[ins[0].ID] == 1 })
		if s := state(t, db, d, ins[0].ID); s.Status != 0 || s.RetryCount != 0 || s.LeaseOwner.String != "hung" {
			t.Fatalf("abandoned row: %+v, want pending, still leased to the relay", s)
		}
		if s := state(t, db, d, ins[1].ID); s.Status != 0 || s.RetryCount != 0 || s.LeaseOwner.Valid || pub.attemptsOf(ins[1].ID) != 0 {
			t.Fatalf("row behind the abandoned one: %+v, want released untouched", s)
		}
		if s := state(t, db, d, ins[2].ID); s.Status != 1 {
			t.Fatalf("finished publish: %+v, want recorded sent", s)
		}
	})
}

// A Relay runs one loop at a time: Run or RunOnce while another runs
// returns ErrRunning.
func TestAlreadyRunning(t *testing.T) {
	forEachDialect(t, func(t *testing.T, db *sql.DB, d dialect.Dialect, drv driver.Driver) {
		ctx := context.Background()
		pub := newRecPub(t)
		started := make(chan struct{})
		unblock := make(chan struct{})
		var once sync.Once
		pub.setFail(func(*message.Message) error {
			once.Do(func() { close(started) })
			<-unblock
			return nil
		})
		insertEvents(t, db, d, ev{Key: "w"})
		r := mustRelay(t, drv, testOptions(pub, "single"))
		stop := runRelay(t, r)
		<-started // Run is inside a cycle
		if _, err := r.RunOnce(ctx); !errors.Is(err, ErrRunning) {
			t.Fatalf("RunOnce during Run = %v, want ErrRunning", err)
		}
		if err := r.Run(ctx); !errors.Is(err, ErrRunning) || !strings.Contains(err.Error(), "already running") {
			t.Fatalf("second Run = %v, want ErrRunning", err)
		}
		close(unblock)
		waitFor(t, "the event published", func() bool { return count(t, db, "status = 1") == 1 })
		stop()
		insertEvents(t, db, d, ev{Key: "x"})
		if n, err := r.RunOnce(ctx); err != nil || n != 1 {
			t.Fatalf("RunOnce after Run returned = %d, %v", n, err)
		}
	})
}

func (h *errLog) has(sub string) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, m := range h.msgs {
		if strings.Contains(m, sub) {
			return true
		}
	}
	return false
}
