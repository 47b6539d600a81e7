// Package templates holds the SQL layout of outboxgen's tables, the one
// source every generated migration, sqlc schema and test database uses.
//
// There is one text/template per dialect (postgres, mysql, sqlite); Render
// fills in the table names. The output is plain CREATE TABLE / CREATE INDEX
// statements, each ending with ";" at the end of a line, with no ";"
// anywhere else, so a script runner may split on ";\n".
//
// This package depends on neither the runtime nor the generator.
package templates

import (
	"bytes"
	"embed"
	"fmt"
	"regexp"
	"sort"
	"text/template"
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

// Suffixes of the names derived from the table names. PostgreSQL's implicit
// names (the primary key constraint, the identity sequence) are included so
// that nothing is silently truncated.
var (
	outboxSuffixes  = []string{"_pkey", "_id_seq", "_event_id_key", "_claim_idx", "_biz_id_idx", "_due_idx", "_failed_idx"}
	inboxSuffixes   = []string{"_pkey", "_processed_at_idx", "_key", "_key_pkey"}
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
		if !identRE.MatchString(f.name) {
			return fmt.Errorf("templates: %s name %q is not a safe SQL identifier: use lower-case letters, digits and '_', start with a letter or '_', at most %d characters", f.what, f.name, MaxIdentifier)
		}
	}
	if t.Outbox == t.Inbox {
		return fmt.Errorf("templates: outbox and inbox tables are both named %q", t.Outbox)
	}
	for _, id := range t.Identifiers() {
		if len(id) > MaxIdentifier {
			return fmt.Errorf("templates: derived identifier %q is %d characters, longer than %d: shorten the table name", id, len(id), MaxIdentifier)
		}
	}
	// The tables' derived names must not collide with the other table.
	seen := map[string]bool{}
	for _, id := range t.Identifiers() {
		if seen[id] {
			return fmt.Errorf("templates: table names %q, %q and %q produce the identifier %q twice", t.Outbox, t.Inbox, t.Archive, id)
		}
		seen[id] = true
	}
	return nil
}

var dialects = []string{"postgres", "mysql", "sqlite"}

// Dialects returns the dialects Render accepts, in a stable order.
func Dialects() []string { return append([]string(nil), dialects...) }

// Render returns the DDL of the outbox and inbox tables for dialect d
// ("postgres", "mysql" or "sqlite"). The output is deterministic and ends
// with a newline.
func Render(d string, t Tables) ([]byte, error) {
	known := false
	for _, k := range dialects {
		known = known || k == d
	}
	if !known {
		return nil, fmt.Errorf("templates: unknown dialect %q: use postgres, mysql or sqlite", d)
	}
	if err := t.Validate(); err != nil {
		return nil, err
	}
	var buf bytes.Buffer
	if err := tmpl.ExecuteTemplate(&buf, d+".sql.tmpl", t); err != nil {
		return nil, fmt.Errorf("templates: render %s: %w", d, err)
	}
	out := buf.Bytes()
	if len(out) == 0 || out[len(out)-1] != '\n' {
		out = append(out, '\n')
	}
	return out, nil
}

// RenderArchive returns only the DDL of t.Archive for dialect d: for adding
// the archive table to a database that already has the other tables.
func RenderArchive(d string, t Tables) ([]byte, error) {
	if t.Archive == "" {
		return nil, fmt.Errorf("templates: no archive table name given")
	}
	if _, err := Render(d, t); err != nil {
		return nil, err
	}
	var buf bytes.Buffer
	if err := tmpl.ExecuteTemplate(&buf, d+"_archive", t); err != nil {
		return nil, fmt.Errorf("templates: render %s archive: %w", d, err)
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
