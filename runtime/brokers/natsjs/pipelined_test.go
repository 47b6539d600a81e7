package natsjs_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/nats-io/nats.go"

	"github.com/outboxgen/outboxgen/internal/lagproxy"
	"github.com/outboxgen/outboxgen/runtime/brokers/natsjs"
)

// storedIDs lists the Nats-Msg-Id of every message of topic's stream, in
// stream order.
func storedIDs(t *testing.T, pub *natsjs.Publisher) []string {
	t.Helper()
	js, err := pub.Conn().JetStream()
	if err != nil {
		t.Fatal(err)
	}
	name := natsjs.DefaultStreamName(topic)
	info, err := js.StreamInfo(name)
	if err != nil {
		t.Fatalf("stream info: %v", err)
	}
	var ids []string
	for seq := info.State.FirstSeq; seq <= info.State.LastSeq && info.State.Msgs > 0; seq++ {
		m, err := js.GetMsg(name, seq)
		if err != nil {
			t.Fatalf("message %d: %v", seq, err)
		}
		ids = append(ids, m.Header.Get(nats.MsgIdHdr))
	}
	return ids
}

func msgs(ids ...string) []*message.Message {
	out := make([]*message.Message, len(ids))
	for i, id := range ids {
		out[i] = message.NewMessage(id, []byte(`{"n":1}`))
	}
	return out
}

// A call's messages, sent without waiting for each acknowledgement, are
// stored in the call's order; a call sent again stores nothing more.
func TestPublishKeepsCallOrder(t *testing.T) {
	srv := startNATS(t, -1, t.TempDir())
	pub := newPublisher(t, srv.ClientURL(), 5*time.Second)
	var want []string
	for i := range 64 {
		want = append(want, fmt.Sprintf("m-%02d", i))
	}
	if err := pub.Publish(topic, msgs(want...)...); err != nil {
		t.Fatal(err)
	}
	if err := pub.Publish(topic, msgs(want...)...); err != nil {
		t.Fatalf("the call sent again: %v", err)
	}
	if got := storedIDs(t, pub); strings.Join(got, ",") != strings.Join(want, ",") {
		t.Fatalf("stored %v, want %v", got, want)
	}
}

// A message the stream refuses fails the call with the stream's reason;
// the message before it is stored, and so is the one after it, sent
// before the refusal came back; sent again, they are not stored twice.
func TestPublishFailsAtTheRefusedMessage(t *testing.T) {
	srv := startNATS(t, -1, t.TempDir())
	pub, err := natsjs.NewPublisher(natsjs.Config{URL: srv.ClientURL(), AutoProvision: true, PublishTimeout: 5 * time.Second,
		ConfigureStream: func(_ string, c *nats.StreamConfig) { c.MaxMsgSize = 1024 }})
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close()
	call := msgs("a", "big", "c")
	call[1].Payload = []byte(strings.Repeat("x", 4096))
	err = pub.Publish(topic, call...)
	if err == nil || !strings.Contains(err.Error(), "maximum") {
		t.Fatalf("call with a message over the stream's MaxMsgSize: %v, want the stream's refusal", err)
	}
	if got := storedIDs(t, pub); strings.Join(got, ",") != "a,c" {
		t.Fatalf("stored %v, want [a c]", got)
	}
	if err := pub.Publish(topic, msgs("a", "c")...); err != nil {
		t.Fatal(err)
	}
	if got := storedIDs(t, pub); strings.Join(got, ",") != "a,c" {
		t.Fatalf("stored after sending a and c again: %v, want [a c]", got)
	}
}

// laggedPublisher is a publisher to a fresh server through a proxy that
// holds what it sends for lag once the stream exists.
func laggedPublisher(t *testing.T, timeout, lag time.Duration) *natsjs.Publisher {
	t.Helper()
	srv := startNATS(t, -1, t.TempDir())
	proxy := lagproxy.New(t, srv.Addr().String())
	pub := newPublisher(t, "nats://"+proxy.Addr(), timeout)
	if err := pub.EnsureStream(topic); err != nil {
		t.Fatal(err)
	}
	proxy.SetLag(lag)
	return pub
}

// The wait for acknowledgements ends with a message's context (a relay
// gave up on the call), with the context's error.
func TestPublishWaitEndsWithContext(t *testing.T) {
	pub := laggedPublisher(t, time.Minute, time.Minute)
	call := msgs("a", "b")
	ctx, cancel := context.WithCancel(context.Background())
	call[1].SetContext(ctx)
	time.AfterFunc(100*time.Millisecond, cancel)
	if err := pub.Publish(topic, call...); !errors.Is(err, context.Canceled) {
		t.Fatalf("call whose second message's context was cancelled: %v, want context.Canceled", err)
	}
}

// No acknowledgement within PublishTimeout fails the call with
// nats.ErrTimeout, naming the setting.
func TestPublishTimesOut(t *testing.T) {
	pub := laggedPublisher(t, 300*time.Millisecond, time.Minute)
	err := pub.Publish(topic, msgs("a", "b", "c")...)
	if !errors.Is(err, nats.ErrTimeout) || !strings.Contains(err.Error(), "Config.PublishTimeout") {
		t.Fatalf("call without acknowledgements: %v, want nats.ErrTimeout naming Config.PublishTimeout", err)
	}
}
