package spec

import (
	"fmt"
	"sort"
	"strings"

	"gopkg.in/yaml.v3"
)

// validate runs the checks that need the whole file: type resolution,
// event keys, reference cycles, Go name collisions, driver/dialect fit.
func (p *parser) validate() {
	for _, d := range p.types {
		for _, f := range d.fields {
			p.resolveField(f)
		}
		if d.t.IsEnum() && typeNameRe.MatchString(d.t.Name) {
			for _, v := range d.t.Values {
				var used []*renameEntry
				v.GoName, used = p.naming.enumConst(d.t.Name, v.Value)
				p.renamed[v] = used
			}
		}
	}
	for _, d := range p.events {
		for _, f := range d.fields {
			p.resolveField(f)
		}
		for _, v := range d.previous {
			for _, f := range v.fields {
				p.resolveField(f)
			}
		}
		p.checkKey(d)
	}
	p.checkCycles()
	p.checkCollisions()
	p.checkDriver()
	p.checkRenames()
	p.checkOutputs()
}

// checkRenames reports go.rename keys that match no name and no word of a
// name in the spec: a misspelt key would otherwise be ignored silently.
func (p *parser) checkRenames() {
	if len(p.naming.rename) == 0 {
		return
	}
	names := map[string]bool{} // every whole name and word that can be renamed
	var candidates []string
	add := func(words []string) {
		if len(words) == 0 {
			return
		}
		for _, key := range append([]string{snakeKey(words)}, words...) {
			key = strings.ToLower(key)
			if !names[key] {
				names[key] = true
				candidates = append(candidates, key)
			}
		}
	}
	typeNames := map[string]string{}
	for _, d := range p.types {
		typeNames[snakeKey(splitWords(d.t.Name))] = d.t.Name
		for _, f := range d.fields {
			add(splitWords(f.f.Name))
		}
		for _, v := range d.t.Values {
			add(splitWords(v.Value))
			add(append(splitWords(d.t.Name), splitWords(v.Value)...))
		}
	}
	for _, d := range p.events {
		add(splitWords(d.e.Name))
		for _, f := range d.fields {
			add(splitWords(f.f.Name))
		}
		for _, v := range d.previous {
			for _, f := range v.fields {
				add(splitWords(f.f.Name))
			}
		}
	}
	for _, d := range p.consumers {
		add(splitWords(d.c.Name))
	}
	for _, k := range p.renameKeys {
		key := deref(k).Value
		if names[key] {
			continue
		}
		switch {
		case typeNames[key] != "":
			p.errorf(k, "go.rename key %q matches no name it applies to: type %s is named as written; rename it under types: instead", key, typeNames[key])
		case suggest(key, candidates) != "":
			p.errorf(k, "go.rename key %q matches no name or name part in the spec; did you mean %q?", key, suggest(key, candidates))
		default:
			p.errorf(k, "go.rename key %q matches no name or name part in the spec (event, consumer, field or enum value names, or their snake_case words); remove it", key)
		}
	}
}

// resolveField resolves a field's parsed type string into its TypeRef.
func (p *parser) resolveField(f *fieldDecl) {
	if f.expr == nil {
		return
	}
	ref := p.resolve(f.expr, f.typeNode)
	if ref == nil {
		return
	}
	ref.GoType = f.goType
	f.f.Type = ref
}

func (p *parser) resolve(x *typeExpr, node *yaml.Node) *TypeRef {
	switch {
	case x.name == "":
		elem := p.resolve(x.elem, node)
		if elem == nil {
			return nil
		}
		return &TypeRef{Kind: x.kind, Elem: elem}
	case isScalar(x.name):
		return &TypeRef{Kind: KindScalar, Scalar: Scalar(x.name)}
	case p.typeByName[x.name] != nil:
		return &TypeRef{Kind: KindNamed, Named: p.typeByName[x.name].t}
	}
	candidates := append([]string{}, scalarNames...)
	for _, d := range p.types {
		if p.typeByName[d.t.Name] == d {
			candidates = append(candidates, d.t.Name)
		}
	}
	candidates = append(candidates, "list", "map")
	if s := suggest(x.name, candidates); s != "" {
		p.errorAt(offsetPos(node, x.off), "unknown type %q; did you mean %s?", x.name, s)
	} else {
		p.errorAt(offsetPos(node, x.off), "unknown type %q; use a scalar (%s), list<T>, map<T> or a type declared under types:", x.name, strings.Join(scalarNames, ", "))
	}
	return nil
}

// typeString renders a resolved type in the spec's grammar.
func typeString(t *TypeRef) string {
	switch t.Kind {
	case KindScalar:
		return string(t.Scalar)
	case KindList:
		return "list<" + typeString(t.Elem) + ">"
	case KindMap:
		return "map<" + typeString(t.Elem) + ">"
	case KindNamed:
		if t.Named.IsEnum() {
			return "enum " + t.Named.Name
		}
		return "object " + t.Named.Name
	}
	return "?"
}

