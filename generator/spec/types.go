package spec

import (
	"fmt"
	"go/token"
	"strings"
)

// scalarNames are the built-in scalar type names, in documentation order.
var scalarNames = []string{
	string(String), string(Bool), string(Int32), string(Int64), string(Float64),
	string(Bytes), string(Time), string(UUID), string(Decimal), string(JSON),
}

// isScalar reports whether s names a built-in scalar.
func isScalar(s string) bool {
	for _, n := range scalarNames {
		if n == s {
			return true
		}
	}
	return false
}

// maxTypeDepth bounds list/map nesting in a type string.
const maxTypeDepth = 16

// typeExpr is a parsed, not yet resolved, field type string.
type typeExpr struct {
	// name is a scalar or declared type name; empty for list/map.
	name string
	// kind is KindList or KindMap when name is empty.
	kind Kind
	elem *typeExpr
	// off is the byte offset of this expression in the type string.
	off int
}

// typeSyntaxError is a syntax error at byte offset off of a type string.
type typeSyntaxError struct {
	off int
	msg string
}

// typeParser is a recursive-descent parser for the type grammar:
//
//	type = ident | "list" "<" type ">" | "map" "<" [ "string" "," ] type ">"
type typeParser struct {
	s   string
	pos int
}

// parseTypeString parses s, or reports the first syntax error in it.
func parseTypeString(s string) (*typeExpr, *typeSyntaxError) {
	p := &typeParser{s: s}
	p.skipSpace()
	if p.pos == len(s) {
		return nil, &typeSyntaxError{0, "type must not be empty; use a scalar (" + strings.Join(scalarNames, ", ") + "), a type from types:, list<T> or map<T>"}
	}
	t, err := p.parse(0)
	if err != nil {
		return nil, err
	}
	p.skipSpace()
	if p.pos < len(s) {
		return nil, &typeSyntaxError{p.pos, fmt.Sprintf("unexpected %q after type %q; a field has exactly one type", s[p.pos:], strings.TrimSpace(s[:p.pos]))}
	}
	return t, nil
}

func (p *typeParser) skipSpace() {
	for p.pos < len(p.s) && (p.s[p.pos] == ' ' || p.s[p.pos] == '\t') {
		p.pos++
	}
}

// ident scans an identifier at the current position.
func (p *typeParser) ident() string {
	start := p.pos
	for p.pos < len(p.s) {
		c := p.s[p.pos]
		if c == '_' || 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || p.pos > start && '0' <= c && c <= '9' {
			p.pos++
			continue
		}
		break
	}
	return p.s[start:p.pos]
}

// peek returns the next non-space byte, or 0 at the end.
func (p *typeParser) peek() byte {
	p.skipSpace()
	if p.pos < len(p.s) {
		return p.s[p.pos]
	}
	return 0
}

func (p *typeParser) describeNext() string {
	if p.pos >= len(p.s) {
		return "end of type"
	}
	r := []rune(p.s[p.pos:])
	return fmt.Sprintf("%q", string(r[0]))
}

func (p *typeParser) parse(depth int) (*typeExpr, *typeSyntaxError) {
	p.skipSpace()
	start := p.pos
	if depth > maxTypeDepth {
		return nil, &typeSyntaxError{start, fmt.Sprintf("type nests more than %d levels deep; simplify it with a named type", maxTypeDepth)}
	}
	name := p.ident()
	if name == "" {
		return nil, &typeSyntaxError{start, fmt.Sprintf("expected a type name, found %s", p.describeNext())}
	}
	if p.peek() != '<' {
		if name == "list" || name == "map" {
			return nil, &typeSyntaxError{start, fmt.Sprintf("%s needs an element type, e.g. %s<string>", name, name)}
		}
		return &typeExpr{name: name, off: start}, nil
	}
	lt := p.pos
	p.pos++ // '<'
	var kind Kind
	switch name {
	case "list":
		kind = KindList
	case "map":
		kind = KindMap
	default:
		return nil, &typeSyntaxError{lt, fmt.Sprintf("%s does not take a type parameter; only list<T> and map<T> do", name)}
	}
	elem, err := p.parse(depth + 1)
	if err != nil {
		return nil, err
	}
	if p.peek() == ',' {
		if kind == KindList {
			return nil, &typeSyntaxError{p.pos, "list takes one type parameter: list<T>"}
		}
		if elem.name != string(String) {
			return nil, &typeSyntaxError{elem.off, fmt.Sprintf("map keys must be string (JSON object keys are strings), not %s; write map<T> or map<string, T>", p.s[elem.off:p.pos])}
		}
		p.pos++ // ','
		elem, err = p.parse(depth + 1)
		if err != nil {
			return nil, err
		}
	}
	if p.peek() != '>' {
		if p.pos >= len(p.s) {
			return nil, &typeSyntaxError{lt, fmt.Sprintf("unclosed %q; add the missing %q", "<", ">")}
		}
		return nil, &typeSyntaxError{p.pos, fmt.Sprintf("expected %q, found %s", ">", p.describeNext())}
	}
	p.pos++ // '>'
	return &typeExpr{kind: kind, elem: elem, off: start}, nil
}

