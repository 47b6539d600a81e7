// Package console is the outbox console: an http.Handler with the pages
// an operator on call opens (overview, FAILED events, one event, keys held
// back, inboxes, search) and the actions they take (requeue, replay,
// delete a FAILED event), over a runtime/admin Admin.
//
// The pages are rendered on the server from html/template, with a small
// embedded stylesheet and script (no build step): every page is complete
// without JavaScript, which only refreshes the overview. `outboxgen
// console` serves it on loopback; a service can mount it behind its own
// authentication:
//
//	h, err := console.New(console.Config{Admin: adm, BasePath: "/outbox/", ReadOnly: !isAdmin})
//	mux.Handle("/outbox/", requireOperator(h))
//
// Security: without a token or basic authentication the console answers
// to the host names localhost, 127.0.0.1 and [::1] only (and those in
// Config.AllowedHosts), before anything else, so that a web page whose
// host name is re-pointed at this machine (DNS rebinding) cannot read or
// act on it; Config.Token or Config.BasicAuthUser/Password protect every
// request (compared in constant time), and a request is authenticated
// before any page shows the database or sets a session. Failed sign-ins
// are throttled per client address (Config.LoginThrottle): after 5, the
// address is refused with 429 for a minute, doubled by each further
// failure up to 15 minutes, its credentials not even checked; a success
// clears none of them, and a login cookie (set by a token or basic auth
// sign-in) keeps working from a throttled address. Every
// action goes through a confirmation page and runs in one transaction
// (admin.Selection.OneTransaction) on exactly the events the confirmation
// counted (their count and a digest of their ids ride in its form; when
// they changed, nothing is changed and the confirmation is shown again),
// and says what it changed, including the held-back events it released.
// POSTs need a same-origin request (http.CrossOriginProtection) and a
// per-session synchronizer token; ReadOnly offers and accepts no action. Every response carries a strict Content-Security-Policy (no
// inline script or style), X-Frame-Options DENY, nosniff, no-referrer and
// no-store. Requests are bounded: body size, query length, page size and
// each statement's time.
package console

import (
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/outboxgen/outboxgen/runtime/admin"
)

// Defaults and bounds.
const (
	// DefaultWindow is the span of the overview's charts.
	DefaultWindow = 3 * time.Hour
	// MaxWindow is the longest chart span (one bar per minute).
	MaxWindow = 24 * time.Hour
	// DefaultRefresh is the overview's live refresh period.
	DefaultRefresh = 5 * time.Second
	// DefaultStatementTimeout bounds every database statement a request
	// runs.
	DefaultStatementTimeout = 5 * time.Second
	// DefaultPageSize and MaxPageSize bound the rows of a list page
	// (?limit=).
	DefaultPageSize = 50
	MaxPageSize     = 500
	// MaxBodyBytes bounds a POST body; MaxQueryBytes a request's query
	// string; MaxParamBytes one query or form value.
	MaxBodyBytes  = 256 << 10
	MaxQueryBytes = 8 << 10
	MaxParamBytes = 1024
	// MaxPayloadDisplay is how much of a payload or headers the event page
	// shows; the rest is cut with a note.
	MaxPayloadDisplay = 256 << 10
	// MinTokenLen is the shortest Config.Token New accepts.
	MinTokenLen = 16
)

