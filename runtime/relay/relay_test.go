package relay

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/outboxgen/outboxgen/runtime/dialect"
	"github.com/outboxgen/outboxgen/runtime/driver"
	"github.com/outboxgen/outboxgen/runtime/outbox"
)

// 1. Happy path: everything committed is published exactly once, with the
// right UUID, topic, payload and metadata; rows end sent with sent_at set.
func TestHappyPath(t *testing.T) {
	forEachDialect(t, func(t *testing.T, db *sql.DB, d dialect.Dialect, drv driver.Driver) {
		pub := newRecPub(t)
		// A real subscriber on the in-process broker sees what consumers see.
		subCtx, subCancel := context.WithCancel(context.Background())
		defer subCancel()
		var evs []ev
		for i := range 30 {
			topic := []string{"orders", "payments"}[i%2]
			evs = append(evs, ev{Key: fmt.Sprintf("k%d", i%7), Topic: topic, Headers: map[string]string{"traceparent": fmt.Sprintf("tp-%d", i)}})
		}
		chans := map[string]<-chan *message.Message{}
		for _, topic := range []string{"orders", "payments"} {
			ch, err := pub.inner.Subscribe(subCtx, topic)
			if err != nil {
				t.Fatal(err)
			}
			chans[topic] = ch
		}
		ins := insertEvents(t, db, d, evs...)
		// A stored header named like the relay's metadata (the Writer
		// refuses them; an older writer or a hand-written row may not)
		// loses to the relay's value.
		for i, e := range ins {
			h := fmt.Sprintf(`{"traceparent": "tp-%d", "outbox_type": "spoofed"}`, i)
			if _, err := db.Exec("UPDATE "+table+" SET headers = "+d.Placeholder(1)+" WHERE event_id = "+d.Placeholder(2), h, e.ID); err != nil {
				t.Fatal(err)
			}
		}

		opts := testOptions(pub, "happy")
		failOnPollErrors(t, &opts)
		r := mustRelay(t, drv, opts)
		stop := runRelay(t, r)
		r.Notify()
		waitFor(t, "all rows sent", func() bool { return count(t, db, "status = 1") == len(ins) })
		stop()

		got := map[string]*message.Message{}
		gotTopic := map[string]string{}
		for topic, ch := range chans {
		drain:
			for {
				select {
				case m := <-ch:
					m.Ack()
					if got[m.UUID] != nil {
						t.Errorf("event %s delivered twice", m.UUID)
					}
					got[m.UUID] = m
					gotTopic[m.UUID] = topic
				case <-time.After(200 * time.Millisecond):
					break drain
				}
			}
		}
		if len(got) != len(ins) {
			t.Fatalf("subscriber got %d messages, want %d", len(got), len(ins))
		}
		for _, e := range ins {
			m := got[e.ID]
			if m == nil {
				t.Fatalf("event %s not delivered", e.ID)
			}
			if gotTopic[e.ID] != e.Topic {
				t.Errorf("event %s on topic %q, want %q", e.ID, gotTopic[e.ID], e.Topic)
			}
			// MySQL normalises JSON text, so compare after a round trip.
			if norm(string(m.Payload)) != norm(e.Payload) {
				t.Errorf("payload %s, want %s", m.Payload, e.Payload)
			}
			want := map[string]string{
				MetadataType: "ORDER_PAID", MetadataKey: e.Key, MetadataVersion: "2", MetadataEventID: e.ID,
				MetadataPartitionKey: e.Key, "traceparent": e.Headers["traceparent"],
			}
			for k, v := range want {
				if m.Metadata.Get(k) != v {
					t.Errorf("metadata %s = %q, want %q", k, m.Metadata.Get(k), v)
				}
			}
			if seq := m.Metadata.Get(MetadataSequence); seq != fmt.Sprint(e.ID0(t, db, d)) {
				t.Errorf("metadata %s = %q, want the row id", MetadataSequence, seq)
			}
			meta, err := outbox.ParseMeta(m.Metadata, m.UUID)
			if err != nil || meta.Key != e.Key || meta.EventID != e.ID || meta.Version != 2 {
				t.Errorf("outbox.ParseMeta = %+v, %v", meta, err)
			}
			ts, err := time.Parse(time.RFC3339Nano, m.Metadata.Get(MetadataCreatedAt))
			if err != nil || ts.IsZero() || time.Since(ts) > time.Hour || time.Until(ts) > time.Hour {
				t.Errorf("created_at metadata %q (%v) is not a recent RFC 3339 time", m.Metadata.Get(MetadataCreatedAt), err)
			}
			s := state(t, db, d, e.ID)
			if s.Status != 1 || !s.SentAtSet || s.LeaseOwner.Valid || s.RetryCount != 0 {
				t.Errorf("row %s: %+v, want sent, sent_at set, no lease", e.ID, s)
			}
		}
		for id, n := range pub.successCount() {
			if n != 1 {
				t.Errorf("event %s published %d times", id, n)
			}
		}
	})
}

