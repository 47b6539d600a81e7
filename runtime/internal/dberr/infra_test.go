package dberr

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"io"
	"net"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/go-sql-driver/mysql"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	_ "modernc.org/sqlite"
)

// sqliteErrors returns real modernc.org/sqlite errors: a missing table,
// SQLITE_BUSY and SQLITE_READONLY.
func sqliteErrors(t *testing.T) (missing, busy, readOnly error) {
	ctx := t.Context()
	path := filepath.Join(t.TempDir(), "x.db")
	db, err := sql.Open("sqlite", "file:"+path+"?_pragma=journal_mode(WAL)") // no busy timeout
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if _, err := db.ExecContext(ctx, `CREATE TABLE t (x INTEGER)`); err != nil {
		t.Fatal(err)
	}
	_, missing = db.ExecContext(ctx, `INSERT INTO nope VALUES (1)`)

	lock, err := db.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer lock.Close()
	if _, err := lock.ExecContext(ctx, `BEGIN IMMEDIATE`); err != nil {
		t.Fatal(err)
	}
	other, err := db.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	_, busy = other.ExecContext(ctx, `INSERT INTO t VALUES (1)`)
	if _, err := lock.ExecContext(ctx, `ROLLBACK`); err != nil {
		t.Fatal(err)
	}

	ro, err := sql.Open("sqlite", "file:"+path+"?mode=ro")
	if err != nil {
		t.Fatal(err)
	}
	defer ro.Close()
	_, readOnly = ro.ExecContext(ctx, `INSERT INTO t VALUES (1)`)
	return missing, busy, readOnly
}

func TestInfrastructure(t *testing.T) {
	missing, busy, readOnly := sqliteErrors(t)
	pg := func(code string) error {
		return fmt.Errorf("inbox: record: %w", &pgconn.PgError{Severity: "ERROR", Code: code, Message: "x"})
	}
	my := func(n uint16) error {
		return fmt.Errorf("inbox: record: %w", &mysql.MySQLError{Number: n, Message: "x"})
	}
	refused := &net.OpError{Op: "dial", Net: "tcp", Err: &net.DNSError{Err: "x"}}
	cases := []struct {
		name string
		err  error
		want Infra
	}{
		{"nil", nil, NoInfra},
		{"application error", errors.New("test: handler fails"), NoInfra},
		{"canceled", fmt.Errorf("x: %w", context.Canceled), NoInfra},
		{"pg unique violation", pg("23505"), NoInfra},
		{"pg invalid byte sequence", pg("22021"), NoInfra},
		{"pg deadlock", pg("40P01"), InfraConflict},
		{"pg serialization failure", pg("40001"), InfraConflict},
		{"pg statement_timeout", pg("57014"), InfraTimeout},
		{"pg lock_timeout", pg("55P03"), InfraTimeout},
		{"pg check violation", pg("23514"), NoInfra},
		{"pg in failed transaction", pg("25P02"), NoInfra}, // a handler that went on after an error
		{"pg connection failure", pg("08006"), InfraConnection},
		{"pg undefined table", pg("42P01"), InfraMissing},
		{"pg undefined column", pg("42703"), InfraMissing},
		{"pg no such database", pg("3D000"), InfraMissing},
		{"pg insufficient privilege", pg("42501"), InfraDenied},
		{"pg password failed", pg("28P01"), InfraDenied},
		{"pg too many connections", pg("53300"), InfraResources},
		{"pg disk full", pg("53100"), InfraResources},
		{"pg admin shutdown", pg("57P01"), InfraShutdown},
		{"pg cannot connect now", pg("57P03"), InfraShutdown},
		{"pg read-only transaction", pg("25006"), InfraReadOnly},
		{"mysql no such table", my(1146), InfraMissing},
		{"mysql table access denied", my(1142), InfraDenied},
		{"mysql db access denied", my(1044), InfraDenied},
		{"mysql access denied", my(1045), InfraDenied},
		{"mysql gone away", my(2006), InfraConnection},
		{"mysql lost connection", my(2013), InfraConnection},
		{"mysql can't connect", my(2002), InfraConnection},
		{"mysql read-only", my(1290), InfraReadOnly},
		{"mysql too many connections", my(1040), InfraResources},
		{"mysql shutdown", my(1053), InfraShutdown},
		{"mysql duplicate", my(1062), NoInfra},
		{"mysql deadlock", my(1213), InfraConflict},
		{"mariadb record changed (snapshot isolation)", my(1020), InfraConflict},
		{"mysql lock wait timeout", my(1205), InfraTimeout},
		{"mysql max_execution_time", my(3024), InfraTimeout},
		{"mysql NOWAIT", my(3572), InfraTimeout},
		{"mariadb max_statement_time", my(1969), InfraTimeout},
		{"joined deadlock and rollback error", errors.Join(my(1213), errors.New("rollback: x")), InfraConflict},
		{"mysql incorrect string", my(1366), NoInfra},
		{"sqlite no such table", missing, InfraMissing},
		{"sqlite busy", busy, InfraBusy},
		{"sqlite read-only", readOnly, InfraReadOnly},
		{"mattn-style busy", errors.New("database is locked"), InfraBusy},
		{"bad conn", fmt.Errorf("x: %w", driver.ErrBadConn), InfraConnection},
		{"conn done", sql.ErrConnDone, InfraConnection},
		{"net error", refused, InfraConnection},
		{"connection refused", fmt.Errorf("dial: %w", syscall.ECONNREFUSED), InfraConnection},
		{"unexpected EOF", fmt.Errorf("failed to receive message: %w", io.ErrUnexpectedEOF), InfraConnection},
		{"pgx conn closed", fmt.Errorf("x: %w", errors.New("conn closed")), InfraConnection},
		{"go-sql-driver invalid connection", errors.New("invalid connection"), InfraConnection},
		{"deadline", fmt.Errorf("x: %w", context.DeadlineExceeded), InfraTimeout},
		{"joined", errors.Join(errors.New("rollback failed"), pg("42501")), InfraDenied},
		{"explained", &Error{Class: Denied, Advice: "relay: grant", Err: errors.New("x")}, InfraDenied},
	}
	for _, c := range cases {
		if c.err == nil && c.name != "nil" {
			t.Errorf("%s: the test could not produce the error", c.name)
			continue
		}
		if got := Infrastructure(c.err); got != c.want {
			t.Errorf("%s (%v): Infrastructure = %v, want %v", c.name, c.err, got, c.want)
		}
	}
	for k := InfraConnection; k <= InfraConflict; k++ {
		if k.String() == "none" || k.Hint() == "" {
			t.Errorf("kind %d: String %q, Hint %q", k, k, k.Hint())
		}
	}
	if NoInfra.Hint() != "" {
		t.Error("NoInfra has a hint")
	}
}

