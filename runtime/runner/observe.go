package runner

import (
	"context"
	"sync"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/outboxgen/outboxgen/runtime/dialect"
	"github.com/outboxgen/outboxgen/runtime/driver"
	"github.com/outboxgen/outboxgen/runtime/outbox"
)

// health remembers how the database answered last, across every part:
// what /readyz reports between its own probes.
type health struct {
	mu       sync.Mutex
	lastOK   time.Time // last call that succeeded
	lastFail time.Time // last call that failed (not by cancellation)
	lastErr  error
}

func (h *health) record(ctx context.Context, err error) {
	now := time.Now()
	h.mu.Lock()
	defer h.mu.Unlock()
	switch {
	case err == nil:
		h.lastOK = now
	case ctx.Err() != nil:
		// Cancelled by shutdown or a part's own deadline: says nothing
		// about the database.
	default:
		h.lastFail, h.lastErr = now, err
	}
}

// state returns the last success, the last failure and its error.
func (h *health) state() (ok, fail time.Time, err error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.lastOK, h.lastFail, h.lastErr
}

// counters are the runner's own instruments, fed by the observed driver.
type counters struct {
	claimed  metric.Int64Counter
	sent     metric.Int64Counter
	retried  metric.Int64Counter
	failed   metric.Int64Counter
	released metric.Int64Counter
	dbErrors metric.Int64Counter
	deleted  metric.Int64Counter
}

func newCounters(m metric.Meter) (*counters, error) {
	var c counters
	var err error
	mk := func(dst *metric.Int64Counter, name, desc string) {
		if err == nil {
			*dst, err = m.Int64Counter(name, metric.WithUnit("{row}"), metric.WithDescription(desc))
		}
	}
	mk(&c.claimed, "outboxgen.relay.claimed", "Outbox rows claimed for publishing (relay and sweeper).")
	mk(&c.sent, "outboxgen.relay.sent", "Outbox rows published and marked sent.")
	mk(&c.retried, "outboxgen.relay.retried", "Failed publishes recorded for a later retry.")
	mk(&c.failed, "outboxgen.relay.failed", "Outbox rows marked FAILED (attempts exhausted or permanent error).")
	mk(&c.released, "outboxgen.relay.released", "Claimed rows given back unpublished (shutdown, publish timeout, broker outage).")
	if err == nil {
		c.dbErrors, err = m.Int64Counter("outboxgen.database.errors", metric.WithUnit("{error}"),
			metric.WithDescription("Database calls of the runtime that failed (not counting cancellation at shutdown)."))
	}
	if err == nil {
		c.deleted, err = m.Int64Counter("outboxgen.janitor.deleted", metric.WithUnit("{row}"),
			metric.WithDescription("Rows the janitor deleted: sent outbox rows (target outbox; archived when moved to the archive table) and inbox records (target inbox)."))
	}
	return &c, err
}

// observed is a driver.Driver that records every call's outcome in health
// and counts rows in the runner's metrics; one per part, so that the
// counts carry the part's name.
type observed struct {
	driver.Driver
	h    *health
	c    *counters
	part metric.MeasurementOption
}

// observe wraps d for part, keeping d's Notifier (PostgreSQL
// LISTEN/NOTIFY), which the relay finds by a type assertion.
func observe(d driver.Driver, h *health, c *counters, part string) driver.Driver {
	o := observed{Driver: d, h: h, c: c, part: metric.WithAttributeSet(attribute.NewSet(attribute.String("part", part)))}
	if n, ok := d.(driver.Notifier); ok {
		return observedNotifier{observed: o, n: n}
	}
	return o
}

type observedNotifier struct {
	observed
	n driver.Notifier
}

func (o observedNotifier) WaitForNotification(ctx context.Context) error {
	return o.n.WaitForNotification(ctx)
}

func (o observed) done(ctx context.Context, op string, err error) {
	o.h.record(ctx, err)
	if err != nil && ctx.Err() == nil {
		o.c.dbErrors.Add(context.Background(), 1, o.part, metric.WithAttributes(attribute.String("operation", op)))
	}
}

func (o observed) add(c metric.Int64Counter, n int64) {
	if n > 0 {
		c.Add(context.Background(), n, o.part)
	}
}

