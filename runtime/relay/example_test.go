package relay_test

import (
	"context"
	"database/sql"
	"fmt"
	"log"
	"os"
	"path/filepath"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"
	_ "modernc.org/sqlite"

	"github.com/outboxgen/outboxgen/examples/orderpaid/events"
	"github.com/outboxgen/outboxgen/runtime/driver/sqldriver"
	"github.com/outboxgen/outboxgen/runtime/relay"
	"github.com/outboxgen/outboxgen/templates"
)

// A relay publishes the events committed into the outbox table of
// events.yaml (here events.Schema of the example service) to any watermill
// publisher: an in-process channel here, natsjs or kafka in production.
func ExampleNew() {
	ctx := context.Background()
	db, done := openDB()
	defer done()

	// The business transaction: the event row commits with it.
	w, err := events.NewWriter(db)
	if err != nil {
		log.Fatal(err)
	}
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		log.Fatal(err)
	}
	if _, err := w.InsertOrderPaid(ctx, tx, events.OrderPaid{OrderID: "o-1", AmountCents: 1299, Method: events.PaymentMethodCard}); err != nil {
		log.Fatal(err)
	}
	if err := tx.Commit(); err != nil {
		log.Fatal(err)
	}

	// The relay, on the tables and dialect of events.yaml.
	pub := gochannel.NewGoChannel(gochannel.Config{Persistent: true}, watermill.NopLogger{})
	defer pub.Close()
	msgs, err := pub.Subscribe(ctx, events.OrderPaidTopic)
	if err != nil {
		log.Fatal(err)
	}
	drv, err := sqldriver.New(db, events.Schema)
	if err != nil {
		log.Fatal(err)
	}
	r, err := relay.New(drv, relay.Config{Publisher: pub})
	if err != nil {
		log.Fatal(err)
	}
	// A service runs go r.Run(ctx); RunOnce polls once.
	n, err := r.RunOnce(ctx)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("published", n)

	m := <-msgs
	m.Ack()
	fmt.Println(m.Metadata.Get(relay.MetadataType), m.Metadata.Get(relay.MetadataKey))
	// Output:
	// published 1
	// ORDER_PAID o-1
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
