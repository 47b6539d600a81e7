package drivertest

// The operator's part of the suite: Overview, FindEvents, GetEvent,
// GetEventByEventID, Replay, FindInbox and ForgetInbox, run by runOps.
// Rows are seeded with OpsSeed and then shaped row by row with UPDATEs
// that use the database clock (OpsAgo), as in the rest of the suite.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"slices"
	"testing"
	"time"

	"github.com/outboxgen/outboxgen/runtime/driver"
)

// runAdmin runs the operator's part of the suite.
func runAdmin(t *testing.T, open func(t *testing.T) Env) {
	t.Run("FindEvents", func(t *testing.T) { adminTestFindEvents(t, open(t)) })
	t.Run("GetEvent", func(t *testing.T) { adminTestGetEvent(t, open(t)) })
	t.Run("Replay", func(t *testing.T) { adminTestReplay(t, open(t)) })
	t.Run("Overview", func(t *testing.T) { adminTestOverview(t, open(t)) })
	t.Run("OverviewEmpty", func(t *testing.T) { adminTestOverviewEmpty(t, open(t)) })
	t.Run("Inbox", func(t *testing.T) { adminTestInbox(t, open(t)) })
	runConsole(t, open)
}

// adminSet runs "UPDATE outbox SET set WHERE id = id".
func adminSet(t *testing.T, env Env, id int64, set string) {
	t.Helper()
	opsExec(t, env.DB, fmt.Sprintf("UPDATE %s SET %s WHERE id = %d", env.Driver.Tables().Outbox, set, id))
}

func adminIDs(evs []driver.Event) []int64 {
	ids := []int64{}
	for _, e := range evs {
		ids = append(ids, e.ID)
	}
	return ids
}

func adminFind(t *testing.T, env Env, f driver.EventFilter) []driver.Event {
	t.Helper()
	if f.Limit == 0 {
		f.Limit = 100
	}
	evs, err := env.Driver.FindEvents(context.Background(), f)
	if err != nil {
		t.Fatalf("FindEvents(%+v): %v", f, err)
	}
	return evs
}

func adminNear(t *testing.T, what string, got, want, tol time.Duration) {
	t.Helper()
	if got < want-tol || got > want+tol {
		t.Errorf("%s = %s, want %s ± %s", what, got, want, tol)
	}
}

