// Package inbox runs outboxgen consumers: watermill handlers that make an
// at-least-once delivery take effect exactly once.
//
// Every delivery runs in one local transaction:
//
//  1. insert (consumer, event_id, event type, key) into the inbox table;
//     when the row exists the event was handled already: count it in the
//     inbox's duplicate table (<inbox>_duplicate, schema version 2; see
//     below), commit, ack, skip (counted as "duplicate"), unless the
//     recorded event type or key differs from the delivery's: then another
//     event reuses the id, and the delivery is a permanent failure
//     (ReusedEventIDError) instead of being dropped;
//  2. for events marked latest_only, advance the stale guard (the newest
//     outbox sequence applied per consumer, event type and key); an older
//     event is skipped (counted as "stale") — its inbox row is kept;
//  3. decode the payload (checking its version) and call the typed handler
//     with the transaction, then commit and ack.
//
// Any error rolls back the handler's writes and the inbox row together, so
// the retry or redelivery runs again from scratch. The handler may write
// follow-up events with the generated InsertX(ctx, tx, ...): they commit or
// roll back with it.
//
// Failures: each delivery is tried Config.MaxAttempts times in-process
// (watermill's Retry middleware) and then goes to the poison topic
// (watermill's PoisonQueue middleware, which wraps Retry). Permanent
// failures — an undecodable payload, an unknown payload version, malformed
// outbox metadata, an event id, event type or key that cannot fit the inbox
// table (see MaxEventIDLen, MaxTypeLen, MaxKeyLen; checked before any SQL),
// an event id reused by another event, errors wrapped with Permanent — skip
// the retries. A panic in a handler is recovered and treated as an error;
// its stack trace is logged at ERROR, and the error (and so the poison
// reason, metadata "reason_poisoned") is one line of at most MaxReasonLen
// bytes.
//
// Conflicts: when the database rolls a delivery's transaction back as a
// deadlock victim or serialization failure (PostgreSQL 40P01, 40001;
// MySQL/MariaDB 1213, MariaDB 1020), whether the inbox's own statements
// (concurrent deliveries of one key can deadlock on the inbox tables),
// the handler's or the commit hit it, the whole transaction (inbox record,
// stale guard, handler) runs again at once, after a few random
// milliseconds, up to 5 times in all. These runs are not attempts of the
// message: they never count toward MaxAttempts (each is counted with
// outcome "conflict" and logged at INFO). A conflict that persists beyond
// them is handled as an infrastructure failure (below, error class
// "conflict"), never poisoned. The handler's writes in the transaction
// were rolled back with it; a handler's effects outside the transaction
// (a call to another service, say) happen again, as they do for any
// retry or redelivery: consumers are at-least-once for those, and such
// effects must be idempotent.
//
// Infrastructure failures are the database's fault, not the message's: the
// database is unreachable or the connection was lost, the user lacks a
// privilege, a table is missing, the database is out of resources,
// shutting down, read-only or locked (SQLITE_BUSY), a statement timed out
// (context.DeadlineExceeded, or the server's statement_timeout,
// lock_timeout, innodb_lock_wait_timeout, max_execution_time or
// max_statement_time), or conflicts persist (above). They are recognised
// by driver error code (PostgreSQL SQLSTATE classes 08, 28, 53, 57P, 58
// and 42501, 42P01, 42703, 3D000, 3F000, 25006, 57014, 55P03, 40P01,
// 40001; MySQL/MariaDB 1044, 1045, 1049, 1054, 1142, 1143, 1146, 1205,
// 1213, 1290, 1969, 2002, 2006, 2013, 3024 and others; SQLite BUSY,
// READONLY, PERM, IOERR, FULL, "no such table") or as driver.ErrBadConn,
// net errors and the like, whether the inbox's own statements or the
// handler's hit them (a handler error must wrap the driver's error with %w
// to be recognised). Such a delivery is rolled back and tried again, with the
// Config's backoff (RetryInitialInterval doubling up to RetryMaxInterval),
// until it gets through or the router stops (then it is nacked); these
// attempts do not count toward MaxAttempts and the message is never
// poisoned for them. Each one is logged at ERROR with the error class and
// what to do, and counted with outcome "infrastructure" (SQLITE_BUSY: at
// INFO, outcome "busy"). A consumer whose table is missing or whose
// privileges are wrong therefore stops and alerts rather than poisoning
// valid messages, and carries on once the schema is applied or the
// privilege granted. Errors wrapped with Permanent stay permanent. A
// failure while the message's context is done (the router stopping) is
// put down to the stop, whatever the driver reports it as (a cancelled
// PostgreSQL statement is 57014, like a statement_timeout): the message
// is nacked, not retried, not logged as a database failure, never
// poisoned, and counted with outcome "stopped" (as is a delivery given
// back while it waited out a database failure).
//
// Duplicates: a duplicate delivery is recorded in the inbox's duplicate
// table (<inbox>_duplicate: per consumer and event, how many times, first
// and last seen), in a transaction of its own after the duplicate's
// (which changes nothing) committed, so that operators see which events
// were delivered again (the console, admin.Admin's RecentDuplicates). A
// first delivery never touches it. Recording duplicates is optional: it
// never fails or stalls a delivery. The table comes with schema version 2
// (`outboxgen migrate up`), and the consumer's database user needs
// SELECT, INSERT and UPDATE on it (`outboxgen grants`); while the table
// is missing, or the user may not read or write it, duplicates are
// skipped as before and not recorded, which is logged (at ERROR, with
// what to do) once per change, and the table is looked at again at most
// once a minute, so a migration or a grant takes effect without a
// restart. Whether the table can be read is checked when the router
// starts (with the inbox table, but never refusing to start), or before
// a delivery, never by a statement inside a delivery's transaction
// (which would abort it on PostgreSQL).
package inbox

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"runtime/debug"
	"strings"
	"sync"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/message/router/middleware"
	"go.opentelemetry.io/otel/attribute"

	"github.com/outboxgen/outboxgen/runtime/dialect"
	"github.com/outboxgen/outboxgen/runtime/internal/dberr"
	"github.com/outboxgen/outboxgen/runtime/internal/errtext"
	"github.com/outboxgen/outboxgen/runtime/outbox"
	"github.com/outboxgen/outboxgen/runtime/redact"
)

