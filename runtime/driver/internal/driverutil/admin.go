package driverutil

// The operator methods of driver.Driver (Overview, FindEvents, GetEvent,
// Requeue, Replay, DeleteFailed, FindInbox, ForgetInbox, and the console's
// Leases, BlockedKeys, InboxConsumers, RecentDuplicates), written once over
// Querier, which both drivers adapt their handle to.

import (
	"cmp"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/outboxgen/outboxgen/runtime/dialect"
	"github.com/outboxgen/outboxgen/runtime/driver"
	"github.com/outboxgen/outboxgen/runtime/internal/dberr"
)

// Rows is what both *sql.Rows and pgx.Rows offer (Close adapted).
type Rows interface {
	Next() bool
	Scan(dest ...any) error
	Err() error
	Close()
}

// Querier runs statements on the driver's database handle, or in one
// transaction of it.
type Querier interface {
	// Query runs a statement that returns rows.
	Query(ctx context.Context, query string, args ...any) (Rows, error)
	// Exec runs a statement and returns the rows it changed.
	Exec(ctx context.Context, query string, args ...any) (int64, error)
	// InTx runs f in one transaction (MySQL: READ COMMITTED, as the
	// relay's) and commits it when f returns nil; otherwise, or when ctx
	// ends, it rolls back and nothing f did happened.
	InTx(ctx context.Context, f func(tx Querier) error) error
}

// QueryIDs runs query, which returns one id column, in tx.
func QueryIDs(ctx context.Context, tx Querier, query string, args []any) ([]int64, error) {
	rs, err := tx.Query(ctx, query, args...)
	if err != nil {
		return nil, err
	}
	defer rs.Close()
	var ids []int64
	for rs.Next() {
		var id int64
		if err := rs.Scan(&id); err != nil {
			return nil, err
		}
		ids = append(ids, id)
	}
	return ids, rs.Err()
}

// Admin implements the operator methods for one driver.
type Admin struct {
	// What prefixes errors: "sqldriver" or "pgxdriver".
	What string
	Q    Querier
	// Queries are the operator statements; Ops the monitor's (Stats).
	Queries *dialect.AdminQueries
	Ops     *dialect.OpsQueries
	// Relay are the relay's statements (Requeue, ReleaseHeld); set by the
	// driver after NewAdmin.
	Relay *RelayQueries
	// Check is the driver's Check: the optional duplicate table
	// (driver.InboxDuplicates) is used only when it passes. Set by the
	// driver after NewAdmin.
	Check func(ctx context.Context, t driver.Table) error
}

// NewAdmin returns the operator methods of dialect d for tables.
func NewAdmin(what string, q Querier, d dialect.Dialect, tables driver.Tables) (*Admin, error) {
	aq, err := dialect.NewAdminQueries(d, tables.Outbox, tables.Inbox)
	if err != nil {
		return nil, err
	}
	oq, err := dialect.NewOpsQueries(d, tables.Outbox, tables.Inbox)
	if err != nil {
		return nil, err
	}
	return &Admin{What: what, Q: q, Queries: aq, Ops: oq}, nil
}

func (a *Admin) errf(what string, err error) error {
	return fmt.Errorf("%s: %s: %w", a.What, what, err)
}

// one runs a query expected to return one row and scans it.
func (a *Admin) one(ctx context.Context, query string, args []any, dest ...any) error {
	rows, err := a.Q.Query(ctx, query, args...)
	if err != nil {
		return err
	}
	defer rows.Close()
	if !rows.Next() {
		if err := rows.Err(); err != nil {
			return err
		}
		return sql.ErrNoRows
	}
	if err := rows.Scan(dest...); err != nil {
		return err
	}
	return rows.Err()
}

// each runs a query and calls scan for every row.
func (a *Admin) each(ctx context.Context, query string, args []any, scan func(Rows) error) error {
	rows, err := a.Q.Query(ctx, query, args...)
	if err != nil {
		return err
	}
	defer rows.Close()
	for rows.Next() {
		if err := scan(rows); err != nil {
			return err
		}
	}
	return rows.Err()
}

// Seconds converts an age in seconds to a duration, clamped at 0
// (PostgreSQL's now() is the transaction start, so a row committed a
// moment later looks younger than zero).
func Seconds(s float64) time.Duration {
	if s <= 0 {
		return 0
	}
	return time.Duration(s * float64(time.Second))
}

