package privtest

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net/url"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxgen/outboxgen/internal/testdb"
	"github.com/outboxgen/outboxgen/runtime/outbox"
	"github.com/outboxgen/outboxgen/runtime/relay"
	"github.com/outboxgen/outboxgen/runtime/walrelay"
	"github.com/outboxgen/outboxgen/templates"
)

// walStatements renders the PostgreSQL script with sql.wal for roles and
// returns its statements, comments dropped.
func walStatements(t *testing.T, e *env, roles templates.Roles) []string {
	t.Helper()
	script, err := templates.RenderGrants("postgres", templates.GrantParams{Tables: tables, Database: e.dbName, Schema: e.schema, Roles: roles, WAL: true})
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, stmt := range templates.Statements(script) {
		var lines []string
		for _, l := range strings.Split(stmt, "\n") {
			if l = strings.TrimSpace(l); l != "" && !strings.HasPrefix(l, "--") {
				lines = append(lines, l)
			}
		}
		out = append(out, strings.Join(lines, " "))
	}
	return out
}

// walRole creates a login role holding the WAL-mode script's statements
// for it (roles names it), except those containing without ("" keeps
// all); it returns the role and the statements applied.
func (e *env) walRole(t *testing.T, kind string, roles func(string) templates.Roles, without string) *role {
	t.Helper()
	name := "og" + randomHex(5) + "_" + kind
	e.drops = append(e.drops, "DROP ROLE IF EXISTS "+name)
	e.exec(t, "CREATE ROLE "+name+" LOGIN PASSWORD '"+password+"'")
	r := &role{name: name}
	applied := false
	for _, stmt := range walStatements(t, e, roles(name)) {
		if without != "" && strings.Contains(stmt, without) {
			applied = true
			continue
		}
		r.grants = append(r.grants, stmt)
		e.grant(t, stmt)
	}
	if without != "" && !applied {
		t.Fatalf("no statement of the %s script contains %q", kind, without)
	}
	u, err := url.Parse(e.dsn)
	if err != nil {
		t.Fatal(err)
	}
	u.User = url.UserPassword(name, password)
	r.dsn = u.String()
	return r
}

// logicalEnv is a PostgreSQL env on a server with wal_level=logical
// (skipped outside CI otherwise); replication slots of its database are
// dropped before it is.
func logicalEnv(t *testing.T) *env {
	t.Helper()
	e := newEnv(t, "postgres")
	var level string
	if err := e.admin.QueryRowContext(e.ctx, "SELECT current_setting('wal_level')").Scan(&level); err != nil {
		t.Fatal(err)
	}
	if level != "logical" {
		msg := "wal_level is " + level + ": the WAL-mode grants need a server with wal_level=logical (scripts/testdb.sh sets it at the server's next start)"
		if os.Getenv("CI") == "true" {
			t.Fatal(msg)
		}
		t.Skip(msg)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		for ctx.Err() == nil {
			_, _ = e.admin.ExecContext(ctx, "SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots WHERE database = current_database() AND active_pid IS NOT NULL")
			_, _ = e.admin.ExecContext(ctx, "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE database = current_database() AND NOT active")
			var n int
			if e.admin.QueryRowContext(ctx, "SELECT count(*) FROM pg_replication_slots WHERE database = current_database()").Scan(&n) == nil && n == 0 {
				return
			}
			time.Sleep(100 * time.Millisecond)
		}
		t.Error("could not drop the replication slots of the test database")
	})
	return e
}

func walSchema() outbox.Schema {
	s := testdb.SchemaWith(outbox.Postgres, drvTables)
	s.WAL = true
	return s
}

// runWALWriter writes one event through the schema's writer (WAL mode)
// as the role, and checks that it went into the WAL, not the table.
func runWALWriter(e *env, as *role) error {
	w, err := walSchema().NewWriter(outbox.Postgres)
	if err != nil {
		return err
	}
	tx, err := as.db.BeginTx(e.ctx, nil)
	if err != nil {
		return err
	}
	defer tx.Rollback()
	if _, err := w.Insert(e.ctx, tx, event("wal-writer")); err != nil {
		return err
	}
	if err := tx.Commit(); err != nil {
		return err
	}
	var n int
	if err := e.admin.QueryRowContext(e.ctx, "SELECT count(*) FROM "+tables.Outbox).Scan(&n); err != nil {
		return err
	}
	if n != 0 {
		return fmt.Errorf("the WAL-mode writer inserted %d outbox rows", n)
	}
	return nil
}

// refuser publishes every message except those of key refuse, which it
// refuses permanently (so the stream parks them).
type refuser struct {
	refuse string
	mu     sync.Mutex
	got    []string
}

func (p *refuser) Publish(_ string, msgs ...*message.Message) error {
	for _, m := range msgs {
		if m.Metadata.Get(outbox.MetadataKey) == p.refuse {
			return relay.Permanent(errors.New("privtest: refused"))
		}
		p.mu.Lock()
		p.got = append(p.got, m.Metadata.Get(outbox.MetadataKey))
		p.mu.Unlock()
	}
	return nil
}

func (p *refuser) Close() error { return nil }

func (p *refuser) published() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.got)
}

