package observetest

import (
	"context"
	"database/sql"
	"errors"
	"log/slog"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/redis/go-redis/v9"
	"github.com/twmb/franz-go/pkg/kfake"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"

	"github.com/outboxgen/outboxgen/internal/gentest/sqlevents"
	"github.com/outboxgen/outboxgen/internal/natstest"
	"github.com/outboxgen/outboxgen/internal/testdb"
	"github.com/outboxgen/outboxgen/runtime/brokers/brokerurl"
	"github.com/outboxgen/outboxgen/runtime/brokers/kafka"
	"github.com/outboxgen/outboxgen/runtime/brokers/natsjs"
	"github.com/outboxgen/outboxgen/runtime/inbox"
	"github.com/outboxgen/outboxgen/runtime/outbox"
	"github.com/outboxgen/outboxgen/templates"
)

// topics the sqlevents consumer "points" reads, and its poison topic.
var topics = []string{sqlevents.OrderPaidTopic, sqlevents.OrderStatusChangedTopic, "points.poison", sqlevents.PointsCreditedTopic}

// broker is a real broker: a publisher for the relay and the poison queue,
// and a subscriber factory for the consumer.
type broker struct {
	name   string
	system string // messaging.system
	pub    message.Publisher
	sub    func(t *testing.T) message.Subscriber
}

func startNATS(t *testing.T) broker {
	t.Helper()
	s := natstest.Start(t, func(o *server.Options) { o.ServerName = "outboxgen-observe" })
	url := s.ClientURL()
	pub, err := natsjs.NewPublisher(natsjs.Config{URL: url}) // streams for topics only: another subject fails
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pub.Close() })
	for _, tp := range topics {
		if err := pub.EnsureStream(tp); err != nil {
			t.Fatal(err)
		}
	}
	return broker{name: "nats", system: "nats", pub: pub, sub: func(t *testing.T) message.Subscriber {
		sub, err := natsjs.NewSubscriber(natsjs.SubscriberConfig{URL: url, Durable: "points", AutoProvision: true,
			AckWait: 5 * time.Second, CloseTimeout: 5 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { sub.Close() })
		return sub
	}}
}

func startKafka(t *testing.T) broker {
	t.Helper()
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(2, topics...))
	if err != nil {
		t.Fatalf("kfake: %v", err)
	}
	t.Cleanup(c.Close)
	brokers := c.ListenAddrs()
	pub, err := kafka.NewPublisher(kafka.PublisherConfig{Brokers: brokers})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pub.Close() })
	return broker{name: "kafka", system: "kafka", pub: pub, sub: func(t *testing.T) message.Subscriber {
		sub, err := kafka.NewSubscriber(kafka.SubscriberConfig{Brokers: brokers, ConsumerGroup: "points"})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { sub.Close() })
		return sub
	}}
}

// serverURL returns the URL in env (scripts/testdb.sh starts RabbitMQ and
// Redis), or skips the test when it is not set (fails under CI).
func serverURL(t *testing.T, env string) string {
	t.Helper()
	if u := os.Getenv(env); u != "" {
		return u
	}
	if os.Getenv("CI") != "" {
		t.Fatalf("%s is not set: run `eval \"$(scripts/testdb.sh start)\"`", env)
	}
	t.Skipf("%s is not set, skipping: run `eval \"$(scripts/testdb.sh start)\"`", env)
	return ""
}

// brokerURL opens the publisher and the subscribers of a broker URL
// (package brokerurl, as `outboxgen relay -broker` does).
func brokerURL(t *testing.T, name, system, url string) broker {
	t.Helper()
	ctx := context.Background()
	pub, err := brokerurl.Open(ctx, url, brokerurl.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pub.Close() })
	group := "points-" + strconv.FormatInt(time.Now().UnixNano(), 36)
	return broker{name: name, system: system, pub: pub, sub: func(t *testing.T) message.Subscriber {
		sub, err := brokerurl.OpenSubscriber(ctx, url, group, brokerurl.Options{})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { sub.Close() })
		return sub
	}}
}

