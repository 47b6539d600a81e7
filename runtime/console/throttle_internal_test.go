package console

import (
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"
)

// fakeClock is a clock tests move on by hand.
type fakeClock struct {
	mu sync.Mutex
	t  time.Time
}

func newFakeClock() *fakeClock { return &fakeClock{t: time.Date(2025, 1, 2, 3, 4, 5, 0, time.UTC)} }

func (c *fakeClock) now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *fakeClock) advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

// testThrottle returns a throttle with the defaults (changed by set) on
// a fake clock.
func testThrottle(set func(*LoginThrottle)) (*throttle, *fakeClock) {
	var lim LoginThrottle
	if set != nil {
		set(&lim)
	}
	lim.setDefaults()
	t := newThrottle(lim)
	clk := newFakeClock()
	t.now = clk.now
	return t, clk
}

// fail makes n failed attempts of addr, each of which must be let through.
func fail(t *testing.T, th *throttle, addr string, n int) {
	t.Helper()
	for i := range n {
		a, d, _ := th.begin(addr)
		if a == nil {
			t.Fatalf("%s: attempt %d refused for %s", addr, i+1, d)
		}
		th.failed(a)
	}
}

// TestThrottleLocksAndDoubles: the 5th failure locks the address for a
// minute; each failure after a lock doubles it, up to 15 minutes; a
// locked address is refused until the lock ends, to the second.
func TestThrottleLocksAndDoubles(t *testing.T) {
	th, clk := testThrottle(nil)
	const a = "203.0.113.7"
	for i := range DefaultLoginFailures - 1 {
		at, d, _ := th.begin(a)
		if at == nil {
			t.Fatalf("attempt %d refused for %s", i+1, d)
		}
		if _, _, ok := th.failed(at); ok {
			t.Fatalf("failure %d throttles", i+1)
		}
	}
	if d := th.wait(a); d != 0 {
		t.Fatalf("throttled after %d failures for %s", DefaultLoginFailures-1, d)
	}
	for i, want := range []time.Duration{time.Minute, 2 * time.Minute, 4 * time.Minute, 8 * time.Minute, 15 * time.Minute, 15 * time.Minute} {
		at, d, _ := th.begin(a)
		if at == nil {
			t.Fatalf("attempt refused for %s before the lock of %s", d, want)
		}
		n, lock, ok := th.failed(at)
		if !ok || lock != want || n != DefaultLoginFailures+i {
			t.Fatalf("failure %d: lock %s (reported %v), want %s after failure %d", n, lock, ok, want, DefaultLoginFailures+i)
		}
		if at, d, locked := th.begin(a); at != nil || d != want || !locked {
			t.Errorf("right after the lock: wait %s (locked %v), want %s", d, locked, want)
		}
		clk.advance(want - time.Second)
		if _, d, _ := th.begin(a); d != time.Second || th.wait(a) != time.Second {
			t.Errorf("a second before the lock ends: wait %s, want 1s", d)
		}
		clk.advance(time.Second)
		if d := th.wait(a); d != 0 {
			t.Fatalf("the lock of %s is still on: %s", want, d)
		}
	}
}

// TestThrottleSuccessKeepsFailures: a success clears no failure (it may
// not be the client that failed): the next failure locks the address;
// and after a lock, a success does not give back the failures allowed
// before it. An address that succeeds without failures is not kept.
func TestThrottleSuccessKeepsFailures(t *testing.T) {
	th, _ := testThrottle(nil)
	const a = "203.0.113.7"
	for range 25 { // 4 guesses, then the operator signs in; again and again
		for range DefaultLoginFailures - 1 {
			if at, _, _ := th.begin(a); at != nil {
				th.failed(at)
			}
		}
		if at, _, _ := th.begin(a); at != nil {
			th.succeeded(at)
		}
	}
	if d := th.wait(a); d != DefaultLoginDelay {
		t.Errorf("4 failures, a success and 4 more: throttled for %s, want %s", d, DefaultLoginDelay)
	}
	if th.m[a].failures != DefaultLoginFailures {
		t.Errorf("%d failures counted, want %d", th.m[a].failures, DefaultLoginFailures)
	}
	// A success alone leaves nothing behind.
	at, _, _ := th.begin("192.0.2.1")
	th.succeeded(at)
	if th.len() != 1 {
		t.Errorf("%d addresses remembered after a success without failures, want 1", th.len())
	}
}

