// Package pgxoutbox lets generated writers insert through a native pgx/v5
// transaction. It is a separate package so that database/sql users never
// compile pgx.
package pgxoutbox

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/outboxgen/outboxgen/runtime/outbox"
)

// Insert writes ev into w's outbox table inside tx and returns its event id.
// w must be a Postgres writer. It behaves as outbox.Writer.Insert: a
// caller-chosen id (outbox.WithEventID) that the table already holds for
// another event fails with an error matching outbox.ErrDuplicateEventID, and
// leaves tx usable.
func Insert(ctx context.Context, tx pgx.Tx, w *outbox.Writer, ev outbox.Event, opts ...outbox.InsertOption) (outbox.EventID, error) {
	st, err := w.Prepare(ev, opts...)
	if err != nil {
		return outbox.EventID{}, err
	}
	tag, err := tx.Exec(ctx, st.SQL, st.Args...)
	if err != nil {
		return outbox.EventID{}, fmt.Errorf("outbox: insert %s into %s: %w", ev.Type, w.Table(), err)
	}
	if st.Lookup == "" || tag.RowsAffected() != 0 {
		return st.ID, nil
	}
	var typ, key, topic string
	switch err := tx.QueryRow(ctx, st.Lookup, st.ID.String()).Scan(&typ, &key, &topic); {
	case errors.Is(err, pgx.ErrNoRows):
		return outbox.EventID{}, st.ExistingRowGone(w.Table())
	case err != nil:
		return outbox.EventID{}, fmt.Errorf("outbox: insert %s into %s: look up the existing event id %s: %w", ev.Type, w.Table(), st.ID, err)
	}
	if err := st.CheckExisting(typ, key, topic); err != nil {
		return outbox.EventID{}, err
	}
	return st.ID, nil
}
