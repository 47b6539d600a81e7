// Package migrate applies outboxgen's numbered migrations to a database
// and reports its schema version: what `outboxgen migrate` runs, for a
// service to call itself (at start-up, or from its own migration step).
//
//	report, err := migrate.Up(ctx, db, dialect.Postgres, events.Schema.Tables)
//	fmt.Print(report) // what it changed
//
// The migrations are those of package templates (the files outboxgen
// generate writes to <sql.out>/<dialect>/migrations), rendered for the
// table names. Each ends with the statements recording it in the version
// table (<outbox>_version), so the record is written in the migration's
// transaction on PostgreSQL and SQLite, whichever tool runs the files.
// MySQL commits each DDL statement on its own: a migration that fails half
// way leaves its earlier statements applied and its version unrecorded,
// and Up's error says which statements ran. A run interrupted there (killed,
// its connection lost) is resumed by the next Up: before a MySQL migration
// runs, Up looks for the tables its CREATE TABLE statements create, and
// skips the statement of one that is exactly the statement's table
// (compared with the statement run as a temporary table), reporting it
// (Applied.Kept); a table that is not stops Up before it changes anything,
// showing the differences, and anything else already applied stops it
// with what to do.
//
// Concurrent Up calls (two deployments starting at once) are safe: on
// PostgreSQL they take a session advisory lock, on MySQL a named lock
// (GET_LOCK), and on SQLite each migration runs in a BEGIN IMMEDIATE
// transaction that re-reads the version first; the second caller finds
// the work done.
//
// A database whose tables were created from outboxgen's DDL before
// versioned migrations has no version table: its layout is version 1. Up
// records it as such (Report.Baselined) and applies the later migrations;
// the runtime's start-up check accepts it as version 1 meanwhile.
//
// For a *pgxpool.Pool, pass stdlib.OpenDBFromPool(pool)
// (github.com/jackc/pgx/v5/stdlib).
package migrate

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/outboxgen/outboxgen/runtime/dialect"
	"github.com/outboxgen/outboxgen/runtime/internal/dberr"
	"github.com/outboxgen/outboxgen/runtime/outbox"
	"github.com/outboxgen/outboxgen/templates"
)

// Option configures Up and Status.
type Option func(*config)

type config struct {
	set *templates.MigrationSet
}

// WithMigrations replaces outboxgen's migrations (templates.Builtin()) by
// set: for testing the machinery with a test migration
// (templates.Builtin().Extend).
func WithMigrations(set *templates.MigrationSet) Option {
	return func(c *config) { c.set = set }
}

// Applied is one migration Up applied.
type Applied struct {
	Version    int           `json:"version"`
	Name       string        `json:"name"`
	File       string        `json:"file"`
	Statements int           `json:"statements"`
	Duration   time.Duration `json:"duration_ns"`
	// Kept lists the tables an earlier, interrupted run of the migration
	// had created (MySQL, which commits each DDL statement), found exactly
	// as the migration creates them and kept, rows included.
	Kept []string `json:"kept,omitempty"`
}

// Report says what Up changed.
type Report struct {
	Dialect      dialect.Dialect `json:"dialect"`
	VersionTable string          `json:"version_table"`
	// From and To are the schema versions before and after (0: no
	// tables).
	From int `json:"from"`
	To   int `json:"to"`
	// Baselined: the tables existed without a version table (created
	// before versioned migrations) and were recorded as version 1.
	Baselined bool `json:"baselined,omitempty"`
	// Applied lists the migrations applied, oldest first.
	Applied []Applied `json:"applied"`
	// ArchiveCreated names the archive table Up created: declared
	// (sql.archive_table) after the tables were created.
	ArchiveCreated string `json:"archive_created,omitempty"`
	// Latest is the newest version this outboxgen knows; To may be newer
	// (the database was migrated by a newer outboxgen), or older when Up
	// failed.
	Latest int `json:"latest"`
	// unread: Up failed before it read the version (From and To are not
	// known).
	unread bool
}

// Changed reports whether Up changed the database.
func (r Report) Changed() bool {
	return r.Baselined || len(r.Applied) > 0 || r.ArchiveCreated != ""
}

