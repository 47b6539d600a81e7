package pgxtxpublisher_test

import (
	"context"
	"encoding/json"
	"errors"
	"testing"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxgen/outboxgen/internal/testdb"
	"github.com/outboxgen/outboxgen/runtime/outbox"
	"github.com/outboxgen/outboxgen/runtime/txpublisher"
	"github.com/outboxgen/outboxgen/runtime/txpublisher/pgxtxpublisher"
	"github.com/outboxgen/outboxgen/templates"
)

const table = "outbox_event"

func setup(t *testing.T) (*pgxpool.Pool, *outbox.Writer) {
	t.Helper()
	pool := testdb.PgxPool(t)
	ddl, err := templates.Render("postgres", templates.DefaultTables)
	if err != nil {
		t.Fatal(err)
	}
	for _, stmt := range templates.Statements(ddl) {
		if _, err := pool.Exec(context.Background(), stmt); err != nil {
			t.Fatal(err)
		}
	}
	return pool, outbox.MustNewWriter(outbox.Postgres, table)
}

type stored struct {
	EventID, Type, Key, Topic, Payload string
	Version                            int
	Headers                            map[string]string
}

func rows(t *testing.T, pool *pgxpool.Pool) []stored {
	t.Helper()
	rs, err := pool.Query(context.Background(),
		"SELECT event_id::text, biz_type, biz_id, topic, payload_version, payload::text, headers::text FROM "+table+" ORDER BY id")
	if err != nil {
		t.Fatal(err)
	}
	defer rs.Close()
	var out []stored
	for rs.Next() {
		var s stored
		var headers *string
		if err := rs.Scan(&s.EventID, &s.Type, &s.Key, &s.Topic, &s.Version, &s.Payload, &headers); err != nil {
			t.Fatal(err)
		}
		if headers != nil {
			if err := json.Unmarshal([]byte(*headers), &s.Headers); err != nil {
				t.Fatal(err)
			}
		}
		out = append(out, s)
	}
	if err := rs.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

func begin(t *testing.T, pool *pgxpool.Pool) pgx.Tx {
	t.Helper()
	tx, err := pool.Begin(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = tx.Rollback(context.Background()) })
	return tx
}

func msg(payload string, md ...string) *message.Message {
	m := message.NewMessage(watermill.NewUUID(), []byte(payload))
	for i := 0; i+1 < len(md); i += 2 {
		m.Metadata.Set(md[i], md[i+1])
	}
	return m
}

func TestCommitRollbackAndTxDone(t *testing.T) {
	t.Parallel()
	pool, w := setup(t)
	ctx := context.Background()

	// Rolled back: nothing.
	tx := begin(t, pool)
	if err := pgxtxpublisher.New(tx, w, txpublisher.Config{}).Publish("orders", msg(`{}`), msg(`{}`)); err != nil {
		t.Fatal(err)
	}
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	if got := rows(t, pool); len(got) != 0 {
		t.Fatalf("%d rows after rollback", len(got))
	}

	// Committed: one row per message, a refused message in between
	// leaving the transaction usable, the same message twice once.
	tx = begin(t, pool)
	var pub message.Publisher = pgxtxpublisher.New(tx, w, txpublisher.Config{})
	a := msg(`{"a": 1}`, "partition_key", "order-1", "trace_id", "t1")
	b := msg(`{"b": 2}`, "outbox_type", "ORDER_PAID", "outbox_version", "2")
	if err := pub.Publish("orders", a, b); err != nil {
		t.Fatal(err)
	}
	if err := pub.Publish("orders", message.NewMessage("not-a-uuid", []byte(`{}`))); !errors.Is(err, txpublisher.ErrInvalidMessageID) {
		t.Fatalf("non-UUID id: err = %v", err)
	}
	if err := pub.Publish("orders", msg("\x01binary")); !errors.Is(err, txpublisher.ErrPayloadNotJSON) {
		t.Fatalf("binary payload: err = %v", err)
	}
	if err := pub.Publish("orders", a); err != nil {
		t.Fatal(err)
	}
	if err := pub.Publish("payments", a); !errors.Is(err, txpublisher.ErrDuplicateEventID) {
		t.Fatalf("same UUID on another topic: err = %v", err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	got := rows(t, pool)
	if len(got) != 2 {
		t.Fatalf("%d rows, want 2: %+v", len(got), got)
	}
	if g := got[0]; g.EventID != a.UUID || g.Key != "order-1" || g.Type != "orders" || g.Topic != "orders" || g.Version != 1 || g.Payload != `{"a": 1}` || len(g.Headers) != 1 || g.Headers["trace_id"] != "t1" {
		t.Errorf("row a = %+v", g)
	}
	if g := got[1]; g.EventID != b.UUID || g.Key != b.UUID || g.Type != "ORDER_PAID" || g.Version != 2 || g.Headers != nil {
		t.Errorf("row b = %+v", g)
	}

	// After commit.
	err := pub.Publish("orders", msg(`{}`))
	if !errors.Is(err, txpublisher.ErrTxDone) || !errors.Is(err, pgx.ErrTxClosed) {
		t.Fatalf("after commit: err = %v, want ErrTxDone wrapping pgx.ErrTxClosed", err)
	}
}
