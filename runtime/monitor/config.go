package monitor

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/metric"

	"github.com/outboxgen/outboxgen/runtime/internal/backoff"
)

// Defaults of Config.
const (
	// DefaultInterval is the delay between the end of one check and the
	// start of the next.
	DefaultInterval = time.Minute
	// DefaultCheckTimeout caps the default of Config.CheckTimeout, which
	// is Interval, at least 1 s and at most this: a check is one cheap
	// statement (milliseconds on a healthy database), so 30 seconds
	// already means a lock wait or a connection that no longer answers.
	DefaultCheckTimeout = 30 * time.Second
	// DefaultStaleAfter is the seed design's alarm: a row committed but not
	// sent after 10 minutes means the relay is not doing its job.
	DefaultStaleAfter = 10 * time.Minute
	// DefaultDatabaseBackoffMax caps the pause of Run after consecutive
	// failed checks (see Config.DatabaseBackoffMax).
	DefaultDatabaseBackoffMax = backoff.DefaultMax
	// DefaultMaxSlotLagBytes is the default Thresholds.SlotLagBytes: 1 GiB
	// of WAL retained by the WAL relay's replication slot, about an hour
	// of writes at 1,000 events/s (the README's measured ~345 bytes per
	// transaction makes it ~50 minutes; more for larger payloads). Set it
	// well below max_slot_wal_keep_size, where PostgreSQL drops WAL.
	DefaultMaxSlotLagBytes = 1 << 30
	// MeterName is the instrumentation scope of the default meter.
	MeterName = "github.com/outboxgen/outboxgen/runtime/monitor"
)

// minCheckTimeout is the least default Config.CheckTimeout, for intervals
// below a second: a database round trip on a busy server, or the first
// check's new connection, can take a good part of it, and a timeout must
// mean that something is wrong, not that the server is a little slow.
const minCheckTimeout = time.Second

// Never, as a threshold, turns that alert off.
const Never = -1

// Thresholds say when to alert. Each alert fires when its value is
// strictly greater than its threshold. The zero value alerts on any stale,
// FAILED or expired-lease row and on a pending row older than StaleAfter.
// A negative threshold (Never) turns that alert off.
type Thresholds struct {
	// Stale: pending rows created longer than StaleAfter ago (default 0:
	// any such row alerts).
	Stale int64
	// Failed: FAILED rows waiting for an operator (default 0).
	Failed int64
	// ExpiredLeases: pending rows whose relay died holding them (default
	// 0). Such rows come back by themselves once the sweeper or a relay
	// claims them; a count that stays up means no relay is running.
	ExpiredLeases int64
	// OldestPendingAge: the age of the oldest pending row (default
	// StaleAfter).
	OldestPendingAge time.Duration
	// SlotLagBytes: the WAL the WAL relay's replication slot retains, in
	// bytes (default DefaultMaxSlotLagBytes), checked only when
	// Config.SlotCheck is set. Never turns off the lag limit only: a
	// missing, idle or WAL-losing slot still alerts, since each of those
	// loses events or disk.
	SlotLagBytes int64
}

// Config configure a Monitor. The zero value of every field means "use
// the default".
type Config struct {
	// Interval is the delay between the end of one check and the start of
	// the next (fixed delay; default 1 minute). Run checks once at start.
	// It also sets the staleness limit: once the last successful check is
	// older than 2×Interval the gauges report nothing, and Run raises
	// CheckFailing while its checks keep failing.
	Interval time.Duration
	// CheckTimeout bounds each check's read of the outbox table (the
	// driver's start-up check and Stats) and, separately, SlotCheck
	// (default: Interval, at least 1 s and at most DefaultCheckTimeout,
	// 30 s; it may not exceed 2×Interval, or 1 s for shorter intervals).
	// A read that times out, queued behind a lock (ALTER TABLE, LOCK
	// TABLE, a MySQL metadata lock) or on a connection that no longer
	// answers, fails the check with an error that says so and what to
	// look at, and counts towards CheckFailing like any failed check.
	// Check returns at the deadline even when the driver ignores it; until
	// that abandoned call returns, the next checks fail at once instead of
	// queueing a second statement behind it.
	CheckTimeout time.Duration
	// DatabaseBackoffMax caps the pause of Run after consecutive failed
	// checks (default 30s). The pauses start at Interval (at least
	// 100 ms) and double, jittered; the first successful check resets
	// them. With the default Interval of 1 minute, above the cap, a failed
	// check is simply retried every Interval.
	DatabaseBackoffMax time.Duration
	// StaleAfter is the age after which a pending row counts as stale
	// (default 10 minutes).
	StaleAfter time.Duration
	// Thresholds say when to alert; see Thresholds.
	Thresholds Thresholds

	// SlotCheck, when set, is called on every check with the lag limit
	// (Thresholds.SlotLagBytes, 0 for none) and raises the WALSlot alert
	// while it returns an error, whose text is the alert's message. For
	// sql.wal, pass walrelay.CheckSlot on the relay's slot:
	//
	//	SlotCheck: func(ctx context.Context, max int64) error { return walrelay.CheckSlot(ctx, pool, slot, max) },
	//
	// A function rather than the query itself keeps this package free of
	// the PostgreSQL replication client. It runs within CheckTimeout
	// (a context deadline; a call that outlives it is abandoned and
	// reported as timed out) and its errors never fail the table check.
	SlotCheck func(ctx context.Context, maxLagBytes int64) error

	// OnAlert is called once when a threshold is crossed, not on every
	// check while it stays crossed. It runs on Run's goroutine: it must not
	// block for long.
	OnAlert func(Alert)
	// OnResolve is called once when a crossed threshold clears, with the
	// Alert of the same Kind (Resolved set).
	OnResolve func(Alert)

	// Meter makes the observable gauges (see the package documentation).
	// Default: otel.GetMeterProvider().Meter(MeterName), a no-op unless the
	// application installs a meter provider.
	Meter metric.Meter
	// Attributes are added to every measurement, e.g. the service name
	// when one process watches several outbox tables. The outbox table
	// name is added by itself when the source has a Tables method.
	Attributes []Attribute

	// Logger receives structured logs (default slog.Default()).
	Logger *slog.Logger
}

