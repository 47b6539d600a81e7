package privtest

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/url"
	"os"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"
	"github.com/go-sql-driver/mysql"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxgen/outboxgen/internal/gentest/sqlevents"
	"github.com/outboxgen/outboxgen/internal/testdb"
	"github.com/outboxgen/outboxgen/runtime/dialect"
	"github.com/outboxgen/outboxgen/runtime/driver"
	"github.com/outboxgen/outboxgen/runtime/driver/pgxdriver"
	"github.com/outboxgen/outboxgen/runtime/driver/sqldriver"
	"github.com/outboxgen/outboxgen/runtime/inbox"
	"github.com/outboxgen/outboxgen/runtime/janitor"
	"github.com/outboxgen/outboxgen/runtime/monitor"
	"github.com/outboxgen/outboxgen/runtime/outbox"
	"github.com/outboxgen/outboxgen/runtime/relay"
	"github.com/outboxgen/outboxgen/runtime/sweeper"
	"github.com/outboxgen/outboxgen/templates"
)

// tables are the tables of every test database: the defaults plus the
// janitor's archive table.
var tables = templates.Tables{Outbox: "outbox_event", Inbox: "outbox_inbox", Archive: "outbox_archive"}

var drvTables = driver.Tables{Outbox: tables.Outbox, Inbox: tables.Inbox, Archive: tables.Archive}

const password = "privtest-pw"

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

// component is one outboxgen component: the role it gets in the GRANT
// script and the work it does as that role. run returns the first error;
// a permission problem must surface as an error.
type component struct {
	name string
	role func(name string) templates.Roles
	run  func(t *testing.T, e *env, as *role) error
}

var components = []component{
	{"writer", func(n string) templates.Roles { return templates.Roles{Writer: n} }, runWriter},
	{"relay", func(n string) templates.Roles { return templates.Roles{Relay: n} }, runRelay},
	{"sweeper", func(n string) templates.Roles { return templates.Roles{Sweeper: n} }, runSweeper},
	{"monitor", func(n string) templates.Roles { return templates.Roles{Monitor: n} }, runMonitor},
	{"janitor", func(n string) templates.Roles { return templates.Roles{Janitor: n} }, runJanitor},
	{"consumer", func(n string) templates.Roles { return templates.Roles{Consumer: n} }, runConsumer},
}

// TestGrants runs every component, on PostgreSQL and MariaDB, as a role
// holding exactly the grants of the rendered script ("exact": it must
// work), and once per privilege of the script with that privilege left
// out (it must fail with a permission error): the script is sufficient
// and minimal.
func TestGrants(t *testing.T) {
	for _, d := range []string{"postgres", "mysql"} {
		t.Run(d, func(t *testing.T) {
			for _, c := range components {
				t.Run(c.name, func(t *testing.T) {
					// The script's shape (statements and privileges) does
					// not depend on the names: enumerate it once.
					shape := grantStatements(t, d, "db", "public", c.role("og_shape"))
					t.Run("exact", func(t *testing.T) {
						t.Parallel()
						e := newEnv(t, d)
						r := e.newRole(t, c, -1, "")
						if err := c.run(t, e, r); err != nil {
							t.Fatalf("%s with exactly the script's grants failed: %v\nGrants:\n%s", c.name, err, strings.Join(r.grants, ";\n"))
						}
					})
					for i, g := range shape {
						for _, p := range g.privs {
							t.Run("without "+p+" on "+g.object, func(t *testing.T) {
								t.Parallel()
								e := newEnv(t, d)
								r := e.newRole(t, c, i, p)
								err := c.run(t, e, r)
								if err == nil {
									t.Fatalf("%s worked without %s on %s: the script grants more than needed\nGrants:\n%s", c.name, p, g.object, strings.Join(r.grants, ";\n"))
								}
								if !denied(err) && !(strings.HasPrefix(g.object, "SCHEMA ") && hidden(err)) {
									t.Fatalf("%s without %s on %s failed, but not with a permission error: %v", c.name, p, g.object, err)
								}
								t.Logf("without %s on %s: %v", p, g.object, err)
							})
						}
					}
				})
			}
		})
	}
}

