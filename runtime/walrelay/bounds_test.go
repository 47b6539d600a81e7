package walrelay_test

// What bounds the relay when events do not settle: a park that cannot
// succeed stops Run, a park that may succeed is retried with the backlog
// behind it bounded, and the content bytes held are bounded.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxgen/outboxgen/internal/testdb"
	"github.com/outboxgen/outboxgen/runtime/outbox"
	"github.com/outboxgen/outboxgen/runtime/walrelay"
)

// failInserts makes every INSERT into the outbox table fail with SQLSTATE
// code, for the first n (all when n is 0), as a trigger.
func failInserts(t *testing.T, pool *pgxpool.Pool, n int, codes ...string) {
	t.Helper()
	ctx := context.Background()
	arr := "ARRAY['" + strings.Join(codes, "','") + "']"
	stmts := []string{
		"CREATE SEQUENCE test_insert_fails",
		`CREATE FUNCTION test_fail_insert() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE i bigint := nextval('test_insert_fails'); codes text[] := ` + arr + `;
BEGIN
	IF ` + strconv.Itoa(n) + ` = 0 OR i <= ` + strconv.Itoa(n) + ` THEN
		RAISE EXCEPTION 'test: insert refused (%)', i USING ERRCODE = codes[1 + (i - 1) % array_length(codes, 1)];
	END IF;
	RETURN NEW;
END $$`,
		"CREATE TRIGGER test_fail_insert BEFORE INSERT ON " + testdb.Tables.Outbox + " FOR EACH ROW EXECUTE FUNCTION test_fail_insert()",
	}
	for _, s := range stmts {
		if _, err := pool.Exec(ctx, s); err != nil {
			t.Fatalf("%v\n%s", err, s)
		}
	}
}

// TestParkPermissionDeniedStopsRun: a park refused with "permission
// denied" (the relay role lacks INSERT) is not retried forever, holding
// the slot: Run stops with the GRANT to run, the slot stays before the
// event, and a relay started once the cause is fixed parks it.
func TestParkPermissionDeniedStopsRun(t *testing.T) {
	pool := logicalPool(t)
	b := startNATS(t)
	w := walWriter(t)
	failInserts(t, pool, 0, "42501")
	pub := &failing{Publisher: b.pub}
	pub.on.Store(true)
	r := newRelay(t, pool, pub, nil)
	if err := r.Setup(context.Background()); err != nil {
		t.Fatal(err)
	}
	write(t, pool, w, false, payload{Key: "p", N: 1, Tag: "poison"}, payload{Key: "ok", N: 1})
	write(t, pool, w, false, payload{Key: "ok", N: 2})

	err := runFor(t, r, 60*time.Second)
	if err == nil {
		t.Fatal("Run returned nil; want the park's error")
	}
	for _, want := range []string{"GRANT INSERT ON " + testdb.Tables.Outbox + " TO ", "42501", "park event", "neither published nor parked"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("the error lacks %q: %v", want, err)
		}
	}
	if st := r.Status(); st.Parked != 0 {
		t.Errorf("status %+v: nothing could be parked", st)
	}

	// The grant is run: the next relay streams p/1 again and parks it.
	if _, err := pool.Exec(context.Background(), "DROP TRIGGER test_fail_insert ON "+testdb.Tables.Outbox); err != nil {
		t.Fatal(err)
	}
	r2 := newRelay(t, pool, pub, nil)
	runRelay(t, r2)
	waitFor(t, 30*time.Second, "p/1 parked by the next relay", func() bool { return r2.Status().Parked == 1 })
	if rows := outboxRows(t, pool); len(rows) != 1 || rows[0][1] != "p" {
		t.Errorf("outbox rows %v: want p/1 parked", rows)
	}
}

