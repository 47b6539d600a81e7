package relay

import (
	"errors"
	"fmt"
	"log/slog"
	mathrand "math/rand/v2"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"

	"github.com/outboxgen/outboxgen/runtime/dialect"
	"github.com/outboxgen/outboxgen/runtime/driver"
	"github.com/outboxgen/outboxgen/runtime/internal/backoff"
	"github.com/outboxgen/outboxgen/runtime/internal/hedge"
	"github.com/outboxgen/outboxgen/runtime/internal/instanceid"
	"github.com/outboxgen/outboxgen/runtime/outbox"
)

// Defaults of Config.
const (
	DefaultBatchSize       = 100
	DefaultPollInterval    = 2 * time.Second
	DefaultLeaseDuration   = 30 * time.Second
	DefaultConcurrency     = 8
	DefaultParallelClaims  = 2
	DefaultMaxAttempts     = 5
	DefaultShutdownTimeout = 10 * time.Second
	DefaultPublishTimeout  = time.Minute

	// DefaultBreakerInitial and DefaultBreakerMax parameterise the default
	// BreakerBackoff: 1s doubling to 1 minute, ±20%.
	DefaultBreakerInitial = time.Second
	DefaultBreakerMax     = time.Minute

	// DefaultHoldRecheck is Config.HoldRecheck's default.
	DefaultHoldRecheck = driver.DefaultHold

	// DefaultDatabaseBackoffMax caps the pause after consecutive
	// database errors (see Config.DatabaseBackoffMax).
	DefaultDatabaseBackoffMax = backoff.DefaultMax

	// DefaultBackoffInitial, DefaultBackoffMax and DefaultBackoffJitter
	// parameterise DefaultBackoff: 1, 2, 4, ... minutes, capped at 64, ±20%.
	DefaultBackoffInitial = time.Minute
	DefaultBackoffMax     = 64 * time.Minute
	DefaultBackoffJitter  = 0.2

	// MaxBatchSize bounds BatchSize (it is also the length of the id lists
	// the relay binds).
	MaxBatchSize = dialect.MaxInList
	// MaxRowsInFlight bounds Config.MaxInFlight.
	MaxRowsInFlight = 100 * MaxBatchSize
	// MaxParallelClaims bounds Config.ParallelClaims.
	MaxParallelClaims = 8
	// SlowPublish is the longest a publish runs before it stops counting
	// against Config.Concurrency: eight times the recent typical publish
	// (at least 2ms), at most this.
	SlowPublish = hedge.MaxSlow
	// HedgeBurst and HedgeEvery throttle Config.Hedge: at most HedgeBurst
	// hedges in a row, then one per HedgeEvery publishes that returned
	// without one, so that a broker slow as a whole gets at most a tenth
	// more calls.
	HedgeBurst = hedge.Burst
	HedgeEvery = hedge.Every
	// MaxHedges is how many times Config.Hedge sends one publish again.
	MaxHedges = hedge.Max
	// MaxInstanceID is the longest InstanceID (the lease_owner column).
	MaxInstanceID = instanceid.Max
)

