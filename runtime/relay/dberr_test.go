package relay

// Database errors: backoff (with the breaker closed and open), the
// start-up check, and the advice for errors that waiting cannot mend.

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"path/filepath"
	"regexp"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxgen/outboxgen/internal/testdb"
	"github.com/outboxgen/outboxgen/runtime/dialect"
	"github.com/outboxgen/outboxgen/runtime/driver"
	"github.com/outboxgen/outboxgen/runtime/driver/pgxdriver"
	"github.com/outboxgen/outboxgen/runtime/driver/sqldriver"
	"github.com/outboxgen/outboxgen/runtime/internal/dberr"
	"github.com/outboxgen/outboxgen/templates"
)

// countingDriver counts the statements the relay attempts: claims, and
// lease extensions (the heartbeat and the start-up probe).
type countingDriver struct {
	driver.Driver
	claims, extends atomic.Int64
}

func (c *countingDriver) Claim(ctx context.Context, p driver.ClaimParams) ([]driver.Row, error) {
	c.claims.Add(1)
	return c.Driver.Claim(ctx, p)
}

func (c *countingDriver) ExtendLease(ctx context.Context, owner string, ids []int64, lease time.Duration) (int64, error) {
	c.extends.Add(1)
	return c.Driver.ExtendLease(ctx, owner, ids, lease)
}

func (c *countingDriver) attempts() int64 { return c.claims.Load() + c.extends.Load() }

// sqliteRelayDB is a fresh SQLite outbox and a counting driver on it.
func sqliteRelayDB(t testing.TB) (*sql.DB, *countingDriver) {
	t.Helper()
	db := testdb.Open(t, "sqlite")
	testdb.ApplySchema(t, db, "sqlite", templates.Tables{Outbox: tables.Outbox, Inbox: tables.Inbox})
	drv, err := sqldriver.New(db, testdb.SchemaWith(dialect.SQLite, tables))
	if err != nil {
		t.Fatal(err)
	}
	return db, &countingDriver{Driver: drv}
}

// maxAttemptsPerSecond bounds the database attempts of a relay polling
// every 10 ms against a closed database over one second: the backoff
// (100 ms doubling, at least half of each step) allows 5 or so; without it
// a relay made ~100 (breaker closed) or 100,000+ (breaker open). Generous,
// so that no scheduling hiccup can fail it.
const maxAttemptsPerSecond = 30

// attemptsOverASecond returns how many statements c saw in one second.
func attemptsOverASecond(c *countingDriver) int64 {
	before := c.attempts()
	time.Sleep(time.Second)
	return c.attempts() - before
}

// pollFailures counts the "relay poll failed" lines logged so far.
func pollFailures(h *errLog) int {
	h.mu.Lock()
	defer h.mu.Unlock()
	n := 0
	for _, m := range h.msgs {
		if strings.Contains(m, "relay poll failed") {
			n++
		}
	}
	return n
}

