// Package dberr tells database errors that waiting cannot mend (a missing
// table or column, a missing privilege, a read-only database) from the
// rest (connection refused, timeouts, deadlocks, a closed pool), for the
// relay, sweeper, monitor and janitor, and words them so that an operator
// knows what to do.
//
// It knows the error types of the drivers outboxgen supports without
// importing them (importing go-sql-driver/mysql would register it with
// database/sql in every program that uses the relay): PostgreSQL errors
// (pgx's *pgconn.PgError, lib/pq) by their SQLSTATE method, SQLite errors
// (modernc.org/sqlite) by their Code method and message, and MySQL/MariaDB
// errors (go-sql-driver's *mysql.MySQLError) by their error number.
package dberr

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"reflect"
	"strings"
	"time"
)

// Class is what kind of database error an error is.
type Class uint8

// The classes.
const (
	// Transient: anything not below (the database is down or
	// unreachable, a timeout, a deadlock, a closed pool, ...). Retrying
	// after a pause may succeed.
	Transient Class = iota
	// Missing: a table or column does not exist (PostgreSQL 42P01,
	// 42703, 3F000; MySQL/MariaDB 1146, 1054, and 1176 for an index an
	// index hint names; SQLite "no such table", "no such column").
	Missing
	// Denied: the database user lacks a privilege (PostgreSQL 42501;
	// MySQL/MariaDB 1142, 1143, 1044).
	Denied
	// ReadOnly: the database or the session is read-only (PostgreSQL
	// 25006, e.g. a hot standby; MySQL/MariaDB 1290, 1792, 1836;
	// SQLITE_READONLY).
	ReadOnly
	// Mismatch: the database is not what events.yaml and the code say it
	// is (another SQL dialect, a table events.yaml does not declare).
	// Only start-up checks report it, as an *Error.
	Mismatch
)

func (c Class) String() string {
	switch c {
	case Missing:
		return "missing_table"
	case Denied:
		return "permission_denied"
	case ReadOnly:
		return "read_only"
	case Mismatch:
		return "mismatch"
	}
	return "transient"
}

// Permanent reports whether waiting alone cannot mend errors of class c:
// someone has to change the schema, the grants or the connection.
func (c Class) Permanent() bool { return c != Transient }

// FatalAtStart reports whether a component should refuse to start on an
// error of class c: a missing table or privilege is a deployment mistake
// that waiting does not mend. A read-only database is not: it is what a
// failover looks like for a moment (connections still on the old primary,
// now a standby), so components keep retrying it, loudly.
func (c Class) FatalAtStart() bool { return c == Missing || c == Denied || c == Mismatch }

// FatalAtStart reports whether Classify(err).FatalAtStart(): the test the
// runtime's loops (schedule.FixedDelay.FatalAtStart, relay.Run) apply to a
// failure before their first successful run.
func FatalAtStart(err error) bool { return Classify(err).FatalAtStart() }

// Classify returns the class of err (Transient for nil and for errors of
// unknown drivers). Wrapped and joined errors are searched.
func Classify(err error) Class {
	var e *Error
	if errors.As(err, &e) {
		return e.Class
	}
	c := Transient
	walk(err, func(e error) bool {
		c = classifyOne(e)
		return c != Transient
	})
	return c
}

// walk calls f on err and every error it wraps, depth first, until f
// returns true.
func walk(err error, f func(error) bool) bool {
	if err == nil {
		return false
	}
	if f(err) {
		return true
	}
	switch u := err.(type) {
	case interface{ Unwrap() error }:
		return walk(u.Unwrap(), f)
	case interface{ Unwrap() []error }:
		for _, e := range u.Unwrap() {
			if walk(e, f) {
				return true
			}
		}
	}
	return false
}

func classifyOne(err error) Class {
	if s, ok := err.(interface{ SQLState() string }); ok { // PostgreSQL: pgx, lib/pq
		switch s.SQLState() {
		case "42P01", "42703", "3F000": // undefined_table, undefined_column, invalid_schema_name
			return Missing
		case "42501": // insufficient_privilege
			return Denied
		case "25006": // read_only_sql_transaction
			return ReadOnly
		}
		return Transient
	}
	if n, ok := mysqlErrorNumber(err); ok {
		switch n {
		case 1146, 1054, 1176: // ER_NO_SUCH_TABLE, ER_BAD_FIELD_ERROR, ER_KEY_DOES_NOT_EXITS
			return Missing
		case 1142, 1143, 1044: // ER_TABLEACCESS_DENIED_ERROR, ER_COLUMNACCESS_DENIED_ERROR, ER_DBACCESS_DENIED_ERROR
			return Denied
		case 1290, 1792, 1836: // ER_OPTION_PREVENTS_STATEMENT (--read-only), ER_CANT_EXECUTE_IN_READ_ONLY_TRANSACTION, ER_READ_ONLY_MODE
			return ReadOnly
		}
		return Transient
	}
	if c, ok := err.(interface{ Code() int }); ok && isSQLite(err) { // modernc.org/sqlite
		const sqliteReadOnly = 8
		if c.Code()&0xff == sqliteReadOnly { // extended codes keep the primary code in the low byte
			return ReadOnly
		}
	}
	if isSQLite(err) {
		msg := err.Error()
		switch {
		case strings.Contains(msg, "no such table") || strings.Contains(msg, "no such column"):
			return Missing
		case strings.Contains(msg, "readonly database"):
			return ReadOnly
		}
	}
	return Transient
}

