package telemetry

import (
	"context"
	"sync"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/propagation"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"
)

// Metric names of the relay (OpenTelemetry style; a Prometheus exporter
// shows them as outboxgen_relay_published_total and so on).
const (
	MetricPublished       = "outboxgen.relay.published"
	MetricPublishFailures = "outboxgen.relay.publish.failures"
	MetricHedged          = "outboxgen.relay.hedged"
	MetricRescheduled     = "outboxgen.relay.rescheduled"
	MetricMarkedFailed    = "outboxgen.relay.marked_failed"
	MetricPublishDuration = "outboxgen.relay.publish.duration"
	MetricPublishLag      = "outboxgen.relay.publish.lag"
	MetricClaimDuration   = "outboxgen.relay.claim.duration"
	MetricBatchSize       = "outboxgen.relay.batch.size"
	MetricInFlight        = "outboxgen.relay.in_flight"
	MetricBreakerOpen     = "outboxgen.relay.breaker.open"
	MetricSweeperRescued  = "outboxgen.sweeper.rescued"
)

// Error types (error.type) of failed publishes.
const (
	ErrorPermanent   = "permanent"   // marked FAILED at once
	ErrorInterrupted = "interrupted" // cut off by shutdown, lease, PublishTimeout or a hedge's split: released
	ErrorAbandoned   = "abandoned"   // still running at ShutdownTimeout
	ErrorTransient   = "transient"   // charged an attempt, retried with backoff
)

// DurationBuckets are the histogram bucket bounds, in seconds, of the
// publish and handler durations.
var DurationBuckets = []float64{0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30}

// LagBuckets are the bucket bounds, in seconds, of the end-to-end lags.
var LagBuckets = []float64{0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800, 3600}

// Relay is the relay's tracer and instruments.
type Relay struct {
	tracer   trace.Tracer
	prop     propagation.TextMapPropagator
	system   attribute.KeyValue
	sweeper  bool
	classify func(context.Context, error) string

	published, failures, rescheduled, markedFailed, rescued, hedged metric.Int64Counter
	publishDur, lag, claimDur                                       metric.Float64Histogram
	batchSize                                                       metric.Int64Histogram
	inFlight, breaker                                               metric.Int64Gauge
	// component ("relay" or "sweeper") tells the series of the two
	// relays a runner runs apart: their gauges would overwrite each other.
	component metric.MeasurementOption

	mu    sync.RWMutex
	attrs map[typeTopic]metric.MeasurementOption // cached per event type and topic
}

type typeTopic struct{ typ, topic string }

// RelayScope is the relay's instrumentation scope.
const RelayScope = ScopeName + "/runtime/relay"

