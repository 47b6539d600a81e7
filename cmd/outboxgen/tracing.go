package main

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/outboxgen/outboxgen/runtime/redact"
)

// installTracing makes the process export its spans (the relay's and the
// sweeper's "send <topic>" producer spans) with OTLP over HTTP when the
// standard variable OTEL_EXPORTER_OTLP_ENDPOINT or
// OTEL_EXPORTER_OTLP_TRACES_ENDPOINT is set, unless OTEL_TRACES_EXPORTER
// is "none". The exporter reads the other OTEL_EXPORTER_OTLP_* variables
// itself (headers, timeout, certificates, compression); the resource takes
// OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES (service.name defaults to
// "outboxgen-<command>"). Without those variables nothing is installed and
// tracing stays OpenTelemetry's no-op. The returned function flushes the
// spans still buffered and stops the exporter (at most 5s).
func installTracing(ctx context.Context, cmd string, log *slog.Logger) (shutdown func(), err error) {
	endpoint := os.Getenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
	if endpoint == "" {
		endpoint = os.Getenv("OTEL_EXPORTER_OTLP_ENDPOINT")
	}
	if endpoint == "" || strings.EqualFold(os.Getenv("OTEL_TRACES_EXPORTER"), "none") {
		return func() {}, nil
	}
	exp, err := otlptracehttp.New(ctx)
	if err != nil {
		return nil, fmt.Errorf("tracing: OTLP exporter for %s: %w", redact.URL(endpoint), err)
	}
	res, err := resource.New(ctx,
		resource.WithAttributes(attribute.String("service.name", "outboxgen-"+cmd)),
		resource.WithFromEnv(), resource.WithTelemetrySDK(), resource.WithHost())
	if err != nil {
		return nil, fmt.Errorf("tracing: resource: %w", err)
	}
	tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(exp), sdktrace.WithResource(res))
	otel.SetTracerProvider(tp)
	log.Info("exporting traces with OTLP over HTTP", slog.String("endpoint", redact.URL(endpoint)))
	return func() {
		ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		if err := tp.Shutdown(ctx); err != nil {
			log.Warn("flushing the last spans failed", slog.Any("error", err))
		}
	}, nil
}
