package console

import (
	"bytes"
	"embed"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"html/template"
	"io/fs"
	"math"
	"net/http"
	"net/url"
	"path"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/outboxgen/outboxgen/runtime/admin"
	"github.com/outboxgen/outboxgen/runtime/dialect"
	"github.com/outboxgen/outboxgen/runtime/driver"
	"github.com/outboxgen/outboxgen/runtime/redact"
)

//go:embed templates/*.html assets/*
var files embed.FS

// pages holds one parsed template set per page.
type pages struct {
	t map[string]*template.Template
}

var pageNames = []string{"overview", "failed", "event", "blocked", "inbox", "search", "confirm", "error", "login"}

var funcs = template.FuncMap{
	"age":     humanAge,
	"ago":     ago,
	"ts":      timestamp,
	"short":   short,
	"plural":  plural,
	"state":   eventState,
	"secs":    seconds,
	"inc":     func(i int) int { return i + 1 },
	"nonzero": func(t time.Time) bool { return !t.IsZero() },
	"tableArgs": func(evs []eventRow, check, state bool, form, only string) tableArgs {
		return tableArgs{Events: evs, Check: check, State: state, Form: form, Only: only}
	},
}

// tableArgs are the events table's arguments.
type tableArgs struct {
	Events       []eventRow
	Check, State bool
	Form         string
	Only         string // when set, only rows of this status get a checkbox
}

func parsePages() (*pages, error) {
	p := &pages{t: map[string]*template.Template{}}
	for _, n := range pageNames {
		t, err := template.New(n).Funcs(funcs).ParseFS(files, "templates/layout.html", "templates/"+n+".html")
		if err != nil {
			return nil, fmt.Errorf("console: parse template %s: %w", n, err)
		}
		p.t[n] = t
	}
	return p, nil
}

// view is what every page template gets.
type view struct {
	Title    string
	Nav      string // the active nav entry
	Base     string
	ReadOnly bool
	Database string
	CSRF     string
	Flash    *flash
	Q        string // the search box
	Data     any
	// Bare: a page for a request not (yet) authenticated: no header (no
	// database, navigation or search), no session.
	Bare bool
	// NoHeading: the page's content has its own heading.
	NoHeading bool
}

// render writes page name with data under status code.
func (h *handler) render(w http.ResponseWriter, r *http.Request, code int, name, title, nav string, data any) {
	// Only requests that passed authenticate get here: the header
	// (database description) and a session (and its form token) are for
	// those let in only.
	v := view{Title: title, Nav: nav, Base: h.base, ReadOnly: h.cfg.ReadOnly, Database: redact.String(h.cfg.Database), Data: data}
	sess := h.ensureSession(w, r)
	v.CSRF = h.mac("csrf", sess)
	if fl, ok := h.flashes.take(sess); ok {
		v.Flash = &fl
	}
	// The confirmation's box says what it asks (with the count): no
	// heading above it repeating it.
	v.NoHeading = name == "confirm"
	if ld, ok := data.(listData); ok {
		v.Q = ld.Q
	}
	h.exec(w, code, name, "layout", v)
}

