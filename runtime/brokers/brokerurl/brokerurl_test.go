package brokerurl_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/redis/go-redis/v9"
	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/outboxgen/outboxgen/internal/natstest"
	"github.com/outboxgen/outboxgen/runtime/brokers/brokerurl"
	"github.com/outboxgen/outboxgen/runtime/brokers/internal/brokertest"
	"github.com/outboxgen/outboxgen/runtime/relay"
)

// quiet discards the clients' logs.
var quiet = slog.New(slog.DiscardHandler)

// Environment variables naming the test servers scripts/testdb.sh starts.
const (
	redisEnv = "OUTBOXGEN_TEST_REDIS_URL"
	amqpEnv  = "OUTBOXGEN_TEST_AMQP_URL"
)

// serverURL returns the URL in env, or skips (fails under CI) when it is
// missing: the rule of internal/testdb for the database servers.
func serverURL(t testing.TB, env string) string {
	t.Helper()
	if u := os.Getenv(env); u != "" {
		return u
	}
	if os.Getenv("CI") != "" {
		t.Fatalf("%s is not set: run `eval \"$(scripts/testdb.sh start)\"` (or `make test`)", env)
	}
	t.Skipf("%s is not set, skipping: run `eval \"$(scripts/testdb.sh start)\"` (or `make test`)", env)
	return ""
}

func startNATS(t *testing.T) string {
	t.Helper()
	s := natstest.Start(t, func(o *server.Options) { o.ServerName = "brokerurl-test" })
	return fmt.Sprintf("nats://127.0.0.1:%d", s.Addr().(*net.TCPAddr).Port)
}

func startKafka(t *testing.T, topics ...string) string {
	t.Helper()
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(2, topics...))
	if err != nil {
		t.Fatalf("kfake: %v", err)
	}
	t.Cleanup(c.Close)
	return "kafka://" + strings.Join(c.ListenAddrs(), ",")
}

func randSuffix(t *testing.T) string {
	t.Helper()
	b := make([]byte, 4)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return hex.EncodeToString(b)
}

// closedPort returns a loopback address nothing listens on.
func closedPort(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	return addr
}

// testMessages returns messages as the relay publishes them: UUID =
// event id, the outbox metadata and a header; JSON and non-JSON payloads.
// The UUIDs are new on every call: JetStream drops a re-sent id.
func testMessages(n int) []*message.Message {
	var msgs []*message.Message
	for i := range n {
		id := watermill.NewUUID()
		payload := fmt.Sprintf(`{"order_id":"o-1","seq":%d}`, i)
		if i%2 == 1 {
			payload = fmt.Sprintf("plain text %d, not JSON", i)
		}
		m := message.NewMessage(id, []byte(payload))
		m.Metadata.Set(relay.MetadataType, "ORDER_PAID")
		m.Metadata.Set(relay.MetadataKey, "o-1")
		m.Metadata.Set(relay.MetadataPartitionKey, "o-1")
		m.Metadata.Set(relay.MetadataVersion, "1")
		m.Metadata.Set(relay.MetadataEventID, id)
		m.Metadata.Set(relay.MetadataSequence, fmt.Sprint(i+1))
		m.Metadata.Set("trace", fmt.Sprintf("trace-%d", i))
		msgs = append(msgs, m)
	}
	return msgs
}

// roundTrip subscribes to topic through OpenSubscriber, publishes
// through Open, and checks that every message arrives with its UUID,
// metadata and payload.
func roundTrip(t *testing.T, rawURL, topic string) {
	t.Helper()
	roundTrip2(t, rawURL, rawURL, topic)
}

