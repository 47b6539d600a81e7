package dialect

// This file binds the statements the relay (package runtime/relay) and
// the sweeper send through a driver (package runtime/driver); their text
// is in sql/<dialect>.sql.
//
// Timestamps come from the database clock only: PostgreSQL now(), MySQL
// CURRENT_TIMESTAMP(6), SQLite strftime('%Y-%m-%d %H:%M:%f','now') — the
// same expressions the DDL defaults use, so SQLite text timestamps compare
// correctly as text. A Go time.Time is never bound as a timestamp.

import (
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"
	"unicode/utf8"
)

// RelayColumns are the columns every claim returns, in scan order.
var RelayColumns = []string{"id", "event_id", "biz_type", "biz_id", "topic", "payload_version", "payload", "headers", "retry_count", "created_at"}

// HeldOwner is the lease_owner of a held row: a pending row of an ordered
// type that a claim found waiting behind a FAILED, backing-off or held row
// of its key. Its next_retry_time is pushed past now, so claims (which read
// due rows only) skip it until ReleaseHeld or the hold lapses. No relay
// may use it as its instance id.
const HeldOwner = "~held"

// MaxInList is the largest id list a single relay statement binds. Callers
// split longer lists.
const MaxInList = 1000

// ErrorTextLimit is the most bytes of a publish error stored in last_error.
const ErrorTextLimit = 2048

// RelayQueries holds the relay's statements for one outbox table. Build it
// once with NewRelayQueries; it is immutable and safe for concurrent use.
//
// Each method returns the SQL and its arguments together, so the bind order
// of a statement is decided here, next to its text. The statements are
// those of sql/<dialect>.sql, rendered for the table once.
type RelayQueries struct {
	s     *spec
	table string
	// unordered are the event types (biz_type) exempt from per-key order.
	unordered []string
	set       *stmtSet
	// The claims, prepared with the unordered list; the *Front ones
	// return their front, the *From ones also read from a position (nil
	// where the dialect cannot: ScansFrom).
	claim, overdue, blocked  *prepared
	claimFront, overdueFront *prepared
	claimFrom, overdueFrom   *prepared
	// The windows read without locks and the lock by id (MySQL),
	// prepared likewise, and the windows passing over keys (read without
	// locks, then with them, each plain and overdue).
	candidates, overdueCandidates, lock *prepared
	windowsSkip                         [2][2]*prepared
	// arrays: id lists are bound as one PostgreSQL array (see ArrayIDs).
	arrays bool
}

