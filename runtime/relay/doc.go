// Package relay publishes the rows of outboxgen's outbox table to a
// watermill message.Publisher: the half of the transactional outbox that
// keeps the promise "committed ⇒ published (at least once), rolled back ⇒
// never published".
//
//	drv, err := sqldriver.New(db, events.Schema) // or pgxdriver.New(pool, events.Schema)
//	...
//	r, err := relay.New(drv, relay.Config{Publisher: pub})
//	...
//	go r.Run(ctx) // returns after in-flight results are recorded
//
// The relay reaches the database only through a driver.Driver (package
// runtime/driver), which owns the table names and the SQL.
//
// # How a poll works
//
// Each poll claims up to BatchSize pending, due rows in the order they
// became due and leases them to this instance (lease_owner,
// lease_expires_at = now + LeaseDuration), then publishes them. Polls are
// pipelined: the next claim does not wait for the last batch to finish
// publishing, only for room under MaxInFlight (rows leased and not yet
// recorded), so a slow publish idles its own key and nothing else; while a
// backlog lasts, ParallelClaims claims run at once. Results
// are recorded as publishes complete, in groups, with the next claim in
// the same transaction (one commit, and on pgxdriver one round trip, for
// both; on MySQL/MariaDB committed just before the claim's, which spares
// claims running beside it from reading past uncommitted changes), or
// alone when no claim is due. PostgreSQL and
// MySQL/MariaDB claim with SELECT ... FOR UPDATE SKIP LOCKED in one short
// statement or transaction, so several relay instances share the work with
// no external lock service; SQLite (one writer) claims with a single
// compare-and-set UPDATE ... RETURNING. The claim transaction commits before
// anything is published: broker I/O never runs inside a transaction that
// holds row locks, because a slow or hung broker would then hold those locks
// (blocking writers' updates of the same rows, the janitor and other relays)
// and keep a connection and a long transaction open (bloat on PostgreSQL,
// undo history on InnoDB). The lease, not a lock, protects rows while they
// are published; every result is written WHERE lease_owner = this instance,
// so a relay that lost its lease (it took longer than LeaseDuration, or was
// presumed dead) changes nothing: the row is published again by the new
// owner. Delivery is therefore at-least-once; consumers deduplicate by the
// message UUID (the event_id).
// The fence cannot tell a lapsed lease of this relay from a new one it
// took since, so the relay files no result of a row that a later claim of
// its own returned, and records failures and releases beside a claim of
// its own only by a call that ends while their lease is certain to hold.
//
// All timestamps are taken from the database clock, never the relay's.
//
// # Latency
//
// A relay polls every PollInterval (fixed delay) and at once after a full
// batch. Relay.Notify wakes it early: call it after committing events in
// the same process. On a pgxdriver the relay also listens with PostgreSQL
// LISTEN/NOTIFY and wakes when a writer in any process ran
// pgxdriver.Notify (or sqldriver.Notify) in its transaction; that NOTIFY
// is opt-in because PostgreSQL serialises the commits of notifying
// transactions.
//
// # Per-key order
//
// Events of an ordered event type (outbox.EventType.Ordered; types the
// relay does not know are ordered) with the same key (biz_id) are published
// in id order, across retries and instances: a row is claimed only when
// every older unsent row of its key is sent or claimed in the same batch,
// and within a batch a key's rows are published one after another, stopping
// at the key's first failure (the rest of that key is released unpublished).
// A key whose oldest event is retrying or FAILED holds back that key only;
// other keys keep flowing and are published concurrently (Concurrency; a
// publish running eight times the typical one, at most SlowPublish, gives
// its slot to another key). With Hedge, a publish that runs past
// HedgeAfter is sent again beside itself (up to MaxHedges times,
// throttled), and the first call to succeed lets its key go on: a
// stalled broker call then holds its key back for about HedgeAfter, at
// the price of a duplicate message when more than one call succeeds.
// A hot key is not limited to one event per poll. Pipelining keeps this:
// a key's rows stay leased until their results are recorded, and no claim
// leases a row while an older unsent row of its key is leased.
//
// The guarantee holds when the ids of one key are committed in id order,
// which is the case when the business transaction locks the aggregate row
// (e.g. SELECT ... FOR UPDATE on the order) before inserting its event. Two
// transactions that insert events of the same key without such a lock may
// commit out of id order, and the relay may publish the later id first.
//
// # Failures
//
// A failed publish increments retry_count, stores last_error (at most
// 2 KB) and sets next_retry_time = now + Backoff(retry_count); when
// retry_count reaches MaxAttempts the row becomes FAILED (status 2). FAILED
// rows stay until an operator requeues them (Relay.Requeue) and are listed
// by Relay.ListFailed.
//
// A publish cut off by the relay itself (shutdown, the lease deadline,
// PublishTimeout) is not charged: the row is released as it was. A broker
// outage is not charged either: when every publish of a batch fails across
// at least two keys, a circuit breaker releases the rows uncharged and
// pauses claiming, probing with one row per pause (BreakerBackoff) until a
// publish succeeds. A single failing key never opens it.
//
// Database errors are the relay's, not the rows': nothing is charged, and
// Run backs off (PollInterval, at least 100 ms, doubling to
// DatabaseBackoffMax, jittered, reset by the first successful poll),
// whether or not the breaker is open, logging each failed poll once.
// Errors that waiting cannot mend (a missing table or column, a missing
// privilege, a read-only database) are worded with what to do; a missing
// table or privilege found at start (Run probes the table before its first
// poll) ends Run with the error.
//
// # Leases
//
// The relay extends the lease of every row it holds (publishing, or
// published and waiting to be recorded) every LeaseDuration/3, in one
// statement, so slow publishers do not let it lapse. When the lease
// cannot be extended, the batch stops a margin before the lease lapses;
// PublishTimeout bounds a batch in any case. Broker clients often ignore
// the message context, so bound their own timeouts (natsjs
// PublishTimeout, the kafka package's producer timeouts).
package relay
