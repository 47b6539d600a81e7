package outbox

import (
	"encoding/binary"
	"errors"
	"strings"
	"testing"
	"time"
)

// envelope builds message content as the WAL write path's SQL does: the
// version byte, the sequence and the creation time (version 1: µs since
// 1970; version 2, what the writer emits: µs since 2000, PostgreSQL's
// binary timestamptz), then the body.
func envelope(version byte, seq int64, created time.Time, body []byte) []byte {
	b := []byte{version}
	b = binary.BigEndian.AppendUint64(b, uint64(seq))
	us := created.UnixMicro()
	if version == walEnvelopeV2 {
		us -= pgEpochMicros
	}
	b = binary.BigEndian.AppendUint64(b, uint64(us))
	return append(b, body...)
}

func TestDecodeWALEventRoundTrip(t *testing.T) {
	w, err := NewWALWriter(MustNewWriter(Postgres, "outbox_event"))
	if err != nil {
		t.Fatal(err)
	}
	id := NewEventID()
	st, err := w.Prepare(Event{Type: "ORDER_PAID", Topic: "orders", Key: "o-1", Version: 3, Payload: map[string]int{"n": 1}},
		WithEventID(id), WithHeader("tenant", "t-1"))
	if err != nil {
		t.Fatal(err)
	}
	// One parameter, the body; prefix and sequence are literals, so that
	// the sequence is resolved when the statement is prepared.
	if st.ID != id || len(st.Args) != 1 || !strings.Contains(st.SQL, "pg_logical_emit_message(true, 'outboxgen:outbox_event', '\\x02'::bytea") ||
		!strings.Contains(st.SQL, "nextval('outbox_event_id_seq'::regclass)") || !strings.Contains(st.SQL, "timestamptz_send(now())") {
		t.Fatalf("statement %+v", st)
	}
	if st2, _ := w.Prepare(Event{Type: "T", Topic: "t", Key: "k", Version: 1, Payload: 1}); st2.SQL != st.SQL {
		t.Fatalf("the statement text changed between calls: %q, %q", st.SQL, st2.SQL)
	}
	created := time.Date(2026, 1, 2, 3, 4, 5, 6000, time.UTC)
	for _, version := range []byte{walEnvelopeV1, walEnvelopeV2} {
		ev, err := DecodeWALEvent(envelope(version, 42, created, st.Args[0].([]byte)), 0)
		if err != nil {
			t.Fatal(err)
		}
		if ev.Seq != 42 || !ev.CreatedAt.Equal(created) || ev.ID != id || ev.Type != "ORDER_PAID" || ev.Key != "o-1" || ev.Topic != "orders" ||
			ev.Version != 3 || string(ev.Payload) != `{"n":1}` || string(ev.Headers) != `{"tenant":"t-1"}` {
			t.Fatalf("version %d: decoded %+v", version, ev)
		}
	}
	// No headers: nil, as the table's NULL.
	st, err = w.Prepare(Event{Type: "T", Topic: "t", Key: "k", Version: 1, Payload: 1})
	if err != nil {
		t.Fatal(err)
	}
	ev, err := DecodeWALEvent(envelope(2, 1, created, st.Args[0].([]byte)), 0)
	if err != nil || ev.Headers != nil {
		t.Fatalf("decoded %+v, %v: want no headers", ev, err)
	}
}

func TestWALSequenceName(t *testing.T) {
	long := strings.Repeat("t", 63)
	if got := walSequence(long); len(got) != 63 || !strings.HasSuffix(got, "_id_seq") {
		t.Errorf("walSequence(63 bytes) = %q", got)
	}
}

func TestNewWALWriterRefusesOtherDialects(t *testing.T) {
	if _, err := NewWALWriter(MustNewWriter(MySQL, "outbox_event")); err == nil {
		t.Fatal("a MySQL writer got a WAL write path")
	}
	if _, err := NewWALWriter(nil); !errors.Is(err, ErrNilWriter) {
		t.Fatalf("nil writer: %v", err)
	}
}

func TestDecodeWALEventRefusesMalformed(t *testing.T) {
	created := time.Now()
	good := encodeWALBody(NewEventID(), "T", "k", "topic", 1, "", `{"a":1}`)
	cases := map[string][]byte{
		"empty":            nil,
		"short":            []byte("\x02garbage"),
		"envelope v0":      envelope(0, 1, created, good),
		"sequence 0":       envelope(1, 0, created, good),
		"zero event id":    envelope(1, 1, created, encodeWALBody(EventID{}, "T", "k", "topic", 1, "", `{}`)),
		"truncated":        envelope(1, 1, created, good[:20]),
		"empty key":        envelope(1, 1, created, encodeWALBody(NewEventID(), "T", "", "topic", 1, "", `{}`)),
		"topic space":      envelope(1, 1, created, encodeWALBody(NewEventID(), "T", "k", "a b", 1, "", `{}`)),
		"version 0":        envelope(1, 1, created, encodeWALBody(NewEventID(), "T", "k", "topic", 0, "", `{}`)),
		"headers not map":  envelope(1, 1, created, encodeWALBody(NewEventID(), "T", "k", "topic", 1, `[1]`, `{}`)),
		"bad header":       envelope(1, 1, created, encodeWALBody(NewEventID(), "T", "k", "topic", 1, `{"a b":"x"}`, `{}`)),
		"payload not json": envelope(1, 1, created, encodeWALBody(NewEventID(), "T", "k", "topic", 1, "", `{`)),
		"key over limit":   envelope(1, 1, created, encodeWALBody(NewEventID(), "T", strings.Repeat("k", MaxKeyLen+1), "topic", 1, "", `{}`)),
	}
	for name, c := range cases {
		_, err := DecodeWALEvent(c, 0)
		if !errors.Is(err, ErrMalformedWALMessage) {
			t.Errorf("%s: err %v, want ErrMalformedWALMessage", name, err)
		}
		if errors.Is(err, ErrWALMessageTooLarge) || errors.Is(err, ErrWALEnvelopeVersion) {
			t.Errorf("%s: err %v matches an unreadable-but-valid error", name, err)
		}
	}
}