// Config configures the console; New applies the defaults and validates
// it.
type Config struct {
	// Admin runs the queries and actions (required).
	Admin *admin.Admin
	// ReadOnly offers no action and refuses every POST with 403.
	ReadOnly bool
	// BasePath is where the handler is mounted, e.g. "/outbox/" (default
	// "/"): every link and redirect stays under it. Mount the handler at
	// BasePath (mux.Handle("/outbox/", h)); a handler behind
	// http.StripPrefix works too.
	BasePath string
	// Token, when set, is required by every request: as "Authorization:
	// Bearer <token>", or once as ?token= or through the login form, which
	// set an HttpOnly, SameSite=Strict cookie holding an HMAC of it (the
	// token itself never appears in a page, a URL after login, or a log
	// line). At least MinTokenLen characters.
	Token string
	// BasicAuthUser and BasicAuthPassword, when set, require HTTP basic
	// authentication instead of a token (not both). A request with the
	// right credentials gets the same kind of login cookie as a token
	// sign-in (an HMAC of the user name and password), which later
	// requests are let in by before their Authorization header is looked
	// at: an operator signed in keeps working from an address throttled
	// for failed sign-ins (see LoginThrottle).
	BasicAuthUser, BasicAuthPassword string
	// Database describes what the console is connected to, for the page
	// header: a description without credentials (a password in it is
	// masked anyway, see runtime/redact).
	Database string
	// StaleAfter is the age past which a pending row counts as stale
	// (default admin.DefaultStaleAfter).
	StaleAfter time.Duration
	// Window is the span of the overview's charts (default DefaultWindow,
	// at most MaxWindow).
	Window time.Duration
	// Refresh is the overview's live refresh period (default
	// DefaultRefresh; at least a second).
	Refresh time.Duration
	// StatementTimeout bounds every statement a request runs (default
	// DefaultStatementTimeout).
	StatementTimeout time.Duration
	// AllowedHosts lists the host names (without port) the console answers
	// to besides localhost, 127.0.0.1 and [::1], which it always answers
	// to; "*" allows any host. Any other Host header is refused with 421
	// Misdirected Request before anything else is done.
	//
	// Without a token or basic authentication the default (nil) allows
	// the loopback names only: a web page whose host name is re-pointed
	// at 127.0.0.1 (DNS rebinding) would otherwise be same-origin with the
	// console and could read its pages and act. A service that mounts the
	// console behind its own authentication and its own host names lists
	// those names (e.g. []string{"ops.example.com"}) or []string{"*"}.
	// With a token or basic authentication the default allows any host
	// (a rebound page carries no credential); set AllowedHosts to check
	// the Host header anyway.
	AllowedHosts []string
	// SecureCookies marks the console's cookies Secure even on plain
	// HTTP requests: set it when the console is served over HTTPS by a
	// TLS-terminating proxy (requests that reach the console over TLS get
	// Secure cookies anyway). With BasePath "/" the cookies are then named
	// with the __Host- prefix, which browsers bind to this host and path.
	SecureCookies bool
	// LoginThrottle slows down the guessing of Token or the basic auth
	// password (see LoginThrottle; the zero value holds the defaults).
	LoginThrottle LoginThrottle
	// Logger receives errors, one line per action taken (what it matched
	// and changed, from which address), one per address throttled for
	// failed sign-ins, one when the throttle's table is full and one for
	// the first client address that is no IP address (default
	// slog.Default()); credentials never reach it.
	Logger *slog.Logger
}

