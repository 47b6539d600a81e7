package walrelay_test

// What stops Run rather than lose events in silence: a message this relay
// cannot read but another could, and a slot gone after streaming from it;
// and the breaker's state across a session's end.

import (
	"context"
	"errors"
	"log/slog"
	"regexp"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/outboxgen/outboxgen/internal/syncbuf"
	"github.com/outboxgen/outboxgen/internal/testdb"
	"github.com/outboxgen/outboxgen/runtime/outbox"
	"github.com/outboxgen/outboxgen/runtime/walrelay"
)

// runFor runs r until it returns by itself (within d) and returns its
// error; the test fails when it does not return.
func runFor(t *testing.T, r *walrelay.Relay, d time.Duration) error {
	t.Helper()
	return startRun(t, r)(d)
}

// startRun starts r.Run; the returned func waits up to d for Run to return
// by itself and returns its error, failing the test when it does not.
// A test that ends before it waits stops Run first.
func startRun(t *testing.T, r *walrelay.Relay) (wait func(d time.Duration) error) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	var err error
	go func() { err = r.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	return func(d time.Duration) error {
		t.Helper()
		select {
		case <-done:
			return err
		case <-time.After(d):
			cancel()
			<-done
			t.Fatalf("Run did not stop by itself within %s", d)
			return nil
		}
	}
}

var atLSN = regexp.MustCompile(`at LSN ([0-9A-F]+/[0-9A-F]+)`)

// messageLSN returns the LSN an unreadable message's error names.
func messageLSN(t *testing.T, err error) pglogrepl.LSN {
	t.Helper()
	m := atLSN.FindStringSubmatch(err.Error())
	if m == nil {
		t.Fatalf("error %q names no LSN", err)
	}
	lsn, perr := pglogrepl.ParseLSN(m[1])
	if perr != nil {
		t.Fatal(perr)
	}
	return lsn
}

// checkConfirmedBefore fails the test unless the slot confirmed a position
// (the event before the message) and stopped short of the commit of the
// message's transaction, which ends before after.
//
// The message's own LSN (at) is no bound: pgoutput gives a message the
// end of its record, and a keepalive may confirm the server's WAL end
// past it while the message's transaction has not committed. Decoding
// skips only a transaction whose commit record starts before the
// confirmed position, so anything short of the commit keeps the message;
// the restarted relay stopping at it again is what proves it.
func checkConfirmedBefore(t *testing.T, pool *pgxpool.Pool, slot string, at, after pglogrepl.LSN) {
	t.Helper()
	if c := slotConfirmed(t, pool, slot); c == 0 || c >= after {
		t.Errorf("the slot confirmed %s; want it past the event before and short of the commit of the message (at %s) that ends before %s", c, at, after)
	}
}

// slotConfirmed waits for the slot to be released and returns its
// confirmed position.
func slotConfirmed(t *testing.T, pool *pgxpool.Pool, slot string) pglogrepl.LSN {
	t.Helper()
	var s walrelay.Slot
	waitFor(t, 10*time.Second, "the slot to be released", func() bool {
		var err error
		s, err = walrelay.SlotStatus(context.Background(), pool, slot)
		if err != nil {
			t.Fatal(err)
		}
		return s.Exists && !s.Active
	})
	c, err := pglogrepl.ParseLSN(s.ConfirmedFlush)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// TestTooLargeMessageStopsBeforeIt: an event over the relay's
// MaxMessageBytes is not skipped: Run stops with an error saying what to
// raise, the slot stays before the message, a relay with the same limit
// stops at it again, and one with a higher limit publishes it and what
// follows, in order.
func TestTooLargeMessageStopsBeforeIt(t *testing.T) {
	pool := logicalPool(t)
	b := startNATS(t)
	w := walWriter(t)
	var malformed atomic.Int64
	small := func(c *walrelay.Config) {
		c.MaxMessageBytes = 600
		c.OnMalformed = func(walrelay.Malformed) { malformed.Add(1) }
	}
	r1 := newRelay(t, pool, b.pub, small)
	if err := r1.Setup(context.Background()); err != nil {
		t.Fatal(err)
	}
	write(t, pool, w, false, payload{Key: "s", N: 1})
	write(t, pool, w, false, payload{Key: "s", N: 2, Tag: strings.Repeat("x", 2000)})
	afterLarge := walInsertLSN(t, pool)
	write(t, pool, w, false, payload{Key: "s", N: 3})

	err := runFor(t, r1, 30*time.Second)
	if !errors.Is(err, outbox.ErrWALMessageTooLarge) || errors.Is(err, outbox.ErrMalformedWALMessage) {
		t.Fatalf("Run: %v; want the too-large error, not a malformed one", err)
	}
	for _, want := range []string{"was not skipped", "Config.MaxMessageBytes", "-wal-max-message-bytes", "to at least"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("the error lacks %q: %v", want, err)
		}
	}
	at := messageLSN(t, err)
	checkConfirmedBefore(t, pool, r1.Slot(), at, afterLarge)
	if st := r1.Status(); st.Malformed != 0 || malformed.Load() != 0 || st.Published != 1 {
		t.Errorf("status %+v, %d OnMalformed calls: want s/1 published and nothing malformed", st, malformed.Load())
	}

	// Read again by the next relay.
	err = runFor(t, newRelay(t, pool, b.pub, small), 30*time.Second)
	if !errors.Is(err, outbox.ErrWALMessageTooLarge) || messageLSN(t, err) != at {
		t.Fatalf("a restarted relay: %v; want it to stop at the same message, %s", err, at)
	}

	r3 := newRelay(t, pool, b.pub, nil)
	runRelay(t, r3)
	waitFor(t, 30*time.Second, "the large event and the one after it", func() bool { return distinct(b.messages(t)) >= 3 })
	checkOrder(t, b.messages(t), map[string]int{"s": 3})
	if n := settled(t, "the relay to count 2 published events", 2, func() int64 { return r3.Status().Published }); n != 2 {
		t.Errorf("the relay with the default limit published %d events, want 2 (s/1 was confirmed before the stop)", n)
	}
}

