package outbox

import (
	"errors"
	"fmt"
	"strings"
	"unicode"
	"unicode/utf8"
)

// Limits on what an event may carry, so that every row the writer accepts
// can be stored on every supported database, published over NATS JetStream
// and Kafka with their default settings, and consumed. Writer.Prepare checks
// them before any SQL runs and refuses a violation with an error matching
// ErrInvalidEvent; the transaction stays usable.
//
// Text (the event type, key and topic, header names and values) must be
// valid UTF-8 without NUL bytes: PostgreSQL refuses anything else
// (SQLSTATE 22021), MySQL and SQLite would store it and the consumer could
// never record it. The event type and key travel as message headers
// (outbox_type, outbox_key, partition_key), so they may not hold CR or LF
// either; the topic, a NATS subject or Kafka topic name, may hold no
// whitespace or control characters at all.
//
// Headers (WithHeader, WithHeaders):
//
//   - a name is 1 to MaxHeaderNameLen bytes of RFC 9110 token characters:
//     ASCII letters, digits and !#$%&'*+-.^_`|~ (no spaces, ':' or control
//     characters, which NATS's header block, HTTP and AMQP cannot carry);
//     names the relay or broker clients use themselves are reserved
//     (outbox_*, partition_key, _watermill_*, Nats-*, case-insensitively);
//   - a value is valid UTF-8 without NUL, CR or LF;
//   - an event has at most MaxHeaders headers, whose names and values
//     together hold at most MaxHeadersSize bytes;
//   - the payload (its JSON) and the headers together hold at most the
//     writer's message size limit, MaxMessageSize by default (see
//     WithMaxMessageSize).
const (
	// MaxHeaderNameLen is the longest header name, in bytes.
	MaxHeaderNameLen = 256
	// MaxHeaders is the most headers one event may carry (each costs
	// brokers some framing: 4 bytes in a NATS header block, up to 10 in a
	// Kafka record).
	MaxHeaders = 64
	// MaxHeadersSize caps the sum of the lengths, in bytes, of every
	// header name and value of one event: 60 KiB, so that with the relay's
	// metadata and the framing they stay within the 64 KiB header block
	// NATS JetStream accepts.
	MaxHeadersSize = 60 << 10
	// MaxMessageSize is the default cap, in bytes, of an event's payload
	// (as JSON) plus its headers (names and values): 1 MiB, the default
	// NATS max_payload (which counts headers too) and about Kafka's default
	// message.max.bytes, less 8 KiB for the metadata the relay and the
	// broker client add (event id, type, key, sequence, timestamps).
	MaxMessageSize = 1<<20 - 8<<10
)

// WriterOption configures a Writer.
type WriterOption func(*Writer)

// WithMaxMessageSize sets the writer's cap on payload plus headers size, in
// bytes, instead of MaxMessageSize: raise it only when every broker the
// relay publishes to accepts larger messages (NATS max_payload, Kafka
// message.max.bytes and the producer's max.message.bytes). n <= 0 removes
// the cap.
func WithMaxMessageSize(n int) WriterOption {
	return func(w *Writer) { w.maxMessage = n }
}

// CheckHeaders reports the first header of h that a broker cannot carry
// (see MaxHeaderNameLen): a malformed name or value, more than MaxHeaders
// headers, or headers larger than MaxHeadersSize together. The error says
// which header and why. Writer.Prepare calls it (and also refuses the
// reserved names); other producers of outbox rows (package txpublisher)
// call it too.
func CheckHeaders(h map[string]string) error {
	if len(h) > MaxHeaders {
		return fmt.Errorf("%d headers; at most %d (outbox.MaxHeaders) fit", len(h), MaxHeaders)
	}
	size := 0
	for k, v := range h {
		if err := checkHeaderName(k); err != nil {
			return err
		}
		if err := checkHeaderValue(k, v); err != nil {
			return err
		}
		size += len(k) + len(v)
	}
	if size > MaxHeadersSize {
		return fmt.Errorf("the headers hold %d bytes (names and values); at most %d (outbox.MaxHeadersSize) fit", size, MaxHeadersSize)
	}
	return nil
}