func (c *Config) setDefaults() {
	if c.BasePath == "" {
		c.BasePath = "/"
	}
	if !strings.HasPrefix(c.BasePath, "/") {
		c.BasePath = "/" + c.BasePath
	}
	if !strings.HasSuffix(c.BasePath, "/") {
		c.BasePath += "/"
	}
	if c.StaleAfter == 0 {
		c.StaleAfter = admin.DefaultStaleAfter
	}
	if c.Window == 0 {
		c.Window = DefaultWindow
	}
	if c.Refresh == 0 {
		c.Refresh = DefaultRefresh
	}
	if c.StatementTimeout == 0 {
		c.StatementTimeout = DefaultStatementTimeout
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	c.LoginThrottle.setDefaults()
}

// Validate reports every invalid setting, joined, each saying how to fix
// it.
func (c Config) Validate() error {
	var errs []error
	if c.Admin == nil {
		errs = append(errs, errors.New("console: Config.Admin is nil: pass admin.New(driver)"))
	}
	if c.BasePath == "" || c.BasePath[0] != '/' || c.BasePath[len(c.BasePath)-1] != '/' || strings.Contains(c.BasePath, "//") ||
		strings.ContainsAny(c.BasePath, "?#\"'<>\\ %") || strings.Contains(c.BasePath, "/../") || strings.Contains(c.BasePath, "/./") {
		errs = append(errs, fmt.Errorf("console: Config.BasePath %q: use a clean absolute path such as /outbox/ (letters, digits, '-', '_', '.', '/')", c.BasePath))
	}
	if c.Token != "" && (c.BasicAuthUser != "" || c.BasicAuthPassword != "") {
		errs = append(errs, errors.New("console: both Config.Token and basic auth are set: use one of them"))
	}
	if c.Token != "" && len(c.Token) < MinTokenLen {
		errs = append(errs, fmt.Errorf("console: Config.Token has %d characters: use at least %d random ones (e.g. openssl rand -hex 16)", len(c.Token), MinTokenLen))
	}
	if (c.BasicAuthUser == "") != (c.BasicAuthPassword == "") {
		errs = append(errs, errors.New("console: set both Config.BasicAuthUser and Config.BasicAuthPassword, or neither"))
	}
	if strings.Contains(c.BasicAuthUser, ":") {
		errs = append(errs, errors.New("console: Config.BasicAuthUser holds ':', which basic authentication cannot carry: choose another user name"))
	}
	if c.StaleAfter < 0 {
		errs = append(errs, fmt.Errorf("console: Config.StaleAfter is %s: use a positive duration (or 0 for %s)", c.StaleAfter, admin.DefaultStaleAfter))
	}
	if c.Window < 0 || c.Window > MaxWindow || (c.Window > 0 && c.Window < time.Minute) {
		errs = append(errs, fmt.Errorf("console: Config.Window is %s: use 1m to %s (or 0 for %s)", c.Window, MaxWindow, DefaultWindow))
	}
	if c.Refresh < 0 || (c.Refresh > 0 && c.Refresh < time.Second) {
		errs = append(errs, fmt.Errorf("console: Config.Refresh is %s: use at least 1s (or 0 for %s)", c.Refresh, DefaultRefresh))
	}
	if c.StatementTimeout < 0 {
		errs = append(errs, fmt.Errorf("console: Config.StatementTimeout is %s: use a positive duration (or 0 for %s)", c.StatementTimeout, DefaultStatementTimeout))
	}
	for _, hn := range c.AllowedHosts {
		bare := strings.Trim(hn, "[]")
		if hn == "" || strings.ContainsAny(hn, "/?#@ \t") || strings.Contains(hn, ":") && net.ParseIP(bare) == nil {
			errs = append(errs, fmt.Errorf("console: Config.AllowedHosts holds %q: list host names without scheme or port, such as ops.example.com, or \"*\"", hn))
		}
	}
	errs = append(errs, c.LoginThrottle.validate()...)
	if c.Logger == nil {
		errs = append(errs, errors.New("console: Config.Logger is nil: set it, or leave it nil before New to use slog.Default()"))
	}
	return errors.Join(errs...)
}

// CheckListen refuses to serve the console on a listen address other
// than loopback unless c requires a token or basic authentication: without
// them anyone who reaches the address could requeue, replay and delete
// events. Not loopback: an empty host, 0.0.0.0, ::, any other address, or
// a host name that does not resolve to loopback addresses only (looked up
// within ctx). The error says why, not what to do instead: callers know
// their own options (outboxgen console names its flags).
func (c Config) CheckListen(ctx context.Context, addr string) error {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("%q: use host:port, e.g. 127.0.0.1:8080", addr)
	}
	if c.Token != "" || (c.BasicAuthUser != "" && len(c.BasicAuthPassword) >= MinTokenLen) {
		return nil
	}
	ok, why := loopback(ctx, host)
	switch {
	case ok:
		return nil
	case c.BasicAuthUser != "":
		// Failed sign-ins are throttled per address only: a short
		// password could still be guessed online from many addresses,
		// as a short token could.
		return fmt.Errorf("%s: %s, and the basic auth password has %d characters: use at least %d random ones off loopback", addr, why, len(c.BasicAuthPassword), MinTokenLen)
	}
	return fmt.Errorf("%s: %s, and the console has no authentication: anyone who reaches it could requeue and delete events", addr, why)
}

