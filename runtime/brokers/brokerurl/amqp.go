package brokerurl

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"time"

	wmamqp "github.com/ThreeDotsLabs/watermill-amqp/v3/pkg/amqp"
	"github.com/ThreeDotsLabs/watermill/message"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/outboxgen/outboxgen/runtime/brokers/internal/msgctx"
	"github.com/outboxgen/outboxgen/runtime/internal/pubguard"
	"github.com/outboxgen/outboxgen/runtime/relay"
)

// Defaults of amqp:// URLs.
const (
	// DefaultAMQPExchange is the exchange of amqp:// URLs without
	// exchange=.
	DefaultAMQPExchange = "outbox"
	// DefaultAMQPHeartbeat is the AMQP heartbeat interval: a dead
	// connection is noticed (and an unconfirmed Publish fails) within
	// about twice this.
	DefaultAMQPHeartbeat = 10 * time.Second
)

type amqpSettings struct {
	uri          string // without brokerurl's parameters
	exchange     string
	exchangeType string
	durable      bool
	queue        string
	prefetch     int64
}

func amqpParse(u *brokerURL) (amqpSettings, error) {
	s := amqpSettings{exchange: DefaultAMQPExchange, exchangeType: "topic"}
	var err error
	if v, ok := u.take("exchange"); ok {
		if v == "" {
			return s, u.errorf("parameter exchange is empty: name an exchange (default %q)", DefaultAMQPExchange)
		}
		s.exchange = v
	}
	if v, ok := u.take("exchange_type"); ok {
		switch v {
		case "topic", "direct", "fanout":
			s.exchangeType = v
		default:
			return s, u.errorf("parameter exchange_type=%q: use topic, direct or fanout", v)
		}
	}
	if s.durable, err = u.takeBool("durable", true); err != nil {
		return s, err
	}
	s.queue, _ = u.take("queue")
	if s.prefetch, err = u.takeInt("prefetch", 1); err != nil {
		return s, err
	}
	if s.prefetch < 1 || s.prefetch > 65535 {
		return s, u.errorf("parameter prefetch=%d: use 1 to 65535", s.prefetch)
	}
	// The rest (heartbeat, connection_timeout, TLS files...) is
	// amqp091-go's.
	s.uri = u.baseWithQuery()
	if _, err := amqp.ParseURI(s.uri); err != nil {
		return s, u.wrap("bad AMQP URL (write amqp://user:pass@host:5672/vhost)", err)
	}
	return s, nil
}

// config is the settings for watermill-amqp's marshaler and topology
// builder; the connection's Dial is amqpConn's.
func (s amqpSettings) config() wmamqp.Config {
	c := wmamqp.Config{
		Connection: wmamqp.ConnectionConfig{
			AmqpURI: s.uri,
			AmqpConfig: &amqp.Config{
				Heartbeat: DefaultAMQPHeartbeat,
				Locale:    "en_US",
				Properties: amqp.Table{
					"product": "outboxgen",
				},
			},
			Reconnect: wmamqp.DefaultReconnectConfig(),
		},
		Marshaler: amqpMarshaler{wmamqp.DefaultMarshaler{
			NotPersistentDeliveryMode: !s.durable,
			// The message id is the event id, for tools that look at
			// AMQP properties; the UUID also travels in the
			// _watermill_message_uuid header.
			PostprocessPublishing: func(p amqp.Publishing) amqp.Publishing {
				if id, ok := p.Headers[wmamqp.DefaultMessageUUIDHeaderKey].(string); ok {
					p.MessageId = id
				}
				return p
			},
		}},
		Exchange: wmamqp.ExchangeConfig{
			GenerateName: wmamqp.GenerateExchangeNameConstant(s.exchange),
			Type:         s.exchangeType,
			Durable:      s.durable,
		},
		Queue: wmamqp.QueueConfig{
			Durable: s.durable,
		},
		QueueBind: wmamqp.QueueBindConfig{
			GenerateRoutingKey: func(topic string) string { return topic },
		},
		Publish: wmamqp.PublishConfig{
			GenerateRoutingKey: func(topic string) string { return topic },
			// Publish returns once the broker confirmed the message.
			ConfirmDelivery: true,
		},
		Consume: wmamqp.ConsumeConfig{
			Qos: wmamqp.QosConfig{PrefetchCount: int(s.prefetch)},
		},
		TopologyBuilder: &wmamqp.DefaultTopologyBuilder{},
	}
	return c
}