// Config configures a Relay. The zero value of every field but Publisher
// means "use the default".
type Config struct {
	// Publisher receives every event. Required. Any watermill publisher
	// works (Kafka, NATS JetStream, AMQP, Redis Streams, GoChannel, ...).
	Publisher message.Publisher

	// EventTypes lists the event types with their settings. Default: the
	// driver's schema's (the generated Schema.EventTypes, from
	// events.yaml); set it only to override them. Only Ordered is read: types listed with
	// Ordered false are published without per-key order. Types not listed
	// are ordered.
	EventTypes []outbox.EventType

	// BatchSize is the most rows claimed per poll (default 100, at most
	// 1000). A full batch is followed by an immediate re-poll, while
	// MaxInFlight allows.
	BatchSize int

	// MaxInFlight bounds the rows this relay holds leased at once:
	// claimed and not yet recorded (default 4 × BatchSize). The relay
	// claims the next batch while the last one still publishes, as long
	// as it stays under this bound, so a slow publish idles only its own
	// key and never the instance. It must be at least BatchSize.
	MaxInFlight int

	// ParallelClaims is how many claims may run at once (default 2; 1
	// claims one at a time). A claim always runs beside the publishing of
	// the rows before it; while a backlog lasts (the last claim came back
	// full), this many run beside each other, on connections of their
	// own, so the database works on one while it commits another. They
	// lease under SKIP LOCKED like claims of separate instances, so
	// per-key order holds exactly as it does between instances, and
	// together they stay within MaxInFlight. On PostgreSQL the claims
	// from a front each read a stripe of the keys of their own
	// (driver.ClaimParams.Stripe), taken in turn, so none reads past the
	// rows another of them is leasing. On SQLite (one writer) New sets
	// it to 1.
	ParallelClaims int

	// PollInterval is the delay between the end of a poll that found less
	// than a full window and the start of the next (fixed delay, so a slow
	// poll never piles up; default 2s). Notify wakes the relay early. While
	// rows are in flight, their results go out with a claim as they come
	// in, so claims then run more often than this.
	PollInterval time.Duration

	// LeaseDuration is how long claimed rows stay reserved for this
	// instance (default 30s). While a batch publishes, the relay extends
	// its lease every LeaseDuration/3 (a heartbeat), so a slow publisher
	// does not let it lapse. If the lease cannot be extended (the database
	// is unreachable), the batch stops publishing a margin (a tenth of the
	// lease, at most 5s) before the lease it last secured lapses and gives
	// the rest back, so no other instance publishes the same key
	// concurrently; set the publisher's own timeout well below the lease,
	// since a publish already under way is interrupted only if the
	// publisher honours the message context. It is also how long the rows
	// of a crashed instance wait before another takes them.
	LeaseDuration time.Duration

	// Concurrency is the number of keys published at once (default 8).
	// Events of one ordered key are always published one at a time. A
	// publish running eight times longer than the recent typical one (at
	// least 2ms, at most SlowPublish) stops counting against it, so a few
	// slow publishes do not take every slot: slow publishes go on beside
	// up to Concurrency others, so at most
	// MaxInFlight publishes run at once against a struggling broker.
	// Bound the publisher's own timeout (natsjs PublishTimeout, the kafka
	// package's producer timeouts): a publish that never returns keeps its
	// rows leased (the heartbeat renews them) and its place in MaxInFlight
	// until shutdown abandons it.
	Concurrency int

	// Hedge sends a publish again, beside the call under way, once that
	// has run HedgeAfter without returning, and once more if neither
	// returned HedgeAfter later (MaxHedges); the first call to succeed
	// counts, and the message contexts of the others are cancelled
	// (hedged requests, as in Dean and Barroso's "The Tail at Scale").
	// Under per-key order a key's next events wait for its publish under
	// way, so one broker call that stalls (a lost packet, a leader
	// election, a paused broker connection) holds back its key for its
	// whole length; hedged, for about HedgeAfter. A failure ends the
	// hedging of its publish (another call would be a retry without
	// backoff); the calls still running may yet succeed. The cost: when
	// two calls succeed, the broker gets the message twice, and the later
	// copy can arrive after the key's next event. Delivery is
	// at-least-once anyway; consumers that deduplicate by event id (the
	// generated ones, package inbox) drop it, and NATS JetStream drops it
	// by Nats-Msg-Id within the stream's duplicate window. Hedges run
	// beside the Concurrency slots, as slow publishes do, and are
	// throttled (HedgeBurst, HedgeEvery, kept across Run and RunOnce
	// calls), so a broker that is slow as a whole does not get twice the
	// calls. Run and RunOnce wait for the calls left running before they
	// return; once their context is done, at most ShutdownTimeout.
	// Default false.
	Hedge bool
	// HedgeAfter is how long a publish runs before Hedge sends it again;
	// shorter than PublishTimeout. Default (0): when it counts as slow,
	// eight times the recent typical publish, at least 2ms, at most
	// SlowPublish (see Concurrency); SlowPublish until the relay has seen
	// 16 publishes of the Run or RunOnce call. Set it above the
	// broker's usual tail (its p99) to hedge less often.
	HedgeAfter time.Duration

	// MaxAttempts is the number of failed publishes after which a row is
	// marked FAILED (status 2) and waits for an operator (default 5).
	MaxAttempts int

	// Backoff returns the delay before the next attempt after the
	// attempt-th failed publish of a row (attempt starts at 1). Default:
	// DefaultBackoff (1 min doubling to a 64 min cap, ±20% jitter).
	Backoff func(attempt int) time.Duration

	// PublishTimeout bounds how long one batch publishes (default 1
	// minute): past it the batch starts no new publish and releases the
	// rows it did not get to. A publish already running is waited for (it
	// is interrupted only if the publisher honours the message context),
	// so the publisher's own timeout must be bounded too: e.g. natsjs
	// PublishTimeout (5s by default), the kafka package's producer
	// timeouts. Meanwhile the relay keeps the batch's lease alive.
	PublishTimeout time.Duration

	// BreakerBackoff returns the pause of the circuit breaker after its
	// n-th consecutive outage batch or failed probe (n starts at 1).
	// The breaker opens when every publish of a batch fails, with errors
	// not marked Permanent, across at least two distinct keys: such rows
	// are released without charging an attempt, and the relay claims
	// nothing until the pause is over; then it publishes one probe row
	// (not charged either) and closes the breaker at the first success.
	// A single failing key never opens it. Default: 1s doubling to 1
	// minute, ±20% jitter.
	BreakerBackoff func(n int) time.Duration

	// DatabaseBackoffMax caps the pause of Run after consecutive
	// database errors (default 30s). After a failed poll (the database is
	// down, unreachable or misconfigured) Run waits PollInterval (at least
	// 100 ms), then twice that, and so on up to this cap, each pause
	// jittered within its upper half; the first successful poll resets it.
	// Neither Notify nor an open circuit breaker shortens these pauses.
	// Each failed poll is logged once, with the pause that follows it.
	DatabaseBackoffMax time.Duration

	// ShutdownTimeout bounds how long Run keeps publishing the current
	// batch after its context is cancelled (default 10s). It must be
	// shorter than LeaseDuration. Publishes are interrupted through the
	// message context a little before it (a fifth of it, at most 1s);
	// publishes still running when it passes are abandoned, their rows
	// left leased until the lease lapses. Results are recorded afterwards
	// in any case.
	ShutdownTimeout time.Duration

	// InstanceID names this relay in lease_owner and logs (default
	// hostname-pid-random; at most 64 bytes). It must be unique among the
	// relays sharing a table.
	InstanceID string

	// OverdueAfter, when positive, restricts every claim to rows created
	// at least this long ago (by the database clock), leaving younger rows
	// to the regular relays: the sweeper's rescue pass (package sweeper).
	// Zero (the default) claims every claimable row.
	OverdueAfter time.Duration

	// HoldRecheck is how long a row the relay found waiting behind a
	// FAILED row of its key is held: kept out of claims, so that a key
	// stuck with thousands of events behind it costs the other keys
	// nothing (default 5 minutes). A requeue or a deletion of the FAILED
	// row (driver RequeueAndRelease, DeleteFailed) ends the hold at once,
	// also for a claim that read the key meanwhile; the recheck only
	// matters when the row went another way (deleted by hand) and, on
	// MySQL and MariaDB, for a row of the key written while the requeue
	// or deletion ran, which a claim may still hold (their
	// claim reads the key without locks). Rows behind a backing-off row
	// are held until its next attempt, whatever HoldRecheck is.
	HoldRecheck time.Duration

	// OnFailed, if set, is called once for each row this relay marks
	// FAILED, after the result is recorded (e.g. to alert a human). It
	// must not block for long.
	OnFailed func(FailedEvent)

	// Logger receives structured logs (default slog.Default()).
	Logger *slog.Logger

	// TracerProvider makes the producer span of each publish ("send
	// <topic>", a child of the span that wrote the event, linked to it),
	// whose context goes into the message for the consumer. Default: the
	// global OpenTelemetry provider (a no-op unless installed; the
	// writer's trace context then passes through unchanged).
	TracerProvider trace.TracerProvider
	// MeterProvider makes the relay's instruments (outboxgen.relay.*, see
	// telemetry.go). Default: the global OpenTelemetry provider; the
	// runner passes its own.
	MeterProvider metric.MeterProvider
}

