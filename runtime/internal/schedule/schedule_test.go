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

// A failure FatalAtStart reports true for ends Run, after OnFatal, only
// before the first successful run; later it is retried like any other.
func TestFixedDelayFatalAtStart(t *testing.T) {
	errFatal := errors.New("no such table")
	errDown := errors.New("database down")
	run := func(script []error) (runs int, fatal []error, reported int, err error) {
		err = FixedDelay{
			Interval:     time.Millisecond,
			FatalAtStart: func(err error) bool { return errors.Is(err, errFatal) },
			OnFatal:      func(_ context.Context, err error) { fatal = append(fatal, err) },
			OnError:      func(context.Context, error, int, time.Duration) { reported++ },
		}.Run(context.Background(), func(context.Context) error {
			runs++
			if runs > len(script) {
				return Stop(errors.New("end of script"))
			}
			return script[runs-1]
		})
		return runs, fatal, reported, err
	}

	runs, fatal, reported, err := run([]error{errDown, errFatal, nil})
	if !errors.Is(err, errFatal) || runs != 2 || len(fatal) != 1 || fatal[0] != errFatal || reported != 1 {
		t.Fatalf("before a success: Run = %v after %d runs, OnFatal %v, %d OnError; want the fatal error after 2 runs, one OnFatal, one OnError", err, runs, fatal, reported)
	}
	runs, fatal, reported, err = run([]error{nil, errFatal, nil})
	if err == nil || errors.Is(err, errFatal) || runs != 4 || len(fatal) != 0 || reported != 1 {
		t.Fatalf("after a success: Run = %v after %d runs, OnFatal %v, %d OnError; want the end of the script after 4 runs, no OnFatal, one OnError", err, runs, fatal, reported)
	}

	// A done context wins: the failure is not the database's fault.
	ctx, cancel := context.WithCancel(context.Background())
	called := false
	err = FixedDelay{
		Interval:     time.Millisecond,
		FatalAtStart: func(error) bool { return true },
		OnFatal:      func(context.Context, error) { called = true },
	}.Run(ctx, func(context.Context) error { cancel(); return errFatal })
	if err != nil || called {
		t.Fatalf("cancelled: Run = %v, OnFatal called %v; want nil, not called", err, called)
	}
}
