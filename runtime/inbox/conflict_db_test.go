package inbox_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"

	"github.com/outboxgen/outboxgen/internal/testdb"
	"github.com/outboxgen/outboxgen/runtime/dialect"
	"github.com/outboxgen/outboxgen/runtime/inbox"
	"github.com/outboxgen/outboxgen/runtime/outbox"
	"github.com/outboxgen/outboxgen/templates"
)

// conflictEnv is a consumer's database with the business tables of the
// conflict tests: acct (rows 1, 2, 3) and effect (one row per handled
// event, written by the handler in the delivery's transaction).
type conflictEnv struct {
	name string
	d    dialect.Dialect
	db   *sql.DB
}

// openConflictEnv opens a fresh database of dialect name; params are added
// to the DSN (session settings of the consumer's connections).
func openConflictEnv(t *testing.T, name, params string) *conflictEnv {
	t.Helper()
	d, err := dialect.Parse(name)
	if err != nil {
		t.Fatal(err)
	}
	dsn := testdb.DSN(t, name)
	if params != "" {
		sep := "?"
		if strings.Contains(dsn, "?") {
			sep = "&"
		}
		dsn += sep + params
	}
	db, err := sql.Open(testdb.Driver(t, name), dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	testdb.ApplySchema(t, db, name, templates.DefaultTables)
	for _, q := range []string{
		"CREATE TABLE acct (id INT PRIMARY KEY, n INT NOT NULL)",
		"INSERT INTO acct (id, n) VALUES (1, 0), (2, 0), (3, 0)",
		"CREATE TABLE effect (event_id VARCHAR(64) PRIMARY KEY)",
		"CREATE TABLE scratch (id INT PRIMARY KEY)",
	} {
		if _, err := db.Exec(q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	return &conflictEnv{name: name, d: d, db: db}
}

// onServers runs test once for each database server of the conflict tests
// (PostgreSQL, MySQL/MariaDB), in parallel subtests named after them.
func onServers(t *testing.T, test func(t *testing.T, name string)) {
	for _, name := range []string{"postgres", "mysql"} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			test(t, name)
		})
	}
}

