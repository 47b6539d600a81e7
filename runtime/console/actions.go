package console

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"strings"

	"github.com/outboxgen/outboxgen/runtime/admin"
	"github.com/outboxgen/outboxgen/runtime/redact"
)

// action is one of the console's actions.
type action struct {
	name   string // requeue, replay, delete
	verb   string // Requeue
	past   string // Requeued
	status string // FAILED or SENT
	run    func(*admin.Admin, context.Context, admin.Selection) (admin.Result, error)
	note   string
}

var (
	actRequeue = action{name: "requeue", verb: "Requeue", past: "Requeued", status: "FAILED", run: (*admin.Admin).Requeue,
		note: "They become pending again, due now, with their attempts reset; the events of their keys held back behind them flow again, in order."}
	actReplay = action{name: "replay", verb: "Replay", past: "Replayed", status: "SENT", run: (*admin.Admin).Replay,
		note: "They become pending again with the same event id, payload and headers, so the relay publishes them again. Consumers' inboxes skip events they already handled (forget them with `outboxgen inbox forget` to have them handled again)."}
	actDelete = action{name: "delete", verb: "Delete", past: "Deleted", status: "FAILED", run: (*admin.Admin).Delete,
		note: "Deleted events are gone for good: nothing publishes them, and only the database's backups hold them. The events of their keys held back behind them flow again."}
)

// confirmData is the confirmation page's data.
type confirmData struct {
	Action   string
	Verb     string
	Text     string
	Notes    []string
	Warn     string
	Refused  []admin.Refusal
	Error    string
	Hidden   []field
	CanOK    bool
	Typed    bool   // delete: the user types the event id
	TypedFor string // the event id to type
	Cancel   string
}

type field struct{ Name, Value string }

// selection is what an action form names.
type selection struct {
	sel    admin.Selection
	scope  string // "selected" or "matching"
	filter filterForm
	back   string // "event", "search" or "failed"
	q      string // the search, when back is "search"
	toID   int64  // the confirmation's pin: the highest id it counted
	expect int64  // the confirmation's count; -1: none
	digest string // the confirmation's digest of the ids it counted
}

// readSelection parses an action form.
func readSelection(f url.Values) (selection, error) {
	s := selection{scope: f.Get("scope"), filter: readFilter(f), back: f.Get("back"), q: f.Get("q"), expect: -1}
	switch s.scope {
	case "selected", "":
		s.scope = "selected"
		ids := f["id"]
		if len(ids) == 0 {
			return s, errors.New("no event selected: tick the events to act on, or act on everything the filter matches")
		}
		if len(ids) > admin.MaxRefs {
			return s, fmt.Errorf("%d events selected: select at most %d", len(ids), admin.MaxRefs)
		}
		for _, id := range ids {
			if _, _, err := admin.ParseRef(id); err != nil {
				return s, err
			}
		}
		s.sel.Refs = ids
	case "matching":
		af, err := s.filter.filter()
		if err != nil {
			return s, err
		}
		if v := f.Get("to_id"); v != "" {
			n, err := strconv.ParseInt(v, 10, 64)
			if err != nil || n < 1 {
				return s, fmt.Errorf("to_id %q is not a row id", v)
			}
			s.toID, af.ToID = n, n
		}
		s.sel.Filter = af
		s.sel.All = af.Empty()
	default:
		return s, fmt.Errorf("scope %q: use selected or matching", s.scope)
	}
	if v := f.Get("expect"); v != "" {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil || n < 0 {
			return s, fmt.Errorf("expect %q is not a count", v)
		}
		s.expect = n
	}
	if v := f.Get("digest"); v != "" {
		if len(v) != 64 || strings.Trim(v, "0123456789abcdef") != "" {
			return s, fmt.Errorf("digest %q is not the confirmation's digest", short(v, 80))
		}
		s.digest = v
	}
	if s.expect >= 0 && s.digest != "" {
		s.sel.Expect = &admin.Expect{Count: s.expect, Digest: s.digest}
	}
	s.sel.OneTransaction = true
	return s, nil
}

// backURL is where the console goes after the action.
func (h *handler) backURL(s selection, a action) string {
	if s.back == "event" && len(s.sel.Refs) == 1 && a.name != "delete" {
		return h.base + "events/" + url.PathEscape(s.sel.Refs[0])
	}
	if s.back == "search" && s.q != "" {
		return h.keyLink(s.q)
	}
	return h.link("failed", s.filter.values())
}

// fields returns the form fields that repeat the selection.
func (s selection) fields() []field {
	fs := []field{{"scope", s.scope}, {"back", s.back}}
	if s.q != "" {
		fs = append(fs, field{"q", s.q})
	}
	for _, id := range s.sel.Refs {
		fs = append(fs, field{"id", id})
	}
	for _, k := range []string{"type", "topic", "key", "error", "since"} {
		if v := s.filter.values().Get(k); v != "" {
			fs = append(fs, field{k, v})
		}
	}
	return fs
}

