package console_test

import (
	"context"
	"encoding/base64"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"golang.org/x/net/html"

	"github.com/outboxgen/outboxgen/runtime/admin"
	"github.com/outboxgen/outboxgen/runtime/console"
)

const xss = `<script>alert(1)</script>`

func TestEscaping(t *testing.T) {
	each(t, func(t *testing.T, e env) {
		n := e.insert(t, row{typ: "ORDER_PAID", key: xss, topic: "orders.paid", status: 2, attempts: 1, lastError: "broker said " + xss,
			payload: `{"note":"` + xss + `"}`, headers: `{"x-note":"` + xss + `"}`})
		raw := e.insert(t, row{key: "k-raw", status: 2, payload: `{"a":1}`, lastError: xss})
		// Not JSON (SQLite stores it as is; the JSON columns of PostgreSQL
		// and MariaDB refuse it): shown raw, escaped.
		if e.d == "sqlite" {
			e.exec(t, "UPDATE "+e.outbox()+" SET payload = '"+xss+" not json' WHERE id = "+id(raw))
		}
		c := e.console(t, console.Config{Database: xss})
		for _, p := range []string{"", "failed", "events/" + id(n), "events/" + id(raw), "blocked", "search?q=" + url.QueryEscape(xss), "failed?key=" + url.QueryEscape(xss)} {
			r := c.page(p)
			if strings.Contains(r.body, xss) || strings.Contains(r.body, "<script>alert") {
				t.Errorf("page %q holds the markup unescaped", p)
			}
			scripts := r.all(func(n *html.Node) bool { return n.Data == "script" })
			if len(scripts) != 1 || attr(scripts[0], "src") != "/assets/console.js" {
				t.Errorf("page %q has %d scripts, want only console.js", p, len(scripts))
			}
			if !strings.Contains(r.body, "&lt;script&gt;alert(1)&lt;/script&gt;") {
				t.Errorf("page %q does not show the markup as text", p)
			}
		}
		r := c.page("events/" + id(n))
		if got := r.text("payload"); got != `{ "note": "`+xss+`" }` {
			t.Errorf("#payload = %q", got)
		}
		if got := r.text("headers"); got != `{ "x-note": "`+xss+`" }` {
			t.Errorf("#headers = %q", got)
		}
		if got := r.text("last-error"); got != "broker said "+xss {
			t.Errorf("#last-error = %q", got)
		}
		if e.d == "sqlite" {
			r := c.page("events/" + id(raw))
			if r.text("payload") != xss+" not json" || !strings.Contains(r.text("payload-note"), "not valid JSON") {
				t.Errorf("raw payload = %q (%q)", r.text("payload"), r.text("payload-note"))
			}
		}
	})
}

func TestBigAndBinaryPayload(t *testing.T) {
	each(t, func(t *testing.T, e env) {
		if e.d != "sqlite" {
			t.Skip("only SQLite stores a payload that is not JSON")
		}
		big := e.insert(t, row{key: "big", status: 2})
		e.exec(t, "UPDATE "+e.outbox()+" SET payload = "+e.d.Placeholder(1)+" WHERE id = "+id(big), `{"s":"`+strings.Repeat("x", console.MaxPayloadDisplay)+`"}`)
		bin := e.insert(t, row{key: "bin", status: 2})
		e.exec(t, "UPDATE "+e.outbox()+" SET payload = "+e.d.Placeholder(1)+" WHERE id = "+id(bin), []byte{0xff, 0xfe, 0x00, 0x01, '<'})
		c := e.console(t, console.Config{})
		r := c.page("events/" + id(big))
		if !strings.Contains(r.text("payload-note"), "the first 262144 are shown") || len(r.text("payload")) != console.MaxPayloadDisplay {
			t.Errorf("big payload: note %q, %d bytes shown", r.text("payload-note"), len(r.text("payload")))
		}
		r = c.page("events/" + id(bin))
		if !strings.Contains(r.text("payload-note"), "hex dump") || !strings.Contains(r.text("payload"), "ff fe 00 01 3c") {
			t.Errorf("binary payload: note %q, %q", r.text("payload-note"), r.text("payload"))
		}
	})
}

