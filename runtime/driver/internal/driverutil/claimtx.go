package driverutil

// The claim of the dialects that claim in several statements of one
// transaction (dialect.RelayQueries.ClaimInTransaction: MySQL/MariaDB and
// SQLite), over Querier: sqldriver runs it in the transaction of its
// Claim; drivertest, in a transaction it keeps open, to meet a claim
// before its commit.

import (
	"context"
	"database/sql"
	"fmt"
	"slices"
	"strings"

	"github.com/outboxgen/outboxgen/runtime/dialect"
	"github.com/outboxgen/outboxgen/runtime/driver"
)

// ClaimInTx claims in tx: lock the window, find the rows that must wait
// (ClaimBlocked), hold those, lease the rest. It returns the leased rows
// (in due order) and how many rows it held. The caller commits tx, or
// rolls it back when nothing was leased or held (that releases the
// locks). Its errors start with "claim:".
func ClaimInTx(ctx context.Context, tx Querier, q *dialect.RelayQueries, p driver.ClaimParams) ([]driver.Row, int, error) {
	rows, free, err := claimWindow(ctx, tx, q, p)
	if err != nil || len(rows) == 0 {
		return nil, 0, err
	}
	ids := make([]int64, len(rows))
	for i, r := range rows {
		ids[i] = r.ID
	}
	if free {
		return claimLease(ctx, tx, q, p, rows, ids, 0)
	}
	query, args := q.ClaimBlocked(ids, HoldOf(p))
	brs, err := tx.Query(ctx, query, args...)
	if err != nil {
		return nil, 0, fmt.Errorf("claim: per-key check: %w", err)
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
			return nil, 0, fmt.Errorf("claim: per-key check: %w", err)
		}
		blocked[h.id] = true
		if h.until != nil {
			held = append(held, h)
		}
	}
	brs.Close()
	if err := brs.Err(); err != nil {
		return nil, 0, fmt.Errorf("claim: per-key check: %w", err)
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
	if q.HoldsEach() && len(held) > 0 {
		// One statement, each row with its own value.
		hids := make([]int64, len(held))
		until := make([]any, len(held))
		for i, h := range held {
			hids[i], until[i] = h.id, h.until
		}
		query, args = q.ClaimHold(until, hids)
		if _, err := tx.Exec(ctx, query, args...); err != nil {
			return nil, 0, fmt.Errorf("claim: hold: %w", err)
		}
		return claimLease(ctx, tx, q, p, rows, ids, len(held))
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
		if _, err := tx.Exec(ctx, query, args...); err != nil {
			return nil, 0, fmt.Errorf("claim: hold: %w", err)
		}
	}
	return claimLease(ctx, tx, q, p, rows, ids, len(held))
}

// claimLease leases the locked, unblocked rows (ids) in tx and returns
// them with held, the count of rows the claim held.
func claimLease(ctx context.Context, tx Querier, q *dialect.RelayQueries, p driver.ClaimParams, rows []driver.Row, ids []int64, held int) ([]driver.Row, int, error) {
	if len(rows) > 0 {
		query, args := q.ClaimLease(p.Owner, p.Lease, ids)
		if _, err := tx.Exec(ctx, query, args...); err != nil {
			return nil, 0, fmt.Errorf("claim: lease: %w", err)
		}
	}
	return rows, held, nil
}

