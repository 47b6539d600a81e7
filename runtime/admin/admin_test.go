package admin_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	_ "modernc.org/sqlite"

	"github.com/outboxgen/outboxgen/internal/testdb"
	"github.com/outboxgen/outboxgen/runtime/admin"
	"github.com/outboxgen/outboxgen/runtime/dialect"
	"github.com/outboxgen/outboxgen/runtime/driver"
	"github.com/outboxgen/outboxgen/runtime/driver/drivertest"
	"github.com/outboxgen/outboxgen/runtime/driver/sqldriver"
	"github.com/outboxgen/outboxgen/runtime/dsn"
	"github.com/outboxgen/outboxgen/templates"
)

type env struct {
	a   *admin.Admin
	db  *sql.DB
	d   dialect.Dialect
	drv driver.Driver
}

func openSQLite(t *testing.T) *sql.DB {
	t.Helper()
	db, err := sql.Open("sqlite", dsn.SQLiteDSN(filepath.Join(t.TempDir(), "outbox.db")))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	ddl, err := templates.Render("sqlite", templates.DefaultTables)
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range templates.Statements(ddl) {
		if _, err := db.Exec(s); err != nil {
			t.Fatalf("apply schema: %v\n%s", err, s)
		}
	}
	return db
}

// each runs f on SQLite and, when its server is configured, PostgreSQL.
func each(t *testing.T, f func(t *testing.T, e env)) {
	t.Run("sqlite", func(t *testing.T) {
		t.Parallel()
		f(t, newEnv(t, openSQLite(t), dialect.SQLite))
	})
	for _, srv := range []struct {
		d   dialect.Dialect
		env string
	}{{dialect.Postgres, testdb.PostgresEnv}, {dialect.MySQL, testdb.MySQLEnv}} {
		t.Run(string(srv.d), func(t *testing.T) {
			if os.Getenv(srv.env) == "" {
				t.Skip(srv.env + " not set")
			}
			t.Parallel()
			db := testdb.Open(t, string(srv.d))
			testdb.ApplySchema(t, db, string(srv.d), templates.DefaultTables)
			f(t, newEnv(t, db, srv.d))
		})
	}
}

func newEnv(t *testing.T, db *sql.DB, d dialect.Dialect) env {
	t.Helper()
	drv, err := sqldriver.New(db, testdb.Schema(d))
	if err != nil {
		t.Fatal(err)
	}
	a, err := admin.New(drv)
	if err != nil {
		t.Fatal(err)
	}
	return env{a: a, db: db, d: d, drv: drv}
}

func (e env) outbox() string { return e.drv.Tables().Outbox }