// Sizes of the inbox columns (the DDL in templates/), in characters. A
// message whose values exceed them can never be recorded: it is a permanent
// failure, poisoned at once without touching the database.
const (
	// MaxEventIDLen is the size of event_id (outbox metadata "outbox_event_id",
	// or the message UUID).
	MaxEventIDLen = dialect.MaxInboxEventIDLen
	// MaxTypeLen is the size of biz_type (the event type; routes are checked
	// at registration).
	MaxTypeLen = dialect.MaxTypeLen
	// MaxKeyLen is the size of biz_id (outbox metadata "outbox_key").
	MaxKeyLen = dialect.MaxKeyLen
)

// ErrPermanent is matched (errors.Is) by failures that no retry can fix;
// such messages go to the poison topic at once. Decode errors
// (outbox.ErrUndecodable, outbox.ErrInvalidEvent) and malformed metadata are
// permanent; a handler marks its own with Permanent.
var ErrPermanent = errors.New("permanent failure")

type permanentError struct{ err error }

func (e *permanentError) Error() string        { return "inbox: permanent failure: " + e.err.Error() }
func (e *permanentError) Unwrap() error        { return e.err }
func (e *permanentError) Is(target error) bool { return target == ErrPermanent }

// Permanent marks err as permanent: the message skips the remaining attempts
// and goes to the poison topic. Permanent(nil) is nil.
func Permanent(err error) error {
	if err == nil || errors.Is(err, ErrPermanent) {
		return err
	}
	return &permanentError{err: err}
}

// Route is one event type a consumer handles; build it with On or OnLatest.
// T is the transaction type handed to the handler (*sql.Tx or pgx.Tx).
type Route[T any] struct {
	// Type is the event type (outbox metadata "outbox_type").
	Type string
	// Topic is the topic the event arrives on.
	Topic string
	// LatestOnly switches the stale guard on for this event.
	LatestOnly bool

	call func(ctx context.Context, tx T, payload []byte, m outbox.Meta) error
}

// On routes events of eventType, arriving on topic, through decode to
// handle. decode is the generated DecodeX; its errors are permanent.
func On[T, E any](eventType, topic string, decode func(payload []byte, version int) (E, error), handle func(ctx context.Context, tx T, e E, m outbox.Meta) error) Route[T] {
	return Route[T]{
		Type:  eventType,
		Topic: topic,
		call: func(ctx context.Context, tx T, payload []byte, m outbox.Meta) error {
			e, err := decode(payload, m.Version)
			if err != nil {
				return Permanent(err)
			}
			return handle(ctx, tx, e, m)
		},
	}
}

// OnLatest is On with the stale guard: an event whose outbox sequence is not
// newer than the newest one applied for its key (per consumer and event
// type) is skipped. Right for state events, where each event carries the
// whole new state and the last writer wins; wrong for deltas (an increment,
// an appended line), where skipping an older event loses its change.
// Events without sequence or key metadata are permanent failures.
func OnLatest[T, E any](eventType, topic string, decode func(payload []byte, version int) (E, error), handle func(ctx context.Context, tx T, e E, m outbox.Meta) error) Route[T] {
	r := On(eventType, topic, decode, handle)
	r.LatestOnly = true
	return r
}

// Consumer names a consumer and lists the events it handles.
type Consumer[T any] struct {
	// Name is stored in the inbox table's consumer column: deliveries are
	// deduplicated per consumer. Changing it makes every event new again.
	Name   string
	Routes []Route[T]
}

// Store is the transactional database a consumer runs on. SQLStore adapts a
// *sql.DB; package pgxinbox adapts a pgx pool.
type Store[T any] interface {
	Begin(ctx context.Context) (T, error)
	// Exec runs a statement in tx and returns the affected-row count.
	Exec(ctx context.Context, tx T, query string, args ...any) (int64, error)
	// QueryRow runs a query returning at most one row in tx and scans it
	// into dest; found is false (and err nil) when there is no row. The
	// inbox uses it after a duplicate only, to compare the recorded event
	// type and key with the delivery's.
	QueryRow(ctx context.Context, tx T, query string, args []any, dest ...any) (found bool, err error)
	Commit(ctx context.Context, tx T) error
	// Rollback ends tx; it must be harmless after a failed Commit.
	Rollback(ctx context.Context, tx T) error
}

// Register adds the consumer's handlers to r, one per topic, reading from
// sub, on database db. See RegisterStore.
//
// MySQL/MariaDB: db's DSN must not set clientFoundRows=true, or duplicates
// are handled again (silently: this cannot be detected from db). SQLite:
// db's DSN needs a busy timeout and _txlock=immediate. See the package
// documentation, "Database requirements".
func Register(r *message.Router, sub message.Subscriber, db *sql.DB, c Consumer[*sql.Tx], cfg Config) error {
	if db == nil {
		return errors.New("inbox: nil *sql.DB")
	}
	if len(cfg.Schema.Dialects) > 0 && cfg.Dialect == "" {
		// The dialect is the database's, and events.yaml must list it.
		d, err := cfg.Schema.DialectOf(db)
		if err != nil {
			return fmt.Errorf("inbox: consumer %s: %w (for a wrapping driver, set Config.Dialect to outbox.SQLite, say)", c.Name, err)
		}
		cfg.Dialect = d
	}
	return RegisterStore(r, sub, SQLStore{DB: db}, c, cfg)
}