// claimWindow locks the claim's window in tx and returns its rows: the
// claim statement (RelayClaim) on its own, or, on MySQL/MariaDB, the
// candidates read without locks, then locked by id (see
// RelayQueries.ClaimByCandidates). free reports that what ClaimLock read
// of their keys shows every row free to lease (dialect.FreeToLease);
// false from RelayClaim.
func claimWindow(ctx context.Context, tx Querier, q *dialect.RelayQueries, p driver.ClaimParams) (rows []driver.Row, free bool, err error) {
	if !q.ClaimByCandidates() {
		query, args := Claim(q, p)
		rs, err := tx.Query(ctx, query, args...)
		if err != nil {
			return nil, false, fmt.Errorf("claim: %w", err)
		}
		rows, _, err := ScanRelayRows(rs, "", nil, nil)
		return rows, false, err
	}
	// lock locks up to the limit of cands and returns them, but for those
	// behind a candidate of their key it did not lock (their keys in
	// taken: see dialect.BehindNotLocked).
	lock := func(cands []dialect.Candidate) (rows []driver.Row, free bool, taken []string, err error) {
		if len(cands) == 0 {
			return nil, false, nil, nil
		}
		ids := make([]int64, len(cands))
		for i, c := range cands {
			ids[i] = c.ID
		}
		lq, largs := q.ClaimLock(ids, p.Limit)
		rs, err := tx.Query(ctx, lq, largs...)
		if err != nil {
			return nil, false, nil, fmt.Errorf("claim: lock: %w", err)
		}
		probes := []dialect.LockProbe{}
		if rows, _, err = ScanRelayRows(rs, "", &probes, nil); err != nil {
			return nil, false, nil, err
		}
		behind, taken := dialect.BehindNotLocked(cands, probes)
		if behind != nil {
			rows = slices.DeleteFunc(rows, func(r driver.Row) bool { return behind[r.ID] })
			probes = slices.DeleteFunc(probes, func(r dialect.LockProbe) bool { return behind[r.ID] })
		}
		return rows, dialect.FreeToLease(cands, probes), taken, nil
	}
	// Twice the limit: rows that claims running beside this one have
	// locked but not leased yet are candidates too.
	want := min(2*p.Limit, dialect.MaxInList)
	cq, cargs := q.ClaimCandidates(want, p.OverdueAfter, p.SkipKeys)
	cands, err := queryCandidates(ctx, tx, cq, cargs)
	if err != nil {
		return nil, false, fmt.Errorf("claim: candidates: %w", err)
	}
	rows, free, taken, err := lock(cands)
	if err != nil || len(rows) == p.Limit || len(cands) < want {
		return rows, free, err
	}
	// Other claims hold more than half of the candidates, and more rows
	// may be due after them: the window read with locks skips what they
	// hold (and returns this claim's own rows again), and the keys whose
	// next rows another claim holds; rows locked above and not in it stay
	// locked, unleased, until the commit (pending and not among the rows
	// returned, they keep the rows of their keys behind them from
	// counting as free: see FreeToLease).
	skip := p.SkipKeys
	if len(taken) > 0 {
		skip = append(slices.Clip(skip), taken...)
		skip = skip[:min(len(skip), dialect.MaxInList)]
	}
	query, args := q.ClaimWindow(p.Limit, p.OverdueAfter, skip)
	if cands, err = queryCandidates(ctx, tx, query, args); err != nil {
		return nil, false, fmt.Errorf("claim: %w", err)
	}
	rows, free, _, err = lock(cands)
	return rows, free, err
}

// queryCandidates runs a window statement of MySQL/MariaDB (ClaimCandidates,
// or Claim), which returns ids and keys, in tx.
func queryCandidates(ctx context.Context, tx Querier, query string, args []any) ([]dialect.Candidate, error) {
	rs, err := tx.Query(ctx, query, args...)
	if err != nil {
		return nil, err
	}
	defer rs.Close()
	var out []dialect.Candidate
	for rs.Next() {
		var c dialect.Candidate
		if err := rs.Scan(&c.ID, &c.Key); err != nil {
			return nil, err
		}
		out = append(out, c)
	}
	return out, rs.Err()
}

// ScanRelayRows scans claimed rows (dialect.RelayColumns) read through
// database/sql, and closes rs. With owner set, the statement is a
// one-statement claim, which also returns lease_owner
// (dialect.ClaimColumns), and rows whose lease_owner is not owner (held
// or moved rows) are left out and counted; with front set too, it returns
// its front (dialect.FrontColumns), into *front. With probes set, it is
// ClaimLock's (two more columns, dialect.LockProbe), and the probes are
// appended to *probes. Its errors start with "claim:".
func ScanRelayRows(rs Rows, owner string, probes *[]dialect.LockProbe, front *driver.ScanPos) (out []driver.Row, moved int, err error) {
	defer rs.Close()
	for rs.Next() {
		var r driver.Row
		var created Time
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
			dest = append(dest, &probe.OutsideFront, &probe.FailedBefore)
		}
		if err := rs.Scan(dest...); err != nil {
			return nil, 0, fmt.Errorf("claim: scan: %w", err)
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
			probe.ID, probe.Key = r.ID, r.Key
			*probes = append(*probes, probe)
		}
	}
	if err := rs.Err(); err != nil {
		return nil, 0, fmt.Errorf("claim: %w", err)
	}
	return out, moved, nil
}