func TestCSRF(t *testing.T) {
	each(t, func(t *testing.T, e env) {
		s := seed(t, e)
		c := e.console(t, console.Config{})
		good := c.page("failed").csrf(t)
		other := e.console(t, console.Config{})
		foreign := other.page("failed").csrf(t) // another handler's session
		c2 := serve(t, c.srv.Config.Handler, "/")
		otherSession := c2.page("failed").csrf(t) // the same handler, another session
		before := e.snapshot(t)
		form := func(tok string) url.Values {
			f := url.Values{"scope": {"selected"}, "id": {id(s.failed[0])}, "confirm": {"yes"}, "expect": {"1"}, "digest": {admin.Digest([]int64{s.failed[0]})}}
			if tok != "" {
				f.Set("csrf", tok)
			}
			return f
		}
		for name, tok := range map[string]string{"no token": "", "wrong token": mutate(good), "another handler's": foreign, "another session's": otherSession} {
			r := c.post("actions/requeue", form(tok))
			if r.StatusCode != http.StatusForbidden || !strings.Contains(r.text("main"), "nothing was changed") {
				t.Errorf("%s: %d %q, want 403 saying nothing changed", name, r.StatusCode, r.text("main"))
			}
		}
		// Cross-origin, with a valid token.
		for _, h := range []http.Header{{"Sec-Fetch-Site": {"cross-site"}}, {"Origin": {"https://evil.example"}}} {
			c.hdr = h
			r := c.post("actions/requeue", form(good))
			if r.StatusCode != http.StatusForbidden || !strings.Contains(r.text("main"), "another site") {
				t.Errorf("cross-origin %v: %d %q", h, r.StatusCode, r.text("main"))
			}
		}
		c.hdr = http.Header{}
		if e.snapshot(t) != before {
			t.Fatal("a refused POST changed rows")
		}
		// Same-origin browser request with the right token: accepted.
		c.hdr = http.Header{"Sec-Fetch-Site": {"same-origin"}, "Origin": {c.srv.URL}}
		if r := c.post("actions/requeue", form(good)); r.StatusCode != http.StatusSeeOther {
			t.Errorf("good POST: %d\n%s", r.StatusCode, r.text("main"))
		}
		if e.count(t, "status = 2") != 3 {
			t.Error("the good POST did not requeue")
		}
	})
}

func TestReadOnly(t *testing.T) {
	each(t, func(t *testing.T, e env) {
		s := seed(t, e)
		c := e.console(t, console.Config{ReadOnly: true})
		rw := e.console(t, console.Config{})
		tok := rw.page("failed").csrf(t)
		for _, p := range []string{"", "failed", "events/" + id(s.failed[0]), "events/" + id(s.sent[0]), "blocked", "search?q=a1", "search?q=o0", "inbox"} {
			r := c.page(p)
			if r.id("readonly-badge") == nil || !hasAttr(r.all(func(n *html.Node) bool { return n.Data == "body" })[0], "data-readonly") {
				t.Errorf("%q: no read-only badge or data-readonly", p)
			}
			if f := r.all(func(n *html.Node) bool { return n.Data == "form" && strings.EqualFold(attr(n, "method"), "post") }); len(f) > 0 {
				t.Errorf("%q offers %d POST forms", p, len(f))
			}
			if b := r.all(func(n *html.Node) bool { return n.Data == "input" && attr(n, "type") == "checkbox" }); len(b) > 0 {
				t.Errorf("%q offers checkboxes", p)
			}
			for _, idv := range []string{"requeue", "delete", "replay", "requeue-selected", "requeue-matching", "replay-selected"} {
				if r.id(idv) != nil {
					t.Errorf("%q offers #%s", p, idv)
				}
			}
		}
		before := e.snapshot(t)
		r := c.post("actions/requeue", url.Values{"csrf": {tok}, "scope": {"selected"}, "id": {id(s.failed[0])}, "confirm": {"yes"}})
		if r.StatusCode != http.StatusForbidden || !strings.Contains(r.text("main"), "read-only") {
			t.Errorf("POST in read-only: %d", r.StatusCode)
		}
		if e.snapshot(t) != before {
			t.Error("read-only console changed rows")
		}
	})
}

