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
// and Up's error says which statements ran.
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
	"fmt"
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
	// (the database was migrated by a newer outboxgen).
	Latest int `json:"latest"`
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
		fmt.Fprintf(&b, "applied %s (version %d, %d statements, %s)\n", a.File, a.Version, a.Statements, a.Duration.Round(time.Millisecond))
	}
	if r.ArchiveCreated != "" {
		fmt.Fprintf(&b, "created the archive table %s (sql.archive_table)\n", r.ArchiveCreated)
	}
	switch {
	case r.To > r.Latest:
		fmt.Fprintf(&b, "nothing to apply: the database is at version %d, newer than the %d this outboxgen knows\n", r.To, r.Latest)
	case !r.Changed():
		fmt.Fprintf(&b, "nothing to apply: the database is at version %d, the latest\n", r.To)
	case r.From != r.To:
		fmt.Fprintf(&b, "schema version %d -> %d (recorded in %s)\n", r.From, r.To, r.VersionTable)
	case r.To == r.Latest:
		fmt.Fprintf(&b, "schema version %d, the latest\n", r.To)
	}
	return b.String()
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

// current reads the schema version: (0, 0, false) without tables, (1, 1,
// true) for tables created before versioned migrations.
func current(ctx context.Context, db querier, q *dialect.VersionQueries, t templates.Tables) (version, compatibleFrom int, unrecorded bool, err error) {
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
	return 0, 0, false, fmt.Errorf("the database has %s but not %s (or not all their columns), and no version table %s: it is neither empty nor at version 1; create the missing tables from migration 1 (outboxgen schema prints it) or drop the partial ones, then run migrate up again",
		strings.Join(found, ", "), strings.Join(missing, ", "), q.Table())
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
	s.Current, s.CompatibleFrom, s.Unrecorded, err = current(ctx, db, q, t)
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
	r := Report{Dialect: d, Applied: []Applied{}}
	if err != nil {
		return r, err
	}
	r.VersionTable, r.Latest = q.Table(), c.set.Latest().Version
	conn, err := db.Conn(ctx)
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
		for {
			_, err := conn.ExecContext(ctx, dialect.BeginImmediate)
			if err == nil {
				t.raw = true
				return t, nil
			}
			if !strings.Contains(err.Error(), "database is locked") && !strings.Contains(err.Error(), "SQLITE_BUSY") {
				return nil, err
			}
			select {
			case <-ctx.Done():
				return nil, fmt.Errorf("%w (waiting for another writer: %v)", ctx.Err(), err)
			case <-time.After(20 * time.Millisecond):
			}
		}
	}
	return t, nil
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
		if version, _, unrecorded, err = current(ctx, conn, q, t); err != nil {
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
		if version, _, unrecorded, err = current(ctx, x.q(), q, t); err != nil {
			return false, err
		}
	}
	if first {
		r.From, r.To = version, version
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
	start := time.Now()
	for i, stmt := range run {
		if _, err = x.q().ExecContext(ctx, stmt); err != nil {
			return false, failed(d, applied, i, run, err)
		}
	}
	if err = x.commit(ctx); err != nil {
		return false, fmt.Errorf("commit: %w", err)
	}
	if applied == nil {
		r.Baselined, r.To = true, 1
		return false, nil
	}
	applied.Duration = time.Since(start)
	r.Applied = append(r.Applied, *applied)
	r.To = applied.Version
	return false, nil
}

// failed explains a migration's failed statement i of run.
func failed(d dialect.Dialect, m *Applied, i int, run []string, err error) error {
	what := "recording the version-1 tables"
	if m != nil {
		what = fmt.Sprintf("migration %s", m.File)
	}
	if d != dialect.MySQL {
		return fmt.Errorf("%s failed at statement %d of %d, and was rolled back (nothing of it is applied): %w\nstatement:\n%s", what, i+1, len(run), err, run[i])
	}
	if i == 0 {
		return fmt.Errorf("%s failed at its first statement (nothing of it is applied): %w\nstatement:\n%s", what, err, run[i])
	}
	return fmt.Errorf("%s failed at statement %d of %d: %w\nMySQL commits each DDL statement: statements 1 to %d are applied and the version is not recorded. Undo them, or run the rest by hand (the file's statements %d to %d, the last ones recording the version), then run migrate up again.\nstatement:\n%s",
		what, i+1, len(run), err, i, i+1, len(run), run[i])
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