// NewRelay makes the relay's tracer and instruments from tp and mp;
// publisher names the messaging system; sweeper says that the relay
// rescues overdue rows (package sweeper); classify gives a failed
// publish its error.type (ErrorType when nil).
func NewRelay(tp trace.TracerProvider, mp metric.MeterProvider, publisher any, sweeper bool, classify func(context.Context, error) string) (*Relay, error) {
	if classify == nil {
		classify = ErrorType
	}
	t := &Relay{
		tracer:    tp.Tracer(RelayScope),
		prop:      TraceContext,
		system:    System(publisher),
		sweeper:   sweeper,
		component: metric.WithAttributes(attribute.String("component", map[bool]string{false: "relay", true: "sweeper"}[sweeper])),
		classify:  classify,
	}
	m := mp.Meter(RelayScope)
	var err error
	counter := func(dst *metric.Int64Counter, name, desc string) {
		if err == nil {
			*dst, err = m.Int64Counter(name, metric.WithUnit("{message}"), metric.WithDescription(desc))
		}
	}
	seconds := func(dst *metric.Float64Histogram, name, desc string, buckets []float64) {
		if err == nil {
			*dst, err = m.Float64Histogram(name, metric.WithUnit("s"), metric.WithDescription(desc), metric.WithExplicitBucketBoundaries(buckets...))
		}
	}
	counter(&t.published, MetricPublished, "Messages the broker accepted, by event type and topic.")
	counter(&t.failures, MetricPublishFailures, "Publish attempts that failed, by event type, topic and error.type (permanent, transient, interrupted, abandoned); a hedged publish (relay Config.Hedge) counts once, failed when all its calls failed.")
	counter(&t.hedged, MetricHedged, "Publishes sent a second time because the first ran past the hedge delay (relay Config.Hedge), by event type and topic.")
	counter(&t.rescheduled, MetricRescheduled, "Failed publishes recorded for a later retry (with backoff), by event type and topic.")
	counter(&t.markedFailed, MetricMarkedFailed, "Outbox rows marked FAILED (attempts exhausted or a permanent error), by event type and topic: they wait for an operator.")
	counter(&t.rescued, MetricSweeperRescued, "Overdue rows the sweeper published, by event type and topic.")
	seconds(&t.publishDur, MetricPublishDuration, "Duration of one publish to the broker, by event type, topic and error.type (empty on success); a hedged publish until its first call succeeded or all failed.", DurationBuckets)
	seconds(&t.lag, MetricPublishLag, "Time from the event's insert (created_at) to its publish, by event type and topic.", LagBuckets)
	seconds(&t.claimDur, MetricClaimDuration, "Duration of one claim (with the recording of the previous results).", DurationBuckets)
	if err == nil {
		t.batchSize, err = m.Int64Histogram(MetricBatchSize, metric.WithUnit("{row}"),
			metric.WithDescription("Rows returned by one claim."),
			metric.WithExplicitBucketBoundaries(0, 1, 2, 5, 10, 20, 50, 100, 200, 500, 1000))
	}
	if err == nil {
		t.inFlight, err = m.Int64Gauge(MetricInFlight, metric.WithUnit("{row}"),
			metric.WithDescription("Rows leased by the relay and not recorded yet (publishing or waiting for a slot)."))
	}
	if err == nil {
		t.breaker, err = m.Int64Gauge(MetricBreakerOpen,
			metric.WithDescription("1 while the relay's circuit breaker is open (the broker is judged down), else 0."))
	}
	if err != nil {
		return nil, err
	}
	return t, nil
}

// set returns the cached attributes (event_type, topic) of an event type
// and topic, as a measurement option.
func (t *Relay) set(typ, topic string) metric.MeasurementOption {
	k := typeTopic{typ, topic}
	t.mu.RLock()
	o, ok := t.attrs[k]
	t.mu.RUnlock()
	if ok {
		return o
	}
	o = metric.WithAttributeSet(attribute.NewSet(attribute.String("event_type", typ), attribute.String("topic", topic)))
	t.mu.Lock()
	if t.attrs == nil {
		t.attrs = map[typeTopic]metric.MeasurementOption{}
	}
	t.attrs[k] = o
	t.mu.Unlock()
	return o
}

var (
	producer = trace.WithSpanKind(trace.SpanKindProducer)
	consumer = trace.WithSpanKind(trace.SpanKindConsumer)
)

// StartOptions returns the options of a span of kind (trace.SpanKindProducer
// or trace.SpanKindConsumer) linked to sc when it is valid.
func StartOptions(kind trace.SpanKind, sc trace.SpanContext) []trace.SpanStartOption {
	k := producer
	if kind == trace.SpanKindConsumer {
		k = consumer
	}
	if !sc.IsValid() {
		return []trace.SpanStartOption{k}
	}
	return []trace.SpanStartOption{k, trace.WithLinks(trace.Link{SpanContext: sc})}
}

// Message describes the row a send span is about.
type Message struct {
	Topic, Type, EventID, Key string
	Sequence                  int64
	Attempt                   int
	CreatedAt                 time.Time
}

