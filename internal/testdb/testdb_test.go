package testdb_test

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/outboxgen/outboxgen/internal/testdb"
	"github.com/outboxgen/outboxgen/templates"
)

func TestOpenFreshAndDropped(t *testing.T) {
	for _, d := range testdb.Dialects() {
		t.Run(d, func(t *testing.T) {
			t.Parallel()
			var names []string
			for i := range 2 {
				t.Run(fmt.Sprint(i), func(t *testing.T) {
					db := testdb.Open(t, d)
					ctx := context.Background()
					var name string
					var tables int
					switch d {
					case "postgres":
						if err := db.QueryRowContext(ctx, "SELECT current_database()").Scan(&name); err != nil {
							t.Fatal(err)
						}
						if err := db.QueryRowContext(ctx, "SELECT COUNT(*) FROM information_schema.tables WHERE table_schema = 'public'").Scan(&tables); err != nil {
							t.Fatal(err)
						}
					case "mysql":
						if err := db.QueryRowContext(ctx, "SELECT DATABASE()").Scan(&name); err != nil {
							t.Fatal(err)
						}
						if err := db.QueryRowContext(ctx, "SELECT COUNT(*) FROM information_schema.tables WHERE table_schema = DATABASE()").Scan(&tables); err != nil {
							t.Fatal(err)
						}
					case "sqlite":
						name = "sqlite"
						if err := db.QueryRowContext(ctx, "SELECT COUNT(*) FROM sqlite_master").Scan(&tables); err != nil {
							t.Fatal(err)
						}
						var mode string
						if err := db.QueryRowContext(ctx, "PRAGMA journal_mode").Scan(&mode); err != nil || mode != "wal" {
							t.Errorf("journal_mode = %q, %v; want wal", mode, err)
						}
						var fk, busy int
						if err := db.QueryRowContext(ctx, "PRAGMA foreign_keys").Scan(&fk); err != nil || fk != 1 {
							t.Errorf("foreign_keys = %d, %v; want 1", fk, err)
						}
						if err := db.QueryRowContext(ctx, "PRAGMA busy_timeout").Scan(&busy); err != nil || busy != 10000 {
							t.Errorf("busy_timeout = %d, %v; want 10000", busy, err)
						}
					}
					if tables != 0 {
						t.Errorf("fresh database has %d tables", tables)
					}
					if d != "sqlite" && !strings.HasPrefix(name, "og_") {
						t.Errorf("database name %q, want og_<hex>", name)
					}
					testdb.ApplySchema(t, db, d, templates.DefaultTables)
					names = append(names, name)
				})
			}
			if d == "sqlite" || len(names) != 2 {
				return
			}
			if names[0] == names[1] {
				t.Errorf("two tests got the same database %q", names[0])
			}
			// Both subtests' cleanups have run: their databases are gone.
			db := testdb.Open(t, d)
			for _, name := range names {
				var n int
				q := "SELECT COUNT(*) FROM pg_database WHERE datname = $1"
				if d == "mysql" {
					q = "SELECT COUNT(*) FROM information_schema.schemata WHERE schema_name = ?"
				}
				if err := db.QueryRow(q, name).Scan(&n); err != nil {
					t.Fatal(err)
				}
				if n != 0 {
					t.Errorf("database %s still exists after its test ended", name)
				}
			}
		})
	}
}

func TestPgxPool(t *testing.T) {
	pool := testdb.PgxPool(t)
	var name string
	if err := pool.QueryRow(context.Background(), "SELECT current_database()").Scan(&name); err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(name, "og_") {
		t.Errorf("database %q, want og_<hex>", name)
	}
}

// fakeTB records Skipf and Fatalf instead of ending the test.
type fakeTB struct {
	testing.TB
	skipped, fatal string
}

type stop struct{}

func (f *fakeTB) Helper() {}
func (f *fakeTB) Skipf(format string, args ...any) {
	f.skipped = fmt.Sprintf(format, args...)
	panic(stop{})
}
func (f *fakeTB) Fatalf(format string, args ...any) {
	f.fatal = fmt.Sprintf(format, args...)
	panic(stop{})
}

func run(f *fakeTB, fn func()) {
	defer func() {
		if r := recover(); r != nil {
			if _, ok := r.(stop); !ok {
				panic(r)
			}
		}
	}()
	fn()
}

func TestMissingDSN(t *testing.T) {
	for _, d := range []string{"postgres", "mysql"} {
		env := map[string]string{"postgres": testdb.PostgresEnv, "mysql": testdb.MySQLEnv}[d]
		t.Run(d, func(t *testing.T) {
			t.Setenv(env, "")
			t.Setenv("CI", "")
			f := &fakeTB{TB: t}
			run(f, func() { testdb.Open(f, d) })
			if f.skipped == "" || f.fatal != "" || !strings.Contains(f.skipped, "scripts/testdb.sh start") {
				t.Errorf("without CI: skipped %q, fatal %q; want a skip naming scripts/testdb.sh start", f.skipped, f.fatal)
			}
			t.Setenv("CI", "true")
			f = &fakeTB{TB: t}
			run(f, func() { testdb.Open(f, d) })
			if f.fatal == "" || f.skipped != "" || !strings.Contains(f.fatal, "make test") {
				t.Errorf("with CI: skipped %q, fatal %q; want a failure naming make test", f.skipped, f.fatal)
			}
		})
	}
}

func TestUnknownDialect(t *testing.T) {
	f := &fakeTB{TB: t}
	run(f, func() { testdb.Open(f, "oracle") })
	if f.fatal == "" {
		t.Error("unknown dialect accepted")
	}
}