// A database that goes away (a closed *sql.DB here: every statement fails
// at once, the worst case) is retried with a growing pause, whether the
// circuit breaker is closed or open, and each failure is logged once.
func TestClosedDatabaseBacksOff(t *testing.T) {
	t.Run("breaker closed", func(t *testing.T) {
		db, cd := sqliteRelayDB(t)
		opts := testOptions(newRecPub(t), "closed-db")
		h := &errLog{}
		opts.Logger = slog.New(h)
		r := mustRelay(t, cd, opts)
		runRelay(t, r)
		waitFor(t, "a few healthy polls", func() bool { return cd.claims.Load() >= 3 })
		db.Close()
		logged := pollFailures(h)
		n := attemptsOverASecond(cd)
		t.Logf("closed database, breaker closed: %d attempts in 1s", n)
		if n >= maxAttemptsPerSecond {
			t.Fatalf("%d attempts in 1s with a closed database, want fewer than %d (PollInterval 10ms, backoff from 100ms)", n, maxAttemptsPerSecond)
		}
		if lines := pollFailures(h) - logged; lines > int(n)+1 {
			t.Fatalf("%d failure lines for %d attempts: want one per backoff step", lines, n)
		}
	})
	t.Run("breaker open", func(t *testing.T) {
		db, cd := sqliteRelayDB(t)
		insertEvents(t, db, dialect.SQLite, ev{Key: "a"}, ev{Key: "b"}, ev{Key: "a"}, ev{Key: "b"})
		pub := newRecPub(t)
		pub.setFail(func(*message.Message) error { return errBrokerDown })
		opts := testOptions(pub, "closed-db-breaker")
		h := &errLog{info: true}
		opts.Logger = slog.New(h)
		r := mustRelay(t, cd, opts)
		runRelay(t, r)
		waitFor(t, "the breaker to open", func() bool { return h.has("circuit breaker open") })
		waitFor(t, "a failed probe", func() bool { return h.has("circuit breaker probe failed") })
		db.Close()
		n := attemptsOverASecond(cd)
		t.Logf("closed database, breaker open: %d attempts in 1s", n)
		if n >= maxAttemptsPerSecond {
			t.Fatalf("%d attempts in 1s with a closed database and the breaker open, want fewer than %d", n, maxAttemptsPerSecond)
		}
	})
	// Not a database error, but the same spin: with the breaker open, a
	// probe that finds nothing to claim (another relay published the rows)
	// left the next probe due at once.
	t.Run("breaker open, nothing to claim", func(t *testing.T) {
		db, cd := sqliteRelayDB(t)
		insertEvents(t, db, dialect.SQLite, ev{Key: "a"}, ev{Key: "b"}, ev{Key: "a"}, ev{Key: "b"})
		pub := newRecPub(t)
		pub.setFail(func(*message.Message) error { return errBrokerDown })
		opts := testOptions(pub, "breaker-empty")
		opts.PollInterval = 50 * time.Millisecond
		h := &errLog{info: true}
		opts.Logger = slog.New(h)
		r := mustRelay(t, cd, opts)
		runRelay(t, r)
		waitFor(t, "the breaker to open", func() bool { return h.has("circuit breaker open") })
		if _, err := db.Exec("UPDATE " + table + " SET status = 1"); err != nil { // published elsewhere
			t.Fatal(err)
		}
		n := attemptsOverASecond(cd)
		t.Logf("breaker open, nothing to claim, PollInterval 50ms: %d attempts in 1s", n)
		if n >= 60 {
			t.Fatalf("%d attempts in 1s with the breaker open and nothing to claim, want at most one per PollInterval (50ms)", n)
		}
	})
	t.Run("closed at start", func(t *testing.T) {
		db, cd := sqliteRelayDB(t)
		db.Close()
		r := mustRelay(t, cd, testOptions(newRecPub(t), "closed-at-start"))
		runRelay(t, r) // a transient error at start: Run keeps trying
		n := attemptsOverASecond(cd)
		t.Logf("closed database from the start: %d attempts in 1s", n)
		if n >= maxAttemptsPerSecond {
			t.Fatalf("%d attempts in 1s with a closed database, want fewer than %d", n, maxAttemptsPerSecond)
		}
	})
}

// flakyDriver fails every claim while down is set.
type flakyDriver struct {
	driver.Driver
	down atomic.Bool
}

var errDBDown = errors.New("connection refused (injected)")

func (f *flakyDriver) Claim(ctx context.Context, p driver.ClaimParams) ([]driver.Row, error) {
	if f.down.Load() {
		return nil, errDBDown
	}
	return f.Driver.Claim(ctx, p)
}

var retryInRE = regexp.MustCompile(`retry_in=(\S+)`)

// The backoff resets at the first successful poll: the first failure of
// the next outage is followed by the shortest pause again, and the recovery
// is logged.
func TestDatabaseBackoffResets(t *testing.T) {
	_, cd := sqliteRelayDB(t)
	fd := &flakyDriver{Driver: cd}
	opts := testOptions(newRecPub(t), "flaky")
	opts.DatabaseBackoffMax = 400 * time.Millisecond
	h := &errLog{info: true}
	opts.Logger = slog.New(h)
	r := mustRelay(t, fd, opts)
	fd.down.Store(true)
	runRelay(t, r)
	waitFor(t, "four failed polls", func() bool { return pollFailures(h) >= 4 })
	fd.down.Store(false)
	waitFor(t, "the recovery", func() bool { return h.has("relay poll succeeded again") })
	mark := pollFailures(h)
	fd.down.Store(true)
	waitFor(t, "a failure after the recovery", func() bool { return pollFailures(h) > mark })

	h.mu.Lock()
	var pauses []time.Duration
	for _, m := range h.msgs {
		if !strings.Contains(m, "relay poll failed") {
			continue
		}
		d, err := time.ParseDuration(retryInRE.FindStringSubmatch(m)[1])
		if err != nil {
			t.Fatal(err)
		}
		pauses = append(pauses, d)
	}
	h.mu.Unlock()
	// 100ms, [100, 200], [200, 400], [200, 400] (the cap), then after the
	// recovery 100ms again.
	if pauses[0] != 100*time.Millisecond || pauses[2] < 200*time.Millisecond || pauses[3] > 400*time.Millisecond {
		t.Errorf("pauses %v: want 100ms doubling to the 400ms cap", pauses)
	}
	if p := pauses[mark]; p != 100*time.Millisecond {
		t.Errorf("first pause after the recovery %s (all: %v), want 100ms: the backoff did not reset", p, pauses)
	}
}

