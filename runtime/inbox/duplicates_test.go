package inbox_test

import (
	"context"
	"database/sql"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"

	"github.com/outboxgen/outboxgen/internal/testdb"
	"github.com/outboxgen/outboxgen/runtime/dialect"
	"github.com/outboxgen/outboxgen/runtime/driver/drivertest"
	"github.com/outboxgen/outboxgen/runtime/inbox"
	"github.com/outboxgen/outboxgen/runtime/outbox"
	"github.com/outboxgen/outboxgen/templates"
)

// logCounter counts the log records whose message contains a text.
type logCounter struct {
	mu   sync.Mutex
	msgs []string
}

func (c *logCounter) Enabled(context.Context, slog.Level) bool { return true }
func (c *logCounter) WithAttrs([]slog.Attr) slog.Handler       { return c }
func (c *logCounter) WithGroup(string) slog.Handler            { return c }
func (c *logCounter) Handle(_ context.Context, r slog.Record) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.msgs = append(c.msgs, r.Message)
	return nil
}

func (c *logCounter) count(sub string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := 0
	for _, m := range c.msgs {
		if strings.Contains(m, sub) {
			n++
		}
	}
	return n
}

// dupConsumer runs consumer "c" on db until the test ends; deliver
// returns once the router acked the message.
type dupConsumer struct {
	handled atomic.Int64
	logs    *logCounter
	deliver func(t *testing.T, eventID, key string)
}

func startDupConsumer(t *testing.T, db *sql.DB, d dialect.Dialect) *dupConsumer {
	t.Helper()
	ps := gochannel.NewGoChannel(gochannel.Config{BlockPublishUntilSubscriberAck: true}, watermill.NopLogger{})
	t.Cleanup(func() { ps.Close() })
	r, err := message.NewRouter(message.RouterConfig{}, watermill.NopLogger{})
	if err != nil {
		t.Fatal(err)
	}
	dc := &dupConsumer{logs: &logCounter{}}
	type event struct{}
	c := inbox.Consumer[*sql.Tx]{Name: "c", Routes: []inbox.Route[*sql.Tx]{
		inbox.On("X", "in", func([]byte, int) (event, error) { return event{}, nil },
			func(context.Context, *sql.Tx, event, outbox.Meta) error { dc.handled.Add(1); return nil }),
	}}
	if err := inbox.Register(r, ps, db, c, inbox.Config{InboxTable: templates.DefaultTables.Inbox, Dialect: d,
		NoPoisonQueue: true, MaxAttempts: 1, Logger: slog.New(dc.logs)}); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- r.Run(context.Background()) }()
	t.Cleanup(func() { r.Close(); <-done })
	select {
	case <-r.Running():
	case err := <-done:
		t.Fatalf("router: %v", err)
	}
	dc.deliver = func(t *testing.T, eventID, key string) {
		t.Helper()
		m := inbox.NewXMessage(eventID)
		m.Metadata.Set(outbox.MetadataKey, key)
		if err := ps.Publish("in", m); err != nil {
			t.Fatal(err)
		}
	}
	return dc
}

type dupRow struct {
	count     int64
	typ, key  string
	firstLast bool // first_seen_at <= last_seen_at
}

func readDup(t *testing.T, db *sql.DB, d dialect.Dialect, eventID string) (dupRow, bool) {
	t.Helper()
	var r dupRow
	var ordered int
	err := db.QueryRow("SELECT count, biz_type, biz_id, CASE WHEN first_seen_at <= last_seen_at THEN 1 ELSE 0 END FROM "+
		dialect.InboxDuplicateTable(templates.DefaultTables.Inbox)+" WHERE consumer = 'c' AND event_id = "+d.Placeholder(1), eventID).
		Scan(&r.count, &r.typ, &r.key, &ordered)
	if err == sql.ErrNoRows {
		return r, false
	}
	if err != nil {
		t.Fatal(err)
	}
	r.firstLast = ordered == 1
	return r, true
}

