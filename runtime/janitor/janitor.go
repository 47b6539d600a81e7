// Package janitor keeps the outbox table small: it deletes sent rows older
// than the retention (default 7 days), or moves them into an archive table,
// and deletes old inbox (consumer deduplication) rows, so that the hot
// table holds little more than pending and FAILED rows (the seed design's
// "the outbox table must not grow forever").
//
// With the inbox retention it also deletes old rows of the inbox's record
// of duplicate deliveries (<inbox>_duplicate, schema version 2), by
// last_seen_at; on a database still at version 1 that step is skipped.
//
// It never holds long locks: rows go in bounded batches, each one short
// statement (or, for the archive on MySQL and SQLite, one short
// transaction), oldest first, with a pause between batches; a run stops when
// a batch comes back short. Pending and FAILED rows are never removed.
//
// Run cleans on a schedule inside the service; RunOnce cleans once, for a
// Kubernetes CronJob.
package janitor

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/outboxgen/outboxgen/runtime/driver"
	"github.com/outboxgen/outboxgen/runtime/internal/dberr"
	"github.com/outboxgen/outboxgen/runtime/internal/schedule"
	"github.com/outboxgen/outboxgen/runtime/outbox"
)

// Store is what the janitor changes: any driver.Driver.
type Store interface {
	DeleteSent(ctx context.Context, olderThan time.Duration, limit int) (int64, error)
	ArchiveSent(ctx context.Context, archive string, olderThan time.Duration, limit int) (int64, error)
	DeleteInbox(ctx context.Context, olderThan time.Duration, limit int) (int64, error)
}

// DuplicateStore is implemented by stores that also hold the inbox's
// record of duplicate deliveries (every driver.Driver does): the janitor
// deletes its old rows with the inbox retention.
type DuplicateStore interface {
	DeleteInboxDuplicates(ctx context.Context, olderThan time.Duration, limit int) (int64, error)
}

// Target names what a batch cleaned.
type Target string

// The targets.
const (
	// Outbox: sent outbox rows (deleted or archived).
	Outbox Target = "outbox"
	// Inbox: inbox rows.
	Inbox Target = "inbox"
	// InboxDuplicates: rows of the inbox's record of duplicate deliveries.
	InboxDuplicates Target = "inbox_duplicate"
)

// Batch is one batch that removed rows, passed to Config.OnBatch.
type Batch struct {
	Target   Target
	Rows     int64
	Archived bool // the rows were moved into Config.ArchiveTable
}

// Result counts what one run removed.
type Result struct {
	// Sent is the number of sent outbox rows deleted (or archived, when
	// Archived), in SentBatches batches.
	Sent        int64
	SentBatches int
	Archived    bool
	// Inbox is the number of inbox rows deleted, in InboxBatches batches.
	Inbox        int64
	InboxBatches int
	// Duplicates is the number of rows of the duplicate record deleted, in
	// DuplicateBatches batches (0 when the database is at schema version
	// 1, which lacks the table).
	Duplicates       int64
	DuplicateBatches int
	// DuplicatesSkipped says why the duplicate record was skipped this run
	// ("" when it was not): the table is missing (schema version 1) or the
	// janitor may not use it. The record is optional, so this never fails
	// a run.
	DuplicatesSkipped string
}

// Janitor removes old rows. Create it with New. RunOnce may be called
// concurrently (batches of concurrent runs do not wait for each other on
// PostgreSQL, and at worst end a run early elsewhere), but one Run per
// table is all a service needs.
type Janitor struct {
	store Store
	opts  Config
	log   *slog.Logger
	need  dberr.Need // what the janitor needs, for error advice
	runMu sync.Mutex
	// dupSkipLogged is the dberr.Class (+1) for which the skipped
	// duplicate table was last logged; 0: not skipped (or never logged).
	dupSkipLogged atomic.Int32
}

