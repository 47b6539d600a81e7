package walrelay_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/outboxgen/outboxgen/internal/testdb"
	"github.com/outboxgen/outboxgen/runtime/driver/pgxdriver"
	"github.com/outboxgen/outboxgen/runtime/outbox"
	"github.com/outboxgen/outboxgen/runtime/outbox/pgxoutbox"
	"github.com/outboxgen/outboxgen/runtime/relay"
	"github.com/outboxgen/outboxgen/runtime/walrelay"
)

// TestCommittedInOrderRollbackNever: committed events arrive, per key in
// commit order, with the polling relay's metadata; a rolled-back
// transaction's events never do; the slot's confirmed position advances.
func TestCommittedInOrderRollbackNever(t *testing.T) {
	pool := logicalPool(t)
	b := startNATS(t)
	w := walWriter(t)
	r := newRelay(t, pool, b.pub, nil)
	runRelay(t, r)
	waitFor(t, 30*time.Second, "the relay to stream", func() bool { return r.Status().Streaming })

	want := map[string]int{}
	var rolledBack []outbox.EventID
	for i := 0; i < 20; i++ {
		var evs []payload
		for _, k := range []string{"a", "b", "c"} {
			want[k]++
			evs = append(evs, payload{Key: k, N: want[k]})
		}
		if i%5 == 2 { // a multi-event transaction rolled back
			rolledBack = append(rolledBack, write(t, pool, w, true, payload{Key: "a", N: 999}, payload{Key: "rb", N: 1})...)
		}
		write(t, pool, w, false, evs...)
	}
	total := 60
	waitFor(t, 30*time.Second, "60 events at the broker", func() bool { return distinct(b.messages(t)) >= total })
	msgs := b.messages(t)
	if dups := checkOrder(t, msgs, want); dups != 0 {
		t.Errorf("%d duplicates without any failure", dups)
	}
	for _, m := range msgs {
		for _, id := range rolledBack {
			if m.EventID == id.String() {
				t.Errorf("event %s of a rolled-back transaction was published", id)
			}
		}
	}
	// The polling relay's metadata, from the envelope.
	m := msgs[0]
	meta, err := outbox.ParseMeta(m.Meta, m.EventID)
	if err != nil {
		t.Fatal(err)
	}
	if meta.Type != "ORDER_CHANGED" || meta.Key != m.Key || meta.Version != 1 || meta.Sequence <= 0 || meta.CreatedAt.IsZero() ||
		m.Meta[outbox.MetadataPartitionKey] != m.Key || m.Meta["tenant"] != "t-1" || m.Meta[outbox.MetadataEventID] != m.EventID {
		t.Errorf("metadata %v: want the polling relay's (type, key, version, sequence, created_at, partition_key, event id, stored headers)", m.Meta)
	}
	if age := time.Since(meta.CreatedAt); age < 0 || age > time.Minute {
		t.Errorf("created_at %s is not the writing transaction's time", meta.CreatedAt)
	}
	// Sequences grow within each key (the aggregate is written by one
	// goroutine here).
	last := map[string]int64{}
	for _, m := range msgs {
		s, _ := strconv.ParseInt(m.Meta[outbox.MetadataSequence], 10, 64)
		if s <= last[m.Key] {
			t.Errorf("key %s: sequence %d after %d", m.Key, s, last[m.Key])
		}
		last[m.Key] = s
	}
	// The confirmed position passes the last commit and reaches the slot.
	head := walInsertLSN(t, pool)
	waitFor(t, 10*time.Second, "the slot's confirmed_flush_lsn to pass the last commit", func() bool {
		s, err := walrelay.SlotStatus(context.Background(), pool, r.Slot())
		if err != nil {
			t.Fatal(err)
		}
		c, _ := pglogrepl.ParseLSN(s.ConfirmedFlush)
		return s.Exists && s.Active && c >= head
	})
	if st := r.Status(); st.Published != int64(total) || st.Parked != 0 || st.Malformed != 0 {
		t.Errorf("status %+v: want %d published, nothing parked or malformed", st, total)
	}
	if n := len(outboxRows(t, pool)); n != 0 {
		t.Errorf("the outbox table holds %d rows; the WAL mode writes none", n)
	}
}

