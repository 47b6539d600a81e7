package txpublisher

import (
	"context"
	"database/sql"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"unicode"
	"unicode/utf8"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/google/uuid"

	"github.com/outboxgen/outboxgen/runtime/dialect"
	"github.com/outboxgen/outboxgen/runtime/outbox"
)

// Default metadata keys read into columns. They are the keys the relay sets
// on the messages it publishes (outbox.MetadataType, MetadataPartitionKey,
// MetadataVersion), so a message consumed from the relay and published
// again keeps its type, key and version.
const (
	DefaultTypeMetadata    = outbox.MetadataType
	DefaultKeyMetadata     = outbox.MetadataPartitionKey
	DefaultVersionMetadata = outbox.MetadataVersion
)

// Headers the publisher itself may add to a row.
const (
	// HeaderMessageUUID keeps the message's original UUID when
	// Config.DerivedEventIDs replaced it with a derived event id.
	HeaderMessageUUID = "outbox_message_uuid"
	// HeaderPayloadEncoding marks a payload stored with Config.BinaryPayloads:
	// its value is PayloadEncodingBase64. See DecodePayload.
	HeaderPayloadEncoding = outbox.HeaderPayloadEncoding
	// PayloadEncodingBase64 means the payload column holds a JSON string of
	// the standard base64 encoding (RFC 4648, padded) of the message bytes.
	PayloadEncodingBase64 = outbox.PayloadEncodingBase64
)

// relaySet are the metadata keys the relay sets on every message from the
// row's columns (they win over stored headers), so they are not stored:
// a value from an earlier hop (another producer's outbox_seq, say) would
// only mislead.
var relaySet = map[string]bool{
	outbox.MetadataType:         true,
	outbox.MetadataKey:          true,
	outbox.MetadataVersion:      true,
	outbox.MetadataCreatedAt:    true,
	outbox.MetadataEventID:      true,
	outbox.MetadataSequence:     true,
	outbox.MetadataPartitionKey: true,
}

// Errors matched with errors.Is. A Publish that fails with one of the first
// three ran no SQL: the transaction is untouched.
var (
	// ErrInvalidMessageID: the message UUID is not a UUID (or is the nil
	// UUID) and Config.DerivedEventIDs is not set.
	ErrInvalidMessageID = errors.New("message UUID is not a UUID")
	// ErrPayloadNotJSON: the payload is not valid UTF-8 JSON and
	// Config.BinaryPayloads is not set.
	ErrPayloadNotJSON = errors.New("message payload is not JSON")
	// ErrInvalidMessage: another property of the message does not fit the
	// outbox table or cannot be published (empty or too long topic, type or
	// key, or one holding NUL, CR or LF; a bad version; metadata that is not
	// UTF-8 or breaks outbox.CheckHeaders' limits; payload and metadata
	// larger than the writer's outbox.MaxMessageSize).
	ErrInvalidMessage = errors.New("message does not fit the outbox table")
	// ErrDuplicateEventID: a row with the message's event id already exists
	// for another topic.
	ErrDuplicateEventID = errors.New("event id already used for another topic")
	// ErrTxDone: the transaction was already committed or rolled back. The
	// error also wraps the driver's (sql.ErrTxDone, pgx.ErrTxClosed).
	ErrTxDone = errors.New("transaction already committed or rolled back")
)

// NoMetadata, as Config.TypeMetadata, KeyMetadata or VersionMetadata,
// reads that column from no metadata key: the type is always the topic, the
// key always the event id (unordered), the version always 1.
const NoMetadata = "-"