// New returns a janitor for store (a driver.Driver) with opts.
func New(store Store, opts Config) (*Janitor, error) {
	if store == nil {
		return nil, errors.New("janitor: store is nil: pass the outbox's driver.Driver")
	}
	opts.setDefaults()
	if err := opts.Validate(); err != nil {
		return nil, err
	}
	if s, ok := store.(interface{ Schema() outbox.Schema }); ok && opts.ArchiveTable != "" {
		// Only the archive table events.yaml declares (its DDL is
		// generated with the outbox's).
		sc := s.Schema()
		if a := sc.Tables.Archive; a != opts.ArchiveTable {
			src := sc.Source
			if src == "" {
				src = "events.yaml"
			}
			if a == "" {
				return nil, fmt.Errorf("janitor: Config.ArchiveTable is %q, but %s declares no sql.archive_table: declare it there (its DDL comes with the outbox's), regenerate, and pass the generated Schema.Tables.Archive", opts.ArchiveTable, src)
			}
			return nil, fmt.Errorf("janitor: Config.ArchiveTable is %q, but sql.archive_table in %s is %q: pass Schema.Tables.Archive", opts.ArchiveTable, src, a)
		}
	}
	return &Janitor{store: store, opts: opts, log: opts.Logger.With(slog.String("component", "outboxgen.janitor")), need: need(store, opts)}, nil
}

// need says what the janitor needs from the database, for error advice.
func need(store Store, opts Config) dberr.Need {
	outboxT, inboxT := "the outbox table", "the inbox table"
	if t, ok := store.(interface{ Tables() driver.Tables }); ok {
		outboxT, inboxT = t.Tables().Outbox, t.Tables().Inbox
	}
	// PostgreSQL also wants UPDATE: the janitor picks its batches with
	// FOR UPDATE SKIP LOCKED, and any locking read needs it there.
	const del = "SELECT and DELETE (and UPDATE on PostgreSQL)"
	tables, privs := outboxT, del+" on "+outboxT
	if opts.ArchiveTable != "" {
		tables += ", " + opts.ArchiveTable
		privs += ", INSERT on " + opts.ArchiveTable
	}
	if opts.InboxRetention > 0 {
		tables += ", " + inboxT
		privs += ", " + del + " on " + inboxT
		if _, ok := store.(DuplicateStore); ok {
			tables += ", " + inboxT + "_duplicate"
			privs += ", " + del + " on " + inboxT + "_duplicate"
		}
	}
	return dberr.Need{Component: "janitor", Tables: tables, Privileges: privs}
}

// Config returns the options in effect (defaults applied).
func (j *Janitor) Config() Config { return j.opts }

// RunOnce removes sent outbox rows older than Retention, then inbox rows
// older than InboxRetention, in batches, until a batch comes back short or
// ctx is done. It returns what it removed, also on error; errors that
// waiting cannot mend (a missing table, a missing privilege, a read-only
// database) say what to do.
func (j *Janitor) RunOnce(ctx context.Context) (Result, error) {
	res, took, err := j.run(ctx)
	if err != nil && ctx.Err() == nil {
		j.log.ErrorContext(ctx, "janitor run failed", append(resultAttrs(res, took), slog.Any("error", err))...)
	}
	return res, err
}