// Overview implements driver.Driver.
func (a *Admin) Overview(ctx context.Context, p driver.OverviewParams) (driver.Overview, error) {
	var o driver.Overview
	if p.Window <= 0 {
		p.Window = time.Hour
	}
	if p.ScanRows <= 0 {
		p.ScanRows = 100000
	}
	if p.MaxGroups <= 0 {
		p.MaxGroups = 100
	}
	q, args := a.Ops.Stats(p.StaleAfter)
	var age float64
	if err := a.one(ctx, q, args, &o.Pending, &age, &o.Stale, &o.Failed, &o.ExpiredLeases); err != nil {
		return o, a.errf("overview: counts", err)
	}
	o.OldestPendingAge = Seconds(age)
	q, args = a.Queries.PendingStates()
	if err := a.one(ctx, q, args, &o.BackingOff, &o.InFlight, &o.Relays); err != nil {
		return o, a.errf("overview: pending states", err)
	}
	q, args = a.Queries.FailedGroups(p.MaxGroups)
	err := a.each(ctx, q, args, func(r Rows) error {
		var g driver.FailedGroup
		var last Time
		if err := r.Scan(&g.Type, &g.Topic, &g.Count, &g.FirstID, &last); err != nil {
			return err
		}
		g.LastFailedAt = last.T
		o.FailedGroups = append(o.FailedGroups, g)
		return nil
	})
	if err != nil {
		return o, a.errf("overview: failed per type", err)
	}
	q, args = a.Queries.HeldBack(p.Unordered)
	if err := a.one(ctx, q, args, &o.HeldBackKeys, &o.HeldBackRows); err != nil {
		return o, a.errf("overview: held-back keys", err)
	}
	o.Sent = -1
	if p.CountSent {
		q, args = a.Queries.CountSent()
		if err := a.one(ctx, q, args, &o.Sent); err != nil {
			return o, a.errf("overview: sent rows", err)
		}
	}
	var maxID int64
	q, args = a.Queries.MaxID()
	if err := a.one(ctx, q, args, &maxID); err != nil {
		return o, a.errf("overview: newest id", err)
	}
	o.SentFromID = max(maxID-p.ScanRows, 0)
	q, args = a.Queries.SentPerMinute(o.SentFromID, p.Window)
	err = a.each(ctx, q, args, func(r Rows) error {
		var m driver.MinuteStat
		var minute int64
		var avg, max sql.NullFloat64
		if err := r.Scan(&minute, &m.Sent, &avg, &max); err != nil {
			return err
		}
		m.MinutesAgo, m.AvgLag, m.MaxLag = int(max0(minute)), avg.Float64, max.Float64
		o.SentPerMinute = append(o.SentPerMinute, m)
		return nil
	})
	if err != nil {
		return o, a.errf("overview: sent per minute", err)
	}
	return o, nil
}

func max0(v int64) int64 {
	if v < 0 {
		return 0
	}
	return v
}

// eventDest returns the scan destinations of dialect.EventColumns for e,
// and a function that copies the nullable values into e after the scan.
func eventDest(e *driver.Event) ([]any, func()) {
	var eventID, leaseOwner, lastError sql.NullString
	var status int
	var next, leaseExp, created, updated, sent Time
	dest := []any{&e.ID, &eventID, &e.Type, &e.Key, &e.Topic, &e.Version, &status, &e.RetryCount, &next,
		&leaseOwner, &leaseExp, &lastError, &created, &updated, &sent}
	return dest, func() {
		e.EventID = eventID.String
		e.Status = driver.RowStatus(status)
		e.NextRetryAt, e.LeaseExpiresAt, e.CreatedAt, e.UpdatedAt, e.SentAt = next.T, leaseExp.T, created.T, updated.T, sent.T
		e.LeaseOwner, e.LastError = leaseOwner.String, lastError.String
	}
}

// FindEvents implements driver.Driver.
func (a *Admin) FindEvents(ctx context.Context, f driver.EventFilter) ([]driver.Event, error) {
	q, args, err := a.Queries.FindEvents(f)
	if err != nil {
		return nil, a.errf("find events", err)
	}
	var out []driver.Event
	err = a.each(ctx, q, args, func(r Rows) error {
		var e driver.Event
		dest, done := eventDest(&e)
		if err := r.Scan(dest...); err != nil {
			return err
		}
		done()
		out = append(out, e)
		return nil
	})
	if err != nil {
		return nil, a.errf("find events", err)
	}
	return out, nil
}