func TestTokenAuth(t *testing.T) {
	each(t, func(t *testing.T, e env) {
		if e.d != "sqlite" {
			t.Skip("the database plays no part")
		}
		const token = "s3cret-token-0123456789"
		c := e.console(t, console.Config{Token: token})
		seed(t, e)
		r := c.get("failed")
		if r.StatusCode != http.StatusUnauthorized || r.id("login") == nil {
			t.Fatalf("no credentials: %d, login form %v", r.StatusCode, r.id("login") != nil)
		}
		c.hdr = http.Header{"Authorization": {"Bearer wrong-token-0123456789"}}
		if r := c.get("failed"); r.StatusCode != http.StatusUnauthorized {
			t.Errorf("wrong bearer: %d", r.StatusCode)
		}
		c.hdr = http.Header{"Authorization": {"Bearer " + token}}
		r = c.page("failed")
		if strings.Contains(r.body, token) {
			t.Error("the page holds the token")
		}
		c.hdr = http.Header{}
		if r := c.get("failed?token=nope"); r.StatusCode != http.StatusUnauthorized || strings.Contains(r.body, "nope") {
			t.Errorf("wrong ?token: %d", r.StatusCode)
		}
		// ?token= logs in once and drops the token from the URL.
		r = c.get("failed?type=ORDER_PAID&token=" + token)
		if r.StatusCode != http.StatusSeeOther || r.Header.Get("Location") != "/failed?type=ORDER_PAID" {
			t.Fatalf("?token=: %d to %q", r.StatusCode, r.Header.Get("Location"))
		}
		var cookie *http.Cookie
		for _, ck := range r.Cookies() {
			if ck.Name == "outbox_console_auth" {
				cookie = ck
			}
		}
		if cookie == nil || !cookie.HttpOnly || cookie.SameSite != http.SameSiteStrictMode || strings.Contains(cookie.Value, token) {
			t.Fatalf("login cookie = %+v", cookie)
		}
		if dec, _ := base64.RawURLEncoding.DecodeString(cookie.Value); strings.Contains(string(dec), token) {
			t.Fatal("the cookie holds the token")
		}
		for _, p := range []string{"", "failed", "blocked", "inbox", "search?q=a1"} {
			if r := c.page(p); strings.Contains(r.body, token) {
				t.Errorf("%q holds the token", p)
			}
		}
		// ?token= never redirects off the console.
		req, _ := http.NewRequest(http.MethodGet, c.srv.URL+"/", nil)
		req.URL.Path = "//evil.example/x"
		req.URL.RawQuery = "token=" + token
		if r := serve(t, c.srv.Config.Handler, "/").do(req); r.StatusCode != http.StatusSeeOther || r.Header.Get("Location") != "/" {
			t.Errorf("?token= on //evil.example/x: %d to %q", r.StatusCode, r.Header.Get("Location"))
		}
		// The login form.
		c2 := serve(t, c.srv.Config.Handler, "/")
		if r := c2.post("login", url.Values{"token": {"wrong"}, "next": {"failed"}}); r.StatusCode != http.StatusUnauthorized {
			t.Errorf("wrong login: %d", r.StatusCode)
		}
		r = c2.post("login", url.Values{"token": {token}, "next": {"failed"}})
		if r.StatusCode != http.StatusSeeOther || r.Header.Get("Location") != "/failed" {
			t.Fatalf("login: %d to %q", r.StatusCode, r.Header.Get("Location"))
		}
		c2.page("failed")
		// next cannot leave the console.
		r = serve(t, c.srv.Config.Handler, "/").post("login", url.Values{"token": {token}, "next": {"//evil.example/x"}})
		if r.Header.Get("Location") != "/" {
			t.Errorf("login with an outside next goes to %q", r.Header.Get("Location"))
		}
		// A forged cookie is refused.
		c3 := serve(t, c.srv.Config.Handler, "/")
		c3.hdr = http.Header{"Cookie": {"outbox_console_auth=" + base64.RawURLEncoding.EncodeToString([]byte(token))}}
		if r := c3.get("failed"); r.StatusCode != http.StatusUnauthorized {
			t.Errorf("forged cookie: %d", r.StatusCode)
		}
		// Assets need no login (the login page uses them).
		if r := c3.get("assets/console.css"); r.StatusCode != http.StatusOK {
			t.Errorf("css: %d", r.StatusCode)
		}
	})
}

