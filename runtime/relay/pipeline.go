package relay

// The pipeline: how Run, RunOnce and poll claim, publish and record.
//
// One goroutine (the loop) starts every database write: claims,
// recordings and lease extensions, so a recording never races a
// heartbeat. A claim runs on a goroutine of its own while the loop goes on
// taking the units' results (they go out with the next claim), so the
// database and the publishing overlap; while a backlog lasts (the last
// claim came back full) up to ParallelClaims claims run at once, each
// leasing under SKIP LOCKED as another instance's claim would, unless
// the rows left wait behind rows in flight (saturated); on PostgreSQL
// each reads a stripe of the keys of its own (takeStripe). Nothing else
// touches the database while a claim runs.
//
// Claimed rows are grouped into units (one ordered key's rows, or one
// unordered row), each published on a goroutine of its own (kept for
// reuse, see internal/workers); Concurrency slots bound the publishes running (a
// unit keeps its slot from its first row to its last), and a publish
// running eight times the typical one (at most SlowPublish) gives its
// slot back. Units report to the loop as they finish, and their
// results are recorded with the next claim, in its transaction (one
// commit; sqldriver on MySQL/MariaDB commits them just before it, see
// driver.ClaimResult.RecordedApart), or alone when no claim comes soon
// enough (recordDelay) or room is short. The loop claims again while
// fewer than MaxInFlight rows are leased and unrecorded, counting the
// rows whose results the claim takes along as free (the claim records
// them before it leases its rows), and, when every slot is busy, the units waiting for one hold less than
// a batch: a slow publish holds back only its key.
// Per-key order needs nothing more: a claim never leases a row while an
// older unsent row of its key is unsent outside its own rows, and a key's
// rows stay leased until their results are recorded.
// With Config.Hedge a publish that runs long is sent again beside itself
// (publishRow); the calls that lost run on, and Run waits for them
// (waitCalls).

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/bits"
	mathrand "math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/outboxgen/outboxgen/runtime/dialect"
	"github.com/outboxgen/outboxgen/runtime/driver"
	"github.com/outboxgen/outboxgen/runtime/internal/backoff"
	"github.com/outboxgen/outboxgen/runtime/internal/dberr"
	"github.com/outboxgen/outboxgen/runtime/internal/hedge"
	"github.com/outboxgen/outboxgen/runtime/internal/workers"
)

// recordDelay is how long results wait to be recorded while units still
// publish: they go out with the next claim, or alone after this delay
// (see flushDue).
const recordDelay = 20 * time.Millisecond

// mode says when a pipeline stops claiming.
type mode int

const (
	// modeRun (Run) claims until its context is done; database errors are
	// logged and waited out.
	modeRun mode = iota
	// modeOnce (RunOnce) stops claiming after a claim that came back short
	// while nothing else was in flight, when the circuit breaker opens, or
	// at the first database error.
	modeOnce
	// modeOneClaim (poll, in tests) claims once.
	modeOneClaim
)

// batch is the rows of one claim while they publish: they share a lease
// deadline, PublishTimeout and the circuit breaker's verdict.
type batch struct {
	ctx     context.Context
	stop    context.CancelCauseFunc
	probe   bool
	claimed int
	units   int // units not reported yet
	sent    int
	// transient are failures not marked permanent of a batch with no
	// success yet, held until every unit has reported, or until judgeAt
	// (SlowPublish after the first) when a unit hangs: the breaker may
	// judge them an outage (not charged).
	transient []driver.Failure
	judgeAt   time.Time
	judged    bool
	expire    *time.Timer // the local lease deadline
	trusted   time.Time   // when it passes (see safeBeside)
	timeout   *time.Timer // PublishTimeout
}

// flow is what the units share: the Concurrency slots, and the count of
// rows waiting for their first slot, which wakes the loop (kick) when it
// drops below a batch, so that it claims again.
type flow struct {
	slots  chan struct{}
	queued atomic.Int64
	kick   chan struct{}
	batch  int64
	pool   *workers.Pool // the goroutines units and publishes run on
	typ    hedge.Typical // the typical publish (see slowAfter)
	// calls counts the publisher calls running, hedges and the calls
	// they raced included (see waitCalls).
	calls sync.WaitGroup
}

// callsDone returns a channel closed once no publisher call runs.
func (f *flow) callsDone() <-chan struct{} {
	done := make(chan struct{})
	go func() {
		f.calls.Wait()
		close(done)
	}()
	return done
}

func newFlow(opts Config) *flow {
	return &flow{slots: make(chan struct{}, opts.Concurrency), kick: make(chan struct{}, 1), batch: int64(opts.BatchSize), pool: workers.New()}
}

// slowAfter is how long a publish holds its slot before it counts as
// slow and gives the slot back: eight times the recent typical publish
// (an average of durations each capped at the threshold of its time, so
// a few very slow publishes do not raise it), at least 2ms, at most
// SlowPublish.
func (f *flow) slowAfter() time.Duration { return f.typ.Slow() }

// started notes that a unit of n rows got its first slot (or gave up).
func (f *flow) started(n int) {
	if v := f.queued.Add(-int64(n)); v < f.batch && v+int64(n) >= f.batch {
		select {
		case f.kick <- struct{}{}:
		default:
		}
	}
}

// unitResult is what one unit's publishing did.
type unitResult struct {
	b       *batch
	sent    []int64
	failure *driver.Failure
	release []int64
}

