// Package monitor watches an outbox table and tells people when events are
// not going out: the seed design's monitor ("count rows older than 10
// minutes and not sent; alert while the count stays above zero"). The
// sweeper repairs data; the monitor tells people.
//
// Each check reads one snapshot (driver.Stats: pending count, age of the
// oldest pending row, stale rows, FAILED rows, expired leases) in a single
// cheap statement through the driver, measured by the database clock,
// within Config.CheckTimeout: a check stuck behind a lock or on a dead
// connection fails at its deadline, even when the driver ignores it.
//
//   - Alerts: Config.OnAlert is called once when a threshold is crossed
//     and Config.OnResolve once when it clears, not on every check.
//     Besides the thresholds on the outbox (stale, oldest_pending_age,
//     failed, expired_leases), Run raises check_failing (CheckFailing) when
//     the monitor itself is blind: its checks have been failing (or timing
//     out) and none has succeeded for longer than 2×Interval. It resolves
//     with the next successful check.
//   - Metrics, through the OpenTelemetry metrics API (a no-op unless the
//     application installs a meter provider), as observable gauges that
//     report the last snapshot (the database is never queried from the
//     metrics callback):
//     outboxgen.outbox.pending, outboxgen.outbox.stale,
//     outboxgen.outbox.failed, outboxgen.outbox.expired_leases ({row}),
//     outboxgen.outbox.oldest_pending_age (s); plus the counter
//     outboxgen.monitor.check_errors. The gauges report nothing before the
//     first successful check, and nothing again once the last successful
//     check is older than 2×Interval (the database is down, or Run has
//     stopped): a missing series, which dashboards and "absent" alert rules
//     can see, rather than a stale "stale=0" that looks healthy for hours.
//
// Run checks on a schedule inside the service; Check does one check for a
// Kubernetes CronJob or a health endpoint.
package monitor

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/outboxgen/outboxgen/runtime/dialect"
	"github.com/outboxgen/outboxgen/runtime/driver"
	"github.com/outboxgen/outboxgen/runtime/internal/dberr"
	"github.com/outboxgen/outboxgen/runtime/internal/schedule"
)

// Source is what the monitor reads: any driver.Driver.
type Source interface {
	Stats(ctx context.Context, staleAfter time.Duration) (driver.Stats, error)
}

// checker is implemented by every driver.Driver: see driver.Driver.Check.
type checker interface {
	Check(ctx context.Context, t driver.Table) error
}

// Kind names an alert.
type Kind string

// The alerts, one per threshold.
const (
	// Stale: pending rows older than StaleAfter (the seed's alarm).
	Stale Kind = "stale"
	// OldestPending: the oldest pending row is older than its threshold.
	OldestPending Kind = "oldest_pending_age"
	// Failed: FAILED rows wait for an operator (list and requeue them).
	Failed Kind = "failed"
	// ExpiredLeases: a relay died holding rows.
	ExpiredLeases Kind = "expired_leases"
	// CheckFailing: the monitor cannot read the outbox table (the database
	// is down or unreachable, the statement fails, or it hangs past
	// Config.CheckTimeout behind a lock or on a dead connection): its
	// checks have failed and no check has succeeded for longer than
	// 2×Interval, so the other alerts and the gauges know nothing current.
	// Raised by Run only (Check returns the error instead), once per
	// failure streak, also while a timed-out statement still hangs;
	// resolved by the next successful check.
	CheckFailing Kind = "check_failing"
	// WALSlot: the WAL relay's replication slot is missing, still being
	// created, not streamed from, losing WAL, or retains more than
	// Thresholds.SlotLagBytes (Config.SlotCheck; sql.wal only). The
	// message is the check's error, which says what to do.
	WALSlot Kind = "wal_slot"
)

// Kinds lists every Kind in a stable order.
var Kinds = []Kind{Stale, OldestPending, Failed, ExpiredLeases, WALSlot, CheckFailing}

// Alert is a crossed threshold.
type Alert struct {
	Kind Kind
	// Stats is the snapshot that crossed (or, for OnResolve, cleared) the
	// threshold. For a CheckFailing alert it is the last successful
	// snapshot (zero when there was none), as old as the failure streak;
	// for its resolution, the fresh snapshot.
	Stats driver.Stats
	// Err is the error of the last failed check (CheckFailing alerts only).
	Err error
	// Resolved is set on the Alert passed to OnResolve.
	Resolved bool
	// Message says what is wrong and what to look at.
	Message string
}

