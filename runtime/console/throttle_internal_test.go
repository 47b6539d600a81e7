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
		if d := th.begin(addr); d != 0 {
			t.Fatalf("%s: attempt %d refused for %s", addr, i+1, d)
		}
		th.failed(addr)
	}
}

// TestThrottleLocksAndDoubles: the 5th failure locks the address for a
// minute; each failure after a lock doubles it, up to 15 minutes; a
// locked address is refused until the lock ends, to the second.
func TestThrottleLocksAndDoubles(t *testing.T) {
	th, clk := testThrottle(nil)
	const a = "203.0.113.7"
	for i := range DefaultLoginFailures - 1 {
		if d := th.begin(a); d != 0 {
			t.Fatalf("attempt %d refused for %s", i+1, d)
		}
		if _, _, ok := th.failed(a); ok {
			t.Fatalf("failure %d throttles", i+1)
		}
	}
	if d := th.wait(a); d != 0 {
		t.Fatalf("throttled after %d failures for %s", DefaultLoginFailures-1, d)
	}
	for _, want := range []time.Duration{time.Minute, 2 * time.Minute, 4 * time.Minute, 8 * time.Minute, 15 * time.Minute, 15 * time.Minute} {
		if d := th.begin(a); d != 0 {
			t.Fatalf("attempt refused for %s before the lock of %s", d, want)
		}
		n, lock, ok := th.failed(a)
		if !ok || lock != want {
			t.Fatalf("failure %d: lock %s (reported %v), want %s", n, lock, ok, want)
		}
		if _, _, again := th.failed(a); again {
			t.Error("one lock reported twice")
		}
		if d := th.begin(a); d != want {
			t.Errorf("right after the lock: wait %s, want %s", d, want)
		}
		clk.advance(want - time.Second)
		if d := th.begin(a); d != time.Second || th.wait(a) != time.Second {
			t.Errorf("a second before the lock ends: wait %s, want 1s", d)
		}
		clk.advance(time.Second)
		if d := th.wait(a); d != 0 {
			t.Fatalf("the lock of %s is still on: %s", want, d)
		}
	}
}

// TestThrottleSuccessResets: a success forgets the address's failures.
func TestThrottleSuccessResets(t *testing.T) {
	th, _ := testThrottle(nil)
	const a = "203.0.113.7"
	fail(t, th, a, DefaultLoginFailures-1)
	if d := th.begin(a); d != 0 {
		t.Fatalf("refused for %s", d)
	}
	th.succeeded(a)
	if th.len() != 0 {
		t.Errorf("a success left %d addresses", th.len())
	}
	fail(t, th, a, DefaultLoginFailures-1)
	if d := th.wait(a); d != 0 {
		t.Errorf("throttled for %s: the success did not reset the failures", d)
	}
	// A success forgets a lock too (the attempt that reached it was let
	// through and succeeded).
	fail(t, th, a, 1)
	th.succeeded(a)
	if d := th.wait(a); d != 0 {
		t.Errorf("throttled for %s after a success", d)
	}
}

// TestThrottleAddressesApart: one address throttled does not throttle
// another.
func TestThrottleAddressesApart(t *testing.T) {
	th, _ := testThrottle(nil)
	fail(t, th, "203.0.113.7", DefaultLoginFailures)
	if th.begin("203.0.113.7") == 0 {
		t.Fatal("not throttled")
	}
	if d := th.begin("203.0.113.8"); d != 0 {
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
		allowed int
	)
	for range 50 {
		wg.Go(func() {
			if th.begin("203.0.113.7") == 0 {
				mu.Lock()
				allowed++
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	if allowed != DefaultLoginFailures {
		t.Errorf("%d concurrent attempts let through, want %d", allowed, DefaultLoginFailures)
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
}

// TestThrottleBounded: a flood of addresses leaves at most MaxAddresses
// remembered, the most recent ones; expired ones make room first.
func TestThrottleBounded(t *testing.T) {
	th, clk := testThrottle(nil)
	for i := range 3 * DefaultLoginAddresses {
		fail(t, th, fmt.Sprintf("10.%d.%d.%d", i>>16&255, i>>8&255, i&255), 1)
		if th.len() > DefaultLoginAddresses {
			t.Fatalf("%d addresses remembered, want at most %d", th.len(), DefaultLoginAddresses)
		}
	}
	if th.len() != DefaultLoginAddresses {
		t.Errorf("%d addresses remembered, want %d", th.len(), DefaultLoginAddresses)
	}
	// The newest is still counted, the oldest forgotten.
	last := 3*DefaultLoginAddresses - 1
	newest := fmt.Sprintf("10.%d.%d.%d", last>>16&255, last>>8&255, last&255)
	fail(t, th, newest, DefaultLoginFailures-1)
	if th.wait(newest) == 0 {
		t.Error("the newest address's failures were forgotten")
	}
	if _, ok := th.m["10.0.0.0"]; ok {
		t.Error("the oldest address is still remembered")
	}
	// Once they expire, a new address sweeps them out.
	clk.advance(DefaultLoginWindow + DefaultLoginMaxDelay)
	fail(t, th, "192.0.2.1", 1)
	if th.len() != 1 {
		t.Errorf("%d addresses remembered after they expired, want 1", th.len())
	}
}

// TestClientAddr: failures count under RemoteAddr's host, IPv6 under its
// /64, never under a header the client sets.
func TestClientAddr(t *testing.T) {
	for remote, want := range map[string]string{
		"203.0.113.7:1234":           "203.0.113.7",
		"[2001:db8:1:2:3:4:5:6]:443": "2001:db8:1:2::/64",
		"[2001:db8:1:2::ffff]:80":    "2001:db8:1:2::/64",
		"[::ffff:203.0.113.7]:1":     "203.0.113.7",
		"[fe80::1%eth0]:80":          "fe80::/64",
		"[::1]:8080":                 "::/64",
		"@":                          "@",
		"":                           "",
	} {
		r, _ := http.NewRequest(http.MethodGet, "http://127.0.0.1/", nil)
		r.RemoteAddr = remote
		r.Header.Set("X-Forwarded-For", "198.51.100.1")
		r.Header.Set("X-Real-IP", "198.51.100.2")
		r.Header.Set("Forwarded", "for=198.51.100.3")
		if got := clientAddr(r); got != want {
			t.Errorf("clientAddr(%q) = %q, want %q", remote, got, want)
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
