// Package natsjs builds JetStream publishers (JetStream's asynchronous
// publish, watermill-nats/v2's marshaling) and subscribers (its own, see
// Subscriber) configured for outboxgen's transactional outbox.
//
//	pub, err := natsjs.NewPublisher(natsjs.Config{URL: "nats://127.0.0.1:4222", AutoProvision: true})
//	...
//	drv, err := sqldriver.New(db, events.Schema)
//	...
//	r, err := relay.New(drv, relay.Config{Publisher: pub})
//
// # Subjects
//
// The outbox topic is the NATS subject, unchanged. Dots are NATS token
// separators, so the topic "orders.paid" is the subject "orders.paid",
// captured by streams or consumers filtering on "orders.paid", "orders.*" or
// "orders.>". A topic must therefore be a valid literal subject: non-empty
// tokens separated by single dots, no whitespace, no wildcard tokens ("*",
// ">"). ValidateTopic checks this, and Publish refuses an invalid topic
// before it reaches the server (the relay then retries and finally marks the
// row FAILED, with the reason in last_error).
//
// # De-duplication
//
// Every message is published with the JetStream header Nats-Msg-Id set to
// the watermill message UUID, which the relay sets to the outbox event_id.
// JetStream remembers the ids it stored for the stream's duplicate window
// (Config.DuplicateWindow for streams this package creates; the server
// default is 2 minutes) and acknowledges a re-sent id without storing it
// again. The relay delivers at least once (a publish whose acknowledgement
// was lost is retried); inside the window each event is stored in the
// stream exactly once. A re-send after the window (for instance a row the
// relay retried with a long backoff) is stored again, so consumers must
// still deduplicate by event id (package outbox's inbox) — the window only
// makes duplicates rare. Choose a window longer than the relay's lease
// (relay.Config.LeaseDuration) plus its first backoff steps when you want
// relay re-sends absorbed by the stream.
//
// # Connection
//
// A publisher created from a URL reconnects forever (nats.MaxReconnects(-1))
// and does not buffer publishes while disconnected
// (nats.ReconnectBufSize(-1)): a publish during a broker outage fails at
// once and the relay records the failure and retries with its backoff,
// instead of the publish sitting in a client buffer that the relay already
// counted as failed. Config.NatsOptions are applied after these and can
// override them.
//
// # Durable consumers
//
// A subscriber with SubscriberConfig.Durable creates its durable JetStream
// consumer itself (deliver all, explicit ack, AckWait; ConfigureConsumer
// adds settings) and binds to it, so the consumer outlives every
// subscriber: a restarted or redeployed consumer resumes after the last
// acknowledged message. The messages in flight at a stop (the one a
// handler held, unacknowledged, and those read ahead) are given back to
// JetStream as the subscription ends, and come to the next subscriber a
// second later (not after AckWait); after a crash, or a stop while the
// connection is down, they come again after AckWait. (Subscribing through nats.go's options instead lets
// nats.go own the consumer, and it deletes the consumer when the
// subscription ends: every restart then started over at the beginning of
// the stream.) Without QueueGroup one subscription at a time may hold the
// consumer: a new one waits up to 30 s for the one before it to end, so a
// rolling deploy works if the new process does not have to subscribe
// before the old one stops (the old process must close its subscriber; one
// that died holds the consumer until the server notices). A subscription
// checks every 5 s that its consumer still exists, and creates it again
// if it was deleted (it then delivers the stream from its beginning, with
// the default deliver policy; the inbox drops what was consumed already),
// or binds to it again if another subscriber created it again on its own
// deliver subject. So an operator cannot remove a consumer while its
// subscribers run: stop them first. Subscribers of releases before this
// one own the consumer they created, and delete it when they stop: that
// is how such a deletion happens on an upgrade.
package natsjs

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	neturl "net/url"
	"strings"
	"sync"
	"time"

	wmnats "github.com/ThreeDotsLabs/watermill-nats/v2/pkg/nats"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/nats-io/nats.go"

	"github.com/outboxgen/outboxgen/runtime/brokers/internal/msgctx"
	"github.com/outboxgen/outboxgen/runtime/internal/wmlog"
	"github.com/outboxgen/outboxgen/runtime/redact"
	"github.com/outboxgen/outboxgen/runtime/relay"
)

