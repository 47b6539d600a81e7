package walrelay

import (
	"context"
	"fmt"
	"log/slog"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/google/uuid"
	"go.opentelemetry.io/otel/metric/noop"
	tnoop "go.opentelemetry.io/otel/trace/noop"

	"github.com/outboxgen/outboxgen/internal/natstest"
	"github.com/outboxgen/outboxgen/runtime/brokers/natsjs"
	"github.com/outboxgen/outboxgen/runtime/internal/hedge"
	"github.com/outboxgen/outboxgen/runtime/internal/telemetry"
	"github.com/outboxgen/outboxgen/runtime/internal/workers"
	"github.com/outboxgen/outboxgen/runtime/outbox"
)

type nopPub struct{}

func (nopPub) Publish(string, ...*message.Message) error { return nil }
func (nopPub) Close() error                              { return nil }

// BenchmarkPublish is the relay's cost of one event's Publish call and of
// a call of 16 events, to a publisher that does nothing, with Config.Hedge
// off and on (HedgeAfter a minute: a pause of a busy host never splits a
// call of 16, which would fail the benchmark).
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
		r := &Relay{cfg: Config{Publisher: nopPub{}, PublishTimeout: 30 * time.Second, Hedge: h, HedgeAfter: time.Minute}, tel: tel,
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

// BenchmarkPublishNATS is the relay's calls to a real JetStream server
// (in process, file store), many at once as a busy relay makes them: the
// time per event is the machine's CPU for each, the relay's, the client's
// and the server's, since the callers keep both cores busy.
func BenchmarkPublishNATS(b *testing.B) {
	tel, err := telemetry.NewRelay(tnoop.NewTracerProvider(), noop.NewMeterProvider(), nopPub{}, false, nil)
	if err != nil {
		b.Fatal(err)
	}
	srv := natstest.Start(b, nil)
	const topic = "bench.orders"
	pub, err := natsjs.NewPublisher(natsjs.Config{URL: srv.ClientURL(), PublishTimeout: 10 * time.Second})
	if err != nil {
		b.Fatal(err)
	}
	defer pub.Close()
	if err := pub.EnsureStream(topic); err != nil {
		b.Fatal(err)
	}
	r := &Relay{cfg: Config{Publisher: pub, PublishTimeout: 30 * time.Second}, tel: tel,
		log: slog.New(slog.DiscardHandler), hedges: hedge.NewThrottle()}
	newEvs := func(n int) []*event {
		evs := make([]*event, n)
		for i := range evs {
			evs[i] = &event{WALEvent: outbox.WALEvent{Seq: int64(i + 1), CreatedAt: time.Now(), ID: outbox.EventID(uuid.New()),
				Type: "ORDER_PAID", Key: "k" + string(rune('a'+i)), Topic: topic, Version: 1, Payload: []byte(`{"order_id":"o-1","amount":42}`)}}
		}
		return evs
	}
	for _, pooled := range []bool{false, true} {
		var pool *workers.Pool // nil: a fresh goroutine per call
		if pooled {
			pool = workers.New()
			defer pool.Stop()
		}
		h := hooks{slow: func() bool { return true }, pool: pool}
		name := map[bool]string{false: "fresh", true: "pool"}[pooled]
		b.Run(name+"/one", func(b *testing.B) {
			b.ReportAllocs()
			b.SetParallelism(8)
			b.RunParallel(func(pb *testing.PB) {
				evs := newEvs(1)
				for pb.Next() {
					if err := r.publish(context.Background(), evs[0], 1, h); err != nil {
						b.Error(err)
						return
					}
				}
			})
		})
		b.Run(name+"/16", func(b *testing.B) {
			b.ReportAllocs()
			b.SetParallelism(2)
			b.RunParallel(func(pb *testing.PB) {
				evs := newEvs(16)
				for pb.Next() {
					if err := r.publishMany(context.Background(), evs, h); err != nil {
						b.Error(err)
						return
					}
				}
			})
		})
	}
}

// BenchmarkDispatch is the dispatcher's cost per event, from dispatch to
// settlement, through Concurrency workers to a publisher that does
// nothing: one key (every event waits for the one before), and many keys
// (batches of up to MaxPublishBatch).
func BenchmarkDispatch(b *testing.B) {
	tel, err := telemetry.NewRelay(tnoop.NewTracerProvider(), noop.NewMeterProvider(), nopPub{}, false, nil)
	if err != nil {
		b.Fatal(err)
	}
	for _, keys := range []int{1, 1000} {
		b.Run(fmt.Sprintf("keys=%d", keys), func(b *testing.B) {
			cfg := Config{Publisher: nopPub{}}
			cfg.setDefaults("outbox_event")
			r := &Relay{cfg: cfg, tel: tel, log: slog.New(slog.DiscardHandler), hedges: hedge.NewThrottle()}
			evs := make([]*event, b.N)
			for i := range evs {
				evs[i] = &event{WALEvent: outbox.WALEvent{Seq: int64(i + 1), CreatedAt: time.Now(), ID: outbox.EventID(uuid.New()),
					Type: "ORDER_PAID", Key: fmt.Sprintf("k%d", i%keys), Topic: "orders", Version: 1, Payload: []byte(`{"order_id":"o-1","amount":42}`)}}
			}
			settled := make(chan settlement, 4096)
			d := newDispatcher(r, &parkedKeys{keys: map[string]bool{}, max: 10}, settled)
			defer d.stop(10 * time.Second)
			b.ReportAllocs()
			b.ResetTimer()
			go func() {
				for i := 0; i < len(evs); i += 256 {
					d.dispatch(evs[i:min(i+256, len(evs))]...)
				}
			}()
			for range b.N {
				<-settled
			}
		})
	}
}
