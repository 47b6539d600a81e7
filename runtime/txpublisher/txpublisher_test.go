package txpublisher_test

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/outboxgen/outboxgen/internal/testdb"
	"github.com/outboxgen/outboxgen/runtime/dialect"
	"github.com/outboxgen/outboxgen/runtime/outbox"
	"github.com/outboxgen/outboxgen/runtime/txpublisher"
	"github.com/outboxgen/outboxgen/templates"
)

const table = "outbox_event"

// forEachDialect runs f as a parallel subtest per dialect on a fresh
// database with the outbox schema applied.
func forEachDialect(t *testing.T, f func(t *testing.T, db *sql.DB, w *outbox.Writer)) {
	t.Helper()
	for _, name := range testdb.Dialects() {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			db := testdb.Open(t, name)
			testdb.ApplySchema(t, db, name, templates.DefaultTables)
			d, err := dialect.Parse(name)
			if err != nil {
				t.Fatal(err)
			}
			f(t, db, outbox.MustNewWriter(d, table))
		})
	}
}

// stored is one outbox row as the test reads it back.
type stored struct {
	EventID string
	Type    string
	Key     string
	Topic   string
	Version int
	Payload string
	Headers map[string]string // nil when the column is NULL
	Status  int
}

func rows(t *testing.T, db *sql.DB) []stored {
	t.Helper()
	rs, err := db.QueryContext(context.Background(),
		"SELECT event_id, biz_type, biz_id, topic, payload_version, payload, headers, status FROM "+table+" ORDER BY id")
	if err != nil {
		t.Fatal(err)
	}
	defer rs.Close()
	var out []stored
	for rs.Next() {
		var s stored
		var id outbox.EventID
		var payload []byte
		var headers sql.NullString
		if err := rs.Scan(&id, &s.Type, &s.Key, &s.Topic, &s.Version, &payload, &headers, &s.Status); err != nil {
			t.Fatal(err)
		}
		s.EventID = id.String()
		s.Payload = string(payload)
		if headers.Valid {
			if err := json.Unmarshal([]byte(headers.String), &s.Headers); err != nil {
				t.Fatalf("headers %q: %v", headers.String, err)
			}
		}
		out = append(out, s)
	}
	if err := rs.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

func begin(t *testing.T, db *sql.DB) *sql.Tx {
	t.Helper()
	tx, err := db.BeginTx(context.Background(), nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = tx.Rollback() })
	return tx
}

func msg(payload string, md ...string) *message.Message {
	m := message.NewMessage(watermill.NewUUID(), []byte(payload))
	for i := 0; i+1 < len(md); i += 2 {
		m.Metadata.Set(md[i], md[i+1])
	}
	return m
}

// sameJSON compares JSON texts by value (MySQL normalises spacing).
func sameJSON(t *testing.T, got, want string) {
	t.Helper()
	var g, w any
	if err := json.Unmarshal([]byte(got), &g); err != nil {
		t.Fatalf("stored payload %q: %v", got, err)
	}
	if err := json.Unmarshal([]byte(want), &w); err != nil {
		t.Fatal(err)
	}
	gb, _ := json.Marshal(g)
	wb, _ := json.Marshal(w)
	if string(gb) != string(wb) {
		t.Errorf("payload = %s, want %s", got, want)
	}
}

