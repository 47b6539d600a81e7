// Package pgxdriver implements driver.Driver on a native pgx/v5 pool
// (PostgreSQL). It runs the same PostgreSQL statements as package sqldriver
// (from package dialect) without database/sql's overhead, and can wait for
// new rows with LISTEN/NOTIFY.
package pgxdriver

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxgen/outboxgen/runtime/dialect"
	"github.com/outboxgen/outboxgen/runtime/driver"
	"github.com/outboxgen/outboxgen/runtime/driver/internal/driverutil"
	"github.com/outboxgen/outboxgen/runtime/outbox"
)

// Driver is the pgx/v5 driver. Create it with New.
type Driver struct {
	pool   *pgxpool.Pool
	schema outbox.Schema
	tables driver.Tables
	relayQ *driverutil.RelayQueries // the relay's statements, per unordered set
	listen listener                 // LISTEN/NOTIFY (notify.go)
	check  driverutil.Checker
	// The operator methods (Overview, FindEvents, GetEvent, Replay, ...).
	*driverutil.Admin
}

// New returns a driver for the tables of schema (the generated package's
// Schema, from events.yaml) reachable through pool:
//
//	drv, err := pgxdriver.New(pool, events.Schema)
//
// events.yaml must list postgres in sql.dialects. Every part built on the
// driver calls Check when it starts, which asks the server whether it is
// PostgreSQL and checks the tables it uses.
func New(pool *pgxpool.Pool, schema outbox.Schema) (*Driver, error) {
	if pool == nil {
		return nil, errors.New("pgxdriver: pool is nil: pass the *pgxpool.Pool that holds the outbox table")
	}
	if err := schema.Validate(); err != nil {
		return nil, fmt.Errorf("pgxdriver: %w", err)
	}
	if err := schema.CheckDialect(dialect.Postgres, "a pgx pool"); err != nil {
		return nil, fmt.Errorf("pgxdriver: %w", err)
	}
	tables := schema.Tables
	relayQ, err := driverutil.NewRelayQueries(dialect.Postgres, tables.Outbox, true)
	if err != nil {
		return nil, fmt.Errorf("pgxdriver: %w", err)
	}
	x := &Driver{pool: pool, schema: schema, tables: tables, relayQ: relayQ}
	x.listen.init(pool, tables.Outbox)
	if x.Admin, err = driverutil.NewAdmin("pgxdriver", poolQuerier{pool}, dialect.Postgres, tables); err != nil {
		return nil, fmt.Errorf("pgxdriver: %w", err)
	}
	x.Admin.Relay, x.Admin.Check = relayQ, x.Check
	x.check = driverutil.Checker{
		What: "pgxdriver", Schema: schema, Dialect: dialect.Postgres,
		Text:  driverutil.TextQuery(pool.QueryRow),
		Probe: driverutil.ProbeQuery(pool.Query),
	}
	return x, nil
}

// Dialect returns dialect.Postgres.
func (x *Driver) Dialect() dialect.Dialect { return dialect.Postgres }

// Tables returns the table names.
func (x *Driver) Tables() driver.Tables { return x.tables }

// Schema returns the schema the driver was built from.
func (x *Driver) Schema() outbox.Schema { return x.schema }

// Check verifies that the database is PostgreSQL and that table t has the
// columns the runtime needs; see driver.Driver.
func (x *Driver) Check(ctx context.Context, t driver.Table) error { return x.check.Check(ctx, t) }

// Pool returns the underlying pool.
func (x *Driver) Pool() *pgxpool.Pool { return x.pool }

// poolQuerier adapts the pool to driverutil.Querier.
type poolQuerier struct{ pool *pgxpool.Pool }

func (q poolQuerier) Query(ctx context.Context, query string, args ...any) (driverutil.Rows, error) {
	return q.pool.Query(ctx, query, args...)
}

func (q poolQuerier) Exec(ctx context.Context, query string, args ...any) (int64, error) {
	tag, err := q.pool.Exec(ctx, query, args...)
	return tag.RowsAffected(), err
}

// InTx runs f in one transaction of the pool.
func (q poolQuerier) InTx(ctx context.Context, f func(driverutil.Querier) error) error {
	return pgx.BeginFunc(ctx, q.pool, func(tx pgx.Tx) error { return f(txQuerier{tx}) })
}

// txQuerier adapts a pgx transaction to driverutil.Querier.
type txQuerier struct{ tx pgx.Tx }

func (q txQuerier) Query(ctx context.Context, query string, args ...any) (driverutil.Rows, error) {
	return q.tx.Query(ctx, query, args...)
}

func (q txQuerier) Exec(ctx context.Context, query string, args ...any) (int64, error) {
	tag, err := q.tx.Exec(ctx, query, args...)
	return tag.RowsAffected(), err
}

// InTx runs f in the transaction already open: transactions do not nest.
func (q txQuerier) InTx(_ context.Context, f func(driverutil.Querier) error) error { return f(q) }
