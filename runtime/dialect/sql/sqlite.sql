-- Every statement outboxgen's runtime sends to SQLite 3.35+.
--
-- Package runtime/dialect embeds this file, finds each statement by its
-- "-- name:" line and replaces the markers (see postgres.sql for the list).
-- sqlc prepares every statement as written here on an in-memory database
-- created from schema/sqlite.sql (sqlc compile -f runtime/dialect/sql/sqlc.yaml).
-- Time always comes from the database clock, as the text the DDL defaults
-- write (strftime('%Y-%m-%d %H:%M:%f', 'now')), so timestamps compare as
-- text; durations are bound as strftime modifiers ('1.500000 seconds').
-- SQLite has one writer and no SKIP LOCKED: the claim's prefilter alone
-- keeps per-key order.

-- name: OutboxInsertEvent :exec
INSERT INTO /* TEMPLATE: outbox */outbox_event (event_id, biz_type, biz_id, topic, payload_version, payload, headers)
VALUES (sqlc.arg(event_id), sqlc.arg(biz_type), sqlc.arg(biz_id), sqlc.arg(topic), sqlc.arg(payload_version), sqlc.arg(payload), sqlc.arg(headers));

-- name: OutboxInsertEventIfAbsent :exec
INSERT INTO /* TEMPLATE: outbox */outbox_event (event_id, biz_type, biz_id, topic, payload_version, payload, headers)
VALUES (sqlc.arg(event_id), sqlc.arg(biz_type), sqlc.arg(biz_id), sqlc.arg(topic), sqlc.arg(payload_version), sqlc.arg(payload), sqlc.arg(headers))
ON CONFLICT (event_id) DO NOTHING;

-- name: OutboxEventIdentity :one
SELECT biz_type, biz_id, topic
FROM /* TEMPLATE: outbox */outbox_event
WHERE event_id = sqlc.arg(event_id);

-- The claim is a transaction, as on MySQL (see mysql.sql): RelayClaim
-- reads a window of due candidates in due order (the due index),
-- RelayClaimBlocked finds those an older unsent row of their key outside
-- the window blocks (and which of them to hold), RelayClaimLease and
-- RelayClaimHold write. SQLite has one writer: the transaction (BEGIN
-- IMMEDIATE) holds the write lock throughout, so no SKIP LOCKED is needed.
-- The window is read by a no-op UPDATE (lease_owner = lease_owner) so
-- that the transaction takes SQLite's write lock with its first statement,
-- whatever the DSN's _txlock: a read first would fail to upgrade when
-- another connection writes (SQLITE_BUSY, no busy wait).
-- name: RelayClaim :many
UPDATE /* TEMPLATE: outbox */outbox_event
SET lease_owner = lease_owner
WHERE id IN (
    SELECT c.id
    FROM /* TEMPLATE: outbox */outbox_event c
    WHERE c.status = 0
      AND c.next_retry_time <= strftime('%Y-%m-%d %H:%M:%f', 'now')
      AND (c.lease_expires_at IS NULL OR c.lease_expires_at < strftime('%Y-%m-%d %H:%M:%f', 'now'))
      -- Not behind a row of its key another instance is publishing: it
      -- could not be leased, and would take a place in the window of every
      -- claim until that row is sent (one O(1) read: the key's oldest
      -- unsent row).
      AND (/* IF unordered */c.biz_type IN (sqlc.slice(unordered)) OR /* END */COALESCE((
        SELECT CASE WHEN f.lease_expires_at >= strftime('%Y-%m-%d %H:%M:%f', 'now') THEN 1 ELSE 0 END
        FROM /* TEMPLATE: outbox */outbox_event f
        WHERE f.biz_id = c.biz_id
          AND f.id < c.id
          AND f.status <> 1
          /* IF unordered */AND f.biz_type NOT IN (sqlc.slice(unordered)) /* END */
        ORDER BY f.id
        LIMIT 1), 0) = 0)
      /* IF overdue_on */AND c.created_at <= strftime('%Y-%m-%d %H:%M:%f', 'now', '-' || sqlc.arg(overdue)) /* END */
    ORDER BY c.next_retry_time, c.id
    LIMIT sqlc.arg(max_rows))
