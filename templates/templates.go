// Package templates holds the SQL layout of outboxgen's tables, the one
// source every generated migration, sqlc schema and test database uses.
//
// There is one text/template file per dialect (postgres, mysql, sqlite)
// holding that dialect's numbered migrations (see RenderMigrations); the
// DDL file (Render, RenderFile) is their concatenation. The output is plain
// SQL statements (CREATE TABLE / CREATE INDEX, and the INSERT recording a
// migration in the version table), each ending with ";" at the end of a
// line, with no ";" anywhere else, so a script runner may split on ";\n".
//
// This package depends on neither the runtime nor the generator.
package templates

import (
	"bytes"
	"embed"
	"fmt"
	"maps"
	"regexp"
	"slices"
	"sort"
	"text/template"
	"unicode"
	"unicode/utf8"
)

//go:embed *.sql.tmpl
var files embed.FS

var tmpl = template.Must(template.New("").Option("missingkey=error").ParseFS(files, "*.sql.tmpl"))

// Tables names the tables outboxgen creates: the outbox table, the inbox
// table and the inbox's stale-guard table, Inbox + "_key".
type Tables struct {
	// Outbox is the outbox table (events.yaml default "outbox_event").
	Outbox string
	// Inbox is the consumer idempotency table (default "outbox_inbox").
	Inbox string
	// Archive, when set, adds the archive table the janitor can move sent
	// rows into instead of deleting them (events.yaml sql.archive_table).
	Archive string
}

// DefaultTables are the names events.yaml uses when none are configured.
var DefaultTables = Tables{Outbox: "outbox_event", Inbox: "outbox_inbox"}

// MaxIdentifier is the longest identifier allowed, in bytes (PostgreSQL's
// limit; MySQL's is 64).
const MaxIdentifier = 63

// The longest table names whose derived identifiers (see Identifiers) fit
// in MaxIdentifier bytes: the longest suffixes are "_event_id_key",
// "_processed_at_idx" and "_archived_at_idx".
const (
	MaxOutboxName  = MaxIdentifier - len("_event_id_key")     // 50
	MaxInboxName   = MaxIdentifier - len("_processed_at_idx") // 46
	MaxArchiveName = MaxIdentifier - len("_archived_at_idx")  // 47
)

var identRE = regexp.MustCompile(`^[a-z_][a-z0-9_]{0,62}$`)

// ValidIdentifier reports whether name is safe to splice into SQL unquoted
// on every dialect: lower-case ASCII letters, digits and underscores, not
// starting with a digit, at most MaxIdentifier bytes. It is the
// generator's copy of the runtime's dialect.ValidIdentifier (a test checks
// that they agree).
func ValidIdentifier(name string) bool { return identRE.MatchString(name) }

// checkIdentifier returns an error naming what unless name is a
// ValidIdentifier.
func checkIdentifier(what, name string) error {
	if ValidIdentifier(name) {
		return nil
	}
	return fmt.Errorf("%s %q is not a safe SQL identifier: use lower-case letters, digits and '_', start with a letter or '_', at most %d characters", what, name, MaxIdentifier)
}

// Column sizes of the tables the DDL creates, in characters; the runtime's
// copies are dialect.MaxTypeLen, MaxKeyLen and MaxTopicLen (a test checks
// them against the DDL and against each other).
const (
	MaxTypeLen  = 64  // biz_type: an event name
	MaxKeyLen   = 128 // biz_id
	MaxTopicLen = 255 // topic
)

// Suffixes of the names derived from the table names. PostgreSQL's implicit
// names (the primary key constraint, the identity sequence) are included so
// that nothing is silently truncated.
var (
	outboxSuffixes  = []string{"_pkey", "_id_seq", "_event_id_key", "_claim_idx", "_biz_id_idx", "_due_idx", "_failed_idx", VersionSuffix, VersionSuffix + "_pkey"}
	inboxSuffixes   = []string{"_pkey", "_processed_at_idx", "_key", "_key_pkey", "_duplicate", "_duplicate_pkey", "_dup_recent_idx", "_dup_seen_idx"}
	archiveSuffixes = []string{"_pkey", "_event_id_idx", "_archived_at_idx"}
)

// ClaimIndex returns the name of the claim index of outbox table outbox: the
// partial index on (id) WHERE status = 0 (PostgreSQL, SQLite) or the index on
// (status, id) (MySQL).
func ClaimIndex(outbox string) string { return outbox + "_claim_idx" }

// Identifiers returns every identifier the rendered DDL creates or causes the
// database to create (tables, indexes, constraints, sequences), sorted.
func (t Tables) Identifiers() []string {
	ids := []string{t.Outbox, t.Inbox}
	for _, s := range outboxSuffixes {
		ids = append(ids, t.Outbox+s)
	}
	for _, s := range inboxSuffixes {
		ids = append(ids, t.Inbox+s)
	}
	if t.Archive != "" {
		ids = append(ids, t.Archive)
		for _, s := range archiveSuffixes {
			ids = append(ids, t.Archive+s)
		}
	}
	sort.Strings(ids)
	return ids
}

