-- Every statement outboxgen's runtime sends to PostgreSQL 12+.
--
-- Package runtime/dialect embeds this file, finds each statement by its
-- "-- name:" line and, when a caller asks for it, replaces the markers:
--   /* TEMPLATE: outbox */outbox_event   a table name (outbox, inbox,
--       inbox_key, archive) or the NOTIFY channel (channel): the marker and
--       the default that follows it are replaced by the configured name;
--   sqlc.arg(name)                       one bind parameter ($1, $2, ...);
--   /* ARG: name */?                     the same, where the engine's parser
--       refuses sqlc.arg (MySQL's LIMIT);
--   sqlc.slice(name)                     a list: one parameter per element;
--   /* IF name */ ... /* END */          kept only when list name is not empty.
-- Comments and line breaks are dropped; what is left is the SQL sent.
--
-- sqlc checks every statement as written here against schema/postgres.sql,
-- the DDL templates/ renders (sqlc compile -f runtime/dialect/sql/sqlc.yaml).
-- Time always comes from the database clock (now()); durations are bound
-- as seconds (float8).

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

-- name: OutboxNotifyInsert :exec
SELECT pg_notify(/* TEMPLATE: channel */'outbox_event_insert', '');

-- name: RelayListen :exec
LISTEN /* TEMPLATE: channel */outbox_event_insert;

-- One statement: lock a window of due, unleased candidates (SKIP
-- LOCKED) that do not wait behind a row of their key in flight for less
-- than young, in the order they became due, then by id, through the due
-- index
-- (next_retry_time, id); then, per candidate of an ordered type: lease it
-- when every older unsent row of its key is a candidate too. Otherwise the
-- nearest older unsent row of its key outside the window (prev) decides: prev FAILED: hold
-- the candidate (lease_owner '~held', next_retry_time now + hold; a
-- requeue ends it, RelayReleaseHeld); prev in flight for young or more
-- (a slow publish): hold the candidate until prev is recorded
-- (next_retry_time: the far-future stamp of prev's id, see
-- RelayReleaseInFlightHeld); prev in flight for less: leave it; prev
-- held behind a slow row itself: the same hold, if that row is still in
-- flight and could be share-locked (slow), else leave it; prev due later
-- than the candidate (backing off, held, or behind something itself):
-- move the candidate's next_retry_time to prev's, so it never comes
-- before prev again (held, when that is in the future).
-- prev (and slow) are share-locked (SKIP LOCKED: a claim never waits), so
-- a requeue of a FAILED prev, or the recording of a slow one, either
-- waits for this claim and then releases what it held, or is under way
-- and makes the row skipped (the candidate is left alone): neither misses
-- a hold made at the same moment. (A requeue locks the key's pending
-- rows, RelayLockKeys, before its release: a claim that share-locked a
-- held prev, or locked a candidate, commits first, and the release, a
-- later statement, sees its holds.)
-- So every key's oldest row sorts first among its rows, a claim locks at
-- most max_rows candidates whatever the backlog, and a row behind a stuck
-- key is read once per attempt of the key's head (FAILED: once per hold).
-- A claim reads past the rows waiting behind rows in flight (a backlog of
-- few keys is made of them once each key has a row in flight; the relay
-- then claims in step with its recordings, see relay's saturated), at
-- the cost of one read of the due index and the row each: their keys are
-- probed once per key (the head) and, for keys with more than one
-- candidate, once more (the gap). RETURNING lease_owner tells leased rows
-- from the rest. The overdue_on section (ClaimOverdue, the sweeper) keeps
-- only rows created at least overdue ago. The front section (ClaimFrom)
-- also returns the claim's front, the oldest pending row from where it
-- read, and the from section reads from such a front instead of from the
-- start of the due index, which keeps an entry for every row sent since
-- the last VACUUM (see RelayQueries.ScansFrom).
-- name: RelayClaim :many
WITH cand AS MATERIALIZED (
    SELECT c.id, c.biz_id, c.next_retry_time AS due_at, (/* IF unordered */c.biz_type IN (sqlc.slice(unordered)) OR /* END */false) AS unordered_type,
        h.id AS head_id
    FROM /* TEMPLATE: outbox */outbox_event c
    -- The key's oldest unsent row (its head; c itself when c is the head),
    -- and whether an instance has been publishing it for less than young.
    -- PostgreSQL 14+ memoizes it per key, so a backlog of few keys costs
    -- one read of each row to read past (12 and 13: a probe per row). The
    -- key is matched as a range, not with =, so that the order asked for
    -- is the key index's alone: with = the planner may walk the primary
    -- key instead, expecting the key's rows soon when the statistics show
    -- few keys, and read past every sent row (seconds per claim on a
    -- table drained since).
    LEFT JOIN LATERAL (
        SELECT f.id, (f.lease_expires_at >= now() AND f.updated_at > now() - sqlc.arg(young) * interval '1 second') AS young
        FROM /* TEMPLATE: outbox */outbox_event f
        WHERE /* IF unordered */c.biz_type NOT IN (sqlc.slice(unordered)) AND /* END */f.biz_id >= c.biz_id AND f.biz_id <= c.biz_id
          AND f.status <> 1
          /* IF unordered */AND f.biz_type NOT IN (sqlc.slice(unordered)) /* END */
        ORDER BY f.biz_id, f.id
        LIMIT 1) h ON true
    WHERE c.status = 0
      AND c.next_retry_time <= now()
      -- From a position an earlier claim returned as its front (see
      -- front), not from the oldest entry of the due index: every row
      -- sent since the last VACUUM left an entry there, which each claim
      -- would otherwise read past. With stripes 2 or more, only the keys
      -- of one stripe (hash modulo stripes = stripe): claims running at
      -- once with distinct stripes read disjoint keys, so none reads,
      -- checks and fails to lock the rows another is leasing. A key's
      -- rows are all in one stripe, so per-key order is unaffected. A
      -- CASE and int4eq, not an OR and =: the planner takes a CASE as met
      -- by half the rows (generic plans) and a function call as met by a
      -- third (custom plans, where the CASE is folded away), but the
      -- comparison as met by 0.5 % of them: it then read a backlog of
      -- 10,000 rows whole and sorted it (20 against 13 ms per claim).
      /* IF from */AND (c.next_retry_time, c.id) >= (to_timestamp(0) + sqlc.arg(from_us)::bigint * interval '1 microsecond', sqlc.arg(from_id)::bigint)
      AND CASE WHEN sqlc.arg(stripes)::int < 2 THEN true ELSE int4eq((hashtext(c.biz_id) & 2147483647) % sqlc.arg(stripes)::int, sqlc.arg(stripe)::int) END/* END */
      AND (c.lease_expires_at IS NULL OR c.lease_expires_at < now())
      -- Not behind a row of its key in flight for less than young: it
      -- could not be leased, and would take a place in the window of
      -- every claim until that row is sent. Behind a row in flight for
      -- longer (a slow publish) it is taken, to be held (see verdict), so
      -- claims stop reading past it.
      AND h.young IS NOT TRUE
      /* IF overdue_on */AND c.created_at <= now() - sqlc.arg(overdue) * interval '1 second' /* END */
    ORDER BY c.next_retry_time, c.id
    LIMIT sqlc.arg(max_rows)
    FOR UPDATE OF c SKIP LOCKED),
-- The front section: the oldest pending row from where the claim read
-- (from_id 0: from the start), leased, locked by another claim or not: no
-- row this statement sees is pending before it, so the next claim may
-- read from there (the from section).
/* IF front */front AS MATERIALIZED (
    SELECT f.next_retry_time, f.id
    FROM /* TEMPLATE: outbox */outbox_event f
    WHERE f.status = 0
      AND (f.next_retry_time, f.id) >= (CASE WHEN sqlc.arg(from_id)::bigint = 0 THEN '-infinity'::timestamptz ELSE to_timestamp(0) + sqlc.arg(from_us)::bigint * interval '1 microsecond' END, sqlc.arg(from_id)::bigint)
    ORDER BY f.next_retry_time, f.id
    LIMIT 1),/* END */
-- Per key with a candidate that is not its head: the key's oldest unsent
-- row that is not a candidate (its gap). A candidate is claimable when it
-- is its key's head, or no gap is older than it: every older unsent row
-- of its key is a candidate too. While a backlog of many keys drains,
-- every candidate is its key's head, and this reads nothing.
gaps AS MATERIALIZED (
    SELECT k.biz_id, (
        SELECT o.id
        FROM /* TEMPLATE: outbox */outbox_event o
        WHERE o.biz_id >= k.biz_id AND o.biz_id <= k.biz_id
          AND o.status <> 1
          /* IF unordered */AND o.biz_type NOT IN (sqlc.slice(unordered)) /* END */
          AND o.id NOT IN (SELECT c2.id FROM cand c2)
        ORDER BY o.biz_id, o.id
        LIMIT 1) AS gap_id
    FROM (SELECT DISTINCT cand.biz_id FROM cand WHERE NOT cand.unordered_type AND cand.head_id <> cand.id) k),
checked AS MATERIALIZED (
    SELECT cand.id, cand.biz_id, cand.due_at,
        (cand.unordered_type OR cand.head_id = cand.id OR gaps.gap_id IS NULL OR gaps.gap_id > cand.id) AS claimable
    FROM cand
    LEFT JOIN gaps ON gaps.biz_id = cand.biz_id),
verdict AS MATERIALIZED (
    SELECT checked.id, checked.claimable,
        CASE WHEN checked.claimable THEN NULL
             WHEN prev.status = 2 THEN now() + sqlc.arg(hold) * interval '1 second'
             WHEN prev.lease_expires_at >= now() THEN
                 CASE WHEN prev.updated_at <= now() - sqlc.arg(young) * interval '1 second'
                      THEN timestamptz '3000-01-01 00:00:00+00' + prev.id * interval '1 microsecond' END
             -- prev is held behind a slow row itself: the candidate waits
             -- for that row too, if this claim could share-lock it while
             -- it is still in flight (its recording then waits for this
             -- claim and frees both); else it is left alone.
             WHEN prev.next_retry_time >= timestamptz '3000-01-01 00:00:00+00' THEN
                 CASE WHEN slow.id IS NOT NULL THEN prev.next_retry_time END
             WHEN prev.next_retry_time > checked.due_at THEN prev.next_retry_time
        END AS hold_until
    FROM checked
    LEFT JOIN LATERAL (
        SELECT p.id, p.status, p.next_retry_time, p.lease_expires_at, p.updated_at
        FROM /* TEMPLATE: outbox */outbox_event p
        -- In the WHERE, not the ON: a condition on checked alone becomes a
        -- one-time filter, so claimable rows (all of them, while a backlog
        -- drains) skip the probe instead of running it and discarding it.
        WHERE NOT checked.claimable
          -- The key's rows before the candidate, as a row comparison on
          -- the key index's columns: it starts the index's backward walk
          -- at the candidate (a range on the key alone would start at the
          -- key's newest row and walk the whole held tail for each
          -- candidate), and, as with the head and the gap, the order
          -- asked for is the key index's alone: with p.biz_id = and
          -- ORDER BY p.id, statistics that show few keys made PostgreSQL
          -- walk the primary key down from the candidate, past every sent
          -- row, to the FAILED head (36,000 pages for a claim of 40 rows;
          -- TestClaimHoldOfFewKeysStaysBounded). Only candidates that
          -- cannot be leased read it.
          AND (p.biz_id, p.id) < (checked.biz_id, checked.id)
          AND p.biz_id >= checked.biz_id
          AND p.status <> 1
          /* IF unordered */AND p.biz_type NOT IN (sqlc.slice(unordered)) /* END */
          AND NOT EXISTS (SELECT 1 FROM cand c3 WHERE c3.id = p.id)
        ORDER BY p.biz_id DESC, p.id DESC
        LIMIT 1
        FOR SHARE SKIP LOCKED) prev ON true
    LEFT JOIN LATERAL (
        SELECT s.id
        FROM /* TEMPLATE: outbox */outbox_event s
        WHERE s.id = (extract(epoch FROM prev.next_retry_time - timestamptz '3000-01-01 00:00:00+00') * 1000000)::bigint
          AND s.status = 0
          AND s.lease_expires_at >= now()
        FOR SHARE SKIP LOCKED) slow ON prev.next_retry_time >= timestamptz '3000-01-01 00:00:00+00')
UPDATE /* TEMPLATE: outbox */outbox_event
SET lease_owner = CASE WHEN verdict.claimable THEN sqlc.arg(owner) WHEN verdict.hold_until > now() THEN '~held' END,
    lease_expires_at = CASE WHEN verdict.claimable THEN now() + sqlc.arg(lease) * interval '1 second' END,
    next_retry_time = CASE WHEN verdict.claimable THEN /* TEMPLATE: outbox */outbox_event.next_retry_time ELSE verdict.hold_until END,
    updated_at = now()
FROM verdict
WHERE /* TEMPLATE: outbox */outbox_event.id = verdict.id
  AND (verdict.claimable OR verdict.hold_until IS NOT NULL)
RETURNING /* TEMPLATE: outbox */outbox_event.id, /* TEMPLATE: outbox */outbox_event.event_id,
    /* TEMPLATE: outbox */outbox_event.biz_type, /* TEMPLATE: outbox */outbox_event.biz_id,
    /* TEMPLATE: outbox */outbox_event.topic, /* TEMPLATE: outbox */outbox_event.payload_version,
    /* TEMPLATE: outbox */outbox_event.payload, /* TEMPLATE: outbox */outbox_event.headers,
    /* TEMPLATE: outbox */outbox_event.retry_count, /* TEMPLATE: outbox */outbox_event.created_at,
    /* TEMPLATE: outbox */outbox_event.lease_owner/* IF front */,
    -- Whole seconds and microseconds apart: exact also where extract
    -- returns a float (PostgreSQL 12 and 13).
    (SELECT extract(epoch FROM date_trunc('second', front.next_retry_time))::bigint * 1000000
        + extract(microseconds FROM front.next_retry_time)::bigint % 1000000 FROM front) AS front_us,
    (SELECT front.id FROM front) AS front_id/* END */;


-- name: RelayMarkSent :execrows
UPDATE /* TEMPLATE: outbox */outbox_event
SET status = 1, sent_at = now(), lease_owner = NULL, lease_expires_at = NULL, updated_at = now()
WHERE id IN (sqlc.slice(ids))
  AND lease_owner = sqlc.arg(owner)
  AND status = 0;

-- status is assigned before retry_count (see the MySQL file).
-- name: RelayMarkRetry :execrows
UPDATE /* TEMPLATE: outbox */outbox_event
SET status = CASE WHEN retry_count + 1 >= sqlc.arg(max_attempts) THEN 2 ELSE 0 END,
    retry_count = retry_count + 1,
    last_error = sqlc.arg(last_error),
    next_retry_time = now() + sqlc.arg(delay) * interval '1 second',
    lease_owner = NULL, lease_expires_at = NULL, updated_at = now()
WHERE id = sqlc.arg(id)
  AND lease_owner = sqlc.arg(owner)
  AND status = 0;

-- name: RelayRelease :execrows
UPDATE /* TEMPLATE: outbox */outbox_event
SET lease_owner = NULL, lease_expires_at = NULL, updated_at = now()
WHERE id IN (sqlc.slice(ids))
  AND lease_owner = sqlc.arg(owner)
  AND status = 0;

-- name: RelayExtendLease :execrows
UPDATE /* TEMPLATE: outbox */outbox_event
SET lease_expires_at = now() + sqlc.arg(lease) * interval '1 second', updated_at = now()
WHERE id IN (sqlc.slice(ids))
  AND lease_owner = sqlc.arg(owner)
  AND status = 0;

-- name: RelayRequeue :execrows
UPDATE /* TEMPLATE: outbox */outbox_event
SET status = 0, retry_count = 0, next_retry_time = now(), lease_owner = NULL, lease_expires_at = NULL, updated_at = now()
WHERE id IN (sqlc.slice(ids))
  AND status = 2;

-- The *Array statements bind the id list as one bigint[] (RelayQueries.ArrayIDs):
-- their text does not depend on the list length.

-- The pending rows of the keys of ids, locked (RelayQueries.LockKeys):
-- a requeue waits here for the claims that locked one of them, then
-- releases what they held.
-- name: RelayLockKeys :many
SELECT k.id
FROM /* TEMPLATE: outbox */outbox_event k
WHERE k.biz_id IN (SELECT h.biz_id FROM /* TEMPLATE: outbox */outbox_event h WHERE h.id IN (sqlc.slice(ids)))
  AND k.status = 0
FOR UPDATE;

-- The held rows of the keys of ids back in the due range: the row that
-- held them (one of ids) was requeued.
-- name: RelayReleaseHeld :execrows
UPDATE /* TEMPLATE: outbox */outbox_event
SET lease_owner = NULL, next_retry_time = now(), updated_at = now()
WHERE biz_id IN (SELECT h.biz_id FROM /* TEMPLATE: outbox */outbox_event h WHERE h.id IN (sqlc.slice(ids)))
  AND status = 0
  AND lease_owner = '~held';

-- The rows held behind rows in flight (the stamps: 3000-01-01 UTC plus
-- the row's id in microseconds, dialect.InFlightHoldStamp) back in the
-- due range: those rows were recorded (sent, failed or given back). Run
-- in the recording's transaction after the statements that recorded them:
-- a claim holding rows behind one of them share-locked it, so the
-- recording waited for that claim and sees its holds. One probe of the due
-- index per stamp. A held row was due when it was held, so it goes back
-- to its place by creation (created_at, not now(), which would put it
-- behind the later rows of its key, each of which a claim would then move
-- behind it). RelayReleaseOrphanHeld likewise.
-- name: RelayReleaseInFlightHeld :execrows
UPDATE /* TEMPLATE: outbox */outbox_event
SET lease_owner = NULL, next_retry_time = created_at, updated_at = now()
WHERE status = 0
  AND next_retry_time IN (sqlc.slice(stamps))
  AND lease_owner = '~held';

-- name: RelayReleaseInFlightHeldArray :execrows
UPDATE /* TEMPLATE: outbox */outbox_event
SET lease_owner = NULL, next_retry_time = created_at, updated_at = now()
WHERE status = 0
  AND next_retry_time = ANY(sqlc.arg(stamps)::timestamptz[])
  AND lease_owner = '~held';

-- Holds behind rows in flight whose row is no longer in flight and was
-- recorded without releasing them (a recording by an older runtime, or
-- one that raced the claim): back in the due range. The relay runs it
-- now and then (ClaimParams.ReleaseOrphans).
-- name: RelayReleaseOrphanHeld :execrows
UPDATE /* TEMPLATE: outbox */outbox_event
SET lease_owner = NULL, next_retry_time = created_at, updated_at = now()
WHERE status = 0
  AND next_retry_time >= timestamptz '3000-01-01 00:00:00+00'
  AND lease_owner = '~held'
  AND NOT EXISTS (
    SELECT 1
    FROM /* TEMPLATE: outbox */outbox_event h
    WHERE h.id = (extract(epoch FROM /* TEMPLATE: outbox */outbox_event.next_retry_time - timestamptz '3000-01-01 00:00:00+00') * 1000000)::bigint
      AND h.status = 0
      AND h.lease_expires_at >= now());

-- name: RelayMarkSentArray :execrows
UPDATE /* TEMPLATE: outbox */outbox_event
SET status = 1, sent_at = now(), lease_owner = NULL, lease_expires_at = NULL, updated_at = now()
WHERE id = ANY(sqlc.arg(ids))
  AND lease_owner = sqlc.arg(owner)
  AND status = 0;

-- name: RelayReleaseArray :execrows
UPDATE /* TEMPLATE: outbox */outbox_event
SET lease_owner = NULL, lease_expires_at = NULL, updated_at = now()
WHERE id = ANY(sqlc.arg(ids))
  AND lease_owner = sqlc.arg(owner)
  AND status = 0;

-- name: RelayExtendLeaseArray :execrows
UPDATE /* TEMPLATE: outbox */outbox_event
SET lease_expires_at = now() + sqlc.arg(lease) * interval '1 second', updated_at = now()
WHERE id = ANY(sqlc.arg(ids))
  AND lease_owner = sqlc.arg(owner)
  AND status = 0;

-- name: RelayRequeueArray :execrows
UPDATE /* TEMPLATE: outbox */outbox_event
SET status = 0, retry_count = 0, next_retry_time = now(), lease_owner = NULL, lease_expires_at = NULL, updated_at = now()
WHERE id = ANY(sqlc.arg(ids))
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
SET last_seq = excluded.last_seq, updated_at = now()
WHERE /* TEMPLATE: inbox_key */outbox_inbox_key.last_seq < excluded.last_seq;

-- A duplicate delivery (InboxRecord changed nothing): counted per consumer
-- and event, in the delivery's transaction.
-- name: InboxRecordDuplicate :exec
INSERT INTO /* TEMPLATE: inbox_duplicate */outbox_inbox_duplicate (consumer, event_id, biz_type, biz_id)
VALUES (sqlc.arg(consumer), sqlc.arg(event_id), sqlc.arg(biz_type), sqlc.arg(biz_id))
ON CONFLICT (consumer, event_id) DO UPDATE
SET count = /* TEMPLATE: inbox_duplicate */outbox_inbox_duplicate.count + 1, last_seen_at = now();

-- name: OpsStats :one
SELECT COUNT(*),
    COALESCE(EXTRACT(EPOCH FROM (now() - MIN(created_at)))::float8, 0),
    COALESCE(SUM(CASE WHEN created_at < now() - sqlc.arg(stale_after) * interval '1 second' THEN 1 ELSE 0 END), 0),
    (SELECT COUNT(*) FROM /* TEMPLATE: outbox */outbox_event WHERE status = 2),
    COALESCE(SUM(CASE WHEN lease_expires_at < now() THEN 1 ELSE 0 END), 0)
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
SELECT id, CASE WHEN LEAST(created_at, sent_at) < now() - sqlc.arg(older_than) * interval '1 second' OR created_at > now() THEN 1 ELSE 0 END
FROM /* TEMPLATE: outbox */outbox_event
WHERE id >= sqlc.arg(from_id)
ORDER BY id
LIMIT 1;

-- id = ANY(ARRAY(batch)): an IN (subquery) is planned as a hash semi-join
-- over a sequential scan of the whole table, the array as one primary-key
-- lookup per id. SKIP LOCKED: two janitors never wait for each other.
-- name: OpsDeleteSent :execrows
DELETE FROM /* TEMPLATE: outbox */outbox_event
WHERE id = ANY(ARRAY(
    SELECT s.id
    FROM /* TEMPLATE: outbox */outbox_event s
    WHERE s.status = 1
      AND s.sent_at < now() - sqlc.arg(older_than) * interval '1 second'
      AND s.id <= sqlc.arg(max_id)
    ORDER BY s.id
    LIMIT sqlc.arg(max_rows)
    FOR UPDATE SKIP LOCKED));

-- ctid = ANY(ARRAY(...)): a TID scan of the locked rows. The rows stay
-- locked until the DELETE, so their ctids cannot move.
-- name: OpsDeleteInbox :execrows
DELETE FROM /* TEMPLATE: inbox */outbox_inbox
WHERE ctid = ANY(ARRAY(
    SELECT ctid
    FROM /* TEMPLATE: inbox */outbox_inbox
    WHERE processed_at < now() - sqlc.arg(older_than) * interval '1 second'
    ORDER BY processed_at
    LIMIT sqlc.arg(max_rows)
    FOR UPDATE SKIP LOCKED));

-- The record of duplicate deliveries, with the inbox retention (by
-- last_seen_at), as OpsDeleteInbox.
-- name: OpsDeleteInboxDuplicates :execrows
DELETE FROM /* TEMPLATE: inbox_duplicate */outbox_inbox_duplicate
WHERE ctid = ANY(ARRAY(
    SELECT ctid
    FROM /* TEMPLATE: inbox_duplicate */outbox_inbox_duplicate
    WHERE last_seen_at < now() - sqlc.arg(older_than) * interval '1 second'
    ORDER BY last_seen_at
    LIMIT sqlc.arg(max_rows)
    FOR UPDATE SKIP LOCKED));

-- name: OpsArchiveMove :execrows
WITH moved AS (
    DELETE FROM /* TEMPLATE: outbox */outbox_event
    WHERE id = ANY(ARRAY(
        SELECT s.id
        FROM /* TEMPLATE: outbox */outbox_event s
        WHERE s.status = 1
          AND s.sent_at < now() - sqlc.arg(older_than) * interval '1 second'
          AND s.id <= sqlc.arg(max_id)
        ORDER BY s.id
        LIMIT sqlc.arg(max_rows)
        FOR UPDATE SKIP LOCKED))
    RETURNING id, event_id, biz_type, biz_id, topic, payload_version, payload, headers, status,
        retry_count, next_retry_time, lease_owner, lease_expires_at, last_error, created_at,
        updated_at, sent_at)
INSERT INTO /* TEMPLATE: archive */outbox_archive (id, event_id, biz_type, biz_id, topic, payload_version, payload,
    headers, status, retry_count, next_retry_time, lease_owner, lease_expires_at, last_error,
    created_at, updated_at, sent_at)
SELECT id, event_id, biz_type, biz_id, topic, payload_version, payload, headers, status,
    retry_count, next_retry_time, lease_owner, lease_expires_at, last_error, created_at, updated_at,
    sent_at
FROM moved;

-- Operator queries (package runtime/admin, the outboxgen CLI). Each
-- /* IF has_x */ section is kept only when the operator gave that filter;
-- status is written as a literal so the partial indexes apply.

-- Pending rows by state, through the claim index: backing off after a
-- failed publish, leased to a live relay, and the relays holding leases.
-- name: AdminPendingStates :one
SELECT COALESCE(SUM(CASE WHEN retry_count > 0 AND next_retry_time > now() AND next_retry_time < timestamptz '3000-01-01 00:00:00+00' THEN 1 ELSE 0 END), 0),
    COALESCE(SUM(CASE WHEN lease_expires_at >= now() THEN 1 ELSE 0 END), 0),
    COUNT(DISTINCT CASE WHEN lease_expires_at >= now() THEN lease_owner END)
FROM /* TEMPLATE: outbox */outbox_event
WHERE status = 0;

-- FAILED rows per type and topic, through the failed index.
-- name: AdminFailedGroups :many
SELECT biz_type, topic, COUNT(*), MIN(id), MAX(updated_at)
FROM /* TEMPLATE: outbox */outbox_event
WHERE status = 2
GROUP BY biz_type, topic
ORDER BY COUNT(*) DESC, biz_type, topic
LIMIT sqlc.arg(max_rows);

-- Keys held back: pending rows of ordered types behind a FAILED or
-- backing-off row of the same key (the head). Heads come from the failed
-- and due indexes, the rows behind them from the per-key index.
-- name: AdminHeldBack :one
SELECT COUNT(DISTINCT h.biz_id), COUNT(o.id)
FROM (
    SELECT x.biz_id, MIN(x.id) AS head_id
    FROM (
        SELECT f.biz_id, f.id FROM /* TEMPLATE: outbox */outbox_event f
        WHERE f.status = 2 /* IF unordered */AND f.biz_type NOT IN (sqlc.slice(unordered)) /* END */
        UNION ALL
        SELECT b.biz_id, b.id FROM /* TEMPLATE: outbox */outbox_event b
        WHERE b.status = 0 AND b.next_retry_time > now() AND b.retry_count > 0
          AND b.next_retry_time < timestamptz '3000-01-01 00:00:00+00'
          /* IF unordered */AND b.biz_type NOT IN (sqlc.slice(unordered)) /* END */
    ) x
    GROUP BY x.biz_id
) h
JOIN /* TEMPLATE: outbox */outbox_event o ON o.biz_id = h.biz_id AND o.id > h.head_id AND o.status = 0
/* IF unordered */WHERE o.biz_type NOT IN (sqlc.slice(unordered)) /* END */;

-- Sent rows per minute over the last window, among the rows with id >
-- from_id (AdminMaxID minus the rows to scan: a primary-key range, so the
-- cost is bounded however many sent rows the table keeps), with the
-- commit-to-publish lag.
-- Sent rows kept (the janitor deletes them after retention). The only
-- count that reads the sent rows; status measures it (BenchmarkStatus).
-- name: AdminCountSent :one
SELECT COUNT(*) FROM /* TEMPLATE: outbox */outbox_event WHERE status = 1;

-- name: AdminMaxID :one
SELECT COALESCE(MAX(id), 0) FROM /* TEMPLATE: outbox */outbox_event;

-- date_part, not EXTRACT: EXTRACT returns numeric (PostgreSQL 14+), whose
-- arithmetic over 100,000 rows costs about 40% more (59 ms against 42 ms,
-- BenchmarkConsole -console.explain in runtime/admin).
-- name: AdminSentPerMinute :many
SELECT floor(date_part('epoch', now() - sent_at) / 60)::bigint AS minute_ago, COUNT(*),
    AVG(date_part('epoch', sent_at - created_at)), MAX(date_part('epoch', sent_at - created_at))
FROM /* TEMPLATE: outbox */outbox_event
WHERE id > sqlc.arg(from_id)
  AND status = 1
  AND sent_at >= now() - sqlc.arg(window_secs) * interval '1 second'
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
  /* IF has_max_age */AND created_at >= now() - sqlc.arg(max_age) * interval '1 second' /* END */
  /* IF has_min_age */AND created_at <= now() - sqlc.arg(min_age) * interval '1 second' /* END */
  /* IF has_error */AND strpos(lower(last_error), sqlc.arg(error_sub)) > 0 /* END */
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

-- Sent rows back to pending, due now, attempts reset; the event id, payload
-- and headers are kept, so consumers' inboxes still dedupe by event id.
-- name: AdminReplay :execrows
UPDATE /* TEMPLATE: outbox */outbox_event
SET status = 0, retry_count = 0, next_retry_time = now(), sent_at = NULL, last_error = NULL,
    lease_owner = NULL, lease_expires_at = NULL, updated_at = now()
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
  /* IF has_max_age */AND processed_at >= now() - sqlc.arg(max_age) * interval '1 second' /* END */
  /* IF has_min_age */AND processed_at <= now() - sqlc.arg(min_age) * interval '1 second' /* END */
ORDER BY event_id
LIMIT sqlc.arg(max_rows);

-- name: AdminForgetInbox :execrows
DELETE FROM /* TEMPLATE: inbox */outbox_inbox
WHERE consumer = sqlc.arg(consumer)
  AND event_id IN (sqlc.slice(event_ids));

-- The console (runtime/admin: Relays, BlockedKeys, Delete, Inbox,
-- RecentDuplicates).

-- Relay instances by their leases on pending rows (the claim index: pending
-- rows only), held rows left out.
-- name: AdminLeases :many
SELECT lease_owner, COUNT(*), COALESCE(SUM(CASE WHEN lease_expires_at < now() THEN 1 ELSE 0 END), 0),
    MIN(lease_expires_at), MAX(lease_expires_at), MIN(created_at)
FROM /* TEMPLATE: outbox */outbox_event
WHERE status = 0
  AND lease_owner IS NOT NULL
  AND lease_owner <> '~held'
GROUP BY lease_owner
ORDER BY COUNT(*) DESC, lease_owner
LIMIT sqlc.arg(max_rows);

-- Blocked keys, one page in key order: the heads as in AdminHeldBack (the
-- failed and due indexes), the rows waiting behind each counted through
-- the per-key index, then the head row itself by primary key.
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
            WHERE b.status = 0 AND b.next_retry_time > now() AND b.retry_count > 0 AND b.biz_id > sqlc.arg(after_key)
              AND b.next_retry_time < timestamptz '3000-01-01 00:00:00+00'
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

-- DeleteFailed, in one transaction: lock the FAILED rows of ids (in id
-- order, so concurrent deletes do not deadlock; a claim share-locks the row
-- holding a key back, so a hold is either made before and released after,
-- or not made), release the rows held behind them (RelayReleaseHeld),
-- delete them.
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

-- Per consumer, the inbox rows processed within the window among the
-- newest scan_rows (the processed_at index, newest first: the cost is
-- bounded by scan_rows whatever the inbox holds).
-- name: AdminInboxHandled :many
SELECT r.consumer, COUNT(*), MAX(r.processed_at)
FROM (
    SELECT consumer, processed_at
    FROM /* TEMPLATE: inbox */outbox_inbox
    WHERE processed_at >= now() - sqlc.arg(window_secs) * interval '1 second'
    ORDER BY processed_at DESC
    LIMIT sqlc.arg(scan_rows)
) r
GROUP BY r.consumer
ORDER BY r.consumer;

-- Per consumer, the events delivered again within the window (the
-- last_seen_at index, bounded as AdminInboxHandled).
-- name: AdminInboxDuplicates :many
SELECT r.consumer, COUNT(*), MAX(r.last_seen_at)
FROM (
    SELECT consumer, last_seen_at
    FROM /* TEMPLATE: inbox_duplicate */outbox_inbox_duplicate
    WHERE last_seen_at >= now() - sqlc.arg(window_secs) * interval '1 second'
    ORDER BY last_seen_at DESC
    LIMIT sqlc.arg(scan_rows)
) r
GROUP BY r.consumer
ORDER BY r.consumer;

-- One consumer's latest duplicates (the (consumer, last_seen_at) index).
-- name: AdminRecentDuplicates :many
SELECT consumer, event_id, COALESCE(biz_type, ''), COALESCE(biz_id, ''), count, first_seen_at, last_seen_at
FROM /* TEMPLATE: inbox_duplicate */outbox_inbox_duplicate
WHERE consumer = sqlc.arg(consumer)
ORDER BY last_seen_at DESC
LIMIT sqlc.arg(max_rows);

-- The schema version (the start-up check, outboxgen migrate): the newest
-- migration recorded in the version table and the oldest version a
-- runtime must know to use the tables, as the text "version
-- compatible_from" ("0 0" for an empty table).
-- name: SchemaVersion :one
SELECT CAST(COALESCE(MAX(version), 0) AS text) || ' ' || CAST(COALESCE(MAX(compatible_from), 0) AS text)
FROM /* TEMPLATE: version */outbox_event_version;

-- name: SchemaVersions :many
SELECT version, compatible_from, applied_at
FROM /* TEMPLATE: version */outbox_event_version
ORDER BY version;

-- outboxgen migrate: one migrating session at a time per version table
-- (a session-level advisory lock, released by MigrateUnlock or when the
-- session ends).
-- name: MigrateLock :exec
SELECT pg_advisory_lock(sqlc.arg(lock_key));

-- name: MigrateUnlock :exec
SELECT pg_advisory_unlock(sqlc.arg(lock_key));

-- The WAL relay (runtime/walrelay; dialect/wal.go). Keys with rows not
-- sent (pending or FAILED), through the partial per-key index on the
-- unsent rows: the keys whose streamed events must be parked behind them.
-- name: WALUnsentKeys :many
SELECT DISTINCT biz_id
FROM /* TEMPLATE: outbox */outbox_event
WHERE status <> 1
LIMIT sqlc.arg(max_rows);

-- An event whose publish kept failing, parked for the polling relay: the
-- row the writer would have inserted, its id the outbox_seq it took from
-- the table's sequence at write time, charged the attempts given and due
-- after delay. ON CONFLICT: parked already by an earlier stream of the same
-- events (a restart).
-- name: WALPark :exec
INSERT INTO /* TEMPLATE: outbox */outbox_event (id, event_id, biz_type, biz_id, topic, payload_version, payload, headers,
    created_at, retry_count, next_retry_time, last_error)
VALUES (sqlc.arg(id)::bigint, sqlc.arg(event_id)::uuid, sqlc.arg(biz_type)::text, sqlc.arg(biz_id)::text, sqlc.arg(topic)::text,
    sqlc.arg(payload_version)::int, sqlc.arg(payload)::text::json, sqlc.arg(headers)::text::json,
    sqlc.arg(created_at)::timestamptz, sqlc.arg(retry_count)::int, now() + sqlc.arg(delay) * interval '1 second',
    sqlc.arg(last_error)::text)
ON CONFLICT DO NOTHING;

-- An event of a key remembered as parked: parked too while the key has
-- unsent rows, in the statement that checks it, so that the polling relay
-- marking the key's last row sent cannot slip between the check and the
-- insert. One snapshot (READ COMMITTED, one statement): either the check
-- sees the row unsent and the event goes behind it, or it sees it sent
-- (so published) and the event streams after it. Returns whether the key
-- had unsent rows.
-- name: WALParkIfBlocked :one
WITH blocked AS (
    SELECT EXISTS (SELECT 1 FROM /* TEMPLATE: outbox */outbox_event WHERE biz_id = sqlc.arg(biz_id)::text AND status <> 1) AS b
), ins AS (
    INSERT INTO /* TEMPLATE: outbox */outbox_event (id, event_id, biz_type, biz_id, topic, payload_version, payload, headers,
        created_at, retry_count, next_retry_time, last_error)
    SELECT sqlc.arg(id)::bigint, sqlc.arg(event_id)::uuid, sqlc.arg(biz_type)::text, sqlc.arg(biz_id)::text, sqlc.arg(topic)::text,
        sqlc.arg(payload_version)::int, sqlc.arg(payload)::text::json, sqlc.arg(headers)::text::json,
        sqlc.arg(created_at)::timestamptz, sqlc.arg(retry_count)::int, now() + sqlc.arg(delay) * interval '1 second',
        sqlc.arg(last_error)::text
    FROM blocked
    WHERE b
    ON CONFLICT DO NOTHING
)
SELECT b FROM blocked;
