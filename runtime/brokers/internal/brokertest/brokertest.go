// Package brokertest holds what the end-to-end broker tests share: writing
// outbox events on a real database, running relays, and checking what a
// consumer received.
package brokertest

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"reflect"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/outboxgen/outboxgen/internal/testdb"
	"github.com/outboxgen/outboxgen/runtime/dialect"
	"github.com/outboxgen/outboxgen/runtime/driver/sqldriver"
	"github.com/outboxgen/outboxgen/runtime/internal/pubguard"
	"github.com/outboxgen/outboxgen/runtime/outbox"
	"github.com/outboxgen/outboxgen/runtime/relay"
	"github.com/outboxgen/outboxgen/templates"
)

// Table is the outbox table of the tests.
const Table = "outbox_event"

// EventType is the biz_type of the test events.
const EventType = "ORDER_PAID"

// ForEachDialect runs f as a parallel subtest per dialect in dialects (all
// of testdb.Dialects() when nil) on a fresh database with the schema.
func ForEachDialect(t *testing.T, dialects []string, f func(t *testing.T, db *sql.DB, d dialect.Dialect)) {
	t.Helper()
	if dialects == nil {
		dialects = testdb.Dialects()
	}
	for _, name := range dialects {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			db := testdb.Open(t, name)
			testdb.ApplySchema(t, db, name, templates.DefaultTables)
			d, err := dialect.Parse(name)
			if err != nil {
				t.Fatal(err)
			}
			f(t, db, d)
		})
	}
}

// Payload is the payload of a test event.
type Payload struct {
	Key string `json:"key"`
	Seq int    `json:"seq"`
}

// Written is an event the test committed.
type Written struct {
	EventID string
	Key     string
	Seq     int // per-key sequence, from 0
	Payload Payload
	Trace   string // the "trace" header
}

// Writer writes test events, remembering them in commit order.
type Writer struct {
	db    *sql.DB
	w     *outbox.Writer
	topic string

	mu   sync.Mutex
	seq  map[string]int
	all  []Written
	keys []string
}

// NewWriter returns a writer of events on topic for keys.
func NewWriter(db *sql.DB, d dialect.Dialect, topic string, keys ...string) *Writer {
	return &Writer{db: db, w: outbox.MustNewWriter(d, Table), topic: topic, seq: map[string]int{}, keys: keys}
}

// Write commits rounds transactions, each inserting one event per key
// (keys interleaved, so ids of one key are not adjacent), and returns the
// events written.
func (w *Writer) Write(t testing.TB, rounds int) []Written {
	t.Helper()
	ctx := context.Background()
	var out []Written
	for range rounds {
		tx, err := w.db.BeginTx(ctx, nil)
		if err != nil {
			t.Fatalf("begin: %v", err)
		}
		var batch []Written
		for _, k := range w.keys {
			w.mu.Lock()
			seq := w.seq[k]
			w.seq[k]++
			w.mu.Unlock()
			p := Payload{Key: k, Seq: seq}
			trace := fmt.Sprintf("trace-%s-%d", k, seq)
			id, err := w.w.Insert(ctx, tx, outbox.Event{Type: EventType, Topic: w.topic, Key: k, Version: 1, Payload: p},
				outbox.WithHeader("trace", trace))
			if err != nil {
				_ = tx.Rollback()
				t.Fatalf("insert: %v", err)
			}
			batch = append(batch, Written{EventID: id.String(), Key: k, Seq: seq, Payload: p, Trace: trace})
		}
		if err := tx.Commit(); err != nil {
			t.Fatalf("commit: %v", err)
		}
		out = append(out, batch...)
	}
	w.mu.Lock()
	w.all = append(w.all, out...)
	w.mu.Unlock()
	return out
}

// All returns every event written so far.
func (w *Writer) All() []Written {
	w.mu.Lock()
	defer w.mu.Unlock()
	return append([]Written(nil), w.all...)
}

