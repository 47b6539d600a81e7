package brokerurl_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/url"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/outboxgen/outboxgen/internal/lagproxy"
	"github.com/outboxgen/outboxgen/internal/syncbuf"
	"github.com/outboxgen/outboxgen/runtime/brokers/brokerurl"
)

// amqpChannel is a channel on a connection of the test's own to the
// broker at u, closed when the test ends.
func amqpChannel(t *testing.T, u string) *amqp.Channel {
	t.Helper()
	conn, err := amqp.Dial(u)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	return ch
}

// amqpQueue declares an exclusive queue bound to the outbox exchange
// with topic as routing key, with args, on a connection of its own.
func amqpQueue(t *testing.T, u, topic string, args amqp.Table) (*amqp.Channel, string) {
	t.Helper()
	ch := amqpChannel(t, u)
	if err := ch.ExchangeDeclare(brokerurl.DefaultAMQPExchange, "topic", true, false, false, false, nil); err != nil {
		t.Fatal(err)
	}
	q, err := ch.QueueDeclare("", false, true, true, false, args)
	if err != nil {
		t.Fatal(err)
	}
	if err := ch.QueueBind(q.Name, topic, brokerurl.DefaultAMQPExchange, false, nil); err != nil {
		t.Fatal(err)
	}
	return ch, q.Name
}

// queued reads the ids (message ids) of everything in queue, in order.
func queued(t *testing.T, ch *amqp.Channel, queue string) []string {
	t.Helper()
	var ids []string
	for {
		d, ok, err := ch.Get(queue, true)
		if err != nil {
			t.Fatal(err)
		}
		if !ok {
			return ids
		}
		ids = append(ids, d.MessageId)
	}
}

func ids(n int, prefix string) []*message.Message {
	out := make([]*message.Message, n)
	for i := range out {
		out[i] = message.NewMessage(fmt.Sprintf("%s-%02d", prefix, i), []byte(`{"n":1}`))
	}
	return out
}

