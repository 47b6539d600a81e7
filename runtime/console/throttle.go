package console

import (
	"container/heap"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"strings"
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
// doubled by each further failure up to MaxDelay. The zero value holds
// the defaults.
//
// A sign-in that succeeds does not clear the failures of its address:
// clients behind one address (a NAT, a proxy) cannot be told apart, so a
// success says nothing about the failures of the others, and clearing
// them would let a guesser behind an operator's address guess on without
// end between the operator's sign-ins. Failures are forgotten Window
// after the last one (or after the lock ends) instead.
//
// Every failing path counts: a wrong Authorization header (bearer or
// basic), ?token= or login form, and a login cookie the console did not
// sign (it is then cleared). A request that carries no credential is no
// attempt, but from a throttled address it is refused too. A valid login
// cookie is accepted even from a throttled address (it cannot be
// guessed), so an operator signed in keeps working.
//
// Attempts are counted when they begin, as in flight, and as failures
// when they fail: an address may have no more attempts in flight than it
// has failures left before its lock (one at a time once it was locked),
// so concurrent requests cannot all pass the check before the first
// failure is counted, and concurrent requests that succeed lock nothing.
// One refused for that gets 429 with Retry-After 1.
//
// The address is the host of http.Request.RemoteAddr, an IPv6 one taken
// as its /64 (one host usually holds a whole /64); a RemoteAddr whose host
// is not an IP address (a Unix socket, or a header copied in whole) is
// counted under one entry shared by all such clients. The console reads
// no X-Forwarded-For or similar header: a client could set it. Behind a
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
	// DefaultLoginAddresses, at least 100). An address is forgotten only
	// once its failures expire, never to make room: while the table is
	// full of addresses that failed within Window, the addresses it does
	// not hold share one more entry, as if they were one address (the
	// same Failures, Delay and doubling), and the first such address is
	// logged.
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
		errs = append(errs, fmt.Errorf("console: Config.LoginThrottle.MaxAddresses is %d: use at least 100 (or 0 for %d); fewer would let a few addresses fill it, leaving every other address one shared limit", l.MaxAddresses, DefaultLoginAddresses))
	}
	return errs
}

// throttle counts failed sign-ins per address (see LoginThrottle).
//
// The table holds at most MaxAddresses entries, in a heap by the time
// they expire: an entry is dropped once its failures expired, never
// before (dropping one that has not would give its address a fresh
// count, and anyone holding more addresses than the table, a /48 of
// IPv6, could then guess without end by cycling through them). An address
// the full table cannot take counts under shared, one entry for all of
// them: a guesser who fills the table gets no more than MaxAddresses
// entries' worth of failures, plus those of shared, per Window, and
// memory stays bounded. The cost, under such a flood only, is that
// addresses new to the table share one limit; addresses in the table and
// operators signed in (login cookie) are not affected.
//
// golang.org/x/time/rate would fit a steady rate, not a delay that
// doubles while failures go on; and the table of addresses, which must
// be bounded anyway, is most of the work.
type throttle struct {
	lim LoginThrottle
	now func() time.Time // the clock, replaced by tests
	// log reports the first address that had to count under shared since
	// the table last had room (nil: not reported).
	log func(addr string, addresses int)

	mu       sync.Mutex
	m        map[string]*attempts
	byExpiry expiryHeap // the entries of m, soonest to expire first
	shared   attempts   // of the addresses the full table cannot take
	sharing  bool       // shared was taken since the table last had room
}

// attempts is what the throttle remembers of one address (or of all the
// addresses the full table cannot take: throttle.shared).
type attempts struct {
	addr     string
	failures int       // failed attempts (a success clears none)
	inflight int       // attempts begun and not ended
	last     time.Time // the last failure (before the first: when the entry was made)
	until    time.Time // refused until then
	lockFor  time.Duration
	index    int // in throttle.byExpiry; -1 when not in it
}

func newThrottle(lim LoginThrottle) *throttle {
	t := &throttle{lim: lim, now: time.Now, m: map[string]*attempts{}}
	t.byExpiry.window = lim.Window
	t.shared.index = -1
	return t
}

// expiry is when a is to be forgotten: Window after its last failure or
// the end of its lock, whichever is later (so an address cannot wait out
// a lock and find its failures forgotten).
func (a *attempts) expiry(window time.Duration) time.Time {
	end := a.last
	if a.until.After(end) {
		end = a.until
	}
	return end.Add(window)
}

