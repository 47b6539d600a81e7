package outbox

// The WAL write path (PostgreSQL only): instead of an INSERT into the
// outbox table, the event is written into the write-ahead log as a
// transactional logical decoding message, pg_logical_emit_message(true,
// prefix, content), inside the caller's transaction. PostgreSQL decodes it
// for a logical replication slot only if the transaction commits, and in
// commit order; package runtime/walrelay streams it from there. See
// WALWriter.

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/outboxgen/outboxgen/runtime/internal/telemetry"
)

// WALPrefixBase starts the prefix of every logical decoding message the
// WAL write path emits; the outbox table's name follows (WALPrefix), so
// that several outboxes can share one database and one another's slots.
const WALPrefixBase = "outboxgen:"

// WALPrefix returns the logical decoding message prefix of the events of
// outbox table table: "outboxgen:" + table.
func WALPrefix(table string) string { return WALPrefixBase + table }

// walEnvelopeV1 and walEnvelopeV2 are the first byte of an envelope.
// Version 1 dates the event in microseconds since 1970-01-01, version 2
// (what this build writes) in microseconds since 2000-01-01, which is
// PostgreSQL's own binary timestamptz: timestamptz_send(now()) writes it
// without the numeric arithmetic of extract(epoch ...). The decoder reads
// both, so messages written by an older writer still in the WAL stream on.
const (
	walEnvelopeV1 = 1
	walEnvelopeV2 = 2
)

// pgEpochMicros is 2000-01-01T00:00:00Z, PostgreSQL's timestamp epoch, in
// microseconds since 1970-01-01.
const pgEpochMicros = 946684800 * 1000000

// walFixed is the size of what the SQL statement itself writes in front of
// the body the writer encodes: the version byte, the sequence (8 bytes)
// and the creation time (8 bytes).
const walFixed = 1 + 8 + 8

// MaxWALEnvelope caps the size, in bytes, of the content of one logical
// decoding message a decoder accepts by default: the largest event
// MaxMessageSize allows plus the envelope's own fields. A writer with a
// larger WithMaxMessageSize needs a relay with a matching limit.
const MaxWALEnvelope = MaxMessageSize + 64<<10

// emitWALSQL returns the statement of the WAL write path with message
// prefix prefix and the outbox table's identity sequence sequence, both
// literals of the statement, so that its only parameter is the body ($1)
// and the sequence's name is resolved once, when a connection prepares
// the statement (pgx caches it per connection; PostgreSQL replans it if
// the sequence is dropped and created again), not on every call. The
// sequence numbers the event exactly as an INSERT would, so outbox_seq
// means the same in both modes and a parked event keeps its id. The
// database clock dates the event (now(), the transaction's start, as the
// table's created_at default does). Both are made from the table's name,
// a safe identifier (dialect.CheckIdentifier: lower-case letters, digits
// and '_'), so the literals need no escaping. pg_get_serial_sequence is
// not used: it scans pg_depend on every call.
func emitWALSQL(prefix, sequence string) string {
	return `SELECT pg_logical_emit_message(true, '` + prefix + `', '\x02'::bytea` +
		` || int8send(nextval('` + sequence + `'::regclass))` +
		` || timestamptz_send(now()) || $1::bytea)`
}

// statement returns w's emitWALSQL, made once (a WALWriter may also be
// built by NewWriter's WithWAL, as a literal).
func (w *WALWriter) statement() string {
	if p := w.sql.Load(); p != nil {
		return *p
	}
	q := emitWALSQL(w.prefix, w.sequence)
	w.sql.Store(&q)
	return q
}

// WALEvent is one event as the WAL write path carries it: what an outbox
// row holds, plus its sequence (the row id it would have had).
type WALEvent struct {
	// Seq is the value of the outbox table's id sequence taken for the
	// event: its outbox_seq, and its row id if it is ever parked in the
	// table.
	Seq int64
	// CreatedAt is the database's now() in the writing transaction.
	CreatedAt time.Time
	// ID is the event id (UUIDv7, or the caller's WithEventID).
	ID EventID
	// Type, Key and Topic are biz_type, biz_id and topic.
	Type, Key, Topic string
	// Version is the payload version.
	Version int
	// Headers is the stored headers' JSON object, nil when there are none,
	// exactly as the table's headers column would hold it.
	Headers []byte
	// Payload is the stored payload, exactly as the table's payload column
	// would hold it (JSON; see HeaderPayloadEncoding).
	Payload []byte
}

