package events_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log"
	"os"
	"path/filepath"
	"sync"

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

// The package-level InsertOrderPaid writes the event in the caller's
// transaction, through the writer Bind set up at start-up: the row commits
// or rolls back with the business change.
func ExampleInsertOrderPaid() {
	ctx := context.Background()
	db, done := openDB()
	defer done()

	// At start-up: the package-level InsertX functions write in db's
	// dialect (SQLite here), which must be one events.yaml lists.
	if err := events.Bind(db); err != nil {
		log.Fatal(err)
	}

	pay := func(orderID string, fail bool) error {
		tx, err := db.BeginTx(ctx, nil)
		if err != nil {
			return err
		}
		defer tx.Rollback()
		// ... the business change, through tx ...
		_, err = events.InsertOrderPaid(ctx, tx, events.OrderPaid{OrderID: orderID, AmountCents: 1299, Currency: "EUR", Method: events.PaymentMethodCard})
		if err != nil {
			return err
		}
		if fail {
			return fmt.Errorf("payment of %s declined", orderID) // rolls the event back too
		}
		return tx.Commit()
	}
	fmt.Println(pay("o-1", false))
	fmt.Println(pay("o-2", true))

	// An invalid event is refused before any SQL runs.
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		log.Fatal(err)
	}
	defer tx.Rollback()
	_, err = events.InsertOrderPaid(ctx, tx, events.OrderPaid{OrderID: "o-3", Method: "cash"})
	fmt.Println(errors.Is(err, outbox.ErrInvalidEvent))
	tx.Rollback()

	fmt.Println("pending events:", pending(db))
	// Output:
	// <nil>
	// payment of o-2 declined
	// true
	// pending events: [ORDER_PAID o-1]
}

// A Writer per database needs no package-level state: tests that run in
// parallel, or a program writing to several databases, use one each.
func ExampleNewWriter() {
	ctx := context.Background()
	db, done := openDB()
	defer done()

	w, err := events.NewWriter(db) // the dialect comes from db's driver, checked against events.yaml
	if err != nil {
		log.Fatal(err)
	}
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		log.Fatal(err)
	}
	defer tx.Rollback()
	_, err = w.InsertOrderRefunded(ctx, tx, events.OrderRefunded{OrderID: "o-1", AmountCents: 500},
		outbox.WithHeader("tenant", "acme"))
	if err != nil {
		log.Fatal(err)
	}
	if err := tx.Commit(); err != nil {
		log.Fatal(err)
	}
	fmt.Println("pending events:", pending(db))
	// Output:
	// pending events: [ORDER_REFUNDED o-1]
}

// points credits loyalty points: its writes go through tx, which also
// records the delivery in the inbox table.
type points struct {
	mu      sync.Mutex
	handled map[string]int
}

func (p *points) HandleOrderPaid(ctx context.Context, tx *sql.Tx, e events.OrderPaid, m outbox.Meta) error {
	// ... credit the points through tx; events.InsertPointsCredited(ctx, tx, ...) would commit with it ...
	p.mu.Lock()
	p.handled[e.OrderID]++
	p.mu.Unlock()
	return nil
}

func (p *points) HandleOrderRefunded(ctx context.Context, tx *sql.Tx, e events.OrderRefunded, m outbox.Meta) error {
	return nil
}

// RegisterPoints runs consumer points of events.yaml on a watermill router:
// each delivery is deduplicated by event id in the inbox table, in the same
// transaction as the handler's writes. Here the broker delivers every
// message twice; the handler still sees each event once.
func ExampleRegisterPoints() {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	db, done := openDB()
	defer done()

	// The broker: an in-process channel here (a publish returns once the
	// consumer acknowledged it); see runtime/brokers/natsjs and
	// runtime/brokers/kafka for real ones.
	broker := gochannel.NewGoChannel(gochannel.Config{Persistent: true, BlockPublishUntilSubscriberAck: true}, watermill.NopLogger{})
	defer broker.Close()

	// The consumer: pub receives the poison messages (topic points.poison).
	h := &points{handled: map[string]int{}}
	router, err := message.NewRouter(message.RouterConfig{}, watermill.NopLogger{})
	if err != nil {
		log.Fatal(err)
	}
	err = events.RegisterPoints(router, broker, db, h, inbox.Config{PoisonPublisher: broker})
	if err != nil {
		log.Fatal(err)
	}
	go router.Run(ctx)
	<-router.Running()

	// The producer: a writer and a relay that publishes every message twice.
	w, err := events.NewWriter(db)
	if err != nil {
		log.Fatal(err)
	}
	drv, err := sqldriver.New(db, events.Schema)
	if err != nil {
		log.Fatal(err)
	}
	r, err := relay.New(drv, relay.Config{Publisher: twice{broker}})
	if err != nil {
		log.Fatal(err)
	}
	for _, id := range []string{"o-1", "o-2"} {
		tx, err := db.BeginTx(ctx, nil)
		if err != nil {
			log.Fatal(err)
		}
		if _, err := w.InsertOrderPaid(ctx, tx, events.OrderPaid{OrderID: id, AmountCents: 1299, Method: events.PaymentMethodCard}); err != nil {
			log.Fatal(err)
		}
		if err := tx.Commit(); err != nil {
			log.Fatal(err)
		}
		if _, err := r.RunOnce(ctx); err != nil { // returns once both copies were handled
			log.Fatal(err)
		}
	}
	if err := router.Close(); err != nil {
		log.Fatal(err)
	}

	var inboxRows int
	if err := db.QueryRow("SELECT COUNT(*) FROM " + events.InboxTable).Scan(&inboxRows); err != nil {
		log.Fatal(err)
	}
	fmt.Printf("handled ORDER_PAID o-1 %d time(s), o-2 %d time(s); inbox rows: %d\n", h.handled["o-1"], h.handled["o-2"], inboxRows)
	// Output:
	// handled ORDER_PAID o-1 1 time(s), o-2 1 time(s); inbox rows: 2
}

// twice publishes every message twice, as a broker redelivering after a
// lost acknowledgement would deliver it.
type twice struct{ message.Publisher }

func (p twice) Publish(topic string, msgs ...*message.Message) error {
	for _, m := range msgs {
		if err := p.Publisher.Publish(topic, m, m.Copy()); err != nil {
			return err
		}
	}
	return nil
}

// pending lists the type and key of the pending outbox rows.
func pending(db *sql.DB) []string {
	rows, err := db.Query("SELECT biz_type, biz_id FROM " + events.OutboxTable + " WHERE status = 0 ORDER BY id")
	if err != nil {
		log.Fatal(err)
	}
	defer rows.Close()
	var out []string
	for rows.Next() {
		var typ, key string
		if err := rows.Scan(&typ, &key); err != nil {
			log.Fatal(err)
		}
		out = append(out, typ+" "+key)
	}
	if err := rows.Err(); err != nil {
		log.Fatal(err)
	}
	return out
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
