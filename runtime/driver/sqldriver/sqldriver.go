// Package sqldriver implements driver.Driver on database/sql, for every
// dialect: PostgreSQL through pgx's stdlib, MySQL/MariaDB through
// go-sql-driver/mysql (use interpolateParams=true and parseTime=true in the
// DSN, and run sessions in UTC: see New), and SQLite through
// modernc.org/sqlite.
package sqldriver

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/outboxgen/outboxgen/runtime/dialect"
	"github.com/outboxgen/outboxgen/runtime/driver"
	"github.com/outboxgen/outboxgen/runtime/driver/internal/driverutil"
	"github.com/outboxgen/outboxgen/runtime/outbox"
)

// Driver is the database/sql driver. Create it with New.
type Driver struct {
	db     *sql.DB
	d      dialect.Dialect
	schema outbox.Schema
	tables driver.Tables
	relayQ *driverutil.RelayQueries // the relay's statements, per unordered set
	check  driverutil.Checker
	// The operator methods (Overview, FindEvents, GetEvent, Replay, ...).
	*driverutil.Admin

	// MySQL: the session time zone was found to be UTC (see checkTimeZone).
	tzOK atomic.Bool
	tzMu sync.Mutex
}

// New returns a driver for the tables of schema (the generated package's
// Schema, from events.yaml) in db:
//
//	drv, err := sqldriver.New(db, events.Schema)
//
// The SQL dialect is db's: New recognises pgx's stdlib and lib/pq
// (PostgreSQL), go-sql-driver/mysql (MySQL, MariaDB), modernc.org/sqlite
// and mattn/go-sqlite3 (SQLite) by their driver type, and fails when
// events.yaml does not list that dialect. For a driver it does not
// recognise (a wrapper, e.g. for tracing) it takes the only dialect
// events.yaml lists; when it lists several, pass
// events.Schema.Only(outbox.MySQL) (say). Every part built on the driver
// (relay, sweeper, monitor, janitor) calls Check when it starts, which
// asks the server which dialect it is and checks the tables it uses.
//
// MySQL/MariaDB sessions must run in UTC: the outbox's DATETIME(6)
// timestamps (created_at, leases, backoff) are written and compared with
// CURRENT_TIMESTAMP(6), which follows the session time_zone, so sessions
// in different zones would see leases lapse early or late. Add
// time_zone=%27%2B00%3A00%27 (that is, '+00:00' URL-encoded) to the DSN, or
// run the server in UTC. The first Claim checks the session (SELECT
// @@session.time_zone, and the offset of NOW() from UTC_TIMESTAMP()) and
// fails with an error saying so when it is not UTC.
func New(db *sql.DB, schema outbox.Schema) (*Driver, error) {
	if db == nil {
		return nil, errors.New("sqldriver: db is nil: pass the *sql.DB that holds the outbox table")
	}
	d, err := schema.DialectOf(db)
	if err != nil {
		return nil, fmt.Errorf("sqldriver: %w", err)
	}
	tables := schema.Tables
	relayQ, err := driverutil.NewRelayQueries(d, tables.Outbox, false)
	if err != nil {
		return nil, fmt.Errorf("sqldriver: %w", err)
	}
	x := &Driver{db: db, d: d, schema: schema, tables: tables, relayQ: relayQ}
	if x.Admin, err = driverutil.NewAdmin("sqldriver", dbQuerier{db: db, begin: x.beginRelayTx}, d, tables); err != nil {
		return nil, fmt.Errorf("sqldriver: %w", err)
	}
	x.Admin.Relay, x.Admin.Check = relayQ, x.Check
	x.check = driverutil.Checker{
		What: "sqldriver", Schema: schema, Dialect: d,
		Text:  driverutil.TextQuery(db.QueryRowContext),
		Probe: driverutil.ProbeQuery(db.QueryContext),
	}
	return x, nil
}

// Dialect returns the driver's SQL dialect.
func (x *Driver) Dialect() dialect.Dialect { return x.d }

// Tables returns the table names.
func (x *Driver) Tables() driver.Tables { return x.tables }

// Schema returns the schema the driver was built from.
func (x *Driver) Schema() outbox.Schema { return x.schema }

// Check verifies that the database is of the driver's dialect and that
// table t has the columns the runtime needs; see driver.Driver.
func (x *Driver) Check(ctx context.Context, t driver.Table) error { return x.check.Check(ctx, t) }

// DB returns the underlying database handle.
func (x *Driver) DB() *sql.DB { return x.db }

// checkTimeZone verifies, once it succeeded, that a MySQL session of db
// runs in UTC (see New). Other dialects need no check.
func (x *Driver) checkTimeZone(ctx context.Context) error {
	if x.d != dialect.MySQL || x.tzOK.Load() {
		return nil
	}
	x.tzMu.Lock()
	defer x.tzMu.Unlock()
	if x.tzOK.Load() {
		return nil
	}
	var zone string
	var offset int64
	if err := x.db.QueryRowContext(ctx, dialect.MySQLSessionTimeZone).Scan(&zone, &offset); err != nil {
		return fmt.Errorf("sqldriver: check the MySQL session time zone: %w", err)
	}
	if offset != 0 {
		return fmt.Errorf("sqldriver: the MySQL session time zone is %q (UTC%+.2gh): outbox timestamps and leases need UTC sessions; "+
			"add time_zone=%%27%%2B00%%3A00%%27 (time_zone='+00:00', URL-encoded) to the DSN, or run the server in UTC", zone, float64(offset)/3600)
	}
	x.tzOK.Store(true)
	return nil
}

// dbQuerier adapts *sql.DB to driverutil.Querier.
type dbQuerier struct {
	db    *sql.DB
	begin func(context.Context) (*sql.Tx, error)
}

func (q dbQuerier) Query(ctx context.Context, query string, args ...any) (driverutil.Rows, error) {
	rows, err := q.db.QueryContext(ctx, query, args...)
	if err != nil {
		return nil, err
	}
	return driverutil.SQLRows{Rows: rows}, nil
}

func (q dbQuerier) Exec(ctx context.Context, query string, args ...any) (int64, error) {
	res, err := q.db.ExecContext(ctx, query, args...)
	if err != nil {
		return 0, err
	}
	return res.RowsAffected()
}

// InTx runs f in a transaction begun as the relay's (beginRelayTx).
func (q dbQuerier) InTx(ctx context.Context, f func(driverutil.Querier) error) error {
	tx, err := q.begin(ctx)
	if err != nil {
		return fmt.Errorf("begin: %w", err)
	}
	defer tx.Rollback() //nolint:errcheck // no-op after Commit
	if err := f(driverutil.TxQuerier(tx)); err != nil {
		return err
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("commit: %w", err)
	}
	return nil
}
