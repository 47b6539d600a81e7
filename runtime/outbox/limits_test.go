package outbox

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"unicode/utf8"
)

// Text no database or consumer can take (invalid UTF-8, NUL) and text a
// message header cannot carry (CR, LF) is refused in the event type, key
// and topic before any SQL runs.
func TestPrepareRefusesUnstorableText(t *testing.T) {
	w := MustNewWriter(Postgres, "outbox_event")
	ok := Event{Type: "ORDER_PAID", Topic: "orders.paid", Key: "o-1", Version: 1, Payload: 1}
	cases := []struct {
		name string
		ev   func(Event) Event
		want string
	}{
		{"key invalid UTF-8", func(e Event) Event { e.Key = "k\xff"; return e }, "the key (biz_id) is not valid UTF-8"},
		{"key NUL", func(e Event) Event { e.Key = "k\x00z"; return e }, `the key (biz_id) holds '\x00' at byte 1`},
		{"key LF", func(e Event) Event { e.Key = "k\nz"; return e }, `the key (biz_id) holds '\n'`},
		{"key CR", func(e Event) Event { e.Key = "k\rz"; return e }, `the key (biz_id) holds '\r'`},
		{"type invalid UTF-8", func(e Event) Event { e.Type = "T\xc3"; return e }, "the event type (biz_type) is not valid UTF-8"},
		{"type NUL", func(e Event) Event { e.Type = "T\x00"; return e }, "the event type (biz_type) holds"},
		{"topic invalid UTF-8", func(e Event) Event { e.Topic = "t\xff"; return e }, "the topic is not valid UTF-8"},
		{"topic NUL", func(e Event) Event { e.Topic = "t\x00"; return e }, "the topic holds"},
		{"topic space", func(e Event) Event { e.Topic = "orders paid"; return e }, "the topic holds ' '"},
		{"topic tab", func(e Event) Event { e.Topic = "orders\tpaid"; return e }, `the topic holds '\t'`},
		{"key leading space", func(e Event) Event { e.Key = " o-1"; return e }, "the key (biz_id) starts with a space or tab"},
		{"type leading tab", func(e Event) Event { e.Type = "\tORDER_PAID"; return e }, "the event type (biz_type) starts with a space or tab"},
	}
	for _, c := range cases {
		_, err := w.Prepare(c.ev(ok))
		var ie *InvalidEventError
		if !errors.Is(err, ErrInvalidEvent) || !errors.As(err, &ie) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: err = %v, want ErrInvalidEvent saying %q", c.name, err, c.want)
			continue
		}
		if !strings.Contains(err.Error(), "ORDER_PAID") && !strings.HasPrefix(c.name, "type") {
			t.Errorf("%s: %v does not name the event type", c.name, err)
		}
		if !utf8.ValidString(ie.Type) || strings.ContainsRune(ie.Type, 0) {
			t.Errorf("%s: the error's Type %q is not printable", c.name, ie.Type)
		}
	}
	// Tabs and non-ASCII text are fine in keys.
	for _, key := range []string{"a\tb", "ørder-1", "注文-1", "k with spaces"} {
		e := ok
		e.Key = key
		if _, err := w.Prepare(e); err != nil {
			t.Errorf("key %q refused: %v", key, err)
		}
	}
}

