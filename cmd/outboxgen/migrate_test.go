package main

import (
	"database/sql"
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/outboxgen/outboxgen/internal/testdb"
	"github.com/outboxgen/outboxgen/templates"
)

func TestMigrateSQLite(t *testing.T) {
	latest := templates.Builtin().Latest().Version
	dir := t.TempDir()
	if code, _, stderr := cli(t, dir, "migrate", "-db", "sqlite:app.db", "status"); code != 1 || !strings.Contains(stderr, "app.db") {
		t.Errorf("status of a missing file: exit %d, %s", code, stderr)
	}
	code, stdout, stderr := cli(t, dir, "migrate", "-db", "sqlite:app.db", "up")
	if code != 0 {
		t.Fatalf("up: exit %d: %s%s", code, stdout, stderr)
	}
	for _, want := range []string{"created the SQLite file app.db\n", "database: app.db (SQLite)\n", "applied 0001_outbox_tables.up.sql (version 1, ", "applied 0002_inbox_duplicates.up.sql (version 2, ",
		"applied 0003_claim_index_keys.up.sql (version 3, ", fmt.Sprintf("schema version 0 -> %d (recorded in outbox_event_version)\n", latest)} {
		if !strings.Contains(stdout, want) {
			t.Errorf("up output lacks %q:\n%s", want, stdout)
		}
	}
	t.Logf("migrate up:\n%s", stdout)
	// The action may come first or last; status is the default.
	for _, args := range [][]string{{"migrate", "-db", "sqlite:app.db"}, {"migrate", "status", "-db", "sqlite:app.db"}} {
		code, stdout, stderr = cli(t, dir, args...)
		if code != 0 || !strings.Contains(stdout, fmt.Sprintf("version:    %d, recorded in outbox_event_version (usable by runtimes that know version 1 or later)\n", latest)) ||
			!strings.Contains(stdout, "  0001_outbox_tables.up.sql        applied ") || !strings.Contains(stdout, "  0002_inbox_duplicates.up.sql     applied ") ||
			!strings.Contains(stdout, "  0003_claim_index_keys.up.sql     applied ") ||
			!strings.Contains(stdout, "pending:    none\n") {
			t.Errorf("%v: exit %d\n%s%s", args, code, stdout, stderr)
		}
	}
	t.Logf("migrate status:\n%s", stdout)
	code, stdout, _ = cli(t, dir, "migrate", "up", "-db", "sqlite:app.db")
	if code != 0 || !strings.Contains(stdout, fmt.Sprintf("nothing to apply: the database is at version %d, the latest\n", latest)) || strings.Contains(stdout, "created") {
		t.Errorf("second up: exit %d\n%s", code, stdout)
	}
	code, stdout, _ = cli(t, dir, "migrate", "-db", "sqlite:app.db", "-o", "json", "status")
	var st struct {
		Current int
		Pending []any
		Runtime string
	}
	if err := json.Unmarshal([]byte(stdout), &st); code != 0 || err != nil || st.Current != latest || st.Pending == nil || len(st.Pending) != 0 || st.Runtime != "ok" {
		t.Errorf("status -o json: exit %d, %v, %+v\n%s", code, err, st, stdout)
	}
	for _, args := range [][]string{{"migrate", "-db", "sqlite:app.db", "down"}, {"migrate", "up", "status", "-db", "sqlite:app.db"}, {"migrate", "-o", "yaml", "-db", "sqlite:app.db"}} {
		if code, _, _ := cli(t, dir, args...); code != 2 {
			t.Errorf("%v: exit %d, want 2", args, code)
		}
	}
	t.Setenv(envDB, "")
	if code, _, stderr := cli(t, dir, "migrate", "up"); code != 2 || !strings.Contains(stderr, "no database") {
		t.Errorf("no -db: exit %d, %s", code, stderr)
	}
}

// A PostgreSQL database created from the DDL of before versioned
// migrations: status says so, up records it as version 1, and no output
// shows the password.
func TestMigrateLegacyPostgres(t *testing.T) {
	dsn := testdb.DSN(t, "postgres")
	db, err := sql.Open("pgx", dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	ms, err := templates.RenderMigrations("postgres", templates.DefaultTables, templates.Header{})
	if err != nil {
		t.Fatal(err)
	}
	all, record := ms[0].Statements(), templates.Statements(ms[0].Record)
	for _, stmt := range all[:len(all)-len(record)] {
		if _, err := db.Exec(stmt); err != nil {
			t.Fatal(err)
		}
	}
	dir := t.TempDir()
	code, stdout, stderr := cli(t, dir, "migrate", "-db", dsn)
	if code != 0 || !strings.Contains(stdout, "version:    1 (tables created before versioned migrations, not recorded in outbox_event_version yet: migrate up records them)\n") ||
		!strings.Contains(stdout, "0001_outbox_tables.up.sql        applied (before versioned migrations)") {
		t.Fatalf("status: exit %d\n%s%s", code, stdout, stderr)
	}
	t.Logf("migrate status:\n%s", stdout)
	code, stdout, stderr = cli(t, dir, "migrate", "-db", dsn, "up")
	if code != 0 || !strings.Contains(stdout, "recorded the existing tables as version 1 in outbox_event_version (created before versioned migrations)\n") {
		t.Fatalf("up: exit %d\n%s%s", code, stdout, stderr)
	}
	t.Logf("migrate up:\n%s", stdout)
	if pw := password(t, dsn); pw != "" && strings.Contains(stdout+stderr, ":"+pw+"@") {
		t.Errorf("the password is in the output:\n%s", stdout)
	}
	var n int
	if err := db.QueryRow("SELECT COUNT(*) FROM outbox_event_version WHERE version = 1").Scan(&n); err != nil || n != 1 {
		t.Errorf("version rows: %d, %v", n, err)
	}
}

func password(t *testing.T, dsn string) string {
	_, rest, ok := strings.Cut(dsn, "://")
	if !ok {
		return ""
	}
	userinfo, _, ok := strings.Cut(rest, "@")
	if !ok {
		return ""
	}
	_, pw, _ := strings.Cut(userinfo, ":")
	return pw
}

// An unreachable database: the error names it without the password.
func TestMigrateErrorHidesPassword(t *testing.T) {
	dir := t.TempDir()
	code, stdout, stderr := cli(t, dir, "migrate", "-timeout", "2s", "-db", "postgres://app:s3cr3t-pw@127.0.0.1:1/shop?sslmode=disable", "up")
	if code != 1 || strings.Contains(stdout+stderr, "s3cr3t-pw") || !strings.Contains(stderr, "127.0.0.1") {
		t.Errorf("exit %d\nstdout %s\nstderr %s", code, stdout, stderr)
	}
}
