// Package compat compares two versions of an events.yaml, as `buf
// breaking` compares two versions of a protobuf schema: it reports every
// change that breaks a producer or consumer built from the other version,
// while events of both are in flight (in outboxes, on brokers, in
// replays). `outboxgen check -against BASE` runs it.
//
// Both specs are validated models (package spec). Findings are placed in
// the new file: at the changed field, event or table name, or, for
// something removed, at its parent (the event, type or previous version
// that held it) in the new file, with the base position in the message.
//
// # Rules
//
// Payload rules are about the JSON of one event type. A version bump of
// the event allows them: the consumer generated from the new spec decodes
// the base's payloads as the earlier version declared under previous:, and
// upgrades them with a hand-written function (see package gocode).
//
//	rule                  breaking change                      what it protects
//	FIELD_REMOVED         a field removed (or renamed)         consumers of the base read it; a rename is a removal plus an addition
//	FIELD_TYPE_CHANGED    a field's type changed               decoding: int32 -> string fails on every payload of the other side
//	ELEMENT_TYPE_CHANGED  a list's or map's element type       the same, inside list<T> and map<T>
//	FIELD_MADE_REQUIRED   optional -> required                 payloads written without the field are still in flight
//	FIELD_MADE_OPTIONAL   required -> optional                 consumers of the base read an absent field as its zero value
//	REQUIRED_FIELD_ADDED  a required field added               payloads written before it lack it
//	ENUM_VALUE_REMOVED    an enum value removed                payloads holding it fail validation and are poisoned
//
// Version rules keep every version that can be in flight decodable:
//
//	PREVIOUS_VERSION_MISSING  the version was bumped, but the base's current version is not declared under previous:
//	PREVIOUS_VERSION_CHANGED  a declared previous version's fields differ from that version in the base
//	PREVIOUS_VERSION_REMOVED  a previous version the base declared is gone (allow it once none can be in flight)
//	VERSION_DECREASED         the version went down: payloads of the higher one would be refused
//
// Delivery rules are not about the payload, so no version bump allows them:
//
//	KEY_CHANGED       the key field (or its type) changed   per-key order and the stale guard compare keys across versions
//	TOPIC_CHANGED     the topic changed                     consumers subscribed to the old topic stop receiving the event
//	ORDERED_CHANGED   ordered: true -> false                consumers that rely on per-key order get events out of order
//	EVENT_REMOVED     an event a consumer handles removed   its events in flight reach no handler
//	TABLE_RENAMED     sql.outbox_table/inbox_table/archive_table changed
//	                                                        rows in the old table are never relayed; the inbox forgets
//	                                                        what was handled, so redeliveries are handled twice
//
// Compatible, and not reported: a new optional field; a new event; a new
// enum value (consumers built from the base refuse a payload holding it as
// invalid and send it to the poison topic: deploy consumers before
// producers, or requeue the poisoned events after they are upgraded);
// ordered: false -> true (a stronger guarantee); a removed event that no
// consumer handles; renaming a type under types: (the JSON does not name
// types); go_type, description and Go naming changes.
//
// Switching sql.wal on or off is not reported either. The messages are
// the same in both modes (one builder, the same metadata and outbox_seq
// numbering), so consumers built from either spec are unaffected: it is a
// deployment change, not a contract change. It has its own order, which
// a comparison of two files cannot check: create the replication slot
// before the WAL writers run (outboxgen wal setup), run the streaming
// relay beside the polling relay, and switch every writer of the outbox
// in one deployment (table and WAL writers of the same keys order
// independently); switching off, keep the streaming relay running until
// the slot has caught up. See the README's WAL mode section.
package compat

import (
	"fmt"
	"slices"
	"strings"

	"github.com/outboxgen/outboxgen/generator/spec"
)

// Rule names a kind of breaking change.
type Rule string

