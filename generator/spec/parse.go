package spec

import (
	"bytes"
	"errors"
	"fmt"
	"go/token"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"strings"

	"gopkg.in/yaml.v3"

	"github.com/outboxgen/outboxgen/templates"
)

// ParseFile reads and parses the spec file at path; see Parse. It reads
// regular files only (not a FIFO or a device such as /dev/zero), and at most
// MaxSpecBytes of them.
func ParseFile(path string) (*Spec, error) {
	data, err := readSpecFile(path)
	if err != nil {
		var pos Pos
		if errors.Is(err, errTooLarge) {
			pos = Pos{1, 1}
		}
		return nil, ErrorList{{File: path, Pos: pos, Msg: err.Error()}}
	}
	return Parse(path, data)
}

// errTooLarge marks a spec file larger than MaxSpecBytes.
var errTooLarge = errors.New("split it into several events.yaml files, each with its own go.out")

// tooLarge is the error for a spec file of size bytes (-1: unknown, more
// than MaxSpecBytes).
func tooLarge(size int64) error {
	if size < 0 {
		return fmt.Errorf("the spec file is larger than %d bytes, the limit (MaxSpecBytes); %w", MaxSpecBytes, errTooLarge)
	}
	return fmt.Errorf("the spec file is %d bytes; the limit is %d (MaxSpecBytes); %w", size, MaxSpecBytes, errTooLarge)
}

// readSpecFile reads the regular file at path, refusing anything larger
// than MaxSpecBytes.
func readSpecFile(path string) ([]byte, error) {
	// Stat before opening: opening a FIFO blocks until a writer appears.
	fi, err := os.Stat(path)
	if err != nil {
		return nil, fmt.Errorf("cannot read spec file: %w", pathless(err))
	}
	if !fi.Mode().IsRegular() {
		return nil, fmt.Errorf("cannot read spec file: it is %s, not a regular file", modeName(fi.Mode()))
	}
	if fi.Size() > MaxSpecBytes {
		return nil, tooLarge(fi.Size())
	}
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("cannot read spec file: %w", pathless(err))
	}
	defer f.Close()
	// The file may have been replaced or may grow: check again, and read
	// through a bounded reader.
	if fi, err := f.Stat(); err != nil || !fi.Mode().IsRegular() {
		return nil, fmt.Errorf("cannot read spec file: not a regular file")
	}
	data, err := io.ReadAll(io.LimitReader(f, MaxSpecBytes+1))
	if err != nil {
		return nil, fmt.Errorf("cannot read spec file: %w", pathless(err))
	}
	if len(data) > MaxSpecBytes {
		return nil, tooLarge(-1)
	}
	return data, nil
}

// pathless returns the error inside a *fs.PathError ("no such file or
// directory"), or err: the error list already names the file, and "stat
// events.yaml" would name it again with an internal operation.
func pathless(err error) error {
	if pe, ok := errors.AsType[*fs.PathError](err); ok {
		return pe.Err
	}
	return err
}

// modeName describes a non-regular file mode for error messages.
func modeName(m os.FileMode) string {
	switch {
	case m.IsDir():
		return "a directory"
	case m&os.ModeNamedPipe != 0:
		return "a named pipe (FIFO)"
	case m&os.ModeCharDevice != 0:
		return "a character device"
	case m&os.ModeDevice != 0:
		return "a device"
	case m&os.ModeSocket != 0:
		return "a socket"
	}
	return "not a regular file (" + m.Type().String() + ")"
}

// Parse parses and validates the events.yaml contents data; filename is
// used in positions and stored in Spec.File. On failure the error is an
// ErrorList holding every problem found, sorted by position; Parse never
// panics, whatever data holds.
func Parse(filename string, data []byte) (spec *Spec, err error) {
	defer func() {
		// A safety net: Parse must not crash its caller. FuzzParse fails on
		// this message, so bugs still surface in testing.
		if r := recover(); r != nil {
			spec, err = nil, ErrorList{{File: filename, Pos: Pos{1, 1}, Msg: fmt.Sprintf("%s: %v; please report this bug", internalError, r)}}
		}
	}()
	if len(data) > MaxSpecBytes {
		return nil, ErrorList{{File: filename, Pos: Pos{1, 1}, Msg: tooLarge(int64(len(data))).Error()}}
	}
	p := &parser{
		file:        filename,
		spec:        &Spec{File: filename},
		typeByName:  map[string]*typeDecl{},
		eventByName: map[string]*eventDecl{},
		naming:      defaultNaming,
		renamed:     map[any][]*renameEntry{},
	}
	p.run(data)
	if len(p.errs) > 0 {
		return nil, p.errs.normalize()
	}
	return p.spec, nil
}

// run parses and validates data, stopping early after MaxErrors problems.
func (p *parser) run(data []byte) {
	defer func() {
		if r := recover(); r != nil {
			if _, ok := r.(errTooManyErrors); !ok {
				panic(r)
			}
		}
	}()
	root := p.decode(data)
	if root == nil || !p.checkTree(root) {
		return
	}
	p.parseRoot(root)
	if !p.tooBig {
		p.validate()
	}
}

// internalError starts the message of a recovered panic.
const internalError = "internal error"

// parser holds the state of one Parse call.
type parser struct {
	file string
	errs ErrorList
	spec *Spec

	types       []*typeDecl
	typeByName  map[string]*typeDecl
	events      []*eventDecl
	eventByName map[string]*eventDecl
	consumers   []*consumerDecl

	driverNode *yaml.Node // the go.driver value, if given
	goOutNode  *yaml.Node // the go.out value, once valid
	sqlOutNode *yaml.Node // the sql.out value, if given

	naming     *naming                // go.initialisms and go.rename
	renameKeys []*yaml.Node           // the valid go.rename keys, in file order
	renamed    map[any][]*renameEntry // Go-named item -> go.rename entries used

	declared int  // declarations counted so far, see MaxDeclarations
	handled  int  // consumers' handled events counted so far, see MaxHandlers
	tooBig   bool // a size limit was hit: skip validation
}

// typeDecl is a declared type and what validation needs about it.
type typeDecl struct {
	t      *Type
	fields []*fieldDecl
}

// eventDecl is a declared event and what validation needs about it.
type eventDecl struct {
	e       *Event
	ctx     string
	fields  []*fieldDecl
	keyNode *yaml.Node
	dup     bool // a later duplicate, kept only to check its contents
	// previous are the earlier versions under previous:, in file order.
	previous []*versionDecl
	// versionNode is the event's version value, if given.
	versionNode *yaml.Node
}

// versionDecl is an earlier version of an event, declared under previous:.
type versionDecl struct {
	v           *EventVersion
	fields      []*fieldDecl
	versionNode *yaml.Node
}

// consumerDecl is a declared consumer.
type consumerDecl struct {
	c *Consumer
}

