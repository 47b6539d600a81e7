package privtest

import (
	"database/sql"
	"path/filepath"
	"strings"
	"testing"

	"github.com/outboxgen/outboxgen/internal/testdb"
	"github.com/outboxgen/outboxgen/runtime/dialect"
	"github.com/outboxgen/outboxgen/runtime/driver/sqldriver"
	"github.com/outboxgen/outboxgen/runtime/monitor"
	"github.com/outboxgen/outboxgen/runtime/outbox"
	"github.com/outboxgen/outboxgen/runtime/relay"
	"github.com/outboxgen/outboxgen/templates"
)

// TestSQLiteReadOnlyMonitor: SQLite has no GRANT; what restricts a
// component is how it opens the file. A monitor works on a read-only
// connection (mode=ro), and a relay on the same connection fails: it
// cannot claim.
func TestSQLiteReadOnlyMonitor(t *testing.T) {
	if _, err := templates.RenderGrants("sqlite", templates.GrantParams{Tables: tables, Database: "db", Roles: templates.Roles{Monitor: "m"}}); err == nil || !strings.Contains(err.Error(), "file permissions") {
		t.Fatalf("RenderGrants(sqlite): %v, want an error pointing at file permissions", err)
	}
	path := filepath.Join(t.TempDir(), "outbox.db")
	rw, err := sql.Open("sqlite", testdb.SQLiteDSN(path))
	if err != nil {
		t.Fatal(err)
	}
	defer rw.Close()
	testdb.ApplySchema(t, rw, "sqlite", tables)
	ctx := t.Context()
	tx, err := rw.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := outbox.MustNewWriter(dialect.SQLite, tables.Outbox).Insert(ctx, tx, event("ro-1")); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}

	ro, err := sql.Open("sqlite", "file:"+path+"?mode=ro&_pragma=busy_timeout(10000)")
	if err != nil {
		t.Fatal(err)
	}
	defer ro.Close()
	drv, err := sqldriver.New(ro, testdb.SchemaWith(dialect.SQLite, drvTables))
	if err != nil {
		t.Fatal(err)
	}
	m, err := monitor.New(drv, monitor.Config{Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	st, _, err := m.Check(ctx)
	if err != nil || st.Pending != 1 {
		t.Fatalf("monitor on a read-only SQLite connection: %+v, %v", st, err)
	}
	r, err := relay.New(drv, relay.Config{Publisher: newPublisher(), Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := r.RunOnce(ctx); err == nil || !strings.Contains(strings.ToLower(err.Error()), "readonly") && !strings.Contains(strings.ToLower(err.Error()), "read-only") {
		t.Fatalf("relay on a read-only SQLite connection: %v, want a read-only error", err)
	}
}
