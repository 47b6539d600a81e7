package main

// Process tests of the relay against the other brokers: the real outboxgen
// binary relaying from SQLite and PostgreSQL to Kafka (kfake, in this test
// process), Redis Streams and RabbitMQ (the servers scripts/testdb.sh
// starts), read back through brokerurl.OpenSubscriber.

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/redis/go-redis/v9"
	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/outboxgen/outboxgen/runtime/brokers/brokerurl"
	"github.com/outboxgen/outboxgen/runtime/relay"
	"github.com/outboxgen/outboxgen/templates"
)

// Environment variables naming the broker servers scripts/testdb.sh
// starts.
const (
	testRedisEnv = "OUTBOXGEN_TEST_REDIS_URL"
	testAMQPEnv  = "OUTBOXGEN_TEST_AMQP_URL"
)

// brokerServerURL returns the URL in env. When it is unset the test is
// skipped under `go test -short` outside CI, and fails otherwise (as in
// package brokerurl's tests): `make test` and CI start every server.
func brokerServerURL(t *testing.T, env string) string {
	t.Helper()
	if u := os.Getenv(env); u != "" {
		return u
	}
	if testing.Short() && os.Getenv("CI") == "" {
		t.Skipf("%s is not set (-short): skipping", env)
	}
	t.Fatalf("%s is not set: run `eval \"$(scripts/testdb.sh start)\"` (or `make test`), or use go test -short to skip", env)
	return ""
}

// brokerSuffix is a random hex string for unique topic, group, queue and
// exchange names.
func brokerSuffix(t *testing.T) string {
	t.Helper()
	b := make([]byte, 4)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return hex.EncodeToString(b)
}

// withParams appends query parameters to a URL that may have a query.
func withParams(u, params string) string {
	if strings.Contains(u, "?") {
		return u + "&" + params
	}
	return u + "?" + params
}

// processBroker is a broker the relay process publishes to.
type processBroker struct {
	name string
	// setup returns the URL of a broker ready for topic, for the relay
	// and for a subscriber of group (whose leftovers it removes in
	// t.Cleanup).
	setup func(t *testing.T, topic, group string) string
}

var processBrokers = []processBroker{
	{"kafka", kafkaBroker},
	{"redis", redisBroker},
	{"amqp", amqpBroker},
}

// kafkaBroker starts a kfake cluster (3 partitions for topic, so that the
// relay's per-key partitioning is what keeps each key's order).
func kafkaBroker(t *testing.T, topic, _ string) string {
	t.Helper()
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(3, topic))
	if err != nil {
		t.Fatalf("kfake: %v", err)
	}
	t.Cleanup(c.Close)
	return "kafka://" + strings.Join(c.ListenAddrs(), ",")
}

// redisBroker is the test Redis; the stream topic is deleted afterwards.
func redisBroker(t *testing.T, topic, _ string) string {
	t.Helper()
	u := brokerServerURL(t, testRedisEnv)
	t.Cleanup(func() {
		opts, err := redis.ParseURL(u)
		if err != nil {
			t.Logf("redis cleanup: %v", err)
			return
		}
		c := redis.NewClient(opts)
		defer c.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := c.Del(ctx, topic).Err(); err != nil {
			t.Logf("redis cleanup: delete stream %s: %v", topic, err)
		}
	})
	return u
}

// amqpBroker is the test RabbitMQ with an exchange of this test's own
// (non-durable); the exchange and the subscriber's queue are deleted
// afterwards.
func amqpBroker(t *testing.T, topic, group string) string {
	t.Helper()
	u := brokerServerURL(t, testAMQPEnv)
	exchange := "outboxgen-process-" + brokerSuffix(t)
	t.Cleanup(func() {
		conn, err := amqp.DialConfig(u, amqp.Config{Dial: amqp.DefaultDial(5 * time.Second)})
		if err != nil {
			t.Logf("amqp cleanup: %v", err)
			return
		}
		defer conn.Close()
		ch, err := conn.Channel()
		if err != nil {
			t.Logf("amqp cleanup: %v", err)
			return
		}
		defer ch.Close()
		if _, err := ch.QueueDelete(group+"."+topic, false, false, false); err != nil {
			t.Logf("amqp cleanup: delete queue: %v", err)
		}
		if err := ch.ExchangeDelete(exchange, false, false); err != nil {
			t.Logf("amqp cleanup: delete exchange: %v", err)
		}
	})
	return withParams(u, "exchange="+exchange+"&durable=0")
}

