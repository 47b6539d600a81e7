// Package driver is the one storage interface of outboxgen's runtime: the
// relay, sweeper, monitor and janitor talk to the outbox and inbox tables
// only through a Driver, so they work the same on every database.
//
// Two implementations exist, as in river's riverdriver: package sqldriver
// (database/sql: pgx stdlib, go-sql-driver/mysql, modernc.org/sqlite) and
// package pgxdriver (a native pgx/v5 pool, PostgreSQL). Their SQL lives in
// package dialect, one place per dialect; package drivertest is the
// conformance suite every implementation passes against a real database.
package driver

import (
	"context"
	"errors"
	"time"

	"github.com/outboxgen/outboxgen/runtime/dialect"
	"github.com/outboxgen/outboxgen/runtime/outbox"
)

// Tables names the outbox, inbox and archive tables: the generated
// package's Schema.Tables, from events.yaml. Names are checked with
// dialect.CheckIdentifier before they reach any SQL.
type Tables = outbox.Tables

// Table is one table of a schema that a runtime part uses, for Check.
type Table int

// The tables Check can verify.
const (
	// Outbox is sql.outbox_table: relay, sweeper, monitor, janitor.
	Outbox Table = iota
	// Inbox is sql.inbox_table: consumers, janitor.
	Inbox
	// Archive is sql.archive_table: the janitor when it archives.
	Archive
	// InboxDuplicates is the inbox's record of duplicate deliveries
	// (dialect.InboxDuplicateTable, schema version 2): consumers, janitor,
	// console. It is optional: a database still at schema version 1 lacks
	// it (Check fails with dberr.Missing and the advice to run `outboxgen
	// migrate up`), and the parts that use it then work without it.
	InboxDuplicates
)

// Row is one claimed outbox row, everything the relay needs to publish it.
type Row struct {
	ID         int64
	EventID    string // canonical lower-case UUID text
	Type       string // biz_type
	Key        string // biz_id
	Topic      string
	Version    int
	Payload    []byte
	Headers    []byte // a JSON object, or nil
	RetryCount int    // failed attempts before this one
	CreatedAt  time.Time
}

