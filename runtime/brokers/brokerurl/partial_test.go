package brokerurl_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/outboxgen/outboxgen/runtime/brokers/brokerurl"
	"github.com/outboxgen/outboxgen/runtime/relay"
)

// checkPartial checks that err, of a call of msgs, is a *relay.PartialError
// whose Stored marks exactly the messages whose UUIDs the broker holds
// (got), with at least one stored and one not.
func checkPartial(t *testing.T, err error, msgs []*message.Message, got []string) {
	t.Helper()
	var pe *relay.PartialError
	if !errors.As(err, &pe) {
		t.Fatalf("call stored in part: %v (%T), want a *relay.PartialError", err, err)
	}
	stored := relay.StoredOf(err, len(msgs))
	if stored == nil {
		t.Fatalf("StoredOf(%v, %d) = nil (Stored has %d elements)", err, len(msgs), len(pe.Stored))
	}
	var want []string
	for i, m := range msgs {
		if stored[i] {
			want = append(want, m.UUID)
		}
	}
	if len(want) == 0 || len(want) == len(msgs) {
		t.Fatalf("%d of %d messages marked stored; the test needs some of each", len(want), len(msgs))
	}
	if !slices.Equal(got, want) {
		t.Fatalf("the broker holds %v; Stored marks %v", got, want)
	}
	first := msgs[slices.Index(stored, false)].UUID
	if !strings.Contains(pe.Err.Error(), first) {
		t.Errorf("the error %q does not name %s, the first message not stored", pe.Err, first)
	}
}

// A call whose messages a full queue refuses in part fails with a
// *relay.PartialError that marks as stored exactly the messages a
// consumer finds in the queue. The queue (x-max-length-bytes 1000,
// x-overflow reject-publish) refuses a message whose body would take it
// over 1000 bytes, and takes a smaller one after it: the broker acks
// messages after one it refused, which the call waits for. (The call
// returned at the first refusal, as a plain error: the relay published
// the stored ones again.)
func TestAMQPPublishPartial(t *testing.T) {
	u := serverURL(t, amqpEnv)
	pub, err := brokerurl.Open(context.Background(), u, brokerurl.Options{Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close()
	topic := "orders.partial." + randSuffix(t)
	ch, q := amqpQueue(t, u, topic, amqp.Table{"x-max-length-bytes": int32(1000), "x-overflow": "reject-publish"})
	sizes := []int{300, 300, 600, 300, 500, 100, 200} // queued: 300, 600, -, 900, -, 1000, -
	call := make([]*message.Message, len(sizes))
	for i, n := range sizes {
		call[i] = message.NewMessage(fmt.Sprintf("p-%02d", i), []byte(strings.Repeat("x", n)))
	}
	err = pub.Publish(topic, call...)

	var got []string
	for {
		d, ok, gerr := ch.Get(q, true)
		if gerr != nil {
			t.Fatal(gerr)
		}
		if !ok {
			break
		}
		id, _ := d.Headers["_watermill_message_uuid"].(string)
		got = append(got, id)
	}
	checkPartial(t, err, call, got)
	stored := relay.StoredOf(err, len(call))
	if i := slices.Index(stored, false); !slices.Contains(stored[i:], true) {
		t.Fatalf("Stored %v: no message stored after one refused, the case of the test", stored)
	}
}

// A call whose XADDs Redis refuses in part fails with a
// *relay.PartialError that marks as stored exactly the entries then in
// the stream. The stream's last id is set two below the largest there is,
// so that its third entry on finds no id left ("The stream has exhausted
// the last possible ID"): the refusal of a command in the middle of one
// pipeline, on a stream of the test's own (a maxmemory low enough to
// refuse writes would refuse other tests' too, on the shared server).
// (The call returned a plain error: the relay appended the stored ones
// again.)
func TestRedisPublishPartial(t *testing.T) {
	u := serverURL(t, redisEnv)
	ctx := context.Background()
	pub, err := brokerurl.Open(ctx, u, brokerurl.Options{Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close()
	rc := redisClient(t, u)
	topic := "orders.partial." + randSuffix(t)
	t.Cleanup(func() { rc.Del(context.Background(), topic) })
	if err := rc.XGroupCreateMkStream(ctx, topic, "g", "$").Err(); err != nil { // an empty stream
		t.Fatal(err)
	}
	if err := rc.Do(ctx, "XSETID", topic, "18446744073709551615-18446744073709551613").Err(); err != nil {
		t.Fatal(err)
	}
	call := ids(6, "p")
	err = pub.Publish(topic, call...)

	entries, rerr := rc.XRange(ctx, topic, "-", "+").Result()
	if rerr != nil {
		t.Fatal(rerr)
	}
	var got []string
	for _, e := range entries {
		id, _ := e.Values["_watermill_message_uuid"].(string)
		got = append(got, id)
	}
	checkPartial(t, err, call, got)
	if !strings.Contains(err.Error(), "exhausted") {
		t.Errorf("error %q does not give Redis's reason", err)
	}
}
