package kafka_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outboxgen/outboxgen/runtime/brokers/internal/brokertest"
	"github.com/outboxgen/outboxgen/runtime/brokers/kafka"
	"github.com/outboxgen/outboxgen/runtime/dialect"
	"github.com/outboxgen/outboxgen/runtime/relay"
)

const (
	topic      = "outbox.orders.paid"
	partitions = 4
)

var keys = []string{"order-a", "order-b", "order-c", "order-d", "order-e", "order-f"}

// startKafka starts a kfake broker with topic (partitions partitions),
// configured further by opts, and returns its addresses.
func startKafka(t testing.TB, opts ...kfake.Opt) []string {
	t.Helper()
	c, err := kfake.NewCluster(append([]kfake.Opt{kfake.NumBrokers(1), kfake.SeedTopics(partitions, topic)}, opts...)...)
	if err != nil {
		t.Fatalf("kfake: %v", err)
	}
	t.Cleanup(c.Close)
	return c.ListenAddrs()
}

// consume reads topic from the start with a franz-go client (partition
// visible) until the test ends.
func consume(t *testing.T, brokers []string) *brokertest.Collector {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.ConsumeTopics(topic),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.FetchMaxWait(100*time.Millisecond))
	if err != nil {
		t.Fatalf("kgo: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	c := brokertest.NewCollector()
	done := make(chan struct{})
	go func() {
		defer close(done)
		for ctx.Err() == nil {
			fs := cl.PollFetches(ctx)
			fs.EachRecord(func(r *kgo.Record) {
				md := map[string]string{}
				var id string
				for _, h := range r.Headers {
					if h.Key == "_watermill_message_uuid" {
						id = string(h.Value)
						continue
					}
					md[h.Key] = string(h.Value)
				}
				md["kafka_key"] = string(r.Key)
				c.Add(brokertest.Received{UUID: id, Payload: r.Value, Metadata: md, Partition: r.Partition})
			})
		}
	}()
	t.Cleanup(func() { cancel(); <-done; cl.Close() })
	return c
}

// TestRelayToKafka: two relays publish through the kafka publisher into
// an in-process Kafka (kfake, 4 partitions); every event arrives, keyed by
// its outbox key, each key in one partition, in per-key order there.
func TestRelayToKafka(t *testing.T) {
	brokertest.ForEachDialect(t, nil, func(t *testing.T, db *sql.DB, d dialect.Dialect) {
		brokers := startKafka(t)
		pub, err := kafka.NewPublisher(kafka.PublisherConfig{Brokers: brokers})
		if err != nil {
			t.Fatalf("NewPublisher: %v", err)
		}
		t.Cleanup(func() { pub.Close() })
		w := brokertest.NewWriter(db, d, topic, keys...)
		w.Write(t, 4)
		rs := brokertest.StartRelays(t, db, d, 2, pub, relay.Config{})
		w.Write(t, 4)
		rs.Notify()
		all := w.All()

		got := consume(t, brokers)
		got.WaitUnique(t, len(all), 30*time.Second)
		brokertest.WaitSent(t, db, len(all), 10*time.Second)
		recs := got.Got()
		brokertest.Check(t, all, recs) // all arrived, intact, per-key order of first deliveries

		// Per-key order inside the broker: each key in exactly one
		// partition, and the partition holds the key's events in order
		// (records of a partition arrive in offset order).
		partOf := map[string]int32{}
		used := map[int32]bool{}
		for _, r := range recs {
			k := r.Metadata[relay.MetadataKey]
			if r.Metadata["kafka_key"] != k {
				t.Errorf("record %s: Kafka key %q, want the outbox key %q", r.UUID, r.Metadata["kafka_key"], k)
			}
			if p, ok := partOf[k]; ok && p != r.Partition {
				t.Errorf("key %s in partitions %d and %d", k, p, r.Partition)
			}
			partOf[k] = r.Partition
			used[r.Partition] = true
		}
		if len(used) < 2 {
			t.Errorf("%d keys all landed in one partition: the records are not keyed", len(keys))
		}
		t.Logf("%d events, %d records, keys over %d of %d partitions", len(all), len(recs), len(used), partitions)
	})
}

// TestSubscriber: the watermill-kafka consumer-group subscriber built by
// NewSubscriber reads what the publisher wrote, UUID and metadata intact.
func TestSubscriber(t *testing.T) {
	brokers := startKafka(t)
	pub, err := kafka.NewPublisher(kafka.PublisherConfig{Brokers: brokers})
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close()
	var ids []string
	for i := range 6 {
		m := message.NewMessage("id-"+string(rune('a'+i)), []byte(`{"n":1}`))
		m.Metadata.Set(relay.MetadataKey, "k"+string(rune('0'+i%2)))
		m.Metadata.Set(relay.MetadataPartitionKey, m.Metadata.Get(relay.MetadataKey))
		ids = append(ids, m.UUID)
		if err := pub.Publish(topic, m); err != nil {
			t.Fatalf("publish: %v", err)
		}
	}
	sub, err := kafka.NewSubscriber(kafka.SubscriberConfig{Brokers: brokers, ConsumerGroup: "billing"})
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	msgs, err := sub.Subscribe(ctx, topic)
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	for len(seen) < len(ids) {
		select {
		case m := <-msgs:
			if m.Metadata.Get(relay.MetadataKey) == "" {
				t.Errorf("message %s lost its metadata: %v", m.UUID, m.Metadata)
			}
			seen[m.UUID] = true
			m.Ack()
		case <-ctx.Done():
			t.Fatalf("received %d of %d messages", len(seen), len(ids))
		}
	}
}

func TestPartitionKey(t *testing.T) {
	m := message.NewMessage("u", nil)
	if _, err := kafka.PartitionKey(topic, m); !errors.Is(err, kafka.ErrNoPartitionKey) {
		t.Errorf("no key: %v, want ErrNoPartitionKey", err)
	}
	m.Metadata.Set(relay.MetadataKey, "order-1")
	if k, err := kafka.PartitionKey(topic, m); err != nil || k != "order-1" {
		t.Errorf("outbox_key only: %q, %v", k, err)
	}
	m.Metadata.Set(relay.MetadataPartitionKey, "p-1")
	if k, err := kafka.PartitionKey(topic, m); err != nil || k != "p-1" {
		t.Errorf("partition_key wins: %q, %v", k, err)
	}
	km, err := kafka.NewMarshaler(nil).Marshal(topic, m)
	if err != nil {
		t.Fatal(err)
	}
	if b, _ := km.Key.Encode(); string(b) != "p-1" {
		t.Errorf("record key %q, want p-1", b)
	}
}

func TestConfigValidate(t *testing.T) {
	err := kafka.PublisherConfig{Retries: -1}.Validate()
	if err == nil || !strings.Contains(err.Error(), "Brokers") || !strings.Contains(err.Error(), "Retries") {
		t.Errorf("PublisherConfig.Validate: %v", err)
	}
	if err := (kafka.SubscriberConfig{Brokers: []string{"x:1"}}).Validate(); err == nil || !strings.Contains(err.Error(), "ConsumerGroup") {
		t.Errorf("SubscriberConfig.Validate without a group: %v", err)
	}
	sc, err := kafka.PublisherConfig{Brokers: []string{"x:1"}}.SaramaConfig()
	if err != nil {
		t.Fatal(err)
	}
	if !sc.Producer.Idempotent || sc.Net.MaxOpenRequests != 1 {
		t.Errorf("producer not idempotent by default: idempotent=%v maxOpen=%d", sc.Producer.Idempotent, sc.Net.MaxOpenRequests)
	}
	// A Publish must end well within the relay's default lease, even
	// when every attempt times out (sarama ignores the message context).
	if b := kafka.PublishBudget(sc); b <= 0 || b > relay.DefaultLeaseDuration*6/10 {
		t.Errorf("default publish budget %s, want well under the relay's %s lease", b, relay.DefaultLeaseDuration)
	}
	if sc.Net.ReadTimeout <= sc.Producer.Timeout {
		t.Errorf("read timeout %s must exceed the produce timeout %s (the broker holds the request that long)", sc.Net.ReadTimeout, sc.Producer.Timeout)
	}
}

// TestCloseWhilePublishing: Close while Publish calls are under way waits
// for them, and later calls fail with pubguard's error; watermill-kafka's
// unguarded closed flag let a Publish reach sarama's closed producer
// (send on a closed channel: a panic) and is a data race.
func TestCloseWhilePublishing(t *testing.T) {
	brokers := startKafka(t)
	pub, err := kafka.NewPublisher(kafka.PublisherConfig{Brokers: brokers})
	if err != nil {
		t.Fatal(err)
	}
	brokertest.CloseWhilePublishing(t, pub, topic, func(g, i int) *message.Message {
		m := message.NewMessage(fmt.Sprintf("m-%d-%d", g, i), []byte("x"))
		m.Metadata.Set(relay.MetadataKey, keys[g])
		return m
	})
}
