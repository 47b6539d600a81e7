package gentest

import (
	"strings"
	"testing"

	"github.com/ThreeDotsLabs/watermill/message/router/middleware"

	"github.com/outboxgen/outboxgen/internal/gentest/sqlevents"
	"github.com/outboxgen/outboxgen/runtime/inbox"
	"github.com/outboxgen/outboxgen/runtime/outbox"
)

// An event id or key longer than the inbox columns can never be recorded:
// it is poisoned at once, with the reason, before any SQL (no retries, no
// failed statement), on every database alike (SQLite would store it). Values
// at the limit, counted in characters, go through.
func TestConsumerValuesTooLongForInbox(t *testing.T) {
	forEachBackend(t, func(t *testing.T, b *backend) {
		br := startConsumer(t, b, inbox.Config{}) // the default MaxAttempts (4)
		longID := paidMessage(t, strings.Repeat("e", inbox.MaxEventIDLen+1), "o-1", 1)
		longKey := paidMessage(t, "0190f3c8-0000-7000-8000-000000000002", "o-2", 2)
		longKey.Metadata.Set(outbox.MetadataKey, strings.Repeat("k", inbox.MaxKeyLen+1))
		// At the limits: 64 characters of id, 128 (two-byte) characters of key.
		fits := paidMessage(t, strings.Repeat("f", inbox.MaxEventIDLen), "o-3", 3)
		fits.Metadata.Set(outbox.MetadataKey, strings.Repeat("é", inbox.MaxKeyLen))
		br.publish(sqlevents.OrderPaidTopic, longID, longKey, fits)
		br.waitAcked(3) // poisoned messages are acked on their topic

		// The outcomes are counted before the ack: check them first, so a
		// message that was processed instead of poisoned fails fast.
		if o := br.outcomes(); o[inbox.OutcomePermanent] != 2 || o[inbox.OutcomeFailed] != 0 || o[inbox.OutcomeProcessed] != 1 {
			t.Fatalf("outcomes %v, want 2 permanent failures tried once each (no failed attempts) and 1 processed", o)
		}
		if n := br.h.calls.Load(); n != 1 {
			t.Errorf("handler called %d times, want 1 (the message that fits)", n)
		}
		if n := b.inboxRows(t); n != 1 {
			t.Errorf("%d inbox rows, want 1", n)
		}
		want := map[string]string{
			longID.UUID:  "event id (\"outbox_event_id\" metadata) has 65 characters; the inbox table holds at most 64",
			longKey.UUID: "key (\"outbox_key\" metadata) has 129 characters; the inbox table holds at most 128",
		}
		for _, m := range br.waitPoisoned(2) {
			if r := m.Metadata.Get(middleware.ReasonForPoisonedKey); !strings.Contains(r, want[m.UUID]) || want[m.UUID] == "" {
				t.Errorf("message %.20s… poisoned with reason %q, want it to contain %q", m.UUID, r, want[m.UUID])
			}
		}
	})
}