// isSQLite reports whether err is an SQLite driver's error
// (modernc.org/sqlite *sqlite.Error, mattn/go-sqlite3 sqlite3.Error).
func isSQLite(err error) bool {
	t := reflect.TypeOf(err).String()
	return t == "*sqlite.Error" || t == "sqlite3.Error" || t == "*sqlite3.Error"
}

// Need says what a component needs from the database, for the advice
// attached to permanent errors.
type Need struct {
	// Component names it: "relay", "sweeper", "monitor", "janitor".
	Component string
	// Tables lists the tables it uses, e.g. "outbox_event".
	Tables string
	// Privileges lists what it needs on them, e.g. "SELECT and UPDATE on
	// outbox_event".
	Privileges string
}

// Error is a permanent database error with advice for the operator.
type Error struct {
	Class  Class
	Advice string
	Err    error
}

func (e *Error) Error() string { return e.Advice + ": " + e.Err.Error() }
func (e *Error) Unwrap() error { return e.Err }

// Explain returns err wrapped in an *Error saying what to do when it is
// permanent, and err itself otherwise (also when already explained).
func Explain(err error, n Need) error {
	var e *Error
	if err == nil || errors.As(err, &e) {
		return err
	}
	c := Classify(err)
	var advice string
	switch c {
	case Missing:
		advice = fmt.Sprintf("%s: a table or column it uses does not exist (tables: %s): apply the schema (`outboxgen schema -dialect ...` prints it, or run your migrations) or fix the table names in events.yaml (sql.outbox_table, sql.inbox_table) and regenerate; waiting will not help",
			n.Component, n.Tables)
	case Denied:
		advice = fmt.Sprintf("%s: permission denied: the database user needs %s; grant them (waiting will not help)", n.Component, n.Privileges)
	case ReadOnly:
		advice = fmt.Sprintf("%s: the database is read-only (a PostgreSQL standby or default_transaction_read_only, a MySQL/MariaDB replica with read_only, or a read-only SQLite file or directory): connect it to the writable primary", n.Component)
	default:
		return err
	}
	return &Error{Class: c, Advice: advice, Err: err}
}

// ConflictTries is how many times a transaction the database rolls back
// as a Conflict is run in all before the conflict is given up on (the
// drivers' claims and operator actions, the inbox's deliveries).
const ConflictTries = 5

// ConflictPause is the pause before running a transaction again after its
// try-th Conflict: try × (unit + a random 0 to 4 units), longer each time,
// so that the transactions that collided do not collide again in step.
func ConflictPause(try int, unit time.Duration) time.Duration {
	return time.Duration(try) * (unit + rand.N(4*unit))
}

// Refused reports whether the database refused a value a statement bound
// for what it holds (PostgreSQL SQLSTATE class 22, data exception: text
// too long for its column, bytes its encoding cannot hold; MySQL/MariaDB
// 1366 ER_TRUNCATED_WRONG_VALUE_FOR_FIELD, an incorrect string value for
// the column's character set, and 1406 ER_DATA_TOO_LONG, in strict mode).
// Sending the same values again fails the same way.
func Refused(err error) bool {
	return walk(err, func(e error) bool {
		if s, ok := e.(interface{ SQLState() string }); ok {
			return strings.HasPrefix(s.SQLState(), "22")
		}
		n, ok := mysqlErrorNumber(e)
		return ok && (n == 1366 || n == 1406)
	})
}

// Conflict reports whether err is a deadlock or a serialization failure
// (PostgreSQL 40P01, 40001; MySQL/MariaDB 1213 ER_LOCK_DEADLOCK; MariaDB
// 1020 ER_CHECKREAD, the serialization failure of REPEATABLE READ with
// innodb_snapshot_isolation, the default from 11.8): the database rolled
// the transaction back, and running it again at once is the standard
// remedy. Lock wait timeouts are not conflicts (MySQL 1205 rolls back the
// statement only, after waiting long already): Infrastructure calls them
// InfraTimeout.
func Conflict(err error) bool {
	return walk(err, func(e error) bool {
		if s, ok := e.(interface{ SQLState() string }); ok {
			return s.SQLState() == "40P01" || s.SQLState() == "40001"
		}
		n, ok := mysqlErrorNumber(e)
		return ok && (n == 1213 || n == 1020)
	})
}