// String is the report for people, one line per change.
func (r Report) String() string {
	var b strings.Builder
	if r.Baselined {
		fmt.Fprintf(&b, "recorded the existing tables as version 1 in %s (created before versioned migrations)\n", r.VersionTable)
	}
	for _, a := range r.Applied {
		fmt.Fprintf(&b, "applied %s (version %d, %d statements, %s)", a.File, a.Version, a.Statements, a.Duration.Round(time.Millisecond))
		if len(a.Kept) > 0 {
			fmt.Fprintf(&b, ": resumed an interrupted run: kept the %s %s it had created (exactly as the migration creates %s)",
				plural(len(a.Kept), "table", "tables"), strings.Join(a.Kept, ", "), plural(len(a.Kept), "it", "them"))
		}
		b.WriteByte('\n')
	}
	if r.ArchiveCreated != "" {
		fmt.Fprintf(&b, "created the archive table %s (sql.archive_table)\n", r.ArchiveCreated)
	}
	// notApplied names the versions after To: "version 3 (the latest) is
	// not applied".
	notApplied := func() string {
		if r.To+1 == r.Latest {
			return fmt.Sprintf("version %d (the latest) is not applied", r.Latest)
		}
		return fmt.Sprintf("versions %d to %d (the latest) are not applied", r.To+1, r.Latest)
	}
	switch {
	case r.unread:
		b.WriteString("nothing applied: the schema version could not be read\n")
	case r.To > r.Latest:
		fmt.Fprintf(&b, "nothing to apply: the database is at version %d, newer than the %d this outboxgen knows\n", r.To, r.Latest)
	case r.To < r.Latest && !r.Changed() && r.To == 0:
		fmt.Fprintf(&b, "nothing applied: the database has no outboxgen tables yet; %s\n", notApplied())
	case r.To < r.Latest && !r.Changed():
		fmt.Fprintf(&b, "nothing applied: the database is at version %d; %s\n", r.To, notApplied())
	case r.To < r.Latest && r.From != r.To:
		fmt.Fprintf(&b, "schema version %d -> %d (recorded in %s); %s\n", r.From, r.To, r.VersionTable, notApplied())
	case r.To < r.Latest:
		fmt.Fprintf(&b, "schema version %d; %s\n", r.To, notApplied())
	case !r.Changed():
		fmt.Fprintf(&b, "nothing to apply: the database is at version %d, the latest\n", r.To)
	case r.From != r.To:
		fmt.Fprintf(&b, "schema version %d -> %d (recorded in %s)\n", r.From, r.To, r.VersionTable)
	default:
		fmt.Fprintf(&b, "schema version %d, the latest\n", r.To)
	}
	return b.String()
}

func plural(n int, one, many string) string {
	if n == 1 {
		return one
	}
	return many
}

// Version is one migration recorded in the version table.
type Version struct {
	Version        int       `json:"version"`
	CompatibleFrom int       `json:"compatible_from"`
	AppliedAt      time.Time `json:"applied_at"`
}

// Available is one migration this outboxgen has.
type Available struct {
	Version        int    `json:"version"`
	Name           string `json:"name"`
	File           string `json:"file"`
	CompatibleFrom int    `json:"compatible_from"`
	Applied        bool   `json:"applied"`
}

// State is a database's schema version, as Status reports it.
type State struct {
	Dialect      dialect.Dialect `json:"dialect"`
	VersionTable string          `json:"version_table"`
	// Current is the schema version: 0 when the tables do not exist.
	Current int `json:"current"`
	// CompatibleFrom is the oldest version a runtime must know to use the
	// tables.
	CompatibleFrom int `json:"compatible_from"`
	// Unrecorded: the tables exist without a version table (created before
	// versioned migrations): version 1.
	Unrecorded bool `json:"unrecorded,omitempty"`
	// Recorded lists the version table's rows.
	Recorded []Version `json:"recorded"`
	// Available lists this outboxgen's migrations; Pending those not
	// applied yet.
	Available []Available `json:"available"`
	Pending   []Available `json:"pending"`
	// RuntimeMin and RuntimeMax are the versions this build's runtime runs
	// on (dialect.MinSchemaVersion, dialect.SchemaVersion), and Runtime
	// says whether it can run on the database now: "ok", "migrate" (run
	// migrate up first) or "upgrade" (the database needs a newer
	// runtime), or "no tables".
	RuntimeMin int    `json:"runtime_min"`
	RuntimeMax int    `json:"runtime_max"`
	Runtime    string `json:"runtime"`
}

// String is the state for people.
func (s State) String() string {
	var b strings.Builder
	switch {
	case s.Current == 0:
		b.WriteString("version:    none (no outboxgen tables yet)\n")
	case s.Unrecorded:
		fmt.Fprintf(&b, "version:    %d (tables created before versioned migrations, not recorded in %s yet: migrate up records them)\n", s.Current, s.VersionTable)
	default:
		fmt.Fprintf(&b, "version:    %d, recorded in %s (usable by runtimes that know version %d or later)\n", s.Current, s.VersionTable, s.CompatibleFrom)
	}
	fmt.Fprintf(&b, "runtime:    this outboxgen runs on versions %d to %d: %s\n", s.RuntimeMin, s.RuntimeMax, map[string]string{
		"ok": "compatible", "migrate": "run migrate up first", "upgrade": "upgrade outboxgen first", "no tables": "run migrate up to create the tables",
	}[s.Runtime])
	b.WriteString("migrations:\n")
	applied := map[int]Version{}
	for _, v := range s.Recorded {
		applied[v.Version] = v
	}
	for _, a := range s.Available {
		state := "pending"
		if v, ok := applied[a.Version]; ok {
			state = "applied " + v.AppliedAt.UTC().Format("2006-01-02 15:04:05Z")
		} else if a.Applied {
			state = "applied (before versioned migrations)"
		}
		fmt.Fprintf(&b, "  %-32s %s\n", a.File, state)
	}
	for _, v := range s.Recorded {
		if v.Version > len(s.Available) {
			fmt.Fprintf(&b, "  %-32s applied %s by a newer outboxgen\n", fmt.Sprintf("version %d", v.Version), v.AppliedAt.UTC().Format("2006-01-02 15:04:05Z"))
		}
	}
	if n := len(s.Pending); n > 0 {
		fmt.Fprintf(&b, "pending:    %d (run: outboxgen migrate -db DSN up)\n", n)
	} else {
		b.WriteString("pending:    none\n")
	}
	return b.String()
}