func norm(s string) string { return strings.Join(strings.Fields(s), "") }

// A hot key is not limited to one event per poll: one poll claims and
// publishes all its events, in id order. Unordered types neither wait nor
// block.
func TestHotKeyOnePoll(t *testing.T) {
	forEachDialect(t, func(t *testing.T, db *sql.DB, d dialect.Dialect, drv driver.Driver) {
		pub := newRecPub(t)
		var evs []ev
		for range 20 {
			evs = append(evs, ev{Key: "hot"})
		}
		ins := insertEvents(t, db, d, evs...)
		opts := testOptions(pub, "hot")
		r := mustRelay(t, drv, opts)
		n, err := r.poll(context.Background())
		if err != nil || n != 20 {
			t.Fatalf("poll: %d rows, %v; want 20", n, err)
		}
		order := pub.firstOrderByKey()["hot"]
		for i, e := range ins {
			if order[i] != e.ID {
				t.Fatalf("hot key published out of order at %d", i)
			}
		}

		// Unordered type: its failure does not hold back the key.
		opts.EventTypes = []outbox.EventType{{Name: "VIEWED", Ordered: false}}
		opts.InstanceID = "hot2"
		opts.Backoff = func(int) time.Duration { return time.Hour }
		r = mustRelay(t, drv, opts)
		u := insertEvents(t, db, d, ev{Key: "k", Type: "VIEWED"}, ev{Key: "k", Type: "VIEWED"}, ev{Key: "k"}, ev{Key: "k"})
		pub.setFail(func(m *message.Message) error {
			if m.UUID == u[0].ID || m.UUID == u[2].ID {
				return errBrokerDown
			}
			return nil
		})
		if n, err := r.poll(context.Background()); err != nil || n != 4 {
			t.Fatalf("poll: %d rows, %v; want 4", n, err)
		}
		c := pub.successCount()
		if c[u[1].ID] != 1 || c[u[0].ID] != 0 || c[u[2].ID] != 0 || c[u[3].ID] != 0 {
			t.Fatalf("unordered event must flow, ordered key held: %v", c)
		}
		if s := state(t, db, d, u[3].ID); s.Status != 0 || s.RetryCount != 0 || s.LeaseOwner.Valid {
			t.Fatalf("event behind a failure must be released untouched: %+v", s)
		}
	})
}

