package admin_test

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/outboxgen/outboxgen/runtime/admin"
	"github.com/outboxgen/outboxgen/runtime/dialect"
	"github.com/outboxgen/outboxgen/runtime/driver"
	"github.com/outboxgen/outboxgen/runtime/driver/drivertest"
)

// Delete refuses named events that are not FAILED (nothing deleted), and
// deletes FAILED ones by ref or filter, releasing the rows held behind
// them.
func TestDelete(t *testing.T) {
	each(t, func(t *testing.T, e env) {
		ctx := context.Background()
		ids := drivertest.OpsSeed(t, e.db, e.d, e.outbox(),
			drivertest.OpsSeedRow{Count: 3, Status: 2, CreatedAgo: time.Hour},
			drivertest.OpsSeedRow{Count: 1, Status: 1, CreatedAgo: time.Hour, SentAgo: time.Minute},
			drivertest.OpsSeedRow{Count: 1, Status: 0},
		)
		failed, sent, pending := ids[0], ids[1], ids[2]

		if _, err := e.a.Delete(ctx, admin.Selection{}); err == nil {
			t.Error("Delete with an empty selection succeeded, want an error")
		}
		before := e.snapshot(t)
		for _, other := range []int64{sent[0], pending[0]} {
			res, err := e.a.Delete(ctx, admin.Selection{Refs: refs(failed[0], other)})
			if !errors.Is(err, admin.ErrRefused) || len(res.Refused) != 1 || res.Refused[0].Ref != strconv.FormatInt(other, 10) ||
				!strings.Contains(res.Refused[0].Reason, "not failed") || res.Action != "delete" {
				t.Errorf("Delete naming row %d = %+v, %v; want it refused as not failed", other, res, err)
			}
		}
		if got := e.snapshot(t); got != before {
			t.Fatal("a refused Delete changed rows")
		}
		res, err := e.a.Delete(ctx, admin.Selection{Refs: refs(failed[0]), DryRun: true})
		if err != nil || res.Matched != 1 || res.Changed != 0 {
			t.Errorf("Delete dry run = %+v, %v", res, err)
		}
		res, err = e.a.Delete(ctx, admin.Selection{Refs: refs(failed[0])})
		if err != nil || res.Action != "delete" || res.Matched != 1 || res.Changed != 1 || res.Batches != 1 || res.FirstID != failed[0] {
			t.Errorf("Delete by ref = %+v, %v; want row %d deleted", res, err, failed[0])
		}
		if _, err := e.drv.GetEvent(ctx, failed[0]); !errors.Is(err, driver.ErrNotFound) {
			t.Errorf("deleted row: %v, want ErrNotFound", err)
		}
		res, err = e.a.Delete(ctx, admin.Selection{All: true, OneTransaction: true})
		if err != nil || res.Changed != 2 || res.Batches != 1 {
			t.Errorf("Delete All = %+v, %v; want the 2 FAILED rows left, one transaction", res, err)
		}
		if n := drivertest.OpsCount(t, e.db, e.outbox(), ""); n != 2 {
			t.Errorf("%d rows left, want the sent and the pending one", n)
		}
	})
}

// OneTransaction collects every matched row and changes them with one
// driver call (Batches 1); more than MaxRefs matches are refused.
func TestOneTransaction(t *testing.T) {
	each(t, func(t *testing.T, e env) {
		ctx := context.Background()
		ids := drivertest.OpsSeed(t, e.db, e.d, e.outbox(),
			drivertest.OpsSeedRow{Count: 1200, Status: 2, CreatedAgo: time.Hour},
			drivertest.OpsSeedRow{Count: admin.MaxRefs - 1200 + 1, Status: 2, CreatedAgo: time.Hour},
		)
		ev, err := e.drv.GetEvent(ctx, ids[0][0])
		if err != nil {
			t.Fatal(err)
		}
		before := e.snapshot(t)
		_, err = e.a.Requeue(ctx, admin.Selection{All: true, OneTransaction: true})
		if err == nil || !strings.Contains(err.Error(), "narrow the filter") {
			t.Fatalf("Requeue of %d rows in one transaction = %v, want a refusal saying to narrow the filter", admin.MaxRefs+1, err)
		}
		if got := e.snapshot(t); got != before {
			t.Fatal("a refused Requeue changed rows")
		}
		res, err := e.a.Requeue(ctx, admin.Selection{Filter: admin.Filter{Types: []string{ev.Type}}, OneTransaction: true})
		if err != nil || res.Matched != 1200 || res.Changed != 1200 || res.Batches != 1 {
			t.Errorf("Requeue of 1200 rows in one transaction = %+v, %v; want 1200 changed in 1 batch", res, err)
		}
		refsList := refs(ids[1][:10]...)
		res, err = e.a.Requeue(ctx, admin.Selection{Refs: refsList, OneTransaction: true})
		if err != nil || res.Changed != 10 || res.Batches != 1 {
			t.Errorf("Requeue of 10 refs in one transaction = %+v, %v", res, err)
		}
	})
}

