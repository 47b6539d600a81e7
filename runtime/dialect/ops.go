package dialect

// This file binds the statements the monitor (package runtime/monitor) and
// the janitor (package runtime/janitor) send; their text is in
// sql/<dialect>.sql.
//
// As everywhere in this package, time comes from the database clock only:
// an age or a cutoff is computed in SQL from now() (PostgreSQL),
// CURRENT_TIMESTAMP(6) (MySQL) or strftime('%Y-%m-%d %H:%M:%f','now')
// (SQLite), with the duration bound as a number (or, on SQLite, as a
// strftime modifier). A Go time.Time is never bound.
//
// Index use (see templates/*.sql.tmpl):
//   - Stats reads pending rows through the claim index (PostgreSQL and
//     SQLite: the partial index on status = 0; MySQL: (status, id)) and
//     counts FAILED rows through the failed index (MySQL: (status, id)), so
//     it never scans the sent rows that make up the bulk of the table.
//   - DeleteSent and the archive walk the primary key from its oldest end
//     (MySQL: the (status, id) index) and stop after limit rows, or at
//     the bound (SentBound): the last row created before the cutoff.
//   - DeleteInbox walks the inbox's processed_at index from its oldest end,
//     DeleteInboxDuplicates the duplicate table's last_seen_at index.

import (
	"fmt"
	"time"
)

// OutboxColumns are all columns of the outbox table in DDL order: the
// columns the archive copies. An archive table must have at least these.
var OutboxColumns = []string{
	"id", "event_id", "biz_type", "biz_id", "topic", "payload_version", "payload", "headers",
	"status", "retry_count", "next_retry_time", "lease_owner", "lease_expires_at", "last_error",
	"created_at", "updated_at", "sent_at",
}

// StatsColumns are the columns Stats returns, in scan order. The counts are
// integers (scan into int64); oldest_pending_age is the age of the oldest
// pending row in seconds, a floating-point number (scan into float64), 0
// when nothing is pending. It can come out slightly negative on
// PostgreSQL, whose now() is the start of the transaction: clamp it.
var StatsColumns = []string{"pending", "oldest_pending_age", "stale", "failed", "expired_leases"}

// OpsQueries holds the monitor's and janitor's statements for one outbox
// and inbox table pair. Build it once with NewOpsQueries; it is immutable
// and safe for concurrent use.
type OpsQueries struct {
	s      *spec
	outbox string
	inbox  string
	set    *stmtSet
}

// The monitor's and janitor's statements (see sql/<dialect>.sql).
var (
	sStats                 = define(nil, "OpsStats", "stale_after")
	sIDRange               = define(nil, "OpsIDRange")
	sBoundProbe            = define(nil, "OpsBoundProbe", "older_than", "from_id")
	sDeleteSent            = define(nil, "OpsDeleteSent", "older_than", "max_id", "max_rows")
	sDeleteInbox           = define(nil, "OpsDeleteInbox", "older_than", "max_rows")
	sDeleteInboxDuplicates = define(nil, "OpsDeleteInboxDuplicates", "older_than", "max_rows")
	sArchiveMove           = define(needArchiveMove, "OpsArchiveMove", "older_than", "max_id", "max_rows")
	sArchivePick           = define(needArchivePick, "OpsArchivePick", "older_than", "max_id", "max_rows")
	sArchiveCopy           = define(needArchiveCopy, "OpsArchiveCopy", "ids")
	sArchiveDelete         = define(needArchivePick, "OpsArchiveDelete", "ids")
)

// NewOpsQueries returns the monitor and janitor statements of dialect d for
// outbox table outbox and inbox table inbox.
func NewOpsQueries(d Dialect, outbox, inbox string) (*OpsQueries, error) {
	s := specOf(d)
	if s == nil {
		return nil, errUnknown(d)
	}
	if err := CheckIdentifier("outbox table name", outbox); err != nil {
		return nil, err
	}
	if err := CheckIdentifier("inbox table name", inbox); err != nil {
		return nil, err
	}
	return &OpsQueries{s: s, outbox: outbox, inbox: inbox, set: s.statements(tables{outbox: outbox, inbox: inbox})}, nil
}

// Dialect returns the queries' dialect.
func (q *OpsQueries) Dialect() Dialect { return q.s.dialect }

// withArchive returns the statements for the queries' tables and archive
// (cached per archive name).
func (q *OpsQueries) withArchive(archive string) *stmtSet {
	return q.s.statements(tables{outbox: q.outbox, inbox: q.inbox, archive: archive})
}