// Relays runs n relays over db publishing to pub until the returned stop
// is called (stop waits for Run to return). opts are completed with short
// test timings; Publisher and InstanceID are set here.
type Relays struct {
	rs     []*relay.Relay
	cancel context.CancelFunc
	wg     sync.WaitGroup
}

// StartRelays starts n relays.
func StartRelays(t testing.TB, db *sql.DB, d dialect.Dialect, n int, pub message.Publisher, opts relay.Config) *Relays {
	t.Helper()
	if opts.PollInterval == 0 {
		opts.PollInterval = 25 * time.Millisecond
	}
	if opts.BatchSize == 0 {
		opts.BatchSize = 8 // several polls, so the instances interleave
	}
	if opts.LeaseDuration == 0 {
		opts.LeaseDuration = 20 * time.Second
	}
	if opts.ShutdownTimeout == 0 {
		opts.ShutdownTimeout = 2 * time.Second
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	opts.Publisher = pub
	ctx, cancel := context.WithCancel(context.Background())
	r := &Relays{cancel: cancel}
	for i := range n {
		o := opts
		o.InstanceID = "relay-" + strconv.Itoa(i)
		drv, err := sqldriver.New(db, testdb.Schema(d))
		if err != nil {
			cancel()
			t.Fatalf("sqldriver.New: %v", err)
		}
		rl, err := relay.New(drv, o)
		if err != nil {
			cancel()
			t.Fatalf("relay.New: %v", err)
		}
		r.rs = append(r.rs, rl)
		r.wg.Add(1)
		go func() {
			defer r.wg.Done()
			if err := rl.Run(ctx); err != nil {
				t.Errorf("relay %d: Run: %v", i, err)
			}
		}()
	}
	t.Cleanup(r.Stop)
	return r
}

// Notify wakes every relay.
func (r *Relays) Notify() {
	for _, rl := range r.rs {
		rl.Notify()
	}
}

// Stop stops the relays and waits for them; it may be called twice.
func (r *Relays) Stop() {
	r.cancel()
	r.wg.Wait()
}

// CountStatus returns the number of outbox rows with status.
func CountStatus(t testing.TB, db *sql.DB, status outbox.Status) int {
	t.Helper()
	var n int
	if err := db.QueryRow("SELECT COUNT(*) FROM " + Table + " WHERE status = " + strconv.Itoa(int(status))).Scan(&n); err != nil {
		t.Fatalf("count status %d: %v", status, err)
	}
	return n
}

// MaxRetryCount returns the highest retry_count of the outbox rows.
func MaxRetryCount(t testing.TB, db *sql.DB) int {
	t.Helper()
	return retryCount(t, db, "MAX")
}

// SumRetryCount returns the sum of the outbox rows' retry_count: every
// attempt charged to a row.
func SumRetryCount(t testing.TB, db *sql.DB) int {
	t.Helper()
	return retryCount(t, db, "SUM")
}

// retryCount returns aggregate agg of the outbox rows' retry_count (0
// when there are none).
func retryCount(t testing.TB, db *sql.DB, agg string) int {
	t.Helper()
	var n sql.NullInt64
	if err := db.QueryRow("SELECT " + agg + "(retry_count) FROM " + Table).Scan(&n); err != nil {
		t.Fatalf("%s(retry_count): %v", agg, err)
	}
	return int(n.Int64)
}

// Breakers is a slog.Handler for relay.Config.Logger that follows each
// relay's circuit breaker through the relay's log: its "circuit breaker
// open" and "circuit breaker closed" records, told apart by the relay's
// "relay" attribute (its InstanceID). It keeps nothing else.
type Breakers struct {
	mu     *sync.Mutex
	open   map[string]bool
	closed *int
	relay  string // from WithAttrs
}

// NewBreakers returns an empty Breakers.
func NewBreakers() *Breakers {
	return &Breakers{mu: &sync.Mutex{}, open: map[string]bool{}, closed: new(int)}
}

// Open returns how many relays' breakers are open now.
func (b *Breakers) Open() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	n := 0
	for _, o := range b.open {
		if o {
			n++
		}
	}
	return n
}

