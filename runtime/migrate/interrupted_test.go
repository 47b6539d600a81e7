package migrate_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/outboxgen/outboxgen/internal/testdb"
	"github.com/outboxgen/outboxgen/runtime/dialect"
	"github.com/outboxgen/outboxgen/runtime/migrate"
	"github.com/outboxgen/outboxgen/templates"
)

// migration returns migration version of outboxgen's, rendered for the
// test's tables.
func migration(t *testing.T, d string, version int) templates.Migration {
	t.Helper()
	ms, err := templates.RenderMigrations(d, templates.Tables{Outbox: tables.Outbox, Inbox: tables.Inbox}, templates.Header{})
	if err != nil {
		t.Fatal(err)
	}
	return ms[version-1]
}

// checkReportWording: a report of an Up that stopped short of the latest
// version never calls the version it reached the latest, and says which
// are not applied.
func checkReportWording(t *testing.T, r migrate.Report, want string) {
	t.Helper()
	text := r.String()
	if strings.Contains(text, "the latest\n") || strings.Contains(text, ", the latest") {
		t.Errorf("the report calls version %d the latest (latest: %d):\n%s", r.To, r.Latest, text)
	}
	if !strings.Contains(text, want) {
		t.Errorf("the report lacks %q:\n%s", want, text)
	}
}

// TestInterruptedMigrationResumes: MySQL commits each DDL statement, so a
// migrate up killed (or losing its connection) after migration 2's CREATE
// TABLE and before its version INSERT leaves the table without version 2.
// The next Up finds the table exactly as the migration creates it, keeps
// it (with the rows a consumer wrote meanwhile) and records version 2,
// and says so, then applies the later migrations; before, every later Up
// failed with "nothing of it is applied".
func TestInterruptedMigrationResumes(t *testing.T) {
	ctx := context.Background()
	db := testdb.Open(t, "mysql")
	if _, err := migrate.Up(ctx, db, dialect.MySQL, tables, migrate.WithMigrations(version1(t))); err != nil {
		t.Fatal(err)
	}
	// The interrupted run: migration 2's first statement only.
	m2 := migration(t, "mysql", 2)
	if _, err := db.Exec(m2.Statements()[0]); err != nil {
		t.Fatal(err)
	}
	dup := dialect.InboxDuplicateTable(tables.Inbox)
	// The runtime finds the table (it looks once a minute) and uses it.
	if _, err := db.Exec("INSERT INTO " + dup + " (consumer, event_id) VALUES ('points', 'e-1')"); err != nil {
		t.Fatal(err)
	}
	s, err := migrate.Status(ctx, db, dialect.MySQL, tables)
	if err != nil || s.Current != 1 || len(s.Pending) != latest-1 {
		t.Fatalf("status: %+v, %v", s, err)
	}

	r, err := migrate.Up(ctx, db, dialect.MySQL, tables)
	if err != nil {
		t.Fatalf("Up after an interrupted migration 2: %v\n%s", err, r)
	}
	t.Logf("Up:\n%s", r)
	if r.From != 1 || r.To != latest || len(r.Applied) != latest-1 || r.Applied[0].Version != 2 || !slices.Equal(r.Applied[0].Kept, []string{dup}) {
		t.Fatalf("report: %+v", r)
	}
	for _, a := range r.Applied[1:] {
		if len(a.Kept) != 0 {
			t.Errorf("report: %s kept %v", a.File, a.Kept)
		}
	}
	if want := "applied 0002_inbox_duplicates.up.sql (version 2, 3 statements, "; !strings.Contains(r.String(), want) {
		t.Errorf("report lacks %q:\n%s", want, r)
	}
	if want := "resumed an interrupted run: kept the table " + dup + " it had created (exactly as the migration creates it)"; !strings.Contains(r.String(), want) {
		t.Errorf("report lacks %q:\n%s", want, r)
	}
	var n int
	if err := db.QueryRow("SELECT COUNT(*) FROM " + dup).Scan(&n); err != nil || n != 1 {
		t.Errorf("rows of %s: %d, %v; want the one written before", dup, n, err)
	}
	s, err = migrate.Status(ctx, db, dialect.MySQL, tables)
	if err != nil || s.Current != latest || len(s.Pending) != 0 || len(s.Recorded) != latest {
		t.Errorf("status after Up: %+v, %v", s, err)
	}
	if again, err := migrate.Up(ctx, db, dialect.MySQL, tables); err != nil || again.Changed() {
		t.Errorf("second Up: %+v, %v", again, err)
	}
}

