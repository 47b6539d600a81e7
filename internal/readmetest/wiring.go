// Package readmetest is the README's wiring snippets as compiled, tested
// code. Each region between a "README:begin <name>" and a "README:end"
// comment appears verbatim (dedented) in a ```go block of README.md;
// readme_test.go checks that, and runs the service the snippets build on
// SQLite, PostgreSQL and MariaDB with the custom table names of
// events.yaml here.
package readmetest

import (
	"context"
	"database/sql"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/outboxgen/outboxgen/internal/readmetest/events"
	"github.com/outboxgen/outboxgen/runtime/brokers/kafka"
	"github.com/outboxgen/outboxgen/runtime/brokers/natsjs"
	"github.com/outboxgen/outboxgen/runtime/driver/sqldriver"
	"github.com/outboxgen/outboxgen/runtime/inbox"
	"github.com/outboxgen/outboxgen/runtime/janitor"
	"github.com/outboxgen/outboxgen/runtime/monitor"
	"github.com/outboxgen/outboxgen/runtime/relay"
	"github.com/outboxgen/outboxgen/runtime/sweeper"
)

// Service is what the snippets build: every part wired from the generated
// package (events.Schema) and one database.
type Service struct {
	Relay   *relay.Relay
	Sweeper *sweeper.Sweeper
	Monitor *monitor.Monitor
	Janitor *janitor.Janitor
	Router  *message.Router
}

// Start wires the service: the package-level writer, the relay, sweeper,
// monitor and janitor, and consumer points, with h as its handler. pub
// and sub are the broker's (any watermill publisher and subscriber). It
// starts nothing: Run the relay and the router.
func Start(db *sql.DB, pub message.Publisher, sub message.Subscriber, h events.PointsHandler, logger watermill.LoggerAdapter) (*Service, error) {
	// README:begin bind
	// At start-up: the package-level InsertX functions write in db's
	// dialect, which must be one events.yaml lists.
	if err := events.Bind(db); err != nil {
		return nil, err
	}
	// README:end

	// README:begin relay
	drv, err := sqldriver.New(db, events.Schema) // or pgxdriver.New(pool, events.Schema)
	if err != nil {
		return nil, err
	}
	r, err := relay.New(drv, relay.Config{
		Publisher: pub, // any watermill message.Publisher
	})
	if err != nil {
		return nil, err
	}
	// README:end

	// README:begin ops
	s, err := sweeper.New(drv, sweeper.Config{Publisher: pub})
	if err != nil {
		return nil, err
	}
	m, err := monitor.New(drv, monitor.Config{})
	if err != nil {
		return nil, err
	}
	j, err := janitor.New(drv, janitor.Config{})
	if err != nil {
		return nil, err
	}
	// README:end

	// README:begin consumers
	router, err := message.NewRouter(message.RouterConfig{}, logger)
	if err != nil {
		return nil, err
	}
	err = events.RegisterPoints(router, sub, db, h, inbox.Config{PoisonPublisher: pub})
	if err != nil {
		return nil, err
	}
	// README:end
	return &Service{Relay: r, Sweeper: s, Monitor: m, Janitor: j, Router: router}, nil
}

// PayOrder marks an order paid and emits ORDER_PAID in one transaction.
func PayOrder(ctx context.Context, db *sql.DB, orderID string) error {
	// README:begin insert
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer tx.Rollback()
	// ... the business change, through tx ...
	_, err = events.InsertOrderPaid(ctx, tx, events.OrderPaid{OrderID: orderID, AmountCents: 1299, Method: events.PaymentMethodCard})
	if err != nil {
		return err
	}
	return tx.Commit()
	// README:end
}

// NATS returns the relay's publisher and consumer points' subscriber on the
// NATS JetStream server at natsURL.
func NATS(natsURL string) (*natsjs.Publisher, *natsjs.Subscriber, error) {
	// README:begin nats
	// The relay's publisher: AutoProvision creates a stream per topic
	// (OUTBOX_ORDERS_PAID capturing orders.paid) unless one captures it
	// already; Nats-Msg-Id is the event id, so the stream drops a re-send
	// of an event inside DuplicateWindow.
	pub, err := natsjs.NewPublisher(natsjs.Config{
		URL:             natsURL,
		AutoProvision:   true,
		DuplicateWindow: 2 * time.Minute,
	})
	if err != nil {
		return nil, nil, err
	}
	// One subscriber per consumer, each with its own durable JetStream
	// consumer per topic (points_orders_paid): a restart resumes after the
	// last acknowledged message.
	sub, err := natsjs.NewSubscriber(natsjs.SubscriberConfig{
		URL:           natsURL,
		Durable:       "points",
		AutoProvision: true,
	})
	if err != nil {
		pub.Close()
		return nil, nil, err
	}
	// README:end
	return pub, sub, nil
}

// Kafka returns the relay's publisher and consumer points' subscriber on
// the Kafka cluster of brokers.
func Kafka(brokers []string) (*kafka.Publisher, *kafka.Subscriber, error) {
	// README:begin kafka
	// The relay's publisher: an idempotent producer whose records are keyed
	// by the event key, so each key stays in one partition, in order.
	pub, err := kafka.NewPublisher(kafka.PublisherConfig{Brokers: brokers})
	if err != nil {
		return nil, nil, err
	}
	// One subscriber per consumer, each in its own consumer group.
	sub, err := kafka.NewSubscriber(kafka.SubscriberConfig{
		Brokers:       brokers,
		ConsumerGroup: "points",
	})
	if err != nil {
		pub.Close()
		return nil, nil, err
	}
	// README:end
	return pub, sub, nil
}
