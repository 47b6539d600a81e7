package console_test

import (
	"bytes"
	"encoding/base64"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/cookiejar"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/outboxgen/outboxgen/runtime/console"
)

const throttleToken = "0123456789abcdef0123"

// clock is a fake clock for the login throttle.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *clock) advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

// logBuffer collects log lines written from the server's goroutines.
type logBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *logBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *logBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// throttled is a console served by httptest whose clients stand at
// addresses of their choosing, with a fake clock and its log.
type throttled struct {
	h   http.Handler
	srv *httptest.Server
	clk *clock
	log *logBuffer
}

// remoteHeader carries the client address a test request stands for.
const remoteHeader = "X-Test-Remote-Addr"

// newThrottled serves a console of cfg. A middleware of the test sets
// r.RemoteAddr from remoteHeader, as a service behind a reverse proxy
// would from its proxy's header: the console itself reads none.
func newThrottled(t *testing.T, e env, cfg console.Config) *throttled {
	t.Helper()
	tc := &throttled{clk: &clock{t: time.Date(2025, 1, 2, 3, 4, 5, 0, time.UTC)}, log: &logBuffer{}}
	cfg.Admin = e.a
	cfg.Logger = slog.New(slog.NewTextHandler(tc.log, nil))
	h, err := console.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	console.SetClock(h, tc.clk.now)
	tc.h = h
	tc.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if a := r.Header.Get(remoteHeader); a != "" {
			r.RemoteAddr = a
		}
		h.ServeHTTP(w, r)
	}))
	t.Cleanup(tc.srv.Close)
	return tc
}

// from returns a client of its own (cookies too) at addr.
func (tc *throttled) from(t testing.TB, addr string) *client {
	jar, _ := cookiejar.New(nil)
	return &client{t: t, srv: tc.srv, base: "/", hdr: http.Header{remoteHeader: {addr + ":40000"}},
		c: &http.Client{Jar: jar, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}}
}

// bearer gets the failed page with the token tok in the Authorization
// header.
func bearer(c *client, tok string) *resp {
	c.t.Helper()
	req, err := http.NewRequest(http.MethodGet, c.url("failed"), nil)
	if err != nil {
		c.t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+tok)
	return c.do(req)
}

// wantThrottled fails unless r is a 429 with Retry-After secs.
func wantThrottled(t *testing.T, what string, r *resp, secs int) {
	t.Helper()
	if r.StatusCode != http.StatusTooManyRequests || r.Header.Get("Retry-After") != fmt.Sprint(secs) {
		t.Errorf("%s: %d with Retry-After %q, want 429 with %d", what, r.StatusCode, r.Header.Get("Retry-After"), secs)
	}
	if len(r.Cookies()) != 0 && what != "forged cookie" {
		t.Errorf("%s: the 429 sets cookies %v", what, r.Cookies())
	}
}

