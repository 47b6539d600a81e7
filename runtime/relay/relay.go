package relay

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	mathrand "math/rand/v2"
	"sort"
	"strconv"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/outboxgen/outboxgen/runtime/dialect"
	"github.com/outboxgen/outboxgen/runtime/driver"
	"github.com/outboxgen/outboxgen/runtime/internal/backoff"
	"github.com/outboxgen/outboxgen/runtime/internal/dberr"
	"github.com/outboxgen/outboxgen/runtime/outbox"
	"github.com/outboxgen/outboxgen/runtime/redact"
)

// Metadata keys the relay sets on every message (the definitions live in
// package outbox, next to outbox.ParseMeta, which consumers use to read
// them). Stored headers are copied first, so these win over a header with
// the same name.
const (
	MetadataType         = outbox.MetadataType         // biz_type, e.g. ORDER_PAID
	MetadataKey          = outbox.MetadataKey          // biz_id, the aggregate key
	MetadataVersion      = outbox.MetadataVersion      // payload version, decimal
	MetadataCreatedAt    = outbox.MetadataCreatedAt    // row created_at, RFC 3339 (nanoseconds), UTC
	MetadataEventID      = outbox.MetadataEventID      // event_id, also the message UUID
	MetadataSequence     = outbox.MetadataSequence     // row id, decimal: grows with commit order within a key
	MetadataPartitionKey = outbox.MetadataPartitionKey // = the key, for publishers that partition by metadata (Kafka)
)

// ErrPermanent marks publish errors that no retry can mend. A row whose
// publish fails with an error matching it (errors.Is) is marked FAILED at
// once instead of after MaxAttempts. The relay itself uses it for rows it
// cannot turn into a message (malformed headers, an unknown payload
// encoding); publishers can wrap their own with Permanent (e.g. a topic the
// broker will never accept).
var ErrPermanent = errors.New("permanent publish failure")

// Permanent wraps err so that it matches ErrPermanent.
func Permanent(err error) error {
	if err == nil {
		return nil
	}
	return permanentError{err}
}

type permanentError struct{ err error }

func (e permanentError) Error() string        { return e.err.Error() }
func (e permanentError) Unwrap() error        { return e.err }
func (e permanentError) Is(target error) bool { return target == ErrPermanent }

// Relay publishes outbox rows. Create it with New and start it with Run.
type Relay struct {
	opts          Config
	drv           driver.Driver
	log           *slog.Logger
	unordered     map[string]bool
	unorderedList []string
	wake          chan struct{}

	// running is held by Run and RunOnce: one loop per Relay.
	running sync.Mutex
	// brk is the circuit breaker; only the goroutine holding running
	// touches it.
	brk breaker
	// lastMoved is what the last claim held or moved (see full); only the
	// goroutine holding running touches it.
	lastMoved int
}

// ErrRunning is returned by Run and RunOnce while another Run or RunOnce
// runs on the same Relay.
var ErrRunning = errors.New("relay: already running: call Run or RunOnce once per Relay at a time (use another Relay, with its own InstanceID, for more concurrency)")

// New returns a relay over the outbox table of drv: a sqldriver (pgx
// stdlib, go-sql-driver/mysql, modernc.org/sqlite) or a pgxdriver (native
// pgx pool). The driver owns the table names. opts is completed with
// defaults and validated.
func New(drv driver.Driver, opts Config) (*Relay, error) {
	if drv == nil {
		return nil, errors.New("relay: driver is nil: pass sqldriver.New(db, events.Schema) or pgxdriver.New(pool, events.Schema)")
	}
	if opts.EventTypes == nil {
		opts.EventTypes = drv.Schema().EventTypes
	}
	opts.setDefaults()
	if err := opts.Validate(); err != nil {
		return nil, err
	}
	unordered := opts.unorderedTypes()
	r := &Relay{
		opts:          opts,
		drv:           drv,
		log:           opts.Logger.With(slog.String("relay", opts.InstanceID), slog.String("table", drv.Tables().Outbox)),
		unordered:     map[string]bool{},
		unorderedList: unordered,
		wake:          make(chan struct{}, 1),
	}
	for _, u := range unordered {
		r.unordered[u] = true
	}
	return r, nil
}

