// Package spec reads events.yaml into a validated model.
//
// Parse reports every problem it finds at once, each as
// "file:line:col: message", and never panics on bad input. A *Spec returned
// without error is fully resolved: every type reference points at its
// declaration, every Go name is computed and unique, every SQL identifier is
// safe to splice into DDL.
package spec

import (
	"path/filepath"
	"strconv"
	"strings"
	"unicode"
)

// Driver selects the transaction type the generated writers take.
type Driver string

// The supported drivers.
const (
	// DriverDatabaseSQL makes writers take *sql.Tx (any dialect).
	DriverDatabaseSQL Driver = "database/sql"
	// DriverPgx makes writers take pgx.Tx (PostgreSQL only).
	DriverPgx Driver = "pgx/v5"
)

// Dialect names a SQL database family.
type Dialect string

// The supported dialects.
const (
	Postgres Dialect = "postgres"
	MySQL    Dialect = "mysql" // MySQL 8 and MariaDB 10.6+
	SQLite   Dialect = "sqlite"
)

// Pos is a position in the spec file (1-based line and column).
type Pos struct {
	Line, Col int
}

// Spec is a validated events.yaml.
type Spec struct {
	// File is the path the spec was read from, as given to Parse.
	File string
	// Version is the file format version (1).
	Version int

	Go  GoOutput
	SQL SQLOutput

	// Types are the named object and enum types, in file order.
	Types []*Type
	// Events are the declared events, in file order.
	Events []*Event
	// EventsPos is the position of the events: list (the compatibility
	// check places findings about removed events there).
	EventsPos Pos
	// Consumers are the declared consumers, in file order.
	Consumers []*Consumer
}

// GoOutput is the `go:` section.
type GoOutput struct {
	// Package is the Go package name of the generated code.
	Package string
	// Out is the output directory, relative to the spec file's directory.
	Out string
	// Driver is the transaction flavour of the generated writers.
	Driver Driver
}

// SQLOutput is the `sql:` section.
type SQLOutput struct {
	// Dialects are the dialects to emit DDL for, in file order. The first
	// one is also the dialect the generated Go writer targets by default.
	Dialects []Dialect
	// Out is the directory for the DDL files, relative to the spec file's
	// directory. Empty means no DDL files are written.
	Out string
	// OutboxTable is the outbox table name (default "outbox_event").
	OutboxTable string
	// InboxTable is the consumer idempotency table name (default "outbox_inbox").
	InboxTable string
	// ArchiveTable, when set, adds an archive table to the DDL: the janitor
	// can move sent rows there instead of deleting them.
	ArchiveTable string
	// WAL is sql.wal: the PostgreSQL writers write events into the WAL
	// (pg_logical_emit_message) for the streaming relay (runtime/walrelay)
	// instead of inserting them into the outbox table. It needs postgres
	// in Dialects; writers of other dialects keep the table. One setting
	// per outbox, not per event: all events of an outbox share one slot
	// and one per-key order. WALPos is its position when written.
	WAL    bool
	WALPos Pos
	// Pos is the position of the sql: mapping; OutboxTablePos,
	// InboxTablePos and ArchiveTablePos those of the table names when
	// written (zero when defaulted).
	Pos                                            Pos
	OutboxTablePos, InboxTablePos, ArchiveTablePos Pos
}

// Type is a named, reusable type: an object (Fields) or an enum (Values).
type Type struct {
	// Name is the name as written, and also the Go type name (PascalCase).
	Name        string
	Description string
	// Fields is set for object types.
	Fields []*Field
	// Values is set for enum types (string values, in file order).
	Values []*EnumValue
	Pos    Pos
}

// IsEnum reports whether t is an enum type.
func (t *Type) IsEnum() bool { return t.Values != nil }

// EnumValue is one value of an enum.
type EnumValue struct {
	// Value is the wire value (a string in JSON).
	Value string
	// GoName is the Go constant name: type name + PascalCase(value), or
	// as go.rename says.
	GoName string
	Pos    Pos
}

// Event is one declared event type.
type Event struct {
	// Name is the SCREAMING_SNAKE event type, e.g. ORDER_PAID. It is the
	// outbox row's biz_type.
	Name string
	// GoName is the PascalCase Go name, e.g. OrderPaid.
	GoName      string
	Description string
	// Topic is the broker topic the relay publishes to.
	Topic string
	// Key is the field whose value becomes biz_id: the aggregate id whose
	// events are kept in order. It is always a required scalar field of
	// Fields.
	Key *Field
	// Version is the payload schema version (>= 1, default 1).
	Version int
	// Ordered asks the relay to publish events with the same key in id
	// order (default true).
	Ordered bool
	// Fields are the fields of the current version (Version).
	Fields []*Field
	// Previous are the earlier versions consumers still decode (the
	// event's previous: list), in ascending version order. A version below
	// Version that is not listed is not decodable.
	Previous []*EventVersion
	Pos      Pos
}