// GetEvent implements driver.Driver.
func (a *Admin) GetEvent(ctx context.Context, id int64) (driver.Event, error) {
	q, args := a.Queries.GetEvent(id)
	return a.get(ctx, q, args, fmt.Sprintf("id %d", id))
}

// GetEventByEventID implements driver.Driver.
func (a *Admin) GetEventByEventID(ctx context.Context, eventID string) (driver.Event, error) {
	q, args := a.Queries.GetEventByEventID(eventID)
	return a.get(ctx, q, args, "event id "+eventID)
}

func (a *Admin) get(ctx context.Context, q string, args []any, what string) (driver.Event, error) {
	var e driver.Event
	dest, done := eventDest(&e)
	var payload, headers []byte
	dest = append(dest, &payload, &headers)
	if err := a.one(ctx, q, args, dest...); err != nil {
		if errors.Is(err, sql.ErrNoRows) {
			return e, fmt.Errorf("%s: %w", what, driver.ErrNotFound)
		}
		return e, a.errf("get event "+what, err)
	}
	done()
	e.Payload, e.Headers = payload, headers
	return e, nil
}

// MaxID implements driver.Driver.
func (a *Admin) MaxID(ctx context.Context) (int64, error) {
	var n int64
	q, args := a.Queries.MaxID()
	if err := a.one(ctx, q, args, &n); err != nil {
		return 0, a.errf("read the highest row id", err)
	}
	return n, nil
}

// execChunks runs build's statement for each chunk of ids of at most
// dialect.MaxInList, in tx, and returns the rows changed in all.
func execChunks(ctx context.Context, tx Querier, ids []int64, build func([]int64) (string, []any)) (int64, error) {
	var total int64
	err := Chunks(ids, func(c []int64) error {
		q, args := build(c)
		n, err := tx.Exec(ctx, q, args...)
		total += n
		return err
	})
	return total, err
}

// Requeue implements driver.Driver: every chunk of ids, and the release of
// the rows held behind them, in one transaction.
func (a *Admin) Requeue(ctx context.Context, ids []int64) (int64, error) {
	n, _, err := a.RequeueAndRelease(ctx, ids)
	return n, err
}

// RequeueAndRelease implements driver.Driver: Requeue, which also returns
// how many held rows it released. The first statement of the
// transaction writes (the requeue's UPDATE), so that on SQLite the
// transaction takes the write lock before it reads anything, also when
// the database was opened without _txlock=immediate.
func (a *Admin) RequeueAndRelease(ctx context.Context, ids []int64) (requeued, released int64, err error) {
	if len(ids) == 0 {
		return 0, 0, nil
	}
	q, err := a.Relay.Get(nil)
	if err != nil {
		return 0, 0, a.errf("requeue", err)
	}
	// Two requeues of one key lock its rows in turn, and the database may
	// roll one back as a deadlock victim.
	err = RetryConflicts(ctx, ConflictTries, func() (err error) {
		requeued, released, err = a.requeueAndRelease(ctx, q, ids)
		return err
	})
	if err != nil {
		return 0, 0, a.errf("requeue", err)
	}
	return requeued, released, nil
}

func (a *Admin) requeueAndRelease(ctx context.Context, q *dialect.RelayQueries, ids []int64) (requeued, released int64, err error) {
	err = a.Q.InTx(ctx, func(tx Querier) (err error) {
		requeued, released, err = RequeueInTx(ctx, tx, q, ids)
		return err
	})
	if err != nil {
		return 0, 0, err
	}
	return requeued, released, nil
}

// RequeueInTx runs the statements of Admin.RequeueAndRelease in tx: the
// requeue of every chunk of ids, then the release of the rows held behind
// them (releaseHeld). Exported for drivertest, which runs them in a
// transaction it keeps open while a claim meets their locks.
func RequeueInTx(ctx context.Context, tx Querier, q *dialect.RelayQueries, ids []int64) (requeued, released int64, err error) {
	requeued, err = execChunks(ctx, tx, ids, q.Requeue)
	if err != nil {
		return 0, 0, err
	}
	released, err = releaseHeld(ctx, tx, q, ids)
	if err != nil {
		return 0, 0, err
	}
	return requeued, released, nil
}

