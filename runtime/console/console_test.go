package console_test

import (
	"context"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/net/html"

	"github.com/outboxgen/outboxgen/runtime/admin"
	"github.com/outboxgen/outboxgen/runtime/console"
	"github.com/outboxgen/outboxgen/runtime/driver"
)

// scenario is the state most tests start from: the 3 a.m. page.
type scenario struct {
	failed     []int64 // ORDER_PAID, topic orders.paid, keys a1..a3
	stock      int64   // STOCK_RESERVED FAILED, topic stock.reserved, key s1
	waiting    []int64 // pending behind a1 (2) and a2 (1)
	backoff    int64   // pending, backing off, key b1
	behindB    int64   // pending behind it
	sent       []int64 // sent 5 minutes ago
	recentSent int64   // sent 30 s ago
	leased     int64   // pending, leased to relay-1
	stale      int64   // pending for an hour, key p1
}

const refusedErr = "broker refused topic orders.paid: no stream"

func seed(t testing.TB, e env) scenario {
	t.Helper()
	var s scenario
	for i := 1; i <= 3; i++ {
		s.failed = append(s.failed, e.insert(t, row{key: fmt.Sprintf("a%d", i), status: 2, attempts: 5, lastError: refusedErr, createdAgo: 20 * time.Minute,
			payload: fmt.Sprintf(`{"order":"o-%d","amount":12.5}`, i), headers: `{"traceparent":"00-abc-def-01"}`}))
	}
	s.stock = e.insert(t, row{typ: "STOCK_RESERVED", topic: "stock.reserved", key: "s1", status: 2, attempts: 1, lastError: "permanent: topic stock.reserved refused", createdAgo: 15 * time.Minute})
	s.waiting = append(s.waiting,
		e.insert(t, row{key: "a1", createdAgo: 8 * time.Minute}),
		e.insert(t, row{key: "a1", createdAgo: 7 * time.Minute}),
		e.insert(t, row{key: "a2", createdAgo: 6 * time.Minute}))
	s.backoff = e.insert(t, row{key: "b1", attempts: 2, lastError: "timeout", createdAgo: 5 * time.Minute, nextRetryIn: time.Hour})
	s.behindB = e.insert(t, row{key: "b1", createdAgo: 4 * time.Minute})
	for i := range 5 {
		s.sent = append(s.sent, e.insert(t, row{key: fmt.Sprintf("o%d", i), status: 1, createdAgo: 5*time.Minute + 2*time.Second, sentAgo: 5 * time.Minute}))
	}
	s.recentSent = e.insert(t, row{key: "r1", status: 1, createdAgo: 31 * time.Second, sentAgo: 30 * time.Second})
	s.leased = e.insert(t, row{key: "l1"})
	e.exec(t, fmt.Sprintf("UPDATE %s SET lease_owner = 'relay-1', lease_expires_at = %s WHERE id = %d", e.outbox(), ago(e.d, -time.Minute), s.leased))
	s.stale = e.insert(t, row{key: "p1", createdAgo: time.Hour})
	return s
}

func id(n int64) string { return strconv.FormatInt(n, 10) }

