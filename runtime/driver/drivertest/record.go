package drivertest

// Recording: Record, and Claim with ClaimParams.Record (the relay's
// "record one batch, claim the next" in one transaction; on MySQL/MariaDB
// sqldriver commits the recording just before the claim's).

import (
	"testing"
	"time"

	"github.com/outboxgen/outboxgen/runtime/driver"
)

var recordTests = []struct {
	name string
	f    func(t *testing.T, e *env)
}{
	{"RecordWithClaim", testRecordWithClaim},
	{"RecordFenced", testRecordFenced},
	{"RecordAlone", testRecordAlone},
	{"RecordFailuresEach", testRecordFailuresEach},
	{"RecordFailureAtStoredLimit", testRecordFailureAtStoredLimit},
	{"RecordErrorNotText", testRecordErrorNotText},
}

// testRecordWithClaim: the results are written before the claim (in its
// transaction, or committed just before it when the driver says
// ClaimResult.RecordedApart), so the next row of a key whose head was just marked sent
// is claimed by the same call; failures and releases are counted.
func testRecordWithClaim(t *testing.T, e *env) {
	ids := e.insert(t, seedEv{Key: "a"}, seedEv{Key: "b"}, seedEv{Key: "c"}, seedEv{Key: "d"})
	rows, err := e.Driver.Claim(e.ctx, claimP("r", 3))
	if err != nil || len(rows) != 3 {
		t.Fatalf("first claim: %v %v", rowIDs(rows), err)
	}
	more := e.insert(t, seedEv{Key: "a"}, seedEv{Key: "b"}, seedEv{Key: "c"})
	var res driver.ClaimResult
	p := claimP("r", 10)
	p.Result = &res
	p.Record = &driver.Results{
		Sent:        []int64{ids[0]},
		Failures:    []driver.Failure{{Row: rows[1], Error: "broker said no", Delay: time.Hour}},
		MaxAttempts: 1, // this failure is the last attempt: FAILED
		Release:     []int64{ids[2]},
	}
	got, err := e.Driver.Claim(e.ctx, p)
	if err != nil {
		t.Fatalf("claim with record: %v", err)
	}
	// a's next row follows its sent head; c's released head comes back
	// with c's next row; d was never claimed; b's next row waits behind
	// its FAILED head.
	wantIDs(t, "claimed with the record", rowIDs(got), []int64{ids[2], ids[3], more[0], more[2]})
	if res.Recorded.Sent != 1 || res.Recorded.Retried != 1 || res.Recorded.Released != 1 || len(res.Recorded.Failed) != 1 || res.Recorded.Failed[0] != ids[1] {
		t.Fatalf("recorded %+v, want 1 sent, 1 retried (FAILED %d), 1 released", res.Recorded, ids[1])
	}
	if s := e.state(t, ids[0]); s.Status != 1 || !s.Sent {
		t.Fatalf("row %d after the record: %+v, want sent", ids[0], s)
	}
	if s := e.state(t, ids[1]); s.Status != 2 || s.RetryCount != 1 || s.LastError.String != "broker said no" {
		t.Fatalf("row %d after the record: %+v, want FAILED with its error", ids[1], s)
	}
	if owner, _ := e.heldState(t, more[1]); owner == "r" {
		t.Fatalf("row %d was leased behind its FAILED head", more[1])
	}
}

// testRecordFenced: results for rows another owner holds change nothing,
// and the counts say so; the claim still happens.
func testRecordFenced(t *testing.T, e *env) {
	ids := e.insert(t, seedEv{Key: "a"}, seedEv{Key: "b"}, seedEv{Key: "c"})
	if got := e.claim(t, claimP("other", 1)); len(got) != 1 || got[0] != ids[0] {
		t.Fatalf("other's claim: %v", got)
	}
	var res driver.ClaimResult
	p := claimP("me", 10)
	p.Result = &res
	p.Record = &driver.Results{Sent: []int64{ids[0]}, Release: []int64{ids[0]}}
	got, err := e.Driver.Claim(e.ctx, p)
	if err != nil {
		t.Fatal(err)
	}
	wantIDs(t, "claimed", rowIDs(got), ids[1:])
	if res.Recorded.Sent != 0 || res.Recorded.Released != 0 {
		t.Fatalf("recorded %+v for a row leased to another owner", res.Recorded)
	}
	if s := e.state(t, ids[0]); s.Status != 0 || s.Owner.String != "other" {
		t.Fatalf("row %d: %+v, want still leased to other", ids[0], s)
	}
}

