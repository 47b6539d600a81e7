package dialect

// The query catalog: every statement the runtime sends, rendered per
// dialect into queries/<dialect>.sql with an sqlc annotation, next to the
// schema sqlc checks them against, rendered from templates into
// queries/schema/<dialect>.sql. `make check-generated` runs this test (the
// files are current) and `sqlc compile -f runtime/dialect/queries/sqlc.yaml`
// (every statement parses and matches the tables templates/ creates).
// Regenerate with
//
//	go test ./runtime/dialect -run TestQueryCatalog -update

import (
	"bytes"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/outboxgen/outboxgen/templates"
)

var update = flag.Bool("update", false, "rewrite the query catalog in queries/")

// catalogArchive is the archive table of the catalog: the janitor's archive
// has no default name, so the catalog picks one and templates renders it.
const catalogArchive = "outbox_archive"

// catalogTables are the tables of the catalog: the events.yaml defaults
// plus catalogArchive.
func catalogTables() templates.Tables {
	t := templates.DefaultTables
	t.Archive = catalogArchive
	return t
}

// catalogUnordered is the unordered type list of the "Unordered" variants.
var catalogUnordered = []string{"AUDIT_LOGGED"}

// Representative arguments. Only the number of ids changes the text.
var (
	catalogIDs   = []int64{101, 102}
	catalogOwner = "relay-1"
)

// catalogEntry is one statement of the catalog.
type catalogEntry struct {
	name string // sqlc query name
	cmd  string // sqlc query command
	by   string // the Go call that builds it
	sql  string
}