// snapshot returns status, retry_count and sent_at-is-null of every row.
func (e env) snapshot(t *testing.T) string {
	t.Helper()
	rows, err := e.db.Query("SELECT id, status, retry_count, sent_at IS NULL FROM " + e.outbox() + " ORDER BY id")
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var b strings.Builder
	for rows.Next() {
		var id, st, rc int64
		var null bool
		if err := rows.Scan(&id, &st, &rc, &null); err != nil {
			t.Fatal(err)
		}
		fmt.Fprintf(&b, "%d:%d:%d:%v ", id, st, rc, null)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return b.String()
}

func refs(ids ...int64) []string {
	out := make([]string, len(ids))
	for i, id := range ids {
		out[i] = strconv.FormatInt(id, 10)
	}
	return out
}

func TestRequeueRefsRefused(t *testing.T) {
	each(t, func(t *testing.T, e env) {
		ctx := context.Background()
		ids := drivertest.OpsSeed(t, e.db, e.d, e.outbox(),
			drivertest.OpsSeedRow{Count: 2, Status: 2},
			drivertest.OpsSeedRow{Count: 1, Status: 1, SentAgo: time.Minute},
			drivertest.OpsSeedRow{Count: 1, Status: 0})
		failed, sent, pending := ids[0], ids[1][0], ids[2][0]
		before := e.snapshot(t)

		for _, bad := range []int64{sent, pending, 1 << 40} {
			res, err := e.a.Requeue(ctx, admin.Selection{Refs: refs(failed[0], bad, failed[1])})
			if !errors.Is(err, admin.ErrRefused) {
				t.Fatalf("Requeue with ref %d: error %v, want ErrRefused", bad, err)
			}
			if len(res.Refused) != 1 || res.Refused[0].Ref != strconv.FormatInt(bad, 10) || res.Refused[0].Reason == "" {
				t.Errorf("Requeue with ref %d: Refused = %+v, want exactly that ref with a reason", bad, res.Refused)
			}
			if res.Changed != 0 || res.Batches != 0 {
				t.Errorf("refused Requeue reports %+v, want nothing changed", res)
			}
			if got := e.snapshot(t); got != before {
				t.Fatalf("refused Requeue changed rows:\n before %s\n after  %s", before, got)
			}
		}
		// By event id too.
		ev, err := e.drv.GetEvent(ctx, sent)
		if err != nil {
			t.Fatal(err)
		}
		res, err := e.a.Requeue(ctx, admin.Selection{Refs: []string{strings.ToUpper(ev.EventID)}})
		if !errors.Is(err, admin.ErrRefused) || len(res.Refused) != 1 || !strings.Contains(res.Refused[0].Reason, "replay") {
			t.Errorf("Requeue of a sent event id: %+v, %v; want a refusal pointing at replay", res, err)
		}

		// All FAILED: it works.
		res, err = e.a.Requeue(ctx, admin.Selection{Refs: refs(failed[1], failed[0], failed[0])})
		if err != nil {
			t.Fatal(err)
		}
		if res.Matched != 2 || res.Changed != 2 || res.Batches != 1 || res.FirstID != failed[0] || res.LastID != failed[1] || res.Keys != 2 {
			t.Errorf("Requeue by refs = %+v, want Matched 2 Changed 2 Batches 1 FirstID %d LastID %d Keys 2", res, failed[0], failed[1])
		}
		if n := drivertest.OpsCount(t, e.db, e.outbox(), "status = 2"); n != 0 {
			t.Errorf("%d FAILED rows left", n)
		}
		// Refs and a filter together: refused.
		if _, err := e.a.Requeue(ctx, admin.Selection{Refs: refs(failed[0]), Filter: admin.Filter{Keys: []string{"k0"}}}); err == nil {
			t.Error("Requeue with refs and a filter succeeded, want an error")
		}
		if _, err := e.a.Requeue(ctx, admin.Selection{Refs: []string{"not-a-ref"}}); err == nil {
			t.Error("Requeue of a bad ref succeeded, want an error")
		}
	})
}

func TestRequeueFilterBatches(t *testing.T) {
	each(t, func(t *testing.T, e env) {
		ctx := context.Background()
		ids := drivertest.OpsSeed(t, e.db, e.d, e.outbox(),
			drivertest.OpsSeedRow{Count: 1200, Status: 2, CreatedAgo: time.Hour},
			drivertest.OpsSeedRow{Count: 3, Status: 1, SentAgo: time.Minute}, // never touched
		)
		failed := ids[0]
		ev, err := e.drv.GetEvent(ctx, failed[0])
		if err != nil {
			t.Fatal(err)
		}
		filter := admin.Filter{Types: []string{ev.Type}}

		// Empty selection without All: an error, nothing changed.
		before := e.snapshot(t)
		if _, err := e.a.Requeue(ctx, admin.Selection{}); err == nil {
			t.Error("Requeue with an empty selection succeeded, want an error")
		}
		// Dry run: counts, changes nothing.
		res, err := e.a.Requeue(ctx, admin.Selection{Filter: filter, DryRun: true})
		if err != nil {
			t.Fatal(err)
		}
		if !res.DryRun || res.Matched != 1200 || res.Changed != 0 || res.Batches != 0 || res.Keys != 1200 {
			t.Errorf("dry run = %+v, want Matched 1200, nothing changed", res)
		}
		if got := e.snapshot(t); got != before {
			t.Fatal("a dry run changed rows")
		}

		res, err = e.a.Requeue(ctx, admin.Selection{Filter: filter})
		if err != nil {
			t.Fatal(err)
		}
		if res.Matched != 1200 || res.Changed != 1200 || res.Batches != 3 || res.FirstID != failed[0] || res.LastID != failed[len(failed)-1] {
			t.Errorf("Requeue by filter = %+v, want Matched 1200 Changed 1200 Batches 3", res)
		}
		if n := drivertest.OpsCount(t, e.db, e.outbox(), "status = 0 AND retry_count = 0"); n != 1200 {
			t.Errorf("%d rows pending after requeue, want 1200", n)
		}
		if n := drivertest.OpsCount(t, e.db, e.outbox(), "status = 1"); n != 3 {
			t.Errorf("%d sent rows, want 3 (untouched)", n)
		}
		// Nothing left: a second run changes nothing.
		res, err = e.a.Requeue(ctx, admin.Selection{Filter: filter})
		if err != nil || res.Matched != 0 || res.Changed != 0 {
			t.Errorf("second Requeue = %+v, %v; want nothing", res, err)
		}
	})
}

func TestRequeueAll(t *testing.T) {
	each(t, func(t *testing.T, e env) {
		ctx := context.Background()
		drivertest.OpsSeed(t, e.db, e.d, e.outbox(),
			drivertest.OpsSeedRow{Count: 3, Status: 2},
			drivertest.OpsSeedRow{Count: 2, Status: 2},
			drivertest.OpsSeedRow{Count: 2, Status: 0})
		res, err := e.a.Requeue(ctx, admin.Selection{All: true})
		if err != nil {
			t.Fatal(err)
		}
		if res.Changed != 5 || res.Batches != 1 {
			t.Errorf("Requeue All = %+v, want 5 changed in 1 batch", res)
		}
	})
}

func TestReplay(t *testing.T) {
	each(t, func(t *testing.T, e env) {
		ctx := context.Background()
		ids := drivertest.OpsSeed(t, e.db, e.d, e.outbox(),
			drivertest.OpsSeedRow{Count: 4, Status: 1, CreatedAgo: 3 * time.Hour, SentAgo: 2 * time.Hour},
			drivertest.OpsSeedRow{Count: 2, Status: 1, CreatedAgo: 10 * time.Minute, SentAgo: 5 * time.Minute},
			drivertest.OpsSeedRow{Count: 2, Status: 2, CreatedAgo: 3 * time.Hour},
		)
		old, young, failed := ids[0], ids[1], ids[2]

		if _, err := e.a.Replay(ctx, admin.Selection{}); err == nil {
			t.Error("Replay with an empty selection succeeded, want an error")
		}
		// Refs naming a FAILED row: refused, nothing changed.
		before := e.snapshot(t)
		res, err := e.a.Replay(ctx, admin.Selection{Refs: refs(old[0], failed[0])})
		if !errors.Is(err, admin.ErrRefused) || len(res.Refused) != 1 || res.Refused[0].Ref != strconv.FormatInt(failed[0], 10) || !strings.Contains(res.Refused[0].Reason, "requeue") {
			t.Errorf("Replay naming a FAILED row = %+v, %v; want a refusal pointing at requeue", res, err)
		}
		if got := e.snapshot(t); got != before {
			t.Fatal("a refused Replay changed rows")
		}

		// By filter: sent rows created more than an hour ago, key k1..k3.
		f := admin.Filter{Until: time.Hour, Keys: []string{"k1", "k2", "k3"}}
		res, err = e.a.Replay(ctx, admin.Selection{Filter: f, DryRun: true})
		if err != nil || res.Matched != 3 || res.Changed != 0 {
			t.Fatalf("Replay dry run = %+v, %v; want 3 matched, none changed", res, err)
		}
		if got := e.snapshot(t); got != before {
			t.Fatal("a dry-run Replay changed rows")
		}
		res, err = e.a.Replay(ctx, admin.Selection{Filter: f})
		if err != nil {
			t.Fatal(err)
		}
		if res.Matched != 3 || res.Changed != 3 || res.Batches != 1 || res.FirstID != old[1] || res.LastID != old[3] {
			t.Errorf("Replay by filter = %+v, want rows %v", res, old[1:])
		}
		for _, id := range old[1:] {
			ev, err := e.drv.GetEvent(ctx, id)
			if err != nil {
				t.Fatal(err)
			}
			if ev.Status != driver.Pending || !ev.SentAt.IsZero() || ev.RetryCount != 0 {
				t.Errorf("replayed row %d = %+v", id, ev)
			}
		}
		for _, id := range slices.Concat(old[:1], young) {
			ev, err := e.drv.GetEvent(ctx, id)
			if err != nil {
				t.Fatal(err)
			}
			if ev.Status != driver.Sent {
				t.Errorf("row %d outside the filter is %s, want sent", id, ev.Status)
			}
		}
		// By ref, with FromID/ToID filter.
		res, err = e.a.Replay(ctx, admin.Selection{Filter: admin.Filter{FromID: young[0], ToID: young[0]}})
		if err != nil || res.Changed != 1 || res.FirstID != young[0] {
			t.Errorf("Replay FromID=ToID=%d = %+v, %v; want that row", young[0], res, err)
		}
	})
}

func TestForgetInbox(t *testing.T) {
	each(t, func(t *testing.T, e env) {
		ctx := context.Background()
		table := e.drv.Tables().Inbox
		var eids []string
		for i := range 1100 {
			eid := fmt.Sprintf("00000000-0000-4000-8000-%012d", i)
			eids = append(eids, eid)
			typ := "A"
			if i%2 == 1 {
				typ = "B"
			}
			for _, c := range []string{"c1", "c2"} {
				if _, err := e.db.Exec("INSERT INTO "+table+" (consumer, event_id, biz_type, biz_id) VALUES ("+
					e.d.Placeholder(1)+", "+e.d.Placeholder(2)+", "+e.d.Placeholder(3)+", "+e.d.Placeholder(4)+")", c, eid, typ, "k"+strconv.Itoa(i%7)); err != nil {
					t.Fatal(err)
				}
			}
		}
		count := func(c string) int64 {
			return drivertest.OpsCount(t, e.db, table, "consumer = '"+c+"'")
		}

		if _, err := e.a.ForgetInbox(ctx, admin.InboxSelection{Consumer: "c1"}); err == nil {
			t.Error("ForgetInbox without ids, filter or All succeeded, want an error")
		}
		if _, err := e.a.ForgetInbox(ctx, admin.InboxSelection{All: true}); err == nil {
			t.Error("ForgetInbox without a consumer succeeded, want an error")
		}
		// By ids (one unknown).
		res, err := e.a.ForgetInbox(ctx, admin.InboxSelection{Consumer: "c1", EventIDs: []string{eids[0], " " + eids[1] + " ", "00000000-0000-4000-8000-999999999999"}})
		if err != nil {
			t.Fatal(err)
		}
		if res.Matched != 2 || res.Changed != 2 || res.Batches != 1 {
			t.Errorf("ForgetInbox by ids = %+v, want 2 forgotten", res)
		}
		// By filter, dry run then for real: type B (550 rows, one forgotten).
		res, err = e.a.ForgetInbox(ctx, admin.InboxSelection{Consumer: "c1", Types: []string{"B"}, DryRun: true})
		if err != nil || res.Matched != 549 || res.Changed != 0 {
			t.Errorf("ForgetInbox dry run = %+v, %v; want 549 matched, none changed", res, err)
		}
		if n := count("c1"); n != 1098 {
			t.Fatalf("c1 holds %d rows after the dry run, want 1098", n)
		}
		res, err = e.a.ForgetInbox(ctx, admin.InboxSelection{Consumer: "c1", Types: []string{"B"}})
		if err != nil || res.Matched != 549 || res.Changed != 549 || res.Batches != 2 {
			t.Errorf("ForgetInbox type B = %+v, %v; want 549 in 2 batches", res, err)
		}
		// All.
		res, err = e.a.ForgetInbox(ctx, admin.InboxSelection{Consumer: "c1", All: true})
		if err != nil || res.Changed != 549 || res.Batches != 2 {
			t.Errorf("ForgetInbox All = %+v, %v; want the 549 left in 2 batches", res, err)
		}
		if n := count("c1"); n != 0 {
			t.Errorf("c1 holds %d rows, want 0", n)
		}
		if n := count("c2"); n != 1100 {
			t.Errorf("c2 holds %d rows, want all 1100 (another consumer)", n)
		}
	})
}

// InboxSelection.OneTransaction and Expect: a forget confirmed by a dry
// run's count and digest forgets exactly those rows, in one transaction
// (more than one statement's worth here), and forgets nothing once the
// selection changed.
func TestForgetInboxExpect(t *testing.T) {
	each(t, func(t *testing.T, e env) {
		ctx := context.Background()
		table := e.drv.Tables().Inbox
		insert := func(c, eid string) {
			t.Helper()
			if _, err := e.db.Exec("INSERT INTO "+table+" (consumer, event_id, biz_type, biz_id) VALUES ("+
				e.d.Placeholder(1)+", "+e.d.Placeholder(2)+", 'A', 'k')", c, eid); err != nil {
				t.Fatal(err)
			}
		}
		var eids []string
		for i := range 1100 {
			eid := fmt.Sprintf("00000000-0000-4000-8000-%012d", i)
			eids = append(eids, eid)
			insert("c1", eid)
		}
		insert("c2", eids[0])
		count := func(c string) int64 {
			return drivertest.OpsCount(t, e.db, table, "consumer = '"+c+"'")
		}
		all := admin.InboxSelection{Consumer: "c1", All: true, OneTransaction: true}

		if _, err := e.a.ForgetInbox(ctx, admin.InboxSelection{Consumer: "c1", All: true, Expect: &admin.Expect{Count: 1}}); err == nil {
			t.Error("Expect without OneTransaction was accepted")
		}
		dry := all
		dry.DryRun = true
		res, err := e.a.ForgetInbox(ctx, dry)
		if err != nil || res.Matched != 1100 || res.Changed != 0 || res.Digest != admin.DigestEventIDs(eids) {
			t.Fatalf("dry run = %+v, %v; want 1100 matched, the digest of their event ids", res, err)
		}
		// The consumer handles another event before the operator confirms.
		insert("c1", "00000000-0000-4000-8000-999999999999")
		stale := all
		stale.Expect = &admin.Expect{Count: res.Matched, Digest: res.Digest}
		if res, err := e.a.ForgetInbox(ctx, stale); !errors.Is(err, admin.ErrSelectionChanged) || res.Changed != 0 {
			t.Fatalf("ForgetInbox with a stale Expect = %+v, %v; want ErrSelectionChanged and nothing forgotten", res, err)
		}
		if n := count("c1"); n != 1101 {
			t.Fatalf("c1 holds %d rows after a refused forget, want 1101", n)
		}
		res, err = e.a.ForgetInbox(ctx, dry)
		if err != nil || res.Matched != 1101 {
			t.Fatalf("second dry run = %+v, %v", res, err)
		}
		confirmed := all
		confirmed.Expect = &admin.Expect{Count: res.Matched, Digest: res.Digest}
		res, err = e.a.ForgetInbox(ctx, confirmed)
		if err != nil || res.Matched != 1101 || res.Changed != 1101 || res.Batches != 1 {
			t.Fatalf("confirmed ForgetInbox = %+v, %v; want 1101 forgotten in one transaction", res, err)
		}
		if n := count("c1"); n != 0 {
			t.Errorf("c1 holds %d rows, want 0", n)
		}
		if n := count("c2"); n != 1 {
			t.Errorf("c2 holds %d rows, want its 1 (another consumer)", n)
		}
		// More than MaxRefs rows: refused, nothing forgotten.
		for i := 0; i <= admin.MaxRefs; i += 500 {
			var vals []string
			for j := i; j < min(i+500, admin.MaxRefs+1); j++ {
				vals = append(vals, fmt.Sprintf("('big', '00000000-0000-4000-8000-%012d', 'A', 'k')", j))
			}
			if _, err := e.db.Exec("INSERT INTO " + table + " (consumer, event_id, biz_type, biz_id) VALUES " + strings.Join(vals, ", ")); err != nil {
				t.Fatal(err)
			}
		}
		if res, err := e.a.ForgetInbox(ctx, admin.InboxSelection{Consumer: "big", All: true, OneTransaction: true}); err == nil || !strings.Contains(err.Error(), "narrow") || res.Changed != 0 {
			t.Errorf("ForgetInbox of %d rows in one transaction = %+v, %v; want it refused with a hint to narrow the selection", admin.MaxRefs+1, res, err)
		}
		if n := count("big"); n != admin.MaxRefs+1 {
			t.Errorf("big holds %d rows after a refused forget, want %d", n, admin.MaxRefs+1)
		}
	})
}

func TestStatusAndGet(t *testing.T) {
	each(t, func(t *testing.T, e env) {
		ctx := context.Background()
		ids := drivertest.OpsSeed(t, e.db, e.d, e.outbox(),
			drivertest.OpsSeedRow{Count: 2, Status: 1, CreatedAgo: 2 * time.Minute, SentAgo: time.Minute},
			drivertest.OpsSeedRow{Count: 1, Status: 2})
		st, err := e.a.Status(ctx, admin.StatusOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if st.SentInWindow != 2 || st.Failed != 1 || st.StaleAfter != admin.DefaultStaleAfter || st.Window != admin.DefaultWindow {
			t.Errorf("Status = %+v", st)
		}
		ev, err := e.a.Get(ctx, strconv.FormatInt(ids[1][0], 10))
		if err != nil || ev.ID != ids[1][0] {
			t.Fatalf("Get by id = %+v, %v", ev, err)
		}
		ev2, err := e.a.Get(ctx, strings.ToUpper(ev.EventID))
		if err != nil || ev2.ID != ev.ID {
			t.Fatalf("Get by event id = %+v, %v", ev2, err)
		}
		if _, err := e.a.Get(ctx, "999999"); !errors.Is(err, driver.ErrNotFound) {
			t.Errorf("Get missing: %v, want ErrNotFound", err)
		}
		for _, bad := range []string{"0", "-1", "abc", ""} {
			if _, err := e.a.Get(ctx, bad); err == nil {
				t.Errorf("Get(%q) succeeded, want an error", bad)
			}
		}
		if _, err := e.a.Find(ctx, -1, admin.Filter{}, 0, 0); err == nil {
			t.Error("Find with limit 0 succeeded")
		}
		evs, err := e.a.Find(ctx, driver.Sent, admin.Filter{FromID: ids[0][1]}, 0, 10)
		if err != nil || len(evs) != 1 || evs[0].ID != ids[0][1] {
			t.Errorf("Find sent FromID %d = %v, %v", ids[0][1], evs, err)
		}
	})
}
