package gentest

import (
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/message/router/middleware"

	"github.com/outboxgen/outboxgen/internal/gentest/sqlevents"
	"github.com/outboxgen/outboxgen/runtime/inbox"
	"github.com/outboxgen/outboxgen/runtime/outbox"
)

const eventID = "0190f3c8-7a4e-7b1c-9d2e-1f2a3b4c5d6e"

// Seed check 4: the same message delivered 100 times, one after another
// and all at once, takes effect once.
func TestConsumerSameMessage100TimesSequential(t *testing.T) {
	forEachBackend(t, func(t *testing.T, b *backend) {
		br := startConsumer(t, b, inbox.Config{})
		for range 100 {
			br.deliver(sqlevents.OrderPaidTopic, paidMessage(t, eventID, "o-1", 7))
		}
		if got := b.balance(t); got != 12 {
			t.Errorf("balance %d, want 12 (one credit of 1299 cents)", got)
		}
		if n := b.credits(t); n != 1 {
			t.Errorf("%d credit_log rows, want 1", n)
		}
		if n := br.h.calls.Load(); n != 1 {
			t.Errorf("handler called %d times, want 1", n)
		}
		if o := br.outcomes(); o[inbox.OutcomeProcessed] != 1 || o[inbox.OutcomeDuplicate] != 99 {
			t.Errorf("outcomes %v, want 1 processed and 99 duplicates", o)
		}
	})
}

func TestConsumerSameMessage100TimesConcurrent(t *testing.T) {
	forEachBackend(t, func(t *testing.T, b *backend) {
		// Generous attempts: concurrent inserts of one key may deadlock on
		// MariaDB (an error like any other: rolled back and retried).
		br := startConsumer(t, b, inbox.Config{MaxAttempts: 20})
		msgs := make([]*message.Message, 100)
		for i := range msgs {
			msgs[i] = paidMessage(t, eventID, "o-1", 7)
		}
		var wg sync.WaitGroup
		for _, m := range msgs {
			wg.Go(func() { br.publish(sqlevents.OrderPaidTopic, m) })
		}
		wg.Wait()
		br.waitAcked(100)
		if got := b.balance(t); got != 12 {
			t.Errorf("balance %d, want 12 (one credit)", got)
		}
		if n := b.credits(t); n != 1 {
			t.Errorf("%d credit_log rows, want 1", n)
		}
		if n := b.inboxRows(t); n != 1 {
			t.Errorf("%d inbox rows, want 1", n)
		}
		o := br.outcomes()
		if o[inbox.OutcomeProcessed] != 1 || o[inbox.OutcomeDuplicate] != 99 {
			t.Errorf("outcomes %v, want 1 processed and 99 duplicates", o)
		}
		if len(br.poisoned) != 0 {
			t.Errorf("%d messages poisoned", len(br.poisoned))
		}
	})
}

// A handler that fails twice (after its writes) and then succeeds takes
// effect once: the failed attempts leave nothing behind, and the retry is
// not mistaken for a duplicate. Both retry paths: watermill's in-process
// Retry, and the broker's redelivery after a nack.
func TestConsumerFailsTwiceThenSucceeds(t *testing.T) {
	for _, mode := range []string{"retry", "redelivery"} {
		t.Run(mode, func(t *testing.T) {
			forEachBackend(t, func(t *testing.T, b *backend) {
				var br *broker
				if mode == "retry" {
					br = startConsumer(t, b, inbox.Config{MaxAttempts: 3})
				} else {
					br = startConsumer(t, b, inbox.Config{MaxAttempts: 1, NoPoisonQueue: true})
				}
				br.h.failures.Store(2)
				br.deliver(sqlevents.OrderPaidTopic, paidMessage(t, eventID, "o-1", 7))
				if n := br.h.calls.Load(); n != 3 {
					t.Errorf("handler called %d times, want 3", n)
				}
				if got, n := b.balance(t), b.credits(t); got != 12 || n != 1 {
					t.Errorf("balance %d with %d credits, want 12 and 1", got, n)
				}
				if o := br.outcomes(); o[inbox.OutcomeFailed] != 2 || o[inbox.OutcomeProcessed] != 1 {
					t.Errorf("outcomes %v, want 2 failed, 1 processed", o)
				}
				// A later duplicate is still recognised.
				br.deliver(sqlevents.OrderPaidTopic, paidMessage(t, eventID, "o-1", 7))
				if got := b.balance(t); got != 12 {
					t.Errorf("balance %d after a duplicate, want 12", got)
				}
				if len(br.poisoned) != 0 {
					t.Errorf("%d messages poisoned", len(br.poisoned))
				}
			})
		})
	}
}

