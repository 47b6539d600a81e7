package dialect

// The statements of each dialect are the files sql/<dialect>.sql, embedded
// below. This file loads them, parses them once at init, and renders a
// statement for given table names (cached per dialect and table names) and
// arguments.
//
// A file is a list of statements, each under a sqlc-style name line
// ("-- name: RelayClaim :many"). Markers, all valid SQL to sqlc so that
// `sqlc compile` checks the files as they are (sql/sqlc.yaml):
//
//	/* TEMPLATE: outbox */outbox_event  the marker and the default that
//	                                    follows it (a word or a quoted
//	                                    literal) become the configured name
//	                                    (outbox, inbox, inbox_key,
//	                                    inbox_duplicate, archive,
//	                                    channel, version, due_index: the
//	                                    outbox's claim index, key_index:
//	                                    its per-key index); a literal
//	                                    stays quoted
//	sqlc.arg(name)                      one bind parameter
//	/* ARG: name */?                    the same, where the engine's parser
//	                                    refuses sqlc.arg (MySQL's LIMIT)
//	sqlc.slice(name)                    a list: one parameter per element
//	/* IF name */ ... /* END */         kept only when list name (fixed
//	                                    when the statement is prepared) is
//	                                    not empty
//
// Comments and line breaks are dropped when a file is parsed, so what is
// sent is the statement on one line.
//
// Rendering happens in two steps. prepare (once per dialect, table names
// and fixed lists; the result is cached or kept by the *Queries values)
// replaces the table markers and the fixed lists and resolves the IF
// sections; a prepared statement without a run-time list or a literal
// holds its final text. render (per call) binds the arguments, writes the
// placeholders of run-time lists (id lists) whose length changes per call,
// and writes literal args (stmtDef.asLiteral: a claim's row limit) as
// numbers.

import (
	"embed"
	"fmt"
	"regexp"
	"strings"
	"sync"
)

//go:embed sql/*.sql
var sqlFiles embed.FS

// A stmtDef is a statement the Go code runs, by name, with the parameter
// names its method passes in order (args) and those fixed when the
// statement is prepared (fixed: the relay's unordered type list). need
// says which dialects must define it; nil: every dialect.
type stmtDef struct {
	id    int
	name  string
	args  []string
	fixed []string
	// optional are the args a dialect may leave unused (MySQL's claim
	// leases in a later statement).
	optional []string
	// literals are the int args written into the text as numbers instead
	// of bound (see asLiteral).
	literals []string
	need     func(*spec) bool
}

var defs []*stmtDef

func define(need func(*spec) bool, name string, args ...string) *stmtDef {
	d := &stmtDef{id: len(defs), name: name, args: args, need: need}
	defs = append(defs, d)
	return d
}

// withFixed declares the lists fixed at prepare time.
func (d *stmtDef) withFixed(names ...string) *stmtDef { d.fixed = names; return d }

// mayOmit declares args a dialect's statement may leave unused.
func (d *stmtDef) mayOmit(names ...string) *stmtDef { d.optional = names; return d }

// asLiteral declares int args written into the statement's text as a
// decimal number rather than bound. A claim's row limit is one: PostgreSQL
// plans a prepared statement once per connection (its generic plan) only
// when that plan is not worse than planning for each call's values, and a
// generic plan knows nothing of a bound LIMIT (it assumes a tenth of the
// rows, and joins the claim's rows back to the table by a sequential scan).
// With the number in the text the generic plan is the good one, and the
// claim is no longer planned on every call. Each distinct value is a
// distinct statement, so callers keep the set of values small.
func (d *stmtDef) asLiteral(names ...string) *stmtDef { d.literals = names; return d }

// needed reports whether dialect s must define d.
func (d *stmtDef) needed(s *spec) bool { return d.need == nil || d.need(s) }

