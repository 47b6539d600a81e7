// Package brokers groups outboxgen's broker adapters: thin, documented
// constructors of watermill publishers (for the relay) and subscribers (for
// consumers) configured for the transactional outbox.
//
// Each broker lives in its own sub-package (natsjs, kafka), so a program
// compiles and links only the broker client it uses: importing package relay
// or outbox never pulls in a broker library, and a NATS user does not
// compile Kafka. This package itself is documentation only.
//
// The relay publishes one watermill message per outbox row: UUID = event_id,
// payload = the JSON payload, metadata = the stored headers plus
// relay.MetadataType, MetadataKey (biz_id), MetadataVersion,
// MetadataCreatedAt, MetadataEventID and MetadataPartitionKey (= biz_id).
// The adapters map these onto the broker's own features:
//
//   - natsjs: the event id becomes JetStream's Nats-Msg-Id, so the stream
//     drops the relay's re-sends inside its duplicate window (the relay is
//     at-least-once; the stream becomes effectively-once).
//   - kafka: the outbox key becomes the Kafka record key, so all events of
//     one key land in one partition and keep their order there.
//
// A call of several messages (the streaming relay's) that the broker
// stored only in part fails with a *relay.PartialError saying which were
// stored, in these adapters and in brokerurl's Redis and RabbitMQ
// publishers, so that the relay sends only the others again.
//
// Errors of both adapters are redacted (package redact): they never show a
// password or token of the configuration (URL userinfo, NATS token and
// user/password options, Kafka SASL password), while errors.Is and
// errors.As still see the broker client's errors.
package brokers
