package sqldriver

// The relay's methods: Claim, MarkSent, MarkRetry, Release, ExtendLease,
// and Requeue. Their SQL lives in package dialect (relay.go).

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
// (no UPDATE ... RETURNING) in one short READ COMMITTED transaction: read
// the window's ids without locks, lock them by id (SKIP LOCKED; the
// locking window fills the rest when other claims hold too many of them),
// drop the rows whose older same-key rows another instance holds, lease
// the rest, commit. With p.Record, the
// results are written first in the same transaction: one commit.
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
	// MySQL/MariaDB may pick a claim as a deadlock victim (concurrent
	// claims moving rows in the due index): the transaction was rolled
	// back whole, so it runs again, a few times, before the relay hears
	// of it.
	var rows []driver.Row
	err = driverutil.RetryConflicts(ctx, driverutil.ConflictTries, func() (err error) {
		rows, err = x.claimTx(ctx, q, p, before, query, args, front)
		return err
	})
	return rows, err
}

// claimTx runs a claim in one transaction, the statements before
// (driverutil.ClaimRecordStmts) first.
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
		rows, moved, err = claimSteps(ctx, tx, q, p, query, args)
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
		p.Result.Recorded = rec
	}
	driverutil.SortRows(rows)
	return rows, nil
}

// beginRelayTx starts the transaction of a claim or a recording. MySQL
// runs it READ COMMITTED: the claim's blocked-check must see rows
// committed after its locking read, and it takes no gap locks. SQLite's
// transaction (BEGIN IMMEDIATE, see runtime/dsn) holds the write lock
// throughout.
func (x *Driver) beginRelayTx(ctx context.Context) (*sql.Tx, error) {
	var opts *sql.TxOptions
	if x.d == dialect.MySQL {
		opts = &sql.TxOptions{Isolation: sql.LevelReadCommitted}
	}
	return x.db.BeginTx(ctx, opts)
}