// InstanceID returns the relay's lease owner name.
func (r *Relay) InstanceID() string { return r.opts.InstanceID }

// Notify wakes a waiting Run loop to poll now instead of at the end of its
// PollInterval. Call it after committing a transaction that wrote events,
// to publish them within milliseconds. It never blocks and coalesces calls.
func (r *Relay) Notify() {
	select {
	case r.wake <- struct{}{}:
	default:
	}
}

// Run polls until ctx is cancelled: claim a batch, publish it, record the
// results, then wait PollInterval (or for Notify) — or poll again at once
// when the batch was full. On cancellation it stops claiming, finishes
// publishing the batch in hand for at most ShutdownTimeout, records the
// results (rows it did not get to are released) and returns nil.
//
// Database errors do not stop Run once it has started: each failed poll is
// logged (once, with the pause that follows) and Run backs off, PollInterval
// (at least 100 ms) doubling to DatabaseBackoffMax, jittered, until a poll
// succeeds; Notify and the circuit breaker do not shorten these pauses.
// Errors that waiting cannot mend (a missing table or column, a missing
// privilege, a read-only database) say what to do.
//
// Start-up check: Run first probes the outbox table with a statement that
// changes nothing (an UPDATE of no row, which needs the table, its lease
// columns and the UPDATE privilege). Until that probe and a first poll
// have succeeded, a missing table or column or a missing privilege ends
// Run with that error (also logged), since no amount of waiting mends a
// deployment mistake; a transient error (the database is not up yet) or a
// read-only database (a failover in progress) is retried with the backoff
// above instead.
//
// When the driver is a driver.Notifier (pgxdriver: PostgreSQL
// LISTEN/NOTIFY), Run also wakes when it reports new rows, so writers in
// other processes that notify (pgxdriver.Notify, sqldriver.Notify) get
// their events published without waiting for PollInterval.
//
// Run one Run loop per Relay (a second concurrent Run or RunOnce returns
// ErrRunning); run several relays (processes or Relay values with distinct
// InstanceIDs) to share the work.
//
// Run returns within ShutdownTimeout of ctx's cancellation (plus the time
// to record the results) even when a Publish call hangs: such a publish is
// abandoned, its row stays leased until the lease lapses and is then
// published again (at-least-once).
func (r *Relay) Run(ctx context.Context) error {
	if !r.running.TryLock() {
		return ErrRunning
	}
	defer r.running.Unlock()
	r.log.InfoContext(ctx, "relay started",
		slog.Int("batch_size", r.opts.BatchSize), slog.Duration("poll_interval", r.opts.PollInterval),
		slog.Duration("lease", r.opts.LeaseDuration), slog.Int("concurrency", r.opts.Concurrency))
	if n, ok := r.drv.(driver.Notifier); ok {
		listenCtx, stopListen := context.WithCancel(ctx)
		done := make(chan struct{})
		go func() { defer close(done); r.listen(listenCtx, n) }()
		defer func() { stopListen(); <-done }()
	}
	dbBackoff := backoff.New(r.opts.PollInterval, r.opts.DatabaseBackoffMax)
	started, probed := false, false
	// Go 1.23+ timer semantics: Reset and Stop never leave a stale tick.
	timer := time.NewTimer(r.opts.PollInterval)
	timer.Stop()
	defer timer.Stop()
	for {
		if ctx.Err() != nil {
			r.log.Info("relay stopped")
			return nil
		}
		var n int
		var err error
		if !probed {
			err = r.probeTable(ctx)
			probed = err == nil
		}
		if err == nil {
			n, err = r.poll(ctx)
		}
		var wait time.Duration
		wakeable := false
		switch {
		case err != nil && ctx.Err() != nil:
			continue // shutting down: not the database's fault
		case err != nil:
			err = r.explain(err)
			if !started && dberr.FatalAtStart(err) {
				r.log.ErrorContext(ctx, "relay not started: the outbox table is not usable", slog.Any("error", err))
				return err
			}
			wait = dbBackoff.Next()
			if r.brk.open {
				wait = max(wait, time.Until(r.brk.next))
			}
			r.log.ErrorContext(ctx, "relay poll failed", slog.Any("error", err),
				slog.Int("consecutive_failures", dbBackoff.Failures()), slog.Duration("retry_in", wait))
		default:
			started = true
			if f := dbBackoff.Failures(); f > 0 {
				dbBackoff.Reset()
				r.log.InfoContext(ctx, "relay poll succeeded again", slog.Int("failed_polls", f))
			}
			switch {
			case r.brk.open:
				// Broker outage: wait for the next probe (at least
				// PollInterval, e.g. when a probe found nothing to
				// claim); notifications do not shorten the pause.
				wait = max(time.Until(r.brk.next), r.opts.PollInterval)
			case r.full(n):
				continue // a full window: more is probably waiting
			default:
				wait, wakeable = r.opts.PollInterval, true
			}
		}
		timer.Reset(wait)
		if wakeable {
			select {
			case <-ctx.Done():
			case <-r.wake:
			case <-timer.C:
			}
		} else {
			select {
			case <-ctx.Done():
			case <-timer.C:
			}
		}
		timer.Stop()
	}
}