// TestDecodeWALEventUnreadableIsNotMalformed: content over the limit, or
// of a newer envelope version, may be a valid event that another relay
// reads: its errors say so, and do not match ErrMalformedWALMessage (a
// relay skips malformed messages; it must not skip these).
func TestDecodeWALEventUnreadableIsNotMalformed(t *testing.T) {
	created := time.Now()
	good := encodeWALBody(NewEventID(), "T", "k", "topic", 1, "", `{"a":1}`)
	cases := []struct {
		name    string
		content []byte
		limit   int
		is      error
		says    string
	}{
		{"over the limit", envelope(2, 1, created, good), 20, ErrWALMessageTooLarge, "the limit is 20"},
		{"version 3", envelope(3, 1, created, good), 0, ErrWALEnvelopeVersion, "upgrade the relay"},
		// A newer version's layout is unknown: no length is too short.
		{"version 3, short", []byte{3}, 0, ErrWALEnvelopeVersion, "envelope version 3"},
	}
	for _, c := range cases {
		_, err := DecodeWALEvent(c.content, c.limit)
		if !errors.Is(err, c.is) || errors.Is(err, ErrMalformedWALMessage) || !strings.Contains(err.Error(), c.says) {
			t.Errorf("%s: err %v; want %v, not ErrMalformedWALMessage, saying %q", c.name, err, c.is, c.says)
		}
	}
}

// WithWAL routes Insert and InsertTx of a PostgreSQL writer to the WAL
// statement (the generated InsertX and pgxoutbox.Insert come through
// InsertTx), leaves other dialects on the table, and leaves Prepare on the
// table; Schema.WAL applies it in NewWriter, WriterFor and NewBinding.
func TestWithWALRoutesInserts(t *testing.T) {
	ctx := t.Context()
	ev := Event{Type: "ORDER_PAID", Topic: "orders", Key: "o-1", Version: 1, Payload: 1}
	emits := func(w *Writer, insert func(*Writer, *fakeTx) error) bool {
		t.Helper()
		tx := &fakeTx{}
		if err := insert(w, tx); err != nil {
			t.Fatal(err)
		}
		if len(tx.queries) != 1 {
			t.Fatalf("queries %q, want one", tx.queries)
		}
		return strings.Contains(tx.queries[0], "pg_logical_emit_message")
	}
	viaInsertTx := func(w *Writer, tx *fakeTx) error { _, err := w.InsertTx(ctx, tx, ev); return err }
	pg := MustNewWriter(Postgres, "outbox_event", WithWAL(), WithMaxMessageSize(1<<10))
	if pg.WAL() == nil || !emits(pg, viaInsertTx) {
		t.Fatal("a Postgres writer WithWAL inserted into the table")
	}
	if _, err := pg.InsertTx(ctx, &fakeTx{}, Event{Type: "T", Topic: "t", Key: "k", Version: 1, Payload: strings.Repeat("x", 2<<10)}); !errors.Is(err, ErrInvalidEvent) {
		t.Fatalf("the WAL path ignored WithMaxMessageSize given after WithWAL: %v", err)
	}
	if st, err := pg.Prepare(ev); err != nil || strings.Contains(st.SQL, "pg_logical_emit_message") {
		t.Fatalf("Prepare of a WAL writer: %q, %v; want the table INSERT", st.SQL, err)
	}
	if my := MustNewWriter(MySQL, "outbox_event", WithWAL()); my.WAL() != nil || emits(my, viaInsertTx) {
		t.Fatal("a MySQL writer WithWAL did not keep the table")
	}
	if emits(MustNewWriter(Postgres, "outbox_event"), viaInsertTx) {
		t.Fatal("a Postgres writer without WithWAL wrote into the WAL")
	}

	s := Schema{Tables: Tables{Outbox: "outbox_event", Inbox: "outbox_inbox"}, Dialects: []Dialect{Postgres, SQLite}, WAL: true}
	w, err := s.NewWriter(Postgres)
	if err != nil || w.WAL() == nil {
		t.Fatalf("Schema{WAL}.NewWriter(Postgres) = %v, %v; want a WAL writer", w, err)
	}
	if w, _ := s.NewWriter(SQLite); w.WAL() != nil {
		t.Fatal("Schema{WAL}.NewWriter(SQLite) got a WAL path")
	}
	one, _ := s.Only(Postgres)
	if bw, err := NewBinding(one).Writer(); err != nil || bw.WAL() == nil {
		t.Fatalf("NewBinding(Schema{WAL}) = %v, %v; want a WAL writer", bw, err)
	}
	b := NewBinding(s)
	if err := b.Bind(MustNewWriter(Postgres, "outbox_event")); err == nil || !strings.Contains(err.Error(), "sql.wal") {
		t.Fatalf("bound a table writer to a WAL schema: %v", err)
	}
	if err := b.Bind(w); err != nil {
		t.Fatal(err)
	}
	s.WAL = false
	if err := NewBinding(s).Bind(w); err == nil || !strings.Contains(err.Error(), "sql.wal") {
		t.Fatalf("bound a WAL writer to a table schema: %v", err)
	}
}