// The rules; see the package documentation.
const (
	FieldRemoved       Rule = "FIELD_REMOVED"
	FieldTypeChanged   Rule = "FIELD_TYPE_CHANGED"
	ElementTypeChanged Rule = "ELEMENT_TYPE_CHANGED"
	FieldMadeRequired  Rule = "FIELD_MADE_REQUIRED"
	FieldMadeOptional  Rule = "FIELD_MADE_OPTIONAL"
	RequiredFieldAdded Rule = "REQUIRED_FIELD_ADDED"
	EnumValueRemoved   Rule = "ENUM_VALUE_REMOVED"

	PreviousVersionMissing Rule = "PREVIOUS_VERSION_MISSING"
	PreviousVersionChanged Rule = "PREVIOUS_VERSION_CHANGED"
	PreviousVersionRemoved Rule = "PREVIOUS_VERSION_REMOVED"
	VersionDecreased       Rule = "VERSION_DECREASED"

	KeyChanged     Rule = "KEY_CHANGED"
	TopicChanged   Rule = "TOPIC_CHANGED"
	OrderedChanged Rule = "ORDERED_CHANGED"
	EventRemoved   Rule = "EVENT_REMOVED"
	TableRenamed   Rule = "TABLE_RENAMED"
)

// Rules lists every rule, in the order of the package documentation.
var Rules = []Rule{
	FieldRemoved, FieldTypeChanged, ElementTypeChanged, FieldMadeRequired, FieldMadeOptional, RequiredFieldAdded, EnumValueRemoved,
	PreviousVersionMissing, PreviousVersionChanged, PreviousVersionRemoved, VersionDecreased,
	KeyChanged, TopicChanged, OrderedChanged, EventRemoved, TableRenamed,
}

// Finding is one breaking change.
type Finding struct {
	Rule Rule
	// File and Pos place the finding in the new spec file.
	File string
	Pos  spec.Pos
	// Event is the event concerned; empty for a table name.
	Event string
	// Field is the JSON path of the field concerned within the event's
	// payload ("shipping.city", "items[].sku", "tiers{}"), if any.
	Field string
	// Msg says what changed, where it was in the base, and how to make
	// the change safely.
	Msg string
}

// Error formats f as "file:line:col: msg (RULE)".
func (f Finding) Error() string {
	return fmt.Sprintf("%s:%d:%d: %s (%s)", f.File, f.Pos.Line, f.Pos.Col, f.Msg, f.Rule)
}

// Compare reports every breaking change from base to next, sorted by
// position in next. Findings of a rule in allow are left out.
func Compare(base, next *spec.Spec, allow ...Rule) []Finding {
	c := &comparer{base: base, next: next}
	c.tables()
	nextEvents := map[string]*spec.Event{}
	for _, e := range next.Events {
		nextEvents[e.Name] = e
	}
	for _, b := range base.Events {
		if n := nextEvents[b.Name]; n != nil {
			c.event(b, n)
		} else {
			c.removedEvent(b)
		}
	}
	var out []Finding
	seen := map[Finding]bool{}
	for _, f := range c.out {
		if !slices.Contains(allow, f.Rule) && !seen[f] {
			seen[f] = true
			out = append(out, f)
		}
	}
	slices.SortStableFunc(out, func(a, b Finding) int {
		if a.Pos.Line != b.Pos.Line {
			return a.Pos.Line - b.Pos.Line
		}
		return a.Pos.Col - b.Pos.Col
	})
	return out
}

// ParseRule returns the rule named s (case-insensitive, - or _), or an
// error listing the rules.
func ParseRule(s string) (Rule, error) {
	r := Rule(strings.ToUpper(strings.ReplaceAll(strings.TrimSpace(s), "-", "_")))
	if slices.Contains(Rules, r) {
		return r, nil
	}
	names := make([]string, len(Rules))
	for i, r := range Rules {
		names[i] = string(r)
	}
	return "", fmt.Errorf("unknown rule %q; the rules are %s", s, strings.Join(names, ", "))
}

type comparer struct {
	base, next *spec.Spec
	out        []Finding
}

// at formats a base position for messages: "base.yaml:12:7".
func (c *comparer) at(p spec.Pos) string {
	return fmt.Sprintf("%s:%d:%d", c.base.File, p.Line, p.Col)
}

func (c *comparer) add(rule Rule, pos spec.Pos, event, field, format string, args ...any) {
	c.out = append(c.out, Finding{Rule: rule, File: c.next.File, Pos: pos, Event: event, Field: field, Msg: fmt.Sprintf(format, args...)})
}

