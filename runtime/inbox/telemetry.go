package inbox

import (
	"context"
	"fmt"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/metric"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"

	"github.com/outboxgen/outboxgen/runtime/internal/telemetry"
	"github.com/outboxgen/outboxgen/runtime/outbox"
)

// Scope is the instrumentation scope (tracer and meter name) of the
// consumers.
const Scope = telemetry.ScopeName + "/runtime/inbox"

// Metric names of the consumers (a Prometheus exporter shows them as
// outboxgen_inbox_deliveries_total, outboxgen_inbox_handler_duration_seconds
// and outboxgen_inbox_lag_seconds).
const (
	MetricDeliveries      = "outboxgen.inbox.deliveries"
	MetricHandlerDuration = "outboxgen.inbox.handler.duration"
	MetricLag             = "outboxgen.inbox.lag"
)

// OutcomePoisoned is a delivery that went to the poison topic (after its
// last failed attempt, or at once for a permanent failure): counted once
// per delivery, next to that attempt's own outcome (failed or permanent).
const OutcomePoisoned = "poisoned"

// instruments are a consumer's tracer and instruments.
type instruments struct {
	tracer     trace.Tracer
	system     attribute.KeyValue
	counter    metric.Int64Counter
	handlerDur metric.Float64Histogram
	lag        metric.Float64Histogram
}

func newInstruments(cfg Config, sub message.Subscriber) (*instruments, error) {
	m := cfg.MeterProvider.Meter(Scope)
	in := &instruments{tracer: cfg.TracerProvider.Tracer(Scope), system: telemetry.System(sub)}
	var err error
	in.counter, err = m.Int64Counter(MetricDeliveries,
		metric.WithDescription("Message deliveries handled by outboxgen consumers, by outcome."),
		metric.WithUnit("{delivery}"))
	if err == nil {
		in.handlerDur, err = m.Float64Histogram(MetricHandlerDuration, metric.WithUnit("s"),
			metric.WithDescription("Duration of one attempt at a delivery (its transaction: inbox record, stale guard, handler, commit), by consumer, event type and outcome."),
			metric.WithExplicitBucketBoundaries(telemetry.DurationBuckets...))
	}
	if err == nil {
		in.lag, err = m.Float64Histogram(MetricLag, metric.WithUnit("s"),
			metric.WithDescription("End-to-end lag: from the event's insert into the outbox (created_at) to its processing by the consumer, by consumer and event type."),
			metric.WithExplicitBucketBoundaries(telemetry.LagBuckets...))
	}
	return in, err
}

// delivery is what the attempts at one delivery tell its span.
type delivery struct {
	attempts  int
	eventType string
	outcome   string
	err       error // the last attempt's
}

type deliveryKey struct{}

