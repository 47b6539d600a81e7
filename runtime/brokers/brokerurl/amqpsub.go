package brokerurl

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"

	wmamqp "github.com/ThreeDotsLabs/watermill-amqp/v3/pkg/amqp"
	"github.com/ThreeDotsLabs/watermill/message"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/outboxgen/outboxgen/runtime/internal/backoff"
	"github.com/outboxgen/outboxgen/runtime/internal/wmlog"
	"github.com/outboxgen/outboxgen/runtime/redact"
)

func openAMQPSubscriber(ctx context.Context, u *brokerURL, group string, opt Options) (message.Subscriber, error) {
	s, err := amqpParse(u)
	if err != nil {
		return nil, err
	}
	cfg := s.config()
	queue := s.queue
	cfg.Queue.GenerateName = func(topic string) string {
		if queue != "" {
			return queue
		}
		return group + "." + topic
	}
	conn, err := dialAMQP(ctx, cfg.Connection.AmqpURI, *cfg.Connection.AmqpConfig, opt.ConnectTimeout, opt.Logger, u.secrets, amqpSubscriptionsMeanwhile)
	if err != nil {
		return nil, u.wrap("connect to AMQP", err)
	}
	sub := &amqpSubscriber{conn: conn, cfg: cfg, connectTimeout: opt.ConnectTimeout, log: opt.Logger, secrets: u.secrets}
	sub.ctx, sub.cancel = context.WithCancel(context.Background())
	return sub, nil
}

// amqpSubscriber consumes, for each Subscribe, a queue bound to the
// exchange with the topic as routing key, on a connection of its own that
// reconnects (amqpConn). A subscription whose channel closes (the
// connection was lost, or the broker cancelled the consumer: its queue
// was deleted) declares its queue and binding again and consumes anew, on
// the connection of the moment; the broker puts the messages that were
// not acknowledged back in the queue. It replaces watermill-amqp's
// subscriber, whose connection had the data race on reconnect that
// amqpConn was written to avoid, and which read a closed delivery
// channel's zero values in a loop when the broker cancelled its consumer.
type amqpSubscriber struct {
	conn           *amqpConn
	cfg            wmamqp.Config
	connectTimeout time.Duration // how long Subscribe waits for a connection that is down; the first bound of subscribing again
	log            *slog.Logger
	secrets        []string

	ctx    context.Context // cancelled by Close: every subscription ends
	cancel context.CancelFunc
	wg     sync.WaitGroup // the subscriptions' goroutines

	mu     sync.Mutex
	closed bool
}

var errAMQPSubscriberClosed = errors.New("AMQP subscriber closed")

// Subscribe declares the queue of topic, binds it to the exchange with
// topic as routing key, and consumes it until ctx ends or Close; the
// channel it returns is closed then. A message is delivered once the one
// before it was acknowledged or nacked (nacked: back to its queue).
// Subscribe waits up to Options.ConnectTimeout (and ctx) for a connection
// that is down, and for the broker's answers to its declarations; once
// it returned, an attempt to subscribe again after an interruption waits
// ConnectTimeout, doubling after each attempt that ran out.
func (s *amqpSubscriber) Subscribe(ctx context.Context, topic string) (<-chan *message.Message, error) {
	if strings.TrimSpace(topic) == "" {
		return nil, redact.ErrorWith(errEmptyTopic, s.secrets...)
	}
	if s.ctx.Err() != nil {
		return nil, errAMQPSubscriberClosed
	}
	sub := &amqpSubscription{
		s: s,
		topology: wmamqp.BuildTopologyParams{
			Topic:        topic,
			QueueName:    s.cfg.Queue.GenerateName(topic),
			ExchangeName: s.cfg.Exchange.GenerateName(topic),
			RoutingKey:   s.cfg.QueueBind.GenerateRoutingKey(topic),
		},
		out: make(chan *message.Message),
	}
	// Ends with ctx or Close.
	runCtx, cancel := context.WithCancel(ctx)
	stop := context.AfterFunc(s.ctx, cancel)
	end := func() { stop(); cancel() }

	// The connection, and the declarations and consume on it, within
	// ConnectTimeout and ctx.
	waitCtx, waited := context.WithTimeout(runCtx, s.connectTimeout)
	conn, _, err := s.conn.wait(waitCtx)
	if errors.Is(err, context.DeadlineExceeded) && ctx.Err() == nil {
		err = fmt.Errorf("%w (waited %s)", errAMQPReconnecting, s.connectTimeout)
	}
	if err == nil {
		err = sub.startWithin(waitCtx, conn)
		if errors.Is(err, context.DeadlineExceeded) && ctx.Err() == nil {
			err = fmt.Errorf("the broker did not answer within %s", s.connectTimeout)
		}
	}
	waited()
	if err != nil {
		end()
		return nil, redact.ErrorWith(fmt.Errorf("subscribe to %q (queue %q): %w", topic, sub.topology.QueueName, err), s.secrets...)
	}
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		end()
		sub.ch.Close() //nolint:errcheck // Close closes the connection too
		return nil, errAMQPSubscriberClosed
	}
	s.wg.Add(1)
	s.mu.Unlock()
	go func() {
		defer s.wg.Done()
		defer end()
		sub.run(runCtx)
	}()
	return sub.out, nil
}