// The relay's statements (see sql/<dialect>.sql), with their arguments in
// the order the methods below pass them.
var (
	// One statement for Claim and ClaimOverdue: the overdue_on section
	// adds the created_at cutoff.
	// MySQL's has a locking section (see ClaimByCandidates).
	// max_rows is written into the text: see asLiteral.
	// The front section (ClaimFrom, PostgreSQL) returns the claim's
	// front, the from section starts its read there (of one stripe of
	// the keys with stripes 2 or more). MySQL's skip_on
	// section passes over the keys in skip (see ClaimCandidates).
	sClaim = define(nil, "RelayClaim", "owner", "lease", "max_rows", "hold", "overdue", "young", "from_us", "from_id", "skip", "stripes", "stripe").
		withFixed("unordered", "overdue_on", "locking", "front", "from", "skip_on").mayOmit("owner", "lease", "hold", "overdue", "young", "from_us", "from_id", "skip", "stripes", "stripe").
		asLiteral("max_rows")
	sClaimLock    = define(needCandidates, "RelayClaimLock", "ids", "max_rows").withFixed("unordered")
	sClaimBlocked = define(needClaimInTx, "RelayClaimBlocked", "ids", "hold").withFixed("unordered")
	sClaimLease   = define(needClaimInTx, "RelayClaimLease", "owner", "lease", "ids")
	sClaimHold    = define(needClaimInTx, "RelayClaimHold", "hold_until", "ids")
	sReleaseHeld  = define(nil, "RelayReleaseHeld", "ids")
	sLockKeys     = define(needRowLocks, "RelayLockKeys", "ids")

	sReleaseInFlightHeld      = define(needHoldInFlight, "RelayReleaseInFlightHeld", "stamps")
	sReleaseInFlightHeldArray = define(needHoldInFlightArray, "RelayReleaseInFlightHeldArray", "stamps")
	sReleaseOrphanHeld        = define(needHoldInFlight, "RelayReleaseOrphanHeld")

	sMarkSent    = define(nil, "RelayMarkSent", "owner", "ids")
	sMarkRetry   = define(nil, "RelayMarkRetry", "owner", "id", "last_error", "delay", "max_attempts")
	sRelease     = define(nil, "RelayRelease", "owner", "ids")
	sExtendLease = define(nil, "RelayExtendLease", "owner", "ids", "lease")
	sRequeue     = define(nil, "RelayRequeue", "ids")
	// Each id with its own last_error and delay (lists in the order of
	// ids): dialects with holdEach.
	sMarkRetryEach = define(needHoldEach, "RelayMarkRetryEach", "owner", "ids", "last_error", "delay", "max_attempts")

	sMarkSentArray    = define(needArrayIDs, "RelayMarkSentArray", "owner", "ids")
	sReleaseArray     = define(needArrayIDs, "RelayReleaseArray", "owner", "ids")
	sExtendLeaseArray = define(needArrayIDs, "RelayExtendLeaseArray", "owner", "ids", "lease")
	sRequeueArray     = define(needArrayIDs, "RelayRequeueArray", "ids")
)

// NewRelayQueries returns the relay statements of dialect d for outbox
// table table. Events whose biz_type is in unordered are published without
// per-key order; all other types are ordered by id within their key (biz_id).
func NewRelayQueries(d Dialect, table string, unordered []string) (*RelayQueries, error) {
	s := specOf(d)
	if s == nil {
		return nil, errUnknown(d)
	}
	if err := CheckIdentifier("relay: outbox table name", table); err != nil {
		return nil, err
	}
	q := &RelayQueries{s: s, table: table, unordered: append([]string(nil), unordered...)}
	tb := tables{outbox: table}
	q.set = s.statements(tb)
	c := s.claims(tb, q.unordered)
	q.claim, q.overdue, q.blocked = c.claim, c.overdue, c.blocked
	q.claimFront, q.overdueFront = c.claimFront, c.overdueFront
	q.claimFrom, q.overdueFrom = c.claimFrom, c.overdueFrom
	q.candidates, q.overdueCandidates, q.lock = c.candidates, c.overdueCandidates, c.lock
	q.windowsSkip = c.windowsSkip
	return q, nil
}

// claimSet holds the claims prepared for one unordered list.
type claimSet struct {
	claim, overdue, blocked             *prepared
	claimFront, overdueFront            *prepared
	claimFrom, overdueFrom              *prepared
	candidates, overdueCandidates, lock *prepared
	windowsSkip                         [2][2]*prepared // [locking][overdue]
}

type claimKey struct {
	set       setKey
	unordered string // the list joined with NUL
}

// claimSets caches the claims per dialect, table and unordered list, like
// sets: a relay's statements are rendered once per configuration.
var claimSets sync.Map // claimKey → *claimSet