// Stats returns the monitor's snapshot query: one statement, one row of
// StatsColumns. Pending, stale (pending and created longer than staleAfter
// ago) and expired leases (pending with a lease that lapsed: its relay
// died) come from one pass over the pending rows; FAILED rows are counted
// by a scalar subquery on the failed index.
func (q *OpsQueries) Stats(staleAfter time.Duration) (string, []any) {
	return q.set.get(sStats).render(staleAfter)
}

// IDRange returns the query of the primary key's ends: one row, the
// lowest and the highest id (0, 0 for an empty table). Each is one read
// of an end of the primary key.
func (q *OpsQueries) IDRange() (string, []any) {
	return q.set.get(sIDRange).render()
}

// BoundProbe returns the query of one step of SentBound's search: the
// first row at or after fromID, as (id, 1 when it was created, or sent,
// longer than olderThan ago, else 0); no row when there is none. Sent
// counts too, so that a row sent before its created_at (a clock stepped
// back, or rows written by hand) is not left past the bound, and a row
// created in the future (a clock stepped forward, a MySQL session not in
// UTC) counts as old, so that it does not end the search at it.
func (q *OpsQueries) BoundProbe(olderThan time.Duration, fromID int64) (string, []any) {
	return q.set.get(sBoundProbe).render(olderThan, fromID)
}

// DeleteSent deletes at most limit sent rows whose sent_at is older than
// olderThan, lowest id first, none above maxID (SentBound), in one
// statement. The rows-affected count is the number deleted; fewer than
// limit means none are left up to maxID (on PostgreSQL: none that another
// janitor is not deleting right now).
//
// PostgreSQL locks the rows with SKIP LOCKED, so two janitors never wait
// for each other. MySQL deletes with ORDER BY id LIMIT through the
// (status, id) index; run it READ COMMITTED, or it locks the gaps of the
// rows it reads and holds up the inserts of pending rows.
func (q *OpsQueries) DeleteSent(olderThan time.Duration, maxID int64, limit int) (string, []any) {
	return q.set.get(sDeleteSent).render(olderThan, maxID, limit)
}

// ArchiveInOneStatement reports how an archive batch runs. True
// (PostgreSQL): ArchiveMove is one statement that moves the rows (a
// DELETE ... RETURNING feeding an INSERT); its rows-affected count is the
// number moved. False (MySQL, SQLite): in one short transaction (MySQL:
// READ COMMITTED) run ArchivePick, which returns the ids of the batch, then
// ArchiveCopy (MySQL only; SQLite's pick has already copied the rows),
// then ArchiveDelete, and commit only when every step changed len(ids)
// rows.
func (q *OpsQueries) ArchiveInOneStatement() bool { return q.s.archive == archiveMove }

// ArchiveCopiesOnPick reports whether ArchivePick already copies the rows
// into the archive (SQLite), so that ArchiveCopy is skipped.
func (q *OpsQueries) ArchiveCopiesOnPick() bool { return q.s.archive == archivePickDelete }

// CheckArchive reports whether archive may be the archive table: a valid
// identifier other than the outbox and inbox tables. ArchiveMove and
// ArchivePick check it too.
func (q *OpsQueries) CheckArchive(archive string) error { return q.checkArchive(archive) }

func (q *OpsQueries) checkArchive(archive string) error {
	if err := CheckIdentifier("archive table name", archive); err != nil {
		return err
	}
	if archive == q.outbox || archive == q.inbox {
		return fmt.Errorf("archive table %q must differ from the outbox and inbox tables: create a table with the outbox layout (see templates) and name it", archive)
	}
	return nil
}

// ArchiveMove (PostgreSQL) moves at most limit sent rows older than
// olderThan, none above maxID (SentBound), into archive, lowest id first,
// in one statement.
func (q *OpsQueries) ArchiveMove(archive string, olderThan time.Duration, maxID int64, limit int) (string, []any, error) {
	if err := q.checkArchive(archive); err != nil {
		return "", nil, err
	}
	if !q.ArchiveInOneStatement() {
		return "", nil, fmt.Errorf("ArchiveMove is PostgreSQL only; %s runs ArchivePick, ArchiveCopy and ArchiveDelete in a transaction", q.s.dialect)
	}
	s, args := q.withArchive(archive).get(sArchiveMove).render(olderThan, maxID, limit)
	return s, args, nil
}

