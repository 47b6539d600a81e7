package telemetry_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"go.opentelemetry.io/otel/propagation"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
	tnoop "go.opentelemetry.io/otel/trace/noop"

	"github.com/outboxgen/outboxgen/runtime/internal/telemetry"
)

// tracerProvider is one side of the overhead measurement: tracing off (no
// provider installed: OpenTelemetry's no-op) or a recording SDK provider
// (every span sampled and recorded, exported nowhere).
func tracerProvider(b *testing.B, name string) trace.TracerProvider {
	if name == "off" {
		return tnoop.NewTracerProvider()
	}
	tp := sdktrace.NewTracerProvider(sdktrace.WithSampler(sdktrace.AlwaysSample()))
	b.Cleanup(func() { tp.Shutdown(context.Background()) })
	return tp
}

// BenchmarkStartSend is the relay's per-message tracing and metrics cost:
// extract the writer's context from the row's headers, start and end the
// producer span, inject its context, count the publish.
func BenchmarkStartSend(b *testing.B) {
	for _, name := range []string{"off", "recording"} {
		b.Run(name, func(b *testing.B) {
			// Metrics on in both (the runner always serves them).
			mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(sdkmetric.NewManualReader()))
			defer mp.Shutdown(context.Background())
			tr, err := telemetry.NewRelay(tracerProvider(b, name), mp, nil, false, nil)
			if err != nil {
				b.Fatal(err)
			}
			// The writer's context, as stored in the row's headers.
			wctx, span := sdktrace.NewTracerProvider().Tracer("w").Start(context.Background(), "request")
			span.End()
			stored := propagation.MapCarrier{}
			propagation.TraceContext{}.Inject(wctx, stored)
			m := telemetry.Message{Topic: "orders.paid", Type: "ORDER_PAID", EventID: "0190b1d2-7c3e-7b4a-9f00-000000000001", Key: "o-1", Sequence: 1, Attempt: 1, CreatedAt: time.Now()}
			b.ReportAllocs()
			for b.Loop() {
				md := map[string]string{"traceparent": stored["traceparent"], "outbox_type": "ORDER_PAID"}
				_, end := tr.StartSend(context.Background(), md, m)
				end(nil)
			}
		})
	}
}

// BenchmarkHeaders is the writer's per-insert cost: the trace headers of
// the insert's ctx (none without a span).
func BenchmarkHeaders(b *testing.B) {
	for _, name := range []string{"off", "recording"} {
		b.Run(name, func(b *testing.B) {
			ctx := context.Background()
			if name == "recording" {
				var span trace.Span
				ctx, span = tracerProvider(b, name).Tracer("w").Start(ctx, "request")
				defer span.End()
			}
			b.ReportAllocs()
			for b.Loop() {
				if h := telemetry.Headers(ctx, telemetry.TraceContext); (h == nil) != (name == "off") {
					b.Fatal(errors.New("unexpected headers"))
				}
			}
		})
	}
}
