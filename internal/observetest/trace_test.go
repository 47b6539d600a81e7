package observetest

import (
	"context"
	"database/sql"
	"fmt"
	"log/slog"
	"sort"
	"strings"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/outboxgen/outboxgen/internal/gentest/sqlevents"
	"github.com/outboxgen/outboxgen/runtime/driver/sqldriver"
	"github.com/outboxgen/outboxgen/runtime/relay"
)

// TestTraceEndToEnd: an event written inside a request's span is published
// by the relay and handled by the generated consumer, over NATS JetStream,
// Kafka (kfake), RabbitMQ and Redis Streams, in one trace: request → send (producer, child of the
// request and linked to it) → process (consumer, child of the send and
// linked to it) → the handler's ctx. A delivery that fails once shows two
// attempts and its error, a delivery that keeps failing shows as poisoned.
func TestTraceEndToEnd(t *testing.T) {
	for name, start := range map[string]func(*testing.T) broker{"nats": startNATS, "kafka": startKafka, "amqp": startAMQP, "redis": startRedis} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			b := start(t)
			rec := tracetest.NewSpanRecorder()
			tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
			t.Cleanup(func() { tp.Shutdown(context.Background()) })
			db := openDB(t)
			h := newPoints(t, db)
			runConsumer(t, db, b, h, tp, nil)

			// The application: a request span around the business
			// transaction that writes the events.
			roots := map[string]trace.SpanContext{}
			ids := map[string]string{}
			for _, order := range []string{"order-ok", orderRetry, orderPoison} {
				ctx, span := tp.Tracer("app").Start(context.Background(), "POST /orders/"+order, trace.WithSpanKind(trace.SpanKindServer))
				id := writeOrder(t, ctx, db, order)
				span.End()
				roots[order], ids[order] = span.SpanContext(), id
			}

			drv, err := sqldriver.New(db, sqlevents.Schema)
			if err != nil {
				t.Fatal(err)
			}
			rl, err := relay.New(drv, relayConfig(b, tp))
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithCancel(context.Background())
			relayDone := make(chan error, 1)
			go func() { relayDone <- rl.Run(ctx) }()
			t.Cleanup(func() { cancel(); <-relayDone })

			// Wait for the final word on every order: processed (twice
			// for the follow-up), processed after a retry, poisoned.
			want := map[string]string{"order-ok": "processed", orderRetry: "processed", orderPoison: "poisoned"}
			t.Cleanup(func() {
				if t.Failed() {
					for _, s := range rec.Ended() {
						t.Logf("span %q trace %s id %s parent %s links %d attrs %v", s.Name(), s.SpanContext().TraceID(), s.SpanContext().SpanID(), s.Parent().SpanID(), len(s.Links()), s.Attributes())
					}
				}
			})
			eventually(t, "the consumer spans of every order", func() bool {
				ended := rec.Ended()
				for order, outcome := range want {
					if s := named(ended, roots[order].TraceID(), "process "+sqlevents.OrderPaidTopic); len(s) == 0 || attr(s[0], "outboxgen.outcome") != outcome {
						return false
					}
					if outcome == "processed" && len(named(ended, roots[order].TraceID(), "send "+sqlevents.PointsCreditedTopic)) == 0 {
						return false
					}
				}
				return true
			})
			spans := rec.Ended()
			t.Logf("the trace of %s over %s:\n%s", orderRetry, b.name, spanTree(spans, roots[orderRetry].TraceID()))
			for order := range want {
				t.Run(order, func(t *testing.T) {
					checkChain(t, b, spans, roots[order], ids[order], order, want[order], h)
				})
			}
		})
	}
}

// relayConfig is the relay of the tests: fast polling, traced by tp.
func relayConfig(b broker, tp trace.TracerProvider) relay.Config {
	return relay.Config{
		Publisher:      b.pub,
		PollInterval:   20 * time.Millisecond,
		TracerProvider: tp,
		Logger:         slog.New(slog.DiscardHandler),
	}
}

