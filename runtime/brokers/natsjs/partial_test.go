package natsjs_test

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"

	"github.com/outboxgen/outboxgen/internal/natstest"
	"github.com/outboxgen/outboxgen/runtime/brokers/natsjs"
	"github.com/outboxgen/outboxgen/runtime/relay"
)

// checkStored fails t unless err is a *relay.PartialError whose Stored
// marks exactly the messages of ids now in the stream, at least one of
// them and not all.
func checkStored(t *testing.T, pub *natsjs.Publisher, err error, ids []string) {
	t.Helper()
	var pe *relay.PartialError
	if !errors.As(err, &pe) {
		t.Fatalf("error %v (%T): want a *relay.PartialError", err, err)
	}
	stored := relay.StoredOf(err, len(ids))
	if stored == nil {
		t.Fatalf("StoredOf(err, %d) is nil: Stored %v", len(ids), pe.Stored)
	}
	in := map[string]bool{}
	for _, id := range storedIDs(t, pub) {
		in[id] = true
	}
	var n int
	for i, id := range ids {
		if stored[i] != in[id] {
			t.Errorf("message %s: Stored %v, in the stream %v", id, stored[i], in[id])
		}
		if stored[i] {
			n++
		}
	}
	if n == 0 || n == len(ids) {
		t.Fatalf("%d of %d messages stored: want some, not all", n, len(ids))
	}
}

// A call part of whose messages the stream refuses (full, DiscardNew)
// fails with a *relay.PartialError marking the messages it stored, and
// the stream's reason; sent again, the stored ones are acknowledged as
// duplicates and the others refused again. A call all refused fails
// with a plain error.
func TestPublishPartlyRefused(t *testing.T) {
	srv := startNATS(t, -1, t.TempDir())
	const max = 3
	pub, err := natsjs.NewPublisher(natsjs.Config{URL: srv.ClientURL(), AutoProvision: true, PublishTimeout: 5 * time.Second,
		ConfigureStream: func(_ string, c *nats.StreamConfig) { c.MaxMsgs, c.Discard = max, nats.DiscardNew }})
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close()

	var ids []string
	for i := range 2 * max {
		ids = append(ids, fmt.Sprintf("m-%d", i))
	}
	err = pub.Publish(topic, msgs(ids...)...)
	if err == nil || !strings.Contains(err.Error(), "maximum messages") {
		t.Fatalf("call of %d messages to a stream of at most %d: %v, want the stream's refusal", len(ids), max, err)
	}
	checkStored(t, pub, err, ids)
	t.Logf("first call: %v", err)

	err = pub.Publish(topic, msgs(ids...)...)
	if err == nil || !strings.Contains(err.Error(), "maximum messages") {
		t.Fatalf("the call sent again: %v, want the stream's refusal", err)
	}
	checkStored(t, pub, err, ids)

	err = pub.Publish(topic, msgs("x", "y")...)
	if err == nil || !strings.Contains(err.Error(), "maximum messages") {
		t.Fatalf("call to the full stream: %v, want the stream's refusal", err)
	}
	var pe *relay.PartialError
	if errors.As(err, &pe) {
		t.Fatalf("call all refused: %v, want no PartialError (Stored %v)", err, pe.Stored)
	}
}

// A send that fails partway (a message over the server's max_payload,
// which nats.go refuses before it goes out) still tells which messages
// sent before it were stored; the later ones are not sent.
func TestPublishSendFailsPartway(t *testing.T) {
	srv := natstest.Start(t, func(o *server.Options) { o.MaxPayload = 4096 })
	pub := newPublisher(t, srv.ClientURL(), 5*time.Second)
	ids := []string{"a", "b", "big", "c"}
	call := msgs(ids...)
	call[2].Payload = []byte(strings.Repeat("x", 8192))
	err := pub.Publish(topic, call...)
	if !errors.Is(err, nats.ErrMaxPayload) {
		t.Fatalf("call with a message over max_payload: %v, want nats.ErrMaxPayload", err)
	}
	if !errors.Is(err, relay.ErrPermanent) {
		t.Errorf("call with a message over max_payload: %v, want it permanent (no retry sends it)", err)
	}
	checkStored(t, pub, err, ids)
	if got := storedIDs(t, pub); strings.Join(got, ",") != "a,b" {
		t.Fatalf("stored %v, want [a b]", got)
	}
	if err := pub.Publish(topic, call[2]); !errors.Is(err, nats.ErrMaxPayload) || !errors.Is(err, relay.ErrPermanent) {
		t.Errorf("call of the big message alone: %v, want nats.ErrMaxPayload, permanent", err)
	}
}

// A message the stream refuses (over its max_msg_size) between messages
// it stores: the ones after it are marked stored too, so the relay does
// not send them again.
func TestPublishStoredAfterRefused(t *testing.T) {
	srv := natstest.Start(t, nil)
	pub, err := natsjs.NewPublisher(natsjs.Config{URL: srv.ClientURL(), AutoProvision: true, PublishTimeout: 5 * time.Second,
		ConfigureStream: func(_ string, c *nats.StreamConfig) { c.MaxMsgSize = 2048 }})
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close()
	ids := []string{"a", "big", "c", "d"}
	call := msgs(ids...)
	call[1].Payload = []byte(strings.Repeat("x", 4096))
	err = pub.Publish(topic, call...)
	if err == nil {
		t.Fatal("call with a message over the stream's max_msg_size succeeded")
	}
	stored := relay.StoredOf(err, len(ids))
	if want := []bool{true, false, true, true}; !slices.Equal(stored, want) {
		t.Fatalf("stored %v, want %v: %v", stored, want, err)
	}
	checkStored(t, pub, err, ids)
}

// Publish's redaction keeps the PartialError for errors.As, its Err
// redacted too. The token is a word of the stream's refusal, so that
// there is something to mask.
func TestPartialErrorRedacted(t *testing.T) {
	const token = "exceeded"
	srv := natstest.Start(t, func(o *server.Options) { o.Authorization = token })
	pub, err := natsjs.NewPublisher(natsjs.Config{URL: fmt.Sprintf("nats://%s@127.0.0.1:%d", token, port(srv)), AutoProvision: true,
		PublishTimeout: 5 * time.Second, ConfigureStream: func(_ string, c *nats.StreamConfig) { c.MaxMsgs, c.Discard = 1, nats.DiscardNew }})
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close()
	err = pub.Publish(topic, msgs("a", "b")...)
	var pe *relay.PartialError
	if !errors.As(err, &pe) {
		t.Fatalf("error %v: want a *relay.PartialError", err)
	}
	if !strings.Contains(err.Error(), "maximum messages") || strings.Contains(err.Error(), token) || strings.Contains(pe.Err.Error(), token) {
		t.Fatalf("error %q (Err %q): want the refusal with %q masked", err, pe.Err, token)
	}
	if s := relay.StoredOf(err, 2); len(s) != 2 || !s[0] || s[1] {
		t.Fatalf("StoredOf: %v, want [true false]", s)
	}
}
