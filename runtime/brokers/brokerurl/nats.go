package brokerurl

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/nats-io/nats.go"

	"github.com/outboxgen/outboxgen/runtime/brokers/natsjs"
	"github.com/outboxgen/outboxgen/runtime/redact"
)

var natsParams = []string{"stream", "provision", "duplicate_window", "publish_timeout", "ack_wait"}

// natsSettings are the parameters of a nats:// URL.
type natsSettings struct {
	url            string // the server list, without the query
	stream         string
	provision      bool
	window         time.Duration
	publishTimeout time.Duration
	ackWait        time.Duration
}

func natsParse(u *brokerURL, opt Options) (natsSettings, error) {
	s := natsSettings{url: u.base}
	var err error
	s.stream, _ = u.take("stream")
	if s.stream != "" && strings.ContainsFunc(s.stream, func(r rune) bool {
		return r <= ' ' || r == '.' || r == '*' || r == '>' || r == '/' || r == '\\' || r == 0x7f
	}) {
		return s, u.errorf("parameter stream=%q: a stream name cannot contain whitespace, '.', '*', '>', '/' or '\\'", s.stream)
	}
	if s.provision, err = u.takeBool("provision", opt.Provision != ProvisionOff); err != nil {
		return s, err
	}
	if s.window, err = u.takeDuration("duplicate_window", natsjs.DefaultDuplicateWindow); err != nil {
		return s, err
	}
	if s.publishTimeout, err = u.takeDuration("publish_timeout", natsjs.DefaultPublishTimeout); err != nil {
		return s, err
	}
	if s.ackWait, err = u.takeDuration("ack_wait", natsjs.DefaultAckWait); err != nil {
		return s, err
	}
	return s, u.noMoreParams(natsParams...)
}

func openNATS(ctx context.Context, u *brokerURL, opt Options) (message.Publisher, error) {
	s, err := natsParse(u, opt)
	if err != nil {
		return nil, err
	}
	pub, err := natsjs.NewPublisher(natsjs.Config{
		URL:            s.url,
		NatsOptions:    []nats.Option{nats.Timeout(opt.connectTimeout(ctx)), nats.Name("outboxgen")},
		PublishTimeout: s.publishTimeout,
		Logger:         opt.Logger,
	})
	if err != nil {
		return nil, u.wrap("connect to NATS", err)
	}
	p := &natsPublisher{Publisher: pub, secrets: u.secrets}
	if s.provision {
		js, err := pub.Conn().JetStream()
		if err != nil {
			_ = pub.Close()
			return nil, u.wrap("JetStream", err)
		}
		p.prov = newStreamProvisioner(js, s.stream, s.window)
	}
	return p, nil
}

// natsPublisher is natsjs's publisher with this package's provisioning
// (one stream per topic, or the one stream named by stream=).
type natsPublisher struct {
	*natsjs.Publisher
	prov    *streamProvisioner // nil: provisioning off
	secrets []string
}

// Publish provisions the stream of topic (once), then publishes; when
// JetStream answers that no stream captures the subject (a stream
// deleted, a server restarted empty) it provisions again and retries once.
func (p *natsPublisher) Publish(topic string, msgs ...*message.Message) error {
	if p.prov == nil {
		return p.Publisher.Publish(topic, msgs...)
	}
	if err := natsjs.ValidateTopic(topic); err != nil {
		return p.Publisher.Publish(topic, msgs...) // natsjs reports it as permanent
	}
	if err := p.prov.ensure(topic); err != nil {
		return redact.ErrorWith(err, p.secrets...)
	}
	err := p.Publisher.Publish(topic, msgs...)
	if errors.Is(err, nats.ErrNoStreamResponse) {
		p.prov.forget(topic)
		if perr := p.prov.ensure(topic); perr != nil {
			return redact.ErrorWith(errors.Join(err, perr), p.secrets...)
		}
		err = p.Publisher.Publish(topic, msgs...)
	}
	return err
}

