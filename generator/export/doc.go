// Package export describes the events of a validated events.yaml (package
// spec) for everyone who does not use the generated Go code: non-Go
// consumers, schema registries, event catalogs and documentation tools.
//
// AsyncAPI writes an AsyncAPI 3.0.0 document (YAML, or JSON with
// WithFormat(JSON)); JSONSchema writes one JSON Schema (draft 2020-12) per
// payload version of every event: the current version and each earlier
// version declared under the event's previous: list. `outboxgen export
// asyncapi` and `outboxgen export jsonschema` run them. Output is
// deterministic: the same spec gives the same bytes.
//
// # Payload schemas
//
// The schemas describe the JSON the generated Go code writes (with
// encoding/json, from the generated structs) and accept only JSON the
// generated decoders read back. Per field type:
//
//	string               {"type": "string"}
//	bool                 {"type": "boolean"}
//	int32                {"type": "integer"} within [-2^31, 2^31-1]
//	int64                {"type": "integer"} within [-2^63, 2^63-1]: a JSON number, not a
//	                     string (readers without 64-bit integers, such as JavaScript's
//	                     Number, must parse it as a big integer)
//	float64              {"type": "number"}
//	bytes                {"type": "string", "contentEncoding": "base64"}: standard base64
//	                     with padding, checked by a pattern
//	time                 {"type": "string", "format": "date-time"}: RFC 3339 as Go writes and
//	                     reads it (upper-case T and Z, seconds, optional fraction), checked
//	                     by a pattern too, as many validators do not assert formats
//	uuid                 {"type": "string", "format": "uuid"} and a pattern
//	decimal              {"type": "number"}: the exact digits (encoding/json.Number); with
//	                     a go_type, a number or a string of one (decimal libraries write
//	                     strings)
//	json                 {}: any JSON value
//	list<T>              {"type": "array", "items": T}
//	map<T>               {"type": "object", "additionalProperties": T}
//	enum type            {"type": "string", "enum": [...]} (in "$defs" / components)
//	object type          {"type": "object", ...} (in "$defs" / components)
//
// Required fields are listed in "required": the generated structs always
// write them. A required list, map, bytes or json field, and a list, map
// or bytes value inside a list or map, may be null, because Go writes a nil
// slice or map as null; so may a required go_type pointer. Optional fields
// are omitted when unset (omitempty), never null. Objects accept members
// they do not declare: adding an optional field is a compatible change
// that keeps the version, so readers of a version must ignore new members
// (as the generated decoders do). A go_type field is described by its spec
// type (a decimal excepted, see above): a go_type must marshal as its spec
// type says.
//
// Limits of JSON Schema: an integer written as 1.0 or 1e2 validates as an
// integer but the generated decoders refuse it; write integers without a
// fraction or exponent.
//
// # The AsyncAPI document
//
// The document describes the application that owns events.yaml: it sends
// every event (the generated InsertX writers, published by the relay) and
// receives the events its declared consumers handle. Each topic is a
// channel (its address is the topic; its id is the topic with characters
// other than letters, digits, '.', '_' and '-' replaced by '_'). Each
// payload version is a message: the current one has the event type as its
// id (ORDER_PAID), an earlier one the type and version (ORDER_PAID.v1).
// Send operations (sendOrderPaid) carry the current version only; receive
// operations (points.receiveOrderPaid) every version the consumer decodes.
//
// Every message has the headers the relay sets (runtime/outbox's Metadata*
// keys): outbox_type and outbox_version, fixed per message with "const"
// so that the messages of one channel are told apart by them, outbox_key
// and partition_key (the event's key, in the format of the key field),
// outbox_event_id, outbox_created_at and outbox_seq; the common part is
// components/schemas/OutboxHeaders. The key is also the message's
// correlationId ($message.header#/outbox_key) and its Kafka binding's
// record key (what runtime/brokers/kafka publishes with). An x-outboxgen
// extension on each message names the event, version, topic, key field
// and ordering; receive operations carry x-outboxgen-consumer. (The JSON
// Schema files use standard keywords only, as strict validators such as
// Ajv refuse unknown ones; they say the same in their title and
// description.)
//
// Payload and type schemas in the document are AsyncAPI Schema Objects
// (a superset of JSON Schema draft-07): the same schemas as the JSON Schema
// files, with references to components/schemas instead of "$defs".
package export
