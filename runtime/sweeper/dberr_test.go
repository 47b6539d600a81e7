package sweeper_test

import (
	"context"
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/outboxgen/outboxgen/internal/testdb"
	"github.com/outboxgen/outboxgen/runtime/dialect"
	"github.com/outboxgen/outboxgen/runtime/driver"
	"github.com/outboxgen/outboxgen/runtime/driver/sqldriver"
	"github.com/outboxgen/outboxgen/runtime/sweeper"
	"github.com/outboxgen/outboxgen/templates"
)

// countingDriver counts claims and lease extensions (the probe).
type countingDriver struct {
	driver.Driver
	n atomic.Int64
}

func (c *countingDriver) Claim(ctx context.Context, p driver.ClaimParams) ([]driver.Row, error) {
	c.n.Add(1)
	return c.Driver.Claim(ctx, p)
}

func (c *countingDriver) ExtendLease(ctx context.Context, owner string, ids []int64, lease time.Duration) (int64, error) {
	c.n.Add(1)
	return c.Driver.ExtendLease(ctx, owner, ids, lease)
}

// A sweeper whose database is closed backs off instead of retrying every
// Interval: with Interval 10ms, a handful of attempts in a second (the
// bound is generous), where it used to make ~100.
func TestRunBacksOffOnDatabaseErrors(t *testing.T) {
	db := testdb.Open(t, "sqlite")
	testdb.ApplySchema(t, db, "sqlite", templates.DefaultTables)
	drv, err := sqldriver.New(db, testdb.Schema(dialect.SQLite))
	if err != nil {
		t.Fatal(err)
	}
	cd := &countingDriver{Driver: drv}
	s, err := sweeper.New(cd, sweeper.Config{Publisher: &pub{attempts: map[string]int{}}, Interval: 10 * time.Millisecond, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	db.Close()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	time.Sleep(time.Second)
	n := cd.n.Load()
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("Run = %v, want nil (a closed database is retried)", err)
	}
	t.Logf("closed database, Interval 10ms: %d statements in 1s", n)
	if n >= 30 {
		t.Fatalf("%d statements in 1s with a closed database, want fewer than 30 (backoff from 100ms)", n)
	}
}

// A missing table ends Run at start, with advice.
func TestRunMissingTable(t *testing.T) {
	db := testdb.Open(t, "sqlite")
	drv, err := sqldriver.New(db, testdb.Schema(dialect.SQLite))
	if err != nil {
		t.Fatal(err)
	}
	s, err := sweeper.New(drv, sweeper.Config{Publisher: &pub{attempts: map[string]int{}}, Interval: 10 * time.Millisecond, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second) // a hang guard
	defer cancel()
	err = s.Run(ctx)
	if ctx.Err() != nil || err == nil || !strings.Contains(err.Error(), "apply the schema") {
		t.Fatalf("Run = %v (context: %v), want a missing-table error at once", err, ctx.Err())
	}
	if _, err := s.RunOnce(ctx); err == nil || !strings.Contains(err.Error(), `table "outbox_event" (sql.outbox_table in events.yaml) does not exist`) {
		t.Fatalf("RunOnce = %v, want the explained error", err)
	}
}
