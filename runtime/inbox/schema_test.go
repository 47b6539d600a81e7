package inbox

import (
	"context"
	"database/sql"
	"strings"
	"testing"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"
	_ "modernc.org/sqlite"

	"github.com/outboxgen/outboxgen/runtime/outbox"
)

// With the generated Schema, the dialect is the database's and must be
// listed, and the inbox table is the schema's; a router whose consumer's
// tables are missing fails to start, naming the table, its events.yaml key
// and the fix.
func TestRegisterWithSchema(t *testing.T) {
	db, err := sql.Open("sqlite", ":memory:")
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	ps := gochannel.NewGoChannel(gochannel.Config{}, watermill.NopLogger{})
	defer ps.Close()
	consumer := Consumer[*sql.Tx]{Name: "points", Routes: []Route[*sql.Tx]{
		On("ORDER_PAID", "orders.paid", func([]byte, int) (int, error) { return 0, nil },
			func(context.Context, *sql.Tx, int, outbox.Meta) error { return nil }),
	}}
	pgOnly := outbox.Schema{Source: "shipping.yaml", Tables: outbox.Tables{Outbox: "ship_outbox", Inbox: "ship_inbox"}, Dialects: []outbox.Dialect{outbox.Postgres}}
	r, err := message.NewRouter(message.RouterConfig{}, watermill.NopLogger{})
	if err != nil {
		t.Fatal(err)
	}
	err = Register(r, ps, db, consumer, Config{Schema: pgOnly, NoPoisonQueue: true})
	if err == nil || !strings.Contains(err.Error(), "sql.dialects in shipping.yaml is [postgres]") {
		t.Fatalf("Register on SQLite with a PostgreSQL-only schema = %v", err)
	}
	if err := Register(r, ps, db, consumer, Config{Schema: pgOnly, Dialect: outbox.SQLite, NoPoisonQueue: true}); err == nil || !strings.Contains(err.Error(), "speaks sqlite") {
		t.Fatalf("Register naming an unlisted dialect = %v", err)
	}
	all := pgOnly
	all.Dialects = []outbox.Dialect{outbox.Postgres, outbox.SQLite}
	if err := Register(r, ps, db, consumer, Config{Schema: all, InboxTable: "outbox_inbox", NoPoisonQueue: true}); err == nil || !strings.Contains(err.Error(), `sql.inbox_table in shipping.yaml is "ship_inbox"`) {
		t.Fatalf("Register with another inbox table = %v", err)
	}
	if err := Register(r, ps, db, consumer, Config{Schema: all, NoPoisonQueue: true}); err != nil {
		t.Fatal(err)
	}
	err = r.Run(t.Context())
	for _, want := range []string{`table "ship_inbox" (from sql.inbox_table in shipping.yaml) does not exist`, "outboxgen schema -f shipping.yaml -dialect sqlite"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("Run = %v, want %q", err, want)
		}
	}
}

// A consumer whose SQL is written for another dialect than the database's
// (Config.Dialect set wrong, or a wrapping driver) fails at router start
// instead of poisoning every message on a syntax error.
func TestRegisterWrongDialectFailsAtStart(t *testing.T) {
	db, err := sql.Open("sqlite", ":memory:")
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	ps := gochannel.NewGoChannel(gochannel.Config{}, watermill.NopLogger{})
	defer ps.Close()
	consumer := Consumer[*sql.Tx]{Name: "points", Routes: []Route[*sql.Tx]{
		On("ORDER_PAID", "orders.paid", func([]byte, int) (int, error) { return 0, nil },
			func(context.Context, *sql.Tx, int, outbox.Meta) error { return nil }),
	}}
	both := outbox.Schema{Source: "shipping.yaml", Tables: outbox.Tables{Outbox: "ship_outbox", Inbox: "ship_inbox"}, Dialects: []outbox.Dialect{outbox.MySQL, outbox.SQLite}}
	r, err := message.NewRouter(message.RouterConfig{}, watermill.NopLogger{})
	if err != nil {
		t.Fatal(err)
	}
	if err := Register(r, ps, db, consumer, Config{Schema: both, Dialect: outbox.MySQL, NoPoisonQueue: true}); err != nil {
		t.Fatal(err)
	}
	err = r.Run(t.Context())
	if err == nil || !strings.Contains(err.Error(), "its SQL is mysql, but the database is sqlite") {
		t.Fatalf("Run = %v, want the dialect mismatch at start", err)
	}
}