// setup validates the arguments and renders the migrations.
func setup(d dialect.Dialect, tables outbox.Tables, opts []Option) (*config, templates.Tables, []templates.Migration, *dialect.VersionQueries, error) {
	c := &config{set: templates.Builtin()}
	for _, o := range opts {
		o(c)
	}
	t := templates.Tables{Outbox: tables.Outbox, Inbox: tables.Inbox, Archive: tables.Archive}
	if !d.Valid() {
		return nil, t, nil, nil, fmt.Errorf("migrate: unknown SQL dialect %q: use postgres, mysql or sqlite", d)
	}
	ms, err := c.set.Render(string(d), t, templates.Header{})
	if err != nil {
		return nil, t, nil, nil, fmt.Errorf("migrate: %w", err)
	}
	q, err := dialect.NewVersionQueries(d, t.Outbox)
	if err != nil {
		return nil, t, nil, nil, fmt.Errorf("migrate: %w", err)
	}
	return c, t, ms, q, nil
}

// querier is a *sql.DB, *sql.Conn or *sql.Tx.
type querier interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
	QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error)
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
}

// partialTables is current's error for some of the version-1 tables
// without a version table.
type partialTables struct {
	found, missing []string
	versionTable   string
	mysql          bool
}

func (e *partialTables) Error() string {
	msg := fmt.Sprintf("the database has %s but not %s (or not all their columns), and no version table %s: it is neither empty nor at version 1",
		strings.Join(e.found, ", "), strings.Join(e.missing, ", "), e.versionTable)
	if e.mysql {
		// step resumes migration 1 (a run of it interrupted half way
		// leaves this on MySQL), checking the tables that exist.
		return msg + "; an interrupted run of migration 1 leaves this on MySQL, which commits each CREATE TABLE: migrate up resumes it, keeping each existing table that is exactly as migration 1 creates it (and stopping, with the differences, at one that is not)"
	}
	return msg + "; create the missing tables from migration 1 (outboxgen schema prints it) or drop the partial ones, then run migrate up again"
}

// current reads the schema version: (0, 0, false) without tables, (1, 1,
// true) for tables created before versioned migrations. Some of the
// version-1 tables without a version table is a *partialTables error.
func current(ctx context.Context, db querier, d dialect.Dialect, q *dialect.VersionQueries, t templates.Tables) (version, compatibleFrom int, unrecorded bool, err error) {
	var text string
	err = db.QueryRowContext(ctx, q.Current()).Scan(&text)
	if err == nil {
		version, compatibleFrom, err = dialect.ParseCurrent(text)
		if err != nil || version > 0 {
			return version, compatibleFrom, false, err
		}
		// An empty version table: fall through to the layout.
	} else if dberr.Classify(err) != dberr.Missing {
		return 0, 0, false, fmt.Errorf("read the schema version from %s: %w", q.Table(), err)
	}
	// No version recorded: no tables, or the version-1 layout.
	probes := []struct {
		table string
		cols  []string
	}{
		{t.Outbox, dialect.OutboxColumns},
		{t.Inbox, dialect.InboxColumns},
		{dialect.InboxKeyTable(t.Inbox), dialect.InboxKeyColumns},
	}
	var found, missing []string
	for _, p := range probes {
		switch err := probe(ctx, db, dialect.SelectColumns(p.table, p.cols)); {
		case err == nil:
			found = append(found, p.table)
		case dberr.Classify(err) == dberr.Missing:
			missing = append(missing, p.table)
		default:
			return 0, 0, false, fmt.Errorf("look for table %s: %w", p.table, err)
		}
	}
	switch {
	case len(found) == 0:
		return 0, 0, false, nil
	case len(missing) == 0:
		return 1, 1, true, nil
	}
	return 0, 0, false, &partialTables{found: found, missing: missing, versionTable: q.Table(), mysql: d == dialect.MySQL}
}

// probe runs a query and reads its rows.
func probe(ctx context.Context, db querier, query string) error {
	rows, err := db.QueryContext(ctx, query)
	if err != nil {
		return err
	}
	defer rows.Close()
	for rows.Next() {
	}
	return rows.Err()
}