// TestInterruptedFirstMigrationResumes: the same after migration 1's first
// CREATE TABLE (the outbox table, no version table yet): Up creates the
// rest of migration 1 and goes on, where it refused partial tables.
func TestInterruptedFirstMigrationResumes(t *testing.T) {
	ctx := context.Background()
	db := testdb.Open(t, "mysql")
	if _, err := db.Exec(migration(t, "mysql", 1).Statements()[0]); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Exec("INSERT INTO " + tables.Outbox + " (event_id, biz_type, biz_id, topic, payload) VALUES ('0190a0a0-0000-7000-8000-000000000001', 'T', 'k', 'orders', '{}')"); err != nil {
		t.Fatal(err)
	}
	_, err := migrate.Status(ctx, db, dialect.MySQL, tables)
	if err == nil || !strings.Contains(err.Error(), "migrate up resumes it") {
		t.Errorf("status of migration 1 interrupted: %v", err)
	}
	r, err := migrate.Up(ctx, db, dialect.MySQL, tables)
	if err != nil {
		t.Fatalf("Up after an interrupted migration 1: %v\n%s", err, r)
	}
	t.Logf("Up:\n%s", r)
	if r.From != 0 || r.To != latest || len(r.Applied) != latest || !slices.Equal(r.Applied[0].Kept, []string{tables.Outbox}) {
		t.Fatalf("report: %+v", r)
	}
	for _, a := range r.Applied[1:] {
		if len(a.Kept) != 0 {
			t.Errorf("report: %s kept %v", a.File, a.Kept)
		}
	}
	var n int
	if err := db.QueryRow("SELECT COUNT(*) FROM " + tables.Outbox).Scan(&n); err != nil || n != 1 {
		t.Errorf("rows of %s: %d, %v", tables.Outbox, n, err)
	}
}

// TestExistingTableDiffers: a table of migration 2's name that is not the
// one migration 2 creates (another application's, or one changed since)
// is not taken for an interrupted run's: Up stops, names it, shows how it
// differs and what to do, and never says "nothing of it is applied"; the
// report does not call version 1 the latest. On PostgreSQL and SQLite the
// migration is rolled back, and says so.
func TestExistingTableDiffers(t *testing.T) {
	for _, d := range testdb.Dialects() {
		t.Run(d, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			db := testdb.Open(t, d)
			dia := dialect.Dialect(d)
			if _, err := migrate.Up(ctx, db, dia, tables, migrate.WithMigrations(version1(t))); err != nil {
				t.Fatal(err)
			}
			dup := dialect.InboxDuplicateTable(tables.Inbox)
			// Migration 2's table with last_seen_at named seen_last.
			create := strings.ReplaceAll(migration(t, d, 2).Statements()[0], "last_seen_at", "seen_last")
			if _, err := db.Exec(create); err != nil {
				t.Fatalf("%v\n%s", err, create)
			}
			r, err := migrate.Up(ctx, db, dia, tables)
			if err == nil {
				t.Fatal("Up accepted a table that is not migration 2's")
			}
			t.Logf("Up:\n%s%v", r, err)
			var want []string
			if d == "mysql" {
				want = []string{"migration 0002_inbox_duplicates.up.sql: table " + dup + " already exists, and is not the table statement 1 of 3 creates",
					"`seen_last`", "`last_seen_at`", "rename or drop it", "Nothing was run: the version is not recorded"}
				if strings.Contains(err.Error(), "nothing of it is applied") {
					t.Errorf("MySQL error says nothing is applied: %v", err)
				}
			} else {
				want = []string{"migration 0002_inbox_duplicates.up.sql failed at statement 1 of", "rolled back (nothing of it is applied)"}
			}
			for _, w := range want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error lacks %q: %v", w, err)
				}
			}
			if r.From != 1 || r.To != 1 || r.Changed() {
				t.Errorf("report: %+v", r)
			}
			checkReportWording(t, r, fmt.Sprintf("nothing applied: the database is at version 1; versions 2 to %d (the latest) are not applied\n", latest))
		})
	}
}

