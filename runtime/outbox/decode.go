package outbox

import (
	"encoding/base64"
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

// Stored payload encodings. The payload column holds JSON; a producer that
// must carry arbitrary bytes (package txpublisher's Config.BinaryPayloads)
// stores them as a JSON string of base64 and says so in this header. The
// relay decodes such payloads back to the exact bytes before publishing and
// does not pass the header on.
const (
	HeaderPayloadEncoding = "outbox_payload_encoding"
	PayloadEncodingBase64 = "base64"
)

// DecodeStoredPayload returns the message bytes of a stored payload, given
// its HeaderPayloadEncoding header value: stored itself when encoding is ""
// (a JSON payload), the decoded bytes for PayloadEncodingBase64, and an
// error otherwise (the row was written by a newer outboxgen).
func DecodeStoredPayload(encoding string, stored []byte) ([]byte, error) {
	switch encoding {
	case "":
		return stored, nil
	case PayloadEncodingBase64:
		var s string
		if err := json.Unmarshal(stored, &s); err != nil {
			return nil, fmt.Errorf("outbox: payload marked %s=%s is not a JSON string: %w", HeaderPayloadEncoding, encoding, err)
		}
		b, err := base64.StdEncoding.DecodeString(s)
		if err != nil {
			return nil, fmt.Errorf("outbox: payload marked %s=%s is not base64: %w", HeaderPayloadEncoding, encoding, err)
		}
		return b, nil
	}
	return nil, fmt.Errorf("outbox: unknown payload encoding %s=%q: upgrade the relay to the writer's outboxgen version", HeaderPayloadEncoding, encoding)
}