// ClaimParams says which rows to claim and for how long.
type ClaimParams struct {
	// Owner is the claiming instance's id; every later write to the rows
	// is fenced by it.
	Owner string
	// Lease is how long the claim holds; after it, other instances may
	// claim the rows again (the owner is presumed dead).
	Lease time.Duration
	// Limit is the most rows to claim (at most dialect.MaxInList). It is
	// written into the claim's text, so that PostgreSQL can keep one plan
	// of it per connection: each distinct Limit is a distinct prepared
	// statement there. Use a few values (the relay uses its BatchSize, or
	// when less room is left three, two or one quarter of it, or below that
	// a power of two).
	Limit int
	// Unordered lists event types exempt from per-key order. Rows of all
	// other types are claimed only when every older unsent row of their
	// key is sent or claimed in the same call.
	Unordered []string
	// OverdueAfter, when positive, restricts the claim to rows created at
	// least that long ago: the sweeper's rescue pass.
	OverdueAfter time.Duration
	// Hold is how long a candidate found waiting behind a FAILED row of
	// its key is held (kept out of claims); ReleaseHeld, which Requeue
	// runs, ends the hold early (0: DefaultHold).
	Hold time.Duration
	// HoldBehindSlow is how long a row must have been in flight (leased
	// or heartbeat last) before the candidates behind it in its key are
	// held until it is recorded, so claims stop reading past them while a
	// slow publish lasts (0: DefaultHoldBehindSlow). Every recording ends
	// such holds for the rows it records. PostgreSQL; other dialects leave
	// those candidates where they are.
	HoldBehindSlow time.Duration
	// ReleaseOrphans makes the claim first end the holds behind rows no
	// longer in flight that were recorded without ending them (by an
	// older runtime, or racing the claim that held them). A relay sets it
	// now and then; it reads every row held behind a row in flight.
	ReleaseOrphans bool
	// Front asks for the claim's front in Result.Front (PostgreSQL;
	// other dialects ignore it): one more read of the due index, from
	// From.
	Front bool
	// From, when not zero, starts the claim's read of due rows at this
	// position instead of at the first row due, and implies Front: pass
	// the Front of an earlier claim (PostgreSQL, where the due index
	// keeps an entry for every row sent since the last VACUUM, and a
	// claim from the start reads past them all). Rows due before From are
	// not claimed: see ScanPos for which those can be, and claim from the
	// start now and then. Other dialects ignore it.
	From ScanPos
	// SkipKeys are keys (biz_id) whose rows the claim may pass over: the
	// keys of rows the caller holds leased and has not recorded, so that
	// none of their other rows can be leased until it does (a relay
	// passes the keys of which it is publishing several rows, and not
	// those it records in this call). MySQL/MariaDB read their window of
	// due rows without them: a key with a long backlog otherwise costs
	// every claim a read of each of its waiting rows. Rows of unordered types of those
	// keys are passed over too (leave SkipKeys empty when Unordered is
	// not). At most dialect.MaxInList keys; other dialects ignore it.
	SkipKeys []string
	// Stripe, when its Of is 2 or more, restricts a claim that reads From
	// a front to the keys of one stripe: those whose hash modulo Of is
	// Index. Claims running at once with distinct stripes of one Of read
	// disjoint keys, so none reads past, checks and fails to lock the
	// rows another is leasing (a relay's parallel claims while a backlog
	// drains). Per-key order is unaffected: all rows of a key are in one
	// stripe. Rows of other stripes are read past, so a stripe with no
	// due rows reads every due row once: stripe claims while a backlog
	// of many keys drains, and take the stripes in turn. The front
	// (Result.Front) is of every key. PostgreSQL; claims without From,
	// Stripes with Index outside 0 to Of-1, and other dialects, read
	// every key.
	Stripe Stripe
	// Result, when not nil, receives what the claim did besides leasing.
	Result *ClaimResult
	// Record, when not nil, holds results of earlier claims of Owner:
	// they are written first, in the claim's own transaction, so a relay
	// records one batch and claims the next with one commit (and, on
	// pgxdriver, one round trip); sqldriver on MySQL/MariaDB commits them
	// just before the claim's transaction instead (Result.RecordedApart,
	// see sqldriver). The claim sees what they changed: a key
	// whose head was just marked sent may have its next rows claimed.
	// What they changed is in Result.Recorded; if the call fails, none
	// of it happened, unless Result.RecordedApart says the results were
	// committed before the claim began (sqldriver on MySQL/MariaDB).
	Record *Results
	// RecordInTime asks that Record commit only if the call read its
	// results back before ctx ended, so that a recording that reached the
	// database late (held up on the network) does not commit: the caller
	// relies on it running before a lease lapses. database/sql sends a
	// transaction's COMMIT only after its statements returned; pgxdriver,
	// which otherwise sends the recording, the claim and their commit as
	// one batch, then wraps them in a transaction of its own and commits
	// it after reading them (one round trip more).
	RecordInTime bool
}

// Results is what a relay learned about rows it leased, to record in one
// transaction: Claim (ClaimParams.Record) or Record. Every write is fenced
// by the owner's lease: rows another instance took over are left alone.
type Results struct {
	// Sent rows were published: status sent, sent_at now, lease cleared.
	Sent []int64
	// Failures are failed publishes (see MarkRetry).
	Failures []Failure
	// MaxAttempts is the attempt limit the failures are judged by.
	MaxAttempts int
	// Release rows go back unpublished: the lease is cleared.
	Release []int64
}

// Empty reports whether r holds nothing to record.
func (r *Results) Empty() bool {
	return r == nil || len(r.Sent)+len(r.Failures)+len(r.Release) == 0
}

// Recorded is what recording Results changed.
type Recorded struct {
	// Sent, Retried and Released count the rows each part changed; fewer
	// than asked means the lease of the others was lost.
	Sent, Retried, Released int64
	// Failed lists the rows that became FAILED.
	Failed []int64
	// Unheld counts the rows held behind the recorded ones (see
	// ClaimParams.HoldBehindSlow) that are due again; in a ClaimResult,
	// also those ClaimParams.ReleaseOrphans freed.
	Unheld int64
}

// Stripe is one of Of disjoint sets of keys (see ClaimParams.Stripe);
// the zero Stripe is every key.
type Stripe struct {
	Index, Of int
}

