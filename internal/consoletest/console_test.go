package consoletest

import (
	"context"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/outboxgen/outboxgen/internal/testdb"
	"github.com/outboxgen/outboxgen/runtime/console"
)

// TestConsole drives the console in Chromium: on SQLite every scenario
// (and the screenshots), on PostgreSQL and MariaDB the main flow.
func TestConsole(t *testing.T) {
	for _, d := range testdb.Dialects() {
		t.Run(d, func(t *testing.T) {
			bctx := startBrowser(t)
			e := newEnv(t, d)
			b := newTab(t, bctx, e.url)
			if d == "sqlite" {
				pagesBeforeFix(t, e, b)
				security(t, e, bctx, b)
				layout(t, e, bctx)
			}
			mainFlow(t, e, b)
			if d == "sqlite" {
				deleteFlow(t, e, b)
			}
			if n := b.dialogs.Load(); n != 0 {
				t.Errorf("%d JavaScript dialogs opened: the console opens none (markup in events must stay text)", n)
			}
		})
	}
}

// mainFlow is the story: the overview shows the FAILED group, the
// FAILED list filters it, the event page explains it; the stream is
// created (the cause is fixed), the event is requeued through the
// confirmation page, the relay publishes it and its key's held-back
// events; then every FAILED event matching the filter is requeued.
func mainFlow(t *testing.T, e *env, b *tab) {
	b.open("")
	if eval[bool](b, readOnlyJS) || b.count("#readonly-badge") != 0 {
		t.Error("the read-write console is marked read-only")
	}
	b.wantText("#count-failed", strconv.Itoa(wantFailed))
	b.wantText("#count-pending", strconv.Itoa(wantHeld))
	b.wantText("#held-back-keys", strconv.Itoa(skus+customers))
	group := fmt.Sprintf(`table#failed-groups tr[data-type=%q][data-topic=%q]`, stockType, stockTopic)
	b.wantCount(group, 1)
	b.wantText(group+" td.n", strconv.Itoa(skus))
	b.wantCount(fmt.Sprintf(`table#failed-groups tr[data-type=%q][data-topic=%q]`, pointType, pointTopic), 1)
	b.wantCount("svg#chart-sent", 1)
	b.wantCount("svg#chart-lag", 1)
	// The send rate is read in the background; the live refresh brings
	// the charts in.
	e.eventually("the overview's charts", 20*time.Second, func() bool { return b.count("#charts-pending") == 0 })
	if b.count("svg#chart-sent rect:not(.bg)") == 0 {
		t.Error("the sent-per-minute chart has no bar, though events were sent in the window")
	}
	if e.dialect == "sqlite" {
		b.shot("overview")
	}

	// The FAILED list, then filtered by type.
	b.clickNav("#nav-failed")
	b.wantCount("table#events tr[data-id]", wantFailed)
	b.do(chromedp.SetValue(chromedp.CSS(`#failed-filter input[name=type]`), stockType))
	b.submitNav("#failed-filter")
	b.wantCount("table#events tr[data-id]", skus)
	for _, typ := range eval[[]string](b, `(() => {
		const i = [...document.querySelectorAll("table#events thead th")].map(th => th.textContent.trim()).indexOf("Type");
		return [...document.querySelectorAll("table#events tr[data-id]")].map(r => i < 0 ? "no Type column" : r.cells[i].textContent.trim());
	})()`) {
		if typ != stockType {
			t.Errorf("filtered FAILED list shows a %s row; want only %s", typ, stockType)
		}
	}
	if e.dialect == "sqlite" {
		b.shot("failed")
	}
	failed := e.rows("status = 2 AND biz_type = ?", stockType)
	if len(failed) != skus {
		t.Fatalf("%d FAILED %s rows, want %d", len(failed), stockType, skus)
	}
	head := failed[0]

	// The event page of the first FAILED row.
	b.clickNav(fmt.Sprintf(`table#events tr[data-id="%d"] a`, head.id))
	b.wantText("#event-status", "FAILED")
	b.wantText("#event-id", head.eventID)
	b.wantText("#attempts", "2")
	if b.text("#last-error") == "" || b.text("#last-error") == "none" {
		t.Error("the FAILED event's page shows no last error")
	}
	if b.count("ol#timeline li") < 2 {
		t.Errorf("timeline has %d entries, want at least created and failed", b.count("ol#timeline li"))
	}
	if b.wantText("pre#payload", `"sku_id"`) == "" {
		t.Error("the payload is empty")
	}
	if e.dialect == "sqlite" {
		b.shot("event")
	}

	// The cause is fixed: the stream exists now, and a subscriber reads it.
	if err := e.pub.EnsureStream(stockTopic); err != nil {
		t.Fatal(err)
	}
	sub := e.subscribe(stockTopic)

	// Requeue through the confirmation page.
	b.clickNav("#requeue")
	b.wantCount("#confirm", 1)
	b.wantText("#confirm-text", "1 ")
	if e.dialect == "sqlite" {
		b.shot("confirm")
	}
	b.clickNav("#confirm-ok")
	b.wantText("#flash", "1", "held behind them released") // the key's held-back events, in the same transaction
	keyRows := e.rows("biz_id = ? AND biz_type = ?", head.key, stockType)
	e.eventually("the relay to publish the requeued event and its key's held-back events", 30*time.Second, func() bool {
		return e.countWhere("biz_id = ? AND biz_type = ? AND status = 1", head.key, stockType) == stockPerSKU
	})
	e.eventually("the subscriber to receive them", 30*time.Second, func() bool { return len(sub.got()) == stockPerSKU })
	var want []string
	for _, r := range keyRows {
		want = append(want, r.eventID)
	}
	if got := sub.got(); !slices.Equal(got, want) {
		t.Errorf("key %s: received %v, want the key's events in order %v", head.key, got, want)
	}
	b.open("")
	b.wantText("#count-failed", strconv.Itoa(wantFailed-1))
	b.wantText("#held-back-keys", strconv.Itoa(skus+customers-1))

	// Requeue every FAILED event matching the filter.
	b.open("failed?type=" + url.QueryEscape(stockType))
	b.wantCount("table#events tr[data-id]", skus-1)
	b.clickNav("#requeue-matching")
	b.wantText("#confirm-text", strconv.Itoa(skus-1)+" ")
	b.clickNav("#confirm-ok")
	b.wantText("#flash", strconv.Itoa(skus-1))
	e.eventually("the relay to publish every STOCK_RESERVED event", 30*time.Second, func() bool {
		return e.countWhere("biz_type = ? AND status = 1", stockType) == skus*stockPerSKU
	})
	e.eventually("the subscriber to receive them", 30*time.Second, func() bool { return len(sub.got()) == skus*stockPerSKU })
	b.open("")
	b.wantText("#count-failed", strconv.Itoa(customers))
	b.wantCount(group, 0)
	// Nothing matches any more: the confirmation offers no OK.
	b.open("failed?type=" + url.QueryEscape(stockType))
	b.clickNav("#requeue-matching")
	b.wantText("#confirm-text", "No FAILED event matches")
	b.wantCount("#confirm-ok", 0)
}

