package observetest

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/outboxgen/outboxgen/internal/gentest/sqlevents"
	"github.com/outboxgen/outboxgen/runtime/outbox"
)

// TestTraceOutcomes: a redelivered event shows as a consumer span with
// outcome duplicate, an older state event (latest_only) as stale, each in
// the trace the message carries; a message without trace context starts
// a trace of its own.
func TestTraceOutcomes(t *testing.T) {
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	t.Cleanup(func() { tp.Shutdown(context.Background()) })
	db := openDB(t)
	ps := gochannel.NewGoChannel(gochannel.Config{OutputChannelBuffer: 16}, watermill.NopLogger{})
	t.Cleanup(func() { ps.Close() })
	b := broker{name: "gochannel", system: "gochannel", pub: ps, sub: func(*testing.T) message.Subscriber { return ps }}
	runConsumer(t, db, b, newPoints(t, db), tp, nil)

	traceparent := func(i int) string {
		return "00-0af7651916cd43dd8448eb211c80319" + strconv.Itoa(i) + "-b7ad6b716920333" + strconv.Itoa(i) + "-01"
	}
	msg := func(id, typ, key string, seq int, payload string, tp string) *message.Message {
		m := message.NewMessage(id, []byte(payload))
		m.Metadata.Set(outbox.MetadataEventID, id)
		m.Metadata.Set(outbox.MetadataType, typ)
		m.Metadata.Set(outbox.MetadataKey, key)
		m.Metadata.Set(outbox.MetadataVersion, "1")
		m.Metadata.Set(outbox.MetadataSequence, strconv.Itoa(seq))
		m.Metadata.Set(outbox.MetadataCreatedAt, time.Now().UTC().Format(time.RFC3339Nano))
		if tp != "" {
			m.Metadata.Set("traceparent", tp)
		}
		return m
	}
	paid := `{"order_id":"o-1","customer_id":"c-1","amount_cents":100,"currency":"EUR","method":"card","paid_at":"2026-01-01T00:00:00Z"}`
	publish := func(m *message.Message) {
		t.Helper()
		if err := ps.Publish(topicOf(m), m); err != nil {
			t.Fatal(err)
		}
	}
	// The same event twice (a redelivery): processed, then duplicate.
	publish(msg("0190b1d2-7c3e-7b4a-9f00-000000000001", sqlevents.OrderPaidType, "o-1", 1, paid, traceparent(1)))
	waitSpans(t, rec, 1)
	publish(msg("0190b1d2-7c3e-7b4a-9f00-000000000001", sqlevents.OrderPaidType, "o-1", 1, paid, traceparent(2)))
	waitSpans(t, rec, 2)
	// State events of one key: sequence 5, then an older one, 3: stale.
	publish(msg("0190b1d2-7c3e-7b4a-9f00-000000000005", sqlevents.OrderStatusChangedType, "o-1", 5, `{"order_id":"o-1","status":"shipped"}`, traceparent(3)))
	waitSpans(t, rec, 3)
	publish(msg("0190b1d2-7c3e-7b4a-9f00-000000000003", sqlevents.OrderStatusChangedType, "o-1", 3, `{"order_id":"o-1","status":"paid"}`, ""))
	waitSpans(t, rec, 4)

	spans := rec.Ended()
	want := []struct {
		outcome string
		trace   string
	}{{"processed", traceparent(1)}, {"duplicate", traceparent(2)}, {"processed", traceparent(3)}, {"stale", ""}}
	for i, w := range want {
		s := spans[i]
		if got := attr(s, "outboxgen.outcome"); got != w.outcome {
			t.Errorf("span %d %q: outcome %q, want %q", i, s.Name(), got, w.outcome)
		}
		if w.trace != "" {
			if got := s.SpanContext().TraceID().String(); got != w.trace[3:35] || s.Parent().SpanID().String() != w.trace[36:52] {
				t.Errorf("span %d: trace %s parent %s, want the message's %s", i, got, s.Parent().SpanID(), w.trace)
			}
		} else if s.Parent().IsValid() || len(s.Links()) != 0 {
			t.Errorf("span %d: a message without trace context got parent %v and links %v", i, s.Parent(), s.Links())
		}
	}
}

func topicOf(m *message.Message) string {
	if m.Metadata.Get(outbox.MetadataType) == sqlevents.OrderPaidType {
		return sqlevents.OrderPaidTopic
	}
	return sqlevents.OrderStatusChangedTopic
}

func waitSpans(t *testing.T, rec *tracetest.SpanRecorder, n int) {
	t.Helper()
	eventually(t, strconv.Itoa(n)+" consumer spans", func() bool { return len(rec.Ended()) >= n })
}