type pipeline struct {
	r    *Relay
	ctx  context.Context
	mode mode
	keep time.Duration // how long a secured lease is trusted locally
	// orphansAt is when a claim last ended orphaned holds
	// (ClaimParams.ReleaseOrphans); zero: not yet.
	orphansAt time.Time

	results chan unitResult
	claimed chan claimOutcome // the claims in flight, as they return
	pubCtx  context.Context   // every batch's context derives from it
	// claimCtx is the claims' context: shutdown does not cut a claim off
	// (one cut off after its commit would leave its rows leased with no
	// one to give them back); ShutdownTimeout does.
	claimCtx   context.Context
	stopClaims context.CancelFunc
	stopPub    context.CancelCauseFunc
	flow       *flow
	abandon    chan struct{} // closed at ShutdownTimeout

	batches map[*batch]bool  // batches with units not reported
	leased  map[int64]*batch // rows leased to us and not recorded yet
	keys    map[int64]string // their keys, when claims pass them over (Relay.passKeys)
	running int              // units not reported
	pend    driver.Results
	pendOf  map[int64]*batch // the batch each pending result's row was leased to
	pendAt  time.Time        // when the oldest pending result arrived

	claiming   int       // claims in flight: no other database call starts
	ending     int       // claims in flight recording failures or releases not safe beside a claim: none starts beside them (see safeBeside)
	stripes    uint64    // the stripes of the keys claims in flight read (bit i: Stripe.Index i)
	stripeNext int       // the stripe takeStripe tries first
	claimRows  int       // rows the claims in flight may lease
	claimSeq   int       // claims started
	backlog    bool      // the last claim came back full: another may run beside one in flight
	hbDue      bool      // a heartbeat came due while claiming: it runs once they returned
	claimNow   bool      // claim at the next chance (startup, full claim, Notify)
	onceOwed   bool      // modeOnce: the last short claims ran beside other work; one with nothing beside it decides (owedNow)
	nextPoll   time.Time // when !claimNow: the poll interval is over
	done       bool      // claim no more (mode's end, shutdown, once-mode error)
	stopping   bool      // ctx is done: shutdown under way
	abandoned  bool

	// Run's database error handling.
	probed, started bool
	dbBackoff       *backoff.Backoff
	dbWait          time.Time
	err             error // the error to end with: once modes' first, Run's fatal one

	uncertain bool // restored results may have been recorded already

	claims    int
	claimed1  int // rows of the first claim (poll)
	published int

	// The claims' read position (driver.ScanPos): while a backlog
	// drains, a claim reads from where the last full one found the oldest
	// pending row (its front) rather than from the start of the due index
	// (see rescanEvery).
	from      driver.ScanPos
	fromGen   int       // bumped when from is reset: fronts of claims started before are stale
	scannedAt time.Time // when the last claim from the start began

	// saturatedAt is when a claim made beside rows of ours in flight last
	// found nothing (see saturated); zero: not since a full claim that
	// recorded nothing.
	saturatedAt time.Time
	// leasedClaims counts the claims that returned leased rows (see
	// claimReturned).
	leasedClaims int
	// aloneUntil: until then no claim starts beside another, since one
	// found nothing beside a claim that leased rows (see claimReturned).
	aloneUntil time.Time
	// rescanning: the first claim since the saturated window ended is
	// under way. It tells whether the rows still wait behind rows in
	// flight; a claim beside it would read past them all too, at the same
	// moment, so none starts until it returns.
	rescanning bool
}

// rescanEvery is how often, at most, claims read from a front instead of
// from the start. A claim from a front does not see rows that became
// pending before it afterwards (see driver.ScanPos): the rows of a
// transaction that ran longer than the claims took to pass its start, and
// rows whose hold ended. Those wait for the next claim from the start, at
// most this long while a backlog drains; a relay that is not draining one
// always claims from the start.
const rescanEvery = time.Second

func (r *Relay) newPipeline(ctx context.Context, m mode) *pipeline {
	pubCtx, stopPub := context.WithCancelCause(context.WithoutCancel(ctx))
	claimCtx, stopClaims := context.WithCancel(context.WithoutCancel(ctx))
	return &pipeline{
		pubCtx: pubCtx, stopPub: stopPub,
		claimCtx: claimCtx, stopClaims: stopClaims,
		r: r, ctx: ctx, mode: m,
		keep:      r.opts.LeaseDuration - leaseMargin(r.opts.LeaseDuration),
		results:   make(chan unitResult, r.opts.MaxInFlight+1),
		claimed:   make(chan claimOutcome, r.opts.ParallelClaims),
		flow:      newFlow(r.opts),
		abandon:   make(chan struct{}),
		batches:   map[*batch]bool{},
		leased:    map[int64]*batch{},
		keys:      map[int64]string{},
		pendOf:    map[int64]*batch{},
		claimNow:  true,
		probed:    m != modeRun, // RunOnce probes before, poll never
		dbBackoff: backoff.New(r.opts.PollInterval, r.opts.DatabaseBackoffMax),
	}
}

// run runs the pipeline until its mode ends (or, in modeRun, ctx is done
// or an error that waiting cannot mend shows at start-up), then waits for
// the units in flight (at most ShutdownTimeout past ctx's end) and records
// their results.
func (p *pipeline) run() error {
	r := p.r
	hb := time.NewTicker(max(r.opts.LeaseDuration/3, time.Millisecond))
	defer hb.Stop()
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	defer timer.Stop()
	var stopShutdown func() bool
	defer func() {
		if stopShutdown != nil {
			stopShutdown()
		}
		for b := range p.batches {
			p.endBatch(b)
		}
		p.stopPub(nil)
		p.stopClaims()
		p.flow.pool.Stop()
	}()
	ctxDone := p.ctx.Done()
	for {
		p.absorb()
		if !p.stopping && p.ctx.Err() != nil {
			p.stopping, p.done, ctxDone = true, true, nil
			stopShutdown = p.shutdown()
		}
		// Every unit reports, promptly once abandon is closed: an
		// abandoned publish reports its unit without its row.
		if p.done && p.running == 0 && p.claiming == 0 {
			err := p.finish()
			p.waitCalls()
			return err
		}
		acted, err := p.act()
		if err != nil {
			p.failed(err)
			continue
		}
		if acted {
			continue
		}
		if d := p.nextWake(time.Now()); d >= 0 {
			timer.Reset(d)
		}
		var abandon <-chan struct{}
		if !p.abandoned {
			abandon = p.abandon
		}
		select {
		case <-ctxDone:
		case res := <-p.results:
			p.take(res)
		case out := <-p.claimed:
			p.claimReturned(out)
			if p.hbDue && p.claiming == 0 {
				p.hbDue = false
				p.heartbeat()
			}
		case <-r.wake:
			p.claimNow = true
		case <-p.flow.kick:
		case <-timer.C:
		case <-hb.C:
			if p.claiming > 0 {
				p.hbDue = true
			} else {
				p.heartbeat()
			}
		case <-abandon:
			p.abandoned = true
		}
		timer.Stop()
	}
}

// absorb takes the results that arrived, without waiting.
func (p *pipeline) absorb() {
	for {
		select {
		case res := <-p.results:
			p.take(res)
		default:
			return
		}
	}
}

// act does what is due: judging batches whose publishes hang, then the
// next database call, if any: a claim (with the pending results), or a
// recording of the results alone. It reports whether it called the
// database.
func (p *pipeline) act() (bool, error) {
	now := time.Now()
	for b := range p.batches {
		if !b.judged && len(b.transient) > 0 && !now.Before(b.judgeAt) {
			p.settle(b, b.transient)
			b.transient, b.judged = nil, true
		}
	}
	r := p.r
	if p.mode != modeRun && r.brk.open && now.Before(r.brk.next) && p.running == 0 {
		p.done = true // RunOnce returns at its next poll; poll does nothing
	}
	if now.Before(p.dbWait) {
		return false, nil
	}
	limit, ok := p.claimGate(now)
	if p.claiming > 0 {
		// Beside claims in flight only another claim starts: while a
		// backlog lasts, and unless a heartbeat waits for them to end.
		if ok && p.claiming < r.opts.ParallelClaims && p.besideOK(now) {
			return true, p.claim(limit)
		}
		return false, nil
	}
	switch {
	case ok && (p.claimNow || p.owedNow() || !now.Before(p.nextPoll) || p.flushDue(now)):
		return true, p.claim(limit)
	case p.flushDue(now):
		return true, p.record()
	}
	return false, nil
}

