package templates

// Versioned migrations of outboxgen's tables. The migrations are the one
// source of the layout: the DDL file (RenderFile, `outboxgen schema`, the
// sqlc schema) is their concatenation.

import (
	"bytes"
	"fmt"
	"io/fs"
	"slices"
	"strings"
	"text/template"
)

// VersionSuffix is appended to the outbox table name to name the version
// table, which records the migrations applied; the runtime's
// dialect.VersionTable derives the same name.
const VersionSuffix = "_version"

// VersionTable returns the version table of outbox table outbox.
func VersionTable(outbox string) string { return outbox + VersionSuffix }

// MigrationInfo describes one migration of outboxgen's tables.
type MigrationInfo struct {
	// Version numbers the migrations from 1, without gaps.
	Version int
	// Name is the file name's title: lower-case letters, digits and '_'.
	Name string
	// CompatibleFrom is the oldest schema version a runtime must know to
	// use the tables once this migration is applied: Version for a change
	// older runtimes cannot work with (a column they do not fill, say), an
	// earlier version for an additive one (a nullable column, an index), so
	// that services still running the previous release keep working
	// between `migrate up` and their upgrade.
	CompatibleFrom int
}

// FileName returns the migration's file name, NNNN_name.up.sql: the
// golang-migrate layout, which goose (from the "-- +goose Up" annotation
// the file holds) and atlas (format=golang-migrate or goose) read too.
func (m MigrationInfo) FileName() string { return fmt.Sprintf("%04d_%s.up.sql", m.Version, m.Name) }

// builtin lists outboxgen's migrations, oldest first. Each has a template
// "<dialect> <version>" in every dialect's file (<dialect>.sql.tmpl).
// Migration 1 is the layout outboxgen created before versioned migrations:
// a database created from that DDL is at version 1.
var builtin = []MigrationInfo{
	{Version: 1, Name: "outbox_tables", CompatibleFrom: 1},
	// Migration 2 adds the inbox's record of duplicate deliveries
	// (<inbox>_duplicate): additive, a runtime that knows only version 1
	// ignores it.
	{Version: 2, Name: "inbox_duplicates", CompatibleFrom: 1},
	// Migration 3 adds id and biz_id to MySQL/MariaDB's claim index
	// (<outbox>_due_idx), so that a claim passes over the keys its relay
	// is publishing without reading their rows; on PostgreSQL and SQLite
	// it only records the version. Additive.
	{Version: 3, Name: "claim_index_keys", CompatibleFrom: 1},
}

// Migration is one rendered migration file.
type Migration struct {
	MigrationInfo
	// SQL is the file: the generated-file header, the "-- +goose Up"
	// annotation, the migration's statements and the statements that
	// record it in the version table. As in every output of this package,
	// ";" appears only at the end of a line, at the end of a statement.
	SQL []byte
	// Record is the part of SQL that records the migration in the version
	// table (creating the table if needed): what `outboxgen migrate` runs
	// alone to record the tables of a database created before versioned
	// migrations as version 1.
	Record []byte
}

// Statements returns the migration's statements (see Statements).
func (m Migration) Statements() []string { return Statements(m.SQL) }

// MigrationSet is a list of migrations with their templates: Builtin, or
// Builtin extended with test migrations.
type MigrationSet struct {
	infos []MigrationInfo
	tmpl  *template.Template
}

var builtinSet = &MigrationSet{infos: builtin, tmpl: tmpl}

// Builtin returns outboxgen's migrations.
func Builtin() *MigrationSet { return builtinSet }

// Infos returns the migrations' descriptions, oldest first.
func (s *MigrationSet) Infos() []MigrationInfo { return slices.Clone(s.infos) }

// Latest returns the newest migration.
func (s *MigrationSet) Latest() MigrationInfo { return s.infos[len(s.infos)-1] }

// Until returns the first version migrations of s: the set a database
// migrated by an older outboxgen was migrated with (for tests of an
// upgrade from that version, and for migrating up to a given version).
func (s *MigrationSet) Until(version int) (*MigrationSet, error) {
	if version < 1 || version > len(s.infos) {
		return nil, fmt.Errorf("migration version %d: use 1 to %d", version, len(s.infos))
	}
	return &MigrationSet{infos: slices.Clone(s.infos[:version]), tmpl: s.tmpl}, nil
}

// Extend returns s with more migrations, numbered on from s.Latest(),
// whose templates ("<dialect> <version>" for every dialect, executed with
// the table names as .Outbox, .Inbox, .Archive and .VersionTable) are in
// the files of fsys matching patterns. It is for proving the migration
// machinery with a test migration.
func (s *MigrationSet) Extend(infos []MigrationInfo, fsys fs.FS, patterns ...string) (*MigrationSet, error) {
	t, err := s.tmpl.Clone()
	if err != nil {
		return nil, err
	}
	if _, err := t.ParseFS(fsys, patterns...); err != nil {
		return nil, err
	}
	n := &MigrationSet{infos: append(slices.Clone(s.infos), infos...), tmpl: t}
	if err := n.validate(); err != nil {
		return nil, err
	}
	return n, nil
}