func TestPublishCommitWritesRows(t *testing.T) {
	forEachDialect(t, func(t *testing.T, db *sql.DB, w *outbox.Writer) {
		tx := begin(t, db)
		pub := txpublisher.New(tx, w, txpublisher.Config{})
		msgs := []*message.Message{
			msg(`{"n": 1}`, "partition_key", "order-1", "trace_id", "abc"),
			msg(`{"n": 2}`, "partition_key", "order-1", "outbox_type", "ORDER_PAID", "outbox_version", "3"),
			msg(`[1, 2, 3]`), // unkeyed, no metadata
			msg(`"text"`, "outbox_created_at", "2020-01-01"), // relay-set key: not stored
		}
		if err := pub.Publish("orders", msgs...); err != nil {
			t.Fatal(err)
		}
		if err := pub.Publish("payments", msg(`{}`, "partition_key", "order-1", "tenant", "t-9")); err != nil {
			t.Fatal(err)
		}
		if err := pub.Close(); err != nil {
			t.Fatal(err)
		}
		if err := tx.Commit(); err != nil {
			t.Fatal(err)
		}

		got := rows(t, db)
		if len(got) != 5 {
			t.Fatalf("%d rows, want 5: %+v", len(got), got)
		}
		want := []stored{
			{EventID: msgs[0].UUID, Type: "orders", Key: "order-1", Topic: "orders", Version: 1, Payload: `{"n": 1}`, Headers: map[string]string{"trace_id": "abc"}},
			{EventID: msgs[1].UUID, Type: "ORDER_PAID", Key: "order-1", Topic: "orders", Version: 3, Payload: `{"n": 2}`},
			{EventID: msgs[2].UUID, Type: "orders", Key: msgs[2].UUID, Topic: "orders", Version: 1, Payload: `[1, 2, 3]`},
			{EventID: msgs[3].UUID, Type: "orders", Key: msgs[3].UUID, Topic: "orders", Version: 1, Payload: `"text"`},
			{Type: "payments", Key: "order-1", Topic: "payments", Version: 1, Payload: `{}`, Headers: map[string]string{"tenant": "t-9"}},
		}
		for i, g := range got {
			wnt := want[i]
			if wnt.EventID == "" {
				wnt.EventID = g.EventID
			}
			sameJSON(t, g.Payload, wnt.Payload)
			if w.Dialect() != outbox.MySQL && g.Payload != wnt.Payload {
				t.Errorf("row %d: payload %q, want the exact bytes %q", i, g.Payload, wnt.Payload)
			}
			g.Payload, wnt.Payload = "", ""
			if fmt.Sprint(g) != fmt.Sprint(wnt) {
				t.Errorf("row %d:\n got %+v\nwant %+v", i, g, wnt)
			}
		}
	})
}

func TestPublishRollbackWritesNothing(t *testing.T) {
	forEachDialect(t, func(t *testing.T, db *sql.DB, w *outbox.Writer) {
		tx := begin(t, db)
		pub := txpublisher.New(tx, w, txpublisher.Config{})
		for i := range 3 {
			if err := pub.Publish("orders", msg(fmt.Sprintf(`{"i": %d}`, i))); err != nil {
				t.Fatal(err)
			}
		}
		if err := tx.Rollback(); err != nil {
			t.Fatal(err)
		}
		if got := rows(t, db); len(got) != 0 {
			t.Fatalf("%d rows after rollback, want 0", len(got))
		}
	})
}

