package console

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/outboxgen/outboxgen/runtime/admin"
	"github.com/outboxgen/outboxgen/runtime/dialect"
	"github.com/outboxgen/outboxgen/runtime/driver"
	"github.com/outboxgen/outboxgen/runtime/redact"
)

// overviewData is the overview page's data.
type overviewData struct {
	St        admin.Status
	Relays    []driver.RelayLeases
	RelaysErr string
	ChartsErr string
	// ChartsPending: the send rate is being read for the first time.
	ChartsPending bool
	ChartsAt      time.Duration // how long the charts' query took
	Sent, Lag     chart
	RefreshMS     int64
	RefreshURL    string
	Now           time.Time
	Groups        []groupRow
}

type groupRow struct {
	driver.FailedGroup
	Link string
}

func (h *handler) overview(w http.ResponseWriter, r *http.Request, q url.Values) {
	ctx := r.Context()
	// The counts, fresh; the send rate (a bounded scan of the newest
	// rows) from the chart cache.
	st, err := h.adm.Status(ctx, admin.StatusOptions{StaleAfter: h.cfg.StaleAfter, Window: h.cfg.Window, ScanRows: 1})
	if err != nil {
		h.dbFail(w, r, "read the outbox's state", err)
		return
	}
	d := overviewData{RefreshMS: h.cfg.Refresh.Milliseconds(), RefreshURL: h.base + "?fragment=overview", Now: time.Now()}
	rate, err := h.charts.get(ctx, h.adm, h.cfg)
	if err != nil {
		d.ChartsErr = "The send rate could not be read: " + redact.String(err.Error())
	}
	d.ChartsPending = rate.Pending
	st.SentPerMinute, st.SentFromID, st.SentInWindow, d.ChartsAt = rate.SentPerMinute, rate.SentFromID, rate.SentInWindow, rate.Took
	d.St = st
	d.Relays, err = h.adm.Relays(ctx)
	if err != nil {
		d.RelaysErr = "The relay leases could not be read: " + redact.String(err.Error())
	}
	d.Sent, d.Lag = charts(st.SentPerMinute, h.cfg.Window)
	for _, g := range st.FailedGroups {
		d.Groups = append(d.Groups, groupRow{FailedGroup: g, Link: h.link("failed", url.Values{"type": {g.Type}, "topic": {g.Topic}})})
	}
	if q.Get("fragment") == "overview" {
		h.exec(w, http.StatusOK, "overview", "overview-body", view{Base: h.base, ReadOnly: h.cfg.ReadOnly, Data: d})
		return
	}
	h.render(w, r, http.StatusOK, "overview", "Overview", "overview", d)
}

// ChartsMaxAge is how long the overview reuses the send rate behind its
// charts (per-minute figures over the window, a scan of up to
// admin.DefaultScanRows rows) before reading it again: the counts are read
// on every request and every live refresh, the charts at most this often,
// whatever the number of open consoles. A stale send rate is shown while
// the new one is read in the background, so no page waits for that scan;
// only the first overview waits, at most 150 ms, then shows the charts
// as pending (the live refresh fills them in).
const ChartsMaxAge = 30 * time.Second

// chartsWait is how long an overview waits for the first send rate read.
const chartsWait = 150 * time.Millisecond

// chartCache holds the last send rate read.
type chartCache struct {
	mu      sync.Mutex
	at      time.Time     // when st was read; zero: never
	st      admin.Status  // the last send rate read
	err     error         // the last read's error
	reading chan struct{} // closed when the read under way ends; nil: none
}

// chartRate is what the overview gets from the cache.
type chartRate struct {
	admin.Status
	Pending bool // no send rate read yet: the first read is under way
}