// errorText is a publisher's error as last_error and the log hold it:
// credentials masked (runtime/redact) and cut to the column's size, since a
// broker's text may quote a URL or echo the payload. It is cut well past
// that size before it is scanned, so a megabyte echoed by the broker costs
// nothing, and a secret straddling the first cut lies beyond the second.
func errorText(err error) string {
	s := err.Error()
	if n := 4 * dialect.ErrorTextLimit; len(s) > n {
		s = s[:n]
	}
	return dialect.TruncateError(redact.String(s))
}

// probeID is the row id probeTable updates: no row has it (ids
// start at 1), and the update is fenced by this relay's own InstanceID
// besides.
const probeID = 0

// probeTable checks that the outbox table is usable without changing it:
// the driver's Check, then a lease extension of a row that does not exist fails when the table or its
// lease columns are missing, the user lacks SELECT or UPDATE on it, or the
// database is read-only, and otherwise changes nothing.
func (r *Relay) probeTable(ctx context.Context) error {
	// The driver's check: the server speaks the driver's dialect and the
	// table events.yaml names has every column (needs SELECT only).
	if err := r.drv.Check(ctx, driver.Outbox); err != nil {
		return err
	}
	_, err := r.drv.ExtendLease(ctx, r.opts.InstanceID, []int64{probeID}, r.opts.LeaseDuration)
	return err
}

// explain adds the operator's advice to a database error that waiting
// cannot mend (see package dberr).
func (r *Relay) explain(err error) error {
	t := r.drv.Tables().Outbox
	who := "relay"
	if r.opts.OverdueAfter > 0 {
		who = "sweeper"
	}
	return dberr.Explain(err, dberr.Need{Component: who, Tables: t, Privileges: "SELECT and UPDATE on " + t})
}

