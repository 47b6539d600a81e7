package spec

import (
	"context"
	"database/sql"
	"encoding/binary"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
	"modernc.org/libc"
	sqlite3 "modernc.org/sqlite/lib"

	"github.com/outboxgen/outboxgen/internal/testdb"
	"github.com/outboxgen/outboxgen/templates"
)

// tableNameSpec is a valid spec with sql.outbox_table set to the %s verb.
const tableNameSpec = `version: 1
go: {package: events, out: gen}
sql: {dialects: [postgres], outbox_table: '%s'}
events:
  - {name: A, topic: a, key: id, fields: [{name: id, type: string}]}
`

// checkReserved checks that the spec refuses each of words, which server
// reserves, as a table name, and that sqlReserved says db reserves it (so
// that the error names the database). Words that are no safe identifier
// (operators, upper case) cannot be table names anyway and are skipped.
func checkReserved(t *testing.T, server string, db sqlDatabase, list string, words []string) {
	t.Helper()
	checked := 0
	for _, w := range words {
		w = strings.ToLower(w)
		if !templates.ValidIdentifier(w) || len(w) > templates.MaxOutboxName {
			continue
		}
		checked++
		_, err := Parse("events.yaml", fmt.Appendf(nil, tableNameSpec, w))
		switch {
		case err == nil || !strings.Contains(err.Error(), fmt.Sprintf("%q is a reserved SQL word", w)):
			t.Errorf("%s reserves %s, but the spec accepts it as a table name (%v): add it to %s", server, w, err, list)
		case sqlReserved[w]&db == 0:
			t.Errorf("%s reserves %s, but sqlReserved names only %s: add it to %s", server, w, sqlReserved[w], list)
		}
	}
	if checked < 20 {
		t.Errorf("%s reports only %d reserved words (%v)", server, checked, words)
	}
	t.Logf("%s: %d reserved words, all refused", server, checked)
}

// TestReservedWordsPostgres: every word the PostgreSQL server classifies
// as reserved, or reserved but usable as a function or type name (neither
// can name a table), is refused as a table name.
func TestReservedWordsPostgres(t *testing.T) {
	db := testdb.Open(t, "postgres")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var version string
	if err := db.QueryRowContext(ctx, `SHOW server_version`).Scan(&version); err != nil {
		t.Fatal(err)
	}
	words := queryWords(t, db, `SELECT word FROM pg_get_keywords() WHERE catcode IN ('R', 'T')`)
	checkReserved(t, "PostgreSQL "+version, inPostgres, "postgresReservedWords", words)
}

// TestReservedWordsMySQL: every keyword that the MySQL or MariaDB server
// does not accept as a table name is refused as a table name. The parser
// is asked (CREATE TABLE <word> is prepared, not run): MariaDB's
// information_schema.KEYWORDS does not say which words are reserved, and
// MySQL's RESERVED column is used as well.
func TestReservedWordsMySQL(t *testing.T) {
	db := testdb.Open(t, "mysql")
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var version string
	if err := db.QueryRowContext(ctx, `SELECT VERSION()`).Scan(&version); err != nil {
		t.Fatal(err)
	}
	server, in, list := "MySQL "+version, inMySQL, "mysqlReservedWords"
	if strings.Contains(strings.ToLower(version), "mariadb") {
		server, in, list = "MariaDB "+version, inMariaDB, "mariadbReservedWords"
	}
	conn, err := db.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	var reserved []string
	if rows, err := conn.QueryContext(ctx, `SELECT WORD FROM information_schema.KEYWORDS WHERE RESERVED = 1`); err == nil {
		reserved = scanWords(t, rows)
	} else if me, ok := errors.AsType[*mysql.MySQLError](err); !ok || me.Number != 1054 { // 1054: no RESERVED column (MariaDB)
		t.Fatal(err)
	}
	rows, err := conn.QueryContext(ctx, `SELECT WORD FROM information_schema.KEYWORDS`)
	if err != nil {
		t.Fatal(err)
	}
	for _, w := range scanWords(t, rows) {
		w = strings.ToLower(w)
		if !templates.ValidIdentifier(w) {
			continue
		}
		stmt, err := conn.PrepareContext(ctx, "CREATE TABLE "+w+" (id INT)")
		if err == nil {
			stmt.Close()
			continue
		}
		if me, ok := errors.AsType[*mysql.MySQLError](err); !ok || me.Number != 1064 { // 1064: syntax error
			t.Errorf("prepare CREATE TABLE %s: %v", w, err)
			continue
		}
		reserved = append(reserved, w)
	}
	checkReserved(t, server, in, list, reserved)
}

