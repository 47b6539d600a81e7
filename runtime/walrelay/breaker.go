package walrelay

import (
	"context"
	"log/slog"
	"sync"
	"time"
)

// breaker is the stream's circuit breaker. Publishes failing, with errors
// not marked permanent, for two or more distinct keys with no success in
// between are taken for a broker outage: the breaker opens and every lane
// waits (the in-flight bound then stops the reading of the stream) instead
// of parking the world. While open, one lane at a time probes, every
// BreakerBackoff(n); the first success closes it. Failures of publishes
// that started while it was open, or while it opened, are not counted
// toward parking. A single failing key (a poison event) never opens it:
// other keys' successes reset the count, and the key is parked.
type breaker struct {
	r *Relay

	mu       sync.Mutex
	open     bool
	epoch    int             // bumped when it opens
	failKeys map[string]bool // keys failed since the last success
	trips    int
	next     time.Time // when open: the next probe
	probing  bool
	changed  chan struct{} // closed and replaced on every state change
}

func newBreaker(r *Relay) *breaker {
	return &breaker{r: r, failKeys: map[string]bool{}, changed: make(chan struct{})}
}

func (b *breaker) signal() {
	close(b.changed)
	b.changed = make(chan struct{})
}

// wake wakes the waiting lanes (at shutdown).
func (b *breaker) wake() {
	b.mu.Lock()
	b.signal()
	b.mu.Unlock()
}

// isOpen reports whether the breaker holds publishing.
func (b *breaker) isOpen() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.open
}

func (b *breaker) epochNow() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.epoch
}

// acquire waits until a publish may start: at once while closed; while
// open, when it is this lane's turn to probe (probe true). ok is false
// when ctx ends.
func (b *breaker) acquire(ctx context.Context) (probe, ok bool) {
	for {
		b.mu.Lock()
		if !b.open {
			b.mu.Unlock()
			return false, true
		}
		now := time.Now()
		if !b.probing && !now.Before(b.next) {
			b.probing = true
			b.mu.Unlock()
			return true, true
		}
		ch := b.changed
		wait := time.Until(b.next)
		if b.probing || wait <= 0 {
			wait = time.Second
		}
		b.mu.Unlock()
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return false, false
		case <-ch:
			t.Stop()
		case <-t.C:
		}
	}
}

// success records a publish the broker accepted.
func (b *breaker) success(probe bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	clear(b.failKeys)
	if probe {
		b.probing = false
	}
	if b.open {
		b.r.log.Info("circuit breaker closed: the broker accepts events again", slog.Int("failed_probes", b.trips-1))
		b.open, b.trips = false, 0
		b.r.update(func(s *Status) { s.BreakerOpen = false })
		b.r.tel.Breaker(false)
		b.signal()
	}
}

// failure records a failed publish of key that started at epoch and
// reports whether it counts toward parking the event.
func (b *breaker) failure(key string, probe bool, epoch int, permanent bool) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	if probe {
		b.probing = false
		b.trips++
		wait := max(b.r.cfg.BreakerBackoff(b.trips), 0)
		b.next = time.Now().Add(wait)
		b.r.log.Warn("circuit breaker probe failed: still paused", slog.Int("failed_probes", b.trips-1), slog.Duration("next_probe_in", wait))
		b.signal()
		return permanent
	}
	if permanent {
		return true
	}
	if b.open || epoch != b.epoch {
		return false
	}
	b.failKeys[key] = true
	if len(b.failKeys) < 2 {
		return true
	}
	b.open = true
	b.epoch++
	b.trips = 1
	wait := max(b.r.cfg.BreakerBackoff(1), 0)
	b.next = time.Now().Add(wait)
	b.r.log.Warn("circuit breaker open: publishes of several keys failed with no success between (broker outage?): the stream pauses, nothing is parked",
		slog.Int("keys", len(b.failKeys)), slog.Duration("next_probe_in", wait))
	clear(b.failKeys)
	b.r.update(func(s *Status) { s.BreakerOpen = true })
	b.r.tel.Breaker(true)
	b.signal()
	return false
}