// predeclared are the predeclared Go types a go_type may name without an
// import path (all marshal to JSON).
var predeclared = map[string]bool{
	"any": true, "bool": true, "byte": true, "float32": true, "float64": true,
	"int": true, "int8": true, "int16": true, "int32": true, "int64": true,
	"rune": true, "string": true, "uint": true, "uint8": true, "uint16": true,
	"uint32": true, "uint64": true, "uintptr": true,
}

// parseGoTypeString parses the string form of go_type:
// "[*]import/path.TypeName" or a bare predeclared name like "string".
func parseGoTypeString(s string) (*GoType, string) {
	g := &GoType{}
	orig := s
	if strings.HasPrefix(s, "*") {
		g.Pointer = true
		s = s[1:]
	}
	if s == "" {
		return nil, `go_type must not be empty; write "import/path.TypeName", e.g. "github.com/shopspring/decimal.Decimal"`
	}
	i := strings.LastIndex(s, ".")
	if i < 0 {
		if predeclared[s] {
			g.Name = s
			return g, ""
		}
		return nil, fmt.Sprintf(`go_type %q has no import path; write "import/path.%s", or use a predeclared type such as string or int64`, s, s)
	}
	if strings.Contains(s[i+1:], "/") {
		// The last dot is inside the import path, e.g. github.com/foo/bar.
		return nil, fmt.Sprintf(`go_type %q has no type name: write import/path.TypeName, e.g. "%s.TypeName"`, orig, orig)
	}
	g.Import, g.Name = s[:i], s[i+1:]
	if msg := checkGoType(g); msg != "" {
		return nil, msg
	}
	return g, ""
}

// checkGoType validates a go_type's import path and type name.
func checkGoType(g *GoType) string {
	if g.Import == "" {
		if !predeclared[g.Name] {
			if isExportedIdent(g.Name) {
				return fmt.Sprintf("go_type %s has no import path; add the package that declares it", g.Name)
			}
			return fmt.Sprintf("go_type %q is not a predeclared Go type; add an import path or use e.g. string or int64", g.Name)
		}
		return ""
	}
	if msg := checkImportPath(g.Import); msg != "" {
		return msg
	}
	if !token.IsIdentifier(g.Name) || !isExportedIdent(g.Name) {
		return fmt.Sprintf("go_type name %q in package %s is not an exported Go identifier; it must start with an upper-case letter, e.g. %s.Decimal", g.Name, g.Import, g.Import)
	}
	return ""
}

// checkImportPath reports what is wrong with an import path, or "".
func checkImportPath(path string) string {
	bad := func(why string) string {
		return fmt.Sprintf("go_type import path %q %s; write e.g. github.com/shopspring/decimal", path, why)
	}
	if path == "" {
		return bad("is empty")
	}
	if path == "C" {
		return `go_type import path "C" is cgo's pseudo-package, which the generated code cannot import (a C type does not marshal to JSON); use a Go type, e.g. github.com/shopspring/decimal.Decimal`
	}
	if strings.HasPrefix(path, "/") || strings.HasSuffix(path, "/") {
		return bad("must not start or end with a slash")
	}
	for _, elem := range strings.Split(path, "/") {
		if elem == "" {
			return bad("has an empty path element")
		}
		if elem[0] == '.' || elem[len(elem)-1] == '.' {
			return bad("has an element starting or ending with a dot")
		}
		for _, r := range elem {
			ok := 'a' <= r && r <= 'z' || 'A' <= r && r <= 'Z' || '0' <= r && r <= '9' ||
				strings.ContainsRune("-._~+", r)
			if !ok {
				return bad(fmt.Sprintf("contains the invalid character %q", r))
			}
		}
	}
	return ""
}