// besideOK reports whether claims may run beside each other now: while
// a backlog lasts (the last claim came back full), unless a heartbeat
// waits for the claims to end, the rows left wait behind rows in flight
// (saturated), the first claim after that window runs (rescanning), or
// an empty claim beside a leasing one asked for claims one at a time
// (aloneUntil).
func (p *pipeline) besideOK(now time.Time) bool {
	return p.backlog && p.r.opts.ParallelClaims > 1 && !p.hbDue && !p.saturated(now) && !p.rescanning && !now.Before(p.aloneUntil) &&
		p.ending == 0 && !p.unsafePending(now)
}

// endsLeases reports whether rec holds results that end a lease without
// marking its row sent: failures and releases. The database fences them
// by owner name alone, and a row's result may be older than its lease:
// the lease lapsed while the relay ran (extensions failing), and a claim
// of this relay may lease the row again. A claim that returned such a row
// drops its stale results before the next database call starts
// (dropPending), and results that arrive later are not filed
// (stillLeased); a claim running beside the recording is the one case
// left. Its new lease could commit before the recording ran, and the
// stale retry or release would end it while the row was being published:
// the relay would lease and publish it once more beside that publish, or
// charge an attempt (FAILED at MaxAttempts) for a publish under way
// (TestStaleFailureBesideClaimLeavesNewLease). So such results are
// recorded beside a claim only when safeBeside (the call then ends before
// their lease could lapse); the others by a claim or a recording with no
// other claim beside it. A stale mark of a row sent is harmless: the row
// was published.
func endsLeases(rec *driver.Results) bool {
	return rec != nil && len(rec.Failures)+len(rec.Release) > 0
}

// safeBeside reports whether a failure or release of a row leased to b
// may be recorded by a claim running beside another: b's lease is
// certain to hold for half a LeaseDuration more (b.trusted, a margin
// before the lease in the database), so no claim of this relay can lease
// the row again before then, and the call is cut off by then
// (recordBy), its recording committed only if it came back in time
// (driver.ClaimParams.RecordInTime: a call held up on the network must
// not commit late). That is every batch while its heartbeats succeed (they
// leave at least two thirds of a lease); one whose extensions failed, and
// releases of rows no batch took (nil b), are recorded alone. Recording
// them all alone, a backlog with one publish in ten failing (a minute's
// backoff) drained at 0.25-0.95x (pgx) and 0.60-0.91x (MariaDB) the rate
// of the relay before (six interleaved pairs); this way at 0.85-1.01x
// and 0.79-1.20x (three).
func (p *pipeline) safeBeside(b *batch, now time.Time) bool {
	return b != nil && b.trusted.Sub(now) >= p.r.opts.LeaseDuration/2
}

// unsafePending reports whether pending failures or releases include
// one that is not safeBeside: claims then wait for it, alone.
func (p *pipeline) unsafePending(now time.Time) bool {
	for _, f := range p.pend.Failures {
		if !p.safeBeside(p.pendOf[f.Row.ID], now) {
			return true
		}
	}
	for _, id := range p.pend.Release {
		if !p.safeBeside(p.pendOf[id], now) {
			return true
		}
	}
	return false
}

// recordBy returns when a call recording rec's failures and releases
// (of: their batches) must end, the earliest of their batches' trusted
// leases (zero: none to bound), and whether one is not safeBeside: the
// call then runs with no claim beside it, unbounded.
func (p *pipeline) recordBy(rec *driver.Results, of map[int64]*batch, now time.Time) (by time.Time, alone bool) {
	if !endsLeases(rec) || p.r.opts.ParallelClaims == 1 {
		return time.Time{}, false // no claim runs beside another (SQLite: always)
	}
	see := func(id int64) {
		b := of[id]
		if !p.safeBeside(b, now) {
			alone = true
			return
		}
		if by.IsZero() || b.trusted.Before(by) {
			by = b.trusted
		}
	}
	for _, f := range rec.Failures {
		see(f.Row.ID)
	}
	for _, id := range rec.Release {
		see(id)
	}
	if alone {
		return time.Time{}, true
	}
	return by, false
}

// takeStripe returns a stripe of the keys (driver.ClaimParams.Stripe)
// that no claim in flight reads, one of ParallelClaims, and marks it
// taken until the claim returns. The stripes are taken in turn, so that
// claims running one at a time (MaxInFlight or the slots leave room for
// one only) read every stripe alike, not the first one until it drains.
// Claims in flight are at most ParallelClaims, so one is free; were
// none, the zero Stripe (every key) is as correct, only slower.
func (p *pipeline) takeStripe() driver.Stripe {
	n := p.r.opts.ParallelClaims
	for range n {
		i := p.stripeNext
		p.stripeNext = (i + 1) % n
		if p.stripes&(1<<i) == 0 {
			p.stripes |= 1 << i
			return driver.Stripe{Index: i, Of: n}
		}
	}
	return driver.Stripe{}
}

// saturated reports whether the due rows left wait behind rows in
// flight, as far as the claims can tell: a claim made beside rows of ours
// in flight found nothing to lease or hold, less than rescanEvery ago,
// and no full claim that recorded nothing came back since. That is a
// backlog of few keys (each key's rows go out one batch after the
// other), or of keys other instances are publishing. Another claim then
// would read past every due row again for nothing, so while rows of ours
// are in flight a full claim does not start another at once, nor one
// beside it: the next comes with our results, which free keys
// (flushDue), with a Notify, or when the window ends. With none of ours
// in flight the relay claims at once, as before. A relay that finds
// nothing beside rows in flight while a backlog of many keys drains loses
// at most that: claims in step with its recordings for rescanEvery.
func (p *pipeline) saturated(now time.Time) bool {
	return !p.saturatedAt.IsZero() && now.Sub(p.saturatedAt) < rescanEvery
}

// owedNow reports whether the claim RunOnce owes (onceOwed) may run now:
// with no unit publishing (act starts claims only when none is in flight),
// so that it decides.
func (p *pipeline) owedNow() bool { return p.onceOwed && p.running == 0 }