// testRecordAlone: Record without a claim, and a claim that finds nothing
// still commits its record.
func testRecordAlone(t *testing.T, e *env) {
	ids := e.insert(t, seedEv{Key: "a"}, seedEv{Key: "b"})
	rows, err := e.Driver.Claim(e.ctx, claimP("r", 10))
	if err != nil || len(rows) != 2 {
		t.Fatalf("claim: %v %v", rowIDs(rows), err)
	}
	rec, err := e.Driver.Record(e.ctx, "r", driver.Results{
		Sent: ids[:1], Failures: []driver.Failure{{Row: rows[1], Error: "x", Delay: time.Hour}}, MaxAttempts: 5,
	})
	if err != nil || rec.Sent != 1 || rec.Retried != 1 || len(rec.Failed) != 0 {
		t.Fatalf("Record = %+v, %v; want 1 sent, 1 retried, none FAILED", rec, err)
	}
	if s := e.state(t, ids[1]); s.Status != 0 || s.RetryCount != 1 || s.Due || s.Owner.Valid {
		t.Fatalf("row %d: %+v, want backing off, unleased", ids[1], s)
	}
	if rec, err := e.Driver.Record(e.ctx, "r", driver.Results{}); err != nil || rec.Sent != 0 {
		t.Fatalf("empty Record = %+v, %v", rec, err)
	}
	if _, err := e.Driver.Record(e.ctx, "", driver.Results{Sent: ids[:1]}); err == nil {
		t.Fatal("Record without an owner: no error")
	}

	// Nothing to claim, something to record: the record is committed.
	more := e.insert(t, seedEv{Key: "c"})
	if got := e.claim(t, claimP("r", 10)); len(got) != 1 || got[0] != more[0] {
		t.Fatalf("claim c: %v", got)
	}
	var res driver.ClaimResult
	p := claimP("r", 10)
	p.Result = &res
	p.Record = &driver.Results{Sent: more}
	got, err := e.Driver.Claim(e.ctx, p)
	if err != nil || len(got) != 0 || res.Recorded.Sent != 1 {
		t.Fatalf("claim with record on an empty window: %v, %+v, %v", rowIDs(got), res.Recorded, err)
	}
	if s := e.state(t, more[0]); s.Status != 1 {
		t.Fatalf("row %d: %+v, want sent", more[0], s)
	}
}

// testRecordFailuresEach: failures recorded together each keep their own
// error, delay and attempt limit (MySQL writes those that leave their row
// pending in one statement), a failure for a row another owner holds
// changes nothing, and only the row at its last attempt is reported
// FAILED.
func testRecordFailuresEach(t *testing.T, e *env) {
	ids := e.insert(t, seedEv{Key: "a"}, seedEv{Key: "b"}, seedEv{Key: "c"}, seedEv{Key: "d"}, seedEv{Key: "e"})
	rows, err := e.Driver.Claim(e.ctx, claimP("r", 4))
	if err != nil || len(rows) != 4 {
		t.Fatalf("claim: %v %v", rowIDs(rows), err)
	}
	other, err := e.Driver.Claim(e.ctx, claimP("other", 1))
	if err != nil || len(other) != 1 || other[0].ID != ids[4] {
		t.Fatalf("other's claim: %v %v", rowIDs(other), err)
	}
	rec, err := e.Driver.Record(e.ctx, "r", driver.Results{
		Failures: []driver.Failure{
			{Row: rows[0], Error: "first", Delay: time.Hour},
			{Row: rows[1], Error: "second", Delay: 3 * time.Hour},
			{Row: rows[2], Error: "refused", Permanent: true},
			{Row: rows[3], Error: "third", Delay: 2 * time.Hour},
			{Row: other[0], Error: "not mine", Delay: time.Hour},
		},
		MaxAttempts: 5,
	})
	if err != nil || rec.Retried != 4 || len(rec.Failed) != 1 || rec.Failed[0] != ids[2] {
		t.Fatalf("Record = %+v, %v; want 4 retried, %d FAILED", rec, err, ids[2])
	}
	want := []struct {
		status int
		err    string
		delay  time.Duration
	}{{0, "first", time.Hour}, {0, "second", 3 * time.Hour}, {2, "refused", 0}, {0, "third", 2 * time.Hour}}
	for i, w := range want {
		s := e.state(t, ids[i])
		if s.Status != w.status || s.RetryCount != 1 || s.LastError.String != w.err || s.Owner.Valid {
			t.Fatalf("row %d: %+v, want status %d, retry_count 1, last_error %q, unleased", ids[i], s, w.status, w.err)
		}
		if w.delay == 0 {
			continue
		}
		near := "SELECT CASE WHEN next_retry_time > " + OpsAgo(e.d, -w.delay+time.Minute) + " AND next_retry_time < " + OpsAgo(e.d, -w.delay-time.Minute) + " THEN 1 ELSE 0 END FROM " + e.table + " WHERE id = " + e.d.Placeholder(1)
		var ok int
		if err := e.DB.QueryRowContext(e.ctx, near, ids[i]).Scan(&ok); err != nil || ok != 1 {
			t.Fatalf("row %d: next attempt about %s from now? %d %v", ids[i], w.delay, ok, err)
		}
	}
	if s := e.state(t, ids[4]); s.RetryCount != 0 || s.Owner.String != "other" || s.LastError.Valid {
		t.Fatalf("row %d of another owner: %+v, want untouched", ids[4], s)
	}
}