// Defaults of Config and SubscriberConfig.
const (
	// DefaultDuplicateWindow is the duplicate window of streams this
	// package creates (JetStream's own default).
	DefaultDuplicateWindow = 2 * time.Minute
	// DefaultPublishTimeout bounds how long a publish waits for the
	// stream's acknowledgement.
	DefaultPublishTimeout = 5 * time.Second
	// DefaultAckWait is how long a subscriber waits for the handler to ack
	// before JetStream redelivers.
	DefaultAckWait = 30 * time.Second
	// DefaultStreamPrefix prefixes the names of streams this package
	// creates.
	DefaultStreamPrefix = "OUTBOX_"
)

// Config configures a Publisher.
type Config struct {
	// URL is the NATS server URL (default nats.DefaultURL). Ignored when
	// Conn is set.
	URL string

	// Conn is an existing connection to publish on. The publisher does
	// not close it; URL and NatsOptions are ignored.
	Conn *nats.Conn

	// NatsOptions are applied when the publisher connects to URL, after
	// the package's defaults (reconnect forever, no reconnect buffer).
	NatsOptions []nats.Option

	// PublishTimeout bounds how long one publish waits for JetStream's
	// acknowledgement (default 5s). The relay counts a timeout as a failed
	// publish and retries; if the message had in fact been stored, the
	// retry is dropped by de-duplication (inside the duplicate window).
	PublishTimeout time.Duration

	// AutoProvision creates a stream for a topic on its first publish when
	// no stream captures the topic's subject: named StreamName(topic),
	// capturing exactly that subject, file storage, DuplicateWindow, then
	// adjusted by ConfigureStream. The check is made once per topic per
	// publisher. Without AutoProvision, streams are the operator's job
	// (e.g. one stream "ORDERS" on "orders.>") and a publish to a subject
	// no stream captures fails with nats.ErrNoStreamResponse. With
	// AutoProvision, that error (a stream deleted, a server restarted
	// with an empty store) makes Publish provision again and retry once.
	AutoProvision bool

	// DuplicateWindow is the de-duplication window of streams created by
	// AutoProvision (default 2 minutes). Existing streams keep theirs.
	DuplicateWindow time.Duration

	// StreamName names the stream AutoProvision creates for a topic
	// (default DefaultStreamName).
	StreamName func(topic string) string

	// ConfigureStream, if set, adjusts the configuration of a stream
	// AutoProvision is about to create (replicas, retention, max age...).
	ConfigureStream func(topic string, cfg *nats.StreamConfig)

	// Logger receives watermill's logs (default: none).
	Logger *slog.Logger
}

func (c *Config) setDefaults() {
	if c.URL == "" && c.Conn == nil {
		c.URL = nats.DefaultURL
	}
	if c.PublishTimeout == 0 {
		c.PublishTimeout = DefaultPublishTimeout
	}
	if c.DuplicateWindow == 0 {
		c.DuplicateWindow = DefaultDuplicateWindow
	}
	if c.StreamName == nil {
		c.StreamName = DefaultStreamName
	}
}

// Validate reports every invalid setting. It checks the configuration as
// given; NewPublisher applies the defaults first.
func (c Config) Validate() error {
	var errs []error
	if c.URL == "" && c.Conn == nil {
		errs = append(errs, errors.New("natsjs: Config.URL is empty and Config.Conn is nil: set one of them"))
	}
	if c.PublishTimeout <= 0 {
		errs = append(errs, fmt.Errorf("natsjs: Config.PublishTimeout is %s: use a positive duration (or 0 for %s)", c.PublishTimeout, DefaultPublishTimeout))
	}
	if c.DuplicateWindow <= 0 {
		errs = append(errs, fmt.Errorf("natsjs: Config.DuplicateWindow is %s: use a positive duration (or 0 for %s)", c.DuplicateWindow, DefaultDuplicateWindow))
	}
	if c.StreamName == nil {
		errs = append(errs, errors.New("natsjs: Config.StreamName is nil: leave it nil before NewPublisher to use DefaultStreamName"))
	}
	return errors.Join(errs...)
}