// claimGate returns how many rows a claim may take now, and whether one
// may run at all (pacing aside). It changes nothing.
func (p *pipeline) claimGate(now time.Time) (int, bool) {
	r := p.r
	if p.done || (p.mode == modeOneClaim && p.claims+p.claiming > 0) {
		return 0, false
	}
	if r.brk.open {
		// A probe waits for its time and for the rows in flight.
		if now.Before(r.brk.next) || p.running > 0 || len(p.leased) > 0 || p.claiming > 0 {
			return 0, false
		}
		return r.opts.BatchSize, true
	}
	room := r.opts.MaxInFlight - len(p.leased) - p.claimRows
	if room < r.opts.BatchSize {
		room += p.carried(r.opts.BatchSize - room)
	}
	if room < 1 || (room < r.opts.BatchSize/2 && p.running > 0) {
		return 0, false // wait for room rather than claim crumbs
	}
	limit := claimSize(room, r.opts.BatchSize)
	if p.flow.queued.Load() >= p.flow.batch && len(p.flow.slots) == cap(p.flow.slots) {
		// A batch already waits for slots, all busy (a kick wakes the
		// loop). With a slot free the units only have not started yet.
		return 0, false
	}
	return limit, true
}

// claimSize is the limit of a claim with room for room (≥ 1) rows: batch,
// or the largest of three, two or one quarter of it that fits (so half a
// batch of room still claims half a batch), or below a quarter a power of
// two. The limit is part of the claim's text (on PostgreSQL a prepared
// statement and plan per value and connection), so a relay uses a handful
// of values, not every number up to batch.
func claimSize(room, batch int) int {
	if room >= batch {
		return batch
	}
	for q := 3; q >= 1; q-- {
		if s := batch * q / 4; s >= 1 && room >= s {
			return s
		}
	}
	return 1 << (bits.Len(uint(room)) - 1)
}

// carried counts the rows whose results wait to be recorded and are
// still leased to this relay, up to need (the loop asks on every turn, and
// results can pile up while the database is down). A claim takes those
// results along (takePending) and records them in its own commit (on
// MySQL/MariaDB the commit just before it), which is also when its new
// rows are leased, so they make room for it: claims
// stay full batches instead of the crumbs left beside rows published but
// not yet recorded, and at every commit the relay holds at most
// MaxInFlight rows.
func (p *pipeline) carried(need int) int {
	n := 0
	for id, b := range p.pendOf {
		if n >= need {
			break
		}
		if b != nil && p.leased[id] == b {
			n++
		}
	}
	return n
}

// flushDue reports whether pending results should be recorded now: when
// nothing else is in flight, when the oldest has waited recordDelay, or
// when half a batch has gathered while fewer than a batch of rows are
// free. Act then claims with them when the gate is open (they count as
// its room, see carried) and records them alone when it is not; otherwise
// the next claim takes them along, as a recording alone
// would hold that claim up.
func (p *pipeline) flushDue(now time.Time) bool {
	r := p.r
	n := len(p.pend.Sent) + len(p.pend.Failures) + len(p.pend.Release)
	switch {
	case n == 0:
		return false
	case p.running == 0:
		return true
	case n >= max(r.opts.BatchSize/2, 1) && r.opts.MaxInFlight-len(p.leased) < r.opts.BatchSize:
		return true
	}
	return now.Sub(p.pendAt) >= recordDelay
}

// nextWake returns how long the loop may sleep before act has something
// to do (negative: nothing will be due by itself; unit results, kicks,
// Notify and heartbeats wake it). Only what act would then do counts, so
// the loop never spins on a time that has passed.
func (p *pipeline) nextWake(now time.Time) time.Duration {
	var t time.Time
	set := false
	want := func(at time.Time) {
		if !set || at.Before(t) {
			t, set = at, true
		}
	}
	if p.claiming > 0 {
		// Act starts another claim as soon as one may (the gate opens
		// with a unit's result or a kick, which wake the loop), and
		// nothing else until the claims return, which wakes the loop too.
		for b := range p.batches {
			if !b.judged && len(b.transient) > 0 {
				want(b.judgeAt)
			}
		}
		if !set {
			return -1
		}
		return max(t.Sub(now), 0)
	}
	if !p.pend.Empty() {
		if p.flushDue(now) {
			want(now)
		} else {
			want(p.pendAt.Add(recordDelay))
		}
	}
	r := p.r
	if _, ok := p.claimGate(now); ok {
		if p.claimNow || p.owedNow() {
			want(now)
		} else {
			want(p.nextPoll)
		}
	} else if r.brk.open && !p.done && now.Before(r.brk.next) && p.running == 0 && len(p.leased) == 0 {
		want(r.brk.next) // the probe (once modes end instead)
	}
	for b := range p.batches {
		if !b.judged && len(b.transient) > 0 {
			want(b.judgeAt)
		}
	}
	if !set {
		return -1
	}
	if t.Before(p.dbWait) {
		t = p.dbWait
	}
	return max(t.Sub(now), 0)
}

// takePending returns the pending results to record, leaving none, with
// the batch each result's row was leased to.
func (p *pipeline) takePending() (*driver.Results, map[int64]*batch) {
	if p.pend.Empty() {
		return nil, nil
	}
	rec, of := p.pend, p.pendOf
	rec.MaxAttempts = p.r.opts.MaxAttempts
	p.pend, p.pendOf = driver.Results{}, map[int64]*batch{}
	return &rec, of
}

// restorePending puts back results whose recording failed. The
// call may have committed before it failed (cut off at shutdown or
// ShutdownTimeout, or the commit's reply lost with the connection): the
// next recording then finds some rows already recorded (uncertain), which
// is harmless, and says so rather than warn of leases lost. (A failure
// recorded twice that way is charged twice only if its row was due and
// leased again by the same call, which the relay then never saw: with a
// Backoff of zero.)
func (p *pipeline) restorePending(rec *driver.Results, of map[int64]*batch) int {
	if rec == nil {
		return 0
	}
	p.uncertain = true
	// Only results whose row is still leased to their batch: a claim of
	// this relay that returned since may have leased others again
	// (review helper-106; the same rule as recorded's).
	mine := func(id int64) bool { return p.leased[id] == of[id] } // both nil: rows a claim gave back at once
	keep := func(ids []int64) []int64 {
		return slices.DeleteFunc(slices.Clone(ids), func(id int64) bool { return !mine(id) })
	}
	rec.Sent, rec.Release = keep(rec.Sent), keep(rec.Release)
	rec.Failures = slices.DeleteFunc(slices.Clone(rec.Failures), func(f driver.Failure) bool { return !mine(f.Row.ID) })
	p.pend.Sent = append(rec.Sent, p.pend.Sent...)
	p.pend.Failures = append(rec.Failures, p.pend.Failures...)
	p.pend.Release = append(rec.Release, p.pend.Release...)
	for id, b := range of {
		if mine(id) {
			p.pendOf[id] = b
		}
	}
	p.pendAt = time.Now()
	return len(rec.Failures)
}

// RefusedErrorText is what a failure's last_error becomes when the
// database refused a recording that carried it for a value it binds (see
// replaceRefused). Its publish error is in the relay's log.
const RefusedErrorText = "error text refused by the database; see the log"

