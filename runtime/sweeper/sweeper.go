// Package sweeper is the seed design's compensation job: it publishes the
// outbox rows the relays left behind, such as rows written while no relay
// ran (the relay process was stopped, crashed, or stuck in a long pause),
// and rows whose lease expired because the relay holding them died.
//
// A sweeper claims only rows that are overdue (created at least
// OverdueAfter ago) and claimable: pending, due (a row backing off keeps
// its backoff) and not under a live lease. Everything else about it is a
// relay's: it claims with the same SKIP LOCKED and lease, keeps per-key
// order, publishes through the same watermill publisher, and records
// results the same way (retry_count, backoff, FAILED after MaxAttempts).
// Relays and sweepers can therefore run side by side on one table, any
// number of each: a row is leased to one of them at a time.
//
// Run it in process on its own schedule:
//
//	s, err := sweeper.New(drv, sweeper.Config{Publisher: pub})
//	go s.Run(ctx) // every Interval (fixed delay)
//
// or once per invocation, from a Kubernetes CronJob:
//
//	n, err := s.RunOnce(ctx)
package sweeper

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"

	"github.com/outboxgen/outboxgen/runtime/driver"
	"github.com/outboxgen/outboxgen/runtime/internal/dberr"
	"github.com/outboxgen/outboxgen/runtime/internal/instanceid"
	"github.com/outboxgen/outboxgen/runtime/internal/schedule"
	"github.com/outboxgen/outboxgen/runtime/outbox"
	"github.com/outboxgen/outboxgen/runtime/relay"
)

// Defaults of Config.
const (
	DefaultOverdueAfter = time.Minute
	DefaultInterval     = time.Minute
)

// Config configures a Sweeper. The zero value of every field but
// Publisher means "use the default"; fields shared with relay.Config
// have the relay's defaults.
type Config struct {
	// Publisher receives every rescued event. Required.
	Publisher message.Publisher

	// OverdueAfter is the age (by the database clock) from which a pending
	// row counts as stuck (default 1 minute). Younger rows are left to
	// the relays. Keep it well above the relays' PollInterval, so that a
	// healthy relay normally gets there first.
	OverdueAfter time.Duration

	// Interval is the delay between the end of one sweep and the start of
	// the next in Run (fixed delay; default 1 minute).
	Interval time.Duration

	// EventTypes, BatchSize, LeaseDuration, Concurrency, MaxAttempts,
	// Backoff, ShutdownTimeout, PublishTimeout, BreakerBackoff,
	// HoldRecheck, Hedge, HedgeAfter and OnFailed work as in
	// relay.Config.
	EventTypes      []outbox.EventType
	BatchSize       int
	LeaseDuration   time.Duration
	Concurrency     int
	MaxAttempts     int
	Backoff         func(attempt int) time.Duration
	ShutdownTimeout time.Duration
	PublishTimeout  time.Duration
	BreakerBackoff  func(n int) time.Duration
	HoldRecheck     time.Duration
	Hedge           bool
	HedgeAfter      time.Duration
	OnFailed        func(relay.FailedEvent)

	// InstanceID names the sweeper in lease_owner and logs (default
	// sweeper-hostname-pid-random; at most 64 bytes).
	InstanceID string

	// DatabaseBackoffMax caps the pause of Run after consecutive failed
	// sweeps (default 30s; see relay.Config.DatabaseBackoffMax). The
	// pauses start at Interval (at least 100 ms) and double; with the
	// default Interval of 1 minute, above the cap, a failed sweep is
	// simply retried every Interval.
	DatabaseBackoffMax time.Duration

	// Logger receives structured logs (default slog.Default()).
	Logger *slog.Logger

	// TracerProvider and MeterProvider go to the sweeper's relay (see
	// relay.Config): its publishes are traced like the relay's (with
	// outboxgen.sweeper=true) and counted in the relay's metrics and in
	// outboxgen.sweeper.rescued. Default: the global providers.
	TracerProvider trace.TracerProvider
	MeterProvider  metric.MeterProvider
}

