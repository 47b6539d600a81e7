// Package pgxdriver implements driver.Driver on a native pgx/v5 pool
// (PostgreSQL). It runs the same PostgreSQL statements as package sqldriver
// (from package dialect) without database/sql's overhead, and can wait for
// new rows with LISTEN/NOTIFY.
package pgxdriver

import (
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxgen/outboxgen/runtime/dialect"
	"github.com/outboxgen/outboxgen/runtime/driver"
	"github.com/outboxgen/outboxgen/runtime/driver/internal/driverutil"
)

// Driver is the pgx/v5 driver. Create it with New.
type Driver struct {
	pool   *pgxpool.Pool
	tables driver.Tables
	relayQ *driverutil.RelayQueries // the relay's statements, per unordered set
	listen listener                 // LISTEN/NOTIFY (notify.go)
}

// New returns a driver for the outbox and inbox tables reachable through pool.
func New(pool *pgxpool.Pool, tables driver.Tables) (*Driver, error) {
	if pool == nil {
		return nil, errors.New("pgxdriver: pool is nil: pass the *pgxpool.Pool that holds the outbox table")
	}
	if err := tables.Check(); err != nil {
		return nil, fmt.Errorf("pgxdriver: %w", err)
	}
	relayQ, err := driverutil.NewRelayQueries(dialect.Postgres, tables.Outbox, true)
	if err != nil {
		return nil, fmt.Errorf("pgxdriver: %w", err)
	}
	x := &Driver{pool: pool, tables: tables, relayQ: relayQ}
	x.listen.init(pool, tables.Outbox)
	return x, nil
}

// Dialect returns dialect.Postgres.
func (x *Driver) Dialect() dialect.Dialect { return dialect.Postgres }

// Tables returns the table names.
func (x *Driver) Tables() driver.Tables { return x.tables }

// Pool returns the underlying pool.
func (x *Driver) Pool() *pgxpool.Pool { return x.pool }
