package dialect

// This file binds the operator statements (package runtime/admin and the
// outboxgen CLI): status, finding and showing events, replay, the inbox's
// forget, and the console's relays, blocked keys, deletes of FAILED rows
// and inbox summary. Their text is in sql/<dialect>.sql (the Admin* names).
//
// Index use: every status figure reads pending rows through the claim
// index and FAILED rows through the failed index; sent rows, the bulk of
// the table, are read by SentPerMinute through a primary-key range of
// bounded length, and by CountSent (asked for explicitly) all of them:
// no index of PostgreSQL or SQLite holds them. FindEvents with a status reads that status's index
// (PostgreSQL and SQLite partial indexes need the status as a literal in
// the statement, hence one section per status); FindEvents by key reads
// the per-key index for pending and FAILED rows; for sent rows only MySQL's
// <outbox>_biz_id_idx holds them (PostgreSQL's and SQLite's leave them out,
// so that no insert pays for an index operators rarely need): there a
// search of sent rows by key reads the id range it is given, which callers
// bound (the console searches the newest rows).
//
// The console's statements: Leases reads the pending rows (claim index);
// BlockedKeys the heads as HeldBack does, then one per-key index range
// and one primary-key read per key of the page; LockFailed and
// DeleteFailed the primary key; InboxHandled and InboxDuplicates the
// newest rows of the processed_at and last_seen_at indexes, at most
// scan_rows of them; RecentDuplicates the (consumer, last_seen_at) index.
// BenchmarkConsole in runtime/admin measures them on 1,000,000 rows.

import (
	"fmt"
	"strings"
	"time"
)

// The operator statements (see sql/<dialect>.sql).
var (
	sAdminPendingStates = define(nil, "AdminPendingStates")
	sAdminFailedGroups  = define(nil, "AdminFailedGroups", "max_rows")
	sAdminHeldBack      = define(nil, "AdminHeldBack").withFixed("unordered")
	sAdminCountSent     = define(nil, "AdminCountSent")
	sAdminMaxID         = define(nil, "AdminMaxID")
	sAdminSentPerMinute = define(nil, "AdminSentPerMinute", "from_id", "window_secs")
	sAdminFindEvents    = define(nil, "AdminFindEvents", "after_id", "to_id", "ids", "event_ids", "types", "biz_ids", "topics", "max_age", "min_age", "error_sub", "max_rows").
				withFixed("status_pending", "status_sent", "status_failed", "has_to_id", "has_ids", "has_event_ids", "has_types", "has_keys", "has_topics", "has_max_age", "has_min_age", "has_error").
				mayOmit("to_id", "ids", "event_ids", "types", "biz_ids", "topics", "max_age", "min_age", "error_sub")
	sAdminGetEvent          = define(nil, "AdminGetEvent", "id")
	sAdminGetEventByEventID = define(nil, "AdminGetEventByEventID", "event_id")
	sAdminReplay            = define(nil, "AdminReplay", "ids")
	sAdminFindInbox         = define(nil, "AdminFindInbox", "consumer", "after_event_id", "event_ids", "types", "biz_ids", "max_age", "min_age", "max_rows").
				withFixed("has_event_ids", "has_types", "has_keys", "has_max_age", "has_min_age").
				mayOmit("event_ids", "types", "biz_ids", "max_age", "min_age")
	sAdminForgetInbox = define(nil, "AdminForgetInbox", "consumer", "event_ids")

	sAdminLeases           = define(nil, "AdminLeases", "max_rows")
	sAdminBlockedKeys      = define(nil, "AdminBlockedKeys", "after_key", "max_rows").withFixed("unordered")
	sAdminLockFailed       = define(nil, "AdminLockFailed", "ids")
	sAdminDeleteFailed     = define(nil, "AdminDeleteFailed", "ids")
	sAdminInboxHandled     = define(nil, "AdminInboxHandled", "window_secs", "scan_rows")
	sAdminInboxDuplicates  = define(nil, "AdminInboxDuplicates", "window_secs", "scan_rows")
	sAdminRecentDuplicates = define(nil, "AdminRecentDuplicates", "consumer", "max_rows")
)

