package main

// The long-running commands: `outboxgen relay` (relay, sweeper, monitor
// and janitor in one process, package runtime/runner), and `outboxgen
// sweep` / `outboxgen janitor`, whose -once runs one pass for a Kubernetes
// CronJob. Every option of the runtime's Configs is a flag (with the
// runtime's default), an environment variable and a -config key (see
// config.go).

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"go.opentelemetry.io/otel/metric"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/redis/go-redis/v9"

	"github.com/outboxgen/outboxgen/generator/spec"
	"github.com/outboxgen/outboxgen/runtime/brokers/brokerurl"
	"github.com/outboxgen/outboxgen/runtime/dialect"
	"github.com/outboxgen/outboxgen/runtime/driver"
	"github.com/outboxgen/outboxgen/runtime/dsn"
	"github.com/outboxgen/outboxgen/runtime/janitor"
	"github.com/outboxgen/outboxgen/runtime/monitor"
	"github.com/outboxgen/outboxgen/runtime/outbox"
	"github.com/outboxgen/outboxgen/runtime/redact"
	"github.com/outboxgen/outboxgen/runtime/relay"
	"github.com/outboxgen/outboxgen/runtime/runner"
	"github.com/outboxgen/outboxgen/runtime/sweeper"
	"github.com/outboxgen/outboxgen/runtime/walrelay"
)

// procFlags are the flags of one long-running command; which groups exist
// depends on the command (see newRelayFlags, newSweepFlags,
// newJanitorFlags).
type procFlags struct {
	fl  *flag.FlagSet
	db  *dbFlags
	cmd string

	config      string
	broker      string
	logLevel    string
	metricsAddr string
	readyWindow time.Duration
	once        bool

	runRelay, runSweeper, runMonitor, runJanitor bool

	// relay.Config (the publishing ones are shared with the sweeper)
	batchSize, concurrency, maxAttempts          int
	maxInFlight                                  int
	parallelClaims                               int
	pollInterval, lease, shutdown, publish       time.Duration
	dbBackoffMax                                 time.Duration
	holdRecheck                                  time.Duration
	hedge                                        bool
	hedgeAfter                                   time.Duration
	instanceID                                   string
	backoffInitial, backoffMax                   time.Duration
	backoffJitter                                float64
	breakerInitial, breakerMax                   time.Duration
	sweepInterval, overdueAfter                  time.Duration
	sweeperInstanceID                            string
	monitorInterval, staleAfter, alertOldestAge  time.Duration
	monitorCheckTimeout                          time.Duration
	alertStale, alertFailed, alertExpired        int64
	monitorAttrs                                 string
	janitorInterval, retention, inboxRetention   time.Duration
	archive                                      bool
	janitorBatchSize                             int
	janitorBatchPause                            time.Duration
	hasRelay, hasSweeper, hasMonitor, hasJanitor bool

	// WAL mode (sql.wal): the streaming relay's slot settings (wal.go's
	// part of this file: runWAL).
	walSlot       string
	walFailover   bool
	walCreateSlot bool
	walMaxMessage int
	maxSlotLag    int64
}

// Flag groups of newProcFlags.
const (
	groupRelay   = 1 << iota // relay-only settings (poll interval, instance id)
	groupPublish             // publishing settings (relay and sweeper)
	groupSweeper
	groupMonitor
	groupJanitor
	groupBroker
	groupServer // -metrics-addr, -ready-window
	groupOnce   // -once
	groupSwitch // -relay, -sweeper, -monitor, -janitor
)

const brokerHelp = "the broker: nats://host:4222 (JetStream), kafka://b1:9092,b2:9092, amqp://user:pass@host:5672/vhost, redis://host:6379/0, or stdout: (one JSON line per message)"