// Publisher is a watermill message.Publisher to NATS JetStream for the
// relay: a call's messages sent with JetStream's asynchronous publish,
// Nats-Msg-Id set from the message UUID, topics validated as subjects, and
// optional stream provisioning. It is safe for concurrent use. The
// embedded watermill-nats/v2 publisher owns the connection (Close); its
// own Publish, which awaits each acknowledgement before the next message
// and skips validation and provisioning, is what BenchmarkPublish
// compares with.
type Publisher struct {
	*wmnats.Publisher

	conn          *nats.Conn
	ownConn       bool
	autoProvision bool
	prov          *provisioner
	secrets       []string // masked in every error (redact.ErrorWith)
	// js sends Publish's messages (PublishMsgAsync); its acknowledgement
	// futures time out after timeout, PublishTimeout.
	js      nats.JetStreamContext
	timeout time.Duration
}

var _ message.Publisher = (*Publisher)(nil)

// NewPublisher connects (unless cfg.Conn is set) and returns a publisher.
//
// Its errors, and those of the publisher's methods, never show a password
// or token: a URL's password, a token given as a URL's user
// (nats://TOKEN@host) and the password and token of NatsOptions
// (nats.UserInfo, nats.Token) are masked (package redact). errors.Is and
// errors.As still see the nats errors.
func NewPublisher(cfg Config) (*Publisher, error) {
	cfg.setDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	conn, js, own, err := connectJetStream(cfg.Conn, cfg.URL, cfg.NatsOptions)
	if err != nil {
		return nil, err
	}
	sec := connSecrets(conn, cfg.URL)
	// A context of its own: an acknowledgement that never comes (the
	// server went away) is dropped after PublishTimeout, not kept.
	// Pending acknowledgements are bounded by the relays' own limits (a
	// streaming relay's MaxInFlight is 4,096 events, over nats.go's
	// default 4,000), not by the client's.
	async, err := conn.JetStream(nats.PublishAsyncTimeout(cfg.PublishTimeout), nats.PublishAsyncMaxPending(maxPending))
	if err != nil {
		closeIfOwned(conn, own)
		return nil, redact.ErrorWith(fmt.Errorf("natsjs: jetstream context: %w", err), sec...)
	}
	pub, err := wmnats.NewPublisherWithNatsConn(conn, wmnats.PublisherPublishConfig{
		Marshaler:         Marshaler{},
		SubjectCalculator: wmnats.DefaultSubjectCalculator,
		JetStream: wmnats.JetStreamConfig{
			// Provisioning is ours: watermill's names the stream after
			// the topic, which fails for dotted topics, and asks the
			// server on every publish.
			AutoProvision:  false,
			TrackMsgId:     true,
			PublishOptions: []nats.PubOpt{nats.AckWait(cfg.PublishTimeout)},
		},
	}, wmlog.Adapter(cfg.Logger))
	if err != nil {
		closeIfOwned(conn, own)
		return nil, redact.ErrorWith(fmt.Errorf("natsjs: %w", err), sec...)
	}
	return &Publisher{
		Publisher:     pub,
		conn:          conn,
		ownConn:       own,
		autoProvision: cfg.AutoProvision,
		prov:          newProvisioner(js, cfg.DuplicateWindow, cfg.StreamName, cfg.ConfigureStream),
		secrets:       sec,
		js:            async,
		timeout:       cfg.PublishTimeout,
	}, nil
}