// roundTrip2 is roundTrip with a publisher URL and a subscriber URL.
func roundTrip2(t *testing.T, pubURL, subURL, topic string) {
	t.Helper()
	rawURL := pubURL
	opt := brokerurl.Options{Logger: quiet}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	t0 := time.Now()
	sub, err := brokerurl.OpenSubscriber(ctx, subURL, "tests-"+randSuffix(t), opt)
	if err != nil {
		t.Fatalf("OpenSubscriber: %v", err)
	}
	defer func() {
		if err := sub.Close(); err != nil {
			t.Errorf("subscriber Close: %v", err)
		}
	}()
	ch, err := sub.Subscribe(ctx, topic)
	if err != nil {
		t.Fatalf("Subscribe(%q): %v", topic, err)
	}

	pub, err := brokerurl.Open(ctx, pubURL, opt)
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	defer func() {
		if err := pub.Close(); err != nil {
			t.Errorf("publisher Close: %v", err)
		}
	}()
	sent := testMessages(4)
	for _, m := range sent {
		if err := pub.Publish(topic, m); err != nil {
			t.Fatalf("Publish %s: %v", m.UUID, err)
		}
	}

	want := map[string]*message.Message{}
	for _, m := range sent {
		want[m.UUID] = m
	}
	for len(want) > 0 {
		select {
		case got, ok := <-ch:
			if !ok {
				t.Fatalf("subscription closed with %d messages missing", len(want))
			}
			got.Ack()
			w, ok := want[got.UUID]
			if !ok {
				t.Errorf("unexpected or duplicate message %q (payload %q)", got.UUID, got.Payload)
				continue
			}
			delete(want, got.UUID)
			if string(got.Payload) != string(w.Payload) {
				t.Errorf("message %s: payload %q, want %q", got.UUID, got.Payload, w.Payload)
			}
			for k, v := range w.Metadata {
				if got.Metadata.Get(k) != v {
					t.Errorf("message %s: metadata %s = %q, want %q (all: %v)", got.UUID, k, got.Metadata.Get(k), v, got.Metadata)
				}
			}
		case <-ctx.Done():
			t.Fatalf("timed out with %d of %d messages missing", len(want), len(sent))
		}
	}
	t.Logf("%s: %d messages round-tripped in %s", strings.SplitN(rawURL, ":", 2)[0], len(sent), time.Since(t0).Round(time.Millisecond))
}

func TestRoundTrip(t *testing.T) {
	t.Run("nats", func(t *testing.T) {
		t.Parallel()
		roundTrip(t, startNATS(t), "orders.paid")
	})
	t.Run("nats/one stream", func(t *testing.T) {
		t.Parallel()
		u := startNATS(t) + "?stream=ORDERS&duplicate_window=1m"
		roundTrip(t, u, "orders.paid")
		roundTrip(t, u, "orders.shipped")
		nc, err := nats.Connect(strings.Split(u, "?")[0])
		if err != nil {
			t.Fatal(err)
		}
		defer nc.Close()
		js, _ := nc.JetStream()
		info, err := js.StreamInfo("ORDERS")
		if err != nil {
			t.Fatalf("stream ORDERS: %v", err)
		}
		if got := strings.Join(info.Config.Subjects, ","); got != "orders.paid,orders.shipped" {
			t.Errorf("stream ORDERS subjects %q, want orders.paid,orders.shipped", got)
		}
		if info.Config.Duplicates != time.Minute || info.State.Msgs != 8 {
			t.Errorf("stream ORDERS: duplicate window %s, %d messages; want 1m0s, 8", info.Config.Duplicates, info.State.Msgs)
		}
	})
	t.Run("kafka", func(t *testing.T) {
		t.Parallel()
		roundTrip(t, startKafka(t, "orders.paid")+"?client_id=brokerurl-test", "orders.paid")
	})
	t.Run("redis", func(t *testing.T) {
		t.Parallel()
		roundTrip(t, serverURL(t, redisEnv), "orders.paid."+randSuffix(t))
	})
	t.Run("redis/maxlen", func(t *testing.T) {
		t.Parallel()
		u := serverURL(t, redisEnv)
		sep := "?"
		if strings.Contains(u, "?") {
			sep = "&"
		}
		roundTrip2(t, u+sep+"maxlen=1000", u+sep+"consumer=c1", "orders.paid."+randSuffix(t))
	})
	t.Run("amqp", func(t *testing.T) {
		t.Parallel()
		roundTrip(t, serverURL(t, amqpEnv), "orders.paid."+randSuffix(t))
	})
	t.Run("amqp/exchange", func(t *testing.T) {
		t.Parallel()
		u := serverURL(t, amqpEnv)
		sep := "?"
		if strings.Contains(u, "?") {
			sep = "&"
		}
		roundTrip(t, u+sep+"exchange=brokerurl-test-"+randSuffix(t)+"&durable=0&prefetch=4", "orders.paid")
	})
}

