package walrelay

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/google/uuid"
	"go.opentelemetry.io/otel/metric/noop"
	tnoop "go.opentelemetry.io/otel/trace/noop"

	"github.com/outboxgen/outboxgen/runtime/internal/hedge"
	"github.com/outboxgen/outboxgen/runtime/internal/telemetry"
	"github.com/outboxgen/outboxgen/runtime/outbox"
)

type nopPub struct{}

func (nopPub) Publish(string, ...*message.Message) error { return nil }
func (nopPub) Close() error                              { return nil }

// BenchmarkPublish is the relay's cost of one event's Publish call and of
// a call of 16 events, to a publisher that does nothing, with Config.Hedge
// off and on (no call runs long enough to be hedged or count as slow).
func BenchmarkPublish(b *testing.B) {
	tel, err := telemetry.NewRelay(tnoop.NewTracerProvider(), noop.NewMeterProvider(), nopPub{}, false, nil)
	if err != nil {
		b.Fatal(err)
	}
	evs := make([]*event, 16)
	for i := range evs {
		evs[i] = &event{WALEvent: outbox.WALEvent{Seq: int64(i + 1), CreatedAt: time.Now(), ID: outbox.EventID(uuid.New()),
			Type: "ORDER_PAID", Key: "k" + string(rune('a'+i)), Topic: "orders", Version: 1, Payload: []byte(`{"order_id":"o-1","amount":42}`)}}
	}
	for _, h := range []bool{false, true} {
		r := &Relay{cfg: Config{Publisher: nopPub{}, PublishTimeout: 30 * time.Second, Hedge: h}, tel: tel,
			log: slog.New(slog.DiscardHandler), hedges: hedge.NewThrottle()}
		name := map[bool]string{false: "hedge=off", true: "hedge=on"}[h]
		b.Run(name+"/one", func(b *testing.B) {
			b.ReportAllocs()
			for range b.N {
				if err := r.publish(context.Background(), evs[0], 1, hooks{slow: func() bool { return true }}); err != nil {
					b.Fatal(err)
				}
			}
		})
		b.Run(name+"/16", func(b *testing.B) {
			b.ReportAllocs()
			for range b.N {
				if err := r.publishMany(context.Background(), evs, hooks{slow: func() bool { return true }}); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
