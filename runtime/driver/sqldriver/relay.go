package sqldriver

// The relay's methods: Claim, MarkSent, MarkRetry, Release, ExtendLease,
// ListFailed and Requeue. Their SQL lives in package dialect (relay.go).

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/outboxgen/outboxgen/runtime/dialect"
	"github.com/outboxgen/outboxgen/runtime/driver"
	"github.com/outboxgen/outboxgen/runtime/driver/internal/driverutil"
)

var _ driver.Driver = (*Driver)(nil)

// Claim leases up to p.Limit claimable rows to p.Owner and returns them in
// id order. PostgreSQL and SQLite claim in one statement; MySQL/MariaDB
// (no UPDATE ... RETURNING) in one short READ COMMITTED transaction:
// SELECT ... FOR UPDATE SKIP LOCKED, drop the rows whose older same-key
// rows another instance holds, lease the rest, commit.
func (x *Driver) Claim(ctx context.Context, p driver.ClaimParams) ([]driver.Row, error) {
	if err := driverutil.CheckClaim("sqldriver", p); err != nil {
		return nil, err
	}
	if err := x.checkTimeZone(ctx); err != nil {
		return nil, err
	}
	q, err := x.relayQ.Get(p.Unordered)
	if err != nil {
		return nil, fmt.Errorf("sqldriver: claim: %w", err)
	}
	query, args := driverutil.Claim(q, p)
	if !q.ClaimInTransaction() {
		rs, err := x.db.QueryContext(ctx, query, args...)
		if err != nil {
			return nil, fmt.Errorf("sqldriver: claim: %w", err)
		}
		rows, err := scanRows(rs)
		if err != nil {
			return nil, err
		}
		driverutil.SortRows(rows) // RETURNING has no order
		return rows, nil
	}
	// MySQL/MariaDB: lock, filter, lease, commit. READ COMMITTED: the
	// blocked-check must see rows committed after the locking read, and it
	// takes no gap locks.
	tx, err := x.db.BeginTx(ctx, &sql.TxOptions{Isolation: sql.LevelReadCommitted})
	if err != nil {
		return nil, fmt.Errorf("sqldriver: claim: begin: %w", err)
	}
	defer tx.Rollback() //nolint:errcheck // no-op after Commit
	rs, err := tx.QueryContext(ctx, query, args...)
	if err != nil {
		return nil, fmt.Errorf("sqldriver: claim: %w", err)
	}
	rows, err := scanRows(rs)
	if err != nil || len(rows) == 0 {
		return nil, err
	}
	ids := make([]int64, len(rows))
	for i, r := range rows {
		ids[i] = r.ID
	}
	query, args = q.ClaimBlocked(ids)
	brs, err := tx.QueryContext(ctx, query, args...)
	if err != nil {
		return nil, fmt.Errorf("sqldriver: claim: per-key check: %w", err)
	}
	blocked := map[int64]bool{}
	for brs.Next() {
		var id int64
		if err := brs.Scan(&id); err != nil {
			brs.Close()
			return nil, fmt.Errorf("sqldriver: claim: per-key check: %w", err)
		}
		blocked[id] = true
	}
	if err := brs.Close(); err != nil {
		return nil, fmt.Errorf("sqldriver: claim: per-key check: %w", err)
	}
	if err := brs.Err(); err != nil {
		return nil, fmt.Errorf("sqldriver: claim: per-key check: %w", err)
	}
	if len(blocked) > 0 {
		kept := rows[:0]
		ids = ids[:0]
		for _, r := range rows {
			if !blocked[r.ID] {
				kept = append(kept, r)
				ids = append(ids, r.ID)
			}
		}
		rows = kept
	}
	if len(rows) == 0 {
		return nil, nil // rollback releases the locks
	}
	query, args = q.ClaimLease(p.Owner, p.Lease, ids)
	if _, err := tx.ExecContext(ctx, query, args...); err != nil {
		return nil, fmt.Errorf("sqldriver: claim: lease: %w", err)
	}
	if err := tx.Commit(); err != nil {
		return nil, fmt.Errorf("sqldriver: claim: commit: %w", err)
	}
	return rows, nil // ORDER BY id
}

func scanRows(rs *sql.Rows) ([]driver.Row, error) {
	defer rs.Close()
	var out []driver.Row
	for rs.Next() {
		var r driver.Row
		var created driverutil.Time
		if err := rs.Scan(&r.ID, &r.EventID, &r.Type, &r.Key, &r.Topic, &r.Version, &r.Payload, &r.Headers, &r.RetryCount, &created); err != nil {
			return nil, fmt.Errorf("sqldriver: claim: scan: %w", err)
		}
		r.EventID = strings.ToLower(r.EventID)
		r.CreatedAt = created.T
		out = append(out, r)
	}
	if err := rs.Err(); err != nil {
		return nil, fmt.Errorf("sqldriver: claim: %w", err)
	}
	return out, nil
}

func (x *Driver) execIDs(ctx context.Context, what string, ids []int64, build func(q *dialect.RelayQueries, part []int64) (string, []any)) (int64, error) {
	q, err := x.relayQ.Get(nil)
	if err != nil {
		return 0, fmt.Errorf("sqldriver: %s: %w", what, err)
	}
	var total int64
	err = driverutil.Chunks(ids, func(part []int64) error {
		query, args := build(q, part)
		res, err := x.db.ExecContext(ctx, query, args...)
		if err != nil {
			return fmt.Errorf("sqldriver: %s: %w", what, err)
		}
		n, err := res.RowsAffected()
		if err != nil {
			return fmt.Errorf("sqldriver: %s: rows affected: %w", what, err)
		}
		total += n
		return nil
	})
	return total, err
}

