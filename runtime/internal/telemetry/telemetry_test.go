package telemetry_test

import (
	"context"
	"testing"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/outboxgen/outboxgen/runtime/internal/telemetry"
)

type named struct{}

func (named) MessagingSystem() string { return "pulsar" }

type anonymous struct{}

func TestSystem(t *testing.T) {
	ps := gochannel.NewGoChannel(gochannel.Config{}, watermill.NopLogger{})
	defer ps.Close()
	for _, c := range []struct {
		v    any
		want string
	}{{named{}, "pulsar"}, {ps, "gochannel"}, {&anonymous{}, "_OTHER"}, {nil, "_OTHER"}} {
		if got := telemetry.System(c.v).Value.AsString(); got != c.want {
			t.Errorf("System(%T) = %q, want %q", c.v, got, c.want)
		}
	}
}

func TestHeadersRoundTrip(t *testing.T) {
	if h := telemetry.Headers(context.Background(), telemetry.TraceContext); h != nil {
		t.Errorf("no span: %v", h)
	}
	tp := sdktrace.NewTracerProvider()
	ctx, span := tp.Tracer("t").Start(context.Background(), "s")
	defer span.End()
	h := telemetry.Headers(ctx, telemetry.WithBaggage)
	if len(h) != 1 || h["traceparent"] == "" {
		t.Fatalf("headers %v, want a traceparent alone", h)
	}
	_, sc := telemetry.Extract(context.Background(), telemetry.TraceContext, h)
	if sc.TraceID() != span.SpanContext().TraceID() || sc.SpanID() != span.SpanContext().SpanID() || !sc.IsRemote() {
		t.Errorf("extracted %v, want the span's context, remote", sc)
	}
	if got := telemetry.BatchSize(telemetry.WithBatchSize(ctx, 7)); got != 7 {
		t.Errorf("batch size %d", got)
	}
}