// Publish publishes msgs to the subject topic and waits for JetStream's
// acknowledgement of each. It sends them all before it waits, so a call
// takes one round trip to the server, not one per message (a 64-message
// call a 1 ms round trip away: 1.6 against 80 ms; BenchmarkPublish).
// JetStream stores them in the order sent. It returns the failure of the
// first message, in order, that was not stored. When a call of several
// messages fails for some only (JetStream refused some, a send failed
// partway), that error is a *relay.PartialError whose Stored marks the
// messages JetStream acknowledged: the relay settles those and publishes
// only the others again, which saves calls, and saves a duplicate once
// the duplicate window has passed (inside it JetStream drops the repeat,
// Nats-Msg-Id). A message whose acknowledgement did not come (the wait
// ended) counts as not stored. A duplicate (an id already stored inside
// the window) is acknowledged as success. The wait ends with
// PublishTimeout (nats.ErrTimeout), or with the context of any of the
// messages (its error: a relay gave up on the call). Errors are
// redacted; errors.As still finds the PartialError.
func (p *Publisher) Publish(topic string, msgs ...*message.Message) error {
	stored, err := p.publish(topic, msgs...)
	if err == nil {
		return nil
	}
	// Redacted inside the PartialError, so that its Err shows no secret
	// either.
	return relay.Partial(redact.ErrorWith(err, p.secrets...), stored)
}

// publish returns the failure of the call and, when it fails, which
// messages JetStream acknowledged (nil: none).
func (p *Publisher) publish(topic string, msgs ...*message.Message) ([]bool, error) {
	if err := ValidateTopic(topic); err != nil {
		return nil, relay.Permanent(err) // no retry makes the subject valid
	}
	if !p.autoProvision {
		return p.send(topic, msgs)
	}
	if err := p.prov.ensure(topic); err != nil {
		return nil, err
	}
	stored, err := p.send(topic, msgs)
	if errors.Is(err, nats.ErrNoStreamResponse) {
		// The stream was deleted, or the server came back with an empty
		// store: provision again and retry once. Messages of msgs that
		// did reach a stream are dropped as duplicates (Nats-Msg-Id).
		p.prov.forget(topic)
		if perr := p.prov.ensure(topic); perr != nil {
			// The acknowledgements stand: the stream that gave them
			// stored those messages.
			return stored, errors.Join(err, perr)
		}
		// The second send sends every message again: its
		// acknowledgements tell which are stored now.
		stored, err = p.send(topic, msgs)
	}
	return stored, err
}

// maxPending bounds the acknowledgements a publisher awaits at once.
const maxPending = 1 << 16

// send sends msgs without waiting, then waits for their acknowledgements
// in order, until PublishTimeout after the sends (the acknowledgements'
// own timeout, ErrAsyncPublishTimeout) or until a message's context ends.
// It returns the failure of the first message, in order, not stored and,
// when it fails, stored: stored[i] tells whether JetStream acknowledged
// msgs[i] (Ok).
func (p *Publisher) send(topic string, msgs []*message.Message) (stored []bool, err error) {
	acks := make([]nats.PubAckFuture, 0, len(msgs))
	// A send that fails (a message that does not marshal, the connection
	// lost, too many acknowledgements pending) ends the sends: the
	// messages after it are not sent. Those sent before it may be stored
	// all the same, so their acknowledgements are awaited like those of a
	// call whose sends all went, and within the same bounds: each
	// acknowledgement's own timeout, begun at its send, and the messages'
	// context; a connection lost fails them at once (nats.ErrDisconnected).
	// sendErr is the call's failure when all of those are stored.
	var sendErr error
	for _, msg := range msgs {
		m, err := Marshaler{}.Marshal(topic, msg)
		if err != nil {
			sendErr = fmt.Errorf("natsjs: message %s: %w", msg.UUID, err)
			break
		}
		// As a synchronous publish did: "no responders" (a stream's
		// leader being elected) is retried twice, 250 ms apart; a stall
		// waits up to PublishTimeout.
		ack, err := p.js.PublishMsgAsync(m, nats.RetryAttempts(2), nats.RetryWait(250*time.Millisecond), nats.StallWait(p.timeout))
		if err != nil {
			if errors.Is(err, nats.ErrMaxPayload) {
				// Over the connected server's max_payload: nats.go
				// refuses it before it goes out, and no retry sends it
				// (unless the servers' limit is raised: requeue it then).
				err = relay.Permanent(err)
			}
			sendErr = fmt.Errorf("sending message failed: %w", err)
			break
		}
		acks = append(acks, ack)
	}
	stored = make([]bool, len(msgs))
	// After a failure the acknowledgements after it are still awaited,
	// within the same bounds (no longer than the call could wait anyway),
	// to tell the relay which messages need no second send.
	var first error
	var ctx context.Context // set at the first wait
	for i, ack := range acks {
		select {
		case <-ack.Ok():
			stored[i] = true
			continue
		default:
		}
		if ctx == nil {
			var stop func()
			ctx, stop = msgctx.Any(msgs)
			defer stop()
		}
		select {
		case <-ack.Ok():
			stored[i] = true
		case err := <-ack.Err():
			if first == nil {
				first = p.ackFailed(err)
			}
		case <-ctx.Done():
			// The relay gave up on the call: the acknowledgements not
			// come yet are not awaited, and their messages count as not
			// stored (sent again, at worst dropped as duplicates).
			if first == nil {
				first = fmt.Errorf("sending message failed: %w", context.Cause(ctx))
			}
		}
	}
	if first == nil {
		first = sendErr
	}
	if first == nil {
		return nil, nil
	}
	return stored, first
}