// Closed returns how many times a breaker closed.
func (b *Breakers) Closed() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return *b.closed
}

// Enabled implements slog.Handler.
func (b *Breakers) Enabled(context.Context, slog.Level) bool { return true }

// Handle implements slog.Handler.
func (b *Breakers) Handle(_ context.Context, r slog.Record) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	switch {
	case strings.HasPrefix(r.Message, "circuit breaker open"):
		b.open[b.relay] = true
	case strings.HasPrefix(r.Message, "circuit breaker closed"):
		b.open[b.relay] = false
		*b.closed++
	}
	return nil
}

// WithAttrs implements slog.Handler; it keeps the "relay" attribute.
func (b *Breakers) WithAttrs(as []slog.Attr) slog.Handler {
	c := *b
	for _, a := range as {
		if a.Key == "relay" {
			c.relay = a.Value.String()
		}
	}
	return &c
}

// WithGroup implements slog.Handler.
func (b *Breakers) WithGroup(string) slog.Handler { return b }

// Eventually polls cond every 20ms until it is true or timeout passes.
func Eventually(t testing.TB, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s", timeout, what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// WaitSent waits until n rows are sent.
func WaitSent(t testing.TB, db *sql.DB, n int, timeout time.Duration) {
	t.Helper()
	Eventually(t, timeout, fmt.Sprintf("%d rows sent", n), func() bool { return CountStatus(t, db, outbox.StatusSent) >= n })
}

// Received is a message a consumer got.
type Received struct {
	UUID      string
	Payload   []byte
	Metadata  map[string]string
	Partition int32 // Kafka only
}

// FromMessage converts a watermill message.
func FromMessage(m *message.Message) Received {
	md := map[string]string{}
	for k, v := range m.Metadata {
		md[k] = v
	}
	return Received{UUID: m.UUID, Payload: append([]byte(nil), m.Payload...), Metadata: md}
}

// Collector gathers received messages concurrently.
type Collector struct {
	mu   sync.Mutex
	got  []Received
	seen map[string]bool
}

// NewCollector returns an empty collector.
func NewCollector() *Collector { return &Collector{seen: map[string]bool{}} }

// Add records r.
func (c *Collector) Add(r Received) {
	c.mu.Lock()
	c.got = append(c.got, r)
	c.seen[r.UUID] = true
	c.mu.Unlock()
}

// Unique returns the number of distinct UUIDs received.
func (c *Collector) Unique() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.seen)
}

// Got returns everything received, in arrival order.
func (c *Collector) Got() []Received {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]Received(nil), c.got...)
}

// WaitUnique waits until n distinct messages arrived.
func (c *Collector) WaitUnique(t testing.TB, n int, timeout time.Duration) {
	t.Helper()
	Eventually(t, timeout, fmt.Sprintf("%d distinct messages (have %d)", n, c.Unique()), func() bool { return c.Unique() >= n })
}