// MarkSent marks ids sent, fenced by owner's lease; lists longer than
// dialect.MaxInList take one statement per chunk.
func (x *Driver) MarkSent(ctx context.Context, owner string, ids []int64) (int64, error) {
	return x.execIDs(ctx, "mark sent", ids, func(q *dialect.RelayQueries, part []int64) (string, []any) { return q.MarkSent(owner, part) })
}

// Release gives ids back unpublished, fenced by owner's lease.
func (x *Driver) Release(ctx context.Context, owner string, ids []int64) (int64, error) {
	return x.execIDs(ctx, "release", ids, func(q *dialect.RelayQueries, part []int64) (string, []any) { return q.Release(owner, part) })
}

// ExtendLease pushes the lease of ids still leased to owner to now+lease.
func (x *Driver) ExtendLease(ctx context.Context, owner string, ids []int64, lease time.Duration) (int64, error) {
	return x.execIDs(ctx, "extend lease", ids, func(q *dialect.RelayQueries, part []int64) (string, []any) {
		return q.ExtendLease(owner, part, lease)
	})
}

// Requeue makes FAILED ids pending again.
func (x *Driver) Requeue(ctx context.Context, ids []int64) (int64, error) {
	return x.execIDs(ctx, "requeue", ids, (*dialect.RelayQueries).Requeue)
}

// MarkRetry writes each failure with its own fenced UPDATE (each row has
// its own error text and delay), all in one transaction: one commit for
// the batch.
func (x *Driver) MarkRetry(ctx context.Context, owner string, fs []driver.Failure, maxAttempts int) (int64, []int64, error) {
	if len(fs) == 0 {
		return 0, nil, nil
	}
	q, err := x.relayQ.Get(nil)
	if err != nil {
		return 0, nil, fmt.Errorf("sqldriver: record failures: %w", err)
	}
	tx, err := x.db.BeginTx(ctx, nil)
	if err != nil {
		return 0, nil, fmt.Errorf("sqldriver: record failures: begin: %w", err)
	}
	defer tx.Rollback() //nolint:errcheck // no-op after Commit
	var changed int64
	var failed []int64
	for _, f := range fs {
		query, args := q.MarkRetry(owner, f.Row.ID, f.Error, f.Delay, f.MaxAttempts(maxAttempts))
		res, err := tx.ExecContext(ctx, query, args...)
		if err != nil {
			return 0, nil, fmt.Errorf("sqldriver: record failure of row %d: %w", f.Row.ID, err)
		}
		n, err := res.RowsAffected()
		if err != nil {
			return 0, nil, fmt.Errorf("sqldriver: record failure of row %d: rows affected: %w", f.Row.ID, err)
		}
		changed += n
		if driverutil.FailedID(f, n > 0, f.MaxAttempts(maxAttempts)) {
			failed = append(failed, f.Row.ID)
		}
	}
	if err := tx.Commit(); err != nil {
		return 0, nil, fmt.Errorf("sqldriver: record failures: commit: %w", err)
	}
	return changed, failed, nil
}

// ListFailed lists FAILED rows with id > afterID in id order.
func (x *Driver) ListFailed(ctx context.Context, afterID int64, limit int) ([]driver.FailedEvent, error) {
	if limit < 1 {
		return nil, fmt.Errorf("sqldriver: list failed: limit is %d: use at least 1", limit)
	}
	q, err := x.relayQ.Get(nil)
	if err != nil {
		return nil, fmt.Errorf("sqldriver: list failed: %w", err)
	}
	query, args := q.ListFailed(afterID, limit)
	rs, err := x.db.QueryContext(ctx, query, args...)
	if err != nil {
		return nil, fmt.Errorf("sqldriver: list failed: %w", err)
	}
	defer rs.Close()
	var out []driver.FailedEvent
	for rs.Next() {
		var f driver.FailedEvent
		var lastErr sql.NullString
		var created, updated driverutil.Time
		if err := rs.Scan(&f.ID, &f.EventID, &f.Type, &f.Key, &f.Topic, &f.RetryCount, &lastErr, &created, &updated); err != nil {
			return nil, fmt.Errorf("sqldriver: list failed: scan: %w", err)
		}
		f.EventID = strings.ToLower(f.EventID)
		f.LastError = lastErr.String
		f.CreatedAt, f.UpdatedAt = created.T, updated.T
		out = append(out, f)
	}
	if err := rs.Err(); err != nil {
		return nil, fmt.Errorf("sqldriver: list failed: %w", err)
	}
	return out, nil
}

// Notify wakes the relays listening (package pgxdriver's Notifier) on the
// driver's outbox table, when run inside the writer's transaction after
// its inserts: the notification is delivered at commit. It is opt-in
// because PostgreSQL serialises the commits of notifying transactions
// (see dialect.NotifyInsert); in-process writers can call the relay's
// Notify instead. On MySQL and SQLite it does nothing (they have no
// NOTIFY; relays there poll, or are woken in process).
func (x *Driver) Notify(ctx context.Context, tx *sql.Tx) error {
	if x.d != dialect.Postgres {
		return nil
	}
	if tx == nil {
		return errors.New("sqldriver: notify: tx is nil: call Notify inside the transaction that inserted the events")
	}
	if _, err := tx.ExecContext(ctx, dialect.NotifyInsert(x.tables.Outbox)); err != nil {
		return fmt.Errorf("sqldriver: notify: %w", err)
	}
	return nil
}