// testRecordErrorNotText: a publish error that is not valid text (bytes
// that are not UTF-8, a NUL byte; brokers and clients quote what they
// were given) is stored cleaned, and does not fail the recording it is
// in: PostgreSQL refuses both in a text column, MySQL in strict mode the
// first. Before, such a failure was never recorded, so its row was
// published again each time its lease lapsed.
func testRecordErrorNotText(t *testing.T, e *env) {
	ids := e.insert(t, seedEv{Key: "a"}, seedEv{Key: "b"})
	rows, err := e.Driver.Claim(e.ctx, claimP("r", 2))
	if err != nil || len(rows) != 2 {
		t.Fatalf("claim: %v %v", rowIDs(rows), err)
	}
	rec, err := e.Driver.Record(e.ctx, "r", driver.Results{
		Sent:        ids[1:],
		Failures:    []driver.Failure{{Row: rows[0], Error: "broker said \xff\xfe\x00 no", Delay: time.Hour}},
		MaxAttempts: 5,
	})
	if err != nil || rec.Retried != 1 || rec.Sent != 1 {
		t.Fatalf("Record = %+v, %v; want 1 retried, 1 sent", rec, err)
	}
	if s := e.state(t, ids[0]); s.RetryCount != 1 || s.LastError.String != "broker said \uFFFD no" {
		t.Fatalf("row %d: %+v, want retry_count 1 and the error cleaned", ids[0], s)
	}
}

// testRecordFailureAtStoredLimit: the attempt limit is judged by the
// stored retry_count: a row whose count is ahead of the one it was claimed
// with (changed by hand while it was leased) becomes FAILED at its limit,
// recorded together with a failure that is not at its limit.
func testRecordFailureAtStoredLimit(t *testing.T, e *env) {
	ids := e.insert(t, seedEv{Key: "a"}, seedEv{Key: "b"})
	rows, err := e.Driver.Claim(e.ctx, claimP("r", 2))
	if err != nil || len(rows) != 2 {
		t.Fatalf("claim: %v %v", rowIDs(rows), err)
	}
	e.set(t, "retry_count = 4", ids[0])
	rec, err := e.Driver.Record(e.ctx, "r", driver.Results{
		Failures:    []driver.Failure{{Row: rows[0], Error: "x", Delay: time.Hour}, {Row: rows[1], Error: "y", Delay: time.Hour}},
		MaxAttempts: 5,
	})
	if err != nil || rec.Retried != 2 {
		t.Fatalf("Record = %+v, %v; want 2 retried", rec, err)
	}
	if s := e.state(t, ids[0]); s.Status != 2 || s.RetryCount != 5 {
		t.Fatalf("row %d at its stored limit: %+v, want FAILED", ids[0], s)
	}
	if s := e.state(t, ids[1]); s.Status != 0 || s.RetryCount != 1 {
		t.Fatalf("row %d: %+v, want pending, retry_count 1", ids[1], s)
	}
}