// TestNewerEnvelopeStopsBeforeIt: a message of the outbox's prefix with an
// envelope version newer than this build's may be an event of newer
// writers: Run stops before it, saying to upgrade, and a restarted relay
// stops at it again; it is not counted as malformed.
func TestNewerEnvelopeStopsBeforeIt(t *testing.T) {
	t.Run("written before the relay runs", func(t *testing.T) { testNewerEnvelope(t, false) })
	// The relay streams while the message's transaction stays open and
	// others commit: keepalives carry the server's WAL end past the
	// message before its commit, and the relay may confirm that far.
	t.Run("held open while the relay streams", func(t *testing.T) { testNewerEnvelope(t, true) })
}

func testNewerEnvelope(t *testing.T, hold bool) {
	pool := logicalPool(t)
	b := startNATS(t)
	w := walWriter(t)
	ctx := context.Background()
	var malformed atomic.Int64
	mod := func(c *walrelay.Config) { c.OnMalformed = func(walrelay.Malformed) { malformed.Add(1) } }
	r1 := newRelay(t, pool, b.pub, mod)
	if err := r1.Setup(ctx); err != nil {
		t.Fatal(err)
	}
	var wait func(time.Duration) error
	if hold {
		wait = startRun(t, r1)
		waitFor(t, 30*time.Second, "the relay to stream", func() bool { return r1.Status().Streaming })
	}
	write(t, pool, w, false, payload{Key: "v", N: 1})
	if hold {
		waitFor(t, 30*time.Second, "v/1", func() bool { return distinct(b.messages(t)) >= 1 })
	}
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	prefix := outbox.WALPrefix(testdb.Tables.Outbox)
	if _, err := tx.Exec(ctx, `SELECT pg_logical_emit_message(true, $1, decode('03', 'hex') || 'a future envelope'::bytea)`, prefix); err != nil {
		t.Fatal(err)
	}
	if hold {
		// Others commit (an xid and nothing else: no change to stream)
		// until the relay confirms a position past the message's record.
		// It must: an idle relay confirms the server's WAL end, or its
		// slot would retain the WAL of everything else written.
		pastMessage := walInsertLSN(t, pool)
		passed := false
		for deadline := time.Now().Add(10 * time.Second); !passed && time.Now().Before(deadline); {
			if _, err := pool.Exec(ctx, "SELECT txid_current()"); err != nil {
				t.Fatal(err)
			}
			time.Sleep(20 * time.Millisecond)
			passed = r1.Status().Confirmed > pastMessage
		}
		if !passed {
			t.Fatalf("the relay confirmed %s within 10 s of others' commits: want it past %s, the end of the uncommitted message's record", r1.Status().Confirmed, pastMessage)
		}
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	afterMessage := walInsertLSN(t, pool)
	write(t, pool, w, false, payload{Key: "v", N: 2})
	if !hold {
		wait = startRun(t, r1)
	}

	err = wait(30 * time.Second)
	if !errors.Is(err, outbox.ErrWALEnvelopeVersion) || !strings.Contains(err.Error(), "upgrade the relay") || !strings.Contains(err.Error(), "was not skipped") {
		t.Fatalf("Run: %v; want the envelope version error saying to upgrade", err)
	}
	at := messageLSN(t, err)
	checkConfirmedBefore(t, pool, r1.Slot(), at, afterMessage)
	err = runFor(t, newRelay(t, pool, b.pub, mod), 30*time.Second)
	if !errors.Is(err, outbox.ErrWALEnvelopeVersion) || messageLSN(t, err) != at {
		t.Fatalf("a restarted relay: %v; want it to stop at the same message, %s", err, at)
	}
	if msgs := b.messages(t); distinct(msgs) != 1 || msgs[0].N != 1 {
		t.Errorf("published %v: want v/1 only (v/2 waits behind the unread message)", msgs)
	}
	if malformed.Load() != 0 || r1.Status().Malformed != 0 {
		t.Errorf("%d OnMalformed calls, status %+v: a newer envelope is not malformed", malformed.Load(), r1.Status())
	}
}

// TestMissingSlotAfterStreamingIsFatal: the slot dropped under a relay
// that streamed from it (as after a failover to a server without it) is
// not recreated, which would hide the events lost with it: Run stops with
// the last confirmed position and what to do, logged at ERROR. A standby
// that found the slot (and could take it over) stops too. A new relay,
// which never saw it, creates the slot as before.
func TestMissingSlotAfterStreamingIsFatal(t *testing.T) {
	pool := logicalPool(t)
	b := startNATS(t)
	w := walWriter(t)
	var logs syncbuf.Buffer
	r := newRelay(t, pool, b.pub, func(c *walrelay.Config) {
		c.Logger = slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelInfo}))
	})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	waitFor(t, 30*time.Second, "the relay to stream", func() bool { return r.Status().Streaming })
	for i := 1; i <= 3; i++ {
		write(t, pool, w, false, payload{Key: "d", N: i})
	}
	waitFor(t, 30*time.Second, "3 events", func() bool { return distinct(b.messages(t)) >= 3 })
	// A standby, which never streams: it saw the slot, so it must not be
	// the one to recreate it either.
	var standbyLogs syncbuf.Buffer
	standby := newRelay(t, pool, b.pub, func(c *walrelay.Config) {
		c.InstanceID = "standby"
		c.Logger = slog.New(slog.NewTextHandler(&standbyLogs, &slog.HandlerOptions{Level: slog.LevelInfo}))
	})
	standbyDone := make(chan error, 1)
	go func() { standbyDone <- standby.Run(ctx) }()
	waitFor(t, 30*time.Second, "the standby to find the slot active", func() bool {
		return strings.Contains(standbyLogs.String(), "another instance streams from the slot: standing by")
	})

	// A DBA drops the slot: end the walsender holding it, drop it before
	// a relay takes it again.
	dropped := false
	for deadline := time.Now().Add(20 * time.Second); !dropped && time.Now().Before(deadline); {
		_, _ = pool.Exec(context.Background(), "SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots WHERE slot_name = $1 AND active_pid IS NOT NULL", r.Slot())
		_, err := pool.Exec(context.Background(), "SELECT pg_drop_replication_slot($1)", r.Slot())
		dropped = err == nil
		if !dropped {
			time.Sleep(10 * time.Millisecond)
		}
	}
	if !dropped {
		t.Fatal("could not drop the slot")
	}
	var err error
	select {
	case err = <-done:
	case <-time.After(20 * time.Second):
		s, _ := walrelay.SlotStatus(context.Background(), pool, r.Slot())
		cancel()
		<-done
		t.Fatalf("Run did not stop on the missing slot (slot now %+v); log:\n%s", s, logs.String())
	}
	last := r.Status().Confirmed
	if last == 0 || err == nil {
		t.Fatalf("Run: %v, last confirmed %s: want an error after a confirmed position", err, last)
	}
	for _, want := range []string{"replication slot " + r.Slot() + " is missing", "after LSN " + last.String(), "may not have been published", "outboxgen wal setup", "reconcile"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("the error lacks %q: %v", want, err)
		}
	}
	if l := logs.String(); !regexp.MustCompile(`level=ERROR msg="the replication slot is missing[^\n]*last_confirmed=` + regexp.QuoteMeta(last.String())).MatchString(l) {
		t.Errorf("no ERROR line with last_confirmed=%s:\n%s", last, l)
	}
	select {
	case err := <-standbyDone:
		if err == nil || !strings.Contains(err.Error(), "is missing") {
			t.Errorf("the standby's Run: %v, want the missing slot's error; its log:\n%s", err, standbyLogs.String())
		}
	case <-time.After(20 * time.Second):
		t.Errorf("the standby did not stop on the missing slot; its log:\n%s", standbyLogs.String())
	}
	if s, err := walrelay.SlotStatus(context.Background(), pool, r.Slot()); err != nil || s.Exists {
		t.Errorf("slot %+v (%v): a relay recreated it", s, err)
	}

	// A new relay (a new process) creates the slot on its first session.
	r2 := newRelay(t, pool, b.pub, nil)
	runRelay(t, r2)
	waitFor(t, 30*time.Second, "a new relay to create the slot and stream", func() bool { return r2.Status().Streaming })
}

