package kafka_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outboxgen/outboxgen/runtime/brokers/kafka"
	"github.com/outboxgen/outboxgen/runtime/relay"
)

// partitionKeys returns one key per partition of topic, key i hashed by
// sarama to partition i.
func partitionKeys(t *testing.T) []string {
	t.Helper()
	hash := sarama.NewHashPartitioner(topic)
	ks := make([]string, partitions)
	for i, found := 0, 0; found < partitions; i++ {
		k := fmt.Sprintf("key-%d", i)
		p, err := hash.Partition(&sarama.ProducerMessage{Key: sarama.StringEncoder(k)}, partitions)
		if err != nil {
			t.Fatal(err)
		}
		if ks[p] == "" {
			ks[p] = k
			found++
		}
	}
	return ks
}

// readThroughFences publishes a fence record to every partition, then
// reads topic from the start until it has seen them all, and returns the
// ids of the other records read. A partition is read in order, so
// whatever a call before the fences stored is among them: nothing of it
// can arrive later.
func readThroughFences(t *testing.T, pub *kafka.Publisher, brokers []string, ks []string) []string {
	t.Helper()
	fences := map[string]bool{}
	var call []*message.Message
	for p, k := range ks {
		id := fmt.Sprintf("fence-%d", p)
		fences[id] = true
		call = append(call, keyed(id, k))
	}
	if err := pub.Publish(topic, call...); err != nil {
		t.Fatalf("publishing the fences: %v", err)
	}
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.ConsumeTopics(topic),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.FetchMaxWait(100*time.Millisecond))
	if err != nil {
		t.Fatalf("kgo: %v", err)
	}
	defer cl.Close()
	// A deadline only against a hang: the fences are stored, so they come.
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var ids []string
	for len(fences) > 0 {
		fs := cl.PollFetches(ctx)
		if ctx.Err() != nil {
			t.Fatalf("fences %v not read back: %v", fences, ctx.Err())
		}
		fs.EachRecord(func(r *kgo.Record) {
			var id string
			for _, h := range r.Headers {
				if h.Key == "_watermill_message_uuid" {
					id = string(h.Value)
				}
			}
			if fences[id] {
				delete(fences, id)
				return
			}
			ids = append(ids, id)
		})
	}
	return ids
}

