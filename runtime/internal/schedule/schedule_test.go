package schedule

import (
	"context"
	"testing"
	"time"
)

// Runs never overlap, the first one is immediate, and FixedDelay returns
// once ctx is done.
func TestFixedDelay(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	var runs int
	running := false
	done := make(chan struct{})
	go func() {
		defer close(done)
		FixedDelay(ctx, time.Millisecond, func(context.Context) {
			if running {
				t.Error("runs overlap")
			}
			running = true
			runs++
			if runs == 5 {
				cancel()
			}
			running = false
		})
	}()
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		t.Fatal("FixedDelay did not return after ctx was cancelled")
	}
	if runs != 5 {
		t.Fatalf("%d runs after cancelling in the 5th, want 5", runs)
	}
	// A cancelled context: no run at all.
	FixedDelay(ctx, time.Hour, func(context.Context) { t.Error("run with a done context") })
}
