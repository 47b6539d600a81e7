package txpublisher_test

import (
	"context"
	"database/sql"
	"errors"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"

	"github.com/outboxgen/outboxgen/internal/testdb"
	"github.com/outboxgen/outboxgen/runtime/driver/sqldriver"
	"github.com/outboxgen/outboxgen/runtime/outbox"
	"github.com/outboxgen/outboxgen/runtime/relay"
	"github.com/outboxgen/outboxgen/runtime/txpublisher"
)

// TestThroughRelay publishes through the txpublisher, commits, runs the
// relay and checks what a consumer receives: the same UUID, payload and
// metadata, plus the relay's outbox_* keys.
func TestThroughRelay(t *testing.T) {
	forEachDialect(t, func(t *testing.T, db *sql.DB, w *outbox.Writer) {
		tx := begin(t, db)
		in := msg(`{"order_id":"o-1"}`, "partition_key", "o-1", "outbox_type", "ORDER_PAID", "trace_id", "abc")
		if err := txpublisher.New(tx, w, txpublisher.Config{}).Publish("orders", in); err != nil {
			t.Fatal(err)
		}
		if err := tx.Commit(); err != nil {
			t.Fatal(err)
		}

		broker := gochannel.NewGoChannel(gochannel.Config{Persistent: true}, watermill.NopLogger{})
		defer broker.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		sub, err := broker.Subscribe(ctx, "orders")
		if err != nil {
			t.Fatal(err)
		}
		drv, err := sqldriver.New(db, testdb.Schema(w.Dialect()))
		if err != nil {
			t.Fatal(err)
		}
		r, err := relay.New(drv, relay.Config{
			Publisher:    broker,
			PollInterval: 10 * time.Millisecond,
			Logger:       slog.New(slog.NewTextHandler(io.Discard, nil)),
		})
		if err != nil {
			t.Fatal(err)
		}
		rctx, stop := context.WithCancel(ctx)
		done := make(chan error, 1)
		go func() { done <- r.Run(rctx) }()
		defer func() {
			stop()
			if err := <-done; err != nil && !errors.Is(err, context.Canceled) {
				t.Errorf("relay: %v", err)
			}
		}()

		var out *message.Message
		select {
		case out = <-sub:
			out.Ack()
		case <-ctx.Done():
			t.Fatal("the relay did not publish the row")
		}
		if out.UUID != in.UUID {
			t.Errorf("UUID = %s, want %s", out.UUID, in.UUID)
		}
		if w.Dialect() != outbox.MySQL && string(out.Payload) != string(in.Payload) {
			t.Errorf("payload = %s, want %s", out.Payload, in.Payload)
		}
		for k, v := range map[string]string{
			"trace_id":                 "abc",
			relay.MetadataType:         "ORDER_PAID",
			relay.MetadataKey:          "o-1",
			relay.MetadataVersion:      "1",
			relay.MetadataEventID:      in.UUID,
			relay.MetadataPartitionKey: "o-1",
		} {
			if got := out.Metadata.Get(k); got != v {
				t.Errorf("metadata %s = %q, want %q", k, got, v)
			}
		}
	})
}

// TestRelaySetKeys checks the publisher's default metadata keys against
// the relay's, so that a message consumed from the relay and published
// again keeps its type, key and version.
func TestRelaySetKeys(t *testing.T) {
	if txpublisher.DefaultTypeMetadata != relay.MetadataType ||
		txpublisher.DefaultKeyMetadata != relay.MetadataPartitionKey ||
		txpublisher.DefaultVersionMetadata != relay.MetadataVersion {
		t.Fatal("txpublisher's default metadata keys differ from the relay's")
	}
	// Relay-set keys are not stored as headers; see TestPublishCommitWritesRows
	// (outbox_created_at) and this round trip of the others.
	m := msg(`{}`, relay.MetadataKey, "x", relay.MetadataEventID, "y", relay.MetadataCreatedAt, "z", relay.MetadataSequence, "42")
	forEachDialect(t, func(t *testing.T, db *sql.DB, w *outbox.Writer) {
		tx := begin(t, db)
		if err := txpublisher.New(tx, w, txpublisher.Config{}).Publish("orders", m.Copy()); err != nil {
			t.Fatal(err)
		}
		if err := tx.Commit(); err != nil {
			t.Fatal(err)
		}
		if got := rows(t, db); len(got) != 1 || got[0].Headers != nil {
			t.Fatalf("rows = %+v, want one row without headers", got)
		}
	})
}
