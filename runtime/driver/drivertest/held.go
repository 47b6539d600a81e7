package drivertest

// Held rows: what a claim does with the rows of its window that wait
// behind a FAILED, backing-off or held row of their key (see
// dialect.RelayQueries.ClaimInTransaction).

import (
	"database/sql"
	"strings"
	"testing"
	"time"

	"github.com/outboxgen/outboxgen/runtime/dialect"
	"github.com/outboxgen/outboxgen/runtime/driver"
	"github.com/outboxgen/outboxgen/runtime/driver/internal/driverutil"
)

var heldTests = []struct {
	name string
	f    func(t *testing.T, e *env)
}{
	{"HeldBehindFailed", testHeldBehindFailed},
	{"HeldBehindBackoff", testHeldBehindBackoff},
	{"HeldEachUntilItsHead", testHeldEachUntilItsHead},
	{"MovedBehindLaterHead", testMovedBehindLaterHead},
	{"NotHeldBehindInFlight", testNotHeldBehindInFlight},
	{"HeldUnordered", testHeldUnordered},
	{"RequeueDuringClaim", testRequeueDuringClaim},
	{"RequeueWaitsForClaim", testRequeueWaitsForClaim},
	{"HeldBehindSlowInFlight", testHeldBehindSlowInFlight},
	{"OrphanHoldsReleased", testOrphanHoldsReleased},
	{"HeldBehindHeldSlow", testHeldBehindHeldSlow},
}

// heldState is lease owner and due-ness of a row.
func (e *env) heldState(t *testing.T, id int64) (owner string, due bool) {
	t.Helper()
	s := e.state(t, id)
	return s.Owner.String, s.Due
}

// testHeldBehindFailed: rows behind a FAILED row are held (out of every
// later claim, whatever its window) until the FAILED row is requeued,
// which releases them: then the key goes out in order.
func testHeldBehindFailed(t *testing.T, e *env) {
	ids := e.insert(t, seedEv{Key: "p"}, seedEv{Key: "p"}, seedEv{Key: "p"}, seedEv{Key: "q"})
	e.set(t, "status = 2, retry_count = 5", ids[0])
	var res driver.ClaimResult
	p := claimP("r1", 10)
	p.Result = &res
	wantIDs(t, "claim with p's head FAILED", e.claim(t, p), ids[3:])
	if res.Moved != 2 {
		t.Fatalf("ClaimResult.Moved = %d, want 2 (p's two rows held)", res.Moved)
	}
	for _, id := range ids[1:3] {
		if owner, due := e.heldState(t, id); owner != dialect.HeldOwner || due {
			t.Fatalf("row %d behind the FAILED row: owner %q due %v, want held (%q, not due)", id, owner, due, dialect.HeldOwner)
		}
		if s := e.state(t, id); s.Status != 0 || s.RetryCount != 0 {
			t.Fatalf("held row %d: %+v, want pending and never tried", id, s)
		}
	}
	res = driver.ClaimResult{}
	wantIDs(t, "claim while held", e.claim(t, p), nil)
	if res.Moved != 0 {
		t.Fatalf("a later claim read the held rows again (Moved %d)", res.Moved)
	}
	// New rows of p are held as they arrive.
	late := e.insert(t, seedEv{Key: "p"})
	wantIDs(t, "claim of a late row of p", e.claim(t, claimP("r1", 10)), nil)
	if owner, _ := e.heldState(t, late[0]); owner != dialect.HeldOwner {
		t.Fatalf("late row of p: owner %q, want held", owner)
	}
	if n, rel, err := e.Driver.RequeueAndRelease(e.ctx, ids[:1]); err != nil || n != 1 || rel != 3 {
		t.Fatalf("RequeueAndRelease = %d requeued, %d released, %v; want 1 and 3 (two held rows of p and the late one)", n, rel, err)
	}
	for _, id := range append(ids[1:3], late[0]) {
		if owner, due := e.heldState(t, id); owner != "" || !due {
			t.Fatalf("row %d after the requeue: owner %q due %v, want released and due", id, owner, due)
		}
	}
	wantIDs(t, "claim after the requeue", e.claim(t, claimP("r1", 10)), []int64{ids[0], ids[1], ids[2], late[0]})
}

