// Package outmsg builds the watermill message of one outbox event: the one
// place that decides what a published message looks like. The polling
// relay (package relay, from an outbox row) and the streaming relay
// (package walrelay, from a WAL message) both publish through it, so a
// consumer cannot tell which relay sent an event, and an event the stream
// parks into the table and the polling relay then publishes looks the same
// as if the stream had published it.
package outmsg

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/outboxgen/outboxgen/runtime/outbox"
)

// Event is what a message is built from: the columns of an outbox row, or
// the fields of a decoded WAL envelope.
type Event struct {
	// EventID is the event id (the message UUID and outbox_event_id).
	EventID string
	// Seq is the row id, or the sequence value the WAL writer took (the
	// same sequence): outbox_seq.
	Seq int64
	// Type, Key and Version are biz_type, biz_id and the payload version.
	Type, Key string
	Version   int
	// CreatedAt is when the event was written.
	CreatedAt time.Time
	// Headers is the stored headers' JSON object; nil, empty or JSON null
	// for none.
	Headers []byte
	// Payload is the stored payload (see outbox.DecodeStoredPayload).
	Payload []byte
}

// Build returns ev's message with ctx as its context. The stored headers
// become metadata first; then the outbox_* keys and partition_key are set
// from the event's fields, so a stored header can never override them.
// The payload-encoding header is consumed (the payload is decoded), not
// passed on. An error means ev can never be published (its headers or
// payload are malformed): callers mark it permanent.
func Build(ctx context.Context, ev Event) (*message.Message, error) {
	var h map[string]string
	if len(ev.Headers) > 0 && string(ev.Headers) != "null" {
		if err := json.Unmarshal(ev.Headers, &h); err != nil {
			return nil, fmt.Errorf("headers are not a JSON object of strings: %w", err)
		}
	}
	payload, err := outbox.DecodeStoredPayload(h[outbox.HeaderPayloadEncoding], ev.Payload)
	if err != nil {
		return nil, err
	}
	delete(h, outbox.HeaderPayloadEncoding)
	msg := message.NewMessage(ev.EventID, payload)
	for k, v := range h {
		msg.Metadata.Set(k, v)
	}
	msg.Metadata.Set(outbox.MetadataType, ev.Type)
	msg.Metadata.Set(outbox.MetadataKey, ev.Key)
	msg.Metadata.Set(outbox.MetadataVersion, strconv.Itoa(ev.Version))
	msg.Metadata.Set(outbox.MetadataCreatedAt, ev.CreatedAt.UTC().Format(time.RFC3339Nano))
	msg.Metadata.Set(outbox.MetadataEventID, ev.EventID)
	msg.Metadata.Set(outbox.MetadataSequence, strconv.FormatInt(ev.Seq, 10))
	msg.Metadata.Set(outbox.MetadataPartitionKey, ev.Key)
	msg.SetContext(ctx)
	return msg, nil
}