// ErrMalformedWALMessage is matched by DecodeWALEvent's errors for
// content that no build can read: an envelope of a version this build
// knows (or of none) that breaks its format.
var ErrMalformedWALMessage = errors.New("malformed outbox WAL message")

// ErrWALMessageTooLarge and ErrWALEnvelopeVersion are matched by
// DecodeWALEvent's errors for content that may well be a valid event,
// just not one this decoder reads: larger than the caller's limit, or an
// envelope version newer than this build's. They do not match
// ErrMalformedWALMessage: a relay must not skip such a message (a
// committed event would be lost), but stop before it, so that a relay
// with a higher limit, or a newer one, reads it.
var (
	ErrWALMessageTooLarge = errors.New("outbox WAL message over the size limit")
	ErrWALEnvelopeVersion = errors.New("outbox WAL message of a newer envelope version")
)

// appendUvarintString appends s with its length in front.
func appendUvarintString(b []byte, s string) []byte {
	b = binary.AppendUvarint(b, uint64(len(s)))
	return append(b, s...)
}

// encodeWALBody encodes the part of the envelope the writer builds: event
// id (16 bytes), type, key and topic (each a uvarint length and the
// bytes), the version (uvarint), the headers JSON (uvarint length, 0 for
// none) and the payload (the rest).
func encodeWALBody(id EventID, typ, key, topic string, version int, headers, payload string) []byte {
	b := make([]byte, 0, 16+len(typ)+len(key)+len(topic)+len(headers)+len(payload)+16)
	b = append(b, id[:]...)
	b = appendUvarintString(b, typ)
	b = appendUvarintString(b, key)
	b = appendUvarintString(b, topic)
	b = binary.AppendUvarint(b, uint64(version))
	b = appendUvarintString(b, headers)
	return append(b, payload...)
}

