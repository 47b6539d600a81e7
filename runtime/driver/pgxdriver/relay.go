package pgxdriver

// The relay's methods: Claim, MarkSent, MarkRetry, Release, ExtendLease,
// and Requeue, running package dialect's PostgreSQL statements.
// Id lists are bound as one bigint[] (dialect.RelayQueries.ArrayIDs), so
// every statement text is fixed and pgx prepares it once per connection;
// the failures of a batch go out as one pgx batch.

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outboxgen/outboxgen/runtime/dialect"
	"github.com/outboxgen/outboxgen/runtime/driver"
	"github.com/outboxgen/outboxgen/runtime/driver/internal/driverutil"
)

var (
	_ driver.Driver   = (*Driver)(nil)
	_ driver.Notifier = (*Driver)(nil)
)

// Claim leases up to p.Limit claimable rows to p.Owner, and holds the
// rows of the window waiting behind a failing row of their key, in one
// statement (SELECT ... FOR UPDATE SKIP LOCKED feeding an UPDATE ...
// RETURNING), and returns the leased rows in id order.
func (x *Driver) Claim(ctx context.Context, p driver.ClaimParams) ([]driver.Row, error) {
	if err := driverutil.CheckClaim("pgxdriver", p); err != nil {
		return nil, err
	}
	q, err := x.relayQ.Get(p.Unordered)
	if err != nil {
		return nil, fmt.Errorf("pgxdriver: claim: %w", err)
	}
	query, args := driverutil.Claim(q, p)
	rs, err := x.pool.Query(ctx, query, args...)
	if err != nil {
		return nil, fmt.Errorf("pgxdriver: claim: %w", err)
	}
	defer rs.Close()
	var out []driver.Row
	moved := 0
	for rs.Next() {
		var r driver.Row
		var leaseOwner *string
		if err := rs.Scan(&r.ID, &r.EventID, &r.Type, &r.Key, &r.Topic, &r.Version, &r.Payload, &r.Headers, &r.RetryCount, &r.CreatedAt, &leaseOwner); err != nil {
			return nil, fmt.Errorf("pgxdriver: claim: scan: %w", err)
		}
		if leaseOwner == nil || *leaseOwner != p.Owner {
			moved++ // held, or moved back behind an older row of its key
			continue
		}
		r.EventID = strings.ToLower(r.EventID)
		r.CreatedAt = r.CreatedAt.UTC()
		out = append(out, r)
	}
	if err := rs.Err(); err != nil {
		return nil, fmt.Errorf("pgxdriver: claim: %w", err)
	}
	if p.Result != nil {
		p.Result.Moved = moved
	}
	driverutil.SortRows(out) // RETURNING has no order
	return out, nil
}

func (x *Driver) execIDs(ctx context.Context, what string, ids []int64, build func(q *dialect.RelayQueries) (string, []any)) (int64, error) {
	if len(ids) == 0 {
		return 0, nil
	}
	q, err := x.relayQ.Get(nil)
	if err != nil {
		return 0, fmt.Errorf("pgxdriver: %s: %w", what, err)
	}
	query, args := build(q)
	tag, err := x.pool.Exec(ctx, query, args...)
	if err != nil {
		return 0, fmt.Errorf("pgxdriver: %s: %w", what, err)
	}
	return tag.RowsAffected(), nil
}

// MarkSent marks ids sent, fenced by owner's lease, in one statement.
func (x *Driver) MarkSent(ctx context.Context, owner string, ids []int64) (int64, error) {
	return x.execIDs(ctx, "mark sent", ids, func(q *dialect.RelayQueries) (string, []any) { return q.MarkSent(owner, ids) })
}

// Release gives ids back unpublished, fenced by owner's lease.
func (x *Driver) Release(ctx context.Context, owner string, ids []int64) (int64, error) {
	return x.execIDs(ctx, "release", ids, func(q *dialect.RelayQueries) (string, []any) { return q.Release(owner, ids) })
}

// ExtendLease pushes the lease of ids still leased to owner to now+lease,
// in one statement.
func (x *Driver) ExtendLease(ctx context.Context, owner string, ids []int64, lease time.Duration) (int64, error) {
	return x.execIDs(ctx, "extend lease", ids, func(q *dialect.RelayQueries) (string, []any) { return q.ExtendLease(owner, ids, lease) })
}

// Requeue makes FAILED ids pending again and releases the rows held
// behind them: one pgx batch (one implicit transaction) per chunk of ids.
func (x *Driver) Requeue(ctx context.Context, ids []int64) (int64, error) {
	q, err := x.relayQ.Get(nil)
	if err != nil {
		return 0, fmt.Errorf("pgxdriver: requeue: %w", err)
	}
	var total int64
	err = driverutil.Chunks(ids, func(part []int64) error {
		b := &pgx.Batch{}
		query, args := q.Requeue(part)
		b.Queue(query, args...)
		query, args = q.ReleaseHeld(part)
		b.Queue(query, args...)
		br := x.pool.SendBatch(ctx, b)
		tag, err := br.Exec()
		if err == nil {
			_, err = br.Exec()
		}
		if cerr := br.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return fmt.Errorf("pgxdriver: requeue: %w", err)
		}
		total += tag.RowsAffected()
		return nil
	})
	return total, err
}

// ReleaseHeld makes the held rows of the keys of ids due again.
func (x *Driver) ReleaseHeld(ctx context.Context, ids []int64) (int64, error) {
	var total int64
	err := driverutil.Chunks(ids, func(part []int64) error {
		n, err := x.execIDs(ctx, "release held rows", part, func(q *dialect.RelayQueries) (string, []any) { return q.ReleaseHeld(part) })
		total += n
		return err
	})
	return total, err
}

// MarkRetry writes each failure with its own fenced UPDATE (each row has
// its own error text and delay), sent as one pgx batch: one round trip and
// one implicit transaction, so the batch is recorded entirely or not at all.
func (x *Driver) MarkRetry(ctx context.Context, owner string, fs []driver.Failure, maxAttempts int) (int64, []int64, error) {
	if len(fs) == 0 {
		return 0, nil, nil
	}
	q, err := x.relayQ.Get(nil)
	if err != nil {
		return 0, nil, fmt.Errorf("pgxdriver: record failures: %w", err)
	}
	b := &pgx.Batch{}
	for _, f := range fs {
		query, args := q.MarkRetry(owner, f.Row.ID, f.Error, f.Delay, f.MaxAttempts(maxAttempts))
		b.Queue(query, args...)
	}
	br := x.pool.SendBatch(ctx, b)
	var changed int64
	var failed []int64
	for _, f := range fs {
		tag, err := br.Exec()
		if err != nil {
			br.Close()
			return 0, nil, fmt.Errorf("pgxdriver: record failure of row %d: %w", f.Row.ID, err)
		}
		n := tag.RowsAffected()
		changed += n
		if driverutil.FailedID(f, n > 0, f.MaxAttempts(maxAttempts)) {
			failed = append(failed, f.Row.ID)
		}
	}
	if err := br.Close(); err != nil {
		return 0, nil, fmt.Errorf("pgxdriver: record failures: %w", err)
	}
	return changed, failed, nil
}
