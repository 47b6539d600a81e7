package sqldriver

// The relay's methods: Claim, MarkSent, MarkRetry, Release, ExtendLease,
// and Requeue. Their SQL lives in package dialect (relay.go).

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/outboxgen/outboxgen/runtime/dialect"
	"github.com/outboxgen/outboxgen/runtime/driver"
	"github.com/outboxgen/outboxgen/runtime/driver/internal/driverutil"
)

var _ driver.Driver = (*Driver)(nil)

// Claim leases up to p.Limit claimable rows to p.Owner and returns them in
// id order. PostgreSQL claims in one statement; MySQL/MariaDB (no
// UPDATE ... RETURNING) and SQLite in one short transaction of several
// statements (driverutil.ClaimInTx): lock the window (MySQL, READ
// COMMITTED: read its ids without locks, lock them by id with SKIP
// LOCKED, the locking window filling the rest when other claims hold too
// many of them), drop the rows whose older same-key rows another instance
// holds, lease the rest, commit.
// With p.Record, the results are written first: in the claim's
// transaction (one commit), or on MySQL/MariaDB in one of their own,
// committed before the claim's starts (see recordApart).
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
	// The one claim statement (PostgreSQL); a claim of several statements
	// renders its own (driverutil.ClaimInTx).
	var query string
	var args []any
	if !q.ClaimInTransaction() {
		query, args = driverutil.Claim(q, p)
	}
	front := driverutil.WantsFront(q, p)
	before := driverutil.ClaimRecordStmts(q, p, true)
	if !q.ClaimInTransaction() && len(before) == 0 {
		// PostgreSQL: one statement; held rows come back with lease_owner
		// dialect.HeldOwner.
		rs, err := x.db.QueryContext(ctx, query, args...)
		if err != nil {
			return nil, fmt.Errorf("sqldriver: claim: %w", err)
		}
		rows, moved, pos, err := scanClaimRows(rs, p.Owner, front)
		if err != nil {
			return nil, err
		}
		if p.Result != nil {
			p.Result.Moved, p.Result.Front = moved, pos
		}
		driverutil.SortRows(rows) // RETURNING has no order
		return rows, nil
	}
	// MySQL/MariaDB may pick a claim, or a recording, as a deadlock
	// victim (concurrent claims moving rows in the due index, a requeue
	// locking a key's rows): the transaction was rolled back whole, so it
	// runs again, a few times, before the relay hears of it.
	if x.d == dialect.MySQL && len(before) > 0 {
		var rec driver.Recorded
		err := driverutil.RetryConflicts(ctx, driverutil.ConflictTries, func() (err error) {
			rec, err = x.recordApart(ctx, before)
			return err
		})
		if err != nil {
			return nil, err
		}
		if p.Result != nil {
			p.Result.Recorded, p.Result.RecordedApart = rec, true
		}
		before = nil
	}
	var rows []driver.Row
	err = driverutil.RetryConflicts(ctx, driverutil.ConflictTries, func() (err error) {
		rows, err = x.claimTx(ctx, q, p, before, query, args, front)
		return err
	})
	return rows, err
}

// recordApart runs a claim's recording (MySQL/MariaDB) before its
// transaction, and commits it: one statement on its own (the usual
// recording, the sent rows of the batches that returned), several in a
// transaction. In the claim's transaction the recording left the rows it
// marked uncommitted for the whole claim, and a claim running beside it
// (relay.Config.ParallelClaims) then read, for every index entry of a
// page it had changed, the clustered record and that row's older version
// from the undo log, to see past the change: measured on MariaDB 10.11
// draining a 50k backlog, 96-100 buffer-pool page reads per row drained
// against 71-74 apart, and drains 0.96-1.28x as fast apart (four pairs;
// few keys up to 1.8x), for a commit more per batch. The claim still
// sees what the recording changed. The lone mark-sent commits on its own
// (autocommit), at the session's isolation level: at MySQL's default
// REPEATABLE READ an UPDATE by primary key locks the rows it finds, and
// the gap of an id that is gone (a row deleted meanwhile), nothing else.
func (x *Driver) recordApart(ctx context.Context, stmts []driverutil.Stmt) (driver.Recorded, error) {
	if len(stmts) == 1 && stmts[0].Kind == driverutil.KindSent {
		var rec driver.Recorded
		err := runStmts(ctx, x.db, stmts, &rec) // autocommit
		return rec, err
	}
	return x.recordTx(ctx, stmts)
}

// claimTx runs a claim in one transaction, the statements before
// (driverutil.ClaimRecordStmts) first: query (PostgreSQL), or the steps
// of driverutil.ClaimInTx.
func (x *Driver) claimTx(ctx context.Context, q *dialect.RelayQueries, p driver.ClaimParams, before []driverutil.Stmt, query string, args []any, front bool) ([]driver.Row, error) {
	tx, err := x.beginRelayTx(ctx)
	if err != nil {
		return nil, fmt.Errorf("sqldriver: claim: begin: %w", err)
	}
	defer tx.Rollback() //nolint:errcheck // no-op after Commit
	var rec driver.Recorded
	if err := runStmts(ctx, tx, before, &rec); err != nil {
		return nil, err
	}
	var rows []driver.Row
	var moved int
	var pos driver.ScanPos
	if q.ClaimInTransaction() {
		if rows, moved, err = driverutil.ClaimInTx(ctx, driverutil.TxQuerier(tx), q, p); err != nil {
			err = fmt.Errorf("sqldriver: %w", err)
		}
	} else {
		var rs *sql.Rows
		if rs, err = tx.QueryContext(ctx, query, args...); err != nil {
			err = fmt.Errorf("sqldriver: claim: %w", err)
		} else {
			rows, moved, pos, err = scanClaimRows(rs, p.Owner, front)
		}
	}
	if err != nil {
		return nil, err
	}
	if len(rows) == 0 && moved == 0 && len(before) == 0 {
		return nil, nil // rollback releases the locks
	}
	if err := tx.Commit(); err != nil {
		return nil, fmt.Errorf("sqldriver: claim: commit: %w", err)
	}
	if p.Result != nil {
		p.Result.Moved, p.Result.Front = moved, pos
		if len(before) > 0 {
			p.Result.Recorded = rec
		}
	}
	driverutil.SortRows(rows)
	return rows, nil
}

