package inbox_test

import (
	"context"
	"database/sql"
	"path/filepath"
	"testing"
	"time"

	_ "modernc.org/sqlite"

	"github.com/outboxgen/outboxgen/internal/testdb"
	"github.com/outboxgen/outboxgen/runtime/dialect"
	"github.com/outboxgen/outboxgen/runtime/inbox"
	"github.com/outboxgen/outboxgen/runtime/outbox"
	"github.com/outboxgen/outboxgen/templates"
)

// A SQLite database locked by another writer (SQLITE_BUSY, here without a
// busy timeout so every attempt fails at once) is not the message's fault:
// the delivery waits and retries without using up MaxAttempts (1 here), is
// never poisoned, and goes through once the lock is released.
func TestSQLiteBusyIsNotCountedTowardMaxAttempts(t *testing.T) {
	ctx := t.Context()
	path := filepath.Join(t.TempDir(), "busy.db")
	dsn := "file:" + path + "?_pragma=journal_mode(WAL)" // no busy_timeout: SQLITE_BUSY at once
	db, err := sql.Open("sqlite", dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	testdb.ApplySchema(t, db, "sqlite", templates.DefaultTables)

	// Another process's write transaction holds the write lock.
	other, err := sql.Open("sqlite", dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	lock, err := other.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer lock.Close()
	if _, err := lock.ExecContext(ctx, "BEGIN IMMEDIATE"); err != nil {
		t.Fatal(err)
	}

	h := inbox.NewHarness(t)
	defer h.Close()
	handled := make(chan string, 1)
	type event struct{}
	c := inbox.Consumer[*sql.Tx]{Name: "c", Routes: []inbox.Route[*sql.Tx]{
		inbox.On("X", "in", func([]byte, int) (event, error) { return event{}, nil },
			func(_ context.Context, _ *sql.Tx, _ event, m outbox.Meta) error {
				handled <- m.EventID
				return nil
			}),
	}}
	if err := inbox.Register(h.Router, h.PubSub, db, c, h.Config(dialect.SQLite)); err != nil {
		t.Fatal(err)
	}
	h.Run()

	msg := h.PublishX("in")

	// Wait until the delivery has hit the lock several times (more than
	// MaxAttempts), failing at once if it is poisoned instead.
	timeout := time.After(2 * time.Minute)
	for h.Outcomes()[inbox.OutcomeBusy] < 3 {
		select {
		case p := <-h.Poisoned:
			t.Fatalf("a valid message was poisoned while the database was locked: %s", inbox.AckPoisoned(p))
		case <-timeout:
			t.Fatalf("outcomes %v: the delivery did not retry the locked database", h.Outcomes())
		case <-time.After(time.Millisecond):
		}
	}
	if _, err := lock.ExecContext(ctx, "COMMIT"); err != nil {
		t.Fatal(err)
	}
	select {
	case id := <-handled:
		if id != msg.UUID {
			t.Errorf("handled %s, want %s", id, msg.UUID)
		}
	case p := <-h.Poisoned:
		t.Fatalf("poisoned: %s", inbox.AckPoisoned(p))
	case <-timeout:
		t.Fatal("the delivery did not go through once the lock was released")
	}
	var rows int
	// The handler ran inside the transaction: wait for its commit by
	// reading through a fresh statement until the row shows.
	for rows == 0 {
		if err := db.QueryRowContext(ctx, `SELECT COUNT(*) FROM outbox_inbox WHERE consumer = 'c' AND event_id = ?`, msg.UUID).Scan(&rows); err != nil {
			t.Fatal(err)
		}
		select {
		case <-timeout:
			t.Fatal("the inbox row was not committed")
		default:
		}
	}
	o := h.Outcomes()
	if o[inbox.OutcomeFailed] != 0 || o[inbox.OutcomePermanent] != 0 || o[inbox.OutcomeBusy] < 3 {
		t.Errorf("outcomes %v, want busy attempts only, no failed or permanent one", o)
	}
}
