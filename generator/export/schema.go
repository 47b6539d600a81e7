package export

import (
	"fmt"
	"math"
	"strings"

	"github.com/outboxgen/outboxgen/generator/spec"
)

// dialect is the JSON Schema flavour a schema is written in.
type dialect int

const (
	// draft2020 is JSON Schema draft 2020-12 (the standalone files):
	// named types go to "$defs", and "$ref" may have sibling keywords.
	draft2020 dialect = iota
	// asyncAPISchema is the AsyncAPI 3.0 Schema Object, a superset of
	// draft-07: named types go to "components/schemas", and "$ref" siblings
	// would be ignored, so a described reference is wrapped in allOf.
	asyncAPISchema
)

// Patterns that make the formats checkable by any validator, including
// the many that treat "format" as an annotation only. Each matches what
// the generated Go code writes, and only what it reads back.
const (
	// patternDateTime is RFC 3339 as Go's time.Time marshals it
	// (time.RFC3339Nano) and parses it: an upper-case T and Z, seconds
	// always present (no leap second), an optional fraction.
	patternDateTime = `^[0-9]{4}-(0[1-9]|1[0-2])-(0[1-9]|[12][0-9]|3[01])T([01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9](\.[0-9]+)?(Z|[+-]([01][0-9]|2[0-3]):[0-5][0-9])$`
	// patternUUID is the textual UUID form github.com/google/uuid writes
	// (lower case); it reads upper case too.
	patternUUID = `^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$`
	// patternBase64 is standard base64 with padding (encoding/json's
	// encoding of []byte, base64.StdEncoding).
	patternBase64 = `^(?:[A-Za-z0-9+/]{4})*(?:[A-Za-z0-9+/]{2}==|[A-Za-z0-9+/]{3}=)?$`
	// patternDecimal is a JSON number written as a string, as decimal
	// libraries such as github.com/shopspring/decimal marshal by default.
	patternDecimal = `^-?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?$`
	// patternInteger is an integer key as the outbox stores it (decimal).
	patternInteger = `^-?(0|[1-9][0-9]*)$`
)

// builder writes the JSON Schema of payload fields and named types.
type builder struct {
	d dialect
	// used records the named types referenced so far, so that the
	// standalone schema defines exactly the ones it needs.
	used map[*spec.Type]bool
}

func newBuilder(d dialect) *builder {
	return &builder{d: d, used: map[*spec.Type]bool{}}
}

// refTo returns the reference to named type t, and records its use.
func (b *builder) refTo(t *spec.Type) obj {
	b.used[t] = true
	if b.d == asyncAPISchema {
		return obj{{"$ref", "#/components/schemas/" + t.Name}}
	}
	return obj{{"$ref", "#/$defs/" + t.Name}}
}

// object returns the schema of an object with fields: every required
// field is listed in "required" (the generated structs always write it),
// and other properties are allowed, because adding an optional field is a
// compatible change that keeps the version: readers of this version must
// accept it.
func (b *builder) object(fields []*spec.Field) obj {
	s := obj{{"type", "object"}}
	props := obj{}
	var required []any
	for _, f := range fields {
		props.set(f.Name, b.field(f))
		if !f.Optional {
			required = append(required, f.Name)
		}
	}
	if len(props) > 0 {
		s.set("properties", props)
	}
	if len(required) > 0 {
		s.set("required", required)
	}
	return s
}

// field returns the schema of one field's value.
func (b *builder) field(f *spec.Field) obj {
	s := b.typ(f.Type, fieldNullable(f))
	return b.describe(s, f.Description)
}

// fieldNullable reports whether the generated Go code can write null for
// field f. A required field is written even when its Go value is nil: a
// nil slice, map, []byte or json.RawMessage, or a go_type pointer, is
// null. An optional field is omitted instead (omitempty), never null.
func fieldNullable(f *spec.Field) bool {
	if f.Optional {
		return false
	}
	if gt := f.Type.GoType; gt != nil && gt.Pointer {
		return true
	}
	return nilable(f.Type)
}

// nilable reports whether a Go value of type ref can be nil (and so be
// written as null): slices, maps, []byte and json.RawMessage.
func nilable(ref *spec.TypeRef) bool {
	switch ref.Kind {
	case spec.KindList, spec.KindMap:
		return true
	case spec.KindScalar:
		return ref.Scalar == spec.Bytes || ref.Scalar == spec.JSON
	}
	return false
}

// typ returns the schema of type ref; nullable adds null to it.
func (b *builder) typ(ref *spec.TypeRef, nullable bool) obj {
	var s obj
	switch ref.Kind {
	case spec.KindScalar:
		s = scalar(ref.Scalar, ref.GoType != nil)
	case spec.KindList:
		s = obj{{"type", "array"}, {"items", b.typ(ref.Elem, nilable(ref.Elem))}}
	case spec.KindMap:
		s = obj{{"type", "object"}, {"additionalProperties", b.typ(ref.Elem, nilable(ref.Elem))}}
	case spec.KindNamed:
		s = b.refTo(ref.Named)
	}
	if nullable {
		s = orNull(s)
	}
	return s
}

// orNull returns s extended to accept null.
func orNull(s obj) obj {
	if len(s) == 0 { // any JSON value: null included
		return s
	}
	if t, ok := s.get("type").(string); ok {
		out := append(obj(nil), s...)
		out.set("type", []any{t, "null"})
		return out
	}
	if alts, ok := s.get("anyOf").([]any); ok {
		out := append(obj(nil), s...)
		out.set("anyOf", append(append([]any(nil), alts...), obj{{"type", "null"}}))
		return out
	}
	return obj{{"anyOf", []any{s, obj{{"type", "null"}}}}}
}

