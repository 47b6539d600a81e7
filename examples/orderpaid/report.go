package main

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"text/tabwriter"
	"time"

	"github.com/outboxgen/outboxgen/examples/orderpaid/events"
)

// tracker is the demo's in-process bookkeeping: what the payers committed
// and what the consumers did with it.
type tracker struct {
	paid, declined, refunded atomic.Int64

	mu         sync.Mutex
	commitAt   map[string]time.Time // ORDER_PAID event id -> its transaction committed
	creditAt   map[string]time.Time // ORDER_PAID event id -> the points consumer committed
	processed  map[string]int64     // consumer -> deliveries handled
	duplicates map[string]int64     // consumer -> deliveries skipped by the inbox
}

func newTracker() *tracker {
	return &tracker{
		commitAt: map[string]time.Time{}, creditAt: map[string]time.Time{},
		processed: map[string]int64{}, duplicates: map[string]int64{},
	}
}

func (t *tracker) committed(eventID string) {
	now := time.Now()
	t.paid.Add(1)
	t.mu.Lock()
	t.commitAt[eventID] = now
	t.mu.Unlock()
}

func (t *tracker) delivered(consumer, typ, eventID string, handled bool) {
	now := time.Now()
	t.mu.Lock()
	defer t.mu.Unlock()
	if !handled {
		t.duplicates[consumer]++
		return
	}
	t.processed[consumer]++
	if consumer == "points" && typ == events.OrderPaidType {
		if _, ok := t.creditAt[eventID]; !ok {
			t.creditAt[eventID] = now
		}
	}
}

func (t *tracker) counts() (processed, duplicates map[string]int64) {
	t.mu.Lock()
	defer t.mu.Unlock()
	return maps(t.processed), maps(t.duplicates)
}

func maps(m map[string]int64) map[string]int64 {
	out := make(map[string]int64, len(m))
	for k, v := range m {
		out[k] = v
	}
	return out
}

// latencies returns the commit-to-consumer latency (ORDER_PAID committed by
// the payer → the points consumer's transaction committed) of every event
// seen at both ends, sorted.
func (t *tracker) latencies() []time.Duration {
	t.mu.Lock()
	defer t.mu.Unlock()
	var ds []time.Duration
	for id, done := range t.creditAt {
		if c, ok := t.commitAt[id]; ok {
			ds = append(ds, max(done.Sub(c), 0))
		}
	}
	slices.Sort(ds)
	return ds
}

func percentile(ds []time.Duration, p int) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	i := (len(ds)*p + 99) / 100
	return ds[min(max(i-1, 0), len(ds)-1)]
}

// snapshot is the state of the database, read with the sqlc queries and the
// relay's driver.
type snapshot struct {
	paid, refunded, unpaid             int64 // orders by status (paid counts refunded ones too)
	sentPaid, sentRefunded, sentPoints int64 // outbox rows sent, by type
	credits, debits                    int64 // ledger entries
	receipts, texts                    int64 // sms messages
	mismatches                         int64 // balances that differ from the ledger
	pending, failed                    int64 // outbox rows
}

func (a *app) snapshot(ctx context.Context, q Queries) (snapshot, error) {
	var s snapshot
	var paidOnly int64
	for _, c := range []struct {
		dst *int64
		fn  func() (int64, error)
	}{
		{&paidOnly, func() (int64, error) { return q.CountOrders(ctx, "paid") }},
		{&s.refunded, func() (int64, error) { return q.CountOrders(ctx, "refunded") }},
		{&s.unpaid, func() (int64, error) { return q.CountOrders(ctx, "new") }},
		{&s.sentPaid, func() (int64, error) { return q.CountOutboxSent(ctx, events.OrderPaidType) }},
		{&s.sentRefunded, func() (int64, error) { return q.CountOutboxSent(ctx, events.OrderRefundedType) }},
		{&s.sentPoints, func() (int64, error) { return q.CountOutboxSent(ctx, events.PointsCreditedType) }},
		{&s.credits, func() (int64, error) { return q.CountLedger(ctx, "credit") }},
		{&s.debits, func() (int64, error) { return q.CountLedger(ctx, "debit") }},
		{&s.receipts, func() (int64, error) { return q.CountSMS(ctx, "receipt") }},
		{&s.texts, func() (int64, error) { return q.CountSMS(ctx, "points") }},
		{&s.mismatches, func() (int64, error) { return q.CountBalanceMismatches(ctx) }},
	} {
		n, err := c.fn()
		if err != nil {
			return s, err
		}
		*c.dst = n
	}
	s.paid = paidOnly + s.refunded
	st, err := a.drv.Stats(ctx, 10*time.Minute)
	if err != nil {
		return s, err
	}
	s.pending, s.failed = st.Pending, st.Failed
	return s, nil
}

// settled reports whether every committed payment and refund has all its
// effects, and whether something went wrong for good (a FAILED row or a
// poisoned message), which no waiting can fix.
func (a *app) settled(ctx context.Context, q Queries) (done, failed bool, err error) {
	s, err := a.snapshot(ctx, q)
	if err != nil {
		return false, false, err
	}
	if s.failed > 0 || a.poison.n.Load() > 0 {
		return false, true, nil
	}
	done = s.pending == 0 &&
		s.sentPaid == s.paid && s.credits == s.paid && s.sentPoints == s.paid && s.receipts == s.paid && s.texts == s.paid &&
		s.sentRefunded == s.refunded && s.debits == s.refunded
	return done, false, nil
}