// newProcFlags defines the flags of the groups in which on a FlagSet for
// command cmd.
func newProcFlags(cmd, synopsis string, groups int, stderr io.Writer) *procFlags {
	fl := newFlags(cmd, synopsis, stderr)
	p := &procFlags{fl: fl, cmd: cmd}
	p.db = addDBFlags(fl, false)
	fl.StringVar(&p.config, configFlag, "", "read settings from this YAML file: keys are flag names (batch-size: 200); flags and $OUTBOXGEN_<FLAG> variables win over it")
	fl.StringVar(&p.logLevel, "log-level", "info", "least level logged: debug, info, warn or error (logs are JSON lines on stderr)")
	if groups&groupBroker != 0 {
		fl.StringVar(&p.broker, "broker", "", brokerHelp+" (required)")
	}
	if groups&groupServer != 0 {
		fl.StringVar(&p.metricsAddr, "metrics-addr", "", "serve /metrics (Prometheus), /healthz and /readyz on this address, e.g. :9090 (default: no server)")
		fl.DurationVar(&p.readyWindow, "ready-window", runner.DefaultReadyWindow, "/readyz trusts a database call this recent; older, it probes the database itself")
	}
	if groups&groupOnce != 0 {
		fl.BoolVar(&p.once, "once", false, "run one pass and exit: 0 when it completed, 1 with the error otherwise (for a Kubernetes CronJob)")
	}
	if groups&groupSwitch != 0 {
		fl.BoolVar(&p.runRelay, "relay", true, "run the relay")
		fl.BoolVar(&p.runSweeper, "sweeper", true, "run the sweeper (publishes rows overdue by -overdue-after that no relay took)")
		fl.BoolVar(&p.runMonitor, "monitor", true, "run the monitor (gauges on /metrics, alerts in the log)")
		fl.BoolVar(&p.runJanitor, "janitor", true, "run the janitor (deletes sent rows after -retention)")
	}
	if groups&groupRelay != 0 {
		p.hasRelay = true
		fl.DurationVar(&p.pollInterval, "poll-interval", relay.DefaultPollInterval, "relay: delay between the end of one poll and the next")
		fl.IntVar(&p.maxInFlight, "max-in-flight", 0, "relay: most rows leased and not yet recorded at once; the next batch is claimed while slow publishes run, up to it (0: 4 × -batch-size)")
		fl.IntVar(&p.parallelClaims, "parallel-claims", 0, "relay: claims run at once while a backlog lasts (0: 2; 1: one at a time)")
		fl.StringVar(&p.instanceID, "instance-id", "", "relay: lease owner name, unique among the relays of a table, at most 64 bytes (default hostname-pid-random)")
		fl.StringVar(&p.walSlot, "wal-slot", "", "relay, with sql.wal: the logical replication slot the streaming relay reads (default outboxgen_<outbox table>; the publication is always outboxgen_<outbox table>, as the grants script creates it)")
		fl.BoolVar(&p.walFailover, "wal-failover-slot", false, "relay, with sql.wal: create a missing slot as a failover slot (PostgreSQL 17+), so that it survives a failover to a standby with sync_replication_slots = on")
		fl.BoolVar(&p.walCreateSlot, "wal-create-slot", true, "relay, with sql.wal: create the slot when it does not exist; false: only outboxgen wal setup creates it, and the relay stops on a missing slot, so that a restart after a failover that lost the slot does not hide the events in between")
		fl.IntVar(&p.walMaxMessage, "wal-max-message-bytes", outbox.MaxWALEnvelope, "relay, with sql.wal: largest WAL message, in bytes, the streaming relay reads: at least the writers' WithMaxMessageSize plus 64 KiB (a larger message is not skipped: the streaming relay stops before it until this is raised)")
	}
	if groups&groupPublish != 0 {
		fl.IntVar(&p.batchSize, "batch-size", relay.DefaultBatchSize, fmt.Sprintf("most rows claimed per poll (1 to %d)", relay.MaxBatchSize))
		fl.IntVar(&p.concurrency, "concurrency", relay.DefaultConcurrency, "keys published at once (a key's events are always one at a time; a publish running 8x the typical one, 2ms to 250ms, frees its slot); with sql.wal, also the streaming relay's Publish calls at once (each one event, or the next events of up to 64 keys)")
		fl.IntVar(&p.maxAttempts, "max-attempts", relay.DefaultMaxAttempts, "failed publishes after which a row is marked FAILED")
		fl.DurationVar(&p.lease, "lease-duration", relay.DefaultLeaseDuration, "how long claimed rows stay reserved (extended while publishing); also how long a crashed instance's rows wait")
		fl.DurationVar(&p.shutdown, "shutdown-timeout", relay.DefaultShutdownTimeout, "on SIGTERM, keep publishing the batch in hand this long (shorter than -lease-duration)")
		fl.DurationVar(&p.publish, "publish-timeout", relay.DefaultPublishTimeout, "most time one batch publishes before releasing the rest")
		fl.DurationVar(&p.backoffInitial, "backoff-initial", relay.DefaultBackoffInitial, "retry delay after a row's first failed publish (doubling per failure)")
		fl.DurationVar(&p.backoffMax, "backoff-max", relay.DefaultBackoffMax, "longest retry delay of a row")
		fl.Float64Var(&p.backoffJitter, "backoff-jitter", relay.DefaultBackoffJitter, "random spread of retry and breaker delays, 0 to <1 (0.2: ±20%)")
		fl.DurationVar(&p.breakerInitial, "breaker-initial", relay.DefaultBreakerInitial, "circuit breaker pause after a batch failed on every key (broker outage), doubling")
		fl.DurationVar(&p.breakerMax, "breaker-max", relay.DefaultBreakerMax, "longest circuit breaker pause")
		fl.BoolVar(&p.hedge, "hedge", false, "send a publish again when it runs past -hedge-after (up to twice), and take the first success: a stalled broker call then holds back its key that long, not its whole length; costs a duplicate message (deduplicated by event id) when more than one call succeeds; at most one publish in ten after a burst of ten; with sql.wal, the streaming relay's Publish calls too")
		fl.DurationVar(&p.hedgeAfter, "hedge-after", 0, "with -hedge: how long a publish runs before it is sent again, up to twice; below -publish-timeout (0: when it counts as slow, 8x the typical publish, 2ms to 250ms)")
		fl.DurationVar(&p.holdRecheck, "hold-recheck", relay.DefaultHoldRecheck, "how long rows waiting behind a FAILED event of their key stay out of claims (a requeue releases them at once)")
	}
	if groups&(groupPublish|groupMonitor|groupJanitor) != 0 {
		fl.DurationVar(&p.dbBackoffMax, "database-backoff-max", relay.DefaultDatabaseBackoffMax, "longest pause after consecutive database errors (every part)")
	}
	if groups&groupSweeper != 0 {
		p.hasSweeper = true
		fl.DurationVar(&p.sweepInterval, "sweep-interval", sweeper.DefaultInterval, "sweeper: delay between the end of one sweep and the next")
		fl.DurationVar(&p.overdueAfter, "overdue-after", sweeper.DefaultOverdueAfter, "sweeper: age from which a pending row counts as left behind (keep it well above -poll-interval)")
		fl.StringVar(&p.sweeperInstanceID, "sweeper-instance-id", "", "sweeper: lease owner name (default sweeper-hostname-pid-random)")
	}
	if groups&groupMonitor != 0 {
		p.hasMonitor = true
		fl.DurationVar(&p.monitorInterval, "monitor-interval", monitor.DefaultInterval, "monitor: delay between checks (gauges go silent after 2 intervals without a good check)")
		fl.DurationVar(&p.monitorCheckTimeout, "monitor-check-timeout", 0, "monitor: longest one check may take before it fails as timed out, e.g. queued behind a lock on the outbox table or on a dead connection (default: -monitor-interval, 1s to 30s; at most 2 intervals)")
		fl.DurationVar(&p.staleAfter, "stale-after", monitor.DefaultStaleAfter, "monitor: age after which a pending row counts as stale")
		fl.Int64Var(&p.alertStale, "alert-stale", 0, "monitor: alert when more stale rows than this (-1: never)")
		fl.Int64Var(&p.alertFailed, "alert-failed", 0, "monitor: alert when more FAILED rows than this (-1: never)")
		fl.Int64Var(&p.alertExpired, "alert-expired-leases", 0, "monitor: alert when more expired leases than this (-1: never)")
		fl.DurationVar(&p.alertOldestAge, "alert-oldest-pending-age", 0, "monitor: alert when the oldest pending row is older than this (default: -stale-after; negative: never)")
		fl.StringVar(&p.monitorAttrs, "monitor-attributes", "", "monitor: extra metric attributes, key=value[,key=value] (e.g. service=orders)")
		fl.Int64Var(&p.maxSlotLag, "max-slot-lag-bytes", monitor.DefaultMaxSlotLagBytes, "monitor, with sql.wal: alert when the replication slot retains more WAL than this, in bytes, or is missing, idle or losing WAL (-1: never)")
	}
	if groups&groupJanitor != 0 {
		p.hasJanitor = true
		fl.DurationVar(&p.janitorInterval, "janitor-interval", janitor.DefaultInterval, "janitor: delay between the end of one run and the next")
		fl.DurationVar(&p.retention, "retention", janitor.DefaultRetention, "janitor: how long sent rows stay after sent_at (pending and FAILED rows are never removed)")
		fl.DurationVar(&p.inboxRetention, "inbox-retention", janitor.DefaultInboxRetention, "janitor: how long inbox rows stay after processed_at, longer than any broker redelivery (negative: keep them)")
		fl.BoolVar(&p.archive, "archive", false, "janitor: move sent rows into the archive table (sql.archive_table, or -archive-table) instead of deleting them")
		fl.IntVar(&p.janitorBatchSize, "janitor-batch-size", janitor.DefaultBatchSize, fmt.Sprintf("janitor: most rows one statement removes (1 to %d)", janitor.MaxBatchSize))
		fl.DurationVar(&p.janitorBatchPause, "janitor-batch-pause", janitor.DefaultBatchPause, "janitor: pause between batches (negative: none)")
	}
	return p
}

