// Package backoff is the pause schedule the relay, sweeper, monitor and
// janitor share after consecutive database errors: exponential from the
// component's interval (at least Floor), doubling up to a cap, with equal
// jitter, and reset by the first success. One schedule for all four, so
// that none of them hammers a database that is down or misconfigured.
package backoff

import (
	mathrand "math/rand/v2"
	"time"
)

const (
	// Floor is the shortest pause after a failure, whatever the interval:
	// a relay polling every 10 ms retries a failing database 10 times a
	// second at most, then less and less.
	Floor = 100 * time.Millisecond
	// DefaultMax is the default cap of the pause (the Config fields
	// DatabaseBackoffMax of the relay, sweeper, monitor and janitor).
	DefaultMax = 30 * time.Second
)

// Backoff counts consecutive failures and returns the pause after each.
// The zero value is not usable: use New. It is not safe for concurrent use
// (each loop owns one).
type Backoff struct {
	min, max time.Duration
	failures int
	rand     func() float64 // in [0, 1); replaced in tests
}

// New returns a Backoff whose pauses start at interval (at least Floor)
// and double per consecutive failure up to max (at least the first pause).
func New(interval, max time.Duration) *Backoff {
	b := &Backoff{min: interval, max: max, rand: mathrand.Float64}
	if b.min < Floor {
		b.min = Floor
	}
	if b.max < b.min {
		b.max = b.min
	}
	return b
}

// Next records a failure and returns the pause before the next try: for
// the n-th consecutive failure, d = min·2^(n-1) capped at max, jittered
// uniformly within [d/2, d] ("equal jitter", so that instances failing
// together spread out) but never below min. Successive pauses therefore
// never shrink below the interval and never exceed max.
func (b *Backoff) Next() time.Duration {
	b.failures++
	d := b.min
	for i := 1; i < b.failures && d < b.max; i++ {
		d *= 2
	}
	d = min(d, b.max)
	d = d/2 + time.Duration(b.rand()*float64(d/2))
	return max(d, b.min)
}

// Reset forgets the failures: call it after a success.
func (b *Backoff) Reset() { b.failures = 0 }

// Failures returns the number of consecutive failures recorded.
func (b *Backoff) Failures() int { return b.failures }

// Min returns the first (and shortest) pause.
func (b *Backoff) Min() time.Duration { return b.min }

// Max returns the cap of the pauses.
func (b *Backoff) Max() time.Duration { return b.max }
