package walrelay

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgconn/ctxwatch"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.opentelemetry.io/otel"

	"github.com/outboxgen/outboxgen/runtime/dialect"
	"github.com/outboxgen/outboxgen/runtime/internal/backoff"
	"github.com/outboxgen/outboxgen/runtime/internal/hedge"
	"github.com/outboxgen/outboxgen/runtime/internal/telemetry"
	"github.com/outboxgen/outboxgen/runtime/outbox"
	"github.com/outboxgen/outboxgen/runtime/relay"
)

// Relay streams the events of one outbox from a logical replication slot
// to a watermill publisher. Create it with New and start it with Run.
type Relay struct {
	cfg    Config
	pool   *pgxpool.Pool
	table  string
	prefix string
	repl   *pgconn.Config
	log    *slog.Logger
	tel    *telemetry.Relay
	met    *metrics
	q      queries

	running sync.Mutex

	// Config.Hedge's throttle and the typical call (hedge delay, slow
	// calls), kept across Run's sessions.
	hedges *hedge.Throttle
	typ    hedge.Typical

	// state read by Status, metrics and tests.
	mu     sync.Mutex
	status Status
	// slotSeen is set once this relay found the slot or streamed from it
	// (a standby too: it would otherwise be the one to recreate the slot
	// after a failover): from then on a missing slot means events may have
	// been lost, and it is not recreated.
	slotSeen bool
}

// Status is what a Relay is doing.
type Status struct {
	// Streaming is true while this instance holds the slot.
	Streaming bool
	// Confirmed is the last position reported to PostgreSQL as flushed:
	// every event committed before it was published or parked.
	Confirmed pglogrepl.LSN
	// Published, Parked and Malformed count events since Run started.
	Published, Parked, Malformed int64
	// InFlight is the number of events received and not yet settled
	// (Config.MaxInFlight).
	InFlight int
	// Unconfirmed is the number of events received and not yet confirmed
	// (Config.MaxUnconfirmed): InFlight, and the settled events of
	// transactions waiting behind an unsettled one. A relay that stops
	// now publishes them again.
	Unconfirmed int
	// OldestUnconfirmed is the commit time of the oldest transaction
	// whose events are not all settled (zero when none).
	OldestUnconfirmed time.Time
	// BreakerOpen is true while the circuit breaker holds publishing.
	BreakerOpen bool
	// ParkedKeys is the number of keys remembered as parked.
	ParkedKeys int
}

// Status returns a snapshot of what the relay is doing.
func (r *Relay) Status() Status {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.status
}

func (r *Relay) update(f func(*Status)) {
	r.mu.Lock()
	f(&r.status)
	r.mu.Unlock()
}

// ErrRunning is returned by Run while another Run of the same Relay runs.
var ErrRunning = errors.New("walrelay: already running: call Run once per Relay")

// New returns a streaming relay for the outbox of schema on the PostgreSQL
// database of pool. pool serves the slot set-up, parking and lag queries;
// the stream has its own replication connection (Config.Replication).
func New(pool *pgxpool.Pool, schema outbox.Schema, cfg Config) (*Relay, error) {
	if pool == nil {
		return nil, errors.New("walrelay: pool is nil: pass the pgxpool.Pool of the database holding the outbox")
	}
	if err := schema.Validate(); err != nil {
		return nil, fmt.Errorf("walrelay: %w", err)
	}
	if err := schema.CheckDialect(dialect.Postgres, "the WAL relay"); err != nil {
		return nil, fmt.Errorf("walrelay: %w", err)
	}
	table := schema.Tables.Outbox
	cfg.setDefaults(table)
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	repl := cfg.Replication
	if repl == nil {
		repl = pool.Config().ConnConfig.Config.Copy()
	} else {
		repl = repl.Copy()
	}
	if repl.RuntimeParams == nil {
		repl.RuntimeParams = map[string]string{}
	}
	repl.RuntimeParams["replication"] = "database"
	repl.RuntimeParams["application_name"] = "outboxgen-walrelay"
	// A receive deadline (the reader's status timer) must only interrupt
	// the read, never cancel the walsender's work or close the connection.
	repl.BuildContextWatcherHandler = func(c *pgconn.PgConn) ctxwatch.Handler {
		return &pgconn.DeadlineContextWatcherHandler{Conn: c.Conn()}
	}
	tp, mp := cfg.TracerProvider, cfg.MeterProvider
	if tp == nil {
		tp = otel.GetTracerProvider()
	}
	if mp == nil {
		mp = otel.GetMeterProvider()
	}
	tel, err := telemetry.NewRelay(tp, mp, cfg.Publisher, false, publishErrorType)
	if err != nil {
		return nil, fmt.Errorf("walrelay: telemetry: %w", err)
	}
	wq, err := dialect.NewWALQueries(dialect.Postgres, table)
	if err != nil {
		return nil, fmt.Errorf("walrelay: %w", err)
	}
	r := &Relay{
		cfg: cfg, pool: pool, table: table, prefix: outbox.WALPrefix(table), repl: repl,
		log: cfg.Logger.With(slog.String("walrelay", cfg.InstanceID), slog.String("slot", cfg.Slot), slog.String("table", table)),
		tel: tel, q: queries{wq}, hedges: hedge.NewThrottle(),
	}
	if r.met, err = newMetrics(mp, r); err != nil {
		return nil, fmt.Errorf("walrelay: metrics: %w", err)
	}
	return r, nil
}