// newRelayFlags, newSweepFlags and newJanitorFlags are the FlagSets of
// the three commands (also read by the manifests' test).
func newRelayFlags(stderr io.Writer) *procFlags {
	return newProcFlags("relay", "relay -db DSN -broker URL [-f events.yaml] [-metrics-addr :9090] [-sweeper=false] [-monitor=false] [-janitor=false] [flags]",
		groupRelay|groupPublish|groupSweeper|groupMonitor|groupJanitor|groupBroker|groupServer|groupSwitch, stderr)
}

func newSweepFlags(stderr io.Writer) *procFlags {
	return newProcFlags("sweep", "sweep -db DSN -broker URL [-once] [-overdue-after 1m] [flags]",
		groupPublish|groupSweeper|groupBroker|groupServer|groupOnce, stderr)
}

func newJanitorFlags(stderr io.Writer) *procFlags {
	return newProcFlags("janitor", "janitor -db DSN [-once] [-retention 168h] [-archive] [flags]",
		groupJanitor|groupServer|groupOnce, stderr)
}

func cmdRelay(args []string, stdout, stderr io.Writer) error {
	p := newRelayFlags(stderr)
	if err := p.parse(args); err != nil {
		return err
	}
	if !p.runRelay && !p.runSweeper && !p.runMonitor && !p.runJanitor {
		fmt.Fprintln(stderr, "outboxgen relay: -relay, -sweeper, -monitor and -janitor are all false: nothing to run")
		return errUsage
	}
	return p.serve(stdout, stderr)
}

func cmdSweep(args []string, stdout, stderr io.Writer) error {
	p := newSweepFlags(stderr)
	if err := p.parse(args); err != nil {
		return err
	}
	p.runSweeper = true
	if p.once {
		return p.oncePass(stdout, stderr)
	}
	return p.serve(stdout, stderr)
}

func cmdJanitor(args []string, stdout, stderr io.Writer) error {
	p := newJanitorFlags(stderr)
	if err := p.parse(args); err != nil {
		return err
	}
	p.runJanitor = true
	if p.once {
		return p.oncePass(stdout, stderr)
	}
	return p.serve(stdout, stderr)
}