// loopback reports whether host names loopback addresses only, and if
// not, why.
func loopback(ctx context.Context, host string) (bool, string) {
	if host == "" {
		return false, "an empty host listens on every interface"
	}
	if ip := net.ParseIP(strings.Trim(host, "[]")); ip != nil {
		if ip.IsLoopback() {
			return true, ""
		}
		if ip.IsUnspecified() {
			return false, host + " listens on every interface"
		}
		return false, host + " is not a loopback address"
	}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	addrs, err := net.DefaultResolver.LookupIPAddr(ctx, host)
	if err != nil || len(addrs) == 0 {
		return false, host + " does not resolve"
	}
	for _, a := range addrs {
		if !a.IP.IsLoopback() {
			return false, host + " resolves to " + a.IP.String() + ", not a loopback address"
		}
	}
	return true, ""
}

// handler is the console.
type handler struct {
	cfg     Config
	adm     *admin.Admin
	base    string
	secret  []byte // signs session, CSRF and login cookies; new per handler
	pages   *pages
	cop     *http.CrossOriginProtection
	flashes flashes
	charts  chartCache
	// authMAC is the login cookie's value: an HMAC of Token, or of the
	// basic auth user name and password (so that other credentials,
	// under the same secret, would not take it).
	authMAC string
	// throttle counts failed sign-ins per client address.
	throttle *throttle
	// unparsedLogged: a RemoteAddr that is no IP address was logged.
	unparsedLogged atomic.Bool
	// The cookies' names (with the __Host- prefix when SecureCookies and
	// BasePath is "/").
	sessionCookie, authCookie string
}

// New returns the console's handler, or an error naming every invalid
// setting of cfg.
func New(cfg Config) (http.Handler, error) {
	cfg.setDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	secret := make([]byte, 32)
	if _, err := rand.Read(secret); err != nil {
		return nil, fmt.Errorf("console: read random secret: %w", err)
	}
	p, err := parsePages()
	if err != nil {
		return nil, err
	}
	h := &handler{
		cfg:    cfg,
		adm:    cfg.Admin.WithStatementTimeout(cfg.StatementTimeout),
		base:   cfg.BasePath,
		secret: secret,
		pages:  p,
		cop:    http.NewCrossOriginProtection(),
		// One per handler, as its secret: a restart forgets failures as
		// it signs everyone out.
		throttle: newThrottle(cfg.LoginThrottle),
	}
	h.flashes.m = map[string]flash{}
	h.sessionCookie, h.authCookie = sessionCookie, authCookie
	if cfg.SecureCookies && cfg.BasePath == "/" {
		h.sessionCookie, h.authCookie = "__Host-"+sessionCookie, "__Host-"+authCookie
	}
	h.authMAC = h.loginMAC()
	h.throttle.log = func(addr string, addresses int) {
		cfg.Logger.Warn("console: failed sign-ins: the throttle table is full of addresses that failed within its window; addresses it does not hold share one limit until one expires",
			"remote", addr, "addresses", addresses)
	}
	h.cop.SetDenyHandler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h.failBare(w, http.StatusForbidden, "Cross-origin request refused",
			"This action came from another site (or the browser said so), so nothing was changed. Open the console itself and act from its pages.")
	}))
	return h, nil
}

// mac returns the base64 HMAC of purpose and value under the handler's
// secret.
func (h *handler) mac(purpose, value string) string {
	m := hmac.New(sha256.New, h.secret)
	m.Write([]byte(purpose))
	m.Write([]byte{0})
	m.Write([]byte(value))
	return base64.RawURLEncoding.EncodeToString(m.Sum(nil))
}

// loginMAC returns the login cookie's value: an HMAC of the token, or of
// the basic auth user name and password, so that a cookie set for other
// credentials is no longer taken (nor one of another handler: another
// secret). "" without authentication.
func (h *handler) loginMAC() string {
	switch {
	case h.cfg.Token != "":
		return h.mac("auth", h.cfg.Token)
	case h.cfg.BasicAuthUser != "":
		// The user name holds no ':' (Validate): the pair is unambiguous.
		return h.mac("auth-basic", h.cfg.BasicAuthUser+":"+h.cfg.BasicAuthPassword)
	}
	return ""
}

