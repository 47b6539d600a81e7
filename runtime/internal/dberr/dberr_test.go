package dberr

import (
	"database/sql"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"testing"

	"github.com/go-sql-driver/mysql"
	"github.com/jackc/pgx/v5/pgconn"
	_ "modernc.org/sqlite"
)

// Each driver's errors, as the drivers return them, wrapped and joined as
// the relay's drivers do.
func TestClassify(t *testing.T) {
	wrap := func(err error) error {
		return errors.Join(errors.New("other"), fmt.Errorf("sqldriver: claim: %w", err))
	}
	for _, tc := range []struct {
		err  error
		want Class
	}{
		{nil, Transient},
		{errors.New("connection refused"), Transient},
		{sql.ErrConnDone, Transient},
		{&pgconn.PgError{Code: "42P01"}, Missing},
		{&pgconn.PgError{Code: "42703"}, Missing},
		{&pgconn.PgError{Code: "42501"}, Denied},
		{&pgconn.PgError{Code: "25006"}, ReadOnly},
		{&pgconn.PgError{Code: "40P01"}, Transient}, // deadlock
		{&pgconn.PgError{Code: "57P01"}, Transient}, // admin shutdown
		{&mysql.MySQLError{Number: 1146}, Missing},
		{&mysql.MySQLError{Number: 1176}, Missing}, // an index hint's index
		{&mysql.MySQLError{Number: 1054}, Missing},
		{&mysql.MySQLError{Number: 1142}, Denied},
		{&mysql.MySQLError{Number: 1143}, Denied},
		{&mysql.MySQLError{Number: 1290}, ReadOnly},
		{&mysql.MySQLError{Number: 1792}, ReadOnly},
		{&mysql.MySQLError{Number: 1213}, Transient},                                        // deadlock
		{errors.New("Error 1146 (42S02): Table 'x.outbox_event' doesn't exist"), Transient}, // not a driver error
	} {
		if got := Classify(tc.err); got != tc.want {
			t.Errorf("Classify(%v) = %s, want %s", tc.err, got, tc.want)
		}
		if tc.err != nil {
			if got := Classify(wrap(tc.err)); got != tc.want {
				t.Errorf("Classify(wrapped %v) = %s, want %s", tc.err, got, tc.want)
			}
		}
	}

	// SQLite, for real: a missing table and a read-only file.
	path := filepath.Join(t.TempDir(), "x.db")
	db, err := sql.Open("sqlite", "file:"+path)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	_, err = db.Exec("UPDATE outbox_event SET status = 1")
	if Classify(err) != Missing {
		t.Errorf("SQLite %v: %s, want %s", err, Classify(err), Missing)
	}
	if _, err := db.Exec("CREATE TABLE outbox_event (status INTEGER)"); err != nil {
		t.Fatal(err)
	}
	ro, err := sql.Open("sqlite", "file:"+path+"?mode=ro")
	if err != nil {
		t.Fatal(err)
	}
	defer ro.Close()
	_, err = ro.Exec("UPDATE outbox_event SET status = 1")
	if Classify(err) != ReadOnly {
		t.Errorf("SQLite %v: %s, want %s", err, Classify(err), ReadOnly)
	}
}

func TestExplain(t *testing.T) {
	need := Need{Component: "relay", Tables: "outbox_event", Privileges: "SELECT and UPDATE on outbox_event"}
	plain := errors.New("connection refused")
	if got := Explain(plain, need); got != plain {
		t.Errorf("Explain(transient) = %v, want it unchanged", got)
	}
	for _, tc := range []struct {
		err    error
		advice string
	}{
		{&pgconn.PgError{Code: "42P01", Message: `relation "outbox_event" does not exist`}, "relay: a table or column it uses does not exist (tables: outbox_event): apply the schema"},
		{&mysql.MySQLError{Number: 1142, Message: "UPDATE command denied"}, "relay: permission denied: the database user needs SELECT and UPDATE on outbox_event"},
		{&pgconn.PgError{Code: "25006"}, "relay: the database is read-only"},
	} {
		got := Explain(fmt.Errorf("claim: %w", tc.err), need)
		if !strings.HasPrefix(got.Error(), tc.advice) || !strings.Contains(got.Error(), tc.err.Error()) || !errors.Is(got, tc.err) {
			t.Errorf("Explain(%v) = %v, want it to start with %q and wrap the error", tc.err, got, tc.advice)
		}
		if again := Explain(got, need); again != got {
			t.Errorf("Explain twice: %v", again)
		}
	}
	if !Missing.FatalAtStart() || !Denied.FatalAtStart() || ReadOnly.FatalAtStart() || Transient.FatalAtStart() {
		t.Error("FatalAtStart: want a missing table or privilege fatal at start, a read-only database and transient errors not")
	}
}