func TestBasicAuth(t *testing.T) {
	each(t, func(t *testing.T, e env) {
		if e.d != "sqlite" {
			t.Skip("the database plays no part")
		}
		c := e.console(t, console.Config{BasicAuthUser: "ops", BasicAuthPassword: "pa55word!"})
		r := c.get("")
		if r.StatusCode != http.StatusUnauthorized || !strings.HasPrefix(r.Header.Get("WWW-Authenticate"), "Basic ") {
			t.Errorf("no credentials: %d %q", r.StatusCode, r.Header.Get("WWW-Authenticate"))
		}
		for _, up := range [][2]string{{"ops", "wrong"}, {"other", "pa55word!"}, {"", ""}} {
			req, _ := http.NewRequest(http.MethodGet, c.url(""), nil)
			req.SetBasicAuth(up[0], up[1])
			if r := c.do(req); r.StatusCode != http.StatusUnauthorized {
				t.Errorf("%v: %d", up, r.StatusCode)
			}
		}
		req, _ := http.NewRequest(http.MethodGet, c.url(""), nil)
		req.SetBasicAuth("ops", "pa55word!")
		if r := c.do(req); r.StatusCode != http.StatusOK || strings.Contains(r.body, "pa55word!") {
			t.Errorf("right credentials: %d", r.StatusCode)
		}
	})
}

func TestHeadersAndBounds(t *testing.T) {
	each(t, func(t *testing.T, e env) {
		if e.d != "sqlite" {
			t.Skip("the database plays no part")
		}
		s := seed(t, e)
		c := e.console(t, console.Config{})
		tok := c.page("failed").csrf(t)
		check := func(what string, r *resp) {
			t.Helper()
			h := r.Header
			csp := h.Get("Content-Security-Policy")
			if !strings.Contains(csp, "default-src 'self'") || !strings.Contains(csp, "frame-ancestors 'none'") || strings.Contains(csp, "unsafe-inline") {
				t.Errorf("%s: CSP %q", what, csp)
			}
			for k, v := range map[string]string{"X-Content-Type-Options": "nosniff", "Referrer-Policy": "no-referrer", "X-Frame-Options": "DENY", "Cache-Control": "no-store"} {
				if h.Get(k) != v {
					t.Errorf("%s: %s = %q, want %q", what, k, h.Get(k), v)
				}
			}
		}
		check("overview", c.page(""))
		check("event", c.page("events/"+id(s.failed[0])))
		check("css", c.page("assets/console.css"))
		check("js", c.page("assets/console.js"))
		check("404", c.get("nope"))
		check("403", c.post("actions/requeue", url.Values{}))
		check("redirect", c.get("search?q="+id(s.failed[0])))
		if ct := c.page("assets/console.js").Header.Get("Content-Type"); !strings.HasPrefix(ct, "text/javascript") {
			t.Errorf("js content type %q", ct)
		}
		if r := c.get("assets/../console.go"); r.StatusCode != http.StatusNotFound {
			t.Errorf("asset path escape: %d", r.StatusCode)
		}
		// Session cookie flags.
		for _, ck := range c.get("failed").Cookies() {
			t.Errorf("a second page set cookie %s again", ck.Name)
		}
		r := serve(t, c.srv.Config.Handler, "/").page("")
		if cks := r.Cookies(); len(cks) != 1 || !cks[0].HttpOnly || cks[0].SameSite != http.SameSiteStrictMode || cks[0].Path != "/" {
			t.Errorf("session cookie = %+v", cks)
		}

		// Bounds.
		if r := c.get("failed?key=" + strings.Repeat("k", console.MaxParamBytes+1)); r.StatusCode != http.StatusRequestURITooLong {
			t.Errorf("long parameter: %d", r.StatusCode)
		}
		if r := c.get("failed?" + strings.Repeat("a=1&", console.MaxQueryBytes/4+1)); r.StatusCode != http.StatusRequestURITooLong {
			t.Errorf("long query: %d", r.StatusCode)
		}
		before := e.snapshot(t)
		big := url.Values{"csrf": {tok}, "scope": {"selected"}}
		for range console.MaxBodyBytes / 8 {
			big.Add("id", "1234567890")
		}
		if r := c.post("actions/requeue", big); r.StatusCode != http.StatusRequestEntityTooLarge {
			t.Errorf("big body: %d", r.StatusCode)
		}
		if r := c.post("actions/requeue", url.Values{"csrf": {tok}, "scope": {"selected"}, "id": {strings.Repeat("1", console.MaxParamBytes+1)}}); r.StatusCode != http.StatusRequestEntityTooLarge {
			t.Errorf("long field: %d", r.StatusCode)
		}
		if r := c.post("actions/requeue", url.Values{"csrf": {tok}, "scope": {"selected"}}); r.StatusCode != http.StatusBadRequest || !strings.Contains(r.text("main"), "no event selected") {
			t.Errorf("nothing selected: %d %q", r.StatusCode, r.text("main"))
		}
		if e.snapshot(t) != before {
			t.Error("refused requests changed rows")
		}
		req, _ := http.NewRequest(http.MethodDelete, c.url("failed"), nil)
		if r := c.do(req); r.StatusCode != http.StatusMethodNotAllowed {
			t.Errorf("DELETE: %d", r.StatusCode)
		}
	})
}

