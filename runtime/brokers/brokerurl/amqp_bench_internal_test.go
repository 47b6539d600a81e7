package brokerurl

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	wmamqp "github.com/ThreeDotsLabs/watermill-amqp/v3/pkg/amqp"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/outboxgen/outboxgen/internal/lagproxy"
	"github.com/outboxgen/outboxgen/runtime/brokers/internal/brokertest"
)

// BenchmarkAMQPPublish is one Publish call of 1, 16 and 64 messages to
// the test RabbitMQ server (durable exchange, persistent messages,
// publisher confirms), directly and through a proxy that holds what the
// client sends for 1 ms (a broker a network away): "pipelined" is
// Open's publisher; "watermill" is the watermill-amqp publisher it
// replaced, with the same configuration (a channel opened per call, a
// confirm awaited per message).
func BenchmarkAMQPPublish(b *testing.B) {
	raw := os.Getenv("OUTBOXGEN_TEST_AMQP_URL")
	if raw == "" {
		b.Skip("OUTBOXGEN_TEST_AMQP_URL is not set: run `eval \"$(scripts/testdb.sh start)\"`")
	}
	proxy, proxied := lagproxy.ForURL(b, raw)
	topic := "orders.bench." + strconv.FormatInt(time.Now().UnixNano(), 36)
	opt := Options{ConnectTimeout: 10 * time.Second}
	for _, lag := range []time.Duration{0, time.Millisecond} {
		pu := raw
		if lag > 0 {
			proxy.SetLag(lag)
			pu = proxied
		}
		u, err := parse(pu)
		if err != nil {
			b.Fatal(err)
		}
		s, err := amqpParse(u)
		if err != nil {
			b.Fatal(err)
		}
		old, err := wmamqp.NewPublisher(s.config(), watermill.NopLogger{})
		if err != nil {
			b.Fatal(err)
		}
		pub, err := Open(context.Background(), pu, opt)
		if err != nil {
			b.Fatal(err)
		}
		for _, n := range []int{1, 16, 64} {
			for _, mode := range []string{"watermill", "pipelined"} {
				call := brokertest.Whole(pub, topic)
				if mode == "watermill" {
					call = brokertest.Whole(old, topic)
				}
				b.Run(fmt.Sprintf("lag=%s/msgs=%d/%s", lag, n, mode), func(b *testing.B) {
					brokertest.BenchCall(b, n, func(int, int) *message.Message {
						return message.NewMessage("m", []byte(`{"order_id":"o-1","amount":42}`))
					}, call)
				})
			}
		}
		old.Close()
		pub.Close()
	}
}