// get returns the send rate, starting a read when it is older than
// ChartsMaxAge.
func (c *chartCache) get(ctx context.Context, a *admin.Admin, cfg Config) (chartRate, error) {
	c.mu.Lock()
	if !c.at.IsZero() && time.Since(c.at) < ChartsMaxAge {
		defer c.mu.Unlock()
		return chartRate{Status: c.st}, nil
	}
	if c.reading == nil {
		done := make(chan struct{})
		c.reading = done
		go func() {
			// Not the request's context: the read outlives the request
			// that started it (each statement is still bounded).
			st, err := a.Status(context.Background(), admin.StatusOptions{StaleAfter: cfg.StaleAfter, Window: cfg.Window})
			c.mu.Lock()
			if err == nil {
				c.st, c.at = st, time.Now()
			} else {
				cfg.Logger.Error("console: read the send rate", "err", redact.Error(err))
			}
			c.err, c.reading = err, nil
			c.mu.Unlock()
			close(done)
		}()
	}
	reading := c.reading
	if !c.at.IsZero() {
		defer c.mu.Unlock()
		return chartRate{Status: c.st}, nil
	}
	c.mu.Unlock()
	t := time.NewTimer(chartsWait)
	defer t.Stop()
	select {
	case <-reading:
	case <-t.C:
	case <-ctx.Done():
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.at.IsZero() {
		return chartRate{Pending: c.err == nil}, c.err
	}
	return chartRate{Status: c.st}, nil
}

// filterForm is the FAILED list's filter, as the form sends it.
type filterForm struct {
	Type, Topic, Key, Error, Since string
}

func readFilter(v url.Values) filterForm {
	return filterForm{Type: strings.TrimSpace(v.Get("type")), Topic: strings.TrimSpace(v.Get("topic")), Key: strings.TrimSpace(v.Get("key")),
		Error: strings.TrimSpace(v.Get("error")), Since: strings.TrimSpace(v.Get("since"))}
}

// values returns the filter as query values (empty fields left out).
func (f filterForm) values() url.Values {
	v := url.Values{}
	for k, s := range map[string]string{"type": f.Type, "topic": f.Topic, "key": f.Key, "error": f.Error, "since": f.Since} {
		if s != "" {
			v.Set(k, s)
		}
	}
	return v
}

// filter converts the form into an admin.Filter.
func (f filterForm) filter() (admin.Filter, error) {
	var af admin.Filter
	if f.Type != "" {
		af.Types = []string{f.Type}
	}
	if f.Topic != "" {
		af.Topics = []string{f.Topic}
	}
	if f.Key != "" {
		af.Keys = []string{f.Key}
	}
	af.ErrorContains = f.Error
	if f.Since != "" {
		d, err := parseSpan(f.Since)
		if err != nil {
			return af, err
		}
		af.Since = d
	}
	return af, nil
}

// parseSpan parses a duration such as 90m, 1h or 2d.
func parseSpan(s string) (time.Duration, error) {
	if n, ok := strings.CutSuffix(s, "d"); ok {
		if days, err := strconv.Atoi(n); err == nil && days > 0 && days <= 3650 {
			return time.Duration(days) * 24 * time.Hour, nil
		}
	}
	d, err := time.ParseDuration(s)
	if err != nil || d <= 0 {
		return 0, fmt.Errorf("since %q: give a positive span such as 30m, 1h or 2d", s)
	}
	return d, nil
}

// pageSize reads ?limit=.
func pageSize(q url.Values) (int, error) {
	s := q.Get("limit")
	if s == "" {
		return DefaultPageSize, nil
	}
	n, err := strconv.Atoi(s)
	if err != nil || n < 1 || n > MaxPageSize {
		return 0, fmt.Errorf("limit %q: give 1 to %d rows per page", s, MaxPageSize)
	}
	return n, nil
}

// afterID reads ?after= (a row id).
func afterID(q url.Values) (int64, error) {
	s := q.Get("after")
	if s == "" {
		return 0, nil
	}
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil || n < 0 {
		return 0, fmt.Errorf("after %q: give the last row id of the previous page", s)
	}
	return n, nil
}

// listData is an event list's data (FAILED list, search results).
type listData struct {
	Filter    filterForm
	Hidden    url.Values // the filter as hidden fields
	Events    []eventRow
	Next      string
	First     string
	Paged     bool
	Err       string
	Limit     int
	Q         string
	Searched  bool
	NotFound  string
	ShowState bool
	// SentFromID: sent events were searched among ids above it only.
	SentFromID int64
	// HasSent: the list holds sent events (which can be replayed).
	HasSent bool
	// Match: the search term is also this event's row id or event id.
	Match *searchMatch
}

type eventRow struct {
	driver.Event
	State state
	Link  string
}

func (h *handler) rows(evs []driver.Event) []eventRow {
	out := make([]eventRow, len(evs))
	for i, e := range evs {
		out[i] = eventRow{Event: e, State: eventState(e), Link: h.base + "events/" + strconv.FormatInt(e.ID, 10)}
	}
	return out
}

func (h *handler) failed(w http.ResponseWriter, r *http.Request, q url.Values) {
	f := readFilter(q)
	d := listData{Filter: f, Hidden: f.values(), First: h.link("failed", f.values())}
	limit, err := pageSize(q)
	after, err2 := afterID(q)
	af, err3 := f.filter()
	if err := errors.Join(err, err2, err3); err != nil {
		d.Err = err.Error()
		h.render(w, r, http.StatusBadRequest, "failed", "FAILED events", "failed", d)
		return
	}
	d.Limit, d.Paged = limit, after > 0
	evs, err := h.adm.Find(r.Context(), driver.Failed, af, after, limit+1)
	if err != nil {
		h.dbFail(w, r, "list the FAILED events", err)
		return
	}
	if len(evs) > limit {
		evs = evs[:limit]
		nq := f.values()
		nq.Set("after", strconv.FormatInt(evs[len(evs)-1].ID, 10))
		if limit != DefaultPageSize {
			nq.Set("limit", strconv.Itoa(limit))
		}
		d.Next = h.link("failed", nq)
	}
	d.Events = h.rows(evs)
	h.render(w, r, http.StatusOK, "failed", "FAILED events", "failed", d)
}

// searchMatch is the event whose id or event id the search term is, when
// the term is also a key with events: the page shows both.
type searchMatch struct {
	ID   int64
	Link string
	What string // "row id" or "event id"
}

// search answers ?key= (the events of a key, never an id lookup: every
// key link uses it) and ?q= (the search box: a row id or event id opens
// the event, unless the term is also a key with events, in which case
// the page shows both; any other term is a key).
func (h *handler) search(w http.ResponseWriter, r *http.Request, q url.Values) {
	key := strings.TrimSpace(q.Get("key"))
	term := strings.TrimSpace(q.Get("q"))
	byKey := key != ""
	if byKey {
		term = key
	}
	d := listData{Q: term, ShowState: true}
	if term == "" {
		h.render(w, r, http.StatusOK, "search", "Search", "", d)
		return
	}
	d.Searched = true
	limit, err := pageSize(q)
	after, err2 := afterID(q)
	if err := errors.Join(err, err2); err != nil {
		d.Err = err.Error()
		h.render(w, r, http.StatusBadRequest, "search", "Search", "", d)
		return
	}
	var match *driver.Event
	if !byKey {
		if _, eventID, err := admin.ParseRef(term); err == nil {
			ev, err := h.adm.Get(r.Context(), term)
			switch {
			case err == nil:
				match = &ev
				what := "row id"
				if eventID != "" {
					what = "event id"
				}
				d.Match = &searchMatch{ID: ev.ID, Link: h.base + "events/" + strconv.FormatInt(ev.ID, 10), What: what}
			case errors.Is(err, driver.ErrNotFound):
				d.NotFound = "No event has id or event id " + term + "; looking for it as a key instead."
			default:
				h.dbFail(w, r, "look up the event", err)
				return
			}
		}
	}
	evs, bound, err := h.keyEvents(r.Context(), term, after, limit+1)
	if err != nil {
		h.dbFail(w, r, "list the key's events", err)
		return
	}
	if match != nil && len(evs) == 0 && after == 0 {
		// Only the event: open it.
		http.Redirect(w, r, d.Match.Link, http.StatusSeeOther)
		return
	}
	d.SentFromID = bound
	d.First = h.link("search", url.Values{"key": {term}})
	d.Paged = after > 0
	if len(evs) > limit {
		evs = evs[:limit]
		nq := url.Values{"key": {term}, "after": {strconv.FormatInt(evs[len(evs)-1].ID, 10)}}
		if limit != DefaultPageSize {
			nq.Set("limit", strconv.Itoa(limit))
			d.First = h.link("search", url.Values{"key": {term}, "limit": {strconv.Itoa(limit)}})
		}
		d.Next = h.link("search", nq)
	}
	d.Events = h.rows(evs)
	for _, e := range evs {
		d.HasSent = d.HasSent || e.Status == driver.Sent
	}
	h.render(w, r, http.StatusOK, "search", "Search: "+short(term, 40), "", d)
}

// keyEvents returns up to limit events of key with id > after, in id
// order: every pending and FAILED one (an index holds them by key), and
// the sent ones. On PostgreSQL and SQLite no index holds sent rows by key
// (they are the bulk of the table), so sent rows are searched among the
// newest admin.DefaultScanRows rows only, ids above bound (0: all).
func (h *handler) keyEvents(ctx context.Context, key string, after int64, limit int) (evs []driver.Event, bound int64, err error) {
	f := admin.Filter{Keys: []string{key}}
	if h.adm.Driver().Dialect() != dialect.MySQL {
		maxID, err := h.adm.MaxID(ctx)
		if err != nil {
			return nil, 0, err
		}
		bound = max(0, maxID-admin.DefaultScanRows)
	}
	for _, status := range []driver.RowStatus{driver.Pending, driver.Failed, driver.Sent} {
		sf := f
		if status == driver.Sent && bound > 0 {
			sf.FromID = bound + 1
		}
		part, err := h.adm.Find(ctx, status, sf, after, limit)
		if err != nil {
			return nil, 0, err
		}
		evs = append(evs, part...)
	}
	slices.SortFunc(evs, func(a, b driver.Event) int { return cmp.Compare(a.ID, b.ID) })
	if len(evs) > limit {
		evs = evs[:limit]
	}
	return evs, bound, nil
}

// eventData is the event page's data.
type eventData struct {
	Ev        driver.Event
	State     state
	Payload   shown
	Headers   shown
	Timeline  []timelineEntry
	KeyLink   string
	Recent    bool
	IDText    string
	RecentWin time.Duration
}

type timelineEntry struct {
	At   time.Time
	Text string
}

func (h *handler) event(w http.ResponseWriter, r *http.Request, ref string) {
	ref, _ = url.PathUnescape(ref)
	if _, _, err := admin.ParseRef(ref); err != nil {
		h.fail(w, r, http.StatusBadRequest, "Not an event reference", err.Error())
		return
	}
	ev, err := h.adm.Get(r.Context(), ref)
	if errors.Is(err, driver.ErrNotFound) {
		h.fail(w, r, http.StatusNotFound, "No such event", "No event "+ref+" in the outbox table: it was never written, or the janitor (or an operator) deleted it.")
		return
	}
	if err != nil {
		h.dbFail(w, r, "read the event", err)
		return
	}
	d := eventData{Ev: ev, State: eventState(ev), Payload: showBody(ev.Payload), Headers: showBody(ev.Headers),
		KeyLink: h.keyLink(ev.Key), IDText: strconv.FormatInt(ev.ID, 10), RecentWin: admin.RecentWindow}
	d.Recent = ev.Status == driver.Sent && time.Since(ev.SentAt) < admin.RecentWindow
	tl := []timelineEntry{{At: ev.CreatedAt, Text: "created (committed with its business change)"}}
	if ev.LeaseOwner != "" && ev.Status == driver.Pending {
		if head, ok := dialect.InFlightHoldOf(ev.LeaseOwner, ev.NextRetryAt); ok {
			tl = append(tl, timelineEntry{At: ev.UpdatedAt, Text: "held back, until that event is recorded, behind an older event of its key whose publish was slow: event " + strconv.FormatInt(head, 10) + ", since"})
		} else if ev.LeaseOwner == dialect.HeldOwner {
			tl = append(tl, timelineEntry{At: ev.NextRetryAt, Text: "held back behind an older event of its key until"})
		} else {
			tl = append(tl, timelineEntry{At: ev.LeaseExpiresAt, Text: "claimed by " + ev.LeaseOwner + " until"})
		}
	}
	if ev.Status == driver.Pending && ev.RetryCount > 0 && !dialect.IsInFlightHold(ev.NextRetryAt) {
		tl = append(tl, timelineEntry{At: ev.NextRetryAt, Text: fmt.Sprintf("backing off after %s: next attempt at", plural(int64(ev.RetryCount), "failed attempt"))})
	}
	if ev.Status == driver.Failed {
		tl = append(tl, timelineEntry{At: ev.UpdatedAt, Text: fmt.Sprintf("failed for good after %s", plural(int64(ev.RetryCount), "attempt"))})
	}
	if !ev.SentAt.IsZero() {
		tl = append(tl, timelineEntry{At: ev.SentAt, Text: "sent"})
	}
	d.Timeline = tl
	h.render(w, r, http.StatusOK, "event", fmt.Sprintf("Event %d", ev.ID), "", d)
}

// blockedData is the blocked keys page's data.
type blockedData struct {
	Keys  []blockedRow
	Next  string
	First string
	Paged bool
	Err   string
}

type blockedRow struct {
	driver.BlockedKey
	State   state
	Link    string
	KeyLink string
}

// keyLink is the link to the events of key: ?key=, never an id lookup
// (a key such as "2" is not row 2).
func (h *handler) keyLink(key string) string {
	return h.link("search", url.Values{"key": {key}})
}

func (h *handler) blocked(w http.ResponseWriter, r *http.Request, q url.Values) {
	d := blockedData{First: h.base + "blocked"}
	limit, err := pageSize(q)
	if err != nil {
		d.Err = err.Error()
		h.render(w, r, http.StatusBadRequest, "blocked", "Blocked keys", "blocked", d)
		return
	}
	after := q.Get("after")
	d.Paged = after != ""
	keys, err := h.adm.BlockedKeys(r.Context(), after, limit+1)
	if err != nil {
		h.dbFail(w, r, "list the blocked keys", err)
		return
	}
	if len(keys) > limit {
		keys = keys[:limit]
		nq := url.Values{"after": {keys[len(keys)-1].Key}}
		if limit != DefaultPageSize {
			nq.Set("limit", strconv.Itoa(limit))
		}
		d.Next = h.link("blocked", nq)
	}
	for _, k := range keys {
		d.Keys = append(d.Keys, blockedRow{BlockedKey: k, State: eventState(k.Head), Link: h.base + "events/" + strconv.FormatInt(k.Head.ID, 10), KeyLink: h.keyLink(k.Key)})
	}
	h.render(w, r, http.StatusOK, "blocked", "Blocked keys", "blocked", d)
}

// inboxData is the inbox page's data.
type inboxData struct {
	Window     time.Duration
	Consumers  []consumerRow
	Consumer   string
	Duplicates []driver.InboxDuplicate
	Err        string
}

type consumerRow struct {
	driver.InboxConsumer
	Link string
}

func (h *handler) inbox(w http.ResponseWriter, r *http.Request, q url.Values) {
	d := inboxData{Window: admin.DefaultInboxWindow, Consumer: q.Get("consumer")}
	if s := q.Get("window"); s != "" {
		win, err := parseSpan(s)
		if err != nil || win > admin.MaxInboxWindow {
			d.Err = fmt.Sprintf("window %q: give a span of at most %s, such as 1h or 1d", s, humanAge(admin.MaxInboxWindow))
			h.render(w, r, http.StatusBadRequest, "inbox", "Inbox", "inbox", d)
			return
		}
		d.Window = win
	}
	ctx := r.Context()
	if d.Consumer != "" {
		dups, err := h.adm.RecentDuplicates(ctx, d.Consumer, 100)
		if err != nil {
			h.dbFail(w, r, "list the consumer's duplicate deliveries", err)
			return
		}
		d.Duplicates = dups
		h.render(w, r, http.StatusOK, "inbox", "Inbox: "+short(d.Consumer, 40), "inbox", d)
		return
	}
	cs, err := h.adm.Inbox(ctx, d.Window)
	if err != nil {
		h.dbFail(w, r, "read the inbox", err)
		return
	}
	for _, c := range cs {
		d.Consumers = append(d.Consumers, consumerRow{InboxConsumer: c, Link: h.link("inbox", url.Values{"consumer": {c.Consumer}})})
	}
	h.render(w, r, http.StatusOK, "inbox", "Inbox", "inbox", d)
}