// Slot returns the replication slot's name.
func (r *Relay) Slot() string { return r.cfg.Slot }

// Run streams until ctx is cancelled. It sets up the publication and slot
// when missing, then starts streaming; while another instance holds the
// slot it waits as a standby, retrying every TakeoverInterval, and takes
// over when that instance's connection ends. Connection and database
// errors are logged and retried with a growing pause (at most
// ReconnectMax). Run returns nil after a graceful shutdown (publishes under
// way waited for, the confirmed position reported), or an error that
// waiting cannot mend: wal_level is not logical, a missing privilege, the
// slot belongs to another database or plugin, the server is older than
// PostgreSQL 14, the slot went missing after this relay found it or
// streamed from it (a missing slot is created only before it was ever
// seen: a new slot would hide the events lost with the old one), a message this relay cannot read (over
// MaxMessageBytes, a newer envelope version), which it does not skip, or
// an event it cannot park for a cause retrying cannot clear (a missing
// privilege or table, a value the table refuses).
func (r *Relay) Run(ctx context.Context) error {
	if !r.running.TryLock() {
		return ErrRunning
	}
	defer r.running.Unlock()
	bo := backoff.New(100*time.Millisecond, r.cfg.ReconnectMax)
	standby := false
	for ctx.Err() == nil {
		err := r.session(ctx, &standby)
		if ctx.Err() != nil {
			return nil
		}
		var wait time.Duration
		switch {
		case err == nil:
			bo.Reset()
			continue
		case errors.Is(err, errSlotActive):
			if !standby {
				r.log.Info("another instance streams from the slot: standing by", slog.Duration("retry_every", r.cfg.TakeoverInterval))
				standby = true
			}
			wait = r.cfg.TakeoverInterval
			bo.Reset()
		case isFatal(err):
			return err
		default:
			wait = bo.Next()
			r.log.Warn("stream interrupted: reconnecting", slog.String("error", telemetry.ErrorText(err)), slog.Duration("retry_in", wait))
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil
		case <-t.C:
		}
	}
	return nil
}

// errSlotActive: START_REPLICATION found the slot held by another
// connection (SQLSTATE 55006).
var errSlotActive = errors.New("walrelay: the replication slot is active in another connection")

// fatalError marks an error that waiting cannot mend.
type fatalError struct{ err error }

func (e fatalError) Error() string { return e.err.Error() }
func (e fatalError) Unwrap() error { return e.err }

func isFatal(err error) bool {
	var f fatalError
	return errors.As(err, &f)
}

// classify turns a set-up error into errSlotActive, a fatal error with
// what to do, or itself.
func classify(what string, err error) error {
	var pe *pgconn.PgError
	if !errors.As(err, &pe) {
		return fmt.Errorf("walrelay: %s: %w", what, err)
	}
	switch {
	case pe.Code == "55006":
		return errSlotActive
	case pe.Code == "55000" && containsFold(pe.Message, "wal_level"):
		return fatalError{fmt.Errorf("walrelay: %s: %w: set wal_level = logical (and max_replication_slots, max_wal_senders) in postgresql.conf and restart PostgreSQL", what, err)}
	case pe.Code == "55000" && containsFold(pe.Message+" "+pe.Detail, "invalidated"):
		return fatalError{fmt.Errorf("walrelay: %s: %w: the slot lost WAL (max_slot_wal_keep_size) and the events written in the gap cannot be streamed: reconcile them from the business data, then drop the slot (pg_drop_replication_slot) so that the relay creates a new one", what, err)}
	case pe.Code == "42501" || pe.Code == "28000":
		return fatalError{fmt.Errorf("walrelay: %s: %w: the relay's role needs the REPLICATION attribute (ALTER ROLE ... REPLICATION) and CREATE on the database to create the publication, or create slot and publication beforehand", what, err)}
	}
	return fmt.Errorf("walrelay: %s: %w", what, err)
}