// checkKey resolves an event's key to one of its required scalar fields.
func (p *parser) checkKey(d *eventDecl) {
	if d.keyNode == nil {
		return
	}
	key := deref(d.keyNode).Value
	var f *fieldDecl
	names := make([]string, 0, len(d.fields))
	for _, fd := range d.fields {
		if fd.f.Name == "" {
			// A field without a name, reported as such: nothing to offer.
			continue
		}
		names = append(names, fd.f.Name)
		if fd.f.Name == key {
			f = fd
		}
	}
	switch {
	case f == nil && key == "":
		p.errorf(d.keyNode, "key of %s must not be empty; name one of its required fields, e.g. %s", d.ctx, firstOr(names, "order_id"))
	case f == nil:
		if s := suggest(key, names); s != "" {
			p.errorf(d.keyNode, "key %q of %s names no field; did you mean %s?", key, d.ctx, s)
		} else if len(names) > 0 {
			p.errorf(d.keyNode, "key %q of %s names no field; use one of %s", key, d.ctx, strings.Join(names, ", "))
		} else {
			p.errorf(d.keyNode, "key %q of %s names no field; declare it under fields:", key, d.ctx)
		}
	case f.f.Optional:
		p.errorf(d.keyNode, "key %s of %s is an optional field (line %d); a key must always be set, so make the field required or choose another key", key, d.ctx, f.f.Pos.Line)
	case f.f.Type == nil:
		// Its type is already reported as invalid.
	case !isKeyType(f.f.Type):
		p.errorf(d.keyNode, "key %s of %s has type %s; a key must be a string, int32, int64, uuid or enum field", key, d.ctx, typeString(f.f.Type))
	case f.f.Type.GoType != nil && f.f.Type.GoType.Pointer:
		p.errorf(f.pointerNode, "go_type of key %s of %s is a pointer; a key must always be set (it becomes the row's biz_id), so use the type itself: %s", key, d.ctx, pointerFix(f.pointerNode))
	default:
		d.e.Key = f.f
	}
}

// pointerFix says how to make the go_type whose pointer-ness is written at
// n (see fieldDecl.pointerNode) not a pointer.
func pointerFix(n *yaml.Node) string {
	if d := deref(n); d != nil && d.Tag != "!!bool" {
		return fmt.Sprintf("write %q", strings.TrimPrefix(d.Value, "*"))
	}
	return "remove pointer: true"
}

func firstOr(list []string, def string) string {
	if len(list) > 0 {
		return list[0]
	}
	return def
}

// isKeyType reports whether a field of type t can be an event key.
func isKeyType(t *TypeRef) bool {
	switch t.Kind {
	case KindScalar:
		switch t.Scalar {
		case String, Int32, Int64, UUID:
			return true
		}
	case KindNamed:
		return t.Named.IsEnum()
	}
	return false
}

// checkCycles reports object types that contain themselves through
// required, direct (not list, map or go_type) fields: they have no finite
// value.
func (p *parser) checkCycles() {
	type edge struct {
		from *typeDecl
		f    *fieldDecl
		to   *typeDecl
	}
	edges := func(d *typeDecl) []edge {
		var out []edge
		for _, f := range d.fields {
			t := f.f.Type
			if f.f.Optional || t == nil || t.Kind != KindNamed || t.GoType != nil || t.Named.IsEnum() {
				continue
			}
			if to := p.typeByName[t.Named.Name]; to != nil {
				out = append(out, edge{d, f, to})
			}
		}
		return out
	}
	const (
		unvisited = iota
		active
		done
	)
	state := map[*typeDecl]int{}
	var path []edge
	var visit func(d *typeDecl)
	visit = func(d *typeDecl) {
		state[d] = active
		for _, e := range edges(d) {
			switch state[e.to] {
			case active:
				start := len(path)
				for i, pe := range path {
					if pe.from == e.to {
						start = i
						break
					}
				}
				cycle := append(append([]edge{}, path[start:]...), e)
				steps := make([]string, len(cycle))
				for i, ce := range cycle {
					steps[i] = ce.from.t.Name + "." + ce.f.f.Name
				}
				p.errorAt(cycle[0].f.f.Pos, "type %s refers to itself through %s; make one of the fields optional", e.to.t.Name, strings.Join(steps, " -> "))
			case unvisited:
				path = append(path, e)
				visit(e.to)
				path = path[:len(path)-1]
			}
		}
		state[d] = done
	}
	for _, d := range p.types {
		if p.typeByName[d.t.Name] == d && state[d] == unvisited {
			visit(d)
		}
	}
}