RETURNING id, event_id, biz_type, biz_id, topic, payload_version, payload, headers, retry_count, created_at;

-- name: RelayClaimBlocked :many
SELECT c.id, (
    SELECT CASE WHEN p.status = 2 THEN strftime('%Y-%m-%d %H:%M:%f', 'now', sqlc.arg(hold))
                WHEN p.lease_expires_at >= strftime('%Y-%m-%d %H:%M:%f', 'now') THEN NULL
                WHEN p.next_retry_time > c.next_retry_time THEN p.next_retry_time END
    FROM /* TEMPLATE: outbox */outbox_event p
    WHERE p.biz_id = c.biz_id
      AND p.id < c.id
      AND p.status <> 1
      /* IF unordered */AND p.biz_type NOT IN (sqlc.slice(unordered)) /* END */
      AND p.id NOT IN (sqlc.slice(ids))
    ORDER BY p.id DESC
    LIMIT 1) AS hold_until
FROM /* TEMPLATE: outbox */outbox_event c
WHERE c.id IN (sqlc.slice(ids))
  /* IF unordered */AND c.biz_type NOT IN (sqlc.slice(unordered)) /* END */
  AND EXISTS (
    SELECT 1
    FROM /* TEMPLATE: outbox */outbox_event o
    WHERE o.biz_id = c.biz_id
      AND o.id < c.id
      AND o.status <> 1
      /* IF unordered */AND o.biz_type NOT IN (sqlc.slice(unordered)) /* END */
      AND o.id NOT IN (sqlc.slice(ids)));

-- name: RelayClaimLease :execrows
UPDATE /* TEMPLATE: outbox */outbox_event
SET lease_owner = sqlc.arg(owner), lease_expires_at = strftime('%Y-%m-%d %H:%M:%f', 'now', sqlc.arg(lease)), updated_at = strftime('%Y-%m-%d %H:%M:%f', 'now')
WHERE id IN (sqlc.slice(ids));

-- The ids RelayClaimBlocked returned with this hold_until (bound back as
-- it was read).
-- name: RelayClaimHold :execrows
UPDATE /* TEMPLATE: outbox */outbox_event
SET lease_owner = CASE WHEN sqlc.arg(hold_until) > strftime('%Y-%m-%d %H:%M:%f', 'now') THEN '~held' END,
    lease_expires_at = NULL, next_retry_time = sqlc.arg(hold_until), updated_at = strftime('%Y-%m-%d %H:%M:%f', 'now')
WHERE id IN (sqlc.slice(ids));

-- name: RelayReleaseHeld :execrows
UPDATE /* TEMPLATE: outbox */outbox_event
SET lease_owner = NULL, next_retry_time = strftime('%Y-%m-%d %H:%M:%f', 'now'), updated_at = strftime('%Y-%m-%d %H:%M:%f', 'now')
WHERE biz_id IN (SELECT h.biz_id FROM /* TEMPLATE: outbox */outbox_event h WHERE h.id IN (sqlc.slice(ids)))
  AND status = 0
  AND lease_owner = '~held';

-- name: RelayMarkSent :execrows
UPDATE /* TEMPLATE: outbox */outbox_event
SET status = 1, sent_at = strftime('%Y-%m-%d %H:%M:%f', 'now'), lease_owner = NULL, lease_expires_at = NULL, updated_at = strftime('%Y-%m-%d %H:%M:%f', 'now')
WHERE id IN (sqlc.slice(ids))
  AND lease_owner = sqlc.arg(owner)
  AND status = 0;

-- status is assigned before retry_count (see the MySQL file).
-- name: RelayMarkRetry :execrows
UPDATE /* TEMPLATE: outbox */outbox_event
SET status = CASE WHEN retry_count + 1 >= sqlc.arg(max_attempts) THEN 2 ELSE 0 END,
    retry_count = retry_count + 1,
    last_error = sqlc.arg(last_error),
    next_retry_time = strftime('%Y-%m-%d %H:%M:%f', 'now', sqlc.arg(delay)),
    lease_owner = NULL, lease_expires_at = NULL, updated_at = strftime('%Y-%m-%d %H:%M:%f', 'now')
