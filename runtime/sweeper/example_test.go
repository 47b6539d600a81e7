package sweeper_test

import (
	"context"
	"database/sql"
	"fmt"
	"log"
	"os"
	"path/filepath"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"
	_ "modernc.org/sqlite"

	"github.com/outboxgen/outboxgen/examples/orderpaid/events"
	"github.com/outboxgen/outboxgen/runtime/driver/sqldriver"
	"github.com/outboxgen/outboxgen/runtime/sweeper"
	"github.com/outboxgen/outboxgen/templates"
)

// The sweeper publishes the rows no relay published in time (every relay
// is down, say): run it as a goroutine (Run) or as a Kubernetes CronJob
// (RunOnce), on the same driver, and so the same tables, as the relays.
func ExampleNew() {
	ctx := context.Background()
	db, done := openDB()
	defer done()
	payOrder(db, "o-1") // committed, and no relay runs

	pub := gochannel.NewGoChannel(gochannel.Config{Persistent: true}, watermill.NopLogger{})
	defer pub.Close()
	drv, err := sqldriver.New(db, events.Schema)
	if err != nil {
		log.Fatal(err)
	}
	s, err := sweeper.New(drv, sweeper.Config{
		Publisher:    pub,
		OverdueAfter: 10 * time.Millisecond, // default 1 minute
	})
	if err != nil {
		log.Fatal(err)
	}
	// Rows younger than OverdueAfter are left to the relays.
	time.Sleep(50 * time.Millisecond)
	n, err := s.RunOnce(ctx)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("rescued:", n)
	// Output:
	// rescued: 1
}

// payOrder commits an ORDER_PAID event for orderID, as the service's
// payment transaction does.
func payOrder(db *sql.DB, orderID string) {
	ctx := context.Background()
	w, err := events.NewWriter(db)
	if err != nil {
		log.Fatal(err)
	}
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		log.Fatal(err)
	}
	defer tx.Rollback()
	if _, err := w.InsertOrderPaid(ctx, tx, events.OrderPaid{OrderID: orderID, AmountCents: 1299, Method: events.PaymentMethodCard}); err != nil {
		log.Fatal(err)
	}
	if err := tx.Commit(); err != nil {
		log.Fatal(err)
	}
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