// TestGrantsOtherSchema runs every component on PostgreSQL with its tables
// in a schema other than public (the database's search_path), with exactly
// the grants of the script rendered for that schema: the script must grant
// on the schema's tables, not on whatever the admin's search_path finds.
func TestGrantsOtherSchema(t *testing.T) {
	for _, c := range components {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			e := newEnvIn(t, "postgres", "shipping")
			r := e.newRole(t, c, -1, "")
			if err := c.run(t, e, r); err != nil {
				t.Fatalf("%s with exactly the script's grants in schema shipping failed: %v\nGrants:\n%s", c.name, err, strings.Join(r.grants, ";\n"))
			}
		})
	}
}

// grant is one GRANT statement of a script.
type grant struct {
	privs  []string
	object string // what follows ON, with the database qualifier removed
	text   string // the statement, comments dropped
}

var grantRE = regexp.MustCompile(`^GRANT (.+?) ON (.+?) TO (.+)$`)

// grantStatements renders the script of dialect d for database db (and
// PostgreSQL schema) and roles, and parses its GRANT statements.
func grantStatements(t *testing.T, d, db, schema string, roles templates.Roles) []grant {
	t.Helper()
	script, err := templates.RenderGrants(d, templates.GrantParams{Tables: tables, Database: db, Schema: schema, Roles: roles})
	if err != nil {
		t.Fatal(err)
	}
	var gs []grant
	for _, stmt := range templates.Statements(script) {
		var lines []string
		for _, l := range strings.Split(stmt, "\n") {
			if l = strings.TrimSpace(l); l != "" && !strings.HasPrefix(l, "--") {
				lines = append(lines, l)
			}
		}
		text := strings.Join(lines, " ")
		m := grantRE.FindStringSubmatch(text)
		if m == nil {
			t.Fatalf("not a GRANT statement in the %s script: %q", d, text)
		}
		obj := strings.TrimPrefix(m[2], db+".")
		gs = append(gs, grant{privs: strings.Split(m[1], ", "), object: obj, text: text})
	}
	if len(gs) == 0 {
		t.Fatalf("the %s script grants nothing", d)
	}
	return gs
}

// env is one fresh test database with the outboxgen tables, administered
// by a superuser.
type env struct {
	d      string
	dia    dialect.Dialect
	ctx    context.Context
	dsn    string  // the database, as the superuser
	admin  *sql.DB // the database, as the superuser
	server *sql.DB // the server, as the superuser (roles outlive databases)
	dbName string
	schema string   // PostgreSQL: the schema of the tables
	drops  []string // DROP ROLE / DROP USER statements, run at the end
}

func newEnv(t *testing.T, d string) *env {
	t.Helper()
	return newEnvIn(t, d, "public")
}