// Status reads the schema version of the tables in db and lists the
// migrations applied and pending. It changes nothing.
func Status(ctx context.Context, db *sql.DB, d dialect.Dialect, tables outbox.Tables, opts ...Option) (State, error) {
	_, t, ms, q, err := setup(d, tables, opts)
	if err != nil {
		return State{}, err
	}
	s := State{Dialect: d, VersionTable: q.Table(), RuntimeMin: dialect.MinSchemaVersion, RuntimeMax: dialect.SchemaVersion,
		Recorded: []Version{}, Available: []Available{}, Pending: []Available{}}
	s.Current, s.CompatibleFrom, s.Unrecorded, err = current(ctx, db, d, q, t)
	if err != nil {
		return s, fmt.Errorf("migrate: status: %w", err)
	}
	if s.Current > 0 && !s.Unrecorded {
		if s.Recorded, err = recorded(ctx, db, q); err != nil {
			return s, fmt.Errorf("migrate: status: %w", err)
		}
	}
	for _, m := range ms {
		a := Available{Version: m.Version, Name: m.Name, File: m.FileName(), CompatibleFrom: m.CompatibleFrom, Applied: m.Version <= s.Current}
		s.Available = append(s.Available, a)
		if !a.Applied {
			s.Pending = append(s.Pending, a)
		}
	}
	switch {
	case s.Current == 0:
		s.Runtime = "no tables"
	case dialect.Compatibility(s.Current, s.CompatibleFrom) == "old":
		s.Runtime = "migrate"
	case dialect.Compatibility(s.Current, s.CompatibleFrom) == "new":
		s.Runtime = "upgrade"
	default:
		s.Runtime = "ok"
	}
	return s, nil
}

// recorded reads the version table.
func recorded(ctx context.Context, db querier, q *dialect.VersionQueries) ([]Version, error) {
	rows, err := db.QueryContext(ctx, q.Applied())
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", q.Table(), err)
	}
	defer rows.Close()
	out := []Version{}
	for rows.Next() {
		var v Version
		var at any
		if err := rows.Scan(&v.Version, &v.CompatibleFrom, &at); err != nil {
			return nil, fmt.Errorf("read %s: %w", q.Table(), err)
		}
		if v.AppliedAt, err = timeOf(at); err != nil {
			return nil, fmt.Errorf("read %s: %w", q.Table(), err)
		}
		out = append(out, v)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("read %s: %w", q.Table(), err)
	}
	return out, nil
}

// timeOf converts a scanned timestamp: time.Time, or text (SQLite; MySQL
// without parseTime), taken as UTC.
func timeOf(v any) (time.Time, error) {
	switch t := v.(type) {
	case time.Time:
		return t.UTC(), nil
	case []byte:
		return parseTime(string(t))
	case string:
		return parseTime(t)
	case nil:
		return time.Time{}, nil
	}
	return time.Time{}, fmt.Errorf("unexpected timestamp %T", v)
}

func parseTime(s string) (time.Time, error) {
	for _, l := range []string{"2006-01-02 15:04:05.999999999", "2006-01-02T15:04:05.999999999Z07:00", "2006-01-02 15:04:05.999999999Z07:00"} {
		if t, err := time.Parse(l, s); err == nil {
			return t.UTC(), nil
		}
	}
	return time.Time{}, fmt.Errorf("cannot parse timestamp %q", s)
}

// Up applies the pending migrations to the tables in db, oldest first,
// each in its own transaction (PostgreSQL, SQLite) together with its
// version record, and creates the archive table when tables.Archive names
// one that does not exist. It returns what it changed, also with an error
// (the migrations applied before it).
func Up(ctx context.Context, db *sql.DB, d dialect.Dialect, tables outbox.Tables, opts ...Option) (Report, error) {
	c, t, ms, q, err := setup(d, tables, opts)
	r := Report{Dialect: d, Applied: []Applied{}, unread: true}
	if err != nil {
		return r, err
	}
	r.VersionTable, r.Latest = q.Table(), c.set.Latest().Version
	var conn *sql.Conn
	err = whileBusy(ctx, d, func() (err error) {
		conn, err = db.Conn(ctx)
		return err
	})
	if err != nil {
		return r, fmt.Errorf("migrate: %w", err)
	}
	defer conn.Close()
	unlock, err := lock(ctx, conn, q)
	if err != nil {
		return r, fmt.Errorf("migrate: %w", err)
	}
	defer unlock()
	first := true
	for {
		done, err := step(ctx, conn, d, q, t, ms, &r, first)
		if err != nil {
			return r, fmt.Errorf("migrate: %w", err)
		}
		first = false
		if done {
			break
		}
	}
	if t.Archive != "" {
		if err := ensureArchive(ctx, conn, d, t, &r); err != nil {
			return r, fmt.Errorf("migrate: %w", err)
		}
	}
	return r, nil
}

// lock makes conn the only session migrating these tables (PostgreSQL,
// MySQL) and returns its release. SQLite locks per transaction (begin).
func lock(ctx context.Context, conn *sql.Conn, q *dialect.VersionQueries) (func(), error) {
	query, args, ok := q.Lock(5)
	if !ok {
		return func() {}, nil
	}
	unlock := func() {
		uq, uargs, _ := q.Unlock()
		ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
		defer cancel()
		_, _ = conn.ExecContext(ctx, uq, uargs...)
	}
	if q.LockReturnsRow() {
		// MySQL: GET_LOCK waits 5 s at most; ask again until ctx ends.
		for {
			var got sql.NullInt64
			if err := conn.QueryRowContext(ctx, query, args...).Scan(&got); err != nil {
				return nil, fmt.Errorf("lock %s: %w", q.Table(), err)
			}
			if !got.Valid {
				return nil, fmt.Errorf("lock %s: GET_LOCK returned NULL (the server failed to take the lock)", q.Table())
			}
			if got.Int64 == 1 {
				return unlock, nil
			}
			if err := ctx.Err(); err != nil {
				return nil, fmt.Errorf("lock %s: another migrate is running: %w", q.Table(), err)
			}
		}
	}
	if _, err := conn.ExecContext(ctx, query, args...); err != nil {
		return nil, fmt.Errorf("lock %s: %w", q.Table(), err)
	}
	return unlock, nil
}

