package outbox_test

import (
	"database/sql"
	"database/sql/driver"
	"errors"
	"strings"
	"testing"

	_ "modernc.org/sqlite"

	"github.com/outboxgen/outboxgen/runtime/outbox"
)

var testSchema = outbox.Schema{
	Source:   "shipping.yaml",
	Tables:   outbox.Tables{Outbox: "shipping_outbox", Inbox: "shipping_inbox"},
	Dialects: []outbox.Dialect{outbox.Postgres, outbox.MySQL},
}

// wrapDriver is a driver outbox does not recognise (as a tracing wrapper).
type wrapDriver struct{ driver.Driver }

func init() {
	db, err := sql.Open("sqlite", ":memory:")
	if err != nil {
		panic(err)
	}
	sql.Register("outbox-test-wrap", wrapDriver{db.Driver()})
	db.Close()
}

func openSQLite(t *testing.T, name string) *sql.DB {
	t.Helper()
	db, err := sql.Open(name, ":memory:")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return db
}

func TestDetectDialect(t *testing.T) {
	d, typ, ok := outbox.DetectDialect(openSQLite(t, "sqlite"))
	if !ok || d != outbox.SQLite || typ != "*sqlite.Driver" {
		t.Fatalf("modernc sqlite: %q %q %v", d, typ, ok)
	}
	if _, typ, ok := outbox.DetectDialect(openSQLite(t, "outbox-test-wrap")); ok || !strings.Contains(typ, "wrapDriver") {
		t.Fatalf("a wrapping driver was recognised: %q %v", typ, ok)
	}
}

// A database of a dialect the schema does not list is refused, naming the
// dialect, the spec file, its list and the fix.
func TestDialectOf(t *testing.T) {
	_, err := testSchema.DialectOf(openSQLite(t, "sqlite"))
	var de *outbox.DialectError
	if !errors.As(err, &de) || de.Dialect != outbox.SQLite {
		t.Fatalf("DialectOf(sqlite) = %v, want a DialectError", err)
	}
	for _, want := range []string{"driver *sqlite.Driver", "speaks sqlite", "sql.dialects in shipping.yaml is [postgres, mysql]", "add sqlite to sql.dialects"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("%q lacks %q", err, want)
		}
	}
	// An unrecognised driver: several dialects cannot be told apart...
	wrapped := openSQLite(t, "outbox-test-wrap")
	if _, err := testSchema.DialectOf(wrapped); err == nil || !strings.Contains(err.Error(), "Schema.Only") {
		t.Fatalf("unrecognised driver, two dialects: %v", err)
	}
	// ... one is taken (the drivers check it against the server).
	only, err := testSchema.Only(outbox.MySQL)
	if err != nil {
		t.Fatal(err)
	}
	if d, err := only.DialectOf(wrapped); err != nil || d != outbox.MySQL {
		t.Fatalf("Only(MySQL).DialectOf = %q, %v", d, err)
	}
	if _, err := testSchema.Only(outbox.SQLite); !errors.As(err, &de) {
		t.Fatalf("Only(SQLite) = %v, want a DialectError", err)
	}
	if _, err := (outbox.Schema{}).DialectOf(wrapped); err == nil || !strings.Contains(err.Error(), "generated package's Schema") {
		t.Fatalf("zero Schema: %v", err)
	}
}

func TestSchemaNewWriter(t *testing.T) {
	if _, err := testSchema.NewWriter(outbox.SQLite); err == nil || !strings.Contains(err.Error(), "sql.dialects in shipping.yaml") {
		t.Fatalf("NewWriter(SQLite) = %v", err)
	}
	w, err := testSchema.NewWriter(outbox.MySQL)
	if err != nil || w.Table() != "shipping_outbox" || w.Dialect() != outbox.MySQL {
		t.Fatalf("NewWriter(MySQL) = %v, %v", w, err)
	}
}

// The package-level writer: fixed for one dialect; unbound (an error, no
// guess) for several until bound; bound once per process to one dialect.
func TestBinding(t *testing.T) {
	one, _ := testSchema.Only(outbox.Postgres)
	if w, err := outbox.NewBinding(one).Writer(); err != nil || w.Dialect() != outbox.Postgres {
		t.Fatalf("one dialect: %v, %v", w, err)
	}
	b := outbox.NewBinding(testSchema)
	if _, err := b.Writer(); !errors.Is(err, outbox.ErrUnbound) || !strings.Contains(err.Error(), "Bind(db)") {
		t.Fatalf("unbound: %v", err)
	}
	if err := b.Bind(outbox.MustNewWriter(outbox.SQLite, "shipping_outbox")); err == nil {
		t.Fatal("bound a dialect the schema does not list")
	}
	if err := b.Bind(outbox.MustNewWriter(outbox.MySQL, "outbox_event")); err == nil || !strings.Contains(err.Error(), `sql.outbox_table in shipping.yaml is "shipping_outbox"`) {
		t.Fatalf("bound another table: %v", err)
	}
	my := outbox.MustNewWriter(outbox.MySQL, "shipping_outbox")
	if err := b.Bind(my); err != nil {
		t.Fatal(err)
	}
	if w, err := b.Writer(); err != nil || w != my {
		t.Fatalf("bound: %v, %v", w, err)
	}
	if err := b.Bind(outbox.MustNewWriter(outbox.Postgres, "shipping_outbox")); err == nil || !strings.Contains(err.Error(), "bound to mysql already") {
		t.Fatalf("rebound to another dialect: %v", err)
	}
	var nilWriter *outbox.Writer
	if _, err := nilWriter.Insert(t.Context(), nil, outbox.Event{}); !errors.Is(err, outbox.ErrNilWriter) {
		t.Fatalf("nil writer: %v", err)
	}
}
