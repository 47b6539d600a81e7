package sweeper_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/outboxgen/outboxgen/internal/testdb"
	"github.com/outboxgen/outboxgen/runtime/dialect"
	"github.com/outboxgen/outboxgen/runtime/driver"
	"github.com/outboxgen/outboxgen/runtime/driver/drivertest"
	"github.com/outboxgen/outboxgen/runtime/driver/sqldriver"
	"github.com/outboxgen/outboxgen/runtime/outbox"
	"github.com/outboxgen/outboxgen/runtime/sweeper"
	"github.com/outboxgen/outboxgen/templates"
)

const table = "outbox_event"

// pub records publishes; fail says which event ids the broker refuses.
type pub struct {
	mu       sync.Mutex
	fail     map[string]bool
	attempts map[string]int
	sent     []string
}

func (p *pub) Publish(_ string, msgs ...*message.Message) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, m := range msgs {
		p.attempts[m.UUID]++
		if p.fail[m.UUID] {
			return errors.New("broker refuses (injected)")
		}
		p.sent = append(p.sent, m.UUID)
	}
	return nil
}

func (p *pub) Close() error { return nil }

func (p *pub) snapshot() (sent []string, attempts int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, n := range p.attempts {
		attempts += n
	}
	return append([]string(nil), p.sent...), attempts
}

func forEachDialect(t *testing.T, f func(t *testing.T, db *sql.DB, d dialect.Dialect, drv driver.Driver)) {
	for _, name := range testdb.Dialects() {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			db := testdb.Open(t, name)
			testdb.ApplySchema(t, db, name, templates.DefaultTables)
			d, err := dialect.Parse(name)
			if err != nil {
				t.Fatal(err)
			}
			drv, err := sqldriver.New(db, testdb.Schema(d))
			if err != nil {
				t.Fatal(err)
			}
			f(t, db, d, drv)
		})
	}
}

// insert writes one event per key in one transaction (no relay runs) and
// returns the event ids.
func insert(t *testing.T, db *sql.DB, d dialect.Dialect, keys ...string) []string {
	t.Helper()
	w := outbox.MustNewWriter(d, table)
	tx, err := db.Begin()
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback() //nolint:errcheck
	var ids []string
	for i, k := range keys {
		id, err := w.Insert(context.Background(), tx, outbox.Event{Type: "ORDER_PAID", Topic: "orders", Key: k, Version: 1, Payload: map[string]int{"n": i}})
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, id.String())
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	return ids
}

// set runs "UPDATE outbox_event SET <set> WHERE event_id IN (ids)".
func set(t *testing.T, db *sql.DB, d dialect.Dialect, set string, ids ...string) {
	t.Helper()
	ps := make([]string, len(ids))
	args := make([]any, len(ids))
	for i, id := range ids {
		ps[i], args[i] = d.Placeholder(i+1), id
	}
	if _, err := db.Exec("UPDATE "+table+" SET "+set+" WHERE event_id IN ("+strings.Join(ps, ", ")+")", args...); err != nil {
		t.Fatal(err)
	}
}

type state struct {
	Status, Retry int
	Owner         sql.NullString
}

func stateOf(t *testing.T, db *sql.DB, d dialect.Dialect, id string) state {
	t.Helper()
	var s state
	if err := db.QueryRow("SELECT status, retry_count, lease_owner FROM "+table+" WHERE event_id = "+d.Placeholder(1), id).Scan(&s.Status, &s.Retry, &s.Owner); err != nil {
		t.Fatal(err)
	}
	return s
}

// trace records what a sweep asked of the database and logged, with the
// time since the trace started, for the failure message of a test whose
// timing went wrong (one CI run saw a sweep of a few rows take two
// minutes).
type trace struct {
	start time.Time
	mu    sync.Mutex
	lines []string
}

func newTrace() *trace { return &trace{start: time.Now()} }

func (tr *trace) add(format string, args ...any) {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	tr.lines = append(tr.lines, fmt.Sprintf("%9.3fs ", time.Since(tr.start).Seconds())+fmt.Sprintf(format, args...))
}

func (tr *trace) String() string {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	return strings.Join(tr.lines, "\n")
}

