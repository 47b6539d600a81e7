package walrelay_test

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net"
	"os"
	"sort"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"

	"github.com/outboxgen/outboxgen/internal/natstest"
	"github.com/outboxgen/outboxgen/internal/testdb"
	"github.com/outboxgen/outboxgen/runtime/brokers/natsjs"
	"github.com/outboxgen/outboxgen/runtime/outbox"
	"github.com/outboxgen/outboxgen/runtime/outbox/pgxoutbox"
	"github.com/outboxgen/outboxgen/runtime/walrelay"
	"github.com/outboxgen/outboxgen/templates"
)

const topic = "wal.orders"

// logicalPool returns a pool on a fresh database with the outbox schema,
// on a server with wal_level=logical. Outside CI, a server without it
// skips the test; under CI (CI=true) it fails. Replication slots of the
// database are dropped before the database is.
func logicalPool(t testing.TB) *pgxpool.Pool {
	t.Helper()
	pool := testdb.PgxPool(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var level string
	if err := pool.QueryRow(ctx, "SELECT current_setting('wal_level')").Scan(&level); err != nil {
		t.Fatal(err)
	}
	if level != "logical" {
		msg := fmt.Sprintf("the PostgreSQL server of %s runs with wal_level=%s; the WAL relay needs wal_level=logical (scripts/testdb.sh sets it at the server's next start: `scripts/testdb.sh stop postgres && scripts/testdb.sh start postgres`)", testdb.PostgresEnv, level)
		if os.Getenv("CI") == "true" {
			t.Fatal(msg)
		}
		t.Skip(msg)
	}
	ddl, err := templates.Render("postgres", templates.Tables{Outbox: testdb.Tables.Outbox, Inbox: testdb.Tables.Inbox})
	if err != nil {
		t.Fatal(err)
	}
	for _, stmt := range templates.Statements(ddl) {
		if _, err := pool.Exec(ctx, stmt); err != nil {
			t.Fatalf("apply schema: %v\n%s", err, stmt)
		}
	}
	t.Cleanup(func() { dropSlots(t, pool) })
	return pool
}

// dropSlots drops the replication slots of pool's database (a database
// with a slot cannot be dropped), ending the walsenders still holding one.
func dropSlots(t testing.TB, pool *pgxpool.Pool) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for ctx.Err() == nil {
		_, _ = pool.Exec(ctx, "SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots WHERE database = current_database() AND active_pid IS NOT NULL")
		_, err := pool.Exec(ctx, "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE database = current_database() AND NOT active")
		var n int
		if err == nil {
			err = pool.QueryRow(ctx, "SELECT count(*) FROM pg_replication_slots WHERE database = current_database()").Scan(&n)
		}
		if err == nil && n == 0 {
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Errorf("could not drop the replication slots of the test database")
}

func schema() outbox.Schema { return testdb.Schema(outbox.Postgres) }

// walWriter is the WAL write path on the default outbox table.
func walWriter(t testing.TB) *outbox.WALWriter {
	t.Helper()
	w, err := outbox.NewWALWriter(outbox.MustNewWriter(outbox.Postgres, testdb.Tables.Outbox))
	if err != nil {
		t.Fatal(err)
	}
	return w
}

// payload is what the test events carry: their key and their number
// within the key.
type payload struct {
	Key string `json:"key"`
	N   int    `json:"n"`
	Tag string `json:"tag,omitempty"`
}

// write commits one transaction emitting the events (key, n) through the
// WAL write path; rollback rolls it back instead. Any error is fatal.
func write(t testing.TB, pool *pgxpool.Pool, w *outbox.WALWriter, rollback bool, evs ...payload) []outbox.EventID {
	t.Helper()
	ids, err := writeE(pool, w, rollback, evs...)
	if err != nil {
		t.Fatal(err)
	}
	return ids
}

// writeE is write returning its error, for goroutines other than the
// test's.
func writeE(pool *pgxpool.Pool, w *outbox.WALWriter, rollback bool, evs ...payload) ([]outbox.EventID, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	tx, err := pool.Begin(ctx)
	if err != nil {
		return nil, err
	}
	defer tx.Rollback(ctx) //nolint:errcheck
	var ids []outbox.EventID
	for _, p := range evs {
		id, err := w.InsertTx(ctx, pgxoutbox.Tx(tx), outbox.Event{Type: "ORDER_CHANGED", Topic: topic, Key: p.Key, Version: 1, Payload: p},
			outbox.WithHeader("tenant", "t-1"))
		if err != nil {
			return nil, err
		}
		ids = append(ids, id)
	}
	if rollback {
		return ids, tx.Rollback(ctx)
	}
	return ids, tx.Commit(ctx)
}

// natsBroker is an in-process NATS JetStream server that can be stopped
// and restarted on the same port and store (a broker outage).
type natsBroker struct {
	t    testing.TB
	mu   sync.Mutex
	srv  *server.Server
	opts server.Options
	pub  *natsjs.Publisher
	conn *nats.Conn
	js   nats.JetStreamContext
}

func startNATS(t testing.TB) *natsBroker {
	t.Helper()
	b := &natsBroker{t: t, opts: natstest.Options(t.TempDir())}
	b.opts.ServerName = "walrelay-test"
	b.start()
	b.opts.Port = b.srv.Addr().(*net.TCPAddr).Port
	url := b.srv.ClientURL()
	pub, err := natsjs.NewPublisher(natsjs.Config{URL: url, PublishTimeout: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pub.Close() })
	if err := pub.EnsureStream(topic); err != nil {
		t.Fatal(err)
	}
	b.pub = pub
	conn, err := nats.Connect(url, nats.MaxReconnects(-1), nats.ReconnectWait(100*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(conn.Close)
	js, err := conn.JetStream()
	if err != nil {
		t.Fatal(err)
	}
	b.conn, b.js = conn, js
	return b
}

func (b *natsBroker) start() {
	b.t.Helper()
	s, err := natstest.Run(&b.opts)
	if err != nil {
		b.t.Fatalf("nats server: %v", err)
	}
	b.mu.Lock()
	b.srv = s
	b.mu.Unlock()
	b.t.Cleanup(func() { s.Shutdown(); s.WaitForShutdown() })
}

// stop shuts the server down (an outage); restart brings it back.
func (b *natsBroker) stop() {
	b.mu.Lock()
	s := b.srv
	b.mu.Unlock()
	s.Shutdown()
	s.WaitForShutdown()
}

func (b *natsBroker) restart() { b.start() }

// got is one message read back from the broker.
type got struct {
	EventID string
	payload
	Meta map[string]string
}

// messages reads every message of the topic's stream, in stream order.
func (b *natsBroker) messages(t testing.TB) []got {
	t.Helper()
	info, err := b.js.StreamInfo(natsjs.DefaultStreamName(topic))
	if err != nil {
		t.Fatalf("stream info: %v", err)
	}
	var out []got
	for seq := info.State.FirstSeq; seq <= info.State.LastSeq && info.State.Msgs > 0; seq++ {
		raw, err := b.js.GetMsg(natsjs.DefaultStreamName(topic), seq)
		if err != nil {
			t.Fatalf("get message %d: %v", seq, err)
		}
		msg, err := natsjs.Marshaler{}.Unmarshal(&nats.Msg{Subject: raw.Subject, Header: raw.Header, Data: raw.Data})
		if err != nil {
			t.Fatalf("unmarshal message %d: %v", seq, err)
		}
		var p payload
		if err := json.Unmarshal(msg.Payload, &p); err != nil {
			t.Fatalf("message %d payload %q: %v", seq, msg.Payload, err)
		}
		out = append(out, got{EventID: msg.UUID, payload: p, Meta: msg.Metadata})
	}
	return out
}

// waitFor polls cond until it holds or the timeout passes.
func waitFor(t testing.TB, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s", timeout, what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// settled waits for count to reach n, then a moment more, and returns it
// then: a count above n means more came than should have. (The broker
// has an event a moment before the relay counts it.)
func settled(t testing.TB, what string, n int64, count func() int64) int64 {
	t.Helper()
	waitFor(t, 10*time.Second, what, func() bool { return count() >= n })
	time.Sleep(200 * time.Millisecond)
	return count()
}

// walInsertLSN returns the server's WAL insert position: read after a
// commit, it is past the commit's record. (Not pg_current_wal_lsn, the
// write position: with synchronous_commit off, as on the test databases,
// the commit record may not be written yet when Commit returns.)
func walInsertLSN(t testing.TB, pool *pgxpool.Pool) pglogrepl.LSN {
	t.Helper()
	var lsn pglogrepl.LSN
	if err := pool.QueryRow(context.Background(), "SELECT pg_current_wal_insert_lsn()::text").Scan(&lsn); err != nil {
		t.Fatal(err)
	}
	return lsn
}

// checkOrder checks that, keeping each event's first delivery, every key's
// events arrived as 1, 2, ... want[key], with nothing missing; it returns
// the number of duplicate deliveries.
func checkOrder(t testing.TB, msgs []got, want map[string]int) int {
	t.Helper()
	seen := map[string]bool{}
	next := map[string]int{}
	dups := 0
	for _, m := range msgs {
		if seen[m.EventID] {
			dups++
			continue
		}
		seen[m.EventID] = true
		if _, ok := want[m.Key]; !ok {
			t.Errorf("unexpected event %s of key %q (n %d)", m.EventID, m.Key, m.N)
			continue
		}
		next[m.Key]++
		if m.N != next[m.Key] {
			t.Errorf("key %s: event n=%d arrived in position %d: per-key order broken", m.Key, m.N, next[m.Key])
			next[m.Key] = m.N
		}
	}
	keys := make([]string, 0, len(want))
	for k := range want {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		if next[k] != want[k] {
			t.Errorf("key %s: %d distinct events arrived, want %d", k, next[k], want[k])
		}
	}
	return dups
}

// distinct counts the distinct event ids of msgs.
func distinct(msgs []got) int {
	seen := map[string]bool{}
	for _, m := range msgs {
		seen[m.EventID] = true
	}
	return len(seen)
}

// runRelay starts r.Run and returns a function that stops it and waits.
func runRelay(t testing.TB, r *walrelay.Relay) (stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			select {
			case err := <-done:
				if err != nil {
					t.Errorf("relay Run: %v", err)
				}
			case <-time.After(30 * time.Second):
				t.Errorf("relay Run did not return 30s after its context was cancelled")
			}
		})
	}
	t.Cleanup(stop)
	return stop
}

// newRelay makes a relay with test-sized intervals.
func newRelay(t testing.TB, pool *pgxpool.Pool, pub message.Publisher, mod func(*walrelay.Config)) *walrelay.Relay {
	t.Helper()
	cfg := walrelay.Config{
		Slot:             testSlot(pool),
		Publisher:        pub,
		StatusInterval:   100 * time.Millisecond,
		TakeoverInterval: 200 * time.Millisecond,
		RetryDelay:       20 * time.Millisecond,
		ShutdownTimeout:  5 * time.Second,
		ReconnectMax:     time.Second,
		BreakerBackoff:   func(int) time.Duration { return 200 * time.Millisecond },
		Logger:           slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: slog.LevelInfo})),
	}
	if mod != nil {
		mod(&cfg)
	}
	r, err := walrelay.New(pool, schema(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// testSlot names the relays' slot after the test's database: slots are
// the server's, not the database's, and one left by a run killed on its
// timeout must not stand in the way of the next run.
func testSlot(pool *pgxpool.Pool) string {
	return walrelay.DefaultSlot(pool.Config().ConnConfig.Database)
}

type testWriter struct{ t testing.TB }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(string(p))
	return len(p), nil
}

// outboxRows returns (id, biz_id, status) of every outbox row, by id.
func outboxRows(t testing.TB, pool *pgxpool.Pool) [][3]string {
	t.Helper()
	rows, err := pool.Query(context.Background(), "SELECT id, biz_id, status FROM "+testdb.Tables.Outbox+" ORDER BY id")
	if err != nil {
		t.Fatal(err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) ([3]string, error) {
		var id int64
		var key string
		var st int
		err := r.Scan(&id, &key, &st)
		return [3]string{strconv.FormatInt(id, 10), key, strconv.Itoa(st)}, err
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// Environment of the relay child process (TestSIGKILLMidStream).
const (
	childDSNEnv  = "WALRELAY_TEST_CHILD_DSN"
	childNATSEnv = "WALRELAY_TEST_CHILD_NATS"
)

// TestMain runs a relay instead of the tests when started as the child of
// TestSIGKILLMidStream; it streams until it is killed.
func TestMain(m *testing.M) {
	if dsn := os.Getenv(childDSNEnv); dsn != "" {
		os.Exit(childRelay(dsn, os.Getenv(childNATSEnv)))
	}
	os.Exit(m.Run())
}

func childRelay(dsn, natsURL string) int {
	log := slog.New(slog.NewTextHandler(os.Stderr, nil))
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, dsn)
	if err != nil {
		log.Error("child: pool", "error", err)
		return 2
	}
	pub, err := natsjs.NewPublisher(natsjs.Config{URL: natsURL, PublishTimeout: 2 * time.Second})
	if err != nil {
		log.Error("child: nats", "error", err)
		return 2
	}
	r, err := walrelay.New(pool, schema(), walrelay.Config{Slot: testSlot(pool), Publisher: pub, StatusInterval: 50 * time.Millisecond, InstanceID: "child", Logger: log})
	if err != nil {
		log.Error("child: relay", "error", err)
		return 2
	}
	if err := r.Run(ctx); err != nil {
		log.Error("child: run", "error", err)
		return 1
	}
	return 0
}
