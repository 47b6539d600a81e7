package walrelay

import (
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5/pgconn"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"

	"github.com/outboxgen/outboxgen/runtime/internal/hedge"
	"github.com/outboxgen/outboxgen/runtime/internal/instanceid"
	"github.com/outboxgen/outboxgen/runtime/relay"
)

// Defaults of Config.
const (
	DefaultConcurrency      = 16
	DefaultMaxInFlight      = 4096
	DefaultMaxInFlightBytes = 64 << 20
	DefaultMaxUnconfirmed   = 1 << 18
	DefaultQuickRetries     = 3
	DefaultRetryDelay       = 200 * time.Millisecond
	DefaultParkAloneAfter   = 10 * time.Second
	DefaultPublishTimeout   = 30 * time.Second
	DefaultStatusInterval   = time.Second
	DefaultTakeoverInterval = 5 * time.Second
	DefaultShutdownTimeout  = 10 * time.Second
	DefaultMaxParkedKeys    = 100_000
	DefaultReconnectMax     = 30 * time.Second

	// MaxInFlightLimit bounds Config.MaxInFlight (events held in memory).
	MaxInFlightLimit = 1 << 20
	// MaxUnconfirmedLimit bounds Config.MaxUnconfirmed.
	MaxUnconfirmedLimit = 1 << 24
)