// catalog returns every statement the runtime sends on dialect d with the
// catalog tables.
func catalog(t *testing.T, d Dialect) []catalogEntry {
	t.Helper()
	tb := catalogTables()
	var es []catalogEntry
	add := func(name, cmd, by, sql string) {
		es = append(es, catalogEntry{name: name, cmd: cmd, by: by, sql: sql})
	}
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}

	// Writers (runtime/outbox, runtime/pgxoutbox, runtime/txpublisher).
	add("OutboxInsertEvent", ":exec", "Dialect.InsertEvent(table, false)", d.InsertEvent(tb.Outbox, false))
	add("OutboxInsertEventIfAbsent", ":exec", "Dialect.InsertEvent(table, true): a caller-chosen event id", d.InsertEvent(tb.Outbox, true))
	add("OutboxEventIdentity", ":one", "Dialect.EventIdentity(table): a writer tells a repeated caller-chosen id from a clash", d.EventIdentity(tb.Outbox))
	if d == Postgres {
		add("OutboxNotifyInsert", ":exec", "NotifyInsert(table): the writer's optional wake-up", NotifyInsert(tb.Outbox))
		add("RelayListen", ":exec", "Listen(table): the relay's LISTEN session (native pgx driver)", Listen(tb.Outbox))
	}

	// MySQLSessionTimeZone is left out: sqlc's MySQL engine has no
	// UTC_TIMESTAMP function (strict_function_checks would fail); the
	// sqldriver time-zone test runs it on MariaDB.

	// Relay and sweeper (runtime/relay, runtime/sweeper).
	rq, err := NewRelayQueries(d, tb.Outbox, nil)
	must(err)
	uq, err := NewRelayQueries(d, tb.Outbox, catalogUnordered)
	must(err)
	unord := fmt.Sprintf("%q", catalogUnordered)
	s, _ := rq.Claim(catalogOwner, 30*time.Second, 100)
	add("RelayClaim", ":many", "RelayQueries.Claim(owner, lease, limit), every type ordered", s)
	s, _ = uq.Claim(catalogOwner, 30*time.Second, 100)
	add("RelayClaimUnordered", ":many", "RelayQueries.Claim(owner, lease, limit), unordered types "+unord, s)
	s, _ = rq.ClaimOverdue(catalogOwner, 30*time.Second, 100, time.Minute)
	add("RelayClaimOverdue", ":many", "RelayQueries.ClaimOverdue(owner, lease, limit, overdueAfter): the sweeper's claim", s)
	if rq.ClaimInTransaction() {
		s, _ = rq.ClaimBlocked(catalogIDs)
		add("RelayClaimBlocked", ":many", "RelayQueries.ClaimBlocked(ids), every type ordered", s)
		s, _ = uq.ClaimBlocked(catalogIDs)
		add("RelayClaimBlockedUnordered", ":many", "RelayQueries.ClaimBlocked(ids), unordered types "+unord, s)
		s, _ = rq.ClaimLease(catalogOwner, 30*time.Second, catalogIDs)
		add("RelayClaimLease", ":execrows", "RelayQueries.ClaimLease(owner, lease, ids)", s)
	}
	s, _ = rq.MarkSent(catalogOwner, catalogIDs)
	add("RelayMarkSent", ":execrows", "RelayQueries.MarkSent(owner, ids)", s)
	s, _ = rq.MarkRetry(catalogOwner, 101, "broker down", 2*time.Second, 10)
	add("RelayMarkRetry", ":execrows", "RelayQueries.MarkRetry(owner, id, errText, delay, maxAttempts)", s)
	s, _ = rq.Release(catalogOwner, catalogIDs)
	add("RelayRelease", ":execrows", "RelayQueries.Release(owner, ids)", s)
	s, _ = rq.ExtendLease(catalogOwner, catalogIDs, 30*time.Second)
	add("RelayExtendLease", ":execrows", "RelayQueries.ExtendLease(owner, ids, lease): the relay's lease heartbeat", s)
	s, _ = rq.ListFailed(0, 100)
	add("RelayListFailed", ":many", "RelayQueries.ListFailed(afterID, limit)", s)
	s, _ = rq.Requeue(catalogIDs)
	add("RelayRequeue", ":execrows", "RelayQueries.Requeue(ids)", s)
	if aq := rq.ArrayIDs(); aq != rq {
		s, _ = aq.MarkSent(catalogOwner, catalogIDs)
		add("RelayMarkSentArray", ":execrows", "RelayQueries.ArrayIDs().MarkSent(owner, ids) (native pgx driver)", s)
		s, _ = aq.Release(catalogOwner, catalogIDs)
		add("RelayReleaseArray", ":execrows", "RelayQueries.ArrayIDs().Release(owner, ids) (native pgx driver)", s)
		s, _ = aq.ExtendLease(catalogOwner, catalogIDs, 30*time.Second)
		add("RelayExtendLeaseArray", ":execrows", "RelayQueries.ArrayIDs().ExtendLease(owner, ids, lease) (native pgx driver)", s)
		s, _ = aq.Requeue(catalogIDs)
		add("RelayRequeueArray", ":execrows", "RelayQueries.ArrayIDs().Requeue(ids) (native pgx driver)", s)
	}

	// Consumer inbox (runtime/inbox).
	iq, err := NewInboxQueries(d, tb.Inbox)
	must(err)
	s, _ = iq.Record("billing", "0190c7a4-0000-7000-8000-000000000001", "ORDER_PAID", "order-1")
	add("InboxRecord", ":execrows", "InboxQueries.Record(consumer, eventID, bizType, bizID)", s)
	s, _ = iq.Recorded("billing", "0190c7a4-0000-7000-8000-000000000001")
	add("InboxRecorded", ":one", "InboxQueries.Recorded(consumer, eventID)", s)
	s, _ = iq.Guard("billing", "ORDER_PAID", "order-1", 101)
	add("InboxGuard", ":execrows", "InboxQueries.Guard(consumer, bizType, bizID, seq)", s)

	// Monitor and janitor (runtime/monitor, runtime/janitor).
	oq, err := NewOpsQueries(d, tb.Outbox, tb.Inbox)
	must(err)
	s, _ = oq.Stats(5 * time.Minute)
	add("OpsStats", ":one", "OpsQueries.Stats(staleAfter)", s)
	s, _ = oq.DeleteSent(7*24*time.Hour, 1000)
	add("OpsDeleteSent", ":execrows", "OpsQueries.DeleteSent(olderThan, limit)", s)
	s, _ = oq.DeleteInbox(7*24*time.Hour, 1000)
	add("OpsDeleteInbox", ":execrows", "OpsQueries.DeleteInbox(olderThan, limit)", s)
	if oq.ArchiveInOneStatement() {
		s, _, err = oq.ArchiveMove(tb.Archive, 7*24*time.Hour, 1000)
		must(err)
		add("OpsArchiveMove", ":execrows", "OpsQueries.ArchiveMove(archive, olderThan, limit)", s)
	} else {
		s, _, err = oq.ArchivePick(tb.Archive, 7*24*time.Hour, 1000)
		must(err)
		add("OpsArchivePick", ":many", "OpsQueries.ArchivePick(archive, olderThan, limit)", s)
		if !oq.ArchiveCopiesOnPick() {
			s, _, err = oq.ArchiveCopy(tb.Archive, catalogIDs)
			must(err)
			add("OpsArchiveCopy", ":execrows", "OpsQueries.ArchiveCopy(archive, ids)", s)
		}
		add("OpsArchiveDelete", ":execrows", "OpsQueries.ArchiveDelete(ids)", first(oq.ArchiveDelete(catalogIDs)))
	}

	return es
}

