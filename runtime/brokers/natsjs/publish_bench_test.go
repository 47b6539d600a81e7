package natsjs_test

import (
	"fmt"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/outboxgen/outboxgen/internal/lagproxy"
	"github.com/outboxgen/outboxgen/runtime/brokers/internal/brokertest"
)

// BenchmarkPublish is one Publish call of 1, 16 and 64 messages to a real
// JetStream server (in process, file store), reached directly and through
// a proxy that holds what the client sends for 1 ms (a broker a network
// away): "pipelined" is Publisher.Publish, which sends a call's messages
// without waiting for each acknowledgement before the next;
// "sequential" is the watermill-nats publisher it wraps, which waits
// for each (what Publish did before).
func BenchmarkPublish(b *testing.B) {
	srv := startNATS(b, -1, b.TempDir())
	proxy := lagproxy.New(b, srv.Addr().String())
	for _, lag := range []time.Duration{0, time.Millisecond} {
		url := srv.ClientURL()
		if lag > 0 {
			proxy.SetLag(lag)
			url = "nats://" + proxy.Addr()
		}
		pub := newPublisher(b, url, 10*time.Second)
		if err := pub.EnsureStream(topic); err != nil {
			b.Fatal(err)
		}
		for _, n := range []int{1, 16, 64} {
			for _, mode := range []string{"sequential", "pipelined"} {
				var call func([]*message.Message) error = brokertest.Whole(pub, topic)
				if mode == "sequential" {
					call = brokertest.Whole(pub.Publisher, topic) // watermill-nats: an ack awaited per message
				}
				b.Run(fmt.Sprintf("lag=%s/msgs=%d/%s", lag, n, mode), func(b *testing.B) {
					brokertest.BenchCall(b, n, func(seq, _ int) *message.Message {
						return message.NewMessage(mode+strconv.Itoa(seq)+"-"+lag.String(), []byte(`{"order_id":"o-1","amount":42}`))
					}, call)
				})
			}
		}
		// Single-message calls, 8 per core at once, as the polling relay
		// makes them: the time per call is the CPU of each (the relay
		// side's and the server's), not a round trip.
		for _, mode := range []string{"sequential", "pipelined"} {
			publish := pub.Publish
			if mode == "sequential" {
				publish = pub.Publisher.Publish
			}
			b.Run(fmt.Sprintf("lag=%s/msgs=1/parallel/%s", lag, mode), func(b *testing.B) {
				b.ReportAllocs()
				b.SetParallelism(8)
				var seq atomic.Int64
				b.RunParallel(func(pb *testing.PB) {
					for pb.Next() {
						id := mode + "-p-" + strconv.FormatInt(seq.Add(1), 10) + "-" + lag.String()
						if err := publish(topic, message.NewMessage(id, []byte(`{"order_id":"o-1","amount":42}`))); err != nil {
							b.Error(err)
							return
						}
					}
				})
			})
		}
	}
}