// Config configures a Relay. The zero value of every field but Publisher
// means "use the default".
type Config struct {
	// Publisher receives every event. Required: the same watermill
	// publisher the polling relay uses.
	Publisher message.Publisher

	// Slot is the logical replication slot's name (default
	// "outboxgen_" + the outbox table). It is created (pgoutput) when
	// missing. The slot is also the lock: one relay streams from it at a
	// time; others wait as standbys.
	Slot string
	// Publication is the publication pgoutput is started with (default
	// the slot's name). pgoutput needs one even to send logical decoding
	// messages only: it is created, empty (FOR no table), when missing.
	Publication string

	// FailoverSlot creates a missing slot as a failover slot (PostgreSQL
	// 17+: pg_create_logical_replication_slot(..., failover => true)), so
	// that a physical standby with sync_replication_slots = on keeps it in
	// step and the relay resumes on the new primary after a failover. On
	// older servers the creation fails with what to do.
	FailoverSlot bool
	// NoCreateSlot makes Run stop, with what to do, instead of creating a
	// missing slot: only Setup (outboxgen wal setup, an operator's step)
	// creates it. A relay never recreates a slot it found or streamed
	// from, but a new process cannot tell a slot lost in a failover, or
	// dropped, from one never created: restarted by a supervisor after a
	// failover, it would create a new slot at the current position and
	// hide the events committed in between. Set it once the slot exists.
	NoCreateSlot bool

	// Replication is the connection configuration of the replication
	// connection. Default: the pool's, with replication=database. Its role
	// needs the REPLICATION attribute.
	Replication *pgconn.Config

	// Concurrency is the number of Publish calls under way at once
	// (default 16). A call carries one event or, when events of several
	// keys are waiting, the next events of up to MaxPublishBatch keys (of
	// one topic). Events of one key are published one at a time, in
	// commit order. A call that runs eight times the typical one (2ms to
	// 250ms) stops counting: another takes its place, so calls that stall
	// hold back their own keys, not the others (as the polling relay's
	// slow publishes give back their slot). At most SlowCallsPerSlot ×
	// Concurrency places are given back at once (a slow batch call gives
	// one, a slow single delivery two, its own and its worker's, or one
	// when its worker was handed off already); beyond them a slow
	// call keeps it, so the calls under way stay a small multiple of
	// Concurrency even when the broker stalls every call (times 1 +
	// relay.MaxHedges with Hedge).
	Concurrency int
	// MaxInFlight bounds the events received from the stream and not yet
	// settled (default 4096): neither acknowledged by the broker nor
	// parked. Their content is in memory. At the bound the relay stops
	// reading the stream (PostgreSQL keeps the WAL), so a broker outage
	// cannot make the relay's memory grow without end. One exception, up
	// to twice this bound (and MaxInFlightBytes, MaxUnconfirmed +
	// MaxInFlight): while the circuit breaker is open and every key in
	// flight has failed since it opened, the relay reads on, a new key at
	// a time, so that another key's event can probe; poison events of a
	// few keys, with their keys' later events behind them, would
	// otherwise hold the breaker open, and the stream, for good.
	MaxInFlight int
	// MaxInFlightBytes bounds the content bytes of the events received and
	// not yet acknowledged or parked (default 64 MiB): the memory a broker
	// outage can hold, whatever the events' size. At the bound the relay
	// stops reading, as at MaxInFlight; one event is always admitted, so a
	// single event larger than the bound still goes through. 64 MiB binds
	// only when events average over 16 KiB (64 MiB / the default
	// MaxInFlight), so typical events keep the whole MaxInFlight of
	// lookahead, while events of the largest default size (MaxMessageBytes,
	// about 1 MiB) are held by about 60, enough to keep Concurrency
	// publishes busy, instead of 4096 (4 GiB).
	MaxInFlightBytes int
	// MaxUnconfirmed bounds the events received and not yet confirmed to
	// PostgreSQL (default 262,144): the unsettled ones and those settled in
	// a transaction that waits behind an unsettled one (the confirmed
	// position only passes whole transactions, in commit order). A settled
	// event keeps no content, only its transaction's place in the commit
	// order (under 100 bytes per transaction), so one slow event at the head
	// (a publish taking up to PublishTimeout per attempt) holds back only
	// its key while the other keys go on for this many events; at the bound
	// the relay stops reading. They are also what a crash publishes again:
	// a relay resumes at the confirmed position.
	MaxUnconfirmed int

	// QuickRetries is the number of publish attempts of an event, RetryDelay
	// apart, before it is parked in the outbox table (default 3). Attempts
	// made while the circuit breaker is open do not count. One more is
	// made when the broker accepted another call begun after the event
	// first failed only once the last attempt had begun (it may have come
	// back meanwhile), and more, for ParkAloneAfter, when its key fails
	// alone.
	QuickRetries int
	// RetryDelay is the pause between quick retries (default 200ms).
	RetryDelay time.Duration
	// ParkAloneAfter is how long an event whose quick retries failed is
	// retried further when its key fails alone: the broker accepted no
	// other call begun since the event first failed, and none is under
	// way to tell a broker outage from a poison event (a quiet moment).
	// The pauses double from RetryDelay up to a second, cut short when
	// such a call succeeds or the breaker opens; the broker's return, or another key's
	// publish, decides; after this long it is parked (default 10s; 1ns:
	// at once). So a short outage at a quiet moment is ridden out instead
	// of sending the key to the polling relay, whose first retry of a
	// parked event comes Backoff later (a minute by default); the cost is
	// this long before a poison event, alone, is parked.
	ParkAloneAfter time.Duration
	// Backoff gives the next_retry_time of a parked event, after its
	// attempt-th failure (default relay.DefaultBackoff, as the polling
	// relay's). The parked row is charged one attempt.
	Backoff func(attempt int) time.Duration
	// BreakerBackoff is the circuit breaker's pause after its n-th trip or
	// failed probe (default 1s doubling to 1 minute, ±20%).
	BreakerBackoff func(n int) time.Duration
	// PublishTimeout bounds one publish (default 30s): the message context
	// is cancelled then; bound the publisher's own timeout too.
	PublishTimeout time.Duration

	// Hedge sends a Publish call again, beside the call under way, once
	// that has run HedgeAfter without returning, and once more if neither
	// returned HedgeAfter later (relay.MaxHedges); the first call to
	// succeed counts, and the message contexts of the others are
	// cancelled. It is the polling relay's Config.Hedge, with the same
	// throttle (relay.HedgeBurst, relay.HedgeEvery, kept across Run's
	// sessions): a call that stalls (a lost packet, a leader election)
	// holds back the keys it carries, up to MaxPublishBatch of them, for
	// about HedgeAfter instead of its whole length. A call of several
	// events is not sent again whole: at HedgeAfter its events are
	// published one by one beside it, each hedged in turn, so a stall
	// that hits one of them (its partition or subject) holds back its key
	// only, and a copy of the whole call cannot stall on it again (the
	// split takes one hedge of the throttle). A failure ends the
	// hedging of its call (another call would be a retry without
	// RetryDelay); the calls still running may yet succeed. The cost:
	// when two calls succeed, the broker gets the messages twice, and a
	// later copy can arrive after its key's next event; consumers that
	// deduplicate by event id drop it. Run waits for the losing calls,
	// cancelled, before it returns, at most ShutdownTimeout (not for a
	// call given up at PublishTimeout). Default false.
	Hedge bool
	// HedgeAfter is how long a Publish call runs before Hedge sends it
	// again; shorter than PublishTimeout. Default (0): eight times the
	// recent typical call, at least 2ms, at most 250ms; 250ms until the
	// relay has seen 16 calls.
	HedgeAfter time.Duration

	// StatusInterval is how often the relay reports its confirmed position
	// to PostgreSQL and samples the slot's lag (default 1s; PostgreSQL's
	// wal_sender_timeout, 60s by default, must be longer).
	StatusInterval time.Duration
	// TakeoverInterval is how often a standby tries to start streaming
	// while another instance holds the slot (default 5s): the longest a
	// dead instance's stream stays idle once PostgreSQL noticed the death.
	TakeoverInterval time.Duration
	// ShutdownTimeout bounds how long Run waits for the publishes under way
	// after its context is cancelled (default 10s).
	ShutdownTimeout time.Duration
	// ReconnectMax caps the pause between attempts after a connection or
	// database error (default 30s).
	ReconnectMax time.Duration

	// MaxParkedKeys bounds the keys remembered as parked (with unsent rows
	// in the outbox table). Above it, every streamed event checks the table
	// for its key instead (default 100000).
	MaxParkedKeys int
	// MaxMessageBytes caps a logical message's content the relay decodes
	// (default outbox.MaxWALEnvelope, for writers with the default
	// outbox.MaxMessageSize). A larger message is not skipped: Run stops
	// before it with an error, and the next relay with a higher cap reads
	// it. Writers with a larger WithMaxMessageSize need at least theirs
	// plus 64 KiB here.
	MaxMessageBytes int

	// OnMalformed, if set, is called for each message of the outbox's
	// prefix that could not be decoded, after it was logged (it is then
	// skipped: no relay could publish it). Messages that another relay
	// could read (over MaxMessageBytes, a newer envelope version) are not
	// malformed: Run stops before them. It must not block for long.
	OnMalformed func(Malformed)

	// InstanceID names this relay in logs (default hostname-pid-random).
	InstanceID string
	// Logger receives structured logs (default slog.Default()).
	Logger *slog.Logger
	// TracerProvider and MeterProvider default to the global ones. The
	// relay records the polling relay's publish instruments
	// (outboxgen.relay.*) and its own (outboxgen.walrelay.*).
	TracerProvider trace.TracerProvider
	MeterProvider  metric.MeterProvider
}

