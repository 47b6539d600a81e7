// Package pgxinbox runs outboxgen consumers on a native pgx/v5 pool. It is
// a separate package so that database/sql users never compile pgx; see
// package inbox for what a consumer does.
package pgxinbox

import (
	"context"
	"errors"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxgen/outboxgen/runtime/dialect"
	"github.com/outboxgen/outboxgen/runtime/inbox"
)

// Register adds the consumer's handlers to r, reading from sub, running each
// delivery in a transaction of pool. The dialect is always PostgreSQL
// (cfg.Dialect is ignored); see inbox.Config for the rest of cfg.
func Register(r *message.Router, sub message.Subscriber, pool *pgxpool.Pool, c inbox.Consumer[pgx.Tx], cfg inbox.Config) error {
	if pool == nil {
		return errors.New("pgxinbox: nil pool")
	}
	cfg.Dialect = dialect.Postgres
	return inbox.RegisterStore(r, sub, Store{Pool: pool}, c, cfg)
}

// Store runs a consumer on a pgx pool.
type Store struct{ Pool *pgxpool.Pool }

// Begin starts a transaction.
func (s Store) Begin(ctx context.Context) (pgx.Tx, error) { return s.Pool.Begin(ctx) }

// Exec runs query in tx and returns the affected-row count.
func (s Store) Exec(ctx context.Context, tx pgx.Tx, query string, args ...any) (int64, error) {
	tag, err := tx.Exec(ctx, query, args...)
	if err != nil {
		return 0, err
	}
	return tag.RowsAffected(), nil
}

// QueryRow runs query in tx and scans its row, if any, into dest.
func (s Store) QueryRow(ctx context.Context, tx pgx.Tx, query string, args []any, dest ...any) (bool, error) {
	err := tx.QueryRow(ctx, query, args...).Scan(dest...)
	if errors.Is(err, pgx.ErrNoRows) {
		return false, nil
	}
	return err == nil, err
}

// Commit commits tx.
func (s Store) Commit(ctx context.Context, tx pgx.Tx) error { return tx.Commit(ctx) }

// Rollback rolls tx back; after Commit it is a no-op.
func (s Store) Rollback(ctx context.Context, tx pgx.Tx) error { return tx.Rollback(ctx) }