// TestRestartResumes: a relay stopped and started again resumes at the
// confirmed position: events written while it was down are published,
// the earlier ones are not published again (a graceful stop confirms
// them).
func TestRestartResumes(t *testing.T) {
	pool := logicalPool(t)
	b := startNATS(t)
	w := walWriter(t)
	want := map[string]int{}
	batch := func(n int) {
		for i := 0; i < n; i++ {
			k := "k" + strconv.Itoa(i%4)
			want[k]++
			write(t, pool, w, false, payload{Key: k, N: want[k]})
		}
	}
	r1 := newRelay(t, pool, b.pub, nil)
	// The deploy step: the slot exists before any writer writes, so the
	// events written before the relay first runs are streamed too.
	if err := r1.Setup(context.Background()); err != nil {
		t.Fatal(err)
	}
	batch(10)
	stop := runRelay(t, r1)
	batch(30)
	waitFor(t, 30*time.Second, "40 events", func() bool { return distinct(b.messages(t)) >= 40 })
	stop()
	// Written while no relay runs (the slot retains them), through
	// database/sql this time (outbox.StdTx).
	db := stdlib.OpenDBFromPool(pool)
	defer db.Close()
	for i := 0; i < 40; i++ {
		k := "k" + strconv.Itoa(i%4)
		want[k]++
		tx, err := db.Begin()
		if err != nil {
			t.Fatal(err)
		}
		if _, err := w.Insert(context.Background(), tx, outbox.Event{Type: "ORDER_CHANGED", Topic: topic, Key: k, Version: 1, Payload: payload{Key: k, N: want[k]}}); err != nil {
			t.Fatal(err)
		}
		if err := tx.Commit(); err != nil {
			t.Fatal(err)
		}
	}
	// The walsender ends the session a moment after Run returned; the lag
	// is measured to the written WAL, which the test databases'
	// synchronous_commit off lets trail the commits by wal_writer_delay.
	var s walrelay.Slot
	waitFor(t, 10*time.Second, "the slot inactive, retaining the new commits", func() bool {
		var err error
		s, err = walrelay.SlotStatus(context.Background(), pool, r1.Slot())
		if err != nil {
			t.Fatal(err)
		}
		return !s.Active && s.LagBytes > 0
	})
	if !s.Exists || s.Active || s.LagBytes <= 0 {
		t.Errorf("slot while the relay is down: %+v: want it to exist, inactive, retaining WAL", s)
	}
	if err := walrelay.CheckSlot(context.Background(), pool, r1.Slot(), 0); err == nil {
		t.Error("CheckSlot: no error while no relay streams from the slot")
	}
	r2 := newRelay(t, pool, b.pub, nil)
	runRelay(t, r2)
	waitFor(t, 30*time.Second, "80 events", func() bool { return distinct(b.messages(t)) >= 80 })
	if n := settled(t, "the relay to count 40 published events", 40, func() int64 { return r2.Status().Published }); n != 40 {
		t.Errorf("the restarted relay published %d events, want the 40 written while it was down (the others were confirmed)", n)
	}
	checkOrder(t, b.messages(t), want)
	waitFor(t, 10*time.Second, "CheckSlot to pass", func() bool {
		return walrelay.CheckSlot(context.Background(), pool, r2.Slot(), 0) == nil
	})
}

// TestMalformedDoesNotStall: a message of the outbox's prefix that no
// build can read (of a known envelope version, breaking its format) is
// logged with its LSN and skipped; the events after it flow.
func TestMalformedDoesNotStall(t *testing.T) {
	pool := logicalPool(t)
	b := startNATS(t)
	w := walWriter(t)
	var mu sync.Mutex
	var bad []walrelay.Malformed
	r := newRelay(t, pool, b.pub, func(c *walrelay.Config) {
		c.OnMalformed = func(m walrelay.Malformed) { mu.Lock(); bad = append(bad, m); mu.Unlock() }
	})
	runRelay(t, r)
	waitFor(t, 30*time.Second, "the relay to stream", func() bool { return r.Status().Streaming })
	write(t, pool, w, false, payload{Key: "m", N: 1})
	ctx := context.Background()
	prefix := outbox.WALPrefix(testdb.Tables.Outbox)
	if _, err := pool.Exec(ctx, "SELECT pg_logical_emit_message(true, $1, decode('02', 'hex') || 'garbage'::bytea)", prefix); err != nil {
		t.Fatal(err)
	}
	// Another outbox's prefix is not ours: ignored without a word.
	if _, err := pool.Exec(ctx, "SELECT pg_logical_emit_message(true, 'outboxgen:other_outbox', 'x'::bytea)"); err != nil {
		t.Fatal(err)
	}
	write(t, pool, w, false, payload{Key: "m", N: 2})
	waitFor(t, 30*time.Second, "the events around the malformed message", func() bool { return distinct(b.messages(t)) >= 2 })
	checkOrder(t, b.messages(t), map[string]int{"m": 2})
	mu.Lock()
	defer mu.Unlock()
	if len(bad) != 1 || bad[0].LSN == "" || !errors.Is(bad[0].Error, outbox.ErrMalformedWALMessage) {
		t.Fatalf("malformed reports %+v: want one, with its LSN", bad)
	}
	if st := r.Status(); st.Malformed != 1 {
		t.Errorf("status counts %d malformed, want 1", st.Malformed)
	}
}

// failing wraps the broker's publisher and fails, while on, every publish
// of an event whose payload tag is "poison".
type failing struct {
	message.Publisher
	on atomic.Bool
	// fails counts refused calls of one message (the quick retries);
	// batchFails refused calls of several (a batch the relay then
	// publishes one by one, charging nobody).
	fails, batchFails atomic.Int64
}

