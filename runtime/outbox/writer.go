package outbox

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	"github.com/outboxgen/outboxgen/runtime/dialect"
)

// Execer is what Writer.Insert needs from a transaction. Generated writers
// take *sql.Tx (or pgx.Tx through package pgxoutbox), never this interface,
// so that a pool or *sql.DB cannot be passed by mistake.
type Execer interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
}

// InsertOption adjusts a single insert.
type InsertOption func(*insertOptions)

type insertOptions struct {
	id      EventID
	headers map[string]string
}

// WithEventID uses id instead of a fresh UUIDv7. Re-emitting an event with
// the same id is idempotent: when a row with that event_id already exists
// the insert is skipped and succeeds. Derive such ids deterministically,
// e.g. with uuid.NewSHA1 over the business key.
func WithEventID(id EventID) InsertOption {
	return func(o *insertOptions) { o.id = id }
}

// WithHeaders attaches headers to the event (merged over earlier ones). The
// relay publishes them as message metadata, e.g. a trace parent or tenant.
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

// Writer inserts events into one outbox table of one dialect. It is safe
// for concurrent use; its statements are built once.
type Writer struct {
	dialect     Dialect
	table       string
	insert      string
	insertIfNew string
}

// NewWriter returns a Writer for table in dialect d.
func NewWriter(d Dialect, table string) (*Writer, error) {
	if !d.Valid() {
		return nil, fmt.Errorf("outbox: unknown dialect %q: use outbox.Postgres, outbox.MySQL or outbox.SQLite", d)
	}
	if err := dialect.CheckIdentifier("outbox: table name", table); err != nil {
		return nil, err
	}
	return &Writer{
		dialect:     d,
		table:       table,
		insert:      d.InsertEvent(table, false),
		insertIfNew: d.InsertEvent(table, true),
	}, nil
}

// MustNewWriter is NewWriter for package-level variables: it panics on a
// bad dialect or table name, which are programming errors.
func MustNewWriter(d Dialect, table string) *Writer {
	w, err := NewWriter(d, table)
	if err != nil {
		panic(err)
	}
	return w
}

// Dialect returns the writer's dialect.
func (w *Writer) Dialect() Dialect { return w.dialect }

// Table returns the writer's outbox table name.
func (w *Writer) Table() string { return w.table }

// Statement is a prepared insert: the id the event will carry and the SQL
// with its arguments. Drivers other than database/sql execute it.
type Statement struct {
	ID   EventID
	SQL  string
	Args []any
}

// Prepare marshals ev and builds its INSERT without touching the database.
// Any error leaves the caller's transaction untouched and usable.
func (w *Writer) Prepare(ev Event, opts ...InsertOption) (Statement, error) {
	var o insertOptions
	for _, opt := range opts {
		opt(&o)
	}
	if ev.Type == "" || ev.Topic == "" {
		return Statement{}, errors.New("outbox: event type and topic must be set")
	}
	if ev.Key == "" {
		return Statement{}, &InvalidEventError{Type: ev.Type, Reason: "the key (biz_id) is empty"}
	}
	payload, err := json.Marshal(ev.Payload)
	if err != nil {
		return Statement{}, fmt.Errorf("outbox: marshal %s payload: %w", ev.Type, err)
	}
	var headers any // NULL when there are none
	if len(o.headers) > 0 {
		for k := range o.headers {
			if err := checkHeaderName(k); err != nil {
				return Statement{}, &InvalidEventError{Type: ev.Type, Field: "headers", Reason: err.Error()}
			}
		}
		h, err := json.Marshal(o.headers)
		if err != nil {
			return Statement{}, fmt.Errorf("outbox: marshal %s headers: %w", ev.Type, err)
		}
		headers = string(h)
	}
	query := w.insert
	id := o.id
	if id.IsZero() {
		id = NewEventID()
	} else {
		query = w.insertIfNew
	}
	// JSON goes in as text: MySQL refuses JSON from a binary string and
	// SQLite would store []byte as a BLOB.
	return Statement{
		ID:   id,
		SQL:  query,
		Args: []any{id.String(), ev.Type, ev.Key, ev.Topic, ev.Version, string(payload), headers},
	}, nil
}

// Insert writes ev into the outbox table inside tx and returns its event id.
// It runs no other statement, so the business transaction stays short.
func (w *Writer) Insert(ctx context.Context, tx Execer, ev Event, opts ...InsertOption) (EventID, error) {
	st, err := w.Prepare(ev, opts...)
	if err != nil {
		return EventID{}, err
	}
	if _, err := tx.ExecContext(ctx, st.SQL, st.Args...); err != nil {
		return EventID{}, fmt.Errorf("outbox: insert %s into %s: %w", ev.Type, w.table, err)
	}
	return st.ID, nil
}

// checkHeaderName refuses header names that the relay or a broker adapter
// gives a meaning of their own: a stored header with such a name would be
// overwritten, or would change how the broker treats the message (a
// "_watermill_message_uuid" header makes watermill-kafka refuse every
// publish; "Nats-Expected-*" headers change JetStream's checks).
func checkHeaderName(k string) error {
	lk := strings.ToLower(k)
	switch {
	case k == "":
		return errors.New("a header name is empty")
	case strings.HasPrefix(lk, "outbox_") || lk == MetadataPartitionKey:
		return fmt.Errorf("header %q is reserved: the relay sets outbox_* and %s itself", k, MetadataPartitionKey)
	case strings.HasPrefix(lk, "_watermill_") || strings.HasPrefix(lk, "nats-"):
		return fmt.Errorf("header %q is reserved by the broker client (_watermill_*, Nats-*); choose another name", k)
	}
	return nil
}
