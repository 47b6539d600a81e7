package kafka_test

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/outboxgen/outboxgen/runtime/brokers/kafka"
	"github.com/outboxgen/outboxgen/runtime/relay"
)

func keyed(id, key string) *message.Message {
	m := message.NewMessage(id, []byte(`{"n":1}`))
	m.Metadata.Set(relay.MetadataKey, key)
	return m
}

// One call's records of one key, handed to sarama together, arrive in
// the call's order.
func TestPublishCallKeepsKeyOrder(t *testing.T) {
	brokers := startKafka(t)
	pub, err := kafka.NewPublisher(kafka.PublisherConfig{Brokers: brokers})
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close()
	var call []*message.Message
	for i := range 60 {
		call = append(call, keyed(fmt.Sprintf("m-%02d", i), keys[i%3]))
	}
	got := consume(t, brokers)
	if err := pub.Publish(topic, call...); err != nil {
		t.Fatal(err)
	}
	got.WaitUnique(t, len(call), 10*time.Second)
	last := map[string]string{}
	for _, r := range got.Got() {
		k := r.Metadata["kafka_key"]
		if r.UUID <= last[k] {
			t.Fatalf("key %s: %s arrived after %s", k, r.UUID, last[k])
		}
		last[k] = r.UUID
	}
}

// A record the broker refuses fails the call with the broker's error,
// naming that record and how many failed; the call's other records, on
// other partitions, are stored.
func TestPublishFailsAtTheRefusedRecord(t *testing.T) {
	brokers := startKafka(t, kfake.BrokerConfigs(map[string]string{"message.max.bytes": "2048"}))
	// Three keys on three partitions (sarama's hash partitioner): the big
	// record's batch holds it alone.
	hash := sarama.NewHashPartitioner(topic)
	var ks []string
	used := map[int32]bool{}
	for i := 0; len(ks) < 3; i++ {
		k := fmt.Sprintf("key-%d", i)
		p, err := hash.Partition(&sarama.ProducerMessage{Key: sarama.StringEncoder(k)}, partitions)
		if err != nil {
			t.Fatal(err)
		}
		if !used[p] {
			used[p] = true
			ks = append(ks, k)
		}
	}
	pub, err := kafka.NewPublisher(kafka.PublisherConfig{Brokers: brokers})
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close()
	big := keyed("big", ks[1])
	big.Payload = []byte(strings.Repeat("x", 4096))
	got := consume(t, brokers)
	err = pub.Publish(topic, keyed("a", ks[0]), big, keyed("c", ks[2]))
	if !errors.Is(err, sarama.ErrMessageSizeTooLarge) || !strings.Contains(err.Error(), "message big (1 of 3 failed)") {
		t.Fatalf("call with a record over message.max.bytes: %v, want sarama.ErrMessageSizeTooLarge naming message big, 1 of 3 failed", err)
	}
	got.WaitUnique(t, 2, 10*time.Second)
	for _, r := range got.Got() {
		if r.UUID != "a" && r.UUID != "c" {
			t.Fatalf("received %s, want only a and c", r.UUID)
		}
	}
}