// parkError is the fatal error of a park of ev that failed for a cause
// retrying cannot clear, saying what to do; nil for an error that may
// clear (a lost connection, a serialization failure or deadlock, a server
// shutting down or out of resources), which retryDB retries. privilege is
// what the park needs on the outbox table: a 42501 is answered with its
// GRANT.
func (r *Relay) parkError(ev *event, privilege string, err error) error {
	var pe *pgconn.PgError
	if !errors.As(err, &pe) || len(pe.Code) != 5 {
		return nil
	}
	var todo string
	switch class := pe.Code[:2]; {
	case pe.Code == "42501":
		role := r.pool.Config().ConnConfig.User
		if role == "" {
			role = "<the relay's role>"
		}
		todo = fmt.Sprintf("the relay's role cannot write the parked event into the outbox table: run GRANT %s ON %s TO %s as the table's owner (`outboxgen grants -dialect postgres -f events.yaml`, with sql.wal: true, writes it with the other grants of the relay), then start the relay again", privilege, r.table, role)
	case class == "42": // undefined table (42P01) or column (42703), ...
		todo = fmt.Sprintf("the outbox table %s is missing or its schema is older than this relay: run `outboxgen migrate up` on this database (and check that the relay's schema names the table), then start the relay again", r.table)
	case class == "22" || class == "23" || class == "54":
		// Data exceptions (22008 datetime out of range, ...), integrity
		// violations, limits: this event's row is refused, every time.
		todo = fmt.Sprintf("the outbox table %s refuses this event's row (next_retry_time is now() plus Config.Backoff(1); a NOT NULL column or constraint this build does not fill comes from a newer schema: upgrade the relay): fix the cause, then start the relay again", r.table)
	default:
		return nil
	}
	return fatalError{fmt.Errorf("walrelay: park event %s (key %q, LSN %s) in %s: %w: %s; it was neither published nor parked, and the slot's confirmed position stays before its transaction",
		ev.ID, ev.Key, ev.lsn, r.table, err, todo)}
}

// MinServerVersion is the oldest PostgreSQL (server_version_num) the WAL
// relay streams from: pgoutput's messages option, which sends the logical
// decoding messages, came with PostgreSQL 14.
const MinServerVersion = 140000

// checkServerVersion is the fatal error of a server older than
// MinServerVersion (version is server_version_num), nil otherwise. Without
// it, START_REPLICATION fails with pgoutput's "unrecognized pgoutput
// option" at every retry.
func checkServerVersion(version int) error {
	if version >= MinServerVersion {
		return nil
	}
	return fatalError{fmt.Errorf("walrelay: WAL mode needs PostgreSQL 14 or later (pgoutput's messages option); this server is %d.%d (server_version_num %d): upgrade PostgreSQL, or keep sql.wal off (the polling relay works on this version)", version/10000, version%10000, version)}
}

func containsFold(s, sub string) bool {
	for i := 0; i+len(sub) <= len(s); i++ {
		if equalFold(s[i:i+len(sub)], sub) {
			return true
		}
	}
	return false
}

func equalFold(a, b string) bool {
	if len(a) != len(b) {
		return false
	}
	for i := 0; i < len(a); i++ {
		x, y := a[i], b[i]
		if 'A' <= x && x <= 'Z' {
			x += 'a' - 'A'
		}
		if 'A' <= y && y <= 'Z' {
			y += 'a' - 'A'
		}
		if x != y {
			return false
		}
	}
	return true
}