// subscribeBroker subscribes to topic as group through brokerurl (before
// anything is published) and collects every message, acknowledged, with
// its UUID as the delivery's id. It checks that the metadata carry the
// event id (= the UUID) and the key of the payload.
func subscribeBroker(t *testing.T, rawURL, group, topic string) *collector {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	sub, err := brokerurl.OpenSubscriber(ctx, rawURL, group, brokerurl.Options{Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		cancel()
		t.Fatalf("OpenSubscriber: %v", err)
	}
	ch, err := sub.Subscribe(ctx, topic)
	if err != nil {
		cancel()
		sub.Close()
		t.Fatalf("Subscribe(%q): %v", topic, err)
	}
	c := &collector{}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for m := range ch {
			var p struct {
				Key string `json:"key"`
				Seq int    `json:"seq"`
			}
			if err := json.Unmarshal(m.Payload, &p); err != nil {
				t.Errorf("message %s: payload %q: %v", m.UUID, m.Payload, err)
			}
			if id := m.Metadata.Get(relay.MetadataEventID); id != m.UUID {
				t.Errorf("message %s: metadata %s = %q, want the UUID", m.UUID, relay.MetadataEventID, id)
			}
			if k := m.Metadata.Get(relay.MetadataKey); k != p.Key {
				t.Errorf("message %s: metadata %s = %q, want the payload's key %q", m.UUID, relay.MetadataKey, k, p.Key)
			}
			c.mu.Lock()
			c.msgs = append(c.msgs, delivery{id: m.UUID, key: p.Key, seq: p.Seq})
			c.mu.Unlock()
			m.Ack()
		}
	}()
	t.Cleanup(func() {
		cancel()
		if err := sub.Close(); err != nil {
			t.Logf("subscriber Close: %v", err)
		}
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			t.Errorf("the subscription did not end within 10s of Close")
		}
	})
	return c
}

// sentEvents returns the events of the outbox table by event id, as the
// deliveries should show them (key and payload seq).
func (db *testDB) sentEvents(t *testing.T) map[string]delivery {
	t.Helper()
	rows, err := db.db.Query("SELECT event_id, biz_id, payload FROM " + templates.DefaultTables.Outbox + " ORDER BY id")
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	events := map[string]delivery{}
	for rows.Next() {
		var id, key, payload string
		if err := rows.Scan(&id, &key, &payload); err != nil {
			t.Fatal(err)
		}
		var p struct {
			Seq int `json:"seq"`
		}
		if err := json.Unmarshal([]byte(payload), &p); err != nil {
			t.Fatalf("row %s: payload %q: %v", id, payload, err)
		}
		events[id] = delivery{id: id, key: key, seq: p.Seq}
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return events
}

// unique returns the number of distinct event ids delivered.
func (c *collector) unique() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	seen := map[string]bool{}
	for _, m := range c.msgs {
		seen[m.id] = true
	}
	return len(seen)
}

// snapshot returns the deliveries so far.
func (c *collector) snapshot() []delivery {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]delivery(nil), c.msgs...)
}

// checkByID checks msgs against the events (by event id): every event
// arrived, nothing else did, each with its own key and seq, and the first
// delivery of each event of a key came in insertion (seq) order.
// Duplicates are allowed; it returns their number.
func checkByID(t *testing.T, msgs []delivery, events map[string]delivery) (dups int) {
	t.Helper()
	seen := map[string]bool{}
	next := map[string]int{}
	for _, m := range msgs {
		want, ok := events[m.id]
		if !ok {
			t.Errorf("delivery of an unknown event id %q (key %s, seq %d)", m.id, m.key, m.seq)
			continue
		}
		if m.key != want.key || m.seq != want.seq {
			t.Errorf("event %s delivered as %s/%d, want %s/%d", m.id, m.key, m.seq, want.key, want.seq)
		}
		if seen[m.id] {
			dups++
			continue
		}
		seen[m.id] = true
		if want.seq != next[want.key] {
			t.Errorf("key %s: first delivery of seq %d came when seq %d was expected next", want.key, want.seq, next[want.key])
		}
		next[want.key] = want.seq + 1
	}
	for id, e := range events {
		if !seen[id] {
			t.Errorf("event %s (%s/%d) never delivered", id, e.key, e.seq)
		}
	}
	return dups
}

// brokerKeys are the keys of the broker process tests.
func brokerKeys(n int) []string {
	keys := make([]string, n)
	for i := range keys {
		keys[i] = fmt.Sprintf("order-%02d", i)
	}
	return keys
}

// Sizes of the broker process tests: 15 keys of 20 events.
const (
	brokerTestKeys   = 15
	brokerTestPerKey = 20
)

// terminate sends SIGTERM and checks the relay exits 0 promptly (its
// -shutdown-timeout is 1s; the rest is closing the broker and database
// connections).
func (p *proc) terminate(t *testing.T) time.Duration {
	t.Helper()
	t0 := time.Now()
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatalf("SIGTERM: %v", err)
	}
	if code := p.wait(t, 5*time.Second); code != 0 {
		t.Fatalf("SIGTERMed relay exited %d, want 0; stderr:\n%s", code, p.stderr.String())
	}
	took := time.Since(t0)
	if !strings.Contains(p.stderr.String(), `"msg":"shutting down"`) {
		t.Errorf("no shutdown log line; stderr:\n%s", p.stderr.String())
	}
	return took
}