// TestLostConnectionMayBeApplied: the client gives up on a MySQL DDL
// statement (a lost connection, a timeout, Ctrl-C) that the server goes
// on to finish: the error says the statement may be applied, never that
// nothing is; once the server has finished it, Up resumes the migration.
func TestLostConnectionMayBeApplied(t *testing.T) {
	db := testdb.Open(t, "mysql")
	set, err := templates.Builtin().Extend([]templates.MigrationInfo{{Version: 4, Name: "test_slow", CompatibleFrom: 1}}, os.DirFS("testdata"), "slow_migration.sql.tmpl")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := migrate.Up(context.Background(), db, dialect.MySQL, tables); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	defer cancel()
	r, err := migrate.Up(ctx, db, dialect.MySQL, tables, migrate.WithMigrations(set))
	if err == nil {
		t.Fatal("Up with a 500ms timeout finished a 2s statement")
	}
	t.Logf("Up:\n%s%v", r, err)
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("error does not wrap the deadline: %v", err)
	}
	for _, want := range []string{"migration 0004_test_slow.up.sql: statement 1 of 3 did not complete", "the server may have applied it", "The version is not recorded", "Run migrate up again once the database is reachable: it resumes the migration"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error lacks %q: %v", want, err)
		}
	}
	if strings.Contains(err.Error(), "nothing of it is applied") {
		t.Errorf("error says nothing is applied: %v", err)
	}
	checkReportWording(t, r, "nothing applied: the database is at version 3; version 4 (the latest) is not applied\n")

	// The server finishes the statement the client gave up on.
	slow := tables.Outbox + "_slow"
	deadline := time.Now().Add(20 * time.Second)
	for !tableExists(db, slow) {
		if time.Now().After(deadline) {
			t.Fatalf("the server never finished creating %s", slow)
		}
		time.Sleep(100 * time.Millisecond)
	}
	r, err = migrate.Up(context.Background(), db, dialect.MySQL, tables, migrate.WithMigrations(set))
	if err != nil {
		t.Fatalf("Up after the lost statement: %v\n%s", err, r)
	}
	t.Logf("Up:\n%s", r)
	if r.From != 3 || r.To != 4 || len(r.Applied) != 1 || !slices.Equal(r.Applied[0].Kept, []string{slow}) {
		t.Errorf("report: %+v", r)
	}
}

func tableExists(db *sql.DB, table string) bool {
	_, err := db.Exec("SELECT 1 FROM " + table + " WHERE 1 = 0")
	return err == nil
}

// TestReportString: the report's last line for each outcome; "the
// latest" only of the latest version.
func TestReportString(t *testing.T) {
	for _, c := range []struct {
		r    migrate.Report
		want string
	}{
		{migrate.Report{From: 2, To: 2, Latest: 2}, "nothing to apply: the database is at version 2, the latest\n"},
		{migrate.Report{From: 1, To: 1, Latest: 2}, "nothing applied: the database is at version 1; version 2 (the latest) is not applied\n"},
		{migrate.Report{From: 0, To: 0, Latest: 2}, "nothing applied: the database has no outboxgen tables yet; versions 1 to 2 (the latest) are not applied\n"},
		{migrate.Report{From: 0, To: 1, Latest: 3, VersionTable: "v", Applied: []migrate.Applied{{Version: 1, File: "0001_a.up.sql", Statements: 2}}},
			"schema version 0 -> 1 (recorded in v); versions 2 to 3 (the latest) are not applied\n"},
		{migrate.Report{From: 0, To: 2, Latest: 2, VersionTable: "v", Applied: []migrate.Applied{{Version: 2, File: "0002_a.up.sql", Statements: 2}}},
			"schema version 0 -> 2 (recorded in v)\n"},
		{migrate.Report{From: 1, To: 1, Latest: 2, ArchiveCreated: "a"}, "schema version 1; version 2 (the latest) is not applied\n"},
		{migrate.Report{From: 2, To: 2, Latest: 2, ArchiveCreated: "a"}, "schema version 2, the latest\n"},
		{migrate.Report{From: 3, To: 3, Latest: 2}, "nothing to apply: the database is at version 3, newer than the 2 this outboxgen knows\n"},
	} {
		if got := c.r.String(); !strings.HasSuffix(got, c.want) {
			t.Errorf("%+v:\n%s\nwant it to end with\n%s", c.r, got, c.want)
		}
	}
}