// setup creates the publication and the slot when missing. conn is the
// replication connection (the slot is created through it). Once this
// relay found the slot or streamed, or with Config.NoCreateSlot, a
// missing slot is created only when recreate (Setup, an operator's
// explicit step), else it is a fatal error.
func (r *Relay) setup(ctx context.Context, conn *pgconn.PgConn, recreate bool) error {
	var level string
	if err := r.pool.QueryRow(ctx, "SELECT current_setting('wal_level')").Scan(&level); err != nil {
		return classify("read wal_level", err)
	}
	if level != "logical" {
		return fatalError{fmt.Errorf("walrelay: the server runs with wal_level = %s: set wal_level = logical (and max_replication_slots, max_wal_senders) in postgresql.conf and restart PostgreSQL", level)}
	}
	var version int
	if err := r.pool.QueryRow(ctx, "SELECT current_setting('server_version_num')::int").Scan(&version); err != nil {
		return classify("read the server version", err)
	}
	if err := checkServerVersion(version); err != nil {
		return err
	}
	var pubExists bool
	if err := r.pool.QueryRow(ctx, "SELECT EXISTS (SELECT 1 FROM pg_publication WHERE pubname = $1)", r.cfg.Publication).Scan(&pubExists); err != nil {
		return classify("look up the publication", err)
	}
	if !pubExists {
		// Empty: the relay needs only the logical decoding messages, which
		// pgoutput sends whatever the publication lists.
		if _, err := r.pool.Exec(ctx, "CREATE PUBLICATION "+r.cfg.Publication); err != nil {
			var pe *pgconn.PgError
			if !errors.As(err, &pe) || pe.Code != "42710" { // created meanwhile by another instance
				return classify("create publication "+r.cfg.Publication, err)
			}
		} else {
			r.log.Info("publication created", slog.String("publication", r.cfg.Publication))
		}
	}
	var db, plugin, cur string
	var found bool
	err := r.pool.QueryRow(ctx, `SELECT coalesce(database, ''), coalesce(plugin, ''), current_database() FROM pg_replication_slots WHERE slot_name = $1`, r.cfg.Slot).Scan(&db, &plugin, &cur)
	switch {
	case err == nil:
		found = true
	case errors.Is(err, pgxNoRows):
	default:
		return classify("look up the replication slot", err)
	}
	if found {
		if db != cur || plugin != "pgoutput" {
			return fatalError{fmt.Errorf("walrelay: replication slot %s exists for database %q with plugin %q; the relay needs a pgoutput slot of database %q: choose another Config.Slot", r.cfg.Slot, db, plugin, cur)}
		}
		r.mu.Lock()
		r.slotSeen = true
		r.mu.Unlock()
		return nil
	}
	r.mu.Lock()
	seen, last := r.slotSeen, r.status.Confirmed
	r.mu.Unlock()
	if seen && !recreate {
		return r.slotGone(last)
	}
	if r.cfg.NoCreateSlot && !recreate {
		r.log.Error("the replication slot does not exist, and Run does not create it (Config.NoCreateSlot)")
		return fatalError{fmt.Errorf("walrelay: replication slot %s does not exist, and Run does not create it (Config.NoCreateSlot; outboxgen relay -wal-create-slot=false): if the slot existed (a failover to a server without it, or a drop), events committed after the last position the previous relay confirmed (its log and metrics show it) may not have been published: create the slot with outboxgen wal setup (Relay.Setup), then reconcile from the business data the events committed between then and the new slot's creation; on a first deployment, run outboxgen wal setup before the writers switch to WAL mode", r.cfg.Slot)}
	}
	// The creation waits for the transactions running now to end: say so
	// before, as a long-running one holds it (and the caller) up.
	r.log.Info("creating the replication slot: it is ready once the transactions running now have ended")
	if r.cfg.FailoverSlot {
		if version < 170000 {
			return fatalError{fmt.Errorf("walrelay: Config.FailoverSlot needs PostgreSQL 17 or later (failover slots); this server is %d: unset it, and see the README on failover", version)}
		}
		_, err = r.pool.Exec(ctx, "SELECT pg_create_logical_replication_slot($1, 'pgoutput', false, false, true)", r.cfg.Slot)
	} else {
		_, err = pglogrepl.CreateReplicationSlot(ctx, conn, r.cfg.Slot, "pgoutput", pglogrepl.CreateReplicationSlotOptions{Mode: pglogrepl.LogicalReplication})
	}
	if err != nil {
		var pe *pgconn.PgError
		if errors.As(err, &pe) && pe.Code == "42710" { // another instance created it
			return nil
		}
		if ctx.Err() != nil {
			// PostgreSQL drops a slot whose creation did not finish.
			return fmt.Errorf("walrelay: replication slot %s was not created: its creation waits for the transactions running when it began to end (see pg_stat_activity for long-running ones), and it had not ended when set-up had to stop; nothing was left behind: do not switch writers to WAL mode yet, run set-up again: %w", r.cfg.Slot, context.Cause(ctx))
		}
		return classify("create replication slot "+r.cfg.Slot, err)
	}
	r.log.Info("replication slot created", slog.String("plugin", "pgoutput"), slog.Bool("failover", r.cfg.FailoverSlot))
	return nil
}