// tx is one migration's transaction on conn: database/sql's on
// PostgreSQL, BEGIN IMMEDIATE on SQLite, none on MySQL (DDL commits
// itself).
type tx struct {
	conn *sql.Conn
	d    dialect.Dialect
	sql  *sql.Tx
	raw  bool // SQLite: BEGIN IMMEDIATE sent on conn
}

func begin(ctx context.Context, conn *sql.Conn, d dialect.Dialect) (*tx, error) {
	t := &tx{conn: conn, d: d}
	switch d {
	case dialect.Postgres:
		var err error
		t.sql, err = conn.BeginTx(ctx, nil)
		return t, err
	case dialect.SQLite:
		// Waits for other writers (busy_timeout), and retries when the
		// connection has none.
		err := whileBusy(ctx, d, func() error {
			_, err := conn.ExecContext(ctx, dialect.BeginImmediate)
			return err
		})
		if err != nil {
			return nil, err
		}
		t.raw = true
	}
	return t, nil
}

// whileBusy runs f again while it fails with SQLITE_BUSY, until ctx ends.
// Besides a BEGIN IMMEDIATE on a connection without busy_timeout, a new
// connection's PRAGMA journal_mode(WAL) fails so at once, without the
// busy handler, while another converts a fresh file (several instances
// migrating at start-up).
func whileBusy(ctx context.Context, d dialect.Dialect, f func() error) error {
	for {
		err := f()
		if err == nil || d != dialect.SQLite || dberr.Infrastructure(err) != dberr.InfraBusy {
			return err
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%w (waiting for another writer: %v)", ctx.Err(), err)
		case <-time.After(20 * time.Millisecond):
		}
	}
}

func (t *tx) q() querier {
	if t.sql != nil {
		return t.sql
	}
	return t.conn
}

func (t *tx) commit(ctx context.Context) error {
	switch {
	case t.sql != nil:
		return t.sql.Commit()
	case t.raw:
		_, err := t.conn.ExecContext(ctx, "COMMIT")
		return err
	}
	return nil
}

func (t *tx) rollback() {
	switch {
	case t.sql != nil:
		_ = t.sql.Rollback()
	case t.raw:
		_, _ = t.conn.ExecContext(context.Background(), "ROLLBACK")
	}
}

// step reads the version and applies the next pending migration (or
// records the version-1 tables), in one transaction. done: nothing was
// pending.
func step(ctx context.Context, conn *sql.Conn, d dialect.Dialect, q *dialect.VersionQueries, t templates.Tables, ms []templates.Migration, r *Report, first bool) (done bool, err error) {
	// PostgreSQL: read before the transaction, as a failed probe would
	// abort it; the session lock keeps the answer valid.
	var version int
	var unrecorded bool
	if d == dialect.Postgres {
		if version, _, unrecorded, err = current(ctx, conn, d, q, t); err != nil {
			return false, err
		}
	}
	x, err := begin(ctx, conn, d)
	if err != nil {
		return false, fmt.Errorf("begin: %w", err)
	}
	defer func() {
		if err != nil {
			x.rollback()
		}
	}()
	if d != dialect.Postgres {
		if version, _, unrecorded, err = current(ctx, x.q(), d, q, t); err != nil {
			var partial *partialTables
			if d != dialect.MySQL || !errors.As(err, &partial) {
				return false, err
			}
			// MySQL: a run of migration 1 interrupted half way. Run it
			// again: its statements creating the existing tables are
			// checked and skipped below.
			version, err = 0, nil
		}
	}
	if first {
		r.From, r.To, r.unread = version, version, false
	}
	var run []string
	var applied *Applied
	switch {
	case unrecorded:
		run = statements(ms[0].Record)
	case version < len(ms):
		m := ms[version]
		run = m.Statements()
		applied = &Applied{Version: m.Version, Name: m.Name, File: m.FileName(), Statements: len(run)}
	default:
		if err = x.commit(ctx); err != nil {
			return false, err
		}
		return true, nil
	}
	what := "recording the version-1 tables"
	if applied != nil {
		what = "migration " + applied.File
	}
	start := time.Now()
	skip, kept := make([]bool, len(run)), []string(nil)
	if d == dialect.MySQL {
		if skip, kept, err = existingTables(ctx, conn, what, run); err != nil {
			return false, err
		}
	}
	for i, stmt := range run {
		if skip[i] {
			continue
		}
		if _, err = x.q().ExecContext(ctx, stmt); err != nil {
			return false, failed(d, what, i, run, err)
		}
	}
	if err = x.commit(ctx); err != nil {
		if uncertain(err) {
			return false, fmt.Errorf("%s: the commit did not complete: %w\nThe connection was lost or the call gave up while committing: the migration is applied entirely, its version record included, or not at all. migrate status tells which; migrate up applies it again if it is not", what, err)
		}
		return false, fmt.Errorf("%s: commit failed, and the migration was rolled back (nothing of it is applied): %w", what, err)
	}
	if applied == nil {
		r.Baselined, r.To = true, 1
		return false, nil
	}
	applied.Duration = time.Since(start)
	applied.Kept = kept
	r.Applied = append(r.Applied, *applied)
	r.To = applied.Version
	return false, nil
}

