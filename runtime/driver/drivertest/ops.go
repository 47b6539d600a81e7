package drivertest

// The monitor's and janitor's part of the conformance suite: Stats,
// DeleteSent, ArchiveSent and DeleteInbox, run by Run. The seeding helpers
// (OpsSeed, OpsSeedInbox, CreateArchiveTable) are exported for the
// monitor's and janitor's own tests.
//
// Rows are aged with the database clock (an UPDATE setting created_at,
// sent_at, ... to "now minus d"), never with a bound Go time, and every
// age in the fixtures is far from every threshold, so no test depends on
// how fast it runs.

import (
	"context"
	"crypto/rand"
	"database/sql"
	"fmt"
	"reflect"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/outboxgen/outboxgen/runtime/dialect"
	"github.com/outboxgen/outboxgen/runtime/driver"
	"github.com/outboxgen/outboxgen/templates"
)

// runOps runs the monitor's and janitor's part of the suite; Run calls it.
func runOps(t *testing.T, open func(t *testing.T) Env) {
	t.Run("StatsEmpty", func(t *testing.T) { opsTestStatsEmpty(t, open(t)) })
	t.Run("Stats", func(t *testing.T) { opsTestStats(t, open(t)) })
	t.Run("DeleteSent", func(t *testing.T) { opsTestDeleteSent(t, open(t)) })
	t.Run("DeleteSentBound", func(t *testing.T) { opsTestDeleteSentBound(t, open(t)) })
	t.Run("ArchiveSent", func(t *testing.T) { opsTestArchiveSent(t, open(t)) })
	t.Run("ArchiveSentMissingTable", func(t *testing.T) { opsTestArchiveMissing(t, open(t)) })
	t.Run("DeleteInbox", func(t *testing.T) { opsTestDeleteInbox(t, open(t)) })
	t.Run("BadLimit", func(t *testing.T) { opsTestBadLimit(t, open(t)) })
	t.Run("Admin", func(t *testing.T) { runAdmin(t, open) })
}

const (
	opsDay       = 24 * time.Hour
	opsRetention = 7 * opsDay
)

