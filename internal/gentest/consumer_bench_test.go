package gentest

import (
	"fmt"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/outboxgen/outboxgen/internal/gentest/sqlevents"
	"github.com/outboxgen/outboxgen/runtime/inbox"
	"github.com/outboxgen/outboxgen/runtime/outbox"
)

// BenchmarkConsumer measures consumer throughput on PostgreSQL (database/sql)
// with the inbox (the generated RegisterPoints: inbox insert + handler in
// one transaction) against the same handler without it (a plain watermill
// handler: decode, begin, the same UPDATE, commit), side by side in one
// run: both run on one router and one GoChannel, in alternating blocks of
// 200 messages delivered concurrently, so machine noise hits both alike.
// It reports inbox-msg/s, plain-msg/s and their ratio inbox/plain.
func BenchmarkConsumer(b *testing.B) {
	be := sqlBackend(b, "postgres")
	const customers = 64
	br := startConsumer(b, be, inbox.Config{})
	for i := range customers {
		be.mustExec(b, `INSERT INTO balances (customer_id, points) VALUES (?, 0)`, fmt.Sprintf("b-%d", i))
	}
	db := be.db

	const plainTopic = "bench.plain"
	plain := func(msg *message.Message) error {
		ctx := msg.Context()
		m, err := outbox.ParseMeta(msg.Metadata, msg.UUID)
		if err != nil {
			return err
		}
		e, err := sqlevents.DecodeOrderPaid(msg.Payload, m.Version)
		if err != nil {
			return err
		}
		tx, err := db.BeginTx(ctx, nil)
		if err != nil {
			return err
		}
		defer tx.Rollback()
		if _, err := tx.ExecContext(ctx, `UPDATE balances SET points = points + $1 WHERE customer_id = $2`, e.AmountCents/100, e.CustomerID); err != nil {
			return err
		}
		if _, err := tx.ExecContext(ctx, `INSERT INTO credit_log (order_id, event_id) VALUES ($1, $2)`, e.OrderID, m.EventID); err != nil {
			return err
		}
		return tx.Commit()
	}
	br.router.AddConsumerHandler("plain", plainTopic, br.ps, plain)
	if err := br.router.RunHandlers(b.Context()); err != nil {
		b.Fatal(err)
	}

	const block = 200
	seq := int64(0)
	run := func(topic string, n int) time.Duration {
		msgs := make([]*message.Message, n)
		for i := range msgs {
			seq++
			ev := paid(fmt.Sprintf("o-%d", seq))
			ev.CustomerID = fmt.Sprintf("b-%d", seq%customers)
			msgs[i] = paidMessageOf(b, outbox.NewEventID().String(), ev, seq)
		}
		start := time.Now()
		br.publish(topic, msgs...)
		br.waitAcked(n)
		return time.Since(start)
	}
	// Warm up both paths (connections, plans).
	run(sqlevents.OrderPaidTopic, 50)
	run(plainTopic, 50)

	var inboxTime, plainTime time.Duration
	b.ResetTimer()
	for done := 0; done < b.N; done += block {
		n := min(block, b.N-done)
		inboxTime += run(sqlevents.OrderPaidTopic, n)
		plainTime += run(plainTopic, n)
	}
	b.StopTimer()
	inboxRate := float64(b.N) / inboxTime.Seconds()
	plainRate := float64(b.N) / plainTime.Seconds()
	b.ReportMetric(inboxRate, "inbox-msg/s")
	b.ReportMetric(plainRate, "plain-msg/s")
	b.ReportMetric(inboxRate/plainRate, "inbox/plain")
	if o := br.outcomes(); o["processed"] < int64(b.N) {
		b.Fatalf("outcomes %v, want %d processed", o, b.N)
	}
}
