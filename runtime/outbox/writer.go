package outbox

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"unicode/utf8"

	"go.opentelemetry.io/otel/propagation"

	"github.com/outboxgen/outboxgen/runtime/dialect"
	"github.com/outboxgen/outboxgen/runtime/internal/telemetry"
)

// Execer is what Writer.Insert needs from a transaction: *sql.Tx has both
// methods. Generated writers take *sql.Tx (or pgx.Tx through package
// pgxoutbox), never this interface, so that a pool or *sql.DB cannot be
// passed by mistake. QueryRowContext runs only after an insert with a
// caller-chosen event id (WithEventID) was skipped, to compare the existing
// row with the event.
type Execer interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
}

// InsertOption adjusts a single insert.
type InsertOption func(*insertOptions)

type insertOptions struct {
	id      EventID
	headers map[string]string
}

// WithEventID uses id instead of a fresh UUIDv7. Re-emitting an event with
// the same id is idempotent: when a row with that event_id already exists
// and holds the same event type, key and topic, the insert is skipped and
// succeeds. When the existing row is another event (another type, key or
// topic), Insert fails with an error matching ErrDuplicateEventID instead of
// dropping the event; the check is a SELECT, so the transaction stays
// usable. Derive such ids deterministically from everything that identifies
// the event, e.g. with uuid.NewSHA1 over the event type and business key.
//
// On MySQL the writer tells a skipped insert from a new row by the rows
// affected, which needs the go-sql-driver/mysql default
// clientFoundRows=false: do not set clientFoundRows=true in the DSN of a
// database that writers use with WithEventID, or a clash goes unnoticed.
func WithEventID(id EventID) InsertOption {
	return func(o *insertOptions) { o.id = id }
}

// WithHeaders attaches headers to the event (merged over earlier ones). The
// relay publishes them as message metadata, e.g. a trace parent or tenant.
// Names and values must keep to the header limits (token-character names
// of at most MaxHeaderNameLen bytes, values without NUL, CR or LF, at most
// MaxHeaders headers and MaxHeadersSize bytes; see MaxHeadersSize), or the
// insert fails with ErrInvalidEvent before any SQL runs.
func WithHeaders(h map[string]string) InsertOption {
	return func(o *insertOptions) {
		if o.headers == nil {
			o.headers = make(map[string]string, len(h))
		}
		for k, v := range h {
			o.headers[k] = v
		}
	}
}

// WithHeader attaches one header to the event.
func WithHeader(key, value string) InsertOption {
	return WithHeaders(map[string]string{key: value})
}

// ErrNilWriter is returned by the inserts of a nil *Writer (and so of a
// generated package's zero Writer value).
var ErrNilWriter = errors.New("outbox: the writer is nil: create it with the generated NewWriter (or outbox.NewWriter)")

// Writer inserts events into one outbox table of one dialect. It is safe
// for concurrent use; its statements are built once.
type Writer struct {
	dialect     Dialect
	table       string
	insert      string
	insertIfNew string
	identity    string
	maxMessage  int                           // cap of payload + headers bytes; <= 0: none
	propagator  propagation.TextMapPropagator // nil: no trace context stored
	walOn       bool                          // WithWAL was given
	// wal is set by NewWriter when WithWAL was given and the dialect is
	// Postgres: Insert and InsertTx then emit into the WAL, not the table.
	wal *WALWriter
}

// NewWriter returns a Writer for table in dialect d. Its message size cap
// is MaxMessageSize unless an option changes it.
func NewWriter(d Dialect, table string, opts ...WriterOption) (*Writer, error) {
	if !d.Valid() {
		return nil, fmt.Errorf("outbox: %w", errUnknownDialect(d))
	}
	if err := dialect.CheckIdentifier("outbox: table name", table); err != nil {
		return nil, err
	}
	w := &Writer{
		dialect:     d,
		table:       table,
		insert:      d.InsertEvent(table, false),
		insertIfNew: d.InsertEvent(table, true),
		identity:    d.EventIdentity(table),
		maxMessage:  MaxMessageSize,
		propagator:  telemetry.TraceContext,
	}
	for _, opt := range opts {
		opt(w)
	}
	if w.walOn && d == Postgres {
		// Built after the options, so the WAL path sees the final size
		// cap and propagator (it reads them from w on every insert).
		w.wal = &WALWriter{w: w, prefix: WALPrefix(table), sequence: walSequence(table)}
	}
	return w, nil
}

// MustNewWriter is NewWriter for package-level variables: it panics on a
// bad dialect or table name, which are programming errors.
func MustNewWriter(d Dialect, table string, opts ...WriterOption) *Writer {
	w, err := NewWriter(d, table, opts...)
	if err != nil {
		panic(err)
	}
	return w
}

// Dialect returns the writer's dialect.
func (w *Writer) Dialect() Dialect { return w.dialect }