func (tr *trace) Write(p []byte) (int, error) {
	tr.add("%s", strings.TrimSpace(string(p)))
	return len(p), nil
}

// tracedDriver adds the relay's claims, recordings and lease extensions to
// a trace, with how long each took.
type tracedDriver struct {
	driver.Driver
	tr *trace
}

func (d tracedDriver) Claim(ctx context.Context, p driver.ClaimParams) ([]driver.Row, error) {
	t0 := time.Now()
	rows, err := d.Driver.Claim(ctx, p)
	ids := make([]int64, len(rows))
	for i, r := range rows {
		ids[i] = r.ID
	}
	var rec driver.Results
	if p.Record != nil {
		rec = *p.Record
	}
	d.tr.add("claim limit %d, recording %d sent %d failed %d released: leased %v, %v (took %s)", p.Limit, len(rec.Sent), len(rec.Failures), len(rec.Release), ids, err, time.Since(t0))
	return rows, err
}

func (d tracedDriver) Record(ctx context.Context, owner string, r driver.Results) (driver.Recorded, error) {
	t0 := time.Now()
	got, err := d.Driver.Record(ctx, owner, r)
	d.tr.add("record %d sent %d failed %d released: %+v, %v (took %s)", len(r.Sent), len(r.Failures), len(r.Release), got, err, time.Since(t0))
	return got, err
}

func (d tracedDriver) ExtendLease(ctx context.Context, owner string, ids []int64, lease time.Duration) (int64, error) {
	t0 := time.Now()
	n, err := d.Driver.ExtendLease(ctx, owner, ids, lease)
	d.tr.add("extend lease of %v: %d, %v (took %s)", ids, n, err, time.Since(t0))
	return n, err
}

// Seed check 2: with the relay stopped, one sweep publishes the stuck
// rows (in per-key order) and rescues rows of a dead relay whose lease
// expired; it leaves rows younger than OverdueAfter to the relay, rows
// under a live lease alone, and honours the backoff of a failing row.
func TestSweepRescuesStuckRows(t *testing.T) {
	forEachDialect(t, func(t *testing.T, db *sql.DB, d dialect.Dialect, drv driver.Driver) {
		ctx := context.Background()
		stuck := insert(t, db, d, "a", "b", "a", "c", "poison")
		tr := newTrace() // young rows must stay younger than OverdueAfter
		young := insert(t, db, d, "a", "y")
		leased := insert(t, db, d, "live")
		expired := insert(t, db, d, "dead")
		old := append(append(append([]string{}, stuck...), leased...), expired...)
		set(t, db, d, "created_at = "+drivertest.OpsAgo(d, 10*time.Minute), old...)
		set(t, db, d, "lease_owner = 'relay-1', lease_expires_at = "+drivertest.OpsAgo(d, -time.Hour), leased...)
		set(t, db, d, "lease_owner = 'relay-dead', lease_expires_at = "+drivertest.OpsAgo(d, time.Minute), expired...)

		p := &pub{fail: map[string]bool{stuck[4]: true}, attempts: map[string]int{}}
		tr.add("rows inserted and aged")
		s, err := sweeper.New(tracedDriver{drv, tr}, sweeper.Config{
			Publisher: p, OverdueAfter: time.Minute, BatchSize: 2, // several batches in one sweep
			Backoff: func(int) time.Duration { return time.Hour },
			Logger:  slog.New(slog.NewTextHandler(tr, &slog.HandlerOptions{Level: slog.LevelDebug})),
		})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			if t.Failed() {
				t.Logf("the sweeps, from the young rows' insert on:\n%s", tr)
			}
		})
		tr.add("sweep starts")
		n, err := s.RunOnce(ctx)
		if err != nil || n != 5 {
			t.Fatalf("RunOnce = %d, %v; want the 4 publishable stuck rows and the expired-lease row", n, err)
		}
		sent, attempts := p.snapshot()
		want := map[string]bool{stuck[0]: true, stuck[1]: true, stuck[2]: true, stuck[3]: true, expired[0]: true}
		if len(sent) != len(want) {
			t.Fatalf("published %v", sent)
		}
		pos := map[string]int{}
		for i, id := range sent {
			if !want[id] {
				t.Fatalf("published %s, which is not stuck", id)
			}
			pos[id] = i
		}
		if pos[stuck[0]] > pos[stuck[2]] {
			t.Fatal("key a published out of order")
		}
		for id := range want {
			if s := stateOf(t, db, d, id); s.Status != 1 || s.Owner.Valid {
				t.Fatalf("rescued row %s: %+v, want sent", id, s)
			}
		}
		if s := stateOf(t, db, d, stuck[4]); s.Status != 0 || s.Retry != 1 || s.Owner.Valid {
			t.Fatalf("failing row: %+v, want backing off after one attempt", s)
		}
		for _, id := range young {
			if s := stateOf(t, db, d, id); s.Status != 0 || s.Owner.Valid || s.Retry != 0 {
				t.Fatalf("young row %s touched: %+v", id, s)
			}
		}
		if s := stateOf(t, db, d, leased[0]); s.Status != 0 || s.Owner.String != "relay-1" {
			t.Fatalf("row under a live lease touched: %+v", s)
		}

		// A second sweep finds nothing: the failing row backs off.
		n, err = s.RunOnce(ctx)
		if _, again := p.snapshot(); err != nil || n != 0 || again != attempts {
			t.Fatalf("second RunOnce = %d, %v, attempts %d -> %d; want nothing", n, err, attempts, again)
		}
	})
}