// Check asserts that every written event was received with its payload
// and metadata intact, that nothing unknown was received, and that the
// first deliveries of each key came in per-key sequence order. It returns
// the number of duplicate deliveries.
func Check(t testing.TB, written []Written, got []Received) (duplicates int) {
	t.Helper()
	byID := map[string]Written{}
	for _, w := range written {
		byID[w.EventID] = w
	}
	first := map[string]bool{}
	nextSeq := map[string]int{}
	for _, r := range got {
		w, ok := byID[r.UUID]
		if !ok {
			t.Errorf("received unknown message %s (metadata %v)", r.UUID, r.Metadata)
			continue
		}
		if first[r.UUID] {
			duplicates++
			continue
		}
		first[r.UUID] = true
		var p Payload
		if err := json.Unmarshal(r.Payload, &p); err != nil || !reflect.DeepEqual(p, w.Payload) {
			t.Errorf("event %s: payload %s (err %v), want %+v", r.UUID, r.Payload, err, w.Payload)
		}
		want := map[string]string{
			relay.MetadataType:         EventType,
			relay.MetadataKey:          w.Key,
			relay.MetadataVersion:      "1",
			relay.MetadataEventID:      w.EventID,
			relay.MetadataPartitionKey: w.Key,
			"trace":                    w.Trace,
		}
		for k, v := range want {
			if r.Metadata[k] != v {
				t.Errorf("event %s: metadata %s = %q, want %q", r.UUID, k, r.Metadata[k], v)
			}
		}
		if ts, err := time.Parse(time.RFC3339Nano, r.Metadata[relay.MetadataCreatedAt]); err != nil || time.Since(ts) > time.Hour || time.Until(ts) > time.Hour {
			t.Errorf("event %s: metadata %s = %q: not a recent RFC 3339 time (err %v)", r.UUID, relay.MetadataCreatedAt, r.Metadata[relay.MetadataCreatedAt], err)
		}
		if w.Seq != nextSeq[w.Key] {
			t.Errorf("key %s: first delivery of seq %d came when seq %d was expected: per-key order broken", w.Key, w.Seq, nextSeq[w.Key])
		}
		nextSeq[w.Key] = w.Seq + 1
	}
	for _, w := range written {
		if !first[w.EventID] {
			t.Errorf("event %s (key %s seq %d) was committed but never received", w.EventID, w.Key, w.Seq)
		}
	}
	return duplicates
}

// CloseWhilePublishing publishes to topic from 4 goroutines until pub is
// closed, closes it once 20 messages went out, and checks that Close
// waited for the calls under way and every later call failed with
// pubguard.ErrClosed. msg makes goroutine g's i-th
// message.
func CloseWhilePublishing(t *testing.T, pub message.Publisher, topic string, msg func(g, i int) *message.Message) {
	t.Helper()
	var wg sync.WaitGroup
	var sent, refused atomic.Int64
	for g := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; ; i++ {
				err := pub.Publish(topic, msg(g, i))
				switch {
				case err == nil:
					sent.Add(1)
				case errors.Is(err, pubguard.ErrClosed):
					refused.Add(1)
					return
				default:
					t.Errorf("Publish: %v", err)
					return
				}
			}
		}()
	}
	Eventually(t, 20*time.Second, "20 messages published", func() bool { return sent.Load() >= 20 })
	if err := pub.Close(); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	if refused.Load() != 4 {
		t.Fatalf("%d publishers saw the close, want 4", refused.Load())
	}
	if err := pub.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
}

// BenchCall runs b.N calls of n fresh messages (msg makes the i-th of a
// call, seq unique in the benchmark) through call, and reports the time
// per message besides the time per call: the broker benchmarks' one
// loop, whatever the publisher.
func BenchCall(b *testing.B, n int, msg func(seq, i int) *message.Message, call func(msgs []*message.Message) error) {
	b.Helper()
	b.ReportAllocs()
	msgs := make([]*message.Message, n)
	seq := 0
	for range b.N {
		for i := range msgs {
			seq++
			msgs[i] = msg(seq, i)
		}
		if err := call(msgs); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*n), "ns/msg")
}

// OneByOne is a call that publishes msgs one Publish each, every one
// waiting for its acknowledgement: what the watermill publishers did with
// a call of several messages.
func OneByOne(pub message.Publisher, topic string) func(msgs []*message.Message) error {
	return func(msgs []*message.Message) error {
		for _, m := range msgs {
			if err := pub.Publish(topic, m); err != nil {
				return err
			}
		}
		return nil
	}
}

// Whole is a call that publishes msgs in one Publish.
func Whole(pub message.Publisher, topic string) func(msgs []*message.Message) error {
	return func(msgs []*message.Message) error { return pub.Publish(topic, msgs...) }
}