// startAMQP uses the test RabbitMQ with an exchange of the test's own.
func startAMQP(t *testing.T) broker {
	url := serverURL(t, "OUTBOXGEN_TEST_AMQP_URL")
	sep := "?"
	if strings.Contains(url, "?") {
		sep = "&"
	}
	return brokerURL(t, "amqp", "rabbitmq", url+sep+"durable=0&exchange=observe-"+strconv.FormatInt(time.Now().UnixNano(), 36))
}

// startRedis uses the test Redis, its streams of the consumer's topics
// deleted first (the stream keys are the topics).
func startRedis(t *testing.T) broker {
	url := serverURL(t, "OUTBOXGEN_TEST_REDIS_URL")
	opts, err := redis.ParseURL(url)
	if err != nil {
		t.Fatal(err)
	}
	c := redis.NewClient(opts)
	defer c.Close()
	if err := c.Del(context.Background(), topics...).Err(); err != nil {
		t.Fatal(err)
	}
	return brokerURL(t, "redis", "redis", url)
}

// openDB returns a fresh PostgreSQL database with the outbox and inbox
// tables.
func openDB(t *testing.T) *sql.DB {
	t.Helper()
	db := testdb.Open(t, "postgres")
	testdb.ApplySchema(t, db, "postgres", templates.DefaultTables)
	return db
}

// Order ids the points handler treats specially.
const (
	orderRetry  = "order-retry"  // fails its first attempt
	orderPoison = "order-poison" // fails every attempt: poisoned
)

// points is the consumer's handler: it remembers the span of each call's
// ctx, fails as the order id says, and emits a follow-up event in the
// handler's transaction.
type points struct {
	w     sqlevents.Writer
	mu    sync.Mutex
	calls map[string][]trace.SpanContext // by order id
}

func (p *points) HandleOrderPaid(ctx context.Context, tx *sql.Tx, e sqlevents.OrderPaid, m outbox.Meta) error {
	p.mu.Lock()
	if p.calls == nil {
		p.calls = map[string][]trace.SpanContext{}
	}
	p.calls[e.OrderID] = append(p.calls[e.OrderID], trace.SpanContextFromContext(ctx))
	n := len(p.calls[e.OrderID])
	p.mu.Unlock()
	switch {
	case e.OrderID == orderPoison:
		return errors.New("points: the loyalty service refuses this order")
	case e.OrderID == orderRetry && n == 1:
		return errors.New("points: temporarily unavailable")
	}
	_, err := p.w.InsertPointsCredited(ctx, tx, sqlevents.PointsCredited{CustomerID: e.CustomerID, OrderID: e.OrderID, Points: e.AmountCents / 100})
	return err
}

func (p *points) HandleOrderStatusChanged(context.Context, *sql.Tx, sqlevents.OrderStatusChanged, outbox.Meta) error {
	return nil
}

// newPoints returns a points handler writing its follow-up events to db.
func newPoints(t *testing.T, db *sql.DB) *points {
	t.Helper()
	w, err := sqlevents.NewWriter(db)
	if err != nil {
		t.Fatal(err)
	}
	return &points{w: w}
}

func (p *points) spans(order string) []trace.SpanContext {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]trace.SpanContext(nil), p.calls[order]...)
}

// runConsumer registers the generated points consumer on a router and
// runs it until the test ends.
func runConsumer(t *testing.T, db *sql.DB, b broker, h *points, tp trace.TracerProvider, mp metric.MeterProvider) {
	t.Helper()
	r, err := message.NewRouter(message.RouterConfig{CloseTimeout: 5 * time.Second}, nil)
	if err != nil {
		t.Fatal(err)
	}
	err = sqlevents.RegisterPoints(r, b.sub(t), db, h, inbox.Config{
		PoisonPublisher:      b.pub,
		MaxAttempts:          2,
		RetryInitialInterval: 10 * time.Millisecond,
		TracerProvider:       tp,
		MeterProvider:        mp,
		Logger:               slog.New(slog.DiscardHandler),
	})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- r.Run(context.Background()) }()
	select {
	case <-r.Running():
	case err := <-done:
		t.Fatalf("router: %v", err)
	case <-time.After(30 * time.Second):
		t.Fatal("router not running after 30s")
	}
	t.Cleanup(func() {
		r.Close()
		if err := <-done; err != nil && !strings.Contains(err.Error(), "closed") {
			t.Errorf("router: %v", err)
		}
	})
}

// eventually polls cond every 20ms until it holds or 60s passed.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