// replaceRefused replaces the error texts of failures fs, put back after
// the call that carried them failed with err (and only those: failures
// that arrived meanwhile were not in it), when err says the database refused a value
// it bound: an error text is the only free text a recording binds, and
// sending it again would fail again, failing every claim that carries it
// (a last_error column of a narrower type or character set than the DDL's,
// say). The texts are in the log already ("publish failed"). It reports
// whether it replaced any text.
func (p *pipeline) replaceRefused(fs []driver.Failure, err error) bool {
	if !dberr.Refused(err) {
		return false
	}
	n := 0
	for i := range fs {
		if fs[i].Error != RefusedErrorText {
			fs[i].Error = RefusedErrorText
			n++
		}
	}
	if n > 0 {
		p.r.log.WarnContext(p.ctx, "the database refused a value of a recording: the error texts of its failures are replaced, and the recording is sent again",
			slog.Int("failures", n), slog.String("last_error", RefusedErrorText), slog.Any("error", p.r.explain(err)))
	}
	return n > 0
}

// dropPending forgets the pending results of rows a claim just leased to
// this relay again: they belong to an earlier lease of those rows (given
// back, or lapsed), and recording them now would undo the new one.
func (p *pipeline) dropPending(rows []driver.Row) {
	var stale map[int64]bool
	for _, rw := range rows {
		if _, ok := p.pendOf[rw.ID]; ok {
			if stale == nil {
				stale = map[int64]bool{}
			}
			stale[rw.ID] = true
			delete(p.pendOf, rw.ID)
		}
	}
	if stale == nil {
		return
	}
	p.pend.Sent = slices.DeleteFunc(p.pend.Sent, func(id int64) bool { return stale[id] })
	p.pend.Failures = slices.DeleteFunc(p.pend.Failures, func(f driver.Failure) bool { return stale[f.Row.ID] })
	p.pend.Release = slices.DeleteFunc(p.pend.Release, func(id int64) bool { return stale[id] })
}

// orphanSweepEvery is how often a claim also ends the holds behind rows
// recorded without ending them (ClaimParams.ReleaseOrphans). Such holds
// are rare (a recording by an older runtime, or one racing the claim), and
// a key waits at most this long for one.
const orphanSweepEvery = 5 * time.Second

// skipKeys returns the keys of which a claim recording rec's rows (of)
// leaves several rows leased to us and unrecorded, at most
// dialect.MaxInList of them (ClaimParams.SkipKeys). Until those rows are
// recorded, no other row of their keys can be leased: each is behind one
// of them or, inserted by a transaction that committed after they were
// leased, before them, and then only delayed until they are recorded (as
// when another instance holds the key). A key none of whose rows is left
// is not passed over: the claim may lease its next rows.
//
// A key with one row in flight is not passed either. Several rows of a
// key are leased together when they lie together in the due order (a
// backlog of one key), and then its waiting rows do too, in the way of
// every claim's window. A key with one row in flight has its rows among
// other keys' and costs the window a row or two, while a key passed over
// costs a look-up for every index entry the window reads: with every
// key in flight passed (about 100 to 150 of them), a MariaDB drain of
// 50,000 rows of 1,000 keys ran at 0.95× [0.70–0.99] of the same code
// passing none (three interleaved pairs).
func (p *pipeline) skipKeys(of map[int64]*batch) []string {
	if len(p.keys) == 0 {
		return nil
	}
	n := make(map[string]int, len(p.keys))
	var out []string
	for id, k := range p.keys {
		if b, ok := of[id]; ok && p.leased[id] == b {
			continue
		}
		if n[k]++; n[k] == 2 {
			out = append(out, k)
			if len(out) == dialect.MaxInList {
				break
			}
		}
	}
	return out
}

// claimOutcome is what a claim returned, with what claimReturned needs
// from when it started.
type claimOutcome struct {
	rows      []driver.Row
	res       driver.ClaimResult
	err       error
	rec       *driver.Results
	of        map[int64]*batch // rec's rows' batches
	seq       int              // the claim's number (claimSeq when it started)
	limit     int
	probe     bool
	wasIdle   bool
	claimedAt time.Time
	from      bool // read from p.from, not from the start
	fromGen   int  // p.fromGen when it started
	inFlight  int  // rows of ours in flight beside it: leased, results not carried
	ends      bool // rec ends leases not safeBeside: no claim starts beside it
	rescan    bool // the first claim since the saturated window ended (see rescanning)
	leased    int  // p.leasedClaims when it started
	// stripe is the keys it read (the zero Stripe: all; see takeStripe).
	stripe driver.Stripe
}

// claim records the pending results and claims up to limit rows in one
// call, on a goroutine of its own: claimReturned takes what it returned
// and starts publishing it.
func (p *pipeline) claim(limit int) error {
	r := p.r
	if !p.probed {
		if err := r.probeTable(p.ctx); err != nil {
			return err
		}
		p.probed = true
	}
	p.claimSeq++
	out := claimOutcome{
		seq:       p.claimSeq,
		limit:     limit,
		probe:     r.brk.open,
		wasIdle:   p.running == 0 && p.claiming == 0,
		claimedAt: time.Now(), // the lease starts no earlier than this
		leased:    p.leasedClaims,
	}
	out.rec, out.of = p.takePending()
	out.inFlight = len(p.leased) - len(out.of)
	by, alone := p.recordBy(out.rec, out.of, out.claimedAt)
	if out.ends = alone; out.ends {
		p.ending++
	}
	if !p.saturatedAt.IsZero() && !p.saturated(out.claimedAt) && !p.rescanning {
		out.rescan, p.rescanning = true, true
	}
	// A Notify arriving while the claim runs sets claimNow again: it may
	// announce rows the claim did not see.
	p.claiming++
	p.claimRows += limit
	p.claimNow = false
	p.onceOwed = false
	params := driver.ClaimParams{
		Owner:        r.opts.InstanceID,
		Lease:        r.opts.LeaseDuration,
		Limit:        limit,
		Unordered:    r.unorderedList,
		OverdueAfter: r.opts.OverdueAfter,
		Hold:         r.opts.HoldRecheck,
		Record:       out.rec,
		RecordInTime: !by.IsZero(),
	}
	if r.passKeys {
		params.SkipKeys = p.skipKeys(out.of)
	}
	if out.claimedAt.Sub(p.orphansAt) >= orphanSweepEvery {
		params.ReleaseOrphans = true
		p.orphansAt = out.claimedAt
	}
	// From the last front while a backlog drains; from the start every
	// rescanEvery, and when ending orphaned holds (their rows go back
	// to their creation time, before any front).
	out.fromGen = p.fromGen
	params.Front = p.backlog // its front is of use if it comes back full too
	if !p.from.IsZero() && !params.ReleaseOrphans && out.claimedAt.Sub(p.scannedAt) < rescanEvery {
		params.From, out.from = p.from, true
		if p.besideOK(out.claimedAt) {
			// Claims run beside each other: each reads its own stripe
			// of the keys, not the rows the others are leasing (only
			// claims From a front do; see driver.ClaimParams.Stripe).
			out.stripe = p.takeStripe()
			params.Stripe = out.stripe
		}
	} else {
		p.scannedAt = out.claimedAt
	}
	go func() {
		ctx := p.claimCtx
		if !by.IsZero() {
			var cancel context.CancelFunc
			ctx, cancel = context.WithDeadline(ctx, by)
			defer cancel()
		}
		params.Result = &out.res
		out.rows, out.err = r.drv.Claim(ctx, params)
		if out.err != nil && !by.IsZero() && p.claimCtx.Err() == nil && errors.Is(ctx.Err(), context.DeadlineExceeded) {
			out.err = fmt.Errorf("%w (%w)", errRecordCutOff, out.err)
		}
		p.claimed <- out
	}()
	return nil
}

