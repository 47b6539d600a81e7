package walrelay

// The dispatcher: events of one key form a lane, published one at a time
// in stream (commit) order. Concurrency workers (long-lived goroutines, so
// that an event costs no goroutine start nor stack growth) take lanes whose
// head event may start, in the order they became ready. A worker that
// finds several lanes ready takes their heads together (at most
// MaxPublishBatch) and publishes those of one topic in a single Publish
// call (watermill's Publish takes several messages): each belongs to a
// different key, and a key's next event is taken only once its head is
// settled, so per-key order holds. An event is settled (reported to the
// reader) once the broker acknowledged it or it was durably parked in the
// outbox table. A batch the broker refuses is charged to nobody: each of
// its events is then published on its own, through the single-event path
// with its retries, circuit breaker accounting and parking, exactly as if
// it had never been batched. When the error says which events the broker
// stored (relay.PartialError), only the others take that path; when it
// does not, those it took are published again: duplicates, never losses.
// A single event takes that path at once.

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/outboxgen/outboxgen/runtime/internal/backoff"
	"github.com/outboxgen/outboxgen/runtime/internal/hedge"
	"github.com/outboxgen/outboxgen/runtime/internal/outmsg"
	"github.com/outboxgen/outboxgen/runtime/internal/telemetry"
	"github.com/outboxgen/outboxgen/runtime/internal/workers"
	"github.com/outboxgen/outboxgen/runtime/relay"
)

// lane is the queue of one key's events. It is in dispatcher.lanes while
// it has events; it is in dispatcher.ready while its head may start (no
// worker holds it).
type lane struct {
	key   string
	queue []*event
	busy  bool // a worker publishes its head
	// failedIn is 1 + the breaker's epoch (breaker.openEpoch) in which
	// its head failed while the breaker was open (requeue; 0: not since it
	// became the head): see starved.
	failedIn int
}

type dispatcher struct {
	r       *Relay
	parked  *parkedKeys
	settled chan<- settlement
	brk     *breaker
	singles chan struct{} // bounds the events delivered one by one at once (Concurrency)
	stalls  chan struct{} // places given back by slow calls (SlowCallsPerSlot × Concurrency)
	losers  atomic.Int64  // calls left running after a hedged call succeeded: stop waits for them
	pool    *workers.Pool // the goroutines publisher calls and a split's deliveries run on

	ctx    context.Context // cancelled by stop: start no new publish
	cancel context.CancelFunc
	wg     sync.WaitGroup

	// failed is closed, err set, when an event can be neither published
	// nor parked until an operator acts (fail): the reader stops Run.
	failed   chan struct{}
	err      error
	failOnce sync.Once

	// starve is signalled (buffered, one) when starved may have become
	// true: the reader, paused at its bounds, looks again.
	starve chan struct{}

	mu    sync.Mutex
	cond  *sync.Cond // signalled when a lane becomes ready, and at stop
	lanes map[string]*lane
	ready []*lane // lanes whose head may start, in the order they became ready
}

// MaxPublishBatch is the most events one Publish call of the WAL relay
// carries: the heads of that many keys' lanes, when that many are ready.
const MaxPublishBatch = 64

// SlowCallsPerSlot bounds the places slow calls give back (see
// Config.Concurrency): SlowCallsPerSlot × Concurrency at once, a worker's
// hand-off taking one, and a slow single delivery one more for its own
// place among the single deliveries.
// A call that runs slow beyond them keeps its place, so when the broker
// stalls every call, the calls under way stay a small multiple of
// Concurrency instead of one per event in flight.
const SlowCallsPerSlot = 4

func newDispatcher(r *Relay, parked *parkedKeys, settled chan<- settlement) *dispatcher {
	ctx, cancel := context.WithCancel(context.Background())
	d := &dispatcher{
		r: r, parked: parked, settled: settled,
		brk:     newBreaker(r),
		singles: make(chan struct{}, r.cfg.Concurrency),
		stalls:  make(chan struct{}, SlowCallsPerSlot*r.cfg.Concurrency),
		ctx:     ctx, cancel: cancel,
		failed: make(chan struct{}),
		starve: make(chan struct{}, 1),
		lanes:  map[string]*lane{},
		pool:   workers.New(),
	}
	d.cond = sync.NewCond(&d.mu)
	for range r.cfg.Concurrency {
		d.wg.Add(1)
		go d.worker()
	}
	return d
}

// dispatch queues evs on their keys' lanes; a lane that was empty becomes
// ready.
func (d *dispatcher) dispatch(evs ...*event) {
	d.mu.Lock()
	for _, ev := range evs {
		l := d.lanes[ev.Key]
		if l == nil {
			l = &lane{key: ev.Key}
			d.lanes[ev.Key] = l
		}
		l.queue = append(l.queue, ev)
		if len(l.queue) == 1 && !l.busy {
			d.ready = append(d.ready, l)
			d.cond.Signal()
		}
	}
	d.mu.Unlock()
}