// Config configures a Publisher. The zero Config is the default: type, key
// and version from the relay's metadata keys, payloads must be JSON and
// message UUIDs must be UUIDs.
type Config struct {
	// TypeMetadata is the metadata key biz_type (the event type) is read
	// from. A message without it gets the topic as its type. Default
	// DefaultTypeMetadata; NoMetadata always uses the topic.
	TypeMetadata string
	// KeyMetadata is the metadata key biz_id (the ordering key: messages
	// with the same key are published in order) is read from. A message
	// without it is keyed by its own event id, i.e. unordered. Default
	// DefaultKeyMetadata; NoMetadata makes every message unordered.
	KeyMetadata string
	// VersionMetadata is the metadata key payload_version is read from; its
	// value must be a positive decimal integer. A message without it gets
	// version 1. Default DefaultVersionMetadata; NoMetadata always uses 1.
	VersionMetadata string

	// DerivedEventIDs accepts messages whose UUID is not a UUID (e.g. a
	// watermill.NewULID or NewShortUUID): the event id becomes
	// DerivedEventID(msg.UUID), deterministic so that publishing the same
	// message again stays idempotent, and the original is kept in header
	// HeaderMessageUUID (the relay publishes the row with UUID = event id).
	// A message with an empty UUID gets a fresh UUIDv7, with no
	// idempotency. Default false: such a message is refused with
	// ErrInvalidMessageID.
	DerivedEventIDs bool
	// BinaryPayloads treats payloads as opaque bytes (protobuf, Avro,
	// anything): every payload is stored as a JSON string of its base64
	// encoding with header HeaderPayloadEncoding = PayloadEncodingBase64,
	// and the relay decodes it back to the exact bytes (see DecodePayload).
	// Default false: a payload must be JSON and is stored as is: byte for
	// byte on PostgreSQL and SQLite, normalised by MySQL's JSON type (same
	// value, maybe other spacing and key order). Base64 costs a third more
	// space and hides the payload from SQL queries on the table.
	BinaryPayloads bool
}

// setDefaults fills the zero fields of c.
func (c *Config) setDefaults() {
	if c.TypeMetadata == "" {
		c.TypeMetadata = DefaultTypeMetadata
	}
	if c.KeyMetadata == "" {
		c.KeyMetadata = DefaultKeyMetadata
	}
	if c.VersionMetadata == "" {
		c.VersionMetadata = DefaultVersionMetadata
	}
}

// Validate reports every setting that cannot work, each with how to fix it,
// joined with errors.Join. New calls it after filling in the defaults;
// call it at start-up to fail there rather than at the first New.
func (c Config) Validate() error {
	var errs []error
	for _, f := range []struct{ name, key string }{
		{"TypeMetadata", c.TypeMetadata},
		{"KeyMetadata", c.KeyMetadata},
		{"VersionMetadata", c.VersionMetadata},
	} {
		if !utf8.ValidString(f.key) || strings.ContainsFunc(f.key, unicode.IsControl) {
			errs = append(errs, fmt.Errorf("txpublisher: Config.%s %q is not a metadata key (it must be UTF-8 text without control characters): set a metadata key, \"\" for the default, or txpublisher.NoMetadata to read none", f.name, f.key))
		}
	}
	return errors.Join(errs...)
}

// Tx is what a Publisher needs from a transaction. New and
// pgxtxpublisher.New adapt *sql.Tx and pgx.Tx; implement it only to support
// another driver, and always over a transaction, never a pool: a pool
// commits each row on its own, which defeats the outbox.
type Tx interface {
	outbox.Tx
	// IsTxDone reports whether err says the transaction already ended.
	IsTxDone(err error) bool
}

// Publisher is a watermill message.Publisher that inserts messages into an
// outbox table inside one transaction. Create one per transaction.
type Publisher struct {
	tx     Tx
	w      *outbox.Writer
	cfg    Config
	insert string

	mu sync.Mutex // a transaction runs one statement at a time
}

var _ message.Publisher = (*Publisher)(nil)

// New returns a Publisher writing into w's outbox table inside tx, as cfg
// says (the zero Config for the defaults). w's dialect must be that of tx's
// database. It panics when tx or w is nil, or cfg is invalid (see
// Config.Validate).
func New(tx *sql.Tx, w *outbox.Writer, cfg Config) *Publisher {
	if tx == nil {
		panic("txpublisher: New: nil *sql.Tx")
	}
	return NewTx(sqlTx{outbox.StdTx(tx)}, w, cfg)
}

// NewTx returns a Publisher writing into w's outbox table through tx, an
// adapter of another driver's transaction. It panics when tx or w is nil,
// or cfg is invalid (see Config.Validate).
func NewTx(tx Tx, w *outbox.Writer, cfg Config) *Publisher {
	if tx == nil {
		panic("txpublisher: nil transaction")
	}
	if w == nil {
		panic("txpublisher: nil *outbox.Writer")
	}
	cfg.setDefaults()
	if err := cfg.Validate(); err != nil {
		panic(err)
	}
	d := w.Dialect()
	return &Publisher{
		tx:     tx,
		w:      w,
		cfg:    cfg,
		insert: d.InsertEvent(w.Table(), true),
	}
}

// row is one prepared insert.
type row struct {
	id   outbox.EventID
	args []any
}