// Monitor checks an outbox table. Create it with New; it is safe for
// concurrent use.
type Monitor struct {
	src   Source
	opts  Config
	log   *slog.Logger
	attrs metric.MeasurementOption
	reg   metric.Registration
	errs  metric.Int64Counter
	now   func() time.Time // the local clock; replaced in tests
	need  dberr.Need       // what the monitor needs, for error advice

	mu     sync.Mutex
	last   driver.Stats
	lastAt time.Time
	have   bool

	// Only touched by Run's goroutine (tick):
	active      map[Kind]bool
	failingFrom time.Time // first failed check of the current streak; zero while checks succeed

	// Calls that outlived CheckTimeout and still run (see bounded).
	read, slot flight

	runMu sync.Mutex // one Run at a time
}

// New returns a monitor reading src (a driver.Driver) with opts. It
// registers the metrics callback; Close unregisters it.
func New(src Source, opts Config) (*Monitor, error) {
	if src == nil {
		return nil, errors.New("monitor: source is nil: pass the outbox's driver.Driver")
	}
	opts.setDefaults()
	if err := opts.Validate(); err != nil {
		return nil, err
	}
	kv := make([]attribute.KeyValue, 0, len(opts.Attributes)+1)
	need := dberr.Need{Component: "monitor", Tables: "the outbox table", Privileges: "SELECT on the outbox table and its " + dialect.VersionSuffix + " table"}
	if t, ok := src.(interface{ Tables() driver.Tables }); ok {
		kv = append(kv, attribute.String("outboxgen.table", t.Tables().Outbox))
		need.Tables, need.Privileges = t.Tables().Outbox, "SELECT on "+t.Tables().Outbox
	}
	for _, a := range opts.Attributes {
		kv = append(kv, attribute.String(a.Key, a.Value))
	}
	m := &Monitor{
		src:    src,
		opts:   opts,
		log:    opts.Logger.With(slog.String("component", "outboxgen.monitor")),
		attrs:  metric.WithAttributeSet(attribute.NewSet(kv...)),
		active: map[Kind]bool{},
		now:    time.Now,
		need:   need,
	}
	if err := m.register(); err != nil {
		return nil, fmt.Errorf("monitor: metrics: %w", err)
	}
	return m, nil
}

func (m *Monitor) register() error {
	mt := m.opts.Meter
	pending, err := mt.Int64ObservableGauge("outboxgen.outbox.pending", metric.WithUnit("{row}"),
		metric.WithDescription("Outbox rows waiting to be published (status 0)."))
	if err != nil {
		return err
	}
	age, err := mt.Float64ObservableGauge("outboxgen.outbox.oldest_pending_age", metric.WithUnit("s"),
		metric.WithDescription("Age of the oldest pending outbox row, by the database clock (0 when none)."))
	if err != nil {
		return err
	}
	stale, err := mt.Int64ObservableGauge("outboxgen.outbox.stale", metric.WithUnit("{row}"),
		metric.WithDescription("Pending outbox rows older than the monitor's StaleAfter."))
	if err != nil {
		return err
	}
	failed, err := mt.Int64ObservableGauge("outboxgen.outbox.failed", metric.WithUnit("{row}"),
		metric.WithDescription("FAILED outbox rows (status 2) waiting for an operator."))
	if err != nil {
		return err
	}
	expired, err := mt.Int64ObservableGauge("outboxgen.outbox.expired_leases", metric.WithUnit("{row}"),
		metric.WithDescription("Pending outbox rows whose relay lease expired (the relay died)."))
	if err != nil {
		return err
	}
	m.errs, err = mt.Int64Counter("outboxgen.monitor.check_errors", metric.WithUnit("{check}"),
		metric.WithDescription("Monitor checks that could not read the outbox table."))
	if err != nil {
		return err
	}
	m.reg, err = mt.RegisterCallback(func(_ context.Context, o metric.Observer) error {
		st, at, ok := m.Snapshot()
		if !ok {
			return nil // nothing measured yet: report nothing rather than zeros
		}
		if m.now().Sub(at) > m.staleLimit() {
			// The checks are failing (or have stopped): report nothing
			// rather than old numbers that look current.
			return nil
		}
		o.ObserveInt64(pending, st.Pending, m.attrs)
		o.ObserveFloat64(age, st.OldestPendingAge.Seconds(), m.attrs)
		o.ObserveInt64(stale, st.Stale, m.attrs)
		o.ObserveInt64(failed, st.Failed, m.attrs)
		o.ObserveInt64(expired, st.ExpiredLeases, m.attrs)
		return nil
	}, pending, age, stale, failed, expired)
	return err
}

