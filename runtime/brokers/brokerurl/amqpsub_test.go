package brokerurl_test

import (
	"context"
	"io"
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
	// "context, lag": the subscriber's calls reach the broker 200 ms late
	// as the subscription ends.
	for _, how := range []string{"close", "context", "context, lag"} {
		t.Run(how, func(t *testing.T) {
			group := "tests-" + randSuffix(t)
			topic := "orders.back." + randSuffix(t)
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			proxy, via := lagproxy.ForURL(t, u)
			sub, err := brokerurl.OpenSubscriber(ctx, via+"?prefetch=10", group, brokerurl.Options{Logger: quiet})
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
				if how == "context, lag" {
					proxy.SetLag(200 * time.Millisecond)
				}
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
			// Back in the queue by the time the channel closed: a
			// subscriber that follows gets them first.
			if q, err := amqpChannel(t, u).QueueDeclarePassive(group+"."+topic, true, false, false, false, nil); err != nil {
				t.Fatal(err)
			} else if q.Messages != 3 {
				t.Errorf("%d messages ready in the queue as the subscription's channel closed, want all 3 back", q.Messages)
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

// A broker that stops answering (TCP still up) does not hold Close: the
// subscriber's, with a subscription, and the publisher's, with a kept
// channel, return within about a second (amqpCloseWait), and say the
// broker did not answer. (Found by review: amqp091-go's close waits for
// the broker's answer until the heartbeats time out, 30 s.)
func TestAMQPCloseBrokerSilent(t *testing.T) {
	u := serverURL(t, amqpEnv)
	closeWithin := func(t *testing.T, c io.Closer) {
		t.Helper()
		began := time.Now()
		err := c.Close()
		if took := time.Since(began); took > 2*time.Second {
			t.Errorf("Close took %s with a broker that does not answer", took.Round(time.Millisecond))
		}
		if err == nil || !strings.Contains(err.Error(), "did not answer") {
			t.Errorf("Close: %v, want an error that says the broker did not answer", err)
		}
	}
	t.Run("subscriber", func(t *testing.T) {
		proxy, via := lagproxy.ForURL(t, u)
		s := newAMQPSub(t, u, via, brokerurl.Options{})
		s.publish(t, "a1")
		s.receive(t, 10*time.Second, "a1")
		proxy.SetLag(time.Hour)
		closeWithin(t, s.sub)
	})
	t.Run("publisher", func(t *testing.T) {
		proxy, via := lagproxy.ForURL(t, u)
		pub, err := brokerurl.Open(context.Background(), via, brokerurl.Options{Logger: quiet})
		if err != nil {
			t.Fatal(err)
		}
		if err := pub.Publish("orders.silent."+randSuffix(t), ids(1, "a")...); err != nil {
			t.Fatal(err)
		}
		proxy.SetLag(time.Hour)
		closeWithin(t, pub)
	})
}

// With a broker that stops answering, Subscribe returns within its
// context, or within ConnectTimeout: its declarations wait for the
// broker's answers. (Found by review: they waited 30 s.)
func TestAMQPSubscribeBrokerSilent(t *testing.T) {
	u := serverURL(t, amqpEnv)
	for _, tc := range []struct {
		name    string
		timeout time.Duration // of Subscribe's context; 0: none
		want    string
	}{
		{"context", time.Second, "context deadline exceeded"},
		{"connect timeout", 0, "did not answer within 1s"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			proxy, via := lagproxy.ForURL(t, u)
			sub, err := brokerurl.OpenSubscriber(context.Background(), via, "tests-"+randSuffix(t), brokerurl.Options{Logger: quiet, ConnectTimeout: map[bool]time.Duration{true: time.Second, false: 20 * time.Second}[tc.timeout == 0]})
			if err != nil {
				t.Fatal(err)
			}
			defer sub.Close()
			proxy.SetLag(time.Hour)
			ctx := context.Background()
			if tc.timeout > 0 {
				var cancel context.CancelFunc
				ctx, cancel = context.WithTimeout(ctx, tc.timeout)
				defer cancel()
			}
			began := time.Now()
			_, err = sub.Subscribe(ctx, "orders.silent."+randSuffix(t))
			if took := time.Since(began); took > 3*time.Second {
				t.Errorf("Subscribe took %s", took.Round(time.Millisecond))
			}
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("Subscribe: %v, want an error with %q", err, tc.want)
			}
		})
	}
}

// Close while a subscription subscribes again (its queue was deleted)
// on a broker that stopped answering returns within about a second: the
// connection is closed before the subscriptions are waited for. (Found
// by review.)
func TestAMQPSubscriberCloseWhileResubscribing(t *testing.T) {
	u := serverURL(t, amqpEnv)
	proxy, via := lagproxy.ForURL(t, u)
	s := newAMQPSub(t, u, via, brokerurl.Options{})
	s.publish(t, "a1")
	s.receive(t, 10*time.Second, "a1")
	ch := amqpChannel(t, u)
	proxy.SetLag(time.Hour) // what the subscriber sends from now on is held
	if _, err := ch.QueueDelete(s.queue, false, false, false); err != nil {
		t.Fatal(err)
	}
	time.Sleep(500 * time.Millisecond) // the cancel arrives: the subscription closes its channel, or declares
	began := time.Now()
	s.sub.Close() //nolint:errcheck // the broker does not answer
	if took := time.Since(began); took > 2*time.Second {
		t.Errorf("Close took %s", took.Round(time.Millisecond))
	}
}

// The queue deleted and declared again with other arguments (declaring it
// as the subscriber does fails, PRECONDITION_FAILED): the subscription
// tries again with a growing pause, and resumes once the queue is fixed.
func TestAMQPSubscriberRedeclareConflict(t *testing.T) {
	u := serverURL(t, amqpEnv)
	var logs syncbuf.Buffer
	s := newAMQPSub(t, u, u, brokerurl.Options{Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	s.publish(t, "a1")
	s.receive(t, 10*time.Second, "a1")
	ch := amqpChannel(t, u)
	if _, err := ch.QueueDelete(s.queue, false, false, false); err != nil {
		t.Fatal(err)
	}
	if _, err := ch.QueueDeclare(s.queue, false, false, false, false, nil); err != nil { // not durable
		t.Fatal(err)
	}
	time.Sleep(2 * time.Second)
	if fails := strings.Count(logs.String(), "AMQP subscribing again failed"); fails == 0 || fails > 10 {
		t.Errorf("%d failed attempts in 2 s, want a few (a growing pause from 100 ms)", fails)
	}
	if _, err := ch.QueueDelete(s.queue, false, false, false); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(40 * time.Second)
	for {
		s.publish(t, "r"+randSuffix(t))
		select {
		case m, ok := <-s.msgs:
			if !ok {
				t.Fatal("the subscription's channel closed")
			}
			m.Ack()
			return
		case <-time.After(200 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatalf("not resumed 40 s after the queue was fixed:\n%s", logs.String())
		}
	}
}

// A subscription whose context ends while it subscribes again (its queue
// was deleted) on a broker that stopped answering ends at once: its
// channel closes, without waiting for the broker. (Found by review: it
// waited for the heartbeats to time out.)
func TestAMQPSubscriptionEndsWhileResubscribing(t *testing.T) {
	u := serverURL(t, amqpEnv)
	proxy, via := lagproxy.ForURL(t, u)
	group, topic := "tests-"+randSuffix(t), "orders.resub."+randSuffix(t)
	sub, err := brokerurl.OpenSubscriber(context.Background(), via, group, brokerurl.Options{Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Close()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	msgs, err := sub.Subscribe(ctx, topic)
	if err != nil {
		t.Fatal(err)
	}
	ch := amqpChannel(t, u)
	proxy.SetLag(time.Hour)
	if _, err := ch.QueueDelete(group+"."+topic, false, false, false); err != nil {
		t.Fatal(err)
	}
	time.Sleep(500 * time.Millisecond) // the cancel arrives: the subscription declares again, unanswered
	began := time.Now()
	cancel()
	select {
	case _, ok := <-msgs:
		if ok {
			t.Fatal("a message after the end")
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the subscription's channel is still open 5 s after its context ended")
	}
	if took := time.Since(began); took > time.Second {
		t.Errorf("the subscription took %s to end", took.Round(time.Millisecond))
	}
}

// TestAMQPSubscriberResubscribesOnSlowBroker: a broker that answers, but
// takes longer than ConnectTimeout for the calls of a subscription (six
// round trips of 300 ms here, against 1 s), gets the subscription back
// after an interruption: each attempt that runs out doubles the next
// one's bound. (Found by review: each attempt was given up at
// ConnectTimeout, its late consumer closed, and the next begun from
// scratch, so none ever finished.)
func TestAMQPSubscriberResubscribesOnSlowBroker(t *testing.T) {
	u := serverURL(t, amqpEnv)
	proxy, via := lagproxy.ForURL(t, u)
	var logs syncbuf.Buffer
	s := newAMQPSub(t, u, via, brokerurl.Options{Logger: slog.New(slog.NewTextHandler(&logs, nil)), ConnectTimeout: time.Second})
	s.publish(t, "a1")
	s.receive(t, 10*time.Second, "a1")
	proxy.SetLag(300 * time.Millisecond)
	if _, err := amqpChannel(t, u).QueueDelete(s.queue, false, false, false); err != nil {
		t.Fatal(err)
	}
	// Published once the queue is consumed again (bound before): before
	// that, it would go nowhere.
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		if q, err := amqpChannel(t, u).QueueDeclarePassive(s.queue, true, false, false, false, nil); err == nil && q.Consumers > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the queue was not consumed again within 20 s; log:\n%s", logs.String())
		}
	}
	s.publish(t, "b1")
	if m := s.next(t, 20*time.Second); m.UUID != "b1" {
		t.Fatalf("got %s, want b1", m.UUID)
	} else {
		m.Ack()
	}
	if !strings.Contains(logs.String(), "the broker did not answer within 1s") {
		t.Errorf("no attempt ran out at ConnectTimeout (1 s), though the broker took about 1.8 s:\n%s", logs.String())
	}
	if n := strings.Count(logs.String(), "subscribing again failed"); n > 2 {
		t.Errorf("%d attempts to subscribe again failed, want at most 2 (1 s, then 2 s, then 4 s):\n%s", n, logs.String())
	}
}