func (f *failing) Publish(topic string, msgs ...*message.Message) error {
	for _, m := range msgs {
		if f.on.Load() && string(m.Payload) != "" && containsTag(m.Payload, "poison") {
			if len(msgs) > 1 {
				f.batchFails.Add(1)
			} else {
				f.fails.Add(1)
			}
			return fmt.Errorf("test: the consumer side refuses event %s", m.UUID)
		}
	}
	return f.Publisher.Publish(topic, msgs...)
}

func containsTag(p []byte, tag string) bool {
	return len(p) > 0 && bytesContains(p, `"tag":"`+tag+`"`)
}

func bytesContains(p []byte, s string) bool {
	for i := 0; i+len(s) <= len(p); i++ {
		if string(p[i:i+len(s)]) == s {
			return true
		}
	}
	return false
}

// TestPoisonParkedRequeuedThenStreams: an event whose publish keeps
// failing is parked in the outbox table with every later event of its
// key behind it, while other keys stream; the polling relay marks it
// FAILED, an operator requeues it, the key's parked events are published
// in order, and the key's next event streams again.
func TestPoisonParkedRequeuedThenStreams(t *testing.T) {
	pool := logicalPool(t)
	b := startNATS(t)
	w := walWriter(t)
	pub := &failing{Publisher: b.pub}
	pub.on.Store(true)
	r := newRelay(t, pool, pub, func(c *walrelay.Config) { c.Backoff = func(int) time.Duration { return 10 * time.Millisecond } })
	runRelay(t, r)
	waitFor(t, 30*time.Second, "the relay to stream", func() bool { return r.Status().Streaming })

	write(t, pool, w, false, payload{Key: "p", N: 1, Tag: "poison"}, payload{Key: "ok", N: 1})
	write(t, pool, w, false, payload{Key: "p", N: 2}, payload{Key: "ok", N: 2})
	write(t, pool, w, false, payload{Key: "p", N: 3})
	write(t, pool, w, false, payload{Key: "ok", N: 3})
	waitFor(t, 30*time.Second, "the other key's events", func() bool { return distinct(b.messages(t)) >= 3 })
	waitFor(t, 30*time.Second, "3 parked events", func() bool { return r.Status().Parked == 3 })
	for _, m := range b.messages(t) {
		if m.Key == "p" {
			t.Fatalf("event %d of the poisoned key was published past its parked predecessor", m.N)
		}
	}
	rows := outboxRows(t, pool)
	if len(rows) != 3 || rows[0][1] != "p" || rows[0][2] != "0" {
		t.Fatalf("outbox rows %v: want the 3 events of key p, pending", rows)
	}
	var retry int
	var lastErr string
	if err := pool.QueryRow(context.Background(), "SELECT retry_count, last_error FROM "+testdb.Tables.Outbox+" ORDER BY id LIMIT 1").Scan(&retry, &lastErr); err != nil {
		t.Fatal(err)
	}
	if retry != 1 || lastErr == "" {
		t.Errorf("the poison row has retry_count %d, last_error %q: want one charged attempt and the error", retry, lastErr)
	}
	if got := pub.fails.Load(); got != int64(walrelay.DefaultQuickRetries) {
		t.Errorf("%d failed publishes of the poison event alone before parking, want %d quick retries", got, walrelay.DefaultQuickRetries)
	}
	// A batch holding it may have been refused first (p and ok were
	// written together); that refusal is charged to nobody.
	if got := pub.batchFails.Load(); got > 1 {
		t.Errorf("%d refused batches held the poison event: after the first, it is published alone", got)
	}

	// The polling relay takes over the parked rows: the poison one goes
	// FAILED at once (MaxAttempts 1), holding its key.
	drv, err := pgxdriver.New(pool, schema())
	if err != nil {
		t.Fatal(err)
	}
	pr, err := relay.New(drv, relay.Config{Publisher: pub, PollInterval: 50 * time.Millisecond, MaxAttempts: 2,
		Backoff: func(int) time.Duration { return 10 * time.Millisecond }})
	if err != nil {
		t.Fatal(err)
	}
	pctx, pcancel := context.WithCancel(context.Background())
	pdone := make(chan error, 1)
	go func() { pdone <- pr.Run(pctx) }()
	t.Cleanup(func() { pcancel(); <-pdone })
	var failedID int64
	waitFor(t, 30*time.Second, "the poison row FAILED", func() bool {
		failed, err := pr.ListFailed(context.Background(), 10)
		if err != nil {
			t.Fatal(err)
		}
		if len(failed) == 1 {
			failedID = failed[0].ID
		}
		return len(failed) == 1
	})
	// While the key has unsent rows, its new events are parked too.
	write(t, pool, w, false, payload{Key: "p", N: 4}, payload{Key: "ok", N: 4})
	waitFor(t, 30*time.Second, "event p/4 parked", func() bool { return r.Status().Parked == 4 })

	pub.on.Store(false) // the cause is fixed
	if n, err := pr.Requeue(context.Background(), failedID); err != nil || n != 1 {
		t.Fatalf("requeue: %d, %v", n, err)
	}
	waitFor(t, 30*time.Second, "the parked events published", func() bool {
		var unsent int
		if err := pool.QueryRow(context.Background(), "SELECT count(*) FROM "+testdb.Tables.Outbox+" WHERE status <> 1").Scan(&unsent); err != nil {
			t.Fatal(err)
		}
		return unsent == 0
	})
	// The key streams again.
	write(t, pool, w, false, payload{Key: "p", N: 5})
	waitFor(t, 30*time.Second, "p/5", func() bool { return distinct(b.messages(t)) >= 9 })
	checkOrder(t, b.messages(t), map[string]int{"p": 5, "ok": 4})
	if st := r.Status(); st.Parked != 4 {
		t.Errorf("%d events parked, want 4: p/5 should stream once the key's rows were sent", st.Parked)
	}
	// Parked rows keep their sequence: id = outbox_seq.
	for _, m := range b.messages(t) {
		if m.Key == "p" && m.N <= 4 {
			var n int
			if err := pool.QueryRow(context.Background(), "SELECT count(*) FROM "+testdb.Tables.Outbox+" WHERE id = $1 AND event_id = $2",
				m.Meta[outbox.MetadataSequence], m.EventID).Scan(&n); err != nil || n != 1 {
				t.Errorf("p/%d: no row with id = its outbox_seq %s (%v)", m.N, m.Meta[outbox.MetadataSequence], err)
			}
		}
	}
}

