package outbox

import (
	"database/sql"
	"errors"
	"fmt"
	"reflect"
	"slices"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/outboxgen/outboxgen/runtime/dialect"
)

// Tables names the tables of one events.yaml: sql.outbox_table,
// sql.inbox_table and sql.archive_table. Generated code fills them in its
// Schema; the runtime never guesses them.
type Tables struct {
	Outbox string
	Inbox  string
	// Archive is empty unless events.yaml declares sql.archive_table.
	Archive string
}

// Check returns an error when a table name is not a safe identifier.
func (t Tables) Check() error {
	var errs []error
	errs = append(errs, dialect.CheckIdentifier("outbox table name", t.Outbox))
	errs = append(errs, dialect.CheckIdentifier("inbox table name", t.Inbox))
	if t.Archive != "" {
		errs = append(errs, dialect.CheckIdentifier("archive table name", t.Archive))
	}
	return errors.Join(errs...)
}

// Schema is what one events.yaml says about the database: the table names,
// the SQL dialects the DDL was generated for, and the event types. Every
// generated package exports one as its Schema variable, and every runtime
// part is wired from it (sqldriver.New(db, events.Schema),
// pgxdriver.New(pool, events.Schema), the generated RegisterX), so that
// no part can use a table or dialect events.yaml did not name.
type Schema struct {
	// Source is the spec file the schema was generated from, for error
	// messages, e.g. "events.yaml".
	Source string
	// Tables are sql.outbox_table, sql.inbox_table and sql.archive_table.
	Tables Tables
	// Dialects are sql.dialects, in file order.
	Dialects []Dialect
	// EventTypes are the declared events with their per-type settings.
	EventTypes []EventType
	// WAL is sql.wal: PostgreSQL writers write events into the WAL
	// (pg_logical_emit_message) for package walrelay instead of inserting
	// them into the outbox table. NewWriter, WriterFor and NewBinding pass
	// WithWAL when it is set, so every writer of the schema follows it:
	// per-key order holds only when all writers of an outbox use one path.
	WAL bool
}

// withWAL returns opts with WithWAL in front when s.WAL: in front, so
// that nothing the caller passes can be undone by it (WithWAL only sets a
// flag that no other option touches).
func (s Schema) withWAL(opts []WriterOption) []WriterOption {
	if !s.WAL {
		return opts
	}
	return append([]WriterOption{WithWAL()}, opts...)
}

// source returns the spec file name for messages.
func (s Schema) source() string {
	if s.Source == "" {
		return "events.yaml"
	}
	return s.Source
}