WHERE id = sqlc.arg(id)
  AND lease_owner = sqlc.arg(owner)
  AND status = 0;

-- name: RelayRelease :execrows
UPDATE /* TEMPLATE: outbox */outbox_event
SET lease_owner = NULL, lease_expires_at = NULL, updated_at = strftime('%Y-%m-%d %H:%M:%f', 'now')
WHERE id IN (sqlc.slice(ids))
  AND lease_owner = sqlc.arg(owner)
  AND status = 0;

-- name: RelayExtendLease :execrows
UPDATE /* TEMPLATE: outbox */outbox_event
SET lease_expires_at = strftime('%Y-%m-%d %H:%M:%f', 'now', sqlc.arg(lease)), updated_at = strftime('%Y-%m-%d %H:%M:%f', 'now')
WHERE id IN (sqlc.slice(ids))
  AND lease_owner = sqlc.arg(owner)
  AND status = 0;

-- name: RelayRequeue :execrows
UPDATE /* TEMPLATE: outbox */outbox_event
SET status = 0, retry_count = 0, next_retry_time = strftime('%Y-%m-%d %H:%M:%f', 'now'), lease_owner = NULL, lease_expires_at = NULL,
    updated_at = strftime('%Y-%m-%d %H:%M:%f', 'now')
WHERE id IN (sqlc.slice(ids))
  AND status = 2;

-- name: InboxRecord :execrows
INSERT INTO /* TEMPLATE: inbox */outbox_inbox (consumer, event_id, biz_type, biz_id)
VALUES (sqlc.arg(consumer), sqlc.arg(event_id), sqlc.arg(biz_type), sqlc.arg(biz_id))
ON CONFLICT (consumer, event_id) DO NOTHING;

-- name: InboxRecorded :one
SELECT COALESCE(biz_type, ''), COALESCE(biz_id, '')
FROM /* TEMPLATE: inbox */outbox_inbox
WHERE consumer = sqlc.arg(consumer)
  AND event_id = sqlc.arg(event_id);

-- name: InboxGuard :execrows
INSERT INTO /* TEMPLATE: inbox_key */outbox_inbox_key (consumer, biz_type, biz_id, last_seq)
VALUES (sqlc.arg(consumer), sqlc.arg(biz_type), sqlc.arg(biz_id), sqlc.arg(last_seq))
ON CONFLICT (consumer, biz_type, biz_id) DO UPDATE
SET last_seq = excluded.last_seq, updated_at = strftime('%Y-%m-%d %H:%M:%f', 'now')
WHERE /* TEMPLATE: inbox_key */outbox_inbox_key.last_seq < excluded.last_seq;

-- A duplicate delivery (InboxRecord changed nothing): counted per consumer
-- and event, in the delivery's transaction.
-- name: InboxRecordDuplicate :exec
INSERT INTO /* TEMPLATE: inbox_duplicate */outbox_inbox_duplicate (consumer, event_id, biz_type, biz_id)
VALUES (sqlc.arg(consumer), sqlc.arg(event_id), sqlc.arg(biz_type), sqlc.arg(biz_id))
ON CONFLICT (consumer, event_id) DO UPDATE
SET count = /* TEMPLATE: inbox_duplicate */outbox_inbox_duplicate.count + 1, last_seen_at = strftime('%Y-%m-%d %H:%M:%f', 'now');

-- name: OpsStats :one
SELECT COUNT(*),
    COALESCE((julianday('now') - julianday(MIN(created_at))) * 86400.0, 0),
    COALESCE(SUM(CASE WHEN created_at < strftime('%Y-%m-%d %H:%M:%f', 'now', '-' || sqlc.arg(stale_after)) THEN 1 ELSE 0 END), 0),
    (SELECT COUNT(*) FROM /* TEMPLATE: outbox */outbox_event WHERE status = 2),
    COALESCE(SUM(CASE WHEN lease_expires_at < strftime('%Y-%m-%d %H:%M:%f', 'now') THEN 1 ELSE 0 END), 0)
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
SELECT id, CASE WHEN min(created_at, COALESCE(sent_at, created_at)) < strftime('%Y-%m-%d %H:%M:%f', 'now', '-' || sqlc.arg(older_than)) OR created_at > strftime('%Y-%m-%d %H:%M:%f', 'now') THEN 1 ELSE 0 END
FROM /* TEMPLATE: outbox */outbox_event
WHERE id >= sqlc.arg(from_id)
ORDER BY id
LIMIT 1;

