// Package walrelay is the streaming relay of outboxgen's WAL mode
// (PostgreSQL only): it reads the events that outbox.WALWriter wrote into
// the write-ahead log through a logical replication slot and publishes
// them through the same watermill publishers, with the same message
// metadata and headers, as the polling relay (package relay): both build
// messages with one function (runtime/internal/outmsg). The outbox table
// becomes the slow path: it holds only the events the stream parks.
//
// With sql.wal: true in events.yaml the generated writers write into the
// WAL by themselves (the generated Schema has WAL set; see
// outbox.WithWAL), `outboxgen wal setup` creates the slot and `outboxgen
// relay` runs this relay beside the polling one. By hand:
//
//	w, _ := outbox.NewWALWriter(outbox.MustNewWriter(outbox.Postgres, events.OutboxTable))
//	id, err := w.InsertTx(ctx, pgxoutbox.Tx(tx), ev) // in the business transaction
//
//	r, err := walrelay.New(pool, events.Schema, walrelay.Config{Publisher: pub})
//	go r.Run(ctx)                                    // and the polling relay, for parked events
//
// # Why the WAL
//
// A polled event costs the database an INSERT into a table with five
// indexes, a lease UPDATE, a mark UPDATE, a later DELETE and the vacuum of
// all of them. In WAL mode the writer's only cost is one
// pg_logical_emit_message(true, prefix, content) in its transaction: a WAL
// record, nothing else. PostgreSQL decodes a transactional message for a
// slot only if its transaction commits, and sends transactions in commit
// order: "rolled back ⇒ never published" needs nothing from the relay, and
// while a key streams its order is commit order, without the polling
// relay's condition that writers lock the aggregate before writing its
// event. Parked events are the exception: in the table they are ordered by
// their outbox_seq, taken when the event was written, which is commit order
// only when writers lock the aggregate (as the table outbox needs anyway;
// latest_only consumers rely on the same sequence). Lock the aggregate
// when a key's events may be written by concurrent transactions.
//
// A logical message rather than an INSERT the relay streams: into the
// outbox table, the INSERT keeps the table outbox's cost on the writer;
// into a table without any index it costs the writer about what the
// message costs (bench.BenchmarkWAL measures both), but every row must
// then be deleted and vacuumed, and the table grows while the relay is
// down. The message leaves nothing to clean up. Nothing reads a table row in the
// stream's path, so the race reported in Zehelein/pg-transactional-outbox
// issue 4 (a relay that locks the row it just saw in the WAL may find it
// locked or invisible, and miss it) cannot happen: the message is the
// event.
//
// # The message
//
// The prefix is outbox.WALPrefix(table), "outboxgen:<outbox table>", so
// several outboxes share a database (each relay skips other prefixes).
// The content is a versioned binary envelope (outbox.DecodeWALEvent): a
// version byte, the event's sequence and creation time (written by the SQL
// statement: nextval of the outbox table's identity sequence, now()), then
// the event id, type, key, topic, version, headers and payload, each
// length-prefixed and validated on decode against the writer's limits.
// The sequence is the outbox_seq metadata, exactly as for a table row,
// and the row id if the event is ever parked: consumers' latest_only
// guard and the polling relay's per-key id order see one numbering. It is
// taken when the event is written, so, like the table's id, it follows
// commit order only when writers lock the aggregate: the stream's own
// order is commit order regardless, but latest_only consumers compare
// sequences and need that lock in both modes. A
// message of the prefix that no build can decode (an envelope of a known
// version that breaks its format) is logged at ERROR with its LSN, counted
// (outboxgen.walrelay.malformed, Config.OnMalformed) and skipped: it
// cannot be published, and it must not stall the stream. A message that
// another relay could read is not skipped: over Config.MaxMessageBytes, or
// of a newer envelope version, it stops Run with an error saying what to
// do (raise the cap, upgrade the relay), before its transaction is
// confirmed, so the next relay reads it again.
//
// # The stream and at-least-once
//
// The relay opens its own replication connection (replication=database),
// creates the publication (empty: pgoutput needs one, even for messages
// only) and the pgoutput slot when missing, and starts it with
// proto_version 1 and messages 'true'. One goroutine owns the connection:
// it receives transactions, hands each event to the key's lane, and
// reports the confirmed position (standby status updates every
// StatusInterval, and whenever the server asks). The position advances
// only to the end LSN of a transaction whose every event was acknowledged
// by the broker or durably parked, and of every transaction before it
// (a FIFO of transactions in commit order); with nothing unsettled, a
// keepalive's WAL end is confirmed too, so the slot does not hold WAL of
// transactions without events. A restarted relay (or another instance)
// resumes at the slot's confirmed position: events after it are published
// again (duplicates, which consumers drop by event id), none is lost.
//
// Events are published with bounded concurrency across keys
// (Concurrency Publish calls at once, besides slow ones, see below) and
// one at a time within a key, in
// stream order. When events of several keys wait, one Publish call
// carries the next event of each (at most MaxPublishBatch, one topic); a
// key's next event is taken only once its previous one is settled, so a
// call never holds two events of one key. A refused batch is charged to
// nobody: its events are published again one by one, each with its own
// retries, breaker accounting and parking. When the error says which of
// the call's events the broker stored (relay.PartialError: the adapters
// of package brokers report it), those are settled and only the others
// are published again, so a broker that keeps repeats (Kafka, Redis,
// RabbitMQ) does not store the stored ones twice. The relay stops reading (and
// PostgreSQL keeps the WAL) while MaxInFlight events are unsettled, while
// the unsettled ones hold MaxInFlightBytes of content (at least one event
// is always read), or while MaxUnconfirmed events are not confirmed
// (unsettled, or settled behind an unsettled transaction): memory stays
// bounded however long an event takes (while the breaker is open and every
// key in flight failed since it opened, up to twice the bounds: see
// Broker outages). A call that runs eight times the
// typical one (2ms to 250ms) gives its place among the Concurrency calls
// to another, with the events taken beside it that had not started, so
// stalled calls hold back their own keys only; at most SlowCallsPerSlot ×
// Concurrency places are given back at once, so a broker that stalls
// every call does not multiply the calls without bound. Settled
// events hold no content, so a slow event holds back its key, not the
// others, until MaxUnconfirmed.
// With Config.Hedge, a call that stalls is made again beside it after
// HedgeAfter (the polling relay's hedged publishes), so it holds back the
// keys it carries for about that long; a call of several events has its
// events published one by one instead, each hedged in turn.
//
// The slot only retains WAL from its creation on: events written in WAL
// mode before the slot exists are never streamed. Run Relay.Setup (a
// deploy step, next to the schema migration: `outboxgen wal setup`) or
// start the relay, which
// creates the slot, before switching writers to WAL mode, and keep the
// slot: dropping it drops every event not yet confirmed. A relay creates
// a missing slot only before it ever found it: once it found the slot or
// streamed (a standby too), a missing slot (dropped, or a failover) stops
// Run with the last confirmed position, since a new slot would silently
// skip the events in between. A new process cannot tell a lost slot from one
// never created: with Config.NoCreateSlot, Run never creates one and
// stops instead, and only Setup does.
//
// # Parking
//
// A publish that fails QuickRetries times (RetryDelay apart), or with a
// permanent error (relay.ErrPermanent), parks the event: it is inserted
// into the outbox table as the writer would have inserted it, with its
// sequence as row id, pending, charged one attempt, due after Backoff(1),
// with the error as last_error. From then on the polling relay owns it:
// retries with backoff, FAILED after MaxAttempts, requeue, the CLI and
// the console. The key is remembered as parked, and each later event of
// it is parked too while the key has unsent rows (pending or FAILED), by
// one statement that checks and inserts:
//
//	WITH blocked AS (SELECT EXISTS (SELECT 1 FROM outbox WHERE biz_id = $key AND status <> 1) AS b),
//	ins AS (INSERT INTO outbox (...) SELECT ... FROM blocked WHERE b ON CONFLICT DO NOTHING)
//	SELECT b FROM blocked
//
// An event is settled (its LSN may be confirmed) only after that
// statement committed. A park that fails is retried while the cause may
// clear (a lost connection, a serialization failure, a restarting
// server); one that cannot (permission denied, a missing table or column,
// a value the table refuses) stops Run with what to do (the GRANT, the
// migration), instead of holding the confirmed position for good. When the key has no unsent row left the event is
// streamed and the key forgotten: its events flow through the stream
// again.
//
// Why per-key order holds across the two paths. Only the stream inserts
// the rows of a WAL-mode key, and a key's events are handled one at a
// time in commit order, so no other insert of the key races the check.
// The polling relay's only relevant write is marking the key's last
// unsent row R sent, which it does after the broker acknowledged R. The
// check and the insert are one statement with one snapshot: if it sees R
// unsent, the event is inserted behind R (a larger id: sequences are
// taken in commit order when writers lock the aggregate, as for the table
// outbox) and the polling relay publishes it after R, since it never
// claims a row while an older unsent row of its key exists; if it sees R
// sent, R was published already, and the event is streamed after it. In
// between (R published, not yet marked) the check sees R unsent: the
// event is parked, late but in order. Rows that are FAILED count as
// unsent, so a FAILED event holds its key until it is requeued and sent
// (or deleted by an operator). The keys with unsent rows are loaded when
// streaming starts (at most MaxParkedKeys; above that every event is
// checked), so order holds across restarts and for rows left by the table
// outbox before a switch to WAL mode; rows that table-mode writers insert
// while the stream runs are not seen: switch every writer of an outbox at
// once (stop the table-mode instances before WAL-mode ones start writing,
// rather than a rolling deploy that mixes them), and do not write the same
// keys through txpublisher or Writer.Prepare/Exec, which always insert
// into the table.
//
// # Broker outages
//
// Publishes failing for two or more keys with no success between (of a
// call begun after the first of them failed) open a circuit breaker: every lane waits (not counting those failures toward
// parking), the in-flight bound then stops the reading of the stream, and
// one lane probes every BreakerBackoff until a probe succeeds. An
// outage therefore pauses the stream instead of parking the world. A
// single failing key never opens it (other keys' successes reset the
// count): that key is parked. An event whose quick retries failed is
// parked only once the broker accepted another call that began after the
// event first failed, or none is under way (breaker.verdict): a publish
// that fails fast at the start of an outage, while the others still wait
// for the broker, would otherwise be parked before their failures open
// the breaker; and a call under way as the broker went down may still
// succeed after the first failures, so a success of a call that began
// before tells nothing. When that success came only after the event's
// last attempt began (the broker may have come back meanwhile), it is
// tried once more before it is parked. When no such call succeeded and
// nothing else is under way (its key fails alone, at a quiet moment), an
// outage cannot be told from a poison event: it is retried for
// ParkAloneAfter (10 s) before it is parked, the pauses doubling from
// RetryDelay up to a second and cut short by such a success or the
// breaker's opening, and waiting as a slow call does (its worker's place
// given to another), so that the broker's return or another key's publish
// decides. A short outage at a quiet moment is so ridden out
// (TestLoneKeyOutage); before, the key went to the polling relay, whose
// first retry comes a minute later. While it waits, its key counts as
// failing: one failure of another key opens the breaker (and a probe's
// success then gets it parked). A tiny ParkAloneAfter (1ns) parks at
// once, as before. The evidence against an event outlasts an outage: an
// event whose quick retries ran out as an outage began is parked when it
// fails again after the breaker closed, even if that failure is the start
// of the next outage; so may be an event that failed once, saw a call
// begun after that failure accepted, and whose quick retries then ran out
// as an outage began, before the breaker opened. A call under way as the
// broker went down tells nothing for the breaker either: its late success
// clears the count of failing keys only if it began after the first of
// them failed, and closes an open breaker only if it began after the
// opening (a probe).
// A batch call that fails (or is split by its hedge) says
// nothing of any one key: its events count as under way until their own
// calls, which follow, have an outcome, and an event waiting for its
// verdict gives back its place among the single deliveries so that they
// can run. While the breaker is open, no event holds a worker or a place
// waiting for it: an event that may not probe goes back to its lane, and
// its worker waits holding nothing; the probe is the lane that waited
// longest, and a probe that fails (or an event that failed as the
// breaker opened) sends its lane behind the others. The lanes take turns,
// so poison events cannot keep the probe from a good event, whose success
// closes the breaker. An event keeps its failed attempts, and the
// evidence its verdict weighs, through the wait. Poison events of a few
// keys that fill MaxInFlight, their keys' later events behind them, look
// like an outage to the breaker, and no other key's event would be read
// to tell: so while the breaker is open and every key in flight has
// failed since it opened, the reader reads on past MaxInFlight, up to
// twice it, and a new key's event probes (in an outage, it fails in turn:
// one new key per round of probes). A parked key's failures
// are forgotten, so that they never combine with a later key's into a
// false outage.
//
// # One streamer per slot, takeover
//
// The slot is the lock: START_REPLICATION fails with SQLSTATE 55006
// ("replication slot ... is active") while another connection streams
// from it. Run then stands by and retries every TakeoverInterval; when the
// streaming instance dies its connection drops (at once for a killed
// process; after wal_sender_timeout for a partition), PostgreSQL releases
// the slot and a standby takes over at the confirmed position. Graceful
// shutdown stops reading, waits up to ShutdownTimeout for the publishes
// under way, and reports the confirmed position.
//
// # Operations
//
// The server needs PostgreSQL 14 or later (pgoutput's messages option;
// set-up checks server_version_num), wal_level = logical, max_replication_slots and
// max_wal_senders (one each per relay instance streaming or standing by,
// plus headroom); the relay's role needs the REPLICATION attribute, and
// CREATE on the database unless the publication exists. Writers need
// USAGE on the outbox table's id sequence. A slot retains WAL while its
// relay is down or behind: bound it with max_slot_wal_keep_size (a slot
// past it is invalidated, wal_status "lost", and the events in the gap are
// gone from the stream), and alert on CheckSlot or the lag metrics
// (outboxgen.walrelay.slot.lag_bytes and .lag_seconds). Logical slots of
// PostgreSQL 16 and earlier are not copied to physical standbys: after a
// failover the slot is missing on the new primary, and events written
// since its last confirmation are not streamed (PostgreSQL 17 failover
// slots, created with failover = true and synchronized to the standby with
// sync_replication_slots, keep it). The README has the details.
package walrelay