func TestConsoleQueries(t *testing.T) {
	each(t, func(t *testing.T, e env) {
		ctx := context.Background()
		ids := drivertest.OpsSeed(t, e.db, e.d, e.outbox(), drivertest.OpsSeedRow{Count: 4, Status: 0})
		p := ids[0]
		hour := drivertest.OpsAgo(e.d, -time.Hour)
		if _, err := e.db.Exec("UPDATE " + e.outbox() + " SET lease_owner = 'relay-1', lease_expires_at = " + hour + " WHERE id IN (" + strconv.FormatInt(p[0], 10) + ", " + strconv.FormatInt(p[1], 10) + ")"); err != nil {
			t.Fatal(err)
		}
		relays, err := e.a.Relays(ctx)
		if err != nil || len(relays) != 1 || relays[0].Owner != "relay-1" || relays[0].Rows != 2 || relays[0].Expired != 0 {
			t.Errorf("Relays = %+v, %v; want relay-1 with 2 live leases", relays, err)
		}

		// Key "kb": a FAILED head and a row behind it.
		ev := drivertest.OpsSeed(t, e.db, e.d, e.outbox(), drivertest.OpsSeedRow{Count: 1, Status: 2})[0]
		if _, err := e.db.Exec("UPDATE " + e.outbox() + " SET biz_id = 'kb' WHERE id = " + strconv.FormatInt(ev[0], 10)); err != nil {
			t.Fatal(err)
		}
		behind := drivertest.OpsSeed(t, e.db, e.d, e.outbox(), drivertest.OpsSeedRow{Count: 1, Status: 0})[0]
		if _, err := e.db.Exec("UPDATE " + e.outbox() + " SET biz_id = 'kb' WHERE id = " + strconv.FormatInt(behind[0], 10)); err != nil {
			t.Fatal(err)
		}
		keys, err := e.a.BlockedKeys(ctx, "", 10)
		if err != nil || len(keys) != 1 || keys[0].Key != "kb" || keys[0].Head.ID != ev[0] || keys[0].Waiting != 1 {
			t.Errorf("BlockedKeys = %+v, %v; want kb behind row %d", keys, err, ev[0])
		}
		for _, bad := range []int{0, admin.MaxPage + 1} {
			if _, err := e.a.BlockedKeys(ctx, "", bad); err == nil || !strings.Contains(err.Error(), "use 1 to") {
				t.Errorf("BlockedKeys(limit %d) = %v, want a limit error", bad, err)
			}
		}

		inbox := e.drv.Tables().Inbox
		for i, c := range []string{"billing", "billing", "mail"} {
			if _, err := e.db.Exec("INSERT INTO "+inbox+" (consumer, event_id) VALUES ("+e.d.Placeholder(1)+", "+e.d.Placeholder(2)+")", c, "e"+strconv.Itoa(i)); err != nil {
				t.Fatal(err)
			}
		}
		if _, err := e.db.Exec("INSERT INTO " + dialect.InboxDuplicateTable(inbox) + " (consumer, event_id, count) VALUES ('billing', 'e0', 2)"); err != nil {
			t.Fatal(err)
		}
		cs, err := e.a.Inbox(ctx, 0)
		if err != nil || len(cs) != 2 || cs[0].Consumer != "billing" || cs[0].Handled != 2 || cs[0].Duplicates != 1 || cs[1].Handled != 1 {
			t.Errorf("Inbox = %+v, %v; want billing (2 handled, 1 duplicated) and mail (1)", cs, err)
		}
		for _, bad := range []time.Duration{-time.Second, admin.MaxInboxWindow + 1} {
			if _, err := e.a.Inbox(ctx, bad); err == nil {
				t.Errorf("Inbox(window %s) succeeded, want an error", bad)
			}
		}
		dups, err := e.a.RecentDuplicates(ctx, "billing", 10)
		if err != nil || len(dups) != 1 || dups[0].EventID != "e0" || dups[0].Count != 2 {
			t.Errorf("RecentDuplicates = %+v, %v", dups, err)
		}
		if _, err := e.a.RecentDuplicates(ctx, "", 10); err == nil {
			t.Error("RecentDuplicates without a consumer succeeded")
		}
		if _, err := e.a.RecentDuplicates(ctx, "billing", admin.MaxPage+1); err == nil {
			t.Error("RecentDuplicates over MaxPage succeeded")
		}
	})
}