// A call of several records that the brokers store only some of returns
// a *relay.PartialError (behind the guard's redaction) marking exactly
// the records the topic then holds, so that the relay re-publishes only
// the others. The records are refused for a real reason: over the
// broker's message.max.bytes, or over the producer's MaxMessageBytes
// (sarama refuses them before sending).
func TestPublishReportsStoredRecords(t *testing.T) {
	const secret = "s3cret-sasl-pw"
	cases := []struct {
		name   string
		broker map[string]string
		sarama func(*sarama.Config)
		// refusal tells the error of a refused record.
		refusal func(error) bool
		// permanent: no retry sends the refused record (sarama refused
		// it alone, for its size); a broker's refusal also fails the
		// records batched with it, which a retry sends.
		permanent bool
	}{
		{name: "broker refuses", broker: map[string]string{"message.max.bytes": "2048"},
			refusal: func(err error) bool { return errors.Is(err, sarama.ErrMessageSizeTooLarge) }},
		{name: "producer refuses", sarama: func(sc *sarama.Config) { sc.Producer.MaxMessageBytes = 2048 },
			refusal: func(err error) bool { return errors.As(err, new(sarama.ConfigurationError)) }, permanent: true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			brokers := startKafka(t, kfake.BrokerConfigs(tc.broker))
			sc := sarama.NewConfig()
			// Not enabled, but a secret of the configuration: the
			// publisher masks it in its errors.
			sc.Net.SASL.Password = secret
			if tc.sarama != nil {
				tc.sarama(sc)
			}
			pub, err := kafka.NewPublisher(kafka.PublisherConfig{Brokers: brokers, Sarama: sc})
			if err != nil {
				t.Fatal(err)
			}
			defer pub.Close()

			// The big records alone on their partitions (1 and 3), so
			// that their refusal is theirs only.
			ks := partitionKeys(t)
			big := func(id, key string) *message.Message {
				m := keyed(id, key)
				m.Payload = []byte(strings.Repeat("x", 4096))
				return m
			}
			// The first refused record's id holds the secret, so that
			// redaction rewrites the error's text: errors.As must still
			// find the PartialError behind it.
			call := []*message.Message{
				keyed("a", ks[0]), big("big-1-"+secret, ks[1]), keyed("c", ks[2]),
				keyed("d", ks[0]), big("big-2", ks[3]), keyed("f", ks[2]),
			}
			err = pub.Publish(topic, call...)
			if err == nil {
				t.Fatal("call with records over the size limit succeeded")
			}
			if strings.Contains(err.Error(), secret) {
				t.Errorf("error shows the SASL password: %v", err)
			}
			if !strings.Contains(err.Error(), "(2 of 6 failed)") {
				t.Errorf("error %q does not name the first refused record with how many failed: (2 of 6 failed)", err)
			}
			var pe *relay.PartialError
			if !errors.As(err, &pe) {
				t.Fatalf("error %q (%T) is no *relay.PartialError: the relay would publish the stored records again", err, err)
			}
			if strings.Contains(pe.Error(), secret) {
				t.Errorf("the PartialError, which callers find with errors.As and may log, shows the SASL password: %v", pe)
			}
			if !tc.refusal(err) {
				t.Errorf("error %q (%T) does not wrap the refusal's error", err, err)
			}
			if got := errors.Is(err, relay.ErrPermanent); got != tc.permanent {
				t.Errorf("errors.Is(err, relay.ErrPermanent) = %v, want %v", got, tc.permanent)
			}
			// A call of the big record alone fails the same way.
			if serr := pub.Publish(topic, big("big-alone", ks[1])); serr == nil || !tc.refusal(serr) || errors.Is(serr, relay.ErrPermanent) != tc.permanent {
				t.Errorf("a call of one record too big: %v (permanent %v), want its refusal, permanent %v", serr, errors.Is(serr, relay.ErrPermanent), tc.permanent)
			}
			stored := relay.StoredOf(err, len(call))
			if stored == nil {
				t.Fatalf("StoredOf(err, %d) = nil; PartialError.Stored has %d elements", len(call), len(pe.Stored))
			}
			var want []string
			for i, s := range stored {
				if s {
					want = append(want, call[i].UUID)
				}
			}
			if stored[1] || stored[4] {
				t.Errorf("stored %v marks a refused big record stored", stored)
			}
			if len(want) == 0 || len(want) == len(call) {
				t.Fatalf("stored %v: want some records stored and some not", stored)
			}
			t.Logf("stored %v: %v", stored, err)
			got := readThroughFences(t, pub, brokers, ks)
			slices.Sort(got)
			slices.Sort(want)
			if !slices.Equal(got, want) {
				t.Errorf("topic holds %v of the call, StoredOf marks %v (stored %v)", got, want, stored)
			}
		})
	}
}

// A call none of whose records is stored returns a plain error: no
// PartialError, nothing for the relay to settle.
func TestPublishAllRefusedIsNotPartial(t *testing.T) {
	brokers := startKafka(t, kfake.BrokerConfigs(map[string]string{"message.max.bytes": "2048"}))
	pub, err := kafka.NewPublisher(kafka.PublisherConfig{Brokers: brokers})
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close()
	ks := partitionKeys(t)
	var call []*message.Message
	for i := range 4 {
		m := keyed(fmt.Sprintf("big-%d", i), ks[i%2])
		m.Payload = []byte(strings.Repeat("x", 4096))
		call = append(call, m)
	}
	err = pub.Publish(topic, call...)
	if !errors.Is(err, sarama.ErrMessageSizeTooLarge) || !strings.Contains(err.Error(), "message big-0 (4 of 4 failed)") {
		t.Fatalf("call of records all over message.max.bytes: %v, want sarama.ErrMessageSizeTooLarge naming message big-0, 4 of 4 failed", err)
	}
	var pe *relay.PartialError
	if errors.As(err, &pe) {
		t.Errorf("nothing stored, yet the error is a PartialError: %v", err)
	}
	if s := relay.StoredOf(err, len(call)); s != nil {
		t.Errorf("StoredOf = %v, want nil", s)
	}
	if got := readThroughFences(t, pub, brokers, ks); len(got) != 0 {
		t.Errorf("topic holds %v, want none of the refused records", got)
	}
}
