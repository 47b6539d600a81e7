package spec

import (
	"gopkg.in/yaml.v3"
)

// Limits on the size of a spec. A real events.yaml stays far below each of
// them; they exist so that a hostile or broken file (a YAML alias bomb, a
// device such as /dev/zero, a generated file gone wrong) fails fast with a
// positioned error instead of exhausting memory. Refusing a file at any of
// them takes well under a second and 100 MB; the largest spec accepted
// generates in about 0.3 s and 120 MB (like 1,000 events of 8 fields).
const (
	// MaxSpecBytes is the largest spec file accepted, in bytes (768 KiB;
	// 1,000 events of 8 fields with descriptions take about 600 KB). The
	// YAML parser needs up to about 100 times the file size in memory: a
	// flow list of 390,000 numbers, the worst case, peaks at 85 MB.
	MaxSpecBytes = 768 << 10

	// MaxAliasExpansion is the most YAML nodes that aliases (*name) may
	// add to the document when each is replaced by the value it names.
	// Reusing a field list of ten fields in a hundred events adds about
	// 7,000.
	MaxAliasExpansion = 100_000

	// MaxNestingDepth is the deepest YAML nesting accepted (mappings and
	// lists inside each other, with aliases expanded). events.yaml itself
	// needs 9 levels (a go_type mapping in a field of a previous version of an event).
	MaxNestingDepth = 32

	// MaxEvents is the most events a spec may declare.
	MaxEvents = 1000
	// MaxTypes is the most named types a spec may declare.
	MaxTypes = 1000
	// MaxConsumers is the most consumers a spec may declare.
	MaxConsumers = 1000
	// MaxHandlers is the most handler methods all consumers together may
	// have: the total length of their events lists.
	MaxHandlers = 2000
	// MaxFields is the most fields one event or object type may have.
	MaxFields = 1000
	// MaxEnumValues is the most values one enum type may have.
	MaxEnumValues = 1000
	// MaxPreviousVersions is the most earlier versions one event may list
	// under previous:; the generated code has a struct, a decoder case and
	// an upgrade step for each.
	MaxPreviousVersions = 100

	// MaxDeclarations bounds the size of the generated code: the total
	// number of events, types, consumers, fields, enum values and entries
	// of consumers' events and latest_only lists.
	MaxDeclarations = 20_000

	// MaxErrors is the most problems reported for one file; Parse stops
	// after that many.
	MaxErrors = 200
)

// errTooManyErrors stops a Parse that reached MaxErrors (see errorf).
type errTooManyErrors struct{}