// setDefaults fills the zero fields the sweeper itself uses; relay.New
// fills the shared ones.
func (o *Config) setDefaults() {
	if o.OverdueAfter == 0 {
		o.OverdueAfter = DefaultOverdueAfter
	}
	if o.Interval == 0 {
		o.Interval = DefaultInterval
	}
	if o.DatabaseBackoffMax == 0 {
		o.DatabaseBackoffMax = relay.DefaultDatabaseBackoffMax
	}
	if o.InstanceID == "" {
		o.InstanceID = instanceid.New("sweeper-", "host")
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
}

// Validate reports every invalid setting of the sweeper's own fields,
// joined, each saying how to fix it (New also has relay.New check the
// shared ones). Zero values are valid: New fills in the defaults.
func (o Config) Validate() error {
	var errs []error
	if o.OverdueAfter < 0 {
		errs = append(errs, fmt.Errorf("sweeper: Config.OverdueAfter is %s: use a positive duration (or 0 for %s)", o.OverdueAfter, DefaultOverdueAfter))
	}
	if o.Interval < 0 {
		errs = append(errs, fmt.Errorf("sweeper: Config.Interval is %s: use a positive duration (or 0 for %s)", o.Interval, DefaultInterval))
	}
	if o.DatabaseBackoffMax < 0 {
		errs = append(errs, fmt.Errorf("sweeper: Config.DatabaseBackoffMax is %s: use a positive duration (or 0 for %s)", o.DatabaseBackoffMax, relay.DefaultDatabaseBackoffMax))
	}
	return errors.Join(errs...)
}

// Sweeper rescues overdue outbox rows. Create it with New.
type Sweeper struct {
	relay      *relay.Relay
	interval   time.Duration
	backoffMax time.Duration
	overdue    time.Duration
	log        *slog.Logger
}

// New returns a sweeper over the outbox table of drv. opts is completed
// with defaults and validated.
func New(drv driver.Driver, opts Config) (*Sweeper, error) {
	if drv == nil {
		return nil, errors.New("sweeper: driver is nil: pass sqldriver.New(db, events.Schema) or pgxdriver.New(pool, events.Schema)")
	}
	opts.setDefaults()
	if err := opts.Validate(); err != nil {
		return nil, err
	}
	log := opts.Logger.With(slog.String("component", "sweeper"))
	r, err := relay.New(drv, relay.Config{
		Publisher:          opts.Publisher,
		EventTypes:         opts.EventTypes,
		BatchSize:          opts.BatchSize,
		PollInterval:       opts.Interval,
		LeaseDuration:      opts.LeaseDuration,
		Concurrency:        opts.Concurrency,
		MaxAttempts:        opts.MaxAttempts,
		Backoff:            opts.Backoff,
		ShutdownTimeout:    opts.ShutdownTimeout,
		PublishTimeout:     opts.PublishTimeout,
		BreakerBackoff:     opts.BreakerBackoff,
		HoldRecheck:        opts.HoldRecheck,
		Hedge:              opts.Hedge,
		HedgeAfter:         opts.HedgeAfter,
		DatabaseBackoffMax: opts.DatabaseBackoffMax,
		InstanceID:         opts.InstanceID,
		OverdueAfter:       opts.OverdueAfter,
		OnFailed:           opts.OnFailed,
		Logger:             log,
		TracerProvider:     opts.TracerProvider,
		MeterProvider:      opts.MeterProvider,
	})
	if err != nil {
		return nil, fmt.Errorf("sweeper: %w", err)
	}
	return &Sweeper{relay: r, interval: opts.Interval, backoffMax: opts.DatabaseBackoffMax, overdue: opts.OverdueAfter, log: log}, nil
}

// RunOnce sweeps once: it publishes every overdue claimable row, batch
// after batch, until none is left, and returns how many it published.
// Rows whose publish fails are recorded with their backoff and left for a
// later sweep. When ctx is done it finishes the batch in hand and returns
// ctx's error; a database error ends the sweep and is returned.
func (s *Sweeper) RunOnce(ctx context.Context) (int, error) {
	n, err := s.relay.RunOnce(ctx)
	if n > 0 {
		// Rows the relays should have published: worth an operator's look.
		s.log.WarnContext(ctx, "sweeper published overdue events", slog.Int("published", n), slog.Duration("overdue_after", s.overdue))
	}
	return n, err
}

// Run sweeps every Interval (fixed delay: the next sweep starts Interval
// after the previous one ended) until ctx is done, then returns nil after
// recording the batch in hand. A failed sweep (a database error) is logged
// and retried after a pause that grows from Interval (at least 100 ms),
// doubling up to DatabaseBackoffMax if that is longer, and resets at the
// first successful sweep. A missing table or column or a missing privilege
// before the first successful sweep ends Run with that error (also
// logged): a deployment mistake that waiting does not mend (see relay.Run).
func (s *Sweeper) Run(ctx context.Context) error {
	s.log.InfoContext(ctx, "sweeper started", slog.Duration("interval", s.interval), slog.Duration("overdue_after", s.overdue))
	err := schedule.FixedDelay{
		Interval:   s.interval,
		BackoffMax: s.backoffMax,
		OnError: func(ctx context.Context, err error, failures int, retryIn time.Duration) {
			s.log.ErrorContext(ctx, "sweep failed", slog.Any("error", err), slog.Int("consecutive_failures", failures), slog.Duration("retry_in", retryIn))
		},
		OnRecover: func(ctx context.Context, failures int) {
			s.log.InfoContext(ctx, "sweep succeeded again", slog.Int("failed_sweeps", failures))
		},
		FatalAtStart: dberr.FatalAtStart,
		OnFatal: func(ctx context.Context, err error) {
			s.log.ErrorContext(ctx, "sweeper not started: the outbox table is not usable", slog.Any("error", err))
		},
	}.Run(ctx, func(ctx context.Context) error {
		_, err := s.RunOnce(ctx)
		return err
	})
	if err != nil {
		return fmt.Errorf("sweeper: %w", err)
	}
	s.log.Info("sweeper stopped")
	return nil
}