// checkHeaderName refuses header names that a broker cannot carry.
func checkHeaderName(k string) error {
	if k == "" {
		return errors.New("a header name is empty")
	}
	if len(k) > MaxHeaderNameLen {
		return fmt.Errorf("header name %.40q... is %d bytes long; at most %d (outbox.MaxHeaderNameLen)", k, len(k), MaxHeaderNameLen)
	}
	for i := 0; i < len(k); i++ {
		if !isTokenChar(k[i]) {
			return fmt.Errorf("header name %q holds %q at byte %d: a name is ASCII letters, digits and !#$%%&'*+-.^_`|~ only (no spaces, ':' or control characters)", k, k[i:i+1], i)
		}
	}
	return nil
}

// checkReservedHeader refuses the header names that the relay or a broker
// adapter gives a meaning of their own: a stored header with such a name
// would be overwritten, or would change how the broker treats the message
// (a "_watermill_message_uuid" header makes watermill-kafka refuse every
// publish; "Nats-Expected-*" headers change JetStream's checks).
func checkReservedHeader(k string) error {
	lk := strings.ToLower(k)
	switch {
	case strings.HasPrefix(lk, "outbox_") || lk == MetadataPartitionKey:
		return fmt.Errorf("header %q is reserved: the relay sets outbox_* and %s itself", k, MetadataPartitionKey)
	case strings.HasPrefix(lk, "_watermill_") || strings.HasPrefix(lk, "nats-"):
		return fmt.Errorf("header %q is reserved by the broker client (_watermill_*, Nats-*); choose another name", k)
	}
	return nil
}

// isTokenChar reports whether c is an RFC 9110 token character.
func isTokenChar(c byte) bool {
	switch {
	case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9':
		return true
	}
	return strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0
}

func checkHeaderValue(k, v string) error {
	if !utf8.ValidString(v) {
		return fmt.Errorf("header %q: the value is not valid UTF-8", k)
	}
	if i := strings.IndexAny(v, "\x00\r\n"); i >= 0 {
		return fmt.Errorf("header %q: the value holds %q at byte %d; NUL, CR and LF cannot be carried in a message header", k, v[i:i+1], i)
	}
	if leadingBlank(v) {
		return fmt.Errorf("header %q: the value starts with a space or tab, which NATS drops from header values", k)
	}
	return nil
}

// leadingBlank reports whether v starts with a space or tab: NATS drops
// them from header values, so " k" would arrive as "k".
func leadingBlank(v string) bool { return v != "" && (v[0] == ' ' || v[0] == '\t') }

// CheckText reports why v cannot be an event's type or key (strict false)
// or topic (strict true), described as what, or returns nil: empty, over
// max characters (the outbox column's size), not valid UTF-8, holding NUL,
// CR or LF, or starting with a space or tab (all travel as message
// headers); a topic may hold no whitespace or control character at all.
// The writer checks every event with it; other producers (txpublisher) call
// it so that they refuse exactly what the writer refuses.
func CheckText(what, v string, max int, strict bool) error {
	if v == "" {
		return fmt.Errorf("%s is empty", what)
	}
	if reason := checkText(what, v, strict); reason != "" {
		return errors.New(reason)
	}
	if n := utf8.RuneCountInString(v); n > max {
		return fmt.Errorf("%s is %d characters long; the outbox table holds at most %d", what, n, max)
	}
	return nil
}

// checkText refuses a value of the event type, key or topic that cannot be
// stored or carried: not valid UTF-8, or holding NUL, CR or LF (all of them
// when strict: also other control characters and whitespace).
func checkText(what, v string, strict bool) string {
	if !utf8.ValidString(v) {
		return what + " is not valid UTF-8"
	}
	if leadingBlank(v) {
		return what + " starts with a space or tab, which NATS drops from header values"
	}
	for i, r := range v {
		bad := r == 0 || r == '\r' || r == '\n'
		if strict {
			bad = unicode.IsControl(r) || unicode.IsSpace(r)
		}
		if bad {
			return fmt.Sprintf("%s holds %q at byte %d, which cannot be stored or carried as a message header", what, r, i)
		}
	}
	return ""
}

// printable returns s with invalid UTF-8 and control characters replaced,
// for error messages.
func printable(s string) string {
	return strings.Map(func(r rune) rune {
		if r == utf8.RuneError || unicode.IsControl(r) {
			return '\uFFFD'
		}
		return r
	}, strings.ToValidUTF8(s, "\uFFFD"))
}