// failed explains the failed statement i of run, the statements of what
// ("migration NNNN_name.up.sql").
func failed(d dialect.Dialect, what string, i int, run []string, err error) error {
	n := len(run)
	if d != dialect.MySQL {
		// PostgreSQL, SQLite: one transaction, also when the connection
		// was lost (the server rolls back a session's open transaction).
		return fmt.Errorf("%s failed at statement %d of %d, and was rolled back (nothing of it is applied): %w\nstatement:\n%s", what, i+1, n, err, run[i])
	}
	// MySQL commits each DDL statement: statements 1 to i are applied.
	before := ""
	if i > 0 {
		before = fmt.Sprintf(" Statements 1 to %d are applied.", i)
	}
	switch {
	case uncertain(err):
		recorded := "The version is not recorded."
		if i == n-1 {
			recorded = "The version may be recorded (migrate status tells)."
		}
		return fmt.Errorf("%s: statement %d of %d did not complete: %w\nThe connection was lost or the call gave up while the statement ran, and MySQL commits each DDL statement: the server may have applied it.%s %s Run migrate up again once the database is reachable: it resumes the migration, keeping a table an earlier run created when it is exactly as the migration creates it, and stops at anything else already applied, saying what to do.\nstatement:\n%s",
			what, i+1, n, err, before, recorded, run[i])
	case alreadyExists(err):
		return fmt.Errorf("%s failed at statement %d of %d: %w\nWhat this statement creates already exists and the version is not recorded: an earlier run of this migration most likely stopped after this statement (interrupted, or failed at a later one), as MySQL commits each DDL statement.%s Check that what exists is exactly what the statement below creates, then run the file's statements %d to %d by hand, skipping those already applied (the last ones record the version), and run migrate up again; or undo what the earlier run applied and run migrate up again.\nstatement:\n%s",
			what, i+1, n, err, before, min(i+2, n), n, run[i])
	case i == 0:
		return fmt.Errorf("%s failed at its first statement: %w\nThis run applied none of it, and the version is not recorded. MySQL commits each DDL statement, so if an earlier run of this migration was interrupted, what that run applied is still there: the next migrate up keeps a table it created when it is exactly as the migration creates it, and stops at anything else already applied, saying what to do. Fix the cause, then run migrate up again.\nstatement:\n%s",
			what, err, run[i])
	}
	advice := fmt.Sprintf("Undo them, or run the rest by hand (the file's statements %d to %d, the last ones recording the version), then run migrate up again.", i+1, n)
	if slices.IndexFunc(run[:i], func(s string) bool { return !createsTable(s) }) < 0 {
		advice = fmt.Sprintf("They create tables: fix the cause and run migrate up again, which keeps each of them (checking that it is exactly as the migration creates it) and resumes at statement %d.", i+1)
	}
	return fmt.Errorf("%s failed at statement %d of %d: %w\nMySQL commits each DDL statement: statements 1 to %d are applied and the version is not recorded. %s\nstatement:\n%s",
		what, i+1, n, err, i, advice, run[i])
}

// existingTables looks, before a MySQL migration runs, for the tables its
// CREATE TABLE statements create: one that exists was left by an earlier
// run of the migration, interrupted after the statement (MySQL commits
// each DDL statement), when it is exactly the statement's table. skip
// marks those statements and kept names their tables; a table that is not
// the statement's stops the migration before it changes anything.
func existingTables(ctx context.Context, conn *sql.Conn, what string, run []string) (skip []bool, kept []string, err error) {
	skip = make([]bool, len(run))
	for i, stmt := range run {
		table, asTemp, ok := createdTable(stmt)
		if !ok {
			continue
		}
		_, err := showCreate(ctx, conn, table)
		switch {
		case err == nil:
		case dberr.Classify(err) == dberr.Missing:
			continue
		case errors.Is(err, errNotTable):
			return nil, nil, cannotCheck(what, i, run, table, err)
		default:
			return nil, nil, fmt.Errorf("%s: look for table %s, which statement %d creates: %w", what, table, i+1, err)
		}
		existing, want, err := sameTable(ctx, conn, table, asTemp)
		if err != nil {
			return nil, nil, cannotCheck(what, i, run, table, err)
		}
		if existing != want {
			return nil, nil, differs(what, i, run, table, existing, want)
		}
		skip[i] = true
		kept = append(kept, table)
	}
	return skip, kept, nil
}

// differs explains a table that statement i of run creates and that
// exists with another definition.
func differs(what string, i int, run []string, table, existing, want string) error {
	return fmt.Errorf("%s: table %s already exists, and is not the table statement %d of %d creates (an interrupted run of this migration leaves it exactly as the statement creates it): rename or drop it, or, if it is outboxgen's and was changed since, change it back; then run migrate up again. Nothing was run: the version is not recorded.\n%s\nstatement:\n%s",
		what, table, i+1, len(run), lineDiff(existing, want), run[i])
}

