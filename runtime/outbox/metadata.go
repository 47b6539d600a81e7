package outbox

import (
	"fmt"
	"strconv"
	"time"
)

// Metadata keys the relay sets on every published message, next to the
// headers stored with the event. Consumers read them back with ParseMeta.
const (
	MetadataType      = "outbox_type"       // biz_type, e.g. ORDER_PAID
	MetadataKey       = "outbox_key"        // biz_id, the aggregate key
	MetadataVersion   = "outbox_version"    // payload version, decimal
	MetadataCreatedAt = "outbox_created_at" // row created_at, RFC 3339 (nanoseconds), UTC
	MetadataEventID   = "outbox_event_id"   // event_id, also the message UUID
	// MetadataSequence is the outbox row id, in decimal. Within one key it
	// grows with commit order (when the business transaction locks the
	// aggregate), so consumers can drop stale state events with it.
	MetadataSequence = "outbox_seq"
	// MetadataPartitionKey carries the key for publishers that partition by
	// it (Kafka), so per-key order holds inside the broker too.
	MetadataPartitionKey = "partition_key"
)

// Meta is what a consumer knows about a delivered event besides its payload.
type Meta struct {
	// EventID is the event's global id: the deduplication key.
	EventID string
	// Type is the event type, e.g. "ORDER_PAID".
	Type string
	// Key is the aggregate key (biz_id).
	Key string
	// Version is the payload version.
	Version int
	// Sequence is the producer's outbox row id (0 when absent).
	Sequence int64
	// CreatedAt is when the event was written (zero when absent).
	CreatedAt time.Time
	// Headers holds all message metadata, including the keys above.
	Headers map[string]string
}

// ParseMeta reads Meta from message metadata. The event id falls back to
// fallbackID (the message UUID) when the metadata lacks it. A missing or
// malformed type or version is an error: the message did not come from an
// outbox relay, or was damaged, and belongs on the poison path.
func ParseMeta(md map[string]string, fallbackID string) (Meta, error) {
	m := Meta{EventID: md[MetadataEventID], Type: md[MetadataType], Key: md[MetadataKey], Headers: md}
	if m.EventID == "" {
		m.EventID = fallbackID
	}
	if m.EventID == "" {
		return Meta{}, fmt.Errorf("outbox: message has no event id (metadata %q or message UUID)", MetadataEventID)
	}
	if m.Type == "" {
		return Meta{}, fmt.Errorf("outbox: message %s has no %q metadata: was it published by an outbox relay?", m.EventID, MetadataType)
	}
	v, err := strconv.Atoi(md[MetadataVersion])
	if err != nil || v < 1 {
		return Meta{}, fmt.Errorf("outbox: message %s has an invalid %q metadata value %q", m.EventID, MetadataVersion, md[MetadataVersion])
	}
	m.Version = v
	if s := md[MetadataSequence]; s != "" {
		n, err := strconv.ParseInt(s, 10, 64)
		if err != nil {
			return Meta{}, fmt.Errorf("outbox: message %s has an invalid %q metadata value %q", m.EventID, MetadataSequence, s)
		}
		m.Sequence = n
	}
	if s := md[MetadataCreatedAt]; s != "" {
		t, err := time.Parse(time.RFC3339Nano, s)
		if err != nil {
			return Meta{}, fmt.Errorf("outbox: message %s has an invalid %q metadata value %q", m.EventID, MetadataCreatedAt, s)
		}
		m.CreatedAt = t
	}
	return m, nil
}