// claimSteps claims in tx on MySQL/MariaDB and SQLite: lock the window,
// find the rows that must wait (ClaimBlocked), hold or move those, lease
// the rest. It returns the leased rows (in due order) and how many rows it
// held or moved.
func claimSteps(ctx context.Context, tx *sql.Tx, q *dialect.RelayQueries, p driver.ClaimParams, query string, args []any) ([]driver.Row, int, error) {
	rows, probes, err := claimWindow(ctx, tx, q, p, query, args)
	if err != nil || len(rows) == 0 {
		return nil, 0, err
	}
	ids := make([]int64, len(rows))
	for i, r := range rows {
		ids[i] = r.ID
	}
	if probes != nil && dialect.FreeToLease(probes) {
		return claimLease(ctx, tx, q, p, rows, ids, 0)
	}
	query, args = q.ClaimBlocked(ids, driverutil.HoldOf(p))
	brs, err := tx.QueryContext(ctx, query, args...)
	if err != nil {
		return nil, 0, fmt.Errorf("sqldriver: claim: per-key check: %w", err)
	}
	type hold struct {
		id    int64
		until any // as read, bound back as read
	}
	blocked := map[int64]bool{}
	var held []hold
	for brs.Next() {
		var h hold
		if err := brs.Scan(&h.id, &h.until); err != nil {
			brs.Close()
			return nil, 0, fmt.Errorf("sqldriver: claim: per-key check: %w", err)
		}
		blocked[h.id] = true
		if h.until != nil {
			held = append(held, h)
		}
	}
	if err := brs.Close(); err != nil {
		return nil, 0, fmt.Errorf("sqldriver: claim: per-key check: %w", err)
	}
	if err := brs.Err(); err != nil {
		return nil, 0, fmt.Errorf("sqldriver: claim: per-key check: %w", err)
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
	// One statement per distinct hold_until (the rows behind FAILED rows
	// share one: the statement's clock).
	groups := map[string][]int64{}
	var order []string
	until := map[string]any{}
	for _, h := range held {
		k := fmt.Sprint(h.until)
		if _, ok := groups[k]; !ok {
			order = append(order, k)
			until[k] = h.until
		}
		groups[k] = append(groups[k], h.id)
	}
	for _, k := range order {
		query, args = q.ClaimHold(until[k], groups[k])
		if _, err := tx.ExecContext(ctx, query, args...); err != nil {
			return nil, 0, fmt.Errorf("sqldriver: claim: hold: %w", err)
		}
	}
	return claimLease(ctx, tx, q, p, rows, ids, len(held))
}

// claimLease leases the locked, unblocked rows (ids) in tx and returns
// them with held, the count of rows the claim held.
func claimLease(ctx context.Context, tx *sql.Tx, q *dialect.RelayQueries, p driver.ClaimParams, rows []driver.Row, ids []int64, held int) ([]driver.Row, int, error) {
	if len(rows) > 0 {
		query, args := q.ClaimLease(p.Owner, p.Lease, ids)
		if _, err := tx.ExecContext(ctx, query, args...); err != nil {
			return nil, 0, fmt.Errorf("sqldriver: claim: lease: %w", err)
		}
	}
	return rows, held, nil
}

// claimWindow locks the claim's window in tx and returns its rows: query
// (RelayClaim) on its own, or, on MySQL/MariaDB, the candidates read
// without locks, then locked by id (see RelayQueries.ClaimByCandidates),
// with what ClaimLock read of their keys (probes; nil from RelayClaim).
func claimWindow(ctx context.Context, tx *sql.Tx, q *dialect.RelayQueries, p driver.ClaimParams, query string, args []any) ([]driver.Row, []dialect.LockProbe, error) {
	if !q.ClaimByCandidates() {
		rs, err := tx.QueryContext(ctx, query, args...)
		if err != nil {
			return nil, nil, fmt.Errorf("sqldriver: claim: %w", err)
		}
		rows, _, err := scanRows(rs, "", nil, nil)
		return rows, nil, err
	}
	lock := func(ids []int64) ([]driver.Row, []dialect.LockProbe, error) {
		if len(ids) == 0 {
			return nil, nil, nil
		}
		lq, largs := q.ClaimLock(ids, p.Limit)
		rs, err := tx.QueryContext(ctx, lq, largs...)
		if err != nil {
			return nil, nil, fmt.Errorf("sqldriver: claim: lock: %w", err)
		}
		probes := []dialect.LockProbe{}
		rows, _, err := scanRows(rs, "", &probes, nil)
		return rows, probes, err
	}
	// Twice the limit: rows that claims running beside this one have
	// locked but not leased yet are candidates too.
	want := min(2*p.Limit, dialect.MaxInList)
	cq, cargs := q.ClaimCandidates(want, p.OverdueAfter)
	ids, err := opsQueryIDs(ctx, tx, cq, cargs)
	if err != nil {
		return nil, nil, fmt.Errorf("sqldriver: claim: candidates: %w", err)
	}
	rows, probes, err := lock(ids)
	if err != nil || len(rows) == p.Limit || len(ids) < want {
		return rows, probes, err
	}
	// Other claims hold more than half of the candidates, and more rows
	// may be due after them: the window read with locks skips what they
	// hold (and returns this claim's own rows again); rows locked above
	// and not in it stay locked, unleased, until the commit (and, not
	// among the rows returned, never count as free: see FreeToLease).
	if ids, err = opsQueryIDs(ctx, tx, query, args); err != nil {
		return nil, nil, fmt.Errorf("sqldriver: claim: %w", err)
	}
	return lock(ids)
}

// runStmts runs recording statements in tx and counts what they changed
// into rec.
func runStmts(ctx context.Context, tx *sql.Tx, stmts []driverutil.Stmt, rec *driver.Recorded) error {
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
	tx, err := x.beginRelayTx(ctx)
	if err != nil {
		return driver.Recorded{}, fmt.Errorf("sqldriver: record: begin: %w", err)
	}
	defer tx.Rollback() //nolint:errcheck // no-op after Commit
	var rec driver.Recorded
	if err := runStmts(ctx, tx, driverutil.RecordStmts(q, owner, &r, true), &rec); err != nil {
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
	rows, moved, err := scanRows(rs, owner, nil, at)
	return rows, moved, pos, err
}

// scanRows scans claimed rows (dialect.RelayColumns). With owner set, the
// statement is a one-statement claim, which also returns lease_owner
// (dialect.ClaimColumns), and rows whose lease_owner is not owner (held or
// moved rows) are left out and counted; with front set too, it returns
// its front (dialect.FrontColumns), into *front.
// With probes set, it is ClaimLock's (two more columns, dialect.LockProbe), and the
// probes are appended to *probes.
func scanRows(rs *sql.Rows, owner string, probes *[]dialect.LockProbe, front *driver.ScanPos) (out []driver.Row, moved int, err error) {
	defer rs.Close()
	for rs.Next() {
		var r driver.Row
		var created driverutil.Time
		dest := []any{&r.ID, &r.EventID, &r.Type, &r.Key, &r.Topic, &r.Version, &r.Payload, &r.Headers, &r.RetryCount, &created}
		var leaseOwner sql.NullString
		var frontUS, frontID sql.NullInt64
		if owner != "" {
			dest = append(dest, &leaseOwner)
		}
		if front != nil {
			dest = append(dest, &frontUS, &frontID)
		}
		var probe dialect.LockProbe
		if probes != nil {
			dest = append(dest, &probe.KeyFront, &probe.FailedBefore)
		}
		if err := rs.Scan(dest...); err != nil {
			return nil, 0, fmt.Errorf("sqldriver: claim: scan: %w", err)
		}
		if frontUS.Valid && frontID.Valid {
			*front = driver.ScanPos{DueMicros: frontUS.Int64, ID: frontID.Int64}
		}
		if owner != "" && leaseOwner.String != owner {
			moved++ // held, or moved back behind an older row of its key
			continue
		}
		r.EventID = strings.ToLower(r.EventID)
		r.CreatedAt = created.T
		out = append(out, r)
		if probes != nil {
			probe.ID = r.ID
			*probes = append(*probes, probe)
		}
	}
	if err := rs.Err(); err != nil {
		return nil, 0, fmt.Errorf("sqldriver: claim: %w", err)
	}
	return out, moved, nil
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
