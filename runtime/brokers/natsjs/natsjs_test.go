package natsjs_test

import (
	"context"
	"database/sql"
	"errors"
	"log/slog"
	"net"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"

	"github.com/outboxgen/outboxgen/internal/natstest"
	"github.com/outboxgen/outboxgen/runtime/brokers/internal/brokertest"
	"github.com/outboxgen/outboxgen/runtime/brokers/natsjs"
	"github.com/outboxgen/outboxgen/runtime/dialect"
	"github.com/outboxgen/outboxgen/runtime/relay"
)

// topic has dots: it is the subject "outbox.orders.paid" and the stream
// OUTBOX_OUTBOX_ORDERS_PAID.
const topic = "outbox.orders.paid"

var keys = []string{"order-a", "order-b", "order-c", "order-d"}

// startNATS starts an embedded JetStream server on port (-1: random) with
// its store in dir, stopped in t.Cleanup.
func startNATS(t testing.TB, port int, dir string) *server.Server {
	t.Helper()
	return natstest.Start(t, func(o *server.Options) {
		o.ServerName, o.Port, o.StoreDir = "outboxgen-test", port, dir
	})
}

func port(s *server.Server) int { return s.Addr().(*net.TCPAddr).Port }

func newPublisher(t testing.TB, url string, timeout time.Duration) *natsjs.Publisher {
	t.Helper()
	pub, err := natsjs.NewPublisher(natsjs.Config{
		URL:            url,
		AutoProvision:  true,
		PublishTimeout: timeout,
		NatsOptions:    []nats.Option{nats.ReconnectWait(50 * time.Millisecond)},
	})
	if err != nil {
		t.Fatalf("NewPublisher: %v", err)
	}
	t.Cleanup(func() { pub.Close() })
	return pub
}

// newSubscriber returns a subscriber of cfg, closed when the test ends.
func newSubscriber(t *testing.T, cfg natsjs.SubscriberConfig) *natsjs.Subscriber {
	t.Helper()
	sub, err := natsjs.NewSubscriber(cfg)
	if err != nil {
		t.Fatalf("NewSubscriber: %v", err)
	}
	t.Cleanup(func() { sub.Close() })
	return sub
}

// subscribe subscribes sub to topic, failing t if it cannot.
func subscribe(t *testing.T, sub *natsjs.Subscriber) <-chan *message.Message {
	t.Helper()
	msgs, err := sub.Subscribe(context.Background(), topic)
	if err != nil {
		t.Fatalf("Subscribe: %v", err)
	}
	return msgs
}

