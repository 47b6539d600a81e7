package inbox

import (
	"errors"
	"fmt"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/metric"

	"github.com/outboxgen/outboxgen/runtime/dialect"
	"github.com/outboxgen/outboxgen/runtime/outbox"
)

// DefaultInboxTable is the inbox table name events.yaml uses by default.
const DefaultInboxTable = "outbox_inbox"

// Defaults of Options.
const (
	DefaultMaxAttempts          = 4
	DefaultRetryInitialInterval = 100 * time.Millisecond
	DefaultRetryMaxInterval     = 5 * time.Second
	// DefaultPoisonTopicSuffix is appended to the consumer name to make the
	// default poison topic, e.g. "points.poison".
	DefaultPoisonTopicSuffix = ".poison"
)

// Options configure a consumer. Generated RegisterX functions set Dialect
// (from the generated Writer) and InboxTable (from events.yaml); everything
// else comes from the Option values the application passes.
type Options struct {
	// Schema is the generated package's Schema (from events.yaml):
	// generated RegisterX functions pass it. It supplies InboxTable, and
	// Register (database/sql) takes the dialect from the *sql.DB's driver
	// and refuses one events.yaml does not list; pgxinbox.Register
	// refuses a schema without postgres.
	Schema outbox.Schema
	// Dialect is the SQL dialect of the database (database/sql only; the
	// pgx registration always uses PostgreSQL). Required.
	Dialect dialect.Dialect
	// InboxTable is the inbox table; the stale guard uses InboxTable+"_key".
	// Default "outbox_inbox".
	InboxTable string

	// PoisonPublisher receives messages that cannot be handled: at once for
	// permanent failures (an undecodable payload, an unknown payload
	// version, malformed outbox metadata, an event id or key too long for
	// the inbox table, an event id already handled for another event type
	// or key, an error wrapped with Permanent), after MaxAttempts failed
	// attempts for any other error except infrastructure failures (the
	// database's, which are retried until they clear and never poison; see
	// the package documentation). The message keeps its payload and
	// metadata; watermill's PoisonQueue adds the reason (metadata
	// "reason_poisoned", one line of at most MaxReasonLen bytes), topic
	// and handler. Required unless NoPoisonQueue is set.
	PoisonPublisher message.Publisher
	// PoisonTopic is where poisoned messages go. Default: the consumer name
	// + ".poison", e.g. "points.poison".
	PoisonTopic string
	// NoPoisonQueue turns the poison queue off: a message that keeps failing
	// is nacked after each round of attempts and redelivered by the broker
	// forever, and an undecodable one too. Meant for tests and for brokers
	// with their own dead-letter handling.
	NoPoisonQueue bool

	// MaxAttempts is how often one delivery is tried in-process (watermill's
	// Retry middleware, exponential backoff) before it is poisoned; 1 means
	// no retry. Each attempt is a fresh transaction. The count restarts when
	// the broker redelivers (after a crash, or without a poison queue).
	// Attempts that fail because of the database (unreachable, a missing
	// privilege or table, SQLITE_BUSY, ...) are retried with the same
	// backoff without being counted, until they get through (see the
	// package documentation). Default 4.
	MaxAttempts int
	// RetryInitialInterval is the backoff before the first retry; it
	// doubles up to RetryMaxInterval. Defaults 100ms and 5s.
	RetryInitialInterval time.Duration
	RetryMaxInterval     time.Duration

	// Logger logs failed attempts, infrastructure failures (at ERROR, with
	// what to do) and handler panics (at ERROR, with the stack). Default:
	// the router's logger.
	Logger watermill.LoggerAdapter
	// MeterProvider makes the outboxgen.inbox.deliveries counter. Default:
	// the global OpenTelemetry provider (a no-op unless one is installed).
	MeterProvider metric.MeterProvider
}

// Option adjusts Options.
type Option func(*Options)

// WithOptions replaces all options with o (later options still apply).
func WithOptions(o Options) Option { return func(dst *Options) { *dst = o } }

// WithSchema sets the schema (generated code passes its Schema).
func WithSchema(s outbox.Schema) Option { return func(o *Options) { o.Schema = s } }

// WithDialect sets the SQL dialect (database/sql).
func WithDialect(d dialect.Dialect) Option { return func(o *Options) { o.Dialect = d } }