// Setup creates the publication and the replication slot when missing,
// without streaming, and returns once the slot is ready, also when
// another instance is creating it (Slot.Creating): until then, events
// committed may never be streamed. Run does the same at its start; call
// Setup as a deploy step before writers switch to WAL mode (events
// written before the slot is ready are never streamed), e.g. next to the
// schema migration. Its errors say what to do (wal_level, privileges, a
// creation that waits for long-running transactions until ctx ends).
func (r *Relay) Setup(ctx context.Context) error {
	conn, closeConn, err := r.connectReplication(ctx)
	if err != nil {
		return err
	}
	defer closeConn()
	if err := r.setup(ctx, conn, true); err != nil {
		return err
	}
	return r.waitReady(ctx)
}

// slotGone is the error of a slot found missing after this relay
// streamed from it: dropped, or lost in a failover to a server without
// it. A new slot would start at the current position and hide the gap
// since last, the position up to which every event was published or
// parked, so Run stops instead and says what to reconcile.
func (r *Relay) slotGone(last pglogrepl.LSN) error {
	since := fmt.Sprintf("after LSN %s (every event before it was published or parked)", last)
	if last == 0 {
		// A standby: the streaming instance's log has its last position.
		since = "after the last position the streaming instance confirmed (its log and metrics show it)"
	}
	r.log.Error("the replication slot is missing after this relay found it or streamed from it (dropped, or a failover): not recreated; events committed after the last confirmed position may not have been published",
		slog.String("last_confirmed", last.String()))
	return fatalError{fmt.Errorf("walrelay: replication slot %s is missing, though this relay found it or streamed from it (dropped, or a failover to a server without it): events committed %s may not have been published, and a new slot would not stream them: create the slot again at once (outboxgen wal setup, or restart the relay), then reconcile from the business data the events committed between then and the new slot's creation; see the README on PostgreSQL failover (failover slots: Config.FailoverSlot, -wal-failover-slot)", r.cfg.Slot, since)}
}

// waitReady waits until the slot, which exists, is no longer being
// created (by another instance: setup's own creation returns once the
// slot is ready).
func (r *Relay) waitReady(ctx context.Context) error {
	logged := false
	for {
		s, err := SlotStatus(ctx, r.pool, r.cfg.Slot)
		switch {
		case err != nil:
			if ctx.Err() != nil {
				return r.notReady(ctx)
			}
			return err
		case !s.Exists:
			return fmt.Errorf("walrelay: replication slot %s was dropped while set-up waited for it to be ready: run set-up again", r.cfg.Slot)
		case !s.Creating:
			return nil
		}
		if !logged {
			r.log.Info("another instance is creating the replication slot: waiting until it is ready")
			logged = true
		}
		t := time.NewTimer(100 * time.Millisecond)
		select {
		case <-ctx.Done():
			t.Stop()
			return r.notReady(ctx)
		case <-t.C:
		}
	}
}

func (r *Relay) notReady(ctx context.Context) error {
	return fmt.Errorf("walrelay: replication slot %s is still being created (it waits for the transactions running when its creation began to end; see pg_stat_activity for long-running ones): do not switch writers to WAL mode yet, run set-up again: %w", r.cfg.Slot, context.Cause(ctx))
}

// connectReplication opens a replication connection (at most 30 s) and
// returns it with the function that closes it (at most 5 s).
func (r *Relay) connectReplication(ctx context.Context) (*pgconn.PgConn, func(), error) {
	cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	conn, err := pgconn.ConnectConfig(cctx, r.repl)
	cancel()
	if err != nil {
		return nil, nil, classify("connect for replication", err)
	}
	return conn, func() {
		cctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = conn.Close(cctx)
	}, nil
}

// publishErrorType is the error.type of a failed publish call: a batch
// call split by its hedge (errSplit) was cut off, its events published
// again one by one.
func publishErrorType(ctx context.Context, err error) string {
	switch {
	case errors.Is(err, errSplit):
		return telemetry.ErrorInterrupted
	case errors.Is(err, relay.ErrPermanent):
		return telemetry.ErrorPermanent
	}
	return telemetry.ErrorType(ctx, err)
}