func first(s string, _ []any) string { return s }

// catalogChecks says, per dialect, what sqlc checks (see queries/sqlc.yaml).
var catalogChecks = map[Dialect]string{
	Postgres: `sqlc's PostgreSQL parser and catalog check the syntax, the tables,
-- the selected, returned and inserted columns, the columns compared with a
-- parameter, and the functions (strict_function_checks).`,
	MySQL: `sqlc's MySQL parser (TiDB) and catalog check the syntax, the tables,
-- the selected, returned and inserted columns, the columns compared with a
-- parameter, and the functions (strict_function_checks).`,
	SQLite: `sqlc prepares each statement on an in-memory SQLite database
-- created from that schema: every table, column and function is checked.`,
}

// renderCatalog writes the catalog file of dialect d.
func renderCatalog(d Dialect, es []catalogEntry) []byte {
	tb := catalogTables()
	var b bytes.Buffer
	fmt.Fprintf(&b, `-- Code generated by TestQueryCatalog (runtime/dialect/catalog_test.go). DO NOT EDIT.
-- Regenerate: go test ./runtime/dialect -run TestQueryCatalog -update
--
-- Every statement package runtime/dialect builds for outboxgen's runtime
-- on %[1]s, for the default tables and an archive table:
--   %[2]s, %[3]s, %[3]s_key, %[4]s.
-- Statements that depend on their arguments are shown for an unordered
-- type list of one type where that changes the text, and for id lists of
-- two ids. Only the layout differs from what is sent: line breaks and
-- indentation replace single spaces.
--
-- sqlc checks every statement against schema/%[1]s.sql, the DDL templates/
-- renders (sqlc compile -f runtime/dialect/queries/sqlc.yaml).
-- %[5]s
`, d, tb.Outbox, tb.Inbox, tb.Archive, catalogChecks[d])
	for _, e := range es {
		fmt.Fprintf(&b, "\n-- name: %s %s\n-- %s\n%s;\n", e.name, e.cmd, e.by, formatSQL(e.sql))
	}
	return b.Bytes()
}

// Clause keywords that start a new line when they appear at the top level
// of a statement or subquery.
var (
	clauseRE = regexp.MustCompile(`^(FROM|WHERE|ORDER BY|LIMIT|OFFSET|FOR UPDATE|SET|RETURNING|VALUES|ON CONFLICT|ON DUPLICATE KEY UPDATE|SELECT|UPDATE|INSERT INTO|DELETE FROM|AND)\b`)
	subqRE   = regexp.MustCompile(`^\((SELECT|WITH|DELETE|UPDATE|INSERT)\b`)
)

const (
	indentStr = "    "
	// shortSubquery is the longest subquery kept on one line.
	shortSubquery = 60
	// lineWidth is the width beyond which a line is wrapped after a comma.
	lineWidth = 100
)

// formatSQL lays out a one-line statement over several lines: each clause
// of the statement and of each longer subquery on its own line, indented
// by the subquery depth, each AND of a WHERE clause on its own line, and
// long lines wrapped after a comma. It only ever replaces a single space
// by a line break and indentation, outside string literals, so unformatSQL
// restores the statement exactly.
func formatSQL(s string) string {
	type frame struct {
		query   bool // a subquery laid out over several lines
		level   int  // its indentation
		inWhere bool // after this frame's WHERE: break its ANDs
	}
	stack := []frame{{query: true}}
	var b strings.Builder
	quoted := false
	for i := 0; i < len(s); i++ {
		c := s[i]
		if quoted {
			b.WriteByte(c)
			if c == '\'' {
				quoted = false
			}
			continue
		}
		top := &stack[len(stack)-1]
		switch c {
		case '\'':
			quoted = true
		case '(':
			f := frame{level: top.level}
			if subqRE.MatchString(s[i:]) && closeParen(s, i)-i+1 > shortSubquery {
				f = frame{query: true, level: top.level + 1}
			}
			stack = append(stack, f)
		case ')':
			if len(stack) > 1 {
				stack = stack[:len(stack)-1]
			}
		case ' ':
			kw := clauseRE.FindString(s[i+1:])
			if top.query && kw != "" && breakBefore(s[:i], kw, top.inWhere) {
				if kw == "WHERE" {
					top.inWhere = true
				} else if kw != "AND" {
					top.inWhere = false
				}
				b.WriteString("\n" + strings.Repeat(indentStr, top.level))
				if kw == "AND" {
					b.WriteString("  ")
				}
				continue
			}
		}
		b.WriteByte(c)
	}
	lines := strings.Split(b.String(), "\n")
	for i, l := range lines {
		lines[i] = wrapLine(l)
	}
	return strings.Join(lines, "\n")
}