// TestLoginThrottle: five wrong tokens from an address and it is refused
// with 429 and Retry-After, even with the right token, however the token
// comes; another address signs in; after the delay the address signs in
// again, but the success clears none of its failures; each lock is
// logged once, without the credential.
func TestLoginThrottle(t *testing.T) {
	each(t, func(t *testing.T, e env) {
		if e.d != "sqlite" {
			t.Skip("the database plays no part")
		}
		tc := newThrottled(t, e, console.Config{Token: throttleToken})
		const wrong = "wrong-token-0123456789"
		a := tc.from(t, "203.0.113.7")
		for i := range console.DefaultLoginFailures {
			if r := bearer(a, wrong); r.StatusCode != http.StatusUnauthorized {
				t.Fatalf("wrong token %d: %d, want 401", i+1, r.StatusCode)
			}
		}
		wantThrottled(t, "right bearer token", bearer(a, throttleToken), 60)
		wantThrottled(t, "right ?token=", a.get("failed?token="+throttleToken), 60)
		wantThrottled(t, "right login form", a.post("login", url.Values{"token": {throttleToken}}), 60)
		wantThrottled(t, "no credential", a.get("failed"), 60)
		// A header the client sets is no way out.
		for _, h := range []string{"X-Forwarded-For", "X-Real-IP", "True-Client-IP"} {
			a.hdr.Set(h, "198.51.100.9")
			wantThrottled(t, h, bearer(a, throttleToken), 60)
			a.hdr.Del(h)
		}
		// Another address signs in, with any method.
		b := tc.from(t, "203.0.113.8")
		if r := bearer(b, throttleToken); r.StatusCode != http.StatusOK {
			t.Errorf("right token from another address: %d, want 200", r.StatusCode)
		}
		if r := tc.from(t, "198.51.100.1").post("login", url.Values{"token": {throttleToken}}); r.StatusCode != http.StatusSeeOther {
			t.Errorf("login form from another address: %d, want 303", r.StatusCode)
		}
		// An IPv6 neighbour in the same /64 is the same client.
		v6 := tc.from(t, "[2001:db8::1]")
		for range console.DefaultLoginFailures {
			bearer(v6, wrong)
		}
		wantThrottled(t, "another address of the /64", bearer(tc.from(t, "[2001:db8::2]"), throttleToken), 60)
		if r := bearer(tc.from(t, "[2001:db8:0:1::1]"), throttleToken); r.StatusCode != http.StatusOK {
			t.Errorf("another /64: %d, want 200", r.StatusCode)
		}

		tc.clk.advance(59 * time.Second)
		wantThrottled(t, "a second before the end", bearer(a, throttleToken), 1)
		tc.clk.advance(time.Second)
		// The next failure doubles the delay.
		if r := bearer(a, wrong); r.StatusCode != http.StatusUnauthorized {
			t.Fatalf("wrong token after the delay: %d, want 401", r.StatusCode)
		}
		wantThrottled(t, "after one more failure", bearer(a, throttleToken), 120)
		tc.clk.advance(2 * time.Minute)
		if r := bearer(a, throttleToken); r.StatusCode != http.StatusOK {
			t.Fatalf("right token after the delay: %d, want 200", r.StatusCode)
		}
		// The success cleared nothing (it need not come from the client
		// that failed): the next failure doubles the delay again.
		if r := bearer(a, wrong); r.StatusCode != http.StatusUnauthorized {
			t.Fatalf("wrong token after a success: %d, want 401", r.StatusCode)
		}
		wantThrottled(t, "after a success and one more failure", bearer(a, throttleToken), 240)

		log := tc.log.String()
		lines := strings.Count(log, "address throttled")
		if lines != 4 {
			t.Errorf("%d lines logged, want 4 (one per lock):\n%s", lines, log)
		}
		for _, want := range []string{"remote=203.0.113.7 failures=5 for=1m0s", "remote=203.0.113.7 failures=6 for=2m0s", "remote=203.0.113.7 failures=7 for=4m0s", "remote=2001:db8::/64 failures=5 for=1m0s"} {
			if !strings.Contains(log, want) {
				t.Errorf("no line with %q:\n%s", want, log)
			}
		}
		if strings.Contains(log, wrong) || strings.Contains(log, throttleToken) {
			t.Errorf("the log holds a token:\n%s", log)
		}
	})
}

