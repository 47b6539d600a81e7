package relay

import (
	"context"
	"errors"
	"fmt"

	"github.com/outboxgen/outboxgen/runtime/dialect"
	"github.com/outboxgen/outboxgen/runtime/driver"
)

// FailedEvent is a FAILED outbox row (status 2): it exhausted MaxAttempts
// and waits for an operator. FAILED rows are never deleted automatically.
// In OnFailed, UpdatedAt is zero.
type FailedEvent = driver.FailedEvent

// MaxListFailed is the most rows one ListFailed call returns.
const MaxListFailed = 10000

// ListFailed returns up to limit FAILED rows, oldest (lowest id) first.
// Page with ListFailedAfter.
func (r *Relay) ListFailed(ctx context.Context, limit int) ([]FailedEvent, error) {
	return r.ListFailedAfter(ctx, 0, limit)
}

// ListFailedAfter returns up to limit FAILED rows with id > afterID, in id
// order: pass the last ID of the previous page to get the next one.
func (r *Relay) ListFailedAfter(ctx context.Context, afterID int64, limit int) ([]FailedEvent, error) {
	if limit < 1 || limit > MaxListFailed {
		return nil, fmt.Errorf("relay: ListFailed limit is %d: use 1 to %d", limit, MaxListFailed)
	}
	var out []FailedEvent
	for len(out) < limit {
		n := min(limit-len(out), dialect.MaxInList)
		evs, err := r.drv.FindEvents(ctx, driver.EventFilter{Status: int(driver.Failed), AfterID: afterID, Limit: n})
		if err != nil {
			return out, err
		}
		for _, e := range evs {
			out = append(out, FailedEvent{ID: e.ID, EventID: e.EventID, Type: e.Type, Key: e.Key, Topic: e.Topic,
				RetryCount: e.RetryCount, LastError: e.LastError, CreatedAt: e.CreatedAt, UpdatedAt: e.UpdatedAt})
		}
		if len(evs) < n {
			break
		}
		afterID = evs[len(evs)-1].ID
	}
	return out, nil
}

// Requeue makes the given FAILED rows pending again: status 0, retry_count
// 0, due now. last_error is kept until the next attempt (it records why the
// row had failed). Ids of rows that are not FAILED are ignored; the count
// of requeued rows is returned. The relay is notified, so the rows (and the
// events of their keys held back behind them) go out on its next poll.
func (r *Relay) Requeue(ctx context.Context, ids ...int64) (int64, error) {
	if len(ids) == 0 {
		return 0, errors.New("relay: Requeue needs at least one row id (see ListFailed)")
	}
	n, err := r.drv.Requeue(ctx, ids)
	if n > 0 {
		r.Notify()
	}
	return n, err
}
