package gentest

// Infrastructure failures (a missing inbox table, a missing privilege) are
// the database's fault, not the message's: the consumer keeps the message,
// retries it with backoff without using up MaxAttempts, never poisons it,
// and handles it once the problem is fixed.

import (
	"context"
	"database/sql"
	"fmt"
	"log/slog"
	"net/url"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/go-sql-driver/mysql"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxgen/outboxgen/internal/gentest/pgxevents"
	"github.com/outboxgen/outboxgen/internal/gentest/sqlevents"
	"github.com/outboxgen/outboxgen/internal/testdb"
	"github.com/outboxgen/outboxgen/runtime/inbox"
)

// infraAttempts is how many failed attempts a test waits for before fixing
// the database: well past MaxAttempts (4), so a consumer that counted them
// would have poisoned the message by then.
const infraAttempts = 8

// waitFailedAttempts waits until the consumer has failed at least n
// attempts (outcomes failed or infrastructure), or poisoned something.
func (br *broker) waitFailedAttempts(n int64) map[string]int64 {
	br.t.Helper()
	deadline := time.Now().Add(2 * time.Minute)
	for {
		o := br.outcomes()
		if o[inbox.OutcomeFailed]+o[inbox.OutcomeInfrastructure] >= n || len(br.poisoned) > 0 {
			return o
		}
		if time.Now().After(deadline) {
			br.t.Fatalf("outcomes %v: fewer than %d failed attempts before the timeout", o, n)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// checkKeptThenHandled publishes a payment while the database is broken,
// checks that the message is retried as an infrastructure failure of
// class wantClass, alerted at ERROR with what to do, and not poisoned,
// calls fix, and checks that the message is then handled once.
func checkKeptThenHandled(t *testing.T, b *backend, br *broker, logs *captureLogs, wantClass, wantHint string, fix func()) {
	t.Helper()
	br.publish(sqlevents.OrderPaidTopic, paidMessage(t, eventID, "o-1", 7))
	o := br.waitFailedAttempts(infraAttempts)
	if len(br.poisoned) != 0 {
		t.Fatalf("outcomes %v: the message was poisoned; an infrastructure failure must not poison it", o)
	}
	if o[inbox.OutcomeFailed] != 0 || o[inbox.OutcomeInfrastructure] < infraAttempts {
		t.Fatalf("outcomes %v: want only infrastructure failures, at least %d", o, infraAttempts)
	}
	alerted := false
	for _, m := range logs.errors() {
		alerted = alerted || m.attrs["error_class"] == wantClass && strings.Contains(fmt.Sprint(m.attrs["what_to_do"]), wantHint) &&
			strings.Contains(m.msg, "the message is kept and retried")
	}
	if !alerted {
		t.Errorf("no ERROR log with error_class %s and what_to_do mentioning %q", wantClass, wantHint)
	}
	fix()
	br.waitAcked(1)
	if got, n := b.balance(t), b.credits(t); got != 12 || n != 1 {
		t.Errorf("balance %d with %d credits after the fix, want 12 and 1", got, n)
	}
	if n := b.inboxRows(t); n != 1 {
		t.Errorf("%d inbox rows, want 1", n)
	}
	if o := br.outcomes(); o[inbox.OutcomeProcessed] != 1 || o[inbox.OutcomeFailed] != 0 || o[inbox.OutcomePermanent] != 0 {
		t.Errorf("outcomes %v, want 1 processed and no failed or permanent", o)
	}
	if len(br.poisoned) != 0 {
		t.Errorf("%d messages poisoned", len(br.poisoned))
	}
}

// A missing inbox table (the schema not applied yet, on every database).
func TestConsumerMissingInboxTableKeepsMessage(t *testing.T) {
	forEachBackend(t, func(t *testing.T, b *backend) {
		logs := &captureLogs{}
		br := startConsumer(t, b, inbox.Config{Logger: slog.New(logs)})
		off := sqlevents.InboxTable + "_off"
		b.mustExec(t, `ALTER TABLE `+sqlevents.InboxTable+` RENAME TO `+off)
		checkKeptThenHandled(t, b, br, logs, "missing_table", "apply the schema", func() {
			b.mustExec(t, `ALTER TABLE `+off+` RENAME TO `+sqlevents.InboxTable)
		})
	})
}

// A database user that may read but not insert into the inbox table
// (PostgreSQL 42501, MySQL 1142; on MySQL the inbox insert, an INSERT ...
// ON DUPLICATE KEY UPDATE, needs UPDATE too), for database/sql and pgx.
func TestConsumerInboxPermissionDeniedKeepsMessage(t *testing.T) {
	const user, password = "og_consumer", "og_consumer_pw"
	for _, flavour := range []string{"postgres", "pgx", "mysql"} {
		t.Run(flavour, func(t *testing.T) {
			var b *backend
			if flavour == "pgx" {
				b = pgxBackend(t)
			} else {
				b = sqlBackend(t, flavour)
			}
			dbName := ""
			if flavour == "mysql" {
				dbName = queryString(t, b, `SELECT DATABASE()`)
			} else {
				dbName = queryString(t, b, `SELECT current_database()`)
			}
			// One role per database: roles are server-wide, databases are not.
			role := user + "_" + dbName[len(dbName)-8:]
			var grant, dsn string
			switch flavour {
			case "mysql":
				host := queryString(t, b, `SELECT SUBSTRING_INDEX(CURRENT_USER(), '@', -1)`)
				account := "'" + role + "'@'" + host + "'"
				b.mustExec(t, `CREATE USER `+account+` IDENTIFIED BY '`+password+`'`)
				t.Cleanup(func() { _ = b.exec(context.Background(), `DROP USER `+account) })
				b.mustExec(t, `GRANT SELECT, INSERT, UPDATE ON `+dbName+`.balances TO `+account)
				b.mustExec(t, `GRANT SELECT, INSERT, UPDATE ON `+dbName+`.credit_log TO `+account)
				b.mustExec(t, `GRANT SELECT ON `+dbName+`.`+sqlevents.InboxTable+` TO `+account)
				// SELECT on the stale-guard table too: the router's start-up
				// check reads both tables (a role without it is refused at
				// start; this test is about a privilege lost at run time).
				// The duplicate record is optional: without privileges on
				// <inbox>_duplicate, duplicates are only not recorded.
				b.mustExec(t, `GRANT SELECT ON `+dbName+`.`+sqlevents.InboxTable+`_key TO `+account)
				grant = `GRANT INSERT, UPDATE ON ` + dbName + `.` + sqlevents.InboxTable + ` TO ` + account
				cfg, err := mysql.ParseDSN(os.Getenv(testdb.MySQLEnv))
				if err != nil {
					t.Fatal(err)
				}
				cfg.User, cfg.Passwd, cfg.DBName = role, password, dbName
				dsn = cfg.FormatDSN()
			default:
				b.mustExec(t, `CREATE ROLE `+role+` LOGIN PASSWORD '`+password+`'`)
				t.Cleanup(func() {
					ctx := context.Background()
					_ = b.exec(ctx, `DROP OWNED BY `+role)
					_ = b.exec(ctx, `DROP ROLE `+role)
				})
				b.mustExec(t, `GRANT SELECT, INSERT, UPDATE ON balances, credit_log TO `+role)
				b.mustExec(t, `GRANT SELECT ON `+sqlevents.InboxTable+`, `+sqlevents.InboxTable+`_key TO `+role)
				grant = `GRANT INSERT ON ` + sqlevents.InboxTable + ` TO ` + role
				u, err := url.Parse(os.Getenv(testdb.PostgresEnv))
				if err != nil {
					t.Fatal(err)
				}
				u.User, u.Path = url.UserPassword(role, password), "/"+dbName
				dsn = u.String()
			}
			// The consumer runs as the limited user; the test's checks and
			// fixes as the administrator.
			limited := *b
			switch flavour {
			case "pgx":
				pool, err := pgxpool.New(t.Context(), dsn)
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(pool.Close)
				limited.register = func(r *message.Router, sub message.Subscriber, h *points, cfg inbox.Config) error {
					return pgxevents.RegisterPoints(r, sub, pool, pgxPoints{h}, cfg)
				}
			default:
				db, err := sql.Open(testdb.Driver(t, flavour), dsn)
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { db.Close() })
				w, err := sqlevents.NewWriter(db)
				if err != nil {
					t.Fatal(err)
				}
				limited.register = func(r *message.Router, sub message.Subscriber, h *points, cfg inbox.Config) error {
					return sqlevents.RegisterPoints(r, sub, db, sqlPoints{h, w}, cfg)
				}
			}
			logs := &captureLogs{}
			br := startConsumer(t, &limited, inbox.Config{Logger: slog.New(logs)})
			checkKeptThenHandled(t, b, br, logs, "permission_denied", "grant", func() { b.mustExec(t, grant) })
		})
	}
}

func queryString(t *testing.T, b *backend, query string) string {
	t.Helper()
	var s string
	var err error
	if b.pool != nil {
		err = b.pool.QueryRow(t.Context(), query).Scan(&s)
	} else {
		err = b.db.QueryRowContext(t.Context(), query).Scan(&s)
	}
	if err != nil {
		t.Fatalf("%s: %v", query, err)
	}
	return s
}

// captureLogs is an slog handler that keeps the ERROR records.
type captureLogs struct {
	mu      sync.Mutex
	records []capturedLog
}

type capturedLog struct {
	msg   string
	attrs map[string]any
}

func (*captureLogs) Enabled(context.Context, slog.Level) bool { return true }
func (c *captureLogs) WithAttrs([]slog.Attr) slog.Handler     { return c }
func (c *captureLogs) WithGroup(string) slog.Handler          { return c }

func (c *captureLogs) Handle(_ context.Context, r slog.Record) error {
	if r.Level < slog.LevelError {
		return nil
	}
	l := capturedLog{msg: r.Message, attrs: map[string]any{}}
	r.Attrs(func(a slog.Attr) bool {
		l.attrs[a.Key] = a.Value.Any()
		return true
	})
	c.mu.Lock()
	defer c.mu.Unlock()
	c.records = append(c.records, l)
	return nil
}

func (c *captureLogs) errors() []capturedLog {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]capturedLog(nil), c.records...)
}