func (o observed) Dialect() dialect.Dialect { return o.Driver.Dialect() }
func (o observed) Tables() driver.Tables    { return o.Driver.Tables() }
func (o observed) Schema() outbox.Schema    { return o.Driver.Schema() }
func (o observed) Check(ctx context.Context, t driver.Table) error {
	err := o.Driver.Check(ctx, t)
	o.done(ctx, "check", err)
	return err
}

func (o observed) Claim(ctx context.Context, p driver.ClaimParams) ([]driver.Row, error) {
	if p.Record != nil && p.Result == nil {
		p.Result = &driver.ClaimResult{} // to count what it recorded
	}
	rows, err := o.Driver.Claim(ctx, p)
	o.done(ctx, "claim", err)
	o.add(o.c.claimed, int64(len(rows)))
	// A MySQL claim records apart, in its own commit, before it leases: that
	// recording stands even when the lease after it fails.
	if p.Record != nil && (err == nil || p.Result.RecordedApart) {
		o.recorded(p.Result.Recorded)
	}
	return rows, err
}

func (o observed) Record(ctx context.Context, owner string, r driver.Results) (driver.Recorded, error) {
	rec, err := o.Driver.Record(ctx, owner, r)
	o.done(ctx, "record", err)
	o.recorded(rec)
	return rec, err
}

// recorded counts what a recording changed.
func (o observed) recorded(rec driver.Recorded) {
	o.add(o.c.sent, rec.Sent)
	o.add(o.c.retried, rec.Retried-int64(len(rec.Failed)))
	o.add(o.c.failed, int64(len(rec.Failed)))
	o.add(o.c.released, rec.Released)
}

func (o observed) MarkSent(ctx context.Context, owner string, ids []int64) (int64, error) {
	n, err := o.Driver.MarkSent(ctx, owner, ids)
	o.done(ctx, "mark_sent", err)
	o.add(o.c.sent, n)
	return n, err
}

func (o observed) MarkRetry(ctx context.Context, owner string, fs []driver.Failure, maxAttempts int) (int64, []int64, error) {
	n, failed, err := o.Driver.MarkRetry(ctx, owner, fs, maxAttempts)
	o.done(ctx, "mark_retry", err)
	o.recorded(driver.Recorded{Retried: n, Failed: failed})
	return n, failed, err
}

func (o observed) Release(ctx context.Context, owner string, ids []int64) (int64, error) {
	n, err := o.Driver.Release(ctx, owner, ids)
	o.done(ctx, "release", err)
	o.add(o.c.released, n)
	return n, err
}

func (o observed) ExtendLease(ctx context.Context, owner string, ids []int64, lease time.Duration) (int64, error) {
	n, err := o.Driver.ExtendLease(ctx, owner, ids, lease)
	o.done(ctx, "extend_lease", err)
	return n, err
}

func (o observed) Requeue(ctx context.Context, ids []int64) (int64, error) {
	n, err := o.Driver.Requeue(ctx, ids)
	o.done(ctx, "requeue", err)
	return n, err
}

func (o observed) Stats(ctx context.Context, staleAfter time.Duration) (driver.Stats, error) {
	st, err := o.Driver.Stats(ctx, staleAfter)
	o.done(ctx, "stats", err)
	return st, err
}

func (o observed) DeleteSent(ctx context.Context, olderThan time.Duration, limit int) (int64, error) {
	n, err := o.Driver.DeleteSent(ctx, olderThan, limit)
	o.done(ctx, "delete_sent", err)
	o.deletedRows(n, "outbox", false)
	return n, err
}

func (o observed) ArchiveSent(ctx context.Context, archive string, olderThan time.Duration, limit int) (int64, error) {
	n, err := o.Driver.ArchiveSent(ctx, archive, olderThan, limit)
	o.done(ctx, "archive_sent", err)
	o.deletedRows(n, "outbox", true)
	return n, err
}

func (o observed) DeleteInbox(ctx context.Context, olderThan time.Duration, limit int) (int64, error) {
	n, err := o.Driver.DeleteInbox(ctx, olderThan, limit)
	o.done(ctx, "delete_inbox", err)
	o.deletedRows(n, "inbox", false)
	return n, err
}

// deletedRows counts rows the janitor deleted (or archived) from target.
func (o observed) deletedRows(n int64, target string, archived bool) {
	if n > 0 {
		o.c.deleted.Add(context.Background(), n, metric.WithAttributes(attribute.String("target", target), attribute.Bool("archived", archived)))
	}
}