// listen turns the driver's notifications into Notify calls until ctx is
// done. After an error it waits before listening again, PollInterval (at
// least a second) doubling per consecutive failure up to
// DatabaseBackoffMax, jittered; polling goes on meanwhile.
func (r *Relay) listen(ctx context.Context, n driver.Notifier) {
	b := backoff.New(max(r.opts.PollInterval, listenFloor), r.opts.DatabaseBackoffMax)
	timer := time.NewTimer(0)
	timer.Stop()
	defer timer.Stop()
	for {
		err := n.WaitForNotification(ctx)
		if ctx.Err() != nil {
			return
		}
		if err != nil {
			pause := b.Next()
			r.log.WarnContext(ctx, "waiting for notifications failed: polling only until it recovers", slog.Any("error", err),
				slog.Int("consecutive_failures", b.Failures()), slog.Duration("retry_in", pause))
			timer.Reset(pause)
			select {
			case <-ctx.Done():
				return
			case <-timer.C:
			}
			continue
		}
		b.Reset()
		r.Notify()
	}
}

// listenFloor is the shortest pause after a failed wait for notifications:
// polling goes on meanwhile, so there is no hurry.
const listenFloor = time.Second

// RunOnce drains the claimable rows once: it polls (claim, publish,
// record) until a poll comes back with fewer than BatchSize rows, and
// returns how many rows it published. Rows that fail are recorded with
// their backoff and are not retried by this call unless they come due
// while it runs; when the circuit breaker opens (a broker outage, see
// Config.BreakerBackoff) it returns at its next poll. It stops early,
// returning ctx's error, when ctx is done (the batch in hand is finished
// and recorded as in Run); database errors are returned at once, those
// that waiting cannot mend with advice (see Run). It first probes the
// table as Run does, so that a missing UPDATE privilege shows even when
// nothing is pending. It is meant for one-shot jobs (the sweeper's
// Kubernetes CronJob) and tests; long-running processes use Run. While Run
// or another RunOnce runs on the same Relay it returns ErrRunning.
func (r *Relay) RunOnce(ctx context.Context) (published int, err error) {
	if !r.running.TryLock() {
		return 0, ErrRunning
	}
	defer r.running.Unlock()
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	if err := r.probeTable(ctx); err != nil {
		return 0, r.explain(err)
	}
	for {
		if err := ctx.Err(); err != nil {
			return published, err
		}
		claimed, sent, err := r.cycle(ctx)
		published += sent
		if err != nil {
			return published, r.explain(err)
		}
		if !r.full(claimed) {
			return published, nil
		}
	}
}

// full reports whether the last claim used its whole window (claimed
// rows plus rows it held or moved), so the next claim may find more at
// once: poll again without waiting.
func (r *Relay) full(claimed int) bool {
	return claimed+r.lastMoved >= r.opts.BatchSize
}

// outcome is what happened to the rows of one batch. Rows whose publish
// was abandoned at the shutdown timeout are in none of the lists: they
// stay leased until the lease lapses.
type outcome struct {
	mu       sync.Mutex
	sent     []int64
	failures []driver.Failure
	release  []int64
}

// poll runs one claim-publish-record cycle and returns how many rows it
// claimed.
func (r *Relay) poll(ctx context.Context) (int, error) {
	claimed, _, err := r.cycle(ctx)
	return claimed, err
}

// Why a batch stopped publishing early (the cause of its context).
var (
	errLeaseDeadline  = errors.New("relay: batch stopped before its lease lapses (the lease could not be extended)")
	errLeaseLost      = errors.New("relay: batch stopped: another instance took over part of its lease")
	errPublishTimeout = errors.New("relay: batch stopped after Config.PublishTimeout")
	errShutdown       = errors.New("relay: batch stopped at Config.ShutdownTimeout")
	errAbandoned      = errors.New("relay: publish abandoned at Config.ShutdownTimeout")
)