// TestBadURL: malformed URLs and parameters fail at once with an error
// that says what to write, without the password.
func TestBadURL(t *testing.T) {
	ctx := context.Background()
	const pw = "s3cr3t-pw"
	for _, tc := range []struct {
		url  string
		want string
	}{
		{"", "empty"},
		{"localhost:4222", "no scheme"},
		{"127.0.0.1:4222", "no scheme"},
		{"mqtt://u:" + pw + "@host:1883", `unknown scheme "mqtt"`},
		{"nats://u:" + pw + "@127.0.0.1:4222?stream=a.b", "stream name"},
		{"nats://127.0.0.1:4222?strem=X", "unknown parameter strem"},
		{"nats://127.0.0.1:4222?provision=maybe", "use 1 or 0"},
		{"nats://127.0.0.1:4222?publish_timeout=-1s", "positive duration"},
		{"nats://", "no host"},
		{"kafka://u:" + pw + "@127.0.0.1:9092", "no credentials"},
		{"kafka://127.0.0.1", "not host:port"},
		{"kafka://127.0.0.1:9092?version=banana", "Kafka version"},
		{"kafka://127.0.0.1:9092?from=newest", "for subscribers"},
		{"amqp://u:" + pw + "@127.0.0.1:5672/?exchange_type=headers", "topic, direct or fanout"},
		{"amqp://u:" + pw + "@127.0.0.1:5672/?queue=q", "for subscribers"},
		{"redis://:" + pw + "@127.0.0.1:6379/0?maxlen=-3", "whole number"},
		{"redis://:" + pw + "@127.0.0.1:6379/0?frobnicate=1", "unexpected option"},
		{"stdout:?x=1", "takes none"},
		{"stdout://host", "no address"},
	} {
		_, err := brokerurl.Open(ctx, tc.url, brokerurl.Options{})
		if err == nil {
			t.Errorf("Open(%q): no error", tc.url)
			continue
		}
		if !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Open(%q): %v\nwant it to mention %q", tc.url, err, tc.want)
		}
		if strings.Contains(err.Error(), pw) {
			t.Errorf("Open(%q): the error shows the password: %v", tc.url, err)
		}
	}

	for _, tc := range []struct {
		url, group, want string
	}{
		{"stdout:", "g", "only publishes"},
		{"nats://127.0.0.1:4222", "", "consumer group is empty"},
		{"redis://127.0.0.1:6379/0", "a b", "whitespace"},
		{"redis://127.0.0.1:6379/0?maxlen=5", "g", "for publishers"},
	} {
		_, err := brokerurl.OpenSubscriber(ctx, tc.url, tc.group, brokerurl.Options{})
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("OpenSubscriber(%q, %q): %v\nwant it to mention %q", tc.url, tc.group, err, tc.want)
		}
	}

	if _, err := brokerurl.Open(ctx, "stdout:", brokerurl.Options{Provision: 7}); err == nil || !strings.Contains(err.Error(), "Options.Provision") {
		t.Errorf("Open with Provision 7: %v", err)
	}
}

// TestUnreachable: a broker nobody answers for fails Open and
// OpenSubscriber within a few seconds, with one error naming the URL with
// its password masked.
func TestUnreachable(t *testing.T) {
	const pw = "pa55-w0rd-secret"
	addr := closedPort(t)
	for _, u := range []string{
		"nats://app:" + pw + "@" + addr,
		"nats://" + pw + "@" + addr, // a token
		"kafka://" + addr,
		"amqp://app:" + pw + "@" + addr + "/vhost",
		"redis://:" + pw + "@" + addr + "/0",
		"redis://app:" + pw + "@" + addr + "/0",
	} {
		t.Run(strings.SplitN(u, ":", 2)[0], func(t *testing.T) {
			t.Parallel()
			for _, sub := range []bool{false, true} {
				ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
				t0 := time.Now()
				var err error
				if sub {
					var s message.Subscriber
					s, err = brokerurl.OpenSubscriber(ctx, u, "g", brokerurl.Options{ConnectTimeout: 2 * time.Second, Logger: quiet})
					if err == nil {
						s.Close()
					}
				} else {
					var p message.Publisher
					p, err = brokerurl.Open(ctx, u, brokerurl.Options{ConnectTimeout: 2 * time.Second, Logger: quiet})
					if err == nil {
						p.Close()
					}
				}
				cancel()
				took := time.Since(t0)
				if err == nil {
					t.Fatalf("subscriber=%v: no error for %s", sub, u)
				}
				msg := err.Error()
				t.Logf("subscriber=%v: %s after %s", sub, msg, took.Round(time.Millisecond))
				if strings.Contains(msg, pw) {
					t.Errorf("subscriber=%v: the error shows the password: %s", sub, msg)
				}
				if !strings.Contains(msg, "connect to") || !strings.Contains(msg, addr) {
					t.Errorf("subscriber=%v: want an error saying it could not connect to %s: %s", sub, addr, msg)
				}
				if took > 10*time.Second {
					t.Errorf("subscriber=%v: took %s to fail", sub, took)
				}
			}
		})
	}
}