func (s *spec) claims(tb tables, unordered []string) *claimSet {
	k := claimKey{setKey{s.dialect, tb}, strings.Join(unordered, "\x00")}
	if v, ok := claimSets.Load(k); ok {
		return v.(*claimSet)
	}
	c := &claimSet{
		claim:   s.mustPrepare(sClaim, tb, map[string][]string{"unordered": unordered, "locking": {"1"}}),
		overdue: s.mustPrepare(sClaim, tb, map[string][]string{"unordered": unordered, "overdue_on": {"1"}, "locking": {"1"}}),
	}
	if s.scanFrom {
		on := []string{"1"}
		c.claimFront = s.mustPrepare(sClaim, tb, map[string][]string{"unordered": unordered, "locking": on, "front": on})
		c.overdueFront = s.mustPrepare(sClaim, tb, map[string][]string{"unordered": unordered, "overdue_on": on, "locking": on, "front": on})
		c.claimFrom = s.mustPrepare(sClaim, tb, map[string][]string{"unordered": unordered, "locking": on, "front": on, "from": on})
		c.overdueFrom = s.mustPrepare(sClaim, tb, map[string][]string{"unordered": unordered, "overdue_on": on, "locking": on, "front": on, "from": on})
	}
	fixed := map[string][]string{"unordered": unordered}
	if s.claimInTx {
		c.blocked = s.mustPrepare(sClaimBlocked, tb, fixed)
	}
	if s.claimCandidates {
		c.candidates = s.mustPrepare(sClaim, tb, fixed)
		c.overdueCandidates = s.mustPrepare(sClaim, tb, map[string][]string{"unordered": unordered, "overdue_on": {"1"}})
		c.lock = s.mustPrepare(sClaimLock, tb, fixed)
		for locking := range 2 {
			for overdue := range 2 {
				f := map[string][]string{"unordered": unordered, "skip_on": {"1"}}
				if locking == 1 {
					f["locking"] = []string{"1"}
				}
				if overdue == 1 {
					f["overdue_on"] = []string{"1"}
				}
				c.windowsSkip[locking][overdue] = s.mustPrepare(sClaim, tb, f)
			}
		}
	}
	v, _ := claimSets.LoadOrStore(k, c)
	return v.(*claimSet)
}

// Dialect returns the queries' dialect.
func (q *RelayQueries) Dialect() Dialect { return q.s.dialect }

// ArrayIDs returns a copy of PostgreSQL queries whose id-list statements
// (MarkSent, Release, ExtendLease, Requeue) bind the whole list as one bigint[]
// parameter ("id = ANY($n)") instead of one placeholder per id: the text
// no longer depends on the list length, so a driver that caches prepared
// statements (native pgx) prepares each once, and lists need no splitting
// at MaxInList. Bind the ids as a []int64. On other dialects it returns q.
func (q *RelayQueries) ArrayIDs() *RelayQueries {
	if !q.s.arrayIDs {
		return q
	}
	c := *q
	c.arrays = true
	return &c
}

// idStmt returns list, or its array form under ArrayIDs.
func (q *RelayQueries) idStmt(list, array *stmtDef) *prepared {
	if q.arrays {
		return q.set.get(array)
	}
	return q.set.get(list)
}

// Table returns the outbox table name.
func (q *RelayQueries) Table() string { return q.table }

// ClaimInTransaction reports how Claim is run. False (PostgreSQL):
// Claim is one statement that leases or holds the rows and returns them
// with their new lease_owner (ClaimColumns): run it on its own and keep the
// rows whose lease_owner is the claiming owner. True (MySQL/MariaDB, which
// have no UPDATE ... RETURNING, and SQLite): in one short transaction
// (MySQL: READ COMMITTED) run Claim, which locks and returns the
// candidates (RelayColumns; on MySQL, see ClaimByCandidates for how they
// are read and locked), then ClaimBlocked, which returns the ids not
// to lease, each with hold_until; run ClaimLease on the rest and ClaimHold
// for each id whose hold_until is not NULL; commit. (On MySQL, when
// FreeToLease says so of what ClaimLock returned, no row waits: skip
// ClaimBlocked.)
//
// The candidates are a window of at most limit due, unleased rows, in
// the order they became due (the due index), so a claim reads a bounded
// number of rows however big the backlog, and never reads held rows (their
// next_retry_time is in the future).
//
// Per-key order: a candidate c of an ordered type is leased only if every
// older unsent row o of its key (o.status <> 1, o of an ordered type) is
// in the window too, locked by this claim. Otherwise the nearest such o
// decides: when o is FAILED, c is held for hold (ReleaseHeld, run by
// Requeue, ends it early); when o is backing off or held itself, c is held
// until o's next_retry_time, when o is tried again (and c is looked at
// again with it); when o has been in flight for young or more and the
// dialect HoldsInFlight, c is held until o is recorded
// (InFlightHoldStamp); when o is in flight otherwise, or outside the
// window, c is left alone. A held row has lease_owner HeldOwner and is
// otherwise pending: status, attempts and the rest are unchanged.
func (q *RelayQueries) ClaimInTransaction() bool { return q.s.claimInTx }