func TestPages(t *testing.T) {
	each(t, func(t *testing.T, e env) {
		s := seed(t, e)
		c := e.console(t, console.Config{Database: "test database"})

		// Overview (the first one may show the charts as pending while
		// the send rate is read).
		r := c.overview(t)
		want := map[string]string{"count-failed": "4", "count-pending": "7", "count-stale": "1", "count-backing-off": "1", "count-in-flight": "1",
			"held-back-keys": "3", "held-back-rows": "4"}
		for k, v := range want {
			if got := r.text(k); got != v {
				t.Errorf("overview #%s = %q, want %q", k, got, v)
			}
		}
		if got := r.text("oldest-pending"); got != "1h" && !strings.HasPrefix(got, "59m") {
			t.Errorf("#oldest-pending = %q, want about 1h", got)
		}
		if href := attr(r.id("held-back"), "href"); href != "/blocked" {
			t.Errorf("#held-back links to %q, want /blocked", href)
		}
		groups := r.rowsOf("failed-groups")
		if len(groups) != 2 || attr(groups[0], "data-type") != "ORDER_PAID" || attr(groups[0], "data-topic") != "orders.paid" ||
			!strings.Contains(textOf(groups[0]), "3") || attr(groups[1], "data-type") != "STOCK_RESERVED" {
			t.Errorf("failed groups = %d rows: %v", len(groups), texts(groups))
		}
		if a := r.all(func(n *html.Node) bool {
			return n.Data == "a" && attr(n, "href") == "/failed?topic=orders.paid&type=ORDER_PAID"
		}); len(a) != 1 {
			t.Errorf("no link from the ORDER_PAID group to its FAILED list")
		}
		relays := r.rowsOf("relays")
		if len(relays) != 1 || attr(relays[0], "data-owner") != "relay-1" {
			t.Errorf("relays = %v, want relay-1", texts(relays))
		}
		for _, ch := range []string{"chart-sent", "chart-lag"} {
			svg := r.id(ch)
			if svg == nil || svg.Data != "svg" || attr(svg, "role") != "img" {
				t.Fatalf("#%s is not an accessible svg", ch)
			}
			bars := 0
			for c := svg.FirstChild; c != nil; c = c.NextSibling {
				if c.Data == "rect" && attr(c, "class") == "bar" {
					bars++
				}
			}
			if bars < 1 || bars > 2 {
				t.Errorf("#%s has %d bars, want the 1 or 2 minutes with sent events", ch, bars)
			}
		}
		if !strings.Contains(r.text("chart-sent"), "5 sent") && !strings.Contains(r.text("chart-sent"), "6 sent") {
			t.Errorf("#chart-sent titles do not say how many were sent: %q", r.text("chart-sent"))
		}
		ov := r.id("overview")
		if attr(ov, "data-refresh-url") != "/?fragment=overview" || attr(ov, "data-refresh-ms") != "5000" || attr(ov, "data-refreshed-at") == "" {
			t.Errorf("#overview refresh attributes: %v", ov.Attr)
		}
		if hasAttr(r.all(func(n *html.Node) bool { return n.Data == "body" })[0], "data-readonly") {
			t.Error("body carries data-readonly in read-write mode")
		}
		for _, nav := range []string{"nav-overview", "nav-failed", "nav-blocked", "nav-inbox"} {
			if r.id(nav) == nil {
				t.Errorf("no #%s", nav)
			}
		}
		// The fragment: the overview's content only.
		f := c.page("?fragment=overview")
		if strings.Contains(f.body, "<html") || strings.Contains(f.body, "nav-failed") || f.text("count-failed") != "4" {
			t.Errorf("fragment is not the overview's content:\n%s", f.body)
		}

		// FAILED list, filters.
		r = c.page("failed")
		if got, want := r.dataIDs(), ids(append(s.failed, s.stock)...); !equalStrings(got, want) {
			t.Errorf("/failed rows = %v, want %v", got, want)
		}
		for _, box := range r.all(func(n *html.Node) bool {
			return n.Data == "input" && attr(n, "type") == "checkbox" && attr(n, "name") == "id"
		}) {
			if attr(box, "form") != "requeue-selected-form" {
				t.Errorf("checkbox %s is not in the requeue-selected form", attr(box, "value"))
			}
		}
		if r.id("requeue-selected") == nil || r.id("requeue-matching") == nil || r.id("failed-filter") == nil {
			t.Error("/failed lacks #requeue-selected, #requeue-matching or #failed-filter")
		}
		tr := r.rowsOf("events")[0]
		if !strings.Contains(textOf(tr), refusedErr) || !strings.Contains(textOf(tr), "a1") || !strings.Contains(textOf(tr), "orders.paid") {
			t.Errorf("first FAILED row = %q", textOf(tr))
		}
		for q, want := range map[string][]int64{
			"type=ORDER_PAID":      s.failed,
			"topic=stock.reserved": {s.stock},
			"key=a2":               {s.failed[1]},
			"error=PERMANENT":      {s.stock},
			"since=16m":            {s.stock},
			"since=1d":             append(s.failed, s.stock),
			"type=NOPE":            nil,
		} {
			r := c.page("failed?" + q)
			if got := r.dataIDs(); !equalStrings(got, ids(want...)) {
				t.Errorf("/failed?%s rows = %v, want %v", q, got, ids(want...))
			}
		}
		if r := c.get("failed?since=yesterday"); r.StatusCode != http.StatusBadRequest || !strings.Contains(r.text("main"), "30m, 1h or 2d") {
			t.Errorf("/failed?since=yesterday: %d %q", r.StatusCode, r.text("main"))
		}
		// Paging by last id.
		r = c.page("failed?limit=3")
		if got := r.dataIDs(); !equalStrings(got, ids(s.failed...)) {
			t.Errorf("page 1 = %v", got)
		}
		next := attr(r.id("next-page"), "href")
		if next != "/failed?after="+id(s.failed[2])+"&limit=3" {
			t.Fatalf("#next-page = %q", next)
		}
		r = c.page(next)
		if got := r.dataIDs(); !equalStrings(got, ids(s.stock)) || r.id("next-page") != nil {
			t.Errorf("page 2 = %v (next %v)", got, r.id("next-page") != nil)
		}
		if first := attr(r.id("first-page"), "href"); first != "/failed" {
			t.Errorf("#first-page = %q", first)
		}
		if r := c.get("failed?limit=501"); r.StatusCode != http.StatusBadRequest {
			t.Errorf("limit=501: %d, want 400", r.StatusCode)
		}

		// Event pages.
		r = c.page("events/" + id(s.failed[0]))
		if got := r.text("event-status"); got != "FAILED" {
			t.Errorf("#event-status = %q", got)
		}
		if got := r.text("attempts"); got != "5" {
			t.Errorf("#attempts = %q", got)
		}
		if got := r.text("last-error"); got != refusedErr {
			t.Errorf("#last-error = %q", got)
		}
		if got := textOf(r.id("payload")); got != "{ \"order\": \"o-1\", \"amount\": 12.5 }" || !strings.Contains(r.body, "{\n  &#34;order&#34;") {
			t.Errorf("#payload = %q, want it pretty-printed", got)
		}
		if got := r.text("headers"); !strings.Contains(got, `"traceparent": "00-abc-def-01"`) {
			t.Errorf("#headers = %q", got)
		}
		tl := r.text("timeline")
		if !strings.Contains(tl, "created") || !strings.Contains(tl, "failed for good after 5 attempts") {
			t.Errorf("#timeline = %q", tl)
		}
		if r.id("requeue") == nil || r.id("delete") == nil || r.id("replay") != nil {
			t.Error("a FAILED event offers no requeue and delete (or offers replay)")
		}
		if href := attr(r.id("key-events"), "href"); href != "/search?key=a1" {
			t.Errorf("key link = %q", href)
		}
		r = c.page("events/" + id(s.sent[0]))
		if r.text("event-status") != "SENT" || r.id("replay") == nil || r.id("requeue") != nil || r.id("delete") != nil || !strings.Contains(r.text("timeline"), "sent") {
			t.Errorf("sent event page: status %q, replay %v", r.text("event-status"), r.id("replay") != nil)
		}
		r = c.page("events/" + id(s.backoff))
		if r.text("event-status") != "BACKING OFF" || !strings.Contains(r.text("timeline"), "next attempt at") || r.id("replay") != nil || r.id("requeue") != nil {
			t.Errorf("backing-off event page: %q / %q", r.text("event-status"), r.text("timeline"))
		}
		r = c.page("events/" + id(s.leased))
		if r.text("event-status") != "IN FLIGHT" || !strings.Contains(r.text("timeline"), "claimed by relay-1 until") {
			t.Errorf("leased event page: %q / %q", r.text("event-status"), r.text("timeline"))
		}
		if r := c.get("events/99999999"); r.StatusCode != http.StatusNotFound {
			t.Errorf("missing event: %d, want 404", r.StatusCode)
		}
		if r := c.get("events/nope"); r.StatusCode != http.StatusBadRequest {
			t.Errorf("bad event ref: %d, want 400", r.StatusCode)
		}

		// Blocked keys.
		r = c.page("blocked")
		rows := r.rowsOf("blocked")
		got := map[string]string{}
		for _, tr := range rows {
			got[attr(tr, "data-key")] = attr(tr, "data-head")
		}
		if len(rows) != 3 || got["a1"] != id(s.failed[0]) || got["a2"] != id(s.failed[1]) || got["b1"] != id(s.backoff) {
			t.Errorf("blocked keys = %v", texts(rows))
		}
		for _, tr := range rows {
			txt := textOf(tr)
			switch attr(tr, "data-key") {
			case "a1":
				if !strings.Contains(txt, "FAILED") || !strings.Contains(txt, " 2 ") {
					t.Errorf("a1 row = %q, want FAILED with 2 waiting", txt)
				}
			case "b1":
				if !strings.Contains(txt, "BACKING OFF until") {
					t.Errorf("b1 row = %q, want backing off until", txt)
				}
			}
		}
		r = c.page("blocked?limit=2")
		if n := len(r.rowsOf("blocked")); n != 2 || attr(r.id("next-page"), "href") != "/blocked?after=a2&limit=2" {
			t.Errorf("blocked page 1: %d rows, next %q", n, attr(r.id("next-page"), "href"))
		}
		if r = c.page(attr(r.id("next-page"), "href")); len(r.rowsOf("blocked")) != 1 || attr(r.rowsOf("blocked")[0], "data-key") != "b1" {
			t.Errorf("blocked page 2: %v", texts(r.rowsOf("blocked")))
		}

		// Search.
		for _, q := range []string{id(s.failed[1]), strings.ToUpper(eventID(t, e, s.failed[1]))} {
			r := c.get("search?q=" + url.QueryEscape(q))
			if r.StatusCode != http.StatusSeeOther || r.Header.Get("Location") != "/events/"+id(s.failed[1]) {
				t.Errorf("search %q: %d to %q, want the event page", q, r.StatusCode, r.Header.Get("Location"))
			}
		}
		r = c.page("search?q=a1")
		if got, want := r.dataIDs(), ids(s.failed[0], s.waiting[0], s.waiting[1]); !equalStrings(got, want) {
			t.Errorf("search a1 = %v, want %v", got, want)
		}
		if !strings.Contains(textOf(r.rowsOf("events")[0]), "FAILED") || !strings.Contains(textOf(r.rowsOf("events")[1]), "PENDING") {
			t.Errorf("search rows lack statuses: %v", texts(r.rowsOf("events")))
		}
		if v := r.all(func(n *html.Node) bool { return n.Data == "input" && attr(n, "name") == "q" }); len(v) != 1 || attr(v[0], "value") != "a1" {
			t.Error("the search box does not keep the query")
		}
		if r := c.page("search?q=o0"); !equalStrings(r.dataIDs(), ids(s.sent[0])) || r.id("search-bound") != nil {
			t.Errorf("search o0 = %v, want the sent row %d", r.dataIDs(), s.sent[0])
		}
		r = c.page("search?q=99999999")
		if len(r.dataIDs()) != 0 || !strings.Contains(r.text("main"), "looking for it as a key") {
			t.Errorf("search for a missing id: %q", r.text("main"))
		}
		r = c.page("search?q=a1&limit=1")
		if n := attr(r.id("next-page"), "href"); n != "/search?after="+id(s.failed[0])+"&key=a1&limit=1" {
			t.Errorf("search next page = %q (the page size kept)", n)
		}
	})
}

