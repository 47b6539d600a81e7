package relay

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sort"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/outboxgen/outboxgen/runtime/dialect"
	"github.com/outboxgen/outboxgen/runtime/driver"
	"github.com/outboxgen/outboxgen/runtime/internal/backoff"
	"github.com/outboxgen/outboxgen/runtime/internal/dberr"
	"github.com/outboxgen/outboxgen/runtime/internal/hedge"
	"github.com/outboxgen/outboxgen/runtime/internal/outmsg"
	"github.com/outboxgen/outboxgen/runtime/internal/telemetry"
	"github.com/outboxgen/outboxgen/runtime/outbox"
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
	// passKeys: claims pass the keys of which several rows are in flight
	// (driver.ClaimParams.SkipKeys, pipeline.skipKeys): the dialect reads
	// them and no type is unordered (a row of an unordered type is never
	// behind another, and the window would pass it over too).
	passKeys bool
	wake     chan struct{}
	tel      *telemetry.Relay // spans and metrics (telemetry.go)

	// running is held by Run and RunOnce: one loop per Relay.
	running sync.Mutex
	// brk is the circuit breaker; only the goroutine holding running
	// touches it.
	brk breaker
	// hedges throttles Config.Hedge across Run and RunOnce calls.
	hedges *hedge.Throttle
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
	if drv.Dialect() == dialect.SQLite {
		opts.ParallelClaims = 1 // one writer: a second claim would only wait for the lock
	}
	unordered := opts.unorderedTypes()
	r := &Relay{
		opts:          opts,
		drv:           drv,
		log:           opts.Logger.With(slog.String("relay", opts.InstanceID), slog.String("table", drv.Tables().Outbox)),
		unordered:     map[string]bool{},
		unorderedList: unordered,
		passKeys:      len(unordered) == 0 && drv.Dialect().ClaimSkipsKeys(),
		wake:          make(chan struct{}, 1),
		hedges:        hedge.NewThrottle(),
	}
	for _, u := range unordered {
		r.unordered[u] = true
	}
	tel, err := newTelemetry(opts)
	if err != nil {
		return nil, fmt.Errorf("relay: telemetry: %w", err)
	}
	r.tel = tel
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
		slog.Duration("lease", r.opts.LeaseDuration), slog.Int("concurrency", r.opts.Concurrency),
		slog.Int("max_in_flight", r.opts.MaxInFlight), slog.Int("parallel_claims", r.opts.ParallelClaims))
	if n, ok := r.drv.(driver.Notifier); ok {
		listenCtx, stopListen := context.WithCancel(ctx)
		done := make(chan struct{})
		go func() { defer close(done); r.listen(listenCtx, n) }()
		defer func() { stopListen(); <-done }()
	}
	if err := r.newPipeline(ctx, modeRun).run(); err != nil {
		return err
	}
	r.log.Info("relay stopped")
	return nil
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
	return dberr.Explain(err, dberr.Need{Component: who, Tables: t, Privileges: "SELECT and UPDATE on " + t + ", and SELECT on " + t + dialect.VersionSuffix})
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

// RunOnce drains the claimable rows once: it claims, publishes and
// records (pipelined, as Run) until a claim made with nothing else in
// flight comes back with less than a full window, then waits for the rows
// in flight and records them, and returns how many rows it published. Rows that fail are recorded with
// their backoff and are not retried by this call unless they come due
// while it runs; when the circuit breaker opens (a broker outage, see
// Config.BreakerBackoff) it returns at its next poll. It stops early,
// returning ctx's error, when ctx is done (the batch in hand is finished
// and recorded as in Run); database errors are returned at once, those
// that waiting cannot mend with advice (see Run). It first probes the
// table as Run does, so that a missing UPDATE privilege shows even when
// nothing is pending. It is meant for one-shot jobs (the sweeper's
// Kubernetes CronJob) and tests; long-running processes use Run. With
// Config.Hedge it returns only after the calls hedges beat have returned
// (once ctx is done, at most ShutdownTimeout later). While Run or another
// RunOnce runs on the same Relay it returns ErrRunning.
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
	p := r.newPipeline(ctx, modeOnce)
	err = p.run()
	if err == nil {
		err = ctx.Err()
	}
	return p.published, err
}

// poll runs one claim, publishes what it claimed, records the results and
// returns how many rows it claimed (tests drive the relay step by step
// with it). While the circuit breaker is open, a poll before the next
// probe is due does nothing, and a probe poll publishes one row of the
// claimed batch and releases the rest.
func (r *Relay) poll(ctx context.Context) (int, error) {
	p := r.newPipeline(ctx, modeOneClaim)
	err := p.run()
	return p.claimed1, err
}

