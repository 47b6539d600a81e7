// Package kafka builds Kafka publishers (on a sarama SyncProducer) and
// watermill-kafka/v3 subscribers configured for outboxgen's transactional
// outbox.
//
//	pub, err := kafka.NewPublisher(kafka.PublisherConfig{Brokers: []string{"kafka:9092"}})
//	...
//	drv, err := sqldriver.New(db, events.Schema)
//	...
//	r, err := relay.New(drv, relay.Config{Publisher: pub})
//
// # Per-key order
//
// The relay publishes the events of one key (biz_id) in id order, one at a
// time (each Publish waits for the broker's acknowledgement before the
// next event of that key is sent). This package makes the outbox key the
// Kafka record key (PartitionKey: metadata relay.MetadataPartitionKey, else
// relay.MetadataKey), so every event of a key goes to the same partition —
// sarama's hash partitioner — where Kafka keeps them in the order they were
// written. Consumers reading a partition in order (one consumer per
// partition, as consumer groups do) therefore see a key's events in order.
// Changing a topic's partition count moves keys to other partitions; do it
// only with the relay drained.
//
// The producer is idempotent by default (PublisherConfig.DisableIdempotence):
// sarama's internal retries of a produce request cannot duplicate or
// reorder records. Re-sends by the relay itself (a publish whose
// acknowledgement was lost) are new records: consumers deduplicate by the
// message UUID, which is the event_id (Kafka has no broker-side
// de-duplication by an application id). A call of several records that
// the brokers store only some of says which (relay.PartialError), so that
// the relay sends only the others again. Give sarama the brokers' record
// size limit (Sarama.Producer.MaxMessageBytes, at most
// message.max.bytes; it bounds the record before compression): then
// sarama refuses a record too big alone, and the error is permanent
// (relay.Permanent: the relay fails or parks it at once). A broker's refusal fails the records batched with it in its
// partition too, and with kfake the idempotent producer's next records
// then failed for a moment (out of order sequence numbers), which a
// streaming relay took for an outage.
//
// # Topics
//
// The outbox topic is the Kafka topic name, unchanged: use the characters
// Kafka allows (ASCII letters, digits, '.', '_', '-'; at most 249) and avoid
// mixing '.' and '_' (Kafka's metric names collide). Create topics ahead,
// with the partition count you want; brokers with automatic topic creation
// create them with their defaults on first publish.
package kafka

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/IBM/sarama"
	wmkafka "github.com/ThreeDotsLabs/watermill-kafka/v3/pkg/kafka"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/outboxgen/outboxgen/runtime/internal/pubguard"
	"github.com/outboxgen/outboxgen/runtime/internal/wmlog"
	"github.com/outboxgen/outboxgen/runtime/redact"
	"github.com/outboxgen/outboxgen/runtime/relay"
)

// Defaults of PublisherConfig.
//
// A sarama SyncProducer ignores the message context, so one Publish is
// bounded only by these timeouts: each produce attempt takes at most
// DefaultDialTimeout + DefaultWriteTimeout + DefaultReadTimeout (the
// brokers answer within DefaultProduceTimeout, shorter than the read
// timeout), and a Publish makes at most 1 + DefaultPublishRetry attempts
// with DefaultRetryBackoff between them: PublishBudget, about 16s, well
// under the relay's default 30s lease (relay.DefaultLeaseDuration) and
// its PublishTimeout. The relay retries further with its own backoff, so
// sarama need not retry long. A base PublisherConfig.Sarama keeps its own
// network timeouts: keep that budget under the lease too.
const (
	DefaultClientID       = "outboxgen-relay"
	DefaultPublishRetry   = 1
	DefaultRetryBackoff   = 100 * time.Millisecond
	DefaultDialTimeout    = 2 * time.Second
	DefaultWriteTimeout   = 2 * time.Second
	DefaultReadTimeout    = 4 * time.Second
	DefaultProduceTimeout = 3 * time.Second
	DefaultSubscriberID   = "outboxgen-consumer"
	defaultMetadataRetry  = 250 * time.Millisecond
	defaultMetadataMax    = 1
)