// describe adds a description to s. In the AsyncAPI dialect (draft-07)
// keywords beside "$ref" are ignored, so a reference is wrapped.
func (b *builder) describe(s obj, description string) obj {
	description = strings.TrimSpace(description)
	if description == "" {
		return s
	}
	if b.d == asyncAPISchema && s.get("$ref") != nil {
		return obj{{"description", description}, {"allOf", []any{s}}}
	}
	return append(obj{{"description", description}}, s...)
}

// scalar returns the schema of a built-in scalar as the generated Go code
// marshals it (see README "Field types"). goType reports a go_type
// override: its value is described by the spec type, except a decimal,
// which decimal libraries write as a string or a number.
func scalar(sc spec.Scalar, goType bool) obj {
	switch sc {
	case spec.String:
		return obj{{"type", "string"}}
	case spec.Bool:
		return obj{{"type", "boolean"}}
	case spec.Int32:
		return obj{{"type", "integer"}, {"minimum", int64(math.MinInt32)}, {"maximum", int64(math.MaxInt32)}}
	case spec.Int64:
		// A JSON number, not a string: exact in Go, Java and any reader
		// with 64-bit integers; JavaScript's Number keeps only 53 bits.
		return obj{{"type", "integer"}, {"minimum", int64(math.MinInt64)}, {"maximum", int64(math.MaxInt64)}}
	case spec.Float64:
		return obj{{"type", "number"}}
	case spec.Bytes:
		return obj{{"type", "string"}, {"contentEncoding", "base64"}, {"pattern", patternBase64}}
	case spec.Time:
		return obj{{"type", "string"}, {"format", "date-time"}, {"pattern", patternDateTime}}
	case spec.UUID:
		return obj{{"type", "string"}, {"format", "uuid"}, {"pattern", patternUUID}}
	case spec.Decimal:
		if goType {
			return obj{{"anyOf", []any{
				obj{{"type", "number"}},
				obj{{"type", "string"}, {"pattern", patternDecimal}},
			}}}
		}
		// encoding/json.Number: the exact digits, written as a number.
		return obj{{"type", "number"}}
	case spec.JSON:
		return obj{} // any JSON value
	}
	panic(fmt.Sprintf("export: unknown scalar type %q", sc))
}

// named returns the schema of named type t (an enum or an object).
func (b *builder) named(t *spec.Type) obj {
	var s obj
	if t.IsEnum() {
		values := make([]any, len(t.Values))
		for i, v := range t.Values {
			values[i] = v.Value
		}
		s = obj{{"type", "string"}, {"enum", values}}
	} else {
		s = b.object(t.Fields)
	}
	head := obj{{"title", t.Name}}
	if d := strings.TrimSpace(t.Description); d != "" {
		head.set("description", d)
	}
	return append(head, s...)
}

// definitions returns the schemas of every named type used so far and of
// those they use in turn, in the order of types: in the spec.
func (b *builder) definitions(s *spec.Spec) obj {
	defs := map[*spec.Type]obj{}
	for changed := true; changed; {
		changed = false
		for _, t := range s.Types {
			if b.used[t] && defs[t] == nil {
				defs[t] = b.named(t)
				changed = true
			}
		}
	}
	out := obj{}
	for _, t := range s.Types {
		if d := defs[t]; d != nil {
			out.set(t.Name, d)
		}
	}
	return out
}

// payloadVersion is one version of an event's payload: the current one
// (Event.Fields) or one declared under previous:.
type payloadVersion struct {
	event   *spec.Event
	version int
	// goName is the Go struct of this version: OrderPaid, OrderPaidV1.
	goName      string
	description string
	fields      []*spec.Field
	current     bool
}

// versions returns every payload version of e consumers decode, the
// current one first, then the previous ones from the newest down.
func versions(e *spec.Event) []payloadVersion {
	out := []payloadVersion{{event: e, version: e.Version, goName: e.GoName, description: e.Description, fields: e.Fields, current: true}}
	for i := len(e.Previous) - 1; i >= 0; i-- {
		pv := e.Previous[i]
		out = append(out, payloadVersion{event: e, version: pv.Version, goName: pv.GoName, description: pv.Description, fields: pv.Fields})
	}
	return out
}

// title is the schema title of payload version v, e.g. "ORDER_PAID v2".
func (v payloadVersion) title() string {
	return fmt.Sprintf("%s v%d", v.event.Name, v.version)
}

// describeVersion is the description of a payload version's schema.
func (v payloadVersion) describeVersion() string {
	e := v.event
	var b strings.Builder
	if d := strings.TrimSpace(v.description); d != "" {
		b.WriteString(d)
		b.WriteString("\n\n")
	}
	fmt.Fprintf(&b, "Payload of event %s, version %d", e.Name, v.version)
	if v.current {
		b.WriteString(" (the current version: producers write it)")
	} else {
		fmt.Fprintf(&b, " (an earlier version, still accepted; the current one is %d)", e.Version)
	}
	fmt.Fprintf(&b, ", on topic %s. The message header outbox_version holds the version, outbox_key the event's key", e.Topic)
	if v.current {
		fmt.Fprintf(&b, " (field %s)", e.Key.Name)
	}
	b.WriteString(".")
	if !e.Ordered {
		b.WriteString(" The event is unordered: events with the same key may arrive in any order.")
	}
	return b.String()
}
