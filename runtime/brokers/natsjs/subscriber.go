package natsjs

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"

	wmnats "github.com/ThreeDotsLabs/watermill-nats/v2/pkg/nats"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/nats-io/nats.go"

	"github.com/outboxgen/outboxgen/runtime/redact"
)

// SubscriberConfig configures a Subscriber for the consumers of outbox
// events.
type SubscriberConfig struct {
	// URL is the NATS server URL (default nats.DefaultURL). Ignored when
	// Conn is set.
	URL string

	// Conn is an existing connection. Close drains it, so give the
	// subscriber a connection of its own.
	Conn *nats.Conn

	// NatsOptions are applied when the subscriber connects to URL, after
	// the package's default (reconnect forever).
	NatsOptions []nats.Option

	// Durable names the JetStream consumer so that it survives restarts
	// and resumes after the last acknowledged message. The consumer of a
	// topic is named Durable + "_" + the topic with dots replaced by '_'
	// ("billing" and "orders.paid" → "billing_orders_paid"), so one
	// subscriber can subscribe to several topics. Empty: an ephemeral
	// consumer that starts at the beginning of the stream and is deleted
	// when the subscription ends. See the package doc, "Durable
	// consumers".
	Durable string

	// QueueGroup, if set, spreads the messages of a topic over every
	// subscriber with the same QueueGroup and Durable (it needs Durable:
	// the consumer the group shares must outlive each member). Leave it
	// empty when one process must see a key's events in order.
	QueueGroup string

	// SubscribersCount is the number of subscriptions per topic (default
	// 1). More than one needs QueueGroup and gives up per-key order.
	SubscribersCount int

	// AckWait is how long a message may stay unacknowledged before
	// JetStream redelivers it (default 30s). It is set on the consumer,
	// also on an existing durable one (unless that has a BackOff).
	AckWait time.Duration

	// NakDelay, if set, delays redelivery after a Nack.
	NakDelay wmnats.Delay

	// SubscribeOptions are added to the subscription's options (manual
	// ack; for an ephemeral consumer also deliver all, explicit ack and
	// AckWait). A durable consumer is created by the subscriber, not by
	// these options: set its configuration with ConfigureConsumer; options
	// that ask for other settings than an existing consumer's fail the
	// Subscribe.
	SubscribeOptions []nats.SubOpt

	// ConfigureConsumer, if set, adjusts the configuration of a durable
	// consumer the subscriber creates (deliver all, explicit ack, the
	// topic as filter; its name, deliver subject, deliver group and
	// AckWait are the subscriber's). An existing consumer keeps its
	// configuration, but for AckWait.
	ConfigureConsumer func(topic string, cfg *nats.ConsumerConfig)

	// AutoProvision creates the topic's stream before subscribing, as
	// Config.AutoProvision does for publishers (same DuplicateWindow,
	// StreamName, ConfigureStream).
	AutoProvision   bool
	DuplicateWindow time.Duration
	StreamName      func(topic string) string
	ConfigureStream func(topic string, cfg *nats.StreamConfig)

	// CloseTimeout bounds how long Close waits for the subscriptions'
	// deliveries under way to return (default 30s). Close does not wait
	// for the consumer to acknowledge what it holds: a message not
	// acknowledged by then is given back (see Subscribe), and a handler
	// still running then may see it delivered again elsewhere meanwhile
	// (a watermill Router closes its subscriber before it waits for its
	// handlers): consumers deduplicate by event id.
	CloseTimeout time.Duration

	// Logger receives the subscriber's logs: messages that cannot be read,
	// failed acks and nacks (default: none).
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
	if c.QueueGroup != "" && c.Durable == "" {
		errs = append(errs, fmt.Errorf("natsjs: SubscriberConfig.QueueGroup %q without Durable: the consumer a queue group shares must be durable, or it goes away with the member that created it; set Durable", c.QueueGroup))
	}
	for _, name := range []string{c.Durable, c.QueueGroup} {
		if err := checkConsumerName(name); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// Subscriber is a watermill message.Subscriber over JetStream push
// consumers. Messages carry the relay's metadata and UUID = event_id;
// deduplicate by it (JetStream redelivers unacknowledged messages, and the
// relay may re-send after the duplicate window).
//
// It does what watermill-nats/v2's subscriber does, but for two things
// that matter when a subscription ends. Its output channel is closed only
// once every delivery callback of that subscription has returned:
// watermill-nats (v2.1.3) closes it as soon as Unsubscribe returns, which
// does not wait for a callback under way, and that callback's send on the
// closed channel panics and takes the consuming process down. And a
// durable consumer outlives the subscription (see the package doc).
type Subscriber struct {
	cfg           SubscriberConfig
	conn          *nats.Conn
	js            nats.JetStreamContext
	log           *slog.Logger
	autoProvision bool
	prov          *provisioner
	secrets       []string // masked in every error (redact.ErrorWith)

	mu      sync.Mutex
	closed  bool
	closing chan struct{} // closed by Close: every subscription ends
	outputs sync.WaitGroup
}

var _ message.Subscriber = (*Subscriber)(nil)

// NewSubscriber connects (unless cfg.Conn is set) and returns a subscriber.
// Its errors, and Subscribe's, are redacted as NewPublisher's.
func NewSubscriber(cfg SubscriberConfig) (*Subscriber, error) {
	cfg.setDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	conn, js, _, err := connectJetStream(cfg.Conn, cfg.URL, cfg.NatsOptions)
	if err != nil {
		return nil, err
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Subscriber{
		cfg:           cfg,
		conn:          conn,
		js:            js,
		log:           log,
		autoProvision: cfg.AutoProvision,
		prov:          newProvisioner(js, cfg.DuplicateWindow, cfg.StreamName, cfg.ConfigureStream),
		secrets:       connSecrets(conn, cfg.URL),
		closing:       make(chan struct{}),
	}, nil
}

// Conn returns the subscriber's NATS connection. Close drains it.
func (s *Subscriber) Conn() *nats.Conn { return s.conn }

// Subscribe subscribes to the subject topic (wildcards allowed, e.g.
// "orders.>", when no provisioning is needed). The channel is closed once
// ctx is done or Close is called and every delivery under way has
// returned. On a durable consumer, a message handed over and not
// acknowledged by then, and those read ahead, are given back to
// JetStream, which redelivers them to the next subscriber of the consumer
// a second later (giveBackDelay), not after AckWait; ending waits for
// that, at most drainWait (5 s). While the connection is down nothing can
// be given back: they come again after AckWait. An ephemeral consumer is
// deleted as its subscription ends.
func (s *Subscriber) Subscribe(ctx context.Context, topic string) (<-chan *message.Message, error) {
	if s.isClosed() {
		return nil, errClosed
	}
	if s.autoProvision {
		if err := ValidateTopic(topic); err != nil {
			return nil, err
		}
		if err := s.prov.ensure(topic); err != nil {
			return nil, redact.ErrorWith(err, s.secrets...)
		}
	}
	opts := []nats.SubOpt{nats.ManualAck()}
	var c *consumer
	if s.cfg.Durable != "" {
		var err error
		if c, err = s.durable(topic); err != nil {
			return nil, redact.ErrorWith(err, s.secrets...)
		}
		if s.cfg.QueueGroup == "" {
			if err := s.waitUnbound(ctx, c); err != nil {
				return nil, redact.ErrorWith(err, s.secrets...)
			}
		}
		opts = append(opts, nats.Bind(c.stream, c.name))
	} else {
		// An ephemeral consumer of the stream whose subjects hold topic,
		// deleted when the subscription ends.
		opts = append(opts, nats.DeliverAll(), nats.AckExplicit(), nats.AckWait(s.cfg.AckWait))
	}
	opts = append(opts, s.cfg.SubscribeOptions...)
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil, errClosed
	}
	subCtx, end := context.WithCancel(ctx)
	l := &subscription{s: s, topic: topic, ctx: subCtx, output: make(chan *message.Message), opts: opts}
	if err := l.bind(); err != nil {
		end()
		return nil, redact.ErrorWith(err, s.secrets...)
	}
	s.outputs.Add(1)
	go func() {
		defer s.outputs.Done()
		watched := make(chan struct{})
		go func() {
			defer close(watched)
			if c != nil {
				l.watch(c)
			}
		}()
		select {
		case <-subCtx.Done():
		case <-s.closing:
		}
		end()
		<-watched
		// A durable consumer's subscriptions are drained, not just
		// unsubscribed, while connected: the messages read ahead reach
		// deliver, which gives them back (the subscription has ended),
		// as it gives back one its consumer held. Not while
		// disconnected: no UNSUB would reach the server, and a reconnect
		// would subscribe them again, holding the consumer (those
		// messages then come after AckWait). Not an ephemeral consumer:
		// it is deleted as its subscription ends.
		if c != nil && s.conn.IsConnected() {
			l.drain(l.swap(nil))
		} else {
			l.unsubscribe(l.swap(nil))
		}
		// Drain does not wait for a callback under way: wait for them
		// here, so that none sends on the closed channel.
		l.stop()
		close(l.output)
	}()
	return l.output, nil
}

var errClosed = errors.New("natsjs: Subscribe on a closed subscriber")

func (s *Subscriber) isClosed() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.closed
}

// consumer is a durable consumer a subscription binds to.
type consumer struct {
	topic, stream, name string
	// deliver is the deliver subject it is created with (create sets it
	// to the one it has).
	deliver string
}

// consumerCheck is how often a subscription checks that its durable
// consumer still exists.
const consumerCheck = 5 * time.Second

// durable makes sure the durable consumer of topic exists, and returns it.
// The subscriber creates it rather than nats.go's Subscribe: nats.go
// deletes a consumer it created when the subscription ends (Unsubscribe,
// Drain), and the next subscriber would start over at the beginning of the
// stream. An existing consumer is kept, with AckWait brought to the
// configured one (unless it has a BackOff, which sets its AckWait).
func (s *Subscriber) durable(topic string) (*consumer, error) {
	c := &consumer{topic: topic, name: DurableName(s.cfg.Durable, topic)}
	var err error
	if c.stream, err = s.js.StreamNameBySubject(topic); err != nil {
		return nil, fmt.Errorf("natsjs: find the stream of %s (create it, or set AutoProvision): %w", topic, err)
	}
	info, err := s.js.ConsumerInfo(c.stream, c.name)
	switch {
	case errors.Is(err, nats.ErrConsumerNotFound):
		inbox := s.conn.Opts.InboxPrefix // nats.CustomInboxPrefix
		if inbox == "" {
			inbox = strings.TrimSuffix(nats.InboxPrefix, ".")
		}
		// The same deliver subject for every subscriber that creates it
		// at once: their configurations are equal, so they agree. Stream
		// names have no dots.
		c.deliver = inbox + ".outboxgen." + c.stream + "." + c.name
		return c, s.create(c)
	case err != nil:
		return nil, fmt.Errorf("natsjs: read the durable consumer %s on stream %s: %w", c.name, c.stream, err)
	}
	c.deliver = info.Config.DeliverSubject
	switch group := info.Config.DeliverGroup; {
	case c.deliver == "":
		return nil, fmt.Errorf("natsjs: durable consumer %s on stream %s is a pull consumer: the subscriber needs a push consumer; delete it or choose another Durable", c.name, c.stream)
	case group != s.cfg.QueueGroup:
		return nil, fmt.Errorf("natsjs: durable consumer %s on stream %s delivers to queue group %q, the subscriber's QueueGroup is %q: use the same, or another Durable", c.name, c.stream, group, s.cfg.QueueGroup)
	}
	if info.Config.AckWait != s.cfg.AckWait && len(info.Config.BackOff) == 0 {
		cfg := info.Config
		cfg.AckWait = s.cfg.AckWait
		if _, err := s.js.UpdateConsumer(c.stream, &cfg); err != nil {
			return nil, fmt.Errorf("natsjs: change the AckWait of durable consumer %s from %s to %s: %w", c.name, info.Config.AckWait, s.cfg.AckWait, err)
		}
		s.log.Info("natsjs: durable consumer's AckWait changed", slog.String("consumer", c.name), slog.String("from", info.Config.AckWait.String()), slog.String("to", s.cfg.AckWait.String()))
	}
	return c, nil
}

// create creates the durable consumer c: deliver all, explicit ack,
// AckWait, the topic as filter, QueueGroup as deliver group, then
// ConfigureConsumer's changes.
func (s *Subscriber) create(c *consumer) error {
	want := nats.ConsumerConfig{
		Durable:        c.name,
		DeliverSubject: c.deliver,
		DeliverGroup:   s.cfg.QueueGroup,
		DeliverPolicy:  nats.DeliverAllPolicy,
		AckPolicy:      nats.AckExplicitPolicy,
		AckWait:        s.cfg.AckWait,
		FilterSubject:  c.topic,
	}
	if s.cfg.ConfigureConsumer != nil {
		s.cfg.ConfigureConsumer(c.topic, &want)
		want.Durable, want.DeliverSubject, want.DeliverGroup, want.AckWait = c.name, c.deliver, s.cfg.QueueGroup, s.cfg.AckWait
	}
	info, err := s.js.AddConsumer(c.stream, &want)
	if err != nil {
		return fmt.Errorf("natsjs: create the durable consumer %s on stream %s: %w", c.name, c.stream, err)
	}
	// AddConsumer returns an existing consumer whatever its deliver
	// subject (another subscriber created it a moment before): bind to
	// the one it has.
	c.deliver = info.Config.DeliverSubject
	s.log.Info("natsjs: durable consumer created", slog.String("consumer", c.name), slog.String("stream", c.stream), slog.String("topic", c.topic))
	return nil
}

// boundWait bounds how long Subscribe waits for the subscription before
// it on a durable consumer without a queue group to go away.
const boundWait = 30 * time.Second

// waitUnbound waits (at most boundWait) until no subscription is bound to
// the durable consumer: a consumer without a deliver group takes one, and
// the one of a process that just stopped, or that a rolling deploy is
// about to stop, goes away a moment later. A consumer that goes away with
// it (created by that subscription through nats.go, as before this
// package created its own) is created again.
func (s *Subscriber) waitUnbound(ctx context.Context, c *consumer) error {
	deadline := time.Now().Add(boundWait)
	for logged := false; ; {
		info, err := s.js.ConsumerInfo(c.stream, c.name)
		switch {
		case errors.Is(err, nats.ErrConsumerNotFound) && time.Now().Before(deadline):
			if err := s.create(c); err != nil {
				return err
			}
			continue
		case err != nil:
			return fmt.Errorf("natsjs: read the durable consumer %s on stream %s: %w", c.name, c.stream, err)
		case !info.PushBound:
			return nil
		case time.Now().After(deadline):
			return fmt.Errorf("natsjs: durable consumer %s is still bound to another subscription after %s: stop the other subscriber, or give both the same QueueGroup to share the consumer", c.name, boundWait)
		}
		if !logged {
			s.log.Info("natsjs: waiting for the other subscription of the durable consumer to end", slog.String("consumer", c.name), slog.String("stream", c.stream))
			logged = true
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("natsjs: durable consumer %s is bound to another subscription: %w", c.name, context.Cause(ctx))
		case <-s.closing:
			return errClosed
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// bind makes the subscription's SubscribersCount NATS subscriptions and
// puts them in place of the ones it had, which it ends.
func (l *subscription) bind() error {
	s := l.s
	var subs []*nats.Subscription
	for range s.cfg.SubscribersCount {
		sub, err := s.js.QueueSubscribe(l.topic, s.cfg.QueueGroup, l.deliver, l.opts...)
		if err != nil {
			l.unsubscribe(subs)
			return fmt.Errorf("natsjs: subscribe to %s: %w", l.topic, err)
		}
		subs = append(subs, sub)
	}
	l.unsubscribe(l.swap(subs))
	return nil
}

// listening returns the subject the subscription listens on.
func (l *subscription) listening() string {
	l.subsMu.Lock()
	defer l.subsMu.Unlock()
	return l.subject
}

// swap puts subs in place of the subscription's NATS subscriptions and
// returns those.
func (l *subscription) swap(subs []*nats.Subscription) []*nats.Subscription {
	l.subsMu.Lock()
	defer l.subsMu.Unlock()
	old := l.subs
	l.subs = subs
	if len(subs) > 0 {
		l.subject = subs[0].Subject
	}
	return old
}

func (l *subscription) unsubscribe(subs []*nats.Subscription) {
	for _, sub := range subs {
		if err := sub.Unsubscribe(); err != nil && !errors.Is(err, nats.ErrConnectionClosed) {
			l.s.log.Warn("natsjs: unsubscribe failed", slog.String("topic", l.topic), slog.String("error", redact.ErrorWith(err, l.s.secrets...).Error()))
		}
	}
}

// drainWait bounds how long an ending subscription waits for its NATS
// subscriptions to drain (for deliver to give back what they read ahead).
const drainWait = 5 * time.Second

// drain ends subs as unsubscribe does, but has the messages they read
// ahead delivered first (see deliver: a subscription that ended gives
// them back), waiting at most drainWait.
func (l *subscription) drain(subs []*nats.Subscription) {
	deadline := time.NewTimer(drainWait)
	defer deadline.Stop()
	for i, sub := range subs {
		closed := sub.StatusChanged(nats.SubscriptionClosed)
		if err := sub.Drain(); err != nil {
			if !errors.Is(err, nats.ErrConnectionClosed) && !errors.Is(err, nats.ErrBadSubscription) {
				l.s.log.Warn("natsjs: drain failed: what the subscription read ahead comes back after AckWait", slog.String("topic", l.topic), slog.String("error", redact.ErrorWith(err, l.s.secrets...).Error()))
			}
			continue
		}
		select {
		case <-closed:
		case <-deadline.C:
			l.s.log.Warn("natsjs: subscription still draining after its bound: the rest comes back after AckWait", slog.String("topic", l.topic), slog.Duration("waited", drainWait))
			l.unsubscribe(subs[i:])
			return
		}
	}
}

// watch keeps the subscription fed by its durable consumer c until the
// subscription ends. Every consumerCheck it reads the consumer: gone
// (deleted by an operator, by a stream provisioned again, or by a
// subscriber of an older release that created it through nats.go and
// stopped), it creates it again on the deliver subject the subscription
// listens on; it then delivers the stream from its beginning (with the
// default deliver policy; the consumers' inbox drops what they had).
// Delivering elsewhere (another process created it again first, on its
// own deliver subject), the subscription binds to it again.
func (l *subscription) watch(c *consumer) {
	s := l.s
	t := time.NewTicker(consumerCheck)
	defer t.Stop()
	for warned := false; ; {
		select {
		case <-l.ctx.Done():
			return
		case <-t.C:
		}
		info, err := s.js.ConsumerInfo(c.stream, c.name, nats.Context(l.ctx))
		switch {
		case errors.Is(err, nats.ErrConsumerNotFound):
			s.log.Warn("natsjs: durable consumer gone: creating it again, it delivers the stream from its beginning", slog.String("consumer", c.name), slog.String("stream", c.stream))
			c.deliver = l.listening()
			if err := s.create(c); err != nil {
				s.log.Error("natsjs: durable consumer not created again: the subscription receives nothing until it is", slog.String("consumer", c.name), slog.String("error", redact.ErrorWith(err, s.secrets...).Error()))
			}
		case err != nil:
			if !warned && l.ctx.Err() == nil {
				s.log.Warn("natsjs: durable consumer cannot be read: checked again later", slog.String("consumer", c.name), slog.String("stream", c.stream), slog.String("error", redact.ErrorWith(err, s.secrets...).Error()))
				warned = true
			}
		case info.Config.DeliverSubject != l.listening():
			s.log.Warn("natsjs: durable consumer created again by another subscriber, on its deliver subject: binding to it", slog.String("consumer", c.name), slog.String("stream", c.stream))
			if err := l.bind(); err != nil {
				s.log.Error("natsjs: could not bind to the durable consumer again: checked again later", slog.String("consumer", c.name), slog.String("error", redact.ErrorWith(err, s.secrets...).Error()))
			}
		default:
			warned = false
		}
	}
}

// Close ends every subscription, waits (at most CloseTimeout) until their
// deliveries under way have returned, then drains the connection. A
// message handed over and not acknowledged by then is given back, as
// Subscribe says.
func (s *Subscriber) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	close(s.closing)
	s.mu.Unlock()
	waited := make(chan struct{})
	go func() { s.outputs.Wait(); close(waited) }()
	select {
	case <-waited:
	case <-time.After(s.cfg.CloseTimeout):
		return fmt.Errorf("natsjs: subscriptions still delivering after CloseTimeout (%s): the connection was left open", s.cfg.CloseTimeout)
	}
	if err := s.conn.Drain(); err != nil && !errors.Is(err, nats.ErrConnectionClosed) {
		return redact.ErrorWith(fmt.Errorf("natsjs: drain the connection: %w", err), s.secrets...)
	}
	return nil
}

// subscription is one Subscribe call: its output, and the delivery
// callbacks under way.
type subscription struct {
	s      *Subscriber
	topic  string
	ctx    context.Context // Subscribe's, ended with the subscription
	output chan *message.Message
	opts   []nats.SubOpt

	subsMu  sync.Mutex
	subs    []*nats.Subscription // SubscribersCount of them
	subject string               // the subject they listen on: the consumer's deliver subject

	mu       sync.Mutex
	stopped  bool
	inflight sync.WaitGroup
}

// enter registers a callback; false once the subscription has stopped.
func (l *subscription) enter() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.stopped {
		return false
	}
	l.inflight.Add(1)
	return true
}

// stop makes later callbacks return at once and waits for those under way
// (they return promptly: l.ctx is done).
func (l *subscription) stop() {
	l.mu.Lock()
	l.stopped = true
	l.mu.Unlock()
	l.inflight.Wait()
}

// deliver is the NATS callback: it hands the message to the consumer and
// settles it at JetStream as the consumer does. A message not handed over,
// or not settled, when the subscription ends is given back (giveBack);
// one not settled within AckWait is left unacknowledged: JetStream
// redelivers it after AckWait.
func (l *subscription) deliver(m *nats.Msg) {
	if !l.enter() {
		return
	}
	defer l.inflight.Done()
	log := l.s.log.With(slog.String("topic", l.topic))
	msg := readMsg(m)
	ctx, cancel := context.WithCancel(l.ctx)
	defer cancel()
	msg.SetContext(ctx)
	// Ended (a message read ahead, drained): given back, not handed out,
	// which the select below might do, picking at random among ready cases.
	if ctx.Err() != nil {
		l.giveBack(m, msg.UUID, log)
		return
	}
	select {
	case l.output <- msg:
	case <-ctx.Done():
		l.giveBack(m, msg.UUID, log)
		return
	}
	timeout := time.NewTimer(l.s.cfg.AckWait)
	defer timeout.Stop()
	select {
	case <-msg.Acked():
		l.ack(m, msg.UUID, log)
	case <-msg.Nacked():
		l.nak(m, msg.UUID, log)
	case <-timeout.C:
		log.Warn("natsjs: message neither acked nor nacked within AckWait: JetStream redelivers it", slog.String("uuid", msg.UUID))
	case <-ctx.Done():
		// The subscription ends: an ack the consumer gave at the same
		// moment still counts (the connection stays open until every
		// callback has returned); else the message is given back.
		select {
		case <-msg.Acked():
			l.ack(m, msg.UUID, log)
		case <-msg.Nacked():
			l.nak(m, msg.UUID, log)
		default:
			l.giveBack(m, msg.UUID, log)
		}
	}
}

// giveBackDelay is how long JetStream waits before it redelivers a
// message given back. At once, it could still send it to the subscription
// that gave it back, before it noticed that subscription's end: the
// message would then wait for AckWait after all.
const giveBackDelay = time.Second

// giveBack has JetStream redeliver m after giveBackDelay, to the next
// subscriber of its consumer, rather than after AckWait: the
// subscription ended before its consumer settled it.
func (l *subscription) giveBack(m *nats.Msg, uuid string, log *slog.Logger) {
	if err := m.NakWithDelay(giveBackDelay); err != nil && !errors.Is(err, nats.ErrConnectionClosed) {
		log.Warn("natsjs: giving back an unsettled message failed: JetStream redelivers it after AckWait", slog.String("uuid", uuid), slog.String("error", err.Error()))
	}
}

// ack acknowledges m and waits for JetStream to confirm it.
func (l *subscription) ack(m *nats.Msg, uuid string, log *slog.Logger) {
	if err := m.AckSync(); err != nil {
		log.Error("natsjs: ack failed: JetStream redelivers the message", slog.String("uuid", uuid), slog.String("error", err.Error()))
	}
}

// nak asks JetStream to redeliver m, after NakDelay's wait when set
// (TermSignal: never).
func (l *subscription) nak(m *nats.Msg, uuid string, log *slog.Logger) {
	var delay time.Duration
	if l.s.cfg.NakDelay != nil {
		if md, err := m.Metadata(); err == nil {
			delay = l.s.cfg.NakDelay.WaitTime(md.NumDelivered)
		} else {
			log.Warn("natsjs: message metadata unreadable: nak without delay", slog.String("uuid", uuid), slog.String("error", err.Error()))
		}
	}
	var err error
	switch {
	case delay == wmnats.TermSignal:
		err = m.Term()
	case delay > 0:
		err = m.NakWithDelay(delay)
	default:
		err = m.Nak()
	}
	if err != nil {
		log.Error("natsjs: nack failed: JetStream redelivers the message after AckWait", slog.String("uuid", uuid), slog.String("error", err.Error()))
	}
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