// giveBack returns taken events that have not started to their lanes,
// which are ready again ahead of the others, in evs's order.
func (d *dispatcher) giveBack(evs []*event) {
	if len(evs) == 0 {
		return
	}
	// A worker takes them again, maybe after a while (every worker may be
	// busy): they stop counting as under way, so that no verdict waits
	// for them meanwhile.
	for _, ev := range evs {
		d.release(ev)
	}
	d.mu.Lock()
	ready := make([]*lane, 0, len(evs)+len(d.ready))
	for _, ev := range evs {
		l := d.lanes[ev.Key]
		l.busy = false
		ready = append(ready, l)
	}
	d.ready = append(ready, d.ready...)
	d.cond.Broadcast()
	d.mu.Unlock()
	d.pokeStarve()
}

// pokeStarve wakes the reader, paused at its bounds, to look at starved
// again, when the breaker is open: a lane was given back or emptied.
// (A failed head's requeue wakes it too.)
func (d *dispatcher) pokeStarve() {
	if !d.brk.isOpen() {
		return
	}
	select {
	case d.starve <- struct{}{}:
	default:
	}
}

// requeue returns ev, which was tried while the breaker is open and
// failed, to its lane, which is ready again behind the others: the next
// probe is another lane's.
func (d *dispatcher) requeue(ev *event) {
	d.release(ev)
	epoch, open := d.brk.openEpoch()
	d.mu.Lock()
	l := d.lanes[ev.Key]
	l.busy = false
	if open {
		l.failedIn = epoch + 1
	}
	d.ready = append(d.ready, l)
	d.cond.Signal()
	d.mu.Unlock()
	d.pokeStarve()
}