// Close ends every subscription, closing their channels (the broker puts
// their unacknowledged messages back in the queue), and the connection.
func (s *amqpSubscriber) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	s.mu.Unlock()
	s.cancel()
	// Closed before the subscriptions are waited for: it ends their calls
	// to a broker that stopped answering (a channel's close, a
	// declaration), which wait for its answer.
	err := s.conn.Close()
	s.wg.Wait()
	return redact.ErrorWith(err, s.secrets...)
}

// amqpResubscribeMax caps the bound of one attempt to subscribe again
// (see amqpSubscription.run).
const amqpResubscribeMax = 5 * time.Minute

// amqpSubscription is one Subscribe's consumer.
type amqpSubscription struct {
	s          *amqpSubscriber
	topology   wmamqp.BuildTopologyParams
	out        chan *message.Message
	ch         *amqp.Channel // of the current consumer
	deliveries <-chan amqp.Delivery
}

// startWithin opens a channel on conn, declares the queue, the exchange
// and the binding, and consumes the queue, unless ctx ends first: the
// broker's answers are waited for, and a broker may stop answering with
// the connection still up. A start given up on closes its channel once
// it returns (at the latest when the connection is lost or closed).
func (sub *amqpSubscription) startWithin(ctx context.Context, conn *amqp.Connection) error {
	type started struct {
		ch         *amqp.Channel
		deliveries <-chan amqp.Delivery
		err        error
	}
	done := make(chan started, 1)
	go func() {
		ch, deliveries, err := sub.start(conn)
		done <- started{ch, deliveries, err}
	}()
	select {
	case st := <-done:
		if st.err == nil {
			sub.ch, sub.deliveries = st.ch, st.deliveries
		}
		return st.err
	case <-ctx.Done():
		go func() {
			if st := <-done; st.err == nil {
				st.ch.Close() //nolint:errcheck // given up on
			}
		}()
		return ctx.Err()
	}
}

// start opens a channel on conn, declares the queue, the exchange and the
// binding, and consumes the queue.
func (sub *amqpSubscription) start(conn *amqp.Connection) (*amqp.Channel, <-chan amqp.Delivery, error) {
	cfg := sub.s.cfg
	ch, err := conn.Channel()
	if err != nil {
		return nil, nil, fmt.Errorf("cannot open channel: %w", err)
	}
	if err := ch.Qos(cfg.Consume.Qos.PrefetchCount, 0, false); err != nil {
		ch.Close() //nolint:errcheck // the Qos error says more
		return nil, nil, fmt.Errorf("cannot set prefetch: %w", err)
	}
	if err := cfg.TopologyBuilder.BuildTopology(ch, sub.topology, cfg, wmlog.Adapter(nil)); err != nil {
		ch.Close() //nolint:errcheck // the topology error says more
		return nil, nil, err
	}
	// autoAck off: a message is acknowledged once its handler acked it.
	deliveries, err := ch.Consume(sub.topology.QueueName, "", false, false, false, false, nil)
	if err != nil {
		ch.Close() //nolint:errcheck // the consume error says more
		return nil, nil, fmt.Errorf("cannot consume: %w", err)
	}
	return ch, deliveries, nil
}

