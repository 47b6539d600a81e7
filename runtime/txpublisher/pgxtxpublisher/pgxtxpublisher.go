// Package pgxtxpublisher binds a txpublisher.Publisher to a native pgx/v5
// transaction. It is a separate package so that database/sql users of
// txpublisher never compile pgx.
//
//	tx, _ := pool.Begin(ctx)
//	pub := pgxtxpublisher.New(tx, events, txpublisher.Config{}) // events: an outbox.Postgres writer
//	err = pub.Publish("orders", msg)
//	err = tx.Commit(ctx)
package pgxtxpublisher

import (
	"errors"

	"github.com/jackc/pgx/v5"

	"github.com/outboxgen/outboxgen/runtime/outbox"
	"github.com/outboxgen/outboxgen/runtime/outbox/pgxoutbox"
	"github.com/outboxgen/outboxgen/runtime/txpublisher"
)

// New returns a watermill message.Publisher writing into w's outbox table
// inside tx, as cfg says (the zero Config for the defaults); w must be a
// Postgres writer. It panics when tx or w is nil, or cfg is invalid. See
// package txpublisher for the behaviour and the Config.
func New(tx pgx.Tx, w *outbox.Writer, cfg txpublisher.Config) *txpublisher.Publisher {
	if tx == nil {
		panic("pgxtxpublisher: New: nil pgx.Tx")
	}
	return txpublisher.NewTx(pgxTx{pgxoutbox.Tx(tx)}, w, cfg)
}

type pgxTx struct{ outbox.Tx }

func (pgxTx) IsTxDone(err error) bool { return errors.Is(err, pgx.ErrTxClosed) }
