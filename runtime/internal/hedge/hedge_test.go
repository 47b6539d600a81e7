package hedge

import (
	"errors"
	"testing"
	"time"
)

// The throttle allows Burst hedges in a row, then one per Every publishes
// that returned without one.
func TestThrottle(t *testing.T) {
	f := NewThrottle()
	for i := range Burst {
		if !f.Take() {
			t.Fatalf("hedge %d of the burst refused", i+1)
		}
	}
	if f.Take() {
		t.Fatal("hedge past the burst allowed")
	}
	for i := range Every - 1 {
		f.Refill()
		if f.Take() {
			t.Fatalf("hedge allowed after %d publishes, want %d", i+1, Every)
		}
	}
	f.Refill()
	if !f.Take() {
		t.Fatalf("hedge refused after %d publishes", Every)
	}
	for range 10 * Cap {
		f.Refill()
	}
	if got := f.Tokens(); got != Cap {
		t.Fatalf("throttle holds %d, want its cap %d", got, Cap)
	}
}

// Slow is eight times the typical publish within [MinSlow, MaxSlow], a
// slow publish raises the average by at most its capped share, and
// After is MaxSlow until Warmup publishes were seen, unless a delay is
// set.
func TestTypical(t *testing.T) {
	var ty Typical
	if got := ty.Slow(); got != MinSlow {
		t.Fatalf("Slow of nothing seen = %s, want %s", got, MinSlow)
	}
	if d := ty.After(0); d != MaxSlow {
		t.Fatalf("After(0) before any publish was seen = %s, want %s", d, MaxSlow)
	}
	if d := ty.After(time.Second); d != time.Second {
		t.Fatalf("After(1s) = %s, want 1s", d)
	}
	for range Warmup - 1 {
		ty.Observe(time.Millisecond)
	}
	if d := ty.After(0); d != MaxSlow {
		t.Fatalf("After(0) after %d publishes = %s, want %s", Warmup-1, d, MaxSlow)
	}
	ty.Observe(time.Millisecond)
	if d := ty.After(0); d < MinSlow || d > 8*time.Millisecond {
		t.Fatalf("After(0) = %s after 1ms publishes, want within [%s, 8ms]", d, MinSlow)
	}
	before := ty.Slow()
	ty.Observe(time.Hour) // capped at the threshold of its time
	if got := ty.Slow(); got > before+before/2 {
		t.Fatalf("one 1h publish raised Slow from %s to %s", before, got)
	}
	ty.Set(time.Hour, 0)
	if got := ty.Slow(); got != MaxSlow {
		t.Fatalf("Slow = %s with a 1h average, want %s", got, MaxSlow)
	}
}

// A race is decided by its first success, or by its last call's failure,
// which reports the first failure; Hedge allows Max hedges.
func TestRace(t *testing.T) {
	first, second := errors.New("first"), errors.New("second")
	r := NewRace()
	if n, more := r.Hedge(); n != 1 || !more {
		t.Fatalf("first hedge: %d, more %v; want 1, true", n, more)
	}
	if n, more := r.Hedge(); n != 2 || more {
		t.Fatalf("second hedge: %d, more %v; want 2, false (Max %d)", n, more, Max)
	}
	if done, _ := r.Returned(first); done {
		t.Fatal("a failure with two calls running decided the race")
	}
	if done, err := r.Returned(nil); !done || err != nil {
		t.Fatalf("a success after a failure: done %v, err %v; want true, nil", done, err)
	}

	r = NewRace()
	r.Hedge()
	if done, _ := r.Returned(first); done || r.Running() != 1 {
		t.Fatalf("a failure with a call running: decided, or %d running", r.Running())
	}
	if done, err := r.Returned(second); !done || err != first {
		t.Fatalf("the last call failed: done %v, err %v; want true, the first failure", done, err)
	}

	var ty Typical
	th := NewThrottle()
	th.SetTokens(0)
	r = NewRace()
	r.Done(&ty, th, time.Millisecond)
	if th.Tokens() != 1 || ty.Seen() != 1 {
		t.Fatalf("an unhedged publish: throttle %d, seen %d; want 1, 1", th.Tokens(), ty.Seen())
	}
	r.Hedge()
	r.Done(&ty, th, time.Millisecond)
	if th.Tokens() != 1 || ty.Seen() != 2 {
		t.Fatalf("a hedged publish: throttle %d, seen %d; want 1 (no refill), 2", th.Tokens(), ty.Seen())
	}
	r.Done(&ty, nil, time.Millisecond) // hedging off: nothing to refill
}