// beginRelayTx starts the transaction of a claim or a recording. MySQL
// runs it READ COMMITTED: the claim's blocked-check must see rows
// committed after its locking read, and it takes no gap locks. (The lone
// mark-sent of recordApart runs autocommit at the session's level: an
// UPDATE by primary key that reads nothing else.) SQLite's
// transaction (BEGIN IMMEDIATE, see runtime/dsn) holds the write lock
// throughout.
func (x *Driver) beginRelayTx(ctx context.Context) (*sql.Tx, error) {
	var opts *sql.TxOptions
	if x.d == dialect.MySQL {
		opts = &sql.TxOptions{Isolation: sql.LevelReadCommitted}
	}
	return x.db.BeginTx(ctx, opts)
}

// runStmts runs recording statements in tx (a *sql.Tx, or the *sql.DB
// for one statement on its own) and counts what they changed into rec.
func runStmts(ctx context.Context, tx interface {
	ExecContext(context.Context, string, ...any) (sql.Result, error)
}, stmts []driverutil.Stmt, rec *driver.Recorded) error {
	for _, s := range stmts {
		res, err := tx.ExecContext(ctx, s.Query, s.Args...)
		if err != nil {
			return fmt.Errorf("sqldriver: %s: %w", s.Describe(), err)
		}
		n, err := res.RowsAffected()
		if err != nil {
			return fmt.Errorf("sqldriver: %s: rows affected: %w", s.Describe(), err)
		}
		s.Count(rec, n)
	}
	return nil
}

// Record writes r in one transaction (one commit).
func (x *Driver) Record(ctx context.Context, owner string, r driver.Results) (driver.Recorded, error) {
	if err := driverutil.CheckRecord("sqldriver", owner, &r); err != nil || r.Empty() {
		return driver.Recorded{}, err
	}
	q, err := x.relayQ.Get(nil)
	if err != nil {
		return driver.Recorded{}, fmt.Errorf("sqldriver: record: %w", err)
	}
	return x.recordTx(ctx, driverutil.RecordStmts(q, owner, &r, true))
}

// recordTx runs the statements of a recording in one transaction and
// commits it.
func (x *Driver) recordTx(ctx context.Context, stmts []driverutil.Stmt) (driver.Recorded, error) {
	tx, err := x.beginRelayTx(ctx)
	if err != nil {
		return driver.Recorded{}, fmt.Errorf("sqldriver: record: begin: %w", err)
	}
	defer tx.Rollback() //nolint:errcheck // no-op after Commit
	var rec driver.Recorded
	if err := runStmts(ctx, tx, stmts, &rec); err != nil {
		return driver.Recorded{}, err
	}
	if err := tx.Commit(); err != nil {
		return driver.Recorded{}, fmt.Errorf("sqldriver: record: commit: %w", err)
	}
	return rec, nil
}

// scanClaimRows scans the rows of a one-statement claim
// (dialect.ClaimColumns, then dialect.FrontColumns when front): the rows
// leased to owner, how many others it held or moved, and its front.
func scanClaimRows(rs *sql.Rows, owner string, front bool) ([]driver.Row, int, driver.ScanPos, error) {
	var pos driver.ScanPos
	var at *driver.ScanPos
	if front {
		at = &pos
	}
	rows, moved, err := driverutil.ScanRelayRows(driverutil.SQLRows{Rows: rs}, owner, nil, at)
	if err != nil {
		return nil, 0, pos, fmt.Errorf("sqldriver: %w", err)
	}
	return rows, moved, pos, nil
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

// MarkSent marks ids sent, fenced by owner's lease: a recording (Record,
// one transaction), so the rows held behind them are due again with it.
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

// ExtendLease pushes the lease of ids still leased to owner to now+lease.
func (x *Driver) ExtendLease(ctx context.Context, owner string, ids []int64, lease time.Duration) (int64, error) {
	return x.execIDs(ctx, "extend lease", ids, func(q *dialect.RelayQueries, part []int64) (string, []any) {
		return q.ExtendLease(owner, part, lease)
	})
}

// ReleaseHeld makes the held rows of the keys of ids due again.
func (x *Driver) ReleaseHeld(ctx context.Context, ids []int64) (int64, error) {
	return x.execIDs(ctx, "release held rows", ids, (*dialect.RelayQueries).ReleaseHeld)
}

// MarkRetry writes each failure with its own fenced UPDATE (each row has
// its own error text and delay), all in one transaction: one commit for
// the batch.
func (x *Driver) MarkRetry(ctx context.Context, owner string, fs []driver.Failure, maxAttempts int) (int64, []int64, error) {
	rec, err := x.Record(ctx, owner, driver.Results{Failures: fs, MaxAttempts: maxAttempts})
	return rec.Retried, rec.Failed, err
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
