package dialect

// This file binds the statements the consumer inbox (package
// runtime/inbox) sends; their text is in sql/<dialect>.sql.
//
// Both statements report their outcome through the affected-row count, so a
// delivery costs one round trip for the idempotency record and one more for
// the stale guard, and neither statement raises an error on a duplicate: a
// failed statement would abort the whole transaction on PostgreSQL.
//
// MySQL/MariaDB: the counts are MySQL's defaults (1 inserted, 2 updated,
// 0 unchanged). A DSN with clientFoundRows=true makes an unchanged row count
// as 1 and breaks duplicate detection; the go-sql-driver default is false.

// InboxKeySuffix is appended to the inbox table name to name the stale-guard
// table: (consumer, biz_type, biz_id) → the newest outbox sequence applied.
// templates.Tables derives the same name for the DDL.
const InboxKeySuffix = "_key"

// InboxKeyTable returns the stale-guard table of inbox table inbox.
func InboxKeyTable(inbox string) string { return inbox + InboxKeySuffix }

// InboxDuplicateSuffix is appended to the inbox table name to name the
// record of duplicate deliveries: (consumer, event_id) → how many times
// the event was delivered again, first and last (schema version 2).
const InboxDuplicateSuffix = "_duplicate"

// InboxDuplicateTable returns the duplicate record of inbox table inbox.
func InboxDuplicateTable(inbox string) string { return inbox + InboxDuplicateSuffix }

// InboxQueries holds the consumer statements for one inbox table. Build it
// once with NewInboxQueries; it is immutable and safe for concurrent use.
type InboxQueries struct {
	s         *spec
	inbox     string
	keys      string
	dups      string
	record    *prepared
	recorded  *prepared
	guard     *prepared
	duplicate *prepared
}

// The inbox's statements (see sql/<dialect>.sql).
var (
	sInboxRecord          = define(nil, "InboxRecord", "consumer", "event_id", "biz_type", "biz_id")
	sInboxRecorded        = define(nil, "InboxRecorded", "consumer", "event_id")
	sInboxGuard           = define(nil, "InboxGuard", "consumer", "biz_type", "biz_id", "last_seq")
	sInboxRecordDuplicate = define(nil, "InboxRecordDuplicate", "consumer", "event_id", "biz_type", "biz_id")
)

// NewInboxQueries returns the inbox statements of dialect d for inbox table
// inbox (and its stale-guard table, InboxKeyTable(inbox)).
func NewInboxQueries(d Dialect, inbox string) (*InboxQueries, error) {
	s := specOf(d)
	if s == nil {
		return nil, errUnknown(d)
	}
	if err := CheckIdentifier("inbox: table name", inbox); err != nil {
		return nil, err
	}
	keys := InboxKeyTable(inbox)
	if err := CheckIdentifier("inbox: stale-guard table name", keys); err != nil {
		return nil, err
	}
	dups := InboxDuplicateTable(inbox)
	if err := CheckIdentifier("inbox: duplicate table name", dups); err != nil {
		return nil, err
	}
	set := s.statements(tables{inbox: inbox})
	return &InboxQueries{s: s, inbox: inbox, keys: keys, dups: dups,
		record: set.get(sInboxRecord), recorded: set.get(sInboxRecorded), guard: set.get(sInboxGuard),
		duplicate: set.get(sInboxRecordDuplicate)}, nil
}

// Dialect returns the queries' dialect.
func (q *InboxQueries) Dialect() Dialect { return q.s.dialect }

// Table returns the inbox table name.
func (q *InboxQueries) Table() string { return q.inbox }

// KeyTable returns the stale-guard table name.
func (q *InboxQueries) KeyTable() string { return q.keys }

// DuplicateTable returns the name of the record of duplicate deliveries.
func (q *InboxQueries) DuplicateTable() string { return q.dups }

// Record inserts the idempotency record of one delivery. One affected row:
// the first delivery of (consumer, eventID), handle it; zero: a duplicate,
// already handled (or being handled by a transaction that has since
// committed: the statement waits for a concurrent insert of the same key).
func (q *InboxQueries) Record(consumer, eventID, bizType, bizID string) (string, []any) {
	return q.record.render(consumer, eventID, nullable(bizType), nullable(bizID))
}

// Recorded reads back the event type and key (each "" when NULL) of the
// record of (consumer, eventID), after Record found one: the caller
// compares them with the delivery's to tell a redelivery of the same event
// from another event reusing its id. No row: the record is gone (deleted
// by retention since).
func (q *InboxQueries) Recorded(consumer, eventID string) (string, []any) {
	return q.recorded.render(consumer, eventID)
}

// Guard advances the newest applied sequence of (consumer, bizType, bizID)
// to seq if seq is newer. A non-zero affected-row count: seq is the newest
// so far, apply the event; zero: an equal or newer sequence was already
// applied, the event is stale. The row stays locked until the transaction
// ends, so concurrent deliveries of one key are serialised.
func (q *InboxQueries) Guard(consumer, bizType, bizID string, seq int64) (string, []any) {
	return q.guard.render(consumer, bizType, bizID, seq)
}

// RecordDuplicate counts one duplicate delivery of (consumer, eventID) in
// the duplicate table (DuplicateTable, schema version 2): a new row with
// count 1, or count + 1 and last_seen_at now. Run it only on the
// duplicate path, after Record changed nothing, and only when the table
// exists (a failed statement aborts a PostgreSQL transaction).
func (q *InboxQueries) RecordDuplicate(consumer, eventID, bizType, bizID string) (string, []any) {
	return q.duplicate.render(consumer, eventID, nullable(bizType), nullable(bizID))
}

func nullable(s string) any {
	if s == "" {
		return nil
	}
	return s
}
