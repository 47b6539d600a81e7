package outbox

import (
	"errors"
	"fmt"

	"github.com/outboxgen/outboxgen/runtime/dialect"
)

// ErrInvalidEvent is matched (with errors.Is) by every payload validation
// failure, both before an insert and after decoding.
var ErrInvalidEvent = errors.New("invalid event")

// ErrDuplicateEventID is matched (with errors.Is) by the error of an insert
// with a caller-chosen event id (WithEventID) that the outbox table already
// holds for another event: another type, key or topic. One event id cannot
// name two events; derive ids from everything that identifies the event.
var ErrDuplicateEventID = errors.New("event id already used by another event")

// The outbox table's column sizes, in characters: Prepare refuses longer
// values before any SQL runs.
const (
	// MaxTypeLen is the size of biz_type, the event type.
	MaxTypeLen = dialect.MaxTypeLen
	// MaxKeyLen is the size of biz_id, the key.
	MaxKeyLen = dialect.MaxKeyLen
	// MaxTopicLen is the size of topic.
	MaxTopicLen = dialect.MaxTopicLen
)

// DuplicateEventIDError says which event a caller-chosen event id already
// names in the outbox table. It matches ErrDuplicateEventID.
type DuplicateEventIDError struct {
	// ID is the event id.
	ID EventID
	// Type, Key and Topic are those of the event being inserted.
	Type, Key, Topic string
	// HasType, HasKey and HasTopic are those of the row already stored.
	HasType, HasKey, HasTopic string
}

func (e *DuplicateEventIDError) Error() string {
	return fmt.Sprintf("outbox: insert %s (key %q, topic %q): %s: the outbox already holds event id %s for %s (key %q, topic %q); give each event its own id",
		e.Type, e.Key, e.Topic, ErrDuplicateEventID, e.ID, e.HasType, e.HasKey, e.HasTopic)
}

// Is makes errors.Is(err, ErrDuplicateEventID) true.
func (e *DuplicateEventIDError) Is(target error) bool { return target == ErrDuplicateEventID }

// InvalidEventError says which field of which event type is wrong and why.
type InvalidEventError struct {
	// Type is the event type, e.g. "ORDER_PAID".
	Type string
	// Field is the JSON field path, e.g. "order_id" or "items[2].sku";
	// empty when the problem is not one field's.
	Field string
	// Reason says what is wrong.
	Reason string
}

func (e *InvalidEventError) Error() string {
	if e.Field == "" {
		return fmt.Sprintf("outbox: invalid %s event: %s", e.Type, e.Reason)
	}
	return fmt.Sprintf("outbox: invalid %s event: %s: %s", e.Type, e.Field, e.Reason)
}

// Is makes errors.Is(err, ErrInvalidEvent) true.
func (e *InvalidEventError) Is(target error) bool { return target == ErrInvalidEvent }

// Invalid returns an *InvalidEventError; generated Validate methods use it.
func Invalid(eventType, field, reason string) error {
	return &InvalidEventError{Type: eventType, Field: field, Reason: reason}
}

// WithinField prefixes the field path of an *InvalidEventError returned by
// a nested Validate (an object field or a list element), and stamps the
// event type on it. Other errors are returned unchanged.
func WithinField(err error, eventType, field string) error {
	var ie *InvalidEventError
	if !errors.As(err, &ie) {
		return err
	}
	out := *ie
	out.Type = eventType
	if out.Field == "" {
		out.Field = field
	} else if out.Field[0] == '[' {
		out.Field = field + out.Field
	} else {
		out.Field = field + "." + out.Field
	}
	return &out
}