// writeOrder commits one ORDER_PAID event through the generated writer
// and returns its event id.
func writeOrder(t *testing.T, ctx context.Context, db *sql.DB, order string) string {
	t.Helper()
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback()
	w, err := sqlevents.NewWriter(db)
	if err != nil {
		t.Fatal(err)
	}
	id, err := w.InsertOrderPaid(ctx, tx, sqlevents.OrderPaid{
		OrderID: order, CustomerID: "c-" + order, AmountCents: 1299, Currency: "EUR",
		Method: sqlevents.PaymentMethodCard, PaidAt: time.Now().UTC(),
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	return id.String()
}

// checkChain checks the spans of one order's trace.
func checkChain(t *testing.T, b broker, spans []sdktrace.ReadOnlySpan, root trace.SpanContext, id, order, outcome string, h *points) {
	inTrace := func(name string) []sdktrace.ReadOnlySpan { return named(spans, root.TraceID(), name) }
	// The writer: an event on the request span names the event.
	var req sdktrace.ReadOnlySpan
	for _, s := range spans {
		if s.SpanContext().SpanID() == root.SpanID() {
			req = s
		}
	}
	if req == nil || len(req.Events()) != 1 || req.Events()[0].Name != "outboxgen.event.written" || eventAttr(req.Events()[0].Attributes, "messaging.message.id") != id {
		t.Errorf("request span: want one outboxgen.event.written event for %s, got %+v", id, req)
	}

	// The relay: one producer span, child of the request, linked to it.
	sends := inTrace("send " + sqlevents.OrderPaidTopic)
	if len(sends) != 1 {
		t.Fatalf("%d send spans in the trace, want 1", len(sends))
	}
	send := sends[0]
	if send.SpanKind() != trace.SpanKindProducer || send.Parent().SpanID() != root.SpanID() || !send.Parent().IsRemote() {
		t.Errorf("send span: kind %v parent %v, want a producer span whose (remote) parent is the request span %s", send.SpanKind(), send.Parent().SpanID(), root.SpanID())
	}
	if len(send.Links()) != 1 || send.Links()[0].SpanContext.SpanID() != root.SpanID() {
		t.Errorf("send span links %+v, want one link to the request span (the creation context)", send.Links())
	}
	for k, v := range map[string]string{
		"messaging.system": b.system, "messaging.operation.name": "send", "messaging.operation.type": "send",
		"messaging.destination.name": sqlevents.OrderPaidTopic, "messaging.message.id": id,
		"outboxgen.event.type": sqlevents.OrderPaidType, "outboxgen.event.key": order,
	} {
		if got := attr(send, k); got != v {
			t.Errorf("send span %s = %q, want %q", k, got, v)
		}
	}
	if attr(send, "outboxgen.relay.batch.size") == "" || attr(send, "outboxgen.attempt") != "1" {
		t.Errorf("send span: batch size %q, attempt %q", attr(send, "outboxgen.relay.batch.size"), attr(send, "outboxgen.attempt"))
	}
	if send.Status().Code == codes.Error {
		t.Errorf("send span status %v", send.Status())
	}

	// The consumer: one process span per delivery, child of the send
	// span and linked to it; the handler ran in it.
	procs := inTrace("process " + sqlevents.OrderPaidTopic)
	if len(procs) != 1 {
		t.Fatalf("%d process spans, want 1 (one delivery)", len(procs))
	}
	proc := procs[0]
	if proc.SpanKind() != trace.SpanKindConsumer || proc.Parent().SpanID() != send.SpanContext().SpanID() || !proc.Parent().IsRemote() {
		t.Errorf("process span: kind %v parent %v, want a consumer span whose (remote) parent is the send span %s", proc.SpanKind(), proc.Parent().SpanID(), send.SpanContext().SpanID())
	}
	if len(proc.Links()) != 1 || proc.Links()[0].SpanContext.SpanID() != send.SpanContext().SpanID() {
		t.Errorf("process span links %+v, want one link to the send span", proc.Links())
	}
	for k, v := range map[string]string{
		"messaging.system": b.system, "messaging.operation.name": "process", "messaging.operation.type": "process",
		"messaging.destination.name": sqlevents.OrderPaidTopic, "messaging.message.id": id,
		"messaging.consumer.group.name": "points", "outboxgen.event.type": sqlevents.OrderPaidType,
		"outboxgen.outcome": outcome,
	} {
		if got := attr(proc, k); got != v {
			t.Errorf("process span %s = %q, want %q", k, got, v)
		}
	}
	calls := h.spans(order)
	for i, sc := range calls {
		if sc.SpanID() != proc.SpanContext().SpanID() {
			t.Errorf("handler call %d ran in span %s, want the process span %s", i+1, sc.SpanID(), proc.SpanContext().SpanID())
		}
	}
	var errEvents int
	for _, e := range proc.Events() {
		if e.Name == "exception" {
			errEvents++
		}
	}
	attempts, wantErrs, status := 1, 0, codes.Unset
	switch order {
	case orderRetry:
		attempts, wantErrs = 2, 1
	case orderPoison:
		attempts, wantErrs, status = 2, 2, codes.Error
	}
	if attr(proc, "outboxgen.attempt") != fmt.Sprint(attempts) || len(calls) != attempts || errEvents != wantErrs || proc.Status().Code != status {
		t.Errorf("process span: %s attempts (%d handler calls), %d exception events, status %v; want %d, %d, %v",
			attr(proc, "outboxgen.attempt"), len(calls), errEvents, proc.Status(), attempts, wantErrs, status)
	}

	// A processed order's handler wrote POINTS_CREDITED in the process
	// span: the relay publishes it in the same trace, a child of the
	// process span.
	if outcome == "processed" {
		follow := inTrace("send " + sqlevents.PointsCreditedTopic)
		if len(follow) != 1 || follow[0].Parent().SpanID() != proc.SpanContext().SpanID() {
			t.Errorf("follow-up event: %d send spans %v, want one, child of the process span", len(follow), follow)
		}
	}
}

// named returns the ended spans called name in trace id.
func named(spans []sdktrace.ReadOnlySpan, id trace.TraceID, name string) []sdktrace.ReadOnlySpan {
	var out []sdktrace.ReadOnlySpan
	for _, s := range spans {
		if s.SpanContext().TraceID() == id && s.Name() == name {
			out = append(out, s)
		}
	}
	return out
}
func attr(s sdktrace.ReadOnlySpan, key string) string {
	return eventAttr(s.Attributes(), key)
}

func eventAttr(kv []attribute.KeyValue, key string) string {
	for _, a := range kv {
		if string(a.Key) == key {
			return a.Value.String()
		}
	}
	return ""
}

// spanTree renders the spans of trace id as an indented tree, with their
// kind, status, the attributes worth reading and their links and events:
// what the README's observability section shows.
func spanTree(spans []sdktrace.ReadOnlySpan, id trace.TraceID) string {
	byParent := map[trace.SpanID][]sdktrace.ReadOnlySpan{}
	names := map[trace.SpanID]string{}
	var roots []sdktrace.ReadOnlySpan
	for _, s := range spans {
		if s.SpanContext().TraceID() != id {
			continue
		}
		names[s.SpanContext().SpanID()] = s.Name()
	}
	for _, s := range spans {
		if s.SpanContext().TraceID() != id {
			continue
		}
		if _, ok := names[s.Parent().SpanID()]; ok {
			byParent[s.Parent().SpanID()] = append(byParent[s.Parent().SpanID()], s)
		} else {
			roots = append(roots, s)
		}
	}
	var sb strings.Builder
	var walk func(s sdktrace.ReadOnlySpan, depth int)
	walk = func(s sdktrace.ReadOnlySpan, depth int) {
		indent, pad := "", strings.Repeat("    ", depth+1)
		if depth > 0 {
			indent = strings.Repeat("    ", depth-1) + "└── "
		}
		fmt.Fprintf(&sb, "%s%s  [%s", indent, s.Name(), s.SpanKind())
		if s.Status().Code == codes.Error {
			fmt.Fprintf(&sb, ", status Error")
		}
		fmt.Fprintf(&sb, ", %s]\n", s.EndTime().Sub(s.StartTime()).Round(10*time.Microsecond))
		var kv []string
		for _, a := range s.Attributes() {
			kv = append(kv, string(a.Key)+"="+a.Value.String())
		}
		if len(kv) > 0 {
			fmt.Fprintf(&sb, "%sattributes: %s\n", pad, strings.Join(kv, " "))
		}
		for _, l := range s.Links() {
			fmt.Fprintf(&sb, "%slink → %s (%s)\n", pad, names[l.SpanContext.SpanID()], l.SpanContext.SpanID())
		}
		for _, e := range s.Events() {
			var ea []string
			for _, a := range e.Attributes {
				v := a.Value.String()
				if len(v) > 60 {
					v = v[:57] + "..."
				}
				ea = append(ea, string(a.Key)+"="+v)
			}
			fmt.Fprintf(&sb, "%sevent %s: %s\n", pad, e.Name, strings.Join(ea, " "))
		}
		kids := byParent[s.SpanContext().SpanID()]
		sort.Slice(kids, func(i, j int) bool { return kids[i].StartTime().Before(kids[j].StartTime()) })
		for _, k := range kids {
			walk(k, depth+1)
		}
	}
	for _, r := range roots {
		walk(r, 0)
	}
	return sb.String()
}
