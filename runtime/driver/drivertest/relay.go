// Package drivertest is the conformance suite of driver.Driver, in the
// style of river's riverdrivertest: every implementation runs it against
// a real database from its own tests.
//
//	func TestConformance(t *testing.T) {
//		drivertest.Run(t, func(t *testing.T) drivertest.Env { ... fresh database ... })
//	}
//
// Run covers every method: the relay's (Claim, MarkSent, MarkRetry,
// Release, ExtendLease, Requeue) and the monitor's and
// janitor's (Stats, DeleteSent, ArchiveSent, DeleteInbox).
package drivertest

// The relay's part of the suite. Rows are aged and leases expired by
// moving timestamps with the database clock (OpsAgo), never by sleeping,
// so no test depends on how fast it runs.

import (
	"context"
	"crypto/rand"
	"database/sql"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/outboxgen/outboxgen/runtime/dialect"
	"github.com/outboxgen/outboxgen/runtime/driver"
)

// Env is one fresh database for Run: a driver on it, with outboxgen's
// schema applied for the driver's Tables, and a database/sql handle on the
// same database for seeding and inspection.
type Env struct {
	Driver driver.Driver
	DB     *sql.DB
}

// Run runs the whole conformance suite. open is called once per subtest
// and must return a driver on a fresh database with the schema applied.
func Run(t *testing.T, open func(t *testing.T) Env) {
	tests := []struct {
		name string
		f    func(t *testing.T, e *env)
	}{
		{"ClaimOrderLimitAndFields", testClaimOrderLimitAndFields},
		{"ClaimParamsChecked", testClaimParamsChecked},
		{"LeaseFencing", testLeaseFencing},
		{"LeaseExpiry", testLeaseExpiry},
		{"Release", testRelease},
		{"ExtendLease", testExtendLease},
		{"PerKeyOrderHotKey", testPerKeyOrderHotKey},
		{"PerKeyOrderAcrossOwners", testPerKeyOrderAcrossOwners},
		{"Unordered", testUnordered},
		{"Backoff", testBackoff},
		{"FailedAtMaxAttempts", testFailedAtMaxAttempts},
		{"FailedPaging", testFailedPaging},
		{"Requeue", testRequeue},
		{"OverdueAfter", testOverdueAfter},
		{"LongIDLists", testLongIDLists},
		{"ConcurrentClaims", testConcurrentClaims},
		{"ClaimSkipsRowsLockedElsewhere", testClaimSkipsLocked},
		{"ClaimSkipKeys", testClaimSkipKeys},
		{"ClaimBesideHeldKeyFront", testClaimBesideHeldKeyFront},
		{"ClaimFromFront", testClaimFromFront},
		{"ClaimStripes", testClaimStripes},
	}
	tests = append(tests, heldTests...)
	tests = append(tests, recordTests...)
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			ev := open(t)
			tc.f(t, &env{Env: ev, d: ev.Driver.Dialect(), table: ev.Driver.Tables().Outbox, ctx: context.Background()})
		})
	}
	runOps(t, open)
}

type env struct {
	Env
	d     dialect.Dialect
	table string
	ctx   context.Context
}

// seedEv is an event to insert; zero fields take defaults.
type seedEv struct {
	Type, Key string
	Headers   string // a JSON object, or "" for NULL
}