// The capabilities that decide which statements a dialect defines (see
// spec).
func needClaimInTx(s *spec) bool    { return s.claimInTx }
func needArrayIDs(s *spec) bool     { return s.arrayIDs }
func needRowLocks(s *spec) bool     { return s.rowLocks }
func needCandidates(s *spec) bool   { return s.claimCandidates }
func needHoldEach(s *spec) bool     { return s.holdEach }
func needHoldInFlight(s *spec) bool { return s.holdInFlight }
func needHoldInFlightArray(s *spec) bool {
	return s.holdInFlight && s.arrayIDs
}
func needNotify(s *spec) bool      { return s.notify }
func needWAL(s *spec) bool         { return s.wal }
func needArchiveMove(s *spec) bool { return s.archive == archiveMove }
func needArchivePick(s *spec) bool { return s.archive != archiveMove }
func needArchiveCopy(s *spec) bool { return s.archive == archivePickCopyDelete }

// file is one parsed statement file: name → statement.
type file map[string]*parsedStmt

type parsedStmt struct {
	name, cmd string
	body      string // normalised text with markers
}

var (
	nameRE     = regexp.MustCompile(`^-- name: (\w+) (:\w+)\s*$`)
	templateRE = regexp.MustCompile(`/\* TEMPLATE: (\w+) \*/ ?('[^']*'|\w+)`)
	ifRE       = regexp.MustCompile(`/\* IF (\w+) \*/(.*?)/\* END \*/`)
	paramRE    = regexp.MustCompile(`sqlc\.(arg|slice)\((\w+)\)|/\* ARG: (\w+) \*/\?`)
)

// parseFile splits a statement file into its named statements.
func parseFile(src string) (file, error) {
	f := file{}
	var cur *parsedStmt
	var body strings.Builder
	flush := func() error {
		if cur == nil {
			return nil
		}
		text := normalize(body.String())
		end := indexOutsideQuotes(text, ';')
		if end < 0 {
			return fmt.Errorf("statement %s: no terminating ';'", cur.name)
		}
		if rest := strings.TrimSpace(text[end+1:]); rest != "" {
			return fmt.Errorf("statement %s: text after ';': %q", cur.name, rest)
		}
		cur.body = strings.TrimSpace(text[:end])
		if cur.body == "" {
			return fmt.Errorf("statement %s is empty", cur.name)
		}
		if _, dup := f[cur.name]; dup {
			return fmt.Errorf("statement %s defined twice", cur.name)
		}
		f[cur.name] = cur
		body.Reset()
		return nil
	}
	for _, line := range strings.Split(src, "\n") {
		if m := nameRE.FindStringSubmatch(line); m != nil {
			if err := flush(); err != nil {
				return nil, err
			}
			cur = &parsedStmt{name: m[1], cmd: m[2]}
			continue
		}
		if cur != nil {
			body.WriteString(line)
			body.WriteByte('\n')
		}
	}
	if err := flush(); err != nil {
		return nil, err
	}
	return f, nil
}

// normalize drops "--" comments, collapses white space to single spaces,
// and drops the spaces just inside parentheses, outside string literals.
func normalize(s string) string {
	var b strings.Builder
	quoted, space := false, false
	for i := 0; i < len(s); i++ {
		c := s[i]
		if quoted {
			b.WriteByte(c)
			if c == '\'' {
				quoted = false
			}
			continue
		}
		if c == '-' && i+1 < len(s) && s[i+1] == '-' {
			for i < len(s) && s[i] != '\n' {
				i++
			}
			space = true
			continue
		}
		if c == ' ' || c == '\t' || c == '\n' || c == '\r' {
			space = true
			continue
		}
		if space {
			out := b.String()
			if len(out) > 0 && out[len(out)-1] != '(' && c != ')' && c != ';' {
				b.WriteByte(' ')
			}
			space = false
		}
		if c == '\'' {
			quoted = true
		}
		b.WriteByte(c)
	}
	return strings.TrimSpace(b.String())
}

func indexOutsideQuotes(s string, c byte) int {
	quoted := false
	for i := 0; i < len(s); i++ {
		switch {
		case s[i] == '\'':
			quoted = !quoted
		case !quoted && s[i] == c:
			return i
		}
	}
	return -1
}

// tables are the names a statement's TEMPLATE markers take. An empty name
// is one the caller does not have; a statement that needs it cannot be
// prepared.
type tables struct {
	outbox, inbox, archive string
}