// consume subscribes to topic with a fresh subscriber and feeds a
// collector until the test ends.
func consume(t *testing.T, url, durable string) *brokertest.Collector {
	t.Helper()
	sub, err := natsjs.NewSubscriber(natsjs.SubscriberConfig{
		URL:           url,
		Durable:       durable,
		AutoProvision: true,
		AckWait:       5 * time.Second,
		CloseTimeout:  5 * time.Second,
		NatsOptions:   []nats.Option{nats.ReconnectWait(50 * time.Millisecond)},
	})
	if err != nil {
		t.Fatalf("NewSubscriber: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	msgs, err := sub.Subscribe(ctx, topic)
	if err != nil {
		cancel()
		t.Fatalf("Subscribe: %v", err)
	}
	c := brokertest.NewCollector()
	done := make(chan struct{})
	go func() {
		defer close(done)
		for m := range msgs {
			c.Add(brokertest.FromMessage(m))
			m.Ack()
		}
	}()
	t.Cleanup(func() {
		cancel()
		sub.Close()
		<-done
	})
	return c
}

func streamMsgs(t *testing.T, pub *natsjs.Publisher) uint64 {
	t.Helper()
	js, err := pub.Conn().JetStream()
	if err != nil {
		t.Fatal(err)
	}
	info, err := js.StreamInfo(natsjs.DefaultStreamName(topic))
	if err != nil {
		t.Fatalf("stream info: %v", err)
	}
	return info.State.Msgs
}

// TestRelayToJetStream: events committed on each database, published by
// two relays through natsjs into an embedded JetStream server, all arrive
// intact and in per-key order; relay re-sends are dropped by the stream.
func TestRelayToJetStream(t *testing.T) {
	brokertest.ForEachDialect(t, nil, func(t *testing.T, db *sql.DB, d dialect.Dialect) {
		srv := startNATS(t, -1, t.TempDir())
		url := srv.ClientURL()
		pub := newPublisher(t, url, 2*time.Second)
		w := brokertest.NewWriter(db, d, topic, keys...)
		w.Write(t, 5) // a backlog before the relays start
		rs := brokertest.StartRelays(t, db, d, 2, pub, relay.Config{})
		w.Write(t, 5) // and events committed while they run
		rs.Notify()

		all := w.All()
		n := len(all)
		got := consume(t, url, "e2e")
		got.WaitUnique(t, n, 30*time.Second)
		brokertest.WaitSent(t, db, n, 10*time.Second)
		if dups := brokertest.Check(t, all, got.Got()); dups > 0 {
			t.Logf("%d duplicate deliveries (allowed: at-least-once)", dups)
		}
		if m := streamMsgs(t, pub); m != uint64(n) {
			t.Fatalf("stream holds %d messages, want %d", m, n)
		}

		// Relay re-sends: make every row pending again, as a lost lease
		// or a lost acknowledgement would; the relays publish them all a
		// second time and JetStream drops every one as a duplicate.
		if _, err := db.Exec("UPDATE " + brokertest.Table + " SET status = 0, sent_at = NULL"); err != nil {
			t.Fatal(err)
		}
		rs.Notify()
		brokertest.WaitSent(t, db, n, 10*time.Second)
		if m := streamMsgs(t, pub); m != uint64(n) {
			t.Fatalf("after re-publishing all %d events the stream holds %d messages: de-duplication by event id failed", n, m)
		}
		// The same through the publisher directly, and a control: a new
		// id is stored.
		dup := message.NewMessage(all[0].EventID, []byte(`{}`))
		dup.Metadata.Set(relay.MetadataKey, all[0].Key)
		if err := pub.Publish(topic, dup); err != nil {
			t.Fatalf("re-publish: %v", err)
		}
		if m := streamMsgs(t, pub); m != uint64(n) {
			t.Fatalf("re-publishing event %s grew the stream to %d", all[0].EventID, m)
		}
		if err := pub.Publish(topic, message.NewMessage("control-new-id", []byte(`{}`))); err != nil {
			t.Fatalf("publish control: %v", err)
		}
		if m := streamMsgs(t, pub); m != uint64(n)+1 {
			t.Fatalf("a new id left the stream at %d messages, want %d", m, n+1)
		}
	})
}

// TestBrokerOutage: the NATS server stops; events written meanwhile fail
// to publish, each relay's circuit breaker opens, and from then on the
// relays probe without charging an attempt to any row; the server restarts
// on the same port and store; every event arrives, in per-key order, once
// in the stream.
func TestBrokerOutage(t *testing.T) {
	brokertest.ForEachDialect(t, nil, func(t *testing.T, db *sql.DB, d dialect.Dialect) {
		dir := t.TempDir()
		srv := startNATS(t, -1, dir)
		p := port(srv)
		url := srv.ClientURL()
		pub := newPublisher(t, url, 500*time.Millisecond)
		counting := &countingPublisher{Publisher: pub}
		w := brokertest.NewWriter(db, d, topic, keys...)
		const relays = 2
		breakers := brokertest.NewBreakers()
		breakerMin := 50 * time.Millisecond
		rs := brokertest.StartRelays(t, db, d, relays, counting, relay.Config{
			Backoff:        relay.ExponentialBackoff(50*time.Millisecond, 400*time.Millisecond, 0.2),
			BreakerBackoff: relay.ExponentialBackoff(breakerMin, 400*time.Millisecond, 0.2),
			MaxAttempts:    1000, // never FAILED during the outage
			Logger:         slog.New(breakers),
		})
		w.Write(t, 3)
		rs.Notify()
		brokertest.WaitSent(t, db, len(w.All()), 10*time.Second)

		srv.Shutdown()
		srv.WaitForShutdown()
		down := time.Now()
		w.Write(t, 3) // written while the broker is down
		rs.Notify()
		// A relay's breaker opens when a batch of its fails across keys.
		// Until then a batch holding one key only is charged (a lone
		// failing key is no outage): how many attempts that is depends
		// on how the relays' claims fell. Once a breaker is open, its
		// relay charges nothing until a publish succeeds.
		brokertest.Eventually(t, 15*time.Second, "both relays' circuit breakers open", func() bool {
			return breakers.Open() == relays
		})
		charged, failed := brokertest.SumRetryCount(t, db), counting.failures.Load()
		const window = 1500 * time.Millisecond // stay down: the relays probe
		time.Sleep(window)
		if n := brokertest.SumRetryCount(t, db); n != charged {
			t.Fatalf("%d attempts charged to rows while both circuit breakers were open (%d before they were): the outage was charged to the rows", n-charged, charged)
		}
		probes := counting.failures.Load() - failed
		if probes == 0 {
			t.Fatalf("no publish in %s with both circuit breakers open: the relays do not probe", window)
		}
		// Breaker pause honoured, no hot loop: a relay probes at most
		// once per BreakerBackoff (at least 40ms with its jitter); the
		// batches under way when it opened fail once more at most.
		if most := int64(relays) * (int64(window/(breakerMin*8/10)) + 1 + 8); probes > most {
			t.Fatalf("%d failed publishes in %s with both circuit breakers open (at most %d expected): the relays do not back off", probes, window, most)
		}
		if n := breakers.Closed(); n != 0 {
			t.Fatalf("a circuit breaker closed %d times while the broker was down", n)
		}
		t.Logf("broker down %s: %d failed publishes, %d attempts charged before both breakers were open (max retry_count %d), %d uncharged failed probes after",
			time.Since(down).Round(time.Millisecond), counting.failures.Load(), charged, brokertest.MaxRetryCount(t, db), probes)
		if n := brokertest.CountStatus(t, db, 2); n != 0 {
			t.Fatalf("%d rows FAILED during the outage", n)
		}
		if sent, total := brokertest.CountStatus(t, db, 1), len(w.All()); sent == total {
			t.Fatalf("all %d rows sent while the broker was down", total)
		}

		startNATS(t, p, dir)
		w.Write(t, 2) // and after it is back
		rs.Notify()
		all := w.All()
		brokertest.WaitSent(t, db, len(all), 30*time.Second)

		got := consume(t, url, "") // ephemeral: reads the stream from the start
		got.WaitUnique(t, len(all), 20*time.Second)
		brokertest.Check(t, all, got.Got())
		if m := streamMsgs(t, pub); m != uint64(len(all)) {
			t.Fatalf("stream holds %d messages, want %d", m, len(all))
		}
	})
}

func TestValidateTopic(t *testing.T) {
	for _, ok := range []string{"orders", "orders.paid", "a.b-c.d_e", "ORDERS.Paid"} {
		if err := natsjs.ValidateTopic(ok); err != nil {
			t.Errorf("ValidateTopic(%q): %v", ok, err)
		}
	}
	for _, bad := range []string{"", ".orders", "orders.", "orders..paid", "orders.*", "orders.>", "orders paid", "orders\tpaid"} {
		if err := natsjs.ValidateTopic(bad); err == nil {
			t.Errorf("ValidateTopic(%q) = nil, want an error", bad)
		}
	}
	if got := natsjs.DefaultStreamName("outbox.orders-paid"); got != "OUTBOX_OUTBOX_ORDERS-PAID" {
		t.Errorf("DefaultStreamName = %q", got)
	}
	if got := natsjs.DurableName("billing", "orders.paid"); got != "billing_orders_paid" {
		t.Errorf("DurableName = %q", got)
	}
}

func TestConfigValidate(t *testing.T) {
	err := natsjs.Config{PublishTimeout: -1}.Validate()
	if err == nil {
		t.Fatal("Validate of a zero Config = nil")
	}
	for _, want := range []string{"URL", "PublishTimeout", "DuplicateWindow"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("Validate error %q does not mention %s", err, want)
		}
	}
	if err := (natsjs.SubscriberConfig{URL: "nats://x", SubscribersCount: 2, AckWait: 1, DuplicateWindow: 1, CloseTimeout: 1}).Validate(); err == nil || !strings.Contains(err.Error(), "QueueGroup") {
		t.Errorf("SubscribersCount 2 without QueueGroup: %v", err)
	}
	if err := (natsjs.SubscriberConfig{URL: "nats://x", QueueGroup: "g", SubscribersCount: 1, AckWait: 1, DuplicateWindow: 1, CloseTimeout: 1, StreamName: natsjs.DefaultStreamName}).Validate(); err == nil || !strings.Contains(err.Error(), "without Durable") {
		t.Errorf("QueueGroup without Durable: %v", err)
	}
}

// TestPublishInvalidTopic: an invalid subject fails before the server,
// so the relay records a clear error.
func TestPublishInvalidTopic(t *testing.T) {
	srv := startNATS(t, -1, t.TempDir())
	pub := newPublisher(t, srv.ClientURL(), time.Second)
	err := pub.Publish("orders.*", message.NewMessage("x", nil))
	if err == nil || !strings.Contains(err.Error(), "wildcard") {
		t.Fatalf("Publish to a wildcard subject: %v", err)
	}
	// Without provisioning, a subject no stream captures fails.
	pub2, err := natsjs.NewPublisher(natsjs.Config{URL: srv.ClientURL(), PublishTimeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer pub2.Close()
	if err := pub2.Publish("nobody.listens", message.NewMessage("y", nil)); !errors.Is(err, nats.ErrNoStreamResponse) {
		t.Fatalf("publish without a stream: %v, want nats.ErrNoStreamResponse", err)
	}
}

// countingPublisher counts failed publishes.
type countingPublisher struct {
	*natsjs.Publisher
	failures atomic.Int64
}

func (p *countingPublisher) Publish(topic string, msgs ...*message.Message) error {
	err := p.Publisher.Publish(topic, msgs...)
	if err != nil {
		p.failures.Add(1)
	}
	return err
}

// TestReprovision: with AutoProvision, a stream deleted behind the
// publisher's back is created again on the next publish.
func TestReprovision(t *testing.T) {
	srv := startNATS(t, -1, t.TempDir())
	pub := newPublisher(t, srv.ClientURL(), time.Second)
	if err := pub.Publish(topic, message.NewMessage("a", nil)); err != nil {
		t.Fatal(err)
	}
	js, err := pub.Conn().JetStream()
	if err != nil {
		t.Fatal(err)
	}
	if err := js.DeleteStream(natsjs.DefaultStreamName(topic)); err != nil {
		t.Fatal(err)
	}
	if err := pub.Publish(topic, message.NewMessage("b", nil)); err != nil {
		t.Fatalf("publish after the stream was deleted: %v", err)
	}
	if m := streamMsgs(t, pub); m != 1 {
		t.Fatalf("re-created stream holds %d messages, want 1", m)
	}
}

// TestSubscriptionEndsWhileDelivering ends subscriptions while JetStream
// is delivering to them, by their context and by Close, many times over:
// the output channel is closed only after the callbacks under way
// returned (watermill-nats v2.1.3 closed it before, and a callback's send
// on it then panicked: the race detector reported it in about one run in
// ten of this test), and the messages the consumer did not acknowledge are
// delivered again to the next subscriber of the durable consumer, and
// only those: every message is acknowledged in the end, none twice. (With
// watermill-nats, nats.go deleted the durable consumer it had created when
// the subscription ended, and every subscriber started over at the
// beginning of the stream.)
func TestSubscriptionEndsWhileDelivering(t *testing.T) {
	s := startNATS(t, -1, t.TempDir())
	url := s.ClientURL()
	const total = 1000
	pub := newPublisher(t, url, 5*time.Second)
	for i := range total {
		m := message.NewMessage(strconv.Itoa(i), []byte("x"))
		if err := pub.Publish(topic, m); err != nil {
			t.Fatal(err)
		}
	}
	acked := map[string]bool{}
	for round := 0; len(acked) < total; round++ {
		if round == 200 {
			t.Fatalf("%d of %d messages acknowledged after %d subscriptions", len(acked), total, round)
		}
		sub, err := natsjs.NewSubscriber(natsjs.SubscriberConfig{URL: url, Durable: "ends", AckWait: 300 * time.Millisecond, CloseTimeout: 5 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		msgs, err := sub.Subscribe(ctx, topic)
		if err != nil {
			t.Fatal(err)
		}
		// Stop after a few messages, while the rest keep arriving: by the
		// context in even rounds, by Close in odd ones. The messages
		// received from then on are not acknowledged.
		const stopAt = 25
		n := 0
		stop := func() {
			if round%2 == 0 {
				cancel()
			} else {
				go sub.Close() //nolint:errcheck // checked below
			}
		}
		for m := range msgs {
			if acked[m.UUID] {
				t.Fatalf("round %d: message %s delivered again after its ack", round, m.UUID)
			}
			if n++; n < stopAt {
				acked[m.UUID] = true
				m.Ack()
			}
			if n == stopAt || len(acked) == total {
				stop()
			}
		}
		cancel()
		if err := sub.Close(); err != nil {
			t.Fatalf("round %d: Close: %v", round, err)
		}
	}
}

// TestDurableConsumerKept: a durable consumer outlives its subscribers: the
// next one resumes after the last acknowledged message, waits for the one
// before it to end (a rolling deploy starts the new process first), and
// brings the consumer's AckWait to its own; ConfigureConsumer shapes the
// consumer the first subscriber creates.
func TestDurableConsumerKept(t *testing.T) {
	s := startNATS(t, -1, t.TempDir())
	url := s.ClientURL()
	pub := newPublisher(t, url, 5*time.Second)
	for i := range 10 {
		if err := pub.Publish(topic, message.NewMessage(strconv.Itoa(i), []byte("x"))); err != nil {
			t.Fatal(err)
		}
	}
	open := func(ackWait time.Duration) *natsjs.Subscriber {
		return newSubscriber(t, natsjs.SubscriberConfig{URL: url, Durable: "kept", AckWait: ackWait,
			ConfigureConsumer: func(_ string, cfg *nats.ConsumerConfig) { cfg.MaxAckPending = 50 }})
	}
	first := open(time.Second)
	msgs, err := first.Subscribe(context.Background(), topic)
	if err != nil {
		t.Fatal(err)
	}
	for i := range 4 {
		m := <-msgs
		if m.UUID != strconv.Itoa(i) {
			t.Fatalf("first subscriber got %s, want %d", m.UUID, i)
		}
		m.Ack()
	}
	info := func() *nats.ConsumerInfo {
		js, err := pub.Conn().JetStream()
		if err != nil {
			t.Fatal(err)
		}
		ci, err := js.ConsumerInfo(natsjs.DefaultStreamName(topic), natsjs.DurableName("kept", topic))
		if err != nil {
			t.Fatal(err)
		}
		return ci
	}
	// The acks are confirmed before the next message is handed over.
	time.Sleep(100 * time.Millisecond)
	if ci := info(); ci.Config.MaxAckPending != 50 || ci.Config.AckWait != time.Second || ci.AckFloor.Consumer != 4 {
		t.Fatalf("consumer: MaxAckPending %d, AckWait %s, ack floor %d; want 50, 1s, 4", ci.Config.MaxAckPending, ci.Config.AckWait, ci.AckFloor.Consumer)
	}

	second := open(2 * time.Second)
	got := subscribeAsync(second)
	select {
	case r := <-got:
		t.Fatalf("the second subscriber subscribed while the first was bound (err %v)", r.err)
	case <-time.After(500 * time.Millisecond):
	}
	if err := first.Close(); err != nil {
		t.Fatal(err)
	}
	r := <-got
	if r.err != nil {
		t.Fatalf("second Subscribe: %v", r.err)
	}
	// The messages JetStream had pushed to the first subscriber and nobody
	// acknowledged come again after the first's AckWait.
	for i := 4; i < 10; i++ {
		m := <-r.msgs
		if m.UUID != strconv.Itoa(i) {
			t.Fatalf("second subscriber got %s, want %d: it resumes after the last ack", m.UUID, i)
		}
		m.Ack()
	}
	if ci := info(); ci.Config.AckWait != 2*time.Second || ci.Config.MaxAckPending != 50 {
		t.Fatalf("consumer after the second subscriber: AckWait %s, MaxAckPending %d; want 2s (its own), 50 (kept)", ci.Config.AckWait, ci.Config.MaxAckPending)
	}
}

// TestDurableConsumerRecreated: a durable consumer that goes away under
// its subscribers is created again on the deliver subject they listen
// on. It goes away when an operator deletes it, and when a subscriber of
// an older release that created it through nats.go stops: a new
// subscriber waiting for that one to let go creates it at once.
func TestDurableConsumerRecreated(t *testing.T) {
	s := startNATS(t, -1, t.TempDir())
	url := s.ClientURL()
	pub := newPublisher(t, url, 5*time.Second)
	publish := func(id string) {
		t.Helper()
		if err := pub.Publish(topic, message.NewMessage(id, []byte("x"))); err != nil {
			t.Fatal(err)
		}
	}
	publish("before")
	js, err := pub.Conn().JetStream()
	if err != nil {
		t.Fatal(err)
	}
	stream, name := natsjs.DefaultStreamName(topic), natsjs.DurableName("again", topic)
	// waitFor reads msgs until a message with UUID id, acking each.
	waitFor := func(t *testing.T, msgs <-chan *message.Message, id string, within time.Duration) {
		t.Helper()
		deadline := time.After(within)
		for {
			select {
			case m, ok := <-msgs:
				if !ok {
					t.Fatalf("the subscription ended before %s", id)
				}
				m.Ack()
				if m.UUID == id {
					return
				}
			case <-deadline:
				t.Fatalf("no message %s within %s", id, within)
			}
		}
	}

	t.Run("older release stops", func(t *testing.T) {
		osub := olderRelease(t, url, "", name)
		sub := newSubscriber(t, natsjs.SubscriberConfig{URL: url, Durable: "again"})
		got := subscribeAsync(sub)
		time.Sleep(300 * time.Millisecond)
		if err := osub.Unsubscribe(); err != nil { // deletes the consumer
			t.Fatal(err)
		}
		r := <-got
		if r.err != nil {
			t.Fatalf("Subscribe once the older subscriber stopped: %v", r.err)
		}
		publish("after-old")
		waitFor(t, r.msgs, "after-old", 10*time.Second)
	})

	t.Run("created again elsewhere", func(t *testing.T) {
		// Queue members: an older release owns the consumer; a new
		// member binds to it; the old one stops and deletes it; a second
		// new member creates it again, on its own deliver subject, and
		// stops too. The first must follow the consumer, not stay bound
		// to a subject nobody delivers to.
		osub := olderRelease(t, url, "workers", natsjs.DurableName("group", topic))
		// A message the consumer pushes to the second member's subject
		// as it leaves comes again after AckWait: keep that short.
		cfg := natsjs.SubscriberConfig{URL: url, Durable: "group", QueueGroup: "workers", AckWait: 2 * time.Second}
		msgs := subscribe(t, newSubscriber(t, cfg))
		if err := osub.Unsubscribe(); err != nil { // deletes the consumer
			t.Fatal(err)
		}
		second := newSubscriber(t, cfg)
		subscribe(t, second)
		if err := second.Close(); err != nil {
			t.Fatal(err)
		}
		publish("after-second")
		// Within the 5 s check.
		waitFor(t, msgs, "after-second", 15*time.Second)
	})

	t.Run("deleted by an operator", func(t *testing.T) {
		msgs := subscribe(t, newSubscriber(t, natsjs.SubscriberConfig{URL: url, Durable: "again"}))
		publish("bound")
		waitFor(t, msgs, "bound", 10*time.Second)
		if err := js.DeleteConsumer(stream, name); err != nil {
			t.Fatal(err)
		}
		publish("after-delete")
		// Within the 5 s check, from the beginning of the stream.
		waitFor(t, msgs, "after-delete", 15*time.Second)
		if _, err := js.ConsumerInfo(stream, name); err != nil {
			t.Fatalf("the consumer was not created again: %v", err)
		}
	})
}

// TestDurableConsumerGroupMismatch: a durable consumer that delivers to a
// queue group cannot be bound without it: Subscribe says so at once
// instead of waiting for it to be free.
func TestDurableConsumerGroupMismatch(t *testing.T) {
	s := startNATS(t, -1, t.TempDir())
	url := s.ClientURL()
	newPublisher(t, url, 5*time.Second)
	subscribe(t, newSubscriber(t, natsjs.SubscriberConfig{URL: url, Durable: "mix", QueueGroup: "workers", AutoProvision: true}))
	alone := newSubscriber(t, natsjs.SubscriberConfig{URL: url, Durable: "mix"})
	start := time.Now()
	_, err := alone.Subscribe(context.Background(), topic)
	if err == nil || !strings.Contains(err.Error(), `queue group "workers"`) || time.Since(start) > 5*time.Second {
		t.Fatalf("Subscribe without the consumer's queue group: %v after %s; want a prompt error naming the group", err, time.Since(start))
	}
}

// subscribed is the outcome of a Subscribe call.
type subscribed struct {
	msgs <-chan *message.Message
	err  error
}

// subscribeAsync subscribes sub to topic on a goroutine (Subscribe may
// wait for the consumer), and delivers the outcome on the channel.
func subscribeAsync(sub *natsjs.Subscriber) <-chan subscribed {
	got := make(chan subscribed, 1)
	go func() {
		m, err := sub.Subscribe(context.Background(), topic)
		got <- subscribed{m, err}
	}()
	return got
}

// olderRelease subscribes to topic as the subscriber of an older release
// did, on a connection of its own closed when the test ends: nats.go
// creates the durable consumer and owns it, so Unsubscribe deletes it.
func olderRelease(t *testing.T, url, queue, durable string) *nats.Subscription {
	t.Helper()
	old, err := nats.Connect(url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(old.Close)
	js, err := old.JetStream()
	if err != nil {
		t.Fatal(err)
	}
	sub, err := js.QueueSubscribe(topic, queue, func(m *nats.Msg) { _ = m.Ack() },
		nats.Durable(durable), nats.ManualAck(), nats.DeliverAll(), nats.AckExplicit())
	if err != nil {
		t.Fatal(err)
	}
	return sub
}

// TestRepeatedHeaderDelivered: a message another NATS client wrote with a
// header of several values is delivered, the values joined, and its ack
// settles it. watermill-nats's unmarshaler rejected it and the message
// was left unacknowledged: redelivered after every AckWait, for good.
func TestRepeatedHeaderDelivered(t *testing.T) {
	s := startNATS(t, -1, t.TempDir())
	pub := newPublisher(t, s.ClientURL(), 5*time.Second)
	if err := pub.Publish(topic, message.NewMessage("first", []byte("x"))); err != nil {
		t.Fatal(err) // provisions the stream
	}
	js, err := pub.Conn().JetStream()
	if err != nil {
		t.Fatal(err)
	}
	raw := nats.NewMsg(topic)
	raw.Data = []byte("hand written")
	raw.Header.Set("_watermill_message_uuid", "repeated")
	raw.Header.Add("x-trace", "a")
	raw.Header.Add("x-trace", "b")
	if _, err := js.PublishMsg(raw); err != nil {
		t.Fatal(err)
	}
	const ackWait = 300 * time.Millisecond
	sub := newSubscriber(t, natsjs.SubscriberConfig{URL: s.ClientURL(), Durable: "repeated", AutoProvision: true, AckWait: ackWait, CloseTimeout: 5 * time.Second})
	msgs := subscribe(t, sub)
	for _, want := range []string{"first", "repeated"} {
		select {
		case m := <-msgs:
			if m.UUID != want {
				t.Fatalf("got message %q, want %q", m.UUID, want)
			}
			if want == "repeated" && (m.Metadata.Get("x-trace") != "a, b" || string(m.Payload) != "hand written") {
				t.Fatalf("repeated header read as %q, payload %q", m.Metadata.Get("x-trace"), m.Payload)
			}
			m.Ack()
		case <-time.After(10 * time.Second):
			t.Fatalf("message %q not delivered", want)
		}
	}
	// Settled: nothing comes back after several AckWaits.
	select {
	case m := <-msgs:
		t.Fatalf("message %q delivered again after its ack", m.UUID)
	case <-time.After(5 * ackWait):
	}
}

// TestSubscriptionEndPutsBack: a subscription that ends (by its context,
// or by Close) gives JetStream back the message its consumer held
// unacknowledged and those it had read ahead (500 here), so that the next
// subscriber of the durable consumer gets them a second later
// (giveBackDelay), not after AckWait (30 s here), also when it subscribes
// only after that second: a rolling deploy does not delay them. (Before,
// "got 0 of 500 messages within 10s"; unsubscribing instead of draining,
// or giving back without the delay, lost some hundreds to AckWait.)
func TestSubscriptionEndPutsBack(t *testing.T) {
	for _, by := range []string{"context", "Close", "Close, next later"} {
		t.Run(by, func(t *testing.T) {
			s := startNATS(t, -1, t.TempDir())
			url := s.ClientURL()
			pub := newPublisher(t, url, 5*time.Second)
			const total = 500
			for i := range total {
				if err := pub.Publish(topic, message.NewMessage(strconv.Itoa(i), []byte("x"))); err != nil {
					t.Fatal(err)
				}
			}
			cfg := natsjs.SubscriberConfig{URL: url, Durable: "back", AckWait: 30 * time.Second, CloseTimeout: 5 * time.Second}
			first, err := natsjs.NewSubscriber(cfg)
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			msgs, err := first.Subscribe(ctx, topic)
			if err != nil {
				t.Fatal(err)
			}
			held := <-msgs // not acknowledged; the rest are read ahead
			// Once JetStream has sent them all (and a moment for them to
			// arrive): what it is still sending as the subscription ends
			// reaches nobody, and comes again after AckWait.
			js, err := pub.Conn().JetStream()
			if err != nil {
				t.Fatal(err)
			}
			for sent := 0; sent < total; {
				ci, err := js.ConsumerInfo(natsjs.DefaultStreamName(topic), natsjs.DurableName("back", topic))
				if err != nil {
					t.Fatal(err)
				}
				sent = ci.NumAckPending
				time.Sleep(10 * time.Millisecond)
			}
			time.Sleep(100 * time.Millisecond)
			closed := make(chan error, 1)
			if by == "context" {
				cancel()
			} else {
				go func() { closed <- first.Close() }()
			}
			for range msgs { // ends once the subscription has ended
			}
			if by == "context" {
				closed <- first.Close()
			}
			if err := <-closed; err != nil {
				t.Fatal(err)
			}
			if by == "Close, next later" {
				time.Sleep(3 * time.Second) // no subscriber when JetStream redelivers
			}
			next := newSubscriber(t, cfg)
			got := map[string]bool{}
			deadline := time.After(10 * time.Second)
			for in := subscribe(t, next); len(got) < total; {
				select {
				case m := <-in:
					got[m.UUID] = true
					m.Ack()
				case <-deadline:
					t.Fatalf("the next subscriber got %d of %d messages within 10s (held: %s, got it: %v): the ended subscription did not give them back, and JetStream redelivers after AckWait (30s)", len(got), total, held.UUID, got[held.UUID])
				}
			}
		})
	}
}

func publishN(t *testing.T, pub *natsjs.Publisher, n int) {
	t.Helper()
	for i := range n {
		if err := pub.Publish(topic, message.NewMessage(strconv.Itoa(i), []byte("x"))); err != nil {
			t.Fatal(err)
		}
	}
}

// TestSubscriptionEndDuringOutage: Close while the broker is down returns
// at once and closes the connection: nothing is drained (found by review,
// helper-98: the drain waited for a flush that could not be sent, Close
// ran past a CloseTimeout of 1 s and left the connection reconnecting).
func TestSubscriptionEndDuringOutage(t *testing.T) {
	srv := startNATS(t, -1, t.TempDir())
	url := srv.ClientURL()
	pub := newPublisher(t, url, 5*time.Second)
	publishN(t, pub, 10)
	sub, err := natsjs.NewSubscriber(natsjs.SubscriberConfig{URL: url, Durable: "out", CloseTimeout: time.Second,
		NatsOptions: []nats.Option{nats.ReconnectWait(50 * time.Millisecond)}})
	if err != nil {
		t.Fatal(err)
	}
	msgs, err := sub.Subscribe(context.Background(), topic)
	if err != nil {
		t.Fatal(err)
	}
	<-msgs
	srv.Shutdown()
	srv.WaitForShutdown()
	for !sub.Conn().IsReconnecting() {
		time.Sleep(10 * time.Millisecond)
	}
	start := time.Now()
	// nats.go closes a reconnecting connection it is asked to drain, and
	// says so.
	if err := sub.Close(); err != nil && !errors.Is(err, nats.ErrConnectionReconnecting) {
		t.Errorf("Close, after %s: %v", time.Since(start), err)
	}

	deadline := time.Now().Add(2 * time.Second)
	for !sub.Conn().IsClosed() && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if !sub.Conn().IsClosed() {
		sub.Conn().Close()
		t.Errorf("connection left open (reconnecting forever) after Close")
	}
}

// TestSubscriptionEndWhileReconnecting: a subscription that ends while its
// connection (one with a reconnect buffer, as nats.Connect's defaults)
// is reconnecting lets go of its durable consumer once the server is
// back (found by review, helper-98: drained, it was subscribed again on
// reconnect and held the consumer, push-bound, for good).
func TestSubscriptionEndWhileReconnecting(t *testing.T) {
	dir := t.TempDir()
	srv := startNATS(t, -1, dir)
	p := port(srv)
	url := srv.ClientURL()
	pub := newPublisher(t, url, 5*time.Second)
	publishN(t, pub, 5)
	nc, err := nats.Connect(url, nats.MaxReconnects(-1), nats.ReconnectWait(50*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	sub := newSubscriber(t, natsjs.SubscriberConfig{Conn: nc, Durable: "z"})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	msgs, err := sub.Subscribe(ctx, topic)
	if err != nil {
		t.Fatal(err)
	}
	<-msgs
	srv.Shutdown()
	srv.WaitForShutdown()
	for !nc.IsReconnecting() {
		time.Sleep(10 * time.Millisecond)
	}
	cancel()
	time.Sleep(300 * time.Millisecond)
	startNATS(t, p, dir)
	start := time.Now()
	for range msgs {
	}
	t.Logf("subscription ended %s after restart", time.Since(start))
	other, err := nats.Connect(url)
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	js, _ := other.JetStream()
	time.Sleep(2 * time.Second)
	ci, err := js.ConsumerInfo(natsjs.DefaultStreamName(topic), natsjs.DurableName("z", topic))
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("2s after the subscription ended: PushBound=%v NumAckPending=%d", ci.PushBound, ci.NumAckPending)
	if ci.PushBound {
		// Another subscriber cannot take the consumer.
		s2 := newSubscriber(t, natsjs.SubscriberConfig{URL: url, Durable: "z"})
		c2, cancel2 := context.WithTimeout(context.Background(), 3*time.Second)
		defer cancel2()
		_, err := s2.Subscribe(c2, topic)
		t.Errorf("consumer still push-bound by the ended subscription (zombie interest); another Subscribe: %v", err)
	}
}

// TestEphemeralConsumerDeletedByClose: an ephemeral consumer (no Durable)
// is gone when Close returns (found by review, helper-98: drained, its
// deletion came after Close had returned).
func TestEphemeralConsumerDeletedByClose(t *testing.T) {
	srv := startNATS(t, -1, t.TempDir())
	url := srv.ClientURL()
	pub := newPublisher(t, url, 5*time.Second)
	publishN(t, pub, 50)
	other, err := nats.Connect(url)
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	js, _ := other.JetStream()
	for i := range 5 {
		sub, err := natsjs.NewSubscriber(natsjs.SubscriberConfig{URL: url})
		if err != nil {
			t.Fatal(err)
		}
		msgs, err := sub.Subscribe(context.Background(), topic)
		if err != nil {
			t.Fatal(err)
		}
		<-msgs
		time.Sleep(50 * time.Millisecond)
		if err := sub.Close(); err != nil {
			t.Fatalf("Close: %v", err)
		}
		n := 0
		for range js.ConsumerNames(natsjs.DefaultStreamName(topic)) {
			n++
		}
		if n != 0 {
			t.Errorf("run %d: %d consumers right after Close, want 0", i, n)
		}
	}
}