func TestBasePath(t *testing.T) {
	each(t, func(t *testing.T, e env) {
		if e.d == "mysql" {
			t.Skip("SQLite and PostgreSQL cover it")
		}
		s := seed(t, e)
		cfg := console.Config{BasePath: "/outbox", Admin: e.a, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}
		h, err := console.New(cfg)
		if err != nil {
			t.Fatal(err)
		}
		mux := http.NewServeMux()
		mux.Handle("/outbox/", h)
		c := serve(t, mux, "/outbox/")
		under := func(p string, r *resp) {
			t.Helper()
			for _, n := range r.all(func(n *html.Node) bool { return hasAttr(n, "href") || hasAttr(n, "action") || hasAttr(n, "src") }) {
				for _, k := range []string{"href", "action", "src"} {
					if v := attr(n, k); hasAttr(n, k) && !strings.HasPrefix(v, "/outbox/") {
						t.Errorf("%s: <%s %s=%q> leaves /outbox/", p, n.Data, k, v)
					}
				}
			}
			if ov := r.id("overview"); ov != nil && attr(ov, "data-refresh-url") != "/outbox/?fragment=overview" {
				t.Errorf("refresh url %q", attr(ov, "data-refresh-url"))
			}
		}
		pages := []string{"", "failed", "failed?limit=1", "events/" + id(s.failed[0]), "events/" + id(s.sent[0]), "blocked", "blocked?limit=1", "inbox", "search?q=a1", "search?q=a1&limit=1", "nope"}
		for _, p := range pages {
			r := c.get(p)
			under(p, r)
		}
		if r := c.get("/failed"); r.StatusCode != http.StatusNotFound {
			t.Errorf("/failed outside the base path: %d", r.StatusCode)
		}
		if loc := c.get("search?q=" + id(s.failed[0])).Header.Get("Location"); loc != "/outbox/events/"+id(s.failed[0]) {
			t.Errorf("search redirect %q", loc)
		}
		r := c.page("failed?type=ORDER_PAID")
		under("failed", r)
		r = c.post("actions/requeue", url.Values{"csrf": {r.csrf(t)}, "scope": {"matching"}, "back": {"failed"}, "type": {"ORDER_PAID"}})
		under("confirm", r)
		r = c.post("actions/requeue", confirmForm(t, r))
		if loc := r.Header.Get("Location"); loc != "/outbox/failed?type=ORDER_PAID" {
			t.Errorf("action redirect %q", loc)
		}
		r = c.page(r.Header.Get("Location"))
		if !strings.HasPrefix(r.flash(), "Requeued 3 FAILED events") {
			t.Errorf("flash under /outbox/: %q", r.flash())
		}
		// Token login under the base path: cookie path and redirect.
		cfg.Token = "0123456789abcdef0123"
		h, err = console.New(cfg)
		if err != nil {
			t.Fatal(err)
		}
		mux = http.NewServeMux()
		mux.Handle("/outbox/", h)
		c = serve(t, mux, "/outbox/")
		r = c.get("failed")
		under("login", r)
		r = c.get("blocked?token=" + cfg.Token)
		if loc := r.Header.Get("Location"); loc != "/outbox/blocked" || r.Cookies()[0].Path != "/outbox/" {
			t.Errorf("token login under /outbox/: %q, cookie %+v", loc, r.Cookies())
		}
		// Behind http.StripPrefix too.
		cfg.Token = ""
		h, _ = console.New(cfg)
		mux = http.NewServeMux()
		mux.Handle("/outbox/", http.StripPrefix("/outbox", h))
		c = serve(t, mux, "/outbox/")
		r = c.page("failed")
		under("failed (StripPrefix)", r)
		if len(r.dataIDs()) != 1 {
			t.Errorf("StripPrefix: %d rows", len(r.dataIDs()))
		}
	})
}