// ClaimColumns are the columns a one-statement claim returns:
// RelayColumns, then lease_owner (the owner for leased rows, HeldOwner for
// held ones); a ClaimFrom statement then returns FrontColumns too.
var ClaimColumns = append(append([]string(nil), RelayColumns...), "lease_owner")

// FrontColumns are the columns ClaimFrom's statement returns after
// ClaimColumns: its front (next_retry_time in microseconds since the Unix
// epoch, and id; NULL when no row is pending from where it read), the
// same in every row.
var FrontColumns = []string{"front_us", "front_id"}

// Claim returns the claim statement for owner with lease lease, at most
// limit candidates, holding blocked rows for hold; see ClaimInTransaction
// for how to run it. On dialects with HoldsInFlight, rows behind a row of
// their key in flight for young or more are held until it is recorded.
func (q *RelayQueries) Claim(owner string, lease time.Duration, limit int, hold, young time.Duration) (string, []any) {
	return q.claim.render(owner, lease, limit, hold, time.Duration(0), young, int64(0), int64(0), nil, 0, 0)
}

// ClaimOverdue is Claim restricted to rows created at least overdueAfter
// ago (by the database clock): the sweeper's rescue pass, which leaves
// younger rows to the relay. Per-key order holds as in Claim. It is run
// like Claim (see ClaimInTransaction).
func (q *RelayQueries) ClaimOverdue(owner string, lease time.Duration, limit int, hold, overdueAfter, young time.Duration) (string, []any) {
	return q.overdue.render(owner, lease, limit, hold, overdueAfter, young, int64(0), int64(0), nil, 0, 0)
}

// ScansFrom reports whether a claim can return its front, the oldest
// pending row from where it read, and start its read of due rows at a
// position (ClaimFrom; PostgreSQL).
//
// The due index keeps an entry for every row sent since the last VACUUM
// (marking a row sent takes it out of the index's predicate, but its old
// entry stays until VACUUM removes it), and those entries sort first:
// while a backlog drains, every claim read past all of them, and a claim
// took over twice as long after 200,000 rows as at the start. A claim
// that starts at the front of the previous one reads past the entries of
// the rows sent since then only.
func (q *RelayQueries) ScansFrom() bool { return q.s.scanFrom }

// ClaimFrom is Claim that also returns its front (FrontColumns) and,
// when id is not 0, reads the due rows from position (dueMicros, id) in
// the due index's order (next_retry_time, then id) instead of from the
// first: rows due before it are not claimed. dueMicros is a
// next_retry_time in microseconds since the Unix epoch, as a claim
// returned it in its front; it is no clock reading. overdueAfter > 0
// makes it ClaimOverdue's. With id not 0 and stripes 2 or more it
// claims only rows of the keys of stripe stripe (0 to stripes-1; see
// driver.ClaimParams.Stripe), and reads past the others. It returns ""
// when the dialect cannot (see ScansFrom).
func (q *RelayQueries) ClaimFrom(owner string, lease time.Duration, limit int, hold, overdueAfter, young time.Duration, dueMicros, id int64, stripes, stripe int) (string, []any) {
	p := q.claimFrom
	switch {
	case overdueAfter > 0 && id == 0:
		p = q.overdueFront
	case overdueAfter > 0:
		p = q.overdueFrom
	case id == 0:
		p = q.claimFront
	}
	return p.render(owner, lease, limit, hold, overdueAfter, young, dueMicros, id, nil, stripes, stripe)
}

// HoldsInFlight reports whether a claim holds the rows behind a row of
// their key in flight for a while (PostgreSQL): such rows get
// next_retry_time InFlightHoldStamp(that row's id) and lease_owner
// HeldOwner, so claims stop reading past them, and every recording must
// run ReleaseInFlightHeld for the rows it recorded.
func (q *RelayQueries) HoldsInFlight() bool { return q.s.holdInFlight }