// EventVersion is an earlier version of an event's payload, declared under
// the event's previous: list so that payloads written before a version bump
// stay decodable.
type EventVersion struct {
	// Version is the payload version, at least 1 and below the event's
	// Version; unique within the event.
	Version int
	// GoName is the Go struct name: the event's GoName, "V" and the
	// version, e.g. OrderPaidV1.
	GoName      string
	Description string
	// Fields are that version's payload fields, resolved as the current
	// version's are.
	Fields []*Field
	Pos    Pos
}

// Versions returns the payload versions consumers of e decode: the
// previous ones in ascending order, then the current one.
func (e *Event) Versions() []int {
	out := make([]int, 0, len(e.Previous)+1)
	for _, v := range e.Previous {
		out = append(out, v.Version)
	}
	return append(out, e.Version)
}

// VersionFields returns the fields of payload version v of e (the current
// or a previous one), or nil when e does not declare v.
func (e *Event) VersionFields(v int) []*Field {
	if v == e.Version {
		return e.Fields
	}
	if pv := e.PreviousVersion(v); pv != nil {
		return pv.Fields
	}
	return nil
}

// PreviousVersion returns the declared previous version v of e, or nil.
func (e *Event) PreviousVersion(v int) *EventVersion {
	for _, pv := range e.Previous {
		if pv.Version == v {
			return pv
		}
	}
	return nil
}

// Upgrader returns the name of the hand-written function that turns a
// payload of previous version pv into the next declared version (the next
// previous one, or the current one): "Upgrade" + pv.GoName, and that next
// version's Go type.
func (e *Event) Upgrader(pv *EventVersion) (fn, to string) {
	to = e.GoName
	for i, x := range e.Previous {
		if x == pv && i+1 < len(e.Previous) {
			to = e.Previous[i+1].GoName
		}
	}
	return "Upgrade" + pv.GoName, to
}

// Field is one field of an event or object type.
type Field struct {
	// Name is the name as written; it is the JSON name.
	Name string
	// GoName is the exported Go field name (order_id -> OrderID).
	GoName      string
	Description string
	Optional    bool
	Type        *TypeRef
	Pos         Pos
}

// Kind classifies a TypeRef.
type Kind int

// The kinds of type references.
const (
	KindScalar Kind = iota // a built-in scalar, see Scalar
	KindList               // list<Elem>
	KindMap                // map<Elem> (string keys)
	KindNamed              // a Type declared in `types:`
)

// Scalar is a built-in scalar type.
type Scalar string

// The built-in scalars.
const (
	String  Scalar = "string"
	Bool    Scalar = "bool"
	Int32   Scalar = "int32"
	Int64   Scalar = "int64"
	Float64 Scalar = "float64"
	Bytes   Scalar = "bytes"
	Time    Scalar = "time"
	UUID    Scalar = "uuid"
	Decimal Scalar = "decimal"
	JSON    Scalar = "json"
)

// TypeRef is a resolved field type.
type TypeRef struct {
	Kind Kind
	// Scalar is set for KindScalar.
	Scalar Scalar
	// Elem is set for KindList and KindMap.
	Elem *TypeRef
	// Named is set for KindNamed.
	Named *Type
	// GoType, when set, overrides the Go type of this field (any kind).
	GoType *GoType
}

// GoType is a `go_type` override: a type from another package, as in sqlc's
// overrides. The type must marshal to and from JSON.
type GoType struct {
	// Import is the import path, empty for predeclared types.
	Import string
	// Name is the type name within that package, e.g. "Decimal".
	Name string
	// Pointer makes the field a pointer to the type.
	Pointer bool
}

// Consumer is a declared consumer and the events it handles.
type Consumer struct {
	// Name is the snake_case consumer name as written; it is the inbox
	// table's consumer column value.
	Name string
	// GoName is the PascalCase Go name.
	GoName      string
	Description string
	// Events are the handled events, in the order listed.
	Events []*Event
	// LatestOnly are the events of Events under the stale guard (the
	// consumer's latest_only list), in the order listed: an event older
	// than the newest one applied for its key is skipped. Right for state
	// events (last writer wins), wrong for deltas.
	LatestOnly []*Event
	Pos        Pos
}

// IsLatestOnly reports whether c handles e under the stale guard.
func (c *Consumer) IsLatestOnly(e *Event) bool {
	for _, x := range c.LatestOnly {
		if x == e {
			return true
		}
	}
	return false
}

// SourceName is the spec file as generated code and DDL cite it (in their
// header, "source: ...", and in doc comments): its base name, as sqlc cites
// its query files, so that the output does not depend on the directory
// outboxgen ran in; "events.yaml" for a spec parsed without a file name.
// A name made of anything but letters, digits, spaces and the punctuation
// ._-+()[]@,~ is quoted with escapes (strconv.QuoteToASCII), so that it can
// neither end a comment line nor hide characters in it.
func (s *Spec) SourceName() string {
	if s.File == "" {
		return "events.yaml"
	}
	name := filepath.Base(filepath.ToSlash(s.File))
	for _, r := range name {
		if !unicode.IsLetter(r) && !unicode.IsDigit(r) && !strings.ContainsRune(" ._-+()[]@,~", r) {
			return strconv.QuoteToASCII(name)
		}
	}
	return name
}
