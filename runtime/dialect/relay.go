package dialect

// This file holds every statement the relay (package runtime/relay) and
// the sweeper send through a driver (package runtime/driver), for all
// three dialects. The statements that differ per dialect are built from
// small per-dialect fragments or, for the claim, written out per dialect;
// everything else is shared text.
//
// Timestamps come from the database clock only: PostgreSQL now(), MySQL
// CURRENT_TIMESTAMP(6), SQLite strftime('%Y-%m-%d %H:%M:%f','now') — the
// same expressions the DDL defaults use, so SQLite text timestamps compare
// correctly as text. A Go time.Time is never bound as a timestamp.

import (
	"fmt"
	"strings"
	"time"
)

// RelayColumns are the columns every claim returns, in scan order.
var RelayColumns = []string{"id", "event_id", "biz_type", "biz_id", "topic", "payload_version", "payload", "headers", "retry_count", "created_at"}

// FailedColumns are the columns ListFailed returns, in scan order.
var FailedColumns = []string{"id", "event_id", "biz_type", "biz_id", "topic", "retry_count", "last_error", "created_at", "updated_at"}

// MaxInList is the largest id list a single relay statement binds. Callers
// split longer lists.
const MaxInList = 1000

// ErrorTextLimit is the most bytes of a publish error stored in last_error.
const ErrorTextLimit = 2048

// RelayQueries holds the relay's statements for one outbox table. Build it
// once with NewRelayQueries; it is immutable and safe for concurrent use.
//
// Each method returns the SQL and its arguments together, so the bind order
// of a statement is decided here, next to its text.
type RelayQueries struct {
	d     Dialect
	table string
	// unordered are the event types (biz_type) exempt from per-key order.
	unordered []string
	claim     string // see Claim
	overdue   string // see ClaimOverdue
	blocked   string // MySQL: prefix of ClaimBlocked
	// arrays: id lists are bound as one PostgreSQL array (see ArrayIDs).
	arrays bool
}

// NewRelayQueries returns the relay statements of dialect d for outbox
// table table. Events whose biz_type is in unordered are published without
// per-key order; all other types are ordered by id within their key (biz_id).
func NewRelayQueries(d Dialect, table string, unordered []string) (*RelayQueries, error) {
	if !d.Valid() {
		return nil, fmt.Errorf("unknown SQL dialect %q: use postgres, mysql or sqlite", d)
	}
	if err := CheckIdentifier("relay: outbox table name", table); err != nil {
		return nil, err
	}
	q := &RelayQueries{d: d, table: table, unordered: append([]string(nil), unordered...)}
	q.build()
	return q, nil
}

// Dialect returns the queries' dialect.
func (q *RelayQueries) Dialect() Dialect { return q.d }

// ArrayIDs returns a copy of PostgreSQL queries whose id-list statements
// (MarkSent, Release, ExtendLease, Requeue) bind the whole list as one bigint[]
// parameter ("id = ANY($n)") instead of one placeholder per id: the text
// no longer depends on the list length, so a driver that caches prepared
// statements (native pgx) prepares each once, and lists need no splitting
// at MaxInList. Bind the ids as a []int64. On other dialects it returns q.
func (q *RelayQueries) ArrayIDs() *RelayQueries {
	if q.d != Postgres {
		return q
	}
	c := *q
	c.arrays = true
	return &c
}

// idIn returns the "id is in ids" condition, binding ids.
func (q *RelayQueries) idIn(b *binder, ids []int64) string {
	if q.arrays {
		return "id = ANY(" + b.bind(ids) + ")"
	}
	return "id IN (" + b.ids(ids) + ")"
}

// Table returns the outbox table name.
func (q *RelayQueries) Table() string { return q.table }

// ClaimInTransaction reports how Claim is run. False (PostgreSQL, SQLite):
// Claim is one statement that leases the rows and returns them; run it on
// its own. True (MySQL/MariaDB, which have no UPDATE ... RETURNING): in one
// short READ COMMITTED transaction run Claim (a SELECT ... FOR UPDATE SKIP
// LOCKED returning the candidates), drop the ids ClaimBlocked returns, run
// ClaimLease on the rest, commit.
func (q *RelayQueries) ClaimInTransaction() bool { return q.d == MySQL }

// Claimable is the eligibility of a pending row aliased x: pending, due,
// and not under a live lease.
func (d Dialect) claimable(x string) string {
	now := d.Now()
	return x + ".status = 0 AND " + x + ".next_retry_time <= " + now +
		" AND (" + x + ".lease_expires_at IS NULL OR " + x + ".lease_expires_at < " + now + ")"
}