// Validate checks that both names are safe unquoted SQL identifiers on every
// dialect (lower-case ASCII letters, digits, '_', not starting with a digit),
// that they differ, and that every derived identifier fits in 63 bytes.
func (t Tables) Validate() error {
	names := []struct{ what, name string }{{"outbox table", t.Outbox}, {"inbox table", t.Inbox}}
	if t.Archive != "" {
		names = append(names, struct{ what, name string }{"archive table", t.Archive})
	}
	for _, f := range names {
		if err := checkIdentifier(f.what+" name", f.name); err != nil {
			return err
		}
	}
	if t.Outbox == t.Inbox {
		return fmt.Errorf("outbox and inbox tables are both named %q", t.Outbox)
	}
	for _, id := range t.Identifiers() {
		if len(id) > MaxIdentifier {
			return fmt.Errorf("derived identifier %q is %d characters, longer than %d: shorten the table name", id, len(id), MaxIdentifier)
		}
	}
	// The tables' derived names must not collide with the other table.
	seen := map[string]bool{}
	for _, id := range t.Identifiers() {
		if seen[id] {
			return fmt.Errorf("table names %q, %q and %q produce the identifier %q twice", t.Outbox, t.Inbox, t.Archive, id)
		}
		seen[id] = true
	}
	return nil
}

var dialects = []string{"postgres", "mysql", "sqlite"}

// Dialects returns the dialects Render accepts, in a stable order.
func Dialects() []string { return append([]string(nil), dialects...) }

// dialectAliases maps the other accepted spellings of a dialect to its
// name, in events.yaml and on the command line; the runtime's dialect.Parse
// accepts the same (a test checks that they agree).
var dialectAliases = map[string]string{
	"postgresql": "postgres", "pgx": "postgres",
	"mariadb": "mysql",
	"sqlite3": "sqlite",
}

// ParseDialect returns the dialect named s (one of Dialects), accepting
// the aliases "postgresql", "pgx", "mariadb" and "sqlite3". Spelling is
// exact: "Postgres" is unknown.
func ParseDialect(s string) (string, error) {
	if slices.Contains(dialects, s) {
		return s, nil
	}
	if d, ok := dialectAliases[s]; ok {
		return d, nil
	}
	return "", errUnknownDialect(s)
}

func errUnknownDialect(d string) error {
	return fmt.Errorf("unknown dialect %q: use postgres, mysql (also MariaDB) or sqlite", d)
}

// DialectNames returns every spelling ParseDialect accepts: the dialects,
// then the aliases, sorted.
func DialectNames() []string {
	names := Dialects()
	aliases := slices.Sorted(maps.Keys(dialectAliases))
	return append(names, aliases...)
}

// Header is what the DDL's header says after its first line, "-- Code
// generated by outboxgen. DO NOT EDIT.": each field, when not empty, adds a
// line, as sqlc's and outboxgen's generated Go code do.
type Header struct {
	// Source names the spec file the DDL comes from ("-- source: ...").
	Source string
	// Version is the outboxgen version ("-- outboxgen version: ...").
	Version string
}

// check refuses header text that could end its comment line (and so
// inject SQL) or hide characters in it: anything but printable UTF-8.
func (h Header) check() error {
	for _, f := range []struct{ what, text string }{{"source", h.Source}, {"version", h.Version}} {
		if !utf8.ValidString(f.text) {
			return fmt.Errorf("DDL header %s %q is not valid UTF-8", f.what, f.text)
		}
		for _, r := range f.text {
			if !unicode.IsPrint(r) {
				return fmt.Errorf("DDL header %s %q holds the unprintable character %U", f.what, f.text, r)
			}
		}
	}
	return nil
}

// Render returns the DDL of the outbox and inbox tables for dialect d
// ("postgres", "mysql" or "sqlite"). The output is deterministic and ends
// with a newline.
func Render(d string, t Tables) ([]byte, error) {
	return RenderFile(d, t, Header{})
}

// RenderFile is Render with h's lines in the header: the DDL file outboxgen
// writes for a spec, or prints for `outboxgen schema`. It is every
// migration (RenderMigrations) in order, each followed by the statements
// recording it in the version table.
func RenderFile(d string, t Tables, h Header) ([]byte, error) {
	return builtinSet.File(d, t, h)
}

// RenderArchive returns only the DDL of t.Archive for dialect d: for adding
// the archive table to a database that already has the other tables.
func RenderArchive(d string, t Tables) ([]byte, error) {
	if t.Archive == "" {
		return nil, fmt.Errorf("no archive table name given")
	}
	if _, err := Render(d, t); err != nil {
		return nil, err
	}
	var buf bytes.Buffer
	if err := tmpl.ExecuteTemplate(&buf, d+"_archive", t); err != nil {
		return nil, fmt.Errorf("render the %s archive DDL: %w", d, err)
	}
	buf.WriteByte('\n')
	return buf.Bytes(), nil
}

// Statements splits rendered DDL into its statements, each without its
// trailing ";". It relies on the property the templates keep: ";" appears
// only at the end of a statement, at the end of a line. Comment-only chunks
// are dropped.
func Statements(ddl []byte) []string {
	var stmts []string
	for _, chunk := range bytes.Split(ddl, []byte(";\n")) {
		if hasCode(chunk) {
			stmts = append(stmts, string(bytes.TrimSpace(chunk)))
		}
	}
	return stmts
}

// hasCode reports whether chunk holds anything besides blank lines and
// "--" comment lines.
func hasCode(chunk []byte) bool {
	for _, line := range bytes.Split(chunk, []byte("\n")) {
		line = bytes.TrimSpace(line)
		if len(line) > 0 && !bytes.HasPrefix(line, []byte("--")) {
			return true
		}
	}
	return false
}
