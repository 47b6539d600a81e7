package outbox

import (
	"context"
	"maps"
	"strings"

	"go.opentelemetry.io/otel/propagation"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"

	"github.com/outboxgen/outboxgen/runtime/internal/telemetry"
)

// Trace context: Insert and InsertTx store the span context of their ctx
// (OpenTelemetry, W3C "traceparent" and "tracestate") in the event's
// headers, so that the relay's publish and the consumer's handling join
// the trace of the request that wrote the event. Nothing is stored when
// ctx carries no span (no TracerProvider installed, or no span started),
// and a traceparent header the caller set with WithHeader(s) wins over the
// context's. Trace headers that would break the header limits are left
// out rather than failing the insert. WithTracePropagator changes what is
// stored (e.g. baggage too), WithoutTraceContext turns it off.

// WithTracePropagator makes the writer store what p injects for the
// insert's ctx, instead of the W3C trace context alone; e.g. with baggage:
//
//	outbox.WithTracePropagator(propagation.NewCompositeTextMapPropagator(
//		propagation.TraceContext{}, propagation.Baggage{}))
//
// or the application's global propagator, otel.GetTextMapPropagator().
// nil turns trace propagation off, as WithoutTraceContext does.
func WithTracePropagator(p propagation.TextMapPropagator) WriterOption {
	return func(w *Writer) { w.propagator = p }
}

// WithoutTraceContext stops the writer from storing the trace context of
// the insert's ctx in the event's headers.
func WithoutTraceContext() WriterOption {
	return func(w *Writer) { w.propagator = nil }
}

// withTrace returns headers with the trace headers added, unless the caller
// set one of them (theirs wins), or they would make the insert fail: a
// reserved name, the header limits, or the writer's message size cap
// (maxMessage, with payloadLen bytes of payload). Tracing never turns an
// insert that would succeed into one that fails.
func withTrace(headers, trace map[string]string, payloadLen, maxMessage int) map[string]string {
	if len(trace) == 0 {
		return headers
	}
	for k := range trace {
		if checkReservedHeader(k) != nil {
			return headers
		}
		for h := range headers {
			if strings.EqualFold(h, k) {
				return headers // the caller's own trace context wins
			}
		}
	}
	merged := make(map[string]string, len(headers)+len(trace))
	maps.Copy(merged, headers)
	maps.Copy(merged, trace)
	if CheckHeaders(merged) != nil {
		return headers
	}
	if maxMessage > 0 {
		size := payloadLen
		for k, v := range merged {
			size += len(k) + len(v)
		}
		if size > maxMessage {
			return headers
		}
	}
	return merged
}

// written adds an event naming the inserted event to the span of ctx,
// when it records.
func written(ctx context.Context, st Statement) {
	span := trace.SpanFromContext(ctx)
	if !span.IsRecording() {
		return
	}
	span.AddEvent("outboxgen.event.written", trace.WithAttributes(
		semconv.MessagingMessageID(st.ID.String()),
		telemetry.EventTypeKey.String(st.typ),
		semconv.MessagingDestinationName(st.topic),
	))
}