// ClaimResult is what a claim did besides leasing rows.
type ClaimResult struct {
	// Moved counts the rows of the window the claim held or moved back
	// behind an older row of their key instead of leasing them. They left
	// the window, so a claim that leased fewer than Limit rows but moved
	// some may find more claimable rows at once.
	Moved int
	// Recorded is what ClaimParams.Record changed.
	Recorded Recorded
	// RecordedApart reports that ClaimParams.Record was written in a
	// transaction of its own, committed before the claim's: Recorded
	// then holds what it changed even when Claim returns an error.
	RecordedApart bool
	// Front is, when ClaimParams.Front or From asked for it and the
	// claim returned rows (PostgreSQL), the position of the oldest pending
	// row at or after ClaimParams.From that the claim saw, leased or not:
	// a later claim may read from there (ClaimParams.From). Zero
	// otherwise.
	Front ScanPos
}

// ScanPos is a position in the order claims read due rows: by
// next_retry_time, then id. The zero ScanPos is the start.
//
// A claim's Front has no pending row before it that the claim could see.
// Rows may become pending before it later, and a claim from it does not
// see those: the rows of a transaction that began before the front's
// time and committed after the claim (a row is due from its
// transaction's start; so are the rows Requeue, ReleaseHeld or a replay
// make due again), and rows held behind a row in flight once it is
// recorded (Recorded.Unheld: they go back to their creation time). A
// caller that claims from a front claims from the start too, now and
// then and after such releases, as the relay does.
type ScanPos struct {
	// DueMicros is the row's next_retry_time in microseconds since the
	// Unix epoch, as the database returned it.
	DueMicros int64
	// ID is the row's id; 0 only in the zero ScanPos.
	ID int64
}

// IsZero reports whether p is the start.
func (p ScanPos) IsZero() bool { return p.ID == 0 }

// DefaultHoldBehindSlow is ClaimParams.HoldBehindSlow when it is zero:
// twice the relay's SlowPublish (250 ms, the longest a publish counts as
// usual), well above a broker's usual round trip.
const DefaultHoldBehindSlow = 500 * time.Millisecond

// DefaultHold is ClaimParams.Hold when it is zero. A hold ends early when
// the row holding the key back is sent or requeued (ReleaseHeld); the
// lapse only matters when it went another way (deleted by hand).
const DefaultHold = 5 * time.Minute

// Failure is a failed publish to record.
type Failure struct {
	// Row is the row as claimed; Row.RetryCount counts earlier failures.
	Row Row
	// Error is the publish error text (truncated to 2 KB when stored).
	Error string
	// Delay is the backoff before the next attempt.
	Delay time.Duration
	// Permanent marks a failure no retry can mend (a payload the relay
	// cannot decode, a topic the broker refuses): the row becomes FAILED
	// at once instead of after the remaining attempts.
	Permanent bool
}

// MaxAttempts returns the attempt limit that applies to f: maxAttempts, or
// 1 for a permanent failure (so this attempt is the last).
func (f Failure) MaxAttempts(maxAttempts int) int {
	if f.Permanent {
		return 1
	}
	return maxAttempts
}

// FailedEvent is a FAILED row (status 2): it exhausted its attempts and
// waits for an operator. FAILED rows are never deleted automatically.
type FailedEvent struct {
	ID         int64  // the row id (Requeue takes these)
	EventID    string // the message UUID
	Type       string // biz_type
	Key        string // biz_id; later events of this key are held back
	Topic      string
	RetryCount int    // failed attempts
	LastError  string // the last publish error (at most 2 KB)
	CreatedAt  time.Time
	UpdatedAt  time.Time // when it was marked failed
}

// Stats is a snapshot of the outbox table for monitoring.
type Stats struct {
	// Pending counts rows waiting to be published (status 0).
	Pending int64
	// OldestPendingAge is the age of the oldest pending row (0 when none).
	OldestPendingAge time.Duration
	// Stale counts pending rows older than the threshold asked for: the
	// seed design's alarm ("committed but not sent after 10 minutes").
	Stale int64
	// Failed counts FAILED rows (status 2).
	Failed int64
	// ExpiredLeases counts pending rows whose lease lapsed: a relay died
	// holding them.
	ExpiredLeases int64
}

// RowStatus is the status column of an outbox row.
type RowStatus int

// The row statuses.
const (
	// Pending rows wait to be published (or are being published).
	Pending RowStatus = dialect.StatusPending
	// Sent rows were published; the janitor deletes them after retention.
	Sent RowStatus = dialect.StatusSent
	// Failed rows exhausted their attempts and wait for an operator.
	Failed RowStatus = dialect.StatusFailed
)