// TestThrottleAddressesApart: one address throttled does not throttle
// another.
func TestThrottleAddressesApart(t *testing.T) {
	th, _ := testThrottle(nil)
	fail(t, th, "203.0.113.7", DefaultLoginFailures)
	if at, _, _ := th.begin("203.0.113.7"); at != nil {
		t.Fatal("not throttled")
	}
	if at, d, _ := th.begin("203.0.113.8"); at == nil {
		t.Errorf("another address throttled for %s", d)
	}
}

// TestThrottleConcurrentAttempts: attempts are counted when they begin,
// so that concurrent ones cannot all pass before the first fails.
func TestThrottleConcurrentAttempts(t *testing.T) {
	th, _ := testThrottle(nil)
	var (
		wg      sync.WaitGroup
		mu      sync.Mutex
		allowed []*attempts
	)
	for range 50 {
		wg.Go(func() {
			if a, _, _ := th.begin("203.0.113.7"); a != nil {
				mu.Lock()
				allowed = append(allowed, a)
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	if len(allowed) != DefaultLoginFailures {
		t.Errorf("%d concurrent attempts let through, want %d", len(allowed), DefaultLoginFailures)
	}
	// They all fail, concurrently: one lock, reported once.
	var locks int
	for _, a := range allowed {
		wg.Go(func() {
			if _, _, ok := th.failed(a); ok {
				mu.Lock()
				locks++
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	if d := th.wait("203.0.113.7"); locks != 1 || d != DefaultLoginDelay {
		t.Errorf("%d locks reported, throttled for %s; want 1, %s", locks, d, DefaultLoginDelay)
	}
}

// TestThrottleConcurrentSuccesses: attempts in flight are not failures:
// as many concurrent right ones as Failures lock nothing; one more while
// they run is refused for a second, without a lock. After failures, only
// the failures left run at once; after a lock, one at a time.
func TestThrottleConcurrentSuccesses(t *testing.T) {
	th, _ := testThrottle(nil)
	const a = "203.0.113.7"
	var inFlight []*attempts
	for i := range DefaultLoginFailures {
		at, d, _ := th.begin(a)
		if at == nil {
			t.Fatalf("attempt %d of %d in flight refused for %s", i+1, DefaultLoginFailures, d)
		}
		inFlight = append(inFlight, at)
	}
	if at, d, locked := th.begin(a); at != nil || d != time.Second || locked {
		t.Errorf("one more attempt in flight: let through %v, wait %s, locked %v; want refused for 1s, unlocked", at != nil, d, locked)
	}
	for _, at := range inFlight {
		th.succeeded(at)
	}
	if d := th.wait(a); d != 0 || th.len() != 0 {
		t.Fatalf("%d right attempts at once: throttled for %s, %d addresses remembered", DefaultLoginFailures, d, th.len())
	}
	// 3 failures leave 2 at once.
	fail(t, th, a, 3)
	a1, _, _ := th.begin(a)
	a2, _, _ := th.begin(a)
	if a1 == nil || a2 == nil {
		t.Fatal("2 attempts at once refused after 3 failures")
	}
	if at, _, _ := th.begin(a); at != nil {
		t.Error("a 3rd attempt at once let through after 3 failures")
	}
	th.succeeded(a1)
	th.failed(a2)
	// After a lock: one at a time.
	fail(t, th, a, 1)
	th.now = func() time.Time { return newFakeClock().t.Add(time.Hour) }
	first, _, _ := th.begin(a)
	if first == nil {
		t.Fatal("refused after the lock")
	}
	if at, d, locked := th.begin(a); at != nil || d != time.Second || locked {
		t.Errorf("a second attempt at once after a lock: let through %v, wait %s, locked %v", at != nil, d, locked)
	}
	th.succeeded(first)
	if at, _, _ := th.begin(a); at == nil {
		t.Error("refused after the attempt in flight ended")
	}
}

// TestThrottleExpiry: failures are forgotten a window after the last one,
// but a lock cannot be waited out to forget them: the window starts when
// the lock ends.
func TestThrottleExpiry(t *testing.T) {
	th, clk := testThrottle(nil)
	const a = "203.0.113.7"
	fail(t, th, a, DefaultLoginFailures-1)
	clk.advance(DefaultLoginWindow - time.Second)
	fail(t, th, a, 1)
	if th.wait(a) == 0 {
		t.Fatal("failures forgotten within the window")
	}
	// Waited out: the lock ends, a window passes with no failure.
	clk.advance(DefaultLoginDelay + DefaultLoginWindow)
	if d := th.wait(a); d != 0 || th.len() != 0 {
		t.Fatalf("not forgotten: wait %s, %d addresses", d, th.len())
	}
	fail(t, th, a, DefaultLoginFailures-1)
	if d := th.wait(a); d != 0 {
		t.Fatalf("old failures counted: throttled for %s", d)
	}
	// Locked, then back within the window after the lock: it doubles.
	fail(t, th, a, 1)
	clk.advance(DefaultLoginDelay + DefaultLoginWindow - time.Second)
	fail(t, th, a, 1)
	if d := th.wait(a); d != 2*DefaultLoginDelay {
		t.Errorf("a failure within the window after a lock: throttled for %s, want %s", d, 2*DefaultLoginDelay)
	}
	// Successes do not keep failures from expiring.
	clk.advance(2*DefaultLoginDelay + DefaultLoginWindow/2)
	at, _, _ := th.begin(a)
	th.succeeded(at)
	clk.advance(DefaultLoginWindow / 2)
	if th.wait(a) != 0 || th.len() != 0 {
		t.Errorf("a success kept the failures: %d addresses remembered", th.len())
	}
	// An attempt in flight when the failures expire keeps its place.
	fail(t, th, a, DefaultLoginFailures-1)
	at, _, _ = th.begin(a)
	clk.advance(DefaultLoginWindow)
	if th.wait(a) != 0 || th.len() != 1 {
		t.Fatalf("expired failures with an attempt in flight: wait %s, %d addresses", th.wait(a), th.len())
	}
	th.succeeded(at)
	if th.len() != 0 {
		t.Errorf("%d addresses remembered after the attempt ended, want 0", th.len())
	}
}

// TestThrottleFullTable: a full table forgets no address whose failures
// have not expired, locked or not: addresses it does not hold share one
// entry, as one address would, until one expires (and the first of them
// is reported); addresses it holds are not affected.
func TestThrottleFullTable(t *testing.T) {
	th, clk := testThrottle(func(l *LoginThrottle) { l.MaxAddresses = 100 })
	var logged []string
	th.log = func(addr string, n int) { logged = append(logged, fmt.Sprint(addr, " ", n)) }
	const locked = "2001:db8:0:ffff::/64"
	fail(t, th, locked, DefaultLoginFailures)
	clk.advance(time.Second)
	for i := range 99 {
		fail(t, th, fmt.Sprintf("2001:db8:0:%x::/64", i), 1)
	}
	if th.len() != 100 {
		t.Fatalf("%d addresses remembered, want 100", th.len())
	}
	// 1,000 more addresses, 4 guesses each: the first 5 get through, as
	// from one address, then all are refused.
	var checked, refused int
	for i := range 1000 {
		for range DefaultLoginFailures - 1 {
			addr := fmt.Sprintf("2001:db8:1:%x::/64", i)
			if a, d, isLock := th.begin(addr); a != nil {
				checked++
				th.failed(a)
			} else if d == DefaultLoginDelay && isLock {
				refused++
			}
		}
	}
	if checked != DefaultLoginFailures || refused != 4000-DefaultLoginFailures || th.len() != 100 {
		t.Errorf("addresses the table does not hold: %d guesses checked, %d refused for 1m, %d remembered; want %d, the rest, 100",
			checked, refused, th.len(), DefaultLoginFailures)
	}
	if len(logged) != 1 || logged[0] != "2001:db8:1:0::/64 100" {
		t.Errorf("reported %q, want the first address the table could not take, once", logged)
	}
	if d := th.wait("192.0.2.1"); d != DefaultLoginDelay {
		t.Errorf("an address new to the full table, without credentials: wait %s, want %s", d, DefaultLoginDelay)
	}
	// The lock is still on; the addresses held are not affected.
	if d := th.wait(locked); d != DefaultLoginDelay-time.Second {
		t.Errorf("the lock was forgotten: wait %s", d)
	}
	if a, d, _ := th.begin("2001:db8:0:0::/64"); a == nil {
		t.Errorf("an address the table holds refused for %s", d)
	} else {
		th.succeeded(a)
	}
	// A success of an address new to the full table counts under the
	// shared entry, and clears nothing either.
	clk.advance(DefaultLoginDelay)
	a, _, _ := th.begin("192.0.2.2")
	if a != &th.shared {
		t.Fatal("not counted under the shared entry")
	}
	th.succeeded(a)
	if th.shared.failures != DefaultLoginFailures || th.shared.inflight != 0 || th.len() != 100 {
		t.Errorf("shared entry after a success: %d failures, %d in flight, %d remembered", th.shared.failures, th.shared.inflight, th.len())
	}
	// Once failures expire, they make room, and the next full table is
	// reported again.
	clk.advance(DefaultLoginWindow)
	fail(t, th, "192.0.2.3", 1)
	if th.len() != 1 || th.m["192.0.2.3"] == nil {
		t.Errorf("%d addresses remembered after they expired, want the new one only", th.len())
	}
	for i := range 100 {
		fail(t, th, fmt.Sprintf("10.0.0.%d", i), 1)
	}
	if len(logged) != 2 {
		t.Errorf("reported %q, want a second report", logged)
	}
}

// TestThrottleBounded: a flood of addresses leaves at most MaxAddresses
// remembered, the oldest ones, whose failures have not expired.
func TestThrottleBounded(t *testing.T) {
	th, clk := testThrottle(nil)
	for i := range 3 * DefaultLoginAddresses {
		if a, _, _ := th.begin(fmt.Sprintf("10.%d.%d.%d", i>>16&255, i>>8&255, i&255)); a != nil {
			th.failed(a)
		}
		if th.len() > DefaultLoginAddresses {
			t.Fatalf("%d addresses remembered, want at most %d", th.len(), DefaultLoginAddresses)
		}
	}
	if th.len() != DefaultLoginAddresses || th.m["10.0.0.0"] == nil || len(th.byExpiry.a) != DefaultLoginAddresses {
		t.Errorf("%d addresses remembered (the oldest: %v), want %d", th.len(), th.m["10.0.0.0"] != nil, DefaultLoginAddresses)
	}
	// Once they expire, a new address sweeps them out.
	clk.advance(DefaultLoginWindow + DefaultLoginMaxDelay)
	fail(t, th, "192.0.2.1", 1)
	if th.len() != 1 || len(th.byExpiry.a) != 1 {
		t.Errorf("%d addresses remembered after they expired, want 1", th.len())
	}
}

// TestClientAddr: failures count under RemoteAddr's host, IPv6 under its
// /64, never under a header the client sets; a RemoteAddr that holds no IP
// address under one fixed key, never under a string the client chose.
func TestClientAddr(t *testing.T) {
	for remote, want := range map[string]string{
		"203.0.113.7:1234":           "203.0.113.7",
		"[2001:db8:1:2:3:4:5:6]:443": "2001:db8:1:2::/64",
		"[2001:db8:1:2::ffff]:80":    "2001:db8:1:2::/64",
		"[::ffff:203.0.113.7]:1":     "203.0.113.7",
		"[fe80::1%eth0]:80":          "fe80::/64",
		"[::1]:8080":                 "::/64",
		"203.0.113.7":                "203.0.113.7",
		"[2001:db8::1]":              "2001:db8::/64",
		"[fe80::1%" + strings.Repeat("z", 1<<20) + "]:1": unparsedAddr,
		"@":                             unparsedAddr,
		"":                              unparsedAddr,
		"203.0.113.7, 198.51.100.1":     unparsedAddr,
		"203.0.113.7:1, 198.51.100.1:2": unparsedAddr,
		"unparsed:1":                    unparsedAddr,
		strings.Repeat("x", 1<<20):      unparsedAddr,
	} {
		r, _ := http.NewRequest(http.MethodGet, "http://127.0.0.1/", nil)
		r.RemoteAddr = remote
		r.Header.Set("X-Forwarded-For", "198.51.100.1")
		r.Header.Set("X-Real-IP", "198.51.100.2")
		r.Header.Set("Forwarded", "for=198.51.100.3")
		if got := clientAddr(r); got != want {
			t.Errorf("clientAddr(%.40q) = %.40q, want %q", remote, got, want)
		}
	}
}

// TestLoginThrottleValidate: every invalid setting is named, with its
// bounds.
func TestLoginThrottleValidate(t *testing.T) {
	if errs := (LoginThrottle{}).validate(); len(errs) != 0 {
		t.Errorf("zero value: %v", errs)
	}
	var def LoginThrottle
	def.setDefaults()
	if errs := def.validate(); len(errs) != 0 {
		t.Errorf("defaults: %v", errs)
	}
	if def != (LoginThrottle{Failures: 5, Delay: time.Minute, MaxDelay: 15 * time.Minute, Window: time.Hour, MaxAddresses: 10000}) {
		t.Errorf("defaults = %+v", def)
	}
	// A Delay longer than the default cap raises the default cap.
	long := LoginThrottle{Delay: time.Hour}
	long.setDefaults()
	if long.MaxDelay != time.Hour || len(long.validate()) != 0 {
		t.Errorf("Delay 1h: MaxDelay %s, %v", long.MaxDelay, long.validate())
	}
	for _, tc := range []struct {
		l    LoginThrottle
		want string
	}{
		{LoginThrottle{Failures: -1}, "Failures is -1: use 1 to 100"},
		{LoginThrottle{Failures: 101}, "Failures is 101"},
		{LoginThrottle{Delay: time.Millisecond}, "Delay is 1ms: use 1s to 24h"},
		{LoginThrottle{MaxDelay: 48 * time.Hour}, "MaxDelay is 48h0m0s"},
		{LoginThrottle{Delay: time.Minute, MaxDelay: time.Second}, "shorter than Delay"},
		{LoginThrottle{Window: time.Second}, "Window is 1s: use at least 1m"},
		{LoginThrottle{MaxAddresses: 10}, "MaxAddresses is 10: use at least 100"},
		{LoginThrottle{MaxAddresses: -1}, "MaxAddresses is -1"},
	} {
		var got []string
		for _, err := range tc.l.validate() {
			got = append(got, err.Error())
		}
		if len(got) != 1 || !strings.Contains(got[0], tc.want) {
			t.Errorf("%+v: %q, want one error containing %q", tc.l, got, tc.want)
		}
	}
}

// TestLoginMAC: the login cookie is an HMAC of the credential, so that
// other credentials (a changed password, user name or token) under the
// same secret do not take the cookies set for the old ones.
func TestLoginMAC(t *testing.T) {
	h := &handler{secret: []byte("0123456789abcdef0123456789abcdef")}
	macs := map[string]string{}
	for name, cfg := range map[string]Config{
		"basic":           {BasicAuthUser: "ops", BasicAuthPassword: "pa55word-0123456789"},
		"other password":  {BasicAuthUser: "ops", BasicAuthPassword: "pa55word-0123456780"},
		"other user":      {BasicAuthUser: "op", BasicAuthPassword: "pa55word-0123456789"},
		"split elsewhere": {BasicAuthUser: "ops:pa55word", BasicAuthPassword: "-0123456789"},
		"token":           {Token: "ops:pa55word-0123456789"},
		"other token":     {Token: "ops:pa55word-0123456780"},
	} {
		h.cfg = cfg
		m := h.loginMAC()
		for other, om := range macs {
			if m == om {
				t.Errorf("%s and %s: the same login cookie", name, other)
			}
		}
		macs[name] = m
		if h.loginMAC() != m {
			t.Errorf("%s: the login cookie changes", name)
		}
	}
	h.cfg = Config{}
	if h.loginMAC() != "" {
		t.Error("a login cookie without authentication")
	}
}
