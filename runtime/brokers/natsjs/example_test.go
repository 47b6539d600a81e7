package natsjs_test

import (
	"context"
	"database/sql"
	"fmt"
	"log"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/nats-io/nats-server/v2/server"
	_ "modernc.org/sqlite"

	"github.com/outboxgen/outboxgen/examples/orderpaid/events"
	"github.com/outboxgen/outboxgen/runtime/brokers/natsjs"
	"github.com/outboxgen/outboxgen/runtime/driver/sqldriver"
	"github.com/outboxgen/outboxgen/runtime/inbox"
	"github.com/outboxgen/outboxgen/runtime/outbox"
	"github.com/outboxgen/outboxgen/runtime/relay"
	"github.com/outboxgen/outboxgen/templates"
)

// A service on NATS JetStream, end to end: the writer commits ORDER_PAID
// with the business change, the relay publishes it through a natsjs
// Publisher (streams provisioned on first use, with a duplicate window that
// drops the relay's re-sends), and consumer points receives it through its
// own durable JetStream consumer, deduplicated by the inbox table.
func Example() {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	db, done := openDB()
	defer done()
	natsURL, stop := startJetStream() // your server's URL, e.g. nats://nats:4222
	defer stop()
	if err := events.Bind(db); err != nil {
		log.Fatal(err)
	}

	// The relay's publisher. AutoProvision creates a stream per topic
	// (OUTBOX_ORDERS_PAID capturing orders.paid) unless one captures it
	// already; without it, streams are the operator's job. Nats-Msg-Id is
	// the event id, so a re-send inside DuplicateWindow is dropped.
	pub, err := natsjs.NewPublisher(natsjs.Config{
		URL:             natsURL,
		AutoProvision:   true,
		DuplicateWindow: 2 * time.Minute,
	})
	if err != nil {
		log.Fatal(err)
	}
	defer pub.Close()

	// One subscriber per consumer, with its own durable (points_orders_paid,
	// points_orders_refunded): a restart resumes after the last ack, and
	// another consumer (sms) gets every message too.
	sub, err := natsjs.NewSubscriber(natsjs.SubscriberConfig{
		URL:           natsURL,
		Durable:       "points",
		AutoProvision: true,
	})
	if err != nil {
		log.Fatal(err)
	}
	defer sub.Close()

	drv, err := sqldriver.New(db, events.Schema)
	if err != nil {
		log.Fatal(err)
	}
	r, err := relay.New(drv, relay.Config{Publisher: pub})
	if err != nil {
		log.Fatal(err)
	}
	router, err := message.NewRouter(message.RouterConfig{}, watermill.NopLogger{})
	if err != nil {
		log.Fatal(err)
	}
	h := &points{handled: make(chan string, 8)}
	if err := events.RegisterPoints(router, sub, db, h, inbox.Config{PoisonPublisher: pub}); err != nil {
		log.Fatal(err)
	}
	go router.Run(ctx)
	<-router.Running()
	relayDone := make(chan error, 1)
	go func() { relayDone <- r.Run(ctx) }()

	// The business transaction.
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		log.Fatal(err)
	}
	defer tx.Rollback()
	id, err := events.InsertOrderPaid(ctx, tx, events.OrderPaid{OrderID: "o-1", AmountCents: 1299, Method: events.PaymentMethodCard})
	if err != nil {
		log.Fatal(err)
	}
	if err := tx.Commit(); err != nil {
		log.Fatal(err)
	}
	r.Notify() // publish now rather than at the next poll

	fmt.Println("handled ORDER_PAID", <-h.handled)

	// A re-send of the same event (a relay that lost its lease, say) is
	// dropped by the stream.
	if err := pub.Publish(events.OrderPaidTopic, message.NewMessage(id.String(), []byte(`{}`))); err != nil {
		log.Fatal(err)
	}
	js, err := pub.Conn().JetStream()
	if err != nil {
		log.Fatal(err)
	}
	stream, err := js.StreamInfo(natsjs.DefaultStreamName(events.OrderPaidTopic))
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("stream", stream.Config.Name, "holds", stream.State.Msgs, "message")
	durable, err := js.ConsumerInfo(stream.Config.Name, natsjs.DurableName("points", events.OrderPaidTopic))
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("durable", durable.Name)

	cancel()
	if err := <-relayDone; err != nil {
		log.Fatal(err)
	}
	router.Close()
	fmt.Println("handler calls:", h.calls)
	// Output:
	// handled ORDER_PAID o-1
	// stream OUTBOX_ORDERS_PAID holds 1 message
	// durable points_orders_paid
	// handler calls: 1
}

// points is consumer points' handler.
type points struct {
	mu      sync.Mutex
	calls   int
	handled chan string
}

func (p *points) HandleOrderPaid(ctx context.Context, tx *sql.Tx, e events.OrderPaid, m outbox.Meta) error {
	// ... credit the points through tx ...
	p.mu.Lock()
	p.calls++
	p.mu.Unlock()
	p.handled <- e.OrderID
	return nil
}

func (p *points) HandleOrderRefunded(ctx context.Context, tx *sql.Tx, e events.OrderRefunded, m outbox.Meta) error {
	return nil
}

// startJetStream starts a JetStream server in-process, for the example.
func startJetStream() (url string, stop func()) {
	dir, err := os.MkdirTemp("", "outboxgen-example-nats")
	if err != nil {
		log.Fatal(err)
	}
	s, err := server.NewServer(&server.Options{Host: "127.0.0.1", Port: -1, JetStream: true, StoreDir: dir, NoLog: true, NoSigs: true})
	if err != nil {
		log.Fatal(err)
	}
	go s.Start()
	if !s.ReadyForConnections(10 * time.Second) {
		log.Fatal("nats server not ready")
	}
	return s.ClientURL(), func() { s.Shutdown(); s.WaitForShutdown(); os.RemoveAll(dir) }
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