// act shows an action's confirmation page, or runs it when confirmed.
func (h *handler) act(w http.ResponseWriter, r *http.Request, a action) {
	s, err := readSelection(r.PostForm)
	if err != nil {
		h.fail(w, r, http.StatusBadRequest, "Cannot "+a.name, err.Error()+". Nothing was changed.")
		return
	}
	if a.name == "delete" && (s.scope != "selected" || len(s.sel.Refs) != 1) {
		h.fail(w, r, http.StatusBadRequest, "Cannot delete", "The console deletes one FAILED event at a time, from its page. Nothing was changed.")
		return
	}
	ctx := r.Context()
	if r.PostForm.Get("confirm") != "yes" || s.sel.Expect == nil {
		// Only a confirmation page's form (which carries the count and
		// digest of what it showed) acts.
		h.confirm(w, r, a, s, "", 0)
		return
	}
	if a.name == "delete" {
		ev, err := h.adm.Get(ctx, s.sel.Refs[0])
		if err != nil {
			h.confirm(w, r, a, s, "", 0)
			return
		}
		typed := strings.ToLower(strings.TrimSpace(r.PostForm.Get("confirm_event_id")))
		if typed != ev.EventID {
			h.confirm(w, r, a, s, fmt.Sprintf("You typed %q, which is not this event's id: nothing was deleted. Type %s exactly to delete it.", short(typed, 60), ev.EventID), http.StatusBadRequest)
			return
		}
	}
	res, err := a.run(h.adm, ctx, s.sel)
	if errors.Is(err, admin.ErrSelectionChanged) {
		// Nothing was changed: show what the selection is now.
		h.cfg.Logger.Info("console: "+a.name+" refused: the selection changed since it was confirmed", "confirmed", s.expect, "now", res.Matched, "remote", r.RemoteAddr)
		s.toID = 0
		s.sel.Filter.ToID = 0
		s.sel.All = s.scope == "matching" && s.sel.Filter.Empty()
		s.sel.Expect = nil
		msg := err.Error()
		h.confirm(w, r, a, s, strings.ToUpper(msg[:1])+msg[1:]+".", http.StatusConflict)
		return
	}
	fl := h.resultFlash(a, s, res, err)
	// The audit line: what an operator changed, from where (a failed
	// action may have changed earlier batches).
	audit := []any{"matched", res.Matched, "changed", res.Changed, "released", res.Released, "first_id", res.FirstID, "last_id", res.LastID,
		"keys", res.Keys, "refused", len(res.Refused), "remote", r.RemoteAddr}
	if user, _, ok := r.BasicAuth(); ok {
		audit = append(audit, "user", user)
	}
	if err != nil && !errors.Is(err, admin.ErrRefused) {
		h.cfg.Logger.Error("console: "+a.name, append(audit, "err", redact.Error(err))...)
	} else {
		h.cfg.Logger.Info("console: "+a.name, audit...)
	}
	h.flashes.put(h.session(r), fl)
	http.Redirect(w, r, h.backURL(s, a), http.StatusSeeOther)
}