// 2. Broker down: nothing lost, no attempt charged (the circuit breaker
// takes a batch failing across keys for an outage), claiming pauses while
// the breaker is open but for one probe row per pause, and the backlog
// drains in order after recovery.
func TestBrokerDown(t *testing.T) {
	forEachDialect(t, func(t *testing.T, db *sql.DB, d dialect.Dialect, drv driver.Driver) {
		ctx := context.Background()
		pub := newRecPub(t)
		pub.setFail(func(*message.Message) error { return errBrokerDown })
		var evs []ev
		for _, k := range keys("k", 10) {
			evs = append(evs, ev{Key: k}, ev{Key: k})
		}
		ins := insertEvents(t, db, d, evs...)

		opts := testOptions(pub, "down")
		failOnPollErrors(t, &opts)
		opts.MaxAttempts = 1 // a charged attempt would turn a row FAILED
		opts.BreakerBackoff = func(int) time.Duration { return time.Hour }
		r := mustRelay(t, drv, opts)

		// First poll: the oldest event of each key is tried once; the
		// breaker opens and every row is released uncharged.
		if _, err := r.poll(ctx); err != nil {
			t.Fatal(err)
		}
		if got := pub.totalAttempts(); got != 10 {
			t.Fatalf("attempts after one poll = %d, want 10 (one per key)", got)
		}
		if !r.brk.open {
			t.Fatal("breaker closed after a batch failing on 10 keys")
		}
		// More polls while the breaker is open: no claim, no attempt.
		for range 5 {
			if n, err := r.poll(ctx); err != nil || n != 0 {
				t.Fatalf("poll with the breaker open claimed %d rows (%v), want 0", n, err)
			}
		}
		if got := pub.totalAttempts(); got != 10 {
			t.Fatalf("attempts with the breaker open = %d, want still 10 (hot loop?)", got)
		}
		if got := count(t, db, "retry_count = 0 AND status = 0 AND last_error IS NULL AND lease_owner IS NULL"); got != len(ins) {
			t.Fatalf("%d rows pending, uncharged and released, want all %d", got, len(ins))
		}

		// The pause ends (moved rather than slept): one probe row, failing,
		// not charged; the breaker stays open.
		r.brk.next = time.Time{}
		if _, err := r.poll(ctx); err != nil {
			t.Fatal(err)
		}
		if got := pub.totalAttempts(); got != 11 {
			t.Fatalf("attempts after a probe = %d, want 11", got)
		}
		if !r.brk.open || count(t, db, "retry_count = 0 AND status = 0 AND lease_owner IS NULL") != len(ins) {
			t.Fatal("a failed probe closed the breaker or charged a row")
		}

		// Recovery: the next probe succeeds and closes the breaker; the
		// loop drains everything in order.
		pub.setFail(nil)
		r.brk.next = time.Time{}
		if _, err := r.poll(ctx); err != nil {
			t.Fatal(err)
		}
		if r.brk.open {
			t.Fatal("a successful probe left the breaker open")
		}
		stop := runRelay(t, r)
		waitFor(t, "backlog drained", func() bool { return count(t, db, "status = 1") == len(ins) })
		stop()
		c := pub.successCount()
		for _, e := range ins {
			if c[e.ID] != 1 {
				t.Errorf("event %s published %d times after recovery, want 1", e.ID, c[e.ID])
			}
		}
		if got := count(t, db, "retry_count > 0 OR status = 2"); got != 0 {
			t.Fatalf("%d rows charged by the outage", got)
		}
		checkKeyOrder(t, pub, ins)
	})
}

// A single key failing is no outage: its attempts are charged, with the
// backoff honoured (polls while it backs off attempt nothing), while the
// other keys flow.
func TestOneKeyDownBacksOff(t *testing.T) {
	forEachDialect(t, func(t *testing.T, db *sql.DB, d dialect.Dialect, drv driver.Driver) {
		ctx := context.Background()
		pub := newRecPub(t)
		ins := insertEvents(t, db, d, ev{Key: "bad"}, ev{Key: "bad"}, ev{Key: "ok"})
		pub.setFail(func(m *message.Message) error {
			if m.Metadata.Get(MetadataKey) == "bad" {
				return errBrokerDown
			}
			return nil
		})
		opts := testOptions(pub, "onekey")
		failOnPollErrors(t, &opts)
		opts.Backoff = func(int) time.Duration { return time.Hour }
		r := mustRelay(t, drv, opts)
		if _, err := r.poll(ctx); err != nil {
			t.Fatal(err)
		}
		for range 3 {
			if n, err := r.poll(ctx); err != nil || n != 0 {
				t.Fatalf("poll during backoff claimed %d rows (%v), want 0", n, err)
			}
		}
		if r.brk.open || pub.attemptsOf(ins[0].ID) != 1 || pub.attemptsOf(ins[1].ID) != 0 || pub.successCount()[ins[2].ID] != 1 {
			t.Fatalf("breaker open %v, attempts %d/%d, ok published %d", r.brk.open, pub.attemptsOf(ins[0].ID), pub.attemptsOf(ins[1].ID), pub.successCount()[ins[2].ID])
		}
		if got := count(t, db, "retry_count = 1 AND status = 0 AND last_error IS NOT NULL AND next_retry_time > "+d.Now()); got != 1 {
			t.Fatalf("%d rows backing off with retry_count 1, want 1", got)
		}
	})
}

