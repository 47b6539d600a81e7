package outbox

import (
	"database/sql/driver"
	"fmt"

	"github.com/google/uuid"
)

// EventID is the globally unique id of an event: a UUIDv7, generated in Go
// when the event is written, so it is time-ordered and never collides with
// another service's ids (unlike the table's auto-increment id). Consumers
// deduplicate by it.
type EventID uuid.UUID

// NewEventID returns a new time-ordered UUIDv7.
func NewEventID() EventID {
	// uuid.NewV7 fails only when the system's random source does, which
	// Go treats as fatal everywhere else too.
	return EventID(uuid.Must(uuid.NewV7()))
}

// ParseEventID parses the canonical textual form of an event id.
func ParseEventID(s string) (EventID, error) {
	u, err := uuid.Parse(s)
	if err != nil {
		return EventID{}, fmt.Errorf("outbox: invalid event id %q: %w", s, err)
	}
	return EventID(u), nil
}

// String returns the canonical form, e.g. "0190f3c8-7a4e-7b1c-9d2e-1f2a3b4c5d6e".
func (id EventID) String() string { return uuid.UUID(id).String() }

// IsZero reports whether id is the zero (unset) id.
func (id EventID) IsZero() bool { return id == EventID{} }

// MarshalText implements encoding.TextMarshaler.
func (id EventID) MarshalText() ([]byte, error) { return uuid.UUID(id).MarshalText() }

// UnmarshalText implements encoding.TextUnmarshaler.
func (id *EventID) UnmarshalText(b []byte) error {
	return (*uuid.UUID)(id).UnmarshalText(b)
}

// Value implements driver.Valuer: event ids are stored in their textual form.
func (id EventID) Value() (driver.Value, error) { return id.String(), nil }

// Scan implements sql.Scanner.
func (id *EventID) Scan(src any) error {
	return (*uuid.UUID)(id).Scan(src)
}