// DecodeWALEvent decodes the content of a logical decoding message that the
// WAL write path emitted. It validates everything a relay relies on and
// refuses content over limit bytes (MaxWALEnvelope when limit <= 0). Its
// errors say what is wrong and match ErrWALMessageTooLarge (over limit),
// ErrWALEnvelopeVersion (a version newer than this build's) or else
// ErrMalformedWALMessage.
func DecodeWALEvent(content []byte, limit int) (WALEvent, error) {
	if limit <= 0 {
		limit = MaxWALEnvelope
	}
	bad := func(format string, args ...any) (WALEvent, error) {
		return WALEvent{}, fmt.Errorf("%w: %s", ErrMalformedWALMessage, fmt.Sprintf(format, args...))
	}
	if len(content) > limit {
		return WALEvent{}, fmt.Errorf("%w: %d bytes; the limit is %d", ErrWALMessageTooLarge, len(content), limit)
	}
	if len(content) == 0 {
		return bad("no content")
	}
	// The version before the length: the layout, and so the shortest
	// envelope, of a newer version is unknown here. Version 0 was never
	// written, and versions only grow: content starting with it is no
	// envelope of any build.
	if content[0] > walEnvelopeV2 {
		return WALEvent{}, fmt.Errorf("%w: envelope version %d; this build reads versions %d and %d: upgrade the relay", ErrWALEnvelopeVersion, content[0], walEnvelopeV1, walEnvelopeV2)
	}
	if content[0] != walEnvelopeV1 && content[0] != walEnvelopeV2 {
		return bad("envelope version %d: no build writes it", content[0])
	}
	if len(content) < walFixed+16 {
		return bad("%d bytes: too short for an envelope", len(content))
	}
	var ev WALEvent
	ev.Seq = int64(binary.BigEndian.Uint64(content[1:9]))
	if ev.Seq <= 0 {
		return bad("sequence %d is not positive", ev.Seq)
	}
	micros := int64(binary.BigEndian.Uint64(content[9:17]))
	if content[0] == walEnvelopeV2 {
		micros += pgEpochMicros
	}
	ev.CreatedAt = time.UnixMicro(micros).UTC()
	rest := content[walFixed:]
	copy(ev.ID[:], rest[:16])
	if ev.ID.IsZero() {
		return bad("the event id is zero")
	}
	rest = rest[16:]
	str := func(what string, max int) (string, error) {
		n, k := binary.Uvarint(rest)
		if k <= 0 || n > uint64(len(rest)-k) || n > uint64(max) {
			return "", fmt.Errorf("%w: event %s: bad length of %s", ErrMalformedWALMessage, ev.ID, what)
		}
		s := string(rest[k : k+int(n)])
		rest = rest[k+int(n):]
		return s, nil
	}
	var err error
	if ev.Type, err = str("the event type", 4*MaxTypeLen); err != nil {
		return WALEvent{}, err
	}
	if ev.Key, err = str("the key", 4*MaxKeyLen); err != nil {
		return WALEvent{}, err
	}
	if ev.Topic, err = str("the topic", 4*MaxTopicLen); err != nil {
		return WALEvent{}, err
	}
	for _, c := range []struct {
		what, v string
		max     int
		strict  bool
	}{{"the event type", ev.Type, MaxTypeLen, false}, {"the key", ev.Key, MaxKeyLen, false}, {"the topic", ev.Topic, MaxTopicLen, true}} {
		if err := CheckText(c.what, c.v, c.max, c.strict); err != nil {
			return bad("event %s: %v", ev.ID, err)
		}
	}
	v, k := binary.Uvarint(rest)
	if k <= 0 || v < 1 || v > 1<<31-1 {
		return bad("event %s: bad payload version", ev.ID)
	}
	ev.Version = int(v)
	rest = rest[k:]
	h, err := str("the headers", MaxHeadersSize*2+1024)
	if err != nil {
		return WALEvent{}, err
	}
	if h != "" {
		var m map[string]string
		if err := json.Unmarshal([]byte(h), &m); err != nil {
			return bad("event %s: the headers are not a JSON object of strings: %v", ev.ID, err)
		}
		if err := CheckHeaders(m); err != nil {
			return bad("event %s: %v", ev.ID, err)
		}
		ev.Headers = []byte(h)
	}
	if !utf8.Valid(rest) || !json.Valid(rest) {
		return bad("event %s: the payload is not valid JSON", ev.ID)
	}
	ev.Payload = rest
	return ev, nil
}

// WALWriter writes events into PostgreSQL's write-ahead log instead of the
// outbox table: each insert is one pg_logical_emit_message(true, ...) in
// the caller's transaction. The message is decoded for a logical
// replication slot only if that transaction commits, and in commit order,
// so the walrelay streaming relay publishes exactly the committed events,
// per key in commit order, and the table sees no INSERT, UPDATE, DELETE or
// vacuum for them (it holds only events the relay parks).
//
// Everything else is the Writer's: the same validation and limits (an
// invalid event fails before any SQL), the same headers (with trace
// context), and the same event id. WithEventID is accepted, but there is
// no table to find an earlier event with that id in: repeats are
// published again and consumers deduplicate them by id, as they do
// redeliveries.
//
// The database needs wal_level=logical; the writing role needs USAGE on
// the outbox table's id sequence (<table>_id_seq), which an INSERT into
// the identity column does not.
type WALWriter struct {
	w        *Writer
	prefix   string
	sequence string
	sql      atomic.Pointer[string] // emitWALSQL, made on first use
}

// walSequence returns the name PostgreSQL gives the identity sequence of
// column id of table: table_id_seq, the table part cut so that the name
// fits in 63 bytes (as CREATE TABLE names it; outboxgen's DDL never
// renames it).
func walSequence(table string) string {
	const suffix = "_id_seq"
	if len(table)+len(suffix) > 63 {
		table = table[:63-len(suffix)]
	}
	return table + suffix
}