// checkKeyOrder asserts that, per key, first successful publishes follow
// insertion (id) order.
func checkKeyOrder(t *testing.T, pub *recPub, ins []inserted) {
	t.Helper()
	want := map[string][]string{}
	for _, e := range ins {
		want[e.Key] = append(want[e.Key], e.ID)
	}
	got := pub.firstOrderByKey()
	for k, ids := range want {
		g := got[k]
		// got may hold events of this key inserted by others; keep ours.
		mine := map[string]bool{}
		for _, id := range ids {
			mine[id] = true
		}
		var seq []string
		for _, id := range g {
			if mine[id] {
				seq = append(seq, id)
			}
		}
		if len(seq) != len(ids) {
			t.Errorf("key %s: %d of %d events published", k, len(seq), len(ids))
			continue
		}
		for i := range ids {
			if seq[i] != ids[i] {
				t.Errorf("key %s: publish order differs from id order at position %d", k, i)
				break
			}
		}
	}
}

// 3. Poison event: FAILED after MaxAttempts with last_error; other keys
// flow; later events of the same key are held back; Requeue after the fix
// publishes the key in order.
func TestPoisonEvent(t *testing.T) {
	forEachDialect(t, func(t *testing.T, db *sql.DB, d dialect.Dialect, drv driver.Driver) {
		ctx := context.Background()
		pub := newRecPub(t)
		ins := insertEvents(t, db, d, ev{Key: "A"}, ev{Key: "B"}, ev{Key: "A"}, ev{Key: "B"}, ev{Key: "A"})
		poison := ins[0].ID
		a := []string{ins[0].ID, ins[2].ID, ins[4].ID}
		long := strings.Repeat("é", 3000) // 6000 bytes: must be cut to 2 KB on a rune boundary
		pub.setFail(func(m *message.Message) error {
			if m.UUID == poison {
				return fmt.Errorf("poison: %s", long)
			}
			return nil
		})
		var failedSeen []FailedEvent
		opts := testOptions(pub, "poison")
		opts.MaxAttempts = 3
		opts.Backoff = func(int) time.Duration { return 0 }
		opts.OnFailed = func(f FailedEvent) { failedSeen = append(failedSeen, f) }
		r := mustRelay(t, drv, opts)

		for range 3 {
			if _, err := r.poll(ctx); err != nil {
				t.Fatal(err)
			}
		}
		// Nothing left to claim: A is held behind its FAILED head.
		for range 2 {
			if n, err := r.poll(ctx); err != nil || n != 0 {
				t.Fatalf("poll claimed %d rows (%v), want 0", n, err)
			}
		}
		if got := pub.attemptsOf(poison); got != 3 {
			t.Fatalf("poison attempts = %d, want MaxAttempts 3", got)
		}
		c := pub.successCount()
		if c[ins[1].ID] != 1 || c[ins[3].ID] != 1 {
			t.Fatalf("key B must flow: %v", c)
		}
		for _, id := range a[1:] {
			if pub.attemptsOf(id) != 0 {
				t.Fatalf("event %s behind the poison event was published", id)
			}
			// Held: pending, never tried, out of the claims' way until the
			// poison row is requeued.
			if s := state(t, db, d, id); s.Status != 0 || s.RetryCount != 0 || s.LeaseOwner.String != dialect.HeldOwner {
				t.Fatalf("held-back event: %+v, want pending, held (lease_owner %q), never tried", s, dialect.HeldOwner)
			}
		}
		s := state(t, db, d, poison)
		if s.Status != 2 || s.RetryCount != 3 || s.LeaseOwner.Valid {
			t.Fatalf("poison row: %+v, want failed after 3", s)
		}
		failed, err := r.ListFailed(ctx, 10)
		if err != nil {
			t.Fatal(err)
		}
		if len(failed) != 1 || failed[0].EventID != poison || failed[0].Key != "A" || failed[0].RetryCount != 3 ||
			!strings.HasPrefix(failed[0].LastError, "poison: é") || len(failed[0].LastError) > dialect.ErrorTextLimit ||
			failed[0].UpdatedAt.IsZero() {
			t.Fatalf("ListFailed = %+v", failed)
		}
		if !strings.HasSuffix(failed[0].LastError, "é") {
			t.Fatalf("last_error not cut on a rune boundary: ...%q", failed[0].LastError[len(failed[0].LastError)-4:])
		}
		if len(failedSeen) != 1 || failedSeen[0].EventID != poison {
			t.Fatalf("OnFailed calls = %+v, want one for the poison event", failedSeen)
		}

		// Requeue ignores non-failed ids; after the fix the key goes out in order.
		if n, err := r.Requeue(ctx, ins[1].ID0(t, db, d), s.ID); err != nil || n != 1 {
			t.Fatalf("Requeue = %d, %v; want 1", n, err)
		}
		if n, err := r.Requeue(ctx, s.ID); err != nil || n != 0 {
			t.Fatalf("second Requeue = %d, %v; want 0", n, err)
		}
		pub.setFail(nil)
		if n, err := r.poll(ctx); err != nil || n != 3 {
			t.Fatalf("poll after requeue claimed %d (%v), want 3", n, err)
		}
		checkKeyOrder(t, pub, ins)
		if got := count(t, db, "status = 1"); got != 5 {
			t.Fatalf("%d rows sent, want 5", got)
		}
		if failed, _ := r.ListFailed(ctx, 10); len(failed) != 0 {
			t.Fatalf("failed rows left: %+v", failed)
		}
	})
}