-- name: OpsDeleteSent :execrows
DELETE FROM /* TEMPLATE: outbox */outbox_event
WHERE id IN (
    SELECT id
    FROM /* TEMPLATE: outbox */outbox_event
    WHERE status = 1
      AND sent_at < strftime('%Y-%m-%d %H:%M:%f', 'now', '-' || sqlc.arg(older_than))
      AND id <= sqlc.arg(max_id)
    ORDER BY id
    LIMIT sqlc.arg(max_rows));

-- name: OpsDeleteInbox :execrows
DELETE FROM /* TEMPLATE: inbox */outbox_inbox
WHERE (consumer, event_id) IN (
    SELECT consumer, event_id
    FROM /* TEMPLATE: inbox */outbox_inbox
    WHERE processed_at < strftime('%Y-%m-%d %H:%M:%f', 'now', '-' || sqlc.arg(older_than))
    ORDER BY processed_at
    LIMIT sqlc.arg(max_rows));

-- name: OpsDeleteInboxDuplicates :execrows
DELETE FROM /* TEMPLATE: inbox_duplicate */outbox_inbox_duplicate
WHERE (consumer, event_id) IN (
    SELECT consumer, event_id
    FROM /* TEMPLATE: inbox_duplicate */outbox_inbox_duplicate
    WHERE last_seen_at < strftime('%Y-%m-%d %H:%M:%f', 'now', '-' || sqlc.arg(older_than))
    ORDER BY last_seen_at
    LIMIT sqlc.arg(max_rows));

-- The archive is a transaction of OpsArchivePick, which copies the batch
-- (a write first, so the transaction takes SQLite's write lock at once and
-- cannot fail to upgrade a read snapshot later), and OpsArchiveDelete.
-- name: OpsArchivePick :many
INSERT INTO /* TEMPLATE: archive */outbox_archive (id, event_id, biz_type, biz_id, topic, payload_version, payload,
    headers, status, retry_count, next_retry_time, lease_owner, lease_expires_at, last_error,
    created_at, updated_at, sent_at)
SELECT id, event_id, biz_type, biz_id, topic, payload_version, payload, headers, status,
    retry_count, next_retry_time, lease_owner, lease_expires_at, last_error, created_at, updated_at,
    sent_at
FROM /* TEMPLATE: outbox */outbox_event
WHERE status = 1
  AND sent_at < strftime('%Y-%m-%d %H:%M:%f', 'now', '-' || sqlc.arg(older_than))
  AND id <= sqlc.arg(max_id)
ORDER BY id
LIMIT sqlc.arg(max_rows)
RETURNING id;

-- name: OpsArchiveDelete :execrows
DELETE FROM /* TEMPLATE: outbox */outbox_event
WHERE id IN (sqlc.slice(ids))
  AND status = 1;

-- Operator queries (see postgres.sql).

-- name: AdminPendingStates :one
SELECT COALESCE(SUM(CASE WHEN retry_count > 0 AND next_retry_time > strftime('%Y-%m-%d %H:%M:%f', 'now') THEN 1 ELSE 0 END), 0),
    COALESCE(SUM(CASE WHEN lease_expires_at >= strftime('%Y-%m-%d %H:%M:%f', 'now') THEN 1 ELSE 0 END), 0),
    COUNT(DISTINCT CASE WHEN lease_expires_at >= strftime('%Y-%m-%d %H:%M:%f', 'now') THEN lease_owner END)
FROM /* TEMPLATE: outbox */outbox_event
WHERE status = 0;

-- name: AdminFailedGroups :many
SELECT biz_type, topic, COUNT(*), MIN(id), MAX(updated_at)
FROM /* TEMPLATE: outbox */outbox_event
WHERE status = 2
GROUP BY biz_type, topic
ORDER BY COUNT(*) DESC, biz_type, topic
LIMIT sqlc.arg(max_rows);