// Row statuses (the status column).
const (
	StatusPending = 0
	StatusSent    = 1
	StatusFailed  = 2
)

// EventColumns are the columns FindEvents returns, in scan order;
// GetEvent returns these plus payload and headers. Timestamps are
// nullable where the DDL allows it (lease_expires_at, sent_at), as are
// lease_owner and last_error.
var EventColumns = []string{
	"id", "event_id", "biz_type", "biz_id", "topic", "payload_version", "status", "retry_count", "next_retry_time",
	"lease_owner", "lease_expires_at", "last_error", "created_at", "updated_at", "sent_at",
}

// EventFilter selects outbox rows for an operator. Every set field
// narrows the selection (they are ANDed); lists match any of their values.
type EventFilter struct {
	// Status is StatusPending, StatusSent, StatusFailed, or -1 for any.
	Status int
	// AfterID returns only rows with a larger id (paging: the last id of
	// the previous page). ToID, when positive, only rows with id <= ToID.
	AfterID, ToID int64
	IDs           []int64
	EventIDs      []string // canonical lower-case UUIDs
	Types         []string // biz_type
	Keys          []string // biz_id
	Topics        []string
	// MaxAge keeps rows created at most this long ago; MinAge rows created
	// at least this long ago (by the database clock). Zero: no bound.
	MaxAge, MinAge time.Duration
	// ErrorContains keeps rows whose last_error contains it, ignoring case.
	ErrorContains string
	// Limit is the most rows returned (1 to MaxInList).
	Limit int
}

// InboxFilter selects one consumer's inbox rows.
type InboxFilter struct {
	Consumer string
	// AfterEventID returns only rows with a larger event id (paging).
	AfterEventID   string
	EventIDs       []string
	Types, Keys    []string
	MaxAge, MinAge time.Duration // processed_at bounds, as in EventFilter
	Limit          int
}

// AdminQueries holds the operator statements for one outbox and inbox
// table pair. Build it with NewAdminQueries; it is immutable and safe for
// concurrent use.
type AdminQueries struct {
	s  *spec
	tb tables
}

// NewAdminQueries returns the operator statements of dialect d for the
// outbox table outbox and inbox table inbox.
func NewAdminQueries(d Dialect, outbox, inbox string) (*AdminQueries, error) {
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
	return &AdminQueries{s: s, tb: tables{outbox: outbox, inbox: inbox}}, nil
}

func (q *AdminQueries) set() *stmtSet { return q.s.statements(q.tb) }

// PendingStates returns one row: pending rows backing off after a failed
// publish, pending rows under a live lease (being published), and the
// number of relay instances holding those leases.
func (q *AdminQueries) PendingStates() (string, []any) {
	return q.set().get(sAdminPendingStates).render()
}

// FailedGroups returns FAILED rows per (biz_type, topic): type, topic,
// count, lowest id, latest updated_at; the largest groups first, at most
// limit groups.
func (q *AdminQueries) FailedGroups(limit int) (string, []any) {
	return q.set().get(sAdminFailedGroups).render(limit)
}

// HeldBack returns one row: how many keys have pending rows held back
// behind a FAILED or backing-off row of the same key, and how many such
// rows there are. Types in unordered are never held back.
func (q *AdminQueries) HeldBack(unordered []string) (string, []any) {
	p := q.s.mustPrepare(sAdminHeldBack, q.tb, map[string][]string{"unordered": unordered})
	return p.render()
}

// CountSent counts the sent rows the table keeps.
func (q *AdminQueries) CountSent() (string, []any) {
	return q.set().get(sAdminCountSent).render()
}

// MaxID returns the highest row id (0 for an empty table).
func (q *AdminQueries) MaxID() (string, []any) {
	return q.set().get(sAdminMaxID).render()
}