// PublishBudget returns the longest a Publish of a producer configured by
// sc can take when every attempt runs into its network timeouts: (1 +
// Producer.Retry.Max) × (Net.DialTimeout + Net.WriteTimeout +
// Net.ReadTimeout) + Producer.Retry.Max × Producer.Retry.Backoff. Keep it
// well under the relay's LeaseDuration.
func PublishBudget(sc *sarama.Config) time.Duration {
	attempts := time.Duration(1 + sc.Producer.Retry.Max)
	return attempts*(sc.Net.DialTimeout+sc.Net.WriteTimeout+sc.Net.ReadTimeout) +
		time.Duration(sc.Producer.Retry.Max)*sc.Producer.Retry.Backoff
}

// DefaultVersion is the Kafka protocol version the clients speak by
// default (2.1: idempotent producers, record headers).
var DefaultVersion = sarama.V2_1_0_0

// ErrNoPartitionKey is returned by PartitionKey (and so by Publish) for a
// message that carries neither relay.MetadataPartitionKey nor
// relay.MetadataKey: without a key the record would land on an arbitrary
// partition and per-key order would be lost. The relay always sets both.
var ErrNoPartitionKey = errors.New("kafka: message has no outbox key (metadata " + relay.MetadataPartitionKey + " or " + relay.MetadataKey + ")")

// PartitionKey returns the outbox key of msg: the metadata
// relay.MetadataPartitionKey, else relay.MetadataKey. It is the
// watermill-kafka GeneratePartitionKey the publisher uses by default.
func PartitionKey(_ string, msg *message.Message) (string, error) {
	if k := msg.Metadata.Get(relay.MetadataPartitionKey); k != "" {
		return k, nil
	}
	if k := msg.Metadata.Get(relay.MetadataKey); k != "" {
		return k, nil
	}
	return "", fmt.Errorf("%w: message %s", ErrNoPartitionKey, msg.UUID)
}

// NewMarshaler returns watermill-kafka's marshaler (payload as the record
// value, metadata as record headers, UUID in the _watermill_message_uuid
// header) with the record key set by key (PartitionKey when nil).
func NewMarshaler(key wmkafka.GeneratePartitionKey) wmkafka.MarshalerUnmarshaler {
	if key == nil {
		key = PartitionKey
	}
	return wmkafka.NewWithPartitioningMarshaler(key)
}

// PublisherConfig configures a Publisher.
type PublisherConfig struct {
	// Brokers are the bootstrap brokers ("host:port"). Required.
	Brokers []string

	// ClientID names the client to the brokers (default
	// "outboxgen-relay").
	ClientID string

	// Version is the Kafka protocol version (default DefaultVersion).
	Version sarama.KafkaVersion

	// PartitionKey derives the record key (default PartitionKey: the
	// outbox key).
	PartitionKey wmkafka.GeneratePartitionKey

	// DisableIdempotence turns the idempotent producer off, for brokers
	// or ACLs that do not allow it (IDEMPOTENT_WRITE). Per-key order still
	// holds (the relay waits for each record of a key), but sarama's own
	// retries may then write a record twice.
	DisableIdempotence bool

	// Retries is how often sarama retries a produce request before
	// Publish fails (default 1); the relay retries further with its
	// backoff. Keep it small: Publish does not watch the message context,
	// so its duration is bounded only by the retries and timeouts (see
	// PublishBudget).
	Retries int

	// RetryBackoff is the wait between sarama's retries (default 100ms).
	RetryBackoff time.Duration

	// Sarama, if set, is the base sarama configuration (TLS, SASL...).
	// The settings the outbox depends on are applied over it: sync
	// producer returning successes, acks from all in-sync replicas,
	// hash partitioner, idempotence, and the fields above when set. Its
	// network and produce timeouts are kept: sarama's defaults (30s each)
	// let a Publish outlast the relay's lease, so lower them (see
	// PublishBudget).
	Sarama *sarama.Config

	// Logger is not used: the publisher returns every failure and logs
	// nothing (the watermill-kafka publisher it replaced logged each
	// record at trace level). It is kept so that configurations that set
	// it still compile.
	Logger *slog.Logger
}