// closeParen returns the index of the parenthesis closing the one at
// s[open], or len(s).
func closeParen(s string, open int) int {
	depth, quoted := 0, false
	for i := open; i < len(s); i++ {
		switch c := s[i]; {
		case c == '\'':
			quoted = !quoted
		case quoted:
		case c == '(':
			depth++
		case c == ')':
			depth--
			if depth == 0 {
				return i
			}
		}
	}
	return len(s)
}

// wrapLine wraps a line longer than lineWidth after commas, filling each
// line greedily; it breaks only after the commas of the least nested list
// on the line (a SET list, a select list, a column list) and indents the
// continuation lines one step.
func wrapLine(l string) string {
	if len(l) <= lineWidth {
		return l
	}
	type comma struct{ pos, depth int }
	var commas []comma
	depth, quoted := 0, false
	for i := 0; i < len(l)-1; i++ {
		switch c := l[i]; {
		case c == '\'':
			quoted = !quoted
		case quoted:
		case c == '(':
			depth++
		case c == ')':
			depth--
		case c == ',' && l[i+1] == ' ':
			commas = append(commas, comma{i + 1, depth})
		}
	}
	if len(commas) == 0 {
		return l
	}
	least := commas[0].depth
	for _, c := range commas {
		least = min(least, c.depth)
	}
	indent := l[:len(l)-len(strings.TrimLeft(l, " "))] + indentStr
	var b strings.Builder
	start, last := 0, -1 // start of the current line; last break candidate
	width := 0           // width of the current line's indentation
	for _, c := range commas {
		if c.depth != least {
			continue
		}
		if width+c.pos-start > lineWidth && last > start {
			b.WriteString(l[start:last] + "\n" + indent)
			start, width = last+1, len(indent)
		}
		last = c.pos
	}
	if width+len(l)-start > lineWidth && last > start {
		b.WriteString(l[start:last] + "\n" + indent)
		start = last + 1
	}
	b.WriteString(l[start:])
	return b.String()
}

// breakBefore reports whether keyword kw, preceded by text before, starts
// a new line.
func breakBefore(before, kw string, inWhere bool) bool {
	prev := strings.TrimLeft(before[strings.LastIndexByte(before, ' ')+1:], "(")
	switch kw {
	case "AND":
		return inWhere
	case "SELECT", "UPDATE", "INSERT INTO", "DELETE FROM":
		// A statement after a CTE or an INSERT's column list, not "(SELECT"
		// (the subquery stays on its opening line) nor "KEY UPDATE".
		return strings.HasSuffix(before, ")")
	case "FROM":
		return prev != "DELETE" // DELETE FROM stays together
	}
	return true
}

var unformatRE = regexp.MustCompile(`\n *`)

// unformatSQL undoes formatSQL.
func unformatSQL(s string) string { return unformatRE.ReplaceAllString(s, " ") }

// byRE takes the type and method out of a catalogEntry.by.
var byRE = regexp.MustCompile(`^(\w+)\.(?:ArrayIDs\(\)\.)?(\w+)\(`)

// TestQueryCatalogComplete fails when a method of RelayQueries, OpsQueries
// or InboxQueries returns a statement (string, []any[, error]) that the
// catalog does not build on any dialect.
func TestQueryCatalogComplete(t *testing.T) {
	built := map[string]bool{}
	for _, d := range All {
		for _, e := range catalog(t, d) {
			if m := byRE.FindStringSubmatch(e.by); m != nil {
				built[m[1]+"."+m[2]] = true
			}
		}
	}
	str, args := reflect.TypeFor[string](), reflect.TypeFor[[]any]()
	for _, typ := range []reflect.Type{reflect.TypeFor[*RelayQueries](), reflect.TypeFor[*OpsQueries](), reflect.TypeFor[*InboxQueries]()} {
		for m := range typ.Methods() {
			ft := m.Type
			if ft.NumOut() < 2 || ft.Out(0) != str || ft.Out(1) != args {
				continue
			}
			name := typ.Elem().Name() + "." + m.Name
			if !built[name] {
				t.Errorf("%s builds a statement the query catalog lacks: add it to catalog() in catalog_test.go", name)
			}
		}
	}
}