// TestLoginThrottlePaths: every failing path counts (Authorization
// header, ?token=, the login form, a forged login cookie, basic auth);
// a request without credentials counts none.
func TestLoginThrottlePaths(t *testing.T) {
	each(t, func(t *testing.T, e env) {
		if e.d != "sqlite" {
			t.Skip("the database plays no part")
		}
		tc := newThrottled(t, e, console.Config{Token: throttleToken})
		for i, p := range []struct {
			name string
			fail func(c *client) *resp
		}{
			{"bearer", func(c *client) *resp { return bearer(c, "wrong-token-0123456789") }},
			{"basic credentials on a token console", func(c *client) *resp {
				req, _ := http.NewRequest(http.MethodGet, c.url("failed"), nil)
				req.SetBasicAuth("ops", throttleToken)
				return c.do(req)
			}},
			{"?token=", func(c *client) *resp { return c.get("failed?token=wrong") }},
			{"login form", func(c *client) *resp { return c.post("login", url.Values{"token": {"wrong"}, "next": {"failed"}}) }},
			{"forged cookie", func(c *client) *resp {
				req, _ := http.NewRequest(http.MethodGet, c.url("failed"), nil)
				req.Header.Set("Cookie", "outbox_console_auth=forged")
				r := c.do(req)
				// It is cleared, so that a stale one counts once.
				if cs := r.Cookies(); len(cs) != 1 || cs[0].Name != "outbox_console_auth" || cs[0].MaxAge >= 0 {
					c.t.Errorf("forged cookie: cookies %v, want it cleared", cs)
				}
				return r
			}},
		} {
			c := tc.from(t, fmt.Sprintf("192.0.2.%d", i+1))
			for j := range console.DefaultLoginFailures {
				if r := p.fail(c); r.StatusCode != http.StatusUnauthorized {
					t.Errorf("%s %d: %d, want 401", p.name, j+1, r.StatusCode)
				}
			}
			wantThrottled(t, p.name, bearer(c, throttleToken), 60)
		}
		// Visits without a credential (the login page) are no attempt.
		c := tc.from(t, "192.0.2.100")
		for range 3 * console.DefaultLoginFailures {
			if r := c.get("failed"); r.StatusCode != http.StatusUnauthorized || r.id("login") == nil {
				t.Fatalf("visit without a credential: %d, want 401 with the login form", r.StatusCode)
			}
		}
		if r := bearer(c, throttleToken); r.StatusCode != http.StatusOK {
			t.Errorf("right token after visits: %d, want 200", r.StatusCode)
		}

		// Basic auth.
		tb := newThrottled(t, e, console.Config{BasicAuthUser: "ops", BasicAuthPassword: "pa55word!"})
		basic := func(c *client, user, pass string) *resp {
			req, _ := http.NewRequest(http.MethodGet, c.url("failed"), nil)
			req.SetBasicAuth(user, pass)
			return c.do(req)
		}
		c = tb.from(t, "192.0.2.1")
		for range 3 * console.DefaultLoginFailures {
			if r := c.get("failed"); r.StatusCode != http.StatusUnauthorized || !strings.HasPrefix(r.Header.Get("WWW-Authenticate"), "Basic ") {
				t.Fatalf("no credentials: %d, want the 401 challenge", r.StatusCode)
			}
		}
		for i, up := range [][2]string{{"ops", "wrong"}, {"other", "pa55word!"}, {"", ""}, {"ops", ""}, {"ops", "pa55word"}} {
			if r := basic(c, up[0], up[1]); r.StatusCode != http.StatusUnauthorized {
				t.Errorf("wrong credentials %d: %d, want 401", i+1, r.StatusCode)
			}
		}
		r := basic(c, "ops", "pa55word!")
		wantThrottled(t, "right basic credentials", r, 60)
		if r.Header.Get("WWW-Authenticate") != "" {
			t.Error("the 429 asks for credentials")
		}
		wantThrottled(t, "no credentials", c.get("failed"), 60)
		if r := basic(tb.from(t, "192.0.2.2"), "ops", "pa55word!"); r.StatusCode != http.StatusOK {
			t.Errorf("right credentials from another address: %d, want 200", r.StatusCode)
		}
		if n := strings.Count(tb.log.String(), "address throttled"); n != 1 || strings.Contains(tb.log.String(), "pa55word") {
			t.Errorf("basic auth log (%d lines):\n%s", n, tb.log.String())
		}
	})
}