// ID0 returns the row id of an inserted event.
func (e inserted) ID0(t *testing.T, db *sql.DB, d dialect.Dialect) int64 {
	return state(t, db, d, e.ID).ID
}

// 4. Per-key order with 3 relay instances and 20% random publish failures:
// per key, first successful publishes follow id order; all get published.
func TestKeyOrderThreeInstances(t *testing.T) {
	forEachDialect(t, func(t *testing.T, db *sql.DB, d dialect.Dialect, drv driver.Driver) {
		pub := newRecPub(t)
		var rmu sync.Mutex
		rng := rand.New(rand.NewPCG(1, 2))
		pub.setFail(func(*message.Message) error {
			rmu.Lock()
			defer rmu.Unlock()
			if rng.IntN(5) == 0 {
				return errBrokerDown
			}
			return nil
		})
		ks := keys("agg", 12)
		var ins []inserted
		batch := func() {
			var evs []ev
			for i := range 60 {
				evs = append(evs, ev{Key: ks[rand.IntN(len(ks))], Topic: []string{"a", "b"}[i%2]})
			}
			ins = append(ins, insertEvents(t, db, d, evs...)...)
		}
		batch()
		var relays []*Relay
		for i := range 3 {
			opts := testOptions(pub, fmt.Sprintf("relay-%d", i))
			opts.BatchSize = 16
			opts.Concurrency = 4
			failOnPollErrors(t, &opts)
			r := mustRelay(t, drv, opts)
			relays = append(relays, r)
			runRelay(t, r)
		}
		batch() // more arrive while relays run
		batch()
		for _, r := range relays {
			r.Notify()
		}
		waitFor(t, "all published", func() bool { return count(t, db, "status = 1") == len(ins) })
		checkKeyOrder(t, pub, ins)
		if count(t, db, "status = 2") != 0 {
			t.Fatal("no row may fail with MaxAttempts 1000")
		}
	})
}