// inFlightHoldBase is the stamp of row id 0 (see InFlightHoldStamp); the
// same constant is written in the claim of sql/postgres.sql.
var inFlightHoldBase = time.Date(3000, 1, 1, 0, 0, 0, 0, time.UTC)

// InFlightHoldStamp is the next_retry_time a claim gives the rows it
// holds behind row id while id is in flight: 3000-01-01 UTC plus id
// microseconds. Far in the future, so never due, and one per row, so a
// recording finds exactly the rows held behind what it recorded with one
// probe of the due index each.
func InFlightHoldStamp(id int64) time.Time {
	return inFlightHoldBase.Add(time.Duration(id) * time.Microsecond)
}

// InFlightHoldOf reports whether a pending row with lease_owner owner
// and next_retry_time next is held until row head, an older row of its
// key whose publish was slow, is recorded (see HoldsInFlight).
func InFlightHoldOf(owner string, next time.Time) (head int64, ok bool) {
	if owner != HeldOwner || !IsInFlightHold(next) {
		return 0, false
	}
	return int64(next.Sub(inFlightHoldBase) / time.Microsecond), true
}

// IsInFlightHold reports whether next_retry_time t is an InFlightHoldStamp
// (t then is no retry time: a backoff never reaches year 3000).
func IsInFlightHold(t time.Time) bool { return !t.Before(inFlightHoldBase) }

// ReleaseInFlightHeld makes the rows held behind the ids (recorded: sent,
// failed or given back) due again. Run it in the recording's transaction,
// after the statements that recorded the ids. On dialects without
// HoldsInFlight it returns "", nil. Callers split id lists longer than
// MaxInList unless ArrayIDs.
func (q *RelayQueries) ReleaseInFlightHeld(ids []int64) (string, []any) {
	if !q.s.holdInFlight {
		return "", nil
	}
	stamps := make([]time.Time, len(ids))
	for i, id := range ids {
		stamps[i] = InFlightHoldStamp(id)
	}
	return q.idStmt(sReleaseInFlightHeld, sReleaseInFlightHeldArray).render(stamps)
}

// ReleaseOrphanHeld makes due again the rows held behind a row that is no
// longer in flight but was recorded without releasing them. On dialects
// without HoldsInFlight it returns "", nil.
func (q *RelayQueries) ReleaseOrphanHeld() (string, []any) {
	if !q.s.holdInFlight {
		return "", nil
	}
	return q.set.get(sReleaseOrphanHeld).render()
}

// ClaimByCandidates reports whether a claim transaction reads its window
// in two steps (MySQL/MariaDB): ClaimCandidates, a read without locks of
// more ids than it leases, then ClaimLock, which locks up to the limit of
// them, of which the rows BehindNotLocked names are left alone; when
// fewer than the limit are left and the candidates filled theirs (other
// claims hold rows of the window), ClaimWindow, the same window read with
// locks (it returns Candidates too) and passing over the keys
// BehindNotLocked named, and ClaimLock of what it returned take their
// place. Then ClaimBlocked (unless FreeToLease), ClaimLease and
// ClaimHold, as in ClaimInTransaction. The rows leased are the same as
// Claim's but for which of the window's rows: InnoDB's locking read of
// the due index costs a clustered-index read for each entry left by a
// row sent since the last purge (see sql/mysql.sql).
func (q *RelayQueries) ClaimByCandidates() bool { return q.candidates != nil }

// ClaimCandidates returns the window read without locks: the ids and
// keys (Candidate) of at most limit due, unleased rows in due order, not
// behind a row of their key in flight; with overdueAfter > 0, only rows
// created at least that long ago (ClaimOverdue). Rows whose key is in
// skip are passed over: keys of which the claiming relay is publishing
// rows (driver.ClaimParams.SkipKeys), whose other rows could not be
// leased. With them the window reads the due index for the other keys
// only (schema version 3 has biz_id in it), instead of every waiting row
// of theirs. skip holds at most MaxInList keys. On dialects without
// ClaimByCandidates it returns "", nil.
func (q *RelayQueries) ClaimCandidates(limit int, overdueAfter time.Duration, skip []string) (string, []any) {
	return q.window(false, limit, overdueAfter, skip)
}

