package natsjs

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	wmnats "github.com/ThreeDotsLabs/watermill-nats/v2/pkg/nats"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/nats-io/nats.go"

	"github.com/outboxgen/outboxgen/runtime/internal/wmlog"
	"github.com/outboxgen/outboxgen/runtime/redact"
)

// SubscriberConfig configures a Subscriber for the consumers of outbox
// events.
type SubscriberConfig struct {
	// URL is the NATS server URL (default nats.DefaultURL). Ignored when
	// Conn is set.
	URL string

	// Conn is an existing connection. Close drains it (watermill-nats
	// does so), so give the subscriber a connection of its own.
	Conn *nats.Conn

	// NatsOptions are applied when the subscriber connects to URL, after
	// the package's default (reconnect forever).
	NatsOptions []nats.Option

	// Durable names the JetStream consumer so that it survives restarts
	// and resumes after the last acknowledged message. The consumer of a
	// topic is named Durable + "_" + the topic with dots replaced by '_'
	// ("billing" and "orders.paid" → "billing_orders_paid"), so one
	// subscriber can subscribe to several topics. Empty: an ephemeral
	// consumer that starts at the beginning of the stream.
	Durable string

	// QueueGroup, if set, spreads the messages of a topic over every
	// subscriber with the same QueueGroup (and Durable). Leave it empty
	// when one process must see a key's events in order.
	QueueGroup string

	// SubscribersCount is the number of subscriptions per topic (default
	// 1). More than one needs QueueGroup and gives up per-key order.
	SubscribersCount int

	// AckWait is how long a message may stay unacknowledged before
	// JetStream redelivers it (default 30s).
	AckWait time.Duration

	// NakDelay, if set, delays redelivery after a Nack.
	NakDelay wmnats.Delay

	// SubscribeOptions are added to the defaults (deliver all, explicit
	// ack, manual ack, AckWait).
	SubscribeOptions []nats.SubOpt

	// AutoProvision creates the topic's stream before subscribing, as
	// Config.AutoProvision does for publishers (same DuplicateWindow,
	// StreamName, ConfigureStream).
	AutoProvision   bool
	DuplicateWindow time.Duration
	StreamName      func(topic string) string
	ConfigureStream func(topic string, cfg *nats.StreamConfig)

	// CloseTimeout bounds how long Close waits for in-flight messages
	// (default 30s).
	CloseTimeout time.Duration

	// Logger receives watermill's logs (default: none).
	Logger *slog.Logger
}

func (c *SubscriberConfig) setDefaults() {
	if c.URL == "" && c.Conn == nil {
		c.URL = nats.DefaultURL
	}
	if c.SubscribersCount == 0 {
		c.SubscribersCount = 1
	}
	if c.AckWait == 0 {
		c.AckWait = DefaultAckWait
	}
	if c.DuplicateWindow == 0 {
		c.DuplicateWindow = DefaultDuplicateWindow
	}
	if c.StreamName == nil {
		c.StreamName = DefaultStreamName
	}
	if c.CloseTimeout == 0 {
		c.CloseTimeout = 30 * time.Second
	}
}

