-- Every statement outboxgen's runtime sends to MySQL 8.0+ and MariaDB 10.6+.
--
-- Package runtime/dialect embeds this file, finds each statement by its
-- "-- name:" line and replaces the markers (see postgres.sql for the list).
-- sqlc checks every statement as written here against schema/mysql.sql
-- (sqlc compile -f runtime/dialect/sql/sqlc.yaml). Time always comes from
-- the database clock (CURRENT_TIMESTAMP(6)); durations are bound as
-- microseconds.
--
-- Affected-row counts are MySQL's defaults (1 inserted, 2 updated, 0
-- unchanged): a DSN with clientFoundRows=true breaks the duplicate
-- detection of OutboxInsertEventIfAbsent and InboxRecord.

-- MySQL has no ON CONFLICT; INSERT IGNORE would also swallow unrelated
-- errors (truncation, bad JSON), so a no-op update it is.
-- name: OutboxInsertEvent :exec
INSERT INTO /* TEMPLATE: outbox */outbox_event (event_id, biz_type, biz_id, topic, payload_version, payload, headers)
VALUES (sqlc.arg(event_id), sqlc.arg(biz_type), sqlc.arg(biz_id), sqlc.arg(topic), sqlc.arg(payload_version), sqlc.arg(payload), sqlc.arg(headers));

-- name: OutboxInsertEventIfAbsent :exec
INSERT INTO /* TEMPLATE: outbox */outbox_event (event_id, biz_type, biz_id, topic, payload_version, payload, headers)
VALUES (sqlc.arg(event_id), sqlc.arg(biz_type), sqlc.arg(biz_id), sqlc.arg(topic), sqlc.arg(payload_version), sqlc.arg(payload), sqlc.arg(headers))
ON DUPLICATE KEY UPDATE id = id;

-- name: OutboxEventIdentity :one
SELECT biz_type, biz_id, topic
FROM /* TEMPLATE: outbox */outbox_event
WHERE event_id = sqlc.arg(event_id);

-- "status IN (0, 2)" rather than "status <> 1" (they are the same: the
-- status is 0, 1 or 2): with two equal values MySQL can read
-- (biz_id, status, id) as two ranges bounded by id, where a range on
-- status reads every pending row of the key before the id bound.
-- MySQL has no UPDATE ... RETURNING: the claim is a transaction of
-- RelayClaim (a window of due candidates in due order, through the due
-- index, (status, next_retry_time, id, biz_id) from schema version 3 on),
-- RelayClaimLock (lock them),
-- RelayClaimBlocked (the locked ids an older unlocked row of their key
-- blocks, and which of them to hold; skipped when RelayClaimLock found
-- every row its key's front), RelayClaimLease and RelayClaimHold (see
-- postgres.sql).
-- RelayClaim is rendered without the locking section, the window read
-- without locks (ClaimCandidates, twice the limit, then RelayClaimLock by
-- id), and with it, the locking window a claim falls back to when other
-- claims hold too many of those candidates (ClaimWindow); each plain and
-- overdue, and each with and without the keys passed over (skip_on).
-- All return each candidate's key too (dialect.FreeToLease). InnoDB: a
-- READ COMMITTED locking read of the due index looks up the clustered
-- record of every delete-marked entry it passes, and each row sent since
-- the last purge left one at the index's front: measured on MariaDB 10.11
-- draining a backlog, the locking window grew by 2 pages per row sent
-- until purge ran (up to 16k pages, 7 ms, per claim); read without locks
-- it stays near 3k pages, and RelayClaimLock reads about 600.
-- FORCE INDEX names the index MariaDB 10.11 picks anyway (for ORDER BY
-- ... LIMIT): picked that way, without the hint, it checks the keys
-- passed over (skip_on) only after reading each row, not in the index
-- (EXPLAIN: "Using where", not "Using index condition").
-- name: RelayClaim :many
SELECT c.id, c.biz_id
FROM /* TEMPLATE: outbox */outbox_event c FORCE INDEX (/* TEMPLATE: due_index */outbox_event_due_idx)
WHERE c.status = 0
  AND c.next_retry_time <= CURRENT_TIMESTAMP(6)
  AND (c.lease_expires_at IS NULL OR c.lease_expires_at < CURRENT_TIMESTAMP(6))
  -- Not of a key the claiming relay is publishing rows of (SkipKeys): a
  -- row of such a key waits behind that row and cannot be leased. With
  -- biz_id in the due index (schema version 3), index condition pushdown
  -- drops them from the index entry alone: MariaDB 10.11, a key with
  -- 10,000 rows waiting, 2.0 ms and 200 rows read per window against
  -- 16.7 ms and 10,200, each a clustered-record read and the subqueries
  -- below.
  /* IF skip_on */AND c.biz_id NOT IN (sqlc.slice(skip)) /* END */
  -- Not behind a row of its key another instance is publishing: it
  -- could not be leased, and would take a place in the window of every
  -- claim until that row is sent. Two O(1) reads of the front of
  -- (biz_id, 0, id), the key's oldest pending row: its id alone, read
  -- from the index (c is its key's front: the common case, and a read
  -- without the clustered record, 2 pages instead of 20 on MariaDB
  -- 10.11: 1.1 ms against 2.4 ms for 200 candidates on a table at rest),
  -- then, only when c is not the front, the front's lease. FAILED rows
  -- are never leased, and a row behind one is held by
  -- RelayClaimBlocked. With status IN (0, 2)
  -- MariaDB read the whole key: 48 ms against 5 ms per claim with 1,000
  -- rows per key; the bound f.id < c.id stays out of the subqueries,
  -- where MariaDB does not read it as a range and, for a c that is its
  -- key's front, scanned the key. Neither subquery names c.id at all:
  -- naming only c.biz_id lets MariaDB's subquery cache read each key's
  -- front once per statement, not once per candidate. That matters when
  -- a backlog has few keys: until InnoDB's purge catches up, each read
  -- of a key's front passes the delete-marked index entries of every row
  -- of the key sent since, each checked against its clustered record.
  -- With the second subquery comparing f.id < c.id itself, a 30,000-row
  -- drain of 10 keys spent 8.3 of its 10.8 s in this statement (26.6 ms
  -- a window, up to 617 ms), and drained 2.2x faster without.
  AND (/* IF unordered */c.biz_type IN (sqlc.slice(unordered)) OR /* END */COALESCE((
    SELECT f.id
    FROM /* TEMPLATE: outbox */outbox_event f FORCE INDEX (/* TEMPLATE: key_index */outbox_event_biz_id_idx)
    WHERE f.biz_id = c.biz_id
      AND f.status = 0
      /* IF unordered */AND f.biz_type NOT IN (sqlc.slice(unordered)) /* END */
    ORDER BY f.id
    LIMIT 1), c.id) = c.id
    -- The front's id when its lease runs: c is behind it if that is older.
    OR COALESCE((
    SELECT CASE WHEN f.lease_expires_at >= CURRENT_TIMESTAMP(6) THEN f.id END
    FROM /* TEMPLATE: outbox */outbox_event f FORCE INDEX (/* TEMPLATE: key_index */outbox_event_biz_id_idx)
    WHERE f.biz_id = c.biz_id
      AND f.status = 0
      /* IF unordered */AND f.biz_type NOT IN (sqlc.slice(unordered)) /* END */
    ORDER BY f.id
    LIMIT 1), c.id) >= c.id)
  /* IF overdue_on */AND c.created_at <= CURRENT_TIMESTAMP(6) - INTERVAL sqlc.arg(overdue) MICROSECOND /* END */