// ClaimWindow is ClaimCandidates read with locks (FOR UPDATE SKIP
// LOCKED), the window a claim falls back to when other claims hold too
// many candidates (see ClaimByCandidates): Claim's or ClaimOverdue's
// statement, passing over the keys in skip. On dialects without
// ClaimByCandidates it returns "", nil.
func (q *RelayQueries) ClaimWindow(limit int, overdueAfter time.Duration, skip []string) (string, []any) {
	return q.window(true, limit, overdueAfter, skip)
}

func (q *RelayQueries) window(locking bool, limit int, overdueAfter time.Duration, skip []string) (string, []any) {
	if q.candidates == nil {
		return "", nil
	}
	var p *prepared
	switch over := overdueAfter > 0; {
	case len(skip) > 0:
		p = q.windowsSkip[b2i(locking)][b2i(over)]
	case locking && over:
		p = q.overdue
	case locking:
		p = q.claim
	case over:
		p = q.overdueCandidates
	default:
		p = q.candidates
	}
	return p.render("", time.Duration(0), limit, time.Duration(0), overdueAfter, time.Duration(0), int64(0), int64(0), skip, 0, 0)
}

func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
}

// ClaimLock locks and returns, in id order, up to limit of the candidates
// ids that are still due and unleased (RelayColumns, then LockProbe's two
// columns), skipping rows other transactions hold. On dialects without ClaimByCandidates it returns
// "", nil.
func (q *RelayQueries) ClaimLock(ids []int64, limit int) (string, []any) {
	if q.lock == nil {
		return "", nil
	}
	return q.lock.render(ids, limit)
}

// A Candidate is a row of a claim's window on MySQL/MariaDB:
// ClaimCandidates and ClaimWindow return its id and its key.
type Candidate struct {
	ID  int64
	Key string
}

// LockProbe is what ClaimLock returned about one locked row: its id, its
// key and its two columns after RelayColumns, outside_front (the id of
// the oldest pending row of the row's key that is not among the ids
// ClaimLock was given: its own when there is none, or its type is
// unordered) and failed_before (1 when an older row of its key is
// FAILED). Rows locked together are free to lease, without ClaimBlocked,
// when FreeToLease says so.
type LockProbe struct {
	ID           int64
	Key          string
	OutsideFront int64
	FailedBefore bool
}

// FreeToLease reports whether every row ClaimLock locked of the
// candidates it was given may be leased as it is: no FAILED row is before
// it, and every older pending row of its key is locked beside it (none
// of the key's pending rows outside the candidates is older, and every
// candidate of its key older than it was locked: a claim leaves the
// rows behind one that was not alone, see BehindNotLocked, and judges
// the rest). When it returns false, the claim runs ClaimBlocked, which
// tells exactly which rows wait and which to hold.
func FreeToLease(given []Candidate, locked []LockProbe) bool {
	left := notLocked(given, locked)
	for _, r := range locked {
		if id, ok := left[r.Key]; r.FailedBefore || r.OutsideFront < r.ID || ok && id < r.ID {
			return false
		}
	}
	return true
}

// notLocked returns, per key, the oldest of the candidates given that
// ClaimLock did not lock (nil when it locked them all).
func notLocked(given []Candidate, locked []LockProbe) map[string]int64 {
	mine := make(map[int64]bool, len(locked))
	for _, r := range locked {
		mine[r.ID] = true
	}
	var left map[string]int64
	for _, c := range given {
		if mine[c.ID] {
			continue
		}
		if left == nil {
			left = map[string]int64{}
		}
		if id, ok := left[c.Key]; !ok || c.ID < id {
			left[c.Key] = c.ID
		}
	}
	return left
}