// Validate reports a schema that no generated package would produce: no
// dialect, an unknown one, or an unsafe table name. The zero Schema is
// invalid: pass the generated package's Schema.
func (s Schema) Validate() error {
	if len(s.Dialects) == 0 && s.Tables == (Tables{}) {
		return errors.New("the schema is empty: pass the generated package's Schema (e.g. events.Schema)")
	}
	var errs []error
	if len(s.Dialects) == 0 {
		errs = append(errs, fmt.Errorf("the schema lists no SQL dialect (sql.dialects in %s)", s.source()))
	}
	for _, d := range s.Dialects {
		if !d.Valid() {
			errs = append(errs, fmt.Errorf("unknown SQL dialect %q in the schema (sql.dialects in %s)", d, s.source()))
		}
	}
	if err := s.Tables.Check(); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// errUnknownDialect is the error for a Dialect that is not Valid.
func errUnknownDialect(d Dialect) error {
	return fmt.Errorf("unknown SQL dialect %q: use outbox.Postgres, outbox.MySQL or outbox.SQLite", d)
}

// Has reports whether events.yaml lists dialect d.
func (s Schema) Has(d Dialect) bool { return slices.Contains(s.Dialects, d) }

// Only returns s narrowed to dialect d, which s must list. Use it when the
// dialect of a *sql.DB cannot be told from its driver (a wrapping driver,
// e.g. for tracing) and events.yaml lists several:
// sqldriver.New(db, events.Schema.Only(outbox.MySQL)).
func (s Schema) Only(d Dialect) (Schema, error) {
	if err := s.CheckDialect(d, ""); err != nil {
		return Schema{}, err
	}
	s.Dialects = []Dialect{d}
	return s, nil
}

// CheckDialect returns an error unless events.yaml lists dialect d; what
// names where d came from (e.g. "db's driver *stdlib.Driver") for the
// message.
func (s Schema) CheckDialect(d Dialect, what string) error {
	if !d.Valid() {
		return errUnknownDialect(d)
	}
	if s.Has(d) {
		return nil
	}
	if what == "" {
		what = "the dialect asked for"
	}
	return &DialectError{Dialect: d, Listed: slices.Clone(s.Dialects), Source: s.source(), What: what}
}

// DialectError reports a database whose dialect events.yaml does not
// list: a writer, driver or consumer would run the wrong SQL on it.
type DialectError struct {
	Dialect Dialect   // the database's dialect
	Listed  []Dialect // sql.dialects
	Source  string    // the spec file
	What    string    // where Dialect came from
}

func (e *DialectError) Error() string {
	listed := make([]string, len(e.Listed))
	for i, d := range e.Listed {
		listed[i] = string(d)
	}
	return fmt.Sprintf("%s speaks %s, but sql.dialects in %s is [%s]: connect to a database of a listed dialect, or add %s to sql.dialects, regenerate and apply its schema",
		e.What, e.Dialect, e.Source, strings.Join(listed, ", "), e.Dialect)
}

// driverDialects maps the package of a database/sql driver to the dialect
// it speaks. The drivers are recognised by their type, without importing
// them (importing one would register it in every program using outbox).
var driverDialects = []struct {
	pkg string
	d   Dialect
}{
	{"github.com/jackc/pgx/v5/stdlib", Postgres},
	{"github.com/jackc/pgx/v4/stdlib", Postgres},
	{"github.com/lib/pq", Postgres},
	{"github.com/go-sql-driver/mysql", MySQL},
	{"modernc.org/sqlite", SQLite},
	{"github.com/mattn/go-sqlite3", SQLite},
}

// DetectDialect returns the dialect db's driver speaks, recognised by the
// driver's type: pgx's stdlib and lib/pq (Postgres), go-sql-driver/mysql
// (MySQL, also for MariaDB), modernc.org/sqlite and mattn/go-sqlite3
// (SQLite). ok is false for other (e.g. wrapping) drivers.
func DetectDialect(db *sql.DB) (d Dialect, driverType string, ok bool) {
	if db == nil {
		return "", "", false
	}
	t := reflect.TypeOf(db.Driver())
	if t == nil {
		return "", "", false
	}
	driverType = t.String()
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	pkg := t.PkgPath()
	for _, x := range driverDialects {
		if pkg == x.pkg || strings.HasPrefix(pkg, x.pkg+"/") {
			return x.d, driverType, true
		}
	}
	return "", driverType, false
}

// DialectOf returns the dialect to use on db: the one its driver speaks
// (see DetectDialect), which events.yaml must list. For a driver it does
// not recognise it returns the only dialect events.yaml lists (the
// drivers check it against the server at start); when events.yaml lists
// several, narrow the schema with Only.
func (s Schema) DialectOf(db *sql.DB) (Dialect, error) {
	if db == nil {
		return "", errors.New("db is nil: pass the *sql.DB that holds the outbox tables")
	}
	if err := s.Validate(); err != nil {
		return "", err
	}
	d, typ, ok := DetectDialect(db)
	if ok {
		return d, s.CheckDialect(d, fmt.Sprintf("the database (driver %s)", typ))
	}
	if len(s.Dialects) == 1 {
		return s.Dialects[0], nil
	}
	return "", fmt.Errorf("cannot tell which SQL dialect db's driver %s speaks, and sql.dialects in %s lists several: pass the schema narrowed to the database's dialect, e.g. Schema.Only(outbox.Postgres)",
		typ, s.source())
}

// NewWriter returns a Writer for the outbox table in dialect d, which
// events.yaml must list; with s.WAL a PostgreSQL writer writes into the
// WAL (WithWAL).
func (s Schema) NewWriter(d Dialect, opts ...WriterOption) (*Writer, error) {
	if err := s.Validate(); err != nil {
		return nil, fmt.Errorf("outbox: %w", err)
	}
	if err := s.CheckDialect(d, "the writer's dialect"); err != nil {
		return nil, fmt.Errorf("outbox: %w", err)
	}
	return NewWriter(d, s.Tables.Outbox, s.withWAL(opts)...)
}

// WriterFor returns a Writer for the outbox table on db, in the dialect
// of db's driver (see DialectOf).
func (s Schema) WriterFor(db *sql.DB, opts ...WriterOption) (*Writer, error) {
	d, err := s.DialectOf(db)
	if err != nil {
		return nil, fmt.Errorf("outbox: %w", err)
	}
	return NewWriter(d, s.Tables.Outbox, s.withWAL(opts)...)
}

// ErrUnbound is matched by the error of a generated package-level InsertX
// when events.yaml lists several dialects and no writer was bound at
// start-up (events.Bind(db)): the package cannot know which dialect's SQL
// to run, and never guesses.
var ErrUnbound = errors.New("no writer bound")

// Binding is the writer behind a generated package's package-level InsertX
// functions. It is fixed when events.yaml lists one dialect; otherwise it
// must be bound once at start-up with Bind, and until then Writer returns
// an error matching ErrUnbound. Use NewBinding.
type Binding struct {
	schema Schema
	mu     sync.Mutex // serialises Bind
	w      atomic.Pointer[Writer]
}

// NewBinding returns the binding for s: bound to s's only dialect when it
// lists one, unbound otherwise. It panics on an invalid schema (a
// generated package's is valid).
func NewBinding(s Schema) *Binding {
	if err := s.Validate(); err != nil {
		panic("outbox: " + err.Error())
	}
	b := &Binding{schema: s}
	if len(s.Dialects) == 1 {
		b.w.Store(MustNewWriter(s.Dialects[0], s.Tables.Outbox, s.withWAL(nil)...))
	}
	return b
}

// Bind makes w the package-level writer. w must write s's outbox table in
// a dialect s lists. A binding holds one dialect for the life of the
// process: binding another dialect than the one bound fails (use
// per-database writers for several databases); binding the same dialect
// again replaces the writer (e.g. to change its options).
func (b *Binding) Bind(w *Writer) error {
	if w == nil {
		return errors.New("outbox: bind: the writer is nil")
	}
	if w.Table() != b.schema.Tables.Outbox {
		return fmt.Errorf("outbox: bind: the writer inserts into %q, but sql.outbox_table in %s is %q", w.Table(), b.schema.source(), b.schema.Tables.Outbox)
	}
	if err := b.schema.CheckDialect(w.Dialect(), "the writer"); err != nil {
		return fmt.Errorf("outbox: bind: %w", err)
	}
	if w.Dialect() == Postgres && b.schema.WAL != (w.wal != nil) {
		// Mixing the two write paths for one outbox breaks per-key order
		// (the stream and the polling relay order independently).
		if b.schema.WAL {
			return fmt.Errorf("outbox: bind: sql.wal in %s is true, but the writer inserts into the table: create it from the schema (the generated NewWriter) or with outbox.WithWAL()", b.schema.source())
		}
		return fmt.Errorf("outbox: bind: the writer writes into the WAL (WithWAL), but sql.wal in %s is not set: drop WithWAL, or set sql.wal: true and regenerate", b.schema.source())
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if old := b.w.Load(); old != nil && old.Dialect() != w.Dialect() {
		return fmt.Errorf("outbox: bind: the package-level writer is bound to %s already and cannot switch to %s: one process binds one database; use a writer per database (NewWriter) for more", old.Dialect(), w.Dialect())
	}
	b.w.Store(w)
	return nil
}

// Writer returns the bound writer, or an error matching ErrUnbound.
func (b *Binding) Writer() (*Writer, error) {
	w := b.w.Load()
	if w == nil {
		listed := make([]string, len(b.schema.Dialects))
		for i, d := range b.schema.Dialects {
			listed[i] = string(d)
		}
		return nil, fmt.Errorf("outbox: %w: sql.dialects in %s lists several (%s), so the package-level InsertX functions need the database's dialect: call Bind(db) at start-up, or use a writer per database (NewWriter(db))",
			ErrUnbound, b.schema.source(), strings.Join(listed, ", "))
	}
	return w, nil
}
