package outbox

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/google/uuid"
)

func TestPrepare(t *testing.T) {
	w := MustNewWriter(Postgres, "outbox_event")
	ev := Event{Type: "ORDER_PAID", Topic: "orders.paid", Key: "o-1", Version: 2, Payload: map[string]int{"a": 1}}
	st, err := w.Prepare(ev, WithHeader("trace", "t1"))
	if err != nil {
		t.Fatal(err)
	}
	if uuid.UUID(st.ID).Version() != 7 {
		t.Fatalf("id %s is not a UUIDv7", st.ID)
	}
	want := []any{st.ID.String(), "ORDER_PAID", "o-1", "orders.paid", 2, `{"a":1}`, `{"trace":"t1"}`}
	if len(st.Args) != len(want) {
		t.Fatalf("args = %v", st.Args)
	}
	for i := range want {
		if st.Args[i] != want[i] {
			t.Fatalf("arg %d = %#v, want %#v", i, st.Args[i], want[i])
		}
	}
	if strings.Contains(st.SQL, "ON CONFLICT") {
		t.Fatalf("a fresh id must not use the idempotent insert: %s", st.SQL)
	}

	id := NewEventID()
	st, err = w.Prepare(ev, WithEventID(id))
	if err != nil || st.ID != id || !strings.HasSuffix(st.SQL, "ON CONFLICT (event_id) DO NOTHING") || st.Args[6] != nil {
		t.Fatalf("caller-chosen id: %v %+v", err, st)
	}
}

func TestPrepareRefuses(t *testing.T) {
	w := MustNewWriter(MySQL, "outbox_event")
	ok := Event{Type: "T", Topic: "t", Key: "k", Version: 1, Payload: 1}
	cases := []struct {
		name string
		ev   Event
		opts []InsertOption
		want string
	}{
		{"empty key", Event{Type: "T", Topic: "t", Version: 1}, nil, "key"},
		{"no topic", Event{Type: "T", Key: "k", Version: 1}, nil, "topic"},
		{"unmarshalable", Event{Type: "T", Topic: "t", Key: "k", Version: 1, Payload: make(chan int)}, nil, "marshal"},
		{"relay key header", ok, []InsertOption{WithHeader("outbox_seq", "1")}, "reserved"},
		{"partition key header", ok, []InsertOption{WithHeader("Partition_Key", "x")}, "reserved"},
		{"watermill header", ok, []InsertOption{WithHeader("_watermill_message_uuid", "x")}, "broker"},
		{"nats header", ok, []InsertOption{WithHeader("Nats-Expected-Stream", "x")}, "broker"},
		{"empty header", ok, []InsertOption{WithHeader("", "x")}, "empty"},
	}
	for _, c := range cases {
		_, err := w.Prepare(c.ev, c.opts...)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: err = %v, want one mentioning %q", c.name, err, c.want)
		}
	}
	_, err := w.Prepare(ok, WithHeader("outbox_type", "X"))
	if !errors.Is(err, ErrInvalidEvent) {
		t.Errorf("reserved header error %v does not match ErrInvalidEvent", err)
	}
}

func TestNewWriterRefuses(t *testing.T) {
	if _, err := NewWriter("oracle", "outbox_event"); err == nil {
		t.Error("unknown dialect accepted")
	}
	if _, err := NewWriter(SQLite, "outbox; DROP TABLE x"); err == nil || !strings.Contains(err.Error(), "identifier") {
		t.Errorf("unsafe table name: %v", err)
	}
}

func TestParseMeta(t *testing.T) {
	md := map[string]string{
		MetadataEventID: "e1", MetadataType: "ORDER_PAID", MetadataKey: "o-1", MetadataVersion: "3",
		MetadataSequence: "42", MetadataCreatedAt: "2026-11-29T09:00:00.123456Z", "trace": "t",
	}
	m, err := ParseMeta(md, "fallback")
	if err != nil {
		t.Fatal(err)
	}
	if m.EventID != "e1" || m.Type != "ORDER_PAID" || m.Key != "o-1" || m.Version != 3 || m.Sequence != 42 ||
		m.CreatedAt.Nanosecond() != 123456000 || m.Headers["trace"] != "t" {
		t.Fatalf("meta = %+v", m)
	}
	delete(md, MetadataEventID)
	if m, _ := ParseMeta(md, "fallback"); m.EventID != "fallback" {
		t.Fatalf("fallback id not used: %+v", m)
	}
	for _, bad := range []map[string]string{
		{MetadataVersion: "1"},
		{MetadataType: "T", MetadataVersion: "x"},
		{MetadataType: "T", MetadataVersion: "0"},
		{MetadataType: "T", MetadataVersion: "1", MetadataSequence: "x"},
		{MetadataType: "T", MetadataVersion: "1", MetadataCreatedAt: "yesterday"},
	} {
		if _, err := ParseMeta(bad, "id"); err == nil {
			t.Errorf("ParseMeta(%v) accepted", bad)
		}
	}
}

func TestDecodePayload(t *testing.T) {
	var v struct{ A int }
	if err := DecodePayload("T", []byte(`{"A":1}`), 2, 2, &v); err != nil || v.A != 1 {
		t.Fatalf("decode: %v %+v", err, v)
	}
	for _, c := range []struct {
		payload          string
		version, current int
	}{{`{"A":1}`, 3, 2}, {`{"A":1}`, 0, 2}, {`{`, 1, 1}, {`{"A":"x"}`, 1, 1}} {
		err := DecodePayload("T", []byte(c.payload), c.version, c.current, &v)
		if !errors.Is(err, ErrUndecodable) {
			t.Errorf("DecodePayload(%s, v%d, current %d) = %v, want ErrUndecodable", c.payload, c.version, c.current, err)
		}
	}
}