// TestParkTransientErrorsRetried: serialization failures, deadlocks and
// an administrator's shutdown of the backend may clear: the park is
// retried until it succeeds, and Run goes on.
func TestParkTransientErrorsRetried(t *testing.T) {
	pool := logicalPool(t)
	b := startNATS(t)
	w := walWriter(t)
	failInserts(t, pool, 3, "40001", "40P01", "57P01")
	pub := &failing{Publisher: b.pub}
	pub.on.Store(true)
	r := newRelay(t, pool, pub, nil)
	stop := runRelay(t, r)
	waitFor(t, 30*time.Second, "the relay to stream", func() bool { return r.Status().Streaming })
	write(t, pool, w, false, payload{Key: "p", N: 1, Tag: "poison"}, payload{Key: "ok", N: 1})
	waitFor(t, 30*time.Second, "p/1 parked after the failures", func() bool { return r.Status().Parked == 1 })
	var fails int64
	if err := pool.QueryRow(context.Background(), "SELECT last_value FROM test_insert_fails").Scan(&fails); err != nil || fails < 4 {
		t.Errorf("%d inserts (%v): want the 3 refused ones, then the park", fails, err)
	}
	stop() // fails the test if Run returned an error
}

// TestBacklogBoundedBehindStuckPark: while the head transaction's event
// cannot be parked yet (the table is locked), the transactions behind it
// settle but cannot be confirmed: reading pauses once MaxUnconfirmed events
// are unconfirmed, instead of piling them up without end; once the park
// succeeds everything is published and confirmed.
func TestBacklogBoundedBehindStuckPark(t *testing.T) {
	pool := logicalPool(t)
	b := startNATS(t)
	w := walWriter(t)
	pub := &failing{Publisher: b.pub}
	pub.on.Store(true)
	const maxUnconfirmed = 4
	r := newRelay(t, pool, pub, func(c *walrelay.Config) { c.MaxUnconfirmed = maxUnconfirmed })
	runRelay(t, r)
	waitFor(t, 30*time.Second, "the relay to stream", func() bool { return r.Status().Streaming })
	ctx := context.Background()
	lock, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer lock.Rollback(ctx) //nolint:errcheck
	if _, err := lock.Exec(ctx, "LOCK TABLE "+testdb.Tables.Outbox+" IN EXCLUSIVE MODE"); err != nil {
		t.Fatal(err)
	}
	write(t, pool, w, false, payload{Key: "p", N: 1, Tag: "poison"}, payload{Key: "ok", N: 1})
	const behind = 20
	for i := 1; i <= behind; i++ {
		write(t, pool, w, false, payload{Key: "k", N: i})
	}
	waitFor(t, 30*time.Second, "the park to start (p/1 refused)", func() bool { return pub.fails.Load() >= int64(walrelay.DefaultQuickRetries) })
	time.Sleep(2 * time.Second) // the reader would read on meanwhile
	if n := distinct(b.messages(t)); n > maxUnconfirmed {
		t.Fatalf("%d events published behind the stuck park: the reader should pause at MaxUnconfirmed (%d) unconfirmed events", n, maxUnconfirmed)
	}
	if err := lock.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 60*time.Second, "the events behind the park", func() bool { return distinct(b.messages(t)) >= behind+1 })
	checkOrder(t, b.messages(t), map[string]int{"ok": 1, "k": behind})
	if st := r.Status(); st.Parked != 1 {
		t.Errorf("status %+v: want p/1 parked", st)
	}
	waitFor(t, 30*time.Second, "everything confirmed", func() bool {
		st := r.Status()
		return st.InFlight == 0 && st.Unconfirmed == 0 && st.OldestUnconfirmed.IsZero()
	})
}

// keyGate holds every Publish carrying an event of key until open is
// closed, and tells held when it holds one.
type keyGate struct {
	message.Publisher
	key  string
	open chan struct{}
	held chan struct{}
}

func (g *keyGate) Publish(topic string, msgs ...*message.Message) error {
	for _, m := range msgs {
		var p payload
		if json.Unmarshal(m.Payload, &p) == nil && p.Key == g.key {
			select {
			case g.held <- struct{}{}:
			default:
			}
			<-g.open
			break
		}
	}
	return g.Publisher.Publish(topic, msgs...)
}