// exec runs template tmpl of page name into a buffer first, so a failing
// template never sends half a page.
func (h *handler) exec(w http.ResponseWriter, code int, name, tmpl string, v any) {
	var buf bytes.Buffer
	if err := h.pages.t[name].ExecuteTemplate(&buf, tmpl, v); err != nil {
		h.cfg.Logger.Error("console: render page", "page", name, "err", redact.Error(err))
		http.Error(w, "The console could not render this page; see its log.", http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.WriteHeader(code)
	_, _ = w.Write(buf.Bytes())
}

// errorData is the error page's data.
type errorData struct {
	Title, Text string
	Code        int
}

// fail answers with an error page.
func (h *handler) fail(w http.ResponseWriter, r *http.Request, code int, title, text string) {
	h.render(w, r, code, "error", title, "", errorData{Title: title, Text: redact.String(text), Code: code})
}

// failBare answers with an error page for a request not authenticated
// (yet): no header, no database description, no session cookie.
func (h *handler) failBare(w http.ResponseWriter, code int, title, text string) {
	h.exec(w, code, "error", "layout", view{Title: title, Base: h.base, Bare: true, Data: errorData{Title: title, Text: redact.String(text), Code: code}})
}

// dbFail answers with the error page of a failed database call.
func (h *handler) dbFail(w http.ResponseWriter, r *http.Request, what string, err error) {
	h.cfg.Logger.Error("console: "+what, "err", redact.Error(err))
	h.fail(w, r, http.StatusInternalServerError, "Database error", what+": "+err.Error())
}

type loginData struct {
	Error, Next string
}

func (h *handler) loginPage(w http.ResponseWriter, r *http.Request, code int, msg, next string) {
	if !validNext(next) {
		next = ""
	}
	h.exec(w, code, "login", "layout", view{Title: "Sign in", Base: h.base, Bare: true, Data: loginData{Error: msg, Next: next}})
}

// asset serves an embedded stylesheet or script.
func (h *handler) asset(w http.ResponseWriter, r *http.Request, name string) {
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		h.failBare(w, http.StatusMethodNotAllowed, "Method not allowed", "Assets answer GET only.")
		return
	}
	b, err := fs.ReadFile(files, "assets/"+path.Clean("/" + name)[1:])
	if err != nil || name == "" {
		http.NotFound(w, r)
		return
	}
	switch path.Ext(name) {
	case ".css":
		w.Header().Set("Content-Type", "text/css; charset=utf-8")
	case ".js":
		w.Header().Set("Content-Type", "text/javascript; charset=utf-8")
	case ".svg":
		w.Header().Set("Content-Type", "image/svg+xml")
	}
	_, _ = w.Write(b)
}

// humanAge writes d as "40s", "3m 12s", "2h 5m" or "4d 3h" (a zero
// second part left out: "10m", "3h").
func humanAge(d time.Duration) string {
	if d < 0 {
		d = -d
	}
	two := func(a int, ua string, b int, ub string) string {
		if b == 0 {
			return strconv.Itoa(a) + ua
		}
		return strconv.Itoa(a) + ua + " " + strconv.Itoa(b) + ub
	}
	switch {
	case d < time.Second:
		return "0s"
	case d < time.Minute:
		return fmt.Sprintf("%ds", int(d.Seconds()))
	case d < time.Hour:
		return two(int(d.Minutes()), "m", int(d.Seconds())%60, "s")
	case d < 48*time.Hour:
		return two(int(d.Hours()), "h", int(d.Minutes())%60, "m")
	}
	return two(int(d.Hours())/24, "d", int(d.Hours())%24, "h")
}

// ago writes how long ago t was ("3m 12s ago", "in 40s").
func ago(t time.Time) string {
	if t.IsZero() {
		return "—"
	}
	d := time.Since(t)
	if d < 0 {
		return "in " + humanAge(-d)
	}
	return humanAge(d) + " ago"
}

// timestamp writes t in UTC to the second.
func timestamp(t time.Time) string {
	if t.IsZero() {
		return "—"
	}
	return t.UTC().Format("2006-01-02 15:04:05") + " UTC"
}

func short(s string, n int) string {
	s = strings.Join(strings.Fields(s), " ")
	if utf8.RuneCountInString(s) <= n {
		return s
	}
	r := []rune(s)
	return string(r[:n]) + "…"
}

// plural writes "1 event" or "12 events".
func plural(n int64, word string) string {
	if n == 1 {
		return "1 " + word
	}
	return strconv.FormatInt(n, 10) + " " + word + "s"
}

func seconds(f float64) string {
	switch {
	case f < 1:
		return fmt.Sprintf("%.0f ms", f*1000)
	case f < 60:
		return fmt.Sprintf("%.1f s", f)
	}
	return humanAge(time.Duration(f * float64(time.Second)))
}

// state is an event's state as the console shows it.
type state struct {
	Label  string // e.g. "BACKING OFF"
	Class  string // CSS class
	Status string // the status column: pending, sent, failed
	Detail string
}

func eventState(e driver.Event) state {
	now := time.Now()
	s := state{Status: e.Status.String()}
	head, inFlightHeld := dialect.InFlightHoldOf(e.LeaseOwner, e.NextRetryAt)
	switch {
	case e.Status == driver.Failed:
		s.Label, s.Class = "FAILED", "failed"
	case e.Status == driver.Sent:
		s.Label, s.Class = "SENT", "sent"
	case inFlightHeld:
		s.Label, s.Class, s.Detail = "HELD BACK", "held", "waits until event "+strconv.FormatInt(head, 10)+", an older event of its key whose publish is slow, is recorded"
	case e.LeaseOwner == dialect.HeldOwner:
		s.Label, s.Class, s.Detail = "HELD BACK", "held", "waits behind an older FAILED or backing-off event of its key"
	case e.LeaseOwner != "" && e.LeaseExpiresAt.After(now):
		s.Label, s.Class, s.Detail = "IN FLIGHT", "inflight", "claimed by "+e.LeaseOwner+" until "+timestamp(e.LeaseExpiresAt)
	case e.LeaseOwner != "":
		s.Label, s.Class, s.Detail = "LEASE EXPIRED", "stale", "claimed by "+e.LeaseOwner+", whose lease lapsed at "+timestamp(e.LeaseExpiresAt)
	case e.RetryCount > 0 && e.NextRetryAt.After(now):
		s.Label, s.Class, s.Detail = "BACKING OFF", "backoff", "next attempt at "+timestamp(e.NextRetryAt)
	default:
		s.Label, s.Class = "PENDING", "pending"
	}
	return s
}

// maxIndented bounds the indented form of a payload or headers the event
// page shows (at most MaxPayloadDisplay bytes of JSON, which nesting can
// make hundreds of times larger indented); above it they are shown as
// stored.
const maxIndented = 4 * MaxPayloadDisplay

// shown is a payload or headers prepared for display.
type shown struct {
	Text string
	Note string
}

// showBody pretty-prints JSON, shows other text as it is and binary as a
// hex dump, cut at MaxPayloadDisplay.
func showBody(b []byte) shown {
	if b == nil {
		return shown{Note: "none"}
	}
	var note string
	if len(b) > MaxPayloadDisplay {
		note = fmt.Sprintf("%d bytes; the first %d are shown", len(b), MaxPayloadDisplay)
		n := MaxPayloadDisplay
		// Cut at a character's start, so that text stays text.
		for i := 0; i < utf8.UTFMax && n > 0 && !utf8.RuneStart(b[n]); i++ {
			n--
		}
		b = b[:n]
	} else if text, ok := admin.IndentJSON(b, "", maxIndented); ok {
		return shown{Text: text}
	} else if json.Valid(b) {
		return shown{Text: string(b), Note: "nested too deep to indent: shown as stored"}
	}
	if !utf8.Valid(b) {
		n := min(len(b), 4096)
		if note == "" {
			note = fmt.Sprintf("%d bytes", len(b))
		}
		note += fmt.Sprintf("; not text: hex dump of the first %d bytes", n)
		return shown{Text: hex.Dump(b[:n]), Note: note}
	}
	if note == "" && len(b) > 0 && !json.Valid(b) {
		note = "not valid JSON: shown as stored"
	}
	return shown{Text: string(b), Note: note}
}

// chart is a server-rendered bar chart (inline SVG).
type chart struct {
	ID, Title, Desc string
	W, H            int
	Bars            []chartBar
	Peak, From      string
	Empty           bool
}

type chartBar struct {
	X, Y, W, H string
	Title      string
	Class      string
}

// charts builds the sent-per-minute and lag charts over window.
func charts(stats []driver.MinuteStat, window time.Duration) (sent, lag chart) {
	n := int(window / time.Minute)
	if n < 1 {
		n = 1
	}
	byAgo := make(map[int]driver.MinuteStat, len(stats))
	var peak int64
	var peakLag float64
	for _, m := range stats {
		if m.MinutesAgo < n {
			byAgo[m.MinutesAgo] = m
			peak = max(peak, m.Sent)
			peakLag = max(peakLag, m.MaxLag)
		}
	}
	const barW, h = 4, 100
	sent = chart{ID: "chart-sent", Title: "Events sent per minute", W: n * barW, H: h, Empty: peak == 0,
		Peak: fmt.Sprintf("peak %d/min", peak), From: humanAge(window) + " ago"}
	lag = chart{ID: "chart-lag", Title: "Commit-to-publish lag per minute (average; marks: maximum)", W: n * barW, H: h, Empty: peak == 0,
		Peak: "peak " + seconds(peakLag), From: humanAge(window) + " ago"}
	now := time.Now().Truncate(time.Minute)
	for i := range n {
		minutesAgo := n - 1 - i
		m, ok := byAgo[minutesAgo]
		if !ok || m.Sent == 0 {
			continue
		}
		at := now.Add(-time.Duration(minutesAgo) * time.Minute).UTC().Format("15:04")
		x := strconv.Itoa(i * barW)
		bh := math.Max(1, float64(m.Sent)/float64(peak)*h)
		sent.Bars = append(sent.Bars, chartBar{X: x, Y: fmtF(h - bh), W: "3", H: fmtF(bh), Class: "bar",
			Title: fmt.Sprintf("%s UTC: %d sent", at, m.Sent)})
		if peakLag > 0 {
			ah := math.Max(1, m.AvgLag/peakLag*h)
			mh := math.Max(1, m.MaxLag/peakLag*h)
			lag.Bars = append(lag.Bars,
				chartBar{X: x, Y: fmtF(h - ah), W: "3", H: fmtF(ah), Class: "bar",
					Title: fmt.Sprintf("%s UTC: average lag %s, maximum %s", at, seconds(m.AvgLag), seconds(m.MaxLag))},
				chartBar{X: x, Y: fmtF(h - mh), W: "3", H: "1.5", Class: "mark",
					Title: fmt.Sprintf("%s UTC: maximum lag %s", at, seconds(m.MaxLag))})
		}
	}
	sent.Desc = fmt.Sprintf("%d minutes with sent events in the last %s; %s.", len(sent.Bars), humanAge(window), sent.Peak)
	lag.Desc = fmt.Sprintf("Average and maximum time from commit to publish, per minute, over the last %s; %s.", humanAge(window), lag.Peak)
	return sent, lag
}

func fmtF(f float64) string { return strconv.FormatFloat(f, 'f', 1, 64) }

// link builds base+p with query q.
func (h *handler) link(p string, q url.Values) string {
	if len(q) == 0 {
		return h.base + p
	}
	return h.base + p + "?" + q.Encode()
}
