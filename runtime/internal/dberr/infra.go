package dberr

// Infrastructure failures, for consumers (runtime/inbox): an error from a
// handler's transaction is either the message's or its code's fault (retry
// a few times, then poison the message) or the database's (retry until it
// is fixed, alert, never poison). Classify cannot tell them apart, since it
// calls every error it does not know Transient; Infrastructure recognises
// the database's failures positively and returns NoInfra for the rest.

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"io"
	"net"
	"reflect"
	"strings"
	"syscall"
)

// Infra is the kind of an infrastructure failure: the database failed, not
// the statement or the data it was given.
type Infra uint8

// The kinds.
const (
	// NoInfra: not recognised as an infrastructure failure (an error of
	// the statement, its data or the application), or no error.
	NoInfra Infra = iota
	// InfraConnection: the connection failed or was lost (PostgreSQL class
	// 08; MySQL/MariaDB 2002, 2003, 2006, 2013, 1927, 1158-1161;
	// driver.ErrBadConn, sql.ErrConnDone, net errors, connection
	// refused/reset, an unexpected EOF, pgx's "conn closed", go-sql-driver's
	// "invalid connection").
	InfraConnection
	// InfraDenied: the database user lacks a privilege or cannot log in
	// (Classify's Denied; PostgreSQL class 28; MySQL/MariaDB 1045, 1227;
	// SQLITE_PERM, SQLITE_AUTH).
	InfraDenied
	// InfraMissing: a table or column does not exist (Classify's
	// Missing; PostgreSQL 3D000, MySQL/MariaDB 1049: no such database).
	InfraMissing
	// InfraResources: the database is out of connections, disk or memory,
	// or its storage failed (PostgreSQL classes 53 and 58; MySQL/MariaDB
	// 1021, 1037, 1038, 1040, 1041, 1114, 1203, 1226; SQLite
	// SQLITE_NOMEM, IOERR, CORRUPT, FULL, CANTOPEN, NOTADB).
	InfraResources
	// InfraShutdown: the server is shutting down or restarting, or an
	// administrator ended the session (PostgreSQL class 57P;
	// MySQL/MariaDB 1053).
	InfraShutdown
	// InfraReadOnly: the database or transaction is read-only (Classify's
	// ReadOnly).
	InfraReadOnly
	// InfraBusy: SQLite's SQLITE_BUSY ("database is locked"): another
	// connection holds the write lock.
	InfraBusy
	// InfraTimeout: the database did not answer in time
	// (context.DeadlineExceeded, a network timeout), or the server ended
	// a statement that ran or waited too long: PostgreSQL 57014
	// query_canceled (statement_timeout) and 55P03 lock_not_available
	// (lock_timeout, NOWAIT); MySQL 1205 ER_LOCK_WAIT_TIMEOUT, 3024
	// ER_QUERY_TIMEOUT (max_execution_time), 3572 ER_LOCK_NOWAIT;
	// MariaDB 1969 ER_STATEMENT_TIMEOUT (max_statement_time).
	//
	// 57014 is also what PostgreSQL answers when the client cancels the
	// statement because its context ended (lib/pq always does,
	// pgx with a CancelRequestContextWatcherHandler): a caller whose
	// context is done must take the failure for that, not for this kind.
	InfraTimeout
	// InfraConflict: the database rolled the transaction back as a
	// deadlock victim or serialization failure (Conflict: PostgreSQL
	// 40P01, 40001; MySQL/MariaDB 1213, MariaDB 1020). Run at once again,
	// the transaction usually goes through; a caller retries it in place
	// a few times first (see Conflict) and treats it as an infrastructure
	// failure only when it keeps failing.
	InfraConflict
)