// expire forgets a's failures when they expired at now: a table entry
// with no attempt in flight is dropped, any other keeps its attempts in
// flight only. t.mu is held.
func (t *throttle) expire(a *attempts, now time.Time) {
	if now.Before(a.expiry(t.lim.Window)) {
		return
	}
	a.failures, a.last, a.until, a.lockFor = 0, now, time.Time{}, 0
	switch {
	case a == &t.shared:
	case a.inflight == 0:
		t.remove(a)
	default:
		heap.Fix(&t.byExpiry, a.index)
	}
}

func (t *throttle) remove(a *attempts) {
	delete(t.m, a.addr)
	heap.Remove(&t.byExpiry, a.index)
}

// lookup returns addr's live entry, or nil. t.mu is held.
func (t *throttle) lookup(addr string, now time.Time) *attempts {
	a := t.m[addr]
	if a == nil {
		return nil
	}
	t.expire(a, now)
	if t.m[addr] != a {
		return nil
	}
	return a
}

// room drops the entries that expired and reports whether the table can
// take one more address. t.mu is held.
func (t *throttle) room(now time.Time) bool {
	for len(t.byExpiry.a) > 0 && !now.Before(t.byExpiry.a[0].expiry(t.lim.Window)) {
		t.expire(t.byExpiry.a[0], now) // dropped, or moved on a Window
	}
	return len(t.m) < t.lim.MaxAddresses
}

// entry returns the entry the attempts of addr count under: its own,
// made when the table has room, or else shared; first reports the first
// time shared is taken since the table last had room. t.mu is held.
func (t *throttle) entry(addr string, now time.Time) (a *attempts, first bool) {
	if a := t.lookup(addr, now); a != nil {
		return a, false
	}
	if t.room(now) {
		t.sharing = false
		a := &attempts{addr: addr, last: now}
		t.m[addr] = a
		heap.Push(&t.byExpiry, a)
		return a, false
	}
	t.expire(&t.shared, now)
	first = !t.sharing
	t.sharing = true
	return &t.shared, first
}

// wait returns how long addr is still throttled (0: it is not), for a
// request that carries no credential: no entry is made for it.
func (t *throttle) wait(addr string) time.Duration {
	now := t.now()
	t.mu.Lock()
	defer t.mu.Unlock()
	a := t.lookup(addr, now)
	if a == nil {
		if t.room(now) {
			return 0
		}
		a = &t.shared
		t.expire(a, now)
	}
	if a.until.After(now) {
		return a.until.Sub(now)
	}
	return 0
}

// begin starts an attempt of addr. It returns the entry the attempt
// counts under, to end it with succeeded or failed; or nil when addr is
// throttled, and then the attempt must not be checked: for how long,
// and whether by a lock (else by its attempts in flight, for a second).
func (t *throttle) begin(addr string) (a *attempts, wait time.Duration, locked bool) {
	now := t.now()
	t.mu.Lock()
	a, first := t.entry(addr, now)
	switch {
	case a.until.After(now):
		a, wait, locked = nil, a.until.Sub(now), true
	case a.inflight >= max(1, t.lim.Failures-a.failures):
		// The attempts in flight might all fail: no more than the
		// failures left before the lock (one at a time after it).
		a, wait = nil, time.Second
	default:
		a.inflight++
	}
	n := len(t.m)
	t.mu.Unlock()
	if first && t.log != nil {
		t.log(addr, n)
	}
	return a, wait, locked
}

// succeeded ends an attempt that succeeded: it clears no failure, and
// the address is forgotten if it has none.
func (t *throttle) succeeded(a *attempts) {
	t.mu.Lock()
	defer t.mu.Unlock()
	a.inflight--
	if a != &t.shared && a.failures == 0 && a.inflight == 0 {
		t.remove(a)
	}
}

// failed ends an attempt that failed and counts it. When the failure
// locks the entry it reports ok, with its failures and the lock's length
// (every such failure starts a lock: no attempt runs beside one that may
// reach it).
func (t *throttle) failed(a *attempts) (failures int, lockFor time.Duration, ok bool) {
	now := t.now()
	t.mu.Lock()
	defer t.mu.Unlock()
	a.inflight--
	a.failures++
	a.last = now
	if a.failures >= t.lim.Failures {
		d := t.lim.Delay
		for i := t.lim.Failures; i < a.failures && d < t.lim.MaxDelay; i++ {
			d *= 2
		}
		a.lockFor = min(d, t.lim.MaxDelay)
		a.until = now.Add(a.lockFor)
		ok = true
	}
	if a != &t.shared {
		heap.Fix(&t.byExpiry, a.index)
	}
	return a.failures, a.lockFor, ok
}

// len returns the number of addresses remembered (shared not counted).
func (t *throttle) len() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.m)
}