// insert inserts evs in one transaction, in order, and returns their ids.
func (e *env) insert(t *testing.T, evs ...seedEv) []int64 {
	t.Helper()
	tx, err := e.DB.BeginTx(e.ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback() //nolint:errcheck
	ins := e.d.InsertEvent(e.table, false)
	var uuids []string
	for i, v := range evs {
		if v.Type == "" {
			v.Type = "ORDER_PAID"
		}
		if v.Key == "" {
			v.Key = "k"
		}
		var headers any
		if v.Headers != "" {
			headers = v.Headers
		}
		id := newUUID()
		if _, err := tx.ExecContext(e.ctx, ins, id, v.Type, v.Key, "topic."+v.Key, 2, fmt.Sprintf(`{"n":%d}`, i), headers); err != nil {
			t.Fatalf("insert: %v", err)
		}
		uuids = append(uuids, id)
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	ids := make([]int64, len(uuids))
	for i, u := range uuids {
		if err := e.DB.QueryRowContext(e.ctx, "SELECT id FROM "+e.table+" WHERE event_id = "+e.d.Placeholder(1), u).Scan(&ids[i]); err != nil {
			t.Fatal(err)
		}
	}
	return ids
}

func newUUID() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	return fmt.Sprintf("%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:16])
}

// set runs "UPDATE table SET <set> WHERE id IN (ids)".
func (e *env) set(t *testing.T, set string, ids ...int64) {
	t.Helper()
	ps := make([]string, len(ids))
	args := make([]any, len(ids))
	for i, id := range ids {
		ps[i], args[i] = e.d.Placeholder(i+1), id
	}
	if _, err := e.DB.ExecContext(e.ctx, "UPDATE "+e.table+" SET "+set+" WHERE id IN ("+strings.Join(ps, ", ")+")", args...); err != nil {
		t.Fatalf("set %s: %v", set, err)
	}
}

// rowState is the relay-relevant state of a row.
type rowState struct {
	Status     int
	RetryCount int
	Owner      sql.NullString
	LastError  sql.NullString
	Due        bool // next_retry_time <= now
	Sent       bool // sent_at is set
}

func (e *env) state(t *testing.T, id int64) rowState {
	t.Helper()
	var s rowState
	var due, sent int
	q := "SELECT status, retry_count, lease_owner, last_error, CASE WHEN next_retry_time <= " + e.d.Now() + " THEN 1 ELSE 0 END," +
		" CASE WHEN sent_at IS NULL THEN 0 ELSE 1 END FROM " + e.table + " WHERE id = " + e.d.Placeholder(1)
	if err := e.DB.QueryRowContext(e.ctx, q, id).Scan(&s.Status, &s.RetryCount, &s.Owner, &s.LastError, &due, &sent); err != nil {
		t.Fatalf("state of row %d: %v", id, err)
	}
	s.Due, s.Sent = due == 1, sent == 1
	return s
}

// lockRows locks rows ids in a transaction of their own, as a claim
// running beside the one under test holds them, and returns it: the
// caller rolls it back. One row at a time: a plan reading more rows than
// it returns (InnoDB) would lock those too.
func (e *env) lockRows(t *testing.T, ids ...int64) *sql.Tx {
	t.Helper()
	tx, err := e.DB.BeginTx(e.ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { tx.Rollback() }) //nolint:errcheck
	for _, id := range ids {
		var got int64
		if err := tx.QueryRowContext(e.ctx, "SELECT id FROM "+e.table+" WHERE id = "+e.d.Placeholder(1)+" FOR UPDATE", id).Scan(&got); err != nil {
			t.Fatal(err)
		}
	}
	return tx
}

func claimP(owner string, limit int) driver.ClaimParams {
	return driver.ClaimParams{Owner: owner, Lease: time.Hour, Limit: limit}
}

func (e *env) claim(t *testing.T, p driver.ClaimParams) []int64 {
	t.Helper()
	rows, err := e.Driver.Claim(e.ctx, p)
	if err != nil {
		t.Fatalf("Claim(%+v): %v", p, err)
	}
	return rowIDs(rows)
}

func rowIDs(rows []driver.Row) []int64 {
	out := []int64{}
	for _, r := range rows {
		out = append(out, r.ID)
	}
	return out
}

func wantIDs(t *testing.T, what string, got, want []int64) {
	t.Helper()
	if want == nil {
		want = []int64{}
	}
	if !slices.Equal(got, want) {
		t.Fatalf("%s: ids %v, want %v", what, got, want)
	}
}

func wantN(t *testing.T, what string, n int64, err error, want int64) {
	t.Helper()
	if err != nil || n != want {
		t.Fatalf("%s = %d, %v; want %d", what, n, err, want)
	}
}

// Claim returns the oldest claimable rows in id order, at most Limit,
// with every column, and leases them; a second owner gets the rest.
func testClaimOrderLimitAndFields(t *testing.T, e *env) {
	if got := e.claim(t, claimP("a", 10)); len(got) != 0 {
		t.Fatalf("claim on an empty table: %v", got)
	}
	ids := e.insert(t, seedEv{Key: "k1", Headers: `{"traceparent":"tp"}`}, seedEv{Key: "k2"}, seedEv{Key: "k3"}, seedEv{Key: "k4"}, seedEv{Key: "k5"})
	rows, err := e.Driver.Claim(e.ctx, claimP("a", 3))
	if err != nil {
		t.Fatal(err)
	}
	wantIDs(t, "first claim", rowIDs(rows), ids[:3])
	r := rows[0]
	if r.Type != "ORDER_PAID" || r.Key != "k1" || r.Topic != "topic.k1" || r.Version != 2 || r.RetryCount != 0 ||
		len(r.EventID) != 36 || r.EventID != strings.ToLower(r.EventID) ||
		strings.ReplaceAll(string(r.Payload), " ", "") != `{"n":0}` || !strings.Contains(string(r.Headers), `"traceparent"`) {
		t.Fatalf("row fields: %+v (payload %s, headers %s)", r, r.Payload, r.Headers)
	}
	if len(rows[1].Headers) != 0 {
		t.Fatalf("NULL headers scanned as %q", rows[1].Headers)
	}
	if r.CreatedAt.IsZero() || r.CreatedAt.Location() != time.UTC || time.Since(r.CreatedAt) > 24*time.Hour || time.Until(r.CreatedAt) > 24*time.Hour {
		t.Fatalf("CreatedAt %v is not a recent UTC time", r.CreatedAt)
	}
	for _, id := range ids[:3] {
		if s := e.state(t, id); s.Owner.String != "a" || s.Status != 0 {
			t.Fatalf("claimed row %d: %+v, want leased to a", id, s)
		}
	}
	wantIDs(t, "second owner", e.claim(t, claimP("b", 10)), ids[3:])
	wantIDs(t, "nothing left", e.claim(t, claimP("c", 10)), nil)
}

// Invalid claim parameters are errors, not silent no-ops.
func testClaimParamsChecked(t *testing.T, e *env) {
	for name, p := range map[string]driver.ClaimParams{
		"no owner":         {Lease: time.Hour, Limit: 1},
		"no lease":         {Owner: "a", Limit: 1},
		"limit 0":          {Owner: "a", Lease: time.Hour},
		"limit too large":  {Owner: "a", Lease: time.Hour, Limit: dialect.MaxInList + 1},
		"negative overdue": {Owner: "a", Lease: time.Hour, Limit: 1, OverdueAfter: -time.Second},
		"too many keys":    {Owner: "a", Lease: time.Hour, Limit: 1, SkipKeys: make([]string, dialect.MaxInList+1)},
	} {
		if _, err := e.Driver.Claim(e.ctx, p); err == nil {
			t.Errorf("%s: Claim(%+v) succeeded", name, p)
		}
	}
	if _, err := e.Driver.FindEvents(e.ctx, driver.EventFilter{Status: int(driver.Failed), Limit: 0}); err == nil {
		t.Error("FindEvents with limit 0 succeeded")
	}
}

// Writes of a stale or foreign owner change nothing; the owner's do, once.
func testLeaseFencing(t *testing.T, e *env) {
	ids := e.insert(t, seedEv{Key: "x"}, seedEv{Key: "y"})
	rows, err := e.Driver.Claim(e.ctx, claimP("a", 10))
	if err != nil || len(rows) != 2 {
		t.Fatalf("claim: %v %v", rows, err)
	}
	n, err := e.Driver.MarkSent(e.ctx, "b", ids)
	wantN(t, "foreign MarkSent", n, err, 0)
	n, failed, err := e.Driver.MarkRetry(e.ctx, "b", []driver.Failure{{Row: rows[0], Error: "late", Delay: time.Hour}}, 1)
	wantN(t, "foreign MarkRetry", n, err, 0)
	if len(failed) != 0 {
		t.Fatalf("foreign MarkRetry reported FAILED ids %v", failed)
	}
	n, err = e.Driver.Release(e.ctx, "b", ids)
	wantN(t, "foreign Release", n, err, 0)
	for _, id := range ids {
		if s := e.state(t, id); s.Owner.String != "a" || s.Status != 0 || s.RetryCount != 0 || s.LastError.Valid {
			t.Fatalf("row %d changed by a foreign owner: %+v", id, s)
		}
	}
	n, err = e.Driver.MarkSent(e.ctx, "a", ids)
	wantN(t, "owner MarkSent", n, err, 2)
	for _, id := range ids {
		if s := e.state(t, id); s.Status != 1 || !s.Sent || s.Owner.Valid {
			t.Fatalf("sent row %d: %+v, want status 1, sent_at set, lease cleared", id, s)
		}
	}
	n, err = e.Driver.MarkSent(e.ctx, "a", ids)
	wantN(t, "MarkSent of sent rows", n, err, 0)
	n, _, err = e.Driver.MarkRetry(e.ctx, "a", []driver.Failure{{Row: rows[0], Error: "late"}}, 1)
	wantN(t, "MarkRetry of a sent row", n, err, 0)
	n, err = e.Driver.Release(e.ctx, "a", ids)
	wantN(t, "Release of sent rows", n, err, 0)
	if n, err := e.Driver.MarkSent(e.ctx, "a", nil); err != nil || n != 0 {
		t.Fatalf("MarkSent(nil) = %d, %v", n, err)
	}
}

// A live lease hides rows from other owners; once it expired they are
// claimable again and the old owner is fenced off.
func testLeaseExpiry(t *testing.T, e *env) {
	ids := e.insert(t, seedEv{Key: "x"}, seedEv{Key: "x"}, seedEv{Key: "y"})
	rows, err := e.Driver.Claim(e.ctx, claimP("dead", 10))
	if err != nil || len(rows) != 3 {
		t.Fatalf("claim: %v %v", rows, err)
	}
	wantIDs(t, "claim under a live lease", e.claim(t, claimP("b", 10)), nil)
	e.set(t, "lease_expires_at = "+OpsAgo(e.d, time.Minute), ids...)
	wantIDs(t, "claim after expiry", e.claim(t, claimP("b", 10)), ids)
	n, err := e.Driver.MarkSent(e.ctx, "dead", ids)
	wantN(t, "expired owner MarkSent", n, err, 0)
	_, failed, err := e.Driver.MarkRetry(e.ctx, "dead", []driver.Failure{{Row: rows[0], Error: "late"}}, 1)
	if err != nil || len(failed) != 0 {
		t.Fatalf("expired owner MarkRetry: %v %v", failed, err)
	}
	if s := e.state(t, ids[0]); s.Owner.String != "b" || s.RetryCount != 0 {
		t.Fatalf("row taken over: %+v, want leased to b, untouched", s)
	}
	n, err = e.Driver.MarkSent(e.ctx, "b", ids)
	wantN(t, "new owner MarkSent", n, err, 3)
}

// Release clears the lease and nothing else: the rows are claimable at
// once, with their retry count unchanged.
func testRelease(t *testing.T, e *env) {
	ids := e.insert(t, seedEv{Key: "x"}, seedEv{Key: "x"})
	e.claim(t, claimP("a", 10))
	n, err := e.Driver.Release(e.ctx, "a", ids)
	wantN(t, "Release", n, err, 2)
	for _, id := range ids {
		if s := e.state(t, id); s.Owner.Valid || s.Status != 0 || s.RetryCount != 0 || s.LastError.Valid || !s.Due {
			t.Fatalf("released row %d: %+v", id, s)
		}
	}
	wantIDs(t, "claim after release", e.claim(t, claimP("b", 10)), ids)
}

// ExtendLease pushes the lease of the owner's own pending rows only: a
// foreign owner extends nothing, sent and released rows stay as they are,
// and an extended lease keeps other owners out past the original one.
func testExtendLease(t *testing.T, e *env) {
	ids := e.insert(t, seedEv{Key: "x"}, seedEv{Key: "x"}, seedEv{Key: "y"}, seedEv{Key: "z"})
	rows, err := e.Driver.Claim(e.ctx, driver.ClaimParams{Owner: "a", Lease: time.Hour, Limit: 3})
	if err != nil || len(rows) != 3 {
		t.Fatalf("claim: %v %v", rowIDs(rows), err)
	}
	// The lease lapsed (moved rather than slept), nobody took the rows yet.
	e.set(t, "lease_expires_at = "+OpsAgo(e.d, time.Second), ids[:3]...)
	n, err := e.Driver.ExtendLease(e.ctx, "b", ids, time.Hour)
	wantN(t, "foreign ExtendLease", n, err, 0)
	n, err = e.Driver.MarkSent(e.ctx, "a", ids[2:3])
	wantN(t, "MarkSent", n, err, 1)
	// ids[3] is not claimed: extending it is a no-op too.
	n, err = e.Driver.ExtendLease(e.ctx, "a", ids, time.Hour)
	wantN(t, "owner ExtendLease", n, err, 2)
	if n, err := e.Driver.ExtendLease(e.ctx, "a", nil, time.Hour); err != nil || n != 0 {
		t.Fatalf("ExtendLease(nil) = %d, %v", n, err)
	}
	var live int
	q := "SELECT COUNT(*) FROM " + e.table + " WHERE lease_owner = 'a' AND status = 0 AND lease_expires_at > " + OpsAgo(e.d, -30*time.Minute)
	if err := e.DB.QueryRowContext(e.ctx, q).Scan(&live); err != nil || live != 2 {
		t.Fatalf("rows leased to a for another half hour: %d (%v), want 2", live, err)
	}
	if s := e.state(t, ids[2]); s.Status != 1 || s.Owner.Valid {
		t.Fatalf("sent row after ExtendLease: %+v", s)
	}
	if s := e.state(t, ids[3]); s.Owner.Valid {
		t.Fatalf("unclaimed row leased by ExtendLease: %+v", s)
	}
	wantIDs(t, "claim while the extended lease holds", e.claim(t, claimP("b", 10)), ids[3:])
	// A lapsed lease another owner took over is not extended by the old owner.
	e.set(t, "lease_expires_at = "+OpsAgo(e.d, time.Minute), ids[:2]...)
	wantIDs(t, "takeover", e.claim(t, claimP("c", 10)), ids[:2])
	n, err = e.Driver.ExtendLease(e.ctx, "a", ids, time.Hour)
	wantN(t, "ExtendLease after a takeover", n, err, 0)
	n, err = e.Driver.ExtendLease(e.ctx, "c", ids[:2], time.Hour)
	wantN(t, "new owner ExtendLease", n, err, 2)
	n, err = e.Driver.Release(e.ctx, "c", ids[:2])
	wantN(t, "Release", n, err, 2)
	n, err = e.Driver.ExtendLease(e.ctx, "c", ids[:2], time.Hour)
	wantN(t, "ExtendLease of released rows", n, err, 0)
}

// A hot key is not limited to one row per claim, and a key never runs
// ahead of its oldest unsent row, whatever the limit.
func testPerKeyOrderHotKey(t *testing.T, e *env) {
	var evs []seedEv
	for i := range 12 {
		evs = append(evs, seedEv{Key: "hot"})
		if i%4 == 0 {
			evs = append(evs, seedEv{Key: fmt.Sprintf("cold%d", i)})
		}
	}
	ids := e.insert(t, evs...)
	wantIDs(t, "one claim takes the hot key whole", e.claim(t, claimP("a", 100)), ids)

	// The head of a key backing off or FAILED holds back that key only.
	more := e.insert(t, seedEv{Key: "p"}, seedEv{Key: "q"}, seedEv{Key: "p"}, seedEv{Key: "r"}, seedEv{Key: "r"})
	rows, err := e.Driver.Claim(e.ctx, claimP("b", 1))
	if err != nil || len(rows) != 1 || rows[0].ID != more[0] {
		t.Fatalf("claim limit 1: %v %v", rowIDs(rows), err)
	}
	if _, _, err := e.Driver.MarkRetry(e.ctx, "b", []driver.Failure{{Row: rows[0], Error: "down", Delay: time.Hour}}, 5); err != nil {
		t.Fatal(err)
	}
	wantIDs(t, "p backing off", e.claim(t, claimP("c", 100)), []int64{more[1], more[3], more[4]})
	e.set(t, "status = 2", more[0])
	if n, err := e.Driver.Release(e.ctx, "c", []int64{more[1], more[3], more[4]}); err != nil || n != 3 {
		t.Fatalf("release: %d %v", n, err)
	}
	wantIDs(t, "p FAILED", e.claim(t, claimP("d", 100)), []int64{more[1], more[3], more[4]})
}

// Rows of a key whose older row another owner holds are not claimable
// until that row is sent; then they come in id order.
func testPerKeyOrderAcrossOwners(t *testing.T, e *env) {
	ids := e.insert(t, seedEv{Key: "k"}, seedEv{Key: "k"}, seedEv{Key: "j"}, seedEv{Key: "k"})
	wantIDs(t, "a takes the head", e.claim(t, claimP("a", 1)), ids[:1])
	wantIDs(t, "b skips k", e.claim(t, claimP("b", 100)), ids[2:3])
	wantIDs(t, "c gets nothing", e.claim(t, claimP("c", 100)), nil)
	n, err := e.Driver.MarkSent(e.ctx, "a", ids[:1])
	wantN(t, "a MarkSent", n, err, 1)
	wantIDs(t, "c after the head is sent", e.claim(t, claimP("c", 100)), []int64{ids[1], ids[3]})
}

// Types listed Unordered neither wait for nor hold back their key; the
// driver serves several unordered sets at once.
func testUnordered(t *testing.T, e *env) {
	ids := e.insert(t, seedEv{Key: "k", Type: "VIEWED"}, seedEv{Key: "k", Type: "VIEWED"}, seedEv{Key: "k"}, seedEv{Key: "k"})
	u := []string{"VIEWED", "OTHER"}
	p := claimP("a", 1)
	p.Unordered = u
	wantIDs(t, "a", e.claim(t, p), ids[:1])
	// Ordered-only view: everything of k waits behind the leased head.
	wantIDs(t, "ordered claim", e.claim(t, claimP("b", 100)), nil)
	p = claimP("b", 100)
	p.Unordered = []string{"OTHER", "VIEWED", "VIEWED"} // same set, other spelling
	wantIDs(t, "unordered claim", e.claim(t, p), ids[1:])

	// An unordered row failing holds nothing back.
	more := e.insert(t, seedEv{Key: "m", Type: "VIEWED"}, seedEv{Key: "m"})
	p = claimP("c", 1)
	p.Unordered = u
	rows, err := e.Driver.Claim(e.ctx, p)
	if err != nil || len(rows) != 1 || rows[0].ID != more[0] {
		t.Fatalf("claim: %v %v", rowIDs(rows), err)
	}
	if _, _, err := e.Driver.MarkRetry(e.ctx, "c", []driver.Failure{{Row: rows[0], Error: "x", Delay: time.Hour}}, 5); err != nil {
		t.Fatal(err)
	}
	p = claimP("d", 100)
	p.Unordered = u
	wantIDs(t, "behind a failed unordered row", e.claim(t, p), more[1:])
}

// A failure records retry_count+1, last_error and next_retry_time = now +
// Delay and clears the lease; the row is not claimable before it is due.
func testBackoff(t *testing.T, e *env) {
	ids := e.insert(t, seedEv{Key: "x"}, seedEv{Key: "y"})
	rows, err := e.Driver.Claim(e.ctx, claimP("a", 10))
	if err != nil || len(rows) != 2 {
		t.Fatal(rows, err)
	}
	long := strings.Repeat("é", 3000) // 6000 bytes: stored cut to 2 KB on a rune boundary
	n, failed, err := e.Driver.MarkRetry(e.ctx, "a", []driver.Failure{
		{Row: rows[0], Error: "down: " + long, Delay: time.Hour},
		{Row: rows[1], Error: "blip", Delay: 0},
	}, 5)
	wantN(t, "MarkRetry", n, err, 2)
	if len(failed) != 0 {
		t.Fatalf("FAILED ids %v before max attempts", failed)
	}
	s := e.state(t, ids[0])
	if s.Status != 0 || s.RetryCount != 1 || s.Owner.Valid || s.Due || !strings.HasPrefix(s.LastError.String, "down: é") ||
		len(s.LastError.String) > dialect.ErrorTextLimit || !strings.HasSuffix(s.LastError.String, "é") {
		t.Fatalf("backing-off row: status %d retry %d owner %v due %v error %d bytes", s.Status, s.RetryCount, s.Owner, s.Due, len(s.LastError.String))
	}
	// Delay 0 is due at once; the hour-long backoff is not.
	rows, err = e.Driver.Claim(e.ctx, claimP("b", 10))
	if err != nil || len(rows) != 1 || rows[0].ID != ids[1] || rows[0].RetryCount != 1 {
		t.Fatalf("claim during backoff: %+v %v", rows, err)
	}
	e.set(t, "next_retry_time = "+OpsAgo(e.d, time.Second), ids[0])
	rows, err = e.Driver.Claim(e.ctx, claimP("b", 10))
	if err != nil || len(rows) != 1 || rows[0].ID != ids[0] || rows[0].RetryCount != 1 {
		t.Fatalf("claim after backoff: %+v %v", rows, err)
	}
}

// The failure that reaches maxAttempts turns the row FAILED (status 2) and
// is reported in the failed ids; other failures of the batch are not.
func testFailedAtMaxAttempts(t *testing.T, e *env) {
	ids := e.insert(t, seedEv{Key: "x"}, seedEv{Key: "y"})
	e.set(t, "retry_count = 2", ids[0])
	rows, err := e.Driver.Claim(e.ctx, claimP("a", 10))
	if err != nil || len(rows) != 2 || rows[0].RetryCount != 2 {
		t.Fatal(rows, err)
	}
	n, failed, err := e.Driver.MarkRetry(e.ctx, "a", []driver.Failure{
		{Row: rows[0], Error: "poison", Delay: 0},
		{Row: rows[1], Error: "blip", Delay: 0},
	}, 3)
	wantN(t, "MarkRetry", n, err, 2)
	wantIDs(t, "failed", failed, ids[:1])
	if s := e.state(t, ids[0]); s.Status != 2 || s.RetryCount != 3 || s.Owner.Valid || s.LastError.String != "poison" {
		t.Fatalf("FAILED row: %+v", s)
	}
	if s := e.state(t, ids[1]); s.Status != 0 || s.RetryCount != 1 {
		t.Fatalf("other row: %+v", s)
	}
	wantIDs(t, "FAILED rows are not claimed", e.claim(t, claimP("b", 10)), ids[1:])
}

// FindEvents with status FAILED pages through FAILED rows only, in id
// order (what relay.ListFailed and outboxgen failed list read).
func testFailedPaging(t *testing.T, e *env) {
	ids := e.insert(t, seedEv{Key: "a"}, seedEv{Key: "b"}, seedEv{Key: "c"}, seedEv{Key: "d"}, seedEv{Key: "e"}, seedEv{Key: "f"})
	failedIDs := []int64{ids[0], ids[2], ids[3], ids[4], ids[5]}
	e.set(t, "status = 2, retry_count = 5, last_error = 'boom', updated_at = "+e.d.Now(), failedIDs...)
	e.set(t, "status = 1", ids[1])
	var got []int64
	after := int64(0)
	for page := 0; ; page++ {
		fs, err := e.Driver.FindEvents(e.ctx, driver.EventFilter{Status: int(driver.Failed), AfterID: after, Limit: 2})
		if err != nil {
			t.Fatal(err)
		}
		if len(fs) > 2 || page > 3 {
			t.Fatalf("page %d has %d rows", page, len(fs))
		}
		if len(fs) == 0 {
			break
		}
		for _, f := range fs {
			if f.RetryCount != 5 || f.LastError != "boom" || f.Type != "ORDER_PAID" || f.Topic != "topic."+f.Key ||
				len(f.EventID) != 36 || f.CreatedAt.IsZero() || f.UpdatedAt.IsZero() {
				t.Fatalf("FAILED event %+v", f)
			}
			got = append(got, f.ID)
		}
		after = fs[len(fs)-1].ID
	}
	wantIDs(t, "pages", got, failedIDs)
	fs, err := e.Driver.FindEvents(e.ctx, driver.EventFilter{Status: int(driver.Failed), AfterID: ids[3], Limit: 100})
	if err != nil || len(fs) != 2 || fs[0].ID != ids[4] || fs[0].Key != "e" {
		t.Fatalf("FindEvents of FAILED rows after %d: %+v %v", ids[3], fs, err)
	}
}

// Requeue makes FAILED rows pending, due now, retry_count 0; last_error
// stays; other rows are left alone.
func testRequeue(t *testing.T, e *env) {
	ids := e.insert(t, seedEv{Key: "k"}, seedEv{Key: "k"}, seedEv{Key: "j"})
	e.set(t, "status = 2, retry_count = 5, last_error = 'boom', next_retry_time = "+OpsAgo(e.d, -time.Hour), ids[0])
	wantIDs(t, "key held behind FAILED", e.claim(t, claimP("a", 10)), ids[2:])
	n, err := e.Driver.Requeue(e.ctx, []int64{ids[0], ids[2], 1 << 40})
	wantN(t, "Requeue", n, err, 1)
	if s := e.state(t, ids[0]); s.Status != 0 || s.RetryCount != 0 || !s.Due || s.Owner.Valid || s.LastError.String != "boom" {
		t.Fatalf("requeued row: %+v", s)
	}
	if s := e.state(t, ids[2]); s.Owner.String != "a" {
		t.Fatalf("Requeue touched a pending row: %+v", s)
	}
	n, err = e.Driver.Requeue(e.ctx, ids[:1])
	wantN(t, "second Requeue", n, err, 0)
	wantIDs(t, "key flows again", e.claim(t, claimP("b", 10)), ids[:2])
}

// OverdueAfter claims only rows created at least that long ago (still
// honouring leases, backoff and per-key order); younger rows are left.
func testOverdueAfter(t *testing.T, e *env) {
	ids := e.insert(t,
		seedEv{Key: "old"},      // 0 old
		seedEv{Key: "young"},    // 1 young
		seedEv{Key: "mixed"},    // 2 old head
		seedEv{Key: "mixed"},    // 3 young tail
		seedEv{Key: "leased"},   // 4 old, live lease
		seedEv{Key: "expired"},  // 5 old, expired lease
		seedEv{Key: "backoff"},  // 6 old, backing off
		seedEv{Key: "inverted"}, // 7 young head
		seedEv{Key: "inverted"}, // 8 old tail: must not overtake 7
	)
	e.set(t, "created_at = "+OpsAgo(e.d, 2*time.Hour), ids[0], ids[2], ids[4], ids[5], ids[6], ids[8])
	e.set(t, "lease_owner = 'other', lease_expires_at = "+OpsAgo(e.d, -time.Hour), ids[4])
	e.set(t, "lease_owner = 'dead', lease_expires_at = "+OpsAgo(e.d, time.Minute), ids[5])
	e.set(t, "retry_count = 1, next_retry_time = "+OpsAgo(e.d, -time.Hour), ids[6])
	p := claimP("sweeper", 100)
	p.OverdueAfter = time.Hour
	wantIDs(t, "overdue claim", e.claim(t, p), []int64{ids[0], ids[2], ids[5]})
	wantIDs(t, "again", e.claim(t, p), nil)
	wantIDs(t, "the relay takes the young rows", e.claim(t, claimP("relay", 100)), []int64{ids[1], ids[7], ids[8]})
}

// Id lists longer than dialect.MaxInList work (drivers split or bind them
// whole); unknown ids are ignored.
func testLongIDLists(t *testing.T, e *env) {
	ids := e.insert(t, seedEv{Key: "x"}, seedEv{Key: "y"})
	e.claim(t, claimP("a", 10))
	long := make([]int64, 0, 2*dialect.MaxInList+2)
	for i := range 2 * dialect.MaxInList {
		long = append(long, int64(1<<40+i))
	}
	long = append(long, ids...)
	n, err := e.Driver.MarkSent(e.ctx, "a", long)
	wantN(t, "MarkSent of a long list", n, err, 2)
	e.set(t, "status = 2", ids...)
	n, err = e.Driver.Requeue(e.ctx, long)
	wantN(t, "Requeue of a long list", n, err, 2)
	e.claim(t, claimP("b", 10))
	n, err = e.Driver.Release(e.ctx, "b", long)
	wantN(t, "Release of a long list", n, err, 2)
}

// Concurrent claimers never hold the same row, and per key they claim in
// id order.
func testConcurrentClaims(t *testing.T, e *env) {
	var evs []seedEv
	for i := range 60 {
		evs = append(evs, seedEv{Key: fmt.Sprintf("k%d", i%5)})
	}
	ids := e.insert(t, evs...)
	keyOf := map[int64]string{}
	for i, id := range ids {
		keyOf[id] = evs[i].Key
	}
	var mu sync.Mutex
	held := map[int64]string{}
	byKey := map[string][]int64{}
	sent := 0
	var wg sync.WaitGroup
	errs := make(chan error, 4)
	deadline := time.Now().Add(time.Minute) // a hang guard, not a timing
	for w := range 4 {
		owner := fmt.Sprintf("w%d", w)
		wg.Add(1)
		go func() {
			defer wg.Done()
			for idle := 0; idle < 3; {
				if time.Now().After(deadline) {
					errs <- fmt.Errorf("%s: rows left unclaimable", owner)
					return
				}
				rows, err := e.Driver.Claim(e.ctx, claimP(owner, 7))
				if err != nil {
					errs <- err
					return
				}
				mu.Lock()
				for _, r := range rows {
					if o, ok := held[r.ID]; ok {
						mu.Unlock()
						errs <- fmt.Errorf("row %d claimed by %s while %s holds it", r.ID, owner, o)
						return
					}
					held[r.ID] = owner
					byKey[keyOf[r.ID]] = append(byKey[keyOf[r.ID]], r.ID)
				}
				done := sent == len(ids)
				mu.Unlock()
				if len(rows) == 0 {
					if done {
						idle++
					}
					time.Sleep(time.Millisecond)
					continue
				}
				n, err := e.Driver.MarkSent(e.ctx, owner, rowIDs(rows))
				if err != nil || n != int64(len(rows)) {
					errs <- fmt.Errorf("MarkSent by %s: %d of %d, %v", owner, n, len(rows), err)
					return
				}
				mu.Lock()
				for _, r := range rows {
					delete(held, r.ID)
				}
				sent += len(rows)
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	if sent != len(ids) {
		t.Fatalf("%d rows sent, want %d", sent, len(ids))
	}
	for k, seq := range byKey {
		if !slices.IsSorted(seq) {
			t.Fatalf("key %s claimed out of id order: %v", k, seq)
		}
	}
}

// A claim skips the rows another transaction holds locked (a claim
// running beside it) and still fills its limit from the rows after them,
// however many of the oldest rows are held. SQLite has one writer: there
// is nothing to skip.
func testClaimSkipsLocked(t *testing.T, e *env) {
	if e.d == dialect.SQLite {
		t.Skip("SQLite: one writer, no row locks")
	}
	var evs []seedEv
	for i := range 40 {
		evs = append(evs, seedEv{Key: fmt.Sprintf("s%d", i)})
	}
	ids := e.insert(t, evs...)
	for _, tc := range []struct {
		locked int     // the oldest rows another transaction holds
		want   []int64 // what a claim of 10 leases
	}{
		{5, ids[5:15]},
		{15, ids[15:25]}, // more than half of twice the limit held
		{35, ids[35:40]}, // the whole first window held
	} {
		tx := e.lockRows(t, ids[:tc.locked]...)
		owner := fmt.Sprintf("beside-%d", tc.locked)
		got := e.claim(t, claimP(owner, 10))
		tx.Rollback() //nolint:errcheck
		wantIDs(t, fmt.Sprintf("claim of 10 beside %d locked rows", tc.locked), got, tc.want)
		if n, err := e.Driver.Release(e.ctx, owner, got); err != nil || n != int64(len(got)) {
			t.Fatalf("Release: %d, %v", n, err)
		}
	}

	// A row whose older row of its key another claim holds, locked and
	// not leased yet, waits: leasing it would let it overtake that row.
	// (MySQL leases rows that are their key's front without the per-key
	// statement: the held row is the front here, read without its lock.)
	e.set(t, "status = 1", ids...)
	more := e.insert(t, seedEv{Key: "pair"}, seedEv{Key: "solo"}, seedEv{Key: "pair"})
	tx := e.lockRows(t, more[0])
	wantIDs(t, "claim beside the locked front of pair", e.claim(t, claimP("beside-pair", 10)), more[1:2])
	tx.Rollback() //nolint:errcheck
	wantIDs(t, "claim after that lock is gone", e.claim(t, claimP("after-pair", 10)), []int64{more[0], more[2]})
}

// SkipKeys: where the dialect reads them (dialect.ClaimSkipsKeys), a
// claim passes over every row of those keys and leases the others as it
// would without them, also in the window read with locks that a claim
// falls back to when other transactions hold too many candidates, and
// in the sweeper's overdue claim; elsewhere they change nothing.
func testClaimSkipKeys(t *testing.T, e *env) {
	skips := e.d.ClaimSkipsKeys()
	ids := e.insert(t, seedEv{Key: "a"}, seedEv{Key: "b"}, seedEv{Key: "a"}, seedEv{Key: "c"}, seedEv{Key: "b"})
	p := claimP("r", 10)
	p.SkipKeys = []string{"a", "c"}
	if !skips {
		wantIDs(t, "claim ignoring SkipKeys", e.claim(t, p), ids)
		return
	}
	p.OverdueAfter = time.Nanosecond
	wantIDs(t, "overdue claim passing over a and c", e.claim(t, p), []int64{ids[1], ids[4]})
	wantIDs(t, "claim without SkipKeys", e.claim(t, claimP("r", 10)), []int64{ids[0], ids[2], ids[3]})
	e.set(t, "status = 1", ids...)

	// s0..s19, then one row of key x, then s20..s39; another transaction
	// holds s0..s14: the window read without locks (20 candidates) finds
	// only 5 free, and the window read with locks fills the claim.
	var evs []seedEv
	for i := range 40 {
		if i == 20 {
			evs = append(evs, seedEv{Key: "x"})
		}
		evs = append(evs, seedEv{Key: fmt.Sprintf("s%d", i)})
	}
	ids = e.insert(t, evs...)
	e.lockRows(t, ids[:15]...)
	p = claimP("r2", 10)
	p.SkipKeys = []string{"x"}
	wantIDs(t, "claim of 10 passing over x beside 15 locked rows", e.claim(t, p), append(slices.Clone(ids[15:20]), ids[21:26]...))
}

// Another transaction (a claim running beside this one) holds the front
// of a key whose rows fill the window: the claim leases none of that
// key's rows behind it. On MySQL/MariaDB, which lock the window's
// candidates by id, it takes the other keys' rows due after them: the
// window read with locks passes over that key (dialect.BehindNotLocked).
// (PostgreSQL's window is the limit, here k's rows: it leases nothing.)
func testClaimBesideHeldKeyFront(t *testing.T, e *env) {
	if e.d == dialect.SQLite {
		t.Skip("SQLite: one writer, no row locks")
	}
	var evs []seedEv
	for range 8 {
		evs = append(evs, seedEv{Key: "k"})
	}
	for i := range 10 {
		evs = append(evs, seedEv{Key: fmt.Sprintf("o%d", i)})
	}
	ids := e.insert(t, evs...)
	tx := e.lockRows(t, ids[:2]...)
	// MySQL: 10 candidates (k's 8 rows, o0, o1), the lock of 5 gets k's
	// third to seventh, all behind k's front.
	got := e.claim(t, claimP("beside", 5))
	want := []int64{}
	if e.d.ClaimSkipsKeys() {
		want = ids[8:13]
	}
	wantIDs(t, "claim of 5 beside a held front of k", got, want)
	tx.Rollback() //nolint:errcheck
	rest := slices.DeleteFunc(slices.Clone(ids), func(id int64) bool { return slices.Contains(got, id) })
	wantIDs(t, "claim after that lock is gone", e.claim(t, claimP("after", 20)), rest)
}

// A claim returns its front, the oldest pending row it saw, leased or
// not, when asked (PostgreSQL; zero elsewhere); a claim From it reads
// from there and does not see rows due before it; a claim from the zero
// ScanPos does. Other dialects ignore Front and From.
func testClaimFromFront(t *testing.T, e *env) {
	if e.d == dialect.Postgres {
		// Ids past 32 bits: a position's id is a bigint everywhere.
		if _, err := e.DB.ExecContext(e.ctx, "SELECT setval(pg_get_serial_sequence('"+e.table+"', 'id'), 3000000000)"); err != nil {
			t.Fatal(err)
		}
	}
	ids := e.insert(t, seedEv{Key: "f1"}, seedEv{Key: "f2"}, seedEv{Key: "f3"}, seedEv{Key: "f4"}, seedEv{Key: "f5"}, seedEv{Key: "f6"})
	claim := func(owner string, limit int, from driver.ScanPos) ([]int64, driver.ScanPos) {
		t.Helper()
		var res driver.ClaimResult
		p := claimP(owner, limit)
		p.Front, p.From, p.Result = true, from, &res
		return e.claim(t, p), res.Front
	}
	got, front := claim("a", 2, driver.ScanPos{})
	wantIDs(t, "first claim", got, ids[:2])
	if e.d != dialect.Postgres {
		if !front.IsZero() {
			t.Fatalf("front on %s: %+v, want none", e.d, front)
		}
		// From is ignored: the claim reads from the start (a position
		// past every row would leave nothing).
		got, _ = claim("b", 4, driver.ScanPos{DueMicros: 1 << 60, ID: ids[5] + 1})
		wantIDs(t, "claim From a position past every row on "+string(e.d), got, ids[2:6])
		return
	}
	// The front is the oldest pending row, leased or not: row 1, with
	// its next_retry_time to the microsecond.
	var due int64
	if err := e.DB.QueryRowContext(e.ctx, "SELECT (extract(epoch FROM next_retry_time) * 1000000)::bigint FROM "+e.table+" WHERE id = $1", ids[0]).Scan(&due); err != nil {
		t.Fatal(err)
	}
	if ids[0] <= 3000000000 {
		t.Fatalf("first id %d: the sequence was not moved past 32 bits", ids[0])
	}
	if want := (driver.ScanPos{DueMicros: due, ID: ids[0]}); front != want {
		t.Fatalf("front of the first claim: %+v, want row %d's %+v", front, ids[0], want)
	}
	got, front2 := claim("b", 2, front)
	wantIDs(t, "claim from the front", got, ids[2:4])
	if front2 != front {
		t.Fatalf("front while row %d is leased: %+v, want %+v", ids[0], front2, front)
	}
	if n, err := e.Driver.MarkSent(e.ctx, "a", ids[:2]); err != nil || n != 2 {
		t.Fatalf("MarkSent: %d, %v", n, err)
	}
	if n, err := e.Driver.MarkSent(e.ctx, "b", ids[2:4]); err != nil || n != 2 {
		t.Fatalf("MarkSent: %d, %v", n, err)
	}
	got, front = claim("c", 1, front)
	wantIDs(t, "claim from the front once rows 1-4 are sent", got, ids[4:5])
	if front.ID != ids[4] {
		t.Fatalf("front once rows 1-4 are sent: %+v, want row %d", front, ids[4])
	}
	// A row pending before the front (due an hour ago: as a transaction
	// that began before the front and committed after the claim leaves
	// it) is not seen from the front, and is from the start.
	late := e.insert(t, seedEv{Key: "late"})
	e.set(t, "next_retry_time = "+OpsAgo(e.d, time.Hour), late...)
	got, _ = claim("d", 5, front)
	wantIDs(t, "claim from the front beside a row due before it", got, ids[5:6])
	got, front = claim("e", 5, driver.ScanPos{})
	wantIDs(t, "claim from the start", got, late)
	if front.ID != late[0] {
		t.Fatalf("front of the claim from the start: %+v, want row %d", front, late[0])
	}
}

// Claims From a front with distinct stripes of the keys lease disjoint
// keys, each key's rows whole and in order, together every row; a
// stripe is the same keys in every claim. A claim not From a front, and
// every claim on other dialects than PostgreSQL, ignores its Stripe.
func testClaimStripes(t *testing.T, e *env) {
	var evs []seedEv
	for range 3 {
		for k := range 16 {
			evs = append(evs, seedEv{Key: fmt.Sprintf("k%d", k)})
		}
	}
	ids := e.insert(t, evs...)
	keyOf := map[int64]string{}
	for i, id := range ids {
		keyOf[id] = evs[i].Key
	}
	claim := func(owner string, limit int, s driver.Stripe, from driver.ScanPos) ([]int64, driver.ScanPos) {
		t.Helper()
		var res driver.ClaimResult
		p := claimP(owner, limit)
		p.Front, p.From, p.Stripe, p.Result = true, from, s, &res
		return e.claim(t, p), res.Front
	}
	// Not From a front: every key.
	got, front := claim("first", 1, driver.Stripe{Index: 1, Of: 2}, driver.ScanPos{})
	wantIDs(t, "claim of one stripe not From a front", got, ids[:1])
	e.set(t, "status = 1", ids[0])
	rest := ids[1:]
	if e.d != dialect.Postgres {
		got, _ = claim("other", 100, driver.Stripe{Index: 1, Of: 2}, driver.ScanPos{DueMicros: 1, ID: 1})
		wantIDs(t, "claim of one stripe on "+string(e.d), got, rest)
		return
	}
	var all []int64
	stripeKeys := make([]map[string]bool, 3)
	for i := range stripeKeys {
		s := driver.Stripe{Index: i, Of: len(stripeKeys)}
		var sf driver.ScanPos
		got, sf = claim(fmt.Sprintf("s%d", i), 100, s, front)
		if len(got) == 0 {
			t.Fatalf("stripe %+v leased nothing of 16 keys", s)
		}
		// Its front is of every key: the oldest pending row, leased or
		// not, whatever its stripe.
		if sf.ID != rest[0] {
			t.Fatalf("front of the claim of stripe %+v: %+v, want row %d's", s, sf, rest[0])
		}
		stripeKeys[i] = map[string]bool{}
		for _, id := range got {
			stripeKeys[i][keyOf[id]] = true
			for j := range i {
				if stripeKeys[j][keyOf[id]] {
					t.Fatalf("key %s leased in stripes %d and %d", keyOf[id], j, i)
				}
			}
		}
		// Each of its keys whole, in id order (rows of one key leased
		// together, so claimable only if all older ones are too).
		var want []int64
		for _, id := range rest {
			if stripeKeys[i][keyOf[id]] {
				want = append(want, id)
			}
		}
		wantIDs(t, fmt.Sprintf("stripe %+v: its keys' rows", s), got, want)
		all = append(all, got...)
	}
	slices.Sort(all)
	wantIDs(t, "the stripes together", all, rest)
	// The same stripe again: the same keys.
	e.set(t, "lease_owner = NULL, lease_expires_at = NULL", rest...)
	got, _ = claim("again", 100, driver.Stripe{Index: 1, Of: 3}, front)
	for _, id := range got {
		if !stripeKeys[1][keyOf[id]] {
			t.Fatalf("stripe 1 of 3 again: row %d of key %s, not of its keys %v", id, keyOf[id], stripeKeys[1])
		}
	}
	if len(got) == 0 {
		t.Fatal("stripe 1 of 3 again: nothing leased")
	}
	// A stripe outside 0 to Of-1 is none: every key.
	e.set(t, "lease_owner = NULL, lease_expires_at = NULL", rest...)
	got, _ = claim("outside", 100, driver.Stripe{Index: 3, Of: 3}, front)
	wantIDs(t, "claim of stripe 3 of 3", got, rest)
}