// A crash between the handler's writes and the commit (the database
// session is killed from another connection; on SQLite the commit fails)
// loses the writes and the inbox row together; the redelivery applies the
// effect once.
func TestConsumerCrashBeforeCommit(t *testing.T) {
	forEachBackend(t, func(t *testing.T, b *backend) {
		br := startConsumer(t, b, inbox.Config{MaxAttempts: 1, NoPoisonQueue: true})
		br.h.crash.Store(true)
		br.deliver(sqlevents.OrderPaidTopic, paidMessage(t, eventID, "o-1", 7))
		if br.h.crash.Load() {
			t.Fatal("the crash was not injected")
		}
		if n := br.h.calls.Load(); n != 2 {
			t.Errorf("handler called %d times, want 2 (the crashed attempt and the redelivery)", n)
		}
		if got, n := b.balance(t), b.credits(t); got != 12 || n != 1 {
			t.Errorf("balance %d with %d credits, want 12 and 1", got, n)
		}
		if n := b.inboxRows(t); n != 1 {
			t.Errorf("%d inbox rows, want 1", n)
		}
		// The consumer keeps working on a fresh connection.
		br.deliver(sqlevents.OrderPaidTopic, paidMessage(t, "0190f3c8-7a4e-7b1c-9d2e-000000000002", "o-2", 8))
		if got := b.balance(t); got != 24 {
			t.Errorf("balance %d after a second event, want 24", got)
		}
	})
}

// Undecodable payloads, unknown payload versions and messages without
// outbox metadata go to the poison topic at once, with the reason; the
// handler is not called for them, nothing panics, and other messages flow.
// A panicking handler is an ordinary failure: retried, then poisoned.
func TestConsumerPoison(t *testing.T) {
	forEachBackend(t, func(t *testing.T, b *backend) {
		br := startConsumer(t, b, inbox.Config{MaxAttempts: 3})
		bad := []*message.Message{
			outboxMessage("0190f3c8-0000-7000-8000-000000000001", sqlevents.OrderPaidType, "o-9", 1, 1, []byte(`{"order_id": `)),
			outboxMessage("0190f3c8-0000-7000-8000-000000000002", sqlevents.OrderPaidType, "o-9", 99, 2, []byte(`{}`)),
			outboxMessage("0190f3c8-0000-7000-8000-000000000003", sqlevents.OrderPaidType, "o-9", 1, 3, []byte(`{"order_id": ""}`)),
			message.NewMessage("0190f3c8-0000-7000-8000-000000000004", []byte(`{}`)),
		}
		wantReason := []string{"invalid JSON", "newer than this build understands", "invalid ORDER_PAID event", "has no \"outbox_type\" metadata"}
		for _, m := range bad {
			br.publish(sqlevents.OrderPaidTopic, m)
		}
		br.deliver(sqlevents.OrderPaidTopic, paidMessage(t, eventID, "o-1", 7))
		poisoned := br.waitPoisoned(len(bad))
		br.waitAcked(len(bad)) // poisoned messages are acked on their topic
		reasons := map[string]string{}
		for _, m := range poisoned {
			reasons[m.UUID] = m.Metadata.Get(middleware.ReasonForPoisonedKey)
			if m.Metadata.Get(middleware.PoisonedTopicKey) != sqlevents.OrderPaidTopic || m.Metadata.Get(middleware.PoisonedHandlerKey) != "points/"+sqlevents.OrderPaidTopic {
				t.Errorf("poisoned message metadata %v", m.Metadata)
			}
		}
		for i, m := range bad {
			if r := reasons[m.UUID]; !strings.Contains(r, wantReason[i]) {
				t.Errorf("message %d poisoned with reason %q, want it to mention %q", i, r, wantReason[i])
			}
		}
		if n := br.h.calls.Load(); n != 1 {
			t.Errorf("handler called %d times, want 1 (the good message only)", n)
		}
		if got := b.balance(t); got != 12 {
			t.Errorf("balance %d, want 12", got)
		}
		if o := br.outcomes(); o[inbox.OutcomePermanent] != int64(len(bad)) || o[inbox.OutcomeFailed] != 0 {
			t.Errorf("outcomes %v: want %d permanent failures tried once each", o, len(bad))
		}
		if n := b.inboxRows(t); n != 1 {
			t.Errorf("%d inbox rows, want 1: poisoned messages are not recorded", n)
		}

		// A handler that always fails: MaxAttempts attempts, then poison.
		br.h.failAlways.Store(true)
		before := br.h.calls.Load()
		br.publish(sqlevents.OrderPaidTopic, paidMessage(t, "0190f3c8-0000-7000-8000-000000000005", "o-5", 9))
		p := br.waitPoisoned(1)[0]
		br.waitAcked(1) // the poisoned message is acked on its topic
		if n := br.h.calls.Load() - before; n != 3 {
			t.Errorf("always-failing handler called %d times before poisoning, want 3 (PoisonQueue must wrap Retry)", n)
		}
		if r := p.Metadata.Get(middleware.ReasonForPoisonedKey); !strings.Contains(r, "always fails") {
			t.Errorf("reason %q", r)
		}
		br.h.failAlways.Store(false)

		// A panic is recovered and retried like an error.
		br.h.panics.Store(1)
		br.deliver(sqlevents.OrderPaidTopic, paidMessage(t, "0190f3c8-0000-7000-8000-000000000006", "o-6", 10))
		if got, n := b.balance(t), b.credits(t); got != 24 || n != 2 {
			t.Errorf("balance %d with %d credits after a panicking attempt, want 24 and 2", got, n)
		}
	})
}