// TestNoCreateSlot: with Config.NoCreateSlot a relay that finds no slot
// (as a new process after a failover that lost it) stops with what to do
// and creates nothing; Setup, the operator's step, creates it, and the
// relay then streams.
func TestNoCreateSlot(t *testing.T) {
	pool := logicalPool(t)
	b := startNATS(t)
	w := walWriter(t)
	noCreate := func(c *walrelay.Config) { c.NoCreateSlot = true }
	r := newRelay(t, pool, b.pub, noCreate)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	err := r.Run(ctx)
	if err == nil || ctx.Err() != nil {
		t.Fatalf("Run on a missing slot with NoCreateSlot: %v (context %v), want it to stop at once with an error", err, ctx.Err())
	}
	for _, want := range []string{"replication slot " + r.Slot() + " does not exist", "NoCreateSlot", "outboxgen wal setup", "reconcile"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("the error lacks %q: %v", want, err)
		}
	}
	if s, err := walrelay.SlotStatus(context.Background(), pool, r.Slot()); err != nil || s.Exists {
		t.Fatalf("slot %+v (%v): Run created it", s, err)
	}
	if err := newRelay(t, pool, b.pub, noCreate).Setup(ctx); err != nil {
		t.Fatalf("Setup with NoCreateSlot: %v", err)
	}
	r2 := newRelay(t, pool, b.pub, noCreate)
	runRelay(t, r2)
	waitFor(t, 30*time.Second, "the relay to stream from the slot Setup created", func() bool { return r2.Status().Streaming })
	write(t, pool, w, false, payload{Key: "n", N: 1})
	waitFor(t, 30*time.Second, "the event", func() bool { return distinct(b.messages(t)) >= 1 })
}