// equal compares secrets in constant time (also in their length: both are
// hashed first).
func equal(a, b string) bool {
	ha, hb := sha256.Sum256([]byte(a)), sha256.Sum256([]byte(b))
	return subtle.ConstantTimeCompare(ha[:], hb[:]) == 1
}

const (
	sessionCookie = "outbox_console_session"
	authCookie    = "outbox_console_auth"
)

// ServeHTTP routes a request under BasePath.
func (h *handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	hd := w.Header()
	hd.Set("Content-Security-Policy", "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'; object-src 'none'")
	hd.Set("X-Content-Type-Options", "nosniff")
	hd.Set("Referrer-Policy", "no-referrer")
	hd.Set("X-Frame-Options", "DENY")
	hd.Set("Cache-Control", "no-store")

	if !h.hostAllowed(r.Host) {
		h.failBare(w, http.StatusMisdirectedRequest, "Host not allowed",
			"This console answers to localhost, 127.0.0.1 and [::1] only (and the host names its configuration allows), not to the host name this request named: a page of another site re-pointed at this address must not reach it. Open the console at http://127.0.0.1 with its port, or list the host name in its allowed hosts (outboxgen console --allowed-host, console.Config.AllowedHosts).")
		return
	}
	rest, ok := strings.CutPrefix(r.URL.Path, h.base)
	if !ok {
		// Behind http.StripPrefix: the path is already relative.
		rest = strings.TrimPrefix(r.URL.Path, "/")
		if r.URL.Path == strings.TrimSuffix(h.base, "/") {
			rest = ""
		}
	}
	if len(r.URL.RawQuery) > MaxQueryBytes {
		h.failBare(w, http.StatusRequestURITooLong, "Query too long", fmt.Sprintf("The query string has %d bytes; the console takes at most %d.", len(r.URL.RawQuery), MaxQueryBytes))
		return
	}
	q, err := url.ParseQuery(r.URL.RawQuery)
	if err != nil {
		h.failBare(w, http.StatusBadRequest, "Bad query", "The query string cannot be parsed: "+err.Error())
		return
	}
	for k, vs := range q {
		for _, v := range vs {
			if len(v) > MaxParamBytes || len(k) > MaxParamBytes {
				h.failBare(w, http.StatusRequestURITooLong, "Parameter too long", fmt.Sprintf("A query parameter has more than %d bytes.", MaxParamBytes))
				return
			}
		}
	}

	if strings.HasPrefix(rest, "assets/") {
		h.asset(w, r, strings.TrimPrefix(rest, "assets/"))
		return
	}
	if !h.authenticate(w, r, rest, q) {
		return
	}
	if r.Method == http.MethodPost {
		h.cop.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { h.post(w, r, rest) })).ServeHTTP(w, r)
		return
	}
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		w.Header().Set("Allow", "GET, HEAD, POST")
		h.fail(w, r, http.StatusMethodNotAllowed, "Method not allowed", "The console answers GET and POST only.")
		return
	}
	switch {
	case rest == "":
		h.overview(w, r, q)
	case rest == "failed":
		h.failed(w, r, q)
	case strings.HasPrefix(rest, "events/"):
		h.event(w, r, strings.TrimPrefix(rest, "events/"))
	case rest == "blocked":
		h.blocked(w, r, q)
	case rest == "inbox":
		h.inbox(w, r, q)
	case rest == "search":
		h.search(w, r, q)
	default:
		h.fail(w, r, http.StatusNotFound, "Not found", "There is no console page at this address.")
	}
}

