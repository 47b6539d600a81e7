package dialect

// This file holds the statements of the start-up check (driver.Driver's
// Check): which database the server is, and whether a table has the
// columns the runtime uses. They change nothing and need only SELECT. The
// check of the schema version is in schemaversion.go.

import (
	"context"
	"strings"
)

// InboxColumns are the columns of the inbox table the consumers and the
// janitor use.
var InboxColumns = []string{"consumer", "event_id", "biz_type", "biz_id", "processed_at"}

// InboxKeyColumns are the columns of the stale-guard table (<inbox>_key)
// the consumers of latest_only events use.
var InboxKeyColumns = []string{"consumer", "biz_type", "biz_id", "last_seq"}

// InboxDuplicateColumns are the columns of the inbox's record of duplicate
// deliveries (<inbox>_duplicate, schema version InboxDuplicateVersion).
// The table is optional: a database still at version 1 lacks it, and the
// inbox, the janitor and the console check for it (SelectColumns; a
// missing table is dberr.Missing) before they use it, and skip it when it
// is missing.
var InboxDuplicateColumns = []string{"consumer", "event_id", "biz_type", "biz_id", "count", "first_seen_at", "last_seen_at"}

// ServerVersion asks the server which dialect it is. PostgreSQL and
// MySQL/MariaDB answer it; SQLite does not know version() and fails.
const ServerVersion = "SELECT version()"

// SQLiteVersion succeeds on SQLite only.
const SQLiteVersion = "SELECT sqlite_version()"

// VersionDialect tells the dialect from the text ServerVersion returned:
// PostgreSQL's starts with "PostgreSQL", MySQL's and MariaDB's with a
// version number. It returns "" for any other server (CockroachDB, say),
// which outboxgen does not know.
func VersionDialect(version string) Dialect {
	switch {
	case strings.Contains(version, "PostgreSQL"):
		return Postgres
	case strings.Contains(version, "MariaDB"), strings.Contains(version, "MySQL"),
		version != "" && version[0] >= '0' && version[0] <= '9':
		return MySQL
	}
	return ""
}

// ServerDialect asks the server which dialect it speaks, trying the
// question of guess first (SQLite does not know version()); text runs a
// query returning one text value. It returns "" for a server it does not
// know, and the error of the first question when neither can be asked
// (the database is down, say).
func ServerDialect(ctx context.Context, guess Dialect, text func(context.Context, string) (string, error)) (Dialect, error) {
	first, second := ServerVersion, SQLiteVersion
	if guess == SQLite {
		first, second = SQLiteVersion, ServerVersion
	}
	answer := func(q, v string) Dialect {
		if q == SQLiteVersion {
			return SQLite
		}
		return VersionDialect(v)
	}
	v, err := text(ctx, first)
	if err == nil {
		return answer(first, v), nil
	}
	if v2, err2 := text(ctx, second); err2 == nil {
		return answer(second, v2), nil
	}
	return "", err
}

// ClaimIndexProbe returns a statement that fails when an index the
// relay's claim names in an index hint (MySQL/MariaDB: FORCE INDEX of the
// due index, <outbox>_due_idx, and of the per-key index,
// <outbox>_biz_id_idx, see sql/mysql.sql) is missing from outbox table
// outbox, and matches no row otherwise; "" on other dialects, whose
// claims name no index.
func ClaimIndexProbe(d Dialect, outbox string) string {
	if d != MySQL {
		return ""
	}
	return "SELECT id FROM " + outbox + " FORCE INDEX (" + DueIndex(outbox) + ", " + KeyIndex(outbox) + ") WHERE 1 = 0"
}

// DueIndex returns the name of the claim's index of outbox table outbox,
// <outbox>_due_idx, which the DDL creates on every dialect.
func DueIndex(outbox string) string { return outbox + "_due_idx" }

// KeyIndex returns the name of the per-key index of outbox table outbox,
// <outbox>_biz_id_idx (biz_id, status, id on MySQL/MariaDB), which the
// DDL creates on every dialect.
func KeyIndex(outbox string) string { return outbox + "_biz_id_idx" }

// SelectColumns returns a statement that reads columns of table and
// matches no row: it fails when the table or any column is missing, or
// the user may not read them, and costs nothing otherwise.
func SelectColumns(table string, columns []string) string {
	return "SELECT " + strings.Join(columns, ", ") + " FROM " + table + " WHERE 1 = 0"
}