// cycle runs one claim-publish-record cycle and returns how many rows it
// claimed and how many of them it published. Claiming uses ctx; once rows
// are claimed they are published with a context that outlives ctx by at
// most ShutdownTimeout and the results are always recorded. While the
// circuit breaker is open, a cycle before the next probe is due does
// nothing, and a probe cycle publishes one row of the claimed batch and
// releases the rest.
func (r *Relay) cycle(ctx context.Context) (claimed, sent int, err error) {
	probe := r.brk.open
	if probe && time.Now().Before(r.brk.next) {
		return 0, 0, nil
	}
	claimedAt := time.Now() // the lease starts no earlier than this
	var res driver.ClaimResult
	r.lastMoved = 0
	rows, err := r.drv.Claim(ctx, driver.ClaimParams{
		Result:       &res,
		Owner:        r.opts.InstanceID,
		Lease:        r.opts.LeaseDuration,
		Limit:        r.opts.BatchSize,
		Unordered:    r.unorderedList,
		OverdueAfter: r.opts.OverdueAfter,
		Hold:         r.opts.HoldRecheck,
	})
	if err != nil {
		return 0, 0, err
	}
	r.lastMoved = res.Moved
	if len(rows) == 0 {
		return 0, 0, nil
	}
	out := &outcome{}
	units := r.groups(rows)
	if probe {
		// One row of a unit picked at random (a probe always trying the
		// oldest row would never get past a poison row); the rest go back.
		pick := mathrand.IntN(len(units))
		for i, u := range units {
			if i == pick {
				out.addRelease(u[1:])
			} else {
				out.addRelease(u)
			}
		}
		units = [][]driver.Row{units[pick][:1]}
	}
	r.publishBatch(ctx, rows, units, claimedAt, out)
	r.judge(out, probe)

	// Recording must happen even during shutdown; it is bounded by the
	// lease (past it the fence would reject the writes anyway).
	recCtx, recCancel := context.WithTimeout(context.WithoutCancel(ctx), r.opts.LeaseDuration)
	defer recCancel()
	return len(rows), len(out.sent), r.record(recCtx, len(rows), out)
}

// publishBatch publishes units (the claimed rows, grouped) into out. While
// it runs, a heartbeat extends the lease of every claimed row (all of them
// stay leased until recorded) every LeaseDuration/3. The batch stops
// starting new publishes, and releases the rows it did not get to, when:
//
//   - its lease is about to lapse: the local lease deadline (a margin
//     before the lease last secured by the claim or an extension) passes,
//     because the database could not be reached to extend it;
//   - an extension finds that another instance took over some of the rows;
//   - PublishTimeout has passed since the batch started;
//   - ShutdownTimeout has passed since ctx was done.
//
// Publishes under way are interrupted only through the message context
// (if the publisher honours it) and otherwise waited for, except at the
// shutdown timeout: then publishes still running are abandoned, so that
// Run returns in time. Their rows are not recorded (nothing writes to out
// after publishBatch returns) and stay leased until the lease lapses.
func (r *Relay) publishBatch(ctx context.Context, rows []driver.Row, units [][]driver.Row, claimedAt time.Time, out *outcome) {
	pubCtx, stop := context.WithCancelCause(context.WithoutCancel(ctx))
	defer stop(nil)
	batchCtx, endBatch := context.WithCancel(context.Background())
	defer endBatch()

	timeout := time.AfterFunc(r.opts.PublishTimeout, func() { stop(errPublishTimeout) })
	defer timeout.Stop()

	// Shutdown: publishes are interrupted (through the message context) a
	// grace period before ShutdownTimeout, and those still running at
	// ShutdownTimeout are abandoned.
	abandon := make(chan struct{})
	stopShutdown := context.AfterFunc(ctx, func() {
		grace := shutdownGrace(r.opts.ShutdownTimeout)
		t1 := time.AfterFunc(r.opts.ShutdownTimeout-grace, func() { stop(errShutdown) })
		t2 := time.AfterFunc(r.opts.ShutdownTimeout, func() { close(abandon) })
		context.AfterFunc(batchCtx, func() { t1.Stop(); t2.Stop() })
	})
	defer stopShutdown()

	ids := make([]int64, len(rows))
	for i, rw := range rows {
		ids[i] = rw.ID
	}
	hbCtx, stopHB := context.WithCancel(context.WithoutCancel(ctx))
	hbDone := make(chan struct{})
	go func() {
		defer close(hbDone)
		r.heartbeat(hbCtx, ids, claimedAt, stop)
	}()
	r.publish(pubCtx, abandon, units, out)
	timeout.Stop()
	stopHB()
	<-hbDone
	if cause := context.Cause(pubCtx); cause != nil && !errors.Is(cause, context.Canceled) {
		r.log.WarnContext(ctx, "batch stopped early: the rows not published are released", slog.Any("reason", cause),
			slog.Int("claimed", len(rows)), slog.Int("published", len(out.sent)))
	}
}