// 5. N concurrent writers (some rolling back) and M relays: every committed
// event is published at least once, no rolled-back event ever.
func TestConcurrentWritersAndRelays(t *testing.T) {
	forEachDialect(t, func(t *testing.T, db *sql.DB, d dialect.Dialect, drv driver.Driver) {
		pub := newRecPub(t)
		var relays []*Relay
		for i := range 3 {
			opts := testOptions(pub, fmt.Sprintf("relay-%d", i))
			opts.BatchSize = 20
			failOnPollErrors(t, &opts)
			r := mustRelay(t, drv, opts)
			relays = append(relays, r)
			runRelay(t, r)
		}
		w := outbox.MustNewWriter(d, table)
		const writers, txs = 6, 15
		var mu sync.Mutex
		committed, rolledBack := map[string]string{}, map[string]bool{} // event id -> key
		var wg sync.WaitGroup
		errs := make(chan error, writers)
		for wi := range writers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				rng := rand.New(rand.NewPCG(uint64(wi), 7))
				for j := range txs {
					tx, err := db.Begin()
					if err != nil {
						errs <- err
						return
					}
					ids := map[string]string{}
					for range 1 + rng.IntN(3) {
						// Each key has one writer, inserting sequentially:
						// the per-key order condition holds.
						key := fmt.Sprintf("w%d-k%d", wi, j%4)
						id, err := w.Insert(context.Background(), tx, outbox.Event{Type: "ORDER_PAID", Topic: "orders", Key: key, Version: 1, Payload: map[string]int{"j": j}})
						if err != nil {
							tx.Rollback()
							errs <- err
							return
						}
						ids[id.String()] = key
					}
					rollback := rng.IntN(4) == 0
					if rollback {
						err = tx.Rollback()
					} else {
						err = tx.Commit()
					}
					if err != nil {
						errs <- err
						return
					}
					mu.Lock()
					for id, k := range ids {
						if rollback {
							rolledBack[id] = true
						} else {
							committed[id] = k
						}
					}
					mu.Unlock()
					for _, r := range relays {
						r.Notify()
					}
				}
			}()
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Fatal(err)
		}
		if len(rolledBack) == 0 || len(committed) == 0 {
			t.Fatalf("test needs both outcomes: %d committed, %d rolled back", len(committed), len(rolledBack))
		}
		waitFor(t, "all committed published", func() bool { return count(t, db, "status = 1") == len(committed) })
		c := pub.successCount()
		for id := range committed {
			if c[id] < 1 {
				t.Errorf("committed event %s never published", id)
			}
		}
		for id := range rolledBack {
			if c[id] > 0 || pub.attemptsOf(id) > 0 {
				t.Errorf("rolled-back event %s was published", id)
			}
		}
		if got := count(t, db, "1 = 1"); got != len(committed) {
			t.Errorf("table holds %d rows, want %d committed", got, len(committed))
		}
	})
}

// 6. Lease expiry: rows claimed by a relay that then "crashes" (claims and
// never records) are published by another instance once the lease
// expires; the crashed owner's late writes are fenced off.
func TestLeaseExpiry(t *testing.T) {
	forEachDialect(t, func(t *testing.T, db *sql.DB, d dialect.Dialect, drv driver.Driver) {
		ctx := context.Background()
		pub := newRecPub(t)
		r := mustRelay(t, drv, testOptions(pub, "survivor"))

		// Deterministic part: a long lease blocks everyone until it ends.
		first := insertEvents(t, db, d, ev{Key: "x"}, ev{Key: "y"}, ev{Key: "x"})
		rows, err := r.drv.Claim(ctx, driver.ClaimParams{Owner: "crashed", Lease: time.Hour, Limit: 100})
		if err != nil || len(rows) != 3 {
			t.Fatalf("crashed claim: %d rows, %v", len(rows), err)
		}
		if n, err := r.poll(ctx); err != nil || n != 0 {
			t.Fatalf("poll under a live lease claimed %d (%v), want 0", n, err)
		}
		// The lease ends (moved into the past rather than slept).
		if _, err := db.Exec("UPDATE " + table + " SET lease_expires_at = created_at WHERE lease_owner = 'crashed'"); err != nil {
			t.Fatal(err)
		}
		if n, err := r.poll(ctx); err != nil || n != 3 {
			t.Fatalf("poll after lease expiry claimed %d (%v), want 3", n, err)
		}
		ids := []int64{rows[0].ID, rows[1].ID, rows[2].ID}
		if n, err := r.drv.MarkSent(ctx, "crashed", ids); err != nil || n != 0 {
			t.Fatalf("stale owner markSent changed %d rows (%v), want 0", n, err)
		}
		if _, fl, err := r.drv.MarkRetry(ctx, "crashed", []driver.Failure{{Row: rows[0], Error: "late"}}, 1); err != nil || len(fl) != 0 {
			t.Fatalf("stale owner markRetry: %v %v", fl, err)
		}
		if s := state(t, db, d, first[0].ID); s.Status != 1 || s.LastError.Valid {
			t.Fatalf("stale owner changed a row: %+v", s)
		}

		// Real expiry: a short lease runs out while the survivor polls.
		second := insertEvents(t, db, d, ev{Key: "x"}, ev{Key: "z"})
		if rows, err := r.drv.Claim(ctx, driver.ClaimParams{Owner: "crashed", Lease: 300 * time.Millisecond, Limit: 100}); err != nil || len(rows) != 2 {
			t.Fatalf("crashed claim: %d rows, %v", len(rows), err)
		}
		stop := runRelay(t, r)
		waitFor(t, "expired lease taken over", func() bool { return count(t, db, "status = 1") == 5 })
		stop()
		checkKeyOrder(t, pub, append(first, second...))
	})
}

