package walrelay_test

import (
	"context"
	"log"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxgen/outboxgen/runtime/outbox"
	"github.com/outboxgen/outboxgen/runtime/outbox/pgxoutbox"
	"github.com/outboxgen/outboxgen/runtime/walrelay"
)

// The WAL mode end to end: the slot is set up before writers switch, the
// writer emits into the WAL inside the business transaction, the relay
// streams (and the polling relay, not shown, publishes parked events).
func Example() {
	ctx := context.Background()
	var pool *pgxpool.Pool    // the application's pool (wal_level=logical)
	var pub message.Publisher // the broker's watermill publisher
	if pool == nil || pub == nil {
		return // the example needs a database and a broker
	}
	schema := outbox.Schema{ // the generated events.Schema
		Source:   "events.yaml",
		Tables:   outbox.Tables{Outbox: "outbox_event", Inbox: "outbox_inbox"},
		Dialects: []outbox.Dialect{outbox.Postgres},
	}

	r, err := walrelay.New(pool, schema, walrelay.Config{Publisher: pub})
	if err != nil {
		log.Fatal(err)
	}
	if err := r.Setup(ctx); err != nil { // deploy step: publication and slot
		log.Fatal(err)
	}
	go func() {
		if err := r.Run(ctx); err != nil {
			log.Fatal(err)
		}
	}()

	w, err := outbox.NewWALWriter(outbox.MustNewWriter(outbox.Postgres, schema.Tables.Outbox))
	if err != nil {
		log.Fatal(err)
	}
	tx, err := pool.Begin(ctx)
	if err != nil {
		log.Fatal(err)
	}
	defer tx.Rollback(ctx) //nolint:errcheck
	// ... the business change, e.g. UPDATE orders SET status = 'paid' WHERE id = $1 ...
	if _, err := w.InsertTx(ctx, pgxoutbox.Tx(tx), outbox.Event{Type: "ORDER_PAID", Topic: "orders.paid", Key: "o-1", Version: 1, Payload: map[string]any{"order_id": "o-1"}}); err != nil {
		log.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		log.Fatal(err)
	}
	// Output:
}
