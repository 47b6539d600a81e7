package brokerurl_test

import (
	"context"
	"log/slog"
	"runtime"
	"strings"
	"testing"
	"time"

	wmamqp "github.com/ThreeDotsLabs/watermill-amqp/v3/pkg/amqp"
	"github.com/ThreeDotsLabs/watermill/message"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/outboxgen/outboxgen/internal/lagproxy"
	"github.com/outboxgen/outboxgen/internal/syncbuf"
	"github.com/outboxgen/outboxgen/runtime/brokers/brokerurl"
)

// amqpSub opens a subscriber of a new group on subURL, subscribes to
// topic, and publishes through a publisher of its own on pubURL. The
// group's queue is deleted when the test ends.
type amqpSub struct {
	sub   message.Subscriber
	msgs  <-chan *message.Message
	pub   message.Publisher
	topic string
	queue string
}

func newAMQPSub(t *testing.T, pubURL, subURL string, opt brokerurl.Options) *amqpSub {
	t.Helper()
	if opt.Logger == nil {
		opt.Logger = quiet
	}
	group := "tests-" + randSuffix(t)
	topic := "orders.sub." + randSuffix(t)
	sub, err := brokerurl.OpenSubscriber(context.Background(), subURL, group, opt)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sub.Close() })
	msgs, err := sub.Subscribe(context.Background(), topic)
	if err != nil {
		t.Fatal(err)
	}
	pub, err := brokerurl.Open(context.Background(), pubURL, brokerurl.Options{Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pub.Close() })
	s := &amqpSub{sub: sub, msgs: msgs, pub: pub, topic: topic, queue: group + "." + topic}
	t.Cleanup(func() {
		if conn, err := amqp.Dial(pubURL); err == nil {
			if ch, err := conn.Channel(); err == nil {
				ch.QueueDelete(s.queue, false, false, false) //nolint:errcheck // best effort
			}
			conn.Close()
		}
	})
	return s
}

// publish sends messages with the ids given, one call each.
func (s *amqpSub) publish(t *testing.T, ids ...string) {
	t.Helper()
	for _, id := range ids {
		if err := s.pub.Publish(s.topic, message.NewMessage(id, []byte(`{"id":"`+id+`"}`))); err != nil {
			t.Fatalf("publish %s: %v", id, err)
		}
	}
}

// next is the next message, or fails the test after d.
func (s *amqpSub) next(t *testing.T, d time.Duration) *message.Message {
	t.Helper()
	select {
	case m, ok := <-s.msgs:
		if !ok {
			t.Fatal("the subscription's channel closed")
		}
		if m.UUID == "" || !strings.Contains(string(m.Payload), m.UUID) {
			t.Fatalf("a message that was not published: uuid %q, payload %q, metadata %v", m.UUID, m.Payload, m.Metadata)
		}
		return m
	case <-time.After(d):
		t.Fatalf("no message within %s", d)
	}
	return nil
}

// receive acks messages until it has every id of want, failing on one
// it did not want (none is delivered twice: every one is acked).
func (s *amqpSub) receive(t *testing.T, d time.Duration, want ...string) {
	t.Helper()
	left := map[string]bool{}
	for _, id := range want {
		left[id] = true
	}
	deadline := time.Now().Add(d)
	for len(left) > 0 {
		m := s.next(t, time.Until(deadline))
		m.Ack()
		if !left[m.UUID] {
			t.Fatalf("message %s delivered, not wanted (waiting for %v)", m.UUID, left)
		}
		delete(left, m.UUID)
	}
}