-- name: AdminHeldBack :one
SELECT COUNT(DISTINCT h.biz_id), COUNT(o.id)
FROM (
    SELECT x.biz_id, MIN(x.id) AS head_id
    FROM (
        SELECT f.biz_id, f.id FROM /* TEMPLATE: outbox */outbox_event f
        WHERE f.status = 2 /* IF unordered */AND f.biz_type NOT IN (sqlc.slice(unordered)) /* END */
        UNION ALL
        SELECT b.biz_id, b.id FROM /* TEMPLATE: outbox */outbox_event b
        WHERE b.status = 0 AND b.next_retry_time > strftime('%Y-%m-%d %H:%M:%f', 'now') AND b.retry_count > 0
          /* IF unordered */AND b.biz_type NOT IN (sqlc.slice(unordered)) /* END */
    ) x
    GROUP BY x.biz_id
) h
JOIN /* TEMPLATE: outbox */outbox_event o ON o.biz_id = h.biz_id AND o.id > h.head_id AND o.status = 0
/* IF unordered */WHERE o.biz_type NOT IN (sqlc.slice(unordered)) /* END */;

-- Sent rows kept (the janitor deletes them after retention). The only
-- count that reads the sent rows; status measures it (BenchmarkStatus).
-- name: AdminCountSent :one
SELECT COUNT(*) FROM /* TEMPLATE: outbox */outbox_event WHERE status = 1;

-- name: AdminMaxID :one
SELECT COALESCE(MAX(id), 0) FROM /* TEMPLATE: outbox */outbox_event;

-- name: AdminSentPerMinute :many
SELECT CAST((julianday('now') - julianday(sent_at)) * 1440 AS INTEGER) AS minute_ago, COUNT(*),
    AVG((julianday(sent_at) - julianday(created_at)) * 86400.0), MAX((julianday(sent_at) - julianday(created_at)) * 86400.0)
FROM /* TEMPLATE: outbox */outbox_event
WHERE id > sqlc.arg(from_id)
  AND status = 1
  AND sent_at >= strftime('%Y-%m-%d %H:%M:%f', 'now', '-' || sqlc.arg(window_secs))
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
  /* IF has_max_age */AND created_at >= strftime('%Y-%m-%d %H:%M:%f', 'now', '-' || sqlc.arg(max_age)) /* END */
  /* IF has_min_age */AND created_at <= strftime('%Y-%m-%d %H:%M:%f', 'now', '-' || sqlc.arg(min_age)) /* END */
  /* IF has_error */AND instr(lower(last_error), sqlc.arg(error_sub)) > 0 /* END */
ORDER BY id
LIMIT sqlc.arg(max_rows);

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
SET status = 0, retry_count = 0, next_retry_time = strftime('%Y-%m-%d %H:%M:%f', 'now'), sent_at = NULL, last_error = NULL,
    lease_owner = NULL, lease_expires_at = NULL, updated_at = strftime('%Y-%m-%d %H:%M:%f', 'now')
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
  /* IF has_max_age */AND processed_at >= strftime('%Y-%m-%d %H:%M:%f', 'now', '-' || sqlc.arg(max_age)) /* END */
  /* IF has_min_age */AND processed_at <= strftime('%Y-%m-%d %H:%M:%f', 'now', '-' || sqlc.arg(min_age)) /* END */
ORDER BY event_id
LIMIT sqlc.arg(max_rows);

-- name: AdminForgetInbox :execrows
DELETE FROM /* TEMPLATE: inbox */outbox_inbox
WHERE consumer = sqlc.arg(consumer)
  AND event_id IN (sqlc.slice(event_ids));

-- The console (runtime/admin: Relays, BlockedKeys, Delete, Inbox,
-- RecentDuplicates).

-- name: AdminLeases :many
SELECT lease_owner, COUNT(*), COALESCE(SUM(CASE WHEN lease_expires_at < strftime('%Y-%m-%d %H:%M:%f', 'now') THEN 1 ELSE 0 END), 0),
    MIN(lease_expires_at), MAX(lease_expires_at), MIN(created_at)