// Graceful shutdown: Run returns after the batch in hand is recorded, and
// rows not published in time are released, not lost.
func TestShutdownRecordsInFlight(t *testing.T) {
	forEachDialect(t, func(t *testing.T, db *sql.DB, d dialect.Dialect, drv driver.Driver) {
		pub := newRecPub(t)
		started := make(chan struct{})
		release := make(chan struct{})
		var once sync.Once
		pub.setFail(func(*message.Message) error {
			once.Do(func() { close(started) })
			<-release
			return nil
		})
		insertEvents(t, db, d, ev{Key: "a"}, ev{Key: "a"}, ev{Key: "b"})
		opts := testOptions(pub, "graceful")
		opts.Concurrency = 1
		r := mustRelay(t, drv, opts)
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- r.Run(ctx) }()
		<-started
		cancel() // shutdown while the first publish is in flight
		close(release)
		if err := <-done; err != nil {
			t.Fatal(err)
		}
		if got := count(t, db, "lease_owner IS NOT NULL"); got != 0 {
			t.Fatalf("%d rows still leased after Run returned", got)
		}
		if got := count(t, db, "status = 1"); got != 3 {
			t.Fatalf("%d rows sent, want 3 (the batch in hand is finished)", got)
		}
	})
}

func TestOptionsValidate(t *testing.T) {
	pub := &recPub{}
	base := func() Config { o := Config{Publisher: pub}; o.setDefaults(); return o }
	if err := base().Validate(); err != nil {
		t.Fatalf("defaults invalid: %v", err)
	}
	o := base()
	if o.BatchSize != 100 || o.PollInterval != 2*time.Second || o.LeaseDuration != 30*time.Second || o.Concurrency != 8 ||
		o.MaxAttempts != 5 || o.OverdueAfter != 0 || o.InstanceID == "" || len(o.InstanceID) > 64 ||
		o.PublishTimeout != time.Minute || o.BreakerBackoff == nil || o.DatabaseBackoffMax != 30*time.Second {
		t.Fatalf("defaults: %+v", o)
	}
	if b1, b9 := o.BreakerBackoff(1), o.BreakerBackoff(9); b1 < 800*time.Millisecond || b1 > 1200*time.Millisecond || b9 < 48*time.Second || b9 > 72*time.Second {
		t.Fatalf("default breaker pauses %s, %s: want 1s doubling to 1m", b1, b9)
	}
	for name, mod := range map[string]func(*Config){
		"Publisher":          func(o *Config) { o.Publisher = nil },
		"OverdueAfter":       func(o *Config) { o.OverdueAfter = -1 },
		"BatchSize":          func(o *Config) { o.BatchSize = 5000 },
		"PollInterval":       func(o *Config) { o.PollInterval = -1 },
		"LeaseDuration":      func(o *Config) { o.LeaseDuration = -1 },
		"ShutdownTimeout":    func(o *Config) { o.ShutdownTimeout = time.Minute },
		"PublishTimeout":     func(o *Config) { o.PublishTimeout = -1 },
		"BreakerBackoff":     func(o *Config) { o.BreakerBackoff = nil },
		"Concurrency":        func(o *Config) { o.Concurrency = -2 },
		"MaxAttempts":        func(o *Config) { o.MaxAttempts = -1 },
		"DatabaseBackoffMax": func(o *Config) { o.DatabaseBackoffMax = -1 },
		"InstanceID":         func(o *Config) { o.InstanceID = strings.Repeat("x", 65) },
	} {
		o := base()
		mod(&o)
		err := o.Validate()
		if err == nil || !strings.Contains(err.Error(), "Config."+name) {
			t.Errorf("%s: Validate() = %v, want an error naming it", name, err)
		}
	}
	if _, err := New(nil, Config{Publisher: pub}); err == nil {
		t.Error("New(nil driver) succeeded")
	}
}