// claimReturned files a claim's outcome (see claim).
func (p *pipeline) claimReturned(out claimOutcome) {
	r := p.r
	p.claiming--
	p.claimRows -= out.limit
	if out.ends {
		p.ending--
	}
	if out.stripe.Of > 0 {
		p.stripes &^= 1 << out.stripe.Index
	}
	if out.rescan {
		p.rescanning = false
	}
	if out.err != nil {
		p.backlog = false
		p.resetFrom() // what its recording did is unknown
		if out.res.RecordedApart {
			p.recorded(out.rec, out.of, out.res.Recorded) // committed before the claim failed
		} else {
			n := p.restorePending(out.rec, out.of)
			p.replaceRefused(p.pend.Failures[:n], out.err)
		}
		p.failed(out.err)
		return
	}
	p.succeeded()
	p.recorded(out.rec, out.of, out.res.Recorded)
	p.claims++
	if p.claims == 1 {
		p.claimed1 = len(out.rows)
	}
	if p.mode == modeOneClaim {
		p.done = true
	}
	found := len(out.rows) + out.res.Moved
	if len(out.rows) > 0 {
		p.leasedClaims++
	}
	p.backlog = found >= out.limit
	now := time.Now()
	switch {
	case found == 0 && out.inFlight > 0 && p.claiming == 0 && out.leased == p.leasedClaims && out.stripe.Of == 0:
		p.saturatedAt = now
	case found == 0 && out.inFlight > 0:
		// Beside a claim of ours that leased rows (it returned while this
		// one ran, or still runs), finding nothing says little: the rows
		// it needed may be the ones that claim locked and leased (SKIP
		// LOCKED), and the rows behind them looked free to it, so it left
		// them alone. Taken as saturation, that stopped the other keys'
		// claims for a rescanEvery whenever a key with a long backlog
		// leased its next rows (TestEmptyClaimBesideLeasingClaim). Claims
		// run one at a time for that long instead, at once after a full
		// one: the next that finds nothing tells. The same for a claim
		// of one stripe of the keys: the others may have rows to lease.
		p.aloneUntil = now.Add(rescanEvery)
	case p.backlog && out.rec == nil, out.rescan && found > 0:
		// A full claim that recorded nothing, or the first one after a
		// window that found rows: claims find rows again.
		p.saturatedAt = time.Time{}
	}
	// The rows left wait behind rows in flight, some of them ours: the
	// next claim comes with our results (or at the end of the window).
	wait := p.saturated(now) && (len(p.leased) > 0 || len(out.rows) > 0)
	if p.backlog {
		if wait {
			p.nextPoll = p.saturatedAt.Add(rescanEvery)
		} else {
			p.claimNow = true // a full window: more is probably waiting
		}
		if out.fromGen == p.fromGen && !out.res.Front.IsZero() {
			p.from = out.res.Front
		}
	} else {
		// The backlog has drained (as far as the claim read): the next
		// claim reads from the start, and rows a claim from a front
		// passed over are claimed now, not a PollInterval later (unless
		// the rows left wait behind rows of ours in flight: see
		// saturated).
		p.resetFrom()
		if out.from && !wait {
			p.claimNow = true
		}
		if !p.claimNow {
			p.nextPoll = now.Add(r.opts.PollInterval)
		}
		// RunOnce ends with a short claim made with nothing else in
		// flight, and none started beside it (whose rows it may have
		// passed over as locked). A short claim that cannot tell asks for
		// one that can, made once nothing else is in flight, not a
		// PollInterval later (the sweeper's is a minute).
		if p.mode == modeOnce {
			if out.wasIdle && out.seq == p.claimSeq && !out.from {
				p.done = true
			} else {
				p.onceOwed = true
			}
		}
	}
	p.dropPending(out.rows)
	switch {
	case len(out.rows) > 0 && (p.stopping || (r.brk.open && !out.probe)):
		// Shutting down, or the breaker opened while the claim ran: give
		// them back (uncharged) rather than start publishing.
		for _, rw := range out.rows {
			p.addRelease(nil, rw.ID)
		}
	case len(out.rows) > 0:
		p.startBatch(out.rows, out.claimedAt, out.probe)
	}
	r.observeClaim(out.claimedAt, len(out.rows), len(p.leased))
}

// resetFrom makes the next claim read from the start, and the fronts of
// the claims under way stale.
func (p *pipeline) resetFrom() {
	p.from = driver.ScanPos{}
	p.fromGen++
}

// record records the pending results alone.
func (p *pipeline) record() error {
	rec, of := p.takePending()
	ctx := p.ctx
	if ctx.Err() != nil {
		// Shutting down: results are recorded all the same, bounded by the
		// lease (past it the fence would reject the writes anyway).
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(context.WithoutCancel(ctx), p.r.opts.LeaseDuration)
		defer cancel()
	}
	got, err := p.r.drv.Record(ctx, p.r.opts.InstanceID, *rec)
	if err != nil {
		p.resetFrom() // what it did is unknown
		n := p.restorePending(rec, of)
		p.replaceRefused(p.pend.Failures[:n], err)
		return err
	}
	p.succeeded()
	p.recorded(rec, of, got)
	return nil
}

