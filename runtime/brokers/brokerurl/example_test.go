package brokerurl_test

import (
	"context"
	"fmt"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/outboxgen/outboxgen/runtime/brokers/brokerurl"
	"github.com/outboxgen/outboxgen/runtime/relay"
)

// Open with "stdout:" prints one JSON line per message: a way to watch
// what the relay would send, without a broker. Any other URL works the
// same way (nats://, kafka://, amqp://, redis://).
func ExampleOpen() {
	pub, err := brokerurl.Open(context.Background(), "stdout:", brokerurl.Options{})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer pub.Close()

	m := message.NewMessage("0190c6a8-5f7e-7d1c-9a52-6b1e2f3a4b5c", []byte(`{"order_id": "o-1", "amount": 42}`))
	m.Metadata.Set(relay.MetadataType, "ORDER_PAID")
	m.Metadata.Set(relay.MetadataKey, "o-1")
	if err := pub.Publish("orders.paid", m); err != nil {
		fmt.Println(err)
	}
	n := message.NewMessage("0190c6a8-5f7e-7d1c-9a52-6b1e2f3a4b5d", []byte("not JSON"))
	if err := pub.Publish("orders.note", n); err != nil {
		fmt.Println(err)
	}

	_, err = brokerurl.Open(context.Background(), "mqtt://app:s3cret@broker:1883", brokerurl.Options{})
	fmt.Println(err)
	// Output:
	// {"topic":"orders.paid","uuid":"0190c6a8-5f7e-7d1c-9a52-6b1e2f3a4b5c","metadata":{"outbox_key":"o-1","outbox_type":"ORDER_PAID"},"payload":{"order_id":"o-1","amount":42}}
	// {"topic":"orders.note","uuid":"0190c6a8-5f7e-7d1c-9a52-6b1e2f3a4b5d","metadata":{},"payload":"not JSON"}
	// brokerurl: unknown scheme "mqtt" in "mqtt://app:xxxxx@broker:1883": use one of nats, kafka, amqp, amqps, redis, rediss, stdout (nats://host:4222, kafka://host:9092, amqp://user:pass@host:5672/vhost, redis://host:6379/0 or stdout:)
}
