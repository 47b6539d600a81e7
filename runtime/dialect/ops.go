package dialect

// This file holds every statement the monitor (package runtime/monitor) and
// the janitor (package runtime/janitor) send, for all three dialects.
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
//     (MySQL: the (status, id) index) and stop after limit rows.
//   - DeleteInbox walks the inbox's processed_at index from its oldest end.

import (
	"fmt"
	"strings"
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
	d      Dialect
	outbox string
	inbox  string
}

// NewOpsQueries returns the monitor and janitor statements of dialect d for
// outbox table outbox and inbox table inbox.
func NewOpsQueries(d Dialect, outbox, inbox string) (*OpsQueries, error) {
	if !d.Valid() {
		return nil, fmt.Errorf("unknown SQL dialect %q: use postgres, mysql or sqlite", d)
	}
	if err := CheckIdentifier("outbox table name", outbox); err != nil {
		return nil, err
	}
	if err := CheckIdentifier("inbox table name", inbox); err != nil {
		return nil, err
	}
	return &OpsQueries{d: d, outbox: outbox, inbox: inbox}, nil
}

// Dialect returns the queries' dialect.
func (q *OpsQueries) Dialect() Dialect { return q.d }

// ageSeconds returns the seconds from timestamp expression ts to now, as a
// floating-point number.
func (d Dialect) ageSeconds(ts string) string {
	switch d {
	case Postgres:
		return "EXTRACT(EPOCH FROM (now() - " + ts + "))::float8"
	case MySQL:
		// TIMESTAMPDIFF is an integer; the division makes it DECIMAL.
		return "TIMESTAMPDIFF(MICROSECOND, " + ts + ", CURRENT_TIMESTAMP(6)) / 1000000.0"
	}
	return "(julianday('now') - julianday(" + ts + ")) * 86400.0"
}

// Stats returns the monitor's snapshot query: one statement, one row of
// StatsColumns. Pending, stale (pending and created longer than staleAfter
// ago) and expired leases (pending with a lease that lapsed: its relay
// died) come from one pass over the pending rows; FAILED rows are counted
// by a scalar subquery on the failed index.
func (q *OpsQueries) Stats(staleAfter time.Duration) (string, []any) {
	b := &binder{d: q.d}
	now := q.d.Now()
	// The binder numbers placeholders in the order they are written; the
	// cutoff is the only bound value.
	s := "SELECT COUNT(*)" +
		", COALESCE(" + q.d.ageSeconds("MIN(created_at)") + ", 0)" +
		", COALESCE(SUM(CASE WHEN created_at < " + b.nowPlus(-staleAfter) + " THEN 1 ELSE 0 END), 0)" +
		", (SELECT COUNT(*) FROM " + q.outbox + " WHERE status = 2)" +
		", COALESCE(SUM(CASE WHEN lease_expires_at < " + now + " THEN 1 ELSE 0 END), 0)" +
		" FROM " + q.outbox + " WHERE status = 0"
	return s, b.args
}

// sentBefore is the janitor's condition on outbox rows: sent, and sent
// longer than olderThan ago. FAILED (2) and pending (0) rows never match.
func (q *OpsQueries) sentBefore(b *binder, olderThan time.Duration) string {
	return "status = 1 AND sent_at < " + b.nowPlus(-olderThan)
}

// pgBatch is PostgreSQL's batch of old sent ids, locked with SKIP LOCKED
// so that two janitors never wait for each other. The callers use it as
// id = ANY(ARRAY(batch)): an IN (subquery) is planned as a hash semi-join
// over a sequential scan of the whole table, the array as one primary-key
// lookup per id.
func (q *OpsQueries) pgBatch(b *binder, olderThan time.Duration, limit int) string {
	return "SELECT id FROM " + q.outbox + " WHERE " + q.sentBefore(b, olderThan) +
		" ORDER BY id LIMIT " + b.bind(limit) + " FOR UPDATE SKIP LOCKED"
}

// DeleteSent deletes at most limit sent rows whose sent_at is older than
// olderThan, lowest id first, in one statement. The rows-affected count is
// the number deleted; fewer than limit means none are left (on
// PostgreSQL: none that another janitor is not deleting right now).
//
// PostgreSQL locks the rows with SKIP LOCKED, so two janitors never wait
// for each other. MySQL deletes with ORDER BY id LIMIT through the
// (status, id) index.
func (q *OpsQueries) DeleteSent(olderThan time.Duration, limit int) (string, []any) {
	b := &binder{d: q.d}
	t := q.outbox
	switch q.d {
	case MySQL:
		s := "DELETE FROM " + t + " WHERE " + q.sentBefore(b, olderThan) + " ORDER BY id LIMIT " + b.bind(limit)
		return s, b.args
	case Postgres:
		s := "DELETE FROM " + t + " WHERE id = ANY(ARRAY(" + q.pgBatch(b, olderThan, limit) + "))"
		return s, b.args
	}
	s := "DELETE FROM " + t + " WHERE id IN (SELECT id FROM " + t + " WHERE " + q.sentBefore(b, olderThan) +
		" ORDER BY id LIMIT " + b.bind(limit) + ")"
	return s, b.args
}

// ArchiveInOneStatement reports how an archive batch runs. True
// (PostgreSQL): ArchiveMove is one statement that moves the rows (a
// DELETE ... RETURNING feeding an INSERT); its rows-affected count is the
// number moved. False (MySQL, SQLite): in one short transaction (MySQL:
// READ COMMITTED) run ArchivePick, which returns the ids of the batch, then
// ArchiveCopy (MySQL only; SQLite's pick has already copied the rows),
// then ArchiveDelete, and commit only when every step changed len(ids)
// rows.
func (q *OpsQueries) ArchiveInOneStatement() bool { return q.d == Postgres }