// RegisterStore adds the consumer's handlers to r: one watermill handler per
// topic, named "<consumer>/<topic>", each wrapped (handler-level middleware)
// in PoisonQueue around Retry. Router-level middleware added before it runs
// outside those. When r is already running, call r.RunHandlers afterwards.
func RegisterStore[T any](r *message.Router, sub message.Subscriber, s Store[T], c Consumer[T], cfg Config) error {
	if r == nil || sub == nil || s == nil {
		return errors.New("inbox: router, subscriber and store must not be nil")
	}
	if c.Name == "" || len(c.Name) > 64 {
		return fmt.Errorf("inbox: consumer name %q must have 1 to 64 characters", c.Name)
	}
	if len(c.Routes) == 0 {
		return fmt.Errorf("inbox: consumer %s has no routes", c.Name)
	}
	o := cfg
	o.setDefaults(c.Name)
	if err := o.Validate(); err != nil {
		return err
	}
	logger := r.Logger()
	if o.Logger != nil {
		logger = watermill.NewSlogLogger(o.Logger)
	}
	q, err := dialect.NewInboxQueries(o.Dialect, o.InboxTable)
	if err != nil {
		return err
	}
	in, err := newInstruments(o, sub)
	if err != nil {
		return fmt.Errorf("inbox: instruments: %w", err)
	}

	byTopic := map[string]map[string]Route[T]{}
	var topics []string
	for _, rt := range c.Routes {
		if rt.Type == "" || rt.Topic == "" || rt.call == nil {
			return fmt.Errorf("inbox: consumer %s: route %q on topic %q is incomplete: build routes with inbox.On", c.Name, rt.Type, rt.Topic)
		}
		if n := utf8.RuneCountInString(rt.Type); n > MaxTypeLen {
			return fmt.Errorf("inbox: consumer %s: event type %q has %d characters; the inbox table's biz_type holds %d", c.Name, rt.Type, n, MaxTypeLen)
		}
		if byTopic[rt.Topic] == nil {
			byTopic[rt.Topic] = map[string]Route[T]{}
			topics = append(topics, rt.Topic)
		}
		if _, dup := byTopic[rt.Topic][rt.Type]; dup {
			return fmt.Errorf("inbox: consumer %s routes event type %s twice", c.Name, rt.Type)
		}
		byTopic[rt.Topic][rt.Type] = rt
	}

	var mws []message.HandlerMiddleware
	if !o.NoPoisonQueue {
		poison, err := middleware.PoisonQueueWithFilter(o.PoisonPublisher, o.PoisonTopic, func(err error) bool {
			// A shutdown, or a database that failed (and was still failing
			// when the wait for it ended), is not the message's fault:
			// nack, redeliver later.
			return !errors.Is(err, context.Canceled) && !isInfrastructure(err)
		})
		if err != nil {
			return fmt.Errorf("inbox: %w", err)
		}
		mws = append(mws, poison)
	}
	// Retry is added after PoisonQueue, so it runs inside it (watermill runs
	// the first added middleware outermost): the poison queue sees only the
	// error of the last attempt. The other order would poison every message
	// after its first failure and never retry.
	mws = append(mws, middleware.Retry{
		MaxRetries:      o.MaxAttempts - 1,
		InitialInterval: o.RetryInitialInterval,
		MaxInterval:     o.RetryMaxInterval,
		Multiplier:      2,
		ShouldRetry: func(p middleware.RetryParams) bool {
			// Infrastructure failures were retried in the handler already,
			// until the message's context ended.
			return !errors.Is(p.Err, ErrPermanent) && !errors.Is(p.Err, context.Canceled) && !isInfrastructure(p.Err)
		},
		Logger: logger,
	}.Middleware)

	latest := false
	for _, rt := range c.Routes {
		latest = latest || rt.LatestOnly
	}
	dups := &dupRecorder{consumer: c.Name, table: q.DuplicateTable(), logger: logger}
	// The start-up check: when the router starts, the inbox table (and the
	// stale-guard table) must exist with every column, or Router.Run fails
	// with what to do, instead of every delivery failing later.
	r.AddPlugin(func(*message.Router) error {
		ctx, cancel := context.WithTimeout(context.Background(), startCheckTimeout)
		defer cancel()
		if err := checkTables(ctx, s, q, o.Schema, c.Name, latest); err != nil {
			return err
		}
		return probeDuplicates(ctx, s, dups)
	})

	for _, topic := range topics {
		h := &handler[T]{
			name: c.Name, store: s, q: q, routes: byTopic[topic], in: in, dups: dups,
			backoff: o.RetryInitialInterval, maxBackoff: o.RetryMaxInterval,
			logger: logger,
		}
		wh := r.AddConsumerHandler(c.Name+"/"+topic, topic, sub, h.handle)
		// The span middleware runs outermost: one span per delivery,
		// around every attempt and the poison queue.
		wh.AddMiddleware(append([]message.HandlerMiddleware{in.middleware(c.Name, topic)}, mws...)...)
	}
	return nil
}

// startCheckTimeout bounds the start-up check of the inbox tables.
const startCheckTimeout = 30 * time.Second