// ackFailed returns the error of a message whose acknowledgement failed
// with err.
func (p *Publisher) ackFailed(err error) error {
	switch {
	case errors.Is(err, nats.ErrNoResponders):
		// As a synchronous publish reports it: no stream captures the
		// subject.
		err = nats.ErrNoStreamResponse
	case errors.Is(err, nats.ErrAsyncPublishTimeout):
		return p.timedOut()
	}
	return fmt.Errorf("sending message failed: %w", err)
}

func (p *Publisher) timedOut() error {
	return fmt.Errorf("sending message failed: no acknowledgement within %s (Config.PublishTimeout): %w", p.timeout, nats.ErrTimeout)
}

// EnsureStream provisions the stream of topic now, as the first Publish to
// it does with AutoProvision (e.g. at start-up, to fail fast), with the
// publisher's DuplicateWindow, StreamName and ConfigureStream. It works
// whether or not AutoProvision is set; an existing stream capturing the
// subject is left as it is.
func (p *Publisher) EnsureStream(topic string) error {
	if err := ValidateTopic(topic); err != nil {
		return err
	}
	return redact.ErrorWith(p.prov.ensure(topic), p.secrets...)
}

// Conn returns the publisher's NATS connection.
func (p *Publisher) Conn() *nats.Conn { return p.conn }

// Close closes the connection unless it was passed in Config.Conn.
func (p *Publisher) Close() error {
	// Ends the asynchronous publishing's reply subscription and fails the
	// acknowledgements still awaited, on a shared connection too.
	p.js.CleanupPublisher()
	if p.ownConn {
		return p.Publisher.Close()
	}
	return nil
}

// Marshaler is watermill-nats's NATSMarshaler (payload as the body,
// metadata as headers, UUID in the _watermill_message_uuid header) that
// also sets the JetStream de-duplication header Nats-Msg-Id to the message
// UUID, so de-duplication does not depend on a publisher option.
type Marshaler struct{}

var _ wmnats.MarshalerUnmarshaler = Marshaler{}

// Marshal implements wmnats.Marshaler.
func (Marshaler) Marshal(topic string, msg *message.Message) (*nats.Msg, error) {
	m, err := (&wmnats.NATSMarshaler{}).Marshal(topic, msg)
	if err != nil {
		return nil, err
	}
	if msg.UUID != "" {
		m.Header.Set(nats.MsgIdHdr, msg.UUID)
	}
	return m, nil
}