// TestRefusedMessagesRunNoSQL checks that every refused message leaves the
// transaction usable (on PostgreSQL a failed statement would abort it and
// the commit would write nothing) and writes no message of its call.
func TestRefusedMessagesRunNoSQL(t *testing.T) {
	withID := func(id, payload string) *message.Message { return message.NewMessage(id, []byte(payload)) }
	cases := []struct {
		name string
		msg  *message.Message
		want error
		text string // in the error message
	}{
		{"ulid id", withID(watermill.NewULID(), `{}`), txpublisher.ErrInvalidMessageID, "DerivedEventIDs: true"},
		{"short uuid", withID(watermill.NewShortUUID(), `{}`), txpublisher.ErrInvalidMessageID, "is not a UUID"},
		{"empty id", withID("", `{}`), txpublisher.ErrInvalidMessageID, "is empty"},
		{"nil uuid", withID("00000000-0000-0000-0000-000000000000", `{}`), txpublisher.ErrInvalidMessageID, "nil UUID"},
		{"binary payload", msg("\x08\x96\x01"), txpublisher.ErrPayloadNotJSON, "BinaryPayloads: true"},
		{"plain text payload", msg("hello"), txpublisher.ErrPayloadNotJSON, "not valid JSON"},
		{"empty payload", msg(""), txpublisher.ErrPayloadNotJSON, "it is empty"},
		{"invalid utf-8 in JSON", msg("\"\xff\""), txpublisher.ErrPayloadNotJSON, "UTF-8"},
		{"key too long", msg(`{}`, "partition_key", strings.Repeat("k", 129)), txpublisher.ErrInvalidMessage, "129 characters"},
		{"type too long", msg(`{}`, "outbox_type", strings.Repeat("é", 65)), txpublisher.ErrInvalidMessage, "65 characters"},
		{"bad version", msg(`{}`, "outbox_version", "two"), txpublisher.ErrInvalidMessage, "not a positive integer"},
		{"zero version", msg(`{}`, "outbox_version", "0"), txpublisher.ErrInvalidMessage, "not a positive integer"},
		{"metadata not utf-8", msg(`{}`, "x", "\xff"), txpublisher.ErrInvalidMessage, "UTF-8"},
		{"reserved header", msg(`{}`, txpublisher.HeaderPayloadEncoding, "base64"), txpublisher.ErrInvalidMessage, "reserved"},
		// What no database stores or no broker carries (issue 8).
		{"NUL in key", msg(`{}`, "partition_key", "k\x00z"), txpublisher.ErrInvalidMessage, `key (biz_id, metadata "partition_key") holds '\x00'`},
		{"leading space in key", msg(`{}`, "partition_key", " k"), txpublisher.ErrInvalidMessage, "starts with a space or tab"},
		{"leading tab in metadata value", msg(`{}`, "tenant", "\tx"), txpublisher.ErrInvalidMessage, "starts with a space or tab"},
		{"LF in type", msg(`{}`, "outbox_type", "T\nX"), txpublisher.ErrInvalidMessage, `type (biz_type, metadata "outbox_type" or the topic) holds '\n'`},
		{"space in metadata name", msg(`{}`, "trace id", "x"), txpublisher.ErrInvalidMessage, `header name "trace id" holds " "`},
		{"colon in metadata name", msg(`{}`, "a:b", "x"), txpublisher.ErrInvalidMessage, `header name "a:b" holds ":"`},
		{"CRLF in metadata value", msg(`{}`, "tenant", "a\r\nb"), txpublisher.ErrInvalidMessage, `header "tenant": the value holds "\r"`},
		{"NUL in metadata value", msg(`{}`, "tenant", "a\x00b"), txpublisher.ErrInvalidMessage, `header "tenant": the value holds "\x00"`},
		{"1 MB metadata value", msg(`{}`, "blob", strings.Repeat("x", 1<<20)), txpublisher.ErrInvalidMessage, "MaxHeadersSize"},
		{"payload over the message size limit", msg(`"` + strings.Repeat("x", outbox.MaxMessageSize) + `"`), txpublisher.ErrInvalidMessage, "message size limit"},
		{"nil message", nil, txpublisher.ErrInvalidMessage, "nil message"},
	}
	forEachDialect(t, func(t *testing.T, db *sql.DB, w *outbox.Writer) {
		tx := begin(t, db)
		pub := txpublisher.New(tx, w, txpublisher.Config{})
		first := msg(`{"ok": 1}`)
		if err := pub.Publish("orders", first); err != nil {
			t.Fatal(err)
		}
		for _, c := range cases {
			// The bad message second: the good one before it must not be
			// written either.
			err := pub.Publish("orders", msg(`{"ok": "not written"}`), c.msg)
			if !errors.Is(err, c.want) {
				t.Errorf("%s: err = %v, want %v", c.name, err, c.want)
				continue
			}
			if !strings.Contains(err.Error(), c.text) || !strings.Contains(err.Error(), "message 2 of 2") {
				t.Errorf("%s: error %q does not say %q and which message", c.name, err, c.text)
			}
		}
		for _, topic := range []string{"", strings.Repeat("t", 256)} {
			if err := pub.Publish(topic, msg(`{}`)); !errors.Is(err, txpublisher.ErrInvalidMessage) {
				t.Errorf("topic of %d characters: err = %v, want ErrInvalidMessage", len(topic), err)
			}
		}
		// Topic too long to be the type (> 64) with no type metadata.
		if err := pub.Publish(strings.Repeat("t", 65), msg(`{}`)); !errors.Is(err, txpublisher.ErrInvalidMessage) || !strings.Contains(err.Error(), "biz_type") {
			t.Errorf("65-character topic as type: err = %v, want ErrInvalidMessage about biz_type", err)
		}
		last := msg(`{"ok": 2}`)
		if err := pub.Publish("orders", last); err != nil {
			t.Fatalf("transaction unusable after refused messages: %v", err)
		}
		if err := tx.Commit(); err != nil {
			t.Fatal(err)
		}
		got := rows(t, db)
		if len(got) != 2 || got[0].EventID != first.UUID || got[1].EventID != last.UUID {
			t.Fatalf("rows = %+v, want only the two good messages", got)
		}
	})
}

