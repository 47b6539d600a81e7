package main

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/outboxgen/outboxgen/examples/orderpaid/db/sqlitedb"
	"github.com/outboxgen/outboxgen/examples/orderpaid/events"
	"github.com/outboxgen/outboxgen/runtime/inbox"
	"github.com/outboxgen/outboxgen/runtime/outbox"
)

// This file is the service: the business transactions that pay and refund
// orders (the producer side), and the two consumers.

// errProviderFailed is the simulated failure of a payment after the order
// row and the event were written: the seed design's acceptance check 1
// ("throw an error after the business update: the outbox row must roll
// back with it").
var errProviderFailed = errors.New("payment provider error after the writes")

// pay marks the order paid and writes its ORDER_PAID event in one local
// transaction. No broker is called here: the relay publishes the event
// after the commit. fail simulates an error after both writes.
func (a *app) pay(ctx context.Context, orderID string, fail bool) (outbox.EventID, error) {
	var id outbox.EventID
	err := a.store.inTx(ctx, func(tx *sql.Tx) error {
		q := a.store.queries(tx)
		paidAt := time.Now().UTC().Truncate(time.Microsecond)
		// The UPDATE comes first: it is the state check (only a new order
		// can be paid) and, on PostgreSQL and MySQL, the row lock that
		// keeps the events of one order in commit order.
		n, err := q.MarkOrderPaid(ctx, sqlitedb.MarkOrderPaidParams{PaidAt: sql.NullTime{Time: paidAt, Valid: true}, ID: orderID})
		if err != nil {
			return err
		}
		if n != 1 {
			return fmt.Errorf("pay %s: the order is not new", orderID)
		}
		o, err := q.GetOrder(ctx, orderID)
		if err != nil {
			return err
		}
		id, err = a.events.InsertOrderPaid(ctx, tx, events.OrderPaid{
			OrderID:     o.ID,
			CustomerID:  o.CustomerID,
			AmountCents: o.AmountCents,
			Currency:    o.Currency,
			Method:      events.PaymentMethodCard,
			PaidAt:      paidAt,
		})
		if err != nil {
			return err
		}
		if fail {
			return errProviderFailed
		}
		return nil
	})
	return id, err
}

// refund marks a paid order refunded and writes ORDER_REFUNDED, in one
// transaction.
func (a *app) refund(ctx context.Context, orderID string) (outbox.EventID, error) {
	var id outbox.EventID
	err := a.store.inTx(ctx, func(tx *sql.Tx) error {
		q := a.store.queries(tx)
		at := time.Now().UTC().Truncate(time.Microsecond)
		n, err := q.MarkOrderRefunded(ctx, sqlitedb.MarkOrderRefundedParams{RefundedAt: sql.NullTime{Time: at, Valid: true}, ID: orderID})
		if err != nil {
			return err
		}
		if n != 1 {
			return fmt.Errorf("refund %s: the order is not paid", orderID)
		}
		o, err := q.GetOrder(ctx, orderID)
		if err != nil {
			return err
		}
		reason := "customer request"
		id, err = a.events.InsertOrderRefunded(ctx, tx, events.OrderRefunded{
			OrderID:     o.ID,
			CustomerID:  o.CustomerID,
			AmountCents: o.AmountCents,
			Reason:      &reason,
			RefundedAt:  at,
		})
		return err
	})
	return id, err
}

// pointsFor is the loyalty rule: one point per whole currency unit.
func pointsFor(amountCents int64) int64 { return amountCents / 100 }

// pointsConsumer implements events.PointsHandler. Each method runs inside
// the transaction in which the inbox recorded the event id: the ledger
// entry, the balance update and the POINTS_CREDITED event commit together
// with it, or not at all. A redelivered event never reaches these methods.
type pointsConsumer struct{ a *app }

func (c pointsConsumer) HandleOrderPaid(ctx context.Context, tx *sql.Tx, e events.OrderPaid, m outbox.Meta) error {
	q := c.a.store.queries(tx)
	pts := pointsFor(e.AmountCents)
	// The ledger's unique (order_id, kind) is the state check on top of the
	// inbox: one credit per order, whatever happens upstream.
	if err := q.AddLedgerEntry(ctx, sqlitedb.AddLedgerEntryParams{EventID: m.EventID, CustomerID: e.CustomerID, OrderID: e.OrderID, Kind: "credit", Points: pts}); err != nil {
		return err
	}
	if err := addPoints(ctx, q, e.CustomerID, pts); err != nil {
		return err
	}
	// A follow-up event, written with the generated writer on the
	// consumer's own transaction: emitted exactly when the credit commits.
	if _, err := c.a.events.InsertPointsCredited(ctx, tx, events.PointsCredited{CustomerID: e.CustomerID, OrderID: e.OrderID, Points: pts}); err != nil {
		return err
	}
	markHandled(ctx)
	return nil
}

func (c pointsConsumer) HandleOrderRefunded(ctx context.Context, tx *sql.Tx, e events.OrderRefunded, m outbox.Meta) error {
	q := c.a.store.queries(tx)
	pts := pointsFor(e.AmountCents)
	if err := q.AddLedgerEntry(ctx, sqlitedb.AddLedgerEntryParams{EventID: m.EventID, CustomerID: e.CustomerID, OrderID: e.OrderID, Kind: "debit", Points: pts}); err != nil {
		return err
	}
	if err := addPoints(ctx, q, e.CustomerID, -pts); err != nil {
		return err
	}
	markHandled(ctx)
	return nil
}

func addPoints(ctx context.Context, q Queries, customerID string, delta int64) error {
	n, err := q.AddPoints(ctx, sqlitedb.AddPointsParams{Delta: delta, ID: customerID})
	if err != nil {
		return err
	}
	if n != 1 {
		// No retry can fix this: straight to the poison topic.
		return inbox.Permanent(fmt.Errorf("unknown customer %q", customerID))
	}
	return nil
}

// smsConsumer implements events.SMSHandler: it records the text it would
// send (a real service would call its SMS gateway with the event id as the
// idempotency key, or write a row that a sender process picks up).
type smsConsumer struct{ a *app }

func (c smsConsumer) HandleOrderPaid(ctx context.Context, tx *sql.Tx, e events.OrderPaid, m outbox.Meta) error {
	body := fmt.Sprintf("Order %s paid: %d.%02d %s. Thank you!", e.OrderID, e.AmountCents/100, e.AmountCents%100, e.Currency)
	return c.text(ctx, tx, m, e.CustomerID, "receipt", body)
}

func (c smsConsumer) HandlePointsCredited(ctx context.Context, tx *sql.Tx, e events.PointsCredited, m outbox.Meta) error {
	body := fmt.Sprintf("You earned %d points with order %s.", e.Points, e.OrderID)
	return c.text(ctx, tx, m, e.CustomerID, "points", body)
}

func (c smsConsumer) text(ctx context.Context, tx *sql.Tx, m outbox.Meta, customerID, kind, body string) error {
	q := c.a.store.queries(tx)
	phone, err := q.GetCustomerPhone(ctx, customerID)
	if errors.Is(err, sql.ErrNoRows) {
		return inbox.Permanent(fmt.Errorf("unknown customer %q", customerID))
	}
	if err != nil {
		return err
	}
	if err := q.RecordSMS(ctx, sqlitedb.RecordSMSParams{EventID: m.EventID, CustomerID: customerID, Phone: phone, Kind: kind, Body: body}); err != nil {
		return err
	}
	markHandled(ctx)
	return nil
}