// fieldDecl is a field, its unresolved type and where that type was written.
type fieldDecl struct {
	f        *Field
	ctx      string
	typeNode *yaml.Node
	expr     *typeExpr
	goType   *GoType
	// pointerNode is where goType is made a pointer: the "*..." string
	// or the pointer: value.
	pointerNode *yaml.Node
}

// errorf records a problem at the position of n (1:1 if n is nil).
func (p *parser) errorf(n *yaml.Node, format string, args ...any) {
	p.errorAt(posOf(n), format, args...)
}

// errorAt records a problem at pos. After MaxErrors problems it records
// that it stops, and stops the parse (see run).
func (p *parser) errorAt(pos Pos, format string, args ...any) {
	if len(p.errs) >= MaxErrors {
		p.errs.add(p.file, pos, "too many problems (more than %d, MaxErrors); fix these and run again", MaxErrors)
		panic(errTooManyErrors{})
	}
	p.errs.add(p.file, pos, format, args...)
}

func posOf(n *yaml.Node) Pos {
	if n == nil {
		return Pos{1, 1}
	}
	return Pos{n.Line, n.Column}
}

// deref follows aliases (*name) to the anchored node.
func deref(n *yaml.Node) *yaml.Node {
	for i := 0; n != nil && n.Kind == yaml.AliasNode && n.Alias != nil && i < 100; i++ {
		n = n.Alias
	}
	return n
}

// decode parses data into a YAML node tree and returns the document's root
// value, or nil after recording why there is none.
func (p *parser) decode(data []byte) (root *yaml.Node) {
	defer func() {
		if r := recover(); r != nil {
			if _, ok := r.(errTooManyErrors); ok {
				panic(r)
			}
			p.errorAt(Pos{1, 1}, "invalid YAML: %v", r)
			root = nil
		}
	}()
	dec := yaml.NewDecoder(bytes.NewReader(data))
	var doc yaml.Node
	if err := dec.Decode(&doc); err != nil {
		if errors.Is(err, io.EOF) {
			p.errorAt(Pos{1, 1}, "the spec file is empty; it needs version, go, sql and events")
		} else {
			p.yamlError(data, err)
		}
		return nil
	}
	var extra yaml.Node
	if err := dec.Decode(&extra); err == nil {
		p.errorf(&extra, "the spec file must hold a single YAML document; remove the second one (after ---)")
	} else if !errors.Is(err, io.EOF) {
		p.yamlError(data, err)
		return nil
	}
	root = &doc
	if doc.Kind == yaml.DocumentNode {
		if len(doc.Content) == 0 {
			p.errorAt(Pos{1, 1}, "the spec file is empty; it needs version, go, sql and events")
			return nil
		}
		root = doc.Content[0]
	}
	if r := deref(root); r == nil || r.Kind == yaml.ScalarNode && r.Tag == "!!null" {
		p.errorf(root, "the spec file is empty; it needs version, go, sql and events")
		return nil
	}
	return root
}

// kindName describes the kind of a node for "must be X, got Y" messages.
func kindName(n *yaml.Node) string {
	n = deref(n)
	if n == nil {
		return "nothing"
	}
	switch n.Kind {
	case yaml.MappingNode:
		return "a mapping"
	case yaml.SequenceNode:
		return "a list"
	case yaml.ScalarNode:
		switch n.Tag {
		case "!!null":
			return "an empty value"
		case "!!int":
			return "the integer " + n.Value
		case "!!float":
			return "the number " + n.Value
		case "!!bool":
			return "the boolean " + n.Value
		}
		v := n.Value
		if len(v) > 40 {
			v = v[:40] + "..."
		}
		return fmt.Sprintf("the string %q", v)
	case yaml.AliasNode:
		return "an unresolved alias"
	}
	return "an unknown node"
}

func isNull(n *yaml.Node) bool {
	n = deref(n)
	return n == nil || n.Kind == yaml.ScalarNode && n.Tag == "!!null"
}

// mapNode is a YAML mapping with its keys checked for duplicates.
type mapNode struct {
	node *yaml.Node
	keys []*yaml.Node          // first occurrence of each key, in order
	key  map[string]*yaml.Node // key name -> key node (first occurrence)
	val  map[string]*yaml.Node // key name -> value node (first occurrence)
	dups []*yaml.Node          // repeated key nodes
	bad  []*yaml.Node          // keys that are not plain scalars
}

// mapping returns n as a mapping, or records that subject must be one and
// returns nil.
func (p *parser) mapping(n *yaml.Node, subject string) *mapNode {
	d := deref(n)
	if d == nil || d.Kind != yaml.MappingNode {
		p.errorf(n, "%s must be a mapping, got %s", subject, kindName(n))
		return nil
	}
	m := &mapNode{node: d, key: map[string]*yaml.Node{}, val: map[string]*yaml.Node{}}
	for i := 0; i+1 < len(d.Content); i += 2 {
		k, v := d.Content[i], d.Content[i+1]
		kd := deref(k)
		if kd == nil || kd.Kind != yaml.ScalarNode {
			m.bad = append(m.bad, k)
			continue
		}
		if _, ok := m.key[kd.Value]; ok {
			m.dups = append(m.dups, k)
			continue
		}
		m.keys = append(m.keys, k)
		m.key[kd.Value] = k
		m.val[kd.Value] = v
	}
	return m
}

// checkKeys reports duplicate, malformed and unknown keys of m, which
// describes ctx.
//
// Keys starting with one of ignorePrefixes are allowed and ignored (the
// top level allows "x-" keys to hold YAML anchors).
func (p *parser) checkKeys(m *mapNode, ctx string, allowed []string, ignorePrefixes ...string) {
	for _, k := range m.dups {
		name := deref(k).Value
		p.errorf(k, "duplicate key %q in %s (first at line %d); remove one of them", name, ctx, m.key[name].Line)
	}
	for _, k := range m.bad {
		p.errorf(k, "keys in %s must be plain strings, got %s", ctx, kindName(k))
	}
	for _, k := range m.keys {
		name := deref(k).Value
		if contains(allowed, name) || hasAnyPrefix(name, ignorePrefixes) {
			continue
		}
		if deref(k).Tag == "!!merge" {
			p.errorf(k, "merge keys (<<) are not supported in %s; write the keys out", ctx)
			continue
		}
		if to := movedKeys[name]; to != "" && ctx == rootCtx {
			p.errorf(k, "unknown key %q in %s; did you mean %s (under go:)?", name, ctx, to)
		} else if s := suggest(name, allowed); s != "" {
			p.errorf(k, "unknown key %q in %s; did you mean %q?", name, ctx, s)
		} else {
			p.errorf(k, "unknown key %q in %s; allowed keys are %s", name, ctx, strings.Join(allowed, ", "))
		}
	}
}