// TestCanceledContext: an already cancelled context fails at once.
func TestCanceledContext(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_, err := brokerurl.Open(ctx, "redis://:secretpw@127.0.0.1:1/0", brokerurl.Options{})
	if !errors.Is(err, context.Canceled) || strings.Contains(err.Error(), "secretpw") {
		t.Fatalf("Open with a cancelled context: %v", err)
	}
}

// TestNATSProvisionOff: with provision=0 no stream is created, so a
// publish to a subject no stream captures fails.
func TestNATSProvisionOff(t *testing.T) {
	u := startNATS(t)
	for _, tc := range []struct {
		url string
		opt brokerurl.Options
	}{
		{u + "?provision=0", brokerurl.Options{}},
		{u, brokerurl.Options{Provision: brokerurl.ProvisionOff}},
	} {
		pub, err := brokerurl.Open(context.Background(), tc.url, tc.opt)
		if err != nil {
			t.Fatal(err)
		}
		err = pub.Publish("orders.paid", testMessages(1)...)
		pub.Close()
		if !errors.Is(err, nats.ErrNoStreamResponse) {
			t.Errorf("%s %+v: publish without a stream: %v, want nats.ErrNoStreamResponse", tc.url, tc.opt, err)
		}
	}
}

func TestStdout(t *testing.T) {
	var b strings.Builder
	pub, err := brokerurl.Open(context.Background(), "stdout:", brokerurl.Options{Stdout: &b})
	if err != nil {
		t.Fatal(err)
	}
	msgs := testMessages(2)
	msgs[0].Payload = []byte("{\n  \"order_id\": \"o-1\"\n}")
	if err := pub.Publish("orders.paid", msgs...); err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSuffix(b.String(), "\n"), "\n")
	if len(lines) != 2 {
		t.Fatalf("%d lines, want 2:\n%s", len(lines), b.String())
	}
	for i, want := range []string{`"payload":{"order_id":"o-1"}`, `"payload":"plain text 1, not JSON"`} {
		if !strings.Contains(lines[i], want) || !strings.Contains(lines[i], `"uuid":"`+msgs[i].UUID+`"`) || !strings.Contains(lines[i], `"outbox_key":"o-1"`) {
			t.Errorf("line %d: %s\nwant uuid, metadata and %s", i, lines[i], want)
		}
	}
	if err := pub.Close(); err != nil {
		t.Fatal(err)
	}
	if err := pub.Publish("orders.paid", msgs...); err == nil {
		t.Error("Publish after Close: no error")
	}
}

func TestSchemes(t *testing.T) {
	got := strings.Join(brokerurl.Schemes(), ",")
	if got != "nats,kafka,amqp,amqps,redis,rediss,stdout" {
		t.Errorf("Schemes() = %s", got)
	}
}