// TestBrokerOutagePausesWithoutParking: with the broker down, the breaker
// opens and the stream pauses; nothing is parked; once the broker is back
// every event arrives in per-key order.
func TestBrokerOutagePausesWithoutParking(t *testing.T) {
	// The default RetryDelay, not the harness's 20 ms: the breaker opens
	// once a second key fails, and with 20 ms the first key's quick
	// retries ran out (and parked it) before the writer, one transaction
	// per event on a loaded CI machine, had committed a second key's
	// event 150 ms later.
	brokerOutage(t, func(c *walrelay.Config) { c.RetryDelay = walrelay.DefaultRetryDelay }, 5, 1, 10, 30)
}

// TestBrokerOutageWithBatchesParksNothing: as TestBrokerOutagePausesWithoutParking,
// with transactions of many keys, so that the relay's calls carry several
// events: a batch call that fails says nothing of any one key, and its
// events' own calls decide between poison and outage. With the harness's
// short RetryDelay, a key whose quick retries run out first waits for
// them.
func TestBrokerOutageWithBatchesParksNothing(t *testing.T) {
	brokerOutage(t, nil, 20, 20, 2, 5)
}

// brokerOutage runs a relay (its Config changed by mod) to NATS, writes
// before transactions of perTx events each, the keys taken in turn from
// keys, stops the broker and writes during more: the breaker opens,
// nothing is parked; once the broker is back every event arrives in
// per-key order.
func brokerOutage(t *testing.T, mod func(*walrelay.Config), keys, perTx, before, during int) {
	t.Helper()
	pool := logicalPool(t)
	b := startNATS(t)
	w := walWriter(t)
	r := newRelay(t, pool, b.pub, mod)
	runRelay(t, r)
	waitFor(t, 30*time.Second, "the relay to stream", func() bool { return r.Status().Streaming })
	want := map[string]int{}
	next := 0
	emit := func(txs int) {
		for range txs {
			evs := make([]payload, perTx)
			for i := range evs {
				k := "o" + strconv.Itoa(next%keys)
				next++
				want[k]++
				evs[i] = payload{Key: k, N: want[k]}
			}
			write(t, pool, w, false, evs...)
		}
	}
	emit(before)
	waitFor(t, 30*time.Second, "the events before the outage", func() bool { return distinct(b.messages(t)) >= before*perTx })
	b.stop()
	emit(during)
	waitFor(t, 30*time.Second, "the breaker to open", func() bool { return r.Status().BreakerOpen })
	time.Sleep(time.Second) // probes fail meanwhile
	if st := r.Status(); st.Parked != 0 {
		t.Fatalf("%d events parked during a broker outage: the breaker should pause the stream instead", st.Parked)
	}
	b.restart()
	waitFor(t, 60*time.Second, "every event after the outage", func() bool { return distinct(b.messages(t)) >= (before+during)*perTx })
	checkOrder(t, b.messages(t), want)
	if st := r.Status(); st.Parked != 0 || st.BreakerOpen {
		t.Errorf("status %+v: want nothing parked and the breaker closed", st)
	}
	if n := len(outboxRows(t, pool)); n != 0 {
		t.Errorf("%d rows parked in the table", n)
	}
}