// recorded forgets the rows of rec (recorded, or taken over by another
// instance when the counts fall short) and reports what happened.
func (p *pipeline) recorded(rec *driver.Results, of map[int64]*batch, got driver.Recorded) {
	if got.Unheld > 0 {
		p.resetFrom() // held rows went back to their creation time
	}
	if rec == nil {
		return
	}
	r := p.r
	// A row another claim has leased to this relay again since (after
	// this call released it, or its lease lapsed) stays: it is that
	// claim's now.
	forget := func(id int64) {
		if p.leased[id] == of[id] {
			delete(p.leased, id)
			delete(p.keys, id)
		}
	}
	for _, id := range rec.Sent {
		forget(id)
	}
	for _, f := range rec.Failures {
		forget(f.Row.ID)
	}
	for _, id := range rec.Release {
		forget(id)
	}
	switch {
	case p.uncertain && (got.Sent < int64(len(rec.Sent)) || got.Retried < int64(len(rec.Failures))):
		r.log.InfoContext(p.ctx, "some results were recorded already, by an earlier call that failed or was cut off after it committed",
			slog.Int("published", len(rec.Sent)), slog.Int64("marked", got.Sent))
	case got.Sent < int64(len(rec.Sent)):
		r.log.WarnContext(p.ctx, "lease lost before marking rows sent: they will be published again (at-least-once)",
			slog.Int("published", len(rec.Sent)), slog.Int64("marked", got.Sent))
	case got.Retried < int64(len(rec.Failures)):
		r.log.WarnContext(p.ctx, "lease lost before recording failures", slog.Int("failures", len(rec.Failures)), slog.Int64("recorded", got.Retried))
	}
	p.uncertain = false
	r.observeRecorded(rec, got, len(p.leased))
	r.reportFailed(p.ctx, rec.Failures, got.Failed)
	r.log.DebugContext(p.ctx, "results recorded", slog.Int("sent", len(rec.Sent)),
		slog.Int("failed", len(rec.Failures)), slog.Int("released", len(rec.Release)))
}

// succeeded notes a database call that worked (Run's error handling).
func (p *pipeline) succeeded() {
	p.started = true
	if f := p.dbBackoff.Failures(); f > 0 {
		p.dbBackoff.Reset()
		p.r.log.InfoContext(p.ctx, "relay poll succeeded again", slog.Int("failed_polls", f))
	}
}

// failed handles a database error of act: database calls pause
// (PollInterval doubling to DatabaseBackoffMax, jittered) in every mode.
// Once modes end with their first error; Run ends only with an error that
// waiting cannot mend before its first success, and otherwise logs it.
func (p *pipeline) failed(err error) {
	r := p.r
	wait := p.dbBackoff.Next()
	p.dbWait = time.Now().Add(wait)
	if p.ctx.Err() != nil {
		return // shutting down: not the database's fault; finish records what is left
	}
	err = r.explain(err)
	if p.mode != modeRun {
		if p.err == nil {
			p.err = err
		}
		p.done = true
		return
	}
	if !p.started && dberr.FatalAtStart(err) {
		r.log.ErrorContext(p.ctx, "relay not started: the outbox table is not usable", slog.Any("error", err))
		p.err, p.done = err, true
		return
	}
	r.log.ErrorContext(p.ctx, "relay poll failed", slog.Any("error", err),
		slog.Int("consecutive_failures", p.dbBackoff.Failures()), slog.Duration("retry_in", wait))
}

// startBatch groups claimed rows into units and starts publishing them.
// A probe (the breaker is open) publishes one row of a unit picked at
// random (a probe always trying the oldest row would never get past a
// poison row) and gives the rest back.
func (p *pipeline) startBatch(rows []driver.Row, claimedAt time.Time, probe bool) {
	r := p.r
	ctx, stop := context.WithCancelCause(p.pubCtx)
	ctx = withBatchSize(ctx, len(rows)) // for the send spans
	b := &batch{ctx: ctx, stop: stop, probe: probe, claimed: len(rows)}
	// Ids another batch of this relay held are this batch's from now on
	// (see take).
	b.trusted = claimedAt.Add(p.keep)
	b.expire = time.AfterFunc(time.Until(b.trusted), func() { stop(errLeaseDeadline) })
	b.timeout = time.AfterFunc(r.opts.PublishTimeout, func() { stop(errPublishTimeout) })
	for _, rw := range rows {
		p.leased[rw.ID] = b
		if r.passKeys {
			p.keys[rw.ID] = rw.Key
		}
	}
	p.batches[b] = true
	units := r.groups(rows)
	if probe {
		pick := mathrand.IntN(len(units))
		for i, u := range units {
			rest := u
			if i == pick {
				rest = u[1:]
			}
			for _, rw := range rest {
				p.addRelease(b, rw.ID)
			}
		}
		units = [][]driver.Row{units[pick][:1]}
	}
	b.units = len(units)
	for _, u := range units {
		p.running++
		p.flow.queued.Add(int64(len(u)))
		p.flow.pool.Go(func() {
			res := unitResult{b: b}
			r.publishUnit(b.ctx, p.abandon, p.flow, u, &res)
			p.results <- res
		})
	}
}

// addRelease files ids of batch b (nil: rows never handed to a batch)
// to be given back.
func (p *pipeline) addRelease(b *batch, ids ...int64) {
	if len(ids) == 0 {
		return
	}
	p.pending()
	p.pend.Release = append(p.pend.Release, ids...)
	for _, id := range ids {
		p.pendOf[id] = b
	}
}

// addFailures files failed publishes of batch b.
func (p *pipeline) addFailures(b *batch, fs ...driver.Failure) {
	p.pending()
	p.pend.Failures = append(p.pend.Failures, fs...)
	for _, f := range fs {
		p.pendOf[f.Row.ID] = b
	}
}

// take files one unit's result. Rows no longer leased to the unit's batch
// are left out: after that batch's lease lapsed, a later claim of this
// relay may have taken them, and their results are that claim's to record.
func (p *pipeline) take(res unitResult) {
	p.running--
	b := res.b
	b.units--
	if sent := p.stillLeased(b, res.sent); len(sent) > 0 {
		p.pending()
		p.pend.Sent = append(p.pend.Sent, sent...)
		for _, id := range sent {
			p.pendOf[id] = b
		}
		b.sent += len(sent)
		p.published += len(sent)
		if len(b.transient) > 0 && !b.judged {
			p.settle(b, b.transient) // not an outage after all
			b.transient, b.judged = nil, true
		}
	}
	if f := res.failure; f != nil && p.leased[f.Row.ID] == b {
		switch {
		case f.Permanent:
			p.addFailures(b, *f)
		case b.sent > 0 || b.judged:
			p.settle(b, []driver.Failure{*f})
		default:
			if len(b.transient) == 0 {
				b.judgeAt = time.Now().Add(SlowPublish)
			}
			b.transient = append(b.transient, *f)
		}
	}
	p.addRelease(b, p.stillLeased(b, res.release)...)
	if b.units > 0 {
		return
	}
	if !b.judged {
		p.settle(b, b.transient)
		b.transient, b.judged = nil, true
	}
	if cause := context.Cause(b.ctx); cause != nil && !errors.Is(cause, context.Canceled) {
		p.r.log.WarnContext(p.ctx, "batch stopped early: the rows not published are released", slog.Any("reason", cause),
			slog.Int("claimed", b.claimed), slog.Int("published", b.sent))
	}
	p.endBatch(b)
}