func TestDefaultBackoff(t *testing.T) {
	nominal := []time.Duration{1, 2, 4, 8, 16, 32, 64, 64, 64}
	for i, n := range nominal {
		want := n * time.Minute
		for range 50 {
			got := DefaultBackoff(i + 1)
			if got < want*8/10 || got > want*12/10 {
				t.Fatalf("attempt %d: %s outside %s ±20%%", i+1, got, want)
			}
		}
	}
	if got := ExponentialBackoff(time.Second, time.Minute, 0)(3); got != 4*time.Second {
		t.Fatalf("no jitter: %s", got)
	}
}

// Shutdown with a publish that outlives ShutdownTimeout: the stuck publish
// is cancelled through the message context and released without charging
// an attempt (it was cut off, not refused), the rest of its key is
// released, Run returns, and no lease is left behind.
func TestShutdownTimeoutReleases(t *testing.T) {
	forEachDialect(t, func(t *testing.T, db *sql.DB, d dialect.Dialect, drv driver.Driver) {
		pub := newRecPub(t)
		started := make(chan struct{})
		var once sync.Once
		pub.setFail(func(m *message.Message) error {
			once.Do(func() { close(started) })
			<-m.Context().Done() // a broker that never answers
			return m.Context().Err()
		})
		ins := insertEvents(t, db, d, ev{Key: "a"}, ev{Key: "a"})
		opts := testOptions(pub, "slow")
		opts.ShutdownTimeout = time.Second
		opts.Backoff = func(int) time.Duration { return time.Hour }
		r := mustRelay(t, drv, opts)
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- r.Run(ctx) }()
		<-started
		cancel()
		if err := <-done; err != nil {
			t.Fatal(err)
		}
		if got := count(t, db, "lease_owner IS NOT NULL"); got != 0 {
			t.Fatalf("%d rows still leased after Run returned", got)
		}
		if s := state(t, db, d, ins[0].ID); s.Status != 0 || s.RetryCount != 0 || s.LastError.Valid || pub.attemptsOf(ins[0].ID) != 1 {
			t.Fatalf("cut-off publish: %+v, want released without a charged attempt", s)
		}
		if s := state(t, db, d, ins[1].ID); s.Status != 0 || s.RetryCount != 0 || pub.attemptsOf(ins[1].ID) != 0 {
			t.Fatalf("row behind it: %+v, want released untouched", s)
		}
	})
}

// RunOnce drains every claimable row, batch after batch, and reports how
// many it published; OverdueAfter leaves young rows alone.
func TestRunOnce(t *testing.T) {
	forEachDialect(t, func(t *testing.T, db *sql.DB, d dialect.Dialect, drv driver.Driver) {
		ctx := context.Background()
		pub := newRecPub(t)
		var evs []ev
		for i := range 10 {
			evs = append(evs, ev{Key: fmt.Sprintf("k%d", i%3)})
		}
		ins := insertEvents(t, db, d, evs...)
		opts := testOptions(pub, "once")
		opts.BatchSize = 3
		opts.OverdueAfter = time.Hour
		r := mustRelay(t, drv, opts)
		if n, err := r.RunOnce(ctx); err != nil || n != 0 {
			t.Fatalf("RunOnce with young rows = %d, %v; want 0", n, err)
		}
		opts.OverdueAfter = 0
		r = mustRelay(t, drv, opts)
		if n, err := r.RunOnce(ctx); err != nil || n != len(ins) {
			t.Fatalf("RunOnce = %d, %v; want %d", n, err, len(ins))
		}
		checkKeyOrder(t, pub, ins)
		cctx, cancel := context.WithCancel(ctx)
		cancel()
		if _, err := r.RunOnce(cctx); !errors.Is(err, context.Canceled) {
			t.Fatalf("RunOnce on a done context = %v", err)
		}
	})
}