func (c *PublisherConfig) setDefaults() {
	if c.ClientID == "" {
		c.ClientID = DefaultClientID
	}
	if c.Version == (sarama.KafkaVersion{}) {
		c.Version = DefaultVersion
	}
	if c.PartitionKey == nil {
		c.PartitionKey = PartitionKey
	}
	if c.Retries == 0 {
		c.Retries = DefaultPublishRetry
	}
	if c.RetryBackoff == 0 {
		c.RetryBackoff = DefaultRetryBackoff
	}
}

// Validate reports every invalid setting. It checks the configuration as
// given; NewPublisher applies the defaults first.
func (c PublisherConfig) Validate() error {
	var errs []error
	if len(c.Brokers) == 0 {
		errs = append(errs, errors.New("kafka: PublisherConfig.Brokers is empty: list at least one bootstrap broker host:port"))
	}
	errs = append(errs, checkBrokers("PublisherConfig", c.Brokers)...)
	if c.Retries < 1 {
		errs = append(errs, fmt.Errorf("kafka: PublisherConfig.Retries is %d: use at least 1 (or 0 for %d)", c.Retries, DefaultPublishRetry))
	}
	if c.RetryBackoff < 0 {
		errs = append(errs, fmt.Errorf("kafka: PublisherConfig.RetryBackoff is %s: use a positive duration (or 0 for %s)", c.RetryBackoff, DefaultRetryBackoff))
	}
	if !c.DisableIdempotence && c.Version != (sarama.KafkaVersion{}) && !c.Version.IsAtLeast(sarama.V0_11_0_0) {
		errs = append(errs, fmt.Errorf("kafka: PublisherConfig.Version %s is too old for the idempotent producer: use 0.11 or newer, or set DisableIdempotence", c.Version))
	}
	if c.PartitionKey == nil {
		errs = append(errs, errors.New("kafka: PublisherConfig.PartitionKey must be left nil before NewPublisher to get its default"))
	}
	return errors.Join(errs...)
}

// SaramaConfig returns the sarama producer configuration NewPublisher
// uses for c (after defaults). It is validated by sarama.
func (c PublisherConfig) SaramaConfig() (*sarama.Config, error) {
	c.setDefaults()
	if err := c.Validate(); err != nil {
		return nil, err
	}
	return c.saramaConfig()
}

func (c PublisherConfig) saramaConfig() (*sarama.Config, error) {
	sc := sarama.NewConfig()
	if c.Sarama != nil {
		cp := *c.Sarama
		sc = &cp
	} else {
		sc.Net.DialTimeout = DefaultDialTimeout
		sc.Net.WriteTimeout = DefaultWriteTimeout
		sc.Net.ReadTimeout = DefaultReadTimeout
		sc.Producer.Timeout = DefaultProduceTimeout
		sc.Metadata.Retry.Max = defaultMetadataMax
		sc.Metadata.Retry.Backoff = defaultMetadataRetry
	}
	sc.ClientID = c.ClientID
	sc.Version = c.Version
	sc.Producer.Return.Successes = true // a SyncProducer needs both
	sc.Producer.Return.Errors = true
	sc.Producer.RequiredAcks = sarama.WaitForAll
	sc.Producer.Partitioner = sarama.NewHashPartitioner
	sc.Producer.Retry.Max = c.Retries
	sc.Producer.Retry.Backoff = c.RetryBackoff
	if !c.DisableIdempotence {
		sc.Producer.Idempotent = true
		sc.Net.MaxOpenRequests = 1
	}
	if err := sc.Validate(); err != nil {
		return nil, fmt.Errorf("kafka: sarama config: %w", err)
	}
	return sc, nil
}

