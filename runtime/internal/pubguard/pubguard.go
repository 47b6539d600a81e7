// Package pubguard lets a broker publisher be closed while Publish calls
// are under way. watermill-kafka and watermill-amqp check an unguarded
// closed flag: a Publish that passes it as Close runs panics inside the
// client library (a send on sarama's closed channel, a WaitGroup reused in
// amqp). A Guard makes Close wait for the calls under way and later calls
// fail with ErrClosed.
package pubguard

import (
	"errors"
	"sync"
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
