package pgxdriver_test

import (
	"context"
	"log"
	"os"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	events "github.com/outboxgen/outboxgen/internal/gentest/pgxevents" // a package generated with go.driver: pgx/v5
	"github.com/outboxgen/outboxgen/runtime/driver/pgxdriver"
	"github.com/outboxgen/outboxgen/runtime/relay"
)

// A service on a pgx/v5 pool: the relay's driver comes from the pool and
// the generated package's Schema; writers notify the relay inside their
// transaction, so it publishes at once instead of at its next poll, also
// across processes. (Compiled, not run: it needs a PostgreSQL server.)
func ExampleNew() {
	ctx := context.Background()
	var pub message.Publisher // the broker's: see runtime/brokers/natsjs and runtime/brokers/kafka

	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	drv, err := pgxdriver.New(pool, events.Schema)
	if err != nil {
		log.Fatal(err)
	}
	r, err := relay.New(drv, relay.Config{Publisher: pub})
	if err != nil {
		log.Fatal(err)
	}
	go r.Run(ctx) // LISTENs on the pool: woken by Notify below

	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		// ... the business change, through tx ...
		if _, err := events.InsertOrderPaid(ctx, tx, events.OrderPaid{OrderID: "o-1", AmountCents: 1299, Method: events.PaymentMethodCard}); err != nil {
			return err
		}
		return pgxdriver.Notify(ctx, tx, events.Schema) // delivered at commit
	})
	if err != nil {
		log.Fatal(err)
	}
}
