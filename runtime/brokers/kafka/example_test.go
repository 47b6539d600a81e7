package kafka_test

import (
	"context"
	"database/sql"
	"fmt"
	"log"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/twmb/franz-go/pkg/kfake"
	_ "modernc.org/sqlite"

	"github.com/outboxgen/outboxgen/examples/orderpaid/events"
	"github.com/outboxgen/outboxgen/runtime/brokers/kafka"
	"github.com/outboxgen/outboxgen/runtime/driver/sqldriver"
	"github.com/outboxgen/outboxgen/runtime/inbox"
	"github.com/outboxgen/outboxgen/runtime/outbox"
	"github.com/outboxgen/outboxgen/runtime/relay"
	"github.com/outboxgen/outboxgen/templates"
)

// A service on Kafka, end to end: the writer commits ORDER_PAID with the
// business change, the relay publishes it through a kafka Publisher (an
// idempotent producer, records keyed by the event key, so each key stays
// in one partition and in order), and consumer points reads it in its own
// consumer group, deduplicated by the inbox table.
func Example() {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	db, done := openDB()
	defer done()
	// Your brokers, e.g. []string{"kafka-0:9092"}. Create the topics of
	// events.yaml (orders.paid, orders.refunded, ...) and the poison topics
	// (points.poison) as your cluster requires; here an in-process cluster
	// seeds them.
	brokers, stop := startCluster(events.OrderPaidTopic, events.OrderRefundedTopic, "points.poison")
	defer stop()
	if err := events.Bind(db); err != nil {
		log.Fatal(err)
	}

	// The relay's publisher.
	pub, err := kafka.NewPublisher(kafka.PublisherConfig{Brokers: brokers})
	if err != nil {
		log.Fatal(err)
	}
	defer pub.Close()

	// One subscriber per consumer, each with its own consumer group: two
	// consumers sharing a group would split the messages between them. The
	// subscriber joins the group once per topic (here orders.paid and
	// orders.refunded), and sarama waits Rebalance.Retry.Backoff (default
	// 2s) between attempts while the members join: shortened here.
	sc := sarama.NewConfig()
	sc.Consumer.Group.Rebalance.Retry.Backoff = 100 * time.Millisecond
	sub, err := kafka.NewSubscriber(kafka.SubscriberConfig{
		Brokers:       brokers,
		ConsumerGroup: "points",
		Sarama:        sc, // optional: TLS, SASL, ...
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
	_, err = events.InsertOrderPaid(ctx, tx, events.OrderPaid{OrderID: "o-1", AmountCents: 1299, Method: events.PaymentMethodCard})
	if err != nil {
		log.Fatal(err)
	}
	if err := tx.Commit(); err != nil {
		log.Fatal(err)
	}
	r.Notify() // publish now rather than at the next poll

	fmt.Println("handled ORDER_PAID", <-h.handled)

	cancel()
	if err := <-relayDone; err != nil {
		log.Fatal(err)
	}
	router.Close()
	fmt.Println("handler calls:", h.calls)
	// Output:
	// handled ORDER_PAID o-1
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

// startCluster starts a Kafka cluster in-process (kfake), for the example.
func startCluster(topics ...string) (brokers []string, stop func()) {
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(4, topics...))
	if err != nil {
		log.Fatal(err)
	}
	return c.ListenAddrs(), c.Close
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