func TestSameMessageTwiceIsOneRow(t *testing.T) {
	forEachDialect(t, func(t *testing.T, db *sql.DB, w *outbox.Writer) {
		m := msg(`{"v": 1}`, "partition_key", "k")
		tx := begin(t, db)
		pub := txpublisher.New(tx, w, txpublisher.Config{})
		if err := pub.Publish("orders", m, m); err != nil {
			t.Fatal(err)
		}
		if err := pub.Publish("orders", m); err != nil {
			t.Fatal(err)
		}
		if err := tx.Commit(); err != nil {
			t.Fatal(err)
		}
		// A later transaction (a retried handler) re-publishes it, even
		// with another payload: still one row, the first one.
		tx = begin(t, db)
		pub = txpublisher.New(tx, w, txpublisher.Config{})
		again := m.Copy()
		again.Payload = []byte(`{"v": 2}`)
		if err := pub.Publish("orders", again); err != nil {
			t.Fatal(err)
		}
		// The same UUID for another topic is refused, without breaking
		// the transaction.
		err := pub.Publish("payments", m)
		if !errors.Is(err, txpublisher.ErrDuplicateEventID) || !strings.Contains(err.Error(), `"orders"`) {
			t.Fatalf("same UUID on another topic: err = %v, want ErrDuplicateEventID naming topic orders", err)
		}
		other := msg(`{}`)
		if err := pub.Publish("payments", other); err != nil {
			t.Fatalf("transaction unusable after ErrDuplicateEventID: %v", err)
		}
		if err := tx.Commit(); err != nil {
			t.Fatal(err)
		}
		got := rows(t, db)
		if len(got) != 2 || got[0].EventID != m.UUID || got[1].EventID != other.UUID {
			t.Fatalf("rows = %+v, want m once and other", got)
		}
		sameJSON(t, got[0].Payload, `{"v": 1}`)
	})
}

func TestDerivedEventIDs(t *testing.T) {
	forEachDialect(t, func(t *testing.T, db *sql.DB, w *outbox.Writer) {
		ulid := message.NewMessage(watermill.NewULID(), []byte(`{}`))
		uuidMsg := msg(`{}`)
		empty := message.NewMessage("", []byte(`{}`))
		tx := begin(t, db)
		pub := txpublisher.New(tx, w, txpublisher.Config{DerivedEventIDs: true})
		if err := pub.Publish("orders", ulid, uuidMsg, empty); err != nil {
			t.Fatal(err)
		}
		if err := pub.Publish("orders", ulid); err != nil { // idempotent
			t.Fatal(err)
		}
		if err := tx.Commit(); err != nil {
			t.Fatal(err)
		}
		got := rows(t, db)
		if len(got) != 3 {
			t.Fatalf("%d rows, want 3: %+v", len(got), got)
		}
		if want := txpublisher.DerivedEventID(ulid.UUID).String(); got[0].EventID != want || got[0].Headers[txpublisher.HeaderMessageUUID] != ulid.UUID || got[0].Key != want {
			t.Errorf("ULID message row = %+v, want event id = key = %s and header %s = %s", got[0], want, txpublisher.HeaderMessageUUID, ulid.UUID)
		}
		if got[1].EventID != uuidMsg.UUID || got[1].Headers != nil {
			t.Errorf("UUID message row = %+v, want its own UUID and no headers", got[1])
		}
		if id, err := outbox.ParseEventID(got[2].EventID); err != nil || id.IsZero() || got[2].Headers != nil {
			t.Errorf("empty-UUID message row = %+v, want a fresh event id and no headers", got[2])
		}
	})
}

