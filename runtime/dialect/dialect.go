// Package dialect holds every SQL statement outboxgen's runtime sends, one
// set per database family, so that a dialect's SQL lives in one place.
//
// Table names come from configuration (events.yaml or runtime options); they
// are checked with ValidIdentifier before they are spliced into a statement,
// which is what makes splicing safe.
package dialect

import (
	"fmt"
	"regexp"
	"strconv"
	"strings"
)

// Dialect names a SQL database family. The values match the `dialects`
// entries of events.yaml.
type Dialect string

// The supported dialects.
const (
	// Postgres is PostgreSQL 12 or newer.
	Postgres Dialect = "postgres"
	// MySQL is MySQL 8.0+ or MariaDB 10.6+ (both have SKIP LOCKED).
	MySQL Dialect = "mysql"
	// SQLite is SQLite 3.35+ (modernc.org/sqlite or mattn/go-sqlite3).
	SQLite Dialect = "sqlite"
)

// All lists the supported dialects in a stable order.
var All = []Dialect{Postgres, MySQL, SQLite}

// Parse returns the dialect named s, accepting the common aliases
// ("postgresql", "pgx", "mariadb", "sqlite3").
func Parse(s string) (Dialect, error) {
	switch strings.ToLower(s) {
	case "postgres", "postgresql", "pgx":
		return Postgres, nil
	case "mysql", "mariadb":
		return MySQL, nil
	case "sqlite", "sqlite3":
		return SQLite, nil
	}
	return "", fmt.Errorf("unknown SQL dialect %q: use postgres, mysql or sqlite", s)
}

// Valid reports whether d is one of the supported dialects.
func (d Dialect) Valid() bool {
	return d == Postgres || d == MySQL || d == SQLite
}

var identRE = regexp.MustCompile(`^[a-z_][a-z0-9_]{0,62}$`)

// ValidIdentifier reports whether name is safe to splice into SQL unquoted
// on every dialect: lower-case ASCII letters, digits and underscores, not
// starting with a digit, at most 63 bytes (PostgreSQL's limit).
func ValidIdentifier(name string) bool { return identRE.MatchString(name) }

// CheckIdentifier returns a descriptive error when name is not a
// ValidIdentifier; what names the setting for the message.
func CheckIdentifier(what, name string) error {
	if ValidIdentifier(name) {
		return nil
	}
	return fmt.Errorf("%s %q is not a safe SQL identifier: use lower-case letters, digits and '_', start with a letter or '_', at most 63 characters", what, name)
}

// Placeholder returns the n-th (1-based) bind parameter marker.
func (d Dialect) Placeholder(n int) string {
	if d == Postgres {
		return "$" + strconv.Itoa(n)
	}
	return "?"
}

// placeholders returns "p1, p2, ..., pn".
func (d Dialect) placeholders(n int) string {
	var b strings.Builder
	for i := 1; i <= n; i++ {
		if i > 1 {
			b.WriteString(", ")
		}
		b.WriteString(d.Placeholder(i))
	}
	return b.String()
}

// InsertEventColumns are the columns InsertEvent binds, in bind order. Every
// other column of the outbox table has a default: the row starts pending,
// due now, with timestamps from the database clock (never the client's, so
// that instances with skewed clocks agree).
var InsertEventColumns = []string{"event_id", "biz_type", "biz_id", "topic", "payload_version", "payload", "headers"}

// InsertEventArgs returns InsertEvent's arguments in bind order, so that
// the column order is decided in one place. payload is JSON text (MySQL
// refuses JSON from a binary string, SQLite would store []byte as a BLOB);
// headers is JSON text or nil for NULL.
func InsertEventArgs(eventID, bizType, bizID, topic string, version int, payload string, headers any) []any {
	return []any{eventID, bizType, bizID, topic, version, payload, headers}
}

// Column sizes of the tables in package templates, in characters: values
// longer than these are refused before any SQL runs, since on PostgreSQL a
// failing statement would abort the caller's transaction. The query
// catalog test checks them against the rendered DDL.
const (
	MaxTypeLen         = 64  // biz_type, in the outbox and the inbox
	MaxKeyLen          = 128 // biz_id, in the outbox and the inbox
	MaxTopicLen        = 255 // the outbox's topic
	MaxInboxEventIDLen = 64  // the inbox's event_id (ids of any producer)
)

// InsertEvent returns the INSERT of one outbox row into table. With
// ifAbsent, a row whose event_id already exists is left alone and the
// statement succeeds without inserting: that is how a caller-chosen event id
// makes re-emission idempotent. Callers tell an inserted row from a skipped
// one by the rows affected (1 or 0); on MySQL that needs the driver's
// default clientFoundRows=false, under which the no-op update counts 0 rows
// (with clientFoundRows=true it counts 1, and a skipped insert looks like an
// inserted one).
func (d Dialect) InsertEvent(table string, ifAbsent bool) string {
	q := "INSERT INTO " + table + " (" + strings.Join(InsertEventColumns, ", ") + ") VALUES (" + d.placeholders(len(InsertEventColumns)) + ")"
	if !ifAbsent {
		return q
	}
	if d == MySQL {
		// MySQL has no ON CONFLICT; INSERT IGNORE would also swallow
		// unrelated errors (truncation, bad JSON), so a no-op update it is.
		return q + " ON DUPLICATE KEY UPDATE id = id"
	}
	return q + " ON CONFLICT (event_id) DO NOTHING"
}

// EventIdentity returns the SELECT of the biz_type, biz_id and topic of the
// row with a given event_id: how a writer whose insert with a caller-chosen
// id was skipped tells an idempotent repeat (the same event type, key and
// topic) from a clash (another event under the same id).
func (d Dialect) EventIdentity(table string) string {
	return "SELECT biz_type, biz_id, topic FROM " + table + " WHERE event_id = " + d.Placeholder(1)
}

// MySQLSessionTimeZone selects a MySQL session's time_zone and its offset
// from UTC in seconds. DATETIME columns follow the session time zone, so
// the drivers refuse sessions whose offset is not 0.
const MySQLSessionTimeZone = "SELECT @@session.time_zone, TIMESTAMPDIFF(SECOND, UTC_TIMESTAMP(6), NOW(6))"