// Publish inserts one outbox row per message, in order, using each
// message's context for its statement. It never contacts a broker. See the
// package documentation for how a message maps to a row.
func (p *Publisher) Publish(topic string, msgs ...*message.Message) error {
	rows := make([]row, len(msgs))
	for i, m := range msgs {
		r, err := p.prepare(topic, m)
		if err != nil {
			return fmt.Errorf("txpublisher: publish to topic %q: message %d of %d: %w", topic, i+1, len(msgs), err)
		}
		rows[i] = r
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	for i, r := range rows {
		if err := p.write(msgs[i].Context(), topic, r); err != nil {
			return fmt.Errorf("txpublisher: publish to topic %q: message %d of %d (event id %s): %w", topic, i+1, len(msgs), r.id, err)
		}
	}
	return nil
}

// Close does nothing: the transaction belongs to the caller.
func (p *Publisher) Close() error { return nil }

func (p *Publisher) write(ctx context.Context, topic string, r row) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("message context: %w", context.Cause(ctx))
	}
	n, err := p.tx.Exec(ctx, p.insert, r.args...)
	if err != nil {
		return p.dbErr("insert into "+p.w.Table(), err)
	}
	if n != 0 {
		return nil
	}
	// A row with this event id exists: a re-publish (fine) unless it is
	// another topic's event.
	_, _, existing, found, err := p.w.Existing(ctx, p.tx, r.id)
	if err != nil {
		return p.dbErr("look up the existing event id in "+p.w.Table(), err)
	}
	if found && existing != topic {
		return fmt.Errorf("%w: the outbox already holds event id %s for topic %q; give each copy of a message its own UUID", ErrDuplicateEventID, r.id, existing)
	}
	return nil
}

func (p *Publisher) dbErr(what string, err error) error {
	if p.tx.IsTxDone(err) {
		return fmt.Errorf("%s: %w: publish before Commit or Rollback, with a new publisher for each transaction: %w", what, ErrTxDone, err)
	}
	return fmt.Errorf("%s: %w", what, err)
}

// prepare checks msg and builds its insert arguments without touching the
// database.
func (p *Publisher) prepare(topic string, msg *message.Message) (row, error) {
	if msg == nil {
		return row{}, fmt.Errorf("%w: nil message", ErrInvalidMessage)
	}
	if err := check("topic", topic, dialect.MaxTopicLen, true); err != nil {
		return row{}, err
	}
	headers := make(map[string]string, len(msg.Metadata)+2)
	for k, v := range msg.Metadata {
		if !utf8.ValidString(k) || !utf8.ValidString(v) {
			return row{}, fmt.Errorf("%w: metadata %q is not valid UTF-8", ErrInvalidMessage, k)
		}
		if !relaySet[k] {
			headers[k] = v
		}
	}

	id, derived, err := p.eventID(msg.UUID)
	if err != nil {
		return row{}, err
	}
	if derived && msg.UUID != "" {
		headers[HeaderMessageUUID] = msg.UUID
	}

	typ := topic
	if v := p.meta(msg, p.cfg.TypeMetadata); v != "" {
		typ = v
	}
	if err := check("type (biz_type, metadata "+strconv.Quote(p.cfg.TypeMetadata)+" or the topic)", typ, dialect.MaxTypeLen, false); err != nil {
		return row{}, err
	}
	key := id.String()
	if v := p.meta(msg, p.cfg.KeyMetadata); v != "" {
		key = v
	}
	if err := check("key (biz_id, metadata "+strconv.Quote(p.cfg.KeyMetadata)+")", key, dialect.MaxKeyLen, false); err != nil {
		return row{}, err
	}
	version := 1
	if v := p.meta(msg, p.cfg.VersionMetadata); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > 1<<31-1 {
			return row{}, fmt.Errorf("%w: payload version (metadata %q) %q is not a positive integer", ErrInvalidMessage, p.cfg.VersionMetadata, v)
		}
		version = n
	}

	var payload string
	if p.cfg.BinaryPayloads {
		payload = `"` + base64.StdEncoding.EncodeToString(msg.Payload) + `"`
		headers[HeaderPayloadEncoding] = PayloadEncodingBase64
	} else {
		if !json.Valid(msg.Payload) || !utf8.Valid(msg.Payload) {
			what := "it is not valid JSON"
			if len(msg.Payload) == 0 {
				what = "it is empty"
			} else if json.Valid(msg.Payload) {
				what = "it is not valid UTF-8"
			}
			return row{}, fmt.Errorf("%w: %s (the outbox payload column is JSON): publish JSON (e.g. {} for no data), or store opaque bytes with txpublisher.Config{BinaryPayloads: true}", ErrPayloadNotJSON, what)
		}
		payload = string(msg.Payload)
	}
	if _, reserved := msg.Metadata[HeaderPayloadEncoding]; reserved && !p.cfg.BinaryPayloads {
		return row{}, fmt.Errorf("%w: metadata %q is reserved for Config.BinaryPayloads", ErrInvalidMessage, HeaderPayloadEncoding)
	}

	// What a broker cannot carry is refused here, not by the relay after
	// the commit (the row would go FAILED).
	if err := outbox.CheckHeaders(headers); err != nil {
		return row{}, fmt.Errorf("%w: metadata: %w", ErrInvalidMessage, err)
	}
	if limit := p.w.MaxMessageSize(); limit > 0 {
		size := len(msg.Payload)
		for k, v := range headers {
			size += len(k) + len(v)
		}
		if size > limit {
			return row{}, fmt.Errorf("%w: the payload (%d bytes) and stored metadata exceed the writer's message size limit of %d bytes (outbox.MaxMessageSize; brokers refuse larger messages by default)", ErrInvalidMessage, len(msg.Payload), limit)
		}
	}

	var hdr any // NULL when there are none
	if len(headers) > 0 {
		b, err := json.Marshal(headers)
		if err != nil {
			return row{}, fmt.Errorf("%w: headers: %w", ErrInvalidMessage, err)
		}
		hdr = string(b)
	}

	args := dialect.InsertEventArgs(id.String(), typ, key, topic, version, payload, hdr)
	return row{id: id, args: args}, nil
}