// TestReportOfUnreadVersion: an Up that fails before it could read the
// version (here: the database is gone) reports no version at all.
func TestReportOfUnreadVersion(t *testing.T) {
	db := testdb.Open(t, "sqlite")
	db.Close()
	r, err := migrate.Up(context.Background(), db, dialect.SQLite, tables)
	if err == nil {
		t.Fatal("Up on a closed database succeeded")
	}
	if got := r.String(); strings.Contains(got, "version 0") || !strings.Contains(got, "nothing applied: the schema version could not be read\n") {
		t.Errorf("report:\n%s", got)
	}
}

// TestForeignTableChangesNothing: a MySQL database with some of migration
// 1's tables, one of which is not migration 1's: Up stops before it
// creates anything, naming the table.
func TestForeignTableChangesNothing(t *testing.T) {
	ctx := context.Background()
	db := testdb.Open(t, "mysql")
	if _, err := db.Exec("CREATE TABLE " + tables.Inbox + " (consumer VARCHAR(64) NOT NULL, event_id VARCHAR(64) NOT NULL, biz_type VARCHAR(64) NULL, biz_id VARCHAR(128) NULL, processed_at DATETIME(6) NOT NULL, PRIMARY KEY (consumer, event_id))"); err != nil {
		t.Fatal(err)
	}
	r, err := migrate.Up(ctx, db, dialect.MySQL, tables)
	if err == nil || !strings.Contains(err.Error(), "migration 0001_outbox_tables.up.sql: table "+tables.Inbox+" already exists, and is not the table statement 2 of 5 creates") ||
		!strings.Contains(err.Error(), "Nothing was run") {
		t.Fatalf("Up: %v\n%s", err, r)
	}
	t.Logf("Up:\n%s%v", r, err)
	if tableExists(db, tables.Outbox) || tableExists(db, dialect.VersionTable(tables.Outbox)) {
		t.Error("Up created tables before it stopped")
	}
	checkReportWording(t, r, fmt.Sprintf("nothing applied: the database has no outboxgen tables yet; versions 1 to %d (the latest) are not applied\n", latest))
}

// TestInterruptedAlterSaysWhatToDo: a MySQL migration interrupted after a
// statement Up cannot check (an ALTER TABLE): the next Up says that an
// earlier run most likely applied it and what to run by hand, and doing
// so finishes the migration.
func TestInterruptedAlterSaysWhatToDo(t *testing.T) {
	ctx := context.Background()
	db := testdb.Open(t, "mysql")
	set := withTest(t, false)
	if _, err := migrate.Up(ctx, db, dialect.MySQL, tables); err != nil {
		t.Fatal(err)
	}
	ms, err := set.Render("mysql", templates.Tables{Outbox: tables.Outbox, Inbox: tables.Inbox}, templates.Header{})
	if err != nil {
		t.Fatal(err)
	}
	run := ms[len(ms)-1].Statements() // the test migration's: ALTER TABLE, CREATE INDEX, the version record (2)
	if _, err := db.Exec(run[0]); err != nil {
		t.Fatal(err)
	}
	r, err := migrate.Up(ctx, db, dialect.MySQL, tables, migrate.WithMigrations(set))
	if err == nil {
		t.Fatal("Up succeeded")
	}
	t.Logf("Up:\n%s%v", r, err)
	for _, want := range []string{"migration 0004_test_trace_id.up.sql failed at statement 1 of 4: Error 1060", "What this statement creates already exists and the version is not recorded",
		"an earlier run of this migration most likely stopped after this statement", "run the file's statements 2 to 4 by hand"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error lacks %q: %v", want, err)
		}
	}
	if strings.Contains(err.Error(), "nothing of it is applied") {
		t.Errorf("error says nothing is applied: %v", err)
	}
	checkReportWording(t, r, "nothing applied: the database is at version 3; version 4 (the latest) is not applied\n")
	for _, stmt := range run[1:] {
		if _, err := db.Exec(stmt); err != nil {
			t.Fatal(err)
		}
	}
	if r, err := migrate.Up(ctx, db, dialect.MySQL, tables, migrate.WithMigrations(set)); err != nil || r.Changed() || r.To != 4 {
		t.Errorf("Up after the statements by hand: %+v, %v", r, err)
	}
}