func opsTestStatsEmpty(t *testing.T, env Env) {
	st, err := env.Driver.Stats(context.Background(), 10*time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if st != (driver.Stats{}) {
		t.Fatalf("Stats on an empty table = %+v, want all zero", st)
	}
}

// OpsStatsFixture seeds one row in every state the monitor tells apart, and
// returns the Stats expected with a 10-minute StaleAfter (OldestPendingAge
// is the lower bound: two hours).
func OpsStatsFixture(t testing.TB, db *sql.DB, d dialect.Dialect, tables driver.Tables) driver.Stats {
	t.Helper()
	expired, live := -time.Minute, time.Hour
	OpsSeed(t, db, d, tables.Outbox,
		OpsSeedRow{Count: 2, Status: 0},                                                // pending, fresh
		OpsSeedRow{Count: 2, Status: 0, CreatedAgo: time.Hour},                         // pending, stale
		OpsSeedRow{Count: 1, Status: 0, CreatedAgo: 2 * time.Hour},                     // pending, stale, the oldest
		OpsSeedRow{Count: 1, Status: 0, Lease: &expired},                               // pending, its relay died
		OpsSeedRow{Count: 1, Status: 0, Lease: &live},                                  // pending, claimed right now
		OpsSeedRow{Count: 1, Status: 2, CreatedAgo: 3 * time.Hour},                     // failed (older than every pending row)
		OpsSeedRow{Count: 2, Status: 1, CreatedAgo: 5 * time.Hour, SentAgo: time.Hour}, // sent
	)
	return driver.Stats{Pending: 7, OldestPendingAge: 2 * time.Hour, Stale: 3, Failed: 1, ExpiredLeases: 1}
}

func opsTestStats(t *testing.T, env Env) {
	want := OpsStatsFixture(t, env.DB, env.Driver.Dialect(), env.Driver.Tables())
	st, err := env.Driver.Stats(context.Background(), 10*time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	OpsCheckStats(t, st, want)

	// A StaleAfter longer than every row's age: nothing is stale.
	st, err = env.Driver.Stats(context.Background(), 3*time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	if st.Stale != 0 || st.Pending != want.Pending {
		t.Errorf("Stats(3h) = %+v, want Stale 0 and Pending %d", st, want.Pending)
	}
}

// OpsCheckStats compares got with want exactly, except OldestPendingAge,
// which must lie in [want, want+10min) (the test's own run time).
func OpsCheckStats(t testing.TB, got, want driver.Stats) {
	t.Helper()
	age := got.OldestPendingAge
	g, w := got, want
	g.OldestPendingAge, w.OldestPendingAge = 0, 0
	if g != w {
		t.Errorf("Stats = %+v, want %+v (ignoring OldestPendingAge)", got, want)
	}
	if age < want.OldestPendingAge || age >= want.OldestPendingAge+10*time.Minute {
		t.Errorf("OldestPendingAge = %s, want %s (up to 10 minutes more)", age, want.OldestPendingAge)
	}
}

// opsJanitorFixture seeds rows the janitor must keep and old sent rows it
// must remove. FAILED and pending rows get an old sent_at too, to prove
// the status guard. It returns the ids of the old sent rows.
func opsJanitorFixture(t *testing.T, env Env, oldSent int) (old []int64, keep []int64) {
	t.Helper()
	d, tb := env.Driver.Dialect(), env.Driver.Tables()
	ids := OpsSeed(t, env.DB, d, tb.Outbox,
		OpsSeedRow{Count: oldSent, Status: 1, CreatedAgo: 9 * opsDay, SentAgo: 8 * opsDay},
		OpsSeedRow{Count: 2, Status: 1, CreatedAgo: 2 * opsDay, SentAgo: opsDay},       // young sent
		OpsSeedRow{Count: 2, Status: 2, CreatedAgo: 30 * opsDay, SentAgo: 30 * opsDay}, // old failed
		OpsSeedRow{Count: 2, Status: 0, CreatedAgo: 30 * opsDay, SentAgo: 30 * opsDay}, // old pending
	)
	return ids[0], append(append(append([]int64(nil), ids[1]...), ids[2]...), ids[3]...)
}

func opsTestDeleteSent(t *testing.T, env Env) {
	ctx := context.Background()
	old, keep := opsJanitorFixture(t, env, 5)
	tb := env.Driver.Tables()
	var got []int64
	for i, want := range []int64{2, 2, 1, 0} {
		n, err := env.Driver.DeleteSent(ctx, opsRetention, 2)
		if err != nil {
			t.Fatal(err)
		}
		if n != want {
			t.Fatalf("DeleteSent call %d deleted %d rows, want %d", i+1, n, want)
		}
		if i == 0 {
			// Lowest ids first.
			got = OpsIDs(t, env.DB, tb.Outbox)
			if want := append(append([]int64(nil), old[2:]...), keep...); !reflect.DeepEqual(got, opsSorted(want)) {
				t.Fatalf("after the first batch the table holds ids %v, want %v", got, opsSorted(want))
			}
		}
	}
	if got := OpsIDs(t, env.DB, tb.Outbox); !reflect.DeepEqual(got, opsSorted(keep)) {
		t.Fatalf("after DeleteSent the table holds ids %v, want %v (young sent, failed, pending)", got, opsSorted(keep))
	}
}

// opsTestDeleteSentBound: DeleteSent reads no row past the last one
// created before the cutoff (dialect.SentBound). A row sent before the
// cutoff whose id is past a younger row (its transaction started before
// the younger row's and inserted after it) waits for a later call, once
// the rows before it are old enough; the archive likewise.
func opsTestDeleteSentBound(t *testing.T, env Env) {
	ctx := context.Background()
	d, tb := env.Driver.Dialect(), env.Driver.Tables()
	ids := OpsSeed(t, env.DB, d, tb.Outbox,
		OpsSeedRow{Count: 3, Status: 1, CreatedAgo: 9 * opsDay, SentAgo: 8 * opsDay},
		OpsSeedRow{Count: 4, Status: 1, CreatedAgo: opsDay, SentAgo: opsDay / 2},
		OpsSeedRow{Count: 1, Status: 1, CreatedAgo: 9 * opsDay, SentAgo: 8 * opsDay}, // past the young rows
	)
	n, err := env.Driver.DeleteSent(ctx, opsRetention, 100)
	if err != nil || n != 3 {
		t.Fatalf("DeleteSent: %d rows, %v; want the 3 old rows before the young ones", n, err)
	}
	want := opsSorted(append(append([]int64(nil), ids[1]...), ids[2]...))
	if got := OpsIDs(t, env.DB, tb.Outbox); !reflect.DeepEqual(got, want) {
		t.Fatalf("after DeleteSent the table holds ids %v, want %v", got, want)
	}
	// The young rows age past the cutoff: the row after them goes too.
	opsExec(t, env.DB, "UPDATE "+tb.Outbox+" SET created_at = "+OpsAgo(d, 9*opsDay)+", sent_at = "+OpsAgo(d, 8*opsDay))
	archive := tb.Outbox + "_archive"
	CreateArchiveTable(t, env.DB, d, tb, archive)
	if n, err := env.Driver.ArchiveSent(ctx, archive, opsRetention, 100); err != nil || n != 5 {
		t.Fatalf("ArchiveSent: %d rows, %v; want 5", n, err)
	}
	if n, err := env.Driver.DeleteSent(ctx, opsRetention, 100); err != nil || n != 0 {
		t.Fatalf("DeleteSent on an empty table: %d rows, %v", n, err)
	}
	// Sent before they were created (a clock stepped back): the bound
	// counts sent_at too.
	OpsSeed(t, env.DB, d, tb.Outbox, OpsSeedRow{Count: 2, Status: 1, CreatedAgo: time.Minute, SentAgo: 8 * opsDay})
	if n, err := env.Driver.DeleteSent(ctx, opsRetention, 100); err != nil || n != 2 {
		t.Fatalf("DeleteSent of rows sent before their created_at: %d rows, %v; want 2", n, err)
	}
	// A FAILED row created in the future (a clock stepped forward) at the
	// lowest id does not end the search: the old rows after it go.
	OpsSeed(t, env.DB, d, tb.Outbox,
		OpsSeedRow{Count: 1, Status: 2, CreatedAgo: -2 * opsDay},
		OpsSeedRow{Count: 3, Status: 1, CreatedAgo: 29 * opsDay, SentAgo: 29 * opsDay})
	if n, err := env.Driver.DeleteSent(ctx, opsRetention, 100); err != nil || n != 3 {
		t.Fatalf("DeleteSent behind a row created in the future: %d rows, %v; want 3", n, err)
	}
}

func opsTestArchiveSent(t *testing.T, env Env) {
	ctx := context.Background()
	d, tb := env.Driver.Dialect(), env.Driver.Tables()
	archive := tb.Outbox + "_archive"
	CreateArchiveTable(t, env.DB, d, tb, archive)
	old, keep := opsJanitorFixture(t, env, 5)
	before := OpsRows(t, env.DB, tb.Outbox, old)
	if len(before) != len(old) {
		t.Fatalf("read %d of the %d seeded rows", len(before), len(old))
	}

	for i, want := range []int64{3, 2, 0} {
		n, err := env.Driver.ArchiveSent(ctx, archive, opsRetention, 3)
		if err != nil {
			t.Fatal(err)
		}
		if n != want {
			t.Fatalf("ArchiveSent call %d moved %d rows, want %d", i+1, n, want)
		}
	}
	if got := OpsIDs(t, env.DB, tb.Outbox); !reflect.DeepEqual(got, opsSorted(keep)) {
		t.Fatalf("after ArchiveSent the outbox holds ids %v, want %v", got, opsSorted(keep))
	}
	if got := OpsIDs(t, env.DB, archive); !reflect.DeepEqual(got, opsSorted(old)) {
		t.Fatalf("the archive holds ids %v, want %v", got, opsSorted(old))
	}
	after := OpsRows(t, env.DB, archive, old)
	if !reflect.DeepEqual(before, after) {
		t.Fatalf("archived rows differ from the originals:\n before %v\n after  %v", before, after)
	}

	// Bad names are refused before any SQL runs.
	for _, bad := range []string{"", "x; DROP TABLE y", tb.Outbox, tb.Inbox} {
		if _, err := env.Driver.ArchiveSent(ctx, bad, opsRetention, 3); err == nil {
			t.Errorf("ArchiveSent(archive %q) succeeded, want an error", bad)
		}
	}
}

func opsTestArchiveMissing(t *testing.T, env Env) {
	old, keep := opsJanitorFixture(t, env, 3)
	if _, err := env.Driver.ArchiveSent(context.Background(), "no_such_archive", opsRetention, 10); err == nil {
		t.Fatal("ArchiveSent into a missing table succeeded, want an error")
	}
	if got, want := OpsIDs(t, env.DB, env.Driver.Tables().Outbox), opsSorted(append(old, keep...)); !reflect.DeepEqual(got, want) {
		t.Fatalf("after a failed ArchiveSent the outbox holds ids %v, want all of %v", got, want)
	}
}

func opsTestDeleteInbox(t *testing.T, env Env) {
	ctx := context.Background()
	d, tb := env.Driver.Dialect(), env.Driver.Tables()
	OpsSeedInbox(t, env.DB, d, tb.Inbox, 3, 8*opsDay)
	OpsSeedInbox(t, env.DB, d, tb.Inbox, 2, opsDay)
	// The stale-guard table is left alone, however old its rows.
	keyTable := dialect.InboxKeyTable(tb.Inbox)
	opsExec(t, env.DB, "INSERT INTO "+keyTable+" (consumer, biz_type, biz_id, last_seq) VALUES ('c', 'T', 'k', 1)")
	opsExec(t, env.DB, "UPDATE "+keyTable+" SET updated_at = "+OpsAgo(d, 30*opsDay))

	for i, want := range []int64{2, 1, 0} {
		n, err := env.Driver.DeleteInbox(ctx, opsRetention, 2)
		if err != nil {
			t.Fatal(err)
		}
		if n != want {
			t.Fatalf("DeleteInbox call %d deleted %d rows, want %d", i+1, n, want)
		}
	}
	if n := OpsCount(t, env.DB, tb.Inbox, ""); n != 2 {
		t.Fatalf("inbox holds %d rows, want the 2 young ones", n)
	}
	if n := OpsCount(t, env.DB, keyTable, ""); n != 1 {
		t.Fatalf("stale-guard table holds %d rows, want 1", n)
	}
}

func opsTestBadLimit(t *testing.T, env Env) {
	ctx := context.Background()
	if _, err := env.Driver.DeleteSent(ctx, opsRetention, 0); err == nil {
		t.Error("DeleteSent with limit 0 succeeded, want an error")
	}
	if _, err := env.Driver.DeleteInbox(ctx, opsRetention, 0); err == nil {
		t.Error("DeleteInbox with limit 0 succeeded, want an error")
	}
	if _, err := env.Driver.ArchiveSent(ctx, "outbox_archive", opsRetention, 0); err == nil {
		t.Error("ArchiveSent with limit 0 succeeded, want an error")
	}
}

// OpsSeedRow describes Count outbox rows to seed, all in one state. Ages are
// measured back from the database clock.
type OpsSeedRow struct {
	Count  int
	Status int // 0 pending, 1 sent, 2 failed
	// CreatedAgo sets created_at to now - CreatedAgo (0: now).
	CreatedAgo time.Duration
	// SentAgo, when positive, sets sent_at to now - SentAgo.
	SentAgo time.Duration
	// Lease, when set, leases the rows to "seed-owner" until now + *Lease
	// (negative: a lease that already expired).
	Lease *time.Duration
}

var opsSeq atomic.Int64

// OpsSeed inserts the rows into outbox table table and returns their ids,
// one slice per OpsSeedRow, in id order. Each OpsSeedRow gets its own biz_type
// ("seed_N") and keys ("k<i>").
func OpsSeed(t testing.TB, db *sql.DB, d dialect.Dialect, table string, rows ...OpsSeedRow) [][]int64 {
	t.Helper()
	out := make([][]int64, len(rows))
	for i, r := range rows {
		typ := fmt.Sprintf("seed_%d", opsSeq.Add(1))
		for start := 0; start < r.Count; start += 500 {
			n := min(500, r.Count-start)
			var b strings.Builder
			b.WriteString("INSERT INTO " + table + " (event_id, biz_type, biz_id, topic, payload) VALUES ")
			args := make([]any, 0, 4*n)
			for j := range n {
				if j > 0 {
					b.WriteString(", ")
				}
				p := len(args)
				fmt.Fprintf(&b, "(%s, %s, %s, %s, '{}')", d.Placeholder(p+1), d.Placeholder(p+2), d.Placeholder(p+3), d.Placeholder(p+4))
				args = append(args, opsUUID(), typ, fmt.Sprintf("k%d", start+j), "seed.topic")
			}
			opsExec(t, db, b.String(), args...)
		}
		sent := "NULL"
		if r.SentAgo > 0 {
			sent = OpsAgo(d, r.SentAgo)
		}
		owner, lease := "NULL", "NULL"
		if r.Lease != nil {
			owner, lease = "'seed-owner'", OpsAgo(d, -*r.Lease)
		}
		opsExec(t, db, "UPDATE "+table+" SET status = "+fmt.Sprint(r.Status)+", created_at = "+OpsAgo(d, r.CreatedAgo)+
			", sent_at = "+sent+", lease_owner = "+owner+", lease_expires_at = "+lease+
			" WHERE biz_type = "+d.Placeholder(1), typ)
		out[i] = opsQueryIDs(t, db, "SELECT id FROM "+table+" WHERE biz_type = "+d.Placeholder(1)+" ORDER BY id", typ)
		if len(out[i]) != r.Count {
			t.Fatalf("drivertest: seeded %d rows of %+v, want %d", len(out[i]), r, r.Count)
		}
	}
	return out
}

// OpsSeedInbox inserts n inbox rows processed ago ago.
func OpsSeedInbox(t testing.TB, db *sql.DB, d dialect.Dialect, table string, n int, ago time.Duration) {
	t.Helper()
	consumer := fmt.Sprintf("seed_%d", opsSeq.Add(1))
	for range n {
		opsExec(t, db, "INSERT INTO "+table+" (consumer, event_id, biz_type, biz_id) VALUES ("+
			d.Placeholder(1)+", "+d.Placeholder(2)+", 'T', 'k')", consumer, opsUUID())
	}
	opsExec(t, db, "UPDATE "+table+" SET processed_at = "+OpsAgo(d, ago)+" WHERE consumer = "+d.Placeholder(1), consumer)
}

// OpsAgo returns the SQL expression for "database now minus ago" in d (a
// negative ago lies in the future).
func OpsAgo(d dialect.Dialect, ago time.Duration) string {
	switch d {
	case dialect.Postgres:
		return fmt.Sprintf("now() - interval '%d microseconds'", ago.Microseconds())
	case dialect.MySQL:
		return fmt.Sprintf("CURRENT_TIMESTAMP(6) - INTERVAL %d MICROSECOND", ago.Microseconds())
	}
	return fmt.Sprintf("strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now', '%+.3f seconds')", -ago.Seconds())
}

// ArchiveTableDDL returns the statements that create archive, the archive
// table of the driver's outbox, in d, as package templates renders them.
func ArchiveTableDDL(d dialect.Dialect, tables driver.Tables, archive string) []string {
	ddl, err := templates.RenderArchive(string(d), templates.Tables{Outbox: tables.Outbox, Inbox: tables.Inbox, Archive: archive})
	if err != nil {
		panic(err)
	}
	return templates.Statements(ddl)
}

// CreateArchiveTable creates archive with ArchiveTableDDL.
func CreateArchiveTable(t testing.TB, db *sql.DB, d dialect.Dialect, tables driver.Tables, archive string) {
	t.Helper()
	for _, s := range ArchiveTableDDL(d, tables, archive) {
		opsExec(t, db, s)
	}
}

// OpsIDs returns the ids in table, ascending.
func OpsIDs(t testing.TB, db *sql.DB, table string) []int64 {
	t.Helper()
	return opsQueryIDs(t, db, "SELECT id FROM "+table+" ORDER BY id")
}

// OpsCount returns the number of rows in table matching where ("" for all).
func OpsCount(t testing.TB, db *sql.DB, table, where string) int64 {
	t.Helper()
	q := "SELECT COUNT(*) FROM " + table
	if where != "" {
		q += " WHERE " + where
	}
	var n int64
	if err := db.QueryRowContext(context.Background(), q).Scan(&n); err != nil {
		t.Fatalf("drivertest: %s: %v", q, err)
	}
	return n
}

// OpsRows returns every dialect.OutboxColumns value of the rows of table
// whose id is in ids, in id order, normalised for comparison (timestamps
// as UTC text, bytes as strings).
func OpsRows(t testing.TB, db *sql.DB, table string, ids []int64) [][]any {
	t.Helper()
	ps := make([]string, len(ids))
	for i, id := range ids {
		ps[i] = fmt.Sprint(id)
	}
	q := "SELECT " + strings.Join(dialect.OutboxColumns, ", ") + " FROM " + table + " WHERE id IN (" + strings.Join(ps, ", ") + ") ORDER BY id"
	rs, err := db.QueryContext(context.Background(), q)
	if err != nil {
		t.Fatalf("drivertest: %s: %v", q, err)
	}
	defer rs.Close()
	var out [][]any
	for rs.Next() {
		vals := make([]any, len(dialect.OutboxColumns))
		ptrs := make([]any, len(vals))
		for i := range vals {
			ptrs[i] = &vals[i]
		}
		if err := rs.Scan(ptrs...); err != nil {
			t.Fatalf("drivertest: scan %s: %v", table, err)
		}
		for i, v := range vals {
			switch x := v.(type) {
			case time.Time:
				vals[i] = x.UTC().Format(time.RFC3339Nano)
			case []byte:
				vals[i] = string(x)
			}
		}
		out = append(out, vals)
	}
	if err := rs.Err(); err != nil {
		t.Fatalf("drivertest: %s: %v", q, err)
	}
	return out
}

func opsExec(t testing.TB, db *sql.DB, q string, args ...any) {
	t.Helper()
	if _, err := db.ExecContext(context.Background(), q, args...); err != nil {
		t.Fatalf("drivertest: %s: %v", q, err)
	}
}

func opsQueryIDs(t testing.TB, db *sql.DB, q string, args ...any) []int64 {
	t.Helper()
	rs, err := db.QueryContext(context.Background(), q, args...)
	if err != nil {
		t.Fatalf("drivertest: %s: %v", q, err)
	}
	defer rs.Close()
	ids := []int64{}
	for rs.Next() {
		var id int64
		if err := rs.Scan(&id); err != nil {
			t.Fatalf("drivertest: %s: %v", q, err)
		}
		ids = append(ids, id)
	}
	if err := rs.Err(); err != nil {
		t.Fatalf("drivertest: %s: %v", q, err)
	}
	return ids
}

func opsSorted(ids []int64) []int64 {
	out := append([]int64{}, ids...)
	slices.Sort(out)
	return out
}

// opsUUID returns a random (version 4) UUID in canonical lower-case text.
func opsUUID() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	return fmt.Sprintf("%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:16])
}