// SentPerMinute returns, per minute ago (0 = the current minute), the rows
// sent within window, their average and largest commit-to-publish lag in
// seconds: counted among the rows with id > fromID (MaxID minus the rows
// to scan), so that its cost is bounded on a table of any size.
func (q *AdminQueries) SentPerMinute(fromID int64, window time.Duration) (string, []any) {
	return q.set().get(sAdminSentPerMinute).render(fromID, window)
}

// sectionOn is a fixed list that keeps an IF section when on.
func sectionOn(on bool) []string {
	if on {
		return []string{"1"}
	}
	return nil
}

// FindEvents returns the rows f selects (EventColumns), in id order.
func (q *AdminQueries) FindEvents(f EventFilter) (string, []any, error) {
	if f.Limit < 1 || f.Limit > MaxInList {
		return "", nil, fmt.Errorf("limit is %d: use 1 to %d", f.Limit, MaxInList)
	}
	if f.Status < -1 || f.Status > StatusFailed {
		return "", nil, fmt.Errorf("status is %d: use -1 (any), 0 (pending), 1 (sent) or 2 (failed)", f.Status)
	}
	for what, n := range map[string]int{"ids": len(f.IDs), "event ids": len(f.EventIDs), "types": len(f.Types), "keys": len(f.Keys), "topics": len(f.Topics)} {
		if n > MaxInList {
			return "", nil, fmt.Errorf("%d %s: give at most %d", n, what, MaxInList)
		}
	}
	p := q.s.mustPrepare(sAdminFindEvents, q.tb, map[string][]string{
		"status_pending": sectionOn(f.Status == StatusPending),
		"status_sent":    sectionOn(f.Status == StatusSent),
		"status_failed":  sectionOn(f.Status == StatusFailed),
		"has_to_id":      sectionOn(f.ToID > 0),
		"has_ids":        sectionOn(len(f.IDs) > 0),
		"has_event_ids":  sectionOn(len(f.EventIDs) > 0),
		"has_types":      sectionOn(len(f.Types) > 0),
		"has_keys":       sectionOn(len(f.Keys) > 0),
		"has_topics":     sectionOn(len(f.Topics) > 0),
		"has_max_age":    sectionOn(f.MaxAge > 0),
		"has_min_age":    sectionOn(f.MinAge > 0),
		"has_error":      sectionOn(f.ErrorContains != ""),
	})
	s, args := p.render(f.AfterID, f.ToID, f.IDs, f.EventIDs, f.Types, f.Keys, f.Topics, f.MaxAge, f.MinAge, strings.ToLower(f.ErrorContains), f.Limit)
	return s, args, nil
}

// GetEvent returns one row (EventColumns, payload, headers) by id.
func (q *AdminQueries) GetEvent(id int64) (string, []any) {
	return q.set().get(sAdminGetEvent).render(id)
}

// GetEventByEventID returns one row (as GetEvent) by event id (a
// canonical lower-case UUID).
func (q *AdminQueries) GetEventByEventID(eventID string) (string, []any) {
	return q.set().get(sAdminGetEventByEventID).render(eventID)
}

// Replay makes sent rows pending again, due now, with their attempts
// reset; rows that are not sent are left alone. Event id, payload and
// headers are kept. Callers split id lists longer than MaxInList.
func (q *AdminQueries) Replay(ids []int64) (string, []any) {
	return q.set().get(sAdminReplay).render(ids)
}

// FindInbox returns the inbox rows f selects: consumer, event_id,
// biz_type, biz_id, processed_at, in event id order.
func (q *AdminQueries) FindInbox(f InboxFilter) (string, []any, error) {
	if f.Consumer == "" {
		return "", nil, fmt.Errorf("no consumer named")
	}
	if f.Limit < 1 || f.Limit > MaxInList {
		return "", nil, fmt.Errorf("limit is %d: use 1 to %d", f.Limit, MaxInList)
	}
	for what, n := range map[string]int{"event ids": len(f.EventIDs), "types": len(f.Types), "keys": len(f.Keys)} {
		if n > MaxInList {
			return "", nil, fmt.Errorf("%d %s: give at most %d", n, what, MaxInList)
		}
	}
	p := q.s.mustPrepare(sAdminFindInbox, q.tb, map[string][]string{
		"has_event_ids": sectionOn(len(f.EventIDs) > 0),
		"has_types":     sectionOn(len(f.Types) > 0),
		"has_keys":      sectionOn(len(f.Keys) > 0),
		"has_max_age":   sectionOn(f.MaxAge > 0),
		"has_min_age":   sectionOn(f.MinAge > 0),
	})
	s, args := p.render(f.Consumer, f.AfterEventID, f.EventIDs, f.Types, f.Keys, f.MaxAge, f.MinAge, f.Limit)
	return s, args, nil
}

