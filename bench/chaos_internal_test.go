package bench

import (
	"testing"
	"time"
)

// chain counts, per key, the rest of a slow publish under way at t and
// every later one, and returns the longest key's sum.
func TestSlowKeysChain(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	at := func(s float64) time.Time { return t0.Add(time.Duration(s * float64(time.Second))) }
	s := &slowKeys{all: []slowPublish{
		{"a", at(0), at(3)},   // ended before t: not counted
		{"b", at(8), at(11)},  // 1 s left at t
		{"b", at(11), at(14)}, // started after t: 3 s
		{"c", at(9.5), at(12.5)},
		{"d", at(12), at(15)},
	}}
	if got, want := s.chain(at(10)), 4*time.Second; got != want {
		t.Errorf("chain = %v, want %v (key b: 1 s left + 3 s)", got, want)
	}
	// A publish of b again while its first is under way (a row whose
	// lease lapsed) overlaps it: counted once.
	s.all = append(s.all, slowPublish{"b", at(12), at(15)})
	if got, want := s.chain(at(10)), 5*time.Second; got != want {
		t.Errorf("chain with overlapping publishes = %v, want %v (key b: 10 s to 15 s)", got, want)
	}
	if got := s.chain(at(20)); got != 0 {
		t.Errorf("chain after every slow publish = %v, want 0", got)
	}
}
