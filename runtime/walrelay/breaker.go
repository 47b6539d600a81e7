package walrelay

import (
	"context"
	"log/slog"
	"sync"
	"time"
)

// breaker is the stream's circuit breaker. Publishes failing, with errors
// not marked permanent, for two or more distinct keys with no success in
// between (of a call begun after the first of them failed) are taken for
// a broker outage: the breaker opens and every lane waits (the in-flight
// bound then stops the reading of the stream) instead of parking the
// world. While open, one lane at a time probes, every BreakerBackoff(n),
// the lanes taking turns (a probe that fails sends its lane to the back
// of the ready lanes: poison events cannot keep the probe from a good
// one); the first success of a call begun since it opened (a probe)
// closes it. Failures of publishes that started while it was open, or
// while it opened, are not counted toward parking. A single failing key
// (a poison event) never opens it: other keys' successes reset the
// count, and the key is parked.
type breaker struct {
	r *Relay

	mu       sync.Mutex
	open     bool
	epoch    int             // bumped when it opens
	failKeys map[string]bool // keys failed since the last success (of a call begun after the first of them failed)
	trips    int
	next     time.Time // when open: the next probe
	probing  bool
	changed  chan struct{} // closed and replaced on every state change

	inflight int // publish calls under way, and events of failed batches before their own call (handOver)
	// starts numbers the publish calls as they start (the last one's
	// number); freshest is the highest number of a call the broker
	// accepted. An event's failure is judged against the calls that
	// started after it (verdict): a call under way as the broker went
	// down may still succeed after the first failures, and tells nothing
	// of the broker since.
	// failedAt: starts when the first of failKeys failed; a success
	// clears failKeys only if its call began after. openedAt: starts when
	// the breaker last opened; a success closes it only if its call began
	// after (a probe, or a batch that started as it opened).
	starts   uint64
	freshest uint64
	failedAt uint64
	openedAt uint64
	waiters  int  // lanes in verdict or a lone pause: wake them on every publish's end
	retired  bool // its session ended: it no longer reports its state
}

// call is a publish call as it starts: its number (breaker.starts), the
// freshest accepted call's number then (so whether the broker had
// accepted a call begun after the event's first failure before this
// attempt began), and whether it probes. Its number also tells whether
// it began before the breaker last opened (openedAt; see failure).
type call struct {
	n, freshest uint64
	probe       bool
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

// retire ends the breaker's reporting at the end of its session. The
// next session's breaker starts closed and reports only its changes, so a
// breaker that ends open would leave Status.BreakerOpen and the breaker
// gauge at open for good: both are reset here, and a publish abandoned at
// the shutdown timeout that ends later no longer touches them. The
// breaker itself stays as it is, so that no lane starts a publish.
func (b *breaker) retire() {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.retired = true
	if b.open {
		b.r.update(func(s *Status) { s.BreakerOpen = false })
		b.r.tel.Breaker(false)
	}
}

// isOpen reports whether the breaker holds publishing.
func (b *breaker) isOpen() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.open
}

// openEpoch is the epoch of the breaker's opening, while it is open.
func (b *breaker) openEpoch() (epoch int, open bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.epoch, b.open
}

// acquire reports whether a publish may start now: while closed, yes;
// while open, only as the probe, when it is due and no other runs (probe
// true). It does not wait: an event that may not start goes back to its
// lane, and its worker waits in await, holding nothing. A publish that may start
// counts as under way from here (as begin), unless carried: it counts
// already, its failed batch's count handed over (handOver). So no verdict
// sees nothing under way between the decision and the call.
func (b *breaker) acquire(carried bool) (c call, ok bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	switch {
	case !b.open:
	case b.mayStartLocked():
		b.probing, c.probe = true, true
	default:
		return c, false
	}
	if !carried {
		b.inflight++
	}
	b.starts++
	c.n, c.freshest = b.starts, b.freshest
	return c, true
}