// TestLoginThrottleSignedIn: an operator signed in (login cookie) keeps
// working while an attacker at the same address is throttled: the cookie
// cannot be guessed.
func TestLoginThrottleSignedIn(t *testing.T) {
	each(t, func(t *testing.T, e env) {
		if e.d != "sqlite" {
			t.Skip("the database plays no part")
		}
		tc := newThrottled(t, e, console.Config{Token: throttleToken})
		op := tc.from(t, "203.0.113.7")
		if r := op.get("failed?token=" + throttleToken); r.StatusCode != http.StatusSeeOther {
			t.Fatalf("sign in: %d", r.StatusCode)
		}
		attacker := tc.from(t, "203.0.113.7")
		for range console.DefaultLoginFailures {
			attacker.post("login", url.Values{"token": {"wrong"}})
		}
		wantThrottled(t, "attacker", attacker.get("failed"), 60)
		op.page("failed")
		// ?token= is taken out of the URL without being looked at.
		if r := op.get("failed?token=wrong"); r.StatusCode != http.StatusSeeOther || r.Header.Get("Location") != "/failed" {
			t.Errorf("?token= signed in while throttled: %d to %q", r.StatusCode, r.Header.Get("Location"))
		}
		// A request with the cookie does not reset the attacker's failures.
		wantThrottled(t, "attacker after the operator's requests", attacker.get("failed"), 60)
	})
}

// TestLoginThrottleConcurrent: concurrent wrong tokens from one address
// get no more than the allowed failures checked.
func TestLoginThrottleConcurrent(t *testing.T) {
	each(t, func(t *testing.T, e env) {
		if e.d != "sqlite" {
			t.Skip("the database plays no part")
		}
		tc := newThrottled(t, e, console.Config{Token: throttleToken})
		var (
			wg    sync.WaitGroup
			mu    sync.Mutex
			codes = map[int]int{}
		)
		for range 40 {
			wg.Go(func() {
				c := tc.from(t, "203.0.113.7")
				req, _ := http.NewRequest(http.MethodGet, c.url("failed"), nil)
				req.Header.Set("Authorization", "Bearer wrong-token-0123456789")
				req.Header.Set(remoteHeader, "203.0.113.7:1")
				r, err := c.c.Do(req)
				if err != nil {
					t.Error(err)
					return
				}
				r.Body.Close()
				mu.Lock()
				codes[r.StatusCode]++
				mu.Unlock()
			})
		}
		wg.Wait()
		if codes[http.StatusUnauthorized] != console.DefaultLoginFailures || codes[http.StatusTooManyRequests] != 40-console.DefaultLoginFailures {
			t.Errorf("answers %v, want %d×401 and the rest 429", codes, console.DefaultLoginFailures)
		}
	})
}

// TestLoginThrottleBounded: a flood of addresses leaves the table at
// MaxAddresses.
func TestLoginThrottleBounded(t *testing.T) {
	each(t, func(t *testing.T, e env) {
		if e.d != "sqlite" {
			t.Skip("the database plays no part")
		}
		tc := newThrottled(t, e, console.Config{Token: throttleToken, LoginThrottle: console.LoginThrottle{MaxAddresses: 100}})
		for i := range 300 {
			bearer(tc.from(t, fmt.Sprintf("10.0.%d.%d", i/256, i%256)), "wrong-token-0123456789")
			if n := console.ThrottledAddresses(tc.h); n > 100 {
				t.Fatalf("%d addresses remembered, want at most 100", n)
			}
		}
		if n := console.ThrottledAddresses(tc.h); n != 100 {
			t.Errorf("%d addresses remembered, want 100", n)
		}
		// Successes and visits add none.
		bearer(tc.from(t, "192.0.2.1"), throttleToken)
		tc.from(t, "192.0.2.2").get("failed")
		if n := console.ThrottledAddresses(tc.h); n > 100 {
			t.Errorf("%d addresses remembered after a success and a visit, want at most 100", n)
		}
		if _, err := console.New(console.Config{Admin: e.a, LoginThrottle: console.LoginThrottle{MaxAddresses: 10, Failures: -1}}); err == nil ||
			!strings.Contains(err.Error(), "LoginThrottle.MaxAddresses") || !strings.Contains(err.Error(), "LoginThrottle.Failures") {
			t.Errorf("New with an invalid LoginThrottle: %v", err)
		}
	})
}

// basicAuth gets the failed page with basic credentials.
func basicAuth(c *client, user, pass string) *resp {
	c.t.Helper()
	req, err := http.NewRequest(http.MethodGet, c.url("failed"), nil)
	if err != nil {
		c.t.Fatal(err)
	}
	req.SetBasicAuth(user, pass)
	return c.do(req)
}