// TestSlotBeingCreated: while the relay creates its slot, waiting for a
// transaction that was running when the creation began, SlotStatus and
// CheckSlot say the slot is not ready, though PostgreSQL already lists it
// as active, and another instance's Setup waits; once the transaction
// ends, Setup returns and the slot is ready and streams.
func TestSlotBeingCreated(t *testing.T) {
	pool := logicalPool(t)
	b := startNATS(t)
	ctx := context.Background()
	tx := holdXID(t, pool)
	r := newRelay(t, pool, b.pub, nil)
	runRelay(t, r)
	var s walrelay.Slot
	var err error
	waitFor(t, 30*time.Second, "the slot to be listed", func() bool {
		s, err = walrelay.SlotStatus(ctx, pool, r.Slot())
		return err == nil && s.Exists
	})
	if !s.Active || !s.Creating || s.ConfirmedFlush != "" {
		t.Fatalf("slot while its creation waits for a transaction: %+v: want it active, creating, with no confirmed position", s)
	}
	if err := walrelay.CheckSlot(ctx, pool, r.Slot(), 0); err == nil || !strings.Contains(err.Error(), "being created") {
		t.Errorf("CheckSlot while the slot is being created: %v", err)
	}
	if r.Status().Streaming {
		t.Error("the relay streams before its slot is ready")
	}
	// Setup (a deploy step: `outboxgen wal setup`) finds the slot and
	// waits until it is ready: writers deployed after it lose nothing.
	other := newRelay(t, pool, b.pub, func(c *walrelay.Config) { c.InstanceID = "setup" })
	// Long enough to connect and look the slot up on a loaded machine.
	short, cancel := context.WithTimeout(ctx, 3*time.Second)
	err = other.Setup(short)
	cancel()
	if err == nil || !strings.Contains(err.Error(), "still being created") {
		t.Errorf("Setup while the slot is being created, until its context ended: %v; want an error saying so", err)
	}
	setupDone := make(chan error, 1)
	go func() { setupDone <- other.Setup(ctx) }()
	select {
	case err := <-setupDone:
		t.Fatalf("Setup returned (%v) while the slot is still being created", err)
	case <-time.After(300 * time.Millisecond):
	}
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-setupDone:
		if err != nil {
			t.Fatalf("Setup once the creation could end: %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("Setup did not return within 30 s of the slot's creation being able to end")
	}
	if s, err = walrelay.SlotStatus(ctx, pool, r.Slot()); err != nil || s.Creating {
		t.Errorf("slot when Setup returned: %+v (%v): want it ready", s, err)
	}
	waitFor(t, 30*time.Second, "the relay to stream", func() bool { return r.Status().Streaming })
	if s, err = walrelay.SlotStatus(ctx, pool, r.Slot()); err != nil || s.Creating || s.ConfirmedFlush == "" {
		t.Errorf("slot once streaming: %+v (%v): want it ready", s, err)
	}
	if err := walrelay.CheckSlot(ctx, pool, r.Slot(), 0); err != nil {
		t.Errorf("CheckSlot once streaming: %v", err)
	}
}

// holdXID begins a transaction that holds an xid, which a slot's creation
// waits for; it is rolled back when the test ends.
func holdXID(t *testing.T, pool *pgxpool.Pool) pgx.Tx {
	t.Helper()
	ctx := context.Background()
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = tx.Rollback(ctx) })
	if _, err := tx.Exec(ctx, "SELECT txid_current()"); err != nil {
		t.Fatal(err)
	}
	return tx
}

// TestSetupCreationCutOff: Setup's own creation of the slot waits for a
// running transaction; when Setup's context ends first, its error says
// why and what to do, and no slot is left behind.
func TestSetupCreationCutOff(t *testing.T) {
	pool := logicalPool(t)
	b := startNATS(t)
	ctx := context.Background()
	tx := holdXID(t, pool)
	r := newRelay(t, pool, b.pub, nil)
	short, cancel := context.WithTimeout(ctx, 3*time.Second)
	err := r.Setup(short)
	cancel()
	if err == nil || !strings.Contains(err.Error(), "was not created") || !strings.Contains(err.Error(), "pg_stat_activity") ||
		!errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Setup cut off while creating the slot: %v; want an error saying the slot was not created and why", err)
	}
	waitFor(t, 30*time.Second, "the cut-off slot to be gone", func() bool {
		s, err := walrelay.SlotStatus(ctx, pool, r.Slot())
		return err == nil && !s.Exists
	})
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	if err := r.Setup(ctx); err != nil {
		t.Fatalf("Setup once nothing holds the creation up: %v", err)
	}
	if s, err := walrelay.SlotStatus(ctx, pool, r.Slot()); err != nil || !s.Exists || s.Creating {
		t.Fatalf("slot after Setup: %+v (%v): want it ready", s, err)
	}
}