// unusable describes a database the relay cannot work on.
type unusable struct {
	class  dberr.Class
	advice string // in the error
}

// checkStartFails runs a relay on drv and expects Run to end at once with
// an explained error of class want, and RunOnce to return the same.
func checkStartFails(t *testing.T, drv driver.Driver, want unusable) {
	t.Helper()
	h := &errLog{}
	opts := testOptions(newRecPub(t), "unusable")
	opts.Logger = slog.New(h)
	r := mustRelay(t, drv, opts)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second) // a hang guard
	defer cancel()
	err := r.Run(ctx)
	if ctx.Err() != nil {
		t.Fatalf("Run kept going on an unusable table (returned %v only when its context ended)", err)
	}
	var e *dberr.Error
	if !errors.As(err, &e) || e.Class != want.class || !strings.Contains(err.Error(), want.advice) {
		t.Fatalf("Run = %v, want a %s error saying %q", err, want.class, want.advice)
	}
	if !h.has("relay not started") {
		t.Errorf("start-up failure not logged: %v", h.msgs)
	}
	if _, err := r.RunOnce(ctx); dberr.Classify(err) != want.class || !strings.Contains(fmt.Sprint(err), want.advice) {
		t.Errorf("RunOnce = %v, want a %s error saying %q", err, want.class, want.advice)
	}
}

// A missing outbox table ends Run at start, on every dialect.
func TestStartMissingTable(t *testing.T) {
	forEachDialect(t, func(t *testing.T, db *sql.DB, d dialect.Dialect, drv driver.Driver) {
		if _, err := db.Exec("DROP TABLE " + table); err != nil {
			t.Fatal(err)
		}
		checkStartFails(t, drv, unusable{dberr.Missing, "apply the schema"})
	})
}

// A user without UPDATE on the outbox table: Run ends at start, even with
// nothing pending (the probe finds it), on PostgreSQL and MySQL/MariaDB
// (SQLite has no privileges).
func TestStartPermissionDenied(t *testing.T) {
	want := unusable{dberr.Denied, "needs SELECT and UPDATE on " + table}
	t.Run("postgres", func(t *testing.T) {
		dsn := testdb.DSN(t, "postgres")
		admin := openDB(t, "pgx", dsn)
		testdb.ApplySchema(t, admin, "postgres", templates.Tables{Outbox: tables.Outbox, Inbox: tables.Inbox})
		role := fmt.Sprintf("outboxgen_ro_%d", time.Now().UnixNano())
		for _, s := range []string{"CREATE ROLE " + role, "GRANT SELECT ON " + table + " TO " + role} {
			if _, err := admin.Exec(s); err != nil {
				t.Fatal(err)
			}
		}
		t.Cleanup(func() {
			admin.Exec("REVOKE ALL ON " + table + " FROM " + role)
			admin.Exec("DROP ROLE " + role)
		})
		// The superuser test login assumes the role for every connection.
		limited := dsn + "&role=" + role
		t.Run("sql", func(t *testing.T) {
			drv, err := sqldriver.New(openDB(t, "pgx", limited), testdb.SchemaWith(dialect.Postgres, tables))
			if err != nil {
				t.Fatal(err)
			}
			checkStartFails(t, drv, want)
		})
		t.Run("pgx", func(t *testing.T) {
			pool, err := pgxpool.New(context.Background(), limited)
			if err != nil {
				t.Fatal(err)
			}
			defer pool.Close()
			drv, err := pgxdriver.New(pool, testdb.SchemaWith(dialect.Postgres, tables))
			if err != nil {
				t.Fatal(err)
			}
			checkStartFails(t, drv, want)
		})
	})
	t.Run("mysql", func(t *testing.T) {
		dsn := testdb.DSN(t, "mysql")
		admin := openDB(t, "mysql", dsn)
		testdb.ApplySchema(t, admin, "mysql", templates.Tables{Outbox: tables.Outbox, Inbox: tables.Inbox})
		user := fmt.Sprintf("ro%d", time.Now().UnixNano()%1e9)
		var dbName string
		if err := admin.QueryRow("SELECT DATABASE()").Scan(&dbName); err != nil {
			t.Fatal(err)
		}
		for _, s := range []string{
			"CREATE USER '" + user + "'@'127.0.0.1' IDENTIFIED BY 'pw'",
			"GRANT SELECT ON " + dbName + "." + table + " TO '" + user + "'@'127.0.0.1'",
		} {
			if _, err := admin.Exec(s); err != nil {
				t.Fatal(err)
			}
		}
		t.Cleanup(func() { admin.Exec("DROP USER '" + user + "'@'127.0.0.1'") })
		limited := user + ":pw@" + dsn[strings.Index(dsn, "@")+1:]
		drv, err := sqldriver.New(openDB(t, "mysql", limited), testdb.SchemaWith(dialect.MySQL, tables))
		if err != nil {
			t.Fatal(err)
		}
		checkStartFails(t, drv, want)
	})
}

