package sqldriver_test

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"

	"github.com/outboxgen/outboxgen/internal/testdb"
	rtdriver "github.com/outboxgen/outboxgen/runtime/driver"
	"github.com/outboxgen/outboxgen/runtime/driver/sqldriver"
	"github.com/outboxgen/outboxgen/runtime/outbox"
	"github.com/outboxgen/outboxgen/runtime/relay"
	"github.com/outboxgen/outboxgen/templates"
)

// wrap is a driver sqldriver does not recognise (as a tracing wrapper).
type wrap struct{ driver.Driver }

var registerWrap sync.Map

// openWrapped opens dialect d's test database through wrap.
func openWrapped(t *testing.T, d string) *sql.DB {
	t.Helper()
	inner := testdb.Open(t, d)
	name := "sqldriver-test-wrap-" + d
	if _, loaded := registerWrap.LoadOrStore(name, true); !loaded {
		sql.Register(name, wrap{inner.Driver()})
	}
	db, err := sql.Open(name, testdb.DSN(t, d))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return db
}

// Check asks the server: a wrapped driver set up for the wrong dialect
// (the schema narrowed to it) is refused before anything runs, and the
// relay ends Run at once with the error.
func TestCheckDialectMismatch(t *testing.T) {
	for _, c := range []struct{ db, claimed string }{{"sqlite", "postgres"}, {"postgres", "mysql"}, {"mysql", "postgres"}} {
		t.Run(c.db, func(t *testing.T) {
			db := openWrapped(t, c.db)
			s := testdb.Schema(c.claimed)
			drv, err := sqldriver.New(db, s) // one dialect: taken on trust, then checked
			if err != nil {
				t.Fatal(err)
			}
			err = drv.Check(t.Context(), rtdriver.Outbox)
			for _, want := range []string{"the database is " + c.db + ", not " + c.claimed, "add " + c.db + " to sql.dialects in events.yaml"} {
				if err == nil || !strings.Contains(err.Error(), want) {
					t.Errorf("Check = %v, want it to say %q", err, want)
				}
			}
			ps := gochannel.NewGoChannel(gochannel.Config{}, nil)
			defer ps.Close()
			r, err := relay.New(drv, relay.Config{Publisher: ps, Logger: slog.New(slog.DiscardHandler)})
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			if err := r.Run(ctx); err == nil || ctx.Err() != nil || !strings.Contains(err.Error(), "not "+c.claimed) {
				t.Fatalf("Run = %v (ctx %v), want the mismatch at once", err, ctx.Err())
			}
		})
	}
}

// A missing table, or a table without a column the runtime needs, is named
// with its events.yaml key and the fix; a complete one passes.
func TestCheckTables(t *testing.T) {
	for _, d := range testdb.Dialects() {
		t.Run(d, func(t *testing.T) {
			db := testdb.Open(t, d)
			tables := outbox.Tables{Outbox: "ship_outbox", Inbox: "ship_inbox"}
			drv, err := sqldriver.New(db, testdb.SchemaWith(d, tables))
			if err != nil {
				t.Fatal(err)
			}
			ctx := t.Context()
			err = drv.Check(ctx, rtdriver.Outbox)
			for _, want := range []string{`table "ship_outbox" (sql.outbox_table in events.yaml) does not exist`, "outboxgen schema -f events.yaml -dialect " + d} {
				if err == nil || !strings.Contains(err.Error(), want) {
					t.Errorf("Check(Outbox) = %v, want %q", err, want)
				}
			}
			// An inbox without processed_at: a column is missing.
			if _, err := db.ExecContext(ctx, "CREATE TABLE ship_inbox (consumer VARCHAR(64), event_id VARCHAR(64), biz_type VARCHAR(64), biz_id VARCHAR(128))"); err != nil {
				t.Fatal(err)
			}
			if err := drv.Check(ctx, rtdriver.Inbox); err == nil || !strings.Contains(err.Error(), `table "ship_inbox" (sql.inbox_table in events.yaml)`) {
				t.Errorf("Check(Inbox) = %v", err)
			}
			if err := drv.Check(ctx, rtdriver.Archive); err == nil || !strings.Contains(err.Error(), "declares no sql.archive_table") {
				t.Errorf("Check(Archive) = %v", err)
			}
			testdb.ApplySchema(t, db, d, templates.Tables{Outbox: "ship_outbox", Inbox: "ship_inbox2"})
			if err := drv.Check(ctx, rtdriver.Outbox); err != nil {
				t.Fatalf("Check(Outbox) after the schema: %v", err)
			}
		})
	}
}