// expiryHeap orders entries by expiry, soonest first (container/heap).
type expiryHeap struct {
	a      []*attempts
	window time.Duration
}

func (h *expiryHeap) Len() int { return len(h.a) }
func (h *expiryHeap) Less(i, j int) bool {
	return h.a[i].expiry(h.window).Before(h.a[j].expiry(h.window))
}
func (h *expiryHeap) Swap(i, j int) {
	h.a[i], h.a[j] = h.a[j], h.a[i]
	h.a[i].index, h.a[j].index = i, j
}
func (h *expiryHeap) Push(x any) {
	a := x.(*attempts)
	a.index = len(h.a)
	h.a = append(h.a, a)
}
func (h *expiryHeap) Pop() any {
	a := h.a[len(h.a)-1]
	h.a[len(h.a)-1] = nil
	h.a = h.a[:len(h.a)-1]
	a.index = -1
	return a
}

// unparsedAddr is the entry of every client whose RemoteAddr holds no IP
// address: one entry, so that such a client can neither pick a fresh
// entry per request nor make the table hold keys of its choosing.
const unparsedAddr = "unparsed"

// clientAddr returns the address failed sign-ins of r are counted under:
// RemoteAddr's host, an IPv6 one as its /64 prefix (an IPv4-mapped one as
// IPv4), or unparsedAddr when it is no IP address (e.g. "@" on a Unix
// socket, or a list of addresses a proxy header was copied from). Never a
// header: the client could set it.
func clientAddr(r *http.Request) string {
	ra := r.RemoteAddr
	if len(ra) > 128 { // longer than any IP address and port
		return unparsedAddr
	}
	host, _, err := net.SplitHostPort(ra)
	if err != nil {
		host = strings.TrimSuffix(strings.TrimPrefix(ra, "["), "]") // an address without port
	}
	ip, err := netip.ParseAddr(host)
	if err != nil {
		return unparsedAddr
	}
	ip = ip.Unmap().WithZone("")
	if ip.Is6() {
		p, _ := ip.Prefix(64)
		return p.String()
	}
	return ip.String()
}

// signInAddr returns clientAddr(r), logging the first RemoteAddr that is
// no IP address (cut short, quoted by the logger).
func (h *handler) signInAddr(r *http.Request) string {
	addr := clientAddr(r)
	if addr == unparsedAddr && h.unparsedLogged.CompareAndSwap(false, true) {
		ra := r.RemoteAddr
		if len(ra) > 64 {
			ra = ra[:64] + "..."
		}
		h.cfg.Logger.Warn("console: a client address is not an IP address: the failed sign-ins of all such clients are counted together (set http.Request.RemoteAddr to one IP address, or host:port)", "remote_addr", ra)
	}
	return addr
}

// signInBegin starts a sign-in attempt from addr (see throttle.begin);
// when addr is throttled it answers 429 and returns nil.
func (h *handler) signInBegin(w http.ResponseWriter, addr string) *attempts {
	a, d, locked := h.throttle.begin(addr)
	if a == nil {
		h.tooMany(w, d, locked)
	}
	return a
}

// signInFailed ends a failed sign-in attempt from addr, counted under a,
// logging when it left a throttled (never what was submitted).
func (h *handler) signInFailed(a *attempts, addr string) {
	n, d, ok := h.throttle.failed(a)
	switch {
	case !ok:
	case a == &h.throttle.shared:
		h.cfg.Logger.Warn("console: failed sign-ins: every address the full throttle table does not hold throttled", "remote", addr, "failures", n, "for", d.String())
	default:
		h.cfg.Logger.Warn("console: failed sign-ins: address throttled", "remote", addr, "failures", n, "for", d.String())
	}
}

// tooMany answers 429 to a throttled address, without looking at any
// credential it sent: a throttled attacker learns nothing. locked: by a
// lock (else by its attempts in flight).
func (h *handler) tooMany(w http.ResponseWriter, d time.Duration, locked bool) {
	secs := int64((d + time.Second - 1) / time.Second)
	w.Header().Set("Retry-After", fmt.Sprint(secs))
	if !locked {
		h.failBare(w, http.StatusTooManyRequests, "Too many sign-ins at once",
			"Sign-ins from your address failed before, and others from it are being checked right now: the console checks no more at once. Try again in a second.")
		return
	}
	h.failBare(w, http.StatusTooManyRequests, "Too many failed sign-ins",
		fmt.Sprintf("Sign-ins from your address failed too often: the console checks none from it for %s. Check the token (or user name and password), then try again.", time.Duration(secs)*time.Second))
}