// runWALRelay runs the streaming relay as the role: set-up (the
// publication exists, the slot is created), streaming of an event a
// superuser's WAL-mode writer committed, and the parking of an event the
// broker refuses.
func runWALRelay(e *env, as *role, wait time.Duration) error {
	pool, err := pgxpool.New(e.ctx, as.dsn)
	if err != nil {
		return err
	}
	defer pool.Close()
	pub := &refuser{refuse: "wal-poison"}
	r, err := walrelay.New(pool, walSchema(), walrelay.Config{Publisher: pub, Slot: "og_" + randomHex(6), Publication: walrelay.DefaultSlot(tables.Outbox), Logger: quiet,
		StatusInterval: 100 * time.Millisecond, ReconnectMax: 200 * time.Millisecond})
	if err != nil {
		return err
	}
	if err := r.Setup(e.ctx); err != nil {
		return err
	}
	ctx, cancel := context.WithCancel(e.ctx)
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	defer func() { cancel(); <-done }()
	for deadline := time.Now().Add(30 * time.Second); !r.Status().Streaming; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			return errors.New("the relay did not stream within 30s")
		}
	}
	w := outbox.MustNewWriter(outbox.Postgres, tables.Outbox, outbox.WithWAL())
	tx, err := e.admin.BeginTx(e.ctx, nil)
	if err != nil {
		return err
	}
	defer tx.Rollback()
	for _, k := range []string{"wal-ok", "wal-poison"} {
		if _, err := w.Insert(e.ctx, tx, event(k)); err != nil {
			return err
		}
	}
	if err := tx.Commit(); err != nil {
		return err
	}
	for deadline := time.Now().Add(wait); pub.published() < 1 || r.Status().Parked < 1; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			return fmt.Errorf("after %s: %d published, %d parked; want 1 and 1", wait, pub.published(), r.Status().Parked)
		}
	}
	var parked int
	if err := e.admin.QueryRowContext(e.ctx, "SELECT count(*) FROM "+tables.Outbox+" WHERE biz_id = 'wal-poison'").Scan(&parked); err != nil || parked != 1 {
		return fmt.Errorf("%d parked rows (%v), want 1", parked, err)
	}
	return nil
}

// TestGrantsWAL: with sql.wal, the writer's and the relay's grants of the
// script are enough for the WAL write path and the streaming relay
// (set-up, streaming, parking), and the lines WAL mode adds are each
// needed.
func TestGrantsWAL(t *testing.T) {
	writer := func(n string) templates.Roles { return templates.Roles{Writer: n} }
	relayRole := func(n string) templates.Roles { return templates.Roles{Relay: n} }
	t.Run("writer exact", func(t *testing.T) {
		t.Parallel()
		e := logicalEnv(t)
		r := e.walRole(t, "writer", writer, "")
		r.db = openRole(t, r)
		if err := runWALWriter(e, r); err != nil {
			t.Fatalf("the WAL-mode writer with exactly the script's grants failed: %v\nGrants:\n%s", err, strings.Join(r.grants, ";\n"))
		}
	})
	t.Run("writer without USAGE on the sequence", func(t *testing.T) {
		t.Parallel()
		e := logicalEnv(t)
		r := e.walRole(t, "writer", writer, "ON SEQUENCE")
		r.db = openRole(t, r)
		if err := runWALWriter(e, r); err == nil || !denied(err) {
			t.Fatalf("the WAL-mode writer without USAGE on the sequence: %v, want a permission error", err)
		}
	})
	t.Run("writer without EXECUTE on pg_logical_emit_message", func(t *testing.T) {
		t.Parallel()
		e := logicalEnv(t)
		r := e.walRole(t, "writer", writer, "GRANT EXECUTE")
		r.db = openRole(t, r)
		if err := runWALWriter(e, r); err == nil || !denied(err) {
			t.Fatalf("the WAL-mode writer without EXECUTE on pg_logical_emit_message: %v, want a permission error", err)
		}
	})
	// Once the script ran, a role it did not name cannot emit an event
	// into the WAL for the relay to publish (PUBLIC could before).
	t.Run("other roles cannot emit", func(t *testing.T) {
		t.Parallel()
		e := logicalEnv(t)
		e.walRole(t, "writer", writer, "")
		r := e.walRole(t, "relay", relayRole, "")
		r.db = openRole(t, r)
		_, err := r.db.ExecContext(e.ctx, "SELECT pg_logical_emit_message(true, $1, 'forged')", outbox.WALPrefix(tables.Outbox))
		if err == nil || !denied(err) {
			t.Fatalf("a role the script gave no EXECUTE emitted a logical decoding message: %v, want a permission error", err)
		}
	})
	t.Run("relay exact", func(t *testing.T) {
		t.Parallel()
		e := logicalEnv(t)
		r := e.walRole(t, "relay", relayRole, "")
		if err := runWALRelay(e, r, 30*time.Second); err != nil {
			t.Fatalf("the streaming relay with exactly the script's grants failed: %v\nGrants:\n%s", err, strings.Join(r.grants, ";\n"))
		}
	})
	for _, without := range []string{"REPLICATION", "CREATE PUBLICATION", "GRANT INSERT ON"} {
		t.Run("relay without "+without, func(t *testing.T) {
			t.Parallel()
			e := logicalEnv(t)
			r := e.walRole(t, "relay", relayRole, without)
			err := runWALRelay(e, r, 5*time.Second) // the exact case shows it needs far less
			if err == nil {
				t.Fatalf("the streaming relay worked without %s: the script grants more than needed", without)
			}
			t.Logf("without %s: %v", without, err)
		})
	}
}

// openRole opens a database/sql pool as the role.
func openRole(t *testing.T, r *role) *sql.DB {
	t.Helper()
	db, err := sql.Open(testdb.Driver(t, "postgres"), r.dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return db
}