ORDER BY c.next_retry_time, c.id
LIMIT /* ARG: max_rows */?
/* IF locking */FOR UPDATE SKIP LOCKED /* END */;

-- Lock up to max_rows of the candidates ids, oldest first, that are
-- still due and unleased (read again under the lock: another claim may
-- have leased them since), through the primary key. Rows another claim
-- holds are skipped, as in the locking RelayClaim; ORDER BY id lets the
-- read stop at max_rows, so no extra row stays locked. Each row comes
-- with two reads RelayClaimBlocked would make, from the front of
-- (biz_id, status, id), taking no locks: outside_front, its key's oldest
-- pending row that is not among ids (its own id when there is none, or
-- its type is unordered), and failed_before, whether an older row of its
-- key is FAILED. When no locked row has a pending row of its key outside
-- ids before it, none a FAILED one, and every candidate of its key older
-- than it is locked too (dialect.FreeToLease; the usual case while a
-- backlog drains, also when a key has several rows in the batch), the
-- claim leases them without RelayClaimBlocked: one statement less per
-- batch. Both subqueries name only c.biz_id, so MariaDB's subquery cache
-- reads them once per key. (The nearest older pending row would tell
-- more, but MariaDB cannot read the bound p.id < c.id of a subquery as a
-- range: it read every pending row of the key, 2,000 rows per claim.)
-- name: RelayClaimLock :many
SELECT c.id, c.event_id, c.biz_type, c.biz_id, c.topic, c.payload_version, c.payload, c.headers, c.retry_count, c.created_at,
    CASE WHEN /* IF unordered */c.biz_type IN (sqlc.slice(unordered)) OR /* END */FALSE THEN c.id ELSE COALESCE((
        SELECT f.id
        FROM /* TEMPLATE: outbox */outbox_event f FORCE INDEX (/* TEMPLATE: key_index */outbox_event_biz_id_idx)
        WHERE f.biz_id = c.biz_id
          AND f.status = 0
          /* IF unordered */AND f.biz_type NOT IN (sqlc.slice(unordered)) /* END */
          AND f.id NOT IN (sqlc.slice(ids))
        ORDER BY f.id
        LIMIT 1), c.id) END AS outside_front,
    CASE WHEN /* IF unordered */c.biz_type IN (sqlc.slice(unordered)) OR /* END */FALSE THEN 0 ELSE COALESCE((
        SELECT o2.id
        FROM /* TEMPLATE: outbox */outbox_event o2 FORCE INDEX (/* TEMPLATE: key_index */outbox_event_biz_id_idx)
        WHERE o2.biz_id = c.biz_id
          AND o2.status = 2
          /* IF unordered */AND o2.biz_type NOT IN (sqlc.slice(unordered)) /* END */
        ORDER BY o2.id
        LIMIT 1), c.id) < c.id END AS failed_before