// Header names and values that a broker cannot carry, and headers too
// large together, are refused at insert time with an error naming the
// header; names and values at the limits are accepted.
func TestPrepareHeaderLimits(t *testing.T) {
	w := MustNewWriter(SQLite, "outbox_event")
	ok := Event{Type: "ORDER_PAID", Topic: "orders.paid", Key: "o-1", Version: 1, Payload: 1}
	refused := []struct {
		name, k, v, want string
	}{
		{"space in name", "trace id", "x", `header name "trace id" holds " " at byte 5`},
		{"colon in name", "trace:id", "x", `header name "trace:id" holds ":"`},
		{"CR in name", "a\rb", "x", `holds "\r"`},
		{"LF in name", "a\nb", "x", `holds "\n"`},
		{"non-ASCII name", "tenánt", "x", "ASCII letters, digits"},
		{"slash in name", "a/b", "x", `holds "/"`},
		{"name too long", strings.Repeat("n", MaxHeaderNameLen+1), "x", "is 257 bytes long; at most 256"},
		{"CR in value", "tenant", "acme\r\nX-Injected: 1", `header "tenant": the value holds "\r" at byte 4`},
		{"LF in value", "tenant", "a\nb", `header "tenant": the value holds "\n"`},
		{"NUL in value", "tenant", "a\x00b", `header "tenant": the value holds "\x00"`},
		{"invalid UTF-8 value", "tenant", "a\xffb", `header "tenant": the value is not valid UTF-8`},
		{"value larger than the headers cap", "big", strings.Repeat("v", MaxHeadersSize), "at most 61440 (outbox.MaxHeadersSize)"},
		{"reserved", "outbox_seq", "1", "reserved"},
	}
	for _, c := range refused {
		_, err := w.Prepare(ok, WithHeader(c.k, c.v))
		var ie *InvalidEventError
		if !errors.Is(err, ErrInvalidEvent) || !errors.As(err, &ie) || ie.Field != "headers" || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: err = %v, want ErrInvalidEvent on headers saying %q", c.name, err, c.want)
		}
	}
	// Together over the cap, each one under it.
	many := map[string]string{}
	for i := range 5 {
		many[strings.Repeat("k", i+1)] = strings.Repeat("v", MaxHeadersSize/4)
	}
	if _, err := w.Prepare(ok, WithHeaders(many)); !errors.Is(err, ErrInvalidEvent) || !strings.Contains(err.Error(), "MaxHeadersSize") {
		t.Errorf("headers over the cap together: %v", err)
	}
	count := map[string]string{}
	for i := range MaxHeaders + 1 {
		count[fmt.Sprintf("h%d", i)] = "v"
	}
	if _, err := w.Prepare(ok, WithHeaders(count)); !errors.Is(err, ErrInvalidEvent) || !strings.Contains(err.Error(), "65 headers; at most 64 (outbox.MaxHeaders)") {
		t.Errorf("too many headers: %v", err)
	}
	delete(count, "h0")
	if _, err := w.Prepare(ok, WithHeaders(count)); err != nil {
		t.Errorf("MaxHeaders headers: %v", err)
	}
	accepted := map[string]string{
		"traceparent":                         "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
		"X-Tenant_ID.v2!#$%&'*+-^`|~":         "acme corp: ünïcode\tand tabs",
		strings.Repeat("n", MaxHeaderNameLen): "",
		"big":                                 strings.Repeat("v", MaxHeadersSize-MaxHeaderNameLen-200),
	}
	if _, err := w.Prepare(ok, WithHeaders(accepted)); err != nil {
		t.Errorf("headers at the limits refused: %v", err)
	}
	if err := CheckHeaders(accepted); err != nil {
		t.Errorf("CheckHeaders: %v", err)
	}
}

// Payload plus headers over the message size cap (the brokers' default
// maximum) is refused; WithMaxMessageSize moves or removes the cap.
func TestPrepareMessageSize(t *testing.T) {
	ev := func(n int) Event {
		// A JSON string of n bytes with its quotes.
		return Event{Type: "BLOB", Topic: "blobs", Key: "b-1", Version: 1, Payload: strings.Repeat("x", n-2)}
	}
	w := MustNewWriter(MySQL, "outbox_event")
	hdr := WithHeader("tenant", "acme") // 10 bytes
	if _, err := w.Prepare(ev(MaxMessageSize-10), hdr); err != nil {
		t.Fatalf("at the cap: %v", err)
	}
	_, err := w.Prepare(ev(MaxMessageSize-9), hdr)
	if !errors.Is(err, ErrInvalidEvent) || !strings.Contains(err.Error(), "payload (1040375 bytes of JSON) and headers (10 bytes) exceed the writer's message size limit of 1040384 bytes") {
		t.Fatalf("over the cap: %v", err)
	}
	big := MustNewWriter(MySQL, "outbox_event", WithMaxMessageSize(4<<20))
	if _, err := big.Prepare(ev(2<<20), hdr); err != nil {
		t.Fatalf("raised cap: %v", err)
	}
	if _, err := big.Prepare(ev(4<<20), hdr); !errors.Is(err, ErrInvalidEvent) {
		t.Fatalf("over the raised cap: %v", err)
	}
	unlimited := MustNewWriter(MySQL, "outbox_event", WithMaxMessageSize(0))
	if _, err := unlimited.Prepare(ev(8<<20), hdr); err != nil {
		t.Fatalf("no cap: %v", err)
	}
}