// TestSearchNumericKey: a key that looks like a row id or an event id is
// searched as a key by its links (?key=), and the search box shows both
// the event and the key's events.
func TestSearchNumericKey(t *testing.T) {
	each(t, func(t *testing.T, e env) {
		first := e.insert(t, row{key: "2", status: 2, attempts: 5, lastError: refusedErr}) // key "2"
		second := e.insert(t, row{key: "order-9", status: 2, attempts: 5, lastError: refusedErr})
		if first != 1 || second != 2 {
			t.Skipf("ids %d and %d: the test needs a fresh table", first, second)
		}
		uuidKey := "0190a8b4-0000-7000-8000-999999999999"
		third := e.insert(t, row{key: uuidKey, status: 2, attempts: 5, lastError: refusedErr})
		c := e.console(t, console.Config{})
		r := c.page("events/1")
		link := attr(r.id("key-events"), "href")
		if link != "/search?key=2" {
			t.Fatalf("key link of event 1 = %q, want /search?key=2", link)
		}
		r = c.get(link)
		if r.StatusCode != http.StatusOK || !equalStrings(r.dataIDs(), ids(first)) || r.id("search-match") != nil {
			t.Errorf("key link: %d, events %v, want the events of key 2 (%d) only", r.StatusCode, r.dataIDs(), first)
		}
		// The search box: row 2 and key "2" both exist: both shown.
		r = c.get("search?q=2")
		if r.StatusCode != http.StatusOK || !equalStrings(r.dataIDs(), ids(first)) || attr(r.id("search-match-link"), "href") != "/events/2" {
			t.Errorf("search 2: %d, events %v, match %q; want key 2's events and a link to event 2", r.StatusCode, r.dataIDs(), attr(r.id("search-match-link"), "href"))
		}
		// A key shaped like an event id, of no event: the key.
		if r := c.get("search?q=" + uuidKey); r.StatusCode != http.StatusOK || !equalStrings(r.dataIDs(), ids(third)) {
			t.Errorf("search %s: %d %v", uuidKey, r.StatusCode, r.dataIDs())
		}
		// An id that is no key: straight to the event.
		if r := c.get("search?q=3"); r.StatusCode != http.StatusSeeOther || r.Header.Get("Location") != "/events/3" {
			t.Errorf("search 3: %d to %q", r.StatusCode, r.Header.Get("Location"))
		}
		// The blocked keys' links are key links too.
		e.insert(t, row{key: "2", status: 0})
		e.exec(t, fmt.Sprintf("UPDATE %s SET lease_owner = '~held' WHERE status = 0", e.outbox()))
		for _, a := range c.page("blocked").all(func(n *html.Node) bool { return n.Data == "a" && strings.Contains(attr(n, "href"), "search") }) {
			if !strings.HasPrefix(attr(a, "href"), "/search?key=") {
				t.Errorf("blocked keys link %q, want /search?key=", attr(a, "href"))
			}
		}
	})
}