// String returns the kind as a snake_case word for metric attributes and
// log fields: "none", "connection", "permission_denied", "missing_table",
// "resources", "shutdown", "read_only", "busy", "timeout", "conflict".
// The shared kinds have Class.String's words.
func (k Infra) String() string {
	switch k {
	case InfraConnection:
		return "connection"
	case InfraDenied:
		return Denied.String()
	case InfraMissing:
		return Missing.String()
	case InfraResources:
		return "resources"
	case InfraShutdown:
		return "shutdown"
	case InfraReadOnly:
		return ReadOnly.String()
	case InfraBusy:
		return "busy"
	case InfraTimeout:
		return "timeout"
	case InfraConflict:
		return "conflict"
	}
	return "none"
}

// Hint says in one sentence what an operator should do; "" for NoInfra.
func (k Infra) Hint() string {
	switch k {
	case InfraConnection:
		return "a connection failed: check that the database (or the service the failing code calls) is up and reachable at the configured address"
	case InfraDenied:
		return "the database user lacks a privilege or cannot log in: grant what the statement needs (e.g. SELECT and INSERT on the inbox tables, and what the handler writes) or fix the credentials"
	case InfraMissing:
		return "a table, column or database does not exist: apply the schema (`outboxgen schema -dialect ...` prints it, or run your migrations) or fix the table names"
	case InfraResources:
		return "the database is out of resources (connections, disk, memory) or its storage failed: free or add them"
	case InfraShutdown:
		return "the database is shutting down or restarting, or an administrator ended the session: wait for it to come back"
	case InfraReadOnly:
		return "the database is read-only (a standby or replica, read-only mode, or a read-only SQLite file): connect to the writable primary"
	case InfraBusy:
		return "another connection holds the SQLite write lock: set _pragma=busy_timeout(10000) and _txlock=immediate in the DSN and keep write transactions short"
	case InfraTimeout:
		return "the database did not answer in time, or a statement ran or waited for a lock longer than the server allows (statement_timeout, lock_timeout, innodb_lock_wait_timeout, max_statement_time): check its load, long-running transactions holding locks, and the network"
	case InfraConflict:
		return "transactions keep deadlocking or failing to serialize, even when run again at once: look for transactions that lock the same rows in different orders or stay open long (the handler's and others on the same tables), and keep them short"
	}
	return ""
}

// Infrastructure returns the kind of infrastructure failure err is, NoInfra
// when err is nil or not recognised as one. Such a failure is not the
// fault of the message or row being processed: retry it with backoff until
// it clears, alert, and never count it against the message or row.
// InfraConflict is one too, but the remedy for it is to run the rolled
// back transaction again at once, a few times, before waiting (Conflict).
// context.Canceled is NoInfra: it means the caller is stopping. A caller
// whose context is done should not ask: the driver may report the cancel
// as a server error (PostgreSQL 57014, InfraTimeout) or a lost
// connection.
func Infrastructure(err error) Infra {
	if err == nil {
		return NoInfra
	}
	switch Classify(err) {
	case Missing:
		return InfraMissing
	case Denied:
		return InfraDenied
	case ReadOnly:
		return InfraReadOnly
	}
	k := NoInfra
	walk(err, func(e error) bool {
		k = infraOne(e)
		return k != NoInfra
	})
	if k != NoInfra {
		return k
	}
	return infraGeneric(err)
}

