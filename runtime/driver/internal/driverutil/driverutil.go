// Package driverutil holds what the driver implementations share: the
// memoized relay statements, timestamp scanning and id-list chunking.
package driverutil

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/outboxgen/outboxgen/runtime/dialect"
	"github.com/outboxgen/outboxgen/runtime/driver"
	"github.com/outboxgen/outboxgen/runtime/internal/dberr"
	"github.com/outboxgen/outboxgen/runtime/outbox"
)

// RelayQueries memoizes the relay statements of one outbox table per set
// of unordered event types (a relay passes the same set on every claim; a
// sweeper may pass another). The zero value is not usable: use
// NewRelayQueries.
type RelayQueries struct {
	d      dialect.Dialect
	table  string
	arrays bool
	m      sync.Map // sorted, joined unordered list -> *dialect.RelayQueries
}

// NewRelayQueries returns the memo for table in dialect d. With arrays,
// the statements bind id lists as one PostgreSQL array (see
// dialect.RelayQueries.ArrayIDs).
func NewRelayQueries(d dialect.Dialect, table string, arrays bool) (*RelayQueries, error) {
	// Build the ordered-only set now: it validates the table name and is
	// the one every caller without unordered types uses.
	q, err := dialect.NewRelayQueries(d, table, nil)
	if err != nil {
		return nil, err
	}
	r := &RelayQueries{d: d, table: table, arrays: arrays}
	if arrays {
		q = q.ArrayIDs()
	}
	r.m.Store("", q)
	return r, nil
}

// Get returns the statements for the unordered event types (in any order,
// duplicates allowed).
func (r *RelayQueries) Get(unordered []string) (*dialect.RelayQueries, error) {
	key := ""
	if len(unordered) > 0 {
		u := slices.Clone(unordered)
		slices.Sort(u)
		u = slices.Compact(u)
		unordered = u
		key = strings.Join(u, "\x00")
	}
	if q, ok := r.m.Load(key); ok {
		return q.(*dialect.RelayQueries), nil
	}
	q, err := dialect.NewRelayQueries(r.d, r.table, unordered)
	if err != nil {
		return nil, err
	}
	if r.arrays {
		q = q.ArrayIDs()
	}
	actual, _ := r.m.LoadOrStore(key, q)
	return actual.(*dialect.RelayQueries), nil
}

// Claim returns the claim statement for p (Claim or ClaimOverdue).
func Claim(q *dialect.RelayQueries, p driver.ClaimParams) (string, []any) {
	hold, young := HoldOf(p), p.HoldBehindSlow
	if young <= 0 {
		young = driver.DefaultHoldBehindSlow
	}
	if WantsFront(q, p) {
		st := p.Stripe
		if st.Of < 2 || st.Index < 0 || st.Index >= st.Of {
			st = driver.Stripe{} // not a stripe: every key
		}
		return q.ClaimFrom(p.Owner, p.Lease, p.Limit, hold, p.OverdueAfter, young, p.From.DueMicros, p.From.ID, st.Of, st.Index)
	}
	if p.OverdueAfter > 0 {
		return q.ClaimOverdue(p.Owner, p.Lease, p.Limit, hold, p.OverdueAfter, young)
	}
	return q.Claim(p.Owner, p.Lease, p.Limit, hold, young)
}

// WantsFront reports whether Claim's statement for p returns the claim's
// front (dialect.FrontColumns): p asks for it or reads from one, and the
// dialect can.
func WantsFront(q *dialect.RelayQueries, p driver.ClaimParams) bool {
	return (p.Front || !p.From.IsZero()) && q.ScansFrom()
}

// HoldOf returns p.Hold, or driver.DefaultHold when it is zero.
func HoldOf(p driver.ClaimParams) time.Duration {
	if p.Hold <= 0 {
		return driver.DefaultHold
	}
	return p.Hold
}