func (c *comparer) tables() {
	b, n := c.base.SQL, c.next.SQL
	pos := func(p spec.Pos) spec.Pos {
		if p.Line == 0 {
			return n.Pos
		}
		return p
	}
	if b.OutboxTable != n.OutboxTable {
		c.add(TableRenamed, pos(n.OutboxTablePos), "", "", "sql.outbox_table changed from %s (in %s) to %s: rows written to %s and not yet relayed would never be published; drain the outbox first (then run the check with -allow TABLE_RENAMED), or keep the name", b.OutboxTable, c.base.File, n.OutboxTable, b.OutboxTable)
	}
	if b.InboxTable != n.InboxTable {
		c.add(TableRenamed, pos(n.InboxTablePos), "", "", "sql.inbox_table changed from %s (in %s) to %s: the consumers would forget every event they handled, and handle redeliveries and replays a second time; keep the name, or copy the rows over before the switch", b.InboxTable, c.base.File, n.InboxTable)
	}
	switch {
	case b.ArchiveTable == "" || b.ArchiveTable == n.ArchiveTable:
	case n.ArchiveTable == "":
		c.add(TableRenamed, n.Pos, "", "", "sql.archive_table %s (in %s) was removed: the janitor would delete sent rows instead of archiving them, and tools reading %s would see no new rows", b.ArchiveTable, c.base.File, b.ArchiveTable)
	default:
		c.add(TableRenamed, pos(n.ArchiveTablePos), "", "", "sql.archive_table changed from %s (in %s) to %s: the archive would be split over two tables; keep the name", b.ArchiveTable, c.base.File, n.ArchiveTable)
	}
}

// removedEvent reports an event of base that next no longer declares, when
// a consumer of base handles it.
func (c *comparer) removedEvent(b *spec.Event) {
	for _, bc := range c.base.Consumers {
		if !slices.Contains(bc.Events, b) {
			continue
		}
		pos := c.next.EventsPos
		for _, nc := range c.next.Consumers {
			if nc.Name == bc.Name {
				pos = nc.Pos
			}
		}
		c.add(EventRemoved, pos, b.Name, "", "event %s (%s) was removed, but consumer %s handles it there: events of it still in outboxes and on the broker would reach no handler; stop producing it first, and remove it once none can be in flight (then with -allow EVENT_REMOVED)", b.Name, c.at(b.Pos), bc.Name)
		return
	}
}

// event compares one event present in both specs.
func (c *comparer) event(b, n *spec.Event) {
	if b.Topic != n.Topic {
		c.add(TopicChanged, n.Pos, n.Name, "", "topic of %s changed from %s (%s) to %s: consumers subscribed to %s would stop receiving it, and events in flight stay on %s; publish to the new topic under a new event name, and remove the old one once none is in flight", n.Name, b.Topic, c.at(b.Pos), n.Topic, b.Topic, b.Topic)
	}
	if b.Key != nil && n.Key != nil {
		switch {
		case b.Key.Name != n.Key.Name:
			c.add(KeyChanged, n.Pos, n.Name, n.Key.Name, "key of %s changed from %s (%s) to %s: per-key ordering and the stale guard (latest_only) compare keys of old and new events, which no longer name the same thing; no version bump fixes that, so declare a new event instead", n.Name, b.Key.Name, c.at(b.Pos), n.Key.Name)
		case typeString(b.Key.Type) != typeString(n.Key.Type) && !sameType(b.Key.Type, n.Key.Type):
			c.add(KeyChanged, n.Key.Pos, n.Name, n.Key.Name, "key %s of %s changed type from %s (%s) to %s: per-key ordering and the stale guard compare keys of old and new events; no version bump fixes that, so declare a new event instead", n.Key.Name, n.Name, typeString(b.Key.Type), c.at(b.Key.Pos), typeString(n.Key.Type))
		}
	}
	if b.Ordered && !n.Ordered {
		c.add(OrderedChanged, n.Pos, n.Name, "", "%s is no longer ordered (ordered: true in %s): the relay would publish events of one key out of order, which consumers written for the base may rely on; keep ordered: true", n.Name, c.at(b.Pos))
	}

	switch {
	case n.Version < b.Version:
		c.add(VersionDecreased, n.Pos, n.Name, "", "version of %s went down from %d (%s) to %d: consumers built from this spec would refuse every version %d payload still in flight; versions only go up", n.Name, b.Version, c.at(b.Pos), n.Version, b.Version)
	case n.Version == b.Version:
		// Same version: the payload must stay compatible.
		for _, ch := range c.fields(n.Name, "", b.Fields, n.Fields, n.Pos, map[[2]*spec.Type]bool{}) {
			c.add(ch.rule, ch.pos, n.Name, ch.field, "%s: %s; to make this change, bump %s to version %d and keep version %d's fields under previous:", ch.what, ch.why, n.Name, b.Version+1, b.Version)
		}
	default:
		// A bump: the base's current version must stay decodable.
		c.kept(n, b.Version, b.Fields, b.Pos, "current")
	}
	for _, bp := range b.Previous {
		if bp.Version >= n.Version {
			continue // reported as VERSION_DECREASED
		}
		c.kept(n, bp.Version, bp.Fields, bp.Pos, "previous")
	}
}