// toggle fails every publish while on.
type toggle struct {
	message.Publisher
	on atomic.Bool
}

func (p *toggle) Publish(topic string, msgs ...*message.Message) error {
	if p.on.Load() {
		return errors.New("test: the broker is unreachable")
	}
	return p.Publisher.Publish(topic, msgs...)
}

// TestBreakerClosedAfterSessionRestart: a session that ends with its
// breaker open leaves neither Status.BreakerOpen nor the breaker gauge at
// open: the next session's breaker starts closed.
func TestBreakerClosedAfterSessionRestart(t *testing.T) {
	pool := logicalPool(t)
	b := startNATS(t)
	w := walWriter(t)
	reader, mp := testMeter(t)
	gauge := func() (int64, bool) {
		var rm metricdata.ResourceMetrics
		if err := reader.Collect(context.Background(), &rm); err != nil {
			t.Fatal(err)
		}
		for _, sm := range rm.ScopeMetrics {
			for _, m := range sm.Metrics {
				if g, ok := m.Data.(metricdata.Gauge[int64]); ok && m.Name == "outboxgen.relay.breaker.open" && len(g.DataPoints) > 0 {
					return g.DataPoints[len(g.DataPoints)-1].Value, true
				}
			}
		}
		return 0, false
	}
	pub := &toggle{Publisher: b.pub}
	r := newRelay(t, pool, pub, func(c *walrelay.Config) {
		c.MeterProvider = mp
		c.RetryDelay = walrelay.DefaultRetryDelay // see TestBrokerOutagePausesWithoutParking
		// No probe while the test runs: only the session's end may
		// close what the status shows.
		c.BreakerBackoff = func(int) time.Duration { return time.Hour }
	})
	runRelay(t, r)
	waitFor(t, 30*time.Second, "the relay to stream", func() bool { return r.Status().Streaming })
	pub.on.Store(true)
	write(t, pool, w, false, payload{Key: "a", N: 1}, payload{Key: "b", N: 1})
	waitFor(t, 30*time.Second, "the breaker to open", func() bool { return r.Status().BreakerOpen })
	if v, ok := gauge(); !ok || v != 1 {
		t.Fatalf("breaker gauge %d (recorded: %v) while open, want 1", v, ok)
	}

	// The broker is back, and the session ends (its connection is cut):
	// the next one streams the events again.
	pub.on.Store(false)
	if _, err := pool.Exec(context.Background(), "SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots WHERE slot_name = $1", r.Slot()); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 30*time.Second, "both events after the session restart", func() bool { return distinct(b.messages(t)) >= 2 })
	if st := r.Status(); st.BreakerOpen || st.Parked != 0 {
		t.Errorf("status %+v after a new session published: want the breaker closed, nothing parked", st)
	}
	if v, ok := gauge(); !ok || v != 0 {
		t.Errorf("breaker gauge %d after a new session published, want 0", v)
	}
}