// settle has the circuit breaker judge failures of b (see judge) and
// files them as charged failures or uncharged releases. The breaker
// judges them all, but only those whose row is still leased to b are
// filed: a failure held for the verdict (b.transient) may be older than
// b's lease, which lapsed meanwhile, and a later claim of this relay may
// have leased its row again. Its result is that claim's to record: the
// owner fence cannot tell the two apart, so a stale retry or release
// would end the new lease while the row is being published, and the
// relay would lease and publish it a third time beside that publish.
func (p *pipeline) settle(b *batch, fs []driver.Failure) {
	if len(fs) == 0 && b.sent == 0 {
		return
	}
	charge, release := p.r.judge(b.sent > 0, fs, b.probe)
	charge = slices.DeleteFunc(slices.Clone(charge), func(f driver.Failure) bool { return p.leased[f.Row.ID] != b })
	if len(charge) > 0 {
		p.addFailures(b, charge...)
	}
	p.addRelease(b, p.stillLeased(b, release)...)
}

// stillLeased returns ids less those no longer leased to b (their lease
// lapsed and a later claim of this relay took them), reusing ids.
func (p *pipeline) stillLeased(b *batch, ids []int64) []int64 {
	return slices.DeleteFunc(ids, func(id int64) bool { return p.leased[id] != b })
}

// pending notes that a result is about to be added.
func (p *pipeline) pending() {
	if p.pend.Empty() {
		p.pendAt = time.Now()
	}
}

// endBatch stops a batch's timers and forgets it.
func (p *pipeline) endBatch(b *batch) {
	b.expire.Stop()
	b.timeout.Stop()
	b.stop(nil)
	delete(p.batches, b)
}

// heartbeat extends the lease of every row leased and not yet recorded,
// in one statement. When that succeeds, each batch's local lease deadline
// moves to a margin before the new lease (measured from before the
// statement, so it never runs past the lease in the database, up to clock
// drift which the margin covers). When it extends fewer rows than asked,
// another instance took some over: each batch is extended on its own, and
// the batches that lost rows stop publishing (errLeaseLost). When it
// fails, the deadlines stay, and a batch whose deadline passes stops
// (errLeaseDeadline).
func (p *pipeline) heartbeat() {
	if len(p.leased) == 0 {
		return
	}
	r := p.r
	ids := make([]int64, 0, len(p.leased))
	for id := range p.leased {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	every := max(r.opts.LeaseDuration/3, time.Millisecond)
	ctx, cancel := context.WithTimeout(context.WithoutCancel(p.ctx), every)
	defer cancel()
	at := time.Now()
	n, err := r.drv.ExtendLease(ctx, r.opts.InstanceID, ids, r.opts.LeaseDuration)
	switch {
	case err != nil:
		r.log.WarnContext(p.ctx, "extending the lease of the rows in flight failed: their batches stop before the lease lapses unless a retry succeeds",
			slog.Int("rows", len(ids)), slog.Any("error", err))
	case n == int64(len(ids)):
		until := at.Add(p.keep)
		for _, b := range p.leased {
			b.trusted = until // also of batches over, their results pending
		}
		for b := range p.batches {
			b.trusted = until
			b.expire.Reset(time.Until(until))
		}
	default:
		groups := map[*batch][]int64{}
		for _, id := range ids {
			groups[p.leased[id]] = append(groups[p.leased[id]], id)
		}
		for b, part := range groups {
			at := time.Now()
			n, err := r.drv.ExtendLease(ctx, r.opts.InstanceID, part, r.opts.LeaseDuration)
			switch {
			case err != nil || !p.batches[b]:
			case n < int64(len(part)):
				if context.Cause(b.ctx) == nil {
					r.log.WarnContext(p.ctx, "lease lost while publishing: another instance took over rows of a batch; it stops",
						slog.Int("rows", len(part)), slog.Int64("still_leased", n))
				}
				b.stop(errLeaseLost)
			default:
				b.trusted = at.Add(p.keep)
				b.expire.Reset(time.Until(b.trusted))
			}
		}
	}
}

// shutdown starts the shutdown sequence: publishes are interrupted
// (through the message context) a grace period before ShutdownTimeout,
// and those still running at ShutdownTimeout are abandoned. It returns a
// function that cancels the sequence.
func (p *pipeline) shutdown() func() bool {
	grace := shutdownGrace(p.r.opts.ShutdownTimeout)
	// The timers run on their own goroutines while the loop owns
	// p.batches: the batches stop through the context they derive from.
	t1 := time.AfterFunc(p.r.opts.ShutdownTimeout-grace, func() { p.stopPub(errShutdown) })
	t2 := time.AfterFunc(p.r.opts.ShutdownTimeout, func() {
		close(p.abandon)
		p.stopClaims()
	})
	return func() bool { return t1.Stop() && t2.Stop() }
}

// waitCalls waits, with Config.Hedge, for the publisher calls still
// running once every unit reported: the calls hedges beat, whose rows
// are recorded already, so that Run does not return while the publisher
// is in use. Once ctx is done it waits at most until ShutdownTimeout.
// (Without Hedge the only such calls are publishes abandoned at
// ShutdownTimeout, each logged already.)
func (p *pipeline) waitCalls() {
	if !p.r.opts.Hedge {
		return
	}
	done := p.flow.callsDone()
	select {
	case <-done:
		return
	case <-p.ctx.Done():
	}
	limit := p.abandon // closed at ShutdownTimeout once shutdown started
	if !p.stopping {
		c := make(chan struct{})
		t := time.AfterFunc(p.r.opts.ShutdownTimeout, func() { close(c) })
		defer t.Stop()
		limit = c
	}
	select {
	case <-done:
	case <-limit:
		select {
		case <-done:
		default:
			p.r.log.WarnContext(p.ctx, "publisher calls still running at the shutdown timeout (calls hedges beat, or publishes abandoned): left running")
		}
	}
}

// finish records what is left (even during shutdown, bounded by the
// lease: past it the fence would reject the writes anyway) and returns
// the pipeline's error.
func (p *pipeline) finish() error {
	rec, of := p.takePending()
	if rec == nil {
		return p.err
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(p.ctx), p.r.opts.LeaseDuration)
	defer cancel()
	got, err := p.r.drv.Record(ctx, p.r.opts.InstanceID, *rec)
	if err != nil && p.replaceRefused(rec.Failures, err) {
		got, err = p.r.drv.Record(ctx, p.r.opts.InstanceID, *rec)
	}
	if err != nil {
		err = p.r.explain(err)
		if p.mode == modeRun {
			// Run returns nil on cancellation: the rows are safe.
			p.r.log.ErrorContext(ctx, "recording the last results failed: their rows are published again once their lease lapses (at-least-once)",
				slog.Int("sent", len(rec.Sent)), slog.Any("error", err))
			return p.err
		}
		return errors.Join(p.err, err)
	}
	p.recorded(rec, of, got)
	return p.err
}