// readOnlyJS is true when the body carries data-readonly (the contract:
// present in read-only mode; "false" counts as absent).
const readOnlyJS = `document.body.hasAttribute("data-readonly") && document.body.getAttribute("data-readonly") !== "false"`

// pagesBeforeFix visits the pages that show the incident (blocked keys,
// search, inbox after a replay) before anything is requeued.
func pagesBeforeFix(t *testing.T, e *env, b *tab) {
	t.Run("blocked", func(t *testing.T) {
		b.t = t
		b.open("")
		b.clickNav("#nav-blocked")
		b.wantCount("table#blocked tr[data-key]", skus+customers)
		b.wantText(`table#blocked tr[data-key="101"] td.waiting`, strconv.Itoa(stockPerSKU-1))
		b.wantText(`table#blocked tr[data-key="c-1"] td.waiting`, "2") // orders 4 and xss behind order 1's points
		b.shot("blocked")
	})
	t.Run("search", func(t *testing.T) {
		b.t = t
		r := e.rows("biz_type = ? AND biz_id = ?", paidType, "o-2")[0]
		b.open("")
		b.do(chromedp.SetValue(chromedp.CSS(`form#search input[name=q]`), r.eventID))
		b.submitNav("form#search")
		if b.count("#event-status") == 1 {
			b.wantText("#event-id", r.eventID)
		} else {
			b.wantCount(fmt.Sprintf(`table#events tr[data-id="%d"]`, r.id), 1)
		}
		b.open("")
		b.do(chromedp.SetValue(chromedp.CSS(`form#search input[name=q]`), "102"))
		b.submitNav("form#search")
		b.wantCount("table#events tr[data-id]", stockPerSKU)
		// Key 102 is also a row id: the page links that event too, and
		// lists the key's events (it does not open event 102 instead).
		if e.countWhere("id = 102") == 1 {
			b.wantCount("#search-match-link", 1)
			if href := b.attr("#search-match-link", "href"); !strings.HasSuffix(href, "/events/102") {
				t.Errorf("the event matching the search links to %q", href)
			}
		}
		// The key link of an event of key 101 lists key 101's events,
		// never the event whose row id is 101.
		k := e.rows("biz_id = ?", "101")[0]
		b.open(fmt.Sprintf("events/%d", k.id))
		b.clickNav("#key-events")
		if loc := b.location(); !strings.HasSuffix(loc, "/search?key=101") {
			t.Errorf("the key link led to %s, want /search?key=101", loc)
		}
		b.wantCount("table#events tr[data-id]", stockPerSKU)
		b.wantCount("#search-match", 0)
	})
	t.Run("replay-and-inbox", func(t *testing.T) {
		b.t = t
		r := e.rows("biz_type = ? AND biz_id = ?", paidType, "o-1")[0]
		b.open(fmt.Sprintf("events/%d", r.id))
		b.wantText("#event-status", "SENT")
		time.Sleep(300 * time.Millisecond) // past the stream's duplicate window (200ms)
		b.clickNav("#replay")
		b.wantText("#confirm-text", "1 ")
		b.clickNav("#confirm-ok")
		b.wantText("#flash", "1")
		e.eventually("the relay to publish the replayed event", 30*time.Second, func() bool {
			return e.countWhere("id = ? AND status = 1", r.id) == 1
		})
		e.eventually("the consumer's inbox to record the duplicate", 30*time.Second, func() bool {
			d, err := e.admin.RecentDuplicates(t.Context(), "points", 10)
			return err == nil && len(d) > 0
		})
		b.clickNav("#nav-inbox")
		b.wantCount(`table#consumers tr[data-consumer="points"]`, 1)
		b.shot("inbox")
		b.clickNav(`table#consumers tr[data-consumer="points"] a`)
		b.wantCount(fmt.Sprintf(`table#duplicates tr[data-event-id=%q]`, r.eventID), 1)
	})
	b.t = t
}