// Malformed describes a logical message of the outbox's prefix that could
// not be decoded.
type Malformed struct {
	// LSN is the message's position in the WAL.
	LSN string
	// Size is the content's length in bytes.
	Size int
	// Error says what is wrong.
	Error error
}

// DefaultSlot is the default replication slot (and publication) name of
// the outbox table table: "outboxgen_" + table.
func DefaultSlot(table string) string { return "outboxgen_" + table }

func (c *Config) setDefaults(table string) {
	if c.Slot == "" {
		c.Slot = DefaultSlot(table)
	}
	if c.Publication == "" {
		c.Publication = c.Slot
	}
	if c.Concurrency == 0 {
		c.Concurrency = DefaultConcurrency
	}
	if c.MaxInFlight == 0 {
		c.MaxInFlight = DefaultMaxInFlight
	}
	if c.MaxInFlightBytes == 0 {
		c.MaxInFlightBytes = DefaultMaxInFlightBytes
	}
	if c.MaxUnconfirmed == 0 {
		c.MaxUnconfirmed = DefaultMaxUnconfirmed
	}
	if c.QuickRetries == 0 {
		c.QuickRetries = DefaultQuickRetries
	}
	if c.RetryDelay == 0 {
		c.RetryDelay = DefaultRetryDelay
	}
	if c.ParkAloneAfter == 0 {
		c.ParkAloneAfter = DefaultParkAloneAfter
	}
	if c.Backoff == nil {
		c.Backoff = relay.DefaultBackoff
	}
	if c.BreakerBackoff == nil {
		c.BreakerBackoff = relay.ExponentialBackoff(relay.DefaultBreakerInitial, relay.DefaultBreakerMax, relay.DefaultBackoffJitter)
	}
	if c.PublishTimeout == 0 {
		c.PublishTimeout = DefaultPublishTimeout
	}
	if c.StatusInterval == 0 {
		c.StatusInterval = DefaultStatusInterval
	}
	if c.TakeoverInterval == 0 {
		c.TakeoverInterval = DefaultTakeoverInterval
	}
	if c.ShutdownTimeout == 0 {
		c.ShutdownTimeout = DefaultShutdownTimeout
	}
	if c.ReconnectMax == 0 {
		c.ReconnectMax = DefaultReconnectMax
	}
	if c.MaxParkedKeys == 0 {
		c.MaxParkedKeys = DefaultMaxParkedKeys
	}
	if c.InstanceID == "" {
		c.InstanceID = instanceid.New("", "walrelay")
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
}

// Validate reports every invalid setting, each saying how to fix it. New
// applies the defaults first.
func (c Config) Validate() error {
	var errs []error
	if c.Publisher == nil {
		errs = append(errs, errors.New("walrelay: Config.Publisher is nil: set it to a watermill message.Publisher"))
	}
	if !validSlotName(c.Slot) {
		errs = append(errs, fmt.Errorf("walrelay: Config.Slot %q is not a valid replication slot name: use 1 to 63 lower-case letters, digits and underscores", c.Slot))
	}
	if !validSlotName(c.Publication) {
		errs = append(errs, fmt.Errorf("walrelay: Config.Publication %q is not a valid name: use 1 to 63 lower-case letters, digits and underscores", c.Publication))
	}
	if c.Concurrency < 1 {
		errs = append(errs, fmt.Errorf("walrelay: Config.Concurrency is %d: use at least 1 (or 0 for %d)", c.Concurrency, DefaultConcurrency))
	}
	if c.MaxInFlight < 1 || c.MaxInFlight > MaxInFlightLimit {
		errs = append(errs, fmt.Errorf("walrelay: Config.MaxInFlight is %d: use 1 to %d (or 0 for %d)", c.MaxInFlight, MaxInFlightLimit, DefaultMaxInFlight))
	}
	if c.MaxInFlightBytes < 1 {
		errs = append(errs, fmt.Errorf("walrelay: Config.MaxInFlightBytes is %d: use a positive size in bytes (or 0 for %d, 64 MiB)", c.MaxInFlightBytes, DefaultMaxInFlightBytes))
	}
	if c.MaxUnconfirmed < 1 || c.MaxUnconfirmed > MaxUnconfirmedLimit {
		errs = append(errs, fmt.Errorf("walrelay: Config.MaxUnconfirmed is %d: use 1 to %d (or 0 for %d)", c.MaxUnconfirmed, MaxUnconfirmedLimit, DefaultMaxUnconfirmed))
	}
	if c.QuickRetries < 1 {
		errs = append(errs, fmt.Errorf("walrelay: Config.QuickRetries is %d: use at least 1 (or 0 for %d)", c.QuickRetries, DefaultQuickRetries))
	}
	for _, d := range []struct {
		name string
		v    time.Duration
	}{{"RetryDelay", c.RetryDelay}, {"ParkAloneAfter", c.ParkAloneAfter}, {"PublishTimeout", c.PublishTimeout}, {"StatusInterval", c.StatusInterval},
		{"TakeoverInterval", c.TakeoverInterval}, {"ShutdownTimeout", c.ShutdownTimeout}, {"ReconnectMax", c.ReconnectMax}} {
		if d.v <= 0 {
			errs = append(errs, fmt.Errorf("walrelay: Config.%s is %s: use a positive duration (or 0 for the default)", d.name, d.v))
		}
	}
	if err := hedge.CheckConfig("walrelay", c.Hedge, c.HedgeAfter, c.PublishTimeout); err != nil {
		errs = append(errs, err)
	}
	if c.MaxParkedKeys < 1 {
		errs = append(errs, fmt.Errorf("walrelay: Config.MaxParkedKeys is %d: use at least 1 (or 0 for %d)", c.MaxParkedKeys, DefaultMaxParkedKeys))
	}
	if c.MaxMessageBytes < 0 {
		errs = append(errs, fmt.Errorf("walrelay: Config.MaxMessageBytes is %d: use 0 for the default or a positive size", c.MaxMessageBytes))
	}
	if c.Logger == nil {
		errs = append(errs, errors.New("walrelay: Config.Logger is nil: leave it nil before New to use slog.Default()"))
	}
	return errors.Join(errs...)
}

// validSlotName reports whether s is a valid replication slot name
// (PostgreSQL: lower-case letters, digits and underscores, at most 63).
func validSlotName(s string) bool {
	if s == "" || len(s) > 63 {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '_') {
			return false
		}
	}
	return true
}
