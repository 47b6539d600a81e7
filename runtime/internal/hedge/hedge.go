// Package hedge holds what the polling relay (package relay) and the
// streaming relay (package walrelay) share to hedge publishes (their
// Config.Hedge): the throttle that bounds the extra calls, and the
// typical publish duration the default hedge delay is taken from.
package hedge

import (
	"fmt"
	"sync/atomic"
	"time"
)

const (
	// Burst and Every throttle the hedges: at most Burst in a row, then
	// one per Every publishes that returned without one, so that a
	// broker slow as a whole gets at most a tenth more calls.
	Burst = 10
	Every = 10
	// Max is how many times one publish is sent again.
	Max = 2
	// Warmup is how many publishes the default delay waits for before it
	// follows the typical publish: until then it is MaxSlow, the most it
	// can be, since the typical publish is not known.
	Warmup = 16
	// MinSlow and MaxSlow bound Typical.Slow.
	MinSlow = 2 * time.Millisecond
	MaxSlow = 250 * time.Millisecond
)

// Throttle is the hedges' token bucket, in 1/Every of a hedge: a hedge
// takes Every, and every publish that returned without one puts one
// back, up to Burst hedges. Its zero value is empty: use NewThrottle.
type Throttle struct{ tokens atomic.Int64 }

const (
	// Cost is what one hedge takes from a Throttle.
	Cost = Every
	// Cap is the most a Throttle holds (Burst hedges).
	Cap = Burst * Cost
)

// NewThrottle returns a full throttle.
func NewThrottle() *Throttle {
	t := &Throttle{}
	t.tokens.Store(Cap)
	return t
}

// Take takes a hedge, if one is left.
func (t *Throttle) Take() bool {
	for {
		old := t.tokens.Load()
		if old < Cost {
			return false
		}
		if t.tokens.CompareAndSwap(old, old-Cost) {
			return true
		}
	}
}

// Refill puts back the share of a publish that returned without a hedge.
func (t *Throttle) Refill() {
	for {
		old := t.tokens.Load()
		if old >= Cap || t.tokens.CompareAndSwap(old, old+1) {
			return
		}
	}
}

// Tokens is what the throttle holds, in 1/Every of a hedge.
func (t *Throttle) Tokens() int64 { return t.tokens.Load() }

// SetTokens sets what the throttle holds (tests).
func (t *Throttle) SetTokens(n int64) { t.tokens.Store(n) }

// Typical is the recent typical publish duration: an average of
// durations each capped at the slow threshold of its time, so a few very
// slow publishes do not raise it. Its zero value is ready to use.
type Typical struct {
	avg  atomic.Int64 // ns
	seen atomic.Int64 // publishes observed
}

// Slow is when a publish counts as slow: eight times the typical one, at
// least MinSlow, at most MaxSlow.
func (t *Typical) Slow() time.Duration {
	return min(max(8*time.Duration(t.avg.Load()), MinSlow), MaxSlow)
}

// Observe feeds a publish's duration into the average.
func (t *Typical) Observe(d time.Duration) {
	t.seen.Add(1)
	d = min(d, t.Slow())
	for {
		old := t.avg.Load()
		next := old + (int64(d)-old)/16
		if t.avg.CompareAndSwap(old, next) {
			return
		}
	}
}

// Seen is how many publishes were observed.
func (t *Typical) Seen() int64 { return t.seen.Load() }

// Set sets the average and the count (tests).
func (t *Typical) Set(avg time.Duration, seen int64) {
	t.avg.Store(int64(avg))
	t.seen.Store(seen)
}

// After is the hedge delay: after when set, else Slow once Warmup
// publishes were seen, and MaxSlow before. (Without a hedge until then,
// a relay's first calls, often its largest batches, once a backlog
// waits, stalled for their whole length: in BenchmarkWAL/slow, one
// unhedged 64-event call of the first 16 held 361 events over 100 ms.)
func (t *Typical) After(after time.Duration) time.Duration {
	if after > 0 {
		return after
	}
	if t.Seen() < Warmup {
		return MaxSlow
	}
	return t.Slow()
}

// Race is the state of one hedged publish: the calls running, the hedges
// made, and the first failure. Start it with NewRace when the first call
// starts.
type Race struct {
	running, hedged int
	failed          error
}

// NewRace returns the state of a publish whose first call started.
func NewRace() Race { return Race{running: 1} }

// Returned notes a call's result. done reports whether the publish is
// decided: a success, or a failure with no call left running (err is
// then the first failure). It is not decided by a failure while other
// calls run, one of which may yet succeed; no hedge should start then
// (another call would be a retry without backoff).
func (r *Race) Returned(err error) (done bool, result error) {
	r.running--
	if err != nil && r.failed == nil {
		r.failed = err
	}
	switch {
	case err == nil:
		return true, nil
	case r.running > 0:
		return false, nil
	}
	return true, r.failed
}

// Hedge notes a hedge started beside the calls running; more reports
// whether another may follow it (Max).
func (r *Race) Hedge() (n int, more bool) {
	r.hedged++
	r.running++
	return r.hedged, r.hedged < Max
}

// Running is the number of calls still running.
func (r *Race) Running() int { return r.running }

// Failed is the first failure so far.
func (r *Race) Failed() error { return r.failed }

// Done accounts a decided publish of duration d: it feeds t, and refills
// th when the publish was not hedged (th nil: hedging is off).
func (r *Race) Done(t *Typical, th *Throttle, d time.Duration) {
	t.Observe(d)
	if th != nil && r.hedged == 0 {
		th.Refill()
	}
}

// CheckConfig checks a relay's Hedge and HedgeAfter against its
// PublishTimeout; pkg prefixes the error ("relay", "walrelay").
func CheckConfig(pkg string, on bool, after, publishTimeout time.Duration) error {
	switch {
	case after < 0:
		return fmt.Errorf("%s: Config.HedgeAfter is %s: use a positive duration (or 0 for eight times the typical publish)", pkg, after)
	case after > 0 && !on:
		return fmt.Errorf("%s: Config.HedgeAfter is %s but Config.Hedge is false: set Hedge to hedge publishes, or leave HedgeAfter 0", pkg, after)
	case after > 0 && publishTimeout > 0 && after >= publishTimeout:
		return fmt.Errorf("%s: Config.HedgeAfter (%s) must be shorter than Config.PublishTimeout (%s): no hedge could start before the publish times out", pkg, after, publishTimeout)
	}
	return nil
}