// Run sweeps on its own schedule until cancelled.
func TestRunSweepsOnSchedule(t *testing.T) {
	forEachDialect(t, func(t *testing.T, db *sql.DB, d dialect.Dialect, drv driver.Driver) {
		p := &pub{attempts: map[string]int{}}
		s, err := sweeper.New(drv, sweeper.Config{Publisher: p, OverdueAfter: time.Minute, Interval: 10 * time.Millisecond, Logger: slog.New(slog.DiscardHandler)})
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- s.Run(ctx) }()
		ids := insert(t, db, d, "a", "b") // appear while the sweeper runs
		set(t, db, d, "created_at = "+drivertest.OpsAgo(d, 10*time.Minute), ids...)
		deadline := time.Now().Add(30 * time.Second) // a hang guard, not a timing
		for {
			if sent, _ := p.snapshot(); len(sent) == 2 {
				break
			}
			if time.Now().After(deadline) {
				t.Fatal("Run did not sweep the stuck rows")
			}
			time.Sleep(5 * time.Millisecond)
		}
		cancel()
		if err := <-done; err != nil {
			t.Fatalf("Run = %v", err)
		}
	})
}

func TestOptions(t *testing.T) {
	drv, err := sqldriver.New(testdb.Open(t, "sqlite"), testdb.Schema(dialect.SQLite))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := sweeper.New(nil, sweeper.Config{Publisher: &pub{}}); err == nil {
		t.Error("nil driver accepted")
	}
	if _, err := sweeper.New(drv, sweeper.Config{}); err == nil || !strings.Contains(err.Error(), "Publisher") {
		t.Errorf("missing Publisher: %v", err)
	}
	if _, err := sweeper.New(drv, sweeper.Config{Publisher: &pub{}, OverdueAfter: -1}); err == nil || !strings.Contains(err.Error(), "OverdueAfter") {
		t.Errorf("negative OverdueAfter: %v", err)
	}
	if _, err := sweeper.New(drv, sweeper.Config{Publisher: &pub{}}); err != nil {
		t.Errorf("defaults: %v", err)
	}
}

// Config.Validate reports every invalid setting at once; zero values are
// valid (New fills the defaults).
func TestConfigValidate(t *testing.T) {
	if err := (sweeper.Config{}).Validate(); err != nil {
		t.Errorf("zero Config: %v", err)
	}
	err := sweeper.Config{OverdueAfter: -1, Interval: -1, DatabaseBackoffMax: -1}.Validate()
	for _, want := range []string{"Config.OverdueAfter", "Config.Interval", "Config.DatabaseBackoffMax"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("Validate() = %v, want it to name %s", err, want)
		}
	}
}