// releaseHeld ends the holds behind the rows ids (requeued, or FAILED
// rows about to be deleted), in tx. It first waits for the claims that
// locked a pending row of their keys (one they may hold, or one they hold
// a row behind) to commit: a claim that read a FAILED row before tx may
// still hold a row behind it, and the release, a later statement, sees
// those holds (LockKeys; SQLite has one writer and needs none).
func releaseHeld(ctx context.Context, tx Querier, q *dialect.RelayQueries, ids []int64) (int64, error) {
	if err := Chunks(ids, func(c []int64) error {
		query, args := q.LockKeys(c)
		if query == "" {
			return nil
		}
		rows, err := tx.Query(ctx, query, args...)
		if err != nil {
			return err
		}
		for rows.Next() {
		}
		rows.Close()
		return rows.Err()
	}); err != nil {
		return 0, fmt.Errorf("lock the rows of the keys: %w", err)
	}
	n, err := execChunks(ctx, tx, ids, q.ReleaseHeld)
	if err != nil {
		return 0, fmt.Errorf("release held rows: %w", err)
	}
	return n, nil
}

// Replay implements driver.Driver: every chunk of ids in one transaction.
func (a *Admin) Replay(ctx context.Context, ids []int64) (int64, error) {
	if len(ids) == 0 {
		return 0, nil
	}
	var total int64
	err := a.Q.InTx(ctx, func(tx Querier) error {
		n, err := execChunks(ctx, tx, ids, a.Queries.Replay)
		total = n
		return err
	})
	if err != nil {
		return 0, a.errf("replay", err)
	}
	return total, nil
}

// DeleteFailed implements driver.Driver: lock the FAILED rows among ids,
// release the rows held behind them, delete them, in one transaction.
func (a *Admin) DeleteFailed(ctx context.Context, ids []int64) (deleted, released int64, err error) {
	if len(ids) == 0 {
		return 0, 0, nil
	}
	q, err := a.Relay.Get(nil)
	if err != nil {
		return 0, 0, a.errf("delete failed rows", err)
	}
	// Two deletions (or a deletion and a requeue) of one key lock its
	// rows in turn, and the database may roll one back as a deadlock
	// victim.
	err = RetryConflicts(ctx, ConflictTries, func() (err error) {
		deleted, released, err = a.deleteFailed(ctx, q, ids)
		return err
	})
	if err != nil {
		return 0, 0, a.errf("delete failed rows", err)
	}
	return deleted, released, nil
}

// deleteFailed is one attempt of DeleteFailed: lock the FAILED rows among
// ids, release the rows held behind them, delete them, in one
// transaction.
func (a *Admin) deleteFailed(ctx context.Context, q *dialect.RelayQueries, ids []int64) (deleted, released int64, err error) {
	err = a.Q.InTx(ctx, func(tx Querier) error {
		var failed []int64
		err := Chunks(ids, func(c []int64) error {
			query, args := a.Queries.LockFailed(c)
			locked, err := QueryIDs(ctx, tx, query, args)
			failed = append(failed, locked...)
			return err
		})
		if err != nil {
			return fmt.Errorf("lock: %w", err)
		}
		if len(failed) == 0 {
			return nil
		}
		slices.Sort(failed)
		r, err := releaseHeld(ctx, tx, q, failed)
		if err != nil {
			return err
		}
		n, err := execChunks(ctx, tx, failed, a.Queries.DeleteFailed)
		deleted, released = n, r
		return err
	})
	if err != nil {
		return 0, 0, err
	}
	return deleted, released, nil
}

// FindInbox implements driver.Driver.
func (a *Admin) FindInbox(ctx context.Context, f driver.InboxFilter) ([]driver.InboxRow, error) {
	q, args, err := a.Queries.FindInbox(f)
	if err != nil {
		return nil, a.errf("find inbox rows", err)
	}
	var out []driver.InboxRow
	err = a.each(ctx, q, args, func(r Rows) error {
		var row driver.InboxRow
		var at Time
		if err := r.Scan(&row.Consumer, &row.EventID, &row.Type, &row.Key, &at); err != nil {
			return err
		}
		row.ProcessedAt = at.T
		out = append(out, row)
		return nil
	})
	if err != nil {
		return nil, a.errf("find inbox rows", err)
	}
	return out, nil
}