func TestNoCredentialsInPages(t *testing.T) {
	each(t, func(t *testing.T, e env) {
		if e.d != "sqlite" {
			t.Skip("the database plays no part")
		}
		seed(t, e)
		for _, db := range []string{"postgres://app:Pw-s3cr3t@db:5432/orders?sslmode=disable", "app:Pw-s3cr3t@tcp(db:3306)/orders", "host=db user=app password=Pw-s3cr3t dbname=orders"} {
			c := e.console(t, console.Config{Database: db})
			for _, p := range []string{"", "failed", "nope", "?fragment=overview"} {
				r := c.get(p)
				if strings.Contains(r.body, "Pw-s3cr3t") {
					t.Errorf("%q with Database %q shows the password", p, db)
				}
			}
			if r := c.page(""); !strings.Contains(r.body, "xxxxx") || !strings.Contains(r.body, "orders") {
				t.Errorf("Database %q is not shown redacted", db)
			}
		}
	})
}

func TestConfig(t *testing.T) {
	each(t, func(t *testing.T, e env) {
		if e.d != "sqlite" {
			t.Skip("the database plays no part")
		}
		for _, tc := range []struct {
			cfg  console.Config
			want string
		}{
			{console.Config{}, "Config.Admin is nil"},
			{console.Config{Admin: e.a, Token: "short"}, "at least 16"},
			{console.Config{Admin: e.a, Token: "0123456789abcdef", BasicAuthUser: "u", BasicAuthPassword: "p"}, "use one of them"},
			{console.Config{Admin: e.a, BasicAuthUser: "u"}, "set both"},
			{console.Config{Admin: e.a, BasePath: "/a b/"}, "BasePath"},
			{console.Config{Admin: e.a, BasePath: "/a/../b/"}, "BasePath"},
			{console.Config{Admin: e.a, Window: 48 * time.Hour}, "Config.Window"},
			{console.Config{Admin: e.a, Refresh: time.Millisecond}, "Config.Refresh"},
			{console.Config{Admin: e.a, StaleAfter: -1}, "StaleAfter"},
		} {
			_, err := console.New(tc.cfg)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("New(%+v) = %v, want an error containing %q", tc.cfg, err, tc.want)
			}
		}
		if _, err := console.New(console.Config{Admin: e.a, BasePath: "outbox"}); err != nil {
			t.Errorf("BasePath outbox: %v", err)
		}
		for addr, ok := range map[string]bool{"127.0.0.1:8080": true, "[::1]:8080": true, "localhost:80": true, ":8080": false, "0.0.0.0:8080": false, "10.0.0.1:80": false, "nohost": false} {
			err := console.Config{}.CheckListen(context.Background(), addr)
			if (err == nil) != ok {
				t.Errorf("CheckListen(%q) = %v", addr, err)
			}
			if err := (console.Config{Token: "0123456789abcdef"}).CheckListen(context.Background(), addr); err != nil && ok {
				t.Errorf("CheckListen(%q) with a token = %v", addr, err)
			}
		}
		if err := (console.Config{BasicAuthUser: "u", BasicAuthPassword: "0123456789abcdef"}).CheckListen(context.Background(), "0.0.0.0:80"); err != nil {
			t.Errorf("CheckListen with basic auth: %v", err)
		}
		// Failed logins are throttled per address only: off loopback a
		// short password is refused as a short token is.
		if err := (console.Config{BasicAuthUser: "u", BasicAuthPassword: "p"}).CheckListen(context.Background(), "0.0.0.0:80"); err == nil || !strings.Contains(err.Error(), "at least 16") {
			t.Errorf("CheckListen with a 1-character basic auth password off loopback = %v", err)
		}
		if err := (console.Config{BasicAuthUser: "u", BasicAuthPassword: "p"}).CheckListen(context.Background(), "127.0.0.1:80"); err != nil {
			t.Errorf("CheckListen with a short basic auth password on loopback = %v", err)
		}
	})
}

// mutate changes the first character of s.
func mutate(s string) string {
	if s[0] == 'A' {
		return "B" + s[1:]
	}
	return "A" + s[1:]
}