// Close unregisters the metrics callback. The monitor must not be used
// afterwards.
func (m *Monitor) Close() error {
	if m.reg == nil {
		return nil
	}
	return m.reg.Unregister()
}

// staleLimit is how old the last successful check may be before the gauges
// go silent and CheckFailing is raised: two intervals, so that one slow or
// failed check does not blank the dashboards.
func (m *Monitor) staleLimit() time.Duration { return 2 * m.opts.Interval }

// Config returns the options in effect (defaults applied).
func (m *Monitor) Config() Config { return m.opts }

// Snapshot returns the last snapshot read by Check or Run, when it was
// taken (the local clock), and whether there is one.
func (m *Monitor) Snapshot() (driver.Stats, time.Time, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.last, m.lastAt, m.have
}

// Check reads one snapshot, records it for the metrics, and returns it with
// the alerts it crosses, in Kinds order. It calls neither OnAlert nor
// OnResolve: a one-off check (a CronJob, a health endpoint) acts on the
// returned alerts itself. It returns within Config.CheckTimeout (twice
// that with SlotCheck) even when the database does not answer: the
// error then says that the check timed out and matches
// context.DeadlineExceeded (errors.Is).
func (m *Monitor) Check(ctx context.Context) (driver.Stats, []Alert, error) {
	st, err := bounded(ctx, m, &m.read, readTimeout, func(ctx context.Context) (driver.Stats, error) {
		if c, ok := m.src.(checker); ok {
			// The driver's start-up check (remembered once it passed):
			// the dialect and the outbox table's columns.
			if err := c.Check(ctx, driver.Outbox); err != nil {
				return driver.Stats{}, err
			}
		}
		return m.src.Stats(ctx, m.opts.StaleAfter)
	})
	if err != nil {
		m.errs.Add(ctx, 1, m.attrs)
		return driver.Stats{}, nil, fmt.Errorf("monitor: read outbox stats: %w", dberr.Explain(err, m.need))
	}
	m.mu.Lock()
	m.last, m.lastAt, m.have = st, m.now(), true
	m.mu.Unlock()
	slotErr := m.checkSlot(ctx)
	var alerts []Alert
	for _, k := range Kinds {
		if k == WALSlot {
			if slotErr != nil {
				alerts = append(alerts, Alert{Kind: WALSlot, Stats: st, Err: slotErr, Message: slotErr.Error()})
			}
			continue
		}
		if m.crossed(k, st) {
			alerts = append(alerts, m.alert(k, st, false))
		}
	}
	return st, alerts, nil
}

// checkSlot runs Config.SlotCheck, if set, within CheckTimeout.
func (m *Monitor) checkSlot(ctx context.Context) error {
	if m.opts.SlotCheck == nil {
		return nil
	}
	max := m.opts.Thresholds.SlotLagBytes
	if max < 0 {
		max = 0 // Never: no lag limit; the slot's state is still checked
	}
	_, err := bounded(ctx, m, &m.slot, slotTimeout, func(ctx context.Context) (struct{}, error) {
		return struct{}{}, m.opts.SlotCheck(ctx, max)
	})
	if _, ok := errors.AsType[*timeoutError](err); ok {
		return fmt.Errorf("monitor: %w", err)
	}
	return err
}

// flight tracks the calls of one kind (the table read, the slot check)
// that bounded abandoned at their deadline and that have not returned yet.
type flight struct {
	mu    sync.Mutex
	stuck int       // abandoned calls still running
	since time.Time // when the oldest of them started (the local clock)
}