// hostAllowed reports whether the console answers to the request's Host
// header (see Config.AllowedHosts).
func (h *handler) hostAllowed(hostport string) bool {
	if len(h.cfg.AllowedHosts) == 0 && (h.cfg.Token != "" || h.cfg.BasicAuthUser != "") {
		return true
	}
	host := hostport
	if hn, _, err := net.SplitHostPort(hostport); err == nil {
		host = hn
	}
	host = strings.TrimSuffix(strings.ToLower(strings.Trim(host, "[]")), ".")
	switch host {
	case "localhost", "127.0.0.1", "::1":
		return true
	}
	for _, a := range h.cfg.AllowedHosts {
		if a == "*" || strings.TrimSuffix(strings.ToLower(strings.Trim(a, "[]")), ".") == host {
			return true
		}
	}
	return false
}

// post routes a POST after the cross-origin check: read-only mode,
// body bound, synchronizer token.
func (h *handler) post(w http.ResponseWriter, r *http.Request, rest string) {
	if rest == "login" {
		h.login(w, r)
		return
	}
	if h.cfg.ReadOnly {
		h.fail(w, r, http.StatusForbidden, "Read-only console", "This console is read-only: it changes nothing. Use the outboxgen command, or a console started without read-only mode.")
		return
	}
	r.Body = http.MaxBytesReader(w, r.Body, MaxBodyBytes)
	if err := r.ParseForm(); err != nil {
		var tooBig *http.MaxBytesError
		if errors.As(err, &tooBig) {
			h.fail(w, r, http.StatusRequestEntityTooLarge, "Request too large", fmt.Sprintf("The form has more than %d bytes: select fewer events, or act on a filter.", MaxBodyBytes))
			return
		}
		h.fail(w, r, http.StatusBadRequest, "Bad form", "The form cannot be parsed: "+err.Error())
		return
	}
	for k, vs := range r.PostForm {
		for _, v := range vs {
			if len(v) > MaxParamBytes || len(k) > MaxParamBytes {
				h.fail(w, r, http.StatusRequestEntityTooLarge, "Field too long", fmt.Sprintf("A form field has more than %d bytes.", MaxParamBytes))
				return
			}
		}
	}
	sess := h.session(r)
	tok := r.PostForm.Get("csrf")
	if sess == "" || tok == "" || !equal(tok, h.mac("csrf", sess)) {
		h.fail(w, r, http.StatusForbidden, "Form expired or forged",
			"This action did not carry the console's form token for your session (it came from another page, an old tab, or the session cookie is missing), so nothing was changed. Reload the page and try again.")
		return
	}
	switch rest {
	case "actions/requeue":
		h.act(w, r, actRequeue)
	case "actions/replay":
		h.act(w, r, actReplay)
	case "actions/delete":
		h.act(w, r, actDelete)
	default:
		h.fail(w, r, http.StatusNotFound, "Not found", "There is no console action at this address.")
	}
}

// session returns the request's valid session id, or "".
func (h *handler) session(r *http.Request) string {
	c, err := r.Cookie(h.sessionCookie)
	if err != nil {
		return ""
	}
	id, sig, ok := strings.Cut(c.Value, ".")
	if !ok || len(id) != 22 || !equal(sig, h.mac("session", id)) {
		return ""
	}
	return id
}

// ensureSession returns the request's session id, setting a new session
// cookie when it has none.
func (h *handler) ensureSession(w http.ResponseWriter, r *http.Request) string {
	if s := h.session(r); s != "" {
		return s
	}
	b := make([]byte, 16)
	_, _ = rand.Read(b)
	id := base64.RawURLEncoding.EncodeToString(b)
	http.SetCookie(w, &http.Cookie{Name: h.sessionCookie, Value: id + "." + h.mac("session", id), Path: h.base,
		HttpOnly: true, SameSite: http.SameSiteStrictMode, Secure: h.secure(r)})
	return id
}