// security: markup in payloads and headers stays text; a POST without the
// form token is refused and changes nothing; the read-only console offers
// no action and refuses POSTs.
func security(t *testing.T, e *env, bctx context.Context, b *tab) {
	t.Run("xss", func(t *testing.T) {
		b.t = t
		// Written by the generated writer: JSON-escaped markup.
		r := e.rows("biz_type = ? AND biz_id = ?", paidType, xssOrder)[0]
		b.open(fmt.Sprintf("events/%d", r.id))
		b.wantText("pre#payload", `alert(`, xssOrder)
		b.wantText("pre#headers", `onerror=alert(`)
		b.wantCount("pre#payload *, pre#headers *", 0)
		// Written with plain SQL: raw markup in the payload and a header.
		r = e.rows("biz_id = ?", rawOrder)[0]
		b.open(fmt.Sprintf("events/%d", r.id))
		b.wantText("pre#payload", `<script>alert('raw')</script>`)
		b.wantText("pre#headers", `<img src=x onerror=alert('raw-header')>`)
		b.wantCount("pre#payload *, pre#headers *", 0)
		b.wantCount("script:not([src])", 0)
		// A second line of defence: the page forbids inline scripts.
		resp, err := http.Get(fmt.Sprintf("%sevents/%d", e.url, r.id))
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if csp := resp.Header.Get("Content-Security-Policy"); !strings.Contains(csp, "script-src 'self'") || strings.Contains(csp, "unsafe-inline") {
			t.Errorf("Content-Security-Policy %q does not forbid inline scripts", csp)
		}
		// Give an injected script or image handler time to run.
		time.Sleep(500 * time.Millisecond)
		if n := b.dialogs.Load(); n != 0 {
			t.Errorf("%d dialogs opened on the event pages holding markup", n)
		}
	})
	t.Run("csrf", func(t *testing.T) {
		b.t = t
		b.open("failed")
		before := e.count(2)
		post := func(withToken bool) int {
			keep := "true"
			if !withToken {
				keep = "false"
			}
			return eval[int](b, `(async () => {
				const f = document.querySelector("#requeue-matching-form");
				const fd = new URLSearchParams(new FormData(f));
				if (!`+keep+`) fd.delete("csrf");
				const r = await fetch(f.action, {method: "POST", body: fd, credentials: "same-origin"});
				return r.status;
			})()`)
		}
		if got := post(false); got != http.StatusForbidden {
			t.Errorf("POST without the form token: %d, want 403", got)
		}
		// The same request with the token is accepted (it shows the
		// confirmation page, changing nothing yet).
		if got := post(true); got != http.StatusOK {
			t.Errorf("POST with the form token: %d, want 200 (the confirmation page)", got)
		}
		if after := e.count(2); after != before {
			t.Errorf("FAILED rows went from %d to %d", before, after)
		}
	})
	t.Run("token-login", func(t *testing.T) {
		const token = "console-token-of-the-test-0123456789"
		u := e.serveConfig(console.Config{Token: token})
		lt := newTab(t, bctx, u)
		lt.open("failed")
		lt.wantCount("form#login", 1)
		lt.wantCount("table#events", 0)
		lt.do(chromedp.SendKeys(chromedp.CSS(`form#login input[name=token]`), "wrong-token-wrong-token"))
		lt.submitNav("form#login")
		lt.wantCount("form#login", 1)
		lt.do(chromedp.SendKeys(chromedp.CSS(`form#login input[name=token]`), token))
		lt.submitNav("form#login")
		lt.wantCount("table#events tr[data-id]", wantFailed)
		if loc := lt.location(); !strings.HasSuffix(loc, "/failed") {
			t.Errorf("after login the tab is at %s, want the page asked for (/failed)", loc)
		}
		// The session cookie is HttpOnly: the page's script cannot read it.
		if c := eval[string](lt, "document.cookie"); strings.Contains(c, token) || c != "" {
			t.Errorf("document.cookie shows %q: the console's cookies must be HttpOnly", c)
		}
		if html := eval[string](lt, "document.documentElement.outerHTML"); strings.Contains(html, token) {
			t.Error("the page holds the token")
		}
		// ?token= once, in a browser context of its own (no cookie
		// yet): the console answers with a redirect to the URL without
		// it.
		lt2 := newTab(t, bctx, u, chromedp.WithNewBrowserContext())
		lt2.open("blocked?token=" + token)
		lt2.wantCount("table#blocked tr[data-key]", skus+customers)
		if loc := lt2.location(); strings.Contains(loc, token) {
			t.Errorf("the URL still holds the token after login: %s", loc)
		}
		// Again with the cookie already valid: still taken out.
		lt2.open("inbox?token=" + token)
		lt2.wantCount("#nav-inbox[aria-current=page]", 1)
		if loc := lt2.location(); strings.Contains(loc, "token") {
			t.Errorf("the URL holds the token although the cookie was valid: %s", loc)
		}
	})
	t.Run("dns-rebinding", func(t *testing.T) {
		// A browser that resolves evil.example to this machine, as DNS
		// rebinding makes it: the console answers 421 to that host name
		// (a page of evil.example would be same-origin with it).
		rctx := startBrowser(t, chromedp.Flag("host-resolver-rules", "MAP evil.example 127.0.0.1"))
		evil := strings.Replace(e.url, "127.0.0.1", "evil.example", 1)
		rt := newTab(t, rctx, evil)
		rt.open("failed")
		rt.wantText("#error", "answers to localhost, 127.0.0.1 and [::1] only")
		rt.wantCount("table#events, header.top", 0)
		if code := rt.attr("#error", "data-code"); code != "421" {
			t.Errorf("#error data-code = %q, want 421", code)
		}
		// The same browser on 127.0.0.1 gets the console.
		lt := newTab(t, rctx, e.url)
		lt.open("failed")
		lt.wantCount("table#events tr[data-id]", e.count(2))
	})
	t.Run("read-only", func(t *testing.T) {
		ro := newTab(t, bctx, e.roURL)
		ro.open("")
		if !eval[bool](ro, readOnlyJS) {
			t.Error("the read-only console's body is not marked data-readonly")
		}
		ro.wantCount("#readonly-badge", 1)
		ro.open("failed")
		ro.wantCount("table#events tr[data-id]", wantFailed)
		ro.wantCount(`input[name=id], #requeue-selected, #requeue-matching, input[name=csrf], form[method=post]`, 0)
		id := e.rows("status = 2")[0].id
		ro.open(fmt.Sprintf("events/%d", id))
		ro.wantText("#event-status", "FAILED")
		ro.wantCount("#requeue, #delete, #replay", 0)
		status := eval[int](ro, `fetch("actions/requeue", {method: "POST", body: new URLSearchParams({scope: "matching"}), credentials: "same-origin"}).then(r => r.status)`)
		if status != http.StatusForbidden {
			t.Errorf("POST to the read-only console from its page: %d, want 403", status)
		}
		resp, err := http.PostForm(e.roURL+"actions/delete", url.Values{"scope": {"selected"}, "id": {strconv.FormatInt(id, 10)}})
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusForbidden {
			t.Errorf("POST to the read-only console: %d, want 403", resp.StatusCode)
		}
		if n := e.countWhere("id = ?", id); n != 1 {
			t.Error("the read-only console deleted a row")
		}
	})
	b.t = t
}