// TestQueryCatalog checks that queries/ holds the current catalog and
// schema (see the top of this file); with -update it rewrites them.
func TestQueryCatalog(t *testing.T) {
	for _, d := range All {
		es := catalog(t, d)
		seen := map[string]bool{}
		for _, e := range es {
			if seen[e.name] {
				t.Fatalf("%s: query name %s twice", d, e.name)
			}
			seen[e.name] = true
			if f := formatSQL(e.sql); unformatSQL(f) != e.sql {
				t.Fatalf("%s %s: layout changed the statement:\n%s\n%s", d, e.name, e.sql, unformatSQL(f))
			}
			if strings.Contains(e.sql, ";") || strings.Contains(e.sql, "\n") {
				t.Fatalf("%s %s: statement contains ';' or a line break: %s", d, e.name, e.sql)
			}
		}
		ddl, err := templates.Render(string(d), catalogTables())
		if err != nil {
			t.Fatal(err)
		}
		golden(t, filepath.Join("queries", string(d)+".sql"), renderCatalog(d, es))
		golden(t, filepath.Join("queries", "schema", string(d)+".sql"), ddl)
	}
}

// golden compares path with want, or writes it with -update.
func golden(t *testing.T, path string, want []byte) {
	t.Helper()
	if *update {
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, want, 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	got, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v: run go test ./runtime/dialect -run TestQueryCatalog -update", err)
	}
	if !bytes.Equal(got, want) {
		t.Errorf("runtime/dialect/%s is stale: run go test ./runtime/dialect -run TestQueryCatalog -update\n%s", path, lineDiff(string(got), string(want)))
	}
}

// lineDiff returns a unified-style line diff from got (the file) to want
// (the current catalog): "-" lines are stale, "+" lines are current.
func lineDiff(got, want string) string {
	g, w := strings.Split(got, "\n"), strings.Split(want, "\n")
	// lcs[i][j] is the longest common subsequence of g[i:] and w[j:].
	lcs := make([][]int, len(g)+1)
	for i := range lcs {
		lcs[i] = make([]int, len(w)+1)
	}
	for i := len(g) - 1; i >= 0; i-- {
		for j := len(w) - 1; j >= 0; j-- {
			if g[i] == w[j] {
				lcs[i][j] = lcs[i+1][j+1] + 1
			} else {
				lcs[i][j] = max(lcs[i+1][j], lcs[i][j+1])
			}
		}
	}
	var b strings.Builder
	for i, j := 0, 0; i < len(g) || j < len(w); {
		switch {
		case i < len(g) && j < len(w) && g[i] == w[j]:
			i++
			j++
		case i < len(g) && (j == len(w) || lcs[i+1][j] >= lcs[i][j+1]):
			fmt.Fprintf(&b, "-%d\t%s\n", i+1, g[i])
			i++
		default:
			fmt.Fprintf(&b, "+%d\t%s\n", j+1, w[j])
			j++
		}
	}
	return b.String()
}

// The column sizes the runtime checks before any SQL are the sizes the
// templates declare (SQLite's TEXT columns have none).
func TestColumnSizesMatchTemplates(t *testing.T) {
	for _, d := range []string{"postgres", "mysql"} {
		ddl, err := templates.Render(d, templates.DefaultTables)
		if err != nil {
			t.Fatal(err)
		}
		outbox, inbox := string(ddl), string(ddl[bytes.Index(ddl, []byte("CREATE TABLE outbox_inbox (")):])
		for _, c := range []struct {
			ddl, column string
			size        int
		}{
			{outbox, "biz_type", MaxTypeLen},
			{outbox, "biz_id", MaxKeyLen},
			{outbox, "topic", MaxTopicLen},
			{inbox, "event_id", MaxInboxEventIDLen},
			{inbox, "biz_type", MaxTypeLen},
			{inbox, "biz_id", MaxKeyLen},
		} {
			m := regexp.MustCompile(`(?im)^\s*` + c.column + `\s+varchar\((\d+)\)`).FindStringSubmatch(c.ddl)
			if m == nil || m[1] != strconv.Itoa(c.size) {
				t.Errorf("%s: column %s is declared %v, the runtime checks %d", d, c.column, m, c.size)
			}
		}
	}
}