// A closed *sql.DB or pgx pool (a service closing its database before its
// consumers drained) is the infrastructure's failure, not the message's.
func TestInfrastructureClosedPool(t *testing.T) {
	ctx := context.Background()
	db, err := sql.Open("sqlite", filepath.Join(t.TempDir(), "closed.db"))
	if err != nil {
		t.Fatal(err)
	}
	db.Close()
	_, sqlErr := db.BeginTx(ctx, nil)
	pool, err := pgxpool.New(ctx, "postgres://nobody@127.0.0.1:1/none")
	if err != nil {
		t.Fatal(err)
	}
	pool.Close()
	_, pgxErr := pool.Begin(ctx)
	for name, err := range map[string]error{"database/sql": sqlErr, "pgxpool": pgxErr} {
		if err == nil {
			t.Fatalf("%s: no error from a closed pool", name)
		}
		if got := Infrastructure(fmt.Errorf("inbox: begin: %w", err)); got != InfraConnection {
			t.Errorf("%s: Infrastructure(%v) = %v, want %v", name, err, got, InfraConnection)
		}
	}
}

// Conflict is the transaction the database rolled back as a deadlock
// victim or serialization failure, and only that: Infrastructure calls it
// InfraConflict. Server-side timeouts are not conflicts.
func TestConflict(t *testing.T) {
	pg := func(code string) error {
		return fmt.Errorf("inbox: commit: %w", &pgconn.PgError{Severity: "ERROR", Code: code, Message: "x"})
	}
	my := func(n uint16) error {
		return fmt.Errorf("inbox: record: %w", &mysql.MySQLError{Number: n, Message: "x"})
	}
	for _, c := range []struct {
		name string
		err  error
		want bool
	}{
		{"nil", nil, false},
		{"application error", errors.New("deadlock"), false},
		{"pg deadlock", pg("40P01"), true},
		{"pg serialization failure", pg("40001"), true},
		{"pg deadlock joined", errors.Join(errors.New("rollback failed"), pg("40P01")), true},
		{"pg statement_timeout", pg("57014"), false},
		{"pg lock_timeout", pg("55P03"), false},
		{"pg unique violation", pg("23505"), false},
		{"mysql deadlock", my(1213), true},
		{"mariadb record changed", my(1020), true},
		{"mysql lock wait timeout", my(1205), false},
		{"mariadb max_statement_time", my(1969), false},
		{"mysql duplicate", my(1062), false},
	} {
		if got := Conflict(c.err); got != c.want {
			t.Errorf("%s: Conflict(%v) = %v, want %v", c.name, c.err, got, c.want)
		}
		if got := Infrastructure(c.err) == InfraConflict; got != c.want {
			t.Errorf("%s: Infrastructure(%v) = %v, want InfraConflict %v", c.name, c.err, Infrastructure(c.err), c.want)
		}
	}
}

func TestRefused(t *testing.T) {
	pg := func(code string) error {
		return fmt.Errorf("pgxdriver: record failure of row 1: %w", &pgconn.PgError{Severity: "ERROR", Code: code, Message: "x"})
	}
	my := func(n uint16) error {
		return fmt.Errorf("sqldriver: record failures of rows [1]: %w", &mysql.MySQLError{Number: n, Message: "x"})
	}
	for _, c := range []struct {
		name string
		err  error
		want bool
	}{
		{"nil", nil, false},
		{"application error", errors.New("invalid byte sequence"), false},
		{"pg value too long", pg("22001"), true},
		{"pg invalid byte sequence", pg("22021"), true},
		{"pg untranslatable character", pg("22P05"), true},
		{"pg joined", errors.Join(errors.New("rollback failed"), pg("22001")), true},
		{"pg deadlock", pg("40P01"), false},
		{"pg undefined column", pg("42703"), false},
		{"mysql incorrect string value", my(1366), true},
		{"mysql data too long", my(1406), true},
		{"mysql deadlock", my(1213), false},
		{"mysql unknown column", my(1054), false},
	} {
		if got := Refused(c.err); got != c.want {
			t.Errorf("%s: Refused(%v) = %v, want %v", c.name, c.err, got, c.want)
		}
	}
}
