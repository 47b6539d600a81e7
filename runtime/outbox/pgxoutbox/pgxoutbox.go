// Package pgxoutbox lets generated writers insert through a native pgx/v5
// transaction. It is a separate package so that database/sql users never
// compile pgx.
package pgxoutbox

import (
	"context"
	"errors"

	"github.com/jackc/pgx/v5"

	"github.com/outboxgen/outboxgen/runtime/outbox"
)

// Insert writes ev into w's outbox table inside tx and returns its event id.
// w must be a Postgres writer. It behaves as outbox.Writer.Insert: a
// caller-chosen id (outbox.WithEventID) that the table already holds for
// another event fails with an error matching outbox.ErrDuplicateEventID, and
// leaves tx usable.
func Insert(ctx context.Context, tx pgx.Tx, w *outbox.Writer, ev outbox.Event, opts ...outbox.InsertOption) (outbox.EventID, error) {
	return w.InsertTx(ctx, Tx(tx), ev, opts...)
}

// Tx adapts a pgx transaction to outbox.Tx.
func Tx(tx pgx.Tx) outbox.Tx { return pgxTx{tx} }

type pgxTx struct{ tx pgx.Tx }

func (t pgxTx) Exec(ctx context.Context, query string, args ...any) (int64, error) {
	tag, err := t.tx.Exec(ctx, query, args...)
	if err != nil {
		return 0, err
	}
	return tag.RowsAffected(), nil
}

func (t pgxTx) QueryRow(ctx context.Context, query string, args []any, dest ...any) (bool, error) {
	err := t.tx.QueryRow(ctx, query, args...).Scan(dest...)
	if errors.Is(err, pgx.ErrNoRows) {
		return false, nil
	}
	return err == nil, err
}