// checkBrokers reports broker addresses that are not host:port: a URL or
// credentials (user:password@host:port) would reach sarama's dial errors,
// password included. Credentials belong in the sarama configuration
// (Net.SASL). The addresses are redacted in the message.
func checkBrokers(what string, brokers []string) []error {
	var errs []error
	for i, b := range brokers {
		if strings.Contains(b, "@") || strings.Contains(b, "://") {
			errs = append(errs, fmt.Errorf("kafka: %s.Brokers[%d] %q is not host:port: give bare addresses, and credentials in Sarama.Net.SASL", what, i, redact.StringWith(b, addrSecrets(b)...)))
		}
	}
	return errs
}

// secrets returns the credentials in the brokers' addresses and sc, for
// redact.ErrorWith: sarama's errors quote broker addresses, and nothing may
// echo a password.
func secrets(brokers []string, sc *sarama.Config) []string {
	var s []string
	for _, b := range brokers {
		s = append(s, addrSecrets(b)...)
	}
	if sc != nil {
		s = append(s, sc.Net.SASL.Password, sc.Net.SASL.GSSAPI.Password)
	}
	return s
}

// addrSecrets returns the password (or the lone user name, which may be a
// token) of a broker address written as [scheme://]user[:password]@host.
func addrSecrets(addr string) []string {
	at := strings.LastIndex(addr, "@")
	if at < 0 {
		return nil
	}
	ui := addr[:at]
	if i := strings.Index(ui, "://"); i >= 0 {
		ui = ui[i+3:]
	}
	if _, pw, ok := strings.Cut(ui, ":"); ok {
		return []string{pw}
	}
	return []string{ui}
}

// Publisher publishes to Kafka through a sarama SyncProducer, each
// message marshalled by watermill-kafka's marshaler (NewMarshaler). Its
// errors never show the credentials of its configuration.
type Publisher struct {
	guarded *pubguard.Publisher
}

var _ message.Publisher = (*Publisher)(nil)

// Publish publishes msgs to topic and returns once the brokers
// acknowledged every record. It hands sarama all of a call's records at
// once (SendMessages), which sends them in as few produce requests as it
// can, instead of waiting for each record's acknowledgement before the
// next (watermill-kafka's publisher): a relay's call of 64 events takes
// a round trip or two, not 64. Records of one partition keep the call's
// order (the idempotent producer, one request in flight per broker).
// When records of a call of several fail, the error is the first failed
// one's, in call order, with how many failed, as a *relay.PartialError
// whose Stored marks the records the brokers acknowledged: the relay
// settles those and publishes only the others again (Kafka does not drop
// repeats). When none was stored, or the call failed as a whole (a
// message that does not marshal), the error is a plain one: every record
// counts as not stored. Errors are redacted
// (package redact); errors.As still finds the PartialError. Once Close
// has begun it fails with "publisher closed".
func (p *Publisher) Publish(topic string, msgs ...*message.Message) error {
	return p.guarded.Publish(topic, msgs...)
}

// Close waits for the Publish calls under way, then closes the producer.
func (p *Publisher) Close() error { return p.guarded.Close() }

// producer is the publisher behind the guard.
type producer struct {
	sp sarama.SyncProducer
	m  wmkafka.Marshaler
}