func TestWithinField(t *testing.T) {
	inner := Invalid("Address", "country", "unknown")
	err := WithinField(inner, "ORDER_PAID", "items[2]")
	var ie *InvalidEventError
	if !errors.As(err, &ie) || ie.Type != "ORDER_PAID" || ie.Field != "items[2].country" {
		t.Fatalf("WithinField = %v", err)
	}
	if got := WithinField(Invalid("A", "[3]", "x"), "E", "tags"); got.(*InvalidEventError).Field != "tags[3]" {
		t.Fatalf("index path: %v", got)
	}
	other := errors.New("other")
	if WithinField(other, "E", "f") != other {
		t.Fatal("non-validation errors must pass through")
	}
}

// Values longer than the outbox table's columns are refused before any SQL
// runs (on PostgreSQL a failing INSERT would abort the transaction);
// lengths count characters, as the DDL sizes do.
func TestPrepareRefusesOverlongValues(t *testing.T) {
	w := MustNewWriter(Postgres, "outbox_event")
	ok := Event{Type: "T", Topic: "t", Key: "k", Version: 1, Payload: 1}
	long := func(n int) string { return strings.Repeat("é", n) } // 2 bytes a character
	cases := []struct {
		name   string
		ev     func(Event) Event
		refuse bool
		want   string
	}{
		{"type at limit", func(e Event) Event { e.Type = long(MaxTypeLen); return e }, false, ""},
		{"type too long", func(e Event) Event { e.Type = long(MaxTypeLen + 1); return e }, true, "event type (biz_type) is 65 characters long; the outbox table holds at most 64"},
		{"key at limit", func(e Event) Event { e.Key = long(MaxKeyLen); return e }, false, ""},
		{"key too long", func(e Event) Event { e.Key = long(MaxKeyLen + 1); return e }, true, "key (biz_id) is 129 characters long; the outbox table holds at most 128"},
		{"topic at limit", func(e Event) Event { e.Topic = long(MaxTopicLen); return e }, false, ""},
		{"topic too long", func(e Event) Event { e.Topic = long(MaxTopicLen + 1); return e }, true, "topic is 256 characters long; the outbox table holds at most 255"},
	}
	for _, c := range cases {
		_, err := w.Prepare(c.ev(ok))
		if !c.refuse {
			if err != nil {
				t.Errorf("%s: %v", c.name, err)
			}
			continue
		}
		if !errors.Is(err, ErrInvalidEvent) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: err = %v, want ErrInvalidEvent saying %q", c.name, err, c.want)
		}
	}
}

// fakeTx is a Tx whose INSERT changes no row (the event id is taken) and
// whose lookup returns row, recording the queries it was asked.
type fakeTx struct {
	row     *[3]string
	queries []string
}

func (f *fakeTx) Exec(_ context.Context, query string, _ ...any) (int64, error) {
	f.queries = append(f.queries, query)
	return 0, nil
}

func (f *fakeTx) QueryRow(_ context.Context, query string, _ []any, dest ...any) (bool, error) {
	f.queries = append(f.queries, query)
	if f.row == nil {
		return false, nil
	}
	for i, d := range dest {
		*d.(*string) = f.row[i]
	}
	return true, nil
}

// With a caller-chosen id a skipped insert is followed by a lookup that
// tells a repeat (same type, key and topic) from a clash; a fresh id never
// looks anything up.
func TestExecCallerChosenID(t *testing.T) {
	ctx := context.Background()
	w := MustNewWriter(SQLite, "outbox_event")
	ev := Event{Type: "ORDER_PAID", Topic: "orders", Key: "o-1", Version: 1, Payload: 1}
	st, err := w.Prepare(ev)
	if err != nil {
		t.Fatal(err)
	}
	fresh := &fakeTx{}
	if err := w.Exec(ctx, fresh, st); err != nil || len(fresh.queries) != 1 {
		t.Fatalf("fresh id: err %v, queries %q; want the INSERT only", err, fresh.queries)
	}
	id := NewEventID()
	st, err = w.Prepare(ev, WithEventID(id))
	if err != nil {
		t.Fatal(err)
	}
	same := &fakeTx{row: &[3]string{"ORDER_PAID", "o-1", "orders"}}
	if err := w.Exec(ctx, same, st); err != nil {
		t.Fatalf("same event: %v", err)
	}
	if want := "SELECT biz_type, biz_id, topic FROM outbox_event WHERE event_id = ?"; len(same.queries) != 2 || same.queries[1] != want {
		t.Fatalf("queries = %q, want the INSERT and %q", same.queries, want)
	}
	for _, other := range [][3]string{
		{"STOCK_RESERVED", "o-1", "orders"},
		{"ORDER_PAID", "o-2", "orders"},
		{"ORDER_PAID", "o-1", "payments"},
	} {
		err := w.Exec(ctx, &fakeTx{row: &other}, st)
		var de *DuplicateEventIDError
		if !errors.Is(err, ErrDuplicateEventID) || !errors.As(err, &de) || de.HasType != other[0] || !strings.Contains(err.Error(), id.String()) {
			t.Errorf("existing %v: err = %v, want ErrDuplicateEventID naming %s", other, err, id)
		}
		if errors.Is(err, ErrInvalidEvent) {
			t.Errorf("existing %v: a duplicate id is not an invalid event", other)
		}
	}
	if err := w.Exec(ctx, &fakeTx{}, st); err == nil || !strings.Contains(err.Error(), "retry the transaction") {
		t.Fatalf("row gone between insert and lookup: err = %v", err)
	}
}