// shutdownGrace is how long before ShutdownTimeout a batch interrupts its
// publishes, so that publishers honouring the message context return (and
// their rows are released) before hung ones are abandoned.
func shutdownGrace(timeout time.Duration) time.Duration {
	return min(timeout/5, time.Second)
}

// heartbeat extends the lease of ids every LeaseDuration/3 until ctx is
// done, and stops the batch (stop) when its local lease deadline passes
// without a successful extension, or when an extension finds rows taken
// over. The local deadline is measured from before the statement that set
// the lease, so it never runs past the lease in the database (up to clock
// drift, which the margin covers).
func (r *Relay) heartbeat(ctx context.Context, ids []int64, claimedAt time.Time, stop context.CancelCauseFunc) {
	lease := r.opts.LeaseDuration
	keep := lease - leaseMargin(lease)
	expire := time.AfterFunc(time.Until(claimedAt.Add(keep)), func() { stop(errLeaseDeadline) })
	defer expire.Stop()
	every := max(lease/3, time.Millisecond)
	tick := time.NewTicker(every)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		at := time.Now()
		ectx, cancel := context.WithTimeout(ctx, every)
		n, err := r.drv.ExtendLease(ectx, r.opts.InstanceID, ids, lease)
		cancel()
		switch {
		case ctx.Err() != nil:
			return
		case err != nil:
			r.log.WarnContext(ctx, "extending the lease of a batch failed: it stops before the lease lapses unless a retry succeeds",
				slog.Int("rows", len(ids)), slog.Any("error", err))
		case n < int64(len(ids)):
			r.log.WarnContext(ctx, "lease lost while publishing: stopping the batch",
				slog.Int("rows", len(ids)), slog.Int64("still_leased", n))
			stop(errLeaseLost)
			return
		default:
			expire.Reset(time.Until(at.Add(keep)))
		}
	}
}

// leaseMargin is how long before its lease lapses a batch stops publishing:
// a tenth of the lease, at most 5s, covering clock drift between the
// relay's timer and the database's and the time to record the results.
func leaseMargin(lease time.Duration) time.Duration {
	return min(lease/10, 5*time.Second)
}

// groups splits a batch into publishing units: the rows of one ordered key
// in id order, or a single row of an unordered type. Units are returned in
// the order of their first id.
func (r *Relay) groups(rows []driver.Row) [][]driver.Row {
	sort.Slice(rows, func(i, j int) bool { return rows[i].ID < rows[j].ID })
	var out [][]driver.Row
	byKey := map[string]int{}
	for _, rw := range rows {
		if r.unordered[rw.Type] {
			out = append(out, []driver.Row{rw})
			continue
		}
		if i, ok := byKey[rw.Key]; ok {
			out[i] = append(out[i], rw)
			continue
		}
		byKey[rw.Key] = len(out)
		out = append(out, []driver.Row{rw})
	}
	return out
}

// publish publishes units with up to Concurrency units at once; a unit's
// rows go one after another and the unit stops at its first failure. It
// returns when every unit is done, or at once when abandon is closed
// (units not handed out yet are released); either way no goroutine writes
// to out after it returned.
func (r *Relay) publish(ctx context.Context, abandon <-chan struct{}, units [][]driver.Row, out *outcome) {
	work := make(chan []driver.Row)
	var wg sync.WaitGroup
	for range min(r.opts.Concurrency, len(units)) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for unit := range work {
				r.publishUnit(ctx, abandon, unit, out)
			}
		}()
	}
	fed := 0