// CheckClaim validates claim parameters; what prefixes the error.
func CheckClaim(what string, p driver.ClaimParams) error {
	switch {
	case p.Owner == "":
		return fmt.Errorf("%s: claim: Owner is empty: name the claiming instance", what)
	case p.Lease <= 0:
		return fmt.Errorf("%s: claim: Lease is %s: use a positive duration", what, p.Lease)
	case p.Limit < 1 || p.Limit > dialect.MaxInList:
		return fmt.Errorf("%s: claim: Limit is %d: use 1 to %d", what, p.Limit, dialect.MaxInList)
	case p.HoldBehindSlow < 0:
		return fmt.Errorf("%s: claim: HoldBehindSlow is %s: use a positive duration (or 0 for %s)", what, p.HoldBehindSlow, driver.DefaultHoldBehindSlow)
	case p.OverdueAfter < 0:
		return fmt.Errorf("%s: claim: OverdueAfter is %s: use 0 (no restriction) or a positive duration", what, p.OverdueAfter)
	case p.Hold < 0:
		return fmt.Errorf("%s: claim: Hold is %s: use 0 (the default) or a positive duration", what, p.Hold)
	case len(p.SkipKeys) > dialect.MaxInList:
		return fmt.Errorf("%s: claim: %d SkipKeys: pass at most %d", what, len(p.SkipKeys), dialect.MaxInList)
	case p.From.ID < 0:
		return fmt.Errorf("%s: claim: From.ID is %d: pass a ClaimResult.Front or the zero ScanPos", what, p.From.ID)
	case p.Owner == dialect.HeldOwner:
		return fmt.Errorf("%s: claim: Owner %q is reserved for held rows: use another instance id", what, p.Owner)
	}
	return CheckRecord(what, p.Owner, p.Record)
}

// FailedID reports whether recording failure f (changed: the fenced
// UPDATE changed its row) with maxAttempts turned the row FAILED.
func FailedID(f driver.Failure, changed bool, maxAttempts int) bool {
	return changed && f.Row.RetryCount+1 >= maxAttempts
}

// SortRows sorts claimed rows by id (UPDATE ... RETURNING has no order).
func SortRows(rows []driver.Row) {
	slices.SortFunc(rows, func(a, b driver.Row) int { return cmp.Compare(a.ID, b.ID) })
}

// Chunks calls f for consecutive slices of ids of at most
// dialect.MaxInList.
func Chunks(ids []int64, f func([]int64) error) error {
	for len(ids) > 0 {
		n := min(len(ids), dialect.MaxInList)
		if err := f(ids[:n]); err != nil {
			return err
		}
		ids = ids[n:]
	}
	return nil
}

// Time scans a timestamp whatever form the database/sql driver returns it
// in: time.Time (pgx; go-sql-driver/mysql with parseTime=true; modernc
// sqlite for DATETIME columns) or text (MySQL without parseTime, SQLite).
// Text and MySQL DATETIME values are taken as UTC (run MySQL sessions in
// UTC, as the DDL says). The result is in UTC; NULL scans as the zero time.
type Time struct{ T time.Time }

var timeLayouts = []string{
	"2006-01-02 15:04:05.999999999",
	"2006-01-02T15:04:05.999999999",
	"2006-01-02 15:04:05.999999999Z07:00",
	time.RFC3339Nano,
	"2006-01-02 15:04:05.999999999 -0700 MST",
}

// Scan implements sql.Scanner.
func (t *Time) Scan(src any) error {
	switch v := src.(type) {
	case nil:
		t.T = time.Time{}
		return nil
	case time.Time:
		t.T = v.UTC()
		return nil
	case []byte:
		return t.parse(string(v))
	case string:
		return t.parse(v)
	}
	return fmt.Errorf("cannot scan %T into a timestamp", src)
}

func (t *Time) parse(s string) error {
	for _, l := range timeLayouts {
		if v, err := time.Parse(l, s); err == nil {
			t.T = v.UTC()
			return nil
		}
	}
	return fmt.Errorf("cannot parse timestamp %q", s)
}