// starved reports whether the breaker is open and the head of every
// lane has failed since it opened: no event in flight can close it.
// Poison events of a few keys look so (their failures opened it, and
// while it is open their probes are not counted), and so does an outage.
// The reader then reads on past its bounds (session.overflow), so that
// another key's event can probe: if it succeeds, the breaker closes and
// the poison events are parked.
func (d *dispatcher) starved() bool {
	epoch, open := d.brk.openEpoch()
	if !open {
		return false
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if len(d.lanes) == 0 {
		return false
	}
	for _, l := range d.lanes {
		if l.failedIn != epoch+1 || l.busy {
			return false
		}
	}
	return true
}

// stop makes the workers start no new publish and waits up to timeout for
// those under way. Unsettled events are left unconfirmed: the next session
// streams them again. The breaker is retired: the next session has its
// own, closed.
func (d *dispatcher) stop(timeout time.Duration) {
	d.cancel()
	d.brk.wake()
	d.mu.Lock()
	d.cond.Broadcast()
	d.mu.Unlock()
	defer d.brk.retire()
	defer d.pool.Stop()
	done := make(chan struct{})
	go func() { d.wg.Wait(); close(done) }()
	t := time.NewTimer(timeout)
	defer t.Stop()
	select {
	case <-done:
	case <-t.C:
		d.r.log.Warn("publishes still running at the shutdown timeout: abandoned; their events are published again by the next stream")
		return
	}
	// The losing calls of hedged calls that succeeded: cancelled, they
	// should return soon, and the publisher may be closed once Run
	// returns. (A call past PublishTimeout was given up: not waited for.)
	// Polled, not a WaitGroup: a call that never returns would leave a
	// waiter behind.
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for d.losers.Load() > 0 {
		select {
		case <-tick.C:
		case <-t.C:
			d.r.log.Warn("losing calls of hedged publishes still running at the shutdown timeout: not waited for; their events were settled", slog.Int64("calls", d.losers.Load()))
			return
		}
	}
}

// take waits for ready lanes and takes the heads of up to MaxPublishBatch
// of them, marking their lanes busy; nil when stopping.
func (d *dispatcher) take(buf []*event) []*event {
	d.mu.Lock()
	defer d.mu.Unlock()
	for len(d.ready) == 0 && d.ctx.Err() == nil {
		d.cond.Wait()
	}
	if d.ctx.Err() != nil {
		return nil
	}
	n := min(len(d.ready), MaxPublishBatch)
	for _, l := range d.ready[:n] {
		l.busy = true
		buf = append(buf, l.queue[0])
	}
	clear(d.ready[:n])
	d.ready = d.ready[n:]
	if len(d.ready) > 0 {
		d.cond.Signal() // more for another worker
	}
	return buf
}

// done pops the settled head of ev's lane, which becomes ready again if it
// has more events.
func (d *dispatcher) done(ev *event) {
	d.mu.Lock()
	l := d.lanes[ev.Key]
	l.queue[0] = nil
	l.queue = l.queue[1:]
	l.busy = false
	l.failedIn = 0 // its next event has not failed
	emptied := len(l.queue) == 0
	if emptied {
		delete(d.lanes, ev.Key)
	} else {
		d.ready = append(d.ready, l)
		d.cond.Signal()
	}
	d.mu.Unlock()
	if emptied {
		d.pokeStarve()
	}
}

// worker publishes the heads of ready lanes until the dispatcher stops,
// or until one of its calls ran slow: a call that runs for Slow (eight
// times the typical call, 2ms to 250ms) starts another worker in its
// place, gives back the events it took and has not started (other topics'
// batches, single deliveries), and this worker ends once the events it
// started are settled. So Concurrency calls that stall do not stop the
// other keys. At most SlowCallsPerSlot × Concurrency places are given
// back at once (stalls); a slow call beyond them keeps its place.
func (d *dispatcher) worker() {
	defer d.wg.Done()
	var (
		mu        sync.Mutex
		handedOff bool     // a slow call gave this worker's place to another
		waiting   []*event // taken, not started: given back at the hand-off
	)
	defer func() {
		mu.Lock()
		defer mu.Unlock()
		if handedOff {
			<-d.stalls
		}
	}()
	// slow runs in the goroutine of the slow call (the worker's, or a
	// single delivery's).
	slow := func() bool {
		mu.Lock()
		defer mu.Unlock()
		if handedOff {
			return true
		}
		select {
		case d.stalls <- struct{}{}:
		default:
			return false
		}
		handedOff = true
		d.wg.Add(1)
		go d.worker()
		d.giveBack(waiting)
		waiting = nil
		return true
	}
	// wait sets the events waiting; false once the worker was handed off
	// (they were given back).
	wait := func(evs ...[]*event) bool {
		mu.Lock()
		defer mu.Unlock()
		if handedOff {
			return false
		}
		waiting = waiting[:0]
		for _, e := range evs {
			waiting = append(waiting, e...)
		}
		return true
	}
	var buf, batch, singles []*event
	for {
		// While the breaker is open, the worker waits here, holding no
		// event, until a probe may start.
		if !d.brk.await(d.ctx) {
			return
		}
		evs := d.take(buf[:0])
		if evs == nil {
			return
		}
		if d.brk.isOpen() {
			// One probe at a time: the first lane taken, the one that
			// waited longest; the others go back in front, in order.
			d.giveBack(evs[1:])
			evs = evs[:1]
		}
		buf = evs
		// Events of keys that may have parked rows are checked against the
		// table first (deliver); the others of one topic go out together
		// while the breaker is closed.
		batch, singles = batch[:0], singles[:0]
		for _, ev := range evs {
			if d.parked.mayHave(ev.Key) {
				singles = append(singles, ev)
			} else {
				batch = append(batch, ev)
			}
		}
		if d.brk.isOpen() {
			singles, batch = append(singles, batch...), batch[:0] // it opened meanwhile
		}
		var refused []*event // of batches the broker refused: published one by one
		for len(batch) > 0 {
			// One topic per Publish call: the batch's first event's. (Read
			// before the loop: rest overwrites batch as it goes.)
			topic := batch[0].Topic
			group, rest := batch[:0:0], batch[:0]
			for _, ev := range batch {
				if ev.Topic == topic {
					group = append(group, ev)
				} else {
					rest = append(rest, ev)
				}
			}
			batch = rest
			if len(group) == 1 {
				singles = append(singles, group...)
				continue
			}
			wait(batch, singles, refused)
			left := d.publishBatch(group, slow)
			if !wait() {
				batch, singles, refused = nil, nil, nil // given back
			}
			refused = append(refused, left...)
		}
		singles = append(singles, refused...)
		if !d.deliverAll(singles, slow) {
			return // shutting down: the unsettled events are streamed again
		}
		mu.Lock()
		off := handedOff
		mu.Unlock()
		if off {
			return
		}
	}
}

// publishBatch publishes evs (different keys, one topic) in one Publish
// call and settles those the broker took. It returns the others, for the
// caller to publish one by one: all of them when the call failed or was
// split, or shutdown began before it; those the broker did not store
// when its error says which it did (relay.PartialError), so that a broker
// that keeps repeats does not store the others twice.
func (d *dispatcher) publishBatch(evs []*event, slow func() bool) (refused []*event) {
	r := d.r
	if d.ctx.Err() != nil {
		return evs
	}
	c := d.brk.begin()
	err := r.publishMany(context.WithoutCancel(d.ctx), evs, hooks{slow: slow, losers: &d.losers, pool: d.pool})
	stored := relay.StoredOf(err, len(evs))
	switch {
	case err == nil:
		d.brk.success(c)
	case stored != nil:
		// A call of several events holds one per key, so settling some
		// while their neighbours are sent again keeps each key's order.
		for i, ev := range evs {
			if !stored[i] {
				ev.pending = true
				refused = append(refused, ev)
			}
		}
		d.brk.successPart(c, len(refused))
		r.log.Debug("batch publish partly failed: publishing the events the broker did not store one by one",
			slog.Int("events", len(evs)), slog.Int("not_stored", len(refused)), slog.String("error", telemetry.ErrorText(err)))
	default:
		// Its events' own calls tell what it failed of (see verdict).
		for _, ev := range evs {
			ev.pending = true
		}
		d.brk.handOver(len(evs))
		if !errors.Is(err, errSplit) { // hedged: one by one; the call's contexts are cancelled (publishMany)
			r.log.Debug("batch publish failed: publishing its events one by one", slog.Int("events", len(evs)), slog.String("error", telemetry.ErrorText(err)))
		}
		return evs
	}
	r.update(func(s *Status) { s.Published += int64(len(evs) - len(refused)) })
	for i, ev := range evs {
		if stored == nil || stored[i] {
			d.settled <- settlement{ev.tx, ev.bytes}
			d.done(ev)
		}
	}
	return refused
}

// deliverAll delivers evs one by one (each with its own retries and
// parking), concurrently (at most Concurrency single deliveries at once
// across the workers, so parking checks cannot swamp the pool, besides
// those whose call ran slow, see place), and settles them; false when
// shutdown cut one off.
func (d *dispatcher) deliverAll(evs []*event, slow func() bool) bool {
	one := func(ev *event) bool {
		select {
		case d.singles <- struct{}{}:
		case <-d.ctx.Done():
			d.release(ev)
			return false
		}
		p := &place{d: d, worker: slow, held: true}
		o := d.deliver(ev, p)
		p.leave()
		switch o {
		case cutOff:
			return false
		case notNow:
			d.giveBack([]*event{ev})
		case tryLater:
			d.requeue(ev)
		default:
			d.settled <- settlement{ev.tx, ev.bytes}
			d.done(ev)
		}
		return true
	}
	switch len(evs) {
	case 0:
		return true
	case 1:
		return one(evs[0])
	}
	var wg sync.WaitGroup
	ok := make([]bool, len(evs))
	for i, ev := range evs {
		wg.Add(1)
		d.pool.Go(func() { defer wg.Done(); ok[i] = one(ev) })
	}
	wg.Wait()
	for _, o := range ok {
		if !o {
			return false
		}
	}
	return true
}

// place is a single delivery's place among the Concurrency ones
// (dispatcher.singles). A call that runs slow gives it back, taking one
// of the stalls, and hands its worker off; the delivery takes a place
// again before it retries or parks (back). Its methods run in the
// delivery's goroutine.
type place struct {
	d       *dispatcher
	worker  func() bool // the worker's hand-off
	held    bool        // holds a place of singles
	stalled bool        // holds one of stalls
}

// slow is the hook of the delivery's calls (see hooks): it gives back
// the place only with its worker's hand-off, which frees the worker's
// other deliveries; else both keep theirs and are asked again.
func (p *place) slow() bool {
	select {
	case p.d.stalls <- struct{}{}:
	default:
		return false
	}
	if !p.worker() {
		<-p.d.stalls
		return false
	}
	p.stalled = true
	p.held = false
	<-p.d.singles
	return true
}

// back ends a slow call's stall and takes a place again; false when the
// dispatcher stops first.
func (p *place) back() bool {
	if p.stalled {
		p.stalled = false
		<-p.d.stalls
	}
	if !p.held {
		select {
		case p.d.singles <- struct{}{}:
			p.held = true
		case <-p.d.ctx.Done():
			return false
		}
	}
	return true
}

// leave gives back what the delivery holds.
func (p *place) leave() {
	if p.stalled {
		p.stalled = false
		<-p.d.stalls
	}
	if p.held {
		p.held = false
		<-p.d.singles
	}
}

// outcome is how a delivery ended.
type outcome int

const (
	settled  outcome = iota // published, or parked
	cutOff                  // by shutdown: unsettled, streamed again by the next session
	notNow                  // the breaker is open and it is another's turn to probe: back in front
	tryLater                // it failed while the breaker is open: back behind the other lanes
)

// deliver publishes ev, or parks it. While the breaker is open it leaves
// instead of waiting (notNow, tryLater), so that its worker takes the
// next probe's lane: when the events in flight are poison, only another
// key's probe can close the breaker.
func (d *dispatcher) deliver(ev *event, p *place) outcome {
	r := d.r
	defer d.release(ev) // if it leaves before its own call
	if !d.brk.mayStart() {
		return notNow // before the parked rows' check, a query
	}
	if d.parked.mayHave(ev.Key) {
		d.release(ev) // it may be parked without a call
		// It reads the key's rows and may insert ev: SELECT and INSERT.
		blocked, err := d.retryDB(ev, "SELECT, INSERT", func(ctx context.Context) (bool, error) { return r.q.parkIfBlocked(ctx, r.pool, ev) })
		if err != nil {
			return cutOff
		}
		if blocked {
			d.parkedOne(ev, "behind unsent rows of its key")
			return settled
		}
		d.parked.remove(ev.Key)
		r.update(func(s *Status) { s.ParkedKeys = d.parked.size() })
	}
	for {
		c, ok := d.brk.acquire(ev.pending)
		if !ok {
			return notNow // it opened meanwhile, or another lane probes
		}
		// Counted as under way now (its count from its failed batch, if
		// pending, is this call's). A publish under way at shutdown is
		// waited for (stop), not cut. success and failure record the
		// outcome as the call stops counting as under way, so that a
		// verdict waiting for it sees it.
		ev.pending = false
		err := r.publish(context.WithoutCancel(d.ctx), ev, ev.attempts+1, hooks{slow: p.slow, losers: &d.losers, pool: d.pool})
		if err == nil {
			d.brk.success(c)
			r.update(func(s *Status) { s.Published++ })
			return settled
		}
		permanent := errors.Is(err, relay.ErrPermanent)
		if d.ctx.Err() != nil && !permanent {
			d.brk.end()
			return cutOff
		}
		counted, started := d.brk.failure(ev.Key, c, permanent)
		delay, alone := r.cfg.RetryDelay, false
		text := telemetry.ErrorText(err)
		if !counted {
			// Another lane probes next: a poison event that probed the
			// open breaker for ever would keep the probe from a lane
			// whose success would close it.
			r.log.Debug("publish failed while the circuit breaker is open: not counted", slog.String("event_id", ev.ID.String()), slog.String("error", text))
			return tryLater
		}
		if ev.failed == 0 {
			ev.failed = started // see breaker.verdict
		}
		// Retries and parking count among the Concurrency deliveries: a
		// slow call's delivery takes a place again.
		if !p.back() {
			return cutOff
		}
		ev.attempts++
		r.log.Warn("publish failed", slog.String("event_id", ev.ID.String()), slog.String("type", ev.Type), slog.String("key", ev.Key),
			slog.String("topic", ev.Topic), slog.Int("attempt", ev.attempts), slog.Bool("permanent", permanent), slog.String("error", text))
		if !permanent && ev.attempts >= r.cfg.QuickRetries+ev.extra {
			// Waiting, it gives back its place: the calls it waits for
			// may need one (those of a failed batch's events).
			p.leave()
			park, ok := d.brk.verdict(d.ctx, ev.failed)
			if !ok {
				return cutOff
			}
			if !park {
				return tryLater // an outage: its lane takes its turn to probe
			}
			if !p.back() {
				return cutOff
			}
			switch fresh := d.brk.freshestCall(); {
			case c.freshest > ev.failed:
				// Before this attempt began, the broker accepted a call
				// that started after the event first failed: the broker
				// worked, and the event still fails. Poison: parked.
			case fresh > ev.failed:
				// The broker accepted such a call only once this
				// attempt had begun: it may have come back meanwhile
				// (calls under way as an outage ended). One more attempt
				// tells; it begins after that success, so this holds
				// once.
				if d.ctx.Err() != nil {
					return cutOff // stop starts no new publish
				}
				ev.extra++
				r.log.Info("publish failed, then the broker accepted other events: trying it once more before parking it",
					slog.String("event_id", ev.ID.String()), slog.String("key", ev.Key))
				continue
			default:
				// Its key fails alone: the broker accepted no call begun
				// since its first failure, and nothing else is under way
				// to tell an outage (a quiet moment) from a poison event.
				// Retried with growing pauses until the broker's return
				// or another key's publish decides, for ParkAloneAfter at
				// most. It waits as a slow call does, its worker's place
				// given to another, so that the other keys' publishes,
				// which may decide, go on; with no stall left to take, it
				// is parked now.
				if ev.alone.IsZero() {
					ev.alone = time.Now()
				}
				if left := r.cfg.ParkAloneAfter - time.Since(ev.alone); left > 0 && p.slow() {
					if ev.aloneTries == 0 {
						r.log.Info("publish failed, and no other key's publish tells a broker outage from a poison event: retrying it before parking it",
							slog.String("event_id", ev.ID.String()), slog.String("key", ev.Key), slog.Duration("for", left))
					}
					ev.extra++
					ev.aloneTries++
					// RetryDelay, doubling, at most a second (or
					// RetryDelay): the broker's return is seen soon
					// even with nothing else to wake the wait.
					delay = r.cfg.RetryDelay
					for i := 1; i < ev.aloneTries && delay < time.Second; i++ {
						delay *= 2
					}
					delay = min(delay, max(time.Second, r.cfg.RetryDelay), left)
					alone = true
				}
			}
		}
		if permanent || ev.attempts >= r.cfg.QuickRetries+ev.extra {
			backoff := max(r.cfg.Backoff(1), 0)
			_, err := d.retryDB(ev, "INSERT", func(ctx context.Context) (bool, error) {
				return true, r.q.park(ctx, r.pool, ev, text, backoff)
			})
			if err != nil {
				return cutOff
			}
			d.parked.add(ev.Key)
			d.brk.forget(ev.Key)
			r.update(func(s *Status) { s.ParkedKeys = d.parked.size() })
			d.parkedOne(ev, "its publish kept failing: "+text)
			return settled
		}
		if alone {
			// Cut short by the success of a call begun after it
			// first failed, or the breaker's opening: either decides.
			if !d.brk.pause(d.ctx, delay, ev.failed) {
				return cutOff
			}
		} else {
			t := time.NewTimer(delay)
			select {
			case <-t.C:
			case <-d.ctx.Done():
				t.Stop()
				return cutOff
			}
		}
		if !p.back() || d.ctx.Err() != nil { // after waiting alone; stop starts no new publish
			return cutOff
		}
	}
}

// release ends ev's count as a publish under way, if its failed batch
// left it one (see breaker.handOver) and its own call has not started.
func (d *dispatcher) release(ev *event) {
	if ev.pending {
		ev.pending = false
		d.brk.end()
	}
}

// fail records the first error that stops Run, for the reader, which
// ends the session.
func (d *dispatcher) fail(err error) {
	d.failOnce.Do(func() {
		d.err = err
		close(d.failed)
	})
}

// hasFailed reports whether fail was called (d.err is then set).
func (d *dispatcher) hasFailed() bool {
	select {
	case <-d.failed:
		return true
	default:
		return false
	}
}

func (d *dispatcher) parkedOne(ev *event, why string) {
	r := d.r
	r.update(func(s *Status) { s.Parked++ })
	r.met.parked(d.ctx)
	r.log.Warn("event parked in the outbox table: the polling relay publishes it (retries, FAILED, requeue); its key streams again once its parked rows are sent",
		slog.String("event_id", ev.ID.String()), slog.Int64("id", ev.Seq), slog.String("type", ev.Type), slog.String("key", ev.Key),
		slog.String("lsn", ev.lsn.String()), slog.String("why", why))
}

// retryDB runs f, which parks ev (privilege: what it needs on the outbox
// table), until it succeeds, waiting with a growing pause after each
// database error that may clear (a lost connection, a serialization
// failure, a server shutting down). It gives up when the dispatcher stops
// (the event stays unsettled, so it is streamed again), or at an error
// that waiting cannot mend (parkError), which stops Run: retried, it
// would hold the confirmed position, and the slot's WAL, for good. It
// never settles an event that is neither published nor parked.
func (d *dispatcher) retryDB(ev *event, privilege string, f func(ctx context.Context) (bool, error)) (bool, error) {
	bo := backoff.New(100*time.Millisecond, d.r.cfg.ReconnectMax)
	for {
		ctx, cancel := context.WithTimeout(d.ctx, 30*time.Second)
		v, err := f(ctx)
		cancel()
		if err == nil {
			return v, nil
		}
		if d.ctx.Err() != nil {
			return false, d.ctx.Err()
		}
		if ferr := d.r.parkError(ev, privilege, err); ferr != nil {
			d.fail(ferr)
			return false, ferr
		}
		wait := bo.Next()
		d.r.log.Warn("parking in the outbox table failed: retrying; the slot's confirmed position stays before this event until it is parked: if this repeats, check the database and the relay's connection to it",
			slog.String("event_id", ev.ID.String()), slog.String("key", ev.Key), slog.String("error", telemetry.ErrorText(err)), slog.Duration("retry_in", wait))
		t := time.NewTimer(wait)
		select {
		case <-t.C:
		case <-d.ctx.Done():
			t.Stop()
			return false, d.ctx.Err()
		}
	}
}

// buildMessage builds ev's watermill message with package outmsg, as the
// polling relay builds a row's: the sequence is the id the event would
// have had, and has if parked, so a parked event is published unchanged.
func buildMessage(ctx context.Context, ev *event) (*message.Message, error) {
	msg, err := outmsg.Build(ctx, outmsg.Event{
		EventID: ev.ID.String(), Seq: ev.Seq, Type: ev.Type, Key: ev.Key, Version: ev.Version,
		CreatedAt: ev.CreatedAt, Headers: ev.Headers, Payload: ev.Payload,
	})
	if err != nil {
		return nil, relay.Permanent(fmt.Errorf("walrelay: event %s: %w", ev.ID, err))
	}
	return msg, nil
}

// publish publishes ev once, bounded by PublishTimeout, with the polling
// relay's producer span and publish metrics.
func (r *Relay) publish(ctx context.Context, ev *event, attempt int, h hooks) (err error) {
	msg, err := buildMessage(ctx, ev)
	var md map[string]string
	if msg != nil {
		md = msg.Metadata
	}
	sctx, end := r.tel.StartSend(ctx, md, telemetry.Message{
		Topic: ev.Topic, Type: ev.Type, EventID: ev.ID.String(), Key: ev.Key,
		Sequence: ev.Seq, Attempt: attempt, CreatedAt: ev.CreatedAt,
	})
	defer func() { end(err) }()
	if err != nil {
		return err
	}
	pctx, cancel := context.WithTimeout(sctx, r.cfg.PublishTimeout)
	defer cancel()
	msg.SetContext(pctx)
	deadline, _ := pctx.Deadline()
	if err := r.call([]*event{ev}, []*message.Message{msg}, pctx.Done(), deadline, h); err != nil {
		if errors.Is(err, errTimeout) {
			return fmt.Errorf("walrelay: publish of event %s did not return within %s (Config.PublishTimeout): %w", ev.ID, r.cfg.PublishTimeout, context.DeadlineExceeded)
		}
		return err
	}
	return nil
}

// publishMany publishes evs (one topic) in one Publish call, bounded by
// PublishTimeout, each message with its own producer span and publish
// metrics, as publish gives a single one. An event whose message cannot be
// built fails the call before anything is sent.
func (r *Relay) publishMany(ctx context.Context, evs []*event, h hooks) (err error) {
	msgs := make([]*message.Message, len(evs))
	ends := make([]func(error), 0, len(evs))
	cancels := make([]context.CancelFunc, 0, len(evs))
	defer func() {
		for _, c := range cancels {
			c()
		}
		stored := relay.StoredOf(err, len(evs)) // each stored message's span ends well
		for i, end := range ends {
			if stored != nil && stored[i] {
				end(nil)
			} else {
				end(err)
			}
		}
	}()
	deadline := time.Now().Add(r.cfg.PublishTimeout)
	var expired <-chan struct{}
	for i, ev := range evs {
		msg, berr := buildMessage(ctx, ev)
		if berr != nil {
			return berr
		}
		sctx, end := r.tel.StartSend(ctx, msg.Metadata, telemetry.Message{
			Topic: ev.Topic, Type: ev.Type, EventID: ev.ID.String(), Key: ev.Key,
			Sequence: ev.Seq, Attempt: 1, CreatedAt: ev.CreatedAt,
		})
		ends = append(ends, end)
		pctx, cancel := context.WithDeadline(sctx, deadline)
		cancels = append(cancels, cancel)
		msg.SetContext(pctx)
		msgs[i] = msg
		if i == 0 {
			expired = pctx.Done() // every message's context has the deadline
		}
	}
	if err := r.call(evs, msgs, expired, deadline, h); err != nil {
		if errors.Is(err, errTimeout) {
			return fmt.Errorf("walrelay: publish of %d events did not return within %s (Config.PublishTimeout): %w", len(evs), r.cfg.PublishTimeout, context.DeadlineExceeded)
		}
		return err
	}
	return nil
}

// publishCall is one Publish call; a panic in the publisher is its error.
func (r *Relay) publishCall(topic string, msgs []*message.Message) (err error) {
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("walrelay: publisher panicked: %v", p)
		}
	}()
	return r.cfg.Publisher.Publish(topic, msgs...)
}