// bounded calls f with a deadline of Config.CheckTimeout and returns its
// result, or a *timeoutError once the deadline passes. f runs on its own
// goroutine so that a driver that ignores its context (a socket read
// without a deadline, a lock wait) cannot hold up Run, a health endpoint
// or a shutdown: bounded returns at the deadline and leaves f running. As
// long as such an abandoned call has not returned, bounded fails at once
// without calling f: no second statement queues behind the first.
func bounded[T any](ctx context.Context, m *Monitor, fl *flight, kind timeoutKind, f func(context.Context) (T, error)) (T, error) {
	var zero T
	limit := m.opts.CheckTimeout
	fl.mu.Lock()
	if fl.stuck > 0 {
		since := fl.since
		fl.mu.Unlock()
		return zero, &timeoutError{kind: kind, limit: limit, running: max(m.now().Sub(since), limit)}
	}
	fl.mu.Unlock()
	type result struct {
		v   T
		err error
	}
	start := m.now()
	cctx, cancel := context.WithTimeout(ctx, limit)
	defer cancel()
	done := make(chan result, 1)
	abandoned := false // guarded by fl.mu, like the send on done
	go func() {
		v, err := f(cctx)
		fl.mu.Lock()
		done <- result{v, err} // buffered: never blocks
		late := abandoned
		if late {
			fl.stuck--
		}
		fl.mu.Unlock()
		if late {
			m.log.Info("monitor: a check abandoned at its timeout has returned", slog.String("check", kind.String()),
				slog.Duration("took", m.now().Sub(start)), slog.Any("error", err))
		}
	}()
	var r result
	select {
	case r = <-done:
	case <-cctx.Done():
		fl.mu.Lock()
		select {
		case r = <-done:
			fl.mu.Unlock()
		default:
			abandoned = true
			if fl.stuck == 0 {
				fl.since = start
			}
			fl.stuck++
			fl.mu.Unlock()
			if err := ctx.Err(); err != nil {
				return zero, err // the caller gave up (Run is stopping): not the database's fault
			}
			return zero, &timeoutError{kind: kind, limit: limit}
		}
	}
	if r.err != nil && ctx.Err() == nil && errors.Is(cctx.Err(), context.DeadlineExceeded) {
		// The driver gave up at the deadline: say why it was cut short.
		return zero, &timeoutError{kind: kind, limit: limit, err: r.err}
	}
	return r.v, r.err
}

// timeoutKind says which call of a check timed out.
type timeoutKind uint8

const (
	readTimeout timeoutKind = iota // the table read: driver check and Stats
	slotTimeout                    // Config.SlotCheck
)

func (k timeoutKind) String() string {
	if k == slotTimeout {
		return "wal_slot"
	}
	return "outbox_stats"
}

// timeoutError is a call of a check that did not finish within
// Config.CheckTimeout. It matches context.DeadlineExceeded.
type timeoutError struct {
	kind  timeoutKind
	limit time.Duration
	// running, when set, says that this call was not made: an earlier
	// one, abandoned at its deadline, has been running this long.
	running time.Duration
	err     error // the driver's error, when it returned at the deadline
}

func (e *timeoutError) Error() string {
	what, advice := "the check", "look for a lock on the outbox table (PostgreSQL: an ALTER TABLE, LOCK TABLE, VACUUM FULL, CLUSTER or REINDEX holding or waiting for its ACCESS EXCLUSIVE lock, see pg_locks and pg_stat_activity; MySQL/MariaDB: a metadata lock, see SHOW PROCESSLIST; SQLite: a long write transaction) and at the connection (a half-open TCP connection after a failover or a network fault, a pool with no free connection); relays are probably stalled as well"
	if e.kind == slotTimeout {
		what, advice = "the WAL slot check", "look at the connection to PostgreSQL (a half-open TCP connection after a failover or a network fault, a pool with no free connection) and at the server's load"
	}
	if e.running > 0 {
		return fmt.Sprintf("%s timed out after %s (Config.CheckTimeout) and its statement has not returned %s after it started: the driver does not honour the deadline; no new statement is sent until it returns; %s: %v",
			what, e.limit, e.running.Round(time.Millisecond), advice, context.DeadlineExceeded)
	}
	cause := error(context.DeadlineExceeded)
	if e.err != nil {
		cause = e.err
	}
	return fmt.Sprintf("%s did not finish within %s (Config.CheckTimeout): %s: %v", what, e.limit, advice, cause)
}