func TestInboxPage(t *testing.T) {
	each(t, func(t *testing.T, e env) {
		in := e.drv.Tables().Inbox
		p := e.d.Placeholder
		for i := range 3 {
			e.exec(t, "INSERT INTO "+in+" (consumer, event_id, biz_type, biz_id) VALUES ("+p(1)+", "+p(2)+", 'ORDER_PAID', 'a1')", "points", fmt.Sprintf("ev-%d", i))
		}
		e.exec(t, "INSERT INTO "+in+" (consumer, event_id, biz_type, biz_id) VALUES ('mailer', 'ev-0', 'ORDER_PAID', 'a1')")
		e.exec(t, "INSERT INTO "+in+"_duplicate (consumer, event_id, biz_type, biz_id, count) VALUES ('points', 'ev-1', 'ORDER_PAID', 'a1', 4)")
		c := e.console(t, console.Config{})
		r := c.page("inbox")
		rows := r.rowsOf("consumers")
		if len(rows) != 2 || attr(rows[0], "data-consumer") != "mailer" || attr(rows[1], "data-consumer") != "points" {
			t.Fatalf("consumers = %v", texts(rows))
		}
		if txt := textOf(rows[1]); !strings.HasPrefix(txt, "points 3 ") || !strings.Contains(txt, " 1 ") {
			t.Errorf("points row = %q, want 3 handled, 1 duplicate", txt)
		}
		r = c.page("inbox?consumer=points")
		dups := r.rowsOf("duplicates")
		if len(dups) != 1 || attr(dups[0], "data-event-id") != "ev-1" || !strings.Contains(textOf(dups[0]), "4") {
			t.Errorf("duplicates = %v", texts(dups))
		}
		if r := c.get("inbox?window=30d"); r.StatusCode != http.StatusBadRequest {
			t.Errorf("window 30d: %d, want 400", r.StatusCode)
		}
	})
}

