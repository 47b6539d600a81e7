package outbox

import (
	"encoding/json"
	"errors"
	"fmt"
)

// ErrUndecodable is matched (with errors.Is) when a payload cannot be
// decoded: bad JSON, a wrong shape, or a version this build does not know.
// Consumers route such messages to the poison path instead of retrying.
var ErrUndecodable = errors.New("undecodable event payload")

// DecodeError describes an undecodable payload.
type DecodeError struct {
	Type   string
	Reason string
	Err    error
}

func (e *DecodeError) Error() string {
	if e.Err != nil {
		return fmt.Sprintf("outbox: cannot decode %s payload: %s: %v", e.Type, e.Reason, e.Err)
	}
	return fmt.Sprintf("outbox: cannot decode %s payload: %s", e.Type, e.Reason)
}

// Is makes errors.Is(err, ErrUndecodable) true.
func (e *DecodeError) Is(target error) bool { return target == ErrUndecodable }

// Unwrap returns the underlying JSON error, if any.
func (e *DecodeError) Unwrap() error { return e.Err }

// DecodePayload unmarshals payload into v after checking its version:
// versions from 1 up to current (the version this build was generated
// with) are accepted, because payload changes are additive; a newer version
// is refused rather than half-understood. Generated DecodeX functions call
// it and then validate the result.
func DecodePayload(eventType string, payload []byte, version, current int, v any) error {
	if version < 1 {
		return &DecodeError{Type: eventType, Reason: fmt.Sprintf("payload version %d is not valid (versions start at 1)", version)}
	}
	if version > current {
		return &DecodeError{Type: eventType, Reason: fmt.Sprintf("payload version %d is newer than this build understands (%d): regenerate with the producer's events.yaml", version, current)}
	}
	if err := json.Unmarshal(payload, v); err != nil {
		return &DecodeError{Type: eventType, Reason: "invalid JSON", Err: err}
	}
	return nil
}
