package dialect

// This file binds the statements that read and guard the schema version of
// outboxgen's tables: the start-up check (driver.Driver's Check) and
// package runtime/migrate. Their text is in sql/<dialect>.sql; the
// migrations themselves are in templates/<dialect>.sql.tmpl.

import (
	"context"
	"fmt"
	"hash/fnv"
	"strconv"
	"strings"

	"github.com/outboxgen/outboxgen/runtime/internal/dberr"
)

// The versions of outboxgen's tables this runtime works with. A migration
// adds a version (templates/*.sql.tmpl; a test checks that SchemaVersion
// is the newest there).
const (
	// SchemaVersion is the newest schema version this runtime knows.
	SchemaVersion = 3
	// MinSchemaVersion is the oldest schema version this runtime runs on:
	// a database at an older one must be migrated first.
	MinSchemaVersion = 1
	// InboxDuplicateVersion is the schema version that added the inbox's
	// record of duplicate deliveries (InboxDuplicateTable): on a database
	// at an older version the table is missing, and the runtime works
	// without it (nothing is recorded, the console shows none).
	InboxDuplicateVersion = 2
)

// VersionSuffix is appended to the outbox table name to name the version
// table; templates.VersionTable derives the same name for the DDL.
const VersionSuffix = "_version"

// VersionTable returns the version table of outbox table outbox: one row
// per migration applied (version, compatible_from, applied_at).
func VersionTable(outbox string) string { return outbox + VersionSuffix }

// VersionQueries holds the schema-version statements for one outbox table.
// Build it with NewVersionQueries; it is immutable and safe for concurrent
// use.
type VersionQueries struct {
	s     *spec
	table string
	set   *stmtSet
}

// The statements (see sql/<dialect>.sql).
var (
	sSchemaVersion  = define(nil, "SchemaVersion")
	sSchemaVersions = define(nil, "SchemaVersions")
	sMigrateLock    = define(needMigrateLock, "MigrateLock", "lock_key", "lock_name", "wait_seconds").mayOmit("lock_key", "lock_name", "wait_seconds")
	sMigrateUnlock  = define(needMigrateLock, "MigrateUnlock", "lock_key", "lock_name").mayOmit("lock_key", "lock_name")
)

// needMigrateLock: PostgreSQL and MySQL serialize migrations with a
// session lock; SQLite with BEGIN IMMEDIATE.
func needMigrateLock(s *spec) bool { return s.dialect != SQLite }

// NewVersionQueries returns the schema-version statements of dialect d
// for outbox table outbox.
func NewVersionQueries(d Dialect, outbox string) (*VersionQueries, error) {
	s := specOf(d)
	if s == nil {
		return nil, errUnknown(d)
	}
	if err := CheckIdentifier("outbox table name", outbox); err != nil {
		return nil, err
	}
	return &VersionQueries{s: s, table: VersionTable(outbox), set: s.statements(tables{outbox: outbox})}, nil
}

// Table returns the version table.
func (q *VersionQueries) Table() string { return q.table }

// Current returns the statement reading the schema version: one row, one
// text column that ParseCurrent reads. It fails when the version table
// does not exist (Classify: Missing), which for a database created before
// versioned migrations means version 1 (see Compatibility).
func (q *VersionQueries) Current() string {
	text, _ := q.set.get(sSchemaVersion).render()
	return text
}

// ParseCurrent parses the text Current returns: the newest version
// recorded and the oldest version a runtime must know to use the tables
// (0 and 0 for an empty table).
func ParseCurrent(text string) (version, compatibleFrom int, err error) {
	v, cf, ok := strings.Cut(strings.TrimSpace(text), " ")
	if ok {
		if version, err = strconv.Atoi(v); err == nil {
			if compatibleFrom, err = strconv.Atoi(cf); err == nil {
				return version, compatibleFrom, nil
			}
		}
	}
	return 0, 0, fmt.Errorf("unexpected schema version %q", text)
}

// Applied returns the statement listing the migrations recorded: rows of
// version, compatible_from (integers) and applied_at (a timestamp), oldest
// first.
func (q *VersionQueries) Applied() string {
	text, _ := q.set.get(sSchemaVersions).render()
	return text
}

// Lock returns the statement that makes this session the only one
// migrating these tables, waiting up to waitSeconds (MySQL; PostgreSQL
// waits until the statement is cancelled). On MySQL it returns one row:
// 1 when the lock was taken, 0 when the wait ran out. SQLite has no such
// statement (ok false): begin each migration's transaction with
// BeginImmediate instead.
func (q *VersionQueries) Lock(waitSeconds int) (query string, args []any, ok bool) {
	if !needMigrateLock(q.s) {
		return "", nil, false
	}
	query, args = q.set.get(sMigrateLock).render(q.lockKey(), q.table, waitSeconds)
	return query, args, true
}

