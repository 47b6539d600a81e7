package walrelay_test

import (
	"context"
	"encoding/json"
	"errors"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxgen/outboxgen/runtime/outbox"
	"github.com/outboxgen/outboxgen/runtime/outbox/pgxoutbox"
	"github.com/outboxgen/outboxgen/runtime/relay"
	"github.com/outboxgen/outboxgen/runtime/walrelay"
)

// batchBroker is an in-memory publisher that records every Publish call
// (the broker is not the subject here: the relay's batching is). Each call
// takes a few milliseconds, so that events queue up and the relay batches
// them; the first failBatches calls with more than one message fail
// without taking any.
type batchBroker struct {
	mu          sync.Mutex
	calls       [][]got // the messages of each accepted call, in call order
	failed      int     // refused calls
	failBatches int
	inCall      map[string]bool // keys being published right now
	overlap     []string        // keys published by two calls at once
	delay       time.Duration
	// The next partBatches calls with more than one message (after the
	// refused ones) store only the messages at even positions, and say
	// so (relay.PartialError); parted counts them.
	partBatches, parted int
}

func (b *batchBroker) Publish(_ string, msgs ...*message.Message) error {
	var call []got
	for _, m := range msgs {
		var p payload
		if err := json.Unmarshal(m.Payload, &p); err != nil {
			return err
		}
		call = append(call, got{EventID: m.UUID, payload: p, Meta: m.Metadata})
	}
	b.mu.Lock()
	for _, g := range call {
		if b.inCall[g.Key] {
			b.overlap = append(b.overlap, g.Key)
		}
		b.inCall[g.Key] = true
	}
	fail := len(msgs) > 1 && b.failed < b.failBatches
	if fail {
		b.failed++
	}
	part := !fail && len(msgs) > 1 && b.parted < b.partBatches
	if part {
		b.parted++
	}
	b.mu.Unlock()
	time.Sleep(b.delay)
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, g := range call {
		delete(b.inCall, g.Key)
	}
	if fail {
		return errors.New("batch refused (test broker)")
	}
	if part {
		stored := make([]bool, len(call))
		var took []got
		for i, g := range call {
			if stored[i] = i%2 == 0; stored[i] {
				took = append(took, g)
			}
		}
		b.calls = append(b.calls, took)
		return relay.Partial(errors.New("odd messages refused (test broker)"), stored)
	}
	b.calls = append(b.calls, call)
	return nil
}

func (b *batchBroker) Close() error { return nil }

// delivered returns the accepted messages in the order the broker took
// them, and the largest call.
func (b *batchBroker) delivered() (msgs []got, largest int) {
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, c := range b.calls {
		msgs = append(msgs, c...)
		largest = max(largest, len(c))
	}
	return msgs, largest
}

// TestBatchedPublishKeepsOrderAndAccounting: with a backlog, the relay
// publishes the heads of several keys in one Publish call; no call holds
// two events of one key and no key is in two calls at once (per-key
// order); a refused batch is published again one event at a time, charged
// to nobody (nothing parked, the breaker stays closed); every event
// arrives in per-key order and the confirmed position passes the last
// commit.
func TestBatchedPublishKeepsOrderAndAccounting(t *testing.T) {
	pool := logicalPool(t)
	w := walWriter(t)
	br := &batchBroker{failBatches: 3, inCall: map[string]bool{}, delay: 5 * time.Millisecond}
	r := newRelay(t, pool, br, func(c *walrelay.Config) { c.Concurrency = 4 })
	// Written before the relay starts, so that it finds a backlog.
	if err := r.Setup(context.Background()); err != nil {
		t.Fatal(err)
	}
	const keys, rounds = 12, 10
	want := writeRounds(t, pool, w, keys, rounds, nil)
	// One transaction whose now() the test knows: the envelope's creation
	// time is exactly it.
	ctx := context.Background()
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var txNow time.Time
	if err := tx.QueryRow(ctx, "SELECT now()").Scan(&txNow); err != nil {
		t.Fatal(err)
	}
	want["timed"] = 1
	timedID, err := w.InsertTx(ctx, pgxoutbox.Tx(tx), outbox.Event{Type: "ORDER_CHANGED", Topic: topic, Key: "timed", Version: 1, Payload: payload{Key: "timed", N: 1}})
	if err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	head := walInsertLSN(t, pool)
	total := keys*rounds + 1

	runRelay(t, r)
	waitFor(t, 60*time.Second, "every event at the broker", func() bool {
		msgs, _ := br.delivered()
		return distinct(msgs) >= total
	})
	msgs, largest := br.delivered()
	if dups := checkOrder(t, msgs, want); dups != 0 {
		t.Errorf("%d duplicates: the refused batches took nothing, so none was expected", dups)
	}
	if largest < 2 {
		t.Errorf("the largest Publish call carried %d message(s): with a backlog, the relay should batch the heads of several keys", largest)
	}
	if largest > walrelay.MaxPublishBatch {
		t.Errorf("a Publish call carried %d messages: more than MaxPublishBatch (%d)", largest, walrelay.MaxPublishBatch)
	}
	br.mu.Lock()
	for i, c := range br.calls {
		seen := map[string]bool{}
		for _, g := range c {
			if seen[g.Key] {
				t.Errorf("call %d carried two events of key %s", i, g.Key)
			}
			seen[g.Key] = true
		}
	}
	if len(br.overlap) > 0 {
		t.Errorf("keys %v were in two Publish calls at once: per-key order needs one at a time", br.overlap)
	}
	if br.failed != br.failBatches {
		t.Errorf("%d batches refused, want %d (the test needs the relay to batch)", br.failed, br.failBatches)
	}
	br.mu.Unlock()
	for _, m := range msgs {
		if m.EventID != timedID.String() {
			continue
		}
		meta, err := outbox.ParseMeta(m.Meta, m.EventID)
		if err != nil {
			t.Fatal(err)
		}
		if !meta.CreatedAt.Equal(txNow) {
			t.Errorf("created_at %s, want the writing transaction's now() %s", meta.CreatedAt, txNow)
		}
	}
	waitFor(t, 10*time.Second, "the slot's confirmed_flush_lsn to pass the last commit", func() bool {
		s, err := walrelay.SlotStatus(ctx, pool, r.Slot())
		if err != nil {
			t.Fatal(err)
		}
		c, _ := pglogrepl.ParseLSN(s.ConfirmedFlush)
		return s.Exists && c >= head
	})
	if st := r.Status(); st.Published != int64(total) || st.Parked != 0 || st.BreakerOpen || st.InFlight != 0 {
		t.Errorf("status %+v: want %d published, nothing parked or in flight, the breaker closed", st, total)
	}
	if n := len(outboxRows(t, pool)); n != 0 {
		t.Errorf("%d rows parked: a refused batch must not park anything", n)
	}
}

