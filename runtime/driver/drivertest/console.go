package drivertest

// The console's part of the suite (issue 14): Leases, BlockedKeys,
// DeleteFailed, InboxConsumers, RecentDuplicates, DeleteInboxDuplicates,
// and the atomicity of Requeue, Replay and DeleteFailed over many ids.
// runAdmin runs it.

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/outboxgen/outboxgen/runtime/dialect"
	"github.com/outboxgen/outboxgen/runtime/driver"
	"github.com/outboxgen/outboxgen/runtime/internal/dberr"
)

// runConsole runs the console's part of the suite.
func runConsole(t *testing.T, open func(t *testing.T) Env) {
	t.Run("Leases", func(t *testing.T) { consoleTestLeases(t, open(t)) })
	t.Run("BlockedKeys", func(t *testing.T) { consoleTestBlockedKeys(t, open(t)) })
	t.Run("DeleteFailed", func(t *testing.T) { consoleTestDeleteFailed(t, open(t)) })
	t.Run("InboxConsumers", func(t *testing.T) { consoleTestInboxConsumers(t, open(t)) })
	t.Run("DuplicatesMissing", func(t *testing.T) { consoleTestDuplicatesMissing(t, open(t)) })
	t.Run("AtomicRequeue", func(t *testing.T) { consoleTestAtomic(t, open(t), "requeue") })
	t.Run("AtomicReplay", func(t *testing.T) { consoleTestAtomic(t, open(t), "replay") })
	t.Run("AtomicDeleteFailed", func(t *testing.T) { consoleTestAtomic(t, open(t), "delete") })
	t.Run("AtomicForgetInbox", func(t *testing.T) { consoleTestAtomicForget(t, open(t)) })
}

func consoleTestLeases(t *testing.T, env Env) {
	ctx := context.Background()
	d, table := env.Driver.Dialect(), env.Driver.Tables().Outbox
	ids := OpsSeed(t, env.DB, d, table,
		OpsSeedRow{Count: 6, Status: 0, CreatedAgo: time.Hour},
		OpsSeedRow{Count: 2, Status: 1, CreatedAgo: time.Hour, SentAgo: time.Minute},
	)
	p := ids[0]
	set := func(id int64, owner string, expiresIn time.Duration, createdAgo time.Duration) {
		adminSet(t, env, id, fmt.Sprintf("lease_owner = '%s', lease_expires_at = %s, created_at = %s", owner, OpsAgo(d, -expiresIn), OpsAgo(d, createdAgo)))
	}
	set(p[0], "relay-a", time.Minute, 3*time.Hour)
	set(p[1], "relay-a", 2*time.Minute, 2*time.Hour)
	set(p[2], "relay-a", -time.Minute, time.Hour) // lapsed
	set(p[3], "relay-b", -5*time.Minute, 4*time.Hour)
	adminSet(t, env, p[4], "lease_owner = '"+dialect.HeldOwner+"', next_retry_time = "+OpsAgo(d, -time.Hour)) // held: not a relay
	// p[5] unleased; the sent rows never count.

	got, err := env.Driver.Leases(ctx, 100)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 || got[0].Owner != "relay-a" || got[1].Owner != "relay-b" {
		t.Fatalf("Leases = %+v, want relay-a (3 rows) then relay-b (1 row), the held row left out", got)
	}
	a, b := got[0], got[1]
	if a.Rows != 3 || a.Expired != 1 || b.Rows != 1 || b.Expired != 1 {
		t.Errorf("Leases rows/expired = %d/%d and %d/%d, want 3/1 and 1/1", a.Rows, a.Expired, b.Rows, b.Expired)
	}
	adminNear(t, "relay-a first expiry", time.Until(a.FirstExpiresAt), -time.Minute, 30*time.Second)
	adminNear(t, "relay-a last expiry", time.Until(a.LastExpiresAt), 2*time.Minute, 30*time.Second)
	adminNear(t, "relay-a oldest row", time.Since(a.OldestCreatedAt), 3*time.Hour, time.Minute)
	adminNear(t, "relay-b oldest row", time.Since(b.OldestCreatedAt), 4*time.Hour, time.Minute)
	if one, err := env.Driver.Leases(ctx, 1); err != nil || len(one) != 1 || one[0].Owner != "relay-a" {
		t.Errorf("Leases(limit 1) = %+v, %v; want relay-a only", one, err)
	}
	for _, bad := range []int{0, -1, dialect.MaxInList + 1} {
		if _, err := env.Driver.Leases(ctx, bad); err == nil {
			t.Errorf("Leases(limit %d) succeeded, want an error", bad)
		}
	}
}