func openAMQP(ctx context.Context, u *brokerURL, opt Options) (message.Publisher, error) {
	if _, ok := u.query["queue"]; ok {
		return nil, u.errorf("parameter queue= is for subscribers: a publisher sends to the exchange (exchange=)")
	}
	s, err := amqpParse(u)
	if err != nil {
		return nil, err
	}
	cfg := s.config()
	conn, err := dialAMQP(ctx, cfg.Connection.AmqpURI, *cfg.Connection.AmqpConfig, opt.ConnectTimeout, opt.Logger, u.secrets, amqpPublishesMeanwhile)
	if err != nil {
		return nil, u.wrap("connect to AMQP", err)
	}
	p := &amqpProducer{conn: conn, cfg: cfg, idle: make(chan amqpChannel, amqpIdleChannels), declared: map[string]uint64{}}
	return &amqpPublisher{pubguard.New(p, u.secrets)}, nil
}

// amqpPublisher sends to the exchange with topic as routing key and waits
// for the broker's confirms, behind a guard, safe to close while Publish
// calls are under way, with redacted errors (package pubguard).
type amqpPublisher struct{ *pubguard.Publisher }

// amqpIdleChannels is how many confirm-mode channels a publisher keeps
// between calls (more calls at once open more, closed after them).
const amqpIdleChannels = 16

// amqpProducer publishes a call's messages on one channel in confirm
// mode, all of them before it waits for their confirms, so a call takes
// a round trip, not one per message (watermill-amqp's publisher waited
// for each message's confirm before the next, on a channel opened for
// the call). It keeps its channels for the next calls. Its connection
// reconnects (amqpConn).
type amqpProducer struct {
	conn *amqpConn
	cfg  wmamqp.Config
	idle chan amqpChannel

	mu       sync.Mutex
	declared map[string]uint64 // exchange → the connection (amqpConn's generation) it was declared on
}

// amqpChannel is a confirm-mode channel and its connection's generation.
type amqpChannel struct {
	*amqp.Channel
	gen uint64
}

// Publish sends msgs on one channel and waits for all their confirms
// (bounded by the messages' contexts). When the broker refused some (a
// full queue with x-overflow reject-publish, say), or the channel closed
// or the wait ended before their confirms, the error names the first; when
// others were stored, it is a *relay.PartialError saying which, and the
// relay sends only the others again. A failed call's channel is not kept
// (put).
func (p *amqpProducer) Publish(topic string, msgs ...*message.Message) (err error) {
	ch, err := p.channel()
	if errors.Is(err, errAMQPReconnecting) {
		return err
	}
	if err != nil {
		return fmt.Errorf("cannot open channel: %w", err)
	}
	defer func() { p.put(ch, err) }()
	exchange := p.cfg.Exchange.GenerateName(topic)
	if err := p.declare(ch, exchange); err != nil {
		return err
	}
	key := p.cfg.Publish.GenerateRoutingKey(topic)
	// Marshalled before any is sent, so that a message that cannot be
	// leaves none of the call published.
	pms := make([]amqp.Publishing, len(msgs))
	for i, msg := range msgs {
		if pms[i], err = p.cfg.Marshaler.Marshal(msg); err != nil {
			return fmt.Errorf("cannot marshal message %s: %w", msg.UUID, err)
		}
	}
	ctx, stop := msgctx.Any(msgs)
	defer stop()
	var unsent error // of the first message not sent; the others were not either
	confirms := make([]*amqp.DeferredConfirmation, 0, len(msgs))
	for i, pm := range pms {
		dc, err := ch.PublishWithDeferredConfirmWithContext(ctx, exchange, key, p.cfg.Publish.Mandatory, p.cfg.Publish.Immediate, pm)
		if err != nil {
			unsent = fmt.Errorf("cannot publish message %s: %w", msgs[i].UUID, err)
			break
		}
		confirms = append(confirms, dc)
	}
	// Every confirm is awaited, not only those up to the first refusal,
	// so that the error says which messages the broker stored: the relay
	// sends only the others again (a queue stores a message sent twice
	// twice). A channel that closes nacks the confirms it still owed
	// (amqp091's DeferredConfirmation), and a message whose confirm did
	// not come before ctx ended counts as not stored too.
	var first error // the call's error: of the first message not stored
	stored := make([]bool, len(msgs))
	for i, dc := range confirms {
		select {
		case <-dc.Done():
		case <-ctx.Done():
		}
		if stored[i] = dc.Acked(); stored[i] || first != nil {
			continue
		}
		select {
		case <-dc.Done():
			first = fmt.Errorf("delivery not confirmed for message [%s] (the broker refused it, or the channel closed)", msgs[i].UUID)
		default:
			first = fmt.Errorf("message %s: no confirm: %w", msgs[i].UUID, context.Cause(ctx))
		}
	}
	if first == nil {
		first = unsent
	}
	return relay.Partial(first, stored)
}

