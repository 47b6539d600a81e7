package pgxdriver

// The monitor's and janitor's methods: Stats, DeleteSent, ArchiveSent and
// DeleteInbox, running package dialect's PostgreSQL statements (ops.go).

import (
	"context"
	"fmt"
	"time"

	"github.com/outboxgen/outboxgen/runtime/driver"
	"github.com/outboxgen/outboxgen/runtime/driver/internal/driverutil"
)

// Stats counts pending, stale (pending and created longer than staleAfter
// ago), failed and expired-lease rows, and the age of the oldest pending
// row, in one statement; every age is measured by the database clock.
func (x *Driver) Stats(ctx context.Context, staleAfter time.Duration) (driver.Stats, error) {
	q := x.Ops
	query, args := q.Stats(staleAfter)
	var st driver.Stats
	var age float64
	if err := x.pool.QueryRow(ctx, query, args...).Scan(&st.Pending, &age, &st.Stale, &st.Failed, &st.ExpiredLeases); err != nil {
		return driver.Stats{}, fmt.Errorf("pgxdriver: stats: %w", err)
	}
	st.OldestPendingAge = driverutil.Seconds(age)
	return st, nil
}

// DeleteSent deletes at most limit sent rows whose sent_at is older than
// olderThan, lowest id first, in one short statement that reads no row
// past the last one created before the cutoff (dialect.SentBound). FAILED
// and pending rows are never deleted.
func (x *Driver) DeleteSent(ctx context.Context, olderThan time.Duration, limit int) (int64, error) {
	q := x.Ops
	if limit < 1 {
		return 0, fmt.Errorf("pgxdriver: delete sent: limit is %d: use at least 1", limit)
	}
	bound, ok, err := x.SentBound(ctx, olderThan)
	if err != nil || !ok {
		return 0, err
	}
	query, args := q.DeleteSent(olderThan, bound, limit)
	return x.JanitorExec(ctx, "delete sent", query, args)
}

// ArchiveSent moves at most limit sent rows whose sent_at is older than
// olderThan into table archive (the outbox layout), lowest id first, in one
// statement (a DELETE ... RETURNING feeding an INSERT): every row moved is
// in the archive and gone from the outbox, or nothing changed.
func (x *Driver) ArchiveSent(ctx context.Context, archive string, olderThan time.Duration, limit int) (int64, error) {
	q := x.Ops
	if limit < 1 {
		return 0, fmt.Errorf("pgxdriver: archive sent: limit is %d: use at least 1", limit)
	}
	if err := q.CheckArchive(archive); err != nil {
		return 0, fmt.Errorf("pgxdriver: archive sent: %w", err)
	}
	bound, ok, err := x.SentBound(ctx, olderThan)
	if err != nil || !ok {
		return 0, err
	}
	query, args, err := q.ArchiveMove(archive, olderThan, bound, limit)
	if err != nil {
		return 0, fmt.Errorf("pgxdriver: archive sent: %w", err)
	}
	return x.JanitorExec(ctx, "archive sent", query, args)
}

// DeleteInbox deletes at most limit inbox rows processed longer ago than
// olderThan, oldest first, in one short statement.
func (x *Driver) DeleteInbox(ctx context.Context, olderThan time.Duration, limit int) (int64, error) {
	q := x.Ops
	if limit < 1 {
		return 0, fmt.Errorf("pgxdriver: delete inbox: limit is %d: use at least 1", limit)
	}
	query, args := q.DeleteInbox(olderThan, limit)
	return x.JanitorExec(ctx, "delete inbox", query, args)
}