// session opens another connection to e's database, closed when the test
// ends, and runs stmts on it (the first one typically BEGIN).
func (e *conflictEnv) session(ctx context.Context, t *testing.T, stmts ...string) *sql.Conn {
	t.Helper()
	conn, err := e.db.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	for _, q := range stmts {
		if _, err := conn.ExecContext(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	return conn
}

// deliverOnce runs a consumer (MaxAttempts 1, with a poison queue) whose
// handler writes the event's effect row and then calls step with the
// number of the call, delivers one message, and checks that it was
// handled exactly once and never poisoned, no attempt charged to it. It
// returns the handler calls and the outcomes counted.
func (e *conflictEnv) deliverOnce(t *testing.T, step func(ctx context.Context, tx *sql.Tx, call int64) error) (int64, map[string]int64) {
	t.Helper()
	h := inbox.NewHarness(t)
	defer h.Close()
	var calls atomic.Int64
	type event struct{}
	c := inbox.Consumer[*sql.Tx]{Name: "c", Routes: []inbox.Route[*sql.Tx]{
		inbox.On("X", "in", func([]byte, int) (event, error) { return event{}, nil },
			func(ctx context.Context, tx *sql.Tx, _ event, m outbox.Meta) error {
				call := calls.Add(1)
				if _, err := tx.ExecContext(ctx, "INSERT INTO effect (event_id) VALUES ("+e.d.Placeholder(1)+")", m.EventID); err != nil {
					return fmt.Errorf("test: effect: %w", err)
				}
				return step(ctx, tx, call)
			}),
	}}
	if err := inbox.Register(h.Router, h.PubSub, e.db, c, h.Config(e.d)); err != nil {
		t.Fatal(err)
	}
	committed := h.Succeeded()
	h.Run()

	msg := h.PublishX("in")
	select {
	case p := <-h.Poisoned:
		t.Fatalf("a valid message was poisoned: %s (outcomes %v)", inbox.AckPoisoned(p), h.Outcomes())
	case <-committed:
	case <-time.After(2 * time.Minute):
		t.Fatalf("the delivery did not go through (outcomes %v)", h.Outcomes())
	}
	// The poison queue acks what it publishes: make sure it did not.
	if reason, ok := h.PoisonedWithin(100 * time.Millisecond); ok {
		t.Fatalf("a valid message was poisoned: %s", reason)
	}
	for table, where := range map[string]string{
		"effect":                      "event_id = " + e.d.Placeholder(1),
		templates.DefaultTables.Inbox: "consumer = 'c' AND event_id = " + e.d.Placeholder(1),
	} {
		var n int
		if err := e.db.QueryRow("SELECT COUNT(*) FROM "+table+" WHERE "+where, msg.UUID).Scan(&n); err != nil {
			t.Fatal(err)
		}
		if n != 1 {
			t.Errorf("%s has %d rows of the event, want 1: handled exactly once", table, n)
		}
	}
	o := h.Outcomes()
	if o[inbox.OutcomeProcessed] != 1 || o[inbox.OutcomeFailed] != 0 || o[inbox.OutcomePermanent] != 0 {
		t.Errorf("outcomes %v, want 1 processed and no failed or permanent attempt", o)
	}
	return calls.Load(), o
}

// waitLockWait waits until the connection with backend id (pg_backend_pid,
// CONNECTION_ID) waits for a row lock (on MySQL/MariaDB: runs stmt, whose
// row lock another transaction holds; information_schema.innodb_trx may
// lag).
func (e *conflictEnv) waitLockWait(ctx context.Context, id int64, stmt string) error {
	q, args := "SELECT COUNT(*) FROM pg_stat_activity WHERE pid = $1 AND wait_event_type = 'Lock'", []any{id}
	if e.d == dialect.MySQL {
		q, args = "SELECT COUNT(*) FROM information_schema.processlist WHERE id = ? AND info = ?", []any{id, stmt}
	}
	for {
		var n int
		if err := e.db.QueryRowContext(ctx, q, args...).Scan(&n); err != nil || n > 0 {
			return err
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(5 * time.Millisecond):
		}
	}
}

func (e *conflictEnv) backendID(ctx context.Context, tx *sql.Tx) (int64, error) {
	q := "SELECT pg_backend_pid()"
	if e.d == dialect.MySQL {
		q = "SELECT CONNECTION_ID()"
	}
	var id int64
	err := tx.QueryRowContext(ctx, q).Scan(&id)
	return id, err
}

// A consumer's transaction that the database rolls back as a deadlock
// victim (a real deadlock with another transaction: PostgreSQL 40P01,
// MariaDB/MySQL 1213) runs again at once and goes through: the message is
// handled exactly once, not poisoned, and the conflict is not charged to
// it (MaxAttempts is 1).
func TestDeadlockedDeliveryIsRetried(t *testing.T) {
	onServers(t, func(t *testing.T, name string) {
		e := openConflictEnv(t, name, "")
		ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
		defer cancel()
		// The other transaction locks row 2 and, once the handler
		// (holding row 1) waits for row 2, asks for row 1. It is the
		// heavier one (InnoDB rolls back the lighter transaction) and
		// waits second (PostgreSQL's deadlock check runs in the
		// first waiter, after deadlock_timeout, and rolls it back):
		// the handler's transaction is the victim.
		rows := make([]string, 20)
		for i := range rows {
			rows[i] = fmt.Sprintf("(%d)", i)
		}
		other := e.session(ctx, t, "BEGIN", "INSERT INTO scratch (id) VALUES "+strings.Join(rows, ", "), "UPDATE acct SET n = n + 1 WHERE id = 2")
		const lockRow2 = "UPDATE acct SET n = n + 1 WHERE id = 2"
		otherDone := make(chan error, 1)
		var once sync.Once
		calls, o := e.deliverOnce(t, func(ctx context.Context, tx *sql.Tx, call int64) error {
			if _, err := tx.ExecContext(ctx, "UPDATE acct SET n = n + 1 WHERE id = 1"); err != nil {
				return fmt.Errorf("test: lock row 1: %w", err)
			}
			if call == 1 {
				id, err := e.backendID(ctx, tx)
				if err != nil {
					return err
				}
				once.Do(func() {
					go func() {
						otherDone <- func() error {
							if err := e.waitLockWait(ctx, id, lockRow2); err != nil {
								return err
							}
							time.Sleep(100 * time.Millisecond)
							if _, err := other.ExecContext(ctx, "UPDATE acct SET n = n + 1 WHERE id = 1"); err != nil {
								return err
							}
							_, err := other.ExecContext(ctx, "COMMIT")
							return err
						}()
					}()
				})
			}
			if _, err := tx.ExecContext(ctx, lockRow2); err != nil {
				return fmt.Errorf("test: lock row 2: %w", err)
			}
			return nil
		})
		if err := <-otherDone; err != nil {
			t.Errorf("the other transaction: %v", err)
		}
		if calls < 2 || o[inbox.OutcomeConflict] < 1 {
			t.Errorf("handler called %d times, outcomes %v: want the handler's transaction to be the deadlock victim, run again", calls, o)
		}
		var n1, n2 int
		if err := e.db.QueryRow("SELECT (SELECT n FROM acct WHERE id = 1), (SELECT n FROM acct WHERE id = 2)").Scan(&n1, &n2); err != nil {
			t.Fatal(err)
		}
		if n1 != 2 || n2 != 2 {
			t.Errorf("acct rows 1, 2: %d, %d; want 2, 2 (the handler's writes once, the other transaction's once)", n1, n2)
		}
	})
}

// A consumer's transaction that cannot be serialized with a concurrent one
// (PostgreSQL REPEATABLE READ: 40001; MariaDB REPEATABLE READ with
// innodb_snapshot_isolation, the default from 11.8: 1020) runs again at
// once and goes through, handled exactly once, not charged, not poisoned.
func TestSerializationFailureIsRetried(t *testing.T) {
	onServers(t, func(t *testing.T, name string) {
		params := "default_transaction_isolation=repeatable%20read"
		if name == "mysql" {
			admin := testdb.Open(t, name)
			var version string
			if err := admin.QueryRow("SELECT VERSION()").Scan(&version); err != nil {
				t.Fatal(err)
			}
			if err := admin.QueryRow("SELECT @@innodb_snapshot_isolation").Scan(new(any)); err != nil {
				t.Skipf("%s has no innodb_snapshot_isolation (no serialization failures at REPEATABLE READ): %v", version, err)
			}
			params = "innodb_snapshot_isolation=ON"
		}
		e := openConflictEnv(t, name, params)
		calls, o := e.deliverOnce(t, func(ctx context.Context, tx *sql.Tx, call int64) error {
			var n int
			if err := tx.QueryRowContext(ctx, "SELECT n FROM acct WHERE id = 3").Scan(&n); err != nil {
				return err
			}
			if call == 1 {
				// Another transaction changes the row read, and commits.
				if _, err := e.db.ExecContext(ctx, "UPDATE acct SET n = n + 10 WHERE id = 3"); err != nil {
					return err
				}
			}
			if _, err := tx.ExecContext(ctx, "UPDATE acct SET n = n + 1 WHERE id = 3"); err != nil {
				return fmt.Errorf("test: update row 3: %w", err)
			}
			return nil
		})
		if calls != 2 || o[inbox.OutcomeConflict] != 1 {
			t.Errorf("handler called %d times, outcomes %v; want 2 calls, 1 conflict", calls, o)
		}
		var n int
		if err := e.db.QueryRow("SELECT n FROM acct WHERE id = 3").Scan(&n); err != nil {
			t.Fatal(err)
		}
		if n != 11 {
			t.Errorf("acct row 3 is %d, want 11: the other transaction's 10 and the handler's 1, once", n)
		}
	})
}

// A consumer's statement that waits for a lock longer than the server
// allows (PostgreSQL lock_timeout: 55P03; MySQL/MariaDB
// innodb_lock_wait_timeout: 1205) is the database's failure, not the
// message's: retried with backoff until the lock is released, never
// charged to MaxAttempts, never poisoned, handled once.
func TestLockTimeoutIsRetried(t *testing.T) {
	onServers(t, func(t *testing.T, name string) {
		e := openConflictEnv(t, name, "")
		ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
		defer cancel()
		holder := e.session(ctx, t, "BEGIN", "UPDATE acct SET n = n + 1 WHERE id = 3")
		setTimeout := "SET LOCAL lock_timeout = '50ms'"
		if e.d == dialect.MySQL {
			setTimeout = "SET SESSION innodb_lock_wait_timeout = 1"
		}
		var released sync.Once
		release := func() error {
			var err error
			released.Do(func() { _, err = holder.ExecContext(ctx, "COMMIT") })
			return err
		}
		defer release() //nolint:errcheck // when the test failed first
		calls, o := e.deliverOnce(t, func(ctx context.Context, tx *sql.Tx, call int64) error {
			if call == 3 { // two lock timeouts so far
				if err := release(); err != nil {
					return errors.Join(inbox.Permanent(errors.New("test: release")), err)
				}
			}
			if _, err := tx.ExecContext(ctx, setTimeout); err != nil {
				return err
			}
			if _, err := tx.ExecContext(ctx, "UPDATE acct SET n = n + 1 WHERE id = 3"); err != nil {
				return fmt.Errorf("test: update row 3: %w", err)
			}
			return nil
		})
		if calls != 3 || o[inbox.OutcomeInfrastructure] != 2 {
			t.Errorf("handler called %d times, outcomes %v; want 3 calls, 2 infrastructure (timeout)", calls, o)
		}
	})
}

// The inbox's own statements deadlock on MySQL/MariaDB: delivery A
// records the stale guard of a new key and holds it; B and C, of the same
// key, wait for it; A rolls back (its handler failed), and InnoDB rolls B
// or C back as a deadlock victim (1213). The victim runs again at once:
// B and C are handled once each, and only A, whose handler failed
// permanently, is poisoned (MaxAttempts is 1). PostgreSQL lets B and C
// through without a deadlock.
func TestInboxGuardDeadlockIsRetried(t *testing.T) {
	onServers(t, func(t *testing.T, name string) {
		e := openConflictEnv(t, name, "")
		ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
		defer cancel()
		waiters := "SELECT COUNT(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'"
		if e.d == dialect.MySQL {
			// A's stale guard ran: whoever runs one now waits for A.
			waiters = "SELECT COUNT(*) FROM information_schema.processlist WHERE db = DATABASE() AND info LIKE 'INSERT INTO " + templates.DefaultTables.Inbox + "_key %'"
		}
		h := inbox.NewHarness(t)
		defer h.Close()
		aStarted := make(chan struct{})
		var (
			mu      sync.Mutex
			handled = map[int64]int{}
		)
		type event struct{}
		handle := func(ctx context.Context, tx *sql.Tx, _ event, m outbox.Meta) error {
			if m.Sequence == 1 { // A: hold the new key until B and C wait for it, then fail
				close(aStarted)
				for {
					var n int
					if err := e.db.QueryRowContext(ctx, waiters).Scan(&n); err != nil {
						return inbox.Permanent(err)
					}
					if n >= 2 {
						break
					}
					time.Sleep(5 * time.Millisecond)
				}
				time.Sleep(50 * time.Millisecond)
				return inbox.Permanent(errors.New("test: A fails"))
			}
			mu.Lock()
			handled[m.Sequence]++
			mu.Unlock()
			return nil
		}
		var routes []inbox.Route[*sql.Tx]
		for _, topic := range []string{"a", "b", "c"} {
			routes = append(routes, inbox.OnLatest("X", topic, func([]byte, int) (event, error) { return event{}, nil }, handle))
		}
		if err := inbox.Register(h.Router, h.PubSub, e.db, inbox.Consumer[*sql.Tx]{Name: "c", Routes: routes}, h.Config(e.d)); err != nil {
			t.Fatal(err)
		}
		h.Run()
		publish := func(topic string, seq int) {
			m := inbox.NewXMessage(watermill.NewUUID())
			m.Metadata.Set(outbox.MetadataKey, "k")
			m.Metadata.Set(outbox.MetadataSequence, fmt.Sprint(seq))
			h.Publish(topic, m)
		}
		publish("a", 1)
		select {
		case <-aStarted:
		case <-ctx.Done():
			t.Fatal("A was not handled")
		}
		publish("b", 2)
		publish("c", 3)
		select {
		case p := <-h.Poisoned:
			if reason := inbox.AckPoisoned(p); !strings.Contains(reason, "test: A fails") {
				t.Fatalf("poisoned: %s", reason)
			}
		case <-ctx.Done():
			t.Fatal("A was not poisoned")
		}
		for {
			o := h.Outcomes()
			if o[inbox.OutcomeProcessed]+o[inbox.OutcomeStale] >= 2 {
				break
			}
			select {
			case p := <-h.Poisoned:
				t.Fatalf("a valid message was poisoned: %s (outcomes %v)", inbox.AckPoisoned(p), o)
			case <-ctx.Done():
				t.Fatalf("B and C were not handled: outcomes %v", o)
			case <-time.After(10 * time.Millisecond):
			}
		}
		if reason, ok := h.PoisonedWithin(100 * time.Millisecond); ok {
			t.Fatalf("a valid message was poisoned: %s", reason)
		}
		o := h.Outcomes()
		mu.Lock()
		defer mu.Unlock()
		// B and C in either order: the later one handled, the earlier
		// one handled or stale, each once.
		if handled[3] != 1 || handled[2] > 1 || o[inbox.OutcomeFailed] != 0 {
			t.Errorf("handled %v, outcomes %v; want C once, B at most once, nothing failed", handled, o)
		}
		t.Logf("outcomes %v", o)
		if e.d == dialect.MySQL && o[inbox.OutcomeConflict] < 1 {
			t.Errorf("outcomes %v: want the deadlock of B and C on the new key run again", o)
		}
	})
}