// checkTables reads no row of the inbox table (and, with latest, of the
// stale-guard table) with every column the consumer uses. A missing table
// or column, or a missing privilege, is returned explained; any other
// error (the database is not up yet) is left to the deliveries, which wait
// for it.
func checkTables[T any](ctx context.Context, s Store[T], q *dialect.InboxQueries, schema outbox.Schema, consumer string, latest bool) error {
	source := schema.Source
	if source == "" {
		source = "events.yaml"
	}
	type check struct {
		table string
		cols  []string
	}
	// The server must speak the dialect the consumer's SQL is written in:
	// else every delivery would fail, and be poisoned, on a syntax error.
	text := func(ctx context.Context, query string) (string, error) {
		tx, err := s.Begin(ctx)
		if err != nil {
			return "", err
		}
		defer s.Rollback(context.WithoutCancel(ctx), tx) //nolint:errcheck // read-only
		var v string
		found, err := s.QueryRow(ctx, tx, query, nil, &v)
		if err == nil && !found {
			err = errors.New("no row")
		}
		return v, err
	}
	got, err := dialect.ServerDialect(ctx, q.Dialect(), text)
	if err != nil {
		return fatalOnly(err, consumer, q.Table())
	}
	if got != q.Dialect() {
		server := string(got)
		if server == "" {
			server = "none outboxgen knows"
		}
		return &dberr.Error{Class: dberr.Mismatch, Err: fmt.Errorf("inbox: consumer %s: its SQL is %s, but the database is %s", consumer, q.Dialect(), server),
			Advice: "set Config.Dialect to the database's dialect (or leave it empty to take it from the *sql.DB's driver), or connect to the database you meant"}
	}
	checks := []check{{q.Table(), dialect.InboxColumns}}
	if latest {
		checks = append(checks, check{q.KeyTable(), dialect.InboxKeyColumns})
	}
	tx, err := s.Begin(ctx)
	if err != nil {
		return fatalOnly(err, consumer, q.Table())
	}
	defer s.Rollback(context.WithoutCancel(ctx), tx) //nolint:errcheck // read-only
	for _, c := range checks {
		dest := make([]any, len(c.cols))
		for i := range dest {
			dest[i] = new(any)
		}
		if _, err := s.QueryRow(ctx, tx, dialect.SelectColumns(c.table, c.cols), nil, dest...); err != nil {
			err = fmt.Errorf("inbox: consumer %s: check table %s: %w", consumer, c.table, err)
			if dberr.Classify(err) == dberr.Missing {
				return &dberr.Error{Class: dberr.Missing, Err: err, Advice: fmt.Sprintf(
					"table %q (from sql.inbox_table in %s) does not exist or lacks columns consumers need (%s): apply the schema (`outboxgen schema -f %s -dialect %s` prints it, or run your migrations); if the table has another name, set sql.inbox_table in %s and regenerate",
					c.table, source, strings.Join(c.cols, ", "), source, q.Dialect(), source)}
			}
			return fatalOnly(err, consumer, c.table)
		}
	}
	return nil
}

// dupRecorder knows whether a consumer's duplicate table
// (<inbox>_duplicate, schema version 2) can be used, so that duplicates
// are recorded only where it can. Recording duplicates is optional: a
// table that is missing, or that the consumer may not read or write, only
// means they are not recorded (logged once per change, at warn level, with
// what to do); it never fails or stalls a delivery.
type dupRecorder struct {
	consumer, table string
	logger          watermill.LoggerAdapter

	mu      sync.Mutex
	state   int       // dupUnknown, dupPresent, dupMissing or dupDenied
	checked time.Time // of the last probe or record that found it unusable
	// byWrite: dupDenied came from a failed record (the consumer may read
	// the table but not write it), so a probe (a read) cannot tell when
	// it is usable again: the record itself is tried every dupRecheck.
	byWrite bool
}

const (
	dupUnknown = iota
	dupPresent
	dupMissing // the table does not exist
	dupDenied  // the consumer may not read or write it
)

// dupRecheck is how often an unusable duplicate table is looked at again
// (a variable for the tests).
var dupRecheck = time.Minute

// due reports whether the table must be probed before a delivery: never
// probed successfully, or found unusable by a probe dupRecheck ago.
func (d *dupRecorder) due() bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.state == dupUnknown || (d.state != dupPresent && !d.byWrite && time.Since(d.checked) >= dupRecheck)
}

// tryRecord reports whether a duplicate is to be recorded: the table is
// usable, or writing it was denied dupRecheck ago (try again).
func (d *dupRecorder) tryRecord() bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.state == dupPresent || (d.state == dupDenied && d.byWrite && time.Since(d.checked) >= dupRecheck)
}

// set records a verdict (of a probe, or of a record, byWrite), logging
// when the state changes.
func (d *dupRecorder) set(state int, err error, byWrite bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	was := d.state
	d.state, d.byWrite = state, byWrite && state == dupDenied
	if state != dupPresent {
		d.checked = time.Now()
	}
	if state == was || d.logger == nil {
		return
	}
	fields := watermill.LogFields{"consumer": d.consumer, "table": d.table}
	if err != nil {
		err = redact.Error(err)
	}
	switch state {
	case dupMissing:
		d.logger.Error("inbox: duplicate deliveries are not recorded (deliveries go on): table "+d.table+" does not exist (the database is at schema version 1); `outboxgen migrate up` adds it. Looked for again every minute", err, fields)
	case dupDenied:
		d.logger.Error("inbox: duplicate deliveries are not recorded (deliveries go on): the consumer's database user may not use table "+d.table+"; grant it SELECT, INSERT and UPDATE there (`outboxgen grants` prints every grant). Tried again every minute", err, fields)
	case dupPresent:
		if was != dupUnknown {
			d.logger.Info("inbox: duplicate deliveries are recorded from now on: table "+d.table+" can be used", fields)
		}
	}
}