// validate checks the numbering, names and templates of s.
func (s *MigrationSet) validate() error {
	for i, m := range s.infos {
		if m.Version != i+1 {
			return fmt.Errorf("migration %q has version %d, want %d: number migrations from 1 without gaps", m.Name, m.Version, i+1)
		}
		if !ValidIdentifier(m.Name) {
			return fmt.Errorf("migration %d: name %q: use lower-case letters, digits and '_'", m.Version, m.Name)
		}
		if m.CompatibleFrom < 1 || m.CompatibleFrom > m.Version {
			return fmt.Errorf("migration %d: CompatibleFrom %d: use 1 to %d", m.Version, m.CompatibleFrom, m.Version)
		}
		for _, d := range dialects {
			if s.tmpl.Lookup(bodyName(d, m.Version)) == nil {
				return fmt.Errorf("migration %d has no template %q", m.Version, bodyName(d, m.Version))
			}
		}
	}
	return nil
}

func bodyName(d string, version int) string { return fmt.Sprintf("%s %d", d, version) }

// migrationData is what the migration templates are executed with.
type migrationData struct {
	Tables
	VersionTable string
	Migration    MigrationInfo
}

// header renders the generated-file header, ending with a "--" line.
func header(h Header) string {
	var b strings.Builder
	b.WriteString("-- Code generated by outboxgen. DO NOT EDIT.\n")
	if h.Source != "" {
		b.WriteString("-- source: " + h.Source + "\n")
	}
	if h.Version != "" {
		b.WriteString("-- outboxgen version: " + h.Version + "\n")
	}
	b.WriteString("--\n")
	return b.String()
}

// parts renders the body of migration m and the statements recording it,
// each without trailing blank lines.
func (s *MigrationSet) parts(d string, t Tables, m MigrationInfo) (body, record string, err error) {
	data := migrationData{Tables: t, VersionTable: VersionTable(t.Outbox), Migration: m}
	var buf bytes.Buffer
	if err := s.tmpl.ExecuteTemplate(&buf, bodyName(d, m.Version), data); err != nil {
		return "", "", fmt.Errorf("render the %s migration %d: %w", d, m.Version, err)
	}
	body = strings.TrimRight(buf.String(), "\n")
	buf.Reset()
	if err := s.tmpl.ExecuteTemplate(&buf, d+"_version", data); err != nil {
		return "", "", fmt.Errorf("render the %s version record: %w", d, err)
	}
	return body, strings.TrimRight(buf.String(), "\n"), nil
}

func (s *MigrationSet) check(d string, t Tables, h Header) error {
	if !slices.Contains(dialects, d) {
		return errUnknownDialect(d)
	}
	if err := t.Validate(); err != nil {
		return err
	}
	return h.check()
}

// Render returns the migration files of dialect d for tables t, oldest
// first, each starting with h's header.
func (s *MigrationSet) Render(d string, t Tables, h Header) ([]Migration, error) {
	if err := s.check(d, t, h); err != nil {
		return nil, err
	}
	out := make([]Migration, 0, len(s.infos))
	for _, m := range s.infos {
		body, record, err := s.parts(d, t, m)
		if err != nil {
			return nil, err
		}
		var b strings.Builder
		b.WriteString(header(h))
		fmt.Fprintf(&b, "-- Migration %d of outboxgen's tables (%s %s), recorded in %s.\n", m.Version, d, m.Name, VersionTable(t.Outbox))
		b.WriteString("-- Apply with `outboxgen migrate up`, golang-migrate, goose or atlas: see\n")
		b.WriteString("-- \"Migrating outboxgen's tables\" in outboxgen's README.\n")
		b.WriteString("-- +goose Up\n")
		b.WriteString(body)
		b.WriteString("\n\n")
		b.WriteString(record)
		b.WriteString("\n")
		out = append(out, Migration{MigrationInfo: m, SQL: []byte(b.String()), Record: []byte(record + "\n")})
	}
	return out, nil
}

// File returns the DDL file of dialect d: every migration in order, each
// followed by its version record, under h's header. Applied to an empty
// database it creates the latest layout, recorded as such.
func (s *MigrationSet) File(d string, t Tables, h Header) ([]byte, error) {
	if err := s.check(d, t, h); err != nil {
		return nil, err
	}
	var b strings.Builder
	b.WriteString(header(h))
	for i, m := range s.infos {
		body, record, err := s.parts(d, t, m)
		if err != nil {
			return nil, err
		}
		if i > 0 {
			b.WriteString("\n\n")
		}
		b.WriteString(body)
		b.WriteString("\n\n")
		b.WriteString(record)
	}
	b.WriteString("\n")
	return []byte(b.String()), nil
}

// RenderMigrations returns outboxgen's migration files for dialect d and
// tables t (Builtin().Render).
func RenderMigrations(d string, t Tables, h Header) ([]Migration, error) {
	return builtinSet.Render(d, t, h)
}