// kept checks that version v of event n, with fields fields in the base
// (where it was the current version, or a previous one at basePos), is
// declared under previous: in next with the same fields.
func (c *comparer) kept(n *spec.Event, v int, fields []*spec.Field, basePos spec.Pos, was string) {
	pv := n.PreviousVersion(v)
	if pv == nil {
		if was == "current" {
			c.add(PreviousVersionMissing, n.Pos, n.Name, "", "%s went from version %d (%s) to %d without declaring version %d under previous:, so version %d events still in flight would be poisoned; add it with its fields from %s (previous: [{version: %d, fields: [...]}])", n.Name, v, c.at(basePos), n.Version, v, v, c.base.File, v)
		} else {
			c.add(PreviousVersionRemoved, n.Pos, n.Name, "", "previous version %d of %s (%s) was removed: version %d events still in flight would be poisoned; remove it only once none can be (outboxes drained, broker retention passed, no replays of them planned), with -allow %s", v, n.Name, c.at(basePos), v, PreviousVersionRemoved)
		}
		return
	}
	for _, ch := range c.fields(n.Name, "", fields, pv.Fields, pv.Pos, map[[2]*spec.Type]bool{}) {
		c.add(PreviousVersionChanged, ch.pos, n.Name, ch.field, "previous version %d of %s differs from version %d in %s: %s; it must decode the payloads that version's producers write, so declare the fields as they were", v, n.Name, v, c.base.File, ch.what)
	}
}

// change is one difference between two field lists.
type change struct {
	rule  Rule
	pos   spec.Pos
	field string
	// what says what changed; why, what it breaks.
	what, why string
}

// fields compares the field lists of one object (an event's payload, a
// previous version or an object type) of event ev; path is the JSON path
// of the object, parent its position in next. seen stops recursive types.
func (c *comparer) fields(ev, path string, base, next []*spec.Field, parent spec.Pos, seen map[[2]*spec.Type]bool) []change {
	var out []change
	nextByName := map[string]*spec.Field{}
	for _, f := range next {
		nextByName[f.Name] = f
	}
	baseByName := map[string]*spec.Field{}
	for _, f := range base {
		baseByName[f.Name] = f
	}
	var added []*spec.Field
	for _, f := range next {
		if baseByName[f.Name] == nil {
			added = append(added, f)
		}
	}
	for _, bf := range base {
		p := join(path, bf.Name)
		nf := nextByName[bf.Name]
		if nf == nil {
			why := "consumers built from the base read it"
			for _, a := range added {
				if sameType(a.Type, bf.Type) {
					why = fmt.Sprintf("renamed to %s? A rename is a removal plus an addition: consumers built from the base read %s", a.Name, bf.Name)
					break
				}
			}
			out = append(out, change{FieldRemoved, parent, p, fmt.Sprintf("field %s (%s) of %s was removed (%s)", p, typeString(bf.Type), ev, c.at(bf.Pos)), why})
			continue
		}
		switch {
		case bf.Optional && !nf.Optional:
			out = append(out, change{FieldMadeRequired, nf.Pos, p, fmt.Sprintf("field %s of %s was made required (optional at %s)", p, ev, c.at(bf.Pos)), "payloads written without it are still in flight"})
		case !bf.Optional && nf.Optional:
			out = append(out, change{FieldMadeOptional, nf.Pos, p, fmt.Sprintf("field %s of %s was made optional (required at %s)", p, ev, c.at(bf.Pos)), "consumers built from the base read an absent value as its zero value"})
		}
		out = append(out, c.types(ev, p, bf, nf, bf.Type, nf.Type, 0, seen)...)
	}
	for _, a := range added {
		if !a.Optional {
			out = append(out, change{RequiredFieldAdded, a.Pos, join(path, a.Name), fmt.Sprintf("required field %s (%s) was added to %s (not in %s)", join(path, a.Name), typeString(a.Type), ev, c.base.File), "payloads written before it lack it; add it with optional: true"})
		}
	}
	return out
}

