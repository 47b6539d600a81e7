package kafka_test

import (
	"fmt"
	"strconv"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/outboxgen/outboxgen/runtime/brokers/internal/brokertest"
	"github.com/outboxgen/outboxgen/runtime/brokers/kafka"
	"github.com/outboxgen/outboxgen/runtime/relay"
)

// BenchmarkPublish is one Publish call of 1, 16 and 64 messages (one key
// each, 4 partitions) to an in-process Kafka (kfake), answering at once
// and 1 ms late (a broker a network away: kfake holds each produce
// request): "pipelined" is Publisher.Publish, which hands sarama the
// call's records at once; "sequential" publishes them one by one, each
// waiting for its acknowledgement (what the watermill-kafka publisher
// did before).
func BenchmarkPublish(b *testing.B) {
	for _, lag := range []time.Duration{0, time.Millisecond} {
		c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(partitions, topic))
		if err != nil {
			b.Fatal(err)
		}
		if lag > 0 {
			c.ControlKey(int16(kmsg.Produce), func(kmsg.Request) (kmsg.Response, error, bool) {
				c.KeepControl()
				c.SleepControl(func() { time.Sleep(lag) })
				return nil, nil, false
			})
		}
		pub, err := kafka.NewPublisher(kafka.PublisherConfig{Brokers: c.ListenAddrs()})
		if err != nil {
			b.Fatal(err)
		}
		for _, n := range []int{1, 16, 64} {
			for _, mode := range []string{"sequential", "pipelined"} {
				call := brokertest.Whole(pub, topic)
				if mode == "sequential" {
					call = brokertest.OneByOne(pub, topic)
				}
				b.Run(fmt.Sprintf("lag=%s/msgs=%d/%s", lag, n, mode), func(b *testing.B) {
					brokertest.BenchCall(b, n, func(seq, i int) *message.Message {
						m := message.NewMessage(mode+strconv.Itoa(seq), []byte(`{"order_id":"o-1","amount":42}`))
						m.Metadata.Set(relay.MetadataKey, "order-"+strconv.Itoa(i))
						return m
					}, call)
				})
			}
		}
		pub.Close()
		c.Close()
	}
}