// LockReturnsRow reports whether Lock's statement returns a row (MySQL:
// run it with QueryRow and again while it returns 0).
func (q *VersionQueries) LockReturnsRow() bool { return q.s.dialect == MySQL }

// Unlock returns the statement releasing Lock (ok false on SQLite).
func (q *VersionQueries) Unlock() (query string, args []any, ok bool) {
	if !needMigrateLock(q.s) {
		return "", nil, false
	}
	query, args = q.set.get(sMigrateUnlock).render(q.lockKey(), q.table)
	return query, args, true
}

// lockKey is PostgreSQL's advisory lock key for the version table: a hash
// of its name, so that the migrations of other outbox tables in the same
// database do not wait for each other.
func (q *VersionQueries) lockKey() int64 {
	h := fnv.New64a()
	h.Write([]byte("outboxgen migrate " + q.table))
	return int64(h.Sum64())
}

// BeginImmediate starts an SQLite transaction that takes the database's
// write lock at once, so that two migrating processes run one after the
// other (sent on a dedicated connection, ended with "COMMIT" or
// "ROLLBACK").
const BeginImmediate = "BEGIN IMMEDIATE"

// Compatibility says whether a runtime that knows schema versions
// MinSchemaVersion to SchemaVersion can use tables at version (whose
// migrations need a runtime knowing compatibleFrom or later). It returns
// "" when it can, "old" when the tables must be migrated first, "new" when
// the runtime must be upgraded first.
func Compatibility(version, compatibleFrom int) string {
	switch {
	case version < MinSchemaVersion:
		return "old"
	case compatibleFrom > SchemaVersion:
		return "new"
	}
	return ""
}

// CheckSchemaVersion is the schema-version part of the start-up check:
// text runs a query returning one text value (driverutil.TextQuery), what
// prefixes errors ("sqldriver"), source names the spec file for advice.
// It returns nil when this runtime can use the tables of outbox, and
// otherwise an error whose advice says what to run.
//
// A database without the version table was created from the DDL of
// outboxgen before versioned migrations: that layout is version 1, so it
// passes (the column check that follows confirms the layout). So does an
// empty version table (a migration tool stopped between creating it and
// recording the version).
func CheckSchemaVersion(ctx context.Context, d Dialect, outbox, what, source string, text func(context.Context, string) (string, error)) error {
	q, err := NewVersionQueries(d, outbox)
	if err != nil {
		return fmt.Errorf("%s: %w", what, err)
	}
	answer, err := text(ctx, q.Current())
	if err != nil {
		switch dberr.Classify(err) {
		case dberr.Missing:
			answer = "1 1" // created before versioned migrations: version 1
		case dberr.Denied:
			// Left for the component to explain (dberr.Explain: what it
			// needs), naming the grant this check needs.
			return fmt.Errorf("%s: read the schema version from %s (the start-up check needs SELECT on it; `outboxgen grants` prints every grant): %w", what, q.Table(), err)
		default:
			return fmt.Errorf("%s: read the schema version from %s: %w", what, q.Table(), err)
		}
	}
	version, compatibleFrom, err := ParseCurrent(answer)
	if err != nil {
		return fmt.Errorf("%s: %s: %w", what, q.Table(), err)
	}
	if version == 0 {
		return nil
	}
	if source == "" {
		source = "events.yaml"
	}
	switch Compatibility(version, compatibleFrom) {
	case "old":
		return &dberr.Error{Class: dberr.Mismatch,
			Err:    fmt.Errorf("%s: the tables of %s are at schema version %d, older than this runtime supports (%d to %d)", what, outbox, version, MinSchemaVersion, SchemaVersion),
			Advice: fmt.Sprintf("migrate them: run `outboxgen migrate -db DSN -f %s up` (DSN: the database; or apply the numbered migrations in <sql.out>/%s/migrations with your migration tool)", source, d)}
	case "new":
		return &dberr.Error{Class: dberr.Mismatch,
			Err:    fmt.Errorf("%s: the tables of %s are at schema version %d, which needs a runtime that knows version %d or later; this one knows %d to %d", what, outbox, version, compatibleFrom, MinSchemaVersion, SchemaVersion),
			Advice: "upgrade github.com/outboxgen/outboxgen in this service (the tables were migrated by a newer outboxgen; `outboxgen migrate -db DSN status` lists the versions)"}
	}
	return nil
}