// layout: the overview refreshes itself; at 360 px no page overflows
// sideways; dark mode changes the colours.
func layout(t *testing.T, e *env, bctx context.Context) {
	t.Run("live-refresh", func(t *testing.T) {
		b := newTab(t, bctx, e.url)
		b.open("")
		first := b.attr("#overview", "data-refreshed-at")
		if first == "" {
			t.Fatal("#overview has no data-refreshed-at")
		}
		deadline := time.Now().Add(15 * time.Second)
		for b.attr("#overview", "data-refreshed-at") == first {
			if time.Now().After(deadline) {
				t.Fatalf("#overview[data-refreshed-at] still %s after 15s (Refresh is 1s)", first)
			}
			time.Sleep(200 * time.Millisecond)
		}
		b.wantText("#count-failed", strconv.Itoa(wantFailed))
	})
	t.Run("phone", func(t *testing.T) {
		b := newTab(t, bctx, e.url)
		b.do(chromedp.EmulateViewport(360, 740, chromedp.EmulateMobile))
		id := e.rows("status = 2")[0].id
		for _, p := range []string{"", "failed", fmt.Sprintf("events/%d", id), "blocked", "inbox"} {
			b.open(p)
			sw, iw := eval[int](b, "document.documentElement.scrollWidth"), eval[int](b, "window.innerWidth")
			if iw != 360 {
				t.Errorf("/%s at 360 px: window.innerWidth is %d: the page lacks <meta name=viewport content=\"width=device-width\">", p, iw)
			}
			if sw > iw {
				t.Errorf("/%s at 360 px: the page is %d px wide, the viewport %d: it overflows sideways", p, sw, iw)
			}
			if p == "" {
				b.shot("overview-phone")
			}
		}
	})
	t.Run("dark", func(t *testing.T) {
		b := newTab(t, bctx, e.url)
		bg := func() string {
			return eval[string](b, "getComputedStyle(document.body).backgroundColor")
		}
		b.colorScheme("light")
		b.open("")
		light := bg()
		b.colorScheme("dark")
		b.open("")
		dark := bg()
		if dark == light {
			t.Errorf("dark mode: body background %s, the same as in light mode", dark)
		}
		b.shot("overview-dark")
	})
}