// errTimeout is call's error when no call returned by the deadline.
var errTimeout = errors.New("walrelay: publish timed out")

// errSplit is the hedge of a call of several events: publish them one by
// one (see call).
var errSplit = errors.New("walrelay: batch publish running long: published one by one")

// hooks connect a Publish call to its dispatcher.
type hooks struct {
	// slow, if not nil, is called once the call has run for Slow
	// (hedge.Typical): the worker's hand-off (dispatcher.worker), or a
	// single delivery's (place). False: the call keeps its place, and
	// slow is called again after another Slow.
	slow func() bool
	// losers, if not nil, counts the calls left running after a hedged
	// call succeeded or split (cancelled, they should return soon), until
	// they return or their deadline passes; the dispatcher's stop waits
	// for them.
	losers *atomic.Int64
	// pool runs the call's goroutines (nil: a fresh one each).
	pool *workers.Pool
}

// call publishes msgs, the messages of evs (one topic), in one Publish
// call run on a goroutine of its own, h.pool's (a call that never returns
// is left behind when expired is ready: errTimeout). With Config.Hedge, a call still
// running at the hedge delay is made again beside it, with copies of the
// messages, if the throttle allows, and again that delay later, up to
// relay.MaxHedges times. The first call to succeed decides; the caller
// then cancels the messages' contexts (each is its publish's, with the
// deadline, and the copies share it), which stops the others, counted in
// h.losers until they return. A failure ends the hedging and waits for
// the calls still running (one may yet succeed); when all fail, the
// first failure is returned.
func (r *Relay) call(evs []*event, msgs []*message.Message, expired <-chan struct{}, deadline time.Time, h hooks) error {
	topic := evs[0].Topic
	hedging := r.cfg.Hedge
	var after time.Duration
	var throttle *hedge.Throttle // refilled by an unhedged call (nil: Hedge off)
	if hedging {
		after, throttle = r.typ.After(r.cfg.HedgeAfter), r.hedges
	}
	// A call of several events is not sent again whole: its hedge is
	// errSplit, and the caller publishes the events one by one beside it
	// (dispatcher.publishBatch), so a stall that hits one of them (its
	// partition, its subject) holds back its key only.
	split := hedging && len(evs) > 1
	var pristine []*message.Message // the hedges' source, never published
	var spans []context.Context     // the messages' send spans, for a split
	var hedges <-chan time.Time
	if hedging {
		// Taken before the first call starts: a publisher may write to
		// its messages while it runs.
		if split {
			spans = make([]context.Context, len(msgs))
			for i, m := range msgs {
				spans[i] = m.Context()
			}
		} else {
			pristine = make([]*message.Message, len(msgs))
			for i, m := range msgs {
				pristine[i] = m.CopyWithContext()
			}
		}
		t := time.NewTimer(after)
		defer t.Stop()
		hedges = t.C
	}
	calls := 1
	if hedging {
		calls += relay.MaxHedges
	}
	res := make(chan error, calls)
	// Each call's state when hedging, for h.losers: running, counted as a
	// loser, returned. (Unhedged, the one call has returned when call does.)
	const running, losing, returned = 0, 1, 2
	var states []*atomic.Int32
	start := func(ms []*message.Message) {
		var st *atomic.Int32
		if hedging && h.losers != nil {
			st = new(atomic.Int32)
			states = append(states, st)
		}
		h.pool.Go(func() {
			err := r.publishCall(topic, ms)
			// Returned before its result is seen: a call that won is never
			// counted as a loser (leave).
			if st != nil && st.Swap(returned) == losing {
				h.losers.Add(-1)
			}
			res <- err
		})
	}
	began := time.Now()
	start(msgs)
	var slowT *time.Timer
	var slowC <-chan time.Time
	if h.slow != nil {
		slowT = time.NewTimer(r.typ.Slow())
		defer slowT.Stop()
		slowC = slowT.C
	}
	// leave counts the calls still running as losers: the caller cancels
	// their messages' contexts as it returns. A loser still running at the
	// deadline (a publisher that ignores its context) stops counting then,
	// as a call given up at PublishTimeout does.
	leave := func() {
		for _, st := range states {
			h.losers.Add(1)
			if !st.CompareAndSwap(running, losing) {
				h.losers.Add(-1)
				continue
			}
			time.AfterFunc(time.Until(deadline), func() {
				if st.CompareAndSwap(losing, returned) {
					h.losers.Add(-1)
				}
			})
		}
	}
	race := hedge.NewRace()
	for {
		select {
		case err := <-res:
			done, err := race.Returned(err)
			if !done {
				hedges = nil
				continue // another call may still succeed
			}
			race.Done(&r.typ, throttle, time.Since(began))
			leave()
			return err
		case <-hedges:
			hedges = nil
			if !r.hedges.Take() {
				continue
			}
			if split {
				for i, ctx := range spans {
					r.tel.Hedged(ctx, evs[i].Type, topic, time.Since(began))
				}
				r.log.Debug("batch publish running long: its events are published one by one beside it (hedge)", slog.Int("events", len(evs)),
					slog.String("topic", topic), slog.Duration("after", time.Since(began)))
				leave()
				return errSplit
			}
			hedged, more := race.Hedge()
			for i, m := range pristine {
				r.tel.Hedged(m.Context(), evs[i].Type, topic, time.Since(began))
			}
			r.log.Debug("publish running long: sent again beside it (hedge)", slog.Int("events", len(evs)),
				slog.String("event_id", evs[0].ID.String()), slog.String("key", evs[0].Key), slog.String("topic", topic),
				slog.Duration("after", time.Since(began)), slog.Int("hedge", hedged))
			ms := make([]*message.Message, len(pristine))
			for i, m := range pristine {
				ms[i] = m.CopyWithContext()
			}
			start(ms)
			if more {
				t := time.NewTimer(after)
				defer t.Stop()
				hedges = t.C
			}
		case <-slowC:
			if h.slow() {
				slowC = nil
			} else {
				slowT.Reset(r.typ.Slow()) // no place to give back yet
			}
		case <-expired:
			return errTimeout
		}
	}
}