// TestTakeover: two instances on one slot: one streams, the other stands
// by; when the streaming one stops, the other takes over and nothing is
// lost.
func TestTakeover(t *testing.T) {
	pool := logicalPool(t)
	b := startNATS(t)
	w := walWriter(t)
	a := newRelay(t, pool, b.pub, func(c *walrelay.Config) { c.InstanceID = "a" })
	stopA := runRelay(t, a)
	waitFor(t, 30*time.Second, "a to stream", func() bool { return a.Status().Streaming })
	bb := newRelay(t, pool, b.pub, func(c *walrelay.Config) { c.InstanceID = "b" })
	runRelay(t, bb)
	want := map[string]int{}
	emit := func(n int) {
		for i := 0; i < n; i++ {
			k := "t" + strconv.Itoa(i%3)
			want[k]++
			write(t, pool, w, false, payload{Key: k, N: want[k]})
		}
	}
	emit(15)
	waitFor(t, 30*time.Second, "15 events", func() bool { return distinct(b.messages(t)) >= 15 })
	time.Sleep(500 * time.Millisecond) // b retries START_REPLICATION meanwhile
	if bb.Status().Streaming || bb.Status().Published != 0 {
		t.Fatalf("the standby streams while a holds the slot: %+v", bb.Status())
	}
	stopA()
	emit(15)
	waitFor(t, 30*time.Second, "b to take over", func() bool { return bb.Status().Streaming })
	waitFor(t, 30*time.Second, "30 events", func() bool { return distinct(b.messages(t)) >= 30 })
	checkOrder(t, b.messages(t), want)
}

// TestSIGKILLMidStream: a relay process killed with SIGKILL while it
// streams loses nothing: a standby instance takes the slot over and
// resumes at the confirmed position; per-key order holds (keeping each
// event's first delivery).
func TestSIGKILLMidStream(t *testing.T) {
	pool := logicalPool(t)
	b := startNATS(t)
	w := walWriter(t)
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), childDSNEnv+"="+pool.Config().ConnString(), childNATSEnv+"="+b.srv.ClientURL())
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	killed := false
	t.Cleanup(func() {
		if !killed {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
		}
		// Read after Wait: the child has stopped writing. What it
		// logged is the only account of a child that fell behind.
		if t.Failed() {
			t.Logf("the child relay's log:\n%s", stderr.String())
		}
	})
	// Held and created: PostgreSQL lists a slot as active from the start
	// of its creation, and events committed before it is ready may never
	// be streamed (a CI run lost the first of them that way).
	waitFor(t, 30*time.Second, "the child relay to hold the slot", func() bool {
		s, err := walrelay.SlotStatus(context.Background(), pool, testSlot(pool))
		return err == nil && s.Active && !s.Creating
	})
	standby := newRelay(t, pool, b.pub, func(c *walrelay.Config) { c.InstanceID = "standby" })
	runRelay(t, standby)
	t.Cleanup(func() {
		if t.Failed() {
			s, err := walrelay.SlotStatus(context.Background(), pool, testSlot(pool))
			t.Logf("the standby: %+v; the slot: %+v (%v); %d distinct events at the broker", standby.Status(), s, err, distinct(b.messages(t)))
		}
	})

	const total = 400
	want := map[string]int{}
	done := make(chan error, 1)
	go func() {
		for i := 0; i < total; i += 2 {
			var evs []payload
			for j := i; j < i+2; j++ {
				k := "s" + strconv.Itoa(j%7)
				want[k]++
				evs = append(evs, payload{Key: k, N: want[k]})
			}
			if _, err := writeE(pool, w, false, evs...); err != nil {
				done <- err
				return
			}
		}
		done <- nil
	}()
	waitFor(t, 30*time.Second, "the child to publish 100 events", func() bool { return distinct(b.messages(t)) >= 100 })
	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	killed = true
	_ = cmd.Wait()
	atKill := distinct(b.messages(t))
	if err := <-done; err != nil {
		t.Fatalf("writer: %v", err)
	}
	waitFor(t, 30*time.Second, "the standby to take over", func() bool { return standby.Status().Streaming })
	waitFor(t, 60*time.Second, "every event", func() bool { return distinct(b.messages(t)) >= total })
	msgs := b.messages(t)
	dups := checkOrder(t, msgs, want)
	t.Logf("killed after %d of %d events reached the broker; the standby published %d (%d duplicates dropped by JetStream's de-duplication window, %d at the broker)",
		atKill, total, standby.Status().Published, standby.Status().Published-int64(total-atKill), dups)
	if t.Failed() {
		t.Logf("child stderr:\n%s", stderr.String())
	}
}

// crashEnv names the data directory of a PostgreSQL server the crash test
// may kill (pg_ctl stop -m immediate: no shutdown checkpoint, as after a
// power loss) and restart. It must be the server of
// OUTBOXGEN_TEST_POSTGRES_DSN, and nobody else's. Without it the test
// starts a private server of its own (startPrivatePostgres).
const crashEnv = "OUTBOXGEN_TEST_WAL_CRASH_PGDATA"