// BehindNotLocked returns the ids of the rows ClaimLock locked of the
// candidates given that are behind an older candidate of their key it
// did not lock (another claim holds that one, or it is no longer due),
// and their keys. None of them can be leased by this claim, and no other
// statement is needed to tell: the claim leaves them alone (neither
// leased nor held) and, when it reads its window again, passes over
// their keys (driver.ClaimParams.SkipKeys). FreeToLease then judges the
// rest. Two claims of one relay running side by side meet this way when
// a key with a long backlog has just had its rows recorded: both find
// its next rows free, one leases them, and the other locks the rows
// after those. Asking RelayClaimBlocked about each of them instead took
// 100–275 ms for 100 rows of a key 10,000 rows long on MariaDB 10.11,
// and the claim leased nothing.
func BehindNotLocked(given []Candidate, locked []LockProbe) (ids map[int64]bool, keys []string) {
	left := notLocked(given, locked)
	for _, r := range locked {
		if id, ok := left[r.Key]; ok && id < r.ID {
			if ids == nil {
				ids = map[int64]bool{}
			}
			if !slices.Contains(keys, r.Key) {
				keys = append(keys, r.Key)
			}
			ids[r.ID] = true
		}
	}
	return ids, keys
}

// ClaimBlocked (MySQL, SQLite) returns the ids among the just locked ids
// that must not be leased, with a second column, hold_until: NULL to leave
// the id alone, else the value to pass to ClaimHold. hold is how long a
// row behind a FAILED one is held. Run it in the claim transaction after
// Claim. On PostgreSQL it returns "", nil.
func (q *RelayQueries) ClaimBlocked(ids []int64, hold time.Duration) (string, []any) {
	return q.blocked.render(ids, hold)
}

// ClaimLease (MySQL, SQLite) leases the locked, unblocked ids to owner. On
// other dialects it returns "", nil.
func (q *RelayQueries) ClaimLease(owner string, lease time.Duration, ids []int64) (string, []any) {
	if !q.s.claimInTx {
		return "", nil
	}
	return q.set.get(sClaimLease).render(owner, lease, ids)
}

// ClaimHold (MySQL, SQLite) gives the ids next_retry_time holdUntil, the
// value ClaimBlocked returned for them (bound back as it was read), and
// lease_owner HeldOwner when that is in the future. On dialects that hold
// each row with its own value (HoldsEach: MySQL), holdUntil is a []any of
// one value per id, in the order of ids. Callers split id lists longer
// than MaxInList. On PostgreSQL it returns "", nil.
func (q *RelayQueries) ClaimHold(holdUntil any, ids []int64) (string, []any) {
	if !q.s.claimInTx {
		return "", nil
	}
	if l, ok := holdUntil.([]any); q.s.holdEach && (!ok || len(l) != len(ids)) {
		panic(fmt.Sprintf("dialect: ClaimHold of %d ids with %T: want a []any of one value per id", len(ids), holdUntil))
	}
	return q.set.get(sClaimHold).render(holdUntil, ids)
}

// HoldsEach reports whether ClaimHold takes a value per id (one statement
// for every row a claim holds), not one value for all its ids.
func (q *RelayQueries) HoldsEach() bool { return q.s.holdEach }

// ReleaseHeld makes the held rows of the keys of ids due again: the row
// holding them back (one of ids) was sent or requeued. Callers split id
// lists longer than MaxInList.
func (q *RelayQueries) ReleaseHeld(ids []int64) (string, []any) {
	return q.set.get(sReleaseHeld).render(ids)
}

// LockKeys locks the pending rows of the keys of ids (PostgreSQL, MySQL;
// on SQLite it returns "", nil). A requeue runs it after Requeue and
// before ReleaseHeld, in one transaction: it waits for every claim that
// locked one of those rows (a row the claim may hold, or the row it holds
// one behind) to commit, so that ReleaseHeld sees the holds they made, and
// a claim after it skips the locked rows instead of holding them.
func (q *RelayQueries) LockKeys(ids []int64) (string, []any) {
	if !q.s.rowLocks {
		return "", nil
	}
	return q.set.get(sLockKeys).render(ids)
}

