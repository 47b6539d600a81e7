package txpublisher_test

import (
	"context"
	"database/sql"
	"fmt"
	"log"
	"os"
	"path/filepath"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"
	_ "modernc.org/sqlite"

	"github.com/outboxgen/outboxgen/examples/orderpaid/events"
	"github.com/outboxgen/outboxgen/runtime/driver/sqldriver"
	"github.com/outboxgen/outboxgen/runtime/outbox"
	"github.com/outboxgen/outboxgen/runtime/relay"
	"github.com/outboxgen/outboxgen/runtime/txpublisher"
	"github.com/outboxgen/outboxgen/templates"
)

// Code written against watermill's message.Publisher publishes inside the
// business transaction through a txpublisher: Publish only inserts outbox
// rows, which commit with the transaction; the relay forwards them to the
// broker.
func ExampleNew() {
	ctx := context.Background()
	db, done := openDB()
	defer done()
	w, err := events.NewWriter(db) // once, at start-up
	if err != nil {
		log.Fatal(err)
	}

	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		log.Fatal(err)
	}
	defer tx.Rollback()
	pub := txpublisher.New(tx, w.Outbox(), txpublisher.Config{})
	// ... business writes on tx ...
	msg := message.NewMessage(watermill.NewUUID(), []byte(`{"order_id":"o-1","amount_cents":1299}`))
	msg.Metadata.Set(outbox.MetadataType, "ORDER_SHIPPED") // the row's type and key (txpublisher.DefaultTypeMetadata, DefaultKeyMetadata)
	msg.Metadata.Set(outbox.MetadataPartitionKey, "o-1")
	msg.Metadata.Set("tenant", "acme") // stored as a header, published as metadata
	if err := pub.Publish("orders.shipped", msg); err != nil {
		log.Fatal(err)
	}
	if err := tx.Commit(); err != nil {
		log.Fatal(err)
	}

	// The relay publishes the committed row to the broker.
	broker := gochannel.NewGoChannel(gochannel.Config{Persistent: true}, watermill.NopLogger{})
	defer broker.Close()
	got, err := broker.Subscribe(ctx, "orders.shipped")
	if err != nil {
		log.Fatal(err)
	}
	drv, err := sqldriver.New(db, events.Schema)
	if err != nil {
		log.Fatal(err)
	}
	r, err := relay.New(drv, relay.Config{Publisher: broker})
	if err != nil {
		log.Fatal(err)
	}
	n, err := r.RunOnce(ctx)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("published", n)
	m := <-got
	m.Ack()
	fmt.Println(m.UUID == msg.UUID, m.Metadata.Get(relay.MetadataType), m.Metadata.Get(relay.MetadataKey), m.Metadata.Get("tenant"), string(m.Payload))
	// Output:
	// published 1
	// true ORDER_SHIPPED o-1 acme {"order_id":"o-1","amount_cents":1299}
}

// openDB opens a new SQLite database (a temporary file) and creates the
// tables of events.yaml in it, as a service's migrations would
// (outboxgen schema -dialect sqlite prints the same DDL). done closes and
// removes it.
func openDB() (db *sql.DB, done func()) {
	dir, err := os.MkdirTemp("", "outboxgen-example")
	if err != nil {
		log.Fatal(err)
	}
	db, err = sql.Open("sqlite", "file:"+filepath.Join(dir, "app.db")+"?_pragma=busy_timeout(10000)&_pragma=journal_mode(WAL)&_txlock=immediate")
	if err != nil {
		log.Fatal(err)
	}
	ddl, err := templates.Render("sqlite", templates.Tables{Outbox: events.OutboxTable, Inbox: events.InboxTable})
	if err != nil {
		log.Fatal(err)
	}
	for _, stmt := range templates.Statements(ddl) {
		if _, err := db.Exec(stmt); err != nil {
			log.Fatal(err)
		}
	}
	return db, func() { db.Close(); os.RemoveAll(dir) }
}
