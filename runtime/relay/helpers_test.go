package relay

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxgen/outboxgen/internal/testdb"
	"github.com/outboxgen/outboxgen/runtime/dialect"
	"github.com/outboxgen/outboxgen/runtime/driver"
	"github.com/outboxgen/outboxgen/runtime/driver/pgxdriver"
	"github.com/outboxgen/outboxgen/runtime/driver/sqldriver"
	"github.com/outboxgen/outboxgen/runtime/outbox"
	"github.com/outboxgen/outboxgen/templates"
)

const table = "outbox_event"

var tables = driver.Tables{Outbox: table, Inbox: "outbox_inbox"}

// forEachDialect runs f as a parallel subtest per dialect on a fresh
// database with the outbox schema applied: sqldriver on every dialect, and
// pgxdriver ("pgx") on PostgreSQL. db is a database/sql handle on the same
// database, for writing and inspecting rows.
func forEachDialect(t *testing.T, f func(t *testing.T, db *sql.DB, d dialect.Dialect, drv driver.Driver)) {
	t.Helper()
	for _, name := range append(testdb.Dialects(), "pgx") {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			if name == "pgx" {
				dsn := testdb.DSN(t, "postgres")
				db, err := sql.Open("pgx", dsn)
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { db.Close() })
				pool, err := pgxpool.New(context.Background(), dsn)
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(pool.Close)
				testdb.ApplySchema(t, db, "postgres", templates.Tables{Outbox: tables.Outbox, Inbox: tables.Inbox})
				drv, err := pgxdriver.New(pool, testdb.SchemaWith(dialect.Postgres, tables))
				if err != nil {
					t.Fatal(err)
				}
				f(t, db, dialect.Postgres, drv)
				return
			}
			db := testdb.Open(t, name)
			testdb.ApplySchema(t, db, name, templates.Tables{Outbox: tables.Outbox, Inbox: tables.Inbox})
			d, err := dialect.Parse(name)
			if err != nil {
				t.Fatal(err)
			}
			drv, err := sqldriver.New(db, testdb.SchemaWith(d, tables))
			if err != nil {
				t.Fatal(err)
			}
			f(t, db, d, drv)
		})
	}
}

// recPub is a test double of the broker's failures: it wraps a real
// in-process GoChannel and records every attempt and every success; fail
// decides per message whether the broker "fails" instead of delivering.
type recPub struct {
	inner *gochannel.GoChannel

	mu       sync.Mutex
	fail     func(msg *message.Message) error
	attempts map[string]int // event id -> publish attempts
	oks      []published    // successful publishes, in the order they returned
}

type published struct {
	Topic string
	Msg   *message.Message
}

func newRecPub(t *testing.T) *recPub {
	p := &recPub{
		inner:    gochannel.NewGoChannel(gochannel.Config{OutputChannelBuffer: 10000}, watermill.NopLogger{}),
		attempts: map[string]int{},
	}
	t.Cleanup(func() { p.inner.Close() })
	return p
}

func (p *recPub) setFail(f func(msg *message.Message) error) {
	p.mu.Lock()
	p.fail = f
	p.mu.Unlock()
}

func (p *recPub) Publish(topic string, msgs ...*message.Message) error {
	for _, m := range msgs {
		p.mu.Lock()
		p.attempts[m.UUID]++
		fail := p.fail
		p.mu.Unlock()
		if fail != nil {
			if err := fail(m); err != nil {
				return err
			}
		}
		if err := p.inner.Publish(topic, m); err != nil {
			return err
		}
		p.mu.Lock()
		p.oks = append(p.oks, published{Topic: topic, Msg: m})
		p.mu.Unlock()
	}
	return nil
}

func (p *recPub) Close() error { return nil }

func (p *recPub) attemptsOf(id string) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.attempts[id]
}

func (p *recPub) totalAttempts() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	n := 0
	for _, c := range p.attempts {
		n += c
	}
	return n
}

// successes returns the successful publishes so far.
func (p *recPub) successes() []published {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]published(nil), p.oks...)
}

// successCount returns event id -> successful publishes.
func (p *recPub) successCount() map[string]int {
	out := map[string]int{}
	for _, s := range p.successes() {
		out[s.Msg.UUID]++
	}
	return out
}

// firstOrderByKey returns, per key, the event ids in the order of their
// first successful publish.
func (p *recPub) firstOrderByKey() map[string][]string {
	seen := map[string]bool{}
	out := map[string][]string{}
	for _, s := range p.successes() {
		if seen[s.Msg.UUID] {
			continue
		}
		seen[s.Msg.UUID] = true
		k := s.Msg.Metadata.Get(MetadataKey)
		out[k] = append(out[k], s.Msg.UUID)
	}
	return out
}

var errBrokerDown = errors.New("broker down (injected)")

// errLog is a slog.Handler that records every message at level Warn and
// above; tests fail on unexpected poll errors through it.
type errLog struct {
	mu   sync.Mutex
	msgs []string
	info bool // record Info too
}

func (h *errLog) Enabled(_ context.Context, l slog.Level) bool {
	return l >= slog.LevelWarn || h.info && l >= slog.LevelInfo
}
func (h *errLog) Handle(_ context.Context, r slog.Record) error {
	line := r.Level.String() + " " + r.Message
	r.Attrs(func(a slog.Attr) bool { line += " " + a.String(); return true })
	h.mu.Lock()
	h.msgs = append(h.msgs, line)
	h.mu.Unlock()
	return nil
}
func (h *errLog) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h *errLog) WithGroup(string) slog.Handler      { return h }