func openDB(t *testing.T, driverName, dsn string) *sql.DB {
	t.Helper()
	db, err := sql.Open(driverName, dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return db
}

// A read-only database (a standby during a failover, a read-only SQLite
// file) is not fatal at start: Run keeps trying, with backoff, and says
// what is wrong; RunOnce returns it explained.
func TestReadOnlyDatabase(t *testing.T) {
	const advice = "the database is read-only"
	cases := map[string]func(t *testing.T) driver.Driver{
		"sqlite": func(t *testing.T) driver.Driver {
			path := filepath.Join(t.TempDir(), "ro.db")
			rw := openDB(t, "sqlite", testdb.SQLiteDSN(path))
			testdb.ApplySchema(t, rw, "sqlite", templates.Tables{Outbox: tables.Outbox, Inbox: tables.Inbox})
			rw.Close()
			drv, err := sqldriver.New(openDB(t, "sqlite", "file:"+path+"?mode=ro"), testdb.SchemaWith(dialect.SQLite, tables))
			if err != nil {
				t.Fatal(err)
			}
			return drv
		},
		"postgres": func(t *testing.T) driver.Driver {
			dsn := testdb.DSN(t, "postgres")
			testdb.ApplySchema(t, openDB(t, "pgx", dsn), "postgres", templates.Tables{Outbox: tables.Outbox, Inbox: tables.Inbox})
			drv, err := sqldriver.New(openDB(t, "pgx", dsn+"&default_transaction_read_only=on"), testdb.SchemaWith(dialect.Postgres, tables))
			if err != nil {
				t.Fatal(err)
			}
			return drv
		},
		"mysql": func(t *testing.T) driver.Driver {
			dsn := testdb.DSN(t, "mysql")
			testdb.ApplySchema(t, openDB(t, "mysql", dsn), "mysql", templates.Tables{Outbox: tables.Outbox, Inbox: tables.Inbox})
			ro := openDB(t, "mysql", dsn+"&tx_read_only=1") // MariaDB
			if err := ro.Ping(); err != nil {
				ro = openDB(t, "mysql", dsn+"&transaction_read_only=1") // MySQL 8
			}
			drv, err := sqldriver.New(ro, testdb.SchemaWith(dialect.MySQL, tables))
			if err != nil {
				t.Fatal(err)
			}
			return drv
		},
	}
	for _, name := range testdb.Dialects() {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			drv := cases[name](t)
			h := &errLog{}
			opts := testOptions(newRecPub(t), "read-only")
			opts.Logger = slog.New(h)
			r := mustRelay(t, drv, opts)
			stop := runRelay(t, r)
			waitFor(t, "the read-only error logged with advice", func() bool { return h.has("relay poll failed") && h.has(advice) })
			stop()
			if h.has("relay not started") {
				t.Errorf("Run gave up on a read-only database: %v", h.msgs)
			}
			if _, err := r.RunOnce(context.Background()); dberr.Classify(err) != dberr.ReadOnly || !strings.Contains(fmt.Sprint(err), advice) {
				t.Errorf("RunOnce = %v, want a read-only error saying %q", err, advice)
			}
		})
	}
}

// failingNotifier is a driver whose notifications always fail (the
// listening connection cannot be had).
type failingNotifier struct {
	driver.Driver
	waits atomic.Int64
}

func (f *failingNotifier) WaitForNotification(context.Context) error {
	f.waits.Add(1)
	return errDBDown
}

// A listener that keeps failing backs off too (from a second, doubling):
// over 7 seconds it tries 3 or 4 times, where it used to try every second.
func TestListenerBacksOff(t *testing.T) {
	_, cd := sqliteRelayDB(t)
	fn := &failingNotifier{Driver: cd}
	r := mustRelay(t, fn, testOptions(newRecPub(t), "listener"))
	runRelay(t, r)
	time.Sleep(7 * time.Second)
	n := fn.waits.Load()
	t.Logf("failing listener: %d waits in 7s", n)
	if n > 5 {
		t.Fatalf("%d waits for notifications in 7s with every wait failing, want at most 5 (1s doubling)", n)
	}
}