// parse layers the settings and checks what needs no database.
func (p *procFlags) parse(args []string) error {
	if err := parseLayered(p.fl, args); err != nil {
		if errors.Is(err, errUsage) || errors.Is(err, flag.ErrHelp) {
			return err
		}
		return fmt.Errorf("outboxgen %s: %s", p.cmd, oneLine(err))
	}
	if _, err := parseLevel(p.logLevel); err != nil {
		fmt.Fprintf(p.fl.Output(), "outboxgen %s: %v\n", p.cmd, err)
		return errUsage
	}
	if p.fl.Lookup("broker") != nil && p.broker == "" && (p.cmd != "relay" || p.runRelay || p.runSweeper) {
		fmt.Fprintf(p.fl.Output(), "outboxgen %s: no broker: pass -broker URL or set %s (%s)\n", p.cmd, envName("broker"), brokerHelp)
		return errUsage
	}
	if err := p.db.check(); err != nil {
		return err
	}
	// An unknown broker scheme fails before the database is dialled.
	if scheme, _, ok := strings.Cut(p.broker, ":"); p.broker != "" && (!ok || !slices.Contains(brokerurl.Schemes(), strings.ToLower(scheme))) {
		return fmt.Errorf("outboxgen %s: -broker: unknown scheme %q in %q: use one of %s", p.cmd, scheme, redact.URL(p.broker), strings.Join(brokerurl.Schemes(), ", "))
	}
	// Name an unknown scheme (never a secret) rather than just refuse the
	// value, which dsn keeps to itself since it may hold a password.
	if scheme, _, ok := strings.Cut(p.db.db, "://"); ok && !slices.Contains(dbSchemes, strings.ToLower(scheme)) {
		return fmt.Errorf("outboxgen %s: -db: unknown scheme %q: use postgres://, mysql://, mariadb://, sqlite:path or a *.db file", p.cmd, redact.String(scheme))
	}
	return nil
}

// dbSchemes are the URL schemes package dsn opens.
var dbSchemes = []string{"postgres", "postgresql", "mysql", "mariadb"}

// parseLevel reads -log-level.
func parseLevel(s string) (slog.Level, error) {
	var l slog.Level
	if err := l.UnmarshalText([]byte(s)); err != nil {
		return 0, fmt.Errorf("-log-level %q: use debug, info, warn or error", s)
	}
	return l, nil
}

// logger writes JSON lines to w, every record redacted (runtime/redact),
// with the passwords of the DSN and broker URL masked by name as well.
func (p *procFlags) logger(w io.Writer) *slog.Logger {
	lvl, _ := parseLevel(p.logLevel)
	h := slog.NewJSONHandler(w, &slog.HandlerOptions{Level: lvl, ReplaceAttr: func(_ []string, a slog.Attr) slog.Attr {
		// "2s" rather than 2000000000: these lines are read by people too.
		if a.Value.Kind() == slog.KindDuration {
			return slog.String(a.Key, a.Value.Duration().String())
		}
		return a
	}})
	return slog.New(redact.NewHandler(h, p.secrets()...)).
		With(slog.String("process", "outboxgen "+p.cmd))
}

// redisLog adapts a slog.Logger to go-redis's logger.
type redisLog struct{ l *slog.Logger }

func (r redisLog) Printf(ctx context.Context, format string, v ...any) {
	r.l.WarnContext(ctx, strings.TrimSpace(fmt.Sprintf(format, v...)))
}

// secrets are the passwords of the database DSN and the broker URL, masked
// by name in every log line and error besides redact's patterns.
func (p *procFlags) secrets() []string {
	var out []string
	if src, err := dsn.Parse(p.db.db, ""); err == nil {
		out = append(out, src.Secrets...)
	}
	return append(out, brokerurl.Secrets(p.broker)...)
}

// oneLine joins the lines of err's text: main prints errors as one line.
func oneLine(err error) string {
	return strings.Join(strings.Fields(strings.ReplaceAll(err.Error(), "\n", "; ")), " ")
}

// failf is the command's error: one line, credentials masked.
func (p *procFlags) failf(format string, args ...any) error {
	msg := fmt.Sprintf(format, args...)
	msg = redact.StringWith(msg, p.secrets()...)
	return fmt.Errorf("outboxgen %s: %s", p.cmd, oneLine(errors.New(msg)))
}

// setup is what every command opens before its parts run.
type setup struct {
	db   *opsDB
	pub  message.Publisher
	log  *slog.Logger
	cfg  runner.Config
	stop func()
}

// open connects to the database, checks the tables the parts need and
// opens the broker; every failure is one line. The caller calls stop.
func (p *procFlags) open(ctx context.Context, stderr, stdout io.Writer) (*setup, error) {
	s := &setup{log: p.logger(stderr)}
	// go-redis logs through a global logger of its own (plain text on
	// stderr): route it into the process's JSON, redacted log.
	redis.SetLogger(redisLog{s.log.With(slog.String("component", "go-redis"))})
	db, err := p.db.open(ctx)
	if err != nil {
		if errors.Is(err, errUsage) {
			return nil, err
		}
		return nil, p.failf("%v", err)
	}
	s.db = db
	s.stop = func() { db.Close() }
	fail := func(err error) (*setup, error) {
		s.stop()
		return nil, err
	}
	cfg, err := p.runnerConfig(db, s.log)
	if err != nil {
		return fail(p.failf("%v", err))
	}
	// The start-up checks, before anything is logged, so that a
	// deployment mistake is one line (the parts would find it too).
	cctx, cancel := context.WithTimeout(ctx, p.db.timeout)
	defer cancel()
	for _, t := range p.tablesNeeded(cfg) {
		if err := db.Driver.Check(cctx, t); err != nil {
			return fail(p.failf("%v", err))
		}
	}
	if cfg.Relay != nil || cfg.Sweeper != nil {
		pub, err := brokerurl.Open(ctx, p.broker, brokerurl.Options{Logger: s.log, Stdout: stdout})
		if err != nil {
			return fail(p.failf("-broker: %v", err))
		}
		s.pub = pub
		s.stop = func() { pub.Close(); db.Close() }
		cfg.Publisher = pub
	}
	cfg.Logger = s.log
	s.cfg = cfg
	return s, nil
}