// String returns "pending", "sent" or "failed".
func (s RowStatus) String() string {
	switch s {
	case Pending:
		return "pending"
	case Sent:
		return "sent"
	case Failed:
		return "failed"
	}
	return "unknown"
}

// ErrNotFound is returned by GetEvent and GetEventByEventID when no row
// has the id.
var ErrNotFound = errors.New("no such event in the outbox table")

// Event is one outbox row as an operator sees it. FindEvents leaves
// Payload and Headers nil (lists stay small); GetEvent fills them.
type Event struct {
	ID             int64     `json:"id"`
	EventID        string    `json:"event_id"`
	Type           string    `json:"type"`
	Key            string    `json:"key"`
	Topic          string    `json:"topic"`
	Version        int       `json:"version"`
	Status         RowStatus `json:"-"`
	RetryCount     int       `json:"attempts"`
	NextRetryAt    time.Time `json:"next_attempt_at"`
	LeaseOwner     string    `json:"lease_owner,omitempty"`
	LeaseExpiresAt time.Time `json:"lease_expires_at,omitzero"`
	LastError      string    `json:"last_error,omitempty"`
	CreatedAt      time.Time `json:"created_at"`
	UpdatedAt      time.Time `json:"updated_at"`
	SentAt         time.Time `json:"sent_at,omitzero"`
	Payload        []byte    `json:"-"`
	Headers        []byte    `json:"-"`
}

// EventFilter selects outbox rows for FindEvents (see dialect.EventFilter).
type EventFilter = dialect.EventFilter

// InboxFilter selects inbox rows for FindInbox (see dialect.InboxFilter).
type InboxFilter = dialect.InboxFilter

// InboxRow is one consumer's record of one handled event.
type InboxRow struct {
	Consumer    string    `json:"consumer"`
	EventID     string    `json:"event_id"`
	Type        string    `json:"type,omitempty"`
	Key         string    `json:"key,omitempty"`
	ProcessedAt time.Time `json:"processed_at"`
}

// OverviewParams says what Overview measures.
type OverviewParams struct {
	// StaleAfter is the age past which a pending row counts as stale.
	StaleAfter time.Duration
	// Unordered lists the event types exempt from per-key order: their
	// rows are never held back.
	Unordered []string
	// Window is how far back SentPerMinute looks; ScanRows how many of the
	// newest rows (by id) it reads at most, which bounds its cost.
	Window   time.Duration
	ScanRows int64
	// MaxGroups bounds FailedGroups.
	MaxGroups int
	// CountSent asks for Overview.Sent, which reads every sent row on
	// PostgreSQL and SQLite (no index holds them).
	CountSent bool
}

// FailedGroup counts the FAILED rows of one event type and topic.
type FailedGroup struct {
	Type         string    `json:"type"`
	Topic        string    `json:"topic"`
	Count        int64     `json:"count"`
	FirstID      int64     `json:"first_id"`
	LastFailedAt time.Time `json:"last_failed_at"`
}

// MinuteStat is what was sent in one minute.
type MinuteStat struct {
	// MinutesAgo is 0 for the current minute.
	MinutesAgo int     `json:"minutes_ago"`
	Sent       int64   `json:"sent"`
	AvgLag     float64 `json:"avg_lag_seconds"` // commit-to-publish
	MaxLag     float64 `json:"max_lag_seconds"`
}

// Overview is what an operator asks first: Stats plus the states of the
// pending rows, FAILED rows per type and topic, keys held back, and the
// recent send rate.
type Overview struct {
	Stats
	// Sent counts the sent rows the table keeps (until the janitor's
	// retention); -1 unless OverviewParams.CountSent.
	Sent int64
	// BackingOff counts pending rows waiting out the backoff after a
	// failed publish.
	BackingOff int64
	// InFlight counts pending rows leased to a live relay.
	InFlight int64
	// Relays counts the relay instances holding live leases.
	Relays int64
	// FailedGroups are the FAILED rows per type and topic, largest first.
	FailedGroups []FailedGroup
	// HeldBackKeys counts keys whose pending rows wait behind a FAILED or
	// backing-off row of the same key; HeldBackRows counts those rows.
	HeldBackKeys, HeldBackRows int64
	// SentPerMinute lists the minutes of the window with sent rows, newest
	// first (minutes with none are left out), counted among the rows with
	// id > SentFromID only.
	SentPerMinute []MinuteStat
	// SentFromID is the id the send rate was counted above: the newest id
	// minus OverviewParams.ScanRows, or 0 when the scan covered the whole
	// table. When positive, rows older than it that were sent within the
	// window (late, after an outage) are not counted.
	SentFromID int64
}