// probeDuplicates reads no row of the duplicate table, in a transaction
// of its own, and records whether it can be used. It never returns an
// error: a missing table or privilege means duplicates are not recorded
// (logged), and a database that cannot be reached leaves the verdict
// open, for the next delivery. (It returns error for its callers' sake:
// always nil.)
func probeDuplicates[T any](ctx context.Context, s Store[T], d *dupRecorder) error {
	tx, err := s.Begin(ctx)
	if err != nil {
		return nil // down: the delivery fails on its own and is retried
	}
	defer s.Rollback(context.WithoutCancel(ctx), tx) //nolint:errcheck // read-only
	dest := make([]any, len(dialect.InboxDuplicateColumns))
	for i := range dest {
		dest[i] = new(any)
	}
	_, err = s.QueryRow(ctx, tx, dialect.SelectColumns(d.table, dialect.InboxDuplicateColumns), nil, dest...)
	d.verdict(err, false)
	return nil
}

// verdict sets the state from err, the result of using the table (by a
// record when byWrite, else by a probe): nil (usable), missing, denied;
// other errors (the database down or busy, a deadline) leave the state
// as it is.
func (d *dupRecorder) verdict(err error, byWrite bool) {
	switch {
	case err == nil:
		d.set(dupPresent, nil, false)
	case dberr.Classify(err) == dberr.Missing:
		d.set(dupMissing, err, byWrite)
	case dberr.Classify(err) == dberr.Denied || dberr.Classify(err) == dberr.Mismatch:
		d.set(dupDenied, err, byWrite)
	}
}

// recordDuplicate records a duplicate delivery of m in the duplicate
// table, in a transaction of its own, after the delivery's committed: a
// failure (a missing privilege, a busy database) cannot abort the
// delivery's transaction, which on PostgreSQL would otherwise be lost
// with it (a savepoint would avoid that too, but would keep the
// delivery's transaction, and on SQLite the write lock, open for a write
// the delivery does not need). A failure is logged, never returned.
func (h *handler[T]) recordDuplicate(ctx context.Context, m outbox.Meta) {
	query, args := h.q.RecordDuplicate(h.name, m.EventID, m.Type, m.Key)
	err := func() error {
		tx, err := h.store.Begin(ctx)
		if err != nil {
			return err
		}
		if _, err := h.store.Exec(ctx, tx, query, args...); err != nil {
			_ = h.store.Rollback(context.WithoutCancel(ctx), tx)
			return err
		}
		if err := h.store.Commit(ctx, tx); err != nil {
			_ = h.store.Rollback(context.WithoutCancel(ctx), tx)
			return err
		}
		return nil
	}()
	h.dups.verdict(err, true)
	if err == nil {
		return
	}
	if c := dberr.Classify(err); c != dberr.Missing && c != dberr.Denied && c != dberr.Mismatch && h.logger != nil {
		h.logger.Info("inbox: a duplicate delivery was not recorded (the delivery was handled)", watermill.LogFields{"consumer": h.name,
			"event_id": m.EventID, "table": h.q.DuplicateTable(), "err": redact.Error(err).Error()})
	}
}

// fatalOnly returns err explained when it is fatal at start (a missing
// privilege), and nil otherwise: a database that is down is waited for.
func fatalOnly(err error, consumer, table string) error {
	if !dberr.FatalAtStart(err) {
		return nil
	}
	return dberr.Explain(err, dberr.Need{Component: "consumer " + consumer, Tables: table,
		Privileges: "SELECT and INSERT on " + table + " (and on its _key table for latest_only events, plus UPDATE there)"})
}

// handler handles the messages of one topic for one consumer.
type handler[T any] struct {
	name   string
	store  Store[T]
	q      *dialect.InboxQueries
	routes map[string]Route[T]
	in     *instruments
	dups   *dupRecorder // the consumer's duplicate table, shared by its handlers

	// Infrastructure failures (SQLITE_BUSY among them) are retried in
	// place, waiting backoff, doubling up to maxBackoff.
	backoff, maxBackoff time.Duration
	logger              watermill.LoggerAdapter
}

// Outcomes counted in outboxgen.inbox.deliveries.
const (
	OutcomeProcessed = "processed"
	OutcomeDuplicate = "duplicate"
	OutcomeStale     = "stale"
	OutcomeUnhandled = "unhandled"
	OutcomeFailed    = "failed"
	OutcomePermanent = "permanent"
	// OutcomeBusy is one attempt that found the SQLite database locked
	// (SQLITE_BUSY): retried without counting toward MaxAttempts.
	OutcomeBusy = "busy"
	// OutcomeInfrastructure is one attempt that failed because of the
	// database, not the message (unreachable, a missing privilege or table,
	// out of resources, shutting down, read-only, timed out, deadlocks or
	// serialization failures that running again at once did not get past):
	// retried with backoff without counting toward MaxAttempts, never
	// poisoned, and logged at ERROR. The counter's error_class attribute
	// says which (see the package documentation).
	OutcomeInfrastructure = "infrastructure"
	// OutcomeConflict is one run of a delivery's transaction that the
	// database rolled back as a deadlock victim or serialization failure:
	// run again at once (after a few random milliseconds), up to 5 times,
	// without counting toward MaxAttempts; logged at INFO.
	OutcomeConflict = "conflict"
	// OutcomeStopped is a delivery given back (nacked) because the
	// router was stopping or the message's context ended: its attempt
	// was cut short, or it was waiting out a database failure. Neither
	// poisoned nor counted toward MaxAttempts; the broker delivers it
	// again later.
	OutcomeStopped = "stopped"
)