// ArchiveCopiesOnPick reports whether ArchivePick already copies the rows
// into the archive (SQLite), so that ArchiveCopy is skipped.
func (q *OpsQueries) ArchiveCopiesOnPick() bool { return q.d == SQLite }

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
// olderThan into archive, lowest id first, in one statement.
func (q *OpsQueries) ArchiveMove(archive string, olderThan time.Duration, limit int) (string, []any, error) {
	if err := q.checkArchive(archive); err != nil {
		return "", nil, err
	}
	if q.d != Postgres {
		return "", nil, fmt.Errorf("ArchiveMove is PostgreSQL only; %s runs ArchivePick, ArchiveCopy and ArchiveDelete in a transaction", q.d)
	}
	b := &binder{d: q.d}
	t := q.outbox
	cs := strings.Join(OutboxColumns, ", ")
	s := "WITH moved AS (DELETE FROM " + t + " WHERE id = ANY(ARRAY(" + q.pgBatch(b, olderThan, limit) + ")) RETURNING " + cs + ")" +
		" INSERT INTO " + archive + " (" + cs + ") SELECT " + cs + " FROM moved"
	return s, b.args, nil
}

// ArchivePick (MySQL, SQLite) starts an archive batch: it returns the ids
// (one column) of at most limit sent rows older than olderThan, lowest id
// first. MySQL: a SELECT ... FOR UPDATE SKIP LOCKED that locks them.
// SQLite: an INSERT INTO archive ... SELECT ... RETURNING id that copies
// them (a write first, so the transaction takes SQLite's write lock at
// once and cannot fail to upgrade a read snapshot later).
func (q *OpsQueries) ArchivePick(archive string, olderThan time.Duration, limit int) (string, []any, error) {
	if err := q.checkArchive(archive); err != nil {
		return "", nil, err
	}
	b := &binder{d: q.d}
	t := q.outbox
	switch q.d {
	case MySQL:
		s := "SELECT id FROM " + t + " WHERE " + q.sentBefore(b, olderThan) + " ORDER BY id LIMIT " + b.bind(limit) + " FOR UPDATE SKIP LOCKED"
		return s, b.args, nil
	case SQLite:
		cs := strings.Join(OutboxColumns, ", ")
		// "WHERE true" is not needed: the SELECT has a WHERE, so SQLite's
		// INSERT ... SELECT ... ON CONFLICT parsing ambiguity cannot arise.
		s := "INSERT INTO " + archive + " (" + cs + ") SELECT " + cs + " FROM " + t + " WHERE " + q.sentBefore(b, olderThan) +
			" ORDER BY id LIMIT " + b.bind(limit) + " RETURNING id"
		return s, b.args, nil
	}
	return "", nil, fmt.Errorf("ArchivePick is for MySQL and SQLite; PostgreSQL runs ArchiveMove")
}

// ArchiveCopy (MySQL) copies the picked ids into archive. Callers split
// id lists longer than MaxInList.
func (q *OpsQueries) ArchiveCopy(archive string, ids []int64) (string, []any, error) {
	if err := q.checkArchive(archive); err != nil {
		return "", nil, err
	}
	b := &binder{d: q.d}
	cs := strings.Join(OutboxColumns, ", ")
	// outbox.id, not id: both tables have an id (sqlc rejects the bare
	// name as ambiguous, though MySQL resolves it to the FROM table).
	s := "INSERT INTO " + archive + " (" + cs + ") SELECT " + cs + " FROM " + q.outbox + " WHERE " + q.outbox + ".id IN (" + b.ids(ids) + ")"
	return s, b.args, nil
}

// ArchiveDelete (MySQL, SQLite) deletes the picked ids from the outbox
// table; status = 1 is repeated as a guard. Callers split id lists longer
// than MaxInList.
func (q *OpsQueries) ArchiveDelete(ids []int64) (string, []any) {
	b := &binder{d: q.d}
	s := "DELETE FROM " + q.outbox + " WHERE id IN (" + b.ids(ids) + ") AND status = 1"
	return s, b.args
}

// DeleteInbox deletes at most limit inbox rows processed longer than
// olderThan ago, oldest first, in one statement (the processed_at index
// finds them). The stale-guard table (InboxKeyTable) is never touched: it
// holds one row per key, not one per event.
func (q *OpsQueries) DeleteInbox(olderThan time.Duration, limit int) (string, []any) {
	b := &binder{d: q.d}
	t := q.inbox
	cond := "processed_at < " + b.nowPlus(-olderThan)
	switch q.d {
	case MySQL:
		s := "DELETE FROM " + t + " WHERE " + cond + " ORDER BY processed_at LIMIT " + b.bind(limit)
		return s, b.args
	case Postgres:
		// ctid = ANY(ARRAY(...)): a TID scan of the locked rows. The
		// rows stay locked until the DELETE, so their ctids cannot move.
		s := "DELETE FROM " + t + " WHERE ctid = ANY(ARRAY(SELECT ctid FROM " + t + " WHERE " + cond +
			" ORDER BY processed_at LIMIT " + b.bind(limit) + " FOR UPDATE SKIP LOCKED))"
		return s, b.args
	}
	s := "DELETE FROM " + t + " WHERE (consumer, event_id) IN (SELECT consumer, event_id FROM " + t + " WHERE " + cond +
		" ORDER BY processed_at LIMIT " + b.bind(limit) + ")"
	return s, b.args
}