// run delivers messages until ctx ends, subscribing again whenever the
// consumer's channel closes; it closes out when it returns.
func (sub *amqpSubscription) run(ctx context.Context) {
	defer close(sub.out)
	log := sub.s.log.With(slog.String("queue", sub.topology.QueueName))
	for {
		lost := sub.consume(ctx)
		if sub.s.ctx.Err() == nil {
			// Close puts back what the channel held. (After Close, the
			// connection's close did.) A channel closed already returns
			// at once.
			closed := make(chan struct{})
			go func(ch *amqp.Channel) {
				defer close(closed)
				ch.Close() //nolint:errcheck // nothing to do about it
			}(sub.ch)
			if !lost {
				// The subscription ends: out closes once the broker has
				// its messages back, so that a subscriber that follows
				// gets them first; waited for at most amqpCloseWait, a
				// broker that stopped answering must not hold it.
				t := time.NewTimer(amqpCloseWait)
				select {
				case <-closed:
				case <-t.C:
					log.Warn("AMQP subscription ended without the broker's answer to closing its channel: what it held goes back to the queue when the broker notices", slog.Duration("waited", amqpCloseWait))
				}
				t.Stop()
				return
			}
		} else if !lost {
			return
		}
		log.Warn("AMQP subscription interrupted: subscribing again")
		bo := backoff.New(backoff.Floor, backoff.DefaultMax)
		// Each attempt is bounded, from ConnectTimeout, the bound doubling
		// after each attempt that ran out (up to amqpResubscribeMax, or
		// ConnectTimeout if longer): a
		// broker slower than ConnectTimeout for the six calls of a
		// subscription gets it back (a fixed bound gave up every attempt),
		// and a channel call stuck while the connection stays up (its
		// heartbeats answered) is tried again. An attempt given up runs
		// on until the broker answers, and then closes its channel
		// (startWithin): a few on a slow broker; one per bound (5
		// minutes) on a channel call stuck until the connection drops.
		limit := sub.s.connectTimeout
		for {
			conn, _, err := sub.s.conn.wait(ctx)
			if err != nil {
				return // ctx ended, or Close
			}
			attempt, cancel := context.WithTimeout(ctx, limit)
			err = sub.startWithin(attempt, conn)
			cancel()
			if err == nil {
				break
			}
			if ctx.Err() != nil {
				return
			}
			if errors.Is(err, context.DeadlineExceeded) {
				err = fmt.Errorf("the broker did not answer within %s", limit)
				limit = min(2*limit, max(amqpResubscribeMax, sub.s.connectTimeout))
			}
			log.Warn("AMQP subscribing again failed: trying again", slog.String("error", redact.StringWith(err.Error(), sub.s.secrets...)), slog.Int("attempt", bo.Failures()+1))
			t := time.NewTimer(bo.Next())
			select {
			case <-ctx.Done():
				t.Stop()
				return
			case <-t.C:
			}
		}
		log.Info("AMQP subscription resumed")
	}
}

// consume hands the consumer's deliveries out one at a time until ctx
// ends (false) or the channel is lost (true).
func (sub *amqpSubscription) consume(ctx context.Context) (lost bool) {
	for {
		select {
		case <-ctx.Done():
			return false
		case d, ok := <-sub.deliveries:
			if !ok {
				return true // the channel closed, or the broker cancelled the consumer
			}
			if done, lost := sub.deliver(ctx, d); done || lost {
				return lost
			}
		}
	}
}

// deliver sends d out and waits for its handler's ack or nack, which it
// passes on to the broker. done: ctx ended (d went back to its queue);
// lost: the channel could not take the ack or nack.
func (sub *amqpSubscription) deliver(ctx context.Context, d amqp.Delivery) (done, lost bool) {
	msg, err := sub.s.cfg.Marshaler.Unmarshal(d)
	if err != nil {
		// A consumer's inbox poisons it: better than back to the queue
		// for ever.
		msg = message.NewMessage("", d.Body)
		msg.Metadata.Set(MetadataUnreadable, "AMQP delivery: "+err.Error())
	}
	if d.Redelivered {
		msg.Metadata.Set(wmamqp.MetadataRedeliveredKey, "true")
	}
	msgCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	msg.SetContext(msgCtx)
	// Not handed out once the subscription ends: select picks at random
	// among ready cases.
	handed := false
	if ctx.Err() == nil {
		select {
		case sub.out <- msg:
			handed = true
		case <-ctx.Done():
		}
	}
	if !handed {
		d.Nack(false, true) //nolint:errcheck // closing the channel puts it back too
		return true, false
	}
	select {
	case <-msg.Acked():
		err = d.Ack(false)
	case <-msg.Nacked():
		err = d.Nack(false, true)
	case <-ctx.Done():
		select {
		case <-msg.Acked(): // acked as it ended: passed on
			d.Ack(false) //nolint:errcheck // a lost ack: delivered again
		default:
			d.Nack(false, true) //nolint:errcheck // closing the channel puts it back too
		}
		return true, false
	}
	return false, err != nil
}
