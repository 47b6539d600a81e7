package brokerurl_test

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/redis/go-redis/v9"

	"github.com/outboxgen/outboxgen/internal/lagproxy"
	"github.com/outboxgen/outboxgen/runtime/brokers/brokerurl"
	"github.com/outboxgen/outboxgen/runtime/brokers/internal/brokertest"
)

func redisClient(t testing.TB, u string) *redis.Client {
	t.Helper()
	opts, err := redis.ParseURL(u)
	if err != nil {
		t.Fatal(err)
	}
	c := redis.NewClient(opts)
	t.Cleanup(func() { c.Close() })
	return c
}

// One call's entries, sent in one pipeline, are appended in the call's
// order; an XADD that fails (the key holds another type) fails the call,
// naming the first message.
func TestRedisPublishCall(t *testing.T) {
	u := serverURL(t, redisEnv)
	ctx := context.Background()
	pub, err := brokerurl.Open(ctx, u, brokerurl.Options{Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close()
	topic := "orders.call." + randSuffix(t)
	var call []*message.Message
	for i := range 50 {
		call = append(call, message.NewMessage(fmt.Sprintf("m-%02d", i), []byte(`{"n":1}`)))
	}
	if err := pub.Publish(topic, call...); err != nil {
		t.Fatal(err)
	}
	rc := redisClient(t, u)
	entries, err := rc.XRange(ctx, topic, "-", "+").Result()
	if err != nil {
		t.Fatal(err)
	}
	if len(entries) != len(call) {
		t.Fatalf("%d entries, want %d", len(entries), len(call))
	}
	for i, e := range entries {
		if got := e.Values["_watermill_message_uuid"]; got != call[i].UUID {
			t.Fatalf("entry %d is message %v, want %s", i, got, call[i].UUID)
		}
	}

	wrong := "orders.wrongtype." + randSuffix(t)
	if err := rc.Set(ctx, wrong, "a string", time.Minute).Err(); err != nil {
		t.Fatal(err)
	}
	err = pub.Publish(wrong, call[:3]...)
	if err == nil || !strings.Contains(err.Error(), "message m-00") || !strings.Contains(err.Error(), "WRONGTYPE") {
		t.Fatalf("call to a key holding a string: %v, want WRONGTYPE naming message m-00", err)
	}
}

// BenchmarkRedisPublish is one Publish call of 1, 16 and 64 messages to
// the test Redis server, directly and through a proxy that holds what
// the client sends for 1 ms (a server a network away): "pipelined" is
// the publisher's call, "sequential" the same messages one call each
// (one round trip each, as the watermill-redisstream publisher sent
// them).
func BenchmarkRedisPublish(b *testing.B) {
	u := serverURL(b, redisEnv)
	proxy, proxied := lagproxy.ForURL(b, u)
	ctx := context.Background()
	topic := "orders.bench." + strconv.FormatInt(time.Now().UnixNano(), 36)
	defer redisClient(b, u).Del(ctx, topic)
	for _, lag := range []time.Duration{0, time.Millisecond} {
		pu := u
		if lag > 0 {
			proxy.SetLag(lag)
			pu = proxied
		}
		pub, err := brokerurl.Open(ctx, pu+sepFor(pu)+"maxlen=10000", brokerurl.Options{Logger: quiet})
		if err != nil {
			b.Fatal(err)
		}
		for _, n := range []int{1, 16, 64} {
			for _, mode := range []string{"sequential", "pipelined"} {
				call := brokertest.Whole(pub, topic)
				if mode == "sequential" {
					call = brokertest.OneByOne(pub, topic)
				}
				b.Run(fmt.Sprintf("lag=%s/msgs=%d/%s", lag, n, mode), func(b *testing.B) {
					brokertest.BenchCall(b, n, benchMsg, call)
				})
			}
		}
		pub.Close()
	}
}

func sepFor(u string) string {
	if strings.Contains(u, "?") {
		return "&"
	}
	return "?"
}

// benchMsg is a benchmark's message (the brokers here need no key).
func benchMsg(int, int) *message.Message {
	return message.NewMessage("m", []byte(`{"order_id":"o-1","amount":42}`))
}