// testHeldBehindBackoff: rows behind a backing-off row are held until its
// next attempt, then claimed with it, in order.
func testHeldBehindBackoff(t *testing.T, e *env) {
	ids := e.insert(t, seedEv{Key: "b"}, seedEv{Key: "b"})
	e.set(t, "retry_count = 1, next_retry_time = "+OpsAgo(e.d, -2*time.Second), ids[0])
	wantIDs(t, "claim while b backs off", e.claim(t, claimP("r1", 10)), nil)
	if owner, due := e.heldState(t, ids[1]); owner != dialect.HeldOwner || due {
		t.Fatalf("row behind the backing-off row: owner %q due %v, want held", owner, due)
	}
	time.Sleep(2500 * time.Millisecond)
	wantIDs(t, "claim once b is due", e.claim(t, claimP("r1", 10)), ids)
}

// testHeldEachUntilItsHead: one claim holding rows behind several heads
// gives each row its own head's next attempt (behind a backing-off head)
// or the hold (behind a FAILED one). MySQL writes all of them in one
// statement, each row's value found by its place in a list: a value given
// to the wrong row would make it due before its head, or hold it past.
func testHeldEachUntilItsHead(t *testing.T, e *env) {
	var evs []seedEv
	for _, k := range []string{"e1", "e2", "e3", "ef"} {
		evs = append(evs, seedEv{Key: k}, seedEv{Key: k}, seedEv{Key: k})
	}
	ids := e.insert(t, evs...)
	heads := []int64{ids[0], ids[3], ids[6], ids[9]}
	for i, h := range heads[:3] {
		e.set(t, "retry_count = 1, next_retry_time = "+OpsAgo(e.d, -time.Duration(i+1)*time.Hour), h)
	}
	e.set(t, "status = 2, retry_count = 5", heads[3])
	var res driver.ClaimResult
	p := claimP("r1", 20)
	p.Hold = 30 * time.Minute
	p.Result = &res
	wantIDs(t, "claim with every head backing off or FAILED", e.claim(t, p), nil)
	if res.Moved != 8 {
		t.Fatalf("ClaimResult.Moved = %d, want 8 (two rows behind each head)", res.Moved)
	}
	same := "SELECT CASE WHEN c.next_retry_time = h.next_retry_time THEN 1 ELSE 0 END FROM " + e.table + " c, " + e.table + " h WHERE c.id = " + e.d.Placeholder(1) + " AND h.id = " + e.d.Placeholder(2)
	for i, h := range heads {
		for _, id := range ids[3*i+1 : 3*i+3] {
			if owner, due := e.heldState(t, id); owner != dialect.HeldOwner || due {
				t.Fatalf("row %d behind head %d: owner %q due %v, want held", id, h, owner, due)
			}
			if i == 3 {
				// Behind the FAILED head: held for p.Hold from the claim.
				near := "SELECT CASE WHEN next_retry_time > " + OpsAgo(e.d, -25*time.Minute) + " AND next_retry_time < " + OpsAgo(e.d, -35*time.Minute) + " THEN 1 ELSE 0 END FROM " + e.table + " WHERE id = " + e.d.Placeholder(1)
				var ok int
				if err := e.DB.QueryRowContext(e.ctx, near, id).Scan(&ok); err != nil || ok != 1 {
					t.Fatalf("row %d behind the FAILED head: held about 30 minutes? %d %v", id, ok, err)
				}
				continue
			}
			var ok int
			if err := e.DB.QueryRowContext(e.ctx, same, id, h).Scan(&ok); err != nil || ok != 1 {
				t.Fatalf("row %d: next attempt the same as its head %d's? %d %v", id, h, ok, err)
			}
		}
	}
}