func (h *handler[T]) count(ctx context.Context, eventType, outcome string, attrs ...attribute.KeyValue) {
	h.in.count(ctx, h.name, eventType, outcome, attrs...)
}

func (h *handler[T]) handle(msg *message.Message) error {
	return oneLine(h.logger, h.handleMessage(msg))
}

func (h *handler[T]) handleMessage(msg *message.Message) (err error) {
	ctx := msg.Context()
	start := time.Now()
	m, err := outbox.ParseMeta(msg.Metadata, msg.UUID)
	if err != nil {
		err = Permanent(err)
		h.settle(ctx, start, msg.Metadata.Get(outbox.MetadataType), time.Time{}, OutcomePermanent, err)
		return err
	}
	rt, ok := h.routes[m.Type]
	if !ok {
		// Another type sharing the topic: not this consumer's business.
		h.settle(ctx, start, m.Type, m.CreatedAt, OutcomeUnhandled, nil)
		return nil
	}
	if err := checkFits(m); err != nil {
		err = Permanent(err)
		h.settle(ctx, start, m.Type, m.CreatedAt, OutcomePermanent, err)
		return err
	}
	if rt.LatestOnly && (m.Sequence <= 0 || m.Key == "") {
		err := Permanent(fmt.Errorf("inbox: %s event %s is latest_only but has no %q and %q metadata to order it by", m.Type, m.EventID, outbox.MetadataSequence, outbox.MetadataKey))
		h.settle(ctx, start, m.Type, m.CreatedAt, OutcomePermanent, err)
		return err
	}
	outcome, err := h.runConflicts(ctx, rt, msg.Payload, m, &start)
	for wait := h.backoff; err != nil && !errors.Is(err, ErrPermanent); wait = min(2*wait, h.maxBackoff) {
		if ctx.Err() != nil {
			// The router is stopping (or the message's context ended)
			// while the attempt ran: whatever it failed with is taken for
			// that, since drivers report a cancelled statement in their
			// own ways (PostgreSQL 57014 query_canceled, which a server's
			// statement_timeout also yields; a closed connection;
			// sql.ErrTxDone). Not the message's fault, nor the
			// database's: nack (never poison, no retry) and let the
			// broker redeliver later.
			err = &infraError{err: fmt.Errorf("%w (stopped: %w)", err, ctx.Err())}
			h.settle(ctx, start, m.Type, m.CreatedAt, OutcomeStopped, err)
			return err
		}
		class := dberr.Infrastructure(err)
		if class == dberr.NoInfra {
			break
		}
		// The database failed, not the message: never poison it, and do
		// not use up its MaxAttempts. Wait and try again until the
		// cause is fixed or gone, or the router stops.
		h.infrastructure(ctx, m, class, wait, err)
		if werr := sleep(ctx, wait); werr != nil {
			// Shutting down: nack (never poison) and let the broker
			// redeliver later. The attempt was counted already (as
			// infrastructure); this tells the delivery's span and the
			// counter that it was given back.
			err = &infraError{err: fmt.Errorf("%w (stopped waiting: %w)", err, werr)}
			h.stopped(ctx, m, err)
			return err
		}
		start = time.Now() // the handler duration is one attempt's, not the waits'
		outcome, err = h.runConflicts(ctx, rt, msg.Payload, m, &start)
	}
	if err != nil {
		if errors.Is(err, ErrPermanent) {
			outcome = OutcomePermanent
		} else {
			outcome = OutcomeFailed
		}
	}
	h.settle(ctx, start, m.Type, m.CreatedAt, outcome, err)
	return err
}

// conflictPause is the pause before running a delivery's transaction
// again after its try-th conflict (dberr.ConflictPause: 2 to 10 ms, times
// try). A variable for the tests.
var conflictPause = func(try int) time.Duration {
	return dberr.ConflictPause(try, 2*time.Millisecond)
}

// runConflicts runs the delivery (run), and runs it again, up to
// dberr.ConflictTries times in all, while it fails as a deadlock victim or
// serialization failure (dberr.Conflict: PostgreSQL 40P01, 40001;
// MySQL/MariaDB 1213, 1020), whether the inbox's statements, the
// handler's or the commit hit it. The database rolled the transaction
// back whole (run rolls it back too), the handler's writes with the inbox
// row, so running it again is safe; these runs are not attempts of the
// message (they never count toward MaxAttempts) and are counted as
// outcome "conflict". A conflict still failing after the last run is
// returned: handleMessage then handles it as an infrastructure failure
// (dberr.InfraConflict). *start is reset for each run, so that the
// handler duration is one run's.
func (h *handler[T]) runConflicts(ctx context.Context, rt Route[T], payload []byte, m outbox.Meta, start *time.Time) (outcome string, err error) {
	for try := 1; ; try++ {
		outcome, err = h.run(ctx, rt, payload, m)
		if err == nil || try >= dberr.ConflictTries || errors.Is(err, ErrPermanent) || !dberr.Conflict(err) || ctx.Err() != nil {
			return outcome, err
		}
		pause := conflictPause(try)
		h.count(ctx, m.Type, OutcomeConflict)
		if h.logger != nil {
			h.logger.Info("inbox: the database rolled the delivery's transaction back (deadlock or serialization failure); running it again (not counted toward MaxAttempts)", watermill.LogFields{
				"consumer": h.name, "event_type": m.Type, "event_id": m.EventID, "try": try, "wait_time": pause, "error": err.Error(),
			})
		}
		if sleep(ctx, pause) != nil {
			return outcome, err
		}
		*start = time.Now()
	}
}