// newEnvIn is newEnv with the PostgreSQL tables in schema, which becomes
// the database's search_path.
func newEnvIn(t *testing.T, d, schema string) *env {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	e := &env{d: d, ctx: ctx, schema: schema}
	switch d {
	case "postgres":
		e.dia = dialect.Postgres
	case "mysql":
		e.dia = dialect.MySQL
	}
	// The server connection is opened first, so that it is closed (and
	// the roles dropped) after testdb dropped the database.
	serverDSN := os.Getenv(testdb.PostgresEnv)
	if d == "mysql" {
		serverDSN = os.Getenv(testdb.MySQLEnv)
	}
	if serverDSN != "" {
		srv, err := sql.Open(testdb.Driver(t, d), serverDSN)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { srv.Close() })
		e.server = srv
		// Roles and users are the server's, not the database's: dropped
		// after testdb dropped the database (cleanups run last first),
		// when nothing depends on them any more.
		t.Cleanup(func() {
			for _, drop := range e.drops {
				if _, err := srv.ExecContext(context.Background(), drop); err != nil {
					t.Errorf("%s: %v", drop, err)
				}
			}
		})
	}
	e.dsn = testdb.DSN(t, d) // skips without a server (fails in CI)
	admin, err := sql.Open(testdb.Driver(t, d), e.dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { admin.Close() })
	e.admin = admin
	if err := admin.QueryRowContext(ctx, map[string]string{"postgres": "SELECT current_database()", "mysql": "SELECT DATABASE()"}[d]).Scan(&e.dbName); err != nil {
		t.Fatal(err)
	}
	if d == "postgres" && schema != "public" {
		// Every later connection (the admin's new pool, the roles')
		// finds the tables through the database's search_path.
		e.exec(t, "CREATE SCHEMA "+schema)
		e.exec(t, "ALTER DATABASE "+e.dbName+" SET search_path TO "+schema)
		admin.Close()
		if admin, err = sql.Open(testdb.Driver(t, d), e.dsn); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { admin.Close() })
		e.admin = admin
	}
	testdb.ApplySchema(t, admin, d, tables)
	if d == "postgres" {
		// A hardened database: PUBLIC may neither connect nor use the
		// schema, so the script's CONNECT and USAGE grants are what let
		// the roles in.
		e.exec(t, "REVOKE CONNECT, TEMPORARY ON DATABASE "+e.dbName+" FROM PUBLIC")
		e.exec(t, "REVOKE ALL ON SCHEMA "+schema+" FROM PUBLIC")
	}
	return e
}

func (e *env) exec(t *testing.T, q string, args ...any) {
	t.Helper()
	if _, err := e.admin.ExecContext(e.ctx, q, args...); err != nil {
		t.Fatalf("admin: %s: %v", q, err)
	}
}