// Validate reports every invalid setting. It checks the configuration as
// given; NewSubscriber applies the defaults first.
func (c SubscriberConfig) Validate() error {
	var errs []error
	if c.URL == "" && c.Conn == nil {
		errs = append(errs, errors.New("natsjs: SubscriberConfig.URL is empty and SubscriberConfig.Conn is nil: set one of them"))
	}
	if c.SubscribersCount < 1 {
		errs = append(errs, fmt.Errorf("natsjs: SubscriberConfig.SubscribersCount is %d: use at least 1 (or 0 for 1)", c.SubscribersCount))
	} else if c.SubscribersCount > 1 && c.QueueGroup == "" {
		errs = append(errs, fmt.Errorf("natsjs: SubscriberConfig.SubscribersCount is %d without a QueueGroup: every subscription would receive every message; set QueueGroup", c.SubscribersCount))
	}
	if c.AckWait <= 0 {
		errs = append(errs, fmt.Errorf("natsjs: SubscriberConfig.AckWait is %s: use a positive duration (or 0 for %s)", c.AckWait, DefaultAckWait))
	}
	if c.DuplicateWindow <= 0 {
		errs = append(errs, fmt.Errorf("natsjs: SubscriberConfig.DuplicateWindow is %s: use a positive duration (or 0 for %s)", c.DuplicateWindow, DefaultDuplicateWindow))
	}
	if c.CloseTimeout <= 0 {
		errs = append(errs, fmt.Errorf("natsjs: SubscriberConfig.CloseTimeout is %s: use a positive duration (or 0 for 30s)", c.CloseTimeout))
	}
	if c.StreamName == nil {
		errs = append(errs, errors.New("natsjs: SubscriberConfig.StreamName must be left nil before NewSubscriber to get its default"))
	}
	for _, name := range []string{c.Durable, c.QueueGroup} {
		if err := checkConsumerName(name); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// Subscriber is a watermill message.Subscriber over JetStream push
// consumers (watermill-nats/v2 with JetStream enabled). Messages carry the
// relay's metadata and UUID = event_id; deduplicate by it (JetStream
// redelivers unacknowledged messages, and the relay may re-send after the
// duplicate window).
type Subscriber struct {
	*wmnats.Subscriber

	conn          *nats.Conn
	autoProvision bool
	prov          *provisioner
	secrets       []string // masked in every error (redact.ErrorWith)
}

var _ message.Subscriber = (*Subscriber)(nil)

// NewSubscriber connects (unless cfg.Conn is set) and returns a subscriber.
// Its errors, and Subscribe's, are redacted as NewPublisher's.
func NewSubscriber(cfg SubscriberConfig) (*Subscriber, error) {
	cfg.setDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	conn, js, own, err := connectJetStream(cfg.Conn, cfg.URL, cfg.NatsOptions)
	if err != nil {
		return nil, err
	}
	sec := connSecrets(conn, cfg.URL)
	opts := append([]nats.SubOpt{nats.DeliverAll(), nats.AckExplicit(), nats.ManualAck(), nats.AckWait(cfg.AckWait)}, cfg.SubscribeOptions...)
	queue := cfg.QueueGroup
	sub, err := wmnats.NewSubscriberWithNatsConn(conn, wmnats.SubscriberSubscriptionConfig{
		Unmarshaler:      Marshaler{},
		SubscribersCount: cfg.SubscribersCount,
		AckWaitTimeout:   cfg.AckWait,
		CloseTimeout:     cfg.CloseTimeout,
		NakDelay:         cfg.NakDelay,
		QueueGroupPrefix: queue,
		SubjectCalculator: func(queueGroupPrefix, topic string) *wmnats.SubjectDetail {
			return &wmnats.SubjectDetail{Primary: topic, QueueGroup: queueGroupPrefix}
		},
		JetStream: wmnats.JetStreamConfig{
			AutoProvision:    false, // ours, see Config.AutoProvision
			SubscribeOptions: opts,
			DurablePrefix:    cfg.Durable,
			DurableCalculator: func(prefix, topic string) string {
				if prefix == "" {
					return ""
				}
				return DurableName(prefix, topic)
			},
		},
	}, wmlog.Adapter(cfg.Logger))
	if err != nil {
		closeIfOwned(conn, own)
		return nil, redact.ErrorWith(fmt.Errorf("natsjs: %w", err), sec...)
	}
	return &Subscriber{
		Subscriber:    sub,
		conn:          conn,
		autoProvision: cfg.AutoProvision,
		prov:          newProvisioner(js, cfg.DuplicateWindow, cfg.StreamName, cfg.ConfigureStream),
		secrets:       sec,
	}, nil
}

// Conn returns the subscriber's NATS connection. Subscriber.Close (from
// watermill-nats) drains it.
func (s *Subscriber) Conn() *nats.Conn { return s.conn }

// Subscribe subscribes to the subject topic (wildcards allowed, e.g.
// "orders.>", when no provisioning is needed).
func (s *Subscriber) Subscribe(ctx context.Context, topic string) (<-chan *message.Message, error) {
	if s.autoProvision {
		if err := ValidateTopic(topic); err != nil {
			return nil, err
		}
		if err := s.prov.ensure(topic); err != nil {
			return nil, redact.ErrorWith(err, s.secrets...)
		}
	}
	ch, err := s.Subscriber.Subscribe(ctx, topic)
	return ch, redact.ErrorWith(err, s.secrets...)
}

// DurableName returns the consumer name of a durable subscriber for topic:
// prefix + "_" + topic with '.', '*' and '>' replaced by '_'.
func DurableName(prefix, topic string) string {
	b := []byte(prefix + "_" + topic)
	for i, c := range b {
		if c == '.' || c == '*' || c == '>' {
			b[i] = '_'
		}
	}
	return string(b)
}

func checkConsumerName(name string) error {
	for _, r := range name {
		if r <= ' ' || r == '.' || r == '*' || r == '>' || r == '/' || r == '\\' || r == 0x7f {
			return fmt.Errorf("natsjs: consumer or queue name %q contains %q: use letters, digits, '_' and '-'", name, r)
		}
	}
	return nil
}