// A subscriber whose connection is lost reconnects, declares its queue
// again and consumes on: the message its handler held is delivered again
// (flagged redelivered), and the messages published meanwhile arrive.
// The log says what happened, without the URL's password. Run with -race
// (watermill-amqp's subscriber swapped its connection unlocked).
func TestAMQPSubscriberReconnects(t *testing.T) {
	u := serverURL(t, amqpEnv)
	proxy, via := lagproxy.ForURL(t, u)
	var logs syncbuf.Buffer
	s := newAMQPSub(t, u, via, brokerurl.Options{Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	s.publish(t, "a1", "a2")
	s.receive(t, 10*time.Second, "a1", "a2")

	s.publish(t, "b1", "b2")
	held := s.next(t, 10*time.Second) // b1, its handler still at work
	proxy.Cut()
	s.publish(t, "c1", "c2", "c3")
	held.Ack() // too late: the channel is gone
	again := s.next(t, 30*time.Second)
	if again.UUID != held.UUID || again.Metadata.Get(wmamqp.MetadataRedeliveredKey) != "true" {
		t.Fatalf("after the reconnect: %s (redelivered %q), want %s again, flagged redelivered", again.UUID, again.Metadata.Get(wmamqp.MetadataRedeliveredKey), held.UUID)
	}
	again.Ack()
	s.receive(t, 10*time.Second, "b2", "c1", "c2", "c3")

	text := logs.String()
	for _, want := range []string{"AMQP connection lost", "AMQP subscription interrupted", "AMQP subscription resumed"} {
		if !strings.Contains(text, want) {
			t.Errorf("the log does not say %q:\n%s", want, text)
		}
	}
	if pass, ok := mustParse(t, u).User.Password(); ok && pass != "" && strings.Contains(text, pass) {
		t.Error("the log shows the URL's password")
	}
}

// A deleted queue (an operator's mistake, a policy) cancels the consumer:
// the subscriber declares and binds the queue again and consumes on.
// watermill-amqp's subscriber read the closed delivery channel in a loop,
// handing out empty messages.
func TestAMQPSubscriberQueueDeleted(t *testing.T) {
	u := serverURL(t, amqpEnv)
	s := newAMQPSub(t, u, u, brokerurl.Options{})
	s.publish(t, "a1")
	s.receive(t, 10*time.Second, "a1")
	ch := amqpChannel(t, u)
	if _, err := ch.QueueDelete(s.queue, false, false, false); err != nil {
		t.Fatal(err)
	}
	// Messages published before the queue is back go nowhere: publish
	// until one arrives.
	deadline := time.Now().Add(20 * time.Second)
	for i := 0; ; i++ {
		id := "r" + string(rune('a'+i%26)) + randSuffix(t)
		s.publish(t, id)
		select {
		case m, ok := <-s.msgs:
			if !ok {
				t.Fatal("the subscription's channel closed")
			}
			m.Ack()
			if m.UUID == "" || !strings.Contains(string(m.Payload), m.UUID) {
				t.Fatalf("a message that was not published: uuid %q, payload %q", m.UUID, m.Payload)
			}
			return
		case <-time.After(100 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatal("no message 20 s after the queue was deleted")
		}
	}
}

// Close and a cancelled Subscribe context end the subscription (its
// channel closes) and put the messages not acknowledged back in the
// queue, for the next subscriber of the group.
func TestAMQPSubscriberPutsBackUnacked(t *testing.T) {
	u := serverURL(t, amqpEnv)
	for _, how := range []string{"close", "context"} {
		t.Run(how, func(t *testing.T) {
			group := "tests-" + randSuffix(t)
			topic := "orders.back." + randSuffix(t)
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			sub, err := brokerurl.OpenSubscriber(ctx, u+"?prefetch=10", group, brokerurl.Options{Logger: quiet})
			if err != nil {
				t.Fatal(err)
			}
			defer sub.Close()
			msgs, err := sub.Subscribe(ctx, topic)
			if err != nil {
				t.Fatal(err)
			}
			s := &amqpSub{sub: sub, msgs: msgs, topic: topic}
			s.pub, err = brokerurl.Open(ctx, u, brokerurl.Options{Logger: quiet})
			if err != nil {
				t.Fatal(err)
			}
			defer s.pub.Close()
			s.publish(t, "m1", "m2", "m3")
			held := s.next(t, 10*time.Second)
			began := time.Now()
			if how == "close" {
				if err := sub.Close(); err != nil {
					t.Fatal(err)
				}
			} else {
				cancel()
			}
			select {
			case m, ok := <-msgs:
				if ok {
					t.Fatalf("message %s delivered after the end", m.UUID)
				}
			case <-time.After(5 * time.Second):
				t.Fatal("the channel is still open 5 s after the end")
			}
			if took := time.Since(began); took > 2*time.Second {
				t.Errorf("the subscription took %s to end", took.Round(time.Millisecond))
			}
			select {
			case <-held.Context().Done():
			default:
				t.Error("the held message's context is not done")
			}
			s2 := &amqpSub{topic: topic}
			next, err := brokerurl.OpenSubscriber(context.Background(), u, group, brokerurl.Options{Logger: quiet})
			if err != nil {
				t.Fatal(err)
			}
			defer next.Close()
			if s2.msgs, err = next.Subscribe(context.Background(), topic); err != nil {
				t.Fatal(err)
			}
			s2.receive(t, 10*time.Second, "m1", "m2", "m3")
		})
	}
}

// Close while the connection is down, its redial stuck in a handshake,
// returns at once, closes the subscription's channel and leaves no
// goroutine of the subscriber behind. Subscribe meanwhile waits for the
// connection for Options.ConnectTimeout, then fails.
func TestAMQPSubscriberCloseWhileReconnecting(t *testing.T) {
	u := serverURL(t, amqpEnv)
	proxy, via := lagproxy.ForURL(t, u)
	sub, err := brokerurl.OpenSubscriber(context.Background(), via, "tests-"+randSuffix(t), brokerurl.Options{Logger: quiet, ConnectTimeout: 500 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	msgs, err := sub.Subscribe(context.Background(), "orders.down."+randSuffix(t))
	if err != nil {
		t.Fatal(err)
	}
	proxy.SetLag(time.Hour)
	proxy.Cut()
	time.Sleep(300 * time.Millisecond) // past the first redial's pause: it is dialling
	began := time.Now()
	if _, err := sub.Subscribe(context.Background(), "orders.other"); err == nil || !strings.Contains(err.Error(), "reconnecting") {
		t.Errorf("Subscribe while the connection is down: %v, want an error that says it is reconnecting", err)
	}
	if took := time.Since(began); took > 2*time.Second {
		t.Errorf("Subscribe took %s to fail, with ConnectTimeout 500ms", took.Round(time.Millisecond))
	}
	began = time.Now()
	if err := sub.Close(); err != nil {
		t.Fatal(err)
	}
	if took := time.Since(began); took > time.Second {
		t.Errorf("Close took %s", took.Round(time.Millisecond))
	}
	if _, ok := <-msgs; ok {
		t.Error("a message after Close")
	}
	buf := make([]byte, 1<<20)
	if stacks := string(buf[:runtime.Stack(buf, true)]); strings.Contains(stacks, "brokerurl.(*amqp") {
		t.Errorf("a goroutine of the subscriber is left after Close:\n%s", stacks)
	}
	if _, err := sub.Subscribe(context.Background(), "orders.late"); err == nil || !strings.Contains(err.Error(), "subscriber closed") {
		t.Errorf("Subscribe after Close: %v, want an error that says the subscriber is closed", err)
	}
}