// grant runs a GRANT statement as the admin. On PostgreSQL it runs with
// search_path public, whatever the tables' schema: as an administrator
// running the script from another session would, so that a script naming
// tables without their schema fails.
func (e *env) grant(t *testing.T, stmt string) {
	t.Helper()
	if e.d != "postgres" {
		e.exec(t, stmt)
		return
	}
	tx, err := e.admin.BeginTx(e.ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback()
	for _, q := range []string{"SET LOCAL search_path TO public", stmt} {
		if _, err := tx.ExecContext(e.ctx, q); err != nil {
			t.Fatalf("admin: %s: %v", q, err)
		}
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
}

// role is a login role holding some grants, with a connection pool.
type role struct {
	name   string
	grants []string
	db     *sql.DB
	dsn    string
}

func randomHex(n int) string {
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		panic(err)
	}
	return hex.EncodeToString(b)
}

// newRole creates a login role for c holding the grants of its script,
// except privilege without of statement skip (skip < 0: all of them).
func (e *env) newRole(t *testing.T, c component, skip int, without string) *role {
	t.Helper()
	name := "og" + randomHex(5) + "_" + c.name
	r := &role{name: name}
	switch e.d {
	case "postgres":
		e.drops = append(e.drops, "DROP ROLE IF EXISTS "+name)
		e.exec(t, "CREATE ROLE "+name+" LOGIN PASSWORD '"+password+"'")
	case "mysql":
		e.drops = append(e.drops, "DROP USER IF EXISTS '"+name+"'@'%'")
		e.exec(t, "CREATE USER '"+name+"'@'%' IDENTIFIED BY '"+password+"'")
	}
	for i, g := range grantStatements(t, e.d, e.dbName, e.schema, c.role(name)) {
		stmt := g.text
		if i == skip {
			var keep []string
			for _, p := range g.privs {
				if p != without {
					keep = append(keep, p)
				}
			}
			if len(keep) == 0 {
				continue
			}
			stmt = strings.Replace(stmt, strings.Join(g.privs, ", "), strings.Join(keep, ", "), 1)
		}
		r.grants = append(r.grants, stmt)
		e.grant(t, stmt)
	}
	switch e.d {
	case "postgres":
		u, err := url.Parse(e.dsn)
		if err != nil {
			t.Fatal(err)
		}
		u.User = url.UserPassword(name, password)
		r.dsn = u.String()
	case "mysql":
		cfg, err := mysql.ParseDSN(e.dsn)
		if err != nil {
			t.Fatal(err)
		}
		cfg.User, cfg.Passwd = name, password
		r.dsn = cfg.FormatDSN()
	}
	db, err := sql.Open(testdb.Driver(t, e.d), r.dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	r.db = db
	return r
}

// denied reports whether err is a database's refusal for lack of a
// privilege: PostgreSQL SQLSTATE 42501 (insufficient_privilege), MySQL
// errors 1044 (database), 1142 (table), 1143 (column); or such a refusal
// reported as text (a poisoned message's reason).
func denied(err error) bool {
	var pg *pgconn.PgError
	if errors.As(err, &pg) {
		return pg.Code == "42501"
	}
	var my *mysql.MySQLError
	if errors.As(err, &my) {
		return my.Number == 1044 || my.Number == 1142 || my.Number == 1143
	}
	msg := strings.ToLower(err.Error())
	return strings.Contains(msg, "sqlstate 42501") || strings.Contains(msg, "permission denied") ||
		strings.Contains(msg, "command denied") || strings.Contains(msg, "access denied")
}

// hidden reports whether err is PostgreSQL's "relation does not exist"
// (42P01): how it refuses a table in a schema the role has no USAGE on
// (its unqualified name no longer resolves).
func hidden(err error) bool {
	var pg *pgconn.PgError
	return errors.As(err, &pg) && pg.Code == "42P01"
}

// ------------------------------------------------------------ fixtures

func orderPaid(id string) sqlevents.OrderPaid {
	return sqlevents.OrderPaid{OrderID: id, CustomerID: "c-" + id, AmountCents: 1299, Currency: "EUR",
		Method: sqlevents.PaymentMethodCard, PaidAt: time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)}
}

func event(key string) outbox.Event {
	return outbox.Event{Type: sqlevents.OrderPaidType, Topic: sqlevents.OrderPaidTopic, Key: key,
		Version: sqlevents.OrderPaidVersion, Payload: orderPaid(key)}
}

// seed inserts one pending event per key as the superuser and returns
// their row ids.
func (e *env) seed(t *testing.T, keys ...string) []int64 {
	t.Helper()
	w := outbox.MustNewWriter(e.dia, tables.Outbox)
	tx, err := e.admin.BeginTx(e.ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback()
	var ids []int64
	for _, k := range keys {
		id, err := w.Insert(e.ctx, tx, event(k))
		if err != nil {
			t.Fatal(err)
		}
		var rowID int64
		if err := tx.QueryRowContext(e.ctx, "SELECT id FROM "+tables.Outbox+" WHERE event_id = "+e.dia.Placeholder(1), id.String()).Scan(&rowID); err != nil {
			t.Fatal(err)
		}
		ids = append(ids, rowID)
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	return ids
}

// ago is the dialect's expression for "now minus d".
func (e *env) ago(d time.Duration) string {
	s := strconv.FormatInt(int64(d/time.Second), 10)
	if e.d == "postgres" {
		return "now() - interval '" + s + " seconds'"
	}
	return "CURRENT_TIMESTAMP(6) - INTERVAL " + s + " SECOND"
}

func (e *env) count(t *testing.T, q string) int64 {
	t.Helper()
	var n int64
	if err := e.admin.QueryRowContext(e.ctx, q).Scan(&n); err != nil {
		t.Fatalf("%s: %v", q, err)
	}
	return n
}

func newPublisher() *gochannel.GoChannel {
	return gochannel.NewGoChannel(gochannel.Config{}, watermill.NopLogger{})
}

// ------------------------------------------------------------ components

// runWriter inserts events as the generated writers do, once with a fresh
// id and twice with a caller-chosen one (the repeat is the idempotent
// no-op that reads the existing row); on PostgreSQL it also NOTIFYs the
// relays inside the transaction.
func runWriter(t *testing.T, e *env, as *role) error {
	ctx := e.ctx
	w := outbox.MustNewWriter(e.dia, tables.Outbox)
	fixed := outbox.NewEventID()
	for i, opts := range [][]outbox.InsertOption{nil, {outbox.WithEventID(fixed)}, {outbox.WithEventID(fixed)}} {
		tx, err := as.db.BeginTx(ctx, nil)
		if err != nil {
			return err
		}
		if _, err := w.Insert(ctx, tx, event("writer-"+strconv.Itoa(min(i, 1))), opts...); err != nil {
			tx.Rollback()
			return fmt.Errorf("insert %d: %w", i, err)
		}
		if err := notify(ctx, tx, as.db, e.dia); err != nil {
			tx.Rollback()
			return fmt.Errorf("notify: %w", err)
		}
		if err := tx.Commit(); err != nil {
			return err
		}
	}
	return nil
}

// runRelay publishes pending rows with RunOnce (database/sql driver, and
// on PostgreSQL the pgx driver with LISTEN and a NOTIFY too), then lists
// and requeues a FAILED row.
func runRelay(t *testing.T, e *env, as *role) error {
	ctx := e.ctx
	e.seed(t, "relay-1", "relay-2", "relay-3")
	failed := e.seed(t, "relay-failed")[0]
	e.exec(t, "UPDATE "+tables.Outbox+" SET status = 2, retry_count = 5, last_error = 'boom' WHERE id = "+strconv.FormatInt(failed, 10))

	drv, err := sqldriver.New(as.db, testdb.SchemaWith(e.dia, drvTables))
	if err != nil {
		return err
	}
	r, err := relay.New(drv, relay.Config{Publisher: newPublisher(), Logger: quiet})
	if err != nil {
		return err
	}
	n, err := r.RunOnce(ctx)
	if err != nil {
		return fmt.Errorf("RunOnce: %w", err)
	}
	if n != 3 {
		return fmt.Errorf("RunOnce published %d rows, want 3", n)
	}
	fs, err := r.ListFailed(ctx, 10)
	if err != nil {
		return fmt.Errorf("ListFailed: %w", err)
	}
	if len(fs) != 1 || fs[0].ID != failed {
		return fmt.Errorf("ListFailed: %+v, want row %d", fs, failed)
	}
	if n, err := r.Requeue(ctx, failed); err != nil || n != 1 {
		return fmt.Errorf("Requeue: %d, %w", n, err)
	}
	if e.d != "postgres" {
		return nil
	}

	// The pgx driver: LISTEN (the first wait returns once listening),
	// a NOTIFY from a writer, the wake-up, a claim.
	pool, err := pgxpool.New(ctx, as.dsn)
	if err != nil {
		return err
	}
	defer pool.Close()
	pdrv, err := pgxdriver.New(pool, testdb.SchemaWith(dialect.Postgres, drvTables))
	if err != nil {
		return err
	}
	if err := pdrv.WaitForNotification(ctx); err != nil {
		return fmt.Errorf("LISTEN: %w", err)
	}
	e.seed(t, "relay-4")
	tx, err := e.admin.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	if err := notify(ctx, tx, e.admin, e.dia); err != nil {
		tx.Rollback()
		return err
	}
	if err := tx.Commit(); err != nil {
		return err
	}
	if err := pdrv.WaitForNotification(ctx); err != nil {
		return fmt.Errorf("wait for NOTIFY: %w", err)
	}
	pr, err := relay.New(pdrv, relay.Config{Publisher: newPublisher(), Logger: quiet})
	if err != nil {
		return err
	}
	// relay-failed was requeued: it is due again too.
	if n, err := pr.RunOnce(ctx); err != nil || n != 2 {
		return fmt.Errorf("pgx RunOnce: %d, %w", n, err)
	}
	return nil
}

// runSweeper publishes rows nobody published for an hour.
func runSweeper(t *testing.T, e *env, as *role) error {
	ctx := e.ctx
	e.seed(t, "sweep-1", "sweep-2")
	e.exec(t, "UPDATE "+tables.Outbox+" SET created_at = "+e.ago(time.Hour))
	drv, err := sqldriver.New(as.db, testdb.SchemaWith(e.dia, drvTables))
	if err != nil {
		return err
	}
	s, err := sweeper.New(drv, sweeper.Config{Publisher: newPublisher(), OverdueAfter: time.Minute, Logger: quiet})
	if err != nil {
		return err
	}
	n, err := s.RunOnce(ctx)
	if err != nil {
		return fmt.Errorf("RunOnce: %w", err)
	}
	if n != 2 {
		return fmt.Errorf("the sweeper published %d rows, want 2", n)
	}
	return nil
}

// runMonitor reads one snapshot.
func runMonitor(t *testing.T, e *env, as *role) error {
	ctx := e.ctx
	e.seed(t, "mon-1")
	e.exec(t, "UPDATE "+tables.Outbox+" SET created_at = "+e.ago(time.Hour))
	drv, err := sqldriver.New(as.db, testdb.SchemaWith(e.dia, drvTables))
	if err != nil {
		return err
	}
	m, err := monitor.New(drv, monitor.Config{Logger: quiet})
	if err != nil {
		return err
	}
	defer m.Close()
	st, _, err := m.Check(ctx)
	if err != nil {
		return fmt.Errorf("Check: %w", err)
	}
	if st.Pending != 1 || st.Stale != 1 {
		return fmt.Errorf("Check: %+v, want 1 pending, 1 stale", st)
	}
	return nil
}

// runJanitor archives old sent rows and deletes old inbox rows, then, in
// delete mode, deletes old sent rows.
func runJanitor(t *testing.T, e *env, as *role) error {
	ctx := e.ctx
	old := func(keys ...string) {
		ids := e.seed(t, keys...)
		for _, id := range ids {
			e.exec(t, "UPDATE "+tables.Outbox+" SET status = 1, sent_at = "+e.ago(30*24*time.Hour)+" WHERE id = "+strconv.FormatInt(id, 10))
		}
	}
	old("jan-1", "jan-2")
	for i := range 3 {
		e.exec(t, "INSERT INTO "+tables.Inbox+" (consumer, event_id, processed_at) VALUES ('points', 'ev-"+strconv.Itoa(i)+"', "+e.ago(30*24*time.Hour)+")")
	}
	e.exec(t, "INSERT INTO "+tables.Inbox+"_duplicate (consumer, event_id, first_seen_at, last_seen_at) VALUES ('points', 'ev-0', "+e.ago(30*24*time.Hour)+", "+e.ago(30*24*time.Hour)+")")
	drv, err := sqldriver.New(as.db, testdb.SchemaWith(e.dia, drvTables))
	if err != nil {
		return err
	}
	// The duplicate record is optional: without its grants the janitor
	// skips it and logs why (at WARN, with the database's error), which
	// ends the run with that error here.
	var skipErr error
	logger := slog.New(errHandler{min: slog.LevelWarn, f: func(msg string, err error) {
		if strings.HasPrefix(msg, "janitor: duplicate deliveries' record skipped") && skipErr == nil {
			skipErr = err
		}
	}})
	j, err := janitor.New(drv, janitor.Config{ArchiveTable: tables.Archive, Logger: logger})
	if err != nil {
		return err
	}
	res, err := j.RunOnce(ctx)
	if err != nil {
		return fmt.Errorf("archive RunOnce: %w", err)
	}
	if skipErr != nil {
		return fmt.Errorf("archive RunOnce skipped the duplicate record: %w", skipErr)
	}
	if res.Duplicates != 1 {
		return fmt.Errorf("archive RunOnce: %+v, want 1 duplicate record deleted", res)
	}
	if res.Sent != 2 || !res.Archived || res.Inbox != 3 {
		return fmt.Errorf("archive RunOnce: %+v, want 2 rows archived and 3 inbox rows deleted", res)
	}
	if n := e.count(t, "SELECT COUNT(*) FROM "+tables.Archive); n != 2 {
		return fmt.Errorf("%d rows in the archive, want 2", n)
	}
	old("jan-3")
	j, err = janitor.New(drv, janitor.Config{Logger: quiet})
	if err != nil {
		return err
	}
	res, err = j.RunOnce(ctx)
	if err != nil {
		return fmt.Errorf("delete RunOnce: %w", err)
	}
	if res.Sent != 1 || res.Archived {
		return fmt.Errorf("delete RunOnce: %+v, want 1 row deleted", res)
	}
	return nil
}

// runConsumer delivers an ORDER_PAID event twice (the second is a
// duplicate, which reads the inbox record back) and an
// ORDER_STATUS_CHANGED event (latest_only: the stale guard's upsert)
// through a watermill router to a consumer registered with
// inbox.Register. The inbox retries a database failure (a missing
// privilege included) forever without poisoning the message, and logs
// each attempt at ERROR: the first such log ends the run with its error.
func runConsumer(t *testing.T, e *env, as *role) error {
	ctx := e.ctx
	ps := gochannel.NewGoChannel(gochannel.Config{BlockPublishUntilSubscriberAck: true}, watermill.NopLogger{})
	defer ps.Close()
	var (
		mu      sync.Mutex
		handled int
	)
	dbFailed := make(chan error, 1)
	logger := slog.New(errHandler{f: func(msg string, err error) {
		// The duplicate record is optional: without its grants the
		// consumer goes on and logs why it records nothing, which here
		// ends the run with that error, so that each of those grants is
		// proven needed for the record.
		if strings.HasPrefix(msg, "inbox: the database failed") || strings.HasPrefix(msg, "inbox: delivery failed") ||
			strings.HasPrefix(msg, "inbox: duplicate deliveries are not recorded") {
			select {
			case dbFailed <- err:
			default:
			}
		}
	}})
	r, err := message.NewRouter(message.RouterConfig{}, watermill.NopLogger{})
	if err != nil {
		return err
	}
	count := func() { mu.Lock(); handled++; mu.Unlock() }
	err = inbox.Register(r, ps, as.db, inbox.Consumer[*sql.Tx]{
		Name: "points",
		Routes: []inbox.Route[*sql.Tx]{
			inbox.On(sqlevents.OrderPaidType, sqlevents.OrderPaidTopic, sqlevents.DecodeOrderPaid,
				func(context.Context, *sql.Tx, sqlevents.OrderPaid, outbox.Meta) error { count(); return nil }),
			inbox.OnLatest(sqlevents.OrderStatusChangedType, sqlevents.OrderStatusChangedTopic, sqlevents.DecodeOrderStatusChanged,
				func(context.Context, *sql.Tx, sqlevents.OrderStatusChanged, outbox.Meta) error { count(); return nil }),
		},
	}, inbox.Config{Dialect: e.dia, InboxTable: tables.Inbox, NoPoisonQueue: true, MaxAttempts: 1, Logger: logger})
	if err != nil {
		return err
	}
	rctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- r.Run(rctx) }()
	defer func() { cancel(); <-done }()
	select {
	case <-r.Running():
	case err := <-done:
		done <- err // for the deferred receive
		return fmt.Errorf("router: %w", err)
	}

	msg := func(eventID, typ, key string, seq int, payload any) *message.Message {
		b, err := json.Marshal(payload)
		if err != nil {
			t.Fatal(err)
		}
		m := message.NewMessage(eventID, b)
		m.Metadata.Set(outbox.MetadataEventID, eventID)
		m.Metadata.Set(outbox.MetadataType, typ)
		m.Metadata.Set(outbox.MetadataKey, key)
		m.Metadata.Set(outbox.MetadataVersion, "1")
		m.Metadata.Set(outbox.MetadataSequence, strconv.Itoa(seq))
		m.Metadata.Set(outbox.MetadataCreatedAt, time.Now().UTC().Format(time.RFC3339Nano))
		return m
	}
	paid := outbox.NewEventID().String()
	status := outbox.NewEventID().String()
	deliveries := []struct {
		topic string
		m     *message.Message
	}{
		{sqlevents.OrderPaidTopic, msg(paid, sqlevents.OrderPaidType, "o-1", 1, orderPaid("o-1"))},
		{sqlevents.OrderPaidTopic, msg(paid, sqlevents.OrderPaidType, "o-1", 1, orderPaid("o-1"))}, // redelivery
		{sqlevents.OrderStatusChangedTopic, msg(status, sqlevents.OrderStatusChangedType, "o-1", 2, sqlevents.OrderStatusChanged{OrderID: "o-1", Status: "paid"})},
	}
	published := make(chan error, 1)
	go func() {
		for _, dl := range deliveries {
			// Returns once the router acked the message (handled or
			// skipped), or when the router stopped.
			if err := ps.Publish(dl.topic, dl.m); err != nil {
				published <- err
				return
			}
		}
		published <- nil
	}()
	select {
	case err := <-published:
		if err != nil {
			return err
		}
	case err := <-dbFailed:
		cancel() // stops the retries; the blocked Publish returns
		<-published
		return err
	}
	mu.Lock()
	defer mu.Unlock()
	if handled != 2 {
		return fmt.Errorf("handled %d deliveries, want 2 (the redelivery skipped)", handled)
	}
	if n := e.count(t, "SELECT COUNT(*) FROM "+tables.Inbox); n != 2 {
		return fmt.Errorf("%d inbox rows, want 2", n)
	}
	if n := e.count(t, "SELECT COUNT(*) FROM "+tables.Inbox+"_key"); n != 1 {
		return fmt.Errorf("%d stale-guard rows, want 1", n)
	}
	if n := e.count(t, "SELECT COUNT(*) FROM "+tables.Inbox+"_duplicate"); n != 1 {
		return fmt.Errorf("%d duplicate records, want 1 (the redelivery)", n)
	}
	return nil
}

// errHandler is an slog handler that passes its records at min or above
// (ERROR when min is zero: slog.LevelInfo) with their message and "error"
// attribute to f.
type errHandler struct {
	min slog.Level
	f   func(msg string, err error)
}

func (errHandler) Enabled(context.Context, slog.Level) bool { return true }
func (h errHandler) WithAttrs([]slog.Attr) slog.Handler     { return h }
func (h errHandler) WithGroup(string) slog.Handler          { return h }
func (h errHandler) Handle(_ context.Context, r slog.Record) error {
	min := h.min
	if min == slog.LevelInfo {
		min = slog.LevelError
	}
	if r.Level < min {
		return nil
	}
	var err error
	r.Attrs(func(a slog.Attr) bool {
		if e, ok := a.Value.Any().(error); ok && a.Key == "error" {
			err = e
		}
		return true
	})
	h.f(r.Message, err)
	return nil
}

// notify runs the database/sql driver's NOTIFY in tx (a no-op but on
// PostgreSQL).
func notify(ctx context.Context, tx *sql.Tx, db *sql.DB, d dialect.Dialect) error {
	drv, err := sqldriver.New(db, testdb.SchemaWith(d, drvTables))
	if err != nil {
		return err
	}
	return drv.Notify(ctx, tx)
}