// confirm renders the confirmation page from a dry run.
func (h *handler) confirm(w http.ResponseWriter, r *http.Request, a action, s selection, typedErr string, errCode int) {
	dry := s.sel
	dry.DryRun = true
	res, err := a.run(h.adm, r.Context(), dry)
	d := confirmData{Action: a.name, Verb: a.verb, Hidden: s.fields(), Cancel: h.backURL(s, a), Error: typedErr}
	if a.name == "delete" {
		d.Cancel = h.base + "events/" + url.PathEscape(s.sel.Refs[0])
	}
	code := http.StatusOK
	if typedErr != "" {
		code = errCode
	}
	switch {
	case errors.Is(err, admin.ErrRefused):
		d.Text = fmt.Sprintf("Cannot %s: %s of the events named cannot be %s.", a.name, plural(int64(len(res.Refused)), "event"), strings.ToLower(a.past))
		d.Refused = res.Refused
		h.render(w, r, http.StatusConflict, "confirm", a.verb+"?", "", d)
		return
	case err != nil:
		d.Text = fmt.Sprintf("Cannot %s these events.", a.name)
		d.Error = redact.String(err.Error())
		h.render(w, r, http.StatusConflict, "confirm", a.verb+"?", "", d)
		return
	}
	d.Text = fmt.Sprintf("%s %s of %s?", a.verb, plural(res.Matched, a.status+" event"), plural(int64(res.Keys), "key"))
	if a.name == "delete" {
		d.Text = fmt.Sprintf("Delete %s for good?", plural(res.Matched, a.status+" event"))
	}
	if res.Matched > 0 {
		d.Notes = append(d.Notes, idRange(res)+".", a.note, "It runs in one transaction: all of it happens, or none.")
	} else {
		d.Text = fmt.Sprintf("No %s event matches: there is nothing to %s.", a.status, a.name)
		d.Notes = append(d.Notes, "Events that fail later are not included: look again, and act on what you see then.")
	}
	if res.RecentlySent > 0 {
		verb, obj := "were", "their replays"
		if res.RecentlySent == 1 {
			verb, obj = "was", "its replay"
		}
		d.Warn = fmt.Sprintf("%s %s sent less than %s ago: a broker that drops re-sent message ids within a window (NATS JetStream's duplicate window, 2 minutes by default) will drop %s.",
			plural(res.RecentlySent, "event"), verb, humanAge(admin.RecentWindow), obj)
	}
	if res.Matched == 0 {
		// Nothing to confirm: no OK button, which could act on events
		// that match later.
		h.render(w, r, code, "confirm", a.verb, "", d)
		return
	}
	if s.scope == "matching" {
		// Pin what was counted: events that match later with a higher id
		// are not included (and do not make the confirmation stale).
		d.Hidden = append(d.Hidden, field{"to_id", strconv.FormatInt(res.LastID, 10)})
	}
	// The action changes exactly the events counted here, or nothing.
	d.Hidden = append(d.Hidden, field{"expect", strconv.FormatInt(res.Matched, 10)}, field{"digest", res.Digest})
	d.CanOK = true
	if a.name == "delete" {
		ev, err := h.adm.Get(r.Context(), s.sel.Refs[0])
		if err == nil {
			d.Typed, d.TypedFor = true, ev.EventID
		} else {
			d.CanOK = false
		}
	}
	h.render(w, r, code, "confirm", a.verb+"?", "", d)
}

// idRange writes "Row 40" or "Rows 40–57".
func idRange(res admin.Result) string {
	if res.FirstID == res.LastID {
		return fmt.Sprintf("Row %d", res.FirstID)
	}
	return fmt.Sprintf("Rows %d–%d", res.FirstID, res.LastID)
}

// resultFlash says what an action changed.
func (h *handler) resultFlash(a action, s selection, res admin.Result, err error) flash {
	if errors.Is(err, admin.ErrRefused) {
		parts := make([]string, 0, len(res.Refused))
		for i, rf := range res.Refused {
			if i == 10 {
				parts = append(parts, fmt.Sprintf("and %d more", len(res.Refused)-10))
				break
			}
			parts = append(parts, rf.Ref+": "+rf.Reason)
		}
		return flash{Kind: "error", Text: fmt.Sprintf("%s refused: nothing was changed. %s cannot be %s now (%s).",
			a.verb, plural(int64(len(res.Refused)), "event named"), strings.ToLower(a.past), strings.Join(parts, "; "))}
	}
	if err != nil {
		return flash{Kind: "error", Text: fmt.Sprintf("%s failed; nothing was changed: %s", a.verb, redact.String(err.Error()))}
	}
	var b strings.Builder
	fmt.Fprintf(&b, "%s %s", a.past, plural(res.Changed, a.status+" event"))
	if res.Matched > 0 {
		ids := fmt.Sprintf("ids %d–%d", res.FirstID, res.LastID)
		if res.FirstID == res.LastID {
			ids = fmt.Sprintf("id %d", res.FirstID)
		}
		fmt.Fprintf(&b, " (%s, %s)", ids, plural(int64(res.Keys), "key"))
	}
	if res.Released > 0 {
		fmt.Fprintf(&b, "; %s held behind them released", plural(res.Released, "event"))
	}
	b.WriteString(" in one transaction.")
	kind := "ok"
	if res.Changed < res.Matched {
		fmt.Fprintf(&b, " %s matched, but %s changed state meanwhile (a relay or another operator acted on %s) and %s left alone.",
			plural(res.Matched, "event"), plural(res.Matched-res.Changed, "event"), pron(res.Matched-res.Changed), map[bool]string{true: "was", false: "were"}[res.Matched-res.Changed == 1])
		kind = "warn"
	}
	if res.Matched == 0 {
		fmt.Fprintf(&b, " No %s event matched any more: nothing was changed.", a.status)
		kind = "warn"
	}
	if res.RecentlySent > 0 {
		fmt.Fprintf(&b, " %s sent less than %s ago: a broker with a duplicate window may drop %s.", plural(res.RecentlySent, "event"), humanAge(admin.RecentWindow), pron(res.RecentlySent))
		kind = "warn"
	}
	return flash{Kind: kind, Text: b.String()}
}

func pron(n int64) string {
	if n == 1 {
		return "it"
	}
	return "them"
}