// progressLoop prints a progress line every cfg.Progress until stopped.
func (a *app) progressLoop(q Queries) (stop func()) {
	quit, done := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		t := time.NewTicker(a.cfg.Progress)
		defer t.Stop()
		for {
			select {
			case <-quit:
				return
			case <-t.C:
				a.printProgress(q)
			}
		}
	}()
	var once sync.Once
	return func() { once.Do(func() { close(quit); <-done }) }
}

func (a *app) printProgress(q Queries) {
	s, err := a.snapshot(context.Background(), q)
	if err != nil {
		a.printf("  %5.1fs  (progress: %v)\n", a.elapsed(), err)
		return
	}
	_, dups := a.track.counts()
	line := fmt.Sprintf("  %5.1fs  paid %d/%d  refunded %d  published %d (pending %d)  points +%d -%d  sms %d",
		a.elapsed(), s.paid, a.cfg.Orders, s.refunded, s.sentPaid+s.sentRefunded+s.sentPoints, s.pending,
		s.credits, s.debits, s.receipts+s.texts)
	if n := dups["points"] + dups["sms"]; n > 0 {
		line += fmt.Sprintf("  duplicates skipped %d", n)
	}
	if a.cfg.Chaos {
		line += fmt.Sprintf("  | injected: %d failures, %d lost acks, %d duplicates", a.pub.failures.Load(), a.pub.lostAcks.Load(), a.pub.dups.Load())
	}
	if s.failed > 0 {
		line += fmt.Sprintf("  FAILED %d", s.failed)
	}
	a.printf("%s\n", line)
}

// reconcile reads the final state and compares every count with what the
// payers committed.
func (a *app) reconcile(ctx context.Context, q Queries) (Result, error) {
	s, err := a.snapshot(ctx, q)
	if err != nil {
		return Result{}, err
	}
	processed, dups := a.track.counts()
	paid, refunded, declined := a.track.paid.Load(), a.track.refunded.Load(), a.track.declined.Load()
	eq := func(what string, got, want int64) Check {
		return Check{What: what, Got: got, Want: want, OK: got == want}
	}
	info := func(what string, got int64) Check { return Check{What: what, Got: got, Info: true, OK: true} }
	checks := []Check{
		eq("orders paid (committed payments)", s.paid, paid),
		eq("ORDER_PAID published (outbox rows sent)", s.sentPaid, paid),
		eq("points credited (ledger)", s.credits, paid),
		eq("POINTS_CREDITED published (emitted by the points consumer)", s.sentPoints, paid),
		eq("sms receipts", s.receipts, paid),
		eq("sms points texts", s.texts, paid),
		eq("orders refunded", s.refunded, refunded),
		eq("ORDER_REFUNDED published", s.sentRefunded, refunded),
		eq("points debited (ledger)", s.debits, refunded),
		eq("failed payments: orders left unpaid, no event", s.unpaid, declined),
		eq("balances that differ from their ledger", s.mismatches, 0),
		info("deliveries handled (points + sms)", processed["points"]+processed["sms"]),
		info("duplicates skipped by the inbox (points + sms)", dups["points"]+dups["sms"]),
		eq("outbox rows still pending", s.pending, 0),
		eq("FAILED outbox rows", s.failed, 0),
		eq("messages sent to a poison topic", a.poison.n.Load(), 0),
	}
	res := Result{Checks: checks, Reconciled: true}
	for _, c := range checks {
		res.Reconciled = res.Reconciled && c.OK
	}
	return res, nil
}

func (a *app) printResult(res Result) {
	a.printf("\nreconciliation\n")
	tw := tabwriter.NewWriter(a.out, 0, 0, 2, ' ', tabwriter.AlignRight)
	for _, c := range res.Checks {
		switch {
		case c.Info:
			fmt.Fprintf(tw, "  %d\t\t  %s\n", c.Got, c.What)
		case c.OK:
			fmt.Fprintf(tw, "  %d\tok\t  %s\n", c.Got, c.What)
		default:
			fmt.Fprintf(tw, "  %d\tWANT %d\t  %s\n", c.Got, c.Want, c.What)
		}
	}
	tw.Flush()
	ds := a.track.latencies()
	a.printf("\nlatency, payment committed -> points credited (%d events): p50 %s  p99 %s  max %s\n",
		len(ds), round(percentile(ds, 50)), round(percentile(ds, 99)), round(percentile(ds, 100)))
	if a.cfg.Chaos {
		a.printf("chaos injected: %d publish failures, %d lost acks, %d duplicate messages, 1 relay restart; broker accepted %d messages for %d events\n",
			a.pub.failures.Load(), a.pub.lostAcks.Load(), a.pub.dups.Load(), a.pub.accepted.Load(), sumSent(res))
	}
	if res.Reconciled {
		a.printf("\nRECONCILED in %.1fs: every committed payment was published, credited and texted exactly once in effect.\n", a.elapsed())
	} else {
		a.printf("\nNOT RECONCILED (%.1fs): see the lines marked WANT.\n", a.elapsed())
	}
}

func sumSent(res Result) int64 {
	var n int64
	for _, c := range res.Checks {
		switch c.What {
		case "ORDER_PAID published (outbox rows sent)", "ORDER_REFUNDED published", "POINTS_CREDITED published (emitted by the points consumer)":
			n += c.Got
		}
	}
	return n
}

func round(d time.Duration) time.Duration {
	switch {
	case d >= time.Second:
		return d.Round(10 * time.Millisecond)
	case d >= 10*time.Millisecond:
		return d.Round(time.Millisecond)
	}
	return d.Round(10 * time.Microsecond)
}
