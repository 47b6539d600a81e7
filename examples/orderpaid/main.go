// Command orderpaid is the example service: it pays orders and records an
// ORDER_PAID event for each in the same SQLite transaction, using the sqlc
// queries in db/ and the writers outboxgen generated into events/ from the
// repository's events.yaml.
//
// It runs with no servers: the database is a SQLite file (pure Go driver).
// The relay that publishes the outbox rows to a broker is the next part of
// the project; until then the demo shows the rows it would publish and the
// payment that rolled back without leaving one.
package main

import (
	"context"
	"database/sql"
	"embed"
	"errors"
	"flag"
	"fmt"
	"io/fs"
	"log"
	"os"
	"path/filepath"
	"time"

	_ "modernc.org/sqlite"

	"github.com/outboxgen/outboxgen/examples/orderpaid/db"
	"github.com/outboxgen/outboxgen/examples/orderpaid/events"
	"github.com/outboxgen/outboxgen/runtime/outbox"
)

//go:embed schema/sqlite/*.sql
var schema embed.FS

func main() {
	dbPath := flag.String("db", filepath.Join(os.TempDir(), "orderpaid-demo.db"), "SQLite database file (recreated on each run)")
	orders := flag.Int("orders", 5, "orders to pay")
	flag.Parse()
	if err := run(context.Background(), *dbPath, *orders); err != nil {
		log.Fatal(err)
	}
}

var errDeclined = errors.New("card declined")

func run(ctx context.Context, path string, n int) error {
	for _, suffix := range []string{"", "-wal", "-shm"} {
		os.Remove(path + suffix)
	}
	conn, err := sql.Open("sqlite", "file:"+path+"?_pragma=busy_timeout(10000)&_pragma=journal_mode(WAL)")
	if err != nil {
		return err
	}
	defer conn.Close()
	if err := applySchema(ctx, conn); err != nil {
		return err
	}
	q := db.New(conn)

	fmt.Printf("database: %s\n\n", path)
	for i := 1; i <= n; i++ {
		id := fmt.Sprintf("o-%03d", i)
		if err := q.CreateOrder(ctx, db.CreateOrderParams{ID: id, CustomerID: fmt.Sprintf("c-%d", i%3), AmountCents: int64(1000 + i*99), Currency: "EUR"}); err != nil {
			return err
		}
		// Every third payment fails after the order was updated: the
		// business change and its event roll back together.
		var fail error
		if i%3 == 0 {
			fail = errDeclined
		}
		eventID, err := pay(ctx, conn, q, id, fail)
		switch {
		case errors.Is(err, errDeclined):
			fmt.Printf("pay %s: %v: rolled back, no event\n", id, err)
		case err != nil:
			return err
		default:
			fmt.Printf("pay %s: committed with event %s\n", id, eventID)
		}
	}

	pending, err := q.CountPendingEvents(ctx)
	if err != nil {
		return err
	}
	fmt.Printf("\noutbox rows waiting for the relay: %d\n", pending)
	rows, err := conn.QueryContext(ctx, `SELECT event_id, biz_type, biz_id, topic, payload FROM outbox_event ORDER BY id`)
	if err != nil {
		return err
	}
	defer rows.Close()
	for rows.Next() {
		var eventID, typ, key, topic, payload string
		if err := rows.Scan(&eventID, &typ, &key, &topic, &payload); err != nil {
			return err
		}
		fmt.Printf("  %s %-10s key=%s topic=%s %s\n", eventID, typ, key, topic, payload)
	}
	return rows.Err()
}

// pay is the business transaction: mark the order paid and write the event.
func pay(ctx context.Context, conn *sql.DB, q *db.Queries, orderID string, fail error) (outbox.EventID, error) {
	tx, err := conn.BeginTx(ctx, nil)
	if err != nil {
		return outbox.EventID{}, err
	}
	defer tx.Rollback()
	order, err := q.WithTx(tx).GetOrder(ctx, orderID)
	if err != nil {
		return outbox.EventID{}, err
	}
	paidAt := time.Now().UTC()
	if n, err := q.WithTx(tx).MarkOrderPaid(ctx, db.MarkOrderPaidParams{PaidAt: sql.NullTime{Time: paidAt, Valid: true}, ID: orderID}); err != nil || n != 1 {
		return outbox.EventID{}, fmt.Errorf("mark %s paid: %d rows, %v", orderID, n, err)
	}
	id, err := events.InsertOrderPaid(ctx, tx, events.OrderPaid{
		OrderID:     order.ID,
		CustomerID:  order.CustomerID,
		AmountCents: order.AmountCents,
		Currency:    order.Currency,
		Method:      events.PaymentMethodCard,
		PaidAt:      paidAt,
	})
	if err != nil {
		return outbox.EventID{}, err
	}
	if fail != nil {
		return outbox.EventID{}, fail
	}
	return id, tx.Commit()
}

func applySchema(ctx context.Context, conn *sql.DB) error {
	files, err := fs.Glob(schema, "schema/sqlite/*.sql")
	if err != nil {
		return err
	}
	for _, f := range files {
		ddl, err := schema.ReadFile(f)
		if err != nil {
			return err
		}
		if _, err := conn.ExecContext(ctx, string(ddl)); err != nil {
			return fmt.Errorf("apply %s: %w", f, err)
		}
	}
	return nil
}