// MarkSent marks the ids sent (status 1, sent_at now, lease cleared),
// fenced by the lease: only rows still leased to owner and pending change.
// The rows-affected count tells how many were still owned.
func (q *RelayQueries) MarkSent(owner string, ids []int64) (string, []any) {
	return q.idStmt(sMarkSent, sMarkSentArray).render(owner, ids)
}

// MarkRetry records a failed publish of row id, fenced by the lease:
// retry_count + 1, last_error errText (truncated to ErrorTextLimit bytes),
// next_retry_time now + delay, the lease cleared, and status 2 (failed)
// once the new retry_count reaches maxAttempts.
func (q *RelayQueries) MarkRetry(owner string, id int64, errText string, delay time.Duration, maxAttempts int) (string, []any) {
	return q.set.get(sMarkRetry).render(owner, id, TruncateError(errText), delay, maxAttempts)
}

// RetryEach is one failure of MarkRetryEach.
type RetryEach struct {
	ID    int64
	Error string
	Delay time.Duration
}

// MarkRetryEach records the failures fs as MarkRetry records each of
// them, with maxAttempts, in one statement (callers split lists longer
// than MaxInList). Its row count is the total: callers that must know
// which rows became FAILED record those with MarkRetry. On dialects
// without it (every one but MySQL) it returns "", nil.
func (q *RelayQueries) MarkRetryEach(owner string, fs []RetryEach, maxAttempts int) (string, []any) {
	if !q.s.holdEach {
		return "", nil
	}
	ids := make([]int64, len(fs))
	errs := make([]any, len(fs))
	delays := make([]any, len(fs))
	for i, f := range fs {
		ids[i], errs[i], delays[i] = f.ID, TruncateError(f.Error), f.Delay
	}
	return q.set.get(sMarkRetryEach).render(owner, ids, errs, delays, maxAttempts)
}

// Release gives the ids back unpublished (lease cleared, nothing else
// changed), fenced by the lease.
func (q *RelayQueries) Release(owner string, ids []int64) (string, []any) {
	return q.idStmt(sRelease, sReleaseArray).render(owner, ids)
}

// ExtendLease pushes the lease of the ids still leased to owner and
// pending to now + lease (the relay's heartbeat while a batch publishes),
// fenced like MarkSent: rows another owner took over, or already recorded,
// are left alone. The rows-affected count tells how many are still owned.
func (q *RelayQueries) ExtendLease(owner string, ids []int64, lease time.Duration) (string, []any) {
	return q.idStmt(sExtendLease, sExtendLeaseArray).render(owner, ids, lease)
}

// Requeue makes failed rows pending again: status 0, retry_count 0, due
// now, lease cleared. last_error is kept (the last failure stays visible
// until the next attempt overwrites it or the row is sent). Rows that are
// not failed are left alone.
func (q *RelayQueries) Requeue(ids []int64) (string, []any) {
	return q.idStmt(sRequeue, sRequeueArray).render(ids)
}

// TruncateError makes s storable as last_error: bytes that are not UTF-8
// become U+FFFD, NUL bytes are dropped (PostgreSQL refuses both in a text
// column, MySQL in strict mode the first, and either would fail the whole
// recording), and it is cut to at most ErrorTextLimit bytes on a UTF-8
// boundary. Publish errors quote what brokers and clients were given, so
// they may hold any bytes.
func TruncateError(s string) string {
	if !utf8.ValidString(s) {
		s = strings.ToValidUTF8(s, "\uFFFD")
	}
	if strings.IndexByte(s, 0) >= 0 {
		s = strings.ReplaceAll(s, "\x00", "")
	}
	if len(s) <= ErrorTextLimit {
		return s
	}
	cut := ErrorTextLimit
	for cut > 0 && s[cut]&0xC0 == 0x80 { // inside a multi-byte rune
		cut--
	}
	return s[:cut]
}