// eligible is claimable, restricted for the sweeper's overdue claim to
// rows created at least :overdue ago (the marker binds "now - overdue").
func (q *RelayQueries) eligible(x string, overdue bool) string {
	if !overdue {
		return q.d.claimable(x)
	}
	return q.d.claimable(x) + " AND " + x + ".created_at <= :overdue"
}

// The claim statements are built once, with the unordered type list bound
// through markers that expand later fills in order. Markers: ":owner",
// ":lease", ":limit", ":overdue" (ClaimOverdue's cutoff), ":u" (the
// unordered list), ":ids" (MySQL's ClaimBlocked).
//
// Per-key order: a candidate c of an ordered type may be claimed only if
// every older unsent row o of its key (o.status <> 1, o of an ordered type)
// is claimed in the same batch. The candidate query keeps c only if all
// such o are themselves claimable (the "prefilter": no older row of the key
// is FAILED, backing off or leased); since candidates are taken in id order,
// those o come before c. Under SKIP LOCKED, though, an o that another
// instance is claiming right now is skipped, so a second check runs against
// the set actually locked: c is dropped when an older unsent row of its key
// is not in that set (PostgreSQL: inside the same statement; MySQL:
// ClaimBlocked). SQLite has one writer and no SKIP LOCKED, so the prefilter
// alone is exact there.

func (q *RelayQueries) orderedPred(x string) string {
	if len(q.unordered) == 0 {
		return ""
	}
	return " AND " + x + ".biz_type NOT IN (:u)"
}

func (q *RelayQueries) unorderedOr(x string) string {
	if len(q.unordered) == 0 {
		return ""
	}
	return x + ".biz_type IN (:u) OR "
}

// prefilter is the per-key condition on candidate c (see above). In the
// overdue claim an older row must be overdue too (else it is no candidate
// and c would overtake it).
func (q *RelayQueries) prefilter(c string, overdue bool) string {
	t := q.table
	return " AND (" + q.unorderedOr(c) + "NOT EXISTS (SELECT 1 FROM " + t + " o WHERE o.biz_id = " + c + ".biz_id AND o.id < " + c + ".id AND o.status <> 1" +
		q.orderedPred("o") + " AND NOT (" + q.eligible("o", overdue) + ")" + q.fence() + "))"
}

// fence keeps PostgreSQL from turning a per-key NOT EXISTS into an
// anti-join: the planner would then read every row of the table, sent rows
// included, on each claim (measured on a 100k-row backlog: 22-41 ms a
// claim, growing with the table). With OFFSET 0 the subquery stays a
// per-candidate probe of the (biz_id, id) index: 3.4 ms. MySQL refuses
// OFFSET without LIMIT and SQLite never flattens it, so they get nothing.
func (q *RelayQueries) fence() string {
	if q.d == Postgres {
		return " OFFSET 0"
	}
	return ""
}

func cols(prefix string, cs []string) string {
	out := make([]string, len(cs))
	for i, c := range cs {
		out[i] = prefix + c
	}
	return strings.Join(out, ", ")
}

func (q *RelayQueries) build() {
	q.claim = q.buildClaim(false)
	q.overdue = q.buildClaim(true)
	if q.d == MySQL {
		t := q.table
		q.blocked = "SELECT c.id FROM " + t + " c WHERE c.id IN (:ids)" + q.orderedPred("c") +
			" AND EXISTS (SELECT 1 FROM " + t + " o WHERE o.biz_id = c.biz_id AND o.id < c.id AND o.status <> 1" + q.orderedPred("o") +
			" AND o.id NOT IN (:ids))"
	}
}