// TestRelayProcessBrokers: the relay process publishes every event of a
// SQLite or PostgreSQL outbox to Kafka, Redis Streams and RabbitMQ, the
// first delivery of each key's events in insertion order, and exits 0 on
// SIGTERM.
func TestRelayProcessBrokers(t *testing.T) {
	for _, b := range processBrokers {
		for _, dbName := range []string{"sqlite", "postgres"} {
			t.Run(b.name+"/"+dbName, func(t *testing.T) {
				t.Parallel()
				t0 := time.Now()
				sfx := brokerSuffix(t)
				topic, group := "outbox.orders.paid."+sfx, "process-test-"+sfx
				url := b.setup(t, topic, group)
				db := newTestDB(t, dbName)
				got := subscribeBroker(t, url, group, topic)
				keys := brokerKeys(brokerTestKeys)
				db.insert(t, topic, keys, 0, brokerTestPerKey)
				events := db.sentEvents(t)
				total := len(keys) * brokerTestPerKey
				if len(events) != total {
					t.Fatalf("%d rows inserted, want %d", len(events), total)
				}

				tRelay := time.Now()
				p := start(t, relayArgs(db.flag, url, "-monitor=false")...)
				waitFor(t, 15*time.Second, "every event delivered", func() bool { return got.unique() >= total })
				delivered := time.Since(tRelay)
				waitFor(t, 5*time.Second, "every row marked sent", func() bool { return db.count(t, 0) == 0 })
				stop := p.terminate(t)
				if n := db.count(t, 1); n != total {
					t.Errorf("%d rows sent, want %d", n, total)
				}
				msgs := got.snapshot()
				dups := checkByID(t, msgs, events)
				t.Logf("%s on %s: %d events over %d keys delivered in %s (%d deliveries, %d duplicates); SIGTERM exit 0 after %s; %s in all",
					b.name, dbName, total, len(keys), delivered.Round(time.Millisecond), len(msgs), dups, stop.Round(time.Millisecond), time.Since(t0).Round(time.Millisecond))
			})
		}
	}
}

// TestReplayThroughKafka: `outboxgen replay -key K`, run while a relay
// process runs, makes the relay publish K's events to Kafka again, with
// their original event ids, in order.
func TestReplayThroughKafka(t *testing.T) {
	t.Parallel()
	t0 := time.Now()
	sfx := brokerSuffix(t)
	topic, group := "outbox.orders.paid."+sfx, "replay-test-"+sfx
	url := kafkaBroker(t, topic, group)
	db := newTestDB(t, "sqlite")
	got := subscribeBroker(t, url, group, topic)
	keys := brokerKeys(brokerTestKeys)
	db.insert(t, topic, keys, 0, brokerTestPerKey)
	events := db.sentEvents(t)
	total := len(keys) * brokerTestPerKey

	p := start(t, relayArgs(db.flag, url, "-monitor=false")...)
	waitFor(t, 15*time.Second, "every event delivered", func() bool { return got.unique() >= total })
	waitFor(t, 5*time.Second, "every row marked sent", func() bool { return db.count(t, 0) == 0 })
	// Quiet: no re-send of the first round still on its way.
	last := -1
	waitFor(t, 5*time.Second, "no more deliveries", func() bool {
		n := got.len()
		quiet := n == last
		last = n
		if !quiet {
			time.Sleep(200 * time.Millisecond)
		}
		return quiet
	})
	first := got.snapshot()
	checkByID(t, first, events)

	const key = "order-07"
	var want []string // key's event ids in order
	for _, m := range first {
		if m.key == key && m.seq == len(want) {
			want = append(want, m.id)
		}
	}
	if len(want) != brokerTestPerKey {
		t.Fatalf("key %s: %d events delivered in order, want %d", key, len(want), brokerTestPerKey)
	}

	out := opsMust(t, "replay", "-db", db.flag, "-key", key)
	if !strings.Contains(out, fmt.Sprintf("replayed %d events", brokerTestPerKey)) {
		t.Errorf("replay -key %s: %s", key, out)
	}
	again := func() []string { // first deliveries of key's events after the replay
		var ids []string
		seen := map[string]bool{}
		for _, m := range got.snapshot()[len(first):] {
			if m.key == key && !seen[m.id] {
				seen[m.id] = true
				ids = append(ids, m.id)
			}
		}
		return ids
	}
	waitFor(t, 15*time.Second, "the replayed events delivered", func() bool { return len(again()) >= brokerTestPerKey })
	waitFor(t, 5*time.Second, "the replayed rows marked sent", func() bool { return db.count(t, 0) == 0 })
	if ids := again(); strings.Join(ids, " ") != strings.Join(want, " ") {
		t.Errorf("key %s replayed as\n%v\nwant its event ids in order\n%v", key, ids, want)
	}
	for _, m := range got.snapshot()[len(first):] {
		if m.key != key {
			t.Errorf("after the replay of %s, event %s of key %s delivered again", key, m.id, m.key)
		}
	}
	stop := p.terminate(t)
	t.Logf("replay of %d events of %s delivered again in order; SIGTERM exit 0 after %s; %s in all",
		brokerTestPerKey, key, stop.Round(time.Millisecond), time.Since(t0).Round(time.Millisecond))
}
