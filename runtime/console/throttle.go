package console

import (
	"container/list"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"sync"
	"time"
)

// Defaults of LoginThrottle.
const (
	// DefaultLoginFailures is how many failed sign-ins an address may make
	// before it is throttled.
	DefaultLoginFailures = 5
	// DefaultLoginDelay is how long an address is throttled at first;
	// DefaultLoginMaxDelay caps the doubling that follows.
	DefaultLoginDelay    = time.Minute
	DefaultLoginMaxDelay = 15 * time.Minute
	// DefaultLoginWindow is how long failures are remembered.
	DefaultLoginWindow = time.Hour
	// DefaultLoginAddresses bounds the addresses remembered.
	DefaultLoginAddresses = 10000
)

// LoginThrottle slows down the guessing of Config.Token or the basic
// auth password: failed sign-ins are counted per client address, and an
// address that failed Failures times is refused with 429 Too Many
// Requests and Retry-After, its credentials not even checked, for Delay,
// doubled by each further failure up to MaxDelay. A sign-in that
// succeeds forgets the address. The zero value holds the defaults.
//
// Every failing path counts: a wrong Authorization header (bearer or
// basic), ?token= or login form, and a login cookie the console did not
// sign (it is then cleared). A request that carries no credential is no
// attempt, but from a throttled address it is refused too.
//
// The address is the host of http.Request.RemoteAddr, an IPv6 one taken
// as its /64 (one host usually holds a whole /64). The console reads no
// X-Forwarded-For or similar header: a client could set it. Behind a
// reverse proxy every client thus shares the proxy's address; a service
// that mounts the console behind one sets RemoteAddr from the header its
// proxy sets (and overwrites) before the console sees the request.
type LoginThrottle struct {
	// Failures is how many failed sign-ins an address may make before it
	// is throttled (default DefaultLoginFailures, at most 100).
	Failures int
	// Delay is how long an address is throttled by its Failures-th
	// failure (default DefaultLoginDelay); each further failure doubles
	// it, up to MaxDelay (default DefaultLoginMaxDelay). Both from 1s to
	// 24h.
	Delay, MaxDelay time.Duration
	// Window is how long an address's failures are remembered: it is
	// forgotten once it has gone Window without a failure and is no
	// longer throttled (default DefaultLoginWindow, at least 1m).
	Window time.Duration
	// MaxAddresses bounds the addresses remembered, so that a flood of
	// addresses cannot grow memory without end (default
	// DefaultLoginAddresses, at least 100): past it, the address that
	// failed least recently is forgotten.
	MaxAddresses int
}

func (l *LoginThrottle) setDefaults() {
	if l.Failures == 0 {
		l.Failures = DefaultLoginFailures
	}
	if l.Delay == 0 {
		l.Delay = DefaultLoginDelay
	}
	if l.MaxDelay == 0 {
		l.MaxDelay = max(DefaultLoginMaxDelay, l.Delay)
	}
	if l.Window == 0 {
		l.Window = DefaultLoginWindow
	}
	if l.MaxAddresses == 0 {
		l.MaxAddresses = DefaultLoginAddresses
	}
}

// validate reports every invalid setting of l (defaults applied or 0).
func (l LoginThrottle) validate() []error {
	var errs []error
	if l.Failures < 0 || l.Failures > 100 {
		errs = append(errs, fmt.Errorf("console: Config.LoginThrottle.Failures is %d: use 1 to 100 (or 0 for %d)", l.Failures, DefaultLoginFailures))
	}
	for _, d := range []struct {
		name string
		v    time.Duration
		def  time.Duration
	}{{"Delay", l.Delay, DefaultLoginDelay}, {"MaxDelay", l.MaxDelay, DefaultLoginMaxDelay}} {
		if d.v < 0 || d.v > 0 && (d.v < time.Second || d.v > 24*time.Hour) {
			errs = append(errs, fmt.Errorf("console: Config.LoginThrottle.%s is %s: use 1s to 24h (or 0 for %s)", d.name, d.v, d.def))
		}
	}
	if l.Delay > 0 && l.MaxDelay > 0 && l.MaxDelay < l.Delay {
		errs = append(errs, fmt.Errorf("console: Config.LoginThrottle.MaxDelay (%s) is shorter than Delay (%s): make it at least as long", l.MaxDelay, l.Delay))
	}
	if l.Window < 0 || l.Window > 0 && l.Window < time.Minute {
		errs = append(errs, fmt.Errorf("console: Config.LoginThrottle.Window is %s: use at least 1m (or 0 for %s)", l.Window, DefaultLoginWindow))
	}
	if l.MaxAddresses < 0 || l.MaxAddresses > 0 && l.MaxAddresses < 100 {
		errs = append(errs, fmt.Errorf("console: Config.LoginThrottle.MaxAddresses is %d: use at least 100 (or 0 for %d); fewer would let a few addresses push their own out", l.MaxAddresses, DefaultLoginAddresses))
	}
	return errs
}

// throttle counts failed sign-ins per address (see LoginThrottle).
//
// An attempt is counted as a failure when it starts (begin) and forgotten
// when it succeeds: checking first and counting after would let an
// attacker's concurrent requests all pass the check before the first
// failure is counted.
//
// golang.org/x/time/rate would fit a steady rate, not a delay that
// doubles while failures go on; and the table of addresses, which must
// be bounded anyway, is most of the work.
type throttle struct {
	lim LoginThrottle
	now func() time.Time // the clock, replaced by tests

	mu  sync.Mutex
	m   map[string]*list.Element // of *attempts, in lru
	lru list.List                // least recently attempted first
}