func adminTestFindEvents(t *testing.T, env Env) {
	d := env.Driver.Dialect()
	live := time.Hour
	ids := OpsSeed(t, env.DB, d, env.Driver.Tables().Outbox,
		OpsSeedRow{Count: 2, Status: 0}, // A: pending, fresh
		OpsSeedRow{Count: 2, Status: 1, CreatedAgo: 2 * time.Hour, SentAgo: time.Hour}, // B: sent
		OpsSeedRow{Count: 2, Status: 2, CreatedAgo: 3 * time.Hour},                     // C: failed
		OpsSeedRow{Count: 1, Status: 0, Lease: &live},                                  // D: pending, leased
	)
	a, b, c, dd := ids[0], ids[1], ids[2], ids[3]
	adminSet(t, env, a[0], "topic = 'other.topic'")
	adminSet(t, env, c[0], "retry_count = 5, last_error = 'Broker SAYS No: topic missing'")
	adminSet(t, env, c[1], "retry_count = 5, last_error = 'dial tcp: i/o TIMEOUT'")
	all := slices.Concat(a, b, c, dd)

	cases := []struct {
		name string
		f    driver.EventFilter
		want []int64
	}{
		{"any", driver.EventFilter{Status: -1}, all},
		{"pending", driver.EventFilter{Status: 0}, slices.Concat(a, dd)},
		{"sent", driver.EventFilter{Status: 1}, b},
		{"failed", driver.EventFilter{Status: 2}, c},
		{"ids", driver.EventFilter{Status: -1, IDs: []int64{c[0], a[1], 1 << 40}}, []int64{a[1], c[0]}},
		{"ids+status", driver.EventFilter{Status: 2, IDs: []int64{c[0], a[1]}}, []int64{c[0]}},
		{"keys", driver.EventFilter{Status: -1, Keys: []string{"k1"}}, []int64{a[1], b[1], c[1]}},
		{"topics", driver.EventFilter{Status: -1, Topics: []string{"other.topic"}}, []int64{a[0]}},
		{"topics none", driver.EventFilter{Status: -1, Topics: []string{"no.such.topic"}}, []int64{}},
		{"max age", driver.EventFilter{Status: -1, MaxAge: 90 * time.Minute}, slices.Concat(a, dd)},
		{"min age", driver.EventFilter{Status: -1, MinAge: 90 * time.Minute}, slices.Concat(b, c)},
		{"age range", driver.EventFilter{Status: -1, MaxAge: 150 * time.Minute, MinAge: 90 * time.Minute}, b},
		{"error lower", driver.EventFilter{Status: -1, ErrorContains: "broker says"}, []int64{c[0]}},
		{"error upper", driver.EventFilter{Status: -1, ErrorContains: "TIMEOUT"}, []int64{c[1]}},
		{"error mixed", driver.EventFilter{Status: 2, ErrorContains: "I/O tImEoUt"}, []int64{c[1]}},
		{"error none", driver.EventFilter{Status: -1, ErrorContains: "nothing like it"}, []int64{}},
		{"after+to", driver.EventFilter{Status: -1, AfterID: a[0], ToID: b[1]}, []int64{a[1], b[0], b[1]}},
		{"limit", driver.EventFilter{Status: -1, Limit: 3}, all[:3]},
	}
	for _, tc := range cases {
		if got := adminIDs(adminFind(t, env, tc.f)); !reflect.DeepEqual(got, tc.want) {
			t.Errorf("FindEvents %s (%+v) = ids %v, want %v", tc.name, tc.f, got, tc.want)
		}
	}

	// Event ids and types: taken from a first read.
	evs := adminFind(t, env, driver.EventFilter{Status: -1})
	byID := map[int64]driver.Event{}
	for _, e := range evs {
		byID[e.ID] = e
	}
	if got := adminIDs(adminFind(t, env, driver.EventFilter{Status: -1, EventIDs: []string{byID[b[0]].EventID, byID[c[1]].EventID}})); !reflect.DeepEqual(got, []int64{b[0], c[1]}) {
		t.Errorf("FindEvents by event ids = %v, want %v", got, []int64{b[0], c[1]})
	}
	if got := adminIDs(adminFind(t, env, driver.EventFilter{Status: -1, Types: []string{byID[b[0]].Type, byID[dd[0]].Type}})); !reflect.DeepEqual(got, slices.Concat(b, dd)) {
		t.Errorf("FindEvents by types = %v, want %v", got, slices.Concat(b, dd))
	}
	// Combined filters AND.
	if got := adminIDs(adminFind(t, env, driver.EventFilter{Status: -1, Types: []string{byID[c[0]].Type}, Keys: []string{"k0"}, Topics: []string{"seed.topic"}})); !reflect.DeepEqual(got, []int64{c[0]}) {
		t.Errorf("FindEvents by type+key+topic = %v, want %v", got, []int64{c[0]})
	}

	// Paging with AfterID.
	var paged []int64
	var after int64
	for page := 0; ; page++ {
		p := adminFind(t, env, driver.EventFilter{Status: -1, AfterID: after, Limit: 2})
		if len(p) == 0 {
			break
		}
		if len(p) > 2 || page > 10 {
			t.Fatalf("page %d has %d rows", page, len(p))
		}
		paged = append(paged, adminIDs(p)...)
		after = p[len(p)-1].ID
	}
	if !reflect.DeepEqual(paged, all) {
		t.Errorf("paging by 2 read %v, want %v", paged, all)
	}

	// Fields.
	for _, id := range all {
		e := byID[id]
		if e.EventID == "" || e.Type == "" || e.Key == "" || e.Topic == "" || e.Version != 1 {
			t.Errorf("row %d: identity fields missing: %+v", id, e)
		}
		if e.CreatedAt.IsZero() || e.UpdatedAt.IsZero() || e.NextRetryAt.IsZero() {
			t.Errorf("row %d: a timestamp is zero: %+v", id, e)
		}
		if e.Payload != nil || e.Headers != nil {
			t.Errorf("row %d: FindEvents returned payload %q / headers %q, want nil", id, e.Payload, e.Headers)
		}
	}
	for _, id := range a {
		e := byID[id]
		if e.Status != driver.Pending || !e.SentAt.IsZero() || e.LastError != "" || e.LeaseOwner != "" || !e.LeaseExpiresAt.IsZero() || e.RetryCount != 0 {
			t.Errorf("pending row %d: %+v, want status pending, no sent_at, error or lease", id, e)
		}
	}
	for _, id := range b {
		e := byID[id]
		if e.Status != driver.Sent || e.SentAt.IsZero() {
			t.Errorf("sent row %d: %+v, want status sent with sent_at", id, e)
			continue
		}
		// created 2h ago, sent 1h ago: the clocks and time zones agree.
		adminNear(t, fmt.Sprintf("row %d sent_at - created_at", id), e.SentAt.Sub(e.CreatedAt), time.Hour, time.Minute)
		adminNear(t, fmt.Sprintf("row %d age by Go clock", id), time.Since(e.CreatedAt), 2*time.Hour, 5*time.Minute)
	}
	if e := byID[c[0]]; e.Status != driver.Failed || e.RetryCount != 5 || e.LastError != "Broker SAYS No: topic missing" || !e.SentAt.IsZero() {
		t.Errorf("failed row %d: %+v, want status failed, attempts 5, its last error", c[0], e)
	}
	if e := byID[dd[0]]; e.LeaseOwner != "seed-owner" || e.LeaseExpiresAt.IsZero() {
		t.Errorf("leased row %d: %+v, want lease owner seed-owner and an expiry", dd[0], e)
	} else {
		adminNear(t, "lease expiry - created_at", e.LeaseExpiresAt.Sub(e.CreatedAt), time.Hour, time.Minute)
	}

	// Bad filters are refused.
	ctx := context.Background()
	for _, f := range []driver.EventFilter{{Status: -1, Limit: 0}, {Status: -1, Limit: 1001}, {Status: 3, Limit: 1}, {Status: -2, Limit: 1}} {
		if _, err := env.Driver.FindEvents(ctx, f); err == nil {
			t.Errorf("FindEvents(%+v) succeeded, want an error", f)
		}
	}
}

