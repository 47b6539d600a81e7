package gentest

import (
	"context"
	"database/sql"
	"encoding/json"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/outboxgen/outboxgen/internal/gentest/sqlevents"
	"github.com/outboxgen/outboxgen/runtime/outbox"
)

// handWritten is the INSERT a careful developer would write by hand for the
// same row: a UUIDv7, the JSON payload, one statement.
func handWritten(ctx context.Context, tx *sql.Tx, e sqlevents.OrderPaid) (uuid.UUID, error) {
	id, err := uuid.NewV7()
	if err != nil {
		return uuid.UUID{}, err
	}
	payload, err := json.Marshal(e)
	if err != nil {
		return uuid.UUID{}, err
	}
	_, err = tx.ExecContext(ctx,
		`INSERT INTO outbox_event (event_id, biz_type, biz_id, topic, payload_version, payload, headers) VALUES ($1, $2, $3, $4, $5, $6, $7)`,
		id.String(), "ORDER_PAID", e.OrderID, "orders.paid", 1, string(payload), nil)
	return id, err
}

// benchWriter is BenchmarkWriter's writer.
var benchWriter sqlevents.Writer

func generated(ctx context.Context, tx *sql.Tx, e sqlevents.OrderPaid) error {
	_, err := benchWriter.InsertOrderPaid(ctx, tx, e)
	return err
}

func handwritten(ctx context.Context, tx *sql.Tx, e sqlevents.OrderPaid) error {
	_, err := handWritten(ctx, tx, e)
	return err
}

// BenchmarkWriter compares the generated InsertOrderPaid with a hand-written
// INSERT of the same row on real PostgreSQL, each in its own short
// transaction. The "interleaved" case alternates the two in blocks inside
// one run, so machine noise hits both alike, and reports their ratio as the
// gen/hand metric (target: at most 1.05).
func BenchmarkWriter(b *testing.B) {
	e := setup(b, "postgres")
	benchWriter = e.writer
	ctx := context.Background()
	ev := paid("o-1")

	insert := func(b *testing.B, f func(context.Context, *sql.Tx, sqlevents.OrderPaid) error) {
		tx, err := e.db.BeginTx(ctx, nil)
		if err != nil {
			b.Fatal(err)
		}
		if err := f(ctx, tx, ev); err != nil {
			b.Fatal(err)
		}
		if err := tx.Commit(); err != nil {
			b.Fatal(err)
		}
	}
	b.Run("generated", func(b *testing.B) {
		for b.Loop() {
			insert(b, generated)
		}
	})
	b.Run("handwritten", func(b *testing.B) {
		for b.Loop() {
			insert(b, handwritten)
		}
	})
	b.Run("interleaved", func(b *testing.B) {
		const block = 50
		var gen, hand time.Duration
		n := 0
		for b.Loop() {
			// Alternate which side goes first so neither always runs warm.
			sides := []struct {
				f   func(context.Context, *sql.Tx, sqlevents.OrderPaid) error
				acc *time.Duration
			}{{generated, &gen}, {handwritten, &hand}}
			if n%2 == 1 {
				sides[0], sides[1] = sides[1], sides[0]
			}
			for _, s := range sides {
				start := time.Now()
				for range block {
					insert(b, s.f)
				}
				*s.acc += time.Since(start)
			}
			n++
		}
		b.ReportMetric(float64(gen)/float64(n*block), "gen-ns/insert")
		b.ReportMetric(float64(hand)/float64(n*block), "hand-ns/insert")
		b.ReportMetric(float64(gen)/float64(hand), "gen/hand")
	})
}

// BenchmarkPrepare measures the writer's CPU cost alone (validation,
// marshalling, id, arguments), without a database round trip.
func BenchmarkPrepare(b *testing.B) {
	ev := paid("o-1")
	w, err := sqlevents.DialectWriter(outbox.Postgres)
	if err != nil {
		b.Fatal(err)
	}
	for b.Loop() {
		if err := ev.Validate(); err != nil {
			b.Fatal(err)
		}
		if _, err := w.Outbox().Prepare(outbox.Event{Type: sqlevents.OrderPaidType, Topic: sqlevents.OrderPaidTopic, Key: ev.OrderID, Version: sqlevents.OrderPaidVersion, Payload: ev}); err != nil {
			b.Fatal(err)
		}
	}
}
