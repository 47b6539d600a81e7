package pgxtxpublisher_test

import (
	"context"
	"log"
	"os"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	events "github.com/outboxgen/outboxgen/internal/gentest/pgxevents" // a package generated with go.driver: pgx/v5
	"github.com/outboxgen/outboxgen/runtime/outbox"
	"github.com/outboxgen/outboxgen/runtime/txpublisher"
	"github.com/outboxgen/outboxgen/runtime/txpublisher/pgxtxpublisher"
)

// Code written against watermill's message.Publisher publishes inside a pgx
// transaction: Publish only inserts outbox rows, which commit with tx; the
// relay forwards them. (Compiled, not run: it needs a PostgreSQL server;
// txpublisher.New's example runs the same on SQLite.)
func ExampleNew() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	w, err := events.NewWriter() // once, at start-up
	if err != nil {
		log.Fatal(err)
	}

	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		pub := pgxtxpublisher.New(tx, w.Outbox(), txpublisher.Config{})
		// ... business writes on tx ...
		msg := message.NewMessage(watermill.NewUUID(), []byte(`{"order_id":"o-1"}`))
		msg.Metadata.Set(outbox.MetadataType, "ORDER_SHIPPED")
		msg.Metadata.Set(outbox.MetadataPartitionKey, "o-1")
		return pub.Publish("orders.shipped", msg)
	})
	if err != nil {
		log.Fatal(err)
	}
}