func adminJSONEqual(a, b []byte) bool {
	var x, y any
	if json.Unmarshal(a, &x) != nil || json.Unmarshal(b, &y) != nil {
		return false
	}
	return reflect.DeepEqual(x, y)
}

func adminTestGetEvent(t *testing.T, env Env) {
	ctx := context.Background()
	ids := OpsSeed(t, env.DB, env.Driver.Dialect(), env.Driver.Tables().Outbox,
		OpsSeedRow{Count: 2, Status: 2, CreatedAgo: time.Hour})
	adminSet(t, env, ids[0][0], `payload = '{"amount": 42, "note": "x"}', headers = '{"traceparent": "00-abc"}', retry_count = 3, last_error = 'boom'`)

	e, err := env.Driver.GetEvent(ctx, ids[0][0])
	if err != nil {
		t.Fatal(err)
	}
	if e.ID != ids[0][0] || e.Status != driver.Failed || e.RetryCount != 3 || e.LastError != "boom" || e.EventID == "" || e.CreatedAt.IsZero() {
		t.Errorf("GetEvent = %+v", e)
	}
	if !adminJSONEqual(e.Payload, []byte(`{"amount": 42, "note": "x"}`)) {
		t.Errorf("GetEvent payload = %q", e.Payload)
	}
	if !adminJSONEqual(e.Headers, []byte(`{"traceparent": "00-abc"}`)) {
		t.Errorf("GetEvent headers = %q", e.Headers)
	}
	byEID, err := env.Driver.GetEventByEventID(ctx, e.EventID)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(byEID, e) {
		t.Errorf("GetEventByEventID = %+v\nwant GetEvent's %+v", byEID, e)
	}
	// A row without headers.
	e2, err := env.Driver.GetEvent(ctx, ids[0][1])
	if err != nil {
		t.Fatal(err)
	}
	if len(e2.Headers) != 0 || !adminJSONEqual(e2.Payload, []byte(`{}`)) {
		t.Errorf("GetEvent of a row without headers: payload %q headers %q", e2.Payload, e2.Headers)
	}

	if _, err := env.Driver.GetEvent(ctx, 1<<40); !errors.Is(err, driver.ErrNotFound) {
		t.Errorf("GetEvent(missing) error = %v, want driver.ErrNotFound", err)
	}
	if _, err := env.Driver.GetEventByEventID(ctx, opsUUID()); !errors.Is(err, driver.ErrNotFound) {
		t.Errorf("GetEventByEventID(missing) error = %v, want driver.ErrNotFound", err)
	}
}