// Table returns the writer's outbox table name.
func (w *Writer) Table() string { return w.table }

// MaxMessageSize returns the writer's cap, in bytes, on an event's payload
// plus headers (names and values); 0 when there is none. See
// WithMaxMessageSize.
func (w *Writer) MaxMessageSize() int { return max(w.maxMessage, 0) }

// Statement is a prepared insert: the id the event will carry and the SQL
// with its arguments. Writer.Exec runs it.
type Statement struct {
	ID   EventID
	SQL  string
	Args []any

	// lookup is set when ID was chosen by the caller (WithEventID): then
	// SQL skips an existing row with that event_id, and when it affects no
	// rows Exec runs lookup to compare the existing row with this event.
	lookup          string
	typ, key, topic string
}

// Tx is a transaction as a Writer uses it. StdTx adapts database/sql,
// package pgxoutbox adapts pgx.
type Tx interface {
	// Exec runs a statement and returns how many rows it changed.
	Exec(ctx context.Context, query string, args ...any) (int64, error)
	// QueryRow runs a query returning at most one row and scans it into
	// dest; found is false (and err nil) when there is no row.
	QueryRow(ctx context.Context, query string, args []any, dest ...any) (found bool, err error)
}

// StdTx adapts a database/sql transaction (anything with ExecContext and
// QueryRowContext) to Tx.
func StdTx(tx Execer) Tx { return stdTx{tx} }

type stdTx struct{ tx Execer }

func (t stdTx) Exec(ctx context.Context, query string, args ...any) (int64, error) {
	res, err := t.tx.ExecContext(ctx, query, args...)
	if err != nil {
		return 0, err
	}
	return res.RowsAffected()
}

func (t stdTx) QueryRow(ctx context.Context, query string, args []any, dest ...any) (bool, error) {
	err := t.tx.QueryRowContext(ctx, query, args...).Scan(dest...)
	if errors.Is(err, sql.ErrNoRows) {
		return false, nil
	}
	return err == nil, err
}

// Existing reads the biz_type, biz_id and topic of the row holding event id
// id in w's table; found is false when there is none. A publisher that
// re-emits ids (package txpublisher) compares them with its own rules.
func (w *Writer) Existing(ctx context.Context, tx Tx, id EventID) (bizType, bizID, topic string, found bool, err error) {
	found, err = tx.QueryRow(ctx, w.identity, []any{id.String()}, &bizType, &bizID, &topic)
	return bizType, bizID, topic, found, err
}

// Exec runs st inside tx. A caller-chosen id that the table already holds
// for the same event (same type, key and topic) is an idempotent repeat and
// succeeds; for another event it fails with ErrDuplicateEventID and leaves
// tx usable (the check is a SELECT, not a failed statement).
func (w *Writer) Exec(ctx context.Context, tx Tx, st Statement) error {
	n, err := tx.Exec(ctx, st.SQL, st.Args...)
	if err != nil {
		return fmt.Errorf("outbox: insert %s into %s: %w", st.typ, w.table, err)
	}
	if st.lookup == "" || n != 0 {
		return nil
	}
	typ, key, topic, found, err := w.Existing(ctx, tx, st.ID)
	switch {
	case err != nil:
		return fmt.Errorf("outbox: insert %s into %s: look up the existing event id %s: %w", st.typ, w.table, st.ID, err)
	case !found:
		// Deleted in between (by the janitor, say): whether it was the
		// same event cannot be told.
		return fmt.Errorf("outbox: insert %s into %s: event id %s was taken when inserting but its row was gone when compared; retry the transaction", st.typ, w.table, st.ID)
	case typ == st.typ && key == st.key && topic == st.topic:
		return nil
	}
	return &DuplicateEventIDError{
		ID:       st.ID,
		Type:     st.typ,
		Key:      st.key,
		Topic:    st.topic,
		HasType:  typ,
		HasKey:   key,
		HasTopic: topic,
	}
}

// Prepare marshals ev and builds its INSERT without touching the database.
// It refuses, with an error matching ErrInvalidEvent, an event that could
// not be stored, published or consumed (see the limits next to
// MaxHeadersSize): any error leaves the caller's transaction untouched and
// usable.
//
// Prepare stores no trace context: Insert and InsertTx do (see
// WithTracePropagator). Prepare and Exec always build and run the table
// INSERT, also for a writer made WithWAL: their callers (txpublisher)
// re-emit events with caller-chosen ids and rely on the table's id check,
// which the WAL has no equivalent of.
func (w *Writer) Prepare(ev Event, opts ...InsertOption) (Statement, error) {
	return w.prepare(ev, nil, opts...)
}