// ForgetInbox implements driver.Driver: one statement per
// dialect.MaxInList event ids, all in one transaction.
func (a *Admin) ForgetInbox(ctx context.Context, consumer string, eventIDs []string) (int64, error) {
	if consumer == "" {
		return 0, a.errf("forget inbox rows", errors.New("no consumer named"))
	}
	if len(eventIDs) == 0 {
		return 0, nil
	}
	var total int64
	err := a.Q.InTx(ctx, func(tx Querier) error {
		total = 0
		for ids := eventIDs; len(ids) > 0; {
			n := min(len(ids), dialect.MaxInList)
			q, args := a.Queries.ForgetInbox(consumer, ids[:n])
			c, err := tx.Exec(ctx, q, args...)
			if err != nil {
				return err
			}
			total += c
			ids = ids[n:]
		}
		return nil
	})
	if err != nil {
		return 0, a.errf("forget inbox rows", err)
	}
	return total, nil
}

// checkLimit returns an error unless 1 <= limit <= dialect.MaxInList.
func checkLimit(limit int) error {
	if limit < 1 || limit > dialect.MaxInList {
		return fmt.Errorf("limit is %d: use 1 to %d", limit, dialect.MaxInList)
	}
	return nil
}

// Leases implements driver.Driver.
func (a *Admin) Leases(ctx context.Context, limit int) ([]driver.RelayLeases, error) {
	if err := checkLimit(limit); err != nil {
		return nil, a.errf("leases", err)
	}
	q, args := a.Queries.Leases(limit)
	var out []driver.RelayLeases
	err := a.each(ctx, q, args, func(r Rows) error {
		var l driver.RelayLeases
		var first, last, oldest Time
		if err := r.Scan(&l.Owner, &l.Rows, &l.Expired, &first, &last, &oldest); err != nil {
			return err
		}
		l.FirstExpiresAt, l.LastExpiresAt, l.OldestCreatedAt = first.T, last.T, oldest.T
		out = append(out, l)
		return nil
	})
	if err != nil {
		return nil, a.errf("leases", err)
	}
	return out, nil
}

// BlockedKeys implements driver.Driver.
func (a *Admin) BlockedKeys(ctx context.Context, p driver.BlockedKeysParams) ([]driver.BlockedKey, error) {
	if err := checkLimit(p.Limit); err != nil {
		return nil, a.errf("blocked keys", err)
	}
	if len(p.Unordered) > dialect.MaxInList {
		return nil, a.errf("blocked keys", fmt.Errorf("%d unordered types: give at most %d", len(p.Unordered), dialect.MaxInList))
	}
	q, args := a.Queries.BlockedKeys(p.Unordered, p.AfterKey, p.Limit)
	var out []driver.BlockedKey
	err := a.each(ctx, q, args, func(r Rows) error {
		var b driver.BlockedKey
		dest, done := eventDest(&b.Head)
		var oldest Time
		if err := r.Scan(append(dest, &b.Waiting, &oldest)...); err != nil {
			return err
		}
		done()
		b.Key, b.HeadStatus, b.OldestWaitingAt = b.Head.Key, b.Head.Status.String(), oldest.T
		out = append(out, b)
		return nil
	})
	if err != nil {
		return nil, a.errf("blocked keys", err)
	}
	return out, nil
}

// hasDuplicates reports whether the inbox's duplicate table (schema
// version 2) exists: false, nil when it is missing.
func (a *Admin) hasDuplicates(ctx context.Context) (bool, error) {
	if a.Check == nil {
		return false, errors.New("no table check (the driver did not set Admin.Check)")
	}
	err := a.Check(ctx, driver.InboxDuplicates)
	if err != nil && dberr.Classify(err) == dberr.Missing {
		return false, nil
	}
	return err == nil, err
}