// tablesNeeded lists the tables the configured parts use.
func (p *procFlags) tablesNeeded(cfg runner.Config) []driver.Table {
	ts := []driver.Table{driver.Outbox}
	if cfg.Janitor != nil {
		if cfg.Janitor.InboxRetention >= 0 {
			ts = append(ts, driver.Inbox)
		}
		if cfg.Janitor.ArchiveTable != "" {
			ts = append(ts, driver.Archive)
		}
	}
	return ts
}

// runnerConfig turns the flags into the runtime's Configs (Validate of
// each part reports bad values when it is built).
func (p *procFlags) runnerConfig(db *opsDB, log *slog.Logger) (runner.Config, error) {
	cfg := runner.Config{MetricsAddr: p.metricsAddr, ReadyWindow: p.readyWindow}
	jitter := p.backoffJitter
	retry := relay.ExponentialBackoff(p.backoffInitial, p.backoffMax, jitter)
	breaker := relay.ExponentialBackoff(p.breakerInitial, p.breakerMax, jitter)
	onFailed := func(part string) func(relay.FailedEvent) {
		return func(e relay.FailedEvent) {
			log.Error("event marked FAILED: it waits for an operator (outboxgen failed list, outboxgen requeue)",
				slog.Int64("id", e.ID), slog.String("event_id", e.EventID), slog.String("type", e.Type),
				slog.String("key", e.Key), slog.Int("attempts", e.RetryCount), slog.String("last_error", e.LastError), slog.String("part", part))
		}
	}
	if p.hasRelay && p.runRelay {
		if jitter < 0 || jitter >= 1 {
			return cfg, fmt.Errorf("-backoff-jitter is %v: use 0 to less than 1", jitter)
		}
		cfg.Relay = &relay.Config{
			BatchSize: p.batchSize, MaxInFlight: p.maxInFlight, ParallelClaims: p.parallelClaims, PollInterval: p.pollInterval, LeaseDuration: p.lease, Concurrency: p.concurrency,
			MaxAttempts: p.maxAttempts, Backoff: retry, PublishTimeout: p.publish, BreakerBackoff: breaker,
			DatabaseBackoffMax: p.dbBackoffMax, ShutdownTimeout: p.shutdown, InstanceID: p.instanceID,
			HoldRecheck: p.holdRecheck, Hedge: p.hedge, HedgeAfter: p.hedgeAfter,
		}
		cfg.Relay.OnFailed = onFailed("relay")
	}
	if p.hasSweeper && p.runSweeper {
		if jitter < 0 || jitter >= 1 {
			return cfg, fmt.Errorf("-backoff-jitter is %v: use 0 to less than 1", jitter)
		}
		cfg.Sweeper = &sweeper.Config{
			OverdueAfter: p.overdueAfter, Interval: p.sweepInterval, BatchSize: p.batchSize, LeaseDuration: p.lease,
			Concurrency: p.concurrency, MaxAttempts: p.maxAttempts, Backoff: retry, ShutdownTimeout: p.shutdown,
			PublishTimeout: p.publish, BreakerBackoff: breaker, InstanceID: p.sweeperInstanceID, DatabaseBackoffMax: p.dbBackoffMax,
			HoldRecheck: p.holdRecheck, Hedge: p.hedge, HedgeAfter: p.hedgeAfter,
		}
		cfg.Sweeper.OnFailed = onFailed("sweeper")
	}
	if p.hasMonitor && p.runMonitor {
		attrs, err := parseAttributes(p.monitorAttrs)
		if err != nil {
			return cfg, err
		}
		cfg.Monitor = &monitor.Config{
			Interval: p.monitorInterval, CheckTimeout: p.monitorCheckTimeout, DatabaseBackoffMax: p.dbBackoffMax, StaleAfter: p.staleAfter, Attributes: attrs,
			Thresholds: monitor.Thresholds{Stale: p.alertStale, Failed: p.alertFailed, ExpiredLeases: p.alertExpired, OldestPendingAge: p.alertOldestAge},
		}
	}
	if p.hasJanitor && p.runJanitor {
		cfg.Janitor = &janitor.Config{
			Interval: p.janitorInterval, DatabaseBackoffMax: p.dbBackoffMax, Retention: p.retention,
			InboxRetention: p.inboxRetention, BatchSize: p.janitorBatchSize, BatchPause: p.janitorBatchPause,
		}
		if p.archive {
			a := db.Schema.Tables.Archive
			if a == "" {
				return cfg, errors.New("-archive: no archive table: set sql.archive_table in events.yaml (and create it from the generated DDL) or pass -archive-table")
			}
			cfg.Janitor.ArchiveTable = a
		}
	}
	return cfg, nil
}

// parseAttributes reads -monitor-attributes: key=value[,key=value].
func parseAttributes(s string) ([]monitor.Attribute, error) {
	var out []monitor.Attribute
	for _, kv := range strings.Split(s, ",") {
		kv = strings.TrimSpace(kv)
		if kv == "" {
			continue
		}
		k, v, ok := strings.Cut(kv, "=")
		if !ok || strings.TrimSpace(k) == "" {
			return nil, fmt.Errorf("-monitor-attributes: %q is not key=value", kv)
		}
		out = append(out, monitor.Attribute{Key: strings.TrimSpace(k), Value: strings.TrimSpace(v)})
	}
	return out, nil
}

// signalContext is cancelled by SIGTERM or SIGINT; a second signal kills
// the process the default way (stop restores it once the first arrived).
func signalContext() (context.Context, context.CancelFunc) {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	go func() {
		<-ctx.Done()
		stop()
	}()
	return ctx, stop
}