func (e *timeoutError) Unwrap() []error {
	if e.err != nil {
		return []error{e.err, context.DeadlineExceeded}
	}
	return []error{context.DeadlineExceeded}
}

// crossed reports whether st crosses k's threshold.
func (m *Monitor) crossed(k Kind, st driver.Stats) bool {
	th := m.opts.Thresholds
	switch k {
	case Stale:
		return th.Stale >= 0 && st.Stale > th.Stale
	case OldestPending:
		return th.OldestPendingAge >= 0 && st.Pending > 0 && st.OldestPendingAge > th.OldestPendingAge
	case Failed:
		return th.Failed >= 0 && st.Failed > th.Failed
	case ExpiredLeases:
		return th.ExpiredLeases >= 0 && st.ExpiredLeases > th.ExpiredLeases
	}
	return false
}

func (m *Monitor) alert(k Kind, st driver.Stats, resolved bool) Alert {
	a := Alert{Kind: k, Stats: st, Resolved: resolved}
	th := m.opts.Thresholds
	if resolved {
		switch k {
		case CheckFailing:
			a.Message = "resolved: the monitor reads the outbox table again"
		case Stale:
			a.Message = fmt.Sprintf("resolved: %d pending outbox rows older than %s (threshold %d)", st.Stale, m.opts.StaleAfter, th.Stale)
		case OldestPending:
			a.Message = fmt.Sprintf("resolved: oldest pending outbox row is %s old (threshold %s)", st.OldestPendingAge.Round(time.Second), th.OldestPendingAge)
		case Failed:
			a.Message = fmt.Sprintf("resolved: %d FAILED outbox rows (threshold %d)", st.Failed, th.Failed)
		case ExpiredLeases:
			a.Message = fmt.Sprintf("resolved: %d outbox rows with an expired relay lease (threshold %d)", st.ExpiredLeases, th.ExpiredLeases)
		case WALSlot:
			a.Message = "resolved: the WAL relay's replication slot is streamed from and within its lag limit"
		}
		return a
	}
	switch k {
	case Stale:
		a.Message = fmt.Sprintf("%d pending outbox rows are older than %s (threshold %d): committed events are not going out; check that a relay and the sweeper are running and the broker is reachable", st.Stale, m.opts.StaleAfter, th.Stale)
	case OldestPending:
		a.Message = fmt.Sprintf("the oldest pending outbox row is %s old (threshold %s): check that a relay is running and the broker is reachable", st.OldestPendingAge.Round(time.Second), th.OldestPendingAge)
	case Failed:
		a.Message = fmt.Sprintf("%d outbox rows are FAILED (threshold %d): they exhausted their attempts and hold back later events of their key; inspect last_error, fix the cause and requeue them", st.Failed, th.Failed)
	case ExpiredLeases:
		a.Message = fmt.Sprintf("%d pending outbox rows carry an expired relay lease (threshold %d): a relay died holding them; another relay or the sweeper takes them over, a count that stays up means none is running", st.ExpiredLeases, th.ExpiredLeases)
	}
	return a
}

// failingAlert is the CheckFailing alert for a monitor blind since from,
// its last check failing with err.
func (m *Monitor) failingAlert(from time.Time, err error) Alert {
	st, _, ok := m.Snapshot()
	a := Alert{Kind: CheckFailing, Stats: st, Err: err}
	since := "since " + from.UTC().Format(time.RFC3339)
	if !ok {
		since += " (no check has succeeded yet)"
	}
	a.Message = fmt.Sprintf("the monitor cannot read the outbox table: no successful check %s (limit %s, 2×Interval); the outbox gauges report nothing and the other alerts are frozen; check that the database is reachable; last error: %v", since, m.staleLimit(), err)
	return a
}