// Why a batch stopped publishing early (the cause of its context).
var (
	errLeaseDeadline  = errors.New("relay: batch stopped before its lease lapses (the lease could not be extended)")
	errLeaseLost      = errors.New("relay: batch stopped: another instance took over part of its lease")
	errRecordCutOff   = errors.New("relay: claim cut off before the lease of the failures it recorded could lapse (the database or the network is slow); what it did not record is recorded again")
	errPublishTimeout = errors.New("relay: batch stopped after Config.PublishTimeout")
	errShutdown       = errors.New("relay: batch stopped at Config.ShutdownTimeout")
	errAbandoned      = errors.New("relay: publish abandoned at Config.ShutdownTimeout")
)

// shutdownGrace is how long before ShutdownTimeout a batch interrupts its
// publishes, so that publishers honouring the message context return (and
// their rows are released) before hung ones are abandoned.
func shutdownGrace(timeout time.Duration) time.Duration {
	return min(timeout/5, time.Second)
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

// publishUnit publishes a unit's rows one after another into res, holding
// one of f's slots from its first publish to its last: Concurrency keys
// publish at once, and a key's next row does not queue again behind every
// unit waiting for a slot (with a slot taken per row, a key of 100 rows
// in a batch went out at a fraction of its publish rate while other keys
// waited, until its rows in flight counted as a slow publish). Only a
// slow publish gives the slot back (see publishRow); the next row then
// waits for one again. The unit stops at its first failure and gives the
// rest back. f.queued counts the unit's rows until its first publish
// starts. When ctx is done (the batch stopped) the rows not started are
// given back; when abandon is closed a publish under way is abandoned
// (its row stays leased until the lease lapses) and the rest given back.
func (r *Relay) publishUnit(ctx context.Context, abandon <-chan struct{}, f *flow, unit []driver.Row, res *unitResult) {
	slots := f.slots
	waiting, held := true, false
	defer func() {
		if waiting {
			f.started(len(unit))
		}
		if held {
			<-slots
		}
	}()
	for i, rw := range unit {
		if !held {
			select {
			case slots <- struct{}{}:
				held = true
			case <-ctx.Done():
				res.release = rowIDsOf(unit[i:])
				return
			case <-abandon:
				res.release = rowIDsOf(unit[i:])
				return
			}
		}
		if waiting {
			waiting = false
			f.started(len(unit))
		}
		if ctx.Err() != nil { // the batch stopped: give the rest back
			res.release = rowIDsOf(unit[i:])
			return
		}
		var err error
		held, err = r.publishRow(ctx, abandon, f, rw)
		if errors.Is(err, errAbandoned) {
			r.log.WarnContext(ctx, "publish still running at the shutdown timeout: abandoned; the row stays leased until its lease lapses, then it is published again",
				slog.Int64("id", rw.ID), slog.String("event_id", rw.EventID), slog.String("key", rw.Key), slog.String("topic", rw.Topic))
			res.release = rowIDsOf(unit[i+1:])
			return
		}
		if err == nil {
			res.sent = append(res.sent, rw.ID)
			continue
		}
		permanent := errors.Is(err, ErrPermanent)
		text := telemetry.ErrorText(err)
		if ctx.Err() != nil && !permanent {
			// Cut off by the batch stopping (shutdown, lease deadline,
			// PublishTimeout), not the broker's verdict: no attempt is
			// charged.
			r.log.DebugContext(ctx, "publish interrupted: released",
				slog.Int64("id", rw.ID), slog.String("event_id", rw.EventID), slog.String("error", text))
			res.release = rowIDsOf(unit[i:])
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
		res.failure = &driver.Failure{Row: rw, Error: text, Delay: delay, Permanent: permanent}
		res.release = rowIDsOf(unit[i+1:])
		return
	}
}

func rowIDsOf(rows []driver.Row) []int64 {
	ids := make([]int64, len(rows))
	for i, rw := range rows {
		ids[i] = rw.ID
	}
	return ids
}

// message builds the watermill message of a row (package outmsg, shared
// with the streaming relay, so both publish identical messages).
func (r *Relay) message(ctx context.Context, rw driver.Row) (*message.Message, error) {
	return rowMessage(ctx, rw)
}

// rowMessage is the message of a row; an error is permanent.
func rowMessage(ctx context.Context, rw driver.Row) (*message.Message, error) {
	msg, err := outmsg.Build(ctx, outmsg.Event{
		EventID: rw.EventID, Seq: rw.ID, Type: rw.Type, Key: rw.Key, Version: rw.Version,
		CreatedAt: rw.CreatedAt, Headers: rw.Headers, Payload: rw.Payload,
	})
	if err != nil {
		return nil, Permanent(fmt.Errorf("relay: row %d: %w", rw.ID, err))
	}
	return msg, nil
}

// publishRow publishes one row with a slot of f the caller holds; a
// publish that runs for f.slowAfter gives the slot back, and held reports
// whether the caller still holds it. A panicking publisher counts as a
// failure. The publisher runs in its own goroutine so that a publish that
// never returns can be abandoned (errAbandoned) when abandon is closed.
// With Config.Hedge, a publish still running at hedgeAfter is sent again
// beside it, if the throttle allows, and again hedgeAfter later, up to
// MaxHedges times, each call with a message context of its own: the
// first call to succeed decides, and the others' contexts are cancelled;
// a failure waits for the calls still running (and ends the hedging:
// another call now would be a retry without backoff), and when all fail
// the first failure is returned. The calls still running when it returns
// run on (f.calls).
func (r *Relay) publishRow(ctx context.Context, abandon <-chan struct{}, f *flow, rw driver.Row) (held bool, err error) {
	held = true
	msg, err := r.message(ctx, rw)
	end := r.startSend(ctx, msg, rw) // the producer span (telemetry.go)
	defer func() { end(err) }()
	if err != nil {
		return held, err
	}
	var pristine *message.Message // the hedges' source, never published
	var hedges <-chan time.Time
	var throttle *hedge.Throttle // refilled by an unhedged publish (nil: Hedge off)
	if r.opts.Hedge {
		throttle = r.hedges
	}
	var hedgeTimer *time.Timer
	after, hedging := r.hedgeAfter(f)
	if hedging {
		// Copied before the first call starts: a publisher may write to
		// its message's metadata while it runs.
		pristine = msg.CopyWithContext()
		callCtx, cancel := context.WithCancel(msg.Context())
		defer cancel()
		msg.SetContext(callCtx)
		hedgeTimer = time.NewTimer(after)
		defer hedgeTimer.Stop()
		hedges = hedgeTimer.C
	}
	res := make(chan error, 1+MaxHedges)
	call := func(m *message.Message) {
		f.calls.Add(1)
		f.pool.Go(func() {
			defer f.calls.Done()
			defer func() {
				if p := recover(); p != nil {
					res <- fmt.Errorf("relay: publisher panicked: %v", p)
				}
			}()
			res <- r.opts.Publisher.Publish(rw.Topic, m)
		})
	}
	call(msg)
	start := time.Now()
	slow := time.NewTimer(f.slowAfter())
	defer slow.Stop()
	race := hedge.NewRace()
	for {
		select {
		case err := <-res:
			done, err := race.Returned(err)
			if !done {
				hedges = nil
				continue // another call may still succeed
			}
			race.Done(&f.typ, throttle, time.Since(start))
			return held, err
		case <-slow.C:
			held = false
			<-f.slots // a slow publish lets another key go meanwhile
		case <-hedges:
			hedges = nil
			if !r.hedges.Take() {
				continue
			}
			hedged, more := race.Hedge()
			r.tel.Hedged(pristine.Context(), rw.Type, rw.Topic, time.Since(start))
			r.log.DebugContext(ctx, "publish running long: sent again beside it (hedge)",
				slog.Int64("id", rw.ID), slog.String("event_id", rw.EventID), slog.String("key", rw.Key),
				slog.String("topic", rw.Topic), slog.Duration("after", time.Since(start)), slog.Int("hedge", hedged))
			m := pristine.CopyWithContext()
			callCtx, cancel := context.WithCancel(pristine.Context())
			defer cancel()
			m.SetContext(callCtx)
			call(m)
			if more {
				hedgeTimer.Reset(after)
				hedges = hedgeTimer.C
			}
		case <-abandon:
			for race.Running() > 0 {
				select {
				case err := <-res: // one did finish
					if done, err := race.Returned(err); done {
						return held, err
					}
					continue
				default:
				}
				return held, errAbandoned
			}
			return held, race.Failed()
		}
	}
}

// hedgeAfter is how long a publish runs before Config.Hedge sends it
// again (Config.HedgeAfter, or when it counts as slow), and whether it
// may be hedged at all.
func (r *Relay) hedgeAfter(f *flow) (time.Duration, bool) {
	if !r.opts.Hedge {
		return 0, false
	}
	return f.typ.After(r.opts.HedgeAfter), true
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