func (p producer) Publish(topic string, msgs ...*message.Message) error {
	pms := make([]*sarama.ProducerMessage, len(msgs))
	for i, msg := range msgs {
		pm, err := p.m.Marshal(topic, msg)
		if err != nil {
			return fmt.Errorf("cannot marshal message %s: %w", msg.UUID, err)
		}
		pms[i] = pm
	}
	switch len(pms) {
	case 0:
		return nil
	case 1:
		if _, _, err := p.sp.SendMessage(pms[0]); err != nil {
			return fmt.Errorf("cannot produce message %s: %w", msgs[0].UUID, refusal(err))
		}
		return nil
	}
	err := p.sp.SendMessages(pms)
	var failed sarama.ProducerErrors
	if !errors.As(err, &failed) || len(failed) == 0 {
		if err != nil {
			return fmt.Errorf("cannot produce %d messages: %w", len(pms), err)
		}
		return nil
	}
	// SendMessages (sarama 1.43 sync_producer.go) answers every record:
	// nil when it came back on Successes, which sarama fills only with
	// records a produce response acknowledged (ErrNoError, or
	// ErrDuplicateSequenceNumber: stored by an earlier attempt; without
	// a response only under RequiredAcks NoResponse, which saramaConfig
	// overrides), else a ProducerError in failed. A record absent from
	// failed was therefore stored.
	at := make(map[*sarama.ProducerMessage]int, len(pms))
	for i, pm := range pms {
		at[pm] = i
	}
	stored := make([]bool, len(pms))
	for i := range stored {
		stored[i] = true
	}
	first := len(pms) // the first failed record in call order: the relay reports it
	var firstErr error
	for _, f := range failed {
		i, ok := at[f.Msg]
		if !ok {
			// Not a record of this call: sarama's answer cannot be
			// trusted per record, so nothing counts as stored.
			return fmt.Errorf("cannot produce %d messages (%d failed): %w", len(pms), len(failed), failed[0].Err)
		}
		stored[i] = false
		if i < first {
			first, firstErr = i, refusal(f.Err)
		}
	}
	return relay.Partial(fmt.Errorf("cannot produce message %s (%d of %d failed): %w", msgs[first].UUID, len(failed), len(pms), firstErr), stored)
}

func (p producer) Close() error { return p.sp.Close() }

// refusal marks a record's error permanent (relay.Permanent) when sarama
// refused the record itself for its size, over Producer.MaxMessageBytes:
// no retry sends it, so the polling relay fails its row at once and the
// streaming relay parks it at once, instead of retrying it, or, with a
// few such events and no other, taking them for a broker outage. A
// broker's refusal for size (ErrMessageSizeTooLarge) is not: it also
// fails the records batched with the big one, which a retry sends.
func refusal(err error) error {
	var ce sarama.ConfigurationError
	if errors.As(err, &ce) && strings.HasPrefix(string(ce), "Attempt to produce message larger than configured Producer.MaxMessageBytes") {
		return relay.Permanent(err)
	}
	return err
}

// NewPublisher returns a Publisher (a sarama SyncProducer: Publish returns
// after the brokers acknowledged the records) whose records are keyed by
// the outbox key. Its errors, and NewPublisher's, are redacted: the SASL
// password and any credentials in an address are masked (errors.Is and
// errors.As still see sarama's errors).
func NewPublisher(cfg PublisherConfig) (*Publisher, error) {
	cfg.setDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	sc, err := cfg.saramaConfig()
	if err != nil {
		return nil, redact.ErrorWith(err, secrets(cfg.Brokers, cfg.Sarama)...)
	}
	sec := secrets(cfg.Brokers, sc)
	sp, err := sarama.NewSyncProducer(cfg.Brokers, sc)
	if err != nil {
		return nil, redact.ErrorWith(fmt.Errorf("kafka: cannot create Kafka producer: %w", err), sec...)
	}
	return &Publisher{guarded: pubguard.New(producer{sp: sp, m: NewMarshaler(cfg.PartitionKey)}, sec)}, nil
}

// SubscriberConfig configures a Subscriber for the consumers of outbox
// events.
type SubscriberConfig struct {
	// Brokers are the bootstrap brokers ("host:port"). Required.
	Brokers []string

	// ConsumerGroup is the Kafka consumer group. Required: a group reads
	// each partition with one member at a time, which keeps per-key
	// order, and commits offsets so a restart resumes.
	ConsumerGroup string

	// ClientID names the client (default "outboxgen-consumer").
	ClientID string

	// Version is the Kafka protocol version (default DefaultVersion).
	Version sarama.KafkaVersion

	// FromNewest starts a group without committed offsets at the end of
	// the partitions; by default it starts at the oldest record, so no
	// event published before the group's first start is skipped.
	FromNewest bool

	// NackResendSleep is the wait before a Nacked message is delivered
	// again (default 100ms). The partition waits with it: per-key order
	// holds across Nacks.
	NackResendSleep time.Duration

	// Sarama, if set, is the base sarama configuration (TLS, SASL...).
	Sarama *sarama.Config

	// Logger receives watermill's logs (default: none).
	Logger *slog.Logger
}