func TestRequeueSelected(t *testing.T) {
	each(t, func(t *testing.T, e env) {
		s := seed(t, e)
		c := e.console(t, console.Config{})
		r := c.page("failed")
		tok := r.csrf(t)
		before := e.snapshot(t)
		form := url.Values{"csrf": {tok}, "scope": {"selected"}, "back": {"failed"}, "id": {id(s.failed[0]), id(s.failed[2])}}
		r = c.post("actions/requeue", form)
		if r.StatusCode != http.StatusOK || r.text("confirm-text") != "Requeue 2 FAILED events of 2 keys?" {
			t.Fatalf("confirmation: %d %q", r.StatusCode, r.text("confirm-text"))
		}
		if e.snapshot(t) != before {
			t.Fatal("the confirmation page changed rows")
		}
		if r.id("confirm-ok") == nil || attr(r.id("confirm-cancel"), "href") != "/failed" {
			t.Fatal("no #confirm-ok or #confirm-cancel")
		}
		r = c.post("actions/requeue", confirmForm(t, r))
		if r.StatusCode != http.StatusSeeOther || r.Header.Get("Location") != "/failed" {
			t.Fatalf("confirmed: %d to %q", r.StatusCode, r.Header.Get("Location"))
		}
		r = c.page("failed")
		wantFlash := fmt.Sprintf("Requeued 2 FAILED events (ids %d–%d, 2 keys) in one transaction.", s.failed[0], s.failed[2])
		if got := r.flash(); got != wantFlash {
			t.Errorf("flash = %q, want %q", got, wantFlash)
		}
		if got := c.page("failed").flash(); got != "" {
			t.Errorf("the flash shows twice: %q", got)
		}
		for _, n := range []int64{s.failed[0], s.failed[2]} {
			ev, err := e.drv.GetEvent(context.Background(), n)
			if err != nil || ev.Status != driver.Pending || ev.RetryCount != 0 {
				t.Errorf("row %d after requeue: %+v %v", n, ev, err)
			}
		}
		if n := e.count(t, "status = 2"); n != 2 {
			t.Errorf("%d FAILED rows left, want 2", n)
		}
		// The rows held behind a1 flow again (not held), as the driver's Requeue releases them.
		if n := e.count(t, "lease_owner = '~held'"); n != 0 {
			t.Errorf("%d rows still held", n)
		}

		// A row that changed meanwhile: refused, nothing changed.
		tok = c.page("failed").csrf(t)
		form = url.Values{"csrf": {tok}, "scope": {"selected"}, "id": {id(s.failed[1]), id(s.failed[0])}}
		r = c.post("actions/requeue", form)
		if r.StatusCode != http.StatusConflict || r.id("confirm-ok") != nil || !strings.Contains(r.text("refused"), "pending, not failed") {
			t.Errorf("confirmation naming a pending row: %d, ok %v, %q", r.StatusCode, r.id("confirm-ok") != nil, r.text("refused"))
		}
		before = e.snapshot(t)
		// As if confirmed while both were FAILED.
		form.Set("confirm", "yes")
		form.Set("expect", "2")
		form.Set("digest", admin.Digest([]int64{s.failed[0], s.failed[1]}))
		r = c.post("actions/requeue", form)
		if r.StatusCode != http.StatusSeeOther {
			t.Fatalf("forced confirmation: %d", r.StatusCode)
		}
		if got := c.page("failed").flash(); !strings.Contains(got, "Requeue refused: nothing was changed.") || !strings.Contains(got, id(s.failed[0])+": row "+id(s.failed[0])+" is pending") {
			t.Errorf("refused flash = %q", got)
		}
		if e.snapshot(t) != before {
			t.Error("a refused requeue changed rows")
		}
	})
}

func TestRequeueMatching(t *testing.T) {
	each(t, func(t *testing.T, e env) {
		s := seed(t, e)
		c := e.console(t, console.Config{})
		tok := c.page("failed?type=ORDER_PAID").csrf(t)
		r := c.post("actions/requeue", url.Values{"csrf": {tok}, "scope": {"matching"}, "back": {"failed"}, "type": {"ORDER_PAID"}})
		if r.text("confirm-text") != "Requeue 3 FAILED events of 3 keys?" {
			t.Fatalf("confirmation: %d %q", r.StatusCode, r.text("confirm-text"))
		}
		if attr(r.id("confirm-cancel"), "href") != "/failed?type=ORDER_PAID" {
			t.Errorf("cancel = %q", attr(r.id("confirm-cancel"), "href"))
		}
		// An event that fails after the confirmation is not requeued with
		// the ones counted.
		late := e.insert(t, row{key: "a9", status: 2, attempts: 5, lastError: refusedErr})
		r = c.post("actions/requeue", confirmForm(t, r))
		if r.StatusCode != http.StatusSeeOther || r.Header.Get("Location") != "/failed?type=ORDER_PAID" {
			t.Fatalf("confirmed: %d to %q", r.StatusCode, r.Header.Get("Location"))
		}
		r = c.page(r.Header.Get("Location"))
		want := fmt.Sprintf("Requeued 3 FAILED events (ids %d–%d, 3 keys) in one transaction.", s.failed[0], s.failed[2])
		if r.flash() != want {
			t.Errorf("flash = %q, want %q", r.flash(), want)
		}
		if got := r.dataIDs(); !equalStrings(got, ids(late)) {
			t.Errorf("FAILED ORDER_PAID left = %v, want the late one %d", got, late)
		}
		// All FAILED, no filter.
		tok = r.csrf(t)
		r = c.post("actions/requeue", url.Values{"csrf": {tok}, "scope": {"matching"}})
		if r.text("confirm-text") != "Requeue 2 FAILED events of 2 keys?" {
			t.Fatalf("confirmation of all: %q", r.text("confirm-text"))
		}
		if r := c.post("actions/requeue", confirmForm(t, r)); r.StatusCode != http.StatusSeeOther {
			t.Fatalf("confirmed: %d", r.StatusCode)
		}
		if got := c.page("failed").flash(); got != fmt.Sprintf("Requeued 2 FAILED events (ids %d–%d, 2 keys) in one transaction.", s.stock, late) {
			t.Errorf("flash = %q", got)
		}
		if n := e.count(t, "status = 2"); n != 0 {
			t.Errorf("%d FAILED rows left", n)
		}
		// Nothing left: the confirmation offers no OK, and its form (sent
		// anyway) acts on nothing, also on events that fail meanwhile.
		tok = c.page("failed").csrf(t)
		r = c.post("actions/requeue", url.Values{"csrf": {tok}, "scope": {"matching"}})
		if r.text("confirm-text") != "No FAILED event matches: there is nothing to requeue." || r.id("confirm-ok") != nil {
			t.Errorf("empty confirmation: %q, OK button %v", r.text("confirm-text"), r.id("confirm-ok") != nil)
		}
		later := e.insert(t, row{key: "a10", status: 2, attempts: 5, lastError: refusedErr})
		f := hiddenFields(r)
		f.Set("confirm", "yes")
		if r := c.post("actions/requeue", f); r.StatusCode != http.StatusOK || r.text("confirm-text") != "Requeue 1 FAILED event of 1 key?" {
			t.Errorf("the empty confirmation's form: %d %q, want the confirmation of the new event", r.StatusCode, r.text("confirm-text"))
		}
		if n := e.count(t, fmt.Sprintf("status = 2 AND id = %d", later)); n != 1 {
			t.Errorf("an event that failed after an empty confirmation was requeued")
		}
	})
}