// run is RunOnce without logging a failure (Run logs it with its retry
// delay).
func (j *Janitor) run(ctx context.Context) (Result, time.Duration, error) {
	var res Result
	res.Archived = j.opts.ArchiveTable != ""
	start := time.Now()
	sent := func(ctx context.Context) (int64, error) {
		if res.Archived {
			return j.store.ArchiveSent(ctx, j.opts.ArchiveTable, j.opts.Retention, j.opts.BatchSize)
		}
		return j.store.DeleteSent(ctx, j.opts.Retention, j.opts.BatchSize)
	}
	var err error
	if c, ok := j.store.(interface {
		Check(context.Context, driver.Table) error
	}); ok {
		// The driver's start-up check (remembered once it passed): the
		// dialect and the columns of the tables this run touches.
		// Not the archive table: the janitor may only INSERT there (a
		// missing one fails the first archive batch, explained).
		err = c.Check(ctx, driver.Outbox)
		if err == nil && j.opts.InboxRetention > 0 {
			err = c.Check(ctx, driver.Inbox)
		}
	}
	if err == nil {
		res.Sent, res.SentBatches, err = j.drain(ctx, Outbox, res.Archived, sent)
	}
	if err == nil && j.opts.InboxRetention > 0 {
		res.Inbox, res.InboxBatches, err = j.drain(ctx, Inbox, false, func(ctx context.Context) (int64, error) {
			return j.store.DeleteInbox(ctx, j.opts.InboxRetention, j.opts.BatchSize)
		})
	}
	if err == nil && j.opts.InboxRetention > 0 {
		res.Duplicates, res.DuplicateBatches, res.DuplicatesSkipped, err = j.duplicates(ctx)
	}
	took := time.Since(start)
	if err != nil {
		if ctx.Err() != nil && errors.Is(err, ctx.Err()) {
			j.log.InfoContext(ctx, "janitor run interrupted", resultAttrs(res, took)...)
		}
		return res, took, dberr.Explain(err, j.need)
	}
	j.log.InfoContext(ctx, "janitor run done", resultAttrs(res, took)...)
	return res, took, nil
}

// duplicates deletes the old rows of the inbox's duplicate record, when
// the store has one and the janitor can use it. The record is optional:
// a missing table (schema version 1) or a missing privilege skips it,
// with the reason returned and logged (once, until it changes), and never
// fails the run.
func (j *Janitor) duplicates(ctx context.Context) (n int64, batches int, skipped string, err error) {
	ds, ok := j.store.(DuplicateStore)
	if !ok {
		return 0, 0, "", nil
	}
	skip := func(err error) string {
		var why string
		switch c := dberr.Classify(err); c {
		case dberr.Missing:
			why = "the inbox's duplicate table is missing (schema version 1); `outboxgen migrate up` adds it"
		case dberr.Denied, dberr.Mismatch:
			why = "the janitor may not use the inbox's duplicate table; grant it " + j.dupPrivileges() + " there (`outboxgen grants` prints every grant)"
		default:
			return ""
		}
		if j.dupSkipLogged.Swap(int32(dberr.Classify(err))+1) != int32(dberr.Classify(err))+1 {
			j.log.WarnContext(ctx, "janitor: duplicate deliveries' record skipped: "+why, slog.Any("error", err))
		}
		return why
	}
	if c, ok := j.store.(interface {
		Check(context.Context, driver.Table) error
	}); ok {
		if err := c.Check(ctx, driver.InboxDuplicates); err != nil {
			if why := skip(err); why != "" {
				return 0, 0, why, nil
			}
			return 0, 0, "", err
		}
	}
	n, batches, err = j.drain(ctx, InboxDuplicates, false, func(ctx context.Context) (int64, error) {
		return ds.DeleteInboxDuplicates(ctx, j.opts.InboxRetention, j.opts.BatchSize)
	})
	if err != nil {
		// Gone since the check passed, a privilege revoked (or a store
		// without Check): a DELETE outside a transaction that failed
		// changed nothing.
		if why := skip(err); why != "" {
			return n, batches, why, nil
		}
		return n, batches, "", err
	}
	if j.dupSkipLogged.Swap(0) != 0 {
		j.log.InfoContext(ctx, "janitor: the inbox's duplicate table is cleaned again")
	}
	return n, batches, "", nil
}

// dupPrivileges names the privileges the janitor needs on the duplicate
// table.
func (j *Janitor) dupPrivileges() string {
	return "SELECT and DELETE (and UPDATE on PostgreSQL)"
}

