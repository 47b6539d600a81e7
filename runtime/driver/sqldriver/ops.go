package sqldriver

// The monitor's and janitor's methods: Stats, DeleteSent, ArchiveSent and
// DeleteInbox. Their SQL lives in package dialect (ops.go).

import (
	"context"
	"database/sql"
	"fmt"
	"time"

	"github.com/outboxgen/outboxgen/runtime/dialect"
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
	if err := x.db.QueryRowContext(ctx, query, args...).Scan(&st.Pending, &age, &st.Stale, &st.Failed, &st.ExpiredLeases); err != nil {
		return driver.Stats{}, fmt.Errorf("sqldriver: stats: %w", err)
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
		return 0, fmt.Errorf("sqldriver: delete sent: limit is %d: use at least 1", limit)
	}
	bound, ok, err := x.SentBound(ctx, olderThan)
	if err != nil || !ok {
		return 0, err
	}
	query, args := q.DeleteSent(olderThan, bound, limit)
	return x.JanitorExec(ctx, "delete sent", query, args)
}

// DeleteInbox deletes at most limit inbox rows processed longer ago than
// olderThan, oldest first, in one short statement.
func (x *Driver) DeleteInbox(ctx context.Context, olderThan time.Duration, limit int) (int64, error) {
	q := x.Ops
	if limit < 1 {
		return 0, fmt.Errorf("sqldriver: delete inbox: limit is %d: use at least 1", limit)
	}
	query, args := q.DeleteInbox(olderThan, limit)
	return x.JanitorExec(ctx, "delete inbox", query, args)
}

// ArchiveSent moves at most limit sent rows whose sent_at is older than
// olderThan into table archive (the outbox layout), lowest id first, in one
// short transaction: every row moved is in the archive and gone from the
// outbox, or nothing changed.
func (x *Driver) ArchiveSent(ctx context.Context, archive string, olderThan time.Duration, limit int) (int64, error) {
	q := x.Ops
	if limit < 1 {
		return 0, fmt.Errorf("sqldriver: archive sent: limit is %d: use at least 1", limit)
	}
	if err := q.CheckArchive(archive); err != nil {
		return 0, fmt.Errorf("sqldriver: archive sent: %w", err)
	}
	bound, ok, err := x.SentBound(ctx, olderThan)
	if err != nil || !ok {
		return 0, err
	}
	if q.ArchiveInOneStatement() {
		query, args, err := q.ArchiveMove(archive, olderThan, bound, limit)
		if err != nil {
			return 0, fmt.Errorf("sqldriver: archive sent: %w", err)
		}
		return x.JanitorExec(ctx, "archive sent", query, args)
	}
	query, args, err := q.ArchivePick(archive, olderThan, bound, limit)
	if err != nil {
		return 0, fmt.Errorf("sqldriver: archive sent: %w", err)
	}
	var opts *sql.TxOptions
	if x.d == dialect.MySQL {
		// No gap locks: the batch locks its own rows and nothing else.
		opts = &sql.TxOptions{Isolation: sql.LevelReadCommitted}
	}
	tx, err := x.db.BeginTx(ctx, opts)
	if err != nil {
		return 0, fmt.Errorf("sqldriver: archive sent: begin: %w", err)
	}
	defer tx.Rollback() //nolint:errcheck // no-op after Commit
	ids, err := driverutil.QueryIDs(ctx, driverutil.TxQuerier(tx), query, args)
	if err != nil {
		return 0, fmt.Errorf("sqldriver: archive sent: pick: %w", err)
	}
	if len(ids) == 0 {
		return 0, nil
	}
	for start := 0; start < len(ids); start += dialect.MaxInList {
		chunk := ids[start:min(start+dialect.MaxInList, len(ids))]
		if !q.ArchiveCopiesOnPick() {
			query, args, err := q.ArchiveCopy(archive, chunk)
			if err != nil {
				return 0, fmt.Errorf("sqldriver: archive sent: %w", err)
			}
			if err := opsExecExactly(ctx, tx, "copy", query, args, len(chunk)); err != nil {
				return 0, fmt.Errorf("sqldriver: archive sent: %w", err)
			}
		}
		query, args := q.ArchiveDelete(chunk)
		if err := opsExecExactly(ctx, tx, "delete", query, args, len(chunk)); err != nil {
			return 0, fmt.Errorf("sqldriver: archive sent: %w", err)
		}
	}
	if err := tx.Commit(); err != nil {
		return 0, fmt.Errorf("sqldriver: archive sent: commit: %w", err)
	}
	return int64(len(ids)), nil
}

// opsExecExactly runs a statement that must change want rows; any other count
// aborts the batch (the caller rolls back), so no row is ever deleted
// without its copy.
func opsExecExactly(ctx context.Context, tx *sql.Tx, what, query string, args []any, want int) error {
	res, err := tx.ExecContext(ctx, query, args...)
	if err != nil {
		return fmt.Errorf("%s: %w", what, err)
	}
	n, err := res.RowsAffected()
	if err != nil {
		return fmt.Errorf("%s: rows affected: %w", what, err)
	}
	if n != int64(want) {
		return fmt.Errorf("%s changed %d rows, want %d: rolled back", what, n, want)
	}
	return nil
}