// tick runs one scheduled check and reports threshold transitions: OnAlert
// for each newly crossed threshold, OnResolve for each cleared one. A
// failed check changes no threshold alert; once checks have failed and none
// has succeeded for longer than 2×Interval, it raises CheckFailing (once
// per streak), which the next successful check resolves.
func (m *Monitor) tick(ctx context.Context) error {
	st, alerts, err := m.Check(ctx)
	if err != nil {
		if ctx.Err() != nil {
			return err // shutting down: not the database's fault
		}
		t := m.now()
		if m.failingFrom.IsZero() {
			m.failingFrom = t
		}
		// Blind since the last successful check (the gauges' rule), or
		// since the streak began when no check has succeeded yet.
		from := m.failingFrom
		if _, at, ok := m.Snapshot(); ok {
			from = at
		}
		if !m.active[CheckFailing] && t.Sub(from) > m.staleLimit() {
			m.active[CheckFailing] = true
			a := m.failingAlert(from, err)
			m.log.ErrorContext(ctx, "outbox alert", slog.String("kind", string(CheckFailing)), slog.String("message", a.Message))
			if m.opts.OnAlert != nil {
				m.opts.OnAlert(a)
			}
		}
		return err
	}
	m.failingFrom = time.Time{}
	now := map[Kind]bool{}
	for _, a := range alerts {
		now[a.Kind] = true
		if m.active[a.Kind] {
			continue
		}
		m.active[a.Kind] = true
		m.log.WarnContext(ctx, "outbox alert", slog.String("kind", string(a.Kind)), slog.String("message", a.Message), statsAttr(st))
		if m.opts.OnAlert != nil {
			m.opts.OnAlert(a)
		}
	}
	for _, k := range Kinds {
		if !m.active[k] || now[k] {
			continue
		}
		delete(m.active, k)
		a := m.alert(k, st, true)
		m.log.InfoContext(ctx, "outbox alert resolved", slog.String("kind", string(k)), statsAttr(st))
		if m.opts.OnResolve != nil {
			m.opts.OnResolve(a)
		}
	}
	m.log.DebugContext(ctx, "outbox checked", statsAttr(st))
	return nil
}

func statsAttr(st driver.Stats) slog.Attr {
	return slog.Group("stats",
		slog.Int64("pending", st.Pending), slog.Duration("oldest_pending_age", st.OldestPendingAge),
		slog.Int64("stale", st.Stale), slog.Int64("failed", st.Failed), slog.Int64("expired_leases", st.ExpiredLeases))
}

// Run checks at once and then every Interval after the previous check
// ended (fixed delay) until ctx is done; it then returns nil. A check
// ends by CheckTimeout at the latest, so a statement hanging behind a lock
// or on a dead connection (even one whose driver ignores the deadline)
// neither stops the schedule nor holds off CheckFailing. A failed
// check is logged (and counted in outboxgen.monitor.check_errors) and
// retried after a pause that grows from Interval (at least 100 ms),
// doubling up to DatabaseBackoffMax if that is longer, and resets at the
// first successful check; alert state carries over. A missing table or
// column or a missing privilege before the first successful check ends Run
// with that error (also logged): a deployment mistake that waiting does
// not mend. Run one Run per Monitor at a time.
func (m *Monitor) Run(ctx context.Context) error {
	if !m.runMu.TryLock() {
		return errors.New("monitor: Run is already running on this Monitor: run one Run per Monitor")
	}
	defer m.runMu.Unlock()
	m.log.InfoContext(ctx, "monitor started", slog.Duration("interval", m.opts.Interval), slog.Duration("stale_after", m.opts.StaleAfter))
	err := schedule.FixedDelay{
		Interval:   m.opts.Interval,
		BackoffMax: m.opts.DatabaseBackoffMax,
		OnError: func(ctx context.Context, err error, failures int, retryIn time.Duration) {
			m.log.ErrorContext(ctx, "monitor check failed", slog.Any("error", err), slog.Int("consecutive_failures", failures), slog.Duration("retry_in", retryIn))
		},
		OnRecover: func(ctx context.Context, failures int) {
			m.log.InfoContext(ctx, "monitor check succeeded again", slog.Int("failed_checks", failures))
		},
		FatalAtStart: dberr.FatalAtStart,
		OnFatal: func(ctx context.Context, err error) {
			m.log.ErrorContext(ctx, "monitor not started: the outbox table is not usable", slog.Any("error", err))
		},
	}.Run(ctx, m.tick)
	if err != nil {
		return err
	}
	m.log.Info("monitor stopped")
	return nil
}
