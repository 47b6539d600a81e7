package relay

// Tracing and metrics of the relay. The logic lives in
// runtime/internal/telemetry; relay.go and pipeline.go call these hooks.

import (
	"context"
	"errors"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"go.opentelemetry.io/otel"

	"github.com/outboxgen/outboxgen/runtime/driver"
	"github.com/outboxgen/outboxgen/runtime/internal/telemetry"
)

// newTelemetry makes the relay's tracer and instruments from opts
// (TracerProvider and MeterProvider, the global ones when nil).
func newTelemetry(opts Config) (*telemetry.Relay, error) {
	tp, mp := opts.TracerProvider, opts.MeterProvider
	if tp == nil {
		tp = otel.GetTracerProvider()
	}
	if mp == nil {
		mp = otel.GetMeterProvider()
	}
	return telemetry.NewRelay(tp, mp, opts.Publisher, opts.OverdueAfter > 0, publishErrorType)
}

// publishErrorType is the error.type of a failed publish.
func publishErrorType(ctx context.Context, err error) string {
	switch {
	case errors.Is(err, ErrPermanent):
		return telemetry.ErrorPermanent
	case errors.Is(err, errAbandoned):
		return telemetry.ErrorAbandoned
	}
	return telemetry.ErrorType(ctx, err)
}

// startSend starts the producer span of rw's message (msg is nil when it
// could not be built), injects its context into msg and returns the
// function that ends it with the publish's error.
func (r *Relay) startSend(ctx context.Context, msg *message.Message, rw driver.Row) func(error) {
	var md map[string]string
	if msg != nil {
		md = msg.Metadata
	}
	sctx, end := r.tel.StartSend(ctx, md, telemetry.Message{
		Topic: rw.Topic, Type: rw.Type, EventID: rw.EventID, Key: rw.Key,
		Sequence: rw.ID, Attempt: rw.RetryCount + 1, CreatedAt: rw.CreatedAt,
	})
	if msg != nil {
		msg.SetContext(sctx) // publishers that trace see the send span
	}
	return end
}

// observeClaim records a claim that started at start and returned rows
// rows, with inFlight rows leased and unrecorded after it.
func (r *Relay) observeClaim(start time.Time, rows, inFlight int) {
	r.tel.Claimed(time.Since(start), rows, inFlight, r.brk.open)
}

// observeRecorded counts the failures of rec by what the recording did
// with them: marked FAILED (got.Failed) or rescheduled; failures the
// recording did not record (the lease was lost) are not counted. It also
// records the rows in flight and the circuit breaker's state (a batch
// judged an outage releases its rows through a recording).
func (r *Relay) observeRecorded(rec *driver.Results, got driver.Recorded, inFlight int) {
	r.tel.InFlight(inFlight)
	r.tel.Breaker(r.brk.open)
	if rec == nil || len(rec.Failures) == 0 {
		return
	}
	failed := make(map[int64]bool, len(got.Failed))
	for _, id := range got.Failed {
		failed[id] = true
	}
	retried := got.Retried - int64(len(got.Failed))
	fs := make([]telemetry.Failure, 0, len(rec.Failures))
	for _, f := range rec.Failures {
		switch {
		case failed[f.Row.ID]:
			fs = append(fs, telemetry.Failure{Type: f.Row.Type, Topic: f.Row.Topic, Failed: true})
		case retried > 0:
			retried--
			fs = append(fs, telemetry.Failure{Type: f.Row.Type, Topic: f.Row.Topic})
		}
	}
	r.tel.Recorded(fs)
}

// withBatchSize marks a batch's context with its claimed row count.
func withBatchSize(ctx context.Context, n int) context.Context {
	return telemetry.WithBatchSize(ctx, n)
}
