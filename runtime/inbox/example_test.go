package inbox_test

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
	"github.com/outboxgen/outboxgen/runtime/inbox"
	"github.com/outboxgen/outboxgen/runtime/outbox"
	"github.com/outboxgen/outboxgen/runtime/relay"
	"github.com/outboxgen/outboxgen/templates"
)

// The generated RegisterX functions call Register; call it directly for a
// consumer events.yaml does not declare. Each delivery runs in one
// transaction with its inbox row; an error wrapped with Permanent sends the
// message to the poison topic at once instead of retrying it.
func ExampleRegister() {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	db, done := openDB()
	defer done()

	// The broker (a publish returns once the consumer acknowledged it) and
	// the poison queue, in-process here.
	broker := gochannel.NewGoChannel(gochannel.Config{Persistent: true, BlockPublishUntilSubscriberAck: true}, watermill.NopLogger{})
	defer broker.Close()
	poison := gochannel.NewGoChannel(gochannel.Config{Persistent: true}, watermill.NopLogger{})
	defer poison.Close()
	poisoned, err := poison.Subscribe(ctx, "audit.poison")
	if err != nil {
		log.Fatal(err)
	}

	var audited []string
	audit := func(ctx context.Context, tx *sql.Tx, e events.OrderPaid, m outbox.Meta) error {
		if e.AmountCents <= 0 {
			return inbox.Permanent(fmt.Errorf("order %s: amount %d is not positive", e.OrderID, e.AmountCents))
		}
		audited = append(audited, m.Type+" "+m.Key) // ... and write the audit record through tx ...
		return nil
	}
	router, err := message.NewRouter(message.RouterConfig{}, watermill.NopLogger{})
	if err != nil {
		log.Fatal(err)
	}
	err = inbox.Register(router, broker, db, inbox.Consumer[*sql.Tx]{
		Name:   "audit", // the inbox deduplicates per consumer name
		Routes: []inbox.Route[*sql.Tx]{inbox.On(events.OrderPaidType, events.OrderPaidTopic, events.DecodeOrderPaid, audit)},
	}, inbox.Config{Schema: events.Schema, PoisonPublisher: poison}) // poison topic audit.poison
	if err != nil {
		log.Fatal(err)
	}
	go router.Run(ctx)
	<-router.Running()

	// Two events, published by a relay.
	w, err := events.NewWriter(db)
	if err != nil {
		log.Fatal(err)
	}
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		log.Fatal(err)
	}
	defer tx.Rollback()
	for _, e := range []events.OrderPaid{{OrderID: "o-1", AmountCents: 1299, Method: events.PaymentMethodCard}, {OrderID: "o-2", AmountCents: 0, Method: events.PaymentMethodCard}} {
		if _, err := w.InsertOrderPaid(ctx, tx, e); err != nil {
			log.Fatal(err)
		}
	}
	if err := tx.Commit(); err != nil {
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
	if _, err := r.RunOnce(ctx); err != nil { // returns once both were handled
		log.Fatal(err)
	}

	m := <-poisoned
	m.Ack()
	if err := router.Close(); err != nil {
		log.Fatal(err)
	}
	fmt.Println("audited:", audited)
	fmt.Println("poisoned:", m.Metadata.Get(relay.MetadataType), m.Metadata.Get(relay.MetadataKey))
	// Output:
	// audited: [ORDER_PAID o-1]
	// poisoned: ORDER_PAID o-2
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
