// Package pubguard lets a broker publisher be closed while Publish calls
// are under way. watermill-kafka, watermill-amqp and watermill-redisstream
// check an unguarded closed flag: a Publish that passes it as Close runs
// inside the client library (a send on sarama's closed
// channel, a WaitGroup reused in amqp, a data race on the flag). A Guard
// makes Close wait for the calls under way and later calls fail with
// ErrClosed; a Publisher wraps a watermill publisher with one, and
// redacts its errors.
package pubguard

import (
	"errors"
	"sync"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/outboxgen/outboxgen/runtime/redact"
	"github.com/outboxgen/outboxgen/runtime/relay"
)

// ErrClosed is what Do returns once Close has begun.
var ErrClosed = errors.New("publisher closed")

// Guard orders Publish calls (Do) and Close. The zero value is ready.
type Guard struct {
	mu     sync.RWMutex
	closed bool
}

// Do runs publish unless Close has begun (then it returns ErrClosed).
// Calls run concurrently; Close waits for them.
func (g *Guard) Do(publish func() error) error {
	g.mu.RLock()
	defer g.mu.RUnlock()
	if g.closed {
		return ErrClosed
	}
	return publish()
}

// Close runs closeFn once, after the Do calls under way returned; later
// calls of Close return nil.
func (g *Guard) Close(closeFn func() error) error {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.closed {
		return nil
	}
	g.closed = true
	return closeFn()
}

// Publisher is a watermill publisher behind a Guard, whose errors never
// show secrets (package redact).
type Publisher struct {
	pub     message.Publisher
	secrets []string
	guard   Guard
}

// New returns pub guarded, its errors redacted of secrets.
func New(pub message.Publisher, secrets []string) *Publisher {
	return &Publisher{pub: pub, secrets: secrets}
}

// Publish publishes msgs to topic unless Close has begun (ErrClosed).
// A *relay.PartialError is redacted inside too, so that its Err, which a
// caller finds with errors.As and may log, shows no secret either.
func (p *Publisher) Publish(topic string, msgs ...*message.Message) error {
	err := p.guard.Do(func() error { return p.pub.Publish(topic, msgs...) })
	var pe *relay.PartialError
	switch {
	case !errors.As(err, &pe):
	case err == error(pe):
		return relay.Partial(redact.ErrorWith(pe.Err, p.secrets...), pe.Stored)
	default:
		// Wrapped: the whole error, redacted, becomes the Err of a new
		// one, outermost (its text then says twice how many were stored).
		return relay.Partial(redact.ErrorWith(err, p.secrets...), pe.Stored)
	}
	return redact.ErrorWith(err, p.secrets...)
}

// Close waits for the Publish calls under way, then closes the publisher.
func (p *Publisher) Close() error {
	return redact.ErrorWith(p.guard.Close(p.pub.Close), p.secrets...)
}
