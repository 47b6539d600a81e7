package relay

import (
	"log/slog"
	"time"

	"github.com/outboxgen/outboxgen/runtime/driver"
)

// breaker is the relay's circuit breaker. A batch whose publishes all
// failed, with errors not marked permanent, across at least two distinct
// keys is taken for a broker outage rather than for bad events: its rows
// are released without charging an attempt (so an outage longer than the
// backoff schedule does not turn the backlog FAILED) and the breaker
// opens. While open, the relay claims nothing until the next probe is due
// (Config.BreakerBackoff, growing per failed probe); a probe claims a
// batch, publishes one row of a key picked at random and releases the
// rest, also without charging. The first successful publish closes it.
//
// A single failing key (a poison event) never opens it: its failures are
// charged as usual and it goes FAILED after MaxAttempts while other keys
// flow. The price: when the only pending rows are those of two or more
// keys that all fail for reasons of their own, they are probed (uncharged)
// at the breaker's pace instead of going FAILED, until other events flow
// again.
type breaker struct {
	open  bool
	trips int       // failed batches and probes since it opened
	next  time.Time // while open: when the next probe is due
}

// judge updates the breaker with the failures of a batch that has no
// success yet, once every unit of it has reported or one has hung for
// SlowPublish, or with a failure of a batch that had a success (sent).
// transient are its failures not marked permanent (those are charged as
// they come). It returns the failures to charge and the rows to release
// uncharged. probe tells a probe batch, whose failure is never charged.
// While the breaker is open, a batch claimed before it opened (not a
// probe) says nothing about the broker now: its failures are released
// uncharged, and its successes do not close the breaker.
func (r *Relay) judge(sent bool, transient []driver.Failure, probe bool) (charge []driver.Failure, release []int64) {
	if r.brk.open && !probe {
		for _, f := range transient {
			release = append(release, f.Row.ID)
		}
		return nil, release
	}
	if sent {
		if r.brk.open {
			r.log.Info("circuit breaker closed: the broker accepts events again", slog.Int("failed_probes", r.brk.trips-1))
			r.brk = breaker{}
		}
		return transient, nil
	}
	keys := map[string]bool{}
	for _, f := range transient {
		keys[f.Row.Key] = true
	}
	if len(transient) == 0 || (!probe && len(keys) < 2) {
		return transient, nil
	}
	for _, f := range transient {
		release = append(release, f.Row.ID)
	}
	r.brk.trips++
	wait := max(r.opts.BreakerBackoff(r.brk.trips), 0)
	r.brk.next = time.Now().Add(wait)
	if !r.brk.open {
		r.brk.open = true
		r.log.Warn("circuit breaker open: every publish of a batch failed, across several keys (broker outage?): pausing, rows released without charging an attempt",
			slog.Int("failed", len(transient)), slog.Int("keys", len(keys)), slog.String("last_error", transient[len(transient)-1].Error),
			slog.Duration("next_probe_in", wait))
		return nil, release
	}
	r.log.Warn("circuit breaker probe failed: still paused",
		slog.Int("failed_probes", r.brk.trips-1), slog.String("error", transient[len(transient)-1].Error), slog.Duration("next_probe_in", wait))
	return nil, release
}