// TestSlowEventHoldsOnlyItsKey: a publish that does not return holds back
// its key only. The events of other keys behind it are published past
// MaxInFlight (settled, they wait for the slow one's transaction to be
// confirmed, holding no content), up to MaxUnconfirmed, where reading
// pauses; once the slow publish returns, everything is confirmed.
func TestSlowEventHoldsOnlyItsKey(t *testing.T) {
	pool := logicalPool(t)
	b := startNATS(t)
	w := walWriter(t)
	g := &keyGate{Publisher: b.pub, key: "slow", open: make(chan struct{}), held: make(chan struct{}, 1)}
	const maxInFlight, maxUnconfirmed = 4, 40
	r := newRelay(t, pool, g, func(c *walrelay.Config) {
		c.MaxInFlight, c.MaxUnconfirmed = maxInFlight, maxUnconfirmed
		c.PublishTimeout = 2 * time.Minute
	})
	stop := runRelay(t, r)
	waitFor(t, 30*time.Second, "the relay to stream", func() bool { return r.Status().Streaming })
	write(t, pool, w, false, payload{Key: "slow", N: 1})
	select {
	case <-g.held:
	case <-time.After(30 * time.Second):
		t.Fatal("the slow event was not published")
	}
	const behind = 60
	want := map[string]int{"slow": 1}
	for i := 0; i < behind; i++ {
		k := "k" + strconv.Itoa(i%10)
		want[k]++
		write(t, pool, w, false, payload{Key: k, N: want[k]})
	}
	// Before the fix, reading paused at MaxInFlight (4) events here.
	waitFor(t, 30*time.Second, "events of other keys published behind the slow one, past MaxInFlight", func() bool {
		return distinct(b.messages(t)) >= maxUnconfirmed-2
	})
	time.Sleep(time.Second) // the reader would read on meanwhile
	if n := distinct(b.messages(t)); n >= maxUnconfirmed {
		t.Fatalf("%d events published behind the slow one: the reader should pause at MaxUnconfirmed (%d) unconfirmed events", n, maxUnconfirmed)
	}
	if st := r.Status(); st.InFlight != 1 || st.Unconfirmed < maxUnconfirmed-2 || st.Unconfirmed > maxUnconfirmed || st.OldestUnconfirmed.IsZero() {
		t.Errorf("status %+v: want the slow event in flight and about %d unconfirmed", st, maxUnconfirmed)
	}
	close(g.open)
	waitFor(t, 60*time.Second, "every event", func() bool { return distinct(b.messages(t)) >= behind+1 })
	checkOrder(t, b.messages(t), want)
	waitFor(t, 30*time.Second, "everything confirmed", func() bool {
		st := r.Status()
		return st.InFlight == 0 && st.Unconfirmed == 0 && st.OldestUnconfirmed.IsZero()
	})
	stop()
}

// gate holds every Publish until it is opened.
type gate struct {
	message.Publisher
	open chan struct{}
}

func (g *gate) Publish(topic string, msgs ...*message.Message) error {
	<-g.open
	return g.Publisher.Publish(topic, msgs...)
}

// TestInFlightBytesBound: while the broker holds every publish, the
// reader holds at most MaxInFlightBytes of events (plus the one that
// crossed it), not MaxInFlight events; a bound below one event still lets
// events through one at a time.
func TestInFlightBytesBound(t *testing.T) {
	pool := logicalPool(t)
	b := startNATS(t)
	w := walWriter(t)
	g := &gate{Publisher: b.pub, open: make(chan struct{})}
	r := newRelay(t, pool, g, func(c *walrelay.Config) {
		c.MaxInFlightBytes = 10_000
		c.PublishTimeout = time.Minute
	})
	stop := runRelay(t, r)
	waitFor(t, 30*time.Second, "the relay to stream", func() bool { return r.Status().Streaming })
	const n = 20
	big := strings.Repeat("x", 4000) // each event's content is over 4000 bytes
	for i := 0; i < n; i++ {
		write(t, pool, w, false, payload{Key: "b" + strconv.Itoa(i), N: 1, Tag: big})
	}
	waitFor(t, 30*time.Second, "events in flight", func() bool { return r.Status().InFlight >= 2 })
	time.Sleep(time.Second) // the reader would read on meanwhile
	if st := r.Status(); st.InFlight > 3 {
		t.Fatalf("%d events of over 4000 bytes in flight with MaxInFlightBytes 10000: want at most 3", st.InFlight)
	}
	close(g.open)
	want := map[string]int{}
	for i := 0; i < n; i++ {
		want["b"+strconv.Itoa(i)] = 1
	}
	waitFor(t, 60*time.Second, "every event", func() bool { return distinct(b.messages(t)) >= n })
	checkOrder(t, b.messages(t), want)
	stop()

	// Below one event: one at a time, never wedged.
	r2 := newRelay(t, pool, b.pub, func(c *walrelay.Config) { c.MaxInFlightBytes = 1 })
	runRelay(t, r2)
	for i := 0; i < 5; i++ {
		want["b"+strconv.Itoa(i)]++
		write(t, pool, w, false, payload{Key: "b" + strconv.Itoa(i), N: 2, Tag: big})
	}
	waitFor(t, 60*time.Second, "the events over the bound", func() bool { return distinct(b.messages(t)) >= n+5 })
	checkOrder(t, b.messages(t), want)
}