// infraOne recognises driver errors by code.
func infraOne(err error) Infra {
	if s, ok := err.(interface{ SQLState() string }); ok { // PostgreSQL: pgx, lib/pq
		st := s.SQLState()
		if len(st) != 5 {
			return NoInfra
		}
		switch {
		case st == "3D000": // invalid_catalog_name: no such database
			return InfraMissing
		case st == "40P01", st == "40001": // deadlock_detected, serialization_failure
			return InfraConflict
		case st == "57014", st == "55P03": // query_canceled (statement_timeout), lock_not_available (lock_timeout, NOWAIT)
			return InfraTimeout
		case st[:2] == "08":
			return InfraConnection
		case st[:2] == "28":
			return InfraDenied
		case st[:2] == "53", st[:2] == "58":
			return InfraResources
		case st[:3] == "57P":
			return InfraShutdown
		}
		return NoInfra
	}
	if n, ok := mysqlErrorNumber(err); ok {
		switch n {
		case 2002, 2003, 2006, 2013, 1927, 1158, 1159, 1160, 1161:
			return InfraConnection
		case 1045, 1227:
			return InfraDenied
		case 1049:
			return InfraMissing
		case 1021, 1037, 1038, 1040, 1041, 1114, 1203, 1226:
			return InfraResources
		case 1053:
			return InfraShutdown
		case 1213, 1020: // ER_LOCK_DEADLOCK, ER_CHECKREAD (MariaDB innodb_snapshot_isolation)
			return InfraConflict
		case 1205, 3024, 3572, 1969: // ER_LOCK_WAIT_TIMEOUT, ER_QUERY_TIMEOUT, ER_LOCK_NOWAIT, ER_STATEMENT_TIMEOUT (MariaDB)
			return InfraTimeout
		}
		return NoInfra
	}
	if c, ok := err.(interface{ Code() int }); ok && isSQLite(err) { // modernc.org/sqlite
		switch c.Code() & 0xff { // extended codes keep the primary code in the low byte
		case 3, 23: // SQLITE_PERM, SQLITE_AUTH
			return InfraDenied
		case 5: // SQLITE_BUSY
			return InfraBusy
		case 7, 10, 11, 13, 14, 26: // NOMEM, IOERR, CORRUPT, FULL, CANTOPEN, NOTADB
			return InfraResources
		}
		return NoInfra
	}
	if isSQLite(err) { // mattn/go-sqlite3: by message
		if strings.Contains(err.Error(), "database is locked") {
			return InfraBusy
		}
	}
	return NoInfra
}

// infraGeneric recognises driver-independent failures.
func infraGeneric(err error) Infra {
	if errors.Is(err, context.DeadlineExceeded) {
		return InfraTimeout
	}
	var ne net.Error
	if errors.As(err, &ne) {
		if ne.Timeout() {
			return InfraTimeout
		}
		return InfraConnection
	}
	switch {
	case errors.Is(err, driver.ErrBadConn), errors.Is(err, sql.ErrConnDone),
		errors.Is(err, io.ErrUnexpectedEOF),
		errors.Is(err, syscall.ECONNREFUSED), errors.Is(err, syscall.ECONNRESET),
		errors.Is(err, syscall.ECONNABORTED), errors.Is(err, syscall.EPIPE):
		return InfraConnection
	}
	k := NoInfra
	walk(err, func(e error) bool {
		switch msg := e.Error(); {
		case msg == "conn closed", // pgconn.ErrConnClosed
			msg == "invalid connection",      // go-sql-driver's ErrInvalidConn
			msg == "sql: database is closed", // database/sql: the *sql.DB was closed
			msg == "closed pool":             // pgxpool (puddle.ErrClosedPool)
			// A closed pool or *sql.DB: usually a service shutting down
			// before its consumers have drained; never the message's fault.
			k = InfraConnection
		case strings.Contains(msg, "database is locked") || strings.Contains(msg, "SQLITE_BUSY"):
			k = InfraBusy // SQLite wrapped in another driver's error text
		}
		return k != NoInfra
	})
	return k
}

// mysqlErrorNumber returns the error number of a go-sql-driver
// *mysql.MySQLError, read by reflection so that the driver is not imported.
func mysqlErrorNumber(err error) (uint64, bool) {
	v := reflect.ValueOf(err)
	if v.Kind() != reflect.Pointer || v.IsNil() || v.Elem().Kind() != reflect.Struct ||
		!strings.HasSuffix(v.Elem().Type().PkgPath(), "go-sql-driver/mysql") {
		return 0, false
	}
	f := v.Elem().FieldByName("Number")
	if !f.IsValid() || !f.CanUint() {
		return 0, false
	}
	return f.Uint(), true
}