// TestBatchPartlyStoredSendsOnlyTheRest: a batch call the broker stored
// only part of (its error a relay.PartialError) settles the stored events
// and publishes only the others again, one by one: no event reaches the
// broker twice, each key keeps its order, and nothing is parked or
// charged to the breaker.
func TestBatchPartlyStoredSendsOnlyTheRest(t *testing.T) {
	pool := logicalPool(t)
	w := walWriter(t)
	br := &batchBroker{partBatches: 4, inCall: map[string]bool{}, delay: 5 * time.Millisecond}
	reader, mp := testMeter(t)
	r := newRelay(t, pool, br, func(c *walrelay.Config) { c.Concurrency = 4; c.MeterProvider = mp })
	if err := r.Setup(context.Background()); err != nil {
		t.Fatal(err)
	}
	const keys, rounds = 12, 10
	want := writeRounds(t, pool, w, keys, rounds, nil)
	total := keys * rounds
	runRelay(t, r)
	waitFor(t, 60*time.Second, "every event at the broker", func() bool {
		msgs, _ := br.delivered()
		return distinct(msgs) >= total
	})
	waitFor(t, 10*time.Second, "every event settled", func() bool { return r.Status().InFlight == 0 })
	msgs, _ := br.delivered()
	if dups := checkOrder(t, msgs, want); dups != 0 {
		t.Errorf("%d events reached the broker twice: the stored events of a partly stored call were published again", dups)
	}
	br.mu.Lock()
	if br.parted != br.partBatches {
		t.Errorf("%d calls partly stored, want %d (the test needs the relay to batch)", br.parted, br.partBatches)
	}
	br.mu.Unlock()
	if st := r.Status(); st.Published != int64(total) || st.Parked != 0 || st.BreakerOpen {
		t.Errorf("status %+v: want %d published, nothing parked, the breaker closed", st, total)
	}
	if n := len(outboxRows(t, pool)); n != 0 {
		t.Errorf("%d rows parked: a partly stored batch must not park anything", n)
	}
	// Each stored event's send counts as published once, not failed.
	if got := metricValues(t, reader)["outboxgen.relay.published"]; got != float64(total) {
		t.Errorf("outboxgen.relay.published = %v, want %d", got, total)
	}
}

// writeRounds commits rounds transactions, each with the next event of
// keys keys (k0, k1, ...), plus those extra(round) adds (nil: none), and
// returns how many events of each key k it wrote.
func writeRounds(t *testing.T, pool *pgxpool.Pool, w *outbox.WALWriter, keys, rounds int, extra func(round int) []payload) map[string]int {
	t.Helper()
	want := map[string]int{}
	for round := range rounds {
		var evs []payload
		for k := range keys {
			key := "k" + strconv.Itoa(k)
			want[key]++
			evs = append(evs, payload{Key: key, N: want[key]})
		}
		if extra != nil {
			evs = append(evs, extra(round)...)
		}
		write(t, pool, w, false, evs...)
	}
	return want
}