// testMovedBehindLaterHead: a key's head due later than its successors
// (it backed off while they waited) must not be starved by them: a claim
// whose window holds only successors moves them behind the head, and the
// head is claimed within a few claims, before any successor.
func testMovedBehindLaterHead(t *testing.T, e *env) {
	var evs []seedEv
	for range 8 {
		evs = append(evs, seedEv{Key: "s"})
	}
	ids := e.insert(t, evs...)
	// The head failed once and is due now, but later than its successors
	// became due.
	e.set(t, "retry_count = 1, next_retry_time = "+OpsAgo(e.d, time.Millisecond), ids[0])
	e.set(t, "next_retry_time = "+OpsAgo(e.d, time.Hour), ids[1:]...)
	var got []int64
	for i := 0; i < 10 && len(got) == 0; i++ {
		got = e.claim(t, claimP("r1", 3))
	}
	if len(got) == 0 || got[0] != ids[0] {
		t.Fatalf("claims with a window of 3 returned %v, want the head %d first", got, ids[0])
	}
}

// testNotHeldBehindInFlight: a row behind a row another owner is
// publishing is neither leased nor held, and does not take a place in
// other owners' windows: a second relay claims other keys' rows even when
// the busy key's rows come first in due order.
func testNotHeldBehindInFlight(t *testing.T, e *env) {
	ids := e.insert(t, seedEv{Key: "f"}, seedEv{Key: "f"}, seedEv{Key: "f"}, seedEv{Key: "g"})
	wantIDs(t, "r1 claims the head only", e.claim(t, claimP("r1", 1)), ids[:1])
	var res driver.ClaimResult
	p := claimP("r2", 1)
	p.Result = &res
	wantIDs(t, "r2 while f's head is in flight", e.claim(t, p), ids[3:])
	for _, id := range ids[1:3] {
		if owner, due := e.heldState(t, id); owner != "" || !due || res.Moved != 0 {
			t.Fatalf("row %d behind a row in flight: owner %q due %v moved %d, want untouched", id, owner, due, res.Moved)
		}
	}
}

// testHeldUnordered: unordered types are never held.
func testHeldUnordered(t *testing.T, e *env) {
	ids := e.insert(t, seedEv{Type: "AUDIT", Key: "u"}, seedEv{Type: "AUDIT", Key: "u"})
	e.set(t, "status = 2, retry_count = 5", ids[0])
	p := claimP("r1", 10)
	p.Unordered = []string{"AUDIT"}
	wantIDs(t, "unordered row behind a FAILED one", e.claim(t, p), ids[1:])
}