func (c *SubscriberConfig) setDefaults() {
	if c.ClientID == "" {
		c.ClientID = DefaultSubscriberID
	}
	if c.Version == (sarama.KafkaVersion{}) {
		c.Version = DefaultVersion
	}
}

// Validate reports every invalid setting.
func (c SubscriberConfig) Validate() error {
	var errs []error
	if len(c.Brokers) == 0 {
		errs = append(errs, errors.New("kafka: SubscriberConfig.Brokers is empty: list at least one bootstrap broker host:port"))
	}
	errs = append(errs, checkBrokers("SubscriberConfig", c.Brokers)...)
	if c.ConsumerGroup == "" {
		errs = append(errs, errors.New("kafka: SubscriberConfig.ConsumerGroup is empty: name the consumer group (it keeps per-partition order and offsets)"))
	}
	if c.NackResendSleep < 0 && c.NackResendSleep != wmkafka.NoSleep {
		errs = append(errs, fmt.Errorf("kafka: SubscriberConfig.NackResendSleep is %s: use a positive duration, 0 for 100ms or kafka.NoSleep", c.NackResendSleep))
	}
	return errors.Join(errs...)
}

// Subscriber is the watermill-kafka consumer-group subscriber
// NewSubscriber returns. Its errors never show the credentials of its
// configuration.
type Subscriber struct {
	*wmkafka.Subscriber
	secrets []string
}

var _ message.Subscriber = (*Subscriber)(nil)

// Subscribe joins the consumer group for topic (connecting on the first
// call). Errors are redacted (package redact).
func (s *Subscriber) Subscribe(ctx context.Context, topic string) (<-chan *message.Message, error) {
	ch, err := s.Subscriber.Subscribe(ctx, topic)
	return ch, redact.ErrorWith(err, s.secrets...)
}

// NewSubscriber returns a watermill-kafka consumer-group subscriber.
// Messages carry UUID = event_id and the relay's metadata; the record key
// is not exposed (it equals relay.MetadataKey). Errors are redacted as
// NewPublisher's.
func NewSubscriber(cfg SubscriberConfig) (*Subscriber, error) {
	cfg.setDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	sc := wmkafka.DefaultSaramaSubscriberConfig()
	if cfg.Sarama != nil {
		cp := *cfg.Sarama
		sc = &cp
	}
	sc.ClientID = cfg.ClientID
	sc.Version = cfg.Version
	sc.Consumer.Return.Errors = true
	sc.Consumer.Offsets.Initial = sarama.OffsetOldest
	if cfg.FromNewest {
		sc.Consumer.Offsets.Initial = sarama.OffsetNewest
	}
	sec := secrets(cfg.Brokers, sc)
	if err := sc.Validate(); err != nil {
		return nil, redact.ErrorWith(fmt.Errorf("kafka: sarama config: %w", err), sec...)
	}
	sub, err := wmkafka.NewSubscriber(wmkafka.SubscriberConfig{
		Brokers:               cfg.Brokers,
		Unmarshaler:           NewMarshaler(nil),
		OverwriteSaramaConfig: sc,
		ConsumerGroup:         cfg.ConsumerGroup,
		NackResendSleep:       cfg.NackResendSleep,
	}, wmlog.Adapter(cfg.Logger))
	if err != nil {
		return nil, redact.ErrorWith(fmt.Errorf("kafka: %w", err), sec...)
	}
	return &Subscriber{Subscriber: sub, secrets: sec}, nil
}
