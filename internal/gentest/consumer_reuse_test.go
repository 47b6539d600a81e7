package gentest

import (
	"strings"
	"testing"

	"github.com/ThreeDotsLabs/watermill/message/router/middleware"

	"github.com/outboxgen/outboxgen/internal/gentest/sqlevents"
	"github.com/outboxgen/outboxgen/runtime/inbox"
)

// A message reusing the event id of a handled event, with another type or
// another key, is another event: it is poisoned with a reason that says
// so, not acked as a duplicate and dropped. A true redelivery is still a
// duplicate.
func TestConsumerReusedEventIDIsPoisoned(t *testing.T) {
	forEachBackend(t, func(t *testing.T, b *backend) {
		br := startConsumer(t, b, inbox.Config{})
		br.deliver(sqlevents.OrderPaidTopic, paidMessage(t, eventID, "o-1", 7))

		reuses := []string{
			`already handled for ORDER_PAID key "o-1", and this delivery is ORDER_STATUS_CHANGED key "o-1"`,
			`already handled for ORDER_PAID key "o-1", and this delivery is ORDER_PAID key "o-2"`,
		}
		br.publish(sqlevents.OrderStatusChangedTopic, statusMessage(t, eventID, "o-1", "shipped", 8))
		br.publish(sqlevents.OrderPaidTopic, paidMessage(t, eventID, "o-2", 9))
		br.publish(sqlevents.OrderPaidTopic, paidMessage(t, eventID, "o-1", 7)) // a redelivery
		br.waitAcked(3)                                                         // poisoned messages are acked on their topic
		if o := br.outcomes(); o[inbox.OutcomePermanent] != 2 || o[inbox.OutcomeDuplicate] != 1 || o[inbox.OutcomeProcessed] != 1 {
			t.Fatalf("outcomes %v, want 1 processed, 2 permanent (the reused ids), 1 duplicate (the redelivery)", o)
		}
		var reasons []string
		for _, m := range br.waitPoisoned(len(reuses)) {
			reasons = append(reasons, m.Metadata.Get(middleware.ReasonForPoisonedKey))
		}
		for _, want := range reuses {
			found := false
			for _, got := range reasons {
				found = found || strings.Contains(got, want)
			}
			if !found {
				t.Errorf("poison reasons %q: none says %q", reasons, want)
			}
		}
		if n := br.h.calls.Load(); n != 1 {
			t.Errorf("handler called %d times, want 1", n)
		}
		if got := b.balance(t); got != 12 {
			t.Errorf("balance %d, want 12", got)
		}
		if applied := br.h.applied(); len(applied) != 0 {
			t.Errorf("statuses applied: %v, want none", applied)
		}
		if n := b.inboxRows(t); n != 1 {
			t.Errorf("%d inbox rows, want 1", n)
		}
	})
}

// The poison reason of a panicking handler is one line, without the
// stack trace (which goes to the log).
func TestConsumerPanicPoisonReasonIsOneLine(t *testing.T) {
	forEachBackend(t, func(t *testing.T, b *backend) {
		br := startConsumer(t, b, inbox.Config{MaxAttempts: 2})
		br.h.panics.Store(1000)
		br.publish(sqlevents.OrderPaidTopic, paidMessage(t, eventID, "o-1", 7))
		r := br.waitPoisoned(1)[0].Metadata.Get(middleware.ReasonForPoisonedKey)
		if strings.ContainsAny(r, "\r\n") || strings.Contains(r, "goroutine") || len(r) > 1024 ||
			!strings.Contains(r, "panicked: test: handler panic after its writes") {
			t.Errorf("poison reason (%d bytes) = %.300q..., want one line saying the handler panicked", len(r), r)
		}
		if got := b.balance(t); got != 0 {
			t.Errorf("balance %d, want 0: the panicking attempts are rolled back", got)
		}
	})
}