// cannotCheck explains a table that statement i of run creates, that
// exists, and that could not be compared with the statement's.
func cannotCheck(what string, i int, run []string, table string, err error) error {
	return fmt.Errorf("%s: table %s, which statement %d of %d creates, already exists and the version is not recorded: an earlier run of this migration most likely stopped after creating it (MySQL commits each DDL statement), but outboxgen could not check that it is exactly the table the statement creates: %w\nNothing was run. Compare the table (SHOW CREATE TABLE %s) with the statement below: if it matches, run the file's statements %d to %d by hand, skipping those already applied (the last ones record the version); if not, rename or drop it. Then run migrate up again.\nstatement:\n%s",
		what, table, i+1, len(run), err, table, min(i+2, len(run)), len(run), run[i])
}

// lineDiff shows the lines of the existing table's definition and of the
// statement's that the other lacks.
func lineDiff(existing, want string) string {
	// Lines compare without indentation and trailing comma (the last
	// column or key has none).
	lines := func(def string) []string {
		var out []string
		for _, l := range strings.Split(def, "\n") {
			out = append(out, strings.TrimSuffix(strings.TrimSpace(l), ","))
		}
		return out
	}
	e, w := lines(existing), lines(want)
	only := func(a, b []string) []string {
		var out []string
		for _, l := range a {
			if !slices.Contains(b, l) {
				out = append(out, "  "+l)
			}
		}
		if len(out) > 12 {
			out = append(out[:12], fmt.Sprintf("  (%d lines more)", len(out)-12))
		}
		return out
	}
	oe, ow := only(e, w), only(w, e)
	if len(oe) == 0 && len(ow) == 0 {
		return "The existing table has the lines of the statement's, in another order (SHOW CREATE TABLE):\n" + existing
	}
	show := func(l []string) string {
		if len(l) == 0 {
			return "  (none)"
		}
		return strings.Join(l, "\n")
	}
	return "The existing table has (SHOW CREATE TABLE):\n" + show(oe) + "\nwhere the statement creates:\n" + show(ow)
}

// alreadyExists reports whether err says that what a statement creates
// exists: a table, column, index, primary key, foreign key or check
// constraint.
func alreadyExists(err error) bool {
	switch mysqlErrno(err) {
	case 1050, 1060, 1061, 1068, 1826, 3822: // ER_TABLE_EXISTS_ERROR, ER_DUP_FIELDNAME, ER_DUP_KEYNAME, ER_MULTIPLE_PRI_KEY, ER_FK_DUP_NAME, ER_CHECK_CONSTRAINT_DUP_NAME
		return true
	}
	return false
}

// uncertain reports whether err leaves the statement's outcome unknown:
// the connection was lost or the server was shutting down, or the client
// gave up waiting (a cancelled context or a network timeout: go-sql-driver
// then closes the connection, and the server goes on). A timeout the
// server reports (a lock wait, max_statement_time) ended the statement,
// which is not uncertain.
func uncertain(err error) bool {
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return true
	}
	var ne net.Error
	if errors.As(err, &ne) {
		return true
	}
	switch dberr.Infrastructure(err) {
	case dberr.InfraConnection, dberr.InfraShutdown:
		return true
	}
	return false
}

// mysqlErrno returns the error number of the go-sql-driver *MySQLError
// err wraps, 0 if none; read by reflection, so that the driver is not
// imported (and registered) by programs that do not use it.
func mysqlErrno(err error) uint64 {
	for ; err != nil; err = errors.Unwrap(err) {
		v := reflect.ValueOf(err)
		if v.Kind() != reflect.Pointer || v.IsNil() || v.Elem().Kind() != reflect.Struct ||
			!strings.HasSuffix(v.Elem().Type().PkgPath(), "go-sql-driver/mysql") {
			continue
		}
		if f := v.Elem().FieldByName("Number"); f.IsValid() && f.CanUint() {
			return f.Uint()
		}
	}
	return 0
}

// checkTable is the temporary table sameTable creates.
const checkTable = "outboxgen_migrate_check"

var createTableRE = regexp.MustCompile(`^CREATE TABLE ([a-z_][a-z0-9_]*) \(`)

// createdTable returns the table a plain "CREATE TABLE name (" statement
// creates, and the statement creating it as the temporary checkTable
// instead.
func createdTable(stmt string) (table, asTemp string, ok bool) {
	lines := strings.Split(stmt, "\n")
	for k, line := range lines {
		code := strings.TrimSpace(line)
		if code == "" || strings.HasPrefix(code, "--") {
			continue
		}
		m := createTableRE.FindStringSubmatch(code)
		if m == nil {
			return "", "", false
		}
		rest := strings.TrimLeft(strings.Join(lines[k:], "\n"), " \t")
		return m[1], "CREATE TEMPORARY TABLE " + checkTable + " (" + rest[len(m[0]):], true
	}
	return "", "", false
}

// createsTable reports whether stmt is a CREATE TABLE, which the next Up
// finds done (createdTable, or IF NOT EXISTS).
func createsTable(stmt string) bool {
	if _, _, ok := createdTable(stmt); ok {
		return true
	}
	for _, line := range strings.Split(stmt, "\n") {
		if code := strings.TrimSpace(line); code != "" && !strings.HasPrefix(code, "--") {
			return strings.HasPrefix(code, "CREATE TABLE IF NOT EXISTS ")
		}
	}
	return false
}

