package outbox

import (
	"errors"
	"fmt"
)

// ErrInvalidEvent is matched (with errors.Is) by every payload validation
// failure, both before an insert and after decoding.
var ErrInvalidEvent = errors.New("invalid event")

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