// hostReq builds a request to the console with Host header host.
func hostReq(t testing.TB, c *client, method, p, host string, form url.Values) *http.Request {
	t.Helper()
	var body io.Reader
	if form != nil {
		body = strings.NewReader(form.Encode())
	}
	req, err := http.NewRequest(method, c.url(p), body)
	if err != nil {
		t.Fatal(err)
	}
	if form != nil {
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	}
	req.Host = host
	return req
}

// TestHostCheck: without authentication the console answers to loopback
// names only (DNS rebinding), unless AllowedHosts lists the name.
func TestHostCheck(t *testing.T) {
	each(t, func(t *testing.T, e env) {
		s := seed(t, e)
		c := e.console(t, console.Config{})
		before := e.snapshot(t)
		for _, host := range []string{"evil.example:8080", "evil.example", "127.0.0.1.evil.example", "10.0.0.1:80"} {
			for _, p := range []string{"failed", "assets/console.css", "events/" + id(s.failed[0])} {
				r := c.do(hostReq(t, c, http.MethodGet, p, host, nil))
				if r.StatusCode != http.StatusMisdirectedRequest || !strings.Contains(r.body, "Host not allowed") || strings.Contains(r.body, "csrf") || len(r.Cookies()) != 0 {
					t.Errorf("GET %s with Host %s: %d, want 421 without a session", p, host, r.StatusCode)
				}
			}
			// A rebound page acting: refused before the CSRF check.
			r := c.do(hostReq(t, c, http.MethodPost, "actions/requeue", host, url.Values{"scope": {"selected"}, "id": {id(s.failed[0])}, "confirm": {"yes"}}))
			if r.StatusCode != http.StatusMisdirectedRequest {
				t.Errorf("POST with Host %s: %d, want 421", host, r.StatusCode)
			}
		}
		if e.snapshot(t) != before {
			t.Fatal("a request with a foreign Host changed rows")
		}
		for _, host := range []string{"localhost:8080", "LOCALHOST", "127.0.0.1:1", "[::1]:8080", "localhost."} {
			if r := c.do(hostReq(t, c, http.MethodGet, "failed", host, nil)); r.StatusCode != http.StatusOK {
				t.Errorf("GET with Host %s: %d, want 200", host, r.StatusCode)
			}
		}
		// Listed names, or any with "*".
		c = e.console(t, console.Config{AllowedHosts: []string{"ops.example.com"}})
		if r := c.do(hostReq(t, c, http.MethodGet, "failed", "ops.example.com:443", nil)); r.StatusCode != http.StatusOK {
			t.Errorf("listed host: %d", r.StatusCode)
		}
		if r := c.do(hostReq(t, c, http.MethodGet, "failed", "evil.example", nil)); r.StatusCode != http.StatusMisdirectedRequest {
			t.Errorf("unlisted host with AllowedHosts: %d", r.StatusCode)
		}
		c = e.console(t, console.Config{AllowedHosts: []string{"*"}})
		if r := c.do(hostReq(t, c, http.MethodGet, "failed", "evil.example", nil)); r.StatusCode != http.StatusOK {
			t.Errorf("any host with *: %d", r.StatusCode)
		}
		// With a token, any host by default (a rebound page has no
		// credential); AllowedHosts still checks when set.
		c = e.console(t, console.Config{Token: "0123456789abcdef0123"})
		if r := c.do(hostReq(t, c, http.MethodGet, "failed", "console.example", nil)); r.StatusCode != http.StatusUnauthorized {
			t.Errorf("token console, other host, no token: %d, want 401", r.StatusCode)
		}
		c = e.console(t, console.Config{Token: "0123456789abcdef0123", AllowedHosts: []string{"console.example"}})
		if r := c.do(hostReq(t, c, http.MethodGet, "failed", "other.example", nil)); r.StatusCode != http.StatusMisdirectedRequest {
			t.Errorf("token console, unlisted host: %d, want 421", r.StatusCode)
		}
		if _, err := console.New(console.Config{Admin: e.a, AllowedHosts: []string{"https://ops.example.com/"}}); err == nil || !strings.Contains(err.Error(), "without scheme or port") {
			t.Errorf("New with a URL in AllowedHosts: %v", err)
		}
	})
}