// NewWALWriter returns the WAL write path of w, which must be a Postgres
// writer; its table names the outbox (the message prefix is
// WALPrefix(w.Table())), and its options (message size cap, trace
// propagator) apply.
func NewWALWriter(w *Writer) (*WALWriter, error) {
	if w == nil {
		return nil, ErrNilWriter
	}
	if w.dialect != Postgres {
		return nil, fmt.Errorf("outbox: the WAL write path needs PostgreSQL (logical decoding messages); the writer speaks %s: use the table outbox there", w.dialect)
	}
	return &WALWriter{w: w, prefix: WALPrefix(w.table), sequence: walSequence(w.table)}, nil
}

// WithWAL makes a PostgreSQL writer's Insert and InsertTx (and so every
// generated InsertX) write events into the WAL with pg_logical_emit_message
// instead of inserting them into the outbox table: see WALWriter, and run
// walrelay beside the polling relay. Writers of other dialects ignore it
// and keep the table, because only PostgreSQL has logical decoding
// messages; an option rather than an error, so that one events.yaml with
// sql.wal can list several dialects. Generated code passes it when
// events.yaml says sql.wal: true (Schema.WAL).
//
// Prepare and Exec stay table-only (see Prepare).
func WithWAL() WriterOption {
	return func(w *Writer) { w.walOn = true }
}

// WAL returns the WAL write path of a PostgreSQL writer made WithWAL, nil
// for a writer that inserts into the table.
func (w *Writer) WAL() *WALWriter {
	if w == nil {
		return nil
	}
	return w.wal
}

// Writer returns the table writer w wraps.
func (w *WALWriter) Writer() *Writer { return w.w }

// Prefix returns the logical decoding message prefix w emits.
func (w *WALWriter) Prefix() string { return w.prefix }

// Prepare validates ev (see Writer.Prepare) and returns the statement that
// emits it: SQL and arguments for tx.Exec. It stores no trace context.
func (w *WALWriter) Prepare(ev Event, opts ...InsertOption) (Statement, error) {
	return w.prepare(ev, nil, opts...)
}

func (w *WALWriter) prepare(ev Event, trace map[string]string, opts ...InsertOption) (Statement, error) {
	st, err := w.w.prepare(ev, trace, opts...)
	if err != nil {
		return Statement{}, err
	}
	// st.Args are InsertEventArgs: event id, type, key, topic, version,
	// payload, headers (a string or nil).
	headers, _ := st.Args[6].(string)
	body := encodeWALBody(st.ID, st.typ, st.key, st.topic, ev.Version, headers, st.Args[5].(string))
	return Statement{
		ID:   st.ID,
		SQL:  w.statement(),
		Args: []any{body},
		typ:  st.typ, key: st.key, topic: st.topic,
	}, nil
}

// Insert writes ev into the WAL inside tx (a database/sql transaction) and
// returns its event id.
func (w *WALWriter) Insert(ctx context.Context, tx Execer, ev Event, opts ...InsertOption) (EventID, error) {
	return w.InsertTx(ctx, StdTx(tx), ev, opts...)
}

// InsertTx is Insert through any Tx (pgxoutbox.Tx adapts a pgx.Tx). A
// failed statement aborts a PostgreSQL transaction, as a failed INSERT
// does; an invalid event fails before any SQL and leaves tx usable.
func (w *WALWriter) InsertTx(ctx context.Context, tx Tx, ev Event, opts ...InsertOption) (EventID, error) {
	if w == nil || w.w == nil {
		return EventID{}, ErrNilWriter
	}
	st, err := w.prepare(ev, telemetry.Headers(ctx, w.w.propagator), opts...)
	if err != nil {
		return EventID{}, err
	}
	if _, err := tx.Exec(ctx, st.SQL, st.Args...); err != nil {
		return EventID{}, fmt.Errorf("outbox: emit %s into the WAL (outbox %s): %w", st.typ, w.w.table, err)
	}
	written(ctx, st)
	return st.ID, nil
}