// mayStart reports whether acquire would let a publish start now.
func (b *breaker) mayStart() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.mayStartLocked()
}

func (b *breaker) mayStartLocked() bool {
	return !b.open || (!b.probing && !time.Now().Before(b.next))
}

// await waits while no publish may start (the breaker is open, and a
// probe runs or the next is not due); false when ctx ends.
func (b *breaker) await(ctx context.Context) bool {
	for {
		b.mu.Lock()
		if b.mayStartLocked() {
			b.mu.Unlock()
			return ctx.Err() == nil
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
			return false
		case <-ch:
			t.Stop()
		case <-t.C:
		}
	}
}

// begin counts a batch's publish call as under way, so that verdict
// knows whether other publishes may still bring evidence, and numbers it.
// success, handOver and end stop counting it.
func (b *breaker) begin() call {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.inflight++
	b.starts++
	return call{n: b.starts, freshest: b.freshest}
}

// end stops counting a publish as under way, with no outcome recorded
// (a call cut off by shutdown, or an event whose batch failed that leaves
// without a call of its own: see handOver).
func (b *breaker) end() {
	b.mu.Lock()
	b.endLocked()
	b.mu.Unlock()
}

func (b *breaker) endLocked() {
	b.inflight--
	if b.waiters > 0 {
		b.signal()
	}
}

// handOver ends a batch call of n events that failed or was split: its
// failure says nothing of any one key, so it is not recorded, but its
// events' own calls, which follow, will tell. Until each starts, the
// event counts as a publish under way (event.pending), so that a lane
// waiting in verdict waits for that evidence instead of taking an outage
// for a poison event.
func (b *breaker) handOver(n int) {
	b.mu.Lock()
	b.inflight += n - 1 // n ≥ 2: the call's count becomes its events'
	// (Its events then go to their own calls, deliver, or back to their
	// lanes, giveBack: each ends its count, never a batch call.)
	b.mu.Unlock()
}

// forget drops key from the keys failed since the last success: its event
// was parked, so its failures are settled and must not combine with a
// later, unrelated key's failure into a false outage.
func (b *breaker) forget(key string) {
	b.mu.Lock()
	delete(b.failKeys, key)
	b.mu.Unlock()
}

// freshestCall returns the highest number of a call the broker accepted.
func (b *breaker) freshestCall() uint64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.freshest
}

// verdict decides, once an event's quick retries failed, between a poison
// event and the start of a broker outage. An event whose publishes fail
// fast (a refused connection, a full client buffer) can use up its quick
// retries before the other keys' publishes, still under way, fail and
// open the breaker: parking it then would be wrong. So verdict waits until
// the evidence is in: park (true) once the broker accepted a call that
// started after failed, the number of calls started when the event first
// failed (the broker works since: deliver then parks the event, or tries
// it once more if that came only after its last attempt began), or once
// no other publish is under way (nothing else to learn from: a key
// failing alone, see deliver); false once the breaker opened (an outage:
// the event waits with the others and is tried again when a probe closes
// the breaker). A call that started before the event failed tells
// nothing when it succeeds: it may have been under way as the broker
// went down. The publishes under way include slow calls that gave their
// place back: their outcome is evidence too (a broker that hangs rather
// than refuses), so a verdict may wait for them, at most PublishTimeout;
// and the events of a batch call that failed or was split, until each
// one's own call has an outcome (handOver). The lane gives back its place
// among the single deliveries while it waits here, so that those calls
// can run. ok is false when ctx ends.
func (b *breaker) verdict(ctx context.Context, failed uint64) (park, ok bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	for {
		switch {
		case b.open:
			return false, true
		case b.freshest > failed || b.inflight == 0:
			return true, true
		}
		b.waiters++
		ch := b.changed
		b.mu.Unlock()
		select {
		case <-ctx.Done():
		case <-ch:
		}
		b.mu.Lock()
		b.waiters--
		if ctx.Err() != nil {
			return false, false
		}
	}
}