func hasAnyPrefix(s string, prefixes []string) bool {
	for _, p := range prefixes {
		if strings.HasPrefix(s, p) {
			return true
		}
	}
	return false
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// get returns the value of key if it is allowed and present.
func (m *mapNode) get(key string) *yaml.Node {
	if m == nil {
		return nil
	}
	return m.val[key]
}

// require returns the value of key, or records that ctx misses it.
func (p *parser) require(m *mapNode, ctx, key, hint string) *yaml.Node {
	if v := m.get(key); v != nil {
		return v
	}
	p.errorf(m.node, "%s is missing required key %q; %s", ctx, key, hint)
	return nil
}

// str returns the string value of scalar n; an empty value is "".
func (p *parser) str(n *yaml.Node, subject string) (string, bool) {
	d := deref(n)
	if d == nil || d.Kind != yaml.ScalarNode {
		p.errorf(n, "%s must be a string, got %s", subject, kindName(n))
		return "", false
	}
	if d.Tag == "!!null" {
		return "", true
	}
	return d.Value, true
}

// boolean returns the value of a true/false scalar.
func (p *parser) boolean(n *yaml.Node, subject string) (bool, bool) {
	d := deref(n)
	if d == nil || d.Kind != yaml.ScalarNode || d.Tag != "!!bool" {
		p.errorf(n, "%s must be true or false, got %s", subject, kindName(n))
		return false, false
	}
	return strings.EqualFold(d.Value, "true"), true
}

// integer returns the value of an integer scalar.
func (p *parser) integer(n *yaml.Node, subject string) (int, bool) {
	d := deref(n)
	if d == nil || d.Kind != yaml.ScalarNode || d.Tag != "!!int" {
		p.errorf(n, "%s must be an integer, got %s", subject, kindName(n))
		return 0, false
	}
	var v int32
	if err := d.Decode(&v); err != nil {
		p.errorf(n, "%s must be an integer that fits in 32 bits, got %s", subject, d.Value)
		return 0, false
	}
	return int(v), true
}

// list returns the items of a sequence; an empty value is an empty list.
func (p *parser) list(n *yaml.Node, subject string) ([]*yaml.Node, bool) {
	d := deref(n)
	if isNull(d) {
		return nil, true
	}
	if d.Kind != yaml.SequenceNode {
		p.errorf(n, "%s must be a list, got %s", subject, kindName(n))
		return nil, false
	}
	return d.Content, true
}

// label picks a readable name for an item in messages: kind + name when the
// name is presentable, else its index path.
func label(kind, name, indexPath string) string {
	if name != "" && len(name) <= 64 && looseName.MatchString(name) {
		return kind + " " + name
	}
	return indexPath
}

var looseName = regexp.MustCompile(`^[A-Za-z0-9_.\-]+$`)

// rootCtx describes the top level of the spec in messages.
const rootCtx = "the top-level mapping"

// movedKeys are top-level keys that belong under another section, as sqlc
// users may write them.
var movedKeys = map[string]string{"rename": "go.rename", "initialisms": "go.initialisms"}

var (
	rootKeys     = []string{"version", "go", "sql", "types", "events", "consumers"}
	goKeys       = []string{"package", "out", "driver", "initialisms", "rename"}
	sqlKeys      = []string{"dialects", "out", "outbox_table", "inbox_table", "archive_table", "wal"}
	typeKeys     = []string{"name", "description", "fields", "enum"}
	eventKeys    = []string{"name", "description", "topic", "key", "version", "ordered", "fields", "previous"}
	previousKeys = []string{"version", "description", "fields"}
	fieldKeys    = []string{"name", "type", "optional", "description", "go_type"}
	goTypeKeys   = []string{"import", "type", "pointer"}
	consumerKeys = []string{"name", "description", "events", "latest_only"}
)

var (
	packageRe  = regexp.MustCompile(`^[a-z][a-z0-9_]*$`)
	typeNameRe = regexp.MustCompile(`^[A-Z][A-Za-z0-9]*$`)
	enumRe     = regexp.MustCompile(`^[A-Za-z][A-Za-z0-9_.-]*$`)
	eventRe    = regexp.MustCompile(`^[A-Z][A-Z0-9]*(_[A-Z0-9]+)*$`)
	topicRe    = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._\-/]{0,248}$`)
	fieldRe    = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)
	consumerRe = regexp.MustCompile(`^[a-z][a-z0-9_]{0,62}$`)
)

// maxEventName is the longest allowed event name (the biz_type column).
const maxEventName = templates.MaxTypeLen

func (p *parser) parseRoot(root *yaml.Node) {
	m := p.mapping(root, "the spec file")
	if m == nil {
		return
	}
	p.checkKeys(m, rootCtx, rootKeys, "x-")
	const ctx = "the spec file"
	if v := p.require(m, ctx, "version", "add version: 1"); v != nil {
		if n, ok := p.integer(v, "version"); ok && n != 1 {
			p.errorf(v, "unsupported version %d; this outboxgen reads version 1", n)
		}
	}
	p.spec.Version = 1
	if v := p.require(m, ctx, "go", "add go: with package and out"); v != nil {
		p.parseGo(v)
	}
	if v := p.require(m, ctx, "sql", "add sql: with dialects, e.g. dialects: [postgres]"); v != nil {
		p.parseSQL(v)
	}
	if v := m.get("types"); v != nil {
		p.parseTypes(v)
	}
	if v := p.require(m, ctx, "events", "declare at least one event under events:"); v != nil {
		p.spec.EventsPos = posOf(v)
		p.parseEvents(v)
	}
	if v := m.get("consumers"); v != nil {
		p.parseConsumers(v)
	}
}

func (p *parser) parseGo(n *yaml.Node) {
	m := p.mapping(n, "go")
	if m == nil {
		return
	}
	p.checkKeys(m, "go", goKeys)
	if v := p.require(m, "go", "package", "add package: events (the Go package name of the generated code)"); v != nil {
		if s, ok := p.str(v, "go.package"); ok {
			switch {
			case s == "":
				p.errorf(v, "go.package must not be empty; use a lower-case Go identifier such as events")
			case !packageRe.MatchString(s):
				p.errorf(v, "go.package %q is not a valid Go package name; use a lower-case identifier such as events", s)
			case token.IsKeyword(s):
				p.errorf(v, "go.package %q is a Go keyword; choose another name such as events", s)
			case s == "main":
				p.errorf(v, "go.package main cannot hold the generated code: a main package cannot be imported by the code that writes and handles the events; choose another name such as events")
			case s == "documentation":
				p.errorf(v, "go.package documentation cannot hold the generated code: the go tool ignores the files of a package named documentation, so nothing could import it; choose another name such as events")
			}
			p.spec.Go.Package = s
		}
	}
	if v := p.require(m, "go", "out", "add out: the directory for the generated code, relative to the spec file"); v != nil {
		if dir := p.outDir(v, "go.out"); dir != "" {
			if msg := goPackageDir(dir); msg != "" {
				p.errorf(v, "go.out %q %s", deref(v).Value, msg)
			} else {
				p.spec.Go.Out = dir
				p.goOutNode = v
			}
		}
	}
	p.spec.Go.Driver = DriverDatabaseSQL
	if v := m.get("driver"); v != nil {
		p.driverNode = v
		if s, ok := p.str(v, "go.driver"); ok {
			switch Driver(s) {
			case DriverDatabaseSQL, DriverPgx:
				p.spec.Go.Driver = Driver(s)
			default:
				drivers := []string{string(DriverDatabaseSQL), string(DriverPgx)}
				if sg := suggest(s, drivers); sg != "" {
					p.errorf(v, "unknown go.driver %q; did you mean %q?", s, sg)
				} else {
					p.errorf(v, "unknown go.driver %q; use database/sql or pgx/v5", s)
				}
			}
		}
	}
	initialisms, rename := m.get("initialisms"), m.get("rename")
	if initialisms != nil || rename != nil {
		p.naming = &naming{initialisms: commonInitialisms}
		if initialisms != nil {
			p.parseInitialisms(initialisms)
		}
		if rename != nil {
			p.parseRename(rename)
		}
	}
}

var (
	// initialismRe is one word of a name, as splitWords cuts it.
	initialismRe = regexp.MustCompile(`^[A-Za-z0-9]*[A-Za-z][A-Za-z0-9]*$`)
	// renameKeyRe is a name or name part in lower-case snake_case.
	renameKeyRe = regexp.MustCompile(`^[a-z0-9]+(_[a-z0-9]+)*$`)
	// renameToRe is an exported ASCII Go identifier.
	renameToRe = regexp.MustCompile(`^[A-Z][A-Za-z0-9_]*$`)
)

// exportedIdent returns s without the characters an exported Go identifier
// cannot hold and with its first letter upper-cased, if that is one; else
// "".
func exportedIdent(s string) string {
	b := []byte(strings.Map(func(r rune) rune {
		if r < 0x80 && (r == '_' || 'a' <= r && r <= 'z' || 'A' <= r && r <= 'Z' || '0' <= r && r <= '9') {
			return r
		}
		return -1
	}, s))
	if len(b) > 0 && 'a' <= b[0] && b[0] <= 'z' {
		b[0] -= 'a' - 'A'
	}
	if !renameToRe.Match(b) {
		return ""
	}
	return string(b)
}

// parseInitialisms reads go.initialisms: the words written in upper case,
// replacing the default list (as sqlc's initialisms option does). An
// empty value keeps the default list; [] is no initialisms.
func (p *parser) parseInitialisms(n *yaml.Node) {
	if isNull(n) {
		return
	}
	items, ok := p.list(n, "go.initialisms")
	if !ok {
		return
	}
	set := make(map[string]bool, len(items))
	first := map[string]int{}
	for _, it := range items {
		s, ok := p.str(it, "each entry of go.initialisms")
		if !ok {
			continue
		}
		up := strings.ToUpper(s)
		switch {
		case !initialismRe.MatchString(s):
			if words := splitWords(s); len(words) > 1 {
				p.errorf(it, "go.initialisms entry %q is not one word; list its words (%s) one by one, or map the whole name to its Go name under go.rename", s, strings.Join(words, ", "))
			} else {
				p.errorf(it, "go.initialisms entry %q is not a word; use letters and digits, e.g. sms", s)
			}
		case first[up] != 0:
			p.errorf(it, "duplicate go.initialisms entry %s (first at line %d); remove one", s, first[up])
		default:
			first[up] = it.Line
			set[up] = true
		}
	}
	p.naming.initialisms = set
}

// parseRename reads go.rename: names and name parts (snake_case) mapped to
// the Go names to write for them, as in sqlc's rename option.
func (p *parser) parseRename(n *yaml.Node) {
	if isNull(n) {
		return
	}
	m := p.mapping(n, "go.rename")
	if m == nil {
		return
	}
	const ctx = "go.rename"
	for _, k := range m.dups {
		name := deref(k).Value
		p.errorf(k, "duplicate key %q in %s (first at line %d); remove one of them", name, ctx, m.key[name].Line)
	}
	for _, k := range m.bad {
		p.errorf(k, "keys in %s must be plain strings, got %s", ctx, kindName(k))
	}
	p.naming.rename = map[string]*renameEntry{}
	for _, k := range m.keys {
		key := deref(k).Value
		if deref(k).Tag == "!!merge" {
			p.errorf(k, "merge keys (<<) are not supported in %s; write the keys out", ctx)
			continue
		}
		v := m.val[key]
		to, ok := p.str(v, fmt.Sprintf("go.rename of %q", key))
		keyOK := true
		if !renameKeyRe.MatchString(key) {
			keyOK = false
			if words := splitWords(key); len(words) > 0 && snakeKey(words) != key {
				p.errorf(k, "go.rename key %q must be a name or name part in lower-case snake_case; did you mean %q?", key, snakeKey(words))
			} else {
				p.errorf(k, "go.rename key %q must be a name or name part in lower-case snake_case, e.g. sms or country_de", key)
			}
		}
		if !ok {
			continue
		}
		if !renameToRe.MatchString(to) {
			hint := ""
			if fix := exportedIdent(to); fix != "" {
				hint = fmt.Sprintf("; did you mean %s?", fix)
			}
			p.errorf(v, "go.rename of %q: %q is not an exported Go identifier; use an upper-case ASCII letter, then letters, digits or underscores%s", key, to, hint)
			continue
		}
		if keyOK {
			p.naming.rename[key] = &renameEntry{key: key, to: to, line: k.Line}
			p.renameKeys = append(p.renameKeys, k)
		}
	}
}

// outDir validates a relative output directory.
func (p *parser) outDir(v *yaml.Node, subject string) string {
	s, ok := p.str(v, subject)
	if !ok {
		return ""
	}
	switch {
	case strings.TrimSpace(s) == "":
		p.errorf(v, "%s must not be empty; give a directory relative to the spec file", subject)
		return ""
	case strings.ContainsAny(s, "\x00\n\r"):
		p.errorf(v, "%s must be a plain directory path without control characters", subject)
		return ""
	case path.IsAbs(s) || filepath.IsAbs(s) || filepath.VolumeName(s) != "" || strings.HasPrefix(s, `\`):
		p.errorf(v, "%s %q must be relative to the spec file's directory, not absolute", subject, s)
		return ""
	}
	if off, why := firstBadRune(s); off >= 0 {
		p.errorAt(offsetPos(v, off), "%s must be a plain directory path; it contains %s", subject, why)
		return ""
	}
	clean := path.Clean(strings.ReplaceAll(s, `\`, "/"))
	if clean == ".." || strings.HasPrefix(clean, "../") {
		p.errorf(v, "%s %q leaves the spec file's directory; outboxgen writes only inside the directory tree of the spec file, so move the spec file up or the output directory down", subject, s)
		return ""
	}
	return path.Clean(filepath.ToSlash(s))
}

func (p *parser) parseSQL(n *yaml.Node) {
	m := p.mapping(n, "sql")
	if m == nil {
		return
	}
	p.checkKeys(m, "sql", sqlKeys)
	p.spec.SQL.Pos = posOf(m.node)
	if v := p.require(m, "sql", "dialects", "add dialects: [postgres] (or mysql, sqlite)"); v != nil {
		p.parseDialects(v)
	}
	if v := m.get("out"); v != nil {
		p.spec.SQL.Out = p.outDir(v, "sql.out")
		p.sqlOutNode = v
	}
	if v := m.get("wal"); v != nil {
		if on, ok := p.boolean(v, "sql.wal"); ok && on {
			p.spec.SQL.WAL = true
			p.spec.SQL.WALPos = posOf(v)
			// Checked only when the dialects parsed: a broken list has
			// its own error, and guessing past it would add noise.
			if len(p.spec.SQL.Dialects) > 0 && !slices.Contains(p.spec.SQL.Dialects, Postgres) {
				p.errorf(v, "sql.wal: true needs postgres in sql.dialects (WAL mode uses PostgreSQL logical decoding); add postgres to sql.dialects or remove sql.wal")
			}
		}
	}
	p.spec.SQL.OutboxTable = templates.DefaultTables.Outbox
	p.spec.SQL.InboxTable = templates.DefaultTables.Inbox
	var outboxNode *yaml.Node
	outboxOK, inboxOK, archiveOK := true, true, true
	if v := m.get("outbox_table"); v != nil {
		outboxNode = v
		var s string
		if s, outboxOK = p.tableName(v, "sql.outbox_table", templates.MaxOutboxName, "_event_id_key"); outboxOK {
			p.spec.SQL.OutboxTable = s
			p.spec.SQL.OutboxTablePos = posOf(v)
		}
	}
	inboxNode := m.get("inbox_table")
	if v := inboxNode; v != nil {
		var s string
		if s, inboxOK = p.tableName(v, "sql.inbox_table", templates.MaxInboxName, "_processed_at_idx"); inboxOK {
			p.spec.SQL.InboxTable = s
			p.spec.SQL.InboxTablePos = posOf(v)
			if s == p.spec.SQL.OutboxTable {
				where := "the default outbox table name"
				if outboxNode != nil {
					where = fmt.Sprintf("sql.outbox_table (line %d)", outboxNode.Line)
				}
				p.errorf(v, "sql.inbox_table %q is the same as %s; the two tables must have different names", s, where)
				inboxOK = false
			}
		}
	}
	archiveNode := m.get("archive_table")
	if archiveNode != nil {
		var s string
		if s, archiveOK = p.tableName(archiveNode, "sql.archive_table", templates.MaxArchiveName, "_archived_at_idx"); archiveOK {
			p.spec.SQL.ArchiveTable = s
			p.spec.SQL.ArchiveTablePos = posOf(archiveNode)
		}
	}
	// The DDL derives index and constraint names from the table names;
	// they must differ (templates owns those rules).
	if outboxOK && inboxOK && archiveOK {
		tables := templates.Tables{Outbox: p.spec.SQL.OutboxTable, Inbox: p.spec.SQL.InboxTable, Archive: p.spec.SQL.ArchiveTable}
		if err := tables.Validate(); err != nil {
			at := outboxNode
			switch {
			case archiveNode != nil && strings.Contains(err.Error(), p.spec.SQL.ArchiveTable):
				at = archiveNode
			case at == nil || (inboxNode != nil && strings.Contains(err.Error(), p.spec.SQL.InboxTable+"_")):
				at = inboxNode
			}
			if at == nil {
				at = n
			}
			p.errorf(at, "%s", strings.TrimPrefix(err.Error(), "templates: "))
		} else {
			p.checkDerivedNames(tables, map[string]*yaml.Node{
				"sql.outbox_table": outboxNode, "sql.inbox_table": inboxNode, "sql.archive_table": archiveNode,
			}, n)
		}
	}
}

// tableName validates a table name: a safe SQL identifier of at most max
// characters, so that the longest name derived from it (name + suffix)
// fits the 63-character identifier limit.
func (p *parser) tableName(v *yaml.Node, subject string, max int, suffix string) (string, bool) {
	s, ok := p.sqlIdent(v, subject)
	if !ok {
		return "", false
	}
	if len(s) > max {
		p.errorf(v, "%s %q is %d characters long; the limit is %d, so that the names derived from it, such as %s%s, fit in %d characters", subject, s, len(s), max, s, suffix, templates.MaxIdentifier)
		return "", false
	}
	return s, true
}

func (p *parser) parseDialects(v *yaml.Node) {
	items, ok := p.list(v, "sql.dialects")
	if !ok {
		return
	}
	if len(items) == 0 {
		p.errorf(v, "sql.dialects must list at least one dialect: postgres, mysql or sqlite")
		return
	}
	type seen struct {
		raw  string
		line int
	}
	first := map[Dialect]seen{}
	for _, it := range items {
		s, ok := p.str(it, "each dialect")
		if !ok {
			continue
		}
		name, err := templates.ParseDialect(s)
		d := Dialect(name)
		if err != nil {
			if sg := suggest(s, templates.DialectNames()); sg != "" {
				p.errorf(it, "unknown dialect %q; did you mean %q?", s, sg)
			} else {
				p.errorf(it, "unknown dialect %q; use postgres, mysql or sqlite", s)
			}
			continue
		}
		if f, dup := first[d]; dup {
			if f.raw == s {
				p.errorf(it, "duplicate dialect %s (first at line %d); remove one", s, f.line)
			} else {
				p.errorf(it, "dialect %s duplicates %s (line %d): both mean %s; remove one", s, f.raw, f.line, d)
			}
			continue
		}
		first[d] = seen{s, it.Line}
		p.spec.SQL.Dialects = append(p.spec.SQL.Dialects, d)
	}
}

// sqlIdent validates an identifier spliced into DDL.
func (p *parser) sqlIdent(v *yaml.Node, subject string) (string, bool) {
	s, ok := p.str(v, subject)
	if !ok {
		return "", false
	}
	if !templates.ValidIdentifier(s) {
		p.errorf(v, "%s %q is not a safe SQL identifier; use 1 to %d lower-case letters, digits and underscores, starting with a letter or underscore (this prevents SQL injection, as the name is spliced into SQL)", subject, s, templates.MaxIdentifier)
		return "", false
	}
	if in := sqlReserved[s]; in != 0 {
		p.errorf(v, "%s %q is a reserved SQL word (in %s), which the DDL cannot use unquoted; choose another name, e.g. %s_log", subject, s, in, s)
		return "", false
	}
	return s, true
}

func (p *parser) parseTypes(n *yaml.Node) {
	items, ok := p.list(n, "types")
	if !ok || !p.limit(n, len(items), MaxTypes, "the types list", "MaxTypes") || !p.declare(n, len(items)) {
		return
	}
	for i, it := range items {
		p.parseType(it, i)
	}
}

func (p *parser) parseType(n *yaml.Node, i int) {
	index := fmt.Sprintf("types[%d]", i)
	m := p.mapping(n, index)
	if m == nil {
		return
	}
	t := &Type{Pos: posOf(m.node)}
	if v := m.get("name"); v != nil {
		t.Name, _ = p.str(v, index+".name")
	}
	ctx := label("type", t.Name, index)
	p.checkKeys(m, ctx, typeKeys)
	nameOK, dup := false, false
	if v := p.require(m, ctx, "name", "add name: a PascalCase type name, e.g. Address"); v != nil && t.Name != "" {
		switch {
		case !typeNameRe.MatchString(t.Name):
			p.errorf(v, "type name %q must be PascalCase (letters and digits, starting upper-case), e.g. Address", t.Name)
		case isScalar(strings.ToLower(t.Name)) || strings.EqualFold(t.Name, "list") || strings.EqualFold(t.Name, "map"):
			p.errorf(v, "type name %q is too close to the built-in type %s; choose another name", t.Name, strings.ToLower(t.Name))
		case p.typeByName[t.Name] != nil:
			p.errorf(v, "duplicate type %s (first at line %d); rename or remove one", t.Name, p.typeByName[t.Name].t.Pos.Line)
			dup = true
		default:
			nameOK = true
		}
	} else if v != nil {
		p.errorf(v, "type name must not be empty; use a PascalCase name, e.g. Address")
	}
	if v := m.get("description"); v != nil {
		t.Description = p.description(v, "description of "+ctx)
	}
	d := &typeDecl{t: t}
	fieldsNode, enumNode := m.get("fields"), m.get("enum")
	switch {
	case fieldsNode != nil && enumNode != nil:
		first, second := m.key["fields"], m.key["enum"]
		if second.Line < first.Line || second.Line == first.Line && second.Column < first.Column {
			first, second = second, first
		}
		p.errorf(second, "%s has both fields and enum; a type is either an object (fields) or an enum (enum), remove one", ctx)
	case fieldsNode != nil:
		d.fields = p.parseFields(fieldsNode, ctx)
		for _, f := range d.fields {
			t.Fields = append(t.Fields, f.f)
		}
	case enumNode != nil:
		t.Values = p.parseEnum(enumNode, ctx)
	default:
		p.errorf(m.node, "%s needs fields (for an object type) or enum (for an enum type)", ctx)
	}
	if nameOK {
		p.typeByName[t.Name] = d
	}
	p.types = append(p.types, d)
	if !dup {
		p.spec.Types = append(p.spec.Types, t)
	}
}

func (p *parser) parseEnum(n *yaml.Node, ctx string) []*EnumValue {
	values := []*EnumValue{}
	items, ok := p.list(n, "enum of "+ctx)
	if !ok {
		return values
	}
	if len(items) == 0 {
		p.errorf(n, "enum of %s must list at least one value", ctx)
		return values
	}
	if !p.limit(n, len(items), MaxEnumValues, "enum of "+ctx, "MaxEnumValues") || !p.declare(n, len(items)) {
		return values
	}
	first := map[string]int{}
	for _, it := range items {
		s, ok := p.str(it, "each enum value of "+ctx)
		if !ok {
			continue
		}
		if !enumRe.MatchString(s) {
			p.errorf(it, "enum value %q of %s is invalid; start with a letter and use letters, digits, '_', '.' or '-'", s, ctx)
			continue
		}
		if line, dup := first[s]; dup {
			p.errorf(it, "duplicate enum value %s in %s (first at line %d); remove one", s, ctx, line)
			continue
		}
		first[s] = it.Line
		values = append(values, &EnumValue{Value: s, Pos: posOf(it)})
	}
	return values
}

// parseFields parses the fields list of ctx (an event or object type).
func (p *parser) parseFields(n *yaml.Node, ctx string) []*fieldDecl {
	items, ok := p.list(n, "fields of "+ctx)
	if !ok {
		return nil
	}
	if len(items) == 0 {
		p.errorf(n, "%s must have at least one field", ctx)
		return nil
	}
	if !p.limit(n, len(items), MaxFields, ctx, "MaxFields") || !p.declare(n, len(items)) {
		return nil
	}
	var out []*fieldDecl
	byName := map[string]*Field{}
	byGo := map[string]*Field{}
	for i, it := range items {
		index := fmt.Sprintf("fields[%d] of %s", i, ctx)
		m := p.mapping(it, index)
		if m == nil {
			continue
		}
		f := &Field{Pos: posOf(m.node)}
		if it.Kind == yaml.AliasNode {
			// A field reused through an alias is declared where it is used.
			f.Pos = posOf(it)
		}
		if v := m.get("name"); v != nil {
			f.Name, _ = p.str(v, "name of "+index)
		}
		fctx := index
		if f.Name != "" && len(f.Name) <= 64 && looseName.MatchString(f.Name) {
			fctx = fmt.Sprintf("field %s of %s", f.Name, ctx)
		}
		p.checkKeys(m, fctx, fieldKeys)
		d := &fieldDecl{f: f, ctx: fctx}
		dup := false
		if v := p.require(m, fctx, "name", "add name: the field's JSON name, e.g. order_id"); v != nil {
			switch {
			case f.Name == "":
				p.errorf(v, "field name must not be empty; use e.g. order_id")
			case !fieldRe.MatchString(f.Name):
				p.errorf(v, "field name %q is invalid; use letters, digits and underscores, not starting with a digit", f.Name)
			case byName[f.Name] != nil:
				if it.Kind == yaml.AliasNode {
					v = it
				}
				p.errorf(v, "duplicate field %s in %s (first at line %d); rename or remove one", f.Name, ctx, byName[f.Name].Pos.Line)
				dup = true
			default:
				byName[f.Name] = f
				var used []*renameEntry
				f.GoName, used = p.naming.goName(f.Name)
				p.renamed[f] = used
				switch {
				case f.GoName == "" || !token.IsIdentifier(f.GoName):
					p.errorf(v, "field name %q does not make a valid Go name; start it with a letter", f.Name)
				case reservedFieldNames[f.GoName]:
					// Go structs cannot have a field and a method of one name.
					p.errorf(v, "field %s of %s has the Go name %s%s, which collides with the generated %s method; rename it", f.Name, ctx, f.GoName, renameNote(used), f.GoName)
				case byGo[f.GoName] != nil:
					g := byGo[f.GoName]
					p.errorf(v, "field %s%s collides with %s %s as Go name %s; rename one of them", f.Name, renameNote(used), g.Name, lineNote(g.Pos.Line, p.renamed[g]), f.GoName)
				default:
					byGo[f.GoName] = f
				}
			}
		}
		if v := p.require(m, fctx, "type", "add type: e.g. string, int64, list<string> or a type from types:"); v != nil {
			d.typeNode = v
			if s, ok := p.str(v, "type of "+fctx); ok {
				expr, err := parseTypeString(s)
				if err != nil {
					p.errorAt(offsetPos(v, err.off), "invalid type %q: %s", s, err.msg)
				}
				d.expr = expr
			}
		}
		if v := m.get("optional"); v != nil {
			f.Optional, _ = p.boolean(v, "optional of "+fctx)
		}
		if v := m.get("description"); v != nil {
			f.Description = p.description(v, "description of "+fctx)
		}
		if v := m.get("go_type"); v != nil {
			d.goType, d.pointerNode = p.parseGoType(v, fctx)
		}
		if !dup {
			out = append(out, d)
		}
	}
	return out
}

// offsetPos is the position of byte off within scalar v's value, when the
// scalar is written plainly on one line; else v's own position.
func offsetPos(v *yaml.Node, off int) Pos {
	pos := posOf(v)
	d := deref(v)
	if d != v || d.Style != 0 || strings.ContainsAny(d.Value, "\n") {
		return pos
	}
	pos.Col += len([]rune(d.Value[:min(off, len(d.Value))]))
	return pos
}

// parseGoType parses the go_type value v of field fctx, and returns it with
// the node that makes it a pointer, if any.
func (p *parser) parseGoType(v *yaml.Node, fctx string) (*GoType, *yaml.Node) {
	d := deref(v)
	if d != nil && d.Kind == yaml.MappingNode {
		gctx := "go_type of " + fctx
		m := p.mapping(v, gctx)
		p.checkKeys(m, gctx, goTypeKeys)
		g := &GoType{}
		if n := m.get("import"); n != nil {
			g.Import, _ = p.str(n, "go_type.import")
		}
		pointer := m.get("pointer")
		if pointer != nil {
			g.Pointer, _ = p.boolean(pointer, "go_type.pointer")
		}
		if n := p.require(m, gctx, "type", "add type: the Go type name, e.g. Decimal"); n != nil {
			if s, ok := p.str(n, "go_type.type"); ok {
				g.Name = s
				if msg := checkGoType(g); msg != "" {
					p.errorf(n, "%s", msg)
					return nil, nil
				}
				return g, pointer
			}
		}
		return nil, nil
	}
	if d == nil || d.Kind != yaml.ScalarNode {
		p.errorf(v, `go_type of %s must be a string "import/path.Type" or a mapping {import, type, pointer}, got %s`, fctx, kindName(v))
		return nil, nil
	}
	s, _ := p.str(v, "go_type of "+fctx)
	g, msg := parseGoTypeString(s)
	if msg != "" {
		p.errorf(v, "%s", msg)
		return nil, nil
	}
	return g, v
}

func (p *parser) parseEvents(n *yaml.Node) {
	items, ok := p.list(n, "events")
	if !ok {
		return
	}
	if len(items) == 0 {
		p.errorf(n, "events must list at least one event")
		return
	}
	if !p.limit(n, len(items), MaxEvents, "the events list", "MaxEvents") || !p.declare(n, len(items)) {
		return
	}
	for i, it := range items {
		p.parseEvent(it, i)
	}
}

func (p *parser) parseEvent(n *yaml.Node, i int) {
	index := fmt.Sprintf("events[%d]", i)
	m := p.mapping(n, index)
	if m == nil {
		return
	}
	e := &Event{Pos: posOf(m.node), Version: 1, Ordered: true}
	if v := m.get("name"); v != nil {
		e.Name, _ = p.str(v, index+".name")
	}
	ctx := label("event", e.Name, index)
	p.checkKeys(m, ctx, eventKeys)
	d := &eventDecl{e: e, ctx: ctx}
	nameOK := false
	if v := p.require(m, ctx, "name", "add name: a SCREAMING_SNAKE event name, e.g. ORDER_PAID"); v != nil {
		switch {
		case e.Name == "":
			p.errorf(v, "event name must not be empty; use SCREAMING_SNAKE_CASE, e.g. ORDER_PAID")
		case !eventRe.MatchString(e.Name):
			p.errorf(v, "event name %q must be SCREAMING_SNAKE_CASE (upper-case letters and digits separated by single underscores), e.g. ORDER_PAID", e.Name)
		case len(e.Name) > maxEventName:
			p.errorf(v, "event name %s is %d characters long; the limit is %d", e.Name, len(e.Name), maxEventName)
		case p.eventByName[e.Name] != nil:
			p.errorf(v, "duplicate event %s (first at line %d); rename or remove one", e.Name, p.eventByName[e.Name].e.Pos.Line)
			d.dup = true
		default:
			nameOK = true
			var used []*renameEntry
			e.GoName, used = p.naming.goName(e.Name)
			p.renamed[e] = used
		}
	}
	if v := m.get("description"); v != nil {
		e.Description = p.description(v, "description of "+ctx)
	}
	if v := p.require(m, ctx, "topic", "add topic: the broker topic to publish to, e.g. orders.paid"); v != nil {
		if s, ok := p.str(v, "topic of "+ctx); ok {
			e.Topic = s
			if !topicRe.MatchString(s) {
				p.errorf(v, "invalid topic %q; use 1 to 249 letters, digits, '.', '_', '-' or '/', starting with a letter or digit (no spaces or wildcards)", s)
			}
		}
	}
	if v := p.require(m, ctx, "key", "add key: the name of the required field that identifies the aggregate, e.g. order_id"); v != nil {
		if _, ok := p.str(v, "key of "+ctx); ok {
			d.keyNode = v
		}
	}
	if v := m.get("version"); v != nil {
		d.versionNode = v
		if n, ok := p.integer(v, "version of "+ctx); ok {
			if n < 1 {
				p.errorf(v, "version of %s must be at least 1, got %d", ctx, n)
			} else {
				e.Version = n
			}
		}
	}
	if v := m.get("ordered"); v != nil {
		e.Ordered, _ = p.boolean(v, "ordered of "+ctx)
	}
	if v := p.require(m, ctx, "fields", "add fields: the payload fields"); v != nil {
		d.fields = p.parseFields(v, ctx)
		for _, f := range d.fields {
			e.Fields = append(e.Fields, f.f)
		}
	}
	if v := m.get("previous"); v != nil {
		p.parsePrevious(v, d)
	}
	if nameOK {
		p.eventByName[e.Name] = d
	}
	p.events = append(p.events, d)
	if !d.dup {
		p.spec.Events = append(p.spec.Events, e)
	}
}

// parsePrevious reads an event's previous: list, the earlier versions of
// its payload that consumers still decode: each with its version (below the
// event's current one, each listed once) and its fields.
func (p *parser) parsePrevious(n *yaml.Node, d *eventDecl) {
	e := d.e
	items, ok := p.list(n, "previous of "+d.ctx)
	if !ok || !p.limit(n, len(items), MaxPreviousVersions, "previous of "+d.ctx, "MaxPreviousVersions") || !p.declare(n, len(items)) {
		return
	}
	first := map[int]int{}
	for i, it := range items {
		index := fmt.Sprintf("previous[%d] of %s", i, d.ctx)
		m := p.mapping(it, index)
		if m == nil {
			continue
		}
		pv := &EventVersion{Pos: posOf(m.node)}
		vd := &versionDecl{v: pv}
		versionOK := false
		if v := m.get("version"); v != nil {
			vd.versionNode = v
			pv.Version, versionOK = p.integer(v, "version of "+index)
		}
		vctx := index
		if versionOK && pv.Version > 0 {
			vctx = fmt.Sprintf("version %d of %s", pv.Version, d.ctx)
		}
		p.checkKeys(m, vctx, previousKeys)
		valid := false
		if v := p.require(m, vctx, "version", "add version: the earlier payload version these fields describe, e.g. 1"); v != nil && versionOK {
			switch line, dup := first[pv.Version]; {
			case pv.Version < 1:
				p.errorf(v, "version of %s must be at least 1, got %d", index, pv.Version)
			case pv.Version >= e.Version:
				hint := fmt.Sprintf("bump the version of %s above %d", d.ctx, pv.Version)
				if d.versionNode == nil {
					hint = fmt.Sprintf("set version: %d (or higher) on %s, whose version defaults to 1", pv.Version+1, d.ctx)
				}
				p.errorf(v, "previous version %d of %s is not below its current version %d; previous: lists earlier versions only, so %s", pv.Version, d.ctx, e.Version, hint)
			case dup:
				p.errorf(v, "duplicate previous version %d of %s (first at line %d); remove one", pv.Version, d.ctx, line)
			default:
				first[pv.Version] = v.Line
				valid = true
			}
		}
		if v := m.get("description"); v != nil {
			pv.Description = p.description(v, "description of "+vctx)
		}
		if v := p.require(m, vctx, "fields", "add fields: the payload fields of that version"); v != nil {
			vd.fields = p.parseFields(v, vctx)
			for _, f := range vd.fields {
				pv.Fields = append(pv.Fields, f.f)
			}
		}
		if e.GoName != "" && valid {
			pv.GoName = fmt.Sprintf("%sV%d", e.GoName, pv.Version)
		}
		d.previous = append(d.previous, vd)
		if valid {
			e.Previous = append(e.Previous, pv)
		}
	}
	slices.SortStableFunc(e.Previous, func(a, b *EventVersion) int { return a.Version - b.Version })
}

func (p *parser) parseConsumers(n *yaml.Node) {
	items, ok := p.list(n, "consumers")
	if !ok || p.tooBig {
		// When events were skipped, every handled event would look unknown.
		return
	}
	if !p.limit(n, len(items), MaxConsumers, "the consumers list", "MaxConsumers") || !p.declare(n, len(items)) {
		return
	}
	byName := map[string]*Consumer{}
	for i, it := range items {
		index := fmt.Sprintf("consumers[%d]", i)
		m := p.mapping(it, index)
		if m == nil {
			continue
		}
		c := &Consumer{Pos: posOf(m.node)}
		if v := m.get("name"); v != nil {
			c.Name, _ = p.str(v, index+".name")
		}
		ctx := label("consumer", c.Name, index)
		p.checkKeys(m, ctx, consumerKeys)
		dup := false
		if v := p.require(m, ctx, "name", "add name: a snake_case consumer name, e.g. points"); v != nil {
			switch {
			case c.Name == "":
				p.errorf(v, "consumer name must not be empty; use snake_case, e.g. points")
			case !consumerRe.MatchString(c.Name):
				p.errorf(v, "consumer name %q must be snake_case: a lower-case letter, then up to 62 lower-case letters, digits or underscores", c.Name)
			case byName[c.Name] != nil:
				p.errorf(v, "duplicate consumer %s (first at line %d); rename or remove one", c.Name, byName[c.Name].Pos.Line)
				dup = true
			default:
				byName[c.Name] = c
				var used []*renameEntry
				c.GoName, used = p.naming.goName(c.Name)
				p.renamed[c] = used
			}
		}
		if v := m.get("description"); v != nil {
			c.Description = p.description(v, "description of "+ctx)
		}
		if v := p.require(m, ctx, "events", "add events: the list of events it handles, e.g. [ORDER_PAID]"); v != nil {
			p.parseConsumerEvents(v, c, ctx)
		}
		if v := m.get("latest_only"); v != nil {
			p.parseLatestOnly(v, c, ctx)
		}
		if !dup {
			p.consumers = append(p.consumers, &consumerDecl{c: c})
			p.spec.Consumers = append(p.spec.Consumers, c)
		}
	}
}

func (p *parser) parseConsumerEvents(v *yaml.Node, c *Consumer, ctx string) {
	items, ok := p.list(v, "events of "+ctx)
	if !ok {
		return
	}
	if len(items) == 0 {
		p.errorf(v, "%s must handle at least one event; list it under events:", ctx)
		return
	}
	if !p.handlers(v, len(items)) || !p.declare(v, len(items)) {
		return
	}
	first := map[string]int{}
	for _, it := range items {
		s, ok := p.str(it, "each event of "+ctx)
		if !ok {
			continue
		}
		if line, dup := first[s]; dup {
			p.errorf(it, "%s lists event %s twice (first at line %d); remove one", ctx, s, line)
			continue
		}
		first[s] = it.Line
		d := p.eventByName[s]
		if d == nil {
			names := make([]string, 0, len(p.events))
			for _, e := range p.events {
				names = append(names, e.e.Name)
			}
			if sg := suggest(s, names); sg != "" {
				p.errorf(it, "%s handles unknown event %q; did you mean %s?", ctx, s, sg)
			} else {
				p.errorf(it, "%s handles unknown event %q; declare it under events: or remove it", ctx, s)
			}
			continue
		}
		c.Events = append(c.Events, d.e)
	}
}

// parseLatestOnly reads a consumer's latest_only list: events of its events
// list that get the stale guard.
func (p *parser) parseLatestOnly(v *yaml.Node, c *Consumer, ctx string) {
	items, ok := p.list(v, "latest_only of "+ctx)
	if !ok || !p.declare(v, len(items)) {
		return
	}
	names := make([]string, 0, len(c.Events))
	handledByName := make(map[string]*Event, len(c.Events))
	for _, e := range c.Events {
		names = append(names, e.Name)
		handledByName[e.Name] = e
	}
	first := map[string]int{}
	for _, it := range items {
		s, ok := p.str(it, "each event of latest_only of "+ctx)
		if !ok {
			continue
		}
		if line, dup := first[s]; dup {
			p.errorf(it, "%s lists event %s twice in latest_only (first at line %d); remove one", ctx, s, line)
			continue
		}
		first[s] = it.Line
		handled := handledByName[s]
		if handled == nil {
			if p.eventByName[s] != nil {
				p.errorf(it, "%s lists %s under latest_only but does not handle it; add it to its events or remove it from latest_only", ctx, s)
			} else if sg := suggest(s, names); sg != "" {
				p.errorf(it, "%s lists unknown event %q under latest_only; did you mean %s?", ctx, s, sg)
			} else {
				p.errorf(it, "%s lists unknown event %q under latest_only; list events of its events: there", ctx, s)
			}
			continue
		}
		c.LatestOnly = append(c.LatestOnly, handled)
	}
}