// Checker implements driver.Driver's Check for one driver: it asks the
// server which dialect it is, then reads no row of each table with every
// column the runtime uses. Successes are remembered.
type Checker struct {
	// What prefixes errors: "sqldriver" or "pgxdriver".
	What    string
	Schema  outbox.Schema
	Dialect dialect.Dialect
	// Text runs a query returning one text value.
	Text func(ctx context.Context, query string) (string, error)
	// Probe runs a query and reads its rows, if any.
	Probe func(ctx context.Context, query string) error

	mu        sync.Mutex
	dialectOK bool
	versionOK bool
	tableOK   [4]bool
}

// TextQuery returns a Checker.Text that runs its query with queryRow:
// (*sql.DB).QueryRowContext or (*pgxpool.Pool).QueryRow.
func TextQuery[R interface{ Scan(...any) error }](queryRow func(context.Context, string, ...any) R) func(context.Context, string) (string, error) {
	return func(ctx context.Context, query string) (string, error) {
		var v string
		err := queryRow(ctx, query).Scan(&v)
		return v, err
	}
}

// ProbeQuery returns a Checker.Probe that runs its query with query
// ((*sql.DB).QueryContext or (*pgxpool.Pool).Query) and reads every row.
func ProbeQuery[R interface {
	Next() bool
	Err() error
}](query func(context.Context, string, ...any) (R, error)) func(context.Context, string) error {
	return func(ctx context.Context, q string) error {
		rows, err := query(ctx, q)
		if err != nil {
			return err
		}
		defer closeRows(rows)
		for rows.Next() {
		}
		return rows.Err()
	}
}

// closeRows closes *sql.Rows (Close() error) or pgx.Rows (Close()).
func closeRows(rows any) {
	switch r := rows.(type) {
	case interface{ Close() error }:
		_ = r.Close()
	case interface{ Close() }:
		r.Close()
	}
}

// Check verifies the server's dialect and table t; see driver.Driver.
func (c *Checker) Check(ctx context.Context, t driver.Table) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.dialectOK {
		if err := c.checkDialect(ctx); err != nil {
			return err
		}
		c.dialectOK = true
	}
	if !c.versionOK {
		if err := dialect.CheckSchemaVersion(ctx, c.Dialect, c.Schema.Tables.Outbox, c.What, c.source(), c.Text); err != nil {
			return err
		}
		c.versionOK = true
	}
	if int(t) < 0 || int(t) >= len(c.tableOK) {
		return fmt.Errorf("%s: check: unknown table %d", c.What, t)
	}
	if c.tableOK[t] {
		return nil
	}
	var table, key string
	var cols []string
	switch t {
	case driver.Outbox:
		table, key, cols = c.Schema.Tables.Outbox, "sql.outbox_table", dialect.OutboxColumns
	case driver.Inbox:
		table, key, cols = c.Schema.Tables.Inbox, "sql.inbox_table", dialect.InboxColumns
	case driver.InboxDuplicates:
		table, key, cols = dialect.InboxDuplicateTable(c.Schema.Tables.Inbox), "sql.inbox_table", dialect.InboxDuplicateColumns
	case driver.Archive:
		table, key, cols = c.Schema.Tables.Archive, "sql.archive_table", dialect.OutboxColumns
		if table == "" {
			return &dberr.Error{Class: dberr.Mismatch, Err: fmt.Errorf("%s: no archive table", c.What),
				Advice: fmt.Sprintf("%s declares no sql.archive_table: declare it, regenerate and apply its DDL to archive sent rows, or let the janitor delete them", c.source())}
		}
	}
	if err := c.Probe(ctx, dialect.SelectColumns(table, cols)); err != nil {
		err = fmt.Errorf("%s: check table %s: %w", c.What, table, err)
		if dberr.Classify(err) == dberr.Missing && t == driver.InboxDuplicates {
			return &dberr.Error{Class: dberr.Missing, Err: err, Advice: fmt.Sprintf(
				"table %q (the inbox's record of duplicate deliveries) comes with schema version %d: run `outboxgen migrate -db DSN -f %s up` (or apply the numbered migrations with your migration tool); until then duplicates are not recorded",
				table, dialect.InboxDuplicateVersion, c.source())}
		}
		if dberr.Classify(err) == dberr.Missing {
			return &dberr.Error{Class: dberr.Missing, Err: err, Advice: fmt.Sprintf(
				"table %q (%s in %s) does not exist or lacks columns this runtime needs (%s): apply the schema (`outboxgen schema -f %s -dialect %s` prints it, or run your migrations); if the table has another name, set %s in %s and regenerate",
				table, key, c.source(), strings.Join(cols, ", "), c.source(), c.Dialect, key, c.source())}
		}
		return err
	}
	if q := dialect.ClaimIndexProbe(c.Dialect, table); t == driver.Outbox && q != "" {
		if err := c.Probe(ctx, q); err != nil {
			err = fmt.Errorf("%s: check table %s: %w", c.What, table, err)
			if dberr.Classify(err) == dberr.Missing {
				return &dberr.Error{Class: dberr.Missing, Err: err, Advice: fmt.Sprintf(
					"the claim reads table %q through its indexes %q and %q, and one is missing: create them as outboxgen's DDL does (`outboxgen schema -f %s -dialect %s` prints it)",
					table, dialect.DueIndex(table), dialect.KeyIndex(table), c.source(), c.Dialect)}
			}
			return err
		}
	}
	c.tableOK[t] = true
	return nil
}