// Attribute is a string attribute for the monitor's measurements.
type Attribute struct{ Key, Value string }

func (o *Config) setDefaults() {
	if o.Interval == 0 {
		o.Interval = DefaultInterval
	}
	if o.StaleAfter == 0 {
		o.StaleAfter = DefaultStaleAfter
	}
	if o.DatabaseBackoffMax == 0 {
		o.DatabaseBackoffMax = DefaultDatabaseBackoffMax
	}
	if o.CheckTimeout == 0 && o.Interval > 0 {
		o.CheckTimeout = min(max(o.Interval, minCheckTimeout), DefaultCheckTimeout)
	}
	if o.Thresholds.OldestPendingAge == 0 {
		o.Thresholds.OldestPendingAge = o.StaleAfter
	}
	if o.Thresholds.SlotLagBytes == 0 {
		o.Thresholds.SlotLagBytes = DefaultMaxSlotLagBytes
	}
	if o.Meter == nil {
		o.Meter = otel.GetMeterProvider().Meter(MeterName)
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
}

// Validate reports every invalid setting, saying how to fix it. It checks
// the options as given; New applies the defaults first.
func (o Config) Validate() error {
	var errs []error
	if o.Interval <= 0 {
		errs = append(errs, fmt.Errorf("monitor: Config.Interval is %s: use a positive duration (or 0 for %s)", o.Interval, DefaultInterval))
	}
	if o.StaleAfter <= 0 {
		errs = append(errs, fmt.Errorf("monitor: Config.StaleAfter is %s: use a positive duration (or 0 for %s)", o.StaleAfter, DefaultStaleAfter))
	}
	if o.CheckTimeout < 0 || (o.CheckTimeout == 0 && o.Interval > 0) { // its default derives from a valid Interval
		errs = append(errs, fmt.Errorf("monitor: Config.CheckTimeout is %s: use a positive duration (or 0 for Interval, between %s and %s)", o.CheckTimeout, minCheckTimeout, DefaultCheckTimeout))
	} else if limit := max(2*o.Interval, minCheckTimeout); o.Interval > 0 && o.CheckTimeout > limit {
		errs = append(errs, fmt.Errorf("monitor: Config.CheckTimeout (%s) is longer than %s (2×Interval, at least %s): a hung check would hold off check_failing until it times out; lower it, or 0 for the default", o.CheckTimeout, limit, minCheckTimeout))
	}
	if o.DatabaseBackoffMax <= 0 {
		errs = append(errs, fmt.Errorf("monitor: Config.DatabaseBackoffMax is %s: use a positive duration (or 0 for %s)", o.DatabaseBackoffMax, DefaultDatabaseBackoffMax))
	}
	if o.Meter == nil {
		errs = append(errs, errors.New("monitor: Config.Meter is nil: set it, or leave it nil before New to use the global meter provider"))
	}
	if o.Logger == nil {
		errs = append(errs, errors.New("monitor: Config.Logger is nil: set it, or leave it nil before New to use slog.Default()"))
	}
	for _, a := range o.Attributes {
		if a.Key == "" {
			errs = append(errs, errors.New("monitor: Config.Attributes has an empty key: name every attribute"))
			break
		}
	}
	return errors.Join(errs...)
}