// TestLoginThrottleSharedAddressBasic: with basic auth, a guesser behind
// the operator's address gets no more guesses for the operator's
// sign-ins (a success clears no failure), and the operator, signed in by
// the login cookie the first success set, keeps working while the
// address is throttled.
func TestLoginThrottleSharedAddressBasic(t *testing.T) {
	each(t, func(t *testing.T, e env) {
		if e.d != "sqlite" {
			t.Skip("the database plays no part")
		}
		tc := newThrottled(t, e, console.Config{BasicAuthUser: "ops", BasicAuthPassword: "pa55word!"})
		op, attacker := tc.from(t, "10.0.0.1"), tc.from(t, "10.0.0.1")
		codes := map[int]int{}
		for round := range 25 {
			for range console.DefaultLoginFailures - 1 {
				codes[basicAuth(attacker, "ops", "wrong").StatusCode]++
			}
			if r := basicAuth(op, "ops", "pa55word!"); r.StatusCode != http.StatusOK {
				t.Errorf("operator, round %d: %d, want 200", round+1, r.StatusCode)
			}
		}
		if codes[http.StatusUnauthorized] != console.DefaultLoginFailures || codes[http.StatusTooManyRequests] != 100-console.DefaultLoginFailures {
			t.Errorf("100 guesses beside the operator's sign-ins: %v, want %d checked (401), the rest 429", codes, console.DefaultLoginFailures)
		}
		// Signed in: the cookie, with or without credentials (a browser
		// sends them with every request, right or stale), is let in.
		op.page("failed")
		if r := basicAuth(op, "ops", "stale"); r.StatusCode != http.StatusOK {
			t.Errorf("cookie with other credentials: %d, want 200", r.StatusCode)
		}
		// Not signed in: the right credentials are not even checked.
		wantThrottled(t, "right credentials without the cookie", basicAuth(tc.from(t, "10.0.0.1"), "ops", "pa55word!"), 60)
		wantThrottled(t, "attacker", basicAuth(attacker, "ops", "pa55word!"), 60)
	})
}

// TestLoginThrottleBearerNoReset: right bearer tokens from the address a
// guesser shares clear none of its failures.
func TestLoginThrottleBearerNoReset(t *testing.T) {
	each(t, func(t *testing.T, e env) {
		if e.d != "sqlite" {
			t.Skip("the database plays no part")
		}
		tc := newThrottled(t, e, console.Config{Token: throttleToken})
		op, attacker := tc.from(t, "10.0.0.1"), tc.from(t, "10.0.0.1")
		var checked int
		for range 5 {
			for range console.DefaultLoginFailures - 1 {
				if bearer(attacker, "wrong-token-0123456789").StatusCode == http.StatusUnauthorized {
					checked++
				}
			}
			bearer(op, throttleToken)
		}
		if checked != console.DefaultLoginFailures {
			t.Errorf("%d wrong tokens checked beside right ones, want %d", checked, console.DefaultLoginFailures)
		}
	})
}