// TestActionSelectionChanged: an action changes exactly the events its
// confirmation counted, or nothing.
func TestActionSelectionChanged(t *testing.T) {
	each(t, func(t *testing.T, e env) {
		a := e.insert(t, row{key: "a", status: 2, attempts: 5, lastError: refusedErr})
		mid := e.insert(t, row{key: "b", status: 0, attempts: 2})
		b := e.insert(t, row{key: "c", status: 2, attempts: 5, lastError: refusedErr})
		c := e.console(t, console.Config{})
		tok := c.page("failed").csrf(t)
		r := c.post("actions/requeue", url.Values{"csrf": {tok}, "scope": {"matching"}, "back": {"failed"}})
		if r.text("confirm-text") != "Requeue 2 FAILED events of 2 keys?" {
			t.Fatalf("confirmation: %q", r.text("confirm-text"))
		}
		f := confirmForm(t, r)
		if len(f.Get("digest")) != 64 || f.Get("expect") != "2" {
			t.Fatalf("the confirmation's form carries no count and digest: %v", f)
		}
		// The relay gives up on the row between the two: inside the id
		// range counted, but not counted.
		e.exec(t, fmt.Sprintf("UPDATE %s SET status = 2 WHERE id = %d", e.outbox(), mid))
		before := e.snapshot(t)
		r = c.post("actions/requeue", f)
		if r.StatusCode != http.StatusConflict || !strings.Contains(r.text("confirm-error"), "The selection changed since you confirmed (2 then, 3 now): confirm again; nothing was changed") {
			t.Fatalf("stale confirmation: %d %q", r.StatusCode, r.text("confirm-error"))
		}
		if r.text("confirm-text") != "Requeue 3 FAILED events of 3 keys?" || r.id("confirm-ok") == nil {
			t.Errorf("the new confirmation: %q", r.text("confirm-text"))
		}
		if got := e.snapshot(t); got != before {
			t.Errorf("a stale confirmation changed rows:\n%s\nwant\n%s", got, before)
		}
		// Same count, other events: refused too.
		r2 := c.post("actions/requeue", confirmForm(t, r))
		if r2.StatusCode != http.StatusSeeOther {
			t.Fatalf("the new confirmation: %d", r2.StatusCode)
		}
		if n := e.count(t, fmt.Sprintf("status = 2 AND id IN (%d, %d, %d)", a, mid, b)); n != 0 {
			t.Errorf("%d rows left FAILED after the new confirmation", n)
		}
		x := e.insert(t, row{key: "d", status: 2, attempts: 5, lastError: refusedErr})
		tok = c.page("events/" + id(x)).csrf(t)
		// Delete: the event named is requeued meanwhile: nothing deleted.
		r = c.post("actions/delete", url.Values{"csrf": {tok}, "scope": {"selected"}, "id": {id(x)}, "back": {"event"}})
		f = confirmForm(t, r)
		ev, err := e.a.Get(t.Context(), id(x))
		if err != nil {
			t.Fatal(err)
		}
		f.Set("confirm_event_id", ev.EventID)
		e.exec(t, fmt.Sprintf("UPDATE %s SET status = 0 WHERE id = %d", e.outbox(), x))
		r = c.post("actions/delete", f)
		if e.count(t, fmt.Sprintf("id = %d", x)) != 1 {
			t.Errorf("delete of an event requeued since the confirmation: %d, row deleted", r.StatusCode)
		}
	})
}