// infrastructure counts and logs one attempt that failed because of the
// database: SQLITE_BUSY at INFO (a lock that waiting resolves, counted as
// "busy"), anything else at ERROR with what to do (counted as
// "infrastructure").
func (h *handler[T]) infrastructure(ctx context.Context, m outbox.Meta, class dberr.Infra, wait time.Duration, err error) {
	fields := watermill.LogFields{
		"consumer": h.name, "event_type": m.Type, "event_id": m.EventID, "wait_time": wait,
	}
	if class == dberr.InfraBusy {
		h.count(ctx, m.Type, OutcomeBusy)
		if h.logger != nil {
			fields["error"] = err.Error()
			h.logger.Info("inbox: SQLite database is locked, retrying (not counted toward MaxAttempts)", fields)
		}
		return
	}
	h.count(ctx, m.Type, OutcomeInfrastructure, attribute.String("error_class", class.String()))
	if h.logger != nil {
		fields["error_class"] = class.String()
		fields["inbox_table"] = h.q.Table()
		fields["what_to_do"] = class.Hint()
		h.logger.Error("inbox: the database failed ("+class.String()+"); the message is kept and retried until it gets through (not counted toward MaxAttempts, never poisoned)", err, fields)
	}
}

// infraError is an infrastructure failure still failing when the handler
// stopped waiting for it (the router is stopping): nacked, never poisoned.
type infraError struct{ err error }

func (e *infraError) Error() string { return e.err.Error() }
func (e *infraError) Unwrap() error { return e.err }

// isInfrastructure reports whether err is a database infrastructure
// failure (and not marked permanent): it must not poison the message.
func isInfrastructure(err error) bool {
	var ie *infraError
	if errors.As(err, &ie) {
		return true
	}
	return !errors.Is(err, ErrPermanent) && dberr.Infrastructure(err) != dberr.NoInfra
}

// MaxReasonLen caps, in bytes, the text of a failure as the poison queue
// records it (metadata "reason_poisoned"): one line, so that it fits a
// message header. The whole error is logged.
const MaxReasonLen = 1024

// oneLine returns err with its text on one line (line breaks and other
// control characters replaced) and at most MaxReasonLen bytes; errors.Is
// and errors.As see through it. When it had to shorten the text, it logs
// the whole error first.
func oneLine(logger watermill.LoggerAdapter, err error) error {
	if err == nil {
		return nil
	}
	msg := err.Error()
	line := strings.Join(strings.FieldsFunc(msg, func(r rune) bool { return r == '\n' || r == '\r' }), " | ")
	line = strings.Map(func(r rune) rune {
		if unicode.IsControl(r) {
			return ' '
		}
		return r
	}, strings.ToValidUTF8(line, "\uFFFD"))
	if len(line) > MaxReasonLen {
		if logger != nil {
			logger.Error("inbox: delivery failed (the poison reason is shortened to one line of this)", err, nil)
		}
		cut := MaxReasonLen - len("...")
		for cut > 0 && !utf8.RuneStart(line[cut]) {
			cut--
		}
		line = line[:cut] + "..."
	}
	return errtext.Replace(err, line)
}

// checkFits reports, as a plain error, a value of m that cannot be stored in
// the inbox table: too long for its column, or not valid UTF-8 text (which
// PostgreSQL and MySQL reject). Such a message would fail the INSERT on
// every attempt (and each failed statement aborts its transaction on
// PostgreSQL); SQLite would store it, but the check keeps every database
// alike.
func checkFits(m outbox.Meta) error {
	for _, f := range []struct {
		name, metadata, value string
		max                   int
	}{
		{"event id", outbox.MetadataEventID, m.EventID, MaxEventIDLen},
		{"event type", outbox.MetadataType, m.Type, MaxTypeLen},
		{"key", outbox.MetadataKey, m.Key, MaxKeyLen},
	} {
		if !utf8.ValidString(f.value) || strings.IndexByte(f.value, 0) >= 0 {
			return fmt.Errorf("inbox: %s event %.64q: the %s (%q metadata) is not valid UTF-8 text without NUL bytes, which the inbox table cannot store", m.Type, m.EventID, f.name, f.metadata)
		}
		if n := utf8.RuneCountInString(f.value); n > f.max {
			return fmt.Errorf("inbox: %s event %.64q: the %s (%q metadata) has %d characters; the inbox table holds at most %d", m.Type, m.EventID, f.name, f.metadata, n, f.max)
		}
	}
	return nil
}

// isBusy reports whether err is SQLite's SQLITE_BUSY ("database is
// locked"): another connection holds the lock, and trying again later can
// succeed. SQLITE_LOCKED ("database table is locked") is left out: outside
// shared-cache mode it is a conflict within one connection, which waiting
// does not resolve.
func isBusy(err error) bool { return dberr.Infrastructure(err) == dberr.InfraBusy }