feed:
	for fed < len(units) {
		select {
		case work <- units[fed]:
			fed++
		case <-abandon:
			break feed
		}
	}
	close(work)
	for _, u := range units[fed:] {
		out.addRelease(u)
	}
	wg.Wait() // workers return promptly once abandon is closed
}

func (r *Relay) publishUnit(ctx context.Context, abandon <-chan struct{}, unit []driver.Row, out *outcome) {
	for i, rw := range unit {
		if ctx.Err() != nil { // the batch stopped: give the rest back
			out.addRelease(unit[i:])
			return
		}
		err := r.publishRow(ctx, abandon, rw)
		if errors.Is(err, errAbandoned) {
			r.log.WarnContext(ctx, "publish still running at the shutdown timeout: abandoned; the row stays leased until its lease lapses, then it is published again",
				slog.Int64("id", rw.ID), slog.String("event_id", rw.EventID), slog.String("key", rw.Key), slog.String("topic", rw.Topic))
			out.addRelease(unit[i+1:])
			return
		}
		if err == nil {
			out.mu.Lock()
			out.sent = append(out.sent, rw.ID)
			out.mu.Unlock()
			continue
		}
		permanent := errors.Is(err, ErrPermanent)
		text := errorText(err)
		if ctx.Err() != nil && !permanent {
			// Cut off by the batch stopping (shutdown, lease deadline,
			// PublishTimeout), not the broker's verdict: no attempt is
			// charged.
			r.log.DebugContext(ctx, "publish interrupted: released",
				slog.Int64("id", rw.ID), slog.String("event_id", rw.EventID), slog.String("error", text))
			out.addRelease(unit[i:])
			return
		}
		attempt := rw.RetryCount + 1
		delay := r.opts.Backoff(attempt)
		if delay < 0 {
			delay = 0
		}
		r.log.WarnContext(ctx, "publish failed",
			slog.Int64("id", rw.ID), slog.String("event_id", rw.EventID), slog.String("type", rw.Type),
			slog.String("key", rw.Key), slog.String("topic", rw.Topic), slog.Int("attempt", attempt),
			slog.Duration("retry_in", delay), slog.String("error", text))
		out.mu.Lock()
		out.failures = append(out.failures, driver.Failure{Row: rw, Error: text, Delay: delay, Permanent: permanent})
		out.mu.Unlock()
		out.addRelease(unit[i+1:])
		return
	}
}