func TestBinaryPayloads(t *testing.T) {
	payloads := [][]byte{[]byte("\x00\x08\x96\x01\xff"), []byte(`{"a": 1}`), nil}
	forEachDialect(t, func(t *testing.T, db *sql.DB, w *outbox.Writer) {
		tx := begin(t, db)
		pub := txpublisher.New(tx, w, txpublisher.Config{BinaryPayloads: true})
		for _, p := range payloads {
			if err := pub.Publish("blobs", message.NewMessage(watermill.NewUUID(), p)); err != nil {
				t.Fatal(err)
			}
		}
		if err := tx.Commit(); err != nil {
			t.Fatal(err)
		}
		got := rows(t, db)
		if len(got) != len(payloads) {
			t.Fatalf("%d rows, want %d", len(got), len(payloads))
		}
		for i, g := range got {
			enc := g.Headers[txpublisher.HeaderPayloadEncoding]
			if enc != txpublisher.PayloadEncodingBase64 {
				t.Errorf("row %d: header %s = %q", i, txpublisher.HeaderPayloadEncoding, enc)
			}
			b, err := txpublisher.DecodePayload(enc, []byte(g.Payload))
			if err != nil {
				t.Fatal(err)
			}
			if string(b) != string(payloads[i]) {
				t.Errorf("row %d: decoded %q, want %q", i, b, payloads[i])
			}
		}
	})
}

func TestDecodePayload(t *testing.T) {
	if b, err := txpublisher.DecodePayload("", []byte(`{"a":1}`)); err != nil || string(b) != `{"a":1}` {
		t.Errorf("plain: %q, %v", b, err)
	}
	for _, c := range []struct{ enc, stored string }{{"base64", `{"a":1}`}, {"base64", `"!!"`}, {"gzip", `"AA=="`}} {
		if _, err := txpublisher.DecodePayload(c.enc, []byte(c.stored)); err == nil {
			t.Errorf("DecodePayload(%q, %s): no error", c.enc, c.stored)
		}
	}
}

func TestConfig(t *testing.T) {
	forEachDialect(t, func(t *testing.T, db *sql.DB, w *outbox.Writer) {
		tx := begin(t, db)
		pub := txpublisher.New(tx, w, txpublisher.Config{
			TypeMetadata:    "name",
			KeyMetadata:     "order_id",
			VersionMetadata: txpublisher.NoMetadata,
		})
		m := msg(`{}`, "name", "OrderPaid", "order_id", "o-7", "outbox_version", "9", "partition_key", "ignored")
		if err := pub.Publish("orders", m); err != nil {
			t.Fatal(err)
		}
		if err := tx.Commit(); err != nil {
			t.Fatal(err)
		}
		got := rows(t, db)
		// Custom keys stay in the headers (consumers keep seeing them);
		// the relay-set ones do not.
		want := stored{EventID: m.UUID, Type: "OrderPaid", Key: "o-7", Topic: "orders", Version: 1, Payload: got[0].Payload,
			Headers: map[string]string{"name": "OrderPaid", "order_id": "o-7"}}
		if fmt.Sprint(got[0]) != fmt.Sprint(want) {
			t.Errorf("row = %+v, want %+v", got[0], want)
		}
	})
}

