// Package schedule runs periodic work with a fixed delay, the schedule the
// seed design asks for: the next run starts an interval after the previous
// one ended, so a slow run never piles up behind itself.
package schedule

import (
	"context"
	"time"
)

// FixedDelay calls run at once, then interval after each run returns,
// until ctx is done. It returns when ctx is done and run has returned.
func FixedDelay(ctx context.Context, interval time.Duration, run func(context.Context)) {
	timer := time.NewTimer(interval)
	timer.Stop()
	defer timer.Stop()
	for ctx.Err() == nil {
		run(ctx)
		// Go 1.23+ timer semantics: Reset never leaves a stale tick.
		timer.Reset(interval)
		select {
		case <-ctx.Done():
		case <-timer.C:
		}
	}
}