func (o *outcome) addRelease(rows []driver.Row) {
	if len(rows) == 0 {
		return
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	for _, rw := range rows {
		o.release = append(o.release, rw.ID)
	}
}

// message builds the watermill message of a row.
func (r *Relay) message(ctx context.Context, rw driver.Row) (*message.Message, error) {
	var h map[string]string
	if len(rw.Headers) > 0 && string(rw.Headers) != "null" {
		if err := json.Unmarshal(rw.Headers, &h); err != nil {
			return nil, Permanent(fmt.Errorf("relay: row %d: headers are not a JSON object of strings: %w", rw.ID, err))
		}
	}
	payload, err := outbox.DecodeStoredPayload(h[outbox.HeaderPayloadEncoding], rw.Payload)
	if err != nil {
		return nil, Permanent(fmt.Errorf("relay: row %d: %w", rw.ID, err))
	}
	delete(h, outbox.HeaderPayloadEncoding)
	msg := message.NewMessage(rw.EventID, payload)
	for k, v := range h {
		msg.Metadata.Set(k, v)
	}
	msg.Metadata.Set(MetadataType, rw.Type)
	msg.Metadata.Set(MetadataKey, rw.Key)
	msg.Metadata.Set(MetadataVersion, strconv.Itoa(rw.Version))
	msg.Metadata.Set(MetadataCreatedAt, rw.CreatedAt.UTC().Format(time.RFC3339Nano))
	msg.Metadata.Set(MetadataEventID, rw.EventID)
	msg.Metadata.Set(MetadataSequence, strconv.FormatInt(rw.ID, 10))
	msg.Metadata.Set(MetadataPartitionKey, rw.Key)
	msg.SetContext(ctx)
	return msg, nil
}

// publishRow publishes one row; a panicking publisher counts as a failure.
// The publisher runs in its own goroutine so that a publish that never
// returns can be abandoned (errAbandoned) when abandon is closed.
func (r *Relay) publishRow(ctx context.Context, abandon <-chan struct{}, rw driver.Row) error {
	msg, err := r.message(ctx, rw)
	if err != nil {
		return err
	}
	res := make(chan error, 1)
	go func() {
		defer func() {
			if p := recover(); p != nil {
				res <- fmt.Errorf("relay: publisher panicked: %v", p)
			}
		}()
		res <- r.opts.Publisher.Publish(rw.Topic, msg)
	}()
	select {
	case err := <-res:
		return err
	case <-abandon:
		select {
		case err := <-res: // it did finish
			return err
		default:
			return errAbandoned
		}
	}
}

// record writes a batch's results: sent rows first, then failures, then
// releases. Any order would be safe (a released row is always behind an
// unsent row of its key that is still leased or backing off), this one
// unblocks other instances soonest.
func (r *Relay) record(ctx context.Context, claimed int, out *outcome) error {
	var errs []error
	owner := r.opts.InstanceID
	if len(out.sent) > 0 {
		n, err := r.drv.MarkSent(ctx, owner, out.sent)
		if err != nil {
			errs = append(errs, err)
		} else if n < int64(len(out.sent)) {
			r.log.WarnContext(ctx, "lease lost before marking rows sent: they will be published again (at-least-once)",
				slog.Int("published", len(out.sent)), slog.Int64("marked", n))
		}
	}
	if len(out.failures) > 0 {
		n, failed, err := r.drv.MarkRetry(ctx, owner, out.failures, r.opts.MaxAttempts)
		if err != nil {
			errs = append(errs, err)
		} else {
			if n < int64(len(out.failures)) {
				r.log.WarnContext(ctx, "lease lost before recording failures", slog.Int("failures", len(out.failures)), slog.Int64("recorded", n))
			}
			r.reportFailed(ctx, out.failures, failed)
		}
	}
	if len(out.release) > 0 {
		if _, err := r.drv.Release(ctx, owner, out.release); err != nil {
			errs = append(errs, err)
		}
	}
	r.log.DebugContext(ctx, "batch done", slog.Int("claimed", claimed), slog.Int("sent", len(out.sent)),
		slog.Int("failed", len(out.failures)), slog.Int("released", len(out.release)))
	return errors.Join(errs...)
}

func (r *Relay) reportFailed(ctx context.Context, fs []driver.Failure, failed []int64) {
	if len(failed) == 0 {
		return
	}
	byID := map[int64]driver.Failure{}
	for _, f := range fs {
		byID[f.Row.ID] = f
	}
	for _, id := range failed {
		f := byID[id]
		fe := FailedEvent{ID: id, EventID: f.Row.EventID, Type: f.Row.Type, Key: f.Row.Key, Topic: f.Row.Topic,
			RetryCount: f.Row.RetryCount + 1, LastError: dialect.TruncateError(f.Error), CreatedAt: f.Row.CreatedAt}
		r.log.ErrorContext(ctx, "event marked FAILED after its last attempt: requeue it once the cause is fixed",
			slog.Int64("id", id), slog.String("event_id", fe.EventID), slog.String("type", fe.Type), slog.String("key", fe.Key),
			slog.Int("attempts", fe.RetryCount), slog.String("error", fe.LastError))
		if r.opts.OnFailed != nil {
			r.opts.OnFailed(fe)
		}
	}
}
