package observetest

import (
	"context"
	"testing"
	"time"

	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/outboxgen/outboxgen/internal/gentest/sqlevents"
	"github.com/outboxgen/outboxgen/runtime/brokers/natsjs"
	"github.com/outboxgen/outboxgen/runtime/driver/sqldriver"
	"github.com/outboxgen/outboxgen/runtime/outbox"
	"github.com/outboxgen/outboxgen/runtime/relay"
)

// TestTraceRelayRetry: a publish that fails (no JetStream stream captures
// the subject yet) and succeeds once the stream exists shows as two send
// spans in the writer's trace, both children of the request span: the
// first with status Error and error.type, the second without.
func TestTraceRelayRetry(t *testing.T) {
	b := startNATS(t)
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	t.Cleanup(func() { tp.Shutdown(context.Background()) })
	db := openDB(t)

	const topic = "retry.events"
	ctx, span := tp.Tracer("app").Start(context.Background(), "POST /retry")
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := outbox.MustNewWriter(outbox.Postgres, "outbox_event").Insert(ctx, tx, outbox.Event{Type: sqlevents.OrderPaidType, Topic: topic, Key: "k", Version: 1, Payload: map[string]int{}}); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	span.End()
	root := span.SpanContext()

	drv, err := sqldriver.New(db, sqlevents.Schema)
	if err != nil {
		t.Fatal(err)
	}
	cfg := relayConfig(b, tp)
	cfg.Backoff = func(int) time.Duration { return 20 * time.Millisecond }
	cfg.BreakerBackoff = func(int) time.Duration { return 20 * time.Millisecond }
	rl, err := relay.New(drv, cfg)
	if err != nil {
		t.Fatal(err)
	}
	rctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- rl.Run(rctx) }()
	t.Cleanup(func() { cancel(); <-done })

	sends := func() []sdktrace.ReadOnlySpan { return named(rec.Ended(), root.TraceID(), "send "+topic) }
	eventually(t, "a failed send span", func() bool { return len(sends()) > 0 })
	if err := b.pub.(*natsjs.Publisher).EnsureStream(topic); err != nil {
		t.Fatal(err)
	}
	eventually(t, "a successful send span", func() bool {
		s := sends()
		return len(s) > 0 && s[len(s)-1].Status().Code != codes.Error
	})
	s := sends()
	first, last := s[0], s[len(s)-1]
	if first.Status().Code != codes.Error || attr(first, "error.type") != "transient" || len(first.Events()) == 0 {
		t.Errorf("first send span: status %v, error.type %q, %d events; want Error, transient, the exception", first.Status(), attr(first, "error.type"), len(first.Events()))
	}
	if last.Status().Code == codes.Error || attr(last, "error.type") != "" {
		t.Errorf("last send span: status %v, error.type %q", last.Status(), attr(last, "error.type"))
	}
	for _, sp := range s {
		if sp.Parent().SpanID() != root.SpanID() || sp.SpanKind() != trace.SpanKindProducer {
			t.Errorf("send span %s: parent %s kind %v, want the request span %s", sp.SpanContext().SpanID(), sp.Parent().SpanID(), sp.SpanKind(), root.SpanID())
		}
	}
}
