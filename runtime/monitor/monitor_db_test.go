package monitor_test

import (
	"context"
	"database/sql"
	"testing"

	"github.com/jackc/pgx/v5/stdlib"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"

	"github.com/outboxgen/outboxgen/internal/testdb"
	"github.com/outboxgen/outboxgen/runtime/dialect"
	"github.com/outboxgen/outboxgen/runtime/driver"
	"github.com/outboxgen/outboxgen/runtime/driver/drivertest"
	"github.com/outboxgen/outboxgen/runtime/driver/pgxdriver"
	"github.com/outboxgen/outboxgen/runtime/driver/sqldriver"
	"github.com/outboxgen/outboxgen/runtime/monitor"
	"github.com/outboxgen/outboxgen/templates"
)

// TestMonitorOnDatabases seeds rows in every state on each database, then
// checks exact stats, alerts (once), metrics, and resolution once the rows
// are dealt with.
func TestMonitorOnDatabases(t *testing.T) {
	onDrivers(t, testdb.Dialects(), testMonitor)
}

// onDrivers runs test on each dialect of dialects through sqldriver, and
// on PostgreSQL through pgxdriver ("pgx"), each on a fresh outbox.
func onDrivers(t *testing.T, dialects []string, test func(t *testing.T, db *sql.DB, d dialect.Dialect, drv statsSource)) {
	for _, name := range dialects {
		t.Run(name, func(t *testing.T) {
			d, err := dialect.Parse(name)
			if err != nil {
				t.Fatal(err)
			}
			db := testdb.Open(t, name)
			testdb.ApplySchema(t, db, name, templates.DefaultTables)
			drv, err := sqldriver.New(db, testdb.Schema(d))
			if err != nil {
				t.Fatal(err)
			}
			test(t, db, d, drv)
		})
	}
	t.Run("pgx", func(t *testing.T) {
		pool := testdb.PgxPool(t)
		db := stdlib.OpenDBFromPool(pool)
		t.Cleanup(func() { db.Close() })
		testdb.ApplySchema(t, db, "postgres", templates.DefaultTables)
		drv, err := pgxdriver.New(pool, testdb.Schema(dialect.Postgres))
		if err != nil {
			t.Fatal(err)
		}
		test(t, db, dialect.Postgres, drv)
	})
}

type statsSource interface {
	monitor.Source
	Tables() driver.Tables
}

func testMonitor(t *testing.T, db *sql.DB, d dialect.Dialect, drv statsSource) {
	ctx := context.Background()
	tables := drv.Tables()
	want := drivertest.OpsStatsFixture(t, db, d, tables)

	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	t.Cleanup(func() { mp.Shutdown(context.Background()) })
	rec := newRecorder()
	m, err := monitor.New(drv, monitor.Config{Logger: quiet, Meter: mp.Meter("test"), OnAlert: rec.onAlert, OnResolve: rec.onResolve})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()

	st, alerts, err := m.Check(ctx)
	if err != nil {
		t.Fatal(err)
	}
	drivertest.OpsCheckStats(t, st, want)
	if len(alerts) != 4 {
		t.Errorf("Check alerts = %+v, want stale, oldest_pending_age, failed, expired_leases", alerts)
	}
	got := collect(t, reader)
	for k, v := range map[string]float64{
		"outboxgen.outbox.pending": 7, "outboxgen.outbox.stale": 3, "outboxgen.outbox.failed": 1, "outboxgen.outbox.expired_leases": 1,
	} {
		if got[k] != v {
			t.Errorf("metric %s = %v, want %v", k, got[k], v)
		}
	}
	if age := got["outboxgen.outbox.oldest_pending_age"]; age < 7200 || age >= 7800 {
		t.Errorf("metric oldest_pending_age = %vs, want 2h (up to 10 minutes more)", age)
	}
	if a := collectAttrs(t, reader, "outboxgen.outbox.pending"); a != "outboxgen.table="+tables.Outbox {
		t.Errorf("metric attributes %q, want the outbox table", a)
	}

	// Scheduled checks: each alert once.
	for range 2 {
		if err := m.Tick(ctx); err != nil {
			t.Fatal(err)
		}
	}
	alertsBy, resolvesBy := rec.counts()
	if !equalCounts(alertsBy, map[monitor.Kind]int{"stale": 1, "oldest_pending_age": 1, "failed": 1, "expired_leases": 1}) || len(resolvesBy) != 0 {
		t.Fatalf("after two checks: alerts %v resolves %v, want each alert once, no resolve", alertsBy, resolvesBy)
	}

	// Everything gets published (failed rows requeued and sent too).
	now := map[dialect.Dialect]string{dialect.Postgres: "now()", dialect.MySQL: "CURRENT_TIMESTAMP(6)", dialect.SQLite: "strftime('%Y-%m-%d %H:%M:%f', 'now')"}[d]
	if _, err := db.ExecContext(ctx, "UPDATE "+tables.Outbox+" SET status = 1, sent_at = "+now+", lease_owner = NULL, lease_expires_at = NULL WHERE status <> 1"); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if err := m.Tick(ctx); err != nil {
			t.Fatal(err)
		}
	}
	alertsBy, resolvesBy = rec.counts()
	all := map[monitor.Kind]int{"stale": 1, "oldest_pending_age": 1, "failed": 1, "expired_leases": 1}
	if !equalCounts(alertsBy, all) || !equalCounts(resolvesBy, all) {
		t.Fatalf("after clearing: alerts %v resolves %v, want each once", alertsBy, resolvesBy)
	}
	st, _, _ = m.Snapshot()
	if st != (driver.Stats{}) {
		t.Errorf("snapshot after clearing = %+v, want zero", st)
	}
	got = collect(t, reader)
	for _, k := range []string{"outboxgen.outbox.pending", "outboxgen.outbox.stale", "outboxgen.outbox.failed", "outboxgen.outbox.expired_leases", "outboxgen.outbox.oldest_pending_age"} {
		if v, ok := got[k]; !ok || v != 0 {
			t.Errorf("metric %s = %v (reported %v), want 0", k, v, ok)
		}
	}
}
