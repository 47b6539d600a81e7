// Package txpublisher is a watermill message.Publisher bound to the caller's
// database transaction that writes each message as a row of outboxgen's
// outbox table instead of sending it to a broker. Code written against
// watermill's Publisher interface (or watermill's Forwarder) moves to
// outboxgen by changing one constructor; outboxgen's relay then publishes
// the committed rows to the real broker.
//
// # Before and after
//
// With watermill-sql and watermill's Forwarder, a service publishes inside
// its transaction through a tx-bound SQL publisher wrapped in the
// forwarder's envelope publisher, and runs a Forwarder that moves the rows
// to the broker:
//
//	tx, _ := db.BeginTx(ctx, nil)
//	sqlPub, _ := wmsql.NewPublisher(tx, wmsql.PublisherConfig{SchemaAdapter: wmsql.DefaultPostgreSQLSchema{}}, logger)
//	pub := forwarder.NewPublisher(sqlPub, forwarder.PublisherConfig{ForwarderTopic: "outbox"})
//	// ... business writes on tx ...
//	err = pub.Publish("orders", msg)
//	err = tx.Commit()
//	// elsewhere: fwd, _ := forwarder.NewForwarder(sqlSubscriber, kafkaPublisher, logger, forwarder.Config{ForwarderTopic: "outbox"}); fwd.Run(ctx)
//
// With outboxgen the publisher writes into the outbox table and the relay
// does the forwarding (batched, multi-instance, per-key ordered, with
// backoff and a FAILED state):
//
//	w, _ := events.NewWriter(db) // once: the generated package's writer for db
//
//	tx, _ := db.BeginTx(ctx, nil)
//	pub := txpublisher.New(tx, w.Outbox(), txpublisher.Config{})
//	// ... business writes on tx ...
//	err = pub.Publish("orders", msg) // only INSERTs; never talks to the broker
//	err = tx.Commit()
//	// elsewhere: drv, _ := sqldriver.New(db, events.Schema)
//	//           r, _ := relay.New(drv, relay.Config{Publisher: kafkaPublisher}); r.Run(ctx)
//
// Do not keep forwarder.NewPublisher around the txpublisher: it would
// envelope every message to the forwarder topic, and the relay would
// publish envelopes. For a native pgx/v5 transaction use
// pgxtxpublisher.New(tx, w.Outbox(), txpublisher.Config{}) from the sub-package of that name.
//
// # How a message becomes a row
//
// One row per message, in the order given, all inside the transaction:
//
//   - topic: the Publish topic (at most 255 characters).
//   - event_id: msg.UUID, which must be a UUID (watermill.NewUUID's are).
//     The relay publishes the row with message UUID = event_id in canonical
//     lower-case form. Other ids (watermill.NewULID, short UUIDs, "") are
//     refused with ErrInvalidMessageID unless Config.DerivedEventIDs is set.
//   - biz_type: metadata "outbox_type" (Config.TypeMetadata), else the topic;
//     at most 64 characters. The relay reads per-type settings by it.
//   - biz_id, the ordering key: metadata "partition_key" (Config.KeyMetadata),
//     else the event id, so unkeyed messages carry no order constraint among
//     themselves; at most 128 characters.
//   - payload_version: metadata "outbox_version" (Config.VersionMetadata), a
//     positive integer, else 1.
//   - payload: msg.Payload, which must be JSON (the column is json); else
//     ErrPayloadNotJSON, unless Config.BinaryPayloads is set.
//   - headers: every other metadata entry. The entries the relay sets itself
//     from the row's columns (outbox_type, outbox_key, outbox_version,
//     outbox_created_at, outbox_event_id, outbox_seq, partition_key; see
//     the outbox.Metadata* constants) are not stored: the relay overwrites
//     them anyway, and an earlier hop's values would only mislead. Consumers therefore see the
//     message's metadata plus the relay's outbox_* keys. The stored entries
//     must be what brokers can carry (outbox.CheckHeaders: token-character
//     names, values without NUL, CR or LF, at most outbox.MaxHeaders
//     entries and outbox.MaxHeadersSize bytes), and payload plus entries at
//     most the writer's message size limit (outbox.MaxMessageSize); else
//     ErrInvalidMessage.
//
// Every message of a Publish call is checked before any SQL runs, so a
// refused message (bad id, payload, length, version, metadata) leaves the transaction
// untouched and usable, and no message of that call is written. A failure
// of the database itself (a lost connection, a cancelled context) can leave
// earlier rows of the call written, and on PostgreSQL aborts the
// transaction: roll it back, as after any failed statement.
//
// # Idempotency
//
// The event id is the message's identity. Publishing a message whose UUID
// is already in the outbox table (in this transaction or committed earlier)
// to the same topic is a no-op that succeeds (INSERT ... ON CONFLICT
// (event_id) DO NOTHING, as with outbox.WithEventID), so retried handlers
// do not duplicate events; a different payload under the same UUID is
// ignored too. Publishing it to a different topic fails with
// ErrDuplicateEventID, because one event id cannot name two events: give
// each copy its own UUID (msg.Copy() keeps the UUID; set a new one).
//
// # Contexts, Close, concurrency
//
// Each message's statement runs with msg.Context(): an already cancelled
// context fails Publish before any SQL for that message runs. Publish is
// safe for concurrent use (calls are serialised, since a transaction runs
// one statement at a time). Close does nothing: the transaction belongs to
// the caller, who commits or rolls it back. Publishing after the
// transaction ended fails with ErrTxDone, which also wraps the driver's
// error (sql.ErrTxDone, pgx.ErrTxClosed).
package txpublisher