// TestPostgresCrash: PostgreSQL crashes while writers write and the relay
// streams; after its restart every event whose COMMIT succeeded is
// published, in per-key order (keeping first deliveries).
func TestPostgresCrash(t *testing.T) {
	pgdata := os.Getenv(crashEnv)
	var srv *pgServer
	if pgdata == "" {
		// A private server of our own: crashing the shared one would
		// break every other test running against it.
		srv = startPrivatePostgres(t)
		pgdata = srv.data
		t.Setenv(testdb.PostgresEnv, srv.dsn)
	} else {
		srv = &pgServer{data: pgdata, bin: latestPGBin(t), asPostgres: os.Geteuid() == 0}
	}
	pgctl := func(args ...string) {
		t.Helper()
		if out, err := srv.command("pg_ctl", append([]string{"-D", pgdata}, args...)...).CombinedOutput(); err != nil {
			t.Fatalf("pg_ctl %v: %v\n%s", args, err, out)
		}
	}
	pool := logicalPool(t)
	b := startNATS(t)
	w := walWriter(t)
	r := newRelay(t, pool, b.pub, nil)
	runRelay(t, r)
	waitFor(t, 30*time.Second, "the relay to stream", func() bool { return r.Status().Streaming })

	var mu sync.Mutex
	want := map[string]int{}    // per key: the last n committed
	unsure := map[string]bool{} // event ids whose COMMIT failed: maybe committed
	stopWriters := make(chan struct{})
	var wg sync.WaitGroup
	for c := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			k := "c" + strconv.Itoa(c)
			n := 0
			for {
				select {
				case <-stopWriters:
					return
				default:
				}
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				tx, err := pool.Begin(ctx)
				if err != nil {
					cancel()
					time.Sleep(50 * time.Millisecond)
					continue
				}
				id, err := w.InsertTx(ctx, pgxoutbox.Tx(tx), outbox.Event{Type: "ORDER_CHANGED", Topic: topic, Key: k, Version: 1, Payload: payload{Key: k, N: n + 1}})
				if err == nil {
					err = tx.Commit(ctx)
					if err == nil {
						n++
						mu.Lock()
						want[k] = n
						mu.Unlock()
					} else {
						mu.Lock()
						unsure[id.String()] = true
						mu.Unlock()
					}
				} else {
					_ = tx.Rollback(ctx)
				}
				cancel()
			}
		}()
	}
	waitFor(t, 30*time.Second, "100 events published", func() bool { return distinct(b.messages(t)) >= 100 })
	pgctl("-m", "immediate", "stop")
	time.Sleep(500 * time.Millisecond)
	pgctl("-w", "-l", filepath.Join(filepath.Dir(pgdata), "crash-restart.log"), "start")
	waitFor(t, 60*time.Second, "the relay to stream again", func() bool { return r.Status().Streaming })
	time.Sleep(time.Second) // more events after the restart
	close(stopWriters)
	wg.Wait()
	mu.Lock()
	total := 0
	for _, n := range want {
		total += n
	}
	mu.Unlock()
	// Events whose COMMIT failed at the crash may have committed (the
	// writer cannot know): a key's next n was then taken again by the
	// following event, so wait for and compare only the committed ones,
	// the unsure ones left out (an unsure event that committed would
	// otherwise stand in for a committed one still missing).
	sure := func() []got {
		var msgs []got
		for _, m := range b.messages(t) {
			if !unsure[m.EventID] {
				msgs = append(msgs, m)
			}
		}
		return msgs
	}
	waitFor(t, 60*time.Second, "every committed event", func() bool {
		return distinct(sure()) >= total
	})
	checkOrder(t, sure(), want)
	t.Logf("%d committed events across the crash, %d with an unknown commit outcome", total, len(unsure))
}

// TestMetrics: the relay records the polling relay's publish counter and
// its own slot gauges.
func TestMetrics(t *testing.T) {
	pool := logicalPool(t)
	b := startNATS(t)
	w := walWriter(t)
	reader, mp := testMeter(t)
	r := newRelay(t, pool, b.pub, func(c *walrelay.Config) { c.MeterProvider = mp })
	runRelay(t, r)
	waitFor(t, 30*time.Second, "the relay to stream", func() bool { return r.Status().Streaming })
	for i := 1; i <= 5; i++ {
		write(t, pool, w, false, payload{Key: "x", N: i})
	}
	waitFor(t, 30*time.Second, "5 events", func() bool { return distinct(b.messages(t)) >= 5 })
	// The counter trails the broker by a moment, and the lag gauges
	// appear with the first slot sample (counted as nothing published
	// until then).
	var found map[string]float64
	settled(t, "5 published and a lag sample", 5, func() int64 {
		found = metricValues(t, reader)
		_, bytes := found[walrelay.MetricSlotLagBytes]
		_, secs := found[walrelay.MetricSlotLagSeconds]
		if !bytes || !secs {
			return 0
		}
		return int64(found["outboxgen.relay.published"])
	})
	if found["outboxgen.relay.published"] != 5 {
		t.Errorf("outboxgen.relay.published = %v, want 5 (%v)", found["outboxgen.relay.published"], found)
	}
	if found[walrelay.MetricStreaming] != 1 {
		t.Errorf("%s = %v, want 1", walrelay.MetricStreaming, found[walrelay.MetricStreaming])
	}
	if v, ok := found[walrelay.MetricSlotLagBytes]; !ok || v < 0 {
		t.Errorf("%s missing or negative: %v", walrelay.MetricSlotLagBytes, found)
	}
	if v, ok := found[walrelay.MetricSlotLagSeconds]; !ok || v < 0 {
		t.Errorf("%s missing or negative: %v", walrelay.MetricSlotLagSeconds, found)
	}
}