// Unmarshal implements wmnats.Unmarshaler. It reads what NATSMarshaler
// reads and never fails: Nats-Msg-Id and JetStream's other control headers
// are not copied into the metadata (the UUID carries the same value), and
// a header with several values, which NATSMarshaler rejects, becomes one
// metadata value, the values joined by ", " as in HTTP. NATS allows such
// headers and other clients write them; rejecting the message left it
// unacknowledged, redelivered after every AckWait for good.
func (Marshaler) Unmarshal(m *nats.Msg) (*message.Message, error) {
	return readMsg(m), nil
}

func readMsg(m *nats.Msg) *message.Message {
	msg := message.NewMessage(m.Header.Get(wmnats.WatermillUUIDHdr), m.Data)
	for k, v := range m.Header {
		switch k {
		case wmnats.WatermillUUIDHdr, nats.MsgIdHdr, nats.ExpectedLastMsgIdHdr, nats.ExpectedStreamHdr, nats.ExpectedLastSubjSeqHdr, nats.ExpectedLastSeqHdr:
			continue
		}
		msg.Metadata.Set(k, strings.Join(v, ", "))
	}
	return msg
}

// ValidateTopic reports whether topic can be published to as a NATS
// subject: non-empty tokens separated by single dots, no whitespace or
// control characters, no wildcard token ("*" or ">").
func ValidateTopic(topic string) error {
	if topic == "" {
		return errors.New("natsjs: topic is empty")
	}
	for _, tok := range strings.Split(topic, ".") {
		switch {
		case tok == "":
			return fmt.Errorf("natsjs: topic %q is not a NATS subject: it has an empty token (leading, trailing or double dot)", topic)
		case tok == "*" || tok == ">":
			return fmt.Errorf("natsjs: topic %q is not a NATS subject to publish to: it has the wildcard token %q", topic, tok)
		}
		for _, r := range tok {
			if r <= ' ' || r == 0x7f {
				return fmt.Errorf("natsjs: topic %q is not a NATS subject: it contains whitespace or a control character", topic)
			}
		}
	}
	return nil
}

// DefaultStreamName returns "OUTBOX_" followed by topic in upper case with
// every character other than a letter, digit, '_' or '-' replaced by '_':
// "orders.paid" → "OUTBOX_ORDERS_PAID". (Stream names cannot contain dots.)
// Two topics differing only in those characters map to the same name; the
// second one's provisioning then fails with a clear error — give such
// topics a StreamName of your own, or one operator-made stream.
func DefaultStreamName(topic string) string {
	var b strings.Builder
	b.WriteString(DefaultStreamPrefix)
	for _, r := range strings.ToUpper(topic) {
		if (r >= 'A' && r <= 'Z') || (r >= '0' && r <= '9') || r == '_' || r == '-' {
			b.WriteRune(r)
		} else {
			b.WriteByte('_')
		}
	}
	return b.String()
}

// provisioner creates missing streams, once per topic.
type provisioner struct {
	js        nats.JetStreamManager
	window    time.Duration
	name      func(string) string
	configure func(string, *nats.StreamConfig)

	mu   sync.Mutex
	done map[string]bool
}

func newProvisioner(js nats.JetStreamManager, window time.Duration, name func(string) string, configure func(string, *nats.StreamConfig)) *provisioner {
	return &provisioner{js: js, window: window, name: name, configure: configure, done: map[string]bool{}}
}

// forget makes the next ensure of topic ask the server again.
func (p *provisioner) forget(topic string) {
	p.mu.Lock()
	delete(p.done, topic)
	p.mu.Unlock()
}

func (p *provisioner) ensure(topic string) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.done[topic] {
		return nil
	}
	if _, err := p.js.StreamNameBySubject(topic); err == nil {
		p.done[topic] = true
		return nil
	} else if !errors.Is(err, nats.ErrNoMatchingStream) {
		return fmt.Errorf("natsjs: look up the stream of subject %q: %w", topic, err)
	}
	sc := &nats.StreamConfig{
		Name:       p.name(topic),
		Subjects:   []string{topic},
		Storage:    nats.FileStorage,
		Duplicates: p.window,
	}
	if p.configure != nil {
		p.configure(topic, sc)
	}
	if _, err := p.js.AddStream(sc); err != nil {
		// Another publisher may have created the same stream meanwhile.
		if _, err2 := p.js.StreamNameBySubject(topic); err2 == nil {
			p.done[topic] = true
			return nil
		}
		return fmt.Errorf("natsjs: create stream %q for subject %q: %w", sc.Name, topic, err)
	}
	p.done[topic] = true
	return nil
}