func consoleTestBlockedKeys(t *testing.T, env Env) {
	ctx := context.Background()
	d, table := env.Driver.Dialect(), env.Driver.Tables().Outbox
	e := &env2{env: env, d: d, table: table}
	// Key a: FAILED head, two pending rows behind it (one held).
	a := e.insert(t, "ORD", "a", 3)
	adminSet(t, env, a[0], "status = 2, retry_count = 5, last_error = 'broker said no'")
	adminSet(t, env, a[2], "lease_owner = '"+dialect.HeldOwner+"', next_retry_time = "+OpsAgo(d, -time.Hour))
	adminSet(t, env, a[1], "created_at = "+OpsAgo(d, 2*time.Hour))
	// Key b: a pending row backing off, one row behind it.
	b := e.insert(t, "ORD", "b", 2)
	adminSet(t, env, b[0], "retry_count = 2, next_retry_time = "+OpsAgo(d, -10*time.Minute)+", last_error = 'timeout'")
	// Key c: FAILED, nothing behind: holds nothing back.
	c := e.insert(t, "ORD", "c", 1)
	adminSet(t, env, c[0], "status = 2, retry_count = 5")
	// Key d: an unordered type FAILED with a row behind: blocks only when
	// the type is ordered.
	dd := e.insert(t, "LOG", "d", 2)
	adminSet(t, env, dd[0], "status = 2, retry_count = 5")
	// Key e: sent head, pending rows: not blocked.
	ee := e.insert(t, "ORD", "e", 2)
	adminSet(t, env, ee[0], "status = 1, sent_at = "+OpsAgo(d, time.Minute))

	page := func(p driver.BlockedKeysParams) []driver.BlockedKey {
		t.Helper()
		got, err := env.Driver.BlockedKeys(ctx, p)
		if err != nil {
			t.Fatalf("BlockedKeys(%+v): %v", p, err)
		}
		return got
	}
	keys := func(bs []driver.BlockedKey) []string {
		out := []string{}
		for _, b := range bs {
			out = append(out, b.Key)
		}
		return out
	}
	all := page(driver.BlockedKeysParams{Limit: 100})
	if got := keys(all); !reflect.DeepEqual(got, []string{"a", "b", "d"}) {
		t.Fatalf("BlockedKeys = %v, want [a b d] (c holds nothing back, e's head is sent)", got)
	}
	ka, kb := all[0], all[1]
	if ka.Head.ID != a[0] || ka.Head.Status != driver.Failed || ka.HeadStatus != "failed" || ka.Head.RetryCount != 5 ||
		ka.Head.LastError != "broker said no" || ka.Head.EventID == "" || ka.Head.Type != "ORD" || ka.Head.Topic == "" || ka.Head.Payload != nil {
		t.Errorf("key a head = %+v (%s), want row %d FAILED with its attempts and last error, no payload", ka.Head, ka.HeadStatus, a[0])
	}
	if ka.Waiting != 2 {
		t.Errorf("key a waiting = %d, want 2 (the held row counts)", ka.Waiting)
	}
	adminNear(t, "key a oldest waiting", time.Since(ka.OldestWaitingAt), 2*time.Hour, time.Minute)
	if kb.Head.ID != b[0] || kb.Head.Status != driver.Pending || kb.HeadStatus != "pending" || kb.Waiting != 1 || kb.Head.LastError != "timeout" {
		t.Errorf("key b = %+v, want head row %d pending (backing off) with 1 row waiting", kb, b[0])
	}
	adminNear(t, "key b head next attempt", time.Until(kb.Head.NextRetryAt), 10*time.Minute, time.Minute)

	if got := keys(page(driver.BlockedKeysParams{Limit: 100, Unordered: []string{"LOG"}})); !reflect.DeepEqual(got, []string{"a", "b"}) {
		t.Errorf("BlockedKeys with LOG unordered = %v, want [a b]", got)
	}
	if got := keys(page(driver.BlockedKeysParams{Limit: 1})); !reflect.DeepEqual(got, []string{"a"}) {
		t.Errorf("BlockedKeys page 1 of 1 = %v, want [a]", got)
	}
	if got := keys(page(driver.BlockedKeysParams{Limit: 1, AfterKey: "a"})); !reflect.DeepEqual(got, []string{"b"}) {
		t.Errorf("BlockedKeys after a = %v, want [b]", got)
	}
	if got := keys(page(driver.BlockedKeysParams{Limit: 10, AfterKey: "d"})); len(got) != 0 {
		t.Errorf("BlockedKeys after d = %v, want none", got)
	}
	// The counts agree with Overview's.
	o, err := env.Driver.Overview(ctx, driver.OverviewParams{StaleAfter: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	if o.HeldBackKeys != 3 || o.HeldBackRows != 4 {
		t.Errorf("Overview held back %d keys, %d rows; BlockedKeys found 3 keys, 4 rows", o.HeldBackKeys, o.HeldBackRows)
	}
	for _, bad := range []int{0, dialect.MaxInList + 1} {
		if _, err := env.Driver.BlockedKeys(ctx, driver.BlockedKeysParams{Limit: bad}); err == nil {
			t.Errorf("BlockedKeys(limit %d) succeeded, want an error", bad)
		}
	}
}

// env2 inserts rows of a given type and key.
type env2 struct {
	env   Env
	d     dialect.Dialect
	table string
}

func (e *env2) insert(t *testing.T, typ, key string, n int) []int64 {
	t.Helper()
	ins := e.d.InsertEvent(e.table, false)
	var ids []int64
	for range n {
		id := opsUUID()
		opsExec(t, e.env.DB, ins, id, typ, key, "topic."+typ, 1, `{}`, nil)
		ids = append(ids, opsQueryIDs(t, e.env.DB, "SELECT id FROM "+e.table+" WHERE event_id = "+e.d.Placeholder(1), id)...)
	}
	return ids
}

func consoleTestDeleteFailed(t *testing.T, env Env) {
	ctx := context.Background()
	d, table := env.Driver.Dialect(), env.Driver.Tables().Outbox
	e := &env2{env: env, d: d, table: table}
	f := e.insert(t, "ORD", "f", 3) // FAILED head, two held behind it
	adminSet(t, env, f[0], "status = 2, retry_count = 5")
	for _, id := range f[1:] {
		adminSet(t, env, id, "lease_owner = '"+dialect.HeldOwner+"', next_retry_time = "+OpsAgo(d, -time.Hour))
	}
	g := e.insert(t, "ORD", "g", 1) // FAILED, nothing behind
	adminSet(t, env, g[0], "status = 2")
	s := e.insert(t, "ORD", "s", 1) // sent: left alone
	adminSet(t, env, s[0], "status = 1, sent_at = "+OpsAgo(d, time.Minute))
	p := e.insert(t, "ORD", "p", 1) // pending: left alone

	n, released, err := env.Driver.DeleteFailed(ctx, []int64{f[0], g[0], s[0], p[0], 1 << 40})
	if err != nil {
		t.Fatal(err)
	}
	if n != 2 {
		t.Fatalf("DeleteFailed deleted %d rows, want the 2 FAILED ones", n)
	}
	if released != 2 {
		t.Errorf("DeleteFailed released %d held rows, want the 2 held behind row %d", released, f[0])
	}
	for _, id := range []int64{f[0], g[0]} {
		if _, err := env.Driver.GetEvent(ctx, id); !errors.Is(err, driver.ErrNotFound) {
			t.Errorf("FAILED row %d after DeleteFailed: %v, want ErrNotFound", id, err)
		}
	}
	for _, id := range []int64{s[0], p[0]} {
		if _, err := env.Driver.GetEvent(ctx, id); err != nil {
			t.Errorf("row %d (not FAILED) after DeleteFailed: %v, want it kept", id, err)
		}
	}
	for _, id := range f[1:] {
		ev, err := env.Driver.GetEvent(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		if ev.LeaseOwner != "" || time.Until(ev.NextRetryAt) > time.Minute {
			t.Errorf("row %d held behind the deleted row: owner %q next attempt in %s, want released and due", id, ev.LeaseOwner, time.Until(ev.NextRetryAt))
		}
	}
	rows, err := env.Driver.Claim(ctx, claimP("r1", 10))
	if err != nil {
		t.Fatal(err)
	}
	if got := rowIDs(rows); !reflect.DeepEqual(got, []int64{f[1], f[2], p[0]}) {
		t.Errorf("claim after DeleteFailed = %v, want %v (key f flows again, in order)", got, []int64{f[1], f[2], p[0]})
	}
	if n, r, err := env.Driver.DeleteFailed(ctx, nil); err != nil || n != 0 || r != 0 {
		t.Errorf("DeleteFailed(nil) = %d, %d, %v; want 0, 0, nil", n, r, err)
	}
}

// consoleDup inserts a row of the duplicate table.
func consoleDup(t *testing.T, env Env, consumer, eventID string, count int, firstAgo, lastAgo time.Duration) {
	t.Helper()
	d := env.Driver.Dialect()
	table := dialect.InboxDuplicateTable(env.Driver.Tables().Inbox)
	opsExec(t, env.DB, "INSERT INTO "+table+" (consumer, event_id, biz_type, biz_id, count, first_seen_at, last_seen_at) VALUES ("+
		d.Placeholder(1)+", "+d.Placeholder(2)+", 'T', 'k-"+eventID[:4]+"', "+strconv.Itoa(count)+", "+OpsAgo(d, firstAgo)+", "+OpsAgo(d, lastAgo)+")", consumer, eventID)
}

func consoleTestInboxConsumers(t *testing.T, env Env) {
	ctx := context.Background()
	d, inbox := env.Driver.Dialect(), env.Driver.Tables().Inbox
	ins := func(consumer string, n int, ago time.Duration) {
		for range n {
			opsExec(t, env.DB, "INSERT INTO "+inbox+" (consumer, event_id, biz_type, biz_id, processed_at) VALUES ("+
				d.Placeholder(1)+", "+d.Placeholder(2)+", 'T', 'k', "+OpsAgo(d, ago)+")", consumer, opsUUID())
		}
	}
	ins("billing", 3, time.Minute)
	ins("billing", 2, 3*time.Hour) // outside a 1h window
	ins("mail", 1, 10*time.Minute)
	ins("old", 4, 5*time.Hour) // nothing within the window
	d1, d2, d3 := opsUUID(), opsUUID(), opsUUID()
	consoleDup(t, env, "billing", d1, 3, 2*time.Hour, 5*time.Minute)
	consoleDup(t, env, "billing", d2, 1, 30*time.Minute, 30*time.Minute)
	consoleDup(t, env, "billing", d3, 1, 5*time.Hour, 5*time.Hour) // outside
	consoleDup(t, env, "dupsonly", opsUUID(), 2, 20*time.Minute, 20*time.Minute)

	got, err := env.Driver.InboxConsumers(ctx, time.Hour, 1000)
	if err != nil {
		t.Fatal(err)
	}
	names := []string{}
	by := map[string]driver.InboxConsumer{}
	for _, c := range got {
		names = append(names, c.Consumer)
		by[c.Consumer] = c
	}
	if !reflect.DeepEqual(names, []string{"billing", "dupsonly", "mail"}) {
		t.Fatalf("InboxConsumers(1h) = %+v, want billing, dupsonly, mail", got)
	}
	if b := by["billing"]; b.Handled != 3 || b.Capped || b.Duplicates != 2 {
		t.Errorf("billing = %+v, want 3 handled (not capped), 2 events duplicated", b)
	} else {
		adminNear(t, "billing last processed", time.Since(b.LastProcessedAt), time.Minute, 30*time.Second)
		adminNear(t, "billing last duplicate", time.Since(b.LastDuplicateAt), 5*time.Minute, 30*time.Second)
	}
	if m := by["mail"]; m.Handled != 1 || m.Duplicates != 0 || !m.LastDuplicateAt.IsZero() {
		t.Errorf("mail = %+v, want 1 handled, no duplicates", m)
	}
	if o := by["dupsonly"]; o.Handled != 0 || o.Duplicates != 1 || !o.LastProcessedAt.IsZero() {
		t.Errorf("dupsonly = %+v, want 0 handled, 1 duplicated event", o)
	}
	// A scan bound below the rows within the window: capped, counts are
	// of the newest rows.
	capped, err := env.Driver.InboxConsumers(ctx, time.Hour, 2)
	if err != nil {
		t.Fatal(err)
	}
	var handled int64
	for _, c := range capped {
		handled += c.Handled
		if !c.Capped {
			t.Errorf("InboxConsumers(scan 2): %+v not marked capped", c)
		}
	}
	if handled != 2 {
		t.Errorf("InboxConsumers(scan 2) counted %d handled rows, want 2", handled)
	}
	if _, err := env.Driver.InboxConsumers(ctx, 0, 10); err == nil {
		t.Error("InboxConsumers(window 0) succeeded, want an error")
	}

	recent, err := env.Driver.RecentDuplicates(ctx, "billing", 10)
	if err != nil {
		t.Fatal(err)
	}
	var eids []string
	for _, r := range recent {
		eids = append(eids, r.EventID)
	}
	if !reflect.DeepEqual(eids, []string{d1, d2, d3}) {
		t.Fatalf("RecentDuplicates(billing) = %+v, want %s, %s, %s (newest first)", recent, d1, d2, d3)
	}
	r := recent[0]
	if r.Consumer != "billing" || r.Count != 3 || r.Type != "T" || r.Key != "k-"+d1[:4] {
		t.Errorf("RecentDuplicates row = %+v, want billing, count 3, type T, key k-%s", r, d1[:4])
	}
	adminNear(t, "first seen", time.Since(r.FirstSeenAt), 2*time.Hour, time.Minute)
	adminNear(t, "last seen", time.Since(r.LastSeenAt), 5*time.Minute, time.Minute)
	if two, err := env.Driver.RecentDuplicates(ctx, "billing", 2); err != nil || len(two) != 2 {
		t.Errorf("RecentDuplicates(limit 2) = %d rows, %v", len(two), err)
	}
	if none, err := env.Driver.RecentDuplicates(ctx, "nobody", 10); err != nil || len(none) != 0 {
		t.Errorf("RecentDuplicates(nobody) = %+v, %v; want none", none, err)
	}
	if _, err := env.Driver.RecentDuplicates(ctx, "", 10); err == nil {
		t.Error("RecentDuplicates without a consumer succeeded, want an error")
	}
	if _, err := env.Driver.RecentDuplicates(ctx, "billing", 0); err == nil {
		t.Error("RecentDuplicates(limit 0) succeeded, want an error")
	}

	// The janitor's retention: rows last seen more than 1h ago, in batches.
	dupTable := dialect.InboxDuplicateTable(inbox)
	n, err := env.Driver.DeleteInboxDuplicates(ctx, time.Hour, 1)
	if err != nil || n != 1 {
		t.Fatalf("DeleteInboxDuplicates(1h, 1) = %d, %v; want 1 row", n, err)
	}
	n, err = env.Driver.DeleteInboxDuplicates(ctx, time.Hour, 100)
	if err != nil || n != 0 {
		t.Fatalf("second DeleteInboxDuplicates = %d, %v; want 0 (the rest are recent)", n, err)
	}
	if left := OpsCount(t, env.DB, dupTable, ""); left != 3 {
		t.Errorf("%d duplicate rows left, want 3", left)
	}
}

// consoleTestDuplicatesMissing: on a database at schema version 1 (no
// duplicate table) the inbox summary works without duplicates, and
// Check says what to run.
func consoleTestDuplicatesMissing(t *testing.T, env Env) {
	ctx := context.Background()
	dupTable := dialect.InboxDuplicateTable(env.Driver.Tables().Inbox)
	opsExec(t, env.DB, "DROP TABLE "+dupTable)
	err := env.Driver.Check(ctx, driver.InboxDuplicates)
	if dberr.Classify(err) != dberr.Missing || !strings.Contains(err.Error(), dupTable) || !strings.Contains(dberr.Explain(err, dberr.Need{}).Error(), "migrate") {
		t.Errorf("Check(InboxDuplicates) without the table = %v, want Missing naming it and `outboxgen migrate up`", err)
	}
	opsExec(t, env.DB, "INSERT INTO "+env.Driver.Tables().Inbox+" (consumer, event_id) VALUES ('c', 'e1')")
	got, err := env.Driver.InboxConsumers(ctx, time.Hour, 100)
	if err != nil || len(got) != 1 || got[0].Handled != 1 || got[0].Duplicates != 0 {
		t.Errorf("InboxConsumers without the duplicate table = %+v, %v; want c with 1 handled, 0 duplicates", got, err)
	}
	if dups, err := env.Driver.RecentDuplicates(ctx, "c", 10); err != nil || len(dups) != 0 {
		t.Errorf("RecentDuplicates without the duplicate table = %+v, %v; want none, no error", dups, err)
	}
	if err := env.Driver.Check(ctx, driver.Inbox); err != nil {
		t.Errorf("Check(Inbox) = %v: the inbox itself is fine", err)
	}
}

// consoleTestAtomic proves that one call of Requeue, Replay or
// DeleteFailed over more ids than one statement takes
// (dialect.MaxInList) is one transaction: a real failure in the second
// chunk leaves the first unchanged. PostgreSQL and MySQL: another
// transaction holds a row of the second chunk locked and the call's
// context ends while it waits. SQLite (one writer at a time): a trigger
// fails the statement on that row.
func consoleTestAtomic(t *testing.T, env Env, action string) {
	d, table := env.Driver.Dialect(), env.Driver.Tables().Outbox
	n := dialect.MaxInList + 200
	status := 2
	if action == "replay" {
		status = 1
	}
	seed := OpsSeedRow{Count: n, Status: status, CreatedAgo: time.Hour}
	if status == 1 {
		seed.SentAgo = time.Minute
	}
	ids := OpsSeed(t, env.DB, d, table, seed)[0]
	victim := ids[dialect.MaxInList+50]
	before := OpsRows(t, env.DB, table, ids)
	where := fmt.Sprintf("status = %d", status)

	call := func(ctx context.Context) (int64, error) {
		switch action {
		case "requeue":
			return env.Driver.Requeue(ctx, ids)
		case "replay":
			return env.Driver.Replay(ctx, ids)
		}
		n, _, err := env.Driver.DeleteFailed(ctx, ids)
		return n, err
	}

	op := "UPDATE"
	if action == "delete" {
		op = "DELETE"
	}
	failVictim(t, env, action, op, table, func(r string) string { return fmt.Sprintf("%sid = %d", r, victim) }, "topic = topic", func(ctx context.Context) error {
		_, err := call(ctx)
		return err
	})
	ctx := context.Background()
	if got := OpsRows(t, env.DB, table, ids); !reflect.DeepEqual(got, before) {
		t.Fatalf("%s failed in its second chunk but changed rows: %d of %d still %s", action, OpsCount(t, env.DB, table, where), n, where)
	}
	// Unhindered, one call changes them all.
	got, err := call(ctx)
	if err != nil || got != int64(n) {
		t.Fatalf("%s of %d ids = %d, %v; want all", action, n, got, err)
	}
	if left := OpsCount(t, env.DB, table, where); left != 0 {
		t.Errorf("%d rows still %s after %s", left, where, action)
	}
}

// consoleTestAtomicForget is consoleTestAtomic for ForgetInbox: one call
// over more event ids than one statement takes forgets all of them or,
// when the second chunk fails, none.
func consoleTestAtomicForget(t *testing.T, env Env) {
	table := env.Driver.Tables().Inbox
	n := dialect.MaxInList + 200
	eids := make([]string, n)
	for i := range eids {
		eids[i] = fmt.Sprintf("00000000-0000-4000-8000-%012d", i)
	}
	for i := 0; i < n; i += 100 {
		vals := make([]string, 0, 100)
		for _, e := range eids[i:min(i+100, n)] {
			vals = append(vals, "('c', '"+e+"')")
		}
		opsExec(t, env.DB, "INSERT INTO "+table+" (consumer, event_id) VALUES "+strings.Join(vals, ", "))
	}
	victim := eids[dialect.MaxInList+50]
	count := func() int64 { return OpsCount(t, env.DB, table, "consumer = 'c'") }

	failVictim(t, env, "ForgetInbox", "DELETE", table, func(r string) string { return r + "consumer = 'c' AND " + r + "event_id = '" + victim + "'" }, "biz_type = biz_type", func(ctx context.Context) error {
		_, err := env.Driver.ForgetInbox(ctx, "c", eids)
		return err
	})
	ctx := context.Background()
	if got := count(); got != int64(n) {
		t.Fatalf("ForgetInbox failed in its second chunk but forgot rows: %d of %d left", got, n)
	}
	got, err := env.Driver.ForgetInbox(ctx, "c", eids)
	if err != nil || got != int64(n) {
		t.Fatalf("ForgetInbox of %d event ids = %d, %v; want all", n, got, err)
	}
	if left := count(); left != 0 {
		t.Errorf("%d inbox rows left after ForgetInbox", left)
	}
}

// failVictim runs call while the row of table that where selects (in the
// call's second chunk; where("OLD.") names its columns in a trigger)
// makes it fail, and checks that it failed. SQLite
// (one writer at a time): a trigger fails op on the row. PostgreSQL and
// MySQL: another transaction holds the row locked (an UPDATE setting
// noop) and the call's context ends while it waits.
func failVictim(t *testing.T, env Env, what, op, table string, where func(row string) string, noop string, call func(context.Context) error) {
	t.Helper()
	ctx := context.Background()
	if env.Driver.Dialect() == dialect.SQLite {
		opsExec(t, env.DB, fmt.Sprintf("CREATE TRIGGER drivertest_fail BEFORE %s ON %s WHEN %s BEGIN SELECT RAISE(ABORT, 'drivertest: the row refuses'); END", op, table, where("OLD.")))
		err := call(ctx)
		if err == nil || !strings.Contains(err.Error(), "refuses") {
			t.Fatalf("%s with a failing row in the second chunk: %v, want the trigger's error", what, err)
		}
		opsExec(t, env.DB, "DROP TRIGGER drivertest_fail")
		return
	}
	lock, err := env.DB.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer lock.Rollback() //nolint:errcheck
	if _, err := lock.ExecContext(ctx, fmt.Sprintf("UPDATE %s SET %s WHERE %s", table, noop, where(""))); err != nil {
		t.Fatal(err)
	}
	cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	err = call(cctx)
	cancel()
	if err == nil {
		t.Fatalf("%s while a row of its second chunk (%s) is locked: no error", what, where(""))
	}
	if err := lock.Rollback(); err != nil {
		t.Fatal(err)
	}
}