// attempts is what the throttle remembers of one address.
type attempts struct {
	addr     string
	failures int       // attempts counted (successes are forgotten)
	last     time.Time // when the last one began
	until    time.Time // refused until then
	lockFor  time.Duration
	logged   bool // the current lock was reported by failed
}

func newThrottle(lim LoginThrottle) *throttle {
	return &throttle{lim: lim, now: time.Now, m: map[string]*list.Element{}}
}

// expired reports whether a is to be forgotten at now: Window after its
// last attempt or the end of its lock, whichever is later (so an address
// cannot wait out a lock and find its failures forgotten).
func (a *attempts) expired(now time.Time, window time.Duration) bool {
	end := a.last
	if a.until.After(end) {
		end = a.until
	}
	return !now.Before(end.Add(window))
}

// lookup returns addr's live entry, dropping an expired one. t.mu is held.
func (t *throttle) lookup(addr string, now time.Time) (*list.Element, *attempts) {
	e, ok := t.m[addr]
	if !ok {
		return nil, nil
	}
	a := e.Value.(*attempts)
	if a.expired(now, t.lim.Window) {
		t.remove(e)
		return nil, nil
	}
	return e, a
}

func (t *throttle) remove(e *list.Element) {
	delete(t.m, e.Value.(*attempts).addr)
	t.lru.Remove(e)
}

// wait returns how long addr is still throttled (0: it is not).
func (t *throttle) wait(addr string) time.Duration {
	now := t.now()
	t.mu.Lock()
	defer t.mu.Unlock()
	if _, a := t.lookup(addr, now); a != nil && a.until.After(now) {
		return a.until.Sub(now)
	}
	return 0
}

// begin starts an attempt of addr, counting it as a failure until
// succeeded says otherwise: it returns 0, or how long addr is still
// throttled, and then the attempt must not be checked. The attempt that
// reaches Failures locks addr at once, so that none runs beside it.
func (t *throttle) begin(addr string) time.Duration {
	now := t.now()
	t.mu.Lock()
	defer t.mu.Unlock()
	e, a := t.lookup(addr, now)
	if a != nil && a.until.After(now) {
		return a.until.Sub(now)
	}
	if a == nil {
		t.prune(now)
		a = &attempts{addr: addr}
		t.m[addr] = t.lru.PushBack(a)
	} else {
		t.lru.MoveToBack(e)
	}
	a.failures++
	a.last = now
	if a.failures >= t.lim.Failures {
		d := t.lim.Delay
		for i := t.lim.Failures; i < a.failures && d < t.lim.MaxDelay; i++ {
			d *= 2
		}
		a.lockFor = min(d, t.lim.MaxDelay)
		a.until = now.Add(a.lockFor)
		a.logged = false
	}
	return 0
}

// prune makes room for one more address: it drops expired ones from the
// front (they are also dropped when looked up), then the least recently
// attempted while the table is full. t.mu is held.
func (t *throttle) prune(now time.Time) {
	for e := t.lru.Front(); e != nil && (len(t.m) >= t.lim.MaxAddresses || e.Value.(*attempts).expired(now, t.lim.Window)); e = t.lru.Front() {
		t.remove(e)
	}
}

// succeeded forgets addr: its attempt succeeded.
func (t *throttle) succeeded(addr string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if e, ok := t.m[addr]; ok {
		t.remove(e)
	}
}

// failed reports, once per lock, that addr's failed attempt left it
// throttled: ok, with its failures and the lock's length.
func (t *throttle) failed(addr string) (failures int, lockFor time.Duration, ok bool) {
	now := t.now()
	t.mu.Lock()
	defer t.mu.Unlock()
	_, a := t.lookup(addr, now)
	if a == nil || a.logged || !a.until.After(now) {
		return 0, 0, false
	}
	a.logged = true
	return a.failures, a.lockFor, true
}

// len returns the number of addresses remembered.
func (t *throttle) len() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.m)
}

// clientAddr returns the address failed sign-ins of r are counted under:
// RemoteAddr's host, an IPv6 one as its /64 prefix (an IPv4-mapped one as
// IPv4). Never a header: the client could set it.
func clientAddr(r *http.Request) string {
	host, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		host = r.RemoteAddr // e.g. "@" on a Unix socket: all share one entry
	}
	ip, err := netip.ParseAddr(host)
	if err != nil {
		return host
	}
	ip = ip.Unmap().WithZone("")
	if ip.Is6() {
		p, _ := ip.Prefix(64)
		return p.String()
	}
	return ip.String()
}

// signInBegin starts a sign-in attempt from addr (see throttle.begin);
// when addr is throttled it answers 429 and returns false.
func (h *handler) signInBegin(w http.ResponseWriter, addr string) bool {
	if d := h.throttle.begin(addr); d > 0 {
		h.tooMany(w, d)
		return false
	}
	return true
}

// signInFailed ends a failed sign-in attempt from addr, logging when it
// left addr throttled (never what was submitted).
func (h *handler) signInFailed(addr string) {
	if n, d, ok := h.throttle.failed(addr); ok {
		h.cfg.Logger.Warn("console: failed sign-ins: address throttled", "remote", addr, "failures", n, "for", d.String())
	}
}

// tooMany answers 429 to a throttled address, without looking at any
// credential it sent: a throttled attacker learns nothing.
func (h *handler) tooMany(w http.ResponseWriter, d time.Duration) {
	secs := int64((d + time.Second - 1) / time.Second)
	w.Header().Set("Retry-After", fmt.Sprint(secs))
	h.failBare(w, http.StatusTooManyRequests, "Too many failed sign-ins",
		fmt.Sprintf("Sign-ins from your address failed too often: the console checks none from it for %s. Check the token (or user name and password), then try again.", time.Duration(secs)*time.Second))
}
