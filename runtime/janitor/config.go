package janitor

import (
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/outboxgen/outboxgen/runtime/dialect"
	"github.com/outboxgen/outboxgen/runtime/internal/backoff"
)

// Defaults of Config.
const (
	DefaultInterval       = time.Hour
	DefaultRetention      = 7 * 24 * time.Hour
	DefaultInboxRetention = 7 * 24 * time.Hour
	DefaultBatchSize      = 1000
	DefaultBatchPause     = 100 * time.Millisecond
	// DefaultDatabaseBackoffMax caps the pause of Run after consecutive
	// failed runs (see Config.DatabaseBackoffMax).
	DefaultDatabaseBackoffMax = backoff.DefaultMax
	// MaxBatchSize bounds BatchSize, so that one statement never holds
	// many row locks for long.
	MaxBatchSize = 10000
)

// Config configure a Janitor. The zero value of every field means "use
// the default".
type Config struct {
	// Interval is the delay between the end of one run and the start of
	// the next (fixed delay; default 1 hour). Run cleans once at start.
	Interval time.Duration

	// DatabaseBackoffMax caps the pause of Run after consecutive failed
	// runs (default 30s). The pauses start at Interval (at least 100 ms)
	// and double, jittered; the first successful run resets them. With
	// the default Interval of 1 hour, above the cap, a failed run is
	// simply retried every Interval.
	DatabaseBackoffMax time.Duration

	// Retention is how long sent rows stay in the outbox table after
	// sent_at (default 7 days). Pending and FAILED rows are never removed,
	// whatever their age.
	Retention time.Duration
	// ArchiveTable, when set, names a table with the outbox layout (see
	// templates) that sent rows are moved into instead of being deleted.
	ArchiveTable string

	// InboxRetention is how long inbox rows (consumer deduplication
	// records) stay after processed_at (default 7 days). It must exceed
	// the longest time a broker may redeliver a message, or a late
	// duplicate is handled twice. Negative: never delete inbox rows. The
	// inbox's stale-guard table (one row per key) is never touched.
	InboxRetention time.Duration

	// BatchSize is the most rows one statement (one short transaction)
	// removes (default 1000, at most 10000). A run repeats batches until
	// one comes back short.
	BatchSize int
	// BatchPause is the pause between batches, so the janitor never
	// starves the writers and the relay (default 100ms; negative: none).
	BatchPause time.Duration

	// OnBatch, if set, is called after every batch that removed rows, on
	// the janitor's goroutine.
	OnBatch func(Batch)

	// Logger receives structured logs (default slog.Default()).
	Logger *slog.Logger
}

func (o *Config) setDefaults() {
	if o.Interval == 0 {
		o.Interval = DefaultInterval
	}
	if o.Retention == 0 {
		o.Retention = DefaultRetention
	}
	if o.DatabaseBackoffMax == 0 {
		o.DatabaseBackoffMax = DefaultDatabaseBackoffMax
	}
	if o.InboxRetention == 0 {
		o.InboxRetention = DefaultInboxRetention
	}
	if o.BatchSize == 0 {
		o.BatchSize = DefaultBatchSize
	}
	if o.BatchPause == 0 {
		o.BatchPause = DefaultBatchPause
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
		errs = append(errs, fmt.Errorf("janitor: Config.Interval is %s: use a positive duration (or 0 for %s)", o.Interval, DefaultInterval))
	}
	if o.DatabaseBackoffMax <= 0 {
		errs = append(errs, fmt.Errorf("janitor: Config.DatabaseBackoffMax is %s: use a positive duration (or 0 for %s)", o.DatabaseBackoffMax, DefaultDatabaseBackoffMax))
	}
	if o.Retention <= 0 {
		errs = append(errs, fmt.Errorf("janitor: Config.Retention is %s: use a positive duration (or 0 for %s); to keep sent rows forever, do not run the janitor", o.Retention, DefaultRetention))
	}
	if o.InboxRetention == 0 {
		errs = append(errs, fmt.Errorf("janitor: Config.InboxRetention is 0: use a positive duration, a negative one to keep inbox rows, or leave it 0 before New for %s", DefaultInboxRetention))
	}
	if o.ArchiveTable != "" {
		if err := dialect.CheckIdentifier("janitor: Config.ArchiveTable", o.ArchiveTable); err != nil {
			errs = append(errs, err)
		}
	}
	if o.BatchSize < 1 || o.BatchSize > MaxBatchSize {
		errs = append(errs, fmt.Errorf("janitor: Config.BatchSize is %d: use 1 to %d (or 0 for %d)", o.BatchSize, MaxBatchSize, DefaultBatchSize))
	}
	if o.BatchPause == 0 {
		errs = append(errs, fmt.Errorf("janitor: Config.BatchPause is 0: use a positive duration, a negative one for no pause, or leave it 0 before New for %s", DefaultBatchPause))
	}
	if o.Logger == nil {
		errs = append(errs, errors.New("janitor: Config.Logger is nil: set it, or leave it nil before New to use slog.Default()"))
	}
	return errors.Join(errs...)
}