// TestBasicAuthCookie: right basic credentials set the login cookie
// (HttpOnly, SameSite=Strict, Secure when configured, under BasePath,
// holding no credential), which alone lets in; a cookie this handler did
// not sign is refused, counted once and cleared, or replaced when the
// request carries the right credentials (then not counted).
func TestBasicAuthCookie(t *testing.T) {
	each(t, func(t *testing.T, e env) {
		if e.d != "sqlite" {
			t.Skip("the database plays no part")
		}
		const pass = "pa55word-0123456789"
		for _, tc := range []struct {
			cfg        console.Config
			name, path string
			secure     bool
		}{
			{console.Config{}, "outbox_console_auth", "/", false},
			{console.Config{SecureCookies: true}, "__Host-outbox_console_auth", "/", true},
			{console.Config{SecureCookies: true, BasePath: "/outbox/"}, "outbox_console_auth", "/outbox/", true},
		} {
			cfg := tc.cfg
			cfg.BasicAuthUser, cfg.BasicAuthPassword = "ops", pass
			th := newThrottled(t, e, cfg)
			c := th.from(t, "192.0.2.1")
			c.base = tc.path
			r := basicAuth(c, "ops", pass)
			cs := r.Cookies()
			if r.StatusCode != http.StatusOK || len(cs) != 2 {
				t.Fatalf("%+v: right credentials: %d, cookies %v", tc.cfg, r.StatusCode, cs)
			}
			var auth *http.Cookie
			for _, ck := range cs {
				if ck.Name == tc.name {
					auth = ck
				}
			}
			if auth == nil {
				t.Fatalf("%+v: no cookie %s in %v", tc.cfg, tc.name, cs)
			}
			dec, _ := base64.RawURLEncoding.DecodeString(auth.Value)
			if !auth.HttpOnly || auth.SameSite != http.SameSiteStrictMode || auth.Secure != tc.secure || auth.Path != tc.path ||
				strings.Contains(auth.Value, pass) || strings.Contains(string(dec), pass) || len(dec) != 32 {
				t.Errorf("%+v: login cookie %+v", tc.cfg, auth)
				continue
			}
			// The cookie alone lets in.
			cookieOnly := func(value string) *resp {
				req, _ := http.NewRequest(http.MethodGet, c.url("failed"), nil)
				req.AddCookie(&http.Cookie{Name: tc.name, Value: value})
				return th.from(t, "192.0.2.2").do(req)
			}
			if r := cookieOnly(auth.Value); r.StatusCode != http.StatusOK {
				t.Errorf("%+v: the cookie alone: %d, want 200", tc.cfg, r.StatusCode)
			}
			// Another handler's cookie (another secret, another password):
			// refused, counted, cleared.
			other := cfg
			other.BasicAuthPassword = pass + "-new"
			oc := newThrottled(t, e, other)
			req, _ := http.NewRequest(http.MethodGet, oc.srv.URL+tc.path+"failed", nil)
			req.AddCookie(&http.Cookie{Name: tc.name, Value: auth.Value})
			r = oc.from(t, "192.0.2.3").do(req)
			if cs := r.Cookies(); r.StatusCode != http.StatusUnauthorized || len(cs) != 1 || cs[0].MaxAge >= 0 || console.ThrottledAddresses(oc.h) != 1 {
				t.Errorf("%+v: another handler's cookie: %d, cookies %v, %d addresses counted; want 401, cleared, 1", tc.cfg, r.StatusCode, cs, console.ThrottledAddresses(oc.h))
			}
			// With the right credentials it is replaced, not counted.
			req, _ = http.NewRequest(http.MethodGet, oc.srv.URL+tc.path+"failed", nil)
			req.AddCookie(&http.Cookie{Name: tc.name, Value: auth.Value})
			req.SetBasicAuth("ops", other.BasicAuthPassword)
			r = oc.from(t, "192.0.2.4").do(req)
			var replaced bool
			for _, ck := range r.Cookies() {
				replaced = replaced || ck.Name == tc.name && ck.Value != auth.Value && ck.MaxAge == 0
			}
			if r.StatusCode != http.StatusOK || !replaced || console.ThrottledAddresses(oc.h) != 1 {
				t.Errorf("%+v: a stale cookie with the right credentials: %d, cookies %v, %d addresses counted; want 200, replaced, 1", tc.cfg, r.StatusCode, r.Cookies(), console.ThrottledAddresses(oc.h))
			}
		}
	})
}