// sleep waits d or until ctx is done, returning ctx's error then.
func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// run handles one delivery in one transaction and returns its outcome.
func (h *handler[T]) run(ctx context.Context, rt Route[T], payload []byte, m outbox.Meta) (outcome string, err error) {
	if h.dups.due() {
		// Before the delivery's transaction: a failed probe must not
		// abort it (PostgreSQL), and SQLite allows one writer. It never
		// fails the delivery.
		_ = probeDuplicates(ctx, h.store, h.dups)
	}
	tx, err := h.store.Begin(ctx)
	if err != nil {
		return "", fmt.Errorf("inbox: %s: begin: %w", h.name, err)
	}
	done := false
	defer func() {
		if !done {
			// Roll back even when ctx is cancelled: the connection goes
			// back to the pool clean.
			_ = h.store.Rollback(context.WithoutCancel(ctx), tx)
		}
	}()
	commit := func() error {
		done = true
		if err := h.store.Commit(ctx, tx); err != nil {
			_ = h.store.Rollback(context.WithoutCancel(ctx), tx)
			return fmt.Errorf("inbox: %s: commit %s %s: %w", h.name, m.Type, m.EventID, err)
		}
		return nil
	}

	query, args := h.q.Record(h.name, m.EventID, m.Type, m.Key)
	n, err := h.store.Exec(ctx, tx, query, args...)
	if err != nil {
		return "", fmt.Errorf("inbox: %s: record %s %s in %s: %w", h.name, m.Type, m.EventID, h.q.Table(), err)
	}
	if n == 0 {
		// Handled before: the same event redelivered, unless another
		// event reuses its id.
		if err := h.sameEvent(ctx, tx, m); err != nil {
			return "", err
		}
		if err := commit(); err != nil {
			return "", err
		}
		if h.dups.tryRecord() {
			h.recordDuplicate(ctx, m)
		}
		return OutcomeDuplicate, nil
	}
	if rt.LatestOnly {
		query, args := h.q.Guard(h.name, m.Type, m.Key, m.Sequence)
		n, err := h.store.Exec(ctx, tx, query, args...)
		if err != nil {
			return "", fmt.Errorf("inbox: %s: stale guard of %s %s in %s: %w", h.name, m.Type, m.EventID, h.q.KeyTable(), err)
		}
		if n == 0 {
			// Keep the inbox row: this event is settled as stale.
			return OutcomeStale, commit()
		}
	}
	if err := h.callSafely(ctx, rt, tx, payload, m); err != nil {
		return "", err
	}
	return OutcomeProcessed, commit()
}

// sameEvent reads the event type and key recorded with m's event id and
// refuses, as a permanent failure, a delivery that is another event: a
// message reusing a handled event id would otherwise be acked as a
// duplicate and silently dropped. A record without a type (written by an
// older inbox) or gone by now cannot be compared and counts as the same.
func (h *handler[T]) sameEvent(ctx context.Context, tx T, m outbox.Meta) error {
	query, args := h.q.Recorded(h.name, m.EventID)
	var typ, key string
	found, err := h.store.QueryRow(ctx, tx, query, args, &typ, &key)
	if err != nil {
		return fmt.Errorf("inbox: %s: read the record of %s %s in %s: %w", h.name, m.Type, m.EventID, h.q.Table(), err)
	}
	if !found || typ == "" || (typ == m.Type && key == m.Key) {
		return nil
	}
	return Permanent(&ReusedEventIDError{Consumer: h.name, EventID: m.EventID, Type: m.Type, Key: m.Key, HadType: typ, HadKey: key})
}

// ReusedEventIDError is the permanent failure of a delivery whose event id
// the consumer already handled for another event (another type or key).
// It matches ErrPermanent and outbox.ErrDuplicateEventID.
type ReusedEventIDError struct {
	Consumer, EventID string
	// Type and Key are the delivery's; HadType and HadKey the handled
	// event's.
	Type, Key, HadType, HadKey string
}

func (e *ReusedEventIDError) Error() string {
	return fmt.Sprintf("inbox: %s: event id %.64q was already handled for %s key %.64q, and this delivery is %s key %.64q: one id cannot name two events; the producer reuses event ids",
		e.Consumer, e.EventID, e.HadType, e.HadKey, e.Type, e.Key)
}

// Is makes errors.Is(err, outbox.ErrDuplicateEventID) true.
func (e *ReusedEventIDError) Is(target error) bool { return target == outbox.ErrDuplicateEventID }

// callSafely calls the route's decoder and handler, turning a panic into an
// error of one line; the stack goes to the log.
func (h *handler[T]) callSafely(ctx context.Context, rt Route[T], tx T, payload []byte, m outbox.Meta) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("inbox: handler for %s %s panicked: %v", m.Type, m.EventID, r)
			if h.logger != nil {
				h.logger.Error("inbox: handler panicked", err, watermill.LogFields{
					"consumer": h.name, "event_type": m.Type, "event_id": m.EventID, "stack": string(debug.Stack()),
				})
			}
		}
	}()
	return rt.call(ctx, tx, payload, m)
}

// SQLStore runs a consumer on a database/sql database.
type SQLStore struct{ DB *sql.DB }

// Begin starts a transaction with the driver's default isolation level.
func (s SQLStore) Begin(ctx context.Context) (*sql.Tx, error) { return s.DB.BeginTx(ctx, nil) }

// Exec runs query in tx and returns the affected-row count.
func (s SQLStore) Exec(ctx context.Context, tx *sql.Tx, query string, args ...any) (int64, error) {
	res, err := tx.ExecContext(ctx, query, args...)
	if err != nil {
		return 0, err
	}
	return res.RowsAffected()
}

// QueryRow runs query in tx and scans its row, if any, into dest.
func (s SQLStore) QueryRow(ctx context.Context, tx *sql.Tx, query string, args []any, dest ...any) (bool, error) {
	err := tx.QueryRowContext(ctx, query, args...).Scan(dest...)
	if errors.Is(err, sql.ErrNoRows) {
		return false, nil
	}
	return err == nil, err
}

// Commit commits tx.
func (s SQLStore) Commit(_ context.Context, tx *sql.Tx) error { return tx.Commit() }

// Rollback rolls tx back; after Commit it is a no-op.
func (s SQLStore) Rollback(_ context.Context, tx *sql.Tx) error { return tx.Rollback() }