func (w *Writer) prepare(ev Event, trace map[string]string, opts ...InsertOption) (Statement, error) {
	var o insertOptions
	for _, opt := range opts {
		opt(&o)
	}
	if ev.Type == "" || ev.Topic == "" {
		return Statement{}, errors.New("outbox: event type and topic must be set")
	}
	typ := truncate(printable(ev.Type), MaxTypeLen) // for error messages
	if ev.Key == "" {
		return Statement{}, &InvalidEventError{Type: typ, Reason: "the key (biz_id) is empty"}
	}
	// The outbox table's column sizes and what the databases and brokers
	// can carry: refused here, before any SQL, since on PostgreSQL a
	// failing INSERT would abort the caller's transaction, and elsewhere
	// the row would be stored and then fail at the relay or the consumer.
	for _, c := range []struct {
		what, value string
		max         int
		strict      bool
	}{
		{"the event type (biz_type)", ev.Type, MaxTypeLen, false},
		{"the key (biz_id)", ev.Key, MaxKeyLen, false},
		{"the topic", ev.Topic, MaxTopicLen, true},
	} {
		if err := CheckText(c.what, c.value, c.max, c.strict); err != nil {
			return Statement{}, &InvalidEventError{Type: typ, Reason: err.Error()}
		}
	}
	payload, err := json.Marshal(ev.Payload)
	if err != nil {
		return Statement{}, fmt.Errorf("outbox: marshal %s payload: %w", ev.Type, err)
	}
	o.headers = withTrace(o.headers, trace, len(payload), w.maxMessage)
	var headers any // NULL when there are none
	headersSize := 0
	if len(o.headers) > 0 {
		if err := CheckHeaders(o.headers); err != nil {
			return Statement{}, &InvalidEventError{Type: ev.Type, Field: "headers", Reason: err.Error()}
		}
		for k, v := range o.headers {
			if err := checkReservedHeader(k); err != nil {
				return Statement{}, &InvalidEventError{Type: ev.Type, Field: "headers", Reason: err.Error()}
			}
			headersSize += len(k) + len(v)
		}
		h, err := json.Marshal(o.headers)
		if err != nil {
			return Statement{}, fmt.Errorf("outbox: marshal %s headers: %w", ev.Type, err)
		}
		headers = string(h)
	}
	if w.maxMessage > 0 && len(payload)+headersSize > w.maxMessage {
		return Statement{}, &InvalidEventError{Type: ev.Type, Reason: fmt.Sprintf(
			"the payload (%d bytes of JSON) and headers (%d bytes) exceed the writer's message size limit of %d bytes (outbox.MaxMessageSize; brokers refuse larger messages by default)",
			len(payload), headersSize, w.maxMessage)}
	}
	query := w.insert
	id := o.id
	if id.IsZero() {
		id = NewEventID()
	} else {
		query = w.insertIfNew
	}
	st := Statement{
		ID:    id,
		SQL:   query,
		Args:  dialect.InsertEventArgs(id.String(), ev.Type, ev.Key, ev.Topic, ev.Version, string(payload), headers),
		typ:   ev.Type,
		key:   ev.Key,
		topic: ev.Topic,
	}
	if query == w.insertIfNew {
		st.lookup = w.identity
	}
	return st, nil
}

// truncate shortens s to at most n runes, marking a cut with "...".
func truncate(s string, n int) string {
	if utf8.RuneCountInString(s) <= n {
		return s
	}
	r := []rune(s)
	return string(r[:n]) + "..."
}

// Insert writes ev into the outbox table inside tx and returns its event id
// (into the WAL for a PostgreSQL writer made WithWAL: see WAL).
// It runs no other statement, so the business transaction stays short,
// except when a caller-chosen id (WithEventID) is already taken: then one
// SELECT compares the existing row with ev (see Exec).
func (w *Writer) Insert(ctx context.Context, tx Execer, ev Event, opts ...InsertOption) (EventID, error) {
	return w.InsertTx(ctx, StdTx(tx), ev, opts...)
}

// InsertTx is Insert through any Tx (pgxoutbox passes a pgx.Tx this way).
// A PostgreSQL writer made WithWAL emits ev into the WAL instead (see
// WALWriter.InsertTx); Insert, pgxoutbox.Insert and every generated
// InsertX come through here, so the one check below routes them all.
func (w *Writer) InsertTx(ctx context.Context, tx Tx, ev Event, opts ...InsertOption) (EventID, error) {
	if w == nil {
		return EventID{}, ErrNilWriter
	}
	if w.wal != nil {
		return w.wal.InsertTx(ctx, tx, ev, opts...)
	}
	st, err := w.prepare(ev, telemetry.Headers(ctx, w.propagator), opts...)
	if err != nil {
		return EventID{}, err
	}
	if err := w.Exec(ctx, tx, st); err != nil {
		return EventID{}, err
	}
	written(ctx, st)
	return st.ID, nil
}