// A duplicate delivery is counted in <inbox>_duplicate, in its own
// transaction; a first delivery leaves no row there.
func TestDuplicatesRecorded(t *testing.T) {
	for _, name := range testdb.Dialects() {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			d, err := dialect.Parse(name)
			if err != nil {
				t.Fatal(err)
			}
			db := testdb.Open(t, name)
			testdb.ApplySchema(t, db, name, templates.DefaultTables)
			c := startDupConsumer(t, db, d)
			e1, e2 := outbox.NewEventID().String(), outbox.NewEventID().String()
			c.deliver(t, e1, "k1")
			c.deliver(t, e2, "k2")
			if _, found := readDup(t, db, d, e1); found {
				t.Fatal("a first delivery wrote a duplicate row")
			}
			c.deliver(t, e1, "k1")
			r, found := readDup(t, db, d, e1)
			if !found || r.count != 1 || r.typ != "X" || r.key != "k1" || !r.firstLast {
				t.Fatalf("after one redelivery: %+v (found %v), want count 1, type X, key k1", r, found)
			}
			c.deliver(t, e1, "k1")
			if r, _ := readDup(t, db, d, e1); r.count != 2 {
				t.Fatalf("after two redeliveries: count %d, want 2", r.count)
			}
			if _, found := readDup(t, db, d, e2); found {
				t.Error("an event delivered once has a duplicate row")
			}
			if n := c.handled.Load(); n != 2 {
				t.Errorf("handler ran %d times, want 2 (duplicates skipped)", n)
			}
		})
	}
}

// On a database at schema version 1 (no duplicate table), duplicates are
// skipped as before (on PostgreSQL without aborting the delivery's
// transaction), the missing table is logged once, and once `migrate up`
// adds it, duplicates are recorded without a restart.
func TestDuplicatesSchemaVersion1(t *testing.T) {
	defer inbox.SetDupRecheck(200 * time.Millisecond)()
	for _, name := range testdb.Dialects() {
		t.Run(name, func(t *testing.T) {
			d, err := dialect.Parse(name)
			if err != nil {
				t.Fatal(err)
			}
			db := testdb.Open(t, name)
			testdb.ApplySchema(t, db, name, templates.DefaultTables)
			dup := dialect.InboxDuplicateTable(templates.DefaultTables.Inbox)
			version := dialect.VersionTable(templates.DefaultTables.Outbox)
			for _, q := range []string{"DROP TABLE " + dup, "DELETE FROM " + version + " WHERE version >= 2"} {
				if _, err := db.Exec(q); err != nil {
					t.Fatal(err)
				}
			}
			c := startDupConsumer(t, db, d)
			e1 := outbox.NewEventID().String()
			for range 3 {
				c.deliver(t, e1, "k1")
			}
			if n := c.handled.Load(); n != 1 {
				t.Fatalf("handler ran %d times, want 1 (duplicates skipped on schema version 1)", n)
			}
			if n := c.logs.count("duplicate deliveries are not recorded"); n != 1 {
				t.Errorf("the missing duplicate table was logged %d times, want once", n)
			}
			if n := c.logs.count("the database failed"); n != 0 {
				t.Errorf("%d infrastructure failures logged, want none", n)
			}

			// outboxgen migrate up: migration 2.
			ms, err := templates.RenderMigrations(name, templates.DefaultTables, templates.Header{})
			if err != nil {
				t.Fatal(err)
			}
			for _, stmt := range ms[1].Statements() {
				if _, err := db.Exec(stmt); err != nil {
					t.Fatalf("migration 2: %v\n%s", err, stmt)
				}
			}
			time.Sleep(300 * time.Millisecond) // past the recheck interval
			c.deliver(t, e1, "k1")             // the check runs before this delivery
			r, found := readDup(t, db, d, e1)
			if !found || r.count != 1 {
				t.Fatalf("after migration 2, a redelivery recorded %+v (found %v), want count 1", r, found)
			}
			if n := c.logs.count("duplicate deliveries are recorded from now on"); n != 1 {
				t.Errorf("the new duplicate table was logged %d times, want once", n)
			}
		})
	}
}