func TestReplayAndDelete(t *testing.T) {
	each(t, func(t *testing.T, e env) {
		s := seed(t, e)
		c := e.console(t, console.Config{})

		// Replay a sent event (sent 5 minutes ago).
		tok := c.page("events/" + id(s.sent[0])).csrf(t)
		r := c.post("actions/replay", url.Values{"csrf": {tok}, "scope": {"selected"}, "back": {"event"}, "id": {id(s.sent[0])}})
		if r.text("confirm-text") != "Replay 1 SENT event of 1 key?" || r.id("confirm-warn") != nil {
			t.Fatalf("replay confirmation: %q (warning %v)", r.text("confirm-text"), r.id("confirm-warn") != nil)
		}
		r = c.post("actions/replay", confirmForm(t, r))
		if r.Header.Get("Location") != "/events/"+id(s.sent[0]) {
			t.Fatalf("replay redirects to %q", r.Header.Get("Location"))
		}
		r = c.page(r.Header.Get("Location"))
		if want := fmt.Sprintf("Replayed 1 SENT event (id %d, 1 key) in one transaction.", s.sent[0]); r.flash() != want {
			t.Errorf("flash = %q, want %q", r.flash(), want)
		}
		if r.text("event-status") != "PENDING" {
			t.Errorf("replayed event is %q", r.text("event-status"))
		}
		// Replay of one sent 30 s ago: the confirmation warns.
		r = c.page("events/" + id(s.recentSent))
		if r.id("replay-recent") == nil {
			t.Error("the event page does not say it was sent recently")
		}
		r = c.post("actions/replay", url.Values{"csrf": {r.csrf(t)}, "scope": {"selected"}, "back": {"event"}, "id": {id(s.recentSent)}})
		if !strings.Contains(r.text("confirm-warn"), "1 event was sent less than 2m ago") {
			t.Errorf("replay warning = %q", r.text("confirm-warn"))
		}
		// Replay of a FAILED event: refused.
		r = c.post("actions/replay", url.Values{"csrf": {tok}, "scope": {"selected"}, "id": {id(s.stock)}})
		if r.StatusCode != http.StatusConflict || !strings.Contains(r.text("refused"), "requeue it instead") {
			t.Errorf("replay of a FAILED event: %d %q", r.StatusCode, r.text("refused"))
		}

		// Delete: typed confirmation.
		r = c.page("events/" + id(s.stock))
		r = c.post("actions/delete", url.Values{"csrf": {r.csrf(t)}, "scope": {"selected"}, "back": {"event"}, "id": {id(s.stock)}})
		if r.text("confirm-text") != "Delete 1 FAILED event for good?" || r.id("confirm-input") == nil {
			t.Fatalf("delete confirmation: %q", r.text("confirm-text"))
		}
		eid := eventID(t, e, s.stock)
		if !strings.Contains(r.text("confirm"), eid) {
			t.Error("the delete confirmation does not show the event id to type")
		}
		before := e.snapshot(t)
		f := confirmForm(t, r)
		f.Set("confirm_event_id", "not-it")
		r2 := c.post("actions/delete", f)
		if r2.StatusCode != http.StatusBadRequest || !strings.Contains(r2.text("confirm-error"), "nothing was deleted") {
			t.Errorf("wrong typed id: %d %q", r2.StatusCode, r2.text("confirm-error"))
		}
		if e.snapshot(t) != before {
			t.Fatal("a wrong typed id deleted rows")
		}
		f.Set("confirm_event_id", strings.ToUpper(eid))
		r = c.post("actions/delete", f)
		if r.StatusCode != http.StatusSeeOther || r.Header.Get("Location") != "/failed" {
			t.Fatalf("delete: %d to %q", r.StatusCode, r.Header.Get("Location"))
		}
		if want := fmt.Sprintf("Deleted 1 FAILED event (id %d, 1 key) in one transaction.", s.stock); c.page("failed").flash() != want {
			t.Errorf("delete flash wrong, want %q", want)
		}
		if n := e.count(t, "id = "+id(s.stock)); n != 0 {
			t.Error("the row is still there")
		}
		if n := e.count(t, "1 = 1"); int(n) != len(strings.Fields(before))-1 {
			t.Errorf("%d rows left, want %d", n, len(strings.Fields(before))-1)
		}
		// Delete of a sent event: refused at the confirmation.
		r = c.post("actions/delete", url.Values{"csrf": {tok}, "scope": {"selected"}, "id": {id(s.sent[1])}})
		if r.StatusCode != http.StatusConflict || r.id("confirm-ok") != nil {
			t.Errorf("delete of a sent event: %d", r.StatusCode)
		}
	})
}

// confirmForm returns the confirmation page's form as the OK button
// posts it.
func confirmForm(t testing.TB, r *resp) url.Values {
	t.Helper()
	if r.id("confirm-ok") == nil {
		t.Fatalf("no #confirm-ok:\n%s", r.text("main"))
	}
	return hiddenFields(r)
}

// hiddenFields returns the page's hidden form fields.
func hiddenFields(r *resp) url.Values {
	f := url.Values{}
	for _, in := range r.all(func(n *html.Node) bool { return n.Data == "input" && attr(n, "type") == "hidden" }) {
		f.Add(attr(in, "name"), attr(in, "value"))
	}
	return f
}

func eventID(t testing.TB, e env, n int64) string {
	t.Helper()
	ev, err := e.drv.GetEvent(context.Background(), n)
	if err != nil {
		t.Fatal(err)
	}
	return ev.EventID
}

func ids(ns ...int64) []string {
	out := []string{}
	for _, n := range ns {
		out = append(out, id(n))
	}
	return out
}

func equalStrings(a, b []string) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

func texts(ns []*html.Node) []string {
	var out []string
	for _, n := range ns {
		out = append(out, textOf(n))
	}
	return out
}