// types compares the types of field bf (base) and nf (next) at path; depth
// counts the list and map levels entered.
func (c *comparer) types(ev, path string, bf, nf *spec.Field, b, n *spec.TypeRef, depth int, seen map[[2]*spec.Type]bool) []change {
	if b == nil || n == nil {
		return nil
	}
	if b.Kind != n.Kind || b.Kind == spec.KindScalar && b.Scalar != n.Scalar ||
		b.Kind == spec.KindNamed && b.Named.IsEnum() != n.Named.IsEnum() {
		if depth == 0 {
			return []change{{FieldTypeChanged, nf.Pos, path, fmt.Sprintf("field %s of %s changed type from %s (%s) to %s", path, ev, typeString(bf.Type), c.at(bf.Pos), typeString(nf.Type)), "payloads of one side do not decode on the other"}}
		}
		return []change{{ElementTypeChanged, nf.Pos, path, fmt.Sprintf("element type of field %s of %s changed from %s to %s (%s at %s, now %s)", fieldOf(path), ev, typeString(b), typeString(n), typeString(bf.Type), c.at(bf.Pos), typeString(nf.Type)), "payloads of one side do not decode on the other"}}
	}
	switch b.Kind {
	case spec.KindList:
		return c.types(ev, path+"[]", bf, nf, b.Elem, n.Elem, depth+1, seen)
	case spec.KindMap:
		return c.types(ev, path+"{}", bf, nf, b.Elem, n.Elem, depth+1, seen)
	case spec.KindNamed:
		bt, nt := b.Named, n.Named
		if bt.IsEnum() {
			var out []change
			for _, v := range bt.Values {
				if !slices.ContainsFunc(nt.Values, func(x *spec.EnumValue) bool { return x.Value == v.Value }) {
					out = append(out, change{EnumValueRemoved, nt.Pos, path, fmt.Sprintf("enum value %s of %s (field %s of %s) was removed (%s)", v.Value, nt.Name, path, ev, c.at(v.Pos)), "payloads holding it would fail validation and be poisoned"})
				}
			}
			return out
		}
		key := [2]*spec.Type{bt, nt}
		if seen[key] {
			return nil
		}
		seen[key] = true
		defer delete(seen, key)
		return c.fields(ev, path, bt.Fields, nt.Fields, nt.Pos, seen)
	}
	return nil
}

// sameType reports whether a and b have the same JSON shape.
func sameType(a, b *spec.TypeRef) bool {
	return sameTypeSeen(a, b, map[[2]*spec.Type]bool{})
}

func sameTypeSeen(a, b *spec.TypeRef, seen map[[2]*spec.Type]bool) bool {
	if a == nil || b == nil || a.Kind != b.Kind {
		return false
	}
	switch a.Kind {
	case spec.KindScalar:
		return a.Scalar == b.Scalar
	case spec.KindList, spec.KindMap:
		return sameTypeSeen(a.Elem, b.Elem, seen)
	}
	at, bt := a.Named, b.Named
	if at.IsEnum() != bt.IsEnum() {
		return false
	}
	if at.IsEnum() {
		return slices.EqualFunc(at.Values, bt.Values, func(x, y *spec.EnumValue) bool { return x.Value == y.Value })
	}
	key := [2]*spec.Type{at, bt}
	if seen[key] {
		return true
	}
	seen[key] = true
	if len(at.Fields) != len(bt.Fields) {
		return false
	}
	for i, f := range at.Fields {
		g := bt.Fields[i]
		if f.Name != g.Name || f.Optional != g.Optional || !sameTypeSeen(f.Type, g.Type, seen) {
			return false
		}
	}
	return true
}

// typeString renders t in the spec's type grammar; named types by name.
func typeString(t *spec.TypeRef) string {
	if t == nil {
		return "?"
	}
	switch t.Kind {
	case spec.KindScalar:
		return string(t.Scalar)
	case spec.KindList:
		return "list<" + typeString(t.Elem) + ">"
	case spec.KindMap:
		return "map<" + typeString(t.Elem) + ">"
	}
	if t.Named.IsEnum() {
		return "enum " + t.Named.Name
	}
	return t.Named.Name
}

func join(path, name string) string {
	if path == "" {
		return name
	}
	return path + "." + name
}

// fieldOf strips the list and map markers from the end of path.
func fieldOf(path string) string {
	return strings.TrimRight(path, "[]{}")
}