// StartSend starts the producer span ("send <topic>") of one message. The
// span's parent is the creation context the writer stored in the row's
// headers (now in md), so that the publish belongs to the trace of the
// request that wrote the event, and it links to that context as the
// messaging conventions ask of a send span. It then injects its own
// context into md (traceparent, tracestate), so the consumer's span
// follows it. With no TracerProvider installed, the stored context passes
// through unchanged. md may be nil (the message could not be built): then
// only the metrics count the failure. The returned function ends the span
// with the publish's error and records the publish metrics.
func (t *Relay) StartSend(ctx context.Context, md map[string]string, m Message) (context.Context, func(error)) {
	start := time.Now()
	var span trace.Span
	if md != nil {
		parent, sc := Extract(ctx, t.prop, md)
		ctx, span = t.tracer.Start(parent, "send "+m.Topic, StartOptions(trace.SpanKindProducer, sc)...)
		if span.IsRecording() {
			attrs := []attribute.KeyValue{
				t.system,
				semconv.MessagingOperationName("send"),
				semconv.MessagingOperationTypeSend,
				semconv.MessagingDestinationName(m.Topic),
				semconv.MessagingMessageID(m.EventID),
				EventTypeKey.String(m.Type),
				EventKeyKey.String(m.Key),
				SequenceKey.Int64(m.Sequence),
				AttemptKey.Int(m.Attempt),
			}
			if n := BatchSize(ctx); n > 0 {
				attrs = append(attrs, BatchSizeKey.Int(n))
			}
			if t.sweeper {
				attrs = append(attrs, SweeperKey.Bool(true))
			}
			span.SetAttributes(attrs...)
		}
		Inject(ctx, t.prop, md)
	}
	return ctx, func(err error) {
		set := t.set(m.Type, m.Topic)
		bg := context.Background()
		took := time.Since(start).Seconds()
		if err == nil {
			t.published.Add(bg, 1, set)
			t.publishDur.Record(bg, took, set)
			if !m.CreatedAt.IsZero() {
				t.lag.Record(bg, time.Since(m.CreatedAt).Seconds(), set)
			}
			if t.sweeper {
				t.rescued.Add(bg, 1, set)
			}
			if span != nil {
				span.End()
			}
			return
		}
		et := t.classify(ctx, err)
		kv := metric.WithAttributes(attribute.String("event_type", m.Type), attribute.String("topic", m.Topic), semconv.ErrorTypeKey.String(et))
		t.failures.Add(bg, 1, kv)
		t.publishDur.Record(bg, took, kv)
		if span != nil {
			span.SetAttributes(semconv.ErrorTypeKey.String(et))
			RecordError(span, err, "")
			span.End()
		}
	}
}

// Hedged counts a publish sent a second time (a hedge) beside the first,
// and marks it on the send span of ctx.
func (t *Relay) Hedged(ctx context.Context, typ, topic string, after time.Duration) {
	t.hedged.Add(context.Background(), 1, t.set(typ, topic))
	if span := trace.SpanFromContext(ctx); span.IsRecording() {
		span.AddEvent("hedge", trace.WithAttributes(HedgeAfterKey.Float64(after.Seconds())))
	}
}

// ErrorType is the default classification of a failed publish:
// interrupted when ctx is done, else transient.
func ErrorType(ctx context.Context, _ error) string {
	if ctx.Err() != nil {
		return ErrorInterrupted
	}
	return ErrorTransient
}

// Claimed records one claim: how long it took, how many rows it returned,
// the rows in flight after it and the circuit breaker's state.
func (t *Relay) Claimed(took time.Duration, rows, inFlight int, breakerOpen bool) {
	bg := context.Background()
	t.claimDur.Record(bg, took.Seconds(), t.component)
	t.batchSize.Record(bg, int64(rows), t.component)
	t.inFlight.Record(bg, int64(inFlight), t.component)
	t.Breaker(breakerOpen)
}

// InFlight records the rows in flight.
func (t *Relay) InFlight(n int) { t.inFlight.Record(context.Background(), int64(n), t.component) }

// Breaker records the circuit breaker's state.
func (t *Relay) Breaker(open bool) {
	v := int64(0)
	if open {
		v = 1
	}
	t.breaker.Record(context.Background(), v, t.component)
}

// Failure is a recorded failure: its row's event type and topic, and
// whether the recording marked it FAILED.
type Failure struct {
	Type, Topic string
	Failed      bool
}

// Recorded counts recorded failures: rescheduled for a retry, or marked
// FAILED.
func (t *Relay) Recorded(fs []Failure) {
	bg := context.Background()
	for _, f := range fs {
		set := t.set(f.Type, f.Topic)
		if f.Failed {
			t.markedFailed.Add(bg, 1, set)
		} else {
			t.rescheduled.Add(bg, 1, set)
		}
	}
}