// meta returns msg's metadata value for key, "" when key is NoMetadata.
func (p *Publisher) meta(msg *message.Message, key string) string {
	if key == NoMetadata {
		return ""
	}
	return msg.Metadata.Get(key)
}

// eventID returns the event id of a message UUID; derived reports that it
// is not the UUID itself.
func (p *Publisher) eventID(s string) (id outbox.EventID, derived bool, err error) {
	u, err := uuid.Parse(s)
	if err == nil && u != uuid.Nil {
		return outbox.EventID(u), false, nil
	}
	if p.cfg.DerivedEventIDs {
		if s == "" {
			return outbox.NewEventID(), true, nil
		}
		return DerivedEventID(s), true, nil
	}
	what := "is not a UUID"
	switch {
	case s == "":
		what = "is empty"
	case err == nil:
		what = "is the nil UUID"
	}
	return outbox.EventID{}, false, fmt.Errorf("%w: message UUID %q %s; the outbox event id, which the relay publishes as the message UUID and consumers deduplicate by, must be a UUID: create messages with message.NewMessage(watermill.NewUUID(), payload), or accept other ids with txpublisher.Config{DerivedEventIDs: true}", ErrInvalidMessageID, s, what)
}

// derivedNamespace is the UUIDv5 namespace of DerivedEventID.
var derivedNamespace = uuid.NewSHA1(uuid.NameSpaceURL, []byte("https://github.com/outboxgen/outboxgen/runtime/txpublisher#message-uuid"))

// DerivedEventID returns the event id Config.DerivedEventIDs gives a message
// whose UUID is messageUUID and not a UUID: a name-based UUID (version 5)
// of it, the same on every call and every machine.
func DerivedEventID(messageUUID string) outbox.EventID {
	return outbox.EventID(uuid.NewSHA1(derivedNamespace, []byte(messageUUID)))
}

// check refuses what the writer refuses (outbox.CheckText), so that no
// message becomes a row the relay or a consumer cannot handle.
func check(what, s string, max int, strict bool) error {
	if err := outbox.CheckText("the "+what, s, max, strict); err != nil {
		return fmt.Errorf("%w: %w", ErrInvalidMessage, err)
	}
	return nil
}

// DecodePayload returns the message bytes of a payload stored by a
// Publisher; see outbox.DecodeStoredPayload, which the relay calls.
func DecodePayload(encoding string, stored []byte) ([]byte, error) {
	return outbox.DecodeStoredPayload(encoding, stored)
}

// sqlTx adapts *sql.Tx.
type sqlTx struct{ outbox.Tx }

func (sqlTx) IsTxDone(err error) bool { return errors.Is(err, sql.ErrTxDone) }