// TestPreAuthPages: before authentication no page shows the database or
// the header, and none sets a session cookie.
func TestPreAuthPages(t *testing.T) {
	each(t, func(t *testing.T, e env) {
		const db = "postgres://app@db.internal.corp:5432/orders"
		for _, cfg := range []console.Config{
			{Token: "0123456789abcdef0123", Database: db},
			{BasicAuthUser: "ops", BasicAuthPassword: "0123456789abcdef", Database: db},
		} {
			c := e.console(t, cfg)
			for _, p := range []string{"failed", "failed?%zz", "?q=" + strings.Repeat("a", console.MaxQueryBytes+1), "?q=" + strings.Repeat("a", console.MaxParamBytes+1), "login"} {
				r := c.get(p)
				if r.StatusCode < 400 || strings.Contains(r.body, "db.internal") || strings.Contains(r.body, `class="top"`) || strings.Contains(r.body, "csrf") || len(r.Cookies()) != 0 {
					t.Errorf("GET %.30s unauthenticated: %d, database shown %v, header %v, cookies %v", p, r.StatusCode,
						strings.Contains(r.body, "db.internal"), strings.Contains(r.body, `class="top"`), r.Cookies())
				}
			}
			r := c.post("assets/console.css", url.Values{})
			if r.StatusCode != http.StatusMethodNotAllowed || strings.Contains(r.body, "db.internal") || len(r.Cookies()) != 0 {
				t.Errorf("POST to an asset unauthenticated: %d", r.StatusCode)
			}
		}
		// Authenticated: the header shows the database.
		c := e.console(t, console.Config{Token: "0123456789abcdef0123", Database: db})
		c.hdr.Set("Authorization", "Bearer 0123456789abcdef0123")
		if r := c.page("failed"); !strings.Contains(r.body, "db.internal") || len(r.Cookies()) == 0 {
			t.Errorf("authenticated page: database shown %v, session cookie %v", strings.Contains(r.body, "db.internal"), r.Cookies())
		}
	})
}

// TestTokenLeftInURL: ?token= is always taken out of the URL, also when
// the login cookie is already valid.
func TestTokenLeftInURL(t *testing.T) {
	each(t, func(t *testing.T, e env) {
		const tok = "0123456789abcdef0123"
		c := e.console(t, console.Config{Token: tok})
		r := c.get("failed?token=" + tok + "&type=X")
		if r.StatusCode != http.StatusSeeOther || r.Header.Get("Location") != "/failed?type=X" {
			t.Fatalf("first ?token=: %d to %q", r.StatusCode, r.Header.Get("Location"))
		}
		r = c.get("failed?token=" + tok + "&type=X")
		if r.StatusCode != http.StatusSeeOther || r.Header.Get("Location") != "/failed?type=X" {
			t.Errorf("?token= with a valid cookie: %d to %q, want the URL without it", r.StatusCode, r.Header.Get("Location"))
		}
		r = c.get("failed?token=wrong")
		if r.StatusCode != http.StatusSeeOther || r.Header.Get("Location") != "/failed" {
			t.Errorf("a wrong ?token= with a valid cookie: %d to %q, want the URL without it", r.StatusCode, r.Header.Get("Location"))
		}
	})
}

// TestSecureCookies: SecureCookies marks the cookies Secure on plain
// HTTP, with the __Host- prefix under BasePath "/".
func TestSecureCookies(t *testing.T) {
	each(t, func(t *testing.T, e env) {
		const tok = "0123456789abcdef0123"
		for _, tc := range []struct {
			cfg    console.Config
			prefix string
			secure bool
		}{
			{console.Config{Token: tok}, "outbox_console_", false},
			{console.Config{Token: tok, SecureCookies: true}, "__Host-outbox_console_", true},
			{console.Config{Token: tok, SecureCookies: true, BasePath: "/outbox/"}, "outbox_console_", true},
		} {
			c := e.console(t, tc.cfg)
			r := c.get("?token=" + tok)
			cs := r.Cookies()
			if len(cs) != 1 || !strings.HasPrefix(cs[0].Name, tc.prefix) || cs[0].Secure != tc.secure || !cs[0].HttpOnly {
				t.Errorf("%+v: cookies %v, want one named %s*, Secure %v", tc.cfg, cs, tc.prefix, tc.secure)
			}
		}
	})
}
