// Package sqldriver implements driver.Driver on database/sql, for every
// dialect: PostgreSQL through pgx's stdlib, MySQL/MariaDB through
// go-sql-driver/mysql (use interpolateParams=true and parseTime=true in the
// DSN, and run sessions in UTC), and SQLite through modernc.org/sqlite.
package sqldriver

import (
	"database/sql"
	"errors"
	"fmt"

	"github.com/outboxgen/outboxgen/runtime/dialect"
	"github.com/outboxgen/outboxgen/runtime/driver"
	"github.com/outboxgen/outboxgen/runtime/driver/internal/driverutil"
)

// Driver is the database/sql driver. Create it with New.
type Driver struct {
	db     *sql.DB
	d      dialect.Dialect
	tables driver.Tables
	relayQ *driverutil.RelayQueries // the relay's statements, per unordered set
}

// New returns a driver for the outbox and inbox tables in db, which speaks
// dialect d.
func New(db *sql.DB, d dialect.Dialect, tables driver.Tables) (*Driver, error) {
	if db == nil {
		return nil, errors.New("sqldriver: db is nil: pass the *sql.DB that holds the outbox table")
	}
	if !d.Valid() {
		return nil, fmt.Errorf("sqldriver: unknown dialect %q: use dialect.Postgres, dialect.MySQL or dialect.SQLite", d)
	}
	if err := tables.Check(); err != nil {
		return nil, fmt.Errorf("sqldriver: %w", err)
	}
	relayQ, err := driverutil.NewRelayQueries(d, tables.Outbox, false)
	if err != nil {
		return nil, fmt.Errorf("sqldriver: %w", err)
	}
	return &Driver{db: db, d: d, tables: tables, relayQ: relayQ}, nil
}

// Dialect returns the driver's SQL dialect.
func (x *Driver) Dialect() dialect.Dialect { return x.d }

// Tables returns the table names.
func (x *Driver) Tables() driver.Tables { return x.tables }

// DB returns the underlying database handle.
func (x *Driver) DB() *sql.DB { return x.db }