// buildClaim builds the claim statement; overdue restricts it to rows
// created at least :overdue ago (ClaimOverdue).
func (q *RelayQueries) buildClaim(overdue bool) string {
	t := q.table
	elig := q.eligible("c", overdue) + q.prefilter("c", overdue)
	switch q.d {
	case Postgres:
		// One statement: lock candidates (SKIP LOCKED), keep those whose
		// older unsent same-key rows are all locked here too, lease them.
		// The CTE is MATERIALIZED so the lock set is computed once. The
		// type test reads the updated row (t.biz_type), not cand: the same
		// row, and sqlc, which checks this statement (queries/), cannot
		// resolve a CTE column compared with a parameter ("table alias
		// does not exist": its resolveCatalogRefs skips CTEs).
		return "WITH cand AS MATERIALIZED (SELECT c.id, c.biz_id FROM " + t + " c WHERE " + elig +
			" ORDER BY c.id LIMIT :limit FOR UPDATE SKIP LOCKED)" +
			" UPDATE " + t + " SET lease_owner = :owner, lease_expires_at = :lease, updated_at = now()" +
			" FROM cand WHERE " + t + ".id = cand.id AND (" + q.unorderedOr(t) +
			"NOT EXISTS (SELECT 1 FROM " + t + " o WHERE o.biz_id = cand.biz_id AND o.id < cand.id AND o.status <> 1" + q.orderedPred("o") +
			" AND NOT EXISTS (SELECT 1 FROM cand c2 WHERE c2.id = o.id)" + q.fence() + "))" +
			" RETURNING " + cols(t+".", RelayColumns)
	case MySQL:
		return "SELECT " + cols("c.", RelayColumns) + " FROM " + t + " c WHERE " + elig +
			" ORDER BY c.id LIMIT :limit FOR UPDATE SKIP LOCKED"
	}
	// SQLite: one statement; SQLite takes the write lock when the
	// statement starts, so the candidate SELECT and the UPDATE see one
	// state.
	cand := "SELECT c.id FROM " + t + " c WHERE " + elig + " ORDER BY c.id LIMIT :limit"
	return "UPDATE " + t + " SET lease_owner = :owner, lease_expires_at = :lease, updated_at = " + q.d.Now() +
		" WHERE id IN (" + cand + ") RETURNING " + strings.Join(RelayColumns, ", ")
}

// expand replaces the markers of a prebuilt statement with placeholders,
// binding values in textual order.
func (q *RelayQueries) expand(stmt string, vals map[string]any) (string, []any) {
	b := &binder{d: q.d}
	var out strings.Builder
	for {
		i := strings.IndexByte(stmt, ':')
		if i < 0 {
			out.WriteString(stmt)
			break
		}
		out.WriteString(stmt[:i])
		rest := stmt[i+1:]
		n := 0
		for n < len(rest) && (rest[n] >= 'a' && rest[n] <= 'z') {
			n++
		}
		name := rest[:n]
		switch name {
		case "u":
			out.WriteString(b.list(q.unordered))
		case "ids":
			out.WriteString(b.ids(vals["ids"].([]int64)))
		case "lease":
			out.WriteString(b.nowPlus(vals["lease"].(time.Duration)))
		case "overdue":
			out.WriteString(b.nowPlus(-vals["overdue"].(time.Duration)))
		case "owner", "limit":
			out.WriteString(b.bind(vals[name]))
		default:
			// Not a marker (e.g. a "::" cast, which the statements do not
			// use); copy it through.
			out.WriteString(":" + name)
		}
		stmt = rest[n:]
	}
	return out.String(), b.args
}

// Claim returns the claim statement for owner with lease lease, at most
// limit rows; see ClaimInTransaction for how to run it. It returns
// RelayColumns.
func (q *RelayQueries) Claim(owner string, lease time.Duration, limit int) (string, []any) {
	return q.expand(q.claim, map[string]any{"owner": owner, "lease": lease, "limit": limit})
}

// ClaimOverdue is Claim restricted to rows created at least overdueAfter
// ago (by the database clock): the sweeper's rescue pass, which leaves
// younger rows to the relay. Per-key order holds as in Claim. It is run
// like Claim (see ClaimInTransaction) and returns RelayColumns.
func (q *RelayQueries) ClaimOverdue(owner string, lease time.Duration, limit int, overdueAfter time.Duration) (string, []any) {
	return q.expand(q.overdue, map[string]any{"owner": owner, "lease": lease, "limit": limit, "overdue": overdueAfter})
}

// ClaimBlocked (MySQL only) returns the ids among the just locked ids that
// must not be claimed: an older unsent row of their key is not among ids.
// Run it in the claim transaction after Claim.
func (q *RelayQueries) ClaimBlocked(ids []int64) (string, []any) {
	return q.expand(q.blocked, map[string]any{"ids": ids})
}

// ClaimLease (MySQL only) leases the locked, unblocked ids to owner.
func (q *RelayQueries) ClaimLease(owner string, lease time.Duration, ids []int64) (string, []any) {
	b := &binder{d: q.d}
	s := "UPDATE " + q.table + " SET lease_owner = " + b.bind(owner) + ", lease_expires_at = " + b.nowPlus(lease) +
		", updated_at = " + q.d.Now() + " WHERE id IN (" + b.ids(ids) + ")"
	return s, b.args
}