// serve runs the configured parts until SIGTERM (exit 0 after a clean
// shutdown).
func (p *procFlags) serve(stdout, stderr io.Writer) error {
	ctx, stop := signalContext()
	defer stop()
	s, err := p.open(ctx, stderr, stdout)
	if err != nil {
		return err
	}
	defer s.stop()
	stopTracing, err := installTracing(ctx, p.cmd, s.log)
	if err != nil {
		return p.failf("%v", err)
	}
	defer stopTracing()
	wal, err := p.openWAL(ctx, s)
	if err != nil {
		return err
	}
	defer wal.close()
	r, err := runner.New(s.db.Driver, s.cfg)
	if err != nil {
		return p.failf("%v", err)
	}
	defer r.Close()
	if wal.build != nil {
		if err := wal.build(r.MeterProvider()); err != nil {
			return err
		}
	}
	p.logStarted(s, append(r.Parts(), wal.parts()...))
	if err := wal.run(ctx, r.Run); err != nil {
		return p.failf("%v", err)
	}
	return nil
}

// logStarted writes the one "started" line: what runs, on which database
// and broker (both redacted), which tables.
func (p *procFlags) logStarted(s *setup, parts []string) {
	t := s.db.Schema.Tables
	attrs := []any{
		slog.Any("parts", parts), slog.String("database", s.db.Source.Where),
		slog.Group("tables", slog.String("outbox", t.Outbox), slog.String("inbox", t.Inbox), slog.String("archive", t.Archive)),
		slog.String("version", version()),
	}
	if s.pub != nil {
		attrs = append(attrs, slog.String("broker", redact.URL(p.broker)))
	}
	if p.metricsAddr != "" {
		attrs = append(attrs, slog.String("metrics_addr", p.metricsAddr))
	}
	if p.once {
		attrs = append(attrs, slog.Bool("once", true))
	}
	s.log.Info("outboxgen "+p.cmd+" started", attrs...)
}

// oncePass runs one sweeper or janitor pass: exit 0 when it completed,
// 1 with the error otherwise.
func (p *procFlags) oncePass(stdout, stderr io.Writer) error {
	ctx, stop := signalContext()
	defer stop()
	s, err := p.open(ctx, stderr, stdout)
	if err != nil {
		return err
	}
	defer s.stop()
	stopTracing, err := installTracing(ctx, p.cmd, s.log)
	if err != nil {
		return p.failf("%v", err)
	}
	defer stopTracing()
	p.logStarted(s, []string{p.cmd})
	start := time.Now()
	switch p.cmd {
	case "sweep":
		sc := *s.cfg.Sweeper
		sc.Publisher, sc.Logger = s.pub, s.log
		sw, err := sweeper.New(s.db.Driver, sc)
		if err != nil {
			return p.failf("%v", err)
		}
		n, err := sw.RunOnce(ctx)
		if err != nil {
			return p.failf("sweep not completed (%d events published): %v", n, err)
		}
		s.log.Info("sweep completed", slog.Int("published", n), slog.Duration("took", time.Since(start)))
	default:
		jc := *s.cfg.Janitor
		jc.Logger = s.log
		j, err := janitor.New(s.db.Driver, jc)
		if err != nil {
			return p.failf("%v", err)
		}
		res, err := j.RunOnce(ctx)
		if err != nil {
			return p.failf("janitor pass not completed (%d sent rows and %d inbox rows removed): %v", res.Sent, res.Inbox, err)
		}
		s.log.Info("janitor pass completed", slog.Int64("sent_removed", res.Sent), slog.Bool("archived", res.Archived),
			slog.Int64("inbox_removed", res.Inbox), slog.Duration("took", time.Since(start)))
	}
	return nil
}

// ---- WAL mode (sql.wal, runtime/walrelay) ----
//
// With sql.wal: true the PostgreSQL writers write events into the WAL, and
// `outboxgen relay` runs the streaming relay (walrelay) beside the
// polling relay, which keeps publishing the events the stream parks in
// the table. `outboxgen wal setup` creates the publication and the
// replication slot ahead of the writers' deployment: a slot retains WAL
// only from its creation, so events written before it would never be
// streamed. It is a command of its own, not a step of `migrate up`,
// because the slot needs a role with the REPLICATION attribute (the
// relay's), while migrations run as the schema owner; and it is safe to
// repeat (an existing slot is kept).

// walSpecOn reports whether the spec the commands read (-f, or
// events.yaml in the working directory) sets sql.wal: true.
func walSpecOn(f *dbFlags) (bool, error) {
	path := f.spec
	if path == "" {
		if _, err := os.Stat(defaultSpec); err != nil {
			return false, nil
		}
		path = defaultSpec
	}
	sp, err := spec.ParseFile(path)
	if err != nil {
		return false, err
	}
	return sp.SQL.WAL, nil
}

// walPool opens a small pgx pool on the -db database for the WAL relay
// (slot set-up, parking, lag queries; the stream has its own replication
// connection) and the slot checks.
func walPool(ctx context.Context, src dsn.Source, timeout time.Duration) (*pgxpool.Pool, error) {
	cfg, err := pgxpool.ParseConfig(src.DSN)
	if err != nil {
		return nil, fmt.Errorf("-db: %s: %w", src.Where, err)
	}
	cfg.MaxConns = 8
	cfg.ConnConfig.ConnectTimeout = timeout
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("connect to %s: %w", src.Where, err)
	}
	pctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	if err := pool.Ping(pctx); err != nil {
		pool.Close()
		return nil, fmt.Errorf("connect to %s: %w", src.Where, err)
	}
	return pool, nil
}

