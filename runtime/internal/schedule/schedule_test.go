package schedule

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/outboxgen/outboxgen/runtime/internal/backoff"
)

// Runs never overlap, the first one is immediate, and Run returns nil once
// ctx is done.
func TestFixedDelay(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	var runs int
	running := false
	done := make(chan error, 1)
	go func() {
		done <- FixedDelay{Interval: time.Millisecond}.Run(ctx, func(context.Context) error {
			if running {
				t.Error("runs overlap")
			}
			running = true
			runs++
			if runs == 5 {
				cancel()
			}
			running = false
			return nil
		})
	}()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Run = %v, want nil", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("Run did not return after ctx was cancelled")
	}
	if runs != 5 {
		t.Fatalf("%d runs after cancelling in the 5th, want 5", runs)
	}
	// A cancelled context: no run at all.
	if err := (FixedDelay{Interval: time.Hour}).Run(ctx, func(context.Context) error { t.Error("run with a done context"); return nil }); err != nil {
		t.Fatal(err)
	}
}

// Failed runs back off (from the interval, at least backoff.Floor,
// doubling), each reported once with its delay; a success resets the
// backoff and is reported; Stop ends Run with its error.
func TestFixedDelayBacksOff(t *testing.T) {
	type report struct {
		failures int
		retryIn  time.Duration
	}
	var reports []report
	var recovered []int
	errDown := errors.New("database down")
	errFatal := errors.New("no such table")
	script := []error{errDown, errDown, errDown, nil, errDown, Stop(errFatal), nil}
	runs := 0
	err := FixedDelay{
		Interval:   time.Millisecond,
		BackoffMax: time.Minute,
		OnError: func(_ context.Context, err error, failures int, retryIn time.Duration) {
			if !errors.Is(err, errDown) {
				t.Errorf("OnError(%v)", err)
			}
			reports = append(reports, report{failures, retryIn})
		},
		OnRecover: func(_ context.Context, failures int) { recovered = append(recovered, failures) },
	}.Run(context.Background(), func(context.Context) error {
		err := script[runs]
		runs++
		return err
	})
	if !errors.Is(err, errFatal) || errors.As(err, new(stop)) {
		t.Fatalf("Run = %v, want the error given to Stop, unwrapped", err)
	}
	if runs != 6 {
		t.Fatalf("%d runs, want 6 (Stop ends Run)", runs)
	}
	f := backoff.Floor
	want := []struct {
		failures int
		lo, hi   time.Duration
	}{{1, f, f}, {2, f, 2 * f}, {3, 2 * f, 4 * f}, {1, f, f}}
	if len(reports) != len(want) {
		t.Fatalf("reports %v, want %d", reports, len(want))
	}
	for i, w := range want {
		if r := reports[i]; r.failures != w.failures || r.retryIn < w.lo || r.retryIn > w.hi {
			t.Errorf("report %d: %d failures, retry in %s; want %d, within [%s, %s]", i, r.failures, r.retryIn, w.failures, w.lo, w.hi)
		}
	}
	if len(recovered) != 1 || recovered[0] != 3 {
		t.Errorf("recoveries %v, want one after 3 failures", recovered)
	}
}