FROM /* TEMPLATE: outbox */outbox_event c
WHERE c.id IN (sqlc.slice(ids))
  AND c.status = 0
  AND c.next_retry_time <= CURRENT_TIMESTAMP(6)
  AND (c.lease_expires_at IS NULL OR c.lease_expires_at < CURRENT_TIMESTAMP(6))
ORDER BY c.id
LIMIT /* ARG: max_rows */?
FOR UPDATE SKIP LOCKED;

-- The locked ids an older unsent row of their key outside ids blocks
-- (the key's oldest pending row outside ids, or its oldest FAILED row, is
-- older: two reads from the front of (biz_id, status, id), each stopping
-- at its first row, where an EXISTS bounded by o.id < c.id read every
-- pending row of the key in MariaDB, about 9 ms per claim at 1,000 rows
-- per key), each with hold_until: NULL (leave it alone), or the next_retry_time to
-- give it (RelayClaimHold), from the nearest older unsent row of its key
-- outside ids (see postgres.sql): the larger of the nearest pending and
-- the nearest FAILED one, each a backward read of the (biz_id, status, id)
-- index (one read of both statuses could not use its order; ORDER BY ...
-- DESC LIMIT 1, since MariaDB reads the whole range for a MAX() with a
-- NOT IN list: 298 ms against 2.8 ms with 20k rows of one key).
-- name: RelayClaimBlocked :many
SELECT c.id, (
    SELECT CASE WHEN p.status = 2 THEN CURRENT_TIMESTAMP(6) + INTERVAL sqlc.arg(hold) MICROSECOND
                WHEN p.lease_expires_at >= CURRENT_TIMESTAMP(6) THEN NULL
                WHEN p.next_retry_time > c.next_retry_time THEN p.next_retry_time END
    FROM /* TEMPLATE: outbox */outbox_event p
    WHERE p.id = GREATEST(
        COALESCE((SELECT p0.id
                  FROM /* TEMPLATE: outbox */outbox_event p0 FORCE INDEX (/* TEMPLATE: key_index */outbox_event_biz_id_idx)
                  WHERE p0.biz_id = c.biz_id
                    AND p0.status = 0
                    AND p0.id < c.id
                    /* IF unordered */AND p0.biz_type NOT IN (sqlc.slice(unordered)) /* END */
                    AND p0.id NOT IN (sqlc.slice(ids))
                  ORDER BY p0.id DESC
                  LIMIT 1), 0),
        COALESCE((SELECT p2.id
                  FROM /* TEMPLATE: outbox */outbox_event p2 FORCE INDEX (/* TEMPLATE: key_index */outbox_event_biz_id_idx)
                  WHERE p2.biz_id = c.biz_id
                    AND p2.status = 2
                    AND p2.id < c.id
                    /* IF unordered */AND p2.biz_type NOT IN (sqlc.slice(unordered)) /* END */
                  ORDER BY p2.id DESC
                  LIMIT 1), 0))) AS hold_until
FROM /* TEMPLATE: outbox */outbox_event c
WHERE c.id IN (sqlc.slice(ids))
  /* IF unordered */AND c.biz_type NOT IN (sqlc.slice(unordered)) /* END */
  AND (COALESCE((
        SELECT o.id
        FROM /* TEMPLATE: outbox */outbox_event o FORCE INDEX (/* TEMPLATE: key_index */outbox_event_biz_id_idx)
        WHERE o.biz_id = c.biz_id
          AND o.status = 0
          /* IF unordered */AND o.biz_type NOT IN (sqlc.slice(unordered)) /* END */
          AND o.id NOT IN (sqlc.slice(ids))
        ORDER BY o.id
        LIMIT 1), c.id) < c.id
    OR COALESCE((
        SELECT o2.id
        FROM /* TEMPLATE: outbox */outbox_event o2 FORCE INDEX (/* TEMPLATE: key_index */outbox_event_biz_id_idx)
        WHERE o2.biz_id = c.biz_id
          AND o2.status = 2
          /* IF unordered */AND o2.biz_type NOT IN (sqlc.slice(unordered)) /* END */
        ORDER BY o2.id
        LIMIT 1), c.id) < c.id);

-- The ids RelayClaimBlocked returned, each given its own hold_until
-- (bound back as it was read, in the order of ids) in one statement:
-- ELT(FIELD(id, ids), hold_until) is the value of id's place. A row
-- behind a key's backing-off row is held until that row's next attempt,
-- so in a window of many keys nearly every held row has a value of its
-- own: one statement per value cost a round trip per held row (MariaDB
-- 10.11, a backlog with one publish in ten failing: 35 statements and
-- about 9 ms per claim).
-- name: RelayClaimHold :execrows
UPDATE /* TEMPLATE: outbox */outbox_event
SET lease_owner = CASE WHEN CAST(ELT(FIELD(id, sqlc.slice(ids)), sqlc.slice(hold_until)) AS DATETIME(6)) > CURRENT_TIMESTAMP(6) THEN '~held' END,
    lease_expires_at = NULL,
    next_retry_time = CAST(ELT(FIELD(id, sqlc.slice(ids)), sqlc.slice(hold_until)) AS DATETIME(6)),
    updated_at = CURRENT_TIMESTAMP(6)