// authenticate reports whether r may proceed; when not, it has answered.
//
// Every credential checked is a sign-in attempt of the client's address
// (see LoginThrottle): begun before the check, which a throttled address
// never reaches, and ended as succeeded or failed after it. A valid login
// cookie is no attempt: it is an HMAC under the handler's random secret,
// which no one can guess, so it is accepted even from a throttled address
// and an operator signed in behind the address an attacker shares (a NAT,
// a proxy) keeps working.
func (h *handler) authenticate(w http.ResponseWriter, r *http.Request, rest string, q url.Values) bool {
	if h.cfg.BasicAuthUser == "" && h.cfg.Token == "" {
		return true
	}
	addr := h.signInAddr(r)
	if h.cfg.BasicAuthUser != "" {
		return h.authenticateBasic(w, r, addr)
	}
	if a := r.Header.Get("Authorization"); a != "" {
		att := h.signInBegin(w, addr)
		if att == nil {
			return false
		}
		if t, ok := strings.CutPrefix(a, "Bearer "); ok && equal(t, h.cfg.Token) {
			h.throttle.succeeded(att)
			return true
		}
		h.signInFailed(att, addr)
		w.Header().Set("WWW-Authenticate", `Bearer realm="outbox console"`)
		h.failBare(w, http.StatusUnauthorized, "Wrong token", "The Authorization header does not carry the console's token.")
		return false
	}
	cookieOK, badCookie := h.authCookieValid(r)
	if badCookie {
		// A cookie this handler did not sign: forged, or left by an earlier
		// process. It counts once, then goes, so that the tabs of an
		// operator do not lock their address out after a restart.
		att := h.signInBegin(w, addr)
		if att == nil {
			return false
		}
		h.signInFailed(att, addr)
		h.clearAuthCookie(w, r)
	}
	if q.Has("token") && r.Method == http.MethodGet {
		// The token never stays in the address bar (nor the history):
		// answer with the URL without it, also when the cookie is
		// already valid (the token is then not looked at).
		if !cookieOK {
			att := h.signInBegin(w, addr)
			if att == nil {
				return false
			}
			if !equal(q.Get("token"), h.cfg.Token) {
				h.signInFailed(att, addr)
				h.loginPage(w, r, http.StatusUnauthorized, "That token is not the console's token.", rest)
				return false
			}
			h.throttle.succeeded(att)
			h.setAuthCookie(w, r)
		}
		q.Del("token")
		if !validNext(rest) {
			rest = "" // e.g. "//elsewhere": never redirect off the console
		}
		target := h.base + rest
		if len(q) > 0 {
			target += "?" + q.Encode()
		}
		http.Redirect(w, r, target, http.StatusSeeOther)
		return false
	}
	if cookieOK {
		return true
	}
	if r.Method == http.MethodPost && rest == "login" {
		return true // login checks the form's token, throttled
	}
	if d := h.throttle.wait(addr); d > 0 && !badCookie {
		h.tooMany(w, d, true) // the attempt checked gets its answer first
		return false
	}
	w.Header().Set("WWW-Authenticate", `Bearer realm="outbox console"`)
	h.loginPage(w, r, http.StatusUnauthorized, "", rest)
	return false
}

// authenticateBasic is authenticate with basic auth. The login cookie
// comes first: a browser sends its basic credentials with every request,
// and the cookie lets those of an operator signed in through while their
// address is throttled (the credentials are then not looked at). Right
// credentials set the cookie.
func (h *handler) authenticateBasic(w http.ResponseWriter, r *http.Request, addr string) bool {
	cookieOK, badCookie := h.authCookieValid(r)
	if cookieOK {
		return true
	}
	if r.Header.Get("Authorization") == "" {
		if badCookie {
			// As with a token: a cookie this handler did not sign counts
			// once, then goes.
			att := h.signInBegin(w, addr)
			if att == nil {
				return false
			}
			h.signInFailed(att, addr)
			h.clearAuthCookie(w, r)
		} else if d := h.throttle.wait(addr); d > 0 {
			// No attempt: the browser would ask for credentials now.
			h.tooMany(w, d, true)
			return false
		}
		h.basicChallenge(w)
		return false
	}
	// With credentials, a cookie this handler did not sign (left by an
	// earlier process) is replaced or cleared, not counted: the request is
	// one attempt, judged by its credentials.
	att := h.signInBegin(w, addr)
	if att == nil {
		return false
	}
	u, p, ok := r.BasicAuth()
	// Evaluate both comparisons, always.
	uok, pok := equal(u, h.cfg.BasicAuthUser), equal(p, h.cfg.BasicAuthPassword)
	if ok && uok && pok {
		h.throttle.succeeded(att)
		h.setAuthCookie(w, r)
		return true
	}
	h.signInFailed(att, addr)
	if badCookie {
		h.clearAuthCookie(w, r)
	}
	h.basicChallenge(w)
	return false
}