// InboxConsumers implements driver.Driver.
func (a *Admin) InboxConsumers(ctx context.Context, window time.Duration, scanRows int64) ([]driver.InboxConsumer, error) {
	if window <= 0 || scanRows < 1 {
		return nil, a.errf("inbox consumers", fmt.Errorf("window %s and scan rows %d: both must be positive", window, scanRows))
	}
	byName := map[string]*driver.InboxConsumer{}
	get := func(name string) *driver.InboxConsumer {
		c := byName[name]
		if c == nil {
			c = &driver.InboxConsumer{Consumer: name}
			byName[name] = c
		}
		return c
	}
	var scanned int64
	q, args := a.Queries.InboxHandled(window, scanRows)
	err := a.each(ctx, q, args, func(r Rows) error {
		var name string
		var n int64
		var last Time
		if err := r.Scan(&name, &n, &last); err != nil {
			return err
		}
		c := get(name)
		c.Handled, c.LastProcessedAt = n, last.T
		scanned += n
		return nil
	})
	if err != nil {
		return nil, a.errf("inbox consumers: handled", err)
	}
	ok, err := a.hasDuplicates(ctx)
	if err != nil {
		return nil, a.errf("inbox consumers", err)
	}
	if ok {
		q, args = a.Queries.InboxDuplicates(window, scanRows)
		err = a.each(ctx, q, args, func(r Rows) error {
			var name string
			var n int64
			var last Time
			if err := r.Scan(&name, &n, &last); err != nil {
				return err
			}
			c := get(name)
			c.Duplicates, c.LastDuplicateAt = n, last.T
			return nil
		})
		if err != nil {
			return nil, a.errf("inbox consumers: duplicates", err)
		}
	}
	out := make([]driver.InboxConsumer, 0, len(byName))
	for _, c := range byName {
		c.Capped = scanned >= scanRows
		out = append(out, *c)
	}
	slices.SortFunc(out, func(x, y driver.InboxConsumer) int { return cmp.Compare(x.Consumer, y.Consumer) })
	return out, nil
}

// RecentDuplicates implements driver.Driver.
func (a *Admin) RecentDuplicates(ctx context.Context, consumer string, limit int) ([]driver.InboxDuplicate, error) {
	if consumer == "" {
		return nil, a.errf("recent duplicates", errors.New("no consumer named"))
	}
	if err := checkLimit(limit); err != nil {
		return nil, a.errf("recent duplicates", err)
	}
	ok, err := a.hasDuplicates(ctx)
	if err != nil || !ok {
		if err != nil {
			err = a.errf("recent duplicates", err)
		}
		return nil, err
	}
	q, args := a.Queries.RecentDuplicates(consumer, limit)
	var out []driver.InboxDuplicate
	err = a.each(ctx, q, args, func(r Rows) error {
		var d driver.InboxDuplicate
		var first, last Time
		if err := r.Scan(&d.Consumer, &d.EventID, &d.Type, &d.Key, &d.Count, &first, &last); err != nil {
			return err
		}
		d.FirstSeenAt, d.LastSeenAt = first.T, last.T
		out = append(out, d)
		return nil
	})
	if err != nil {
		return nil, a.errf("recent duplicates", err)
	}
	return out, nil
}

// DeleteInboxDuplicates implements driver.Driver.
func (a *Admin) DeleteInboxDuplicates(ctx context.Context, olderThan time.Duration, limit int) (int64, error) {
	q, args := a.Ops.DeleteInboxDuplicates(olderThan, limit)
	return a.JanitorExec(ctx, "delete inbox duplicates", q, args)
}

// SentBound returns the highest id the janitor's batches (DeleteSent,
// ArchiveSent) may read for retention olderThan: dialect.SentBound on the
// driver's handle. ok is false when no row is old enough.
func (a *Admin) SentBound(ctx context.Context, olderThan time.Duration) (bound int64, ok bool, err error) {
	bound, ok, err = dialect.SentBound(func() (lo, hi int64, err error) {
		q, args := a.Ops.IDRange()
		err = a.one(ctx, q, args, &lo, &hi)
		return lo, hi, err
	}, func(from int64) (id int64, old, found bool, err error) {
		q, args := a.Ops.BoundProbe(olderThan, from)
		var o int
		err = a.one(ctx, q, args, &id, &o)
		if errors.Is(err, sql.ErrNoRows) {
			return 0, false, false, nil
		}
		return id, o == 1, err == nil, err
	})
	if err != nil {
		return 0, false, a.errf("janitor bound", err)
	}
	return bound, ok, nil
}

// JanitorExec runs one of the janitor's batch statements and returns the
// rows it changed. On MySQL it runs in a READ COMMITTED transaction (InTx,
// as the relay's): at the server's default, REPEATABLE READ, a DELETE ...
// ORDER BY LIMIT takes next-key locks on every row it reads, and the gap
// after the newest row holds up every insert of a pending row (the
// service's own transactions) and the relay's marking until it commits.
func (a *Admin) JanitorExec(ctx context.Context, what, query string, args []any) (n int64, err error) {
	if a.Ops.Dialect() == dialect.MySQL {
		err = a.Q.InTx(ctx, func(tx Querier) error {
			n, err = tx.Exec(ctx, query, args...)
			return err
		})
	} else {
		n, err = a.Q.Exec(ctx, query, args...)
	}
	if err != nil {
		return 0, a.errf(what, err)
	}
	return n, nil
}