// RelayLeases is one relay instance as the outbox table sees it: the
// pending rows leased to it (Leases). A relay that died still shows here
// until its rows are claimed again; Expired says how many of its leases
// lapsed.
type RelayLeases struct {
	// Owner is the relay instance's id (ClaimParams.Owner).
	Owner string `json:"owner"`
	// Rows counts the pending rows leased to Owner.
	Rows int64 `json:"rows"`
	// Expired counts those whose lease lapsed (a dead or stalled relay:
	// the sweeper or the next claim takes them back).
	Expired int64 `json:"expired"`
	// FirstExpiresAt and LastExpiresAt are the earliest and latest lease
	// expiry of those rows.
	FirstExpiresAt time.Time `json:"first_expires_at"`
	LastExpiresAt  time.Time `json:"last_expires_at"`
	// OldestCreatedAt is the created_at of the oldest of those rows.
	OldestCreatedAt time.Time `json:"oldest_created_at"`
}

// BlockedKey is a key whose pending rows wait behind a FAILED or
// backing-off row of the same key (its head), as counted by
// Overview.HeldBackKeys.
type BlockedKey struct {
	// Key is the biz_id.
	Key string `json:"key"`
	// Head is the oldest FAILED or backing-off row of the key, the one
	// holding it back: id, event id, type, topic, status, attempts, next
	// attempt, lease and last error; Payload and Headers are nil.
	Head Event `json:"head"`
	// HeadStatus is Head.Status as text: "failed" or "pending" (backing
	// off).
	HeadStatus string `json:"head_status"`
	// Waiting counts the pending rows of the key newer than Head.
	Waiting int64 `json:"waiting"`
	// OldestWaitingAt is the created_at of the oldest of them.
	OldestWaitingAt time.Time `json:"oldest_waiting_at"`
}

// BlockedKeysParams pages through the blocked keys, in key order.
type BlockedKeysParams struct {
	// Unordered lists the event types exempt from per-key order: their
	// rows neither block a key nor wait.
	Unordered []string
	// AfterKey returns keys after it (the last key of the previous page;
	// "" for the first page).
	AfterKey string
	// Limit is the most keys returned (1 to dialect.MaxInList).
	Limit int
}

// InboxConsumer is what one consumer handled recently (InboxConsumers).
type InboxConsumer struct {
	// Consumer is the consumer name (the inbox's consumer column).
	Consumer string `json:"consumer"`
	// Handled counts the consumer's inbox rows processed within the
	// window, among the newest scanRows rows read; see Capped.
	Handled int64 `json:"handled"`
	// Capped reports that the count reached the scan bound: at least
	// Handled rows.
	Capped bool `json:"capped"`
	// LastProcessedAt is when the consumer last handled an event (within
	// the window; zero when none).
	LastProcessedAt time.Time `json:"last_processed_at,omitzero"`
	// Duplicates counts the events delivered to the consumer again (and
	// skipped) within the window, each once however often: rows of the
	// inbox's duplicate table last seen within the window (schema version
	// 2; always 0 before).
	Duplicates int64 `json:"duplicates"`
	// LastDuplicateAt is when the last duplicate arrived.
	LastDuplicateAt time.Time `json:"last_duplicate_at,omitzero"`
}

// InboxDuplicate is one event delivered to a consumer again after it was
// handled: a row of the inbox's duplicate table.
type InboxDuplicate struct {
	Consumer string `json:"consumer"`
	EventID  string `json:"event_id"`
	Type     string `json:"type"`
	Key      string `json:"key"`
	// Count counts the duplicate deliveries (the first handled delivery
	// not included).
	Count int64 `json:"count"`
	// FirstSeenAt and LastSeenAt are the first and last duplicate.
	FirstSeenAt time.Time `json:"first_seen_at"`
	LastSeenAt  time.Time `json:"last_seen_at"`
}