func resultAttrs(res Result, took time.Duration) []any {
	return []any{
		slog.Int64("sent_rows", res.Sent), slog.Int("sent_batches", res.SentBatches), slog.Bool("archived", res.Archived),
		slog.Int64("inbox_rows", res.Inbox), slog.Int("inbox_batches", res.InboxBatches),
		slog.Int64("duplicate_rows", res.Duplicates), slog.Int("duplicate_batches", res.DuplicateBatches), slog.Duration("took", took),
	}
}

// drain runs batch until one removes fewer than BatchSize rows, pausing
// between batches.
func (j *Janitor) drain(ctx context.Context, target Target, archived bool, batch func(context.Context) (int64, error)) (total int64, batches int, err error) {
	var timer *time.Timer
	defer func() {
		if timer != nil {
			timer.Stop()
		}
	}()
	for {
		if err := ctx.Err(); err != nil {
			return total, batches, fmt.Errorf("janitor: %s: %w", target, err)
		}
		n, err := batch(ctx)
		if err != nil {
			return total, batches, fmt.Errorf("janitor: %s: %w", target, err)
		}
		if n > 0 {
			total += n
			batches++
			j.log.DebugContext(ctx, "janitor batch", slog.String("target", string(target)), slog.Int64("rows", n), slog.Bool("archived", archived))
			if j.opts.OnBatch != nil {
				j.opts.OnBatch(Batch{Target: target, Rows: n, Archived: archived})
			}
		}
		if n < int64(j.opts.BatchSize) {
			return total, batches, nil
		}
		if j.opts.BatchPause > 0 {
			if timer == nil {
				timer = time.NewTimer(j.opts.BatchPause)
			} else {
				timer.Reset(j.opts.BatchPause)
			}
			select {
			case <-ctx.Done():
				return total, batches, fmt.Errorf("janitor: %s: %w", target, ctx.Err())
			case <-timer.C:
			}
		}
	}
}

// Run cleans at once and then every Interval after the previous run ended
// (fixed delay) until ctx is done; it then returns nil. A failed run is
// logged and retried after a pause that grows from Interval (at least
// 100 ms), doubling up to DatabaseBackoffMax if that is longer, and resets
// at the first successful run. A missing table or a missing privilege in
// the first run ends Run with that error (also logged) unless a run has
// succeeded before: a deployment mistake that waiting does not mend. Run
// one Run per Janitor at a time.
func (j *Janitor) Run(ctx context.Context) error {
	if !j.runMu.TryLock() {
		return errors.New("janitor: Run is already running on this Janitor: run one Run per Janitor")
	}
	defer j.runMu.Unlock()
	j.log.InfoContext(ctx, "janitor started", slog.Duration("interval", j.opts.Interval), slog.Duration("retention", j.opts.Retention),
		slog.Duration("inbox_retention", j.opts.InboxRetention), slog.String("archive_table", j.opts.ArchiveTable), slog.Int("batch_size", j.opts.BatchSize))
	var last Result
	var took time.Duration
	err := schedule.FixedDelay{
		Interval:   j.opts.Interval,
		BackoffMax: j.opts.DatabaseBackoffMax,
		OnError: func(ctx context.Context, err error, failures int, retryIn time.Duration) {
			j.log.ErrorContext(ctx, "janitor run failed", append(resultAttrs(last, took), slog.Any("error", err),
				slog.Int("consecutive_failures", failures), slog.Duration("retry_in", retryIn))...)
		},
		OnRecover: func(ctx context.Context, failures int) {
			j.log.InfoContext(ctx, "janitor run succeeded again", slog.Int("failed_runs", failures))
		},
		FatalAtStart: dberr.FatalAtStart,
		OnFatal: func(ctx context.Context, err error) {
			j.log.ErrorContext(ctx, "janitor not started: its tables are not usable", slog.Any("error", err))
		},
	}.Run(ctx, func(ctx context.Context) error {
		var err error
		last, took, err = j.run(ctx)
		return err
	})
	if err != nil {
		return err
	}
	j.log.Info("janitor stopped")
	return nil
}