// Selection.Expect: an action changes exactly the rows a dry run counted
// (by count and digest of their ids), or nothing; Result.Released counts
// the held rows released with a requeue or a delete; MaxID reads the
// highest id.
func TestExpectReleasedMaxID(t *testing.T) {
	each(t, func(t *testing.T, e env) {
		ctx := context.Background()
		if n, err := e.a.MaxID(ctx); err != nil || n != 0 {
			t.Errorf("MaxID of an empty table = %d, %v; want 0", n, err)
		}
		ids := drivertest.OpsSeed(t, e.db, e.d, e.outbox(),
			drivertest.OpsSeedRow{Count: 2, Status: 2, CreatedAgo: time.Hour},
			drivertest.OpsSeedRow{Count: 1, Status: 0, CreatedAgo: time.Hour},
		)
		failed, pending := ids[0], ids[1]
		if n, err := e.a.MaxID(ctx); err != nil || n != pending[0] {
			t.Errorf("MaxID = %d, %v; want %d", n, err, pending[0])
		}
		dry, err := e.a.Requeue(ctx, admin.Selection{All: true, OneTransaction: true, DryRun: true})
		if err != nil || dry.Matched != 2 || dry.Digest != admin.Digest([]int64{failed[1], failed[0]}) {
			t.Fatalf("dry run = %+v, %v; want 2 matched with the digest of their ids", dry, err)
		}
		// A third row fails meanwhile: refused, nothing changed.
		e.exec(t, "UPDATE "+e.outbox()+" SET status = 2 WHERE id = "+strconv.FormatInt(pending[0], 10))
		before := e.snapshot(t)
		exp := &admin.Expect{Count: dry.Matched, Digest: dry.Digest}
		res, err := e.a.Requeue(ctx, admin.Selection{All: true, OneTransaction: true, Expect: exp})
		var sc *admin.SelectionChangedError
		if !errors.As(err, &sc) || !errors.Is(err, admin.ErrSelectionChanged) || sc.Then != 2 || sc.Now != 3 || res.Changed != 0 ||
			err.Error() != "the selection changed since you confirmed (2 then, 3 now): confirm again; nothing was changed" {
			t.Fatalf("Requeue with a stale Expect = %+v, %v", res, err)
		}
		if e.snapshot(t) != before {
			t.Fatal("a Requeue with a stale Expect changed rows")
		}
		// Same count, other rows: refused too.
		e.exec(t, "UPDATE "+e.outbox()+" SET status = 0 WHERE id = "+strconv.FormatInt(failed[0], 10))
		if _, err := e.a.Requeue(ctx, admin.Selection{All: true, OneTransaction: true, Expect: exp}); !errors.Is(err, admin.ErrSelectionChanged) {
			t.Fatalf("Requeue of as many other rows = %v, want ErrSelectionChanged", err)
		}
		if _, err := e.a.Requeue(ctx, admin.Selection{All: true, Expect: exp}); err == nil {
			t.Error("Expect without OneTransaction was accepted")
		}
		// Released: two rows held behind failed[1] (same key as a fresh
		// row of its key).
		ev, err := e.drv.GetEvent(ctx, failed[1])
		if err != nil {
			t.Fatal(err)
		}
		held := drivertest.OpsSeed(t, e.db, e.d, e.outbox(), drivertest.OpsSeedRow{Count: 2, Status: 0})[0]
		for _, id := range held {
			e.exec(t, "UPDATE "+e.outbox()+" SET lease_owner = '"+dialect.HeldOwner+"', biz_id = "+e.d.Placeholder(1)+" WHERE id = "+strconv.FormatInt(id, 10), ev.Key)
		}
		dry, err = e.a.Requeue(ctx, admin.Selection{Refs: refs(failed[1]), OneTransaction: true, DryRun: true})
		if err != nil {
			t.Fatal(err)
		}
		res, err = e.a.Requeue(ctx, admin.Selection{Refs: refs(failed[1]), OneTransaction: true, Expect: &admin.Expect{Count: dry.Matched, Digest: dry.Digest}})
		if err != nil || res.Changed != 1 || res.Released != 2 {
			t.Errorf("Requeue of the head of 2 held rows = %+v, %v; want 1 changed, 2 released", res, err)
		}
	})
}

func (e env) exec(t *testing.T, q string, args ...any) {
	t.Helper()
	if _, err := e.db.Exec(q, args...); err != nil {
		t.Fatalf("%s: %v", q, err)
	}
}