// ArchivePick (MySQL, SQLite) starts an archive batch: it returns the ids
// (one column) of at most limit sent rows older than olderThan, none above
// maxID (SentBound), lowest id first. MySQL: a SELECT ... FOR UPDATE SKIP LOCKED that locks them.
// SQLite: an INSERT INTO archive ... SELECT ... RETURNING id that copies
// them (a write first, so the transaction takes SQLite's write lock at
// once and cannot fail to upgrade a read snapshot later).
func (q *OpsQueries) ArchivePick(archive string, olderThan time.Duration, maxID int64, limit int) (string, []any, error) {
	if err := q.checkArchive(archive); err != nil {
		return "", nil, err
	}
	if q.ArchiveInOneStatement() {
		return "", nil, fmt.Errorf("ArchivePick is for MySQL and SQLite; PostgreSQL runs ArchiveMove")
	}
	s, args := q.withArchive(archive).get(sArchivePick).render(olderThan, maxID, limit)
	return s, args, nil
}

// ArchiveCopy (MySQL) copies the picked ids into archive. Callers split
// id lists longer than MaxInList.
func (q *OpsQueries) ArchiveCopy(archive string, ids []int64) (string, []any, error) {
	if err := q.checkArchive(archive); err != nil {
		return "", nil, err
	}
	if q.s.archive != archivePickCopyDelete {
		return "", nil, fmt.Errorf("ArchiveCopy is MySQL only")
	}
	s, args := q.withArchive(archive).get(sArchiveCopy).render(ids)
	return s, args, nil
}

// ArchiveDelete (MySQL, SQLite) deletes the picked ids from the outbox
// table; status = 1 is repeated as a guard. Callers split id lists longer
// than MaxInList. On PostgreSQL it returns "", nil.
func (q *OpsQueries) ArchiveDelete(ids []int64) (string, []any) {
	if q.ArchiveInOneStatement() {
		return "", nil
	}
	return q.set.get(sArchiveDelete).render(ids)
}

// DeleteInbox deletes at most limit inbox rows processed longer than
// olderThan ago, oldest first, in one statement (the processed_at index
// finds them). The stale-guard table (InboxKeyTable) is never touched: it
// holds one row per key, not one per event.
func (q *OpsQueries) DeleteInbox(olderThan time.Duration, limit int) (string, []any) {
	return q.set.get(sDeleteInbox).render(olderThan, limit)
}

// DeleteInboxDuplicates deletes at most limit rows of the inbox's record
// of duplicate deliveries (schema version 2) last seen longer than
// olderThan ago, oldest first.
func (q *OpsQueries) DeleteInboxDuplicates(olderThan time.Duration, limit int) (string, []any) {
	return q.set.get(sDeleteInboxDuplicates).render(olderThan, limit)
}

// SentBound finds the bound of the janitor's batches: the highest id
// DeleteSent and the archive may read, the last row created (or sent)
// before the cutoff, by a binary search of the primary key (a row sent
// before the cutoff was created before it, and ids grow with creation).
// Without it the batch that comes back short reads every sent row the
// retention keeps, the bulk of the table, to find none. idRange runs
// IDRange; boundProbe runs BoundProbe (found false: no row at or after
// fromID). ok is false when the oldest row is younger than the cutoff:
// nothing to delete. About log2(max id - min id) point reads of the
// primary key.
//
// A row created before the cutoff with a higher id than a younger row
// (its transaction started earlier and inserted later) may fall past the
// bound: it is deleted by a later run, once the rows before it are old
// enough. Retention is a minimum.
func SentBound(idRange func() (lo, hi int64, err error), boundProbe func(fromID int64) (id int64, old, found bool, err error)) (bound int64, ok bool, err error) {
	lo, hi, err := idRange()
	if err != nil || hi == 0 {
		return 0, false, err
	}
	id, old, found, err := boundProbe(lo)
	if err != nil || !found || !old {
		return 0, false, err
	}
	// Invariant: the first row at or after lo (id) is old; no row after
	// hi is.
	lo, bound = id, id
	for lo < hi {
		mid := lo + (hi-lo+1)/2
		id, old, found, err := boundProbe(mid)
		if err != nil {
			return 0, false, err
		}
		if !found || !old {
			hi = mid - 1
			continue
		}
		lo, bound = id, id
	}
	return bound, true, nil
}