func connect(conn *nats.Conn, url string, opts []nats.Option) (*nats.Conn, bool, error) {
	if conn != nil {
		return conn, false, nil
	}
	all := append([]nats.Option{nats.MaxReconnects(-1), nats.ReconnectBufSize(-1)}, opts...)
	c, err := nats.Connect(url, all...)
	if err != nil {
		// nats.go's own errors may quote the URL too (a parse error).
		return nil, false, redact.ErrorWith(fmt.Errorf("natsjs: connect to %s: %w", url, err), optionSecrets(url, all)...)
	}
	return c, true, nil
}

// RedactURL returns a NATS server URL list (comma separated) fit for a
// log line: every password, and every token given as a URL's user name
// (nats://TOKEN@host), masked as "xxxxx". A user name followed by a
// password is kept.
func RedactURL(urls string) string {
	return redact.StringWith(urls, urlSecrets(urls)...)
}

// urlSecrets returns the secrets of a NATS server URL list (comma
// separated): each URL's password, or its user name when it has no
// password (NATS takes a lone user name as a token).
func urlSecrets(urls string) []string {
	var s []string
	for _, raw := range strings.Split(urls, ",") {
		raw = strings.TrimSpace(raw)
		if u, err := neturl.Parse(raw); err == nil {
			if u.User == nil {
				continue
			}
			if pw, ok := u.User.Password(); ok {
				s = append(s, pw)
			} else {
				s = append(s, u.User.Username())
			}
			continue
		}
		// Unparsable: the userinfo runs from "://" to the last '@'.
		at := strings.LastIndex(raw, "@")
		if at < 0 {
			continue
		}
		ui := raw[:at]
		if i := strings.Index(ui, "://"); i >= 0 {
			ui = ui[i+3:]
		}
		if _, pw, ok := strings.Cut(ui, ":"); ok {
			s = append(s, pw)
		} else {
			s = append(s, ui)
		}
	}
	return s
}

// optionSecrets returns the secrets of url and of the connection options
// opts (nats.UserInfo's password, nats.Token), read by applying opts to a
// copy of the default options, as nats.Connect does.
func optionSecrets(url string, opts []nats.Option) []string {
	o := nats.GetDefaultOptions()
	for _, opt := range opts {
		if opt != nil {
			_ = opt(&o)
		}
	}
	s := append(urlSecrets(url), o.Password, o.Token)
	for _, srv := range o.Servers {
		s = append(s, urlSecrets(srv)...)
	}
	return s
}

// connSecrets returns the secrets of an established connection and of url.
func connSecrets(c *nats.Conn, url string) []string {
	s := append(urlSecrets(url), c.Opts.Password, c.Opts.Token)
	for _, srv := range append(c.Opts.Servers, c.Opts.Url) {
		s = append(s, urlSecrets(srv)...)
	}
	if u := c.ConnectedUrl(); u != "" {
		s = append(s, urlSecrets(u)...)
	}
	return s
}

// connectJetStream connects like connect and opens a JetStream context.
func connectJetStream(conn *nats.Conn, url string, opts []nats.Option) (*nats.Conn, nats.JetStreamContext, bool, error) {
	conn, own, err := connect(conn, url, opts)
	if err != nil {
		return nil, nil, false, err
	}
	js, err := conn.JetStream()
	if err != nil {
		closeIfOwned(conn, own)
		return nil, nil, false, redact.ErrorWith(fmt.Errorf("natsjs: jetstream context: %w", err), connSecrets(conn, url)...)
	}
	return conn, js, own, nil
}

func closeIfOwned(c *nats.Conn, own bool) {
	if own {
		c.Close()
	}
}
