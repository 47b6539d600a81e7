package walrelay_test

import (
	"context"
	"database/sql"
	"errors"
	"maps"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5/stdlib"

	"github.com/outboxgen/outboxgen/internal/testdb"
	"github.com/outboxgen/outboxgen/runtime/driver/pgxdriver"
	"github.com/outboxgen/outboxgen/runtime/outbox"
	"github.com/outboxgen/outboxgen/runtime/outbox/pgxoutbox"
	"github.com/outboxgen/outboxgen/runtime/relay"
	"github.com/outboxgen/outboxgen/runtime/walrelay"
)

// recorder is a publisher that keeps a copy of every message it is given
// and refuses, permanently, the ones refuse says to.
type recorder struct {
	mu     sync.Mutex
	msgs   []*message.Message
	refuse func(*message.Message) bool
}

func (p *recorder) Publish(_ string, msgs ...*message.Message) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, m := range msgs {
		c := message.NewMessage(m.UUID, append([]byte(nil), m.Payload...))
		c.Metadata = maps.Clone(m.Metadata)
		p.msgs = append(p.msgs, c)
		if p.refuse != nil && p.refuse(m) {
			return relay.Permanent(errors.New("test: refused"))
		}
	}
	return nil
}

func (p *recorder) Close() error { return nil }

func (p *recorder) got() []*message.Message {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]*message.Message(nil), p.msgs...)
}

// The polling relay and the stream build messages with one builder: an
// event the stream hands to the publisher, then parks, then the polling
// relay publishes from its row, is the same message (UUID, metadata,
// payload) both times. Binary payloads and stored headers included.
func TestBothRelaysPublishIdenticalMessages(t *testing.T) {
	pool := logicalPool(t)
	w := walWriter(t)
	wal := &recorder{refuse: func(*message.Message) bool { return true }}
	r := newRelay(t, pool, wal, func(c *walrelay.Config) { c.Backoff = func(int) time.Duration { return 10 * time.Millisecond } })
	runRelay(t, r)
	waitFor(t, 30*time.Second, "the relay to stream", func() bool { return r.Status().Streaming })

	ctx := context.Background()
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, ev := range []outbox.Event{
		{Type: "ORDER_PAID", Topic: topic, Key: "o-1", Version: 3, Payload: map[string]any{"amount": 12.5, "note": "ü"}},
		{Type: "ORDER_PAID", Topic: topic, Key: "o-2", Version: 1, Payload: []byte{0, 1, 2, 0xff}},
	} {
		if _, err := w.InsertTx(ctx, pgxoutbox.Tx(tx), ev, outbox.WithHeader("tenant", "t-1"), outbox.WithHeader("traceparent", "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01")); err != nil {
			t.Fatal(err)
		}
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 30*time.Second, "both events parked", func() bool { return r.Status().Parked == 2 })

	drv, err := pgxdriver.New(pool, schema())
	if err != nil {
		t.Fatal(err)
	}
	polled := &recorder{}
	pr, err := relay.New(drv, relay.Config{Publisher: polled, PollInterval: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	pctx, pcancel := context.WithCancel(ctx)
	pdone := make(chan error, 1)
	go func() { pdone <- pr.Run(pctx) }()
	t.Cleanup(func() { pcancel(); <-pdone })
	waitFor(t, 30*time.Second, "the polling relay to publish both", func() bool { return len(polled.got()) == 2 })

	streamed := map[string]*message.Message{}
	for _, m := range wal.got() {
		streamed[m.UUID] = m
	}
	for _, p := range polled.got() {
		s := streamed[p.UUID]
		if s == nil {
			t.Fatalf("the polling relay published %s, which the stream never built", p.UUID)
		}
		if string(s.Payload) != string(p.Payload) {
			t.Errorf("%s: payload %q from the stream, %q from the table", p.UUID, s.Payload, p.Payload)
		}
		if !maps.Equal(s.Metadata, p.Metadata) {
			t.Errorf("%s: metadata differ:\nstream %v\ntable  %v", p.UUID, s.Metadata, p.Metadata)
		}
		if p.Metadata.Get("tenant") != "t-1" || p.Metadata.Get(outbox.MetadataSequence) == "" {
			t.Errorf("%s: metadata %v lack the stored header or outbox_seq", p.UUID, p.Metadata)
		}
	}
}

// A writer from a schema with WAL set (what generated code has for
// sql.wal: true) writes into the WAL through both transaction kinds the
// generated InsertX take, *sql.Tx and pgx.Tx, and leaves the outbox table
// alone; the stream publishes both events.
func TestSchemaWALWritersStream(t *testing.T) {
	pool := logicalPool(t)
	s := schema()
	s.WAL = true
	rec := &recorder{}
	r := newRelay(t, pool, rec, nil)
	runRelay(t, r)
	waitFor(t, 30*time.Second, "the relay to stream", func() bool { return r.Status().Streaming })

	ctx := context.Background()
	db := stdlib.OpenDBFromPool(pool)
	t.Cleanup(func() { db.Close() })
	w, err := s.WriterFor(db)
	if err != nil || w.WAL() == nil {
		t.Fatalf("WriterFor: %v, %v; want a WAL writer", w, err)
	}
	ev := outbox.Event{Type: "ORDER_PAID", Topic: topic, Key: "k", Version: 1, Payload: map[string]int{"n": 1}}
	stx, err := db.BeginTx(ctx, &sql.TxOptions{})
	if err != nil {
		t.Fatal(err)
	}
	id1, err := w.Insert(ctx, stx, ev)
	if err != nil {
		t.Fatal(err)
	}
	if err := stx.Commit(); err != nil {
		t.Fatal(err)
	}
	ptx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	bw, err := outbox.NewBinding(s).Writer() // the generated package-level InsertX's writer
	if err != nil || bw.WAL() == nil {
		t.Fatalf("NewBinding: %v, %v; want a WAL writer", bw, err)
	}
	id2, err := pgxoutbox.Insert(ctx, ptx, bw, ev)
	if err != nil {
		t.Fatal(err)
	}
	if err := ptx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 30*time.Second, "both events streamed", func() bool { return len(rec.got()) == 2 })
	got := map[string]bool{}
	for _, m := range rec.got() {
		got[m.UUID] = true
	}
	if !got[id1.String()] || !got[id2.String()] {
		t.Fatalf("streamed %v, want %s and %s", got, id1, id2)
	}
	var rows int
	if err := pool.QueryRow(ctx, "SELECT count(*) FROM "+testdb.Tables.Outbox).Scan(&rows); err != nil || rows != 0 {
		t.Fatalf("%d outbox rows (%v), want none: WAL writers do not insert", rows, err)
	}
}