// Left out of the definitions sameTable compares: the next AUTO_INCREMENT
// value (rows written since), and the names the server generates for
// unnamed CHECK constraints (MySQL: <table>_chk_N, which may differ for a
// temporary table; MariaDB: CONSTRAINT_N), keeping their expressions.
var (
	autoIncrementRE  = regexp.MustCompile(` AUTO_INCREMENT=[0-9]+`)
	generatedCheckRE = regexp.MustCompile("CONSTRAINT `[^`]*(_chk_|CONSTRAINT_)[0-9]+` CHECK")
)

func normaliseDefinition(def string) string {
	return generatedCheckRE.ReplaceAllString(autoIncrementRE.ReplaceAllString(def, ""), "CHECK")
}

// sameTable returns the definitions (SHOW CREATE TABLE) of the existing
// table and of the table asTemp creates as the temporary checkTable, the
// same when the table is exactly the statement's: asTemp is run in conn's
// session, and the temporary table dropped.
func sameTable(ctx context.Context, conn *sql.Conn, table, asTemp string) (existing, want string, err error) {
	drop := func() {
		ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
		defer cancel()
		_, _ = conn.ExecContext(ctx, "DROP TEMPORARY TABLE IF EXISTS "+checkTable)
	}
	drop()
	defer drop()
	if _, err := conn.ExecContext(ctx, asTemp); err != nil {
		return "", "", fmt.Errorf("running the statement as a temporary table failed: %w", err)
	}
	if want, err = showCreate(ctx, conn, checkTable); err != nil {
		return "", "", err
	}
	want = strings.Replace(strings.ReplaceAll(want, checkTable, table), "CREATE TEMPORARY TABLE ", "CREATE TABLE ", 1)
	if existing, err = showCreate(ctx, conn, table); err != nil {
		return "", "", err
	}
	return normaliseDefinition(existing), normaliseDefinition(want), nil
}

var errNotTable = errors.New("not a table (a view?)")

// showCreate returns SHOW CREATE TABLE's definition of table.
func showCreate(ctx context.Context, conn *sql.Conn, table string) (string, error) {
	rows, err := conn.QueryContext(ctx, "SHOW CREATE TABLE `"+table+"`")
	if err != nil {
		return "", fmt.Errorf("SHOW CREATE TABLE %s: %w", table, err)
	}
	defer rows.Close()
	if cols, err := rows.Columns(); err != nil {
		return "", fmt.Errorf("SHOW CREATE TABLE %s: %w", table, err)
	} else if len(cols) != 2 {
		return "", fmt.Errorf("SHOW CREATE TABLE %s: %w", table, errNotTable)
	}
	var name, def string
	if !rows.Next() {
		if err := rows.Err(); err != nil {
			return "", fmt.Errorf("SHOW CREATE TABLE %s: %w", table, err)
		}
		return "", fmt.Errorf("SHOW CREATE TABLE %s: no row", table)
	}
	if err := rows.Scan(&name, &def); err != nil {
		return "", fmt.Errorf("SHOW CREATE TABLE %s: %w", table, err)
	}
	return def, rows.Err()
}

// statements splits SQL (templates.Statements).
func statements(b []byte) []string { return templates.Statements(b) }

// ensureArchive creates t.Archive when it does not exist.
func ensureArchive(ctx context.Context, conn *sql.Conn, d dialect.Dialect, t templates.Tables, r *Report) (err error) {
	look := func(db querier) (bool, error) {
		err := probe(ctx, db, dialect.SelectColumns(t.Archive, dialect.OutboxColumns))
		if err == nil {
			return true, nil
		}
		if dberr.Classify(err) != dberr.Missing {
			return false, fmt.Errorf("look for the archive table %s: %w", t.Archive, err)
		}
		return false, nil
	}
	// PostgreSQL: look before the transaction (a failed probe aborts it);
	// SQLite: inside, where BEGIN IMMEDIATE keeps other migrations out.
	if d == dialect.Postgres {
		if ok, err := look(conn); ok || err != nil {
			return err
		}
	}
	ddl, err := templates.RenderArchive(string(d), t)
	if err != nil {
		return err
	}
	x, err := begin(ctx, conn, d)
	if err != nil {
		return fmt.Errorf("begin: %w", err)
	}
	defer func() {
		if err != nil {
			x.rollback()
		}
	}()
	if d != dialect.Postgres {
		if ok, err := look(x.q()); ok || err != nil {
			return err
		}
	}
	for i, stmt := range templates.Statements(ddl) {
		if _, err = x.q().ExecContext(ctx, stmt); err != nil {
			if d == dialect.MySQL && i > 0 {
				return fmt.Errorf("create the archive table %s: %w (MySQL commits each DDL statement: the %d before this one are applied)", t.Archive, err, i)
			}
			return fmt.Errorf("create the archive table %s: %w", t.Archive, err)
		}
	}
	if err = x.commit(ctx); err != nil {
		return err
	}
	r.ArchiveCreated = t.Archive
	return nil
}