// pause waits d, or less: until the broker accepts a call that started
// after failed (as in verdict) or the breaker opens. A key failing alone
// waits here: another key's outcome decides, and only those two tell
// something (a publish that ends otherwise, a permanent failure or a
// success of a call that started before, wakes it to wait on). false
// when ctx ends.
func (b *breaker) pause(ctx context.Context, d time.Duration, failed uint64) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	b.mu.Lock()
	defer b.mu.Unlock()
	for !b.open && b.freshest <= failed {
		b.waiters++
		ch := b.changed
		b.mu.Unlock()
		timedOut := false
		select {
		case <-ctx.Done():
		case <-ch:
		case <-t.C:
			timedOut = true
		}
		b.mu.Lock()
		b.waiters--
		if ctx.Err() != nil {
			return false
		}
		if timedOut {
			return true
		}
	}
	return true
}

// success records a publish call the broker accepted, and ends it: in
// one step, so that a verdict woken by the end sees the outcome. A call
// that began before the failures it would answer (under way as the
// broker went down) tells nothing of the broker since, as in verdict: it
// neither clears the failed keys nor closes the breaker.
func (b *breaker) success(c call) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.successLocked(c)
}

// successPart records a batch call of which the broker stored only some
// events (relay.PartialError): the broker accepted it, as success records,
// and its handed events it did not store go on counting as under way, as
// handOver's do, until each one's own call starts.
func (b *breaker) successPart(c call, handed int) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.inflight += handed // before the end's signal, so a verdict woken sees them
	b.successLocked(c)
}

func (b *breaker) successLocked(c call) {
	b.freshest = max(b.freshest, c.n)
	b.endLocked()
	if c.n > b.failedAt {
		clear(b.failKeys)
	}
	if c.probe {
		b.probing = false
	}
	if b.open && c.n > b.openedAt {
		b.r.log.Info("circuit breaker closed: the broker accepts events again", slog.Int("failed_probes", b.trips-1))
		b.open, b.trips = false, 0
		if !b.retired {
			b.r.update(func(s *Status) { s.BreakerOpen = false })
			b.r.tel.Breaker(false)
		}
		b.signal()
	} else if c.probe && b.open {
		b.signal() // a probe of an earlier opening ended: the next may start
	}
}

// failure records a failed publish call c of key, ends it (in one step,
// as success), and reports whether it counts toward parking the event,
// and the number of calls started so far (verdict's failed).
func (b *breaker) failure(key string, c call, permanent bool) (counted bool, started uint64) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.endLocked()
	started = b.starts
	if c.probe {
		b.probing = false
		b.trips++
		wait := max(b.r.cfg.BreakerBackoff(b.trips), 0)
		b.next = time.Now().Add(wait)
		b.r.log.Warn("circuit breaker probe failed: still paused", slog.Int("failed_probes", b.trips-1), slog.Duration("next_probe_in", wait))
		b.signal()
		return permanent, started
	}
	if permanent {
		return true, started
	}
	if b.open || c.n <= b.openedAt { // it began before the last opening
		return false, started
	}
	if len(b.failKeys) == 0 {
		b.failedAt = started
	}
	b.failKeys[key] = true
	if len(b.failKeys) < 2 {
		return true, started
	}
	b.open = true
	b.openedAt = started
	b.epoch++
	b.trips = 1
	wait := max(b.r.cfg.BreakerBackoff(1), 0)
	b.next = time.Now().Add(wait)
	b.r.log.Warn("circuit breaker open: publishes of several keys failed with no success between (broker outage?): the stream pauses, nothing is parked",
		slog.Int("keys", len(b.failKeys)), slog.Duration("next_probe_in", wait))
	clear(b.failKeys)
	if !b.retired {
		b.r.update(func(s *Status) { s.BreakerOpen = true })
		b.r.tel.Breaker(true)
	}
	b.signal()
	return false, started
}