// Stale guard: state events of one key delivered out of order; only the
// newest state is applied, older ones are skipped (and recorded, so their
// redeliveries are duplicates).
func TestConsumerStaleGuard(t *testing.T) {
	forEachBackend(t, func(t *testing.T, b *backend) {
		br := startConsumer(t, b, inbox.Config{})
		id := func(i int) string { return fmt.Sprintf("0190f3c8-0000-7000-8000-%012d", i) }
		// Produced in order shipped(10) < delivered(20) < returned(30) ...
		br.deliver(sqlevents.OrderStatusChangedTopic, statusMessage(t, id(20), "o-1", "delivered", 20))
		br.deliver(sqlevents.OrderStatusChangedTopic, statusMessage(t, id(10), "o-1", "shipped", 10)) // stale
		br.deliver(sqlevents.OrderStatusChangedTopic, statusMessage(t, id(30), "o-1", "returned", 30))
		br.deliver(sqlevents.OrderStatusChangedTopic, statusMessage(t, id(20), "o-1", "delivered", 20)) // duplicate
		br.deliver(sqlevents.OrderStatusChangedTopic, statusMessage(t, id(25), "o-1", "lost", 25))      // stale
		if got, want := br.h.applied(), []string{"delivered", "returned"}; !slices.Equal(got, want) {
			t.Errorf("applied %v, want %v", got, want)
		}
		if n := b.mustInt(t, `SELECT applied FROM order_state WHERE order_id = 'o-1'`); n != 2 {
			t.Errorf("order state written %d times, want 2", n)
		}
		status := b.mustInt(t, `SELECT COUNT(*) FROM order_state WHERE order_id = 'o-1' AND status = 'returned'`)
		if status != 1 {
			t.Error("final status is not the newest, returned")
		}
		if n := b.mustInt(t, `SELECT last_seq FROM `+sqlevents.InboxTable+`_key WHERE consumer = 'points' AND biz_type = ? AND biz_id = 'o-1'`, sqlevents.OrderStatusChangedType); n != 30 {
			t.Errorf("last_seq %d, want 30", n)
		}
		if o := br.outcomes(); o[inbox.OutcomeProcessed] != 2 || o[inbox.OutcomeStale] != 2 || o[inbox.OutcomeDuplicate] != 1 {
			t.Errorf("outcomes %v, want 2 processed, 2 stale, 1 duplicate", o)
		}
		// ORDER_PAID is not latest_only: an older sequence is applied.
		br.deliver(sqlevents.OrderPaidTopic, paidMessage(t, id(40), "o-1", 40))
		br.deliver(sqlevents.OrderPaidTopic, paidMessage(t, id(5), "o-1", 5))
		if got := b.balance(t); got != 24 {
			t.Errorf("balance %d, want 24: the guard must not apply to delta events", got)
		}
		// A latest_only event without a sequence cannot be ordered: poison.
		m := statusMessage(t, id(50), "o-1", "gone", 0)
		m.Metadata.Set(outbox.MetadataSequence, "")
		br.publish(sqlevents.OrderStatusChangedTopic, m)
		if r := br.waitPoisoned(1)[0].Metadata.Get(middleware.ReasonForPoisonedKey); !strings.Contains(r, "latest_only") {
			t.Errorf("reason %q", r)
		}
	})
}

// A follow-up event emitted by the handler with the generated writer on
// the handler's transaction rolls back with it, and commits exactly once.
func TestConsumerChainedEventIsAtomic(t *testing.T) {
	forEachBackend(t, func(t *testing.T, b *backend) {
		br := startConsumer(t, b, inbox.Config{MaxAttempts: 1, NoPoisonQueue: true})
		br.h.chain.Store(true)
		br.h.failures.Store(2)
		br.deliver(sqlevents.OrderPaidTopic, paidMessage(t, eventID, "o-1", 7))
		if n := br.h.calls.Load(); n != 3 {
			t.Errorf("handler called %d times, want 3", n)
		}
		if n := b.chained(t); n != 1 {
			t.Errorf("%d POINTS_CREDITED events in the outbox, want 1 (two attempts rolled back)", n)
		}
		br.deliver(sqlevents.OrderPaidTopic, paidMessage(t, eventID, "o-1", 7))
		if n := b.chained(t); n != 1 {
			t.Errorf("%d POINTS_CREDITED events after a duplicate, want 1", n)
		}
		// A crash before commit also loses the chained event.
		br.h.crash.Store(true)
		br.deliver(sqlevents.OrderPaidTopic, paidMessage(t, "0190f3c8-0000-7000-8000-000000000777", "o-7", 8))
		if n := b.chained(t); n != 2 {
			t.Errorf("%d POINTS_CREDITED events after a crashed and a redelivered attempt, want 2", n)
		}
	})
}