// ForgetInbox deletes consumer's inbox rows of the given event ids, so
// that the consumer handles those events again when they are redelivered.
// Callers split lists longer than MaxInList.
func (q *AdminQueries) ForgetInbox(consumer string, eventIDs []string) (string, []any) {
	return q.set().get(sAdminForgetInbox).render(consumer, eventIDs)
}

// Leases returns, per relay instance (lease_owner) holding leases on
// pending rows, held rows left out: owner, rows, rows whose lease lapsed,
// earliest and latest lease expiry, oldest created_at; most rows first, at
// most limit owners. It reads the pending rows only (the claim index).
func (q *AdminQueries) Leases(limit int) (string, []any) {
	return q.set().get(sAdminLeases).render(limit)
}

// BlockedKeys returns one page of the keys HeldBack counts, in key order
// after afterKey, at most limit: EventColumns of the key's head (its
// oldest FAILED or backing-off row), then the number of pending rows
// waiting behind it and the created_at of the oldest of them. Types in
// unordered neither block nor wait.
func (q *AdminQueries) BlockedKeys(unordered []string, afterKey string, limit int) (string, []any) {
	p := q.s.mustPrepare(sAdminBlockedKeys, q.tb, map[string][]string{"unordered": unordered})
	return p.render(afterKey, limit)
}

// LockFailed returns the ids among ids of FAILED rows (in id order, except
// on SQLite) and locks them until the transaction ends (FOR UPDATE; on
// SQLite a no-op UPDATE ... RETURNING, which takes the database's write lock
// first thing, so that the transaction waits for a relay's write instead of
// failing with SQLITE_BUSY on a later upgrade): the first statement of a delete of
// FAILED rows, which then releases the rows held behind them (RelayQueries'
// ReleaseHeld, with the returned ids) and deletes them (DeleteFailed).
// Callers split lists longer than MaxInList.
func (q *AdminQueries) LockFailed(ids []int64) (string, []any) {
	return q.set().get(sAdminLockFailed).render(ids)
}

// DeleteFailed deletes the FAILED rows among ids; rows in another status
// are left alone. Callers split lists longer than MaxInList.
func (q *AdminQueries) DeleteFailed(ids []int64) (string, []any) {
	return q.set().get(sAdminDeleteFailed).render(ids)
}

// InboxHandled returns, per consumer, the inbox rows processed within
// window among the newest scanRows (consumer, count, latest processed_at),
// in consumer order: a bounded read of the processed_at index.
func (q *AdminQueries) InboxHandled(window time.Duration, scanRows int64) (string, []any) {
	return q.set().get(sAdminInboxHandled).render(window, scanRows)
}

// InboxDuplicates returns, per consumer, the events delivered again within
// window among the newest scanRows rows of the duplicate table (consumer,
// count, latest last_seen_at), in consumer order. The duplicate table
// exists from schema version InboxDuplicateVersion on.
func (q *AdminQueries) InboxDuplicates(window time.Duration, scanRows int64) (string, []any) {
	return q.set().get(sAdminInboxDuplicates).render(window, scanRows)
}

// RecentDuplicates returns consumer's latest rows of the duplicate table:
// consumer, event_id, biz_type, biz_id (each "" when NULL), count,
// first_seen_at, last_seen_at; newest first, at most limit.
func (q *AdminQueries) RecentDuplicates(consumer string, limit int) (string, []any) {
	return q.set().get(sAdminRecentDuplicates).render(consumer, limit)
}