// MarkSent marks the ids sent (status 1, sent_at now, lease cleared),
// fenced by the lease: only rows still leased to owner and pending change.
// The rows-affected count tells how many were still owned.
func (q *RelayQueries) MarkSent(owner string, ids []int64) (string, []any) {
	b := &binder{d: q.d}
	now := q.d.Now()
	s := "UPDATE " + q.table + " SET status = 1, sent_at = " + now + ", lease_owner = NULL, lease_expires_at = NULL, updated_at = " + now +
		" WHERE " + q.idIn(b, ids) + " AND lease_owner = " + b.bind(owner) + " AND status = 0"
	return s, b.args
}

// MarkRetry records a failed publish of row id, fenced by the lease:
// retry_count + 1, last_error errText (truncated to ErrorTextLimit bytes),
// next_retry_time now + delay, the lease cleared, and status 2 (failed)
// once the new retry_count reaches maxAttempts.
func (q *RelayQueries) MarkRetry(owner string, id int64, errText string, delay time.Duration, maxAttempts int) (string, []any) {
	b := &binder{d: q.d}
	now := q.d.Now()
	// status is assigned before retry_count: MySQL evaluates SET
	// assignments left to right with already-updated values, PostgreSQL
	// and SQLite with the old ones; in this order all three agree.
	s := "UPDATE " + q.table + " SET status = CASE WHEN retry_count + 1 >= " + b.bind(maxAttempts) + " THEN 2 ELSE 0 END" +
		", retry_count = retry_count + 1, last_error = " + b.bind(TruncateError(errText)) +
		", next_retry_time = " + b.nowPlus(delay) + ", lease_owner = NULL, lease_expires_at = NULL, updated_at = " + now +
		" WHERE id = " + b.bind(id) + " AND lease_owner = " + b.bind(owner) + " AND status = 0"
	return s, b.args
}

// Release gives the ids back unpublished (lease cleared, nothing else
// changed), fenced by the lease.
func (q *RelayQueries) Release(owner string, ids []int64) (string, []any) {
	b := &binder{d: q.d}
	s := "UPDATE " + q.table + " SET lease_owner = NULL, lease_expires_at = NULL, updated_at = " + q.d.Now() +
		" WHERE " + q.idIn(b, ids) + " AND lease_owner = " + b.bind(owner) + " AND status = 0"
	return s, b.args
}

// ExtendLease pushes the lease of the ids still leased to owner and
// pending to now + lease (the relay's heartbeat while a batch publishes),
// fenced like MarkSent: rows another owner took over, or already recorded,
// are left alone. The rows-affected count tells how many are still owned.
func (q *RelayQueries) ExtendLease(owner string, ids []int64, lease time.Duration) (string, []any) {
	b := &binder{d: q.d}
	s := "UPDATE " + q.table + " SET lease_expires_at = " + b.nowPlus(lease) + ", updated_at = " + q.d.Now() +
		" WHERE " + q.idIn(b, ids) + " AND lease_owner = " + b.bind(owner) + " AND status = 0"
	return s, b.args
}

// ListFailed returns failed rows (status 2) with id > afterID in id order,
// at most limit. It returns FailedColumns.
func (q *RelayQueries) ListFailed(afterID int64, limit int) (string, []any) {
	b := &binder{d: q.d}
	s := "SELECT " + strings.Join(FailedColumns, ", ") + " FROM " + q.table + " WHERE status = 2 AND id > " + b.bind(afterID) +
		" ORDER BY id LIMIT " + b.bind(limit)
	return s, b.args
}

// Requeue makes failed rows pending again: status 0, retry_count 0, due
// now, lease cleared. last_error is kept (the last failure stays visible
// until the next attempt overwrites it or the row is sent). Rows that are
// not failed are left alone.
func (q *RelayQueries) Requeue(ids []int64) (string, []any) {
	b := &binder{d: q.d}
	now := q.d.Now()
	s := "UPDATE " + q.table + " SET status = 0, retry_count = 0, next_retry_time = " + now +
		", lease_owner = NULL, lease_expires_at = NULL, updated_at = " + now +
		" WHERE " + q.idIn(b, ids) + " AND status = 2"
	return s, b.args
}

// TruncateError cuts s to at most ErrorTextLimit bytes on a UTF-8 boundary.
func TruncateError(s string) string {
	if len(s) <= ErrorTextLimit {
		return s
	}
	cut := ErrorTextLimit
	for cut > 0 && s[cut]&0xC0 == 0x80 { // inside a multi-byte rune
		cut--
	}
	return s[:cut]
}
