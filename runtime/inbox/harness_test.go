package inbox

import (
	"context"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/message/router/middleware"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/outboxgen/outboxgen/runtime/dialect"
	"github.com/outboxgen/outboxgen/runtime/outbox"
	"github.com/outboxgen/outboxgen/templates"
)

// This file is shared with the external tests (package inbox_test), hence
// the exported names.

// harnessPoisonTopic is the topic of a Harness's poison queue.
const harnessPoisonTopic = "poison"

// Harness is what a test needs to run consumers on an in-memory message
// bus: a gochannel pubsub, a subscription to its poison topic, a router on
// it and a metric reader for the consumers' deliveries. Close it when done
// (defer h.Close()), as an httptest.Server.
type Harness struct {
	t        *testing.T
	PubSub   *gochannel.GoChannel
	Poisoned <-chan *message.Message // what is put on the poison topic
	Router   *message.Router
	Reader   *sdkmetric.ManualReader
	stopped  chan struct{} // closed when Router.Run returned; nil until Run
}

// NewHarness returns a Harness whose router is not running yet: register
// the consumers, then Run it.
func NewHarness(t *testing.T) *Harness {
	t.Helper()
	logger := watermill.NopLogger{}
	h := &Harness{t: t, PubSub: gochannel.NewGoChannel(gochannel.Config{}, logger), Reader: sdkmetric.NewManualReader()}
	var err error
	if h.Poisoned, err = h.PubSub.Subscribe(t.Context(), harnessPoisonTopic); err != nil {
		h.PubSub.Close()
		t.Fatal(err)
	}
	if h.Router, err = message.NewRouter(message.RouterConfig{}, logger); err != nil {
		h.PubSub.Close()
		t.Fatal(err)
	}
	return h
}

// Config is a consumer's configuration on h: the default inbox table,
// h's poison queue after one attempt, retries 1 to 5 ms apart, deliveries
// counted in h.Reader.
func (h *Harness) Config(d dialect.Dialect) Config {
	return Config{
		Dialect: d, InboxTable: templates.DefaultTables.Inbox,
		PoisonPublisher: h.PubSub, PoisonTopic: harnessPoisonTopic, MaxAttempts: 1,
		RetryInitialInterval: time.Millisecond, RetryMaxInterval: 5 * time.Millisecond,
		MeterProvider: sdkmetric.NewMeterProvider(sdkmetric.WithReader(h.Reader)),
	}
}

// Finished adds a router middleware and returns a channel that receives
// each time the router's handlers are done with a message, failed or not.
// It holds one signal: the next delivery's end waits until it is taken.
func (h *Harness) Finished() <-chan struct{} {
	return h.signal(func(error) bool { return true })
}

// Succeeded is as Finished, for the deliveries whose handlers returned no
// error (a poisoned message's included: the poison queue swallows it).
func (h *Harness) Succeeded() <-chan struct{} {
	return h.signal(func(err error) bool { return err == nil })
}

func (h *Harness) signal(when func(error) bool) <-chan struct{} {
	c := make(chan struct{}, 1)
	h.Router.AddMiddleware(func(next message.HandlerFunc) message.HandlerFunc {
		return func(msg *message.Message) ([]*message.Message, error) {
			out, err := next(msg)
			if when(err) {
				c <- struct{}{}
			}
			return out, err
		}
	})
	return c
}

// Run starts the router and returns once it is running, until Close.
func (h *Harness) Run() {
	h.stopped = make(chan struct{})
	go func() { defer close(h.stopped); _ = h.Router.Run(context.Background()) }()
	<-h.Router.Running()
}

// Close stops the router, if it runs, and waits for it, then closes the
// pubsub.
func (h *Harness) Close() {
	if h.stopped != nil {
		h.Router.Close()
		<-h.stopped
	}
	h.PubSub.Close()
}

// NewXMessage returns a message with the given UUID, of event type "X",
// version 1, with an empty JSON object for payload.
func NewXMessage(uuid string) *message.Message {
	msg := message.NewMessage(uuid, []byte(`{}`))
	msg.Metadata.Set(outbox.MetadataType, "X")
	msg.Metadata.Set(outbox.MetadataVersion, "1")
	return msg
}

// Publish publishes msg to topic, failing the test if it cannot.
func (h *Harness) Publish(topic string, msg *message.Message) {
	h.t.Helper()
	if err := h.PubSub.Publish(topic, msg); err != nil {
		h.t.Fatal(err)
	}
}

// PublishX publishes a new message of event type "X", version 1 (see
// NewXMessage), to topic and returns it.
func (h *Harness) PublishX(topic string) *message.Message {
	h.t.Helper()
	msg := NewXMessage(watermill.NewUUID())
	h.Publish(topic, msg)
	return msg
}

// PoisonedWithin waits up to d for a message on the poison topic, acks it
// and returns why it was poisoned; ok is false if none came.
func (h *Harness) PoisonedWithin(d time.Duration) (reason string, ok bool) {
	select {
	case p := <-h.Poisoned:
		return AckPoisoned(p), true
	case <-time.After(d):
		return "", false
	}
}

// AckPoisoned acks p, taken from the poison topic, and returns why it was
// poisoned.
func AckPoisoned(p *message.Message) string {
	p.Ack()
	return p.Metadata.Get(middleware.ReasonForPoisonedKey)
}

// Outcomes sums the deliveries counted in h.Reader (MetricDeliveries) by
// outcome and, for those with an error class, by "<outcome>/<error_class>".
func (h *Harness) Outcomes() map[string]int64 {
	h.t.Helper()
	return outcomes(h.t, h.Reader)
}

// outcomes reads what MetricDeliveries counted from reader, by outcome
// (and outcome/error_class).
func outcomes(t testing.TB, reader *sdkmetric.ManualReader) map[string]int64 {
	t.Helper()
	var rm metricdata.ResourceMetrics
	if err := reader.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	out := map[string]int64{}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if sum, ok := m.Data.(metricdata.Sum[int64]); ok && m.Name == MetricDeliveries {
				for _, dp := range sum.DataPoints {
					o, _ := dp.Attributes.Value("outcome")
					out[o.AsString()] += dp.Value
					if c, ok := dp.Attributes.Value("error_class"); ok {
						out[o.AsString()+"/"+c.AsString()] += dp.Value
					}
				}
			}
		}
	}
	return out
}