// checkTree walks the YAML tree once, without following aliases, and
// reports nesting deeper than MaxNestingDepth, aliases that refer to a
// node containing them, and aliases that together expand to more than
// MaxAliasExpansion nodes. It returns false when the tree must not be
// walked further.
func (p *parser) checkTree(root *yaml.Node) bool {
	type extent struct {
		size   int // nodes, aliases expanded (at most MaxAliasExpansion+1)
		height int // nesting levels, aliases expanded
	}
	const over = MaxAliasExpansion + 1
	memo := map[*yaml.Node]extent{}
	active := map[*yaml.Node]bool{}
	ok := true
	// expand returns the extent of n with aliases expanded, memoised on
	// anchored nodes so that shared values are measured once. walk visits
	// an anchored value (and measures it, at its first alias) before any
	// later alias to it, so the recursion stays as shallow as the text.
	var expand func(n *yaml.Node) extent
	expand = func(n *yaml.Node) extent {
		if n == nil || !ok {
			return extent{}
		}
		if e, done := memo[n]; done {
			return e
		}
		active[n] = true
		defer delete(active, n)
		if n.Kind == yaml.AliasNode {
			if active[n.Alias] {
				p.errorf(n, "this alias refers to a value that contains it; the value would be infinite, remove the alias")
				ok = false
				return extent{over, 0}
			}
			e := expand(n.Alias)
			memo[n] = e
			return e
		}
		e := extent{size: 1}
		for _, c := range n.Content {
			ce := expand(c)
			e.size = min(e.size+ce.size, over)
			e.height = max(e.height, ce.height+1)
		}
		if n.Anchor != "" {
			memo[n] = e
		}
		return e
	}
	expanded := 0
	var walk func(n *yaml.Node, depth int)
	walk = func(n *yaml.Node, depth int) {
		if n == nil || !ok {
			return
		}
		if depth > MaxNestingDepth {
			p.errorf(n, "the YAML nests more than %d levels deep (MaxNestingDepth); events.yaml needs 9, flatten this value", MaxNestingDepth)
			ok = false
			return
		}
		if n.Kind == yaml.AliasNode {
			e := expand(n.Alias)
			if !ok {
				return
			}
			if depth+e.height > MaxNestingDepth {
				p.errorf(n, "this alias nests the YAML more than %d levels deep (MaxNestingDepth); events.yaml needs 9, flatten the value it names", MaxNestingDepth)
				ok = false
				return
			}
			expanded += e.size
			if expanded > MaxAliasExpansion {
				p.errorf(n, "aliases (*name) expand to more than %d YAML nodes (MaxAliasExpansion); an alias bomb? Write the values out or reuse fewer of them", MaxAliasExpansion)
				ok = false
			}
			return
		}
		for _, c := range n.Content {
			walk(c, depth+1)
		}
	}
	walk(root, 1)
	return ok
}

// declare counts k more declarations (see MaxDeclarations) found in the
// list n, and reports false, once, when that exceeds the limit: the list is
// then skipped, and so is validation.
func (p *parser) declare(n *yaml.Node, k int) bool {
	return p.tally(n, &p.declared, k, MaxDeclarations, "the spec declares more than %d events, types, consumers, fields, enum values and handled events in total (MaxDeclarations); split it into several events.yaml files")
}

// handlers counts k more handled events of consumers (see MaxHandlers) in
// the list n, and reports false, once, when that exceeds the limit.
func (p *parser) handlers(n *yaml.Node, k int) bool {
	return p.tally(n, &p.handled, k, MaxHandlers, "the consumers handle more than %d events in total (MaxHandlers); split the spec into several events.yaml files")
}

// tally adds k to the spec-wide count *total and reports false when it
// exceeds max; the first limit crossed is reported (msg, formatted with
// max) and stops the parse.
func (p *parser) tally(n *yaml.Node, total *int, k, max int, msg string) bool {
	*total += k
	if *total <= max {
		return true
	}
	if !p.tooBig {
		p.errorf(n, msg, max)
	}
	p.tooBig = true
	return false
}

// limit reports false, after recording why, when the list n of items has
// more than max items.
func (p *parser) limit(n *yaml.Node, items int, max int, what, name string) bool {
	if items <= max {
		return true
	}
	hint := "split the spec into several events.yaml files, each with its own go.out"
	switch name {
	case "MaxFields":
		hint = "group related fields into object types under types:"
	case "MaxEnumValues":
		hint = "use a string field instead of an enum"
	case "MaxPreviousVersions":
		hint = "retire the versions that no event in flight still has (in an outbox, on the broker or in a replay you may run): remove them from previous: together with their upgrade functions"
	}
	p.errorf(n, "%s has %d %s; the limit is %d (%s): %s", what, items, nameNoun(name), max, name, hint)
	p.tooBig = true
	return false
}

func nameNoun(limit string) string {
	switch limit {
	case "MaxEvents":
		return "events"
	case "MaxTypes":
		return "types"
	case "MaxConsumers":
		return "consumers"
	case "MaxHandlers":
		return "handled events"
	case "MaxFields":
		return "fields"
	case "MaxEnumValues":
		return "values"
	case "MaxPreviousVersions":
		return "versions"
	}
	return "items"
}
