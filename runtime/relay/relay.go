package relay

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"sort"
	"strconv"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/outboxgen/outboxgen/runtime/dialect"
	"github.com/outboxgen/outboxgen/runtime/driver"
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
	opts          Options
	drv           driver.Driver
	log           *slog.Logger
	unordered     map[string]bool
	unorderedList []string
	wake          chan struct{}
}

// New returns a relay over the outbox table of drv: a sqldriver (pgx
// stdlib, go-sql-driver/mysql, modernc.org/sqlite) or a pgxdriver (native
// pgx pool). The driver owns the table names. opts is completed with
// defaults and validated.
func New(drv driver.Driver, opts Options) (*Relay, error) {
	if drv == nil {
		return nil, errors.New("relay: driver is nil: pass sqldriver.New(db, dialect, tables) or pgxdriver.New(pool, tables)")
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
// results (rows it did not get to are released) and returns nil. Database
// errors are logged and retried on the next poll; they do not stop Run.
//
// When the driver is a driver.Notifier (pgxdriver: PostgreSQL
// LISTEN/NOTIFY), Run also wakes when it reports new rows, so writers in
// other processes that notify (pgxdriver.Notify, sqldriver.Notify) get
// their events published without waiting for PollInterval.
//
// Run one Run loop per Relay; run several relays (processes or Relay
// values with distinct InstanceIDs) to share the work.
func (r *Relay) Run(ctx context.Context) error {
	r.log.InfoContext(ctx, "relay started",
		slog.Int("batch_size", r.opts.BatchSize), slog.Duration("poll_interval", r.opts.PollInterval),
		slog.Duration("lease", r.opts.LeaseDuration), slog.Int("concurrency", r.opts.Concurrency))
	if n, ok := r.drv.(driver.Notifier); ok {
		listenCtx, stopListen := context.WithCancel(ctx)
		done := make(chan struct{})
		go func() { defer close(done); r.listen(listenCtx, n) }()
		defer func() { stopListen(); <-done }()
	}
	// Go 1.23+ timer semantics: Reset and Stop never leave a stale tick.
	timer := time.NewTimer(r.opts.PollInterval)
	timer.Stop()
	defer timer.Stop()
	for {
		if ctx.Err() != nil {
			r.log.Info("relay stopped")
			return nil
		}
		n, err := r.poll(ctx)
		if err != nil && ctx.Err() == nil {
			r.log.ErrorContext(ctx, "relay poll failed", slog.Any("error", err))
		}
		if err == nil && n >= r.opts.BatchSize {
			continue // a full batch: more is probably waiting
		}
		timer.Reset(r.opts.PollInterval)
		select {
		case <-ctx.Done():
		case <-r.wake:
		case <-timer.C:
		}
		timer.Stop()
	}
}

// listen turns the driver's notifications into Notify calls until ctx is
// done. After an error it waits PollInterval (at least a second) before
// listening again; polling goes on meanwhile.
func (r *Relay) listen(ctx context.Context, n driver.Notifier) {
	pause := max(r.opts.PollInterval, time.Second)
	for {
		err := n.WaitForNotification(ctx)
		if ctx.Err() != nil {
			return
		}
		if err != nil {
			r.log.WarnContext(ctx, "waiting for notifications failed: polling only until it recovers", slog.Any("error", err))
			select {
			case <-ctx.Done():
				return
			case <-time.After(pause):
			}
			continue
		}
		r.Notify()
	}
}

// RunOnce drains the claimable rows once: it polls (claim, publish,
// record) until a poll comes back with fewer than BatchSize rows, and
// returns how many rows it published. Rows that fail are recorded with
// their backoff and are not retried by this call unless they come due
// while it runs. It stops early, returning ctx's error, when ctx is done
// (the batch in hand is finished and recorded as in Run); database errors
// are returned at once. It is meant for one-shot jobs (the sweeper's
// Kubernetes CronJob) and tests; long-running processes use Run. Do not
// call it while Run runs on the same Relay.
func (r *Relay) RunOnce(ctx context.Context) (published int, err error) {
	for {
		if err := ctx.Err(); err != nil {
			return published, err
		}
		claimed, sent, err := r.cycle(ctx)
		published += sent
		if err != nil {
			return published, err
		}
		if claimed < r.opts.BatchSize {
			return published, nil
		}
	}
}

// outcome is what happened to the rows of one batch.
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

// cycle runs one claim-publish-record cycle and returns how many rows it
// claimed and how many of them it published. Claiming uses ctx; once rows
// are claimed they are published with a context that outlives ctx by at
// most ShutdownTimeout and the results are always recorded.
func (r *Relay) cycle(ctx context.Context) (claimed, sent int, err error) {
	rows, err := r.drv.Claim(ctx, driver.ClaimParams{
		Owner:        r.opts.InstanceID,
		Lease:        r.opts.LeaseDuration,
		Limit:        r.opts.BatchSize,
		Unordered:    r.unorderedList,
		OverdueAfter: r.opts.OverdueAfter,
	})
	if err != nil {
		return 0, 0, err
	}
	if len(rows) == 0 {
		return 0, 0, nil
	}
	// Publishing must end while the lease still holds: past it another
	// instance may claim the same rows and publish them concurrently, which
	// would break per-key order in the broker. The deadline stops the batch
	// a margin before the lease lapses (a publisher that honours the
	// message context stops too); the rows not yet published are released.
	pubCtx, cancel := context.WithDeadline(context.WithoutCancel(ctx), time.Now().Add(r.opts.LeaseDuration-leaseMargin(r.opts.LeaseDuration)))
	stop := context.AfterFunc(ctx, func() {
		t := time.AfterFunc(r.opts.ShutdownTimeout, cancel)
		context.AfterFunc(pubCtx, func() { t.Stop() })
	})
	out := r.publish(pubCtx, rows)
	stop()
	cancel()

	// Recording must happen even during shutdown; it is bounded by the
	// lease (past it the fence would reject the writes anyway).
	recCtx, recCancel := context.WithTimeout(context.WithoutCancel(ctx), r.opts.LeaseDuration)
	defer recCancel()
	return len(rows), len(out.sent), r.record(recCtx, len(rows), out)
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

// publish publishes a batch with up to Concurrency units at once; a unit's
// rows go one after another and the unit stops at its first failure.
func (r *Relay) publish(ctx context.Context, rows []driver.Row) *outcome {
	units := r.groups(rows)
	out := &outcome{}
	work := make(chan []driver.Row)
	var wg sync.WaitGroup
	for range min(r.opts.Concurrency, len(units)) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for unit := range work {
				r.publishUnit(ctx, unit, out)
			}
		}()
	}
	for _, u := range units {
		work <- u
	}
	close(work)
	wg.Wait()
	return out
}

func (r *Relay) publishUnit(ctx context.Context, unit []driver.Row, out *outcome) {
	for i, rw := range unit {
		if ctx.Err() != nil { // shutdown deadline: give the rest back
			out.addRelease(unit[i:])
			return
		}
		err := r.publishRow(ctx, rw)
		if err == nil {
			out.mu.Lock()
			out.sent = append(out.sent, rw.ID)
			out.mu.Unlock()
			continue
		}
		attempt := rw.RetryCount + 1
		delay := r.opts.Backoff(attempt)
		if delay < 0 {
			delay = 0
		}
		r.log.WarnContext(ctx, "publish failed",
			slog.Int64("id", rw.ID), slog.String("event_id", rw.EventID), slog.String("type", rw.Type),
			slog.String("key", rw.Key), slog.String("topic", rw.Topic), slog.Int("attempt", attempt),
			slog.Duration("retry_in", delay), slog.Any("error", err))
		out.mu.Lock()
		out.failures = append(out.failures, driver.Failure{Row: rw, Error: err.Error(), Delay: delay, Permanent: errors.Is(err, ErrPermanent)})
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
func (r *Relay) publishRow(ctx context.Context, rw driver.Row) (err error) {
	msg, err := r.message(ctx, rw)
	if err != nil {
		return err
	}
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("relay: publisher panicked: %v", p)
		}
	}()
	return r.opts.Publisher.Publish(rw.Topic, msg)
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
			slog.Int("attempts", fe.RetryCount), slog.String("error", f.Error))
		if r.opts.OnFailed != nil {
			r.opts.OnFailed(fe)
		}
	}
}
