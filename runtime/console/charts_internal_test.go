package console

import (
	"context"
	"io"
	"log/slog"
	"os"
	"testing"
	"time"

	"github.com/outboxgen/outboxgen/internal/testdb"
	"github.com/outboxgen/outboxgen/runtime/admin"
	"github.com/outboxgen/outboxgen/runtime/driver/sqldriver"
	"github.com/outboxgen/outboxgen/templates"
)

// TestChartCache: the first read of the send rate is waited for at most
// chartsWait; a slow read is shown as pending and lands in the cache when
// it ends; within ChartsMaxAge the cached rate is served. PostgreSQL holds
// the read with a table lock.
func TestChartCache(t *testing.T) {
	if os.Getenv(testdb.PostgresEnv) == "" && os.Getenv("CI") == "" {
		t.Skip(testdb.PostgresEnv + " not set")
	}
	db := testdb.Open(t, "postgres")
	testdb.ApplySchema(t, db, "postgres", templates.DefaultTables)
	if _, err := db.Exec(`INSERT INTO outbox_event (event_id, biz_type, biz_id, topic, payload, status, sent_at)
VALUES (gen_random_uuid(), 'T', 'k', 't', '{}', 1, now() - interval '1 minute')`); err != nil {
		t.Fatal(err)
	}
	drv, err := sqldriver.New(db, testdb.Schema("postgres"))
	if err != nil {
		t.Fatal(err)
	}
	a, err := admin.New(drv)
	if err != nil {
		t.Fatal(err)
	}
	cfg := Config{Admin: a, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}
	cfg.setDefaults()
	ctx := context.Background()
	// Check the table first (admin remembers it), then lock it.
	if _, err := a.Status(ctx, admin.StatusOptions{ScanRows: 1}); err != nil {
		t.Fatal(err)
	}
	tx, err := db.Begin()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec("LOCK TABLE outbox_event IN ACCESS EXCLUSIVE MODE"); err != nil {
		t.Fatal(err)
	}
	var c chartCache
	start := time.Now()
	rate, err := c.get(ctx, a, cfg)
	if err != nil || !rate.Pending || rate.SentInWindow != 0 {
		t.Fatalf("first get while the read is blocked = %+v, %v; want pending", rate, err)
	}
	if d := time.Since(start); d < chartsWait || d > chartsWait+2*time.Second {
		t.Errorf("first get took %s, want about %s", d, chartsWait)
	}
	c.mu.Lock()
	reading := c.reading
	c.mu.Unlock()
	if reading == nil {
		t.Fatal("no read under way")
	}
	if err := tx.Rollback(); err != nil {
		t.Fatal(err)
	}
	<-reading
	rate, err = c.get(ctx, a, cfg)
	if err != nil || rate.Pending || rate.SentInWindow != 1 {
		t.Fatalf("get after the read = %+v, %v; want 1 sent", rate, err)
	}
	// Within ChartsMaxAge: the cache, even when the table changed.
	if _, err := db.Exec(`INSERT INTO outbox_event (event_id, biz_type, biz_id, topic, payload, status, sent_at)
VALUES (gen_random_uuid(), 'T', 'k', 't', '{}', 1, now())`); err != nil {
		t.Fatal(err)
	}
	if rate, _ = c.get(ctx, a, cfg); rate.SentInWindow != 1 {
		t.Errorf("cached get = %d sent, want the cached 1", rate.SentInWindow)
	}
	// Once stale: the stale rate at once, the new one after the read.
	c.mu.Lock()
	c.at = time.Now().Add(-ChartsMaxAge - time.Second)
	c.mu.Unlock()
	if rate, _ = c.get(ctx, a, cfg); rate.SentInWindow != 1 || rate.Pending {
		t.Errorf("stale get = %+v, want the stale rate at once", rate)
	}
	c.mu.Lock()
	reading = c.reading
	c.mu.Unlock()
	if reading != nil {
		<-reading
	}
	if rate, _ = c.get(ctx, a, cfg); rate.SentInWindow != 2 {
		t.Errorf("get after the refresh = %d sent, want 2", rate.SentInWindow)
	}
}
