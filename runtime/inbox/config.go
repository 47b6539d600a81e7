package inbox

import (
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"

	"github.com/outboxgen/outboxgen/runtime/dialect"
	"github.com/outboxgen/outboxgen/runtime/outbox"
)

// Defaults of Config.
const (
	DefaultMaxAttempts          = 4
	DefaultRetryInitialInterval = 100 * time.Millisecond
	DefaultRetryMaxInterval     = 5 * time.Second
	// DefaultPoisonTopicSuffix is appended to the consumer name to make the
	// default poison topic, e.g. "points.poison".
	DefaultPoisonTopicSuffix = ".poison"
)

// Config configures a consumer. Zero fields take their defaults; Register
// and RegisterStore set them and then call Validate. Generated RegisterX
// functions set Schema (from events.yaml); everything else comes from the
// application, e.g.
//
//	events.RegisterPoints(router, sub, db, h, inbox.Config{PoisonPublisher: pub})
type Config struct {
	// Schema is the generated package's Schema (from events.yaml):
	// generated RegisterX functions set it. It supplies InboxTable, and
	// Register (database/sql) takes the dialect from the *sql.DB's driver
	// and refuses one events.yaml does not list; pgxinbox.Register
	// refuses a schema without postgres.
	Schema outbox.Schema
	// Dialect is the SQL dialect of the database (database/sql only; the
	// pgx registration always uses PostgreSQL). Default, with a Schema:
	// the dialect of the *sql.DB's driver. Required otherwise.
	Dialect dialect.Dialect
	// InboxTable is the inbox table; the stale guard uses InboxTable+"_key".
	// Default: Schema's, else "outbox_inbox".
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
	// with their own dead-letter handling. PoisonPublisher must then be nil.
	NoPoisonQueue bool

	// MaxAttempts is how often one delivery is tried in-process (watermill's
	// Retry middleware, exponential backoff) before it is poisoned; 1 means
	// no retry. Each attempt is a fresh transaction. The count restarts when
	// the broker redelivers (after a crash, or without a poison queue).
	// Attempts that fail because of the database (unreachable, a missing
	// privilege or table, SQLITE_BUSY, a server-side statement or lock
	// timeout, ...) are retried with the same backoff without being
	// counted, until they get through; a transaction rolled back as a
	// deadlock victim or serialization failure is first run again at
	// once, up to 5 times, also without being counted (see the package
	// documentation). Default 4.
	MaxAttempts int
	// RetryInitialInterval is the backoff before the first retry; it
	// doubles up to RetryMaxInterval. Defaults 100ms and 5s (or
	// RetryInitialInterval, when that is longer).
	RetryInitialInterval time.Duration
	RetryMaxInterval     time.Duration

	// Logger logs failed attempts, infrastructure failures (at ERROR, with
	// what to do) and handler panics (at ERROR, with the stack). Default:
	// the router's logger (message.Router.Logger), so that a consumer logs
	// where its router does.
	Logger *slog.Logger
	// MeterProvider makes the consumer's instruments: the counter
	// outboxgen.inbox.deliveries and the histograms
	// outboxgen.inbox.handler.duration and outboxgen.inbox.lag. Default:
	// the global OpenTelemetry provider (a no-op unless one is installed).
	MeterProvider metric.MeterProvider
	// TracerProvider makes the consumer span of each delivery ("process
	// <topic>", a child of the context the relay injected into the
	// message). Default: the global OpenTelemetry provider (a no-op unless
	// one is installed).
	TracerProvider trace.TracerProvider
}

// setDefaults fills the zero fields of c for the consumer named consumer.
// Logger is left nil here: RegisterStore uses the router's.
func (c *Config) setDefaults(consumer string) {
	if c.InboxTable == "" {
		c.InboxTable = c.Schema.Tables.Inbox
	}
	if c.PoisonTopic == "" {
		c.PoisonTopic = consumer + DefaultPoisonTopicSuffix
	}
	if c.MaxAttempts == 0 {
		c.MaxAttempts = DefaultMaxAttempts
	}
	if c.RetryInitialInterval == 0 {
		c.RetryInitialInterval = DefaultRetryInitialInterval
	}
	if c.RetryMaxInterval == 0 {
		c.RetryMaxInterval = max(DefaultRetryMaxInterval, c.RetryInitialInterval)
	}
	if c.MeterProvider == nil {
		c.MeterProvider = otel.GetMeterProvider()
	}
	if c.TracerProvider == nil {
		c.TracerProvider = otel.GetTracerProvider()
	}
}

// Validate reports every setting that cannot work, each with how to fix it,
// joined with errors.Join. Register and RegisterStore call it after
// filling in the defaults.
func (c Config) Validate() error {
	var errs []error
	if c.InboxTable == "" {
		// No default name: a consumer must never use a table events.yaml
		// did not name.
		errs = append(errs, errors.New("inbox: no inbox table: set Config.Schema to the generated package's Schema (the generated RegisterX do), or Config.InboxTable"))
	}
	if c.Schema.Tables.Inbox != "" && c.InboxTable != c.Schema.Tables.Inbox {
		errs = append(errs, fmt.Errorf("inbox: the inbox table is %q, but sql.inbox_table in %s is %q: leave Config.InboxTable empty to use the schema's", c.InboxTable, c.Schema.Source, c.Schema.Tables.Inbox))
	}
	if len(c.Schema.Dialects) > 0 && c.Dialect.Valid() {
		if err := c.Schema.CheckDialect(c.Dialect, "the consumer's database"); err != nil {
			errs = append(errs, fmt.Errorf("inbox: %w", err))
		}
	}
	if !c.Dialect.Valid() {
		errs = append(errs, fmt.Errorf("inbox: unknown or missing dialect %q: set Config.Dialect to outbox.Postgres, MySQL or SQLite", c.Dialect))
	}
	if c.InboxTable != "" { // an empty one is reported above
		if err := dialect.CheckIdentifier("inbox: table name", c.InboxTable); err != nil {
			errs = append(errs, err)
		} else if err := dialect.CheckIdentifier("inbox: stale-guard table name", dialect.InboxKeyTable(c.InboxTable)); err != nil {
			errs = append(errs, err)
		}
	}

	switch {
	case c.PoisonPublisher == nil && !c.NoPoisonQueue:
		errs = append(errs, errors.New("inbox: no poison queue: set Config.PoisonPublisher (and PoisonTopic, default \"<consumer>.poison\"), or Config.NoPoisonQueue to have failing messages redelivered forever"))
	case c.PoisonPublisher != nil && c.NoPoisonQueue:
		errs = append(errs, errors.New("inbox: Config sets both PoisonPublisher and NoPoisonQueue: set only one"))
	}
	if c.MaxAttempts < 1 {
		errs = append(errs, fmt.Errorf("inbox: MaxAttempts is %d: set Config.MaxAttempts to at least 1 (0 means the default, %d)", c.MaxAttempts, DefaultMaxAttempts))
	}
	if c.RetryInitialInterval < 0 || c.RetryMaxInterval < c.RetryInitialInterval {
		errs = append(errs, fmt.Errorf("inbox: retry backoff %v..%v is not a valid range: set Config.RetryInitialInterval >= 0 and RetryMaxInterval >= it", c.RetryInitialInterval, c.RetryMaxInterval))
	}
	return errors.Join(errs...)
}