// TestReservedWordsSQLite: every keyword of the SQLite that
// modernc.org/sqlite embeds (sqlite3_keyword_name) that CREATE TABLE does
// not accept as a table name is refused as a table name.
func TestReservedWordsSQLite(t *testing.T) {
	tls := libc.NewTLS()
	defer tls.Close()
	out := tls.Alloc(16) // const char **pzName; int *pnName
	defer tls.Free(16)
	n := int(sqlite3.Xsqlite3_keyword_count(tls))
	var keywords []string
	for i := range n {
		if sqlite3.Xsqlite3_keyword_name(tls, int32(i), out, out+8) != sqlite3.SQLITE_OK {
			t.Fatalf("sqlite3_keyword_name(%d) failed", i)
		}
		name := uintptr(binary.NativeEndian.Uint64(libc.GoBytes(out, 8)))
		size := int(int32(binary.NativeEndian.Uint32(libc.GoBytes(out+8, 4))))
		keywords = append(keywords, strings.ToLower(string(libc.GoBytes(name, size))))
	}
	db, err := sql.Open("sqlite", ":memory:")
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	db.SetMaxOpenConns(1)
	var version string
	if err := db.QueryRow(`SELECT sqlite_version()`).Scan(&version); err != nil {
		t.Fatal(err)
	}
	var reserved []string
	for _, w := range keywords {
		if _, err := db.Exec("CREATE TABLE " + w + " (id INTEGER)"); err != nil {
			reserved = append(reserved, w)
		} else if _, err := db.Exec("DROP TABLE " + w); err != nil {
			t.Fatal(err)
		}
	}
	if len(keywords) < 100 {
		t.Fatalf("SQLite %s reports %d keywords: %v", version, len(keywords), keywords)
	}
	checkReserved(t, "SQLite "+version, inSQLite, "sqliteReservedWords", reserved)
}

// TestReservedWordLists: each listed word could otherwise be a table name
// (lower-case letters, digits and '_'), so that the lists hold no typo.
func TestReservedWordLists(t *testing.T) {
	for w, in := range sqlReserved {
		if !templates.ValidIdentifier(w) {
			t.Errorf("reserved word %q (%s) is not a lower-case identifier", w, in)
		}
	}
}

// TestReservedDerivedNames: a table name is refused when a name the DDL
// derives from it is reserved (none is today, so the test reserves some),
// at the table it derives from.
func TestReservedDerivedNames(t *testing.T) {
	for w, in := range map[string]sqlDatabase{"ob_version": inMySQL, "o_x_duplicate": inPostgres | inSQLite} {
		sqlReserved[w] = in
		defer delete(sqlReserved, w)
	}
	src := `version: 1
go: {package: events, out: gen}
sql:
  dialects: [postgres]
  outbox_table: ob
  inbox_table: o_x
events:
  - {name: A, topic: a, key: id, fields: [{name: id, type: string}]}
`
	want := `events.yaml:5:17: sql.outbox_table "ob" makes the DDL name ob_version, a reserved SQL word (in MySQL), which the DDL cannot use unquoted; choose another name
events.yaml:6:16: sql.inbox_table "o_x" makes the DDL name o_x_duplicate, a reserved SQL word (in PostgreSQL and SQLite), which the DDL cannot use unquoted; choose another name`
	if _, err := Parse("events.yaml", []byte(src)); err == nil || err.Error() != want {
		t.Errorf("got\n%v\nwant\n%s", err, want)
	}
	// A default table name is reported at the sql: mapping.
	src = strings.Replace(src, "  outbox_table: ob\n  inbox_table: o_x\n", "", 1)
	sqlReserved["outbox_event_due_idx"] = inMariaDB
	defer delete(sqlReserved, "outbox_event_due_idx")
	want = `events.yaml:4:3: sql.outbox_table "outbox_event" makes the DDL name outbox_event_due_idx, a reserved SQL word (in MariaDB), which the DDL cannot use unquoted; choose another name`
	if _, err := Parse("events.yaml", []byte(src)); err == nil || err.Error() != want {
		t.Errorf("got\n%v\nwant\n%s", err, want)
	}
}

// queryWords runs query, which selects one string column.
func queryWords(t *testing.T, db *sql.DB, query string) []string {
	t.Helper()
	rows, err := db.Query(query)
	if err != nil {
		t.Fatal(err)
	}
	return scanWords(t, rows)
}

// scanWords reads and closes rows of one string column.
func scanWords(t *testing.T, rows *sql.Rows) []string {
	t.Helper()
	defer rows.Close()
	var words []string
	for rows.Next() {
		var w string
		if err := rows.Scan(&w); err != nil {
			t.Fatal(err)
		}
		words = append(words, w)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return words
}