// poisonous fails every call that carries an event whose key starts
// with prefix; the others go to the broker.
type poisonous struct {
	message.Publisher
	prefix string
}

func (f poisonous) Publish(topic string, msgs ...*message.Message) error {
	for _, m := range msgs {
		var p payload
		if json.Unmarshal(m.Payload, &p) == nil && strings.HasPrefix(p.Key, f.prefix) {
			return errors.New("test: poison")
		}
	}
	return f.Publisher.Publish(topic, msgs...)
}

// outageRelay runs a relay with MaxInFlight 4 (its Config changed by mod)
// to NATS through pub, with the broker down: pub fails every call until
// pub.on is cleared.
func outageRelay(t *testing.T, mod func(*walrelay.Config)) (pool *pgxpool.Pool, b *natsBroker, w *outbox.WALWriter, pub *toggle, r *walrelay.Relay) {
	t.Helper()
	pool = logicalPool(t)
	b = startNATS(t)
	w = walWriter(t)
	pub = &toggle{Publisher: b.pub}
	pub.on.Store(true)
	r = newRelay(t, pool, pub, func(c *walrelay.Config) {
		c.MaxInFlight = 4
		// The default quick retries, not the harness's: the first keys'
		// failures must meet before one of them runs out of retries
		// alone (a lone failing key is parked).
		c.RetryDelay = walrelay.DefaultRetryDelay
		c.BreakerBackoff = func(int) time.Duration { return 50 * time.Millisecond }
		if mod != nil {
			mod(c)
		}
	})
	runRelay(t, r)
	waitFor(t, 30*time.Second, "the relay to stream", func() bool { return r.Status().Streaming })
	return pool, b, w, pub, r
}

// TestPoisonKeysFillingInFlight: events of two poison keys fill
// MaxInFlight, a good event behind them. The poison events' failures
// open the breaker, and while it is open their probes are not counted;
// once every key in flight has failed since it opened, the reader reads
// on past MaxInFlight, so the good event probes and closes the breaker,
// and with good traffic the poison events are parked. (Found by review:
// the reader stopped at MaxInFlight, and the breaker stayed open, and
// the stream stopped, for good.)
func TestPoisonKeysFillingInFlight(t *testing.T) {
	pool := logicalPool(t)
	b := startNATS(t)
	w := walWriter(t)
	r := newRelay(t, pool, poisonous{Publisher: b.pub, prefix: "p"}, func(c *walrelay.Config) {
		c.MaxInFlight = 4
		c.QuickRetries = 1
		c.Concurrency = 2
	})
	runRelay(t, r)
	waitFor(t, 30*time.Second, "the relay to stream", func() bool { return r.Status().Streaming })
	write(t, pool, w, false, payload{Key: "p0", N: 1}, payload{Key: "p1", N: 1}, payload{Key: "p0", N: 2}, payload{Key: "p1", N: 2})
	write(t, pool, w, false, payload{Key: "g0", N: 1})
	waitFor(t, 15*time.Second, "the good event behind the poison keys", func() bool { return distinct(b.messages(t)) >= 1 })
	want := map[string]int{"g0": 1}
	for i := 1; r.Status().Parked < 4; i++ {
		if i > 300 {
			t.Fatalf("30 s after the good event: %+v, want the 4 poison events parked", r.Status())
		}
		want[fmt.Sprintf("g%d", i)] = 1
		write(t, pool, w, false, payload{Key: fmt.Sprintf("g%d", i), N: 1})
		time.Sleep(100 * time.Millisecond)
	}
	waitFor(t, 30*time.Second, "every good event", func() bool { return distinct(b.messages(t)) >= len(want) })
	checkOrder(t, b.messages(t), want)
	if n := len(outboxRows(t, pool)); n != 4 {
		t.Errorf("%d rows in the outbox table, want the 4 poison events", n)
	}
}