// testMeter is a meter provider for a relay, and the reader of its
// metrics (metricValues), shut down when the test ends.
func testMeter(t *testing.T) (*sdkmetric.ManualReader, *sdkmetric.MeterProvider) {
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	t.Cleanup(func() { _ = mp.Shutdown(context.Background()) })
	return reader, mp
}

// metricValues reads reader's metrics by name: counters summed over their
// points, gauges at their last point.
func metricValues(t *testing.T, reader *sdkmetric.ManualReader) map[string]float64 {
	t.Helper()
	var rm metricdata.ResourceMetrics
	if err := reader.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	found := map[string]float64{}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			switch d := m.Data.(type) {
			case metricdata.Sum[int64]:
				for _, p := range d.DataPoints {
					found[m.Name] += float64(p.Value)
				}
			case metricdata.Gauge[int64]:
				for _, p := range d.DataPoints {
					found[m.Name] = float64(p.Value)
				}
			case metricdata.Gauge[float64]:
				for _, p := range d.DataPoints {
					found[m.Name] = p.Value
				}
			}
		}
	}
	return found
}

// TestCommitOrderWithoutLock: two transactions write events of one key
// without locking anything; the one that writes first commits last. The
// stream publishes in commit order (the polling relay would publish in
// id order, the write order).
func TestCommitOrderWithoutLock(t *testing.T) {
	pool := logicalPool(t)
	b := startNATS(t)
	w := walWriter(t)
	r := newRelay(t, pool, b.pub, nil)
	runRelay(t, r)
	waitFor(t, 30*time.Second, "the relay to stream", func() bool { return r.Status().Streaming })
	ctx := context.Background()
	txA, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer txA.Rollback(ctx) //nolint:errcheck
	idA, err := w.InsertTx(ctx, pgxoutbox.Tx(txA), outbox.Event{Type: "ORDER_CHANGED", Topic: topic, Key: "k", Version: 1, Payload: payload{Key: "k", N: 2}})
	if err != nil {
		t.Fatal(err)
	}
	idB := write(t, pool, w, false, payload{Key: "k", N: 1})[0] // written second, committed first
	if err := txA.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 30*time.Second, "both events", func() bool { return distinct(b.messages(t)) >= 2 })
	msgs := b.messages(t)
	if msgs[0].EventID != idB.String() || msgs[1].EventID != idA.String() {
		t.Fatalf("published %s then %s; want commit order %s (B) then %s (A)", msgs[0].EventID, msgs[1].EventID, idB, idA)
	}
	checkOrder(t, msgs, map[string]int{"k": 2})
}

// TestLonePoisonKeysParkOneAfterAnother: a poison event parked, then,
// with no other traffic, a poison event of another key: it is parked too.
// The first key's failures were settled by its parking and must not
// combine with the second's into a false outage (the breaker would open,
// the second key's failures would count as probes only, and it would hold
// the stream's confirmed position for good).
func TestLonePoisonKeysParkOneAfterAnother(t *testing.T) {
	pool := logicalPool(t)
	b := startNATS(t)
	w := walWriter(t)
	pub := &failing{Publisher: b.pub}
	pub.on.Store(true)
	r := newRelay(t, pool, pub, func(c *walrelay.Config) { c.Backoff = func(int) time.Duration { return time.Hour } })
	runRelay(t, r)
	waitFor(t, 30*time.Second, "the relay to stream", func() bool { return r.Status().Streaming })

	write(t, pool, w, false, payload{Key: "p", N: 1, Tag: "poison"})
	waitFor(t, 30*time.Second, "the first poison event parked", func() bool { return r.Status().Parked == 1 })
	write(t, pool, w, false, payload{Key: "q", N: 1, Tag: "poison"})
	waitFor(t, 30*time.Second, "the second poison event parked", func() bool { return r.Status().Parked == 2 })
	if s := r.Status(); s.BreakerOpen {
		t.Errorf("status %+v: the breaker opened on two lone poison keys", s)
	}
	if rows := outboxRows(t, pool); len(rows) != 2 || rows[0][1] != "p" || rows[1][1] != "q" {
		t.Errorf("outbox rows %v: want the two poison events, p then q", rows)
	}
}
