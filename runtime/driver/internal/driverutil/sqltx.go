package driverutil

import (
	"context"
	"database/sql"
)

// TxQuerier adapts a database/sql transaction to Querier. Its InTx runs f
// in that transaction: transactions do not nest. sqldriver runs its
// transactions through it; drivertest, to run a driver's statements in a
// transaction it keeps open while another statement meets their locks.
func TxQuerier(tx *sql.Tx) Querier { return txQuerier{tx} }

type txQuerier struct{ tx *sql.Tx }

func (q txQuerier) Query(ctx context.Context, query string, args ...any) (Rows, error) {
	rows, err := q.tx.QueryContext(ctx, query, args...)
	if err != nil {
		return nil, err
	}
	return SQLRows{rows}, nil
}

func (q txQuerier) Exec(ctx context.Context, query string, args ...any) (int64, error) {
	res, err := q.tx.ExecContext(ctx, query, args...)
	if err != nil {
		return 0, err
	}
	return res.RowsAffected()
}

func (q txQuerier) InTx(_ context.Context, f func(Querier) error) error { return f(q) }

// SQLRows adapts *sql.Rows (whose Close returns an error) to Rows.
type SQLRows struct{ *sql.Rows }

// Close closes the rows; an error is the one Err reports.
func (r SQLRows) Close() { _ = r.Rows.Close() }
