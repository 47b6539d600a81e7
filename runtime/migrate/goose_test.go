package migrate_test

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/pressly/goose/v3"

	"github.com/outboxgen/outboxgen/internal/testdb"
	"github.com/outboxgen/outboxgen/runtime/dialect"
	"github.com/outboxgen/outboxgen/runtime/driver"
	"github.com/outboxgen/outboxgen/runtime/driver/sqldriver"
	"github.com/outboxgen/outboxgen/runtime/migrate"
	"github.com/outboxgen/outboxgen/templates"
)

// TestGoose runs the migration files as outboxgen generate writes them
// (plus the test migration) with goose, as a library, on every database:
// goose reads the NNNN_name.up.sql files by their "-- +goose Up"
// annotation, each migration records itself in outboxgen's version table,
// and the runtime's start-up check and migrate.Status see the version
// goose applied.
func TestGoose(t *testing.T) {
	for _, d := range testdb.Dialects() {
		t.Run(d, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			db := testdb.Open(t, d)
			set := withTest(t, false)
			ms, err := set.Render(d, templates.Tables{Outbox: tables.Outbox, Inbox: tables.Inbox}, templates.Header{Source: "events.yaml"})
			if err != nil {
				t.Fatal(err)
			}
			dir := t.TempDir()
			for _, m := range ms {
				if err := os.WriteFile(filepath.Join(dir, m.FileName()), m.SQL, 0o644); err != nil {
					t.Fatal(err)
				}
			}
			gd := map[string]goose.Dialect{"postgres": goose.DialectPostgres, "mysql": goose.DialectMySQL, "sqlite": goose.DialectSQLite3}[d]
			p, err := goose.NewProvider(gd, db, os.DirFS(dir))
			if err != nil {
				t.Fatal(err)
			}
			res, err := p.Up(ctx)
			if err != nil {
				t.Fatalf("goose up: %v", err)
			}
			if len(res) != 4 {
				t.Fatalf("goose applied %d migrations, want 4: %v", len(res), res)
			}
			if v, err := p.GetDBVersion(ctx); err != nil || v != 4 {
				t.Fatalf("goose version %d, %v; want 4", v, err)
			}
			if !hasDuplicateTable(db) {
				t.Error("goose did not create the inbox's duplicate table (migration 2)")
			}
			s, err := migrate.Status(ctx, db, dialect.Dialect(d), tables, migrate.WithMigrations(set))
			if err != nil {
				t.Fatal(err)
			}
			if s.Current != 4 || len(s.Recorded) != 4 || len(s.Pending) != 0 || s.Runtime != "ok" {
				t.Errorf("status after goose up: %+v", s)
			}
			drv, err := sqldriver.New(db, testdb.SchemaWith(dialect.Dialect(d), tables))
			if err != nil {
				t.Fatal(err)
			}
			if err := drv.Check(ctx, driver.Outbox); err != nil {
				t.Errorf("start-up check after goose up: %v", err)
			}
			// outboxgen migrate finds nothing to do.
			r, err := migrate.Up(ctx, db, dialect.Dialect(d), tables, migrate.WithMigrations(set))
			if err != nil || r.Changed() {
				t.Errorf("migrate up after goose up: %+v, %v", r, err)
			}
		})
	}
}

// TestGooseUpgrade: a database goose migrated to version 1 (the files an
// older outboxgen wrote) is taken to each later version, the latest
// included, as its file (0002_inbox_duplicates.up.sql, then
// 0003_claim_index_keys.up.sql, ...) is added to the directory: the
// inbox's duplicate table exists from 2 on, the version table records
// each, and the runtime's check of the table passes.
func TestGooseUpgrade(t *testing.T) {
	for _, d := range testdb.Dialects() {
		t.Run(d, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			db := testdb.Open(t, d)
			ms, err := templates.RenderMigrations(d, templates.Tables{Outbox: tables.Outbox, Inbox: tables.Inbox}, templates.Header{Source: "events.yaml"})
			if err != nil {
				t.Fatal(err)
			}
			var files []string
			for _, m := range ms {
				files = append(files, m.FileName())
			}
			if len(ms) != dialect.SchemaVersion || len(ms) < 3 || files[1] != "0002_inbox_duplicates.up.sql" || files[2] != "0003_claim_index_keys.up.sql" {
				t.Fatalf("migrations %v, want 0001 to %04d, with 0002_inbox_duplicates and 0003_claim_index_keys", files, dialect.SchemaVersion)
			}
			dir := t.TempDir()
			gd := map[string]goose.Dialect{"postgres": goose.DialectPostgres, "mysql": goose.DialectMySQL, "sqlite": goose.DialectSQLite3}[d]
			for i, m := range ms {
				if err := os.WriteFile(filepath.Join(dir, m.FileName()), m.SQL, 0o644); err != nil {
					t.Fatal(err)
				}
				p, err := goose.NewProvider(gd, db, os.DirFS(dir))
				if err != nil {
					t.Fatal(err)
				}
				if _, err := p.Up(ctx); err != nil {
					t.Fatalf("goose up to %d: %v", i+1, err)
				}
				if v, err := p.GetDBVersion(ctx); err != nil || v != int64(i+1) {
					t.Fatalf("goose version %d, %v; want %d", v, err, i+1)
				}
				if got := hasDuplicateTable(db); got != (i >= 1) {
					t.Fatalf("at version %d the duplicate table exists: %v", i+1, got)
				}
			}
			s, err := migrate.Status(ctx, db, dialect.Dialect(d), tables)
			if err != nil {
				t.Fatal(err)
			}
			if s.Current != len(ms) || len(s.Recorded) != len(ms) || len(s.Pending) != 0 || s.Runtime != "ok" {
				t.Errorf("status after goose up to %d: %+v", len(ms), s)
			}
			drv, err := sqldriver.New(db, testdb.SchemaWith(dialect.Dialect(d), tables))
			if err != nil {
				t.Fatal(err)
			}
			if err := drv.Check(ctx, driver.InboxDuplicates); err != nil {
				t.Errorf("check of the duplicate table after goose up: %v", err)
			}
		})
	}
}
