package relay

import (
	"context"
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/outboxgen/outboxgen/runtime/driver"
)

type nopPublisher struct{}

func (nopPublisher) Publish(string, ...*message.Message) error { return nil }
func (nopPublisher) Close() error                              { return nil }

// BenchmarkPublishRow is publishRow's own cost with a publisher that does
// nothing, Config.Hedge off and on (no publish runs long enough to be
// hedged), holding a slot as publishUnit does.
func BenchmarkPublishRow(b *testing.B) {
	for _, on := range []bool{false, true} {
		b.Run(map[bool]string{false: "hedge=off", true: "hedge=on"}[on], func(b *testing.B) {
			_, drv := sqliteRelayDB(b)
			opts := testOptions(nopPublisher{}, "bench")
			opts.Hedge = on
			r := mustRelay(b, drv, opts)
			f := newFlow(r.opts)
			defer func() {
				<-f.callsDone()
				f.pool.Stop()
			}()
			rw := driver.Row{ID: 1, EventID: "0190a8e2-0000-7000-8000-000000000001", Type: "ORDER_PAID", Key: "k", Topic: "orders",
				Version: 1, Payload: []byte(`{"order_id":"o-1","amount":42}`)}
			ctx := context.Background()
			b.ReportAllocs()
			for range b.N {
				f.slots <- struct{}{}
				held, err := r.publishRow(ctx, nil, f, rw)
				if held {
					<-f.slots
				}
				if err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
