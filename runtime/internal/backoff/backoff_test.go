package backoff

import (
	"testing"
	"time"
)

// The pauses start at the interval (at least Floor), double up to the cap,
// stay within the upper half of their step (equal jitter) but never below
// the first, and start over after Reset.
func TestBackoff(t *testing.T) {
	for _, tc := range []struct {
		name          string
		interval, max time.Duration
		nominal       []time.Duration // before jitter
	}{
		{"floor", 10 * time.Millisecond, 30 * time.Second, []time.Duration{100, 200, 400, 800, 1600, 3200, 6400, 12800, 25600, 30000, 30000}},
		{"interval", time.Second, 5 * time.Second, []time.Duration{1000, 2000, 4000, 5000, 5000}},
		{"cap below interval", time.Minute, 30 * time.Second, []time.Duration{60000, 60000, 60000}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for _, r := range []float64{0, 0.5, 0.999999} {
				b := New(tc.interval, tc.max)
				b.rand = func() float64 { return r }
				for round := range 2 {
					for i, n := range tc.nominal {
						n *= time.Millisecond
						got := b.Next()
						lo := max(n/2, b.Min())
						if got < lo || got > n {
							t.Fatalf("rand %v, round %d, failure %d: pause %s outside [%s, %s]", r, round, i+1, got, lo, n)
						}
						if b.Failures() != i+1 {
							t.Fatalf("Failures() = %d after %d failures", b.Failures(), i+1)
						}
					}
					b.Reset()
				}
			}
		})
	}
	// Real jitter spreads the pauses.
	b := New(time.Second, time.Minute)
	seen := map[time.Duration]bool{}
	for range 20 {
		b.Reset()
		b.Next()
		seen[b.Next()] = true
	}
	if len(seen) < 2 {
		t.Errorf("20 second pauses all equal (%v): no jitter", seen)
	}
}