WHERE id IN (sqlc.slice(ids));

-- name: RelayClaimLease :execrows
UPDATE /* TEMPLATE: outbox */outbox_event
SET lease_owner = sqlc.arg(owner), lease_expires_at = CURRENT_TIMESTAMP(6) + INTERVAL sqlc.arg(lease) MICROSECOND, updated_at = CURRENT_TIMESTAMP(6)
WHERE id IN (sqlc.slice(ids));

-- The pending rows of the keys of ids, locked (RelayQueries.LockKeys):
-- a requeue waits here for the claims that locked one of them, then
-- releases what they held.
-- name: RelayLockKeys :many
SELECT k.id
FROM /* TEMPLATE: outbox */outbox_event k
WHERE k.biz_id IN (SELECT h.biz_id FROM /* TEMPLATE: outbox */outbox_event h WHERE h.id IN (sqlc.slice(ids)))
  AND k.status = 0
FOR UPDATE;

-- The derived table lets MySQL read the table it updates.
-- name: RelayReleaseHeld :execrows
UPDATE /* TEMPLATE: outbox */outbox_event
SET lease_owner = NULL, next_retry_time = CURRENT_TIMESTAMP(6), updated_at = CURRENT_TIMESTAMP(6)
WHERE biz_id IN (SELECT k.biz_id FROM (SELECT h.biz_id FROM /* TEMPLATE: outbox */outbox_event h WHERE h.id IN (sqlc.slice(ids))) k)
  AND status = 0
  AND lease_owner = '~held';

-- name: RelayMarkSent :execrows
UPDATE /* TEMPLATE: outbox */outbox_event
SET status = 1, sent_at = CURRENT_TIMESTAMP(6), lease_owner = NULL, lease_expires_at = NULL, updated_at = CURRENT_TIMESTAMP(6)
WHERE id IN (sqlc.slice(ids))
  AND lease_owner = sqlc.arg(owner)
  AND status = 0;

-- status is assigned before retry_count: MySQL evaluates SET assignments
-- left to right with already-updated values, PostgreSQL and SQLite with the
-- old ones; in this order all three agree.
-- name: RelayMarkRetry :execrows
UPDATE /* TEMPLATE: outbox */outbox_event
SET status = CASE WHEN retry_count + 1 >= sqlc.arg(max_attempts) THEN 2 ELSE 0 END,
    retry_count = retry_count + 1,
    last_error = sqlc.arg(last_error),
    next_retry_time = CURRENT_TIMESTAMP(6) + INTERVAL sqlc.arg(delay) MICROSECOND,
    lease_owner = NULL, lease_expires_at = NULL, updated_at = CURRENT_TIMESTAMP(6)
WHERE id = sqlc.arg(id)
  AND lease_owner = sqlc.arg(owner)
  AND status = 0;