// Driver is the storage of one outbox (and inbox) table pair on one
// database. Implementations are safe for concurrent use. Every method that
// changes a claimed row is fenced by the lease owner and reports how many
// rows it changed, so a relay that lost its lease changes nothing.
type Driver interface {
	// Dialect returns the SQL dialect.
	Dialect() dialect.Dialect
	// Tables returns the table names (the schema's).
	Tables() Tables
	// Schema returns the schema the driver was built from.
	Schema() outbox.Schema

	// Check verifies, before a part first uses the database, that the
	// database speaks the driver's dialect (asked of the server) and that
	// table t exists with every column this runtime needs, and returns an
	// error naming the table, its events.yaml key and the fix otherwise.
	// A missing table or column and a wrong dialect are permanent (see
	// dberr: fatal at start); a database that is down is not. Success is
	// remembered: later calls cost nothing.
	Check(ctx context.Context, t Table) error

	// Claim reads a window of at most p.Limit due (next_retry_time
	// passed), unleased pending rows in the order they became due (rows
	// of a key whose oldest unsent row is being published are passed
	// over, unless that publish has run for p.HoldBehindSlow on a dialect
	// that holds rows behind it), leases to p.Owner those that are
	// claimable and returns them in id order. Claimable: of an unordered
	// type, or every older unsent row of the same key is in the window
	// too. A row of the window waiting behind a FAILED, backing-off or
	// held row of its key is held instead (lease_owner dialect.HeldOwner):
	// behind a FAILED row until now + p.Hold or ReleaseHeld, behind a row
	// backing off until that row's next attempt, behind a slow row in
	// flight until that row is recorded (next_retry_time
	// dialect.InFlightHoldStamp), so that later claims do not read it
	// again in the meantime. The cost of a
	// claim is bounded by p.Limit, whatever the backlog. It holds row locks
	// only for its own short transaction: no broker I/O happens while they
	// are held.
	//
	// With p.Record set, the results are written first in the same
	// transaction (see ClaimParams.Record).
	Claim(ctx context.Context, p ClaimParams) ([]Row, error)
	// Record writes the results of owner's earlier claims (sent rows,
	// failures, releases) in one transaction: the relay's path when it has
	// results but no room to claim more.
	Record(ctx context.Context, owner string, r Results) (Recorded, error)
	// ReleaseHeld makes the held rows of the keys of ids due again, for
	// an operator who resolved the rows holding them back some other way
	// than Requeue (which releases them itself).
	ReleaseHeld(ctx context.Context, ids []int64) (int64, error)
	// MarkSent marks ids sent (status 1, sent_at now) and clears the
	// lease; the rows held behind them are due again (a recording, like
	// Record).
	MarkSent(ctx context.Context, owner string, ids []int64) (int64, error)
	// MarkRetry records failures: retry_count+1, last_error, next_retry_time
	// now+Delay, and status FAILED once retry_count reaches maxAttempts. It
	// returns how many rows changed and the ids that became FAILED.
	MarkRetry(ctx context.Context, owner string, fs []Failure, maxAttempts int) (changed int64, failed []int64, err error)
	// Release gives ids back unpublished (the lease is cleared, nothing
	// else of them changes), and makes the rows held behind them due
	// again, as every recording does.
	Release(ctx context.Context, owner string, ids []int64) (int64, error)
	// ExtendLease pushes the lease of the ids still leased to owner and
	// pending to now+lease (by the database clock): the relay's heartbeat
	// while a batch publishes. Rows another owner took over, or already
	// recorded, are left alone; it returns how many rows it extended.
	ExtendLease(ctx context.Context, owner string, ids []int64, lease time.Duration) (int64, error)

	// Requeue makes FAILED ids pending again, due now, with retry_count 0,
	// and releases the rows held behind them (as ReleaseHeld), all in one
	// transaction however many ids there are (the statements are split
	// into chunks of dialect.MaxInList ids inside it): if it fails, no row
	// changed.
	Requeue(ctx context.Context, ids []int64) (int64, error)
	// RequeueAndRelease is Requeue, which also returns how many held rows
	// of the keys of ids it made due again in the same transaction.
	RequeueAndRelease(ctx context.Context, ids []int64) (requeued, released int64, err error)

	// Stats counts pending, stale (older than staleAfter), failed and
	// expired-lease rows.
	Stats(ctx context.Context, staleAfter time.Duration) (Stats, error)
	// DeleteSent deletes at most limit sent rows whose sent_at is older
	// than olderThan, oldest first, in one short statement.
	DeleteSent(ctx context.Context, olderThan time.Duration, limit int) (int64, error)
	// ArchiveSent moves at most limit such rows into archive (a table with
	// the outbox layout; see templates) in one short transaction.
	ArchiveSent(ctx context.Context, archive string, olderThan time.Duration, limit int) (int64, error)
	// DeleteInbox deletes at most limit inbox rows processed longer ago
	// than olderThan.
	DeleteInbox(ctx context.Context, olderThan time.Duration, limit int) (int64, error)
	// DeleteInboxDuplicates deletes at most limit rows of the inbox's
	// record of duplicate deliveries last seen longer ago than olderThan,
	// oldest first, in one short statement. The table exists from schema
	// version 2 on: check it first (Check(ctx, InboxDuplicates)).
	DeleteInboxDuplicates(ctx context.Context, olderThan time.Duration, limit int) (int64, error)

	// Overview returns what an operator asks first (see Overview); every
	// part reads indexes only, never the sent rows beyond p.ScanRows.
	Overview(ctx context.Context, p OverviewParams) (Overview, error)
	// MaxID returns the highest row id of the outbox table (0 when it is
	// empty), by its primary key: one index read.
	MaxID(ctx context.Context) (int64, error)
	// FindEvents returns the rows f selects, in id order, without payload
	// and headers.
	FindEvents(ctx context.Context, f EventFilter) ([]Event, error)
	// GetEvent returns one row in full by id, or ErrNotFound.
	GetEvent(ctx context.Context, id int64) (Event, error)
	// GetEventByEventID returns one row in full by event id, or
	// ErrNotFound.
	GetEventByEventID(ctx context.Context, eventID string) (Event, error)
	// Replay makes sent ids pending again, due now, attempts reset, event
	// id, payload and headers kept; other ids are left alone. It returns
	// how many rows changed. All ids change in one transaction (as
	// Requeue).
	Replay(ctx context.Context, ids []int64) (int64, error)
	// FindInbox returns the inbox rows f selects, in event id order.
	FindInbox(ctx context.Context, f InboxFilter) ([]InboxRow, error)
	// ForgetInbox deletes consumer's inbox rows of eventIDs, in one
	// transaction, and returns how many it deleted.
	ForgetInbox(ctx context.Context, consumer string, eventIDs []string) (int64, error)

	// Leases returns the relay instances holding leases on pending rows,
	// most rows first, at most limit (1 to dialect.MaxInList). Held rows
	// (lease owner dialect.HeldOwner) are not a relay's and are left out.
	Leases(ctx context.Context, limit int) ([]RelayLeases, error)
	// BlockedKeys returns the keys whose pending rows wait behind a
	// FAILED or backing-off head, in key order, paged by p.AfterKey.
	BlockedKeys(ctx context.Context, p BlockedKeysParams) ([]BlockedKey, error)
	// DeleteFailed deletes the FAILED rows among ids (rows in another
	// status are left alone) and releases the rows held behind them (as
	// ReleaseHeld), all in one transaction (as Requeue). It returns how
	// many rows it deleted, and how many held rows it released.
	DeleteFailed(ctx context.Context, ids []int64) (deleted, released int64, err error)
	// InboxConsumers returns, per consumer, the inbox rows processed
	// within window among the newest scanRows, and the events delivered
	// again within window (among the newest scanRows of the duplicate
	// table; none before schema version 2), in consumer order.
	InboxConsumers(ctx context.Context, window time.Duration, scanRows int64) ([]InboxConsumer, error)
	// RecentDuplicates returns consumer's most recent duplicate
	// deliveries, newest first, at most limit (1 to dialect.MaxInList);
	// none on a database still at schema version 1.
	RecentDuplicates(ctx context.Context, consumer string, limit int) ([]InboxDuplicate, error)
}

// Notifier is implemented by drivers that can wait for new rows without
// polling (PostgreSQL LISTEN/NOTIFY on the pgx driver).
type Notifier interface {
	// WaitForNotification blocks until a row may have been inserted, ctx
	// is done, or an error occurs.
	WaitForNotification(ctx context.Context) error
}