// reservedNames are package-level identifiers the generated code always
// declares.
var reservedNames = []string{"Writer", "EventTypes", "OutboxTable", "InboxTable",
	"Schema", "NewWriter", "DialectWriter", "Bind", "Use", "Default"}

// reservedFieldNames are the Go names of the methods the generated code
// declares on payload and object structs; a field cannot share one. (Object
// types without anything to validate get no Validate method, but the name is
// refused for every field so that adding, say, an enum field later does not
// turn a valid spec into an invalid one.)
var reservedFieldNames = map[string]bool{"Validate": true}

// checkCollisions reports generated package-level identifiers that clash.
func (p *parser) checkCollisions() {
	type ident struct {
		name  string
		desc  string
		owner string // one error per owner
		pos   Pos
		item  any // the spec item whose Go name this is, see p.renamed
	}
	var ids []ident
	for _, t := range p.spec.Types {
		if !typeNameRe.MatchString(t.Name) {
			continue
		}
		owner := "type " + t.Name
		ids = append(ids, ident{t.Name, "type " + t.Name, owner, t.Pos, nil})
		for _, v := range t.Values {
			ids = append(ids, ident{v.GoName, fmt.Sprintf("enum constant %s for value %s of type %s", v.GoName, v.Value, t.Name), owner + "=" + v.Value, v.Pos, v})
		}
	}
	for _, e := range p.spec.Events {
		if e.GoName == "" {
			continue
		}
		owner := "event " + e.Name
		x := e.GoName
		ids = append(ids,
			ident{x, fmt.Sprintf("Go type %s of event %s", x, e.Name), owner, e.Pos, e},
			ident{"Insert" + x, fmt.Sprintf("function Insert%s of event %s", x, e.Name), owner, e.Pos, e},
			ident{"Decode" + x, fmt.Sprintf("function Decode%s of event %s", x, e.Name), owner, e.Pos, e},
			ident{x + "Type", fmt.Sprintf("constant %sType of event %s", x, e.Name), owner, e.Pos, e},
			ident{x + "Topic", fmt.Sprintf("constant %sTopic of event %s", x, e.Name), owner, e.Pos, e},
			ident{x + "Version", fmt.Sprintf("constant %sVersion of event %s", x, e.Name), owner, e.Pos, e},
		)
		for _, v := range e.Previous {
			if v.GoName == "" {
				continue
			}
			vowner := fmt.Sprintf("%s version %d", owner, v.Version)
			ids = append(ids,
				ident{v.GoName, fmt.Sprintf("Go type %s of version %d of event %s", v.GoName, v.Version, e.Name), vowner, v.Pos, e},
				ident{"Upgrade" + v.GoName, fmt.Sprintf("upgrade function Upgrade%s of version %d of event %s", v.GoName, v.Version, e.Name), vowner, v.Pos, e},
			)
		}
	}
	for _, c := range p.spec.Consumers {
		if c.GoName == "" {
			continue
		}
		owner := "consumer " + c.Name
		ids = append(ids,
			ident{c.GoName + "Handler", fmt.Sprintf("handler type %sHandler of consumer %s", c.GoName, c.Name), owner, c.Pos, c},
			ident{"Register" + c.GoName, fmt.Sprintf("function Register%s of consumer %s", c.GoName, c.Name), owner, c.Pos, c},
		)
	}
	sort.SliceStable(ids, func(i, j int) bool {
		a, b := ids[i].pos, ids[j].pos
		return a.Line < b.Line || a.Line == b.Line && a.Col < b.Col
	})
	seen := map[string]ident{}
	for _, r := range reservedNames {
		seen[r] = ident{name: r}
	}
	reported := map[string]bool{}
	for _, id := range ids {
		prev, clash := seen[id.name]
		if !clash {
			seen[id.name] = id
			continue
		}
		if prev.owner == id.owner || reported[id.owner] {
			continue
		}
		reported[id.owner] = true
		desc := id.desc + renameNote(p.renamed[id.item])
		if prev.desc == "" {
			p.errorAt(id.pos, "%s collides with the reserved package-level name %s of the generated code; rename it", desc, id.name)
		} else {
			p.errorAt(id.pos, "%s collides with %s %s; rename one of them", desc, prev.desc, lineNote(prev.pos.Line, p.renamed[prev.item]))
		}
	}
}

// checkDriver reports pgx/v5 combined with dialects other than postgres.
func (p *parser) checkDriver() {
	if p.spec.Go.Driver != DriverPgx {
		return
	}
	var others []string
	for _, d := range p.spec.SQL.Dialects {
		if d != Postgres {
			others = append(others, string(d))
		}
	}
	if len(others) > 0 {
		p.errorf(p.driverNode, "go.driver pgx/v5 works only with postgres, but sql.dialects also lists %s; use driver database/sql, or set dialects: [postgres]", strings.Join(others, ", "))
	}
}
