package driverutil

import (
	"fmt"

	"github.com/outboxgen/outboxgen/runtime/dialect"
	"github.com/outboxgen/outboxgen/runtime/driver"
)

// Stmt is one statement of a recording, with what its row count means.
type Stmt struct {
	Query string
	Args  []any
	// Kind says which count of driver.Recorded the statement's row count
	// adds to; Failure is the failure it records (KindRetry), judged by
	// MaxAttempts (the failure's own limit, or the results').
	Kind        RecordKind
	Failure     driver.Failure
	MaxAttempts int
	// IDs are the rows of a KindRetries statement, for errors.
	IDs []int64
}

// RecordKind is the part of driver.Results a statement records.
type RecordKind int

// The parts of driver.Results.
const (
	KindSent RecordKind = iota
	KindRetry
	// KindRetries records several failures, none of which is its row's
	// last attempt by the row's RetryCount as claimed
	// (dialect.RelayQueries.MarkRetryEach).
	KindRetries
	KindRelease
	// KindUnhold ends the holds behind the recorded rows
	// (ReleaseInFlightHeld, ReleaseOrphanHeld): driver.Recorded.Unheld.
	KindUnhold
)

// RecordStmts returns the statements that record r for owner, sent rows
// first (they unblock other keys soonest), then failures, then releases.
// With chunk, id lists are cut into dialect.MaxInList pieces (statements
// that bind one array take any length).
func RecordStmts(q *dialect.RelayQueries, owner string, r *driver.Results, chunk bool) []Stmt {
	if r.Empty() {
		return nil
	}
	var out []Stmt
	ids := func(list []int64, kind RecordKind, build func([]int64) (string, []any)) {
		if len(list) == 0 {
			return
		}
		if !chunk {
			query, args := build(list)
			out = append(out, Stmt{Query: query, Args: args, Kind: kind})
			return
		}
		_ = Chunks(list, func(part []int64) error {
			query, args := build(part)
			out = append(out, Stmt{Query: query, Args: args, Kind: kind})
			return nil
		})
	}
	ids(r.Sent, KindSent, func(part []int64) (string, []any) { return q.MarkSent(owner, part) })
	var each []dialect.RetryEach
	var eachIDs []int64
	for _, f := range r.Failures {
		limit := f.MaxAttempts(r.MaxAttempts)
		if q.HoldsEach() && limit == r.MaxAttempts && !FailedID(f, true, limit) {
			// Not its last attempt: with the others in one statement,
			// whose total count is all Recorded needs of them. (A row
			// whose stored retry_count is ahead of the claimed one still
			// becomes FAILED, unreported, as with its own MarkRetry.)
			each = append(each, dialect.RetryEach{ID: f.Row.ID, Error: f.Error, Delay: f.Delay})
			eachIDs = append(eachIDs, f.Row.ID)
			continue
		}
		query, args := q.MarkRetry(owner, f.Row.ID, f.Error, f.Delay, limit)
		out = append(out, Stmt{Query: query, Args: args, Kind: KindRetry, Failure: f, MaxAttempts: limit})
	}
	for len(each) > 0 {
		n := min(len(each), dialect.MaxInList)
		query, args := q.MarkRetryEach(owner, each[:n], r.MaxAttempts)
		out = append(out, Stmt{Query: query, Args: args, Kind: KindRetries, IDs: eachIDs[:n]})
		each, eachIDs = each[n:], eachIDs[n:]
	}
	ids(r.Release, KindRelease, func(part []int64) (string, []any) { return q.Release(owner, part) })
	if q.HoldsInFlight() {
		// After the statements above: they lock the recorded rows, so a
		// claim holding rows behind one of them has committed its holds.
		rec := make([]int64, 0, len(r.Sent)+len(r.Failures)+len(r.Release))
		rec = append(rec, r.Sent...)
		for _, f := range r.Failures {
			rec = append(rec, f.Row.ID)
		}
		rec = append(rec, r.Release...)
		ids(rec, KindUnhold, q.ReleaseInFlightHeld)
	}
	return out
}

// ClaimRecordStmts returns the statements a claim with p runs before its
// claim statement, in its transaction (on MySQL/MariaDB, sqldriver commits
// them just before it): the orphaned holds' release when
// p.ReleaseOrphans, then the recording of p.Record (RecordStmts).
func ClaimRecordStmts(q *dialect.RelayQueries, p driver.ClaimParams, chunk bool) []Stmt {
	var out []Stmt
	if p.ReleaseOrphans {
		if query, args := q.ReleaseOrphanHeld(); query != "" {
			out = append(out, Stmt{Query: query, Args: args, Kind: KindUnhold})
		}
	}
	if !p.Record.Empty() {
		out = append(out, RecordStmts(q, p.Owner, p.Record, chunk)...)
	}
	return out
}

// Count adds the row count n of statement s to rec.
func (s Stmt) Count(rec *driver.Recorded, n int64) {
	switch s.Kind {
	case KindSent:
		rec.Sent += n
	case KindRetry:
		rec.Retried += n
		if FailedID(s.Failure, n > 0, s.MaxAttempts) {
			rec.Failed = append(rec.Failed, s.Failure.Row.ID)
		}
	case KindRetries:
		rec.Retried += n
	case KindRelease:
		rec.Released += n
	case KindUnhold:
		rec.Unheld += n
	}
}

// Describe names what s records, for errors.
func (s Stmt) Describe() string {
	switch s.Kind {
	case KindSent:
		return "mark sent"
	case KindRetry:
		return fmt.Sprintf("record failure of row %d", s.Failure.Row.ID)
	case KindRetries:
		if len(s.IDs) > 10 {
			return fmt.Sprintf("record failures of rows %v and %d more", s.IDs[:10], len(s.IDs)-10)
		}
		return fmt.Sprintf("record failures of rows %v", s.IDs)
	case KindUnhold:
		return "end holds behind recorded rows"
	}
	return "release"
}

// CheckRecord validates results to record; what prefixes the error.
func CheckRecord(what, owner string, r *driver.Results) error {
	switch {
	case r.Empty():
		return nil
	case owner == "":
		return fmt.Errorf("%s: record: owner is empty: name the instance that leased the rows", what)
	case len(r.Failures) > 0 && r.MaxAttempts < 1:
		return fmt.Errorf("%s: record: MaxAttempts is %d: use 1 or more", what, r.MaxAttempts)
	}
	return nil
}
