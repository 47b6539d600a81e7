// Package pgxoutbox lets generated writers insert through a native pgx/v5
// transaction. It is a separate package so that database/sql users never
// compile pgx.
package pgxoutbox

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/outboxgen/outboxgen/runtime/outbox"
)

// Insert writes ev into w's outbox table inside tx and returns its event id.
// w must be a Postgres writer.
func Insert(ctx context.Context, tx pgx.Tx, w *outbox.Writer, ev outbox.Event, opts ...outbox.InsertOption) (outbox.EventID, error) {
	st, err := w.Prepare(ev, opts...)
	if err != nil {
		return outbox.EventID{}, err
	}
	if _, err := tx.Exec(ctx, st.SQL, st.Args...); err != nil {
		return outbox.EventID{}, fmt.Errorf("outbox: insert %s into %s: %w", ev.Type, w.Table(), err)
	}
	return st.ID, nil
}