// middleware runs each delivery (all its in-process attempts, and the
// poison queue) in a consumer span "process <topic>". The span's parent
// is the context the relay injected into the message (its send span, or
// the writer's span when the relay does not trace), so one trace runs from
// the request that wrote the event to the handler; it also links to it,
// as the messaging conventions ask of a process span. The handler's ctx
// carries the span, so the handler's own spans (database calls, follow-up
// events written with InsertX) are its children.
func (in *instruments) middleware(consumer, topic string) message.HandlerMiddleware {
	base := []attribute.KeyValue{
		in.system,
		semconv.MessagingOperationName("process"),
		semconv.MessagingOperationTypeProcess,
		semconv.MessagingDestinationName(topic),
		semconv.MessagingConsumerGroupName(consumer),
		telemetry.ConsumerKey.String(consumer),
	}
	name := "process " + topic
	return func(next message.HandlerFunc) message.HandlerFunc {
		return func(msg *message.Message) ([]*message.Message, error) {
			orig := msg.Context()
			parent, sc := telemetry.Extract(orig, telemetry.WithBaggage, msg.Metadata)
			ctx, span := in.tracer.Start(parent, name, telemetry.StartOptions(trace.SpanKindConsumer, sc)...)
			d := &delivery{}
			msg.SetContext(context.WithValue(ctx, deliveryKey{}, d))
			out, err := next(msg)
			msg.SetContext(orig)
			outcome := d.outcome
			if err == nil && d.err != nil {
				// The poison queue published it and acked.
				outcome = OutcomePoisoned
				in.count(ctx, consumer, d.eventType, OutcomePoisoned)
			}
			if span.IsRecording() {
				id := msg.Metadata.Get(outbox.MetadataEventID)
				if id == "" {
					id = msg.UUID
				}
				span.SetAttributes(base...)
				span.SetAttributes(
					semconv.MessagingMessageID(id),
					telemetry.EventTypeKey.String(d.eventType),
					telemetry.OutcomeKey.String(outcome),
					telemetry.AttemptKey.Int(d.attempts),
				)
				switch {
				case err != nil:
					span.SetStatus(codes.Error, telemetry.ErrorText(err))
				case outcome == OutcomePoisoned:
					span.SetStatus(codes.Error, "poisoned: "+telemetry.ErrorText(d.err))
				}
			}
			span.End()
			return out, err
		}
	}
}

func (in *instruments) count(ctx context.Context, consumer, eventType, outcome string, attrs ...attribute.KeyValue) {
	in.counter.Add(context.WithoutCancel(ctx), 1, metric.WithAttributes(append([]attribute.KeyValue{
		attribute.String("consumer", consumer),
		attribute.String("event_type", eventType),
		attribute.String("outcome", outcome),
	}, attrs...)...))
}

// stopped counts a delivery given back while it waited between attempts
// (OutcomeStopped) and tells its span, without an attempt's duration: the
// attempt before the wait was counted on its own.
func (h *handler[T]) stopped(ctx context.Context, m outbox.Meta, err error) {
	h.count(ctx, m.Type, OutcomeStopped)
	if d, _ := ctx.Value(deliveryKey{}).(*delivery); d != nil {
		d.eventType, d.outcome, d.err = m.Type, OutcomeStopped, err
	}
}

// settle counts one attempt at a delivery with its outcome, records its
// duration (and, when processed, the end-to-end lag), and tells the
// delivery's span: a failed attempt is recorded on it as an error event.
func (h *handler[T]) settle(ctx context.Context, start time.Time, eventType string, created time.Time, outcome string, err error) {
	h.count(ctx, eventType, outcome)
	in := h.in
	kv := metric.WithAttributes(attribute.String("consumer", h.name), attribute.String("event_type", eventType), attribute.String("outcome", outcome))
	bg := context.WithoutCancel(ctx)
	if _, routed := h.routes[eventType]; routed {
		// Only this consumer's types: event_type of anything else that
		// arrives on the topic is unchecked input (the buckets multiply
		// its cardinality).
		in.handlerDur.Record(bg, time.Since(start).Seconds(), kv)
	}
	if outcome == OutcomeProcessed && !created.IsZero() {
		in.lag.Record(bg, time.Since(created).Seconds(), metric.WithAttributes(attribute.String("consumer", h.name), attribute.String("event_type", eventType)))
	}
	d, _ := ctx.Value(deliveryKey{}).(*delivery)
	if d == nil {
		return
	}
	d.attempts++
	d.eventType, d.outcome, d.err = eventType, outcome, err
	if err != nil {
		if span := trace.SpanFromContext(ctx); span.IsRecording() {
			// The event only: the span's status is set once, for the delivery.
			span.AddEvent("exception", trace.WithAttributes(
				attribute.String("exception.type", fmt.Sprintf("%T", err)),
				attribute.String("exception.message", telemetry.ErrorText(err)),
				telemetry.AttemptKey.Int(d.attempts), telemetry.OutcomeKey.String(outcome)))
		}
	}
}