// WithInboxTable sets the inbox table name.
func WithInboxTable(table string) Option { return func(o *Options) { o.InboxTable = table } }

// WithPoisonQueue sends unprocessable messages to topic through pub. An
// empty topic keeps the default, "<consumer>.poison".
func WithPoisonQueue(pub message.Publisher, topic string) Option {
	return func(o *Options) {
		o.PoisonPublisher, o.PoisonTopic, o.NoPoisonQueue = pub, topic, false
	}
}

// WithoutPoisonQueue turns the poison queue off; see Options.NoPoisonQueue.
func WithoutPoisonQueue() Option {
	return func(o *Options) { o.PoisonPublisher, o.NoPoisonQueue = nil, true }
}

// WithMaxAttempts sets how often a delivery is tried before it is poisoned.
func WithMaxAttempts(n int) Option { return func(o *Options) { o.MaxAttempts = n } }

// WithRetryBackoff sets the backoff between attempts.
func WithRetryBackoff(initial, max time.Duration) Option {
	return func(o *Options) { o.RetryInitialInterval, o.RetryMaxInterval = initial, max }
}

// WithLogger sets the logger.
func WithLogger(l watermill.LoggerAdapter) Option { return func(o *Options) { o.Logger = l } }

// WithMeterProvider sets the OpenTelemetry meter provider.
func WithMeterProvider(mp metric.MeterProvider) Option {
	return func(o *Options) { o.MeterProvider = mp }
}

func (o *Options) setDefaults(consumer string) {
	if o.InboxTable == "" {
		o.InboxTable = o.Schema.Tables.Inbox
	}
	if o.InboxTable == "" {
		o.InboxTable = DefaultInboxTable
	}
	if o.PoisonTopic == "" {
		o.PoisonTopic = consumer + DefaultPoisonTopicSuffix
	}
	if o.MaxAttempts == 0 {
		o.MaxAttempts = DefaultMaxAttempts
	}
	if o.RetryInitialInterval == 0 {
		o.RetryInitialInterval = DefaultRetryInitialInterval
	}
	if o.RetryMaxInterval == 0 {
		o.RetryMaxInterval = max(DefaultRetryMaxInterval, o.RetryInitialInterval)
	}
	if o.MeterProvider == nil {
		o.MeterProvider = otel.GetMeterProvider()
	}
}

// Validate reports options that cannot work.
func (o Options) Validate() error {
	var errs []error
	if o.Schema.Tables.Inbox != "" && o.InboxTable != o.Schema.Tables.Inbox {
		errs = append(errs, fmt.Errorf("inbox: the inbox table is %q, but sql.inbox_table in %s is %q: leave the table to the schema", o.InboxTable, o.Schema.Source, o.Schema.Tables.Inbox))
	}
	if len(o.Schema.Dialects) > 0 && o.Dialect.Valid() {
		if err := o.Schema.CheckDialect(o.Dialect, "the consumer's database"); err != nil {
			errs = append(errs, fmt.Errorf("inbox: %w", err))
		}
	}
	if !o.Dialect.Valid() {
		errs = append(errs, fmt.Errorf("inbox: unknown or missing dialect %q: use inbox.WithDialect(outbox.Postgres), MySQL or SQLite", o.Dialect))
	}
	if err := dialect.CheckIdentifier("inbox: table name", o.InboxTable); err != nil {
		errs = append(errs, err)
	} else if err := dialect.CheckIdentifier("inbox: stale-guard table name", dialect.InboxKeyTable(o.InboxTable)); err != nil {
		errs = append(errs, err)
	}
	if o.PoisonPublisher == nil && !o.NoPoisonQueue {
		errs = append(errs, errors.New("inbox: no poison queue: pass inbox.WithPoisonQueue(publisher, topic), or inbox.WithoutPoisonQueue() to have failing messages redelivered forever"))
	}
	if o.MaxAttempts < 1 {
		errs = append(errs, fmt.Errorf("inbox: MaxAttempts is %d, want at least 1", o.MaxAttempts))
	}
	if o.RetryInitialInterval < 0 || o.RetryMaxInterval < o.RetryInitialInterval {
		errs = append(errs, fmt.Errorf("inbox: retry backoff %v..%v is not a valid range", o.RetryInitialInterval, o.RetryMaxInterval))
	}
	return errors.Join(errs...)
}