// walPart is the streaming relay of `outboxgen relay`; the zero value
// (sql.wal off, or not a PostgreSQL database) runs nothing.
type walPart struct {
	pool  *pgxpool.Pool
	relay *walrelay.Relay
	log   *slog.Logger
	// build creates relay (nil: no streaming relay runs).
	build func(metric.MeterProvider) error
}

// openWAL builds the streaming relay when the spec says sql.wal, the
// database is PostgreSQL and the relay part runs; it also gives the
// monitor its wal_slot check.
func (p *procFlags) openWAL(ctx context.Context, s *setup) (*walPart, error) {
	on, err := walSpecOn(p.db)
	if err != nil {
		return nil, p.failf("%v", err)
	}
	w := &walPart{log: s.log}
	if !on || s.db.Source.Dialect != dialect.Postgres || (s.cfg.Relay == nil && s.cfg.Monitor == nil) {
		if on && s.db.Source.Dialect != dialect.Postgres {
			s.log.Info("sql.wal is set, but the database is not PostgreSQL: its writers use the outbox table, so only the polling relay runs", slog.String("database", s.db.Source.Where))
		}
		return w, nil
	}
	slot := p.walSlot
	if slot == "" {
		slot = walrelay.DefaultSlot(s.db.Schema.Tables.Outbox)
	}
	w.pool, err = walPool(ctx, s.db.Source, p.db.timeout)
	if err != nil {
		return nil, p.failf("%v", err)
	}
	if s.cfg.Relay != nil {
		schema := s.db.Schema
		schema.WAL = true
		// Built once the runner exists, so that its metrics go to the
		// runner's provider: the process's /metrics.
		w.build = func(mp metric.MeterProvider) error {
			var err error
			w.relay, err = walrelay.New(w.pool, schema, walrelay.Config{
				Publisher: s.pub, Slot: slot, Publication: walrelay.DefaultSlot(schema.Tables.Outbox), FailoverSlot: p.walFailover, NoCreateSlot: !p.walCreateSlot, Concurrency: p.concurrency,
				PublishTimeout: p.publish, ShutdownTimeout: p.shutdown, MaxMessageBytes: p.walMaxMessage,
				Hedge: p.hedge, HedgeAfter: p.hedgeAfter,
				Backoff:        relay.ExponentialBackoff(p.backoffInitial, p.backoffMax, p.backoffJitter),
				BreakerBackoff: relay.ExponentialBackoff(p.breakerInitial, p.breakerMax, p.backoffJitter),
				Logger:         s.log.With(slog.String("part", "walrelay")),
				MeterProvider:  mp,
			})
			if err != nil {
				return p.failf("%v", err)
			}
			return nil
		}
	}
	if s.cfg.Monitor != nil {
		pool := w.pool
		s.cfg.Monitor.Thresholds.SlotLagBytes = p.maxSlotLag
		s.cfg.Monitor.SlotCheck = func(ctx context.Context, max int64) error {
			return walrelay.CheckSlot(ctx, pool, slot, max)
		}
	}
	return w, nil
}

// parts names what openWAL added, for the "started" line.
func (w *walPart) parts() []string {
	if w.relay == nil {
		return nil
	}
	return []string{"walrelay"}
}