-- RelayMarkRetry of several rows, each with its own error and delay
-- (lists in the order of ids; ELT(FIELD(id, ids), ...) is the value of
-- id's place): one round trip for a batch's failures, not one per
-- failure.
-- name: RelayMarkRetryEach :execrows
UPDATE /* TEMPLATE: outbox */outbox_event
SET status = CASE WHEN retry_count + 1 >= sqlc.arg(max_attempts) THEN 2 ELSE 0 END,
    retry_count = retry_count + 1,
    last_error = ELT(FIELD(id, sqlc.slice(ids)), sqlc.slice(last_error)),
    next_retry_time = CURRENT_TIMESTAMP(6) + INTERVAL CAST(ELT(FIELD(id, sqlc.slice(ids)), sqlc.slice(delay)) AS SIGNED) MICROSECOND,
    lease_owner = NULL, lease_expires_at = NULL, updated_at = CURRENT_TIMESTAMP(6)
WHERE id IN (sqlc.slice(ids))
  AND lease_owner = sqlc.arg(owner)
  AND status = 0;

-- name: RelayRelease :execrows
UPDATE /* TEMPLATE: outbox */outbox_event
SET lease_owner = NULL, lease_expires_at = NULL, updated_at = CURRENT_TIMESTAMP(6)
WHERE id IN (sqlc.slice(ids))
  AND lease_owner = sqlc.arg(owner)
  AND status = 0;

-- name: RelayExtendLease :execrows
UPDATE /* TEMPLATE: outbox */outbox_event
SET lease_expires_at = CURRENT_TIMESTAMP(6) + INTERVAL sqlc.arg(lease) MICROSECOND, updated_at = CURRENT_TIMESTAMP(6)
WHERE id IN (sqlc.slice(ids))
  AND lease_owner = sqlc.arg(owner)
  AND status = 0;

-- name: RelayRequeue :execrows
UPDATE /* TEMPLATE: outbox */outbox_event
SET status = 0, retry_count = 0, next_retry_time = CURRENT_TIMESTAMP(6), lease_owner = NULL, lease_expires_at = NULL, updated_at = CURRENT_TIMESTAMP(6)
WHERE id IN (sqlc.slice(ids))
  AND status = 2;

-- No ON CONFLICT; INSERT IGNORE would also turn a too-long event id into a
-- truncated (and possibly colliding) one, so a no-op update.
-- name: InboxRecord :execrows
INSERT INTO /* TEMPLATE: inbox */outbox_inbox (consumer, event_id, biz_type, biz_id)
VALUES (sqlc.arg(consumer), sqlc.arg(event_id), sqlc.arg(biz_type), sqlc.arg(biz_id))
ON DUPLICATE KEY UPDATE consumer = consumer;

-- A locking read, so that it sees the row the INSERT found even when a
-- REPEATABLE READ snapshot predates it.
-- name: InboxRecorded :one
SELECT COALESCE(biz_type, ''), COALESCE(biz_id, '')
FROM /* TEMPLATE: inbox */outbox_inbox
WHERE consumer = sqlc.arg(consumer)
  AND event_id = sqlc.arg(event_id)
LOCK IN SHARE MODE;

-- updated_at has ON UPDATE CURRENT_TIMESTAMP(6): it moves only when
-- last_seq does. An older or equal sequence changes nothing: 0 rows.
-- name: InboxGuard :execrows
INSERT INTO /* TEMPLATE: inbox_key */outbox_inbox_key (consumer, biz_type, biz_id, last_seq)
VALUES (sqlc.arg(consumer), sqlc.arg(biz_type), sqlc.arg(biz_id), sqlc.arg(last_seq))
ON DUPLICATE KEY UPDATE last_seq = IF(VALUES(last_seq) > last_seq, VALUES(last_seq), last_seq);

-- A duplicate delivery (InboxRecord changed nothing): counted per consumer
-- and event, in the delivery's transaction.
-- name: InboxRecordDuplicate :exec
INSERT INTO /* TEMPLATE: inbox_duplicate */outbox_inbox_duplicate (consumer, event_id, biz_type, biz_id)
VALUES (sqlc.arg(consumer), sqlc.arg(event_id), sqlc.arg(biz_type), sqlc.arg(biz_id))
ON DUPLICATE KEY UPDATE count = count + 1, last_seen_at = CURRENT_TIMESTAMP(6);

-- TIMESTAMPDIFF is an integer; the division makes it DECIMAL.
-- name: OpsStats :one
SELECT COUNT(*),
    COALESCE(TIMESTAMPDIFF(MICROSECOND, MIN(created_at), CURRENT_TIMESTAMP(6)) / 1000000.0, 0),
    COALESCE(SUM(CASE WHEN created_at < CURRENT_TIMESTAMP(6) - INTERVAL sqlc.arg(stale_after) MICROSECOND THEN 1 ELSE 0 END), 0),
    (SELECT COUNT(*) FROM /* TEMPLATE: outbox */outbox_event WHERE status = 2),
    COALESCE(SUM(CASE WHEN lease_expires_at < CURRENT_TIMESTAMP(6) THEN 1 ELSE 0 END), 0)
FROM /* TEMPLATE: outbox */outbox_event
WHERE status = 0;

-- The janitor's bound (OpsQueries.SentBound): the ends of the primary key,
-- then, per step of a binary search, the first row at or after from_id and
-- whether it was created (or sent: a clock stepped back) before the
-- cutoff, or created in the future (a clock stepped forward, a session
-- not in UTC): such a row must not end the search. A row sent before the cutoff was created before it, and ids grow
-- with creation, so the batches below
-- read no row past the last one created before the cutoff: without the
-- bound, the batch that comes back short read every sent row kept for the
-- retention period (the whole table) to find none.
-- name: OpsIDRange :one
SELECT COALESCE(MIN(id), 0), COALESCE(MAX(id), 0)
FROM /* TEMPLATE: outbox */outbox_event;

-- name: OpsBoundProbe :one
SELECT id, CASE WHEN LEAST(created_at, COALESCE(sent_at, created_at)) < CURRENT_TIMESTAMP(6) - INTERVAL sqlc.arg(older_than) MICROSECOND OR created_at > CURRENT_TIMESTAMP(6) THEN 1 ELSE 0 END
FROM /* TEMPLATE: outbox */outbox_event
WHERE id >= sqlc.arg(from_id)
ORDER BY id
LIMIT 1;

-- ORDER BY id LIMIT walks the (status, id) index, up to max_id.
-- name: OpsDeleteSent :execrows
DELETE FROM /* TEMPLATE: outbox */outbox_event
WHERE status = 1
  AND sent_at < CURRENT_TIMESTAMP(6) - INTERVAL sqlc.arg(older_than) MICROSECOND
  AND id <= sqlc.arg(max_id)
ORDER BY id
LIMIT /* ARG: max_rows */?;

-- name: OpsDeleteInbox :execrows
DELETE FROM /* TEMPLATE: inbox */outbox_inbox
WHERE processed_at < CURRENT_TIMESTAMP(6) - INTERVAL sqlc.arg(older_than) MICROSECOND
ORDER BY processed_at
LIMIT /* ARG: max_rows */?;

-- name: OpsDeleteInboxDuplicates :execrows
DELETE FROM /* TEMPLATE: inbox_duplicate */outbox_inbox_duplicate
WHERE last_seen_at < CURRENT_TIMESTAMP(6) - INTERVAL sqlc.arg(older_than) MICROSECOND
ORDER BY last_seen_at
LIMIT /* ARG: max_rows */?;

-- The archive is a READ COMMITTED transaction of OpsArchivePick (lock the
-- batch), OpsArchiveCopy and OpsArchiveDelete.
-- name: OpsArchivePick :many
SELECT id
FROM /* TEMPLATE: outbox */outbox_event
WHERE status = 1
  AND sent_at < CURRENT_TIMESTAMP(6) - INTERVAL sqlc.arg(older_than) MICROSECOND
  AND id <= sqlc.arg(max_id)
ORDER BY id
LIMIT /* ARG: max_rows */?
FOR UPDATE SKIP LOCKED;

-- outbox.id, not id: both tables have an id (sqlc rejects the bare name as
-- ambiguous, though MySQL resolves it to the FROM table).
-- name: OpsArchiveCopy :execrows
INSERT INTO /* TEMPLATE: archive */outbox_archive (id, event_id, biz_type, biz_id, topic, payload_version, payload,
    headers, status, retry_count, next_retry_time, lease_owner, lease_expires_at, last_error,
    created_at, updated_at, sent_at)
SELECT id, event_id, biz_type, biz_id, topic, payload_version, payload, headers, status,
    retry_count, next_retry_time, lease_owner, lease_expires_at, last_error, created_at, updated_at,
    sent_at
FROM /* TEMPLATE: outbox */outbox_event
WHERE /* TEMPLATE: outbox */outbox_event.id IN (sqlc.slice(ids));

-- name: OpsArchiveDelete :execrows
DELETE FROM /* TEMPLATE: outbox */outbox_event
WHERE id IN (sqlc.slice(ids))
  AND status = 1;

-- Operator queries (see postgres.sql).

-- name: AdminPendingStates :one
SELECT COALESCE(SUM(CASE WHEN retry_count > 0 AND next_retry_time > CURRENT_TIMESTAMP(6) THEN 1 ELSE 0 END), 0),
    COALESCE(SUM(CASE WHEN lease_expires_at >= CURRENT_TIMESTAMP(6) THEN 1 ELSE 0 END), 0),
    COUNT(DISTINCT CASE WHEN lease_expires_at >= CURRENT_TIMESTAMP(6) THEN lease_owner END)
FROM /* TEMPLATE: outbox */outbox_event
WHERE status = 0;

-- name: AdminFailedGroups :many
SELECT biz_type, topic, COUNT(*), MIN(id), MAX(updated_at)
FROM /* TEMPLATE: outbox */outbox_event
WHERE status = 2
GROUP BY biz_type, topic
ORDER BY COUNT(*) DESC, biz_type, topic
LIMIT /* ARG: max_rows */?;

-- name: AdminHeldBack :one
SELECT COUNT(DISTINCT h.biz_id), COUNT(o.id)
FROM (
    SELECT x.biz_id, MIN(x.id) AS head_id
    FROM (
        SELECT f.biz_id, f.id FROM /* TEMPLATE: outbox */outbox_event f
        WHERE f.status = 2 /* IF unordered */AND f.biz_type NOT IN (sqlc.slice(unordered)) /* END */
        UNION ALL
        SELECT b.biz_id, b.id FROM /* TEMPLATE: outbox */outbox_event b
        WHERE b.status = 0 AND b.next_retry_time > CURRENT_TIMESTAMP(6) AND b.retry_count > 0
          /* IF unordered */AND b.biz_type NOT IN (sqlc.slice(unordered)) /* END */
    ) x
    GROUP BY x.biz_id
) h
JOIN /* TEMPLATE: outbox */outbox_event o ON o.biz_id = h.biz_id AND o.status = 0 AND o.id > h.head_id
/* IF unordered */WHERE o.biz_type NOT IN (sqlc.slice(unordered)) /* END */;

-- Sent rows kept (the janitor deletes them after retention). The only
-- count that reads the sent rows; status measures it (BenchmarkStatus).
-- name: AdminCountSent :one
SELECT COUNT(*) FROM /* TEMPLATE: outbox */outbox_event WHERE status = 1;

-- name: AdminMaxID :one
SELECT COALESCE(MAX(id), 0) FROM /* TEMPLATE: outbox */outbox_event;

-- FORCE INDEX (PRIMARY): the id range read in primary-key order. Left to
-- itself MariaDB reads it through the (status, id) index and looks every
-- row up in the primary key: 245 ms against 45 ms for 100,000 rows
-- (BenchmarkConsole -console.explain in runtime/admin).
-- name: AdminSentPerMinute :many
SELECT FLOOR(TIMESTAMPDIFF(SECOND, sent_at, CURRENT_TIMESTAMP(6)) / 60) AS minute_ago, COUNT(*),
    AVG(TIMESTAMPDIFF(MICROSECOND, created_at, sent_at)) / 1000000.0, MAX(TIMESTAMPDIFF(MICROSECOND, created_at, sent_at)) / 1000000.0
FROM /* TEMPLATE: outbox */outbox_event FORCE INDEX (PRIMARY)
WHERE id > sqlc.arg(from_id)
  AND status = 1
  AND sent_at >= CURRENT_TIMESTAMP(6) - INTERVAL sqlc.arg(window_secs) MICROSECOND
GROUP BY minute_ago
ORDER BY minute_ago;

-- name: AdminFindEvents :many
SELECT id, event_id, biz_type, biz_id, topic, payload_version, status, retry_count, next_retry_time,
    lease_owner, lease_expires_at, last_error, created_at, updated_at, sent_at
FROM /* TEMPLATE: outbox */outbox_event
WHERE id > sqlc.arg(after_id)
  /* IF status_pending */AND status = 0 /* END */
  /* IF status_sent */AND status = 1 /* END */
  /* IF status_failed */AND status = 2 /* END */
  /* IF has_to_id */AND id <= sqlc.arg(to_id) /* END */
  /* IF has_ids */AND id IN (sqlc.slice(ids)) /* END */
  /* IF has_event_ids */AND event_id IN (sqlc.slice(event_ids)) /* END */
  /* IF has_types */AND biz_type IN (sqlc.slice(types)) /* END */
  /* IF has_keys */AND biz_id IN (sqlc.slice(biz_ids)) /* END */
  /* IF has_topics */AND topic IN (sqlc.slice(topics)) /* END */
  /* IF has_max_age */AND created_at >= CURRENT_TIMESTAMP(6) - INTERVAL sqlc.arg(max_age) MICROSECOND /* END */
  /* IF has_min_age */AND created_at <= CURRENT_TIMESTAMP(6) - INTERVAL sqlc.arg(min_age) MICROSECOND /* END */
  /* IF has_error */AND LOCATE(sqlc.arg(error_sub), LOWER(last_error)) > 0 /* END */
ORDER BY id
LIMIT /* ARG: max_rows */?;

-- name: AdminGetEvent :one
SELECT id, event_id, biz_type, biz_id, topic, payload_version, status, retry_count, next_retry_time,
    lease_owner, lease_expires_at, last_error, created_at, updated_at, sent_at, payload, headers
FROM /* TEMPLATE: outbox */outbox_event
WHERE id = sqlc.arg(id);

-- name: AdminGetEventByEventID :one
SELECT id, event_id, biz_type, biz_id, topic, payload_version, status, retry_count, next_retry_time,
    lease_owner, lease_expires_at, last_error, created_at, updated_at, sent_at, payload, headers
FROM /* TEMPLATE: outbox */outbox_event
WHERE event_id = sqlc.arg(event_id);

-- name: AdminReplay :execrows
UPDATE /* TEMPLATE: outbox */outbox_event
SET status = 0, retry_count = 0, next_retry_time = CURRENT_TIMESTAMP(6), sent_at = NULL, last_error = NULL,
    lease_owner = NULL, lease_expires_at = NULL, updated_at = CURRENT_TIMESTAMP(6)
WHERE id IN (sqlc.slice(ids))
  AND status = 1;

-- name: AdminFindInbox :many
SELECT consumer, event_id, COALESCE(biz_type, ''), COALESCE(biz_id, ''), processed_at
FROM /* TEMPLATE: inbox */outbox_inbox
WHERE consumer = sqlc.arg(consumer)
  AND event_id > sqlc.arg(after_event_id)
  /* IF has_event_ids */AND event_id IN (sqlc.slice(event_ids)) /* END */
  /* IF has_types */AND biz_type IN (sqlc.slice(types)) /* END */
  /* IF has_keys */AND biz_id IN (sqlc.slice(biz_ids)) /* END */
  /* IF has_max_age */AND processed_at >= CURRENT_TIMESTAMP(6) - INTERVAL sqlc.arg(max_age) MICROSECOND /* END */
  /* IF has_min_age */AND processed_at <= CURRENT_TIMESTAMP(6) - INTERVAL sqlc.arg(min_age) MICROSECOND /* END */
ORDER BY event_id
LIMIT /* ARG: max_rows */?;

-- name: AdminForgetInbox :execrows
DELETE FROM /* TEMPLATE: inbox */outbox_inbox
WHERE consumer = sqlc.arg(consumer)
  AND event_id IN (sqlc.slice(event_ids));

-- The console (runtime/admin: Relays, BlockedKeys, Delete, Inbox,
-- RecentDuplicates).

-- name: AdminLeases :many
SELECT lease_owner, COUNT(*), COALESCE(SUM(CASE WHEN lease_expires_at < CURRENT_TIMESTAMP(6) THEN 1 ELSE 0 END), 0),
    MIN(lease_expires_at), MAX(lease_expires_at), MIN(created_at)
FROM /* TEMPLATE: outbox */outbox_event
WHERE status = 0
  AND lease_owner IS NOT NULL
  AND lease_owner <> '~held'
GROUP BY lease_owner
ORDER BY COUNT(*) DESC, lease_owner
LIMIT /* ARG: max_rows */?;

-- name: AdminBlockedKeys :many
SELECT e.id, e.event_id, e.biz_type, e.biz_id, e.topic, e.payload_version, e.status, e.retry_count, e.next_retry_time,
    e.lease_owner, e.lease_expires_at, e.last_error, e.created_at, e.updated_at, e.sent_at, w.waiting, w.oldest_waiting
FROM (
    SELECT h.biz_id, h.head_id, COUNT(o.id) AS waiting, MIN(o.created_at) AS oldest_waiting
    FROM (
        SELECT x.biz_id, MIN(x.id) AS head_id
        FROM (
            SELECT f.biz_id, f.id FROM /* TEMPLATE: outbox */outbox_event f
            WHERE f.status = 2 AND f.biz_id > sqlc.arg(after_key) /* IF unordered */AND f.biz_type NOT IN (sqlc.slice(unordered)) /* END */
            UNION ALL
            SELECT b.biz_id, b.id FROM /* TEMPLATE: outbox */outbox_event b
            WHERE b.status = 0 AND b.next_retry_time > CURRENT_TIMESTAMP(6) AND b.retry_count > 0 AND b.biz_id > sqlc.arg(after_key)
              /* IF unordered */AND b.biz_type NOT IN (sqlc.slice(unordered)) /* END */
        ) x
        GROUP BY x.biz_id
    ) h
    JOIN /* TEMPLATE: outbox */outbox_event o ON o.biz_id = h.biz_id AND o.id > h.head_id AND o.status = 0
        /* IF unordered */AND o.biz_type NOT IN (sqlc.slice(unordered)) /* END */
    GROUP BY h.biz_id, h.head_id
    ORDER BY h.biz_id
    LIMIT /* ARG: max_rows */?
) w
JOIN /* TEMPLATE: outbox */outbox_event e ON e.id = w.head_id
ORDER BY w.biz_id;

-- name: AdminLockFailed :many
SELECT id
FROM /* TEMPLATE: outbox */outbox_event
WHERE id IN (sqlc.slice(ids))
  AND status = 2
ORDER BY id
FOR UPDATE;

-- name: AdminDeleteFailed :execrows
DELETE FROM /* TEMPLATE: outbox */outbox_event
WHERE id IN (sqlc.slice(ids))
  AND status = 2;

-- name: AdminInboxHandled :many
SELECT r.consumer, COUNT(*), MAX(r.processed_at)
FROM (
    SELECT consumer, processed_at
    FROM /* TEMPLATE: inbox */outbox_inbox
    WHERE processed_at >= CURRENT_TIMESTAMP(6) - INTERVAL sqlc.arg(window_secs) MICROSECOND
    ORDER BY processed_at DESC
    LIMIT /* ARG: scan_rows */?
) r
GROUP BY r.consumer
ORDER BY r.consumer;

-- name: AdminInboxDuplicates :many
SELECT r.consumer, COUNT(*), MAX(r.last_seen_at)
FROM (
    SELECT consumer, last_seen_at
    FROM /* TEMPLATE: inbox_duplicate */outbox_inbox_duplicate
    WHERE last_seen_at >= CURRENT_TIMESTAMP(6) - INTERVAL sqlc.arg(window_secs) MICROSECOND
    ORDER BY last_seen_at DESC
    LIMIT /* ARG: scan_rows */?
) r
GROUP BY r.consumer
ORDER BY r.consumer;

-- name: AdminRecentDuplicates :many
SELECT consumer, event_id, COALESCE(biz_type, ''), COALESCE(biz_id, ''), count, first_seen_at, last_seen_at
FROM /* TEMPLATE: inbox_duplicate */outbox_inbox_duplicate
WHERE consumer = sqlc.arg(consumer)
ORDER BY last_seen_at DESC
LIMIT /* ARG: max_rows */?;

-- The schema version (the start-up check, outboxgen migrate): the newest
-- migration recorded in the version table and the oldest version a
-- runtime must know to use the tables, as the text "version
-- compatible_from" ("0 0" for an empty table).
-- name: SchemaVersion :one
SELECT CONCAT(COALESCE(MAX(version), 0), ' ', COALESCE(MAX(compatible_from), 0))
FROM /* TEMPLATE: version */outbox_event_version;

-- name: SchemaVersions :many
SELECT version, compatible_from, applied_at
FROM /* TEMPLATE: version */outbox_event_version
ORDER BY version;

-- outboxgen migrate: one migrating session at a time per database and
-- version table (a named lock, released by MigrateUnlock or when the
-- session ends; the name is hashed: MySQL refuses lock names over 64
-- characters). GET_LOCK returns 1 when it got the lock, 0 after waiting
-- wait_seconds.
-- name: MigrateLock :one
SELECT GET_LOCK(CONCAT('outboxgen_migrate.', MD5(CONCAT(DATABASE(), '.', sqlc.arg(lock_name)))), sqlc.arg(wait_seconds));

-- name: MigrateUnlock :exec
SELECT RELEASE_LOCK(CONCAT('outboxgen_migrate.', MD5(CONCAT(DATABASE(), '.', sqlc.arg(lock_name)))));