// authCookieValid reports whether r carries the login cookie this handler
// signs (ok), or another one (bad).
func (h *handler) authCookieValid(r *http.Request) (ok, bad bool) {
	c, err := r.Cookie(h.authCookie)
	if err != nil {
		return false, false
	}
	ok = equal(c.Value, h.authMAC)
	return ok, !ok
}

// basicChallenge answers 401, asking for basic auth credentials.
func (h *handler) basicChallenge(w http.ResponseWriter) {
	w.Header().Set("WWW-Authenticate", `Basic realm="outbox console", charset="UTF-8"`)
	h.failBare(w, http.StatusUnauthorized, "Sign in", "The outbox console needs a user name and password.")
}

func (h *handler) setAuthCookie(w http.ResponseWriter, r *http.Request) {
	http.SetCookie(w, &http.Cookie{Name: h.authCookie, Value: h.authMAC, Path: h.base,
		HttpOnly: true, SameSite: http.SameSiteStrictMode, Secure: h.secure(r)})
}

func (h *handler) clearAuthCookie(w http.ResponseWriter, r *http.Request) {
	http.SetCookie(w, &http.Cookie{Name: h.authCookie, Path: h.base, MaxAge: -1,
		HttpOnly: true, SameSite: http.SameSiteStrictMode, Secure: h.secure(r)})
}

// secure reports whether the cookies set on r's response are Secure.
func (h *handler) secure(r *http.Request) bool { return h.cfg.SecureCookies || r.TLS != nil }

// login checks the login form's token and sets the login cookie.
func (h *handler) login(w http.ResponseWriter, r *http.Request) {
	if h.cfg.Token == "" {
		http.Redirect(w, r, h.base, http.StatusSeeOther)
		return
	}
	r.Body = http.MaxBytesReader(w, r.Body, 8<<10)
	if err := r.ParseForm(); err != nil {
		h.failBare(w, http.StatusBadRequest, "Bad form", "The login form cannot be parsed.")
		return
	}
	next := r.PostForm.Get("next")
	if !validNext(next) {
		next = ""
	}
	addr := h.signInAddr(r)
	att := h.signInBegin(w, addr)
	if att == nil {
		return
	}
	if !equal(r.PostForm.Get("token"), h.cfg.Token) {
		h.signInFailed(att, addr)
		h.loginPage(w, r, http.StatusUnauthorized, "That token is not the console's token.", next)
		return
	}
	h.throttle.succeeded(att)
	h.setAuthCookie(w, r)
	http.Redirect(w, r, h.base+next, http.StatusSeeOther)
}

// validNext reports whether next is a safe page path relative to the
// base path.
func validNext(next string) bool {
	if len(next) > 200 {
		return false
	}
	for _, c := range next {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '/' || c == '-' || c == '_') {
			return false
		}
	}
	return !strings.HasPrefix(next, "/")
}

// flash is the result of an action, shown once on the next page.
type flash struct {
	Text string
	Kind string // "ok", "warn" or "error"
	at   time.Time
}

// flashes holds at most maxFlashes pending flashes, by session.
type flashes struct {
	mu sync.Mutex
	m  map[string]flash
}

const maxFlashes = 1000

func (f *flashes) put(session string, fl flash) {
	f.mu.Lock()
	defer f.mu.Unlock()
	fl.at = time.Now()
	if len(f.m) >= maxFlashes {
		for k, v := range f.m {
			if time.Since(v.at) > 10*time.Minute || len(f.m) >= maxFlashes {
				delete(f.m, k)
			}
		}
	}
	f.m[session] = fl
}

func (f *flashes) take(session string) (flash, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	fl, ok := f.m[session]
	delete(f.m, session)
	return fl, ok && time.Since(fl.at) < 10*time.Minute
}
