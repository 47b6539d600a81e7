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
// RETURNING), and returns the leased rows in id order. With p.Record, the
// results go first in the same pgx batch: one round trip, one implicit
// transaction, one commit.
func (x *Driver) Claim(ctx context.Context, p driver.ClaimParams) ([]driver.Row, error) {
	if err := driverutil.CheckClaim("pgxdriver", p); err != nil {
		return nil, err
	}
	q, err := x.relayQ.Get(p.Unordered)
	if err != nil {
		return nil, fmt.Errorf("pgxdriver: claim: %w", err)
	}
	query, args := driverutil.Claim(q, p)
	front := driverutil.WantsFront(q, p)
	stmts := driverutil.ClaimRecordStmts(q, p, false)
	if len(stmts) == 0 {
		rs, err := x.pool.Query(ctx, query, args...)
		if err != nil {
			return nil, fmt.Errorf("pgxdriver: claim: %w", err)
		}
		out, moved, pos, err := scanClaimed(rs, p.Owner, front)
		if err != nil {
			return nil, err
		}
		if p.Result != nil {
			p.Result.Moved, p.Result.Front = moved, pos
		}
		return out, nil
	}
	b := &pgx.Batch{}
	for _, s := range stmts {
		b.Queue(s.Query, s.Args...)
	}
	b.Queue(query, args...)
	var tx pgx.Tx
	send := x.pool.SendBatch
	if p.RecordInTime {
		// COMMIT goes only after the results came back: a batch held up
		// on the way past ctx's end is rolled back with the connection.
		if tx, err = x.pool.Begin(ctx); err != nil {
			return nil, fmt.Errorf("pgxdriver: claim: %w", err)
		}
		defer tx.Rollback(context.WithoutCancel(ctx)) // after Commit: ErrTxClosed, ignored
		send = tx.SendBatch
	}
	br := send(ctx, b)
	rec, err := readRecorded(br, stmts)
	if err != nil {
		br.Close()
		return nil, err
	}
	var out []driver.Row
	var moved int
	var pos driver.ScanPos
	rs, err := br.Query()
	if err == nil {
		out, moved, pos, err = scanClaimed(rs, p.Owner, front)
	} else {
		err = fmt.Errorf("pgxdriver: claim: %w", err)
	}
	if cerr := br.Close(); err == nil && cerr != nil {
		err = fmt.Errorf("pgxdriver: claim: %w", cerr)
	}
	if err == nil && tx != nil {
		if cerr := tx.Commit(ctx); cerr != nil {
			err = fmt.Errorf("pgxdriver: claim: commit: %w", cerr)
		}
	}
	if err != nil {
		return nil, err
	}
	if p.Result != nil {
		p.Result.Moved, p.Result.Front = moved, pos
		p.Result.Recorded = rec
	}
	return out, nil
}

// scanClaimed reads a claim's rows: those leased to owner in id order,
// how many others it held or moved back behind an older row of their
// key, and, when the statement returns it (front), the claim's front. It
// closes rs.
func scanClaimed(rs pgx.Rows, owner string, front bool) ([]driver.Row, int, driver.ScanPos, error) {
	defer rs.Close()
	var out []driver.Row
	moved := 0
	var pos driver.ScanPos
	for rs.Next() {
		var r driver.Row
		var leaseOwner *string
		var frontUS, frontID *int64
		dest := []any{&r.ID, &r.EventID, &r.Type, &r.Key, &r.Topic, &r.Version, &r.Payload, &r.Headers, &r.RetryCount, &r.CreatedAt, &leaseOwner}
		if front {
			dest = append(dest, &frontUS, &frontID)
		}
		if err := rs.Scan(dest...); err != nil {
			return nil, 0, driver.ScanPos{}, fmt.Errorf("pgxdriver: claim: scan: %w", err)
		}
		if frontUS != nil && frontID != nil {
			pos = driver.ScanPos{DueMicros: *frontUS, ID: *frontID}
		}
		if leaseOwner == nil || *leaseOwner != owner {
			moved++
			continue
		}
		r.EventID = strings.ToLower(r.EventID)
		r.CreatedAt = r.CreatedAt.UTC()
		out = append(out, r)
	}
	if err := rs.Err(); err != nil {
		return nil, 0, driver.ScanPos{}, fmt.Errorf("pgxdriver: claim: %w", err)
	}
	driverutil.SortRows(out) // RETURNING has no order
	return out, moved, pos, nil
}

// readRecorded reads the results of the recording statements queued first
// in a batch.
func readRecorded(br pgx.BatchResults, stmts []driverutil.Stmt) (driver.Recorded, error) {
	var rec driver.Recorded
	for _, s := range stmts {
		tag, err := br.Exec()
		if err != nil {
			return driver.Recorded{}, fmt.Errorf("pgxdriver: %s: %w", s.Describe(), err)
		}
		s.Count(&rec, tag.RowsAffected())
	}
	return rec, nil
}

// Record writes r in one pgx batch: one round trip, one implicit
// transaction.
func (x *Driver) Record(ctx context.Context, owner string, r driver.Results) (driver.Recorded, error) {
	if err := driverutil.CheckRecord("pgxdriver", owner, &r); err != nil || r.Empty() {
		return driver.Recorded{}, err
	}
	q, err := x.relayQ.Get(nil)
	if err != nil {
		return driver.Recorded{}, fmt.Errorf("pgxdriver: record: %w", err)
	}
	stmts := driverutil.RecordStmts(q, owner, &r, false)
	b := &pgx.Batch{}
	for _, s := range stmts {
		b.Queue(s.Query, s.Args...)
	}
	br := x.pool.SendBatch(ctx, b)
	rec, err := readRecorded(br, stmts)
	if cerr := br.Close(); err == nil && cerr != nil {
		err = fmt.Errorf("pgxdriver: record: %w", cerr)
	}
	if err != nil {
		return driver.Recorded{}, err
	}
	return rec, nil
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

// MarkSent marks ids sent, fenced by owner's lease: a recording (Record),
// so the rows held behind them are due again in the same batch.
func (x *Driver) MarkSent(ctx context.Context, owner string, ids []int64) (int64, error) {
	rec, err := x.Record(ctx, owner, driver.Results{Sent: ids})
	return rec.Sent, err
}

// Release gives ids back unpublished, fenced by owner's lease: a
// recording, like MarkSent.
func (x *Driver) Release(ctx context.Context, owner string, ids []int64) (int64, error) {
	rec, err := x.Record(ctx, owner, driver.Results{Release: ids})
	return rec.Released, err
}

// ExtendLease pushes the lease of ids still leased to owner to now+lease,
// in one statement.
func (x *Driver) ExtendLease(ctx context.Context, owner string, ids []int64, lease time.Duration) (int64, error) {
	return x.execIDs(ctx, "extend lease", ids, func(q *dialect.RelayQueries) (string, []any) { return q.ExtendLease(owner, ids, lease) })
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
	rec, err := x.Record(ctx, owner, driver.Results{Failures: fs, MaxAttempts: maxAttempts})
	return rec.Retried, rec.Failed, err
}