func adminTestReplay(t *testing.T, env Env) {
	ctx := context.Background()
	ids := OpsSeed(t, env.DB, env.Driver.Dialect(), env.Driver.Tables().Outbox,
		OpsSeedRow{Count: 1, Status: 0},
		OpsSeedRow{Count: 2, Status: 1, CreatedAgo: 2 * time.Hour, SentAgo: time.Hour},
		OpsSeedRow{Count: 1, Status: 2, CreatedAgo: 3 * time.Hour},
		OpsSeedRow{Count: 1, Status: 1, CreatedAgo: 2 * time.Hour, SentAgo: time.Hour}, // not named
	)
	pending, sent, failed, other := ids[0], ids[1], ids[2], ids[3]
	adminSet(t, env, sent[0], `retry_count = 2, last_error = 'earlier', payload = '{"v": 7}', headers = '{"h": "1"}'`)
	adminSet(t, env, failed[0], "retry_count = 9, last_error = 'dead'")
	before := map[int64]driver.Event{}
	for _, id := range slices.Concat(pending, sent, failed, other) {
		e, err := env.Driver.GetEvent(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		before[id] = e
	}

	n, err := env.Driver.Replay(ctx, slices.Concat(pending, sent, failed, []int64{1 << 40}))
	if err != nil {
		t.Fatal(err)
	}
	if n != 2 {
		t.Fatalf("Replay changed %d rows, want the 2 sent ones", n)
	}
	for _, id := range sent {
		e, err := env.Driver.GetEvent(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		b := before[id]
		if e.Status != driver.Pending || e.RetryCount != 0 || !e.SentAt.IsZero() || e.LastError != "" || e.LeaseOwner != "" {
			t.Errorf("replayed row %d = %+v, want pending, attempts 0, no sent_at, error or lease", id, e)
		}
		if e.EventID != b.EventID || string(e.Payload) != string(b.Payload) || string(e.Headers) != string(b.Headers) || e.Type != b.Type || e.Key != b.Key {
			t.Errorf("replayed row %d changed its event id, payload or headers: %+v (was %+v)", id, e, b)
		}
		// Due now: next_retry_time about created_at + 2h.
		adminNear(t, fmt.Sprintf("row %d next_retry_time - created_at", id), e.NextRetryAt.Sub(e.CreatedAt), 2*time.Hour, 5*time.Minute)
	}
	for _, id := range slices.Concat(pending, failed, other) {
		e, err := env.Driver.GetEvent(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(e, before[id]) {
			t.Errorf("row %d (not sent or not named) changed:\n got %+v\nwant %+v", id, e, before[id])
		}
	}
	// The replayed rows are claimable again.
	rows, err := env.Driver.Claim(ctx, driver.ClaimParams{Owner: "replay", Lease: time.Minute, Limit: 10})
	if err != nil {
		t.Fatal(err)
	}
	var claimed []int64
	for _, r := range rows {
		claimed = append(claimed, r.ID)
	}
	for _, id := range sent {
		if !slices.Contains(claimed, id) {
			t.Errorf("replayed row %d not claimable: claimed %v", id, claimed)
		}
	}
	// Nothing left to replay among them.
	if n, err := env.Driver.Replay(ctx, sent); err != nil || n != 0 {
		t.Errorf("second Replay = %d, %v; want 0, nil", n, err)
	}
	if n, err := env.Driver.Replay(ctx, nil); err != nil || n != 0 {
		t.Errorf("Replay(nil) = %d, %v; want 0, nil", n, err)
	}
}

func adminTestOverviewEmpty(t *testing.T, env Env) {
	o, err := env.Driver.Overview(context.Background(), driver.OverviewParams{StaleAfter: 10 * time.Minute, CountSent: true})
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(o, driver.Overview{}) {
		t.Errorf("Overview of an empty table = %+v, want all zero", o)
	}
	// Without CountSent, the sent rows are not counted (-1), the rest is
	// the same.
	o, err = env.Driver.Overview(context.Background(), driver.OverviewParams{StaleAfter: 10 * time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	if want := (driver.Overview{Sent: -1}); !reflect.DeepEqual(o, want) {
		t.Errorf("Overview of an empty table without CountSent = %+v, want %+v", o, want)
	}
}

func adminTestOverview(t *testing.T, env Env) {
	ctx := context.Background()
	d := env.Driver.Dialect()
	ids := OpsSeed(t, env.DB, d, env.Driver.Tables().Outbox, OpsSeedRow{Count: 19, Status: 0})[0]
	inHour, expired := OpsAgo(d, -time.Hour), OpsAgo(d, time.Minute)
	sent := func(ago time.Duration) string {
		return fmt.Sprintf("status = 1, sent_at = %s, created_at = %s", OpsAgo(d, ago), OpsAgo(d, ago+5*time.Second))
	}
	sets := []string{
		// key kf: FAILED head, two pending rows behind it.
		"biz_type = 'ord', biz_id = 'kf', topic = 't1', status = 2, retry_count = 5, last_error = 'x'",
		"biz_type = 'ord', biz_id = 'kf', topic = 't1'",
		"biz_type = 'ord', biz_id = 'kf', topic = 't1'",
		// key kb: backing-off head, one pending row behind it.
		"biz_type = 'ord', biz_id = 'kb', topic = 't1', retry_count = 1, next_retry_time = " + inHour,
		"biz_type = 'ord', biz_id = 'kb', topic = 't1'",
		// key kok: a plain pending row.
		"biz_type = 'ord', biz_id = 'kok', topic = 't1'",
		// unordered type: FAILED head and a pending row, never held back
		// when the type is listed unordered.
		"biz_type = 'unord', biz_id = 'ku', topic = 't2', status = 2, retry_count = 5",
		"biz_type = 'unord', biz_id = 'ku', topic = 't2'",
		// leases: two live (two relays), one expired.
		"biz_type = 'ord', biz_id = 'kl1', topic = 't1', lease_owner = 'o1', lease_expires_at = " + inHour,
		"biz_type = 'ord', biz_id = 'kl2', topic = 't1', lease_owner = 'o2', lease_expires_at = " + inHour,
		"biz_type = 'ord', biz_id = 'kl3', topic = 't1', lease_owner = 'o3', lease_expires_at = " + expired,
		// another FAILED row of (ord, t1), nothing behind it.
		"biz_type = 'ord', biz_id = 'kf2', topic = 't1', status = 2, retry_count = 5",
		// sent rows: two about 1.5 minutes ago, one 10 minutes ago, one
		// outside the hour window; each 5 s after it was created.
		"biz_type = 'ord', biz_id = 's1', " + sent(90*time.Second),
		"biz_type = 'ord', biz_id = 's2', " + sent(100*time.Second),
		"biz_type = 'ord', biz_id = 's3', " + sent(10*time.Minute+30*time.Second),
		"biz_type = 'ord', biz_id = 's4', " + sent(2*time.Hour),
		// a backing-off row whose key has nothing behind it.
		"biz_type = 'ord', biz_id = 'kb2', topic = 't1', retry_count = 2, next_retry_time = " + inHour,
		// a pending row with retries that is due (not backing off).
		"biz_type = 'ord', biz_id = 'kdue', topic = 't1', retry_count = 1, next_retry_time = " + OpsAgo(d, time.Minute),
		// a sent row behind the FAILED head of kf: not held back.
		"biz_type = 'ord', biz_id = 'kf', topic = 't1', " + sent(30*time.Minute+30*time.Second),
	}
	if len(sets) != len(ids) {
		t.Fatalf("fixture: %d rows, %d shapes", len(ids), len(sets))
	}
	for i, s := range sets {
		adminSet(t, env, ids[i], s)
	}

	o, err := env.Driver.Overview(ctx, driver.OverviewParams{StaleAfter: 10 * time.Minute, Unordered: []string{"unord"}, Window: time.Hour, CountSent: true})
	if err != nil {
		t.Fatal(err)
	}
	if o.Sent != 5 || o.SentFromID != 0 {
		t.Errorf("Overview Sent %d SentFromID %d, want 5 (s1-s4 and kf's) and 0", o.Sent, o.SentFromID)
	}
	// pending: kf x2, kb x2, kok, ku, kl1-3, kb2, kdue = 11
	if o.Pending != 11 || o.Failed != 3 || o.ExpiredLeases != 1 || o.Stale != 0 {
		t.Errorf("Overview stats = %+v, want Pending 11, Failed 3, ExpiredLeases 1, Stale 0", o.Stats)
	}
	if o.BackingOff != 2 || o.InFlight != 2 || o.Relays != 2 {
		t.Errorf("Overview BackingOff %d InFlight %d Relays %d, want 2, 2, 2", o.BackingOff, o.InFlight, o.Relays)
	}
	if o.HeldBackKeys != 2 || o.HeldBackRows != 3 {
		t.Errorf("Overview (unord unordered) HeldBackKeys %d HeldBackRows %d, want 2 (kf, kb) and 3", o.HeldBackKeys, o.HeldBackRows)
	}
	wantGroups := []driver.FailedGroup{
		{Type: "ord", Topic: "t1", Count: 2, FirstID: ids[0]},
		{Type: "unord", Topic: "t2", Count: 1, FirstID: ids[6]},
	}
	var gotGroups []driver.FailedGroup
	for _, g := range o.FailedGroups {
		if g.LastFailedAt.IsZero() {
			t.Errorf("failed group %+v: LastFailedAt is zero", g)
		} else {
			adminNear(t, "failed group age", time.Since(g.LastFailedAt), 0, 5*time.Minute)
		}
		g.LastFailedAt = time.Time{}
		gotGroups = append(gotGroups, g)
	}
	if !reflect.DeepEqual(gotGroups, wantGroups) {
		t.Errorf("FailedGroups = %+v, want %+v", gotGroups, wantGroups)
	}
	var sum int64
	minutes := map[int]int64{}
	for _, m := range o.SentPerMinute {
		sum += m.Sent
		minutes[m.MinutesAgo] += m.Sent
		if m.MinutesAgo < 0 || m.MinutesAgo >= 60 {
			t.Errorf("SentPerMinute minute %d outside the window", m.MinutesAgo)
		}
		if m.AvgLag < 4 || m.AvgLag > 6 || m.MaxLag < 4 || m.MaxLag > 6 {
			t.Errorf("SentPerMinute %+v: lag should be about 5 s", m)
		}
	}
	if sum != 4 {
		t.Errorf("SentPerMinute = %+v: sums to %d, want 4 (the rows sent within the hour)", o.SentPerMinute, sum)
	}
	if minutes[1] != 2 || minutes[10] != 1 || minutes[30] != 1 {
		t.Errorf("SentPerMinute by minute = %v, want 2 at minute 1, 1 at 10, 1 at 30", minutes)
	}
	for i := 1; i < len(o.SentPerMinute); i++ {
		if o.SentPerMinute[i].MinutesAgo <= o.SentPerMinute[i-1].MinutesAgo {
			t.Errorf("SentPerMinute not newest first: %+v", o.SentPerMinute)
		}
	}

	// Without the unordered list, ku counts too.
	o, err = env.Driver.Overview(ctx, driver.OverviewParams{StaleAfter: 10 * time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	if o.HeldBackKeys != 3 || o.HeldBackRows != 4 {
		t.Errorf("Overview (all ordered) HeldBackKeys %d HeldBackRows %d, want 3 and 4", o.HeldBackKeys, o.HeldBackRows)
	}
	// A narrow window and scan bound.
	o, err = env.Driver.Overview(ctx, driver.OverviewParams{StaleAfter: 10 * time.Minute, Window: 5 * time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	sum = 0
	for _, m := range o.SentPerMinute {
		sum += m.Sent
	}
	if sum != 2 {
		t.Errorf("SentPerMinute over 5 minutes = %+v, want 2 rows", o.SentPerMinute)
	}
	o, err = env.Driver.Overview(ctx, driver.OverviewParams{StaleAfter: 10 * time.Minute, ScanRows: 1})
	if err != nil {
		t.Fatal(err)
	}
	sum = 0
	for _, m := range o.SentPerMinute {
		sum += m.Sent
	}
	if sum != 1 { // only the newest id: the kf row sent 30 minutes ago
		t.Errorf("SentPerMinute scanning 1 row = %+v, want 1 row", o.SentPerMinute)
	}
	o, err = env.Driver.Overview(ctx, driver.OverviewParams{StaleAfter: 10 * time.Minute, MaxGroups: 1})
	if err != nil {
		t.Fatal(err)
	}
	if len(o.FailedGroups) != 1 || o.FailedGroups[0].Type != "ord" {
		t.Errorf("FailedGroups with MaxGroups 1 = %+v, want the (ord, t1) group only", o.FailedGroups)
	}
}

func adminTestInbox(t *testing.T, env Env) {
	ctx := context.Background()
	d, table := env.Driver.Dialect(), env.Driver.Tables().Inbox
	e := []string{opsUUID(), opsUUID(), opsUUID(), opsUUID()}
	slices.Sort(e)
	ins := func(consumer, eventID, typ, key string, ago time.Duration) {
		opsExec(t, env.DB, "INSERT INTO "+table+" (consumer, event_id, biz_type, biz_id) VALUES ("+
			d.Placeholder(1)+", "+d.Placeholder(2)+", "+d.Placeholder(3)+", "+d.Placeholder(4)+")", consumer, eventID, typ, key)
		if ago > 0 {
			opsExec(t, env.DB, "UPDATE "+table+" SET processed_at = "+OpsAgo(d, ago)+" WHERE consumer = "+d.Placeholder(1)+" AND event_id = "+d.Placeholder(2), consumer, eventID)
		}
	}
	ins("c1", e[0], "A", "ka", 0)
	ins("c1", e[1], "A", "ka", 0)
	ins("c1", e[2], "B", "kb", 0)
	ins("c1", e[3], "B", "kb", 2*time.Hour)
	ins("c2", e[0], "A", "ka", 0)

	find := func(f driver.InboxFilter) []string {
		t.Helper()
		if f.Limit == 0 {
			f.Limit = 100
		}
		rows, err := env.Driver.FindInbox(ctx, f)
		if err != nil {
			t.Fatalf("FindInbox(%+v): %v", f, err)
		}
		out := []string{}
		for _, r := range rows {
			if r.Consumer != f.Consumer || r.ProcessedAt.IsZero() || r.Type == "" || r.Key == "" {
				t.Errorf("FindInbox row %+v: wrong consumer or a field missing", r)
			}
			out = append(out, r.EventID)
		}
		return out
	}
	cases := []struct {
		name string
		f    driver.InboxFilter
		want []string
	}{
		{"all c1", driver.InboxFilter{Consumer: "c1"}, e},
		{"all c2", driver.InboxFilter{Consumer: "c2"}, e[:1]},
		{"nobody", driver.InboxFilter{Consumer: "c3"}, []string{}},
		{"event ids", driver.InboxFilter{Consumer: "c1", EventIDs: []string{e[2], e[0]}}, []string{e[0], e[2]}},
		{"types", driver.InboxFilter{Consumer: "c1", Types: []string{"A"}}, e[:2]},
		{"keys", driver.InboxFilter{Consumer: "c1", Keys: []string{"kb"}}, e[2:]},
		{"max age", driver.InboxFilter{Consumer: "c1", MaxAge: time.Hour}, e[:3]},
		{"min age", driver.InboxFilter{Consumer: "c1", MinAge: time.Hour}, e[3:]},
		{"after", driver.InboxFilter{Consumer: "c1", AfterEventID: e[1]}, e[2:]},
		{"limit", driver.InboxFilter{Consumer: "c1", Limit: 2}, e[:2]},
		{"types+keys", driver.InboxFilter{Consumer: "c1", Types: []string{"B"}, Keys: []string{"ka"}}, []string{}},
	}
	for _, tc := range cases {
		if got := find(tc.f); !reflect.DeepEqual(got, tc.want) {
			t.Errorf("FindInbox %s = %v, want %v", tc.name, got, tc.want)
		}
	}
	rows, err := env.Driver.FindInbox(ctx, driver.InboxFilter{Consumer: "c1", EventIDs: e[:1], Limit: 1})
	if err != nil {
		t.Fatal(err)
	}
	if len(rows) != 1 || rows[0].Type != "A" || rows[0].Key != "ka" || rows[0].EventID != e[0] {
		t.Errorf("FindInbox row = %+v, want type A key ka event %s", rows, e[0])
	} else {
		adminNear(t, "processed_at age", time.Since(rows[0].ProcessedAt), 0, 5*time.Minute)
	}
	for _, f := range []driver.InboxFilter{{Limit: 1}, {Consumer: "c1"}, {Consumer: "c1", Limit: 1001}} {
		if _, err := env.Driver.FindInbox(ctx, f); err == nil {
			t.Errorf("FindInbox(%+v) succeeded, want an error", f)
		}
	}

	n, err := env.Driver.ForgetInbox(ctx, "c1", []string{e[0], e[1], opsUUID()})
	if err != nil {
		t.Fatal(err)
	}
	if n != 2 {
		t.Errorf("ForgetInbox deleted %d rows, want 2", n)
	}
	if got := find(driver.InboxFilter{Consumer: "c1"}); !reflect.DeepEqual(got, e[2:]) {
		t.Errorf("after ForgetInbox c1 holds %v, want %v", got, e[2:])
	}
	if got := find(driver.InboxFilter{Consumer: "c2"}); !reflect.DeepEqual(got, e[:1]) {
		t.Errorf("after ForgetInbox of c1, c2 holds %v, want %v (consumers are separate)", got, e[:1])
	}
	if _, err := env.Driver.ForgetInbox(ctx, "", []string{e[2]}); err == nil {
		t.Error("ForgetInbox without a consumer succeeded, want an error")
	}
	if n, err := env.Driver.ForgetInbox(ctx, "c1", nil); err != nil || n != 0 {
		t.Errorf("ForgetInbox(no ids) = %d, %v; want 0, nil", n, err)
	}
	if got := OpsCount(t, env.DB, table, ""); got != 3 {
		t.Errorf("inbox holds %d rows, want 3", got)
	}
}
