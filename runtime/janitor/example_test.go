package janitor_test

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
	"github.com/outboxgen/outboxgen/runtime/janitor"
	"github.com/outboxgen/outboxgen/runtime/relay"
	"github.com/outboxgen/outboxgen/templates"
)

// The janitor deletes sent rows older than Retention (and inbox rows older
// than InboxRetention), in short batches; pending and FAILED rows are never
// touched. Run it with Run (every Interval) or RunOnce from a CronJob.
func ExampleNew() {
	ctx := context.Background()
	db, done := openDB()
	defer done()
	drv, err := sqldriver.New(db, events.Schema)
	if err != nil {
		log.Fatal(err)
	}

	// o-1 is published (sent); o-2 is committed after the relay ran, so it
	// is still pending.
	payOrder(db, "o-1")
	pub := gochannel.NewGoChannel(gochannel.Config{Persistent: true}, watermill.NopLogger{})
	defer pub.Close()
	r, err := relay.New(drv, relay.Config{Publisher: pub})
	if err != nil {
		log.Fatal(err)
	}
	if _, err := r.RunOnce(ctx); err != nil {
		log.Fatal(err)
	}
	payOrder(db, "o-2")

	j, err := janitor.New(drv, janitor.Config{
		Retention: 10 * time.Millisecond, // default 7 days
	})
	if err != nil {
		log.Fatal(err)
	}
	time.Sleep(50 * time.Millisecond)
	res, err := j.RunOnce(ctx)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("deleted sent rows:", res.Sent)
	var left int
	if err := db.QueryRow("SELECT COUNT(*) FROM " + events.OutboxTable).Scan(&left); err != nil {
		log.Fatal(err)
	}
	fmt.Println("rows left (pending):", left)
	// Output:
	// deleted sent rows: 1
	// rows left (pending): 1
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