FROM /* TEMPLATE: outbox */outbox_event
WHERE status = 0
  AND lease_owner IS NOT NULL
  AND lease_owner <> '~held'
GROUP BY lease_owner
ORDER BY COUNT(*) DESC, lease_owner
LIMIT sqlc.arg(max_rows);

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
            WHERE b.status = 0 AND b.next_retry_time > strftime('%Y-%m-%d %H:%M:%f', 'now') AND b.retry_count > 0 AND b.biz_id > sqlc.arg(after_key)
              /* IF unordered */AND b.biz_type NOT IN (sqlc.slice(unordered)) /* END */
        ) x
        GROUP BY x.biz_id
    ) h
    JOIN /* TEMPLATE: outbox */outbox_event o ON o.biz_id = h.biz_id AND o.id > h.head_id AND o.status = 0
        /* IF unordered */AND o.biz_type NOT IN (sqlc.slice(unordered)) /* END */
    GROUP BY h.biz_id, h.head_id
    ORDER BY h.biz_id
    LIMIT sqlc.arg(max_rows)
) w
JOIN /* TEMPLATE: outbox */outbox_event e ON e.id = w.head_id
ORDER BY w.biz_id;

-- name: AdminLockFailed :many
-- A write, not a SELECT: it takes SQLite's write lock at the start of the
-- transaction. A transaction that reads first and writes later gets
-- SQLITE_BUSY at once (without waiting) when a relay wrote meanwhile,
-- unless the DSN sets _txlock=immediate.
UPDATE /* TEMPLATE: outbox */outbox_event
SET status = status
WHERE id IN (sqlc.slice(ids))
  AND status = 2
RETURNING id;

-- name: AdminDeleteFailed :execrows
DELETE FROM /* TEMPLATE: outbox */outbox_event
WHERE id IN (sqlc.slice(ids))
  AND status = 2;

-- name: AdminInboxHandled :many
SELECT r.consumer, COUNT(*), MAX(r.processed_at)
FROM (
    SELECT consumer, processed_at
    FROM /* TEMPLATE: inbox */outbox_inbox
    WHERE processed_at >= strftime('%Y-%m-%d %H:%M:%f', 'now', '-' || sqlc.arg(window_secs))
    ORDER BY processed_at DESC
    LIMIT sqlc.arg(scan_rows)
) r
GROUP BY r.consumer
ORDER BY r.consumer;

-- name: AdminInboxDuplicates :many
SELECT r.consumer, COUNT(*), MAX(r.last_seen_at)
FROM (
    SELECT consumer, last_seen_at
    FROM /* TEMPLATE: inbox_duplicate */outbox_inbox_duplicate
    WHERE last_seen_at >= strftime('%Y-%m-%d %H:%M:%f', 'now', '-' || sqlc.arg(window_secs))
    ORDER BY last_seen_at DESC
    LIMIT sqlc.arg(scan_rows)
) r
GROUP BY r.consumer
ORDER BY r.consumer;

-- name: AdminRecentDuplicates :many
SELECT consumer, event_id, COALESCE(biz_type, ''), COALESCE(biz_id, ''), count, first_seen_at, last_seen_at
FROM /* TEMPLATE: inbox_duplicate */outbox_inbox_duplicate
WHERE consumer = sqlc.arg(consumer)
ORDER BY last_seen_at DESC
LIMIT sqlc.arg(max_rows);

-- The schema version (the start-up check, outboxgen migrate): the newest
-- migration recorded in the version table and the oldest version a
-- runtime must know to use the tables, as the text "version
-- compatible_from" ("0 0" for an empty table). outboxgen migrate
-- serializes on SQLite with BEGIN IMMEDIATE (dialect.BeginImmediate).
-- name: SchemaVersion :one
SELECT COALESCE(MAX(version), 0) || ' ' || COALESCE(MAX(compatible_from), 0)
FROM /* TEMPLATE: version */outbox_event_version;

-- name: SchemaVersions :many
SELECT version, compatible_from, applied_at
FROM /* TEMPLATE: version */outbox_event_version
ORDER BY version;
