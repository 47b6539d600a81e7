package hedge

import (
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
// After waits for Warmup publishes unless a delay is set.
func TestTypical(t *testing.T) {
	var ty Typical
	if got := ty.Slow(); got != MinSlow {
		t.Fatalf("Slow of nothing seen = %s, want %s", got, MinSlow)
	}
	if _, ok := ty.After(0); ok {
		t.Fatal("After(0) allows a hedge before any publish was seen")
	}
	if d, ok := ty.After(time.Second); !ok || d != time.Second {
		t.Fatalf("After(1s) = %s, %v; want 1s, true", d, ok)
	}
	for range Warmup {
		ty.Observe(time.Millisecond)
	}
	d, ok := ty.After(0)
	if !ok {
		t.Fatalf("After(0) refuses a hedge after %d publishes", Warmup)
	}
	if d < MinSlow || d > 8*time.Millisecond {
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