func (o *Config) setDefaults() {
	if o.BatchSize == 0 {
		o.BatchSize = DefaultBatchSize
	}
	if o.PollInterval == 0 {
		o.PollInterval = DefaultPollInterval
	}
	if o.LeaseDuration == 0 {
		o.LeaseDuration = DefaultLeaseDuration
	}
	if o.Concurrency == 0 {
		o.Concurrency = DefaultConcurrency
	}
	if o.MaxInFlight == 0 && o.BatchSize > 0 {
		o.MaxInFlight = 4 * o.BatchSize
	}
	if o.ParallelClaims == 0 {
		o.ParallelClaims = DefaultParallelClaims
	}
	if o.MaxAttempts == 0 {
		o.MaxAttempts = DefaultMaxAttempts
	}
	if o.Backoff == nil {
		o.Backoff = DefaultBackoff
	}
	if o.ShutdownTimeout == 0 {
		o.ShutdownTimeout = DefaultShutdownTimeout
	}
	if o.PublishTimeout == 0 {
		o.PublishTimeout = DefaultPublishTimeout
	}
	if o.BreakerBackoff == nil {
		o.BreakerBackoff = ExponentialBackoff(DefaultBreakerInitial, DefaultBreakerMax, DefaultBackoffJitter)
	}
	if o.DatabaseBackoffMax == 0 {
		o.DatabaseBackoffMax = DefaultDatabaseBackoffMax
	}
	if o.HoldRecheck == 0 {
		o.HoldRecheck = DefaultHoldRecheck
	}
	if o.InstanceID == "" {
		o.InstanceID = instanceid.New("", "relay")
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
}

// Validate reports every invalid setting (joined with errors.Join), each
// saying how to fix it. It checks the options as given; New applies the
// defaults first.
func (o Config) Validate() error {
	var errs []error
	if o.Publisher == nil {
		errs = append(errs, errors.New("relay: Config.Publisher is nil: set it to a watermill message.Publisher"))
	}
	if o.BatchSize < 1 || o.BatchSize > MaxBatchSize {
		errs = append(errs, fmt.Errorf("relay: Config.BatchSize is %d: use 1 to %d (or 0 for %d)", o.BatchSize, MaxBatchSize, DefaultBatchSize))
	}
	if o.MaxInFlight < o.BatchSize || o.MaxInFlight > MaxRowsInFlight {
		errs = append(errs, fmt.Errorf("relay: Config.MaxInFlight is %d: use BatchSize (%d) to %d (or 0 for 4 × BatchSize)", o.MaxInFlight, o.BatchSize, MaxRowsInFlight))
	}
	if o.ParallelClaims < 1 || o.ParallelClaims > MaxParallelClaims {
		errs = append(errs, fmt.Errorf("relay: Config.ParallelClaims is %d: use 1 to %d (or 0 for %d)", o.ParallelClaims, MaxParallelClaims, DefaultParallelClaims))
	}
	if o.PollInterval <= 0 {
		errs = append(errs, fmt.Errorf("relay: Config.PollInterval is %s: use a positive duration (or 0 for %s)", o.PollInterval, DefaultPollInterval))
	}
	if o.LeaseDuration <= 0 {
		errs = append(errs, fmt.Errorf("relay: Config.LeaseDuration is %s: use a positive duration longer than a batch takes to publish (or 0 for %s)", o.LeaseDuration, DefaultLeaseDuration))
	}
	if o.Concurrency < 1 {
		errs = append(errs, fmt.Errorf("relay: Config.Concurrency is %d: use at least 1 (or 0 for %d)", o.Concurrency, DefaultConcurrency))
	}
	if o.MaxAttempts < 1 {
		errs = append(errs, fmt.Errorf("relay: Config.MaxAttempts is %d: use at least 1 (or 0 for %d)", o.MaxAttempts, DefaultMaxAttempts))
	}
	if o.Backoff == nil {
		errs = append(errs, errors.New("relay: Config.Backoff is nil: set it, or leave it nil before New to use DefaultBackoff"))
	}
	if o.ShutdownTimeout <= 0 {
		errs = append(errs, fmt.Errorf("relay: Config.ShutdownTimeout is %s: use a positive duration (or 0 for %s)", o.ShutdownTimeout, DefaultShutdownTimeout))
	} else if o.LeaseDuration > 0 && o.ShutdownTimeout >= o.LeaseDuration {
		errs = append(errs, fmt.Errorf("relay: Config.ShutdownTimeout (%s) must be shorter than Config.LeaseDuration (%s): publishing past the lease lets another instance publish the same rows", o.ShutdownTimeout, o.LeaseDuration))
	}
	if o.PublishTimeout <= 0 {
		errs = append(errs, fmt.Errorf("relay: Config.PublishTimeout is %s: use a positive duration (or 0 for %s)", o.PublishTimeout, DefaultPublishTimeout))
	}
	if o.BreakerBackoff == nil {
		errs = append(errs, errors.New("relay: Config.BreakerBackoff is nil: set it, or leave it nil before New to use the default (1s doubling to 1m)"))
	}
	if o.DatabaseBackoffMax <= 0 {
		errs = append(errs, fmt.Errorf("relay: Config.DatabaseBackoffMax is %s: use a positive duration (or 0 for %s)", o.DatabaseBackoffMax, DefaultDatabaseBackoffMax))
	}
	if err := hedge.CheckConfig("relay", o.Hedge, o.HedgeAfter, o.PublishTimeout); err != nil {
		errs = append(errs, err)
	}
	if o.OverdueAfter < 0 {
		errs = append(errs, fmt.Errorf("relay: Config.OverdueAfter is %s: use 0 (claim every row) or a positive duration", o.OverdueAfter))
	}
	if o.HoldRecheck < 0 {
		errs = append(errs, fmt.Errorf("relay: Config.HoldRecheck is %s: use a positive duration (or 0 for %s)", o.HoldRecheck, DefaultHoldRecheck))
	}
	if o.InstanceID == dialect.HeldOwner {
		errs = append(errs, fmt.Errorf("relay: Config.InstanceID %q is reserved for held rows: choose another", o.InstanceID))
	}
	if o.InstanceID == "" || len(o.InstanceID) > MaxInstanceID {
		errs = append(errs, fmt.Errorf("relay: Config.InstanceID %q must be 1 to %d bytes (leave it empty for hostname-pid-random)", o.InstanceID, MaxInstanceID))
	}
	if o.Logger == nil {
		errs = append(errs, errors.New("relay: Config.Logger is nil: set it, or leave it nil before New to use slog.Default()"))
	}
	return errors.Join(errs...)
}

// unorderedTypes returns the names of the event types listed unordered.
func (o *Config) unorderedTypes() []string {
	var out []string
	seen := map[string]bool{}
	for _, et := range o.EventTypes {
		if !et.Ordered && !seen[et.Name] {
			seen[et.Name] = true
			out = append(out, et.Name)
		}
	}
	return out
}

// DefaultBackoff is the seed design's schedule: 1, 2, 4, ... minutes after
// the 1st, 2nd, 3rd ... failure, capped at 64 minutes, with ±20% jitter so
// that rows failed together do not retry together.
func DefaultBackoff(attempt int) time.Duration {
	return ExponentialBackoff(DefaultBackoffInitial, DefaultBackoffMax, DefaultBackoffJitter)(attempt)
}

// ExponentialBackoff returns a Backoff: initial after the first failure,
// doubling per failure up to max, each multiplied by a random factor in
// [1-jitter, 1+jitter] (jitter in [0, 1)).
func ExponentialBackoff(initial, max time.Duration, jitter float64) func(attempt int) time.Duration {
	return func(attempt int) time.Duration {
		d := initial
		for i := 1; i < attempt && d < max; i++ {
			d *= 2
		}
		if d > max {
			d = max
		}
		if jitter > 0 {
			d = time.Duration(float64(d) * (1 - jitter + 2*jitter*mathrand.Float64()))
		}
		return d
	}
}