// deleteFlow deletes a FAILED event through the typed confirmation: a
// wrong id is refused, the right one deletes it and releases its key.
func deleteFlow(t *testing.T, e *env, b *tab) {
	b.t = t
	heads := e.rows("status = 2 AND biz_type = ?", pointType)
	if len(heads) == 0 {
		t.Fatal("no FAILED POINTS_CREDITED row left to delete")
	}
	r := heads[0]
	b.open(fmt.Sprintf("events/%d", r.id))
	b.clickNav("#delete")
	b.wantCount("input#confirm-input", 1)
	b.do(chromedp.SendKeys(chromedp.CSS("input#confirm-input"), "not-the-event-id"))
	b.clickNav("#confirm-ok")
	if n := e.countWhere("id = ?", r.id); n != 1 {
		t.Fatal("a wrong typed confirmation deleted the event")
	}
	b.wantCount("#confirm-error", 1)
	b.open(fmt.Sprintf("events/%d", r.id))
	b.clickNav("#delete")
	b.do(chromedp.SendKeys(chromedp.CSS("input#confirm-input"), r.eventID))
	b.clickNav("#confirm-ok")
	b.wantText("#flash", "1")
	if n := e.countWhere("id = ?", r.id); n != 0 {
		t.Fatal("the typed confirmation did not delete the event")
	}
	b.open("")
	b.wantText("#count-failed", strconv.Itoa(customers-1))
}
