package dialect

// This file holds every statement the consumer inbox (package runtime/inbox)
// sends, for all three dialects.
//
// Both statements report their outcome through the affected-row count, so a
// delivery costs one round trip for the idempotency record and one more for
// the stale guard, and neither statement raises an error on a duplicate: a
// failed statement would abort the whole transaction on PostgreSQL.
//
// MySQL/MariaDB: the counts are MySQL's defaults (1 inserted, 2 updated,
// 0 unchanged). A DSN with clientFoundRows=true makes an unchanged row count
// as 1 and breaks duplicate detection; the go-sql-driver default is false.

import "fmt"

// InboxKeySuffix is appended to the inbox table name to name the stale-guard
// table: (consumer, biz_type, biz_id) → the newest outbox sequence applied.
// templates.Tables derives the same name for the DDL.
const InboxKeySuffix = "_key"

// InboxKeyTable returns the stale-guard table of inbox table inbox.
func InboxKeyTable(inbox string) string { return inbox + InboxKeySuffix }

// InboxQueries holds the consumer statements for one inbox table. Build it
// once with NewInboxQueries; it is immutable and safe for concurrent use.
type InboxQueries struct {
	d        Dialect
	inbox    string
	keys     string
	record   string
	recorded string
	guard    string
}

// NewInboxQueries returns the inbox statements of dialect d for inbox table
// inbox (and its stale-guard table, InboxKeyTable(inbox)).
func NewInboxQueries(d Dialect, inbox string) (*InboxQueries, error) {
	if !d.Valid() {
		return nil, fmt.Errorf("unknown SQL dialect %q: use postgres, mysql or sqlite", d)
	}
	if err := CheckIdentifier("inbox: table name", inbox); err != nil {
		return nil, err
	}
	keys := InboxKeyTable(inbox)
	if err := CheckIdentifier("inbox: stale-guard table name", keys); err != nil {
		return nil, err
	}
	q := &InboxQueries{d: d, inbox: inbox, keys: keys}

	q.record = "INSERT INTO " + inbox + " (consumer, event_id, biz_type, biz_id) VALUES (" + d.placeholders(4) + ")"
	if d == MySQL {
		// No ON CONFLICT; INSERT IGNORE would also turn a too-long event id
		// into a truncated (and possibly colliding) one, so a no-op update.
		q.record += " ON DUPLICATE KEY UPDATE consumer = consumer"
	} else {
		q.record += " ON CONFLICT (consumer, event_id) DO NOTHING"
	}

	// What an existing record says the event was: read after a duplicate,
	// to tell a redelivery from another event reusing the id. On MySQL a
	// locking read, so that it sees the row the INSERT found even when a
	// REPEATABLE READ snapshot predates it.
	q.recorded = "SELECT COALESCE(biz_type, ''), COALESCE(biz_id, '') FROM " + inbox + " WHERE consumer = " + d.Placeholder(1) + " AND event_id = " + d.Placeholder(2)
	if d == MySQL {
		q.recorded += " LOCK IN SHARE MODE"
	}

	ins := "INSERT INTO " + keys + " (consumer, biz_type, biz_id, last_seq) VALUES (" + d.placeholders(4) + ")"
	switch d {
	case MySQL:
		// updated_at has ON UPDATE CURRENT_TIMESTAMP(6): it moves only when
		// last_seq does. An older or equal sequence changes nothing: 0 rows.
		q.guard = ins + " ON DUPLICATE KEY UPDATE last_seq = IF(VALUES(last_seq) > last_seq, VALUES(last_seq), last_seq)"
	default:
		q.guard = ins + " ON CONFLICT (consumer, biz_type, biz_id) DO UPDATE SET last_seq = excluded.last_seq, updated_at = " + d.Now() +
			" WHERE " + keys + ".last_seq < excluded.last_seq"
	}
	return q, nil
}

// Dialect returns the queries' dialect.
func (q *InboxQueries) Dialect() Dialect { return q.d }

// Table returns the inbox table name.
func (q *InboxQueries) Table() string { return q.inbox }

// KeyTable returns the stale-guard table name.
func (q *InboxQueries) KeyTable() string { return q.keys }

// Record inserts the idempotency record of one delivery. One affected row:
// the first delivery of (consumer, eventID), handle it; zero: a duplicate,
// already handled (or being handled by a transaction that has since
// committed: the statement waits for a concurrent insert of the same key).
func (q *InboxQueries) Record(consumer, eventID, bizType, bizID string) (string, []any) {
	return q.record, []any{consumer, eventID, nullable(bizType), nullable(bizID)}
}

// Recorded reads back the event type and key (each "" when NULL) of the
// record of (consumer, eventID), after Record found one: the caller
// compares them with the delivery's to tell a redelivery of the same event
// from another event reusing its id. No row: the record is gone (deleted
// by retention since).
func (q *InboxQueries) Recorded(consumer, eventID string) (string, []any) {
	return q.recorded, []any{consumer, eventID}
}

// Guard advances the newest applied sequence of (consumer, bizType, bizID)
// to seq if seq is newer. A non-zero affected-row count: seq is the newest
// so far, apply the event; zero: an equal or newer sequence was already
// applied, the event is stale. The row stays locked until the transaction
// ends, so concurrent deliveries of one key are serialised.
func (q *InboxQueries) Guard(consumer, bizType, bizID string, seq int64) (string, []any) {
	return q.guard, []any{consumer, bizType, bizID, seq}
}

func nullable(s string) any {
	if s == "" {
		return nil
	}
	return s
}
