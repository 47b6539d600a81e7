package driverutil

// The operator methods of driver.Driver (Overview, FindEvents, GetEvent,
// Replay, FindInbox, ForgetInbox), written once over Querier, which both
// drivers adapt their handle to.

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/outboxgen/outboxgen/runtime/dialect"
	"github.com/outboxgen/outboxgen/runtime/driver"
)

// Rows is what both *sql.Rows and pgx.Rows offer (Close adapted).
type Rows interface {
	Next() bool
	Scan(dest ...any) error
	Err() error
	Close()
}

// Querier runs statements on the driver's database handle.
type Querier interface {
	// Query runs a statement that returns rows.
	Query(ctx context.Context, query string, args ...any) (Rows, error)
	// Exec runs a statement and returns the rows it changed.
	Exec(ctx context.Context, query string, args ...any) (int64, error)
}

// Admin implements the operator methods for one driver.
type Admin struct {
	// What prefixes errors: "sqldriver" or "pgxdriver".
	What string
	Q    Querier
	// Queries are the operator statements; Ops the monitor's (Stats).
	Queries *dialect.AdminQueries
	Ops     *dialect.OpsQueries
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

// Replay implements driver.Driver.
func (a *Admin) Replay(ctx context.Context, ids []int64) (int64, error) {
	var total int64
	err := Chunks(ids, func(c []int64) error {
		q, args := a.Queries.Replay(c)
		n, err := a.Q.Exec(ctx, q, args...)
		total += n
		return err
	})
	if err != nil {
		return total, a.errf("replay", err)
	}
	return total, nil
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

// ForgetInbox implements driver.Driver.
func (a *Admin) ForgetInbox(ctx context.Context, consumer string, eventIDs []string) (int64, error) {
	if consumer == "" {
		return 0, a.errf("forget inbox rows", errors.New("no consumer named"))
	}
	var total int64
	for len(eventIDs) > 0 {
		n := min(len(eventIDs), dialect.MaxInList)
		q, args := a.Queries.ForgetInbox(consumer, eventIDs[:n])
		c, err := a.Q.Exec(ctx, q, args...)
		total += c
		if err != nil {
			return total, a.errf("forget inbox rows", err)
		}
		eventIDs = eventIDs[n:]
	}
	return total, nil
}