func openNATSSubscriber(ctx context.Context, u *brokerURL, group string, opt Options) (message.Subscriber, error) {
	s, err := natsParse(u, opt)
	if err != nil {
		return nil, err
	}
	sub, err := natsjs.NewSubscriber(natsjs.SubscriberConfig{
		URL:         s.url,
		NatsOptions: []nats.Option{nats.Timeout(opt.connectTimeout(ctx)), nats.Name("outboxgen-" + group)},
		Durable:     group,
		AckWait:     s.ackWait,
		Logger:      opt.Logger,
	})
	if err != nil {
		return nil, u.wrap("connect to NATS", err)
	}
	ns := &natsSubscriber{Subscriber: sub, secrets: u.secrets}
	if s.provision {
		js, err := sub.Conn().JetStream()
		if err != nil {
			_ = sub.Close()
			return nil, u.wrap("JetStream", err)
		}
		ns.prov = newStreamProvisioner(js, s.stream, s.window)
	}
	return ns, nil
}

// natsSubscriber is natsjs's subscriber with this package's provisioning.
type natsSubscriber struct {
	*natsjs.Subscriber
	prov    *streamProvisioner
	secrets []string
}

// Subscribe provisions the stream of topic (when topic is a literal
// subject and provisioning is on), then subscribes.
func (s *natsSubscriber) Subscribe(ctx context.Context, topic string) (<-chan *message.Message, error) {
	if s.prov != nil && natsjs.ValidateTopic(topic) == nil {
		if err := s.prov.ensure(topic); err != nil {
			return nil, redact.ErrorWith(err, s.secrets...)
		}
	}
	return s.Subscriber.Subscribe(ctx, topic)
}

// streamProvisioner creates the stream of a topic when no stream captures
// its subject: a stream per topic (natsjs.DefaultStreamName), or the one
// stream named by stream=, extended by each new subject.
type streamProvisioner struct {
	js     nats.JetStreamManager
	stream string // "" for a stream per topic
	window time.Duration

	mu   sync.Mutex
	done map[string]bool
}

func newStreamProvisioner(js nats.JetStreamManager, stream string, window time.Duration) *streamProvisioner {
	return &streamProvisioner{js: js, stream: stream, window: window, done: map[string]bool{}}
}

func (p *streamProvisioner) forget(topic string) {
	p.mu.Lock()
	delete(p.done, topic)
	p.mu.Unlock()
}

func (p *streamProvisioner) ensure(topic string) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.done[topic] {
		return nil
	}
	if err := p.create(topic); err != nil {
		// Another process may have provisioned it meanwhile.
		if _, err2 := p.js.StreamNameBySubject(topic); err2 != nil {
			return err
		}
	}
	p.done[topic] = true
	return nil
}

func (p *streamProvisioner) create(topic string) error {
	if _, err := p.js.StreamNameBySubject(topic); err == nil {
		return nil // captured: leave that stream alone
	} else if !errors.Is(err, nats.ErrNoMatchingStream) {
		return fmt.Errorf("brokerurl: look up the stream of subject %q: %w", topic, err)
	}
	name := p.stream
	if name == "" {
		name = natsjs.DefaultStreamName(topic)
	}
	info, err := p.js.StreamInfo(name)
	switch {
	case errors.Is(err, nats.ErrStreamNotFound):
		_, err = p.js.AddStream(&nats.StreamConfig{
			Name:       name,
			Subjects:   []string{topic},
			Storage:    nats.FileStorage,
			Duplicates: p.window,
		})
		if err != nil {
			return fmt.Errorf("brokerurl: create stream %q for subject %q: %w", name, topic, err)
		}
		return nil
	case err != nil:
		return fmt.Errorf("brokerurl: look up stream %q: %w", name, err)
	}
	cfg := info.Config
	if slices.Contains(cfg.Subjects, topic) {
		return nil
	}
	cfg.Subjects = append(slices.Clone(cfg.Subjects), topic)
	if _, err := p.js.UpdateStream(&cfg); err != nil {
		return fmt.Errorf("brokerurl: add subject %q to stream %q: %w", topic, name, err)
	}
	return nil
}