// testRequeueDuringClaim: a claim that runs while a requeue of the FAILED
// head is under way (not committed yet) must not hold the rows behind it
// past the requeue: once the requeue commits, the key is claimable at
// once. On PostgreSQL the claim skips the FAILED row the requeue locked;
// on MySQL, whose claim reads the key without locks, it skips the key's
// rows the requeue locked (RelayLockKeys). SQLite has one writer, so the
// two cannot overlap there.
func testRequeueDuringClaim(t *testing.T, e *env) {
	if e.d == dialect.SQLite {
		t.Skip("sqlite: one writer, a claim and a requeue cannot overlap")
	}
	ids := e.insert(t, seedEv{Key: "r"}, seedEv{Key: "r"})
	e.set(t, "status = 2, retry_count = 5", ids[0])
	q, err := dialect.NewRelayQueries(e.d, e.table, nil)
	if err != nil {
		t.Fatal(err)
	}
	tx, err := e.DB.BeginTx(e.ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback() //nolint:errcheck
	// The statements of Driver.RequeueAndRelease, in a transaction left
	// open while a claim runs.
	if _, _, err := driverutil.RequeueInTx(e.ctx, driverutil.TxQuerier(tx), q, ids[:1]); err != nil {
		t.Fatal(err)
	}
	wantIDs(t, "claim during the requeue", e.claim(t, claimP("r1", 1)), nil)
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	if owner, due := e.heldState(t, ids[1]); owner == dialect.HeldOwner || !due {
		t.Fatalf("row behind the requeued head: owner %q due %v, want not held", owner, due)
	}
	wantIDs(t, "claim after the requeue", e.claim(t, claimP("r1", 10)), ids)
}

// testRequeueWaitsForClaim: a claim that holds a row behind a held row of
// the key, and commits while a requeue of the key's FAILED head waits for
// its locks: the requeue must release the row the claim held too, or it
// stays out of claims for a whole hold. The driver's claim runs in a
// transaction left open, so that the requeue meets it: PostgreSQL's one
// statement (which share-locks the held row), MySQL's steps
// (driverutil.ClaimInTx: lock, per-key check, hold).
func testRequeueWaitsForClaim(t *testing.T, e *env) {
	if e.d == dialect.SQLite {
		t.Skip("sqlite: one writer, a claim and a requeue cannot overlap")
	}
	ids := e.insert(t, seedEv{Key: "w"}, seedEv{Key: "w"}, seedEv{Key: "w"})
	e.set(t, "status = 2, retry_count = 5", ids[0])
	e.set(t, "lease_owner = '"+dialect.HeldOwner+"', next_retry_time = "+OpsAgo(e.d, -time.Hour), ids[1])
	q, err := dialect.NewRelayQueries(e.d, e.table, nil)
	if err != nil {
		t.Fatal(err)
	}
	tx, err := e.DB.BeginTx(e.ctx, &sql.TxOptions{Isolation: sql.LevelReadCommitted})
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback() //nolint:errcheck
	exec := func(query string, args []any) {
		t.Helper()
		if _, err := tx.ExecContext(e.ctx, query, args...); err != nil {
			t.Fatal(err)
		}
	}
	// Whether a transaction waits for a lock of the claim's.
	var claimPID int
	waiting := func() bool {
		var n int
		if err := e.DB.QueryRowContext(e.ctx, "SELECT count(*) FROM pg_stat_activity WHERE $1 = ANY(pg_blocking_pids(pid))", claimPID).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n > 0
	}
	// The driver's claim, in tx: PostgreSQL's one statement, the steps
	// of MySQL's.
	p := claimP("r1", 10)
	if e.d == dialect.Postgres {
		if err := tx.QueryRowContext(e.ctx, "SELECT pg_backend_pid()").Scan(&claimPID); err != nil {
			t.Fatal(err)
		}
		exec(driverutil.Claim(q, p))
	} else {
		rows, held, err := driverutil.ClaimInTx(e.ctx, driverutil.TxQuerier(tx), q, p)
		if err != nil {
			t.Fatal(err)
		}
		if len(rows) != 0 || held != 1 {
			t.Fatalf("the claim leased %v and held %d rows, want none leased and one held (the row behind the held one)", rowIDs(rows), held)
		}
		// MariaDB's information_schema.INNODB_TRX leaves out a
		// transaction waiting in a locking read; the monitor's list of
		// transactions shows it (not its LATEST DETECTED DEADLOCK
		// section, which comes before and keeps the same words). The
		// monitor is the server's: only a wait for a lock on this test's
		// table counts, not one of a test running beside it.
		var db string
		if err := e.DB.QueryRowContext(e.ctx, "SELECT DATABASE()").Scan(&db); err != nil {
			t.Fatal(err)
		}
		lockOn := "of table `" + db + "`.`" + e.table + "`"
		waiting = func() bool {
			var typ, name, status string
			if err := e.DB.QueryRowContext(e.ctx, "SHOW ENGINE INNODB STATUS").Scan(&typ, &name, &status); err != nil {
				t.Fatal(err)
			}
			_, list, _ := strings.Cut(status, "LIST OF TRANSACTIONS FOR EACH SESSION")
			for _, trx := range strings.Split(list, "---TRANSACTION") {
				if _, lock, ok := strings.Cut(trx, "FOR THIS LOCK TO BE GRANTED"); ok && strings.Contains(lock, lockOn) {
					return true
				}
			}
			return false
		}
	}
	var owner sql.NullString
	if err := tx.QueryRowContext(e.ctx, "SELECT lease_owner FROM "+e.table+" WHERE id = "+e.d.Placeholder(1), ids[2]).Scan(&owner); err != nil {
		t.Fatal(err)
	}
	if owner.String != dialect.HeldOwner {
		t.Fatalf("the claim left the row behind the held one with owner %q, want it held (%q)", owner.String, dialect.HeldOwner)
	}

	type requeued struct {
		n, released int64
		err         error
	}
	done := make(chan requeued, 1)
	go func() {
		n, r, err := e.Driver.RequeueAndRelease(e.ctx, ids[:1])
		done <- requeued{n, r, err}
	}()
	// The requeue's release waits for the claim's lock on the held row.
	deadline := time.Now().Add(10 * time.Second)
	for {
		if waiting() {
			break
		}
		select {
		case r := <-done:
			t.Fatalf("the requeue did not wait for the claim: %+v", r)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatal("the requeue never waited for the claim's lock")
		}
		time.Sleep(10 * time.Millisecond)
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	r := <-done
	if r.err != nil || r.n != 1 || r.released != 2 {
		t.Fatalf("RequeueAndRelease = %d requeued, %d released, %v; want 1 and 2 (the held row and the one the claim held)", r.n, r.released, r.err)
	}
	for _, id := range ids[1:] {
		if owner, due := e.heldState(t, id); owner != "" || !due {
			t.Fatalf("row %d after the requeue: owner %q due %v, want released and due", id, owner, due)
		}
	}
	wantIDs(t, "claim after the requeue", e.claim(t, claimP("r1", 10)), ids)
}

// holdsInFlight skips the test on dialects whose claim leaves rows behind
// a row in flight where they are (see driver.ClaimParams.HoldBehindSlow).
func (e *env) holdsInFlight(t *testing.T) {
	t.Helper()
	q, err := dialect.NewRelayQueries(e.d, e.table, nil)
	if err != nil {
		t.Fatal(err)
	}
	if !q.HoldsInFlight() {
		t.Skipf("%s: rows behind a row in flight are not held", e.d)
	}
}

// slowHead leases the head of a key of three rows to "slow" and makes
// that lease look HoldBehindSlow old; a claim by "other" then holds the
// two rows behind it (out of the due range, lease_owner HeldOwner) and
// leases another key's row. It returns the key's ids.
func (e *env) slowHead(t *testing.T, key string) []int64 {
	t.Helper()
	ids := e.insert(t, seedEv{Key: key}, seedEv{Key: key}, seedEv{Key: key})
	other := e.insert(t, seedEv{Key: key + "-other"})
	wantIDs(t, "the slow instance claims the head", e.claim(t, claimP("slow", 1)), ids[:1])
	e.set(t, "updated_at = updated_at - interval '2 seconds'", ids[0])
	var res driver.ClaimResult
	p := claimP("other", 10)
	p.HoldBehindSlow = time.Second
	p.Result = &res
	wantIDs(t, "a claim beside the slow head", e.claim(t, p), other)
	if res.Moved != 2 {
		t.Fatalf("claim moved %d rows, want the 2 behind the slow head", res.Moved)
	}
	for _, id := range ids[1:] {
		if owner, due := e.heldState(t, id); owner != dialect.HeldOwner || due {
			t.Fatalf("row %d behind a slow head: owner %q due %v, want held", id, owner, due)
		}
	}
	wantIDs(t, "a claim while they are held", e.claim(t, p), nil)
	return ids
}

// testHeldBehindSlowInFlight: rows behind a row in flight for longer than
// HoldBehindSlow are held until that row is recorded, however it is
// recorded (sent, failed, given back); then the key goes on in order.
// A younger head holds nothing (NotHeldBehindInFlight).
func testHeldBehindSlowInFlight(t *testing.T, e *env) {
	e.holdsInFlight(t)
	ctx := e.ctx
	t.Run("sent", func(t *testing.T) {
		ids := e.slowHead(t, "sent")
		rec, err := e.Driver.Record(ctx, "slow", driver.Results{Sent: ids[:1]})
		if err != nil || rec.Sent != 1 || rec.Unheld != 2 {
			t.Fatalf("Record(sent head) = %+v, %v; want 1 sent, 2 unheld", rec, err)
		}
		wantIDs(t, "the key after its head was sent", e.claim(t, claimP("next", 10)), ids[1:])
	})
	t.Run("failed", func(t *testing.T) {
		ids := e.slowHead(t, "failed")
		row := driver.Row{ID: ids[0]}
		rec, err := e.Driver.Record(ctx, "slow", driver.Results{Failures: []driver.Failure{{Row: row, Error: "broker down", Delay: time.Hour}}, MaxAttempts: 10})
		if err != nil || rec.Retried != 1 || rec.Unheld != 2 {
			t.Fatalf("Record(failed head) = %+v, %v; want 1 retried, 2 unheld", rec, err)
		}
		// Due again, and behind a head backing off: held until it is due.
		var res driver.ClaimResult
		p := claimP("next", 10)
		p.Result = &res
		wantIDs(t, "the key while its head backs off", e.claim(t, p), nil)
		if res.Moved != 2 {
			t.Fatalf("claim moved %d rows, want the 2 behind the head backing off", res.Moved)
		}
	})
	t.Run("marked sent", func(t *testing.T) {
		ids := e.slowHead(t, "marked")
		if n, err := e.Driver.MarkSent(ctx, "slow", ids[:1]); err != nil || n != 1 {
			t.Fatalf("MarkSent(head) = %d, %v", n, err)
		}
		wantIDs(t, "the key after its head was marked sent", e.claim(t, claimP("next", 10)), ids[1:])
	})
	t.Run("released", func(t *testing.T) {
		ids := e.slowHead(t, "released")
		if n, err := e.Driver.Release(ctx, "slow", ids[:1]); err != nil || n != 1 {
			t.Fatalf("Release(head) = %d, %v", n, err)
		}
		wantIDs(t, "the key after its head was given back", e.claim(t, claimP("next", 10)), ids)
	})
}

// testOrphanHoldsReleased: a head recorded without ending the holds
// behind it (an older runtime) leaves them held until a claim with
// ReleaseOrphans, which ends them and claims the key at once; holds behind
// a head still in flight stay.
func testOrphanHoldsReleased(t *testing.T, e *env) {
	e.holdsInFlight(t)
	orphan := e.slowHead(t, "orphan")
	kept := e.slowHead(t, "kept")
	e.set(t, "status = 1, sent_at = now(), lease_owner = NULL, lease_expires_at = NULL", orphan[0])
	wantIDs(t, "a claim without ReleaseOrphans", e.claim(t, claimP("next", 10)), nil)
	var res driver.ClaimResult
	p := claimP("next", 10)
	p.ReleaseOrphans = true
	p.Result = &res
	wantIDs(t, "a claim with ReleaseOrphans", e.claim(t, p), orphan[1:])
	if res.Recorded.Unheld != 2 {
		t.Fatalf("ReleaseOrphans ended %d holds, want 2", res.Recorded.Unheld)
	}
	for _, id := range kept[1:] {
		if owner, due := e.heldState(t, id); owner != dialect.HeldOwner || due {
			t.Fatalf("row %d behind a head still in flight: owner %q due %v, want held", id, owner, due)
		}
	}
}

// testHeldBehindHeldSlow: a row arriving behind rows already held behind
// a slow row is held behind that slow row too, only when the claim can
// share-lock it: while its recording is under way (here: a transaction
// holding it) the row is left alone, so the recording, which frees the
// holds it sees, never misses one made at the same moment. Recording the
// slow row then frees every row of the key.
func testHeldBehindHeldSlow(t *testing.T, e *env) {
	e.holdsInFlight(t)
	ids := e.slowHead(t, "chain") // head in flight, ids[1:] held behind it
	late := e.insert(t, seedEv{Key: "chain"})[0]
	p := claimP("other", 10)
	p.HoldBehindSlow = time.Second

	tx := e.lockRows(t, ids[0])
	wantIDs(t, "a claim while the slow row is being recorded", e.claim(t, p), nil)
	tx.Rollback() //nolint:errcheck
	if owner, due := e.heldState(t, late); owner != "" || !due {
		t.Fatalf("late row %d claimed beside the slow row's recording: owner %q due %v, want left alone", late, owner, due)
	}

	wantIDs(t, "a claim after", e.claim(t, p), nil)
	if owner, due := e.heldState(t, late); owner != dialect.HeldOwner || due {
		t.Fatalf("late row %d behind held rows: owner %q due %v, want held", late, owner, due)
	}
	rec, err := e.Driver.Record(e.ctx, "slow", driver.Results{Sent: ids[:1]})
	if err != nil || rec.Unheld != 3 {
		t.Fatalf("Record(slow row sent) = %+v, %v; want 3 unheld", rec, err)
	}
	wantIDs(t, "the key after its slow row was sent", e.claim(t, claimP("next", 10)), append(ids[1:], late))
}