// channel is an idle channel, or a new one in confirm mode.
func (p *amqpProducer) channel() (amqpChannel, error) {
	for {
		select {
		case ch := <-p.idle:
			if !ch.IsClosed() { // closed: the connection was lost since
				return ch, nil
			}
		default:
			conn, gen, err := p.conn.current()
			if err != nil {
				return amqpChannel{}, err
			}
			ch, err := conn.Channel()
			if err != nil {
				return amqpChannel{}, err
			}
			if err := ch.Confirm(false); err != nil {
				ch.Close() //nolint:errcheck
				return amqpChannel{}, err
			}
			return amqpChannel{ch, gen}, nil
		}
	}
}

// put keeps ch for another call, unless the call failed (a context that
// ended leaves confirms behind, and the failure may be the channel's) or
// enough are kept.
func (p *amqpProducer) put(ch amqpChannel, err error) {
	if err == nil {
		select {
		case p.idle <- ch:
			return
		default:
		}
	}
	// Not waited for: closing a channel waits for the broker, which the
	// call may have given up on.
	go ch.Close() //nolint:errcheck // the call's error, if any, says more
}

// declare declares exchange once per connection (none for the default
// exchange, ""): after a reconnect again, since a broker that restarted
// has lost an exchange that is not durable (durable=false).
func (p *amqpProducer) declare(ch amqpChannel, exchange string) error {
	if exchange == "" {
		return nil
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.declared[exchange] == ch.gen {
		return nil
	}
	if err := p.cfg.TopologyBuilder.ExchangeDeclare(ch.Channel, exchange, p.cfg); err != nil {
		return err
	}
	p.declared[exchange] = ch.gen
	return nil
}

// Close closes the connection, and with it the kept channels (each
// channel's own close would wait for the broker's answer).
func (p *amqpProducer) Close() error {
	return p.conn.Close()
}

// amqpMarshaler is watermill-amqp's DefaultMarshaler, except that a
// header whose value is not a string becomes metadata in text instead of
// failing the delivery. RabbitMQ adds such headers itself (x-death when a
// message was dead-lettered, x-delivery-count when a quorum queue
// delivers it again, x-shovelled), and the default marshaler's error
// nacks the message back to its queue, where it fails again: a loop that
// stalls the queue and, under a delivery limit, drops the event.
type amqpMarshaler struct{ wmamqp.DefaultMarshaler }

// Unmarshal implements wmamqp.Marshaler.
func (m amqpMarshaler) Unmarshal(d amqp.Delivery) (*message.Message, error) {
	for _, v := range d.Headers {
		if _, text := v.(string); !text {
			// Copied, not converted in place: the delivery's table is the
			// caller's.
			h := make(amqp.Table, len(d.Headers))
			for k, v := range d.Headers {
				h[k] = headerText(v)
			}
			d.Headers = h
			break
		}
	}
	return m.DefaultMarshaler.Unmarshal(d)
}

// headerText is an AMQP header value as text: strings as they are, times
// in RFC 3339, tables and arrays (x-death) in JSON, other values as Go
// prints them.
func headerText(v any) string {
	switch v := v.(type) {
	case string:
		return v
	case []byte:
		return string(v)
	case nil:
		return ""
	case time.Time:
		return v.UTC().Format(time.RFC3339Nano)
	case amqp.Table, []any:
		if b, err := json.Marshal(v); err == nil {
			return string(b)
		}
	}
	return fmt.Sprint(v)
}
