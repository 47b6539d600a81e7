// Package dialect holds every SQL statement outboxgen's runtime sends, one
// file per database family: sql/postgres.sql, sql/mysql.sql and
// sql/sqlite.sql, embedded and parsed at init (see sql.go). The Go code
// looks statements up by name and fills in table names and arguments.
//
// Table names come from configuration (events.yaml or runtime options); they
// are checked with ValidIdentifier before they are spliced into a statement,
// which is what makes splicing safe.
//
// Adding a dialect: write sql/<name>.sql (every statement the capabilities
// of its spec below require; TestQueryCatalog lists what is missing), a DDL
// template in templates/, an entry in specs and a constant here, and the
// sql/sqlc.yaml entry that checks the file against the DDL.
package dialect

import (
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"time"
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

// archiveMode is how a dialect's janitor archives a batch (see
// OpsQueries.ArchiveInOneStatement).
type archiveMode int

const (
	archiveMove           archiveMode = iota // OpsArchiveMove: one statement
	archivePickCopyDelete                    // OpsArchivePick, OpsArchiveCopy, OpsArchiveDelete
	archivePickDelete                        // OpsArchivePick (which copies), OpsArchiveDelete
)

// spec is what the Go code needs to know about a dialect besides its SQL:
// how it writes placeholders and binds durations, and the capabilities
// that decide which statements its file defines.
type spec struct {
	dialect Dialect
	aliases []string // names Parse accepts besides dialect
	now     string   // the current-timestamp expression of the DDL defaults
	dollar  bool     // placeholders are $1, $2, ...; else ?
	// duration is how a time.Duration argument is bound.
	duration func(time.Duration) any
	// claimInTx: the claim is RelayClaim, RelayClaimBlocked,
	// RelayClaimLease and RelayClaimHold in a transaction (MySQL: no
	// UPDATE ... RETURNING; SQLite: sqlc cannot check the one-statement
	// form, and its single writer makes the transaction as cheap).
	claimInTx bool
	// claimCandidates: the claim transaction reads its window without
	// locks (RelayClaim without its locking section), then locks it by id
	// (RelayClaimLock, which also tells when RelayClaimBlocked can be
	// skipped); the locking RelayClaim is the fallback (InnoDB, see
	// sql/mysql.sql).
	claimCandidates bool
	// holdEach: RelayClaimHold takes a list of hold_until values, one per
	// id in the same order, not one for all (see RelayQueries.HoldsEach),
	// and RelayMarkRetryEach records failures of several rows, each with
	// its own values, in one statement.
	holdEach bool
	// holdInFlight: the claim holds rows behind a row of their key in
	// flight for a while (RelayReleaseInFlightHeld, RelayReleaseOrphanHeld).
	holdInFlight bool
	// scanFrom: the one-statement claim returns its front and has a from
	// section (RelayQueries.ScansFrom).
	scanFrom bool
	// rowLocks: claims lock rows, and run beside a requeue; the requeue
	// locks the pending rows of its keys before it releases their holds
	// (RelayLockKeys). SQLite has one writer: they cannot overlap there.
	rowLocks bool
	// arrayIDs: the Relay*Array statements bind an id list as one array.
	arrayIDs bool
	// notify: OutboxNotifyInsert and RelayListen (LISTEN/NOTIFY).
	notify bool
	// wal: the WAL relay's statements on the outbox table (WAL*; logical
	// decoding is PostgreSQL's).
	wal     bool
	archive archiveMode

	file file // parsed sql/<dialect>.sql
}

// specs lists the dialects in the order of All.
var specs = []*spec{
	{
		dialect: Postgres, aliases: []string{"postgresql", "pgx"},
		now: "now()", dollar: true,
		duration:     func(d time.Duration) any { return d.Seconds() },
		arrayIDs:     true,
		rowLocks:     true,
		scanFrom:     true,
		holdInFlight: true,
		notify:       true,
		wal:          true,
		archive:      archiveMove,
	},
	{
		dialect: MySQL, aliases: []string{"mariadb"},
		now:             "CURRENT_TIMESTAMP(6)",
		duration:        func(d time.Duration) any { return d.Microseconds() },
		claimInTx:       true,
		claimCandidates: true,
		holdEach:        true,
		rowLocks:        true,
		archive:         archivePickCopyDelete,
	},
	{
		dialect: SQLite, aliases: []string{"sqlite3"},
		now:       "strftime('%Y-%m-%d %H:%M:%f', 'now')",
		duration:  func(d time.Duration) any { return fmt.Sprintf("%.6f seconds", d.Seconds()) },
		claimInTx: true,
		archive:   archivePickDelete,
	},
}

// specOf returns the spec of d, or nil.
func specOf(d Dialect) *spec {
	for _, s := range specs {
		if s.dialect == d {
			return s
		}
	}
	return nil
}

// mustSpec returns the spec of d; d must be valid.
func mustSpec(d Dialect) *spec {
	s := specOf(d)
	if s == nil {
		panic("dialect: " + errUnknown(d).Error())
	}
	return s
}

// Parse returns the dialect named s, accepting the common aliases
// ("postgresql", "pgx", "mariadb", "sqlite3").
func Parse(s string) (Dialect, error) {
	name := strings.ToLower(s)
	for _, sp := range specs {
		if name == string(sp.dialect) || contains(sp.aliases, name) {
			return sp.dialect, nil
		}
	}
	return "", errUnknown(s)
}

// errUnknown is the error for a dialect name that is none of All.
func errUnknown[S ~string](d S) error {
	return fmt.Errorf("unknown SQL dialect %q: use postgres, mysql or sqlite", d)
}

// Valid reports whether d is one of the supported dialects.
func (d Dialect) Valid() bool { return specOf(d) != nil }

// ClaimSkipsKeys reports whether d's claim reads driver.ClaimParams.SkipKeys
// (MySQL/MariaDB: see RelayQueries.ClaimCandidates); on other dialects a
// caller need not gather them.
func (d Dialect) ClaimSkipsKeys() bool {
	s := specOf(d)
	return s != nil && s.claimCandidates
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
	if s := specOf(d); s != nil && s.dollar {
		return "$" + strconv.Itoa(n)
	}
	return "?"
}

// Now returns the dialect's current-timestamp expression, the one the DDL
// defaults use.
func (d Dialect) Now() string {
	if s := specOf(d); s != nil {
		return s.now
	}
	return specOf(SQLite).now
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
// inserted one). d must be Valid and table a ValidIdentifier (the text is
// rendered once per table and cached).
func (d Dialect) InsertEvent(table string, ifAbsent bool) string {
	def := sInsertEvent
	if ifAbsent {
		def = sInsertEventIfAbsent
	}
	return mustSpec(d).statements(tables{outbox: table}).get(def).static
}

// EventIdentity returns the SELECT of the biz_type, biz_id and topic of the
// row with a given event_id: how a writer whose insert with a caller-chosen
// id was skipped tells an idempotent repeat (the same event type, key and
// topic) from a clash (another event under the same id). d must be Valid
// and table a ValidIdentifier.
func (d Dialect) EventIdentity(table string) string {
	return mustSpec(d).statements(tables{outbox: table}).get(sEventIdentity).static
}

// The writers' statements. Their arguments are InsertEventArgs and the
// event id; the methods above return only the text.
var (
	sInsertEvent         = define(nil, "OutboxInsertEvent", InsertEventColumns...)
	sInsertEventIfAbsent = define(nil, "OutboxInsertEventIfAbsent", InsertEventColumns...)
	sEventIdentity       = define(nil, "OutboxEventIdentity", "event_id")
)

// MySQLSessionTimeZone selects a MySQL session's time_zone and its offset
// from UTC in seconds. DATETIME columns follow the session time zone, so
// the drivers refuse sessions whose offset is not 0.
const MySQLSessionTimeZone = "SELECT @@session.time_zone, TIMESTAMPDIFF(SECOND, UTC_TIMESTAMP(6), NOW(6))"
