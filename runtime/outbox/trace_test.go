package outbox_test

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"testing"

	"go.opentelemetry.io/otel/baggage"
	"go.opentelemetry.io/otel/propagation"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/outboxgen/outboxgen/internal/testdb"
	"github.com/outboxgen/outboxgen/runtime/outbox"
	"github.com/outboxgen/outboxgen/templates"
)

// storedHeaders inserts one event with w inside ctx on db and returns the
// headers stored with it.
func storedHeaders(t *testing.T, ctx context.Context, db *sql.DB, w *outbox.Writer, opts ...outbox.InsertOption) map[string]string {
	t.Helper()
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback()
	id, err := w.Insert(ctx, tx, outbox.Event{Type: "ORDER_PAID", Topic: "orders.paid", Key: "o-1", Version: 1, Payload: map[string]int{"a": 1}}, opts...)
	if err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	var raw sql.NullString
	if err := db.QueryRowContext(ctx, "SELECT headers FROM outbox_event WHERE event_id = ?", id.String()).Scan(&raw); err != nil {
		t.Fatal(err)
	}
	h := map[string]string{}
	if raw.Valid {
		if err := json.Unmarshal([]byte(raw.String), &h); err != nil {
			t.Fatal(err)
		}
	}
	return h
}

// TestWriterStoresTraceContext: the writer stores the W3C trace context of
// the insert's ctx in the row's headers (on a real SQLite database), adds
// an event naming the event to the span, lets a caller's traceparent win,
// stores baggage only when configured, and nothing when turned off or
// when ctx has no span.
func TestWriterStoresTraceContext(t *testing.T) {
	db := testdb.Open(t, "sqlite")
	testdb.ApplySchema(t, db, "sqlite", templates.DefaultTables)
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	defer tp.Shutdown(context.Background())

	m, _ := baggage.NewMember("tenant", "acme")
	bag, _ := baggage.New(m)
	ctx, span := tp.Tracer("test").Start(baggage.ContextWithBaggage(context.Background(), bag), "POST /orders")
	sc := span.SpanContext()
	traceparent := fmt.Sprintf("00-%s-%s-01", sc.TraceID(), sc.SpanID())

	w := outbox.MustNewWriter(outbox.SQLite, "outbox_event")
	h := storedHeaders(t, ctx, db, w, outbox.WithHeader("tenant", "acme"))
	if h["traceparent"] != traceparent || h["tenant"] != "acme" || h["baggage"] != "" {
		t.Errorf("headers %v, want traceparent %s, the caller's tenant header and no baggage", h, traceparent)
	}

	h = storedHeaders(t, ctx, db, w, outbox.WithHeader("traceparent", "00-0123456789abcdef0123456789abcdef-0123456789abcdef-01"))
	if h["traceparent"] != "00-0123456789abcdef0123456789abcdef-0123456789abcdef-01" {
		t.Errorf("a caller's traceparent must win: %v", h)
	}
	if h = storedHeaders(t, ctx, db, w, outbox.WithHeader("TraceParent", "x")); len(h) != 1 || h["TraceParent"] != "x" {
		t.Errorf("a caller's TraceParent must win: %v", h)
	}

	wb := outbox.MustNewWriter(outbox.SQLite, "outbox_event", outbox.WithTracePropagator(
		propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{})))
	if h := storedHeaders(t, ctx, db, wb); h["traceparent"] != traceparent || h["baggage"] != "tenant=acme" {
		t.Errorf("with baggage: %v", h)
	}

	off := outbox.MustNewWriter(outbox.SQLite, "outbox_event", outbox.WithoutTraceContext())
	if h := storedHeaders(t, ctx, db, off); len(h) != 0 {
		t.Errorf("WithoutTraceContext stored %v", h)
	}
	if h := storedHeaders(t, context.Background(), db, w); len(h) != 0 {
		t.Errorf("without a span: stored %v", h)
	}
	// A non-recording but valid span context (sampled out) still travels:
	// the consumer's spans then join the same, unsampled, trace.
	unsampled := trace.ContextWithSpanContext(context.Background(), trace.NewSpanContext(trace.SpanContextConfig{TraceID: sc.TraceID(), SpanID: sc.SpanID()}))
	if h := storedHeaders(t, unsampled, db, w); h["traceparent"] != fmt.Sprintf("00-%s-%s-00", sc.TraceID(), sc.SpanID()) {
		t.Errorf("unsampled: %v", h)
	}

	span.End()
	ended := rec.Ended()
	if len(ended) != 1 {
		t.Fatalf("%d spans", len(ended))
	}
	var written int
	for _, e := range ended[0].Events() {
		if e.Name == "outboxgen.event.written" {
			written++
		}
	}
	if written != 5 { // the five inserts inside the span
		t.Errorf("%d outboxgen.event.written events on the span, want 5", written)
	}
}

// TestTraceNeverFailsAnInsert: an event that fits the writer's message
// size cap exactly without trace headers is inserted, without them, when
// a span is active (tracing never turns a good insert into a failing one).
func TestTraceNeverFailsAnInsert(t *testing.T) {
	db := testdb.Open(t, "sqlite")
	testdb.ApplySchema(t, db, "sqlite", templates.DefaultTables)
	tp := sdktrace.NewTracerProvider()
	defer tp.Shutdown(context.Background())
	ctx, span := tp.Tracer("test").Start(context.Background(), "request")
	defer span.End()
	// storedHeaders' payload {"a":1} is 7 bytes: the cap fits it exactly.
	w := outbox.MustNewWriter("sqlite", "outbox_event", outbox.WithMaxMessageSize(7))
	h := storedHeaders(t, ctx, db, w)
	if len(h) != 0 {
		t.Fatalf("headers %v stored past the size cap", h)
	}
	// With room for them, they are stored.
	w = outbox.MustNewWriter("sqlite", "outbox_event", outbox.WithMaxMessageSize(1000))
	if h := storedHeaders(t, ctx, db, w); h["traceparent"] == "" {
		t.Fatalf("headers %v: no traceparent with room for it", h)
	}
}