func TestContextAndTxDone(t *testing.T) {
	forEachDialect(t, func(t *testing.T, db *sql.DB, w *outbox.Writer) {
		tx := begin(t, db)
		pub := txpublisher.New(tx, w, txpublisher.Config{})
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		m := msg(`{}`)
		m.SetContext(ctx)
		if err := pub.Publish("orders", m); !errors.Is(err, context.Canceled) {
			t.Fatalf("cancelled context: err = %v, want context.Canceled", err)
		}
		// The message's context reaches the driver: a deadline that
		// expires during the statement is the driver's to report, but an
		// open one must not hinder it.
		ok := msg(`{}`)
		ctx2, cancel2 := context.WithTimeout(context.Background(), time.Minute)
		defer cancel2()
		ok.SetContext(ctx2)
		if err := pub.Publish("orders", ok); err != nil {
			t.Fatalf("after a cancelled message: %v", err)
		}
		if err := tx.Commit(); err != nil {
			t.Fatal(err)
		}
		err := pub.Publish("orders", msg(`{}`))
		if !errors.Is(err, txpublisher.ErrTxDone) || !errors.Is(err, sql.ErrTxDone) || !strings.Contains(err.Error(), "before Commit") {
			t.Fatalf("after commit: err = %v, want ErrTxDone wrapping sql.ErrTxDone", err)
		}
		if got := rows(t, db); len(got) != 1 || got[0].EventID != ok.UUID {
			t.Fatalf("rows = %+v, want only the message with a live context", got)
		}
	})
}

func TestConcurrentPublish(t *testing.T) {
	forEachDialect(t, func(t *testing.T, db *sql.DB, w *outbox.Writer) {
		tx := begin(t, db)
		pub := txpublisher.New(tx, w, txpublisher.Config{})
		var wg sync.WaitGroup
		errs := make(chan error, 8)
		for g := range 8 {
			wg.Go(func() {
				for i := range 10 {
					if err := pub.Publish("orders", msg(fmt.Sprintf(`{"g": %d, "i": %d}`, g, i), "partition_key", fmt.Sprint(g))); err != nil {
						errs <- err
						return
					}
				}
			})
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Fatal(err)
		}
		if err := tx.Commit(); err != nil {
			t.Fatal(err)
		}
		got := rows(t, db)
		if len(got) != 80 {
			t.Fatalf("%d rows, want 80", len(got))
		}
		// Each goroutine's messages keep their order within the key.
		next := map[string]int{}
		for _, r := range got {
			var p struct{ G, I int }
			if err := json.Unmarshal([]byte(r.Payload), &p); err != nil {
				t.Fatal(err)
			}
			if p.I != next[r.Key] {
				t.Fatalf("key %s: message %d after %d", r.Key, p.I, next[r.Key]-1)
			}
			next[r.Key]++
		}
	})
}

// A topic the writer refuses (whitespace, control characters) is refused
// by the publisher too, before any SQL.
func TestPublishRefusesTopicsTheWriterRefuses(t *testing.T) {
	forEachDialect(t, func(t *testing.T, db *sql.DB, w *outbox.Writer) {
		tx := begin(t, db)
		pub := txpublisher.New(tx, w, txpublisher.Config{})
		for _, topic := range []string{"orders paid", "a\tb", "x\u0085y", ""} {
			if err := pub.Publish(topic, msg(`{}`)); !errors.Is(err, txpublisher.ErrInvalidMessage) {
				t.Errorf("Publish(%q) = %v, want ErrInvalidMessage", topic, err)
			}
		}
		if err := tx.Commit(); err != nil {
			t.Fatal(err)
		}
		if got := rows(t, db); len(got) != 0 {
			t.Fatalf("%d rows written, want 0", len(got))
		}
	})
}

func TestConfigValidate(t *testing.T) {
	if err := (txpublisher.Config{}).Validate(); err != nil {
		t.Errorf("zero Config: %v", err)
	}
	err := txpublisher.Config{TypeMetadata: "a\nb", KeyMetadata: "\xff"}.Validate()
	if err == nil || !strings.Contains(err.Error(), "Config.TypeMetadata") || !strings.Contains(err.Error(), "Config.KeyMetadata") || !strings.Contains(err.Error(), "NoMetadata") {
		t.Errorf("Validate = %v, want both keys refused, with the fix", err)
	}
}
