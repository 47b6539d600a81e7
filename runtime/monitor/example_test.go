package monitor_test

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
	"github.com/outboxgen/outboxgen/runtime/monitor"
	"github.com/outboxgen/outboxgen/runtime/relay"
	"github.com/outboxgen/outboxgen/templates"
)

// The monitor reads the outbox table's health: Run checks every Interval
// and calls OnAlert and OnResolve once per crossing (and feeds the
// OpenTelemetry gauges); Check does one check, for a health endpoint.
func ExampleNew() {
	ctx := context.Background()
	db, done := openDB()
	defer done()
	drv, err := sqldriver.New(db, events.Schema)
	if err != nil {
		log.Fatal(err)
	}
	m, err := monitor.New(drv, monitor.Config{
		StaleAfter: 10 * time.Millisecond, // default 10 minutes
	})
	if err != nil {
		log.Fatal(err)
	}
	defer m.Close()

	payOrder(db, "o-1") // committed, and no relay runs
	time.Sleep(50 * time.Millisecond)
	st, alerts, err := m.Check(ctx)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("pending:", st.Pending, "stale:", st.Stale)
	for _, a := range alerts {
		fmt.Println("alert:", a.Kind)
	}

	// A relay publishes the row: the alerts clear.
	pub := gochannel.NewGoChannel(gochannel.Config{Persistent: true}, watermill.NopLogger{})
	defer pub.Close()
	r, err := relay.New(drv, relay.Config{Publisher: pub})
	if err != nil {
		log.Fatal(err)
	}
	if _, err := r.RunOnce(ctx); err != nil {
		log.Fatal(err)
	}
	st, alerts, err = m.Check(ctx)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("pending:", st.Pending, "stale:", st.Stale, "alerts:", len(alerts))
	// Output:
	// pending: 1 stale: 1
	// alert: stale
	// alert: oldest_pending_age
	// pending: 0 stale: 0 alerts: 0
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
