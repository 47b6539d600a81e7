// Package schedule runs periodic work with a fixed delay, the schedule the
// seed design asks for: the next run starts an interval after the previous
// one ended, so a slow run never piles up behind itself. After a failed
// run the delay grows instead (package backoff), so a database that is
// down or misconfigured is not retried faster and faster by every loop.
package schedule

import (
	"context"
	"errors"
	"time"

	"github.com/outboxgen/outboxgen/runtime/internal/backoff"
)

// FixedDelay runs work on a fixed-delay schedule that backs off after
// failures.
type FixedDelay struct {
	// Interval is the delay after a successful run.
	Interval time.Duration
	// BackoffMax caps the delay after consecutive failed runs, which
	// starts at Interval (at least backoff.Floor) and doubles per failure
	// (see backoff.Backoff; 0 means backoff.DefaultMax). With a cap at or
	// below Interval, failed runs are retried every Interval (at least
	// backoff.Floor).
	BackoffMax time.Duration
	// OnError, if set, is called after each failed run (unless ctx is
	// done) with the error, the number of consecutive failures and the
	// delay before the next run: one report per backoff step.
	OnError func(ctx context.Context, err error, failures int, retryIn time.Duration)
	// OnRecover, if set, is called after the first successful run that
	// follows failed ones, with their number.
	OnRecover func(ctx context.Context, failures int)
	// FatalAtStart, if set, is asked about each failed run before the
	// first successful one (unless ctx is done): when it reports true, Run
	// calls OnFatal and returns the error instead of retrying. It tells a
	// deployment mistake that waiting does not mend (a missing table,
	// column or privilege) from an outage.
	FatalAtStart func(error) bool
	// OnFatal, if set, is called with the error that ends Run because
	// FatalAtStart reported true for it.
	OnFatal func(ctx context.Context, err error)
}

// stop marks an error that ends Run.
type stop struct{ err error }

func (s stop) Error() string { return s.err.Error() }
func (s stop) Unwrap() error { return s.err }

// Stop wraps err so that Run returns it (unwrapped) instead of retrying.
func Stop(err error) error {
	if err == nil {
		return nil
	}
	return stop{err}
}

// Run calls run at once, then Interval after each successful run, or the
// backoff delay after each failed one, until ctx is done or run returns an
// error made with Stop, or a run fails before any has succeeded with an
// error FatalAtStart reports true for. Runs never overlap. It returns nil
// when ctx is done (once run has returned), the error given to Stop, or
// the fatal error.
func (s FixedDelay) Run(ctx context.Context, run func(context.Context) error) error {
	bmax := s.BackoffMax
	if bmax == 0 {
		bmax = backoff.DefaultMax
	}
	b := backoff.New(s.Interval, bmax)
	timer := time.NewTimer(s.Interval)
	timer.Stop()
	defer timer.Stop()
	started := false
	for ctx.Err() == nil {
		delay := s.Interval
		if err := run(ctx); err != nil {
			if st, ok := errors.AsType[stop](err); ok {
				return st.err
			}
			if ctx.Err() != nil {
				return nil
			}
			if !started && s.FatalAtStart != nil && s.FatalAtStart(err) {
				if s.OnFatal != nil {
					s.OnFatal(ctx, err)
				}
				return err
			}
			delay = b.Next()
			if s.OnError != nil {
				s.OnError(ctx, err, b.Failures(), delay)
			}
		} else {
			started = true
			if n := b.Failures(); n > 0 {
				b.Reset()
				if s.OnRecover != nil {
					s.OnRecover(ctx, n)
				}
			}
		}
		// Go 1.23+ timer semantics: Reset never leaves a stale tick.
		timer.Reset(delay)
		select {
		case <-ctx.Done():
		case <-timer.C:
		}
	}
	return nil
}