// value returns the name of template marker t.
func (tb tables) value(t string) (string, error) {
	var v string
	switch t {
	case "outbox":
		v = tb.outbox
	case "inbox":
		v = tb.inbox
	case "inbox_key":
		if tb.inbox != "" {
			v = InboxKeyTable(tb.inbox)
		}
	case "inbox_duplicate":
		if tb.inbox != "" {
			v = InboxDuplicateTable(tb.inbox)
		}
	case "archive":
		v = tb.archive
	case "channel":
		if tb.outbox != "" {
			v = NotifyChannel(tb.outbox)
		}
	case "version":
		if tb.outbox != "" {
			v = VersionTable(tb.outbox)
		}
	case "due_index":
		if tb.outbox != "" {
			v = DueIndex(tb.outbox)
		}
	case "key_index":
		if tb.outbox != "" {
			v = KeyIndex(tb.outbox)
		}
	default:
		return "", fmt.Errorf("unknown template %q", t)
	}
	if v == "" {
		return "", fmt.Errorf("template %q: no table name given", t)
	}
	return v, nil
}

// seg is one placeholder of a prepared statement with the text before it.
type seg struct {
	text string
	arg  int  // index into the call's arguments; -1: val
	list bool // the argument is a list: one placeholder per element
	lit  bool // the argument (an int) is written as a number, not bound
	val  any  // a fixed value (already encoded)
}

// prepared is a statement ready to render.
type prepared struct {
	s    *spec
	name string
	segs []seg
	tail string
	// static is the final text when no segment is a run-time list or a
	// literal.
	static string
	// dynamic: the text depends on the call (a list or a literal).
	dynamic bool
	size    int // length of the text without placeholders
}

// prepare renders statement def of dialect s for table names tb and fixed
// lists fixed.
func (s *spec) prepare(def *stmtDef, tb tables, fixed map[string][]string) (*prepared, error) {
	ps, ok := s.file[def.name]
	if !ok {
		return nil, fmt.Errorf("%s: statement %s is not defined in sql/%s.sql", s.dialect, def.name, s.dialect)
	}
	var err error
	text := templateRE.ReplaceAllStringFunc(ps.body, func(m string) string {
		sm := templateRE.FindStringSubmatch(m)
		v, e := tb.value(sm[1])
		if e != nil {
			err = e
			return m
		}
		if strings.HasPrefix(sm[2], "'") {
			return "'" + v + "'"
		}
		return v
	})
	if err != nil {
		return nil, fmt.Errorf("%s %s: %w", s.dialect, def.name, err)
	}
	text = ifRE.ReplaceAllStringFunc(text, func(m string) string {
		sm := ifRE.FindStringSubmatch(m)
		l, ok := fixed[sm[1]]
		if !ok && !contains(def.fixed, sm[1]) {
			err = fmt.Errorf("IF %s: not a fixed list of the statement", sm[1])
		}
		if len(l) == 0 {
			return " "
		}
		return sm[2]
	})
	if err != nil {
		return nil, fmt.Errorf("%s %s: %w", s.dialect, def.name, err)
	}
	text = normalize(text)
	if rest := paramRE.ReplaceAllString(text, "?"); strings.Contains(rest, "/*") || strings.Contains(rest, "*/") || strings.Contains(rest, "sqlc.") {
		return nil, fmt.Errorf("%s %s: a comment or an unknown marker is left: %s", s.dialect, def.name, text)
	}

	for _, l := range def.literals {
		if index(def.args, l) < 0 {
			return nil, fmt.Errorf("%s %s: literal %s is not an argument of the statement (%v)", s.dialect, def.name, l, def.args)
		}
	}
	p := &prepared{s: s, name: def.name}
	used := make([]bool, len(def.args))
	last := 0
	var b strings.Builder // the static text
	n := 0
	for _, loc := range paramRE.FindAllStringSubmatchIndex(text, -1) {
		before := text[last:loc[0]]
		last = loc[1]
		name := ""
		list := false
		if loc[4] >= 0 {
			name, list = text[loc[4]:loc[5]], text[loc[2]:loc[3]] == "slice"
		} else {
			name = text[loc[6]:loc[7]]
		}
		if vals, ok := fixed[name]; ok || contains(def.fixed, name) {
			if !list {
				return nil, fmt.Errorf("%s %s: fixed %s must be a sqlc.slice", s.dialect, def.name, name)
			}
			for i, v := range vals {
				if i > 0 {
					before = ", "
				}
				p.segs = append(p.segs, seg{text: before, arg: -1, val: v})
				b.WriteString(before)
				n++
				b.WriteString(s.placeholder(n))
			}
			if len(vals) == 0 {
				return nil, fmt.Errorf("%s %s: fixed list %s is empty outside an IF section", s.dialect, def.name, name)
			}
			continue
		}
		i := index(def.args, name)
		if i < 0 {
			return nil, fmt.Errorf("%s %s: parameter %s is not an argument of the statement (%v)", s.dialect, def.name, name, def.args)
		}
		used[i] = true
		if contains(def.literals, name) {
			if list {
				return nil, fmt.Errorf("%s %s: literal %s must be a sqlc.arg", s.dialect, def.name, name)
			}
			p.segs = append(p.segs, seg{text: before, arg: i, lit: true})
			p.dynamic = true
			b.WriteString(before)
			continue
		}
		p.segs = append(p.segs, seg{text: before, arg: i, list: list})
		p.dynamic = p.dynamic || list
		b.WriteString(before)
		n++
		b.WriteString(s.placeholder(n))
	}
	p.tail = text[last:]
	b.WriteString(p.tail)
	for i, u := range used {
		if !u && !contains(def.optional, def.args[i]) {
			return nil, fmt.Errorf("%s %s: argument %s is not used", s.dialect, def.name, def.args[i])
		}
	}
	for _, sg := range p.segs {
		p.size += len(sg.text)
	}
	p.size += len(p.tail)
	if !p.dynamic {
		p.static = b.String()
	}
	return p, nil
}