// A consumer whose database user may not use the duplicate table (no
// privilege at all, or SELECT without INSERT and UPDATE) handles every
// delivery as before: duplicates are skipped, not recorded, logged once;
// once the privileges are granted, duplicates are recorded without a
// restart.
func TestDuplicatesTableDenied(t *testing.T) {
	defer inbox.SetDupRecheck(200 * time.Millisecond)()
	for _, name := range []string{"postgres", "mysql"} {
		for _, dupGrant := range []string{"", "SELECT"} {
			t.Run(name+"/"+map[string]string{"": "none", "SELECT": "select"}[dupGrant], func(t *testing.T) {
				d, err := dialect.Parse(name)
				if err != nil {
					t.Fatal(err)
				}
				dsn := testdb.DSN(t, name)
				admin, err := sql.Open(testdb.Driver(t, name), dsn)
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { admin.Close() })
				testdb.ApplySchema(t, admin, name, templates.DefaultTables)
				in := templates.DefaultTables.Inbox
				dup := dialect.InboxDuplicateTable(in)
				inboxPrivs := "SELECT, INSERT"
				if d == dialect.MySQL {
					inboxPrivs = "SELECT, INSERT, UPDATE" // INSERT ... ON DUPLICATE KEY UPDATE
				}
				grants := []string{"GRANT " + inboxPrivs + " ON " + in + " TO {user}", "GRANT SELECT ON " + in + "_key TO {user}"}
				if dupGrant != "" {
					grants = append(grants, "GRANT "+dupGrant+" ON "+dup+" TO {user}")
				}
				limited, err := sql.Open(testdb.Driver(t, name), drivertest.LimitedUser(t, d, admin, dsn, grants...))
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { limited.Close() })

				c := startDupConsumer(t, limited, d)
				deliver := func(eventID string) {
					t.Helper()
					done := make(chan struct{})
					go func() { defer close(done); c.deliver(t, eventID, "k1") }()
					select {
					case <-done:
					case <-time.After(20 * time.Second):
						t.Fatal("a delivery was not acked within 20s: the duplicate table stalls the consumer")
					}
				}
				e1 := outbox.NewEventID().String()
				for range 3 {
					deliver(e1)
				}
				time.Sleep(300 * time.Millisecond) // past the recheck interval: looked at again
				deliver(e1)
				if n := c.handled.Load(); n != 1 {
					t.Fatalf("handler ran %d times, want 1 (the duplicates skipped)", n)
				}
				if n := c.logs.count("duplicate deliveries are not recorded"); n != 1 {
					t.Errorf("the unusable duplicate table was logged %d times, want once: %q", n, c.logs.msgs)
				}
				if n := c.logs.count("may not use table " + dup); n != 1 {
					t.Errorf("no log line says the consumer may not use %s: %q", dup, c.logs.msgs)
				}
				if _, found := readDup(t, admin, d, e1); found {
					t.Fatal("a duplicate was recorded without the privilege")
				}
				// outboxgen grants.
				if _, err := admin.Exec("GRANT SELECT, INSERT, UPDATE ON " + dup + " TO " + limitedAccount(t, admin, d, limited)); err != nil {
					t.Fatal(err)
				}
				time.Sleep(300 * time.Millisecond)
				deliver(e1)
				if r, found := readDup(t, admin, d, e1); !found || r.count != 1 {
					t.Fatalf("after the grant, a redelivery recorded %+v (found %v), want count 1", r, found)
				}
				if n := c.logs.count("duplicate deliveries are recorded from now on"); n != 1 {
					t.Errorf("the usable duplicate table was logged %d times, want once", n)
				}
			})
		}
	}
}

// limitedAccount returns the account limited connects as, for a GRANT.
func limitedAccount(t *testing.T, admin *sql.DB, d dialect.Dialect, limited *sql.DB) string {
	t.Helper()
	var who string
	q := "SELECT current_user"
	if d == dialect.MySQL {
		q = "SELECT CURRENT_USER()"
	}
	if err := limited.QueryRow(q).Scan(&who); err != nil {
		t.Fatal(err)
	}
	if d == dialect.MySQL {
		u, host, _ := strings.Cut(who, "@")
		return "'" + u + "'@'" + host + "'"
	}
	return who
}
