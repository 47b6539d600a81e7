// Package telemetry holds the tracing and metrics helpers that the writer
// (package outbox), the relay and the consumers (package inbox) share: the
// W3C trace context carried in outbox headers and message metadata, the
// OpenTelemetry messaging attributes, and the relay's instruments. It uses
// the OpenTelemetry API only: everything is a no-op until the application
// installs a TracerProvider or MeterProvider (or passes one in a Config).
package telemetry

import (
	"context"
	"fmt"
	"reflect"
	"strings"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"

	"github.com/outboxgen/outboxgen/runtime/dialect"
	"github.com/outboxgen/outboxgen/runtime/redact"
)

// ScopeName is the instrumentation scope (tracer and meter name) prefix;
// each package uses ScopeName + "/runtime/<package>".
const ScopeName = "github.com/outboxgen/outboxgen"

// Attribute keys of outboxgen's own span and metric attributes (the
// messaging ones come from the OpenTelemetry semantic conventions).
const (
	// EventTypeKey is the event type (biz_type), e.g. ORDER_PAID.
	EventTypeKey = attribute.Key("outboxgen.event.type")
	// EventKeyKey is the aggregate key (biz_id).
	EventKeyKey = attribute.Key("outboxgen.event.key")
	// SequenceKey is the outbox row id.
	SequenceKey = attribute.Key("outboxgen.outbox.sequence")
	// AttemptKey is the attempt number of a publish (the relay: retry
	// count + 1) or of a delivery (the consumer: in-process attempts).
	AttemptKey = attribute.Key("outboxgen.attempt")
	// BatchSizeKey is the number of rows claimed with the message
	// (messaging.batch.message_count is for spans of batch operations,
	// and every send span covers one message).
	BatchSizeKey = attribute.Key("outboxgen.relay.batch.size")
	// OutcomeKey is a delivery's outcome (processed, duplicate, stale,
	// unhandled, failed, permanent, poisoned).
	OutcomeKey = attribute.Key("outboxgen.outcome")
	// ConsumerKey is the consumer name (also messaging.consumer.group.name).
	ConsumerKey = attribute.Key("outboxgen.consumer")
	// HedgeAfterKey is, on a send span's "hedge" event, how long the
	// first publish had run when the relay sent the message again.
	HedgeAfterKey = attribute.Key("outboxgen.hedge.after_seconds")
	// SweeperKey marks the send spans of the sweeper (rescues of overdue
	// rows).
	SweeperKey = attribute.Key("outboxgen.sweeper")
)

// TraceContext is the propagator the writer, the relay and the consumers
// use by default: W3C traceparent and tracestate.
var TraceContext propagation.TextMapPropagator = propagation.TraceContext{}

// WithBaggage is TraceContext plus W3C baggage.
var WithBaggage propagation.TextMapPropagator = propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{})

// Headers returns the headers p injects for the context of ctx (nil when
// there is none: no valid span context and, with baggage, no baggage).
func Headers(ctx context.Context, p propagation.TextMapPropagator) map[string]string {
	if p == nil {
		return nil
	}
	if _, ok := p.(propagation.TraceContext); ok && !trace.SpanContextFromContext(ctx).IsValid() {
		return nil // the common case without tracing: no allocation
	}
	h := propagation.MapCarrier{}
	p.Inject(ctx, h)
	if len(h) == 0 {
		return nil
	}
	return h
}

// Extract returns ctx with the remote span context (and baggage, for a
// propagator that carries it) found in md, and that span context.
func Extract(ctx context.Context, p propagation.TextMapPropagator, md map[string]string) (context.Context, trace.SpanContext) {
	if p == nil || len(md) == 0 {
		return ctx, trace.SpanContext{}
	}
	ctx = p.Extract(ctx, propagation.MapCarrier(md))
	return ctx, trace.SpanContextFromContext(ctx)
}

// Inject writes the context of ctx into md (overwriting the fields p
// owns).
func Inject(ctx context.Context, p propagation.TextMapPropagator, md map[string]string) {
	if p == nil || md == nil {
		return
	}
	p.Inject(ctx, propagation.MapCarrier(md))
}

// System returns the messaging.system attribute of a watermill publisher
// or subscriber: its own answer when it has a MessagingSystem method
// (natsjs, kafka), else a guess from its package path (the watermill
// adapters), else "_OTHER".
func System(v any) attribute.KeyValue {
	if s, ok := v.(interface{ MessagingSystem() string }); ok {
		if name := s.MessagingSystem(); name != "" {
			return semconv.MessagingSystemKey.String(name)
		}
	}
	t := reflect.TypeOf(v)
	for t != nil && (t.Kind() == reflect.Pointer || t.Kind() == reflect.Interface) {
		t = t.Elem()
	}
	if t == nil {
		return semconv.MessagingSystemKey.String("_OTHER")
	}
	path := strings.ToLower(t.PkgPath())
	switch {
	case strings.Contains(path, "kafka"):
		return semconv.MessagingSystemKafka
	case strings.Contains(path, "nats"):
		return semconv.MessagingSystemKey.String("nats")
	case strings.Contains(path, "amqp"):
		return semconv.MessagingSystemRabbitMQ
	case strings.Contains(path, "redis"):
		return semconv.MessagingSystemKey.String("redis")
	case strings.Contains(path, "gochannel"):
		return semconv.MessagingSystemKey.String("gochannel")
	}
	return semconv.MessagingSystemKey.String("_OTHER")
}

type batchKey struct{}

// WithBatchSize records, in the context a claimed batch publishes under,
// how many rows the claim returned; the send spans report it.
func WithBatchSize(ctx context.Context, n int) context.Context {
	return context.WithValue(ctx, batchKey{}, n)
}

// BatchSize returns what WithBatchSize stored (0 when nothing).
func BatchSize(ctx context.Context) int {
	n, _ := ctx.Value(batchKey{}).(int)
	return n
}

// ErrorText is err's text as last_error, the logs and spans hold it:
// credentials masked (package redact), since a broker's or database's text
// may quote a URL or a DSN, cut to dialect.ErrorTextLimit (it may echo a
// payload) on a rune boundary, valid UTF-8 and free of NUL bytes
// (PostgreSQL text columns and OTLP refuse anything else; see
// dialect.TruncateError). It is cut well past that size before it
// is scanned, so a megabyte echoed by the broker costs nothing, and a
// secret straddling the first cut lies beyond the second.
func ErrorText(err error) string {
	s := err.Error()
	if n := 4 * dialect.ErrorTextLimit; len(s) > n {
		s = s[:n]
	}
	return dialect.TruncateError(redact.String(s))
}

// RecordError adds an "exception" event for err to span (type and
// ErrorText, plus attrs) and marks the span failed with statusPrefix and
// the same text.
func RecordError(span trace.Span, err error, statusPrefix string, attrs ...attribute.KeyValue) {
	msg := ErrorText(err)
	span.AddEvent("exception", trace.WithAttributes(append([]attribute.KeyValue{
		attribute.String("exception.type", fmt.Sprintf("%T", err)),
		attribute.String("exception.message", msg),
	}, attrs...)...))
	span.SetStatus(codes.Error, statusPrefix+msg)
}