func (c *Checker) source() string {
	if c.Schema.Source == "" {
		return "events.yaml"
	}
	return c.Schema.Source
}

// checkDialect asks the server which dialect it is.
func (c *Checker) checkDialect(ctx context.Context) error {
	got, err := dialect.ServerDialect(ctx, c.Dialect, c.Text)
	if err != nil {
		return fmt.Errorf("%s: check the database: %w", c.What, err) // down, say
	}
	if got == "" {
		return &dberr.Error{Class: dberr.Mismatch, Err: fmt.Errorf("%s: the database server is none outboxgen knows", c.What),
			Advice: "outboxgen supports PostgreSQL, MySQL/MariaDB and SQLite; connect to one of them"}
	}
	if got == c.Dialect {
		return nil
	}
	return &dberr.Error{Class: dberr.Mismatch, Err: fmt.Errorf("%s: the driver runs %s SQL on a %s database", c.What, c.Dialect, got),
		Advice: fmt.Sprintf("the database is %s, not %s as its driver was set up for: %s", got, c.Dialect, dialectAdvice(c.Schema, got))}
}

func dialectAdvice(s outbox.Schema, got dialect.Dialect) string {
	src := s.Source
	if src == "" {
		src = "events.yaml"
	}
	if s.Has(got) {
		return "pass the schema narrowed to the database's dialect (Schema.Only(outbox." + dialectIdent(got) + ")), or connect to the database you meant"
	}
	return fmt.Sprintf("connect to the database you meant, or add %s to sql.dialects in %s, regenerate and apply its schema", got, src)
}

func dialectIdent(d dialect.Dialect) string {
	switch d {
	case dialect.Postgres:
		return "Postgres"
	case dialect.MySQL:
		return "MySQL"
	}
	return "SQLite"
}

// ConflictTries is dberr.ConflictTries: how many times the drivers run
// a transaction the database rolls back as a conflict.
const ConflictTries = dberr.ConflictTries

// RetryConflicts runs tx up to tries times while it fails as a deadlock
// victim or serialization failure (dberr.Conflict): the database rolled
// the transaction back whole, so running it again is safe. Transactions
// retried at once tend to collide again with the same ones, so it waits
// a few random milliseconds first, longer each time. It returns tx's last
// error.
func RetryConflicts(ctx context.Context, tries int, tx func() error) error {
	for attempt := 1; ; attempt++ {
		err := tx()
		if err == nil || attempt >= tries || !dberr.Conflict(err) || ctx.Err() != nil {
			return err
		}
		t := time.NewTimer(dberr.ConflictPause(attempt, time.Millisecond))
		select {
		case <-ctx.Done():
			t.Stop()
			return err
		case <-t.C:
		}
	}
}