// TestSearchKeyBounded: on SQLite (and PostgreSQL) the sent rows of a key
// are searched among the newest rows only; pending and FAILED ones always.
func TestSearchKeyBounded(t *testing.T) {
	each(t, func(t *testing.T, e env) {
		if e.d != "sqlite" {
			t.Skip("SQLite shows it; PostgreSQL runs the same code")
		}
		oldSent := e.insert(t, row{key: "K", status: 1, sentAgo: time.Hour, createdAgo: time.Hour})
		oldFailed := e.insert(t, row{key: "K", status: 2})
		e.exec(t, `WITH RECURSIVE g(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM g WHERE x < 100005)
INSERT INTO outbox_event (event_id, biz_type, biz_id, topic, payload, status, sent_at) SELECT lower(hex(randomblob(16))), 'T', 'f' || x, 't', '{}', 1, '2026-01-01 00:00:00' FROM g`)
		newSent := e.insert(t, row{key: "K", status: 1, sentAgo: time.Minute})
		c := e.console(t, console.Config{})
		r := c.page("search?q=K")
		if got, want := r.dataIDs(), ids(oldFailed, newSent); !equalStrings(got, want) {
			t.Errorf("search K = %v, want %v (not the old sent row %d)", got, want, oldSent)
		}
		if !strings.Contains(r.text("search-bound"), "newest rows only") {
			t.Errorf("no note on the bound: %q", r.text("search-bound"))
		}
		// MySQL searches every row (its index holds sent rows too); a
		// small SQLite table is searched whole.
		r = e.console(t, console.Config{}).page("search?q=f1")
		if r.id("search-bound") == nil || len(r.dataIDs()) != 0 {
			t.Errorf("search f1 (an old sent row outside the bound): %v", r.dataIDs())
		}
	})
}

// TestConfirmedCountChanged: when the events matched at the confirmation
// changed before it was confirmed, the action changes nothing and asks
// again.
func TestConfirmedCountChanged(t *testing.T) {
	each(t, func(t *testing.T, e env) {
		s := seed(t, e)
		c := e.console(t, console.Config{})
		tok := c.page("failed").csrf(t)
		r := c.post("actions/requeue", url.Values{"csrf": {tok}, "scope": {"matching"}, "type": {"ORDER_PAID"}})
		if r.text("confirm-text") != "Requeue 3 FAILED events of 3 keys?" {
			t.Fatalf("confirmation: %q", r.text("confirm-text"))
		}
		// Another operator requeues one meanwhile.
		if _, err := e.drv.Requeue(context.Background(), []int64{s.failed[1]}); err != nil {
			t.Fatal(err)
		}
		before := e.snapshot(t)
		r = c.post("actions/requeue", confirmForm(t, r))
		if r.StatusCode != http.StatusConflict || !strings.Contains(r.text("confirm-error"), "(3 then, 2 now): confirm again") || r.text("confirm-text") != "Requeue 2 FAILED events of 2 keys?" {
			t.Errorf("stale confirmation: %d %q %q", r.StatusCode, r.text("confirm-error"), r.text("confirm-text"))
		}
		if e.snapshot(t) != before {
			t.Error("a stale confirmation changed rows")
		}
	})
}

// overview gets the overview once its charts are read.
func (c *client) overview(t testing.TB) *resp {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		r := c.page("")
		if r.id("charts-pending") == nil || time.Now().After(deadline) {
			return r
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestReplaySelected: a key's sent events are replayed from the search
// page; its other events get no checkbox.
func TestReplaySelected(t *testing.T) {
	each(t, func(t *testing.T, e env) {
		sent1 := e.insert(t, row{key: "K", status: 1, createdAgo: time.Hour, sentAgo: time.Hour})
		failed := e.insert(t, row{key: "K", status: 2})
		sent2 := e.insert(t, row{key: "K", status: 1, createdAgo: time.Hour, sentAgo: time.Hour})
		c := e.console(t, console.Config{})
		r := c.page("search?q=K")
		var boxes []string
		for _, b := range r.all(func(n *html.Node) bool { return n.Data == "input" && attr(n, "name") == "id" }) {
			boxes = append(boxes, attr(b, "value"))
			if attr(b, "form") != "replay-selected-form" {
				t.Errorf("checkbox %s not in the replay form", attr(b, "value"))
			}
		}
		if !equalStrings(boxes, ids(sent1, sent2)) || r.id("replay-selected") == nil {
			t.Fatalf("checkboxes %v, want the sent rows %d and %d (failed %d has none)", boxes, sent1, sent2, failed)
		}
		r = c.post("actions/replay", url.Values{"csrf": {r.csrf(t)}, "scope": {"selected"}, "back": {"search"}, "q": {"K"}, "id": ids(sent1, sent2)})
		if r.text("confirm-text") != "Replay 2 SENT events of 1 key?" || attr(r.id("confirm-cancel"), "href") != "/search?key=K" {
			t.Fatalf("confirmation: %q, cancel %q", r.text("confirm-text"), attr(r.id("confirm-cancel"), "href"))
		}
		r = c.post("actions/replay", confirmForm(t, r))
		if r.Header.Get("Location") != "/search?key=K" {
			t.Fatalf("redirect to %q", r.Header.Get("Location"))
		}
		r = c.page("search?q=K")
		if want := fmt.Sprintf("Replayed 2 SENT events (ids %d–%d, 1 key) in one transaction.", sent1, sent2); r.flash() != want {
			t.Errorf("flash = %q, want %q", r.flash(), want)
		}
		if n := e.count(t, "status = 0"); n != 2 {
			t.Errorf("%d pending rows, want the 2 replayed", n)
		}
		if r.id("replay-selected") != nil {
			t.Error("replay offered with no sent event left")
		}
	})
}