// TestAMQPHeadersNotText: a message with headers that are not strings
// (RabbitMQ adds x-death when it dead-letters a message, x-delivery-count
// when a quorum queue delivers it again) is delivered, those headers as
// text; watermill-amqp's own marshaler failed it, which nacked it back to
// the queue for ever.
func TestAMQPHeadersNotText(t *testing.T) {
	u := serverURL(t, amqpEnv)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	exchange := "brokerurl-headers-" + randSuffix(t)
	sep := "?"
	if strings.Contains(u, "?") {
		sep = "&"
	}
	sub, err := brokerurl.OpenSubscriber(ctx, u+sep+"exchange="+exchange+"&durable=0", "tests-"+randSuffix(t), brokerurl.Options{Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Close()
	ch, err := sub.Subscribe(ctx, "orders.paid")
	if err != nil {
		t.Fatal(err)
	}
	amqpCh := amqpChannel(t, u)
	at := time.Date(2026, 12, 2, 10, 0, 0, 0, time.UTC)
	err = amqpCh.PublishWithContext(ctx, exchange, "orders.paid", false, false, amqp.Publishing{
		Body: []byte(`{"n":1}`),
		Headers: amqp.Table{
			"_watermill_message_uuid": "event-1",
			"x-delivery-count":        int64(3),
			"x-death":                 []any{amqp.Table{"count": int64(1), "reason": "rejected", "queue": "q"}},
			"x-first-death-time":      at,
			"trace":                   "t-1",
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	select {
	case m := <-ch:
		m.Ack()
		if m.UUID != "event-1" || string(m.Payload) != `{"n":1}` {
			t.Fatalf("got %q %q", m.UUID, m.Payload)
		}
		for k, want := range map[string]string{"x-delivery-count": "3", "trace": "t-1", "x-first-death-time": "2026-12-02T10:00:00Z"} {
			if got := m.Metadata.Get(k); got != want {
				t.Errorf("metadata %s = %q, want %q", k, got, want)
			}
		}
		if got := m.Metadata.Get("x-death"); !strings.Contains(got, `"reason":"rejected"`) {
			t.Errorf("metadata x-death = %q, want the table in JSON", got)
		}
	case <-ctx.Done():
		t.Fatal("the message with non-text headers was not delivered")
	}
}

// TestRedisUnreadableEntry: a stream entry no watermill publisher wrote is
// delivered flagged unreadable (a consumer's inbox poisons it), and the
// subscription reads on; watermill-redisstream's marshaller failed it,
// which ended the subscription, and the entry, still pending, ended the
// next one too.
func TestRedisUnreadableEntry(t *testing.T) {
	u := serverURL(t, redisEnv)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	topic := "orders.paid." + randSuffix(t)
	sub, err := brokerurl.OpenSubscriber(ctx, u, "tests-"+randSuffix(t), brokerurl.Options{Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Close()
	ch, err := sub.Subscribe(ctx, topic)
	if err != nil {
		t.Fatal(err)
	}
	opts, err := redis.ParseURL(u)
	if err != nil {
		t.Fatal(err)
	}
	rc := redis.NewClient(opts)
	defer rc.Close()
	if err := rc.XAdd(ctx, &redis.XAddArgs{Stream: topic, Values: map[string]any{"hand": "written", "payload": "x"}}).Err(); err != nil {
		t.Fatal(err)
	}
	pub, err := brokerurl.Open(ctx, u, brokerurl.Options{Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close()
	if err := pub.Publish(topic, message.NewMessage("event-after", []byte("y"))); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"", "event-after"} {
		select {
		case m, ok := <-ch:
			if !ok {
				t.Fatalf("the subscription ended before %q", want)
			}
			m.Ack()
			if m.UUID != want {
				t.Fatalf("got message %q, want %q", m.UUID, want)
			}
			if flag := m.Metadata.Get(brokerurl.MetadataUnreadable); (want == "") != (flag != "") {
				t.Fatalf("message %q: %s = %q", m.UUID, brokerurl.MetadataUnreadable, flag)
			}
		case <-ctx.Done():
			t.Fatalf("no message %q", want)
		}
	}
}

// TestCloseWhilePublishing: Close while Publish calls are under way
// waits for them, and later calls fail. watermill-amqp's and
// watermill-redisstream's unguarded closed flags let a Publish race Close
// (a data race; on AMQP a panic on its reused WaitGroup).
func TestCloseWhilePublishing(t *testing.T) {
	for _, env := range []string{amqpEnv, redisEnv} {
		t.Run(env, func(t *testing.T) {
			u := serverURL(t, env)
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			pub, err := brokerurl.Open(ctx, u, brokerurl.Options{Logger: quiet})
			if err != nil {
				t.Fatal(err)
			}
			topic := "orders.closing." + randSuffix(t)
			brokertest.CloseWhilePublishing(t, pub, topic, func(g, i int) *message.Message {
				return message.NewMessage(fmt.Sprintf("m-%d-%d", g, i), []byte("x"))
			})
		})
	}
}