// A call's messages, all sent before their confirms are awaited, arrive
// in the call's order. A message the broker refuses (its queue is full,
// x-overflow reject-publish) fails the call, naming it; the messages
// before it were queued; the next call works (on another channel).
func TestAMQPPublishCall(t *testing.T) {
	u := serverURL(t, amqpEnv)
	ctx := context.Background()
	pub, err := brokerurl.Open(ctx, u, brokerurl.Options{Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close()

	topic := "orders.call." + randSuffix(t)
	ch, q := amqpQueue(t, u, topic, nil)
	call := ids(50, "m")
	if err := pub.Publish(topic, call...); err != nil {
		t.Fatal(err)
	}
	var want []string
	for _, m := range call {
		want = append(want, m.UUID)
	}
	if got := queued(t, ch, q); strings.Join(got, ",") != strings.Join(want, ",") {
		t.Fatalf("queued %v, want %v", got, want)
	}

	full := "orders.full." + randSuffix(t)
	ch, q = amqpQueue(t, u, full, amqp.Table{"x-max-length": int32(2), "x-overflow": "reject-publish"})
	err = pub.Publish(full, ids(3, "f")...)
	if err == nil || !strings.Contains(err.Error(), "f-02") {
		t.Fatalf("call overflowing a reject-publish queue of 2: %v, want a refusal naming f-02", err)
	}
	if got := queued(t, ch, q); strings.Join(got, ",") != "f-00,f-01" {
		t.Fatalf("queued %v, want [f-00 f-01]", got)
	}
	if err := pub.Publish(full, ids(2, "g")...); err != nil {
		t.Fatalf("the call after a refused one: %v", err)
	}
	if got := queued(t, ch, q); strings.Join(got, ",") != "g-00,g-01" {
		t.Fatalf("queued %v, want [g-00 g-01]", got)
	}
}

// A message's context that ends stops the wait for confirms.
func TestAMQPPublishWaitEndsWithContext(t *testing.T) {
	u := serverURL(t, amqpEnv)
	proxy, via := lagproxy.ForURL(t, u)
	pub, err := brokerurl.Open(context.Background(), via, brokerurl.Options{Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close()
	topic := "orders.ctx." + randSuffix(t)
	if err := pub.Publish(topic, ids(1, "warm")...); err != nil { // the exchange is declared, a channel kept
		t.Fatal(err)
	}
	proxy.SetLag(2 * time.Second) // the wait ends long before; Close waits it out
	call := ids(2, "c")
	ctx, cancel := context.WithCancel(context.Background())
	call[1].SetContext(ctx)
	time.AfterFunc(100*time.Millisecond, cancel)
	if err := pub.Publish(topic, call...); err == nil || !strings.Contains(err.Error(), "context canceled") {
		t.Fatalf("call whose second message's context was cancelled: %v, want context canceled", err)
	}
}

// The publisher reconnects when its connection is cut (a broker restart,
// a lost network): calls under way and calls made while it is down fail,
// none hangs, and calls work again on the new connection, with every
// message of a call that succeeded queued. Calls run concurrently with
// the reconnect, for the race detector. The log says what happened,
// without the URL's password.
func TestAMQPPublishReconnects(t *testing.T) {
	u := serverURL(t, amqpEnv)
	proxy, via := lagproxy.ForURL(t, u)
	var logs syncbuf.Buffer
	pub, err := brokerurl.Open(context.Background(), via, brokerurl.Options{Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close()
	topic := "orders.reconnect." + randSuffix(t)
	ch, q := amqpQueue(t, u, topic, nil)
	calls := func(prefix string) (ok []string, failed int) {
		var wg sync.WaitGroup
		var mu sync.Mutex
		for i := range 8 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				defer cancel()
				msgs := ids(3, fmt.Sprintf("%s%d", prefix, i))
				for _, m := range msgs {
					m.SetContext(ctx)
				}
				err := pub.Publish(topic, msgs...)
				mu.Lock()
				defer mu.Unlock()
				if err != nil {
					failed++
					return
				}
				for _, m := range msgs {
					ok = append(ok, m.UUID)
				}
			}()
		}
		wg.Wait()
		return ok, failed
	}
	if _, failed := calls("a"); failed > 0 { // channels are kept
		t.Fatalf("%d of 8 calls failed before the cut", failed)
	}
	queued(t, ch, q)
	proxy.Cut()
	deadline := time.Now().Add(30 * time.Second)
	var sent []string
	for round := 0; ; round++ {
		ok, failed := calls(fmt.Sprintf("r%d-", round))
		if failed == 0 {
			sent = ok
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("calls still fail 30 s after the cut (%d of 8 in the last round)", failed)
		}
		time.Sleep(50 * time.Millisecond)
	}
	got := map[string]bool{}
	for _, id := range queued(t, ch, q) {
		got[id] = true
	}
	for _, id := range sent {
		if !got[id] {
			t.Fatalf("message %s of a call that succeeded after the reconnect is not queued", id)
		}
	}
	text := logs.String()
	if !strings.Contains(text, "AMQP connection lost") || !strings.Contains(text, "AMQP connection restored") {
		t.Errorf("the log does not say the connection was lost and restored:\n%s", text)
	}
	if pass, ok := mustParse(t, u).User.Password(); ok && pass != "" && strings.Contains(text, pass) {
		t.Error("the log shows the URL's password")
	}
}

// Close while the publisher reconnects returns at once and ends the
// reconnecting; later calls fail.
func TestAMQPCloseWhileReconnecting(t *testing.T) {
	u := serverURL(t, amqpEnv)
	proxy, via := lagproxy.ForURL(t, u)
	pub, err := brokerurl.Open(context.Background(), via, brokerurl.Options{Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	topic := "orders.close." + randSuffix(t)
	if err := pub.Publish(topic, ids(1, "a")...); err != nil {
		t.Fatal(err)
	}
	proxy.Cut()
	time.Sleep(20 * time.Millisecond) // the loss is seen; the first redial waits 100 ms
	done := make(chan error, 1)
	go func() { done <- pub.Close() }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Close: %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Close did not return while the publisher reconnects")
	}
	if err := pub.Publish(topic, ids(1, "b")...); err == nil {
		t.Fatal("a call after Close succeeded")
	}
}

func mustParse(t *testing.T, raw string) *url.URL {
	t.Helper()
	u, err := url.Parse(raw)
	if err != nil {
		t.Fatal(err)
	}
	return u
}

// Close while a redial is in its handshake (the broker accepts the TCP
// connection and does not answer) ends the dial at once, and leaves no
// goroutine of the connection behind. (Found by review: Close waited for
// the handshake's timeout.)
func TestAMQPCloseDuringDial(t *testing.T) {
	u := serverURL(t, amqpEnv)
	proxy, via := lagproxy.ForURL(t, u)
	pub, err := brokerurl.Open(context.Background(), via, brokerurl.Options{Logger: quiet, ConnectTimeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if err := pub.Publish("orders.dial."+randSuffix(t), ids(1, "a")...); err != nil {
		t.Fatal(err)
	}
	proxy.SetLag(time.Hour) // the next connection's handshake gets no answer
	proxy.Cut()
	time.Sleep(300 * time.Millisecond) // past the first redial's pause (100 ms): it is dialling
	began := time.Now()
	if err := pub.Close(); err != nil {
		t.Fatal(err)
	}
	if took := time.Since(began); took > time.Second {
		t.Errorf("Close took %s: it waited for the redial's handshake", took.Round(time.Millisecond))
	}
	buf := make([]byte, 1<<20)
	if stacks := string(buf[:runtime.Stack(buf, true)]); strings.Contains(stacks, "brokerurl.(*amqpConn)") {
		t.Errorf("a goroutine of the connection is left after Close:\n%s", stacks)
	}
}

// A broker that restarts loses an exchange that is not durable: the
// publisher declares it again on its new connection. (Found by review:
// it declared an exchange once, and the calls failed for good.)
func TestAMQPExchangeDeclaredAfterReconnect(t *testing.T) {
	u := serverURL(t, amqpEnv)
	proxy, via := lagproxy.ForURL(t, u)
	ex := "transient-" + randSuffix(t)
	pub, err := brokerurl.Open(context.Background(), via+"?durable=false&exchange="+ex, brokerurl.Options{Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close()
	if err := pub.Publish("orders", ids(1, "a")...); err != nil {
		t.Fatal(err)
	}
	ch := amqpChannel(t, u)
	if err := ch.ExchangeDelete(ex, false, false); err != nil { // what a restart does to it
		t.Fatal(err)
	}
	proxy.Cut()
	publishesWithin(t, pub, "orders", 10*time.Second)
}

// Open's context bounds the first dial only: redials get the whole
// ConnectTimeout, so a slow handshake after a reconnect still succeeds.
// (Each redial had the time left of Open's context, and failed for good
// when the handshake took longer.)
func TestAMQPRedialGetsConnectTimeout(t *testing.T) {
	u := serverURL(t, amqpEnv)
	proxy, via := lagproxy.ForURL(t, u)
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	pub, err := brokerurl.Open(ctx, via, brokerurl.Options{Logger: quiet, ConnectTimeout: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close()
	proxy.SetLag(700 * time.Millisecond) // a handshake takes three round trips: over 2 s
	proxy.Cut()
	publishesWithin(t, pub, "orders.redial."+randSuffix(t), 20*time.Second)
}

// publishesWithin calls pub until a call succeeds, failing the test if
// none does within d (after a cut: the reconnect).
func publishesWithin(t *testing.T, pub message.Publisher, topic string, d time.Duration) {
	t.Helper()
	deadline := time.Now().Add(d)
	var last error
	for time.Now().Before(deadline) {
		if last = pub.Publish(topic, ids(1, "r")...); last == nil {
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatalf("calls still fail %s after the cut: %v", d, last)
}

// amqpOpeners open an AMQP publisher and subscriber, for tests of their
// shared connection.
var amqpOpeners = map[string]func(ctx context.Context, u string, opt brokerurl.Options) (io.Closer, error){
	"publisher": func(ctx context.Context, u string, opt brokerurl.Options) (io.Closer, error) {
		return brokerurl.Open(ctx, u, opt)
	},
	"subscriber": func(ctx context.Context, u string, opt brokerurl.Options) (io.Closer, error) {
		return brokerurl.OpenSubscriber(ctx, u, "tests-timeout", opt)
	},
}

// The URL's connection_timeout bounds each dial, the first one too, a
// shorter or a longer one than Options.ConnectTimeout. (A longer one cut
// the first dial at ConnectTimeout, found by review.)
func TestAMQPURLConnectionTimeout(t *testing.T) {
	u := serverURL(t, amqpEnv)
	for kind, open := range amqpOpeners {
		t.Run(kind+"/shorter", func(t *testing.T) {
			proxy, via := lagproxy.ForURL(t, u)
			proxy.SetLag(time.Second) // the handshake takes over 3 s
			began := time.Now()
			c, err := open(context.Background(), via+"?connection_timeout=300", brokerurl.Options{Logger: quiet, ConnectTimeout: 20 * time.Second})
			if err == nil {
				c.Close()
				t.Fatal("Open succeeded through a handshake of over 3 s with connection_timeout=300")
			}
			if took := time.Since(began); took > 2*time.Second {
				t.Fatalf("Open failed after %s: connection_timeout=300 (ms) was not applied", took.Round(time.Millisecond))
			}
		})
		t.Run(kind+"/longer", func(t *testing.T) {
			proxy, via := lagproxy.ForURL(t, u)
			proxy.SetLag(500 * time.Millisecond) // the handshake takes over 1.5 s
			c, err := open(context.Background(), via+"?connection_timeout=10000", brokerurl.Options{Logger: quiet, ConnectTimeout: 500 * time.Millisecond})
			if err != nil {
				t.Fatalf("Open failed with connection_timeout=10000 (ms) through a handshake of 1.5 s: %v", err)
			}
			c.Close()
		})
		t.Run(kind+"/redial", func(t *testing.T) {
			proxy, via := lagproxy.ForURL(t, u)
			var logs syncbuf.Buffer
			c, err := open(context.Background(), via+"?connection_timeout=300", brokerurl.Options{Logger: slog.New(slog.NewTextHandler(&logs, nil)), ConnectTimeout: 20 * time.Second})
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			proxy.SetLag(time.Second)
			proxy.Cut()
			deadline := time.Now().Add(3 * time.Second) // the first redial: 100 ms, then 300 ms
			for !strings.Contains(logs.String(), "AMQP reconnect failed") {
				if time.Now().After(deadline) {
					t.Fatalf("no redial failed within 3 s of the cut, with connection_timeout=300 (ms):\n%s", logs.String())
				}
				time.Sleep(20 * time.Millisecond)
			}
		})
	}
}

// Open's context, cancelled, ends the first dial at once. (Only its
// deadline was read, found by review: Open could succeed after it.)
func TestAMQPOpenContextEndsDial(t *testing.T) {
	u := serverURL(t, amqpEnv)
	for kind, open := range amqpOpeners {
		t.Run(kind, func(t *testing.T) {
			proxy, via := lagproxy.ForURL(t, u)
			proxy.SetLag(time.Second)
			ctx, cancel := context.WithCancel(context.Background())
			time.AfterFunc(200*time.Millisecond, cancel)
			began := time.Now()
			c, err := open(ctx, via, brokerurl.Options{Logger: quiet, ConnectTimeout: 20 * time.Second})
			took := time.Since(began)
			if err == nil {
				c.Close()
				t.Fatalf("Open succeeded after %s, its context cancelled at 200 ms", took.Round(time.Millisecond))
			}
			if !errors.Is(err, context.Canceled) || took > time.Second {
				t.Fatalf("Open failed after %s with %v; want context.Canceled soon after 200 ms", took.Round(time.Millisecond), err)
			}
		})
	}
}