// TestOutageReadsAtMostTwiceTheBound: in a broker outage every key in
// flight fails, which looks the same: the reader reads on past
// MaxInFlight, a new key at a time, up to twice it and no further, and
// parks nothing; once the broker is back every event is published in
// order.
func TestOutageReadsAtMostTwiceTheBound(t *testing.T) {
	pool, b, w, pub, r := outageRelay(t, nil)
	want := map[string]int{}
	var evs []payload // one transaction: many keys fail at once, as in an outage
	for n := 1; n <= 2; n++ {
		for i := range 12 {
			key := fmt.Sprintf("k%d", i)
			want[key]++
			evs = append(evs, payload{Key: key, N: n})
		}
	}
	write(t, pool, w, false, evs...)
	most := 0
	deadline := time.Now().Add(6 * time.Second)
	for time.Now().Before(deadline) {
		st := r.Status()
		most = max(most, st.InFlight)
		if st.Parked > 0 {
			t.Fatalf("%d events parked in an outage", st.Parked)
		}
		time.Sleep(5 * time.Millisecond)
	}
	if most <= 4 || most > 8 {
		t.Errorf("at most %d events in flight in the outage, want more than MaxInFlight (4) and at most twice it", most)
	}
	pub.on.Store(false)
	waitFor(t, 30*time.Second, "every event", func() bool { return len(b.messages(t)) >= 24 && distinct(b.messages(t)) >= 24 })
	checkOrder(t, b.messages(t), want)
}

// TestOverflowSettlesWithoutTheReader: the reader, past MaxInFlight in an
// outage (TestOutageReadsAtMostTwiceTheBound), waits for the stream,
// here up to a StatusInterval of 10 s. When the broker is back, the
// events settle without it: their settlements have room for twice
// MaxInFlight, and a key's next event is published at once. (Found by
// review: room for MaxInFlight only; the workers waited for the reader,
// 9 s.)
func TestOverflowSettlesWithoutTheReader(t *testing.T) {
	pool, b, w, pub, r := outageRelay(t, func(c *walrelay.Config) {
		c.Concurrency = 2
		c.StatusInterval = 10 * time.Second
	})
	want := map[string]int{"k0": 4, "k1": 1, "k2": 1, "k3": 1}
	write(t, pool, w, false,
		payload{Key: "k0", N: 1}, payload{Key: "k1", N: 1}, payload{Key: "k2", N: 1}, payload{Key: "k3", N: 1},
		payload{Key: "k0", N: 2}, payload{Key: "k0", N: 3}, payload{Key: "k0", N: 4})
	waitFor(t, 30*time.Second, "7 events in flight", func() bool { return r.Status().InFlight == 7 })
	if st := r.Status(); st.Parked > 0 || !st.BreakerOpen {
		t.Fatalf("status %+v: want the breaker open, nothing parked", st)
	}
	pub.on.Store(false)
	began := time.Now()
	waitFor(t, 30*time.Second, "every event", func() bool { return distinct(b.messages(t)) >= 7 })
	if took := time.Since(began); took > 3*time.Second {
		t.Errorf("every event published %s after the broker came back (a probe every 50 ms)", took.Round(time.Millisecond))
	}
	checkOrder(t, b.messages(t), want)
}