// run runs the other parts (runAll) and the streaming relay until ctx is
// done; the first to fail stops the others, and its error is returned.
func (w *walPart) run(ctx context.Context, runAll func(context.Context) error) error {
	if w.relay == nil {
		return runAll(ctx)
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	walErr := make(chan error, 1)
	go func() {
		err := w.relay.Run(ctx)
		if err != nil && ctx.Err() == nil {
			w.log.Error("the streaming relay stopped: stopping the process", slog.String("error", err.Error()))
		}
		cancel()
		walErr <- err
	}()
	err := runAll(ctx)
	cancel()
	if werr := <-walErr; werr != nil {
		return fmt.Errorf("walrelay: %w", werr)
	}
	return err
}

func (w *walPart) close() {
	if w != nil && w.pool != nil {
		w.pool.Close()
	}
}

// cmdWAL is `outboxgen wal setup`: create the publication and the
// replication slot of the spec's outbox (with sql.wal) and exit.
func cmdWAL(args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 || args[0] != "setup" {
		fmt.Fprintln(stderr, "usage: outboxgen wal setup -db DSN [-f events.yaml] [-wal-slot NAME] [-wal-failover-slot]")
		return errUsage
	}
	fl := newFlags("wal setup", "wal setup -db DSN [-f events.yaml] [-wal-slot NAME] [-wal-failover-slot]", stderr)
	dbf := addDBFlags(fl, false)
	slot := fl.String("wal-slot", "", "the replication slot to create (default outboxgen_<outbox table>; the publication is always outboxgen_<outbox table>)")
	failover := fl.Bool("wal-failover-slot", false, "create the slot as a failover slot (PostgreSQL 17+)")
	if err := parseFlags(fl, args[1:]); err != nil {
		return err
	}
	fail := func(err error) error {
		msg := err.Error()
		if src, perr := dsn.Parse(dbf.db, ""); perr == nil {
			msg = redact.StringWith(msg, src.Secrets...)
		}
		return fmt.Errorf("outboxgen wal setup: %s", oneLine(errors.New(redact.String(msg))))
	}
	on, err := walSpecOn(dbf)
	if err != nil {
		return fail(err)
	}
	if !on {
		return fail(errors.New("the spec does not set sql.wal: true: set it in events.yaml (or pass -f), regenerate, then run wal setup before deploying the writers"))
	}
	if err := dbf.check(); err != nil {
		return err
	}
	if src, err := dsn.Parse(dbf.db, ""); err == nil && src.Dialect != dialect.Postgres {
		return fail(fmt.Errorf("%s is not PostgreSQL: only PostgreSQL writers use the WAL; there is nothing to set up", src.Where))
	}
	ctx, cancel := interruptContext()
	defer cancel()
	octx, cancelT := context.WithTimeout(ctx, dbf.timeout)
	defer cancelT()
	o, err := dbf.open(octx)
	if err != nil {
		return fail(err)
	}
	defer o.Close()
	pool, err := walPool(ctx, o.Source, dbf.timeout)
	if err != nil {
		return fail(err)
	}
	defer pool.Close()
	schema := o.Schema
	schema.WAL = true
	// The publication keeps its default name whatever the slot's: the
	// grants script creates that one (templates/grants).
	// Set-up's log on stderr says what it created, and what it waits for
	// while a long-running transaction holds the slot's creation up.
	r, err := walrelay.New(pool, schema, walrelay.Config{Publisher: discard{}, Slot: *slot, Publication: walrelay.DefaultSlot(schema.Tables.Outbox), FailoverSlot: *failover,
		Logger: slog.New(slog.NewTextHandler(stderr, nil))})
	if err != nil {
		return fail(err)
	}
	if err := r.Setup(ctx); err != nil {
		return fail(err)
	}
	st, err := walrelay.SlotStatus(ctx, pool, r.Slot())
	if err != nil {
		return fail(err)
	}
	if !st.Exists {
		return fail(fmt.Errorf("replication slot %s is still missing after set-up", r.Slot()))
	}
	if st.Creating { // Setup waits for a ready slot: dropped and recreated meanwhile
		return fail(fmt.Errorf("replication slot %s is being created again: run outboxgen wal setup again before deploying the WAL-mode writers", r.Slot()))
	}
	fmt.Fprintf(stdout, "replication slot %s and publication ready on %s (outbox %s): deploy the WAL-mode writers now, and run outboxgen relay\n",
		r.Slot(), o.Source.Where, schema.Tables.Outbox)
	return nil
}

// discard is the publisher of `wal setup`, which publishes nothing.
type discard struct{}

func (discard) Publish(string, ...*message.Message) error { return nil }
func (discard) Close() error                              { return nil }

// walStatus is the slot line of `outboxgen status` with sql.wal (nil when
// the spec does not set it or the database is not PostgreSQL).
type walStatus struct {
	Slot           string `json:"slot"`
	Exists         bool   `json:"exists"`
	Active         bool   `json:"active"`
	Creating       bool   `json:"creating,omitempty"`
	LagBytes       int64  `json:"lag_bytes"`
	WALStatus      string `json:"wal_status,omitempty"`
	SafeWALSize    int64  `json:"safe_wal_size"`
	ConfirmedFlush string `json:"confirmed_flush_lsn,omitempty"`
}

// readWALStatus reads the slot's state through o's connection pool.
func readWALStatus(ctx context.Context, dbf *dbFlags, o *opsDB, slot string) (*walStatus, error) {
	on, err := walSpecOn(dbf)
	if err != nil || !on || o.Source.Dialect != dialect.Postgres {
		return nil, err
	}
	if slot == "" {
		slot = walrelay.DefaultSlot(o.Schema.Tables.Outbox)
	}
	conn, err := o.DB.Conn(ctx)
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	var st walrelay.Slot
	err = conn.Raw(func(dc any) error {
		c, ok := dc.(*stdlib.Conn)
		if !ok {
			return fmt.Errorf("the PostgreSQL connection is a %T, not pgx's: cannot read the replication slot", dc)
		}
		var err error
		st, err = walrelay.SlotStatus(ctx, c.Conn(), slot)
		return err
	})
	if err != nil {
		return nil, err
	}
	return &walStatus{Slot: st.Name, Exists: st.Exists, Active: st.Active, Creating: st.Creating, LagBytes: st.LagBytes, WALStatus: st.WALStatus,
		SafeWALSize: st.SafeWALSize, ConfirmedFlush: st.ConfirmedFlush}, nil
}

// String is the status line: "slot outboxgen_outbox_event: active, 12.3
// MB behind (wal_status reserved, safe_wal_size unlimited)".
func (w *walStatus) String() string {
	if !w.Exists {
		return fmt.Sprintf("slot %s: MISSING: events written in WAL mode are not retained; run outboxgen wal setup (or start outboxgen relay) before the writers write", w.Slot)
	}
	state := "inactive (no relay streams from it: WAL accumulates)"
	switch {
	case w.Creating:
		state = "BEING CREATED (it waits for the transactions running when its creation began to end; events committed before it is ready may not be streamed)"
	case w.Active:
		state = "active"
	}
	safe := "unlimited"
	if w.SafeWALSize >= 0 {
		safe = humanBytes(w.SafeWALSize)
	}
	line := fmt.Sprintf("slot %s: %s, %s behind (wal_status %s, safe_wal_size %s)", w.Slot, state, humanBytes(w.LagBytes), w.WALStatus, safe)
	if w.WALStatus == "lost" || w.WALStatus == "unreserved" {
		line += "  << ALERT: the slot is losing WAL (max_slot_wal_keep_size); see the README's WAL mode section"
	}
	return line
}

// humanBytes formats n bytes as "12.3 MB" (decimal units).
func humanBytes(n int64) string {
	const unit = 1000
	if n < unit {
		return fmt.Sprintf("%d B", n)
	}
	f := float64(n)
	for _, u := range []string{"kB", "MB", "GB", "TB"} {
		f /= unit
		if f < unit {
			return fmt.Sprintf("%.1f %s", f, u)
		}
	}
	return fmt.Sprintf("%.1f PB", f/unit)
}