// TestLoginThrottleFullTable: a full table forgets no lock, nor any
// address whose failures have not expired: the addresses it does not
// hold share one limit, so that cycling through more addresses than it
// holds gains a guesser nothing; addresses it holds and operators signed
// in are not affected.
func TestLoginThrottleFullTable(t *testing.T) {
	each(t, func(t *testing.T, e env) {
		if e.d != "sqlite" {
			t.Skip("the database plays no part")
		}
		const wrong = "wrong-token-0123456789"
		tc := newThrottled(t, e, console.Config{Token: throttleToken, LoginThrottle: console.LoginThrottle{MaxAddresses: 100}})
		op := tc.from(t, "[2001:db8:ffff::1]")
		if r := op.get("failed?token=" + throttleToken); r.StatusCode != http.StatusSeeOther {
			t.Fatalf("sign in: %d", r.StatusCode)
		}
		locked := tc.from(t, "[2001:db8::1]")
		for range console.DefaultLoginFailures {
			bearer(locked, wrong)
		}
		for i := range 100 {
			bearer(tc.from(t, fmt.Sprintf("[2001:db8:0:%x::1]", i+1)), wrong)
		}
		if n := console.ThrottledAddresses(tc.h); n != 100 {
			t.Errorf("%d addresses remembered, want 100", n)
		}
		wantThrottled(t, "the /64 locked before 100 others failed", bearer(locked, throttleToken), 60)
		// Cycling: 300 more /64s, 4 guesses each. The 100th above already
		// failed once in the shared entry: 4 are checked, then none.
		codes := map[int]int{}
		for i := range 300 {
			c := tc.from(t, fmt.Sprintf("[2001:db8:1:%x::1]", i))
			for range console.DefaultLoginFailures - 1 {
				codes[bearer(c, wrong).StatusCode]++
			}
		}
		if codes[http.StatusUnauthorized] != console.DefaultLoginFailures-1 || codes[http.StatusTooManyRequests] != 1200-(console.DefaultLoginFailures-1) {
			t.Errorf("1,200 guesses from 300 /64s the full table does not hold: %v, want %d checked, the rest 429", codes, console.DefaultLoginFailures-1)
		}
		// An address the table holds signs in; so does an operator signed
		// in before, from an address it does not hold.
		if r := bearer(tc.from(t, "[2001:db8:0:1::1]"), throttleToken); r.StatusCode != http.StatusOK {
			t.Errorf("an address the table holds: %d, want 200", r.StatusCode)
		}
		op.page("failed")
		log := tc.log.String()
		if strings.Count(log, "throttle table is full") != 1 || strings.Count(log, "every address the full throttle table does not hold throttled") != 1 {
			t.Errorf("log:\n%s", log)
		}
		// The table has room again once failures expire.
		tc.clk.advance(console.DefaultLoginWindow + console.DefaultLoginDelay)
		if r := bearer(tc.from(t, "198.51.100.1"), wrong); r.StatusCode != http.StatusUnauthorized || console.ThrottledAddresses(tc.h) != 1 {
			t.Errorf("after the window: %d, %d addresses remembered", r.StatusCode, console.ThrottledAddresses(tc.h))
		}
	})
}

// TestLoginThrottleUnparsedAddr: clients whose RemoteAddr holds no IP
// address (a header copied in whole) share one entry, whatever the
// string: one of their own each would escape the throttle. It is logged
// once.
func TestLoginThrottleUnparsedAddr(t *testing.T) {
	each(t, func(t *testing.T, e env) {
		if e.d != "sqlite" {
			t.Skip("the database plays no part")
		}
		tc := newThrottled(t, e, console.Config{Token: throttleToken})
		at := func(remote string) *client {
			c := tc.from(t, "")
			c.hdr.Set(remoteHeader, remote)
			return c
		}
		for i := range console.DefaultLoginFailures {
			if r := bearer(at(fmt.Sprintf("198.51.100.%d, 10.0.0.1", i)), "wrong-token-0123456789"); r.StatusCode != http.StatusUnauthorized {
				t.Fatalf("wrong token %d: %d", i+1, r.StatusCode)
			}
		}
		wantThrottled(t, "another unparsable address", bearer(at("203.0.113.9, 10.0.0.2"), throttleToken), 60)
		wantThrottled(t, "a string of the client's choosing", bearer(at(strings.Repeat("x", 4096)), throttleToken), 60)
		if r := bearer(at("203.0.113.9:1"), throttleToken); r.StatusCode != http.StatusOK {
			t.Errorf("an IP address: %d, want 200", r.StatusCode)
		}
		if n := console.ThrottledAddresses(tc.h); n != 1 {
			t.Errorf("%d addresses remembered, want 1", n)
		}
		if log := tc.log.String(); strings.Count(log, "not an IP address") != 1 || strings.Contains(log, strings.Repeat("x", 100)) {
			t.Errorf("log:\n%s", log)
		}
	})
}