func contains(list []string, s string) bool { return index(list, s) >= 0 }

func index(list []string, s string) int {
	for i, v := range list {
		if v == s {
			return i
		}
	}
	return -1
}

// stmtSet holds every statement of a dialect prepared for one set of
// table names (no fixed lists), indexed by stmtDef.id. Statements the
// dialect does not define, or that need a table the set lacks, are nil.
type stmtSet struct {
	s     *spec
	stmts []*prepared
}

type setKey struct {
	d  Dialect
	tb tables
}

// sets caches a stmtSet per dialect and table names: rendering happens
// once per configuration, never per call.
var sets sync.Map // setKey → *stmtSet

// statements returns the statements of dialect s for table names tb.
func (s *spec) statements(tb tables) *stmtSet {
	k := setKey{s.dialect, tb}
	if v, ok := sets.Load(k); ok {
		return v.(*stmtSet)
	}
	set := &stmtSet{s: s, stmts: make([]*prepared, len(defs))}
	for _, def := range defs {
		if _, ok := s.file[def.name]; !ok || len(def.fixed) > 0 {
			continue
		}
		p, err := s.prepare(def, tb, nil)
		if err != nil {
			continue // a table the set lacks (get reports it)
		}
		set.stmts[def.id] = p
	}
	v, _ := sets.LoadOrStore(k, set)
	return v.(*stmtSet)
}

// get returns statement def. The statement must exist: the callers check
// the capability first (a test proves every dialect has what it needs).
func (set *stmtSet) get(def *stmtDef) *prepared {
	p := set.stmts[def.id]
	if p == nil {
		panic(fmt.Sprintf("dialect: %s has no statement %s for these tables", set.s.dialect, def.name))
	}
	return p
}

// mustPrepare prepares a statement with fixed lists (the claims); the
// embedded SQL is checked by the package tests, so an error is a bug.
func (s *spec) mustPrepare(def *stmtDef, tb tables, fixed map[string][]string) *prepared {
	if _, ok := s.file[def.name]; !ok {
		return nil
	}
	p, err := s.prepare(def, tb, fixed)
	if err != nil {
		panic("dialect: " + err.Error())
	}
	return p
}

// loadFiles parses every dialect's statement file; called once at init.
func loadFiles() {
	for _, s := range specs {
		src, err := sqlFiles.ReadFile("sql/" + string(s.dialect) + ".sql")
		if err != nil {
			panic(fmt.Sprintf("dialect: %s: %v", s.dialect, err))
		}
		f, err := parseFile(string(src))
		if err != nil {
			panic(fmt.Sprintf("dialect: sql/%s.sql: %v", s.dialect, err))
		}
		s.file = f
	}
}

func init() { loadFiles() }