// failOnPollErrors fails t at cleanup when the relay logged a failed poll
// (a database error: deadlock, bad SQL, ...).
func failOnPollErrors(t *testing.T, opts *Config) {
	h := &errLog{}
	opts.Logger = slog.New(h)
	t.Cleanup(func() {
		h.mu.Lock()
		defer h.mu.Unlock()
		for _, m := range h.msgs {
			if strings.Contains(m, "relay poll failed") || strings.Contains(m, "lease lost") {
				t.Errorf("unexpected relay log: %s", m)
			}
		}
	})
}

// testOptions are fast settings for tests.
func testOptions(pub message.Publisher, id string) Config {
	return Config{
		Publisher:       pub,
		InstanceID:      id,
		PollInterval:    10 * time.Millisecond,
		LeaseDuration:   20 * time.Second,
		ShutdownTimeout: 5 * time.Second,
		Backoff:         func(int) time.Duration { return 5 * time.Millisecond },
		BreakerBackoff:  func(int) time.Duration { return 5 * time.Millisecond },
		MaxAttempts:     1000,
		Logger:          slog.New(slog.DiscardHandler),
	}
}

func mustRelay(t testing.TB, drv driver.Driver, opts Config) *Relay {
	t.Helper()
	r, err := New(drv, opts)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// runRelay runs r.Run in the background; the returned stop cancels it and
// waits for Run to return, failing the test on an error.
func runRelay(t *testing.T, r *Relay) (stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			if err := <-done; err != nil {
				t.Errorf("Run: %v", err)
			}
		})
	}
	t.Cleanup(stop)
	return stop
}

// ev is an event a test inserts.
type ev struct {
	Type, Key, Topic string
	Headers          map[string]string
}

// inserted is what insertEvents wrote.
type inserted struct {
	ev
	ID      string // event id
	Payload string
}

// insertEvents inserts evs in one transaction, in order, through the real
// outbox.Writer, and returns them with their event ids.
func insertEvents(t *testing.T, db *sql.DB, d dialect.Dialect, evs ...ev) []inserted {
	t.Helper()
	ctx := context.Background()
	w := outbox.MustNewWriter(d, table)
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	var out []inserted
	for i, e := range evs {
		payload := map[string]any{"n": i, "key": e.Key}
		var opts []outbox.InsertOption
		if len(e.Headers) > 0 {
			opts = append(opts, outbox.WithHeaders(e.Headers))
		}
		if e.Type == "" {
			e.Type = "ORDER_PAID"
		}
		if e.Topic == "" {
			e.Topic = "orders"
		}
		id, err := w.Insert(ctx, tx, outbox.Event{Type: e.Type, Topic: e.Topic, Key: e.Key, Version: 2, Payload: payload}, opts...)
		if err != nil {
			tx.Rollback()
			t.Fatal(err)
		}
		b, _ := json.Marshal(payload)
		out = append(out, inserted{ev: e, ID: id.String(), Payload: string(b)})
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	return out
}

// count returns the number of outbox rows matching where (SQL).
func count(t *testing.T, db *sql.DB, where string, args ...any) int {
	t.Helper()
	var n int
	if err := db.QueryRow("SELECT COUNT(*) FROM "+table+" WHERE "+where, args...).Scan(&n); err != nil {
		t.Fatalf("count %s: %v", where, err)
	}
	return n
}

// rowState is the relay-relevant state of a row.
type rowState struct {
	ID         int64
	Status     int
	RetryCount int
	LeaseOwner sql.NullString
	LastError  sql.NullString
	SentAtSet  bool
}

func state(t *testing.T, db *sql.DB, d dialect.Dialect, eventID string) rowState {
	t.Helper()
	var s rowState
	q := "SELECT id, status, retry_count, lease_owner, last_error, sent_at IS NOT NULL FROM " + table + " WHERE event_id = " + d.Placeholder(1)
	if err := db.QueryRow(q, eventID).Scan(&s.ID, &s.Status, &s.RetryCount, &s.LeaseOwner, &s.LastError, &s.SentAtSet); err != nil {
		t.Fatalf("state of %s: %v", eventID, err)
	}
	return s
}

// waitFor polls cond until it holds, failing the test after a generous
// deadline (a hang guard, not a timing assertion).
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(40 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func keys(prefix string, n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf("%s-%d", prefix, i)
	}
	return out
}

// publishCount counts the publishes of one row: how many started, and
// how many started while another was under way.
type publishCount struct {
	mu                        sync.Mutex
	started, running, overlap int
}

// start notes a publish starting; it returns the publish's number (1 for
// the first) and the function that notes its end.
func (c *publishCount) start() (int, func()) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.started++
	if c.running++; c.running > 1 {
		c.overlap++
	}
	return c.started, func() {
		c.mu.Lock()
		c.running--
		c.mu.Unlock()
	}
}

// atMostTwice fails t, after logging el's lines, when the row was
// published more than twice or beside itself: a stale result ended its
// second lease while the second publish ran.
func (c *publishCount) atMostTwice(t *testing.T, el *errLog) {
	t.Helper()
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.overlap == 0 && c.started <= 2 {
		return
	}
	el.mu.Lock()
	for _, m := range el.msgs {
		t.Log(m)
	}
	el.mu.Unlock()
	t.Fatalf("publish attempts of row x: %d; overlapping publishes of x: %d; want at most 2, one after the other", c.started, c.overlap)
}
