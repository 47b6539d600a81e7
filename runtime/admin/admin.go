// Package admin is what an operator does to an outbox: see its state
// (Status, Relays, BlockedKeys), find and inspect events (Find, Get), put
// FAILED events back in the queue (Requeue), delete them for good
// (Delete), publish SENT events again (Replay), see what consumers handled
// and which deliveries were duplicates (Inbox, RecentDuplicates), and make
// a consumer forget events it handled (ForgetInbox).
//
// The outboxgen command's operations (status, failed, requeue, replay,
// inbox forget) and the web console (package runtime/console) are thin
// layers over it, so a service can offer the same actions itself, e.g.
// behind its own admin endpoint. Every query is bounded: limits are
// checked (at most MaxPage rows a page) and reads go through indexes.
//
// An action works in bounded batches of at most BatchSize rows, each one
// transaction: a relay running at the same time sees a batch either whole
// or not at all. With Selection.OneTransaction (the console's choice) the
// whole selection, at most MaxRefs rows, is changed in one transaction
// instead. Batches run in id order, so that the keys held back behind
// requeued rows flow again in order. Actions only change the rows they
// were given or their filter selects, and each reports what it changed.
package admin

import (
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/outboxgen/outboxgen/runtime/dialect"
	"github.com/outboxgen/outboxgen/runtime/driver"
	"github.com/outboxgen/outboxgen/runtime/outbox"
)

// Defaults.
const (
	// DefaultStaleAfter is the seed design's stale alarm: pending for 10
	// minutes.
	DefaultStaleAfter = 10 * time.Minute
	// DefaultWindow is how far back Status reports the send rate.
	DefaultWindow = time.Hour
	// DefaultScanRows bounds the rows Status reads for the send rate.
	DefaultScanRows = 100000
	// BatchSize is the most rows one action statement changes.
	BatchSize = 500
	// MaxRefs is the most ids and event ids one action names.
	MaxRefs = 10000
)

// Admin runs operator queries and actions through a driver.
type Admin struct {
	drv       driver.Driver
	unordered []string
	timeout   time.Duration // per statement; 0: none
}

// WithStatementTimeout returns a copy of a that bounds every statement it
// runs by d (0: no bound beyond the caller's context). An action of many
// batches is bounded per batch, not as a whole, so a big requeue is not
// cut off half-way by a deadline meant for one slow statement.
func (a *Admin) WithStatementTimeout(d time.Duration) *Admin {
	c := *a
	c.timeout = d
	return &c
}

// stmt returns the context of one statement.
func (a *Admin) stmt(ctx context.Context) (context.Context, context.CancelFunc) {
	if a.timeout <= 0 {
		return context.WithCancel(ctx)
	}
	return context.WithTimeout(ctx, a.timeout)
}

// New returns an Admin for drv. Event types listed unordered in the
// driver's schema are never counted as held back.
func New(drv driver.Driver) (*Admin, error) {
	if drv == nil {
		return nil, errors.New("admin: driver is nil: pass the outbox's driver (sqldriver.New or pgxdriver.New)")
	}
	a := &Admin{drv: drv}
	for _, t := range drv.Schema().EventTypes {
		if !t.Ordered {
			a.unordered = append(a.unordered, t.Name)
		}
	}
	return a, nil
}

// Driver returns the driver.
func (a *Admin) Driver() driver.Driver { return a.drv }

// StatusOptions tune Status; the zero value uses the defaults.
type StatusOptions struct {
	StaleAfter time.Duration // default DefaultStaleAfter
	Window     time.Duration // default DefaultWindow
	ScanRows   int64         // default DefaultScanRows
	// CountSent also counts every sent row the table keeps: exact, but on
	// PostgreSQL and SQLite it reads them all (no index holds them), so it
	// costs time in proportion to the retention.
	CountSent bool
}

// Status is the outbox's state, as `outboxgen status` prints it.
type Status struct {
	driver.Overview
	// StaleAfter is the threshold Stale was counted with.
	StaleAfter time.Duration
	// Window is the span of SentPerMinute.
	Window time.Duration
	// SentInWindow sums SentPerMinute.
	SentInWindow int64
	// Took is how long the queries took.
	Took time.Duration
}

// Status reads the outbox's state: it checks the outbox table first, so a
// missing table is reported as such.
func (a *Admin) Status(ctx context.Context, o StatusOptions) (Status, error) {
	if o.StaleAfter <= 0 {
		o.StaleAfter = DefaultStaleAfter
	}
	if o.Window <= 0 {
		o.Window = DefaultWindow
	}
	if o.ScanRows <= 0 {
		o.ScanRows = DefaultScanRows
	}
	sctx, cancel := a.stmt(ctx)
	defer cancel()
	if err := a.drv.Check(sctx, driver.Outbox); err != nil {
		return Status{}, err
	}
	start := time.Now()
	ov, err := a.drv.Overview(sctx, driver.OverviewParams{StaleAfter: o.StaleAfter, Unordered: a.unordered, Window: o.Window, ScanRows: o.ScanRows, CountSent: o.CountSent})
	if err != nil {
		return Status{}, err
	}
	st := Status{Overview: ov, StaleAfter: o.StaleAfter, Window: o.Window, Took: time.Since(start)}
	for _, m := range ov.SentPerMinute {
		st.SentInWindow += m.Sent
	}
	return st, nil
}

// MaxID returns the highest row id of the outbox table (0 when it is
// empty): one index read, for a caller that bounds a scan to the newest
// rows without the cost of Status.
func (a *Admin) MaxID(ctx context.Context) (int64, error) {
	ctx, cancel := a.stmt(ctx)
	defer cancel()
	return a.drv.MaxID(ctx)
}

// Filter selects events. Set fields narrow the selection; lists match any
// of their values.
type Filter struct {
	Types, Keys, Topics []string
	// Since keeps events created at most this long ago; Until events
	// created at least this long ago (by the database clock).
	Since, Until time.Duration
	// ErrorContains keeps events whose last error contains it (any case).
	ErrorContains string
	// FromID and ToID bound the row ids (inclusive; 0: no bound).
	FromID, ToID int64
}

// Empty reports whether f selects every event.
func (f Filter) Empty() bool {
	return len(f.Types) == 0 && len(f.Keys) == 0 && len(f.Topics) == 0 && f.Since == 0 && f.Until == 0 &&
		f.ErrorContains == "" && f.FromID == 0 && f.ToID == 0
}

func (f Filter) query(status int, afterID int64, limit int) driver.EventFilter {
	after := afterID
	if f.FromID > 0 && f.FromID-1 > after {
		after = f.FromID - 1
	}
	return driver.EventFilter{Status: status, AfterID: after, ToID: f.ToID, Types: f.Types, Keys: f.Keys, Topics: f.Topics,
		MaxAge: f.Since, MinAge: f.Until, ErrorContains: f.ErrorContains, Limit: limit}
}

// Find returns up to limit events in status (driver.Failed, Sent,
// Pending, or -1 for any) that f selects, with id > afterID, in id order,
// without payloads: page with the last id returned.
func (a *Admin) Find(ctx context.Context, status driver.RowStatus, f Filter, afterID int64, limit int) ([]driver.Event, error) {
	if limit < 1 || limit > dialect.MaxInList {
		return nil, fmt.Errorf("limit %d: use 1 to %d", limit, dialect.MaxInList)
	}
	ctx, cancel := a.stmt(ctx)
	defer cancel()
	return a.drv.FindEvents(ctx, f.query(int(status), afterID, limit))
}

// Get returns one event in full by ref: a row id (digits) or an event id
// (a UUID).
func (a *Admin) Get(ctx context.Context, ref string) (driver.Event, error) {
	id, eventID, err := ParseRef(ref)
	if err != nil {
		return driver.Event{}, err
	}
	ctx, cancel := a.stmt(ctx)
	defer cancel()
	if eventID != "" {
		return a.drv.GetEventByEventID(ctx, eventID)
	}
	return a.drv.GetEvent(ctx, id)
}

// ParseRef parses a row id (a positive integer) or an event id (a UUID,
// returned in canonical lower case).
func ParseRef(ref string) (id int64, eventID string, err error) {
	ref = strings.TrimSpace(ref)
	if n, err := strconv.ParseInt(ref, 10, 64); err == nil {
		if n < 1 {
			return 0, "", fmt.Errorf("%q: a row id is a positive number", ref)
		}
		return n, "", nil
	}
	e, err := outbox.ParseEventID(ref)
	if err != nil {
		return 0, "", fmt.Errorf("%q is neither a row id (a number) nor an event id (a UUID)", ref)
	}
	return 0, e.String(), nil
}

// Selection names the events an action changes: Refs (row ids or event
// ids), or a Filter; not both. An empty filter selects every event in the
// action's status, which All must confirm.
type Selection struct {
	Refs   []string
	Filter Filter
	All    bool
	// DryRun counts what would change and changes nothing.
	DryRun bool
	// OneTransaction changes every selected event in one transaction
	// (one driver call), so the action happens whole or not at all: the
	// ids are collected first (at most MaxRefs; a bigger selection is
	// refused with an error saying to narrow the filter, or to use the
	// CLI, which works in batches), then changed together. Without it,
	// an action runs in batches of at most BatchSize rows, each its own
	// transaction.
	OneTransaction bool
	// Expect, with OneTransaction, is what a confirmation counted (from
	// a DryRun's Result: Matched and Digest): the action collects the
	// selected ids again and changes nothing, returning a
	// *SelectionChangedError, unless they are exactly the ones counted.
	Expect *Expect
}

// Expect is the selection an operator confirmed.
type Expect struct {
	// Count is the number of events confirmed (Result.Matched).
	Count int64
	// Digest is Digest of their ids (Result.Digest).
	Digest string
}

// Digest returns the hex SHA-256 of ids, sorted, as decimal numbers each
// followed by a newline: what Result.Digest and Expect.Digest hold.
func Digest(ids []int64) string {
	s := slices.Clone(ids)
	slices.Sort(s)
	h := sha256.New()
	var b []byte
	for _, id := range s {
		b = strconv.AppendInt(b[:0], id, 10)
		b = append(b, '\n')
		h.Write(b)
	}
	return hex.EncodeToString(h.Sum(nil))
}

// ErrSelectionChanged is matched (errors.Is) by a *SelectionChangedError.
var ErrSelectionChanged = errors.New("the selection changed since it was confirmed")

// SelectionChangedError is returned when the events a Selection selects
// now are not the ones its Expect confirmed: nothing was changed.
type SelectionChangedError struct {
	// Then is the count confirmed; Now the count selected now.
	Then, Now int64
}

func (e *SelectionChangedError) Error() string {
	if e.Then == e.Now {
		return fmt.Sprintf("the selection changed since you confirmed (%d events then, %d others now): confirm again; nothing was changed", e.Then, e.Now)
	}
	return fmt.Sprintf("the selection changed since you confirmed (%d then, %d now): confirm again; nothing was changed", e.Then, e.Now)
}

// Is reports whether target is ErrSelectionChanged.
func (e *SelectionChangedError) Is(target error) bool { return target == ErrSelectionChanged }

// Refusal says why a named event was not acted on.
type Refusal struct {
	Ref    string `json:"ref"`
	Reason string `json:"reason"`
}

// Result reports what an action changed.
type Result struct {
	// Action is "requeue", "replay", "delete" or "forget".
	Action string `json:"action"`
	// Matched counts the rows selected; Changed the rows changed (fewer
	// when a row's status changed meanwhile, e.g. a relay sent it).
	Matched int64 `json:"matched"`
	Changed int64 `json:"changed"`
	// Batches counts the statements (transactions) that changed rows.
	Batches int `json:"batches"`
	// FirstID and LastID are the lowest and highest row ids selected.
	FirstID int64 `json:"first_id,omitempty"`
	LastID  int64 `json:"last_id,omitempty"`
	// Keys counts the distinct keys of the selected rows.
	Keys int `json:"keys"`
	// Released counts, for a requeue or a delete, the pending rows of
	// those keys that were held back behind the changed rows and were
	// made due again in the same transaction.
	Released int64 `json:"released,omitempty"`
	// Digest, with Selection.OneTransaction, is Digest of the selected
	// ids (ForgetInbox with InboxSelection.OneTransaction: DigestEventIDs
	// of their event ids): pass it back in Expect to act on exactly these.
	Digest string `json:"digest,omitempty"`
	// RecentlySent counts, for a replay, the selected rows sent less than
	// RecentWindow ago (by this machine's clock): a broker that drops
	// re-sent message ids within a window (NATS JetStream's duplicate
	// window, 2 minutes by default) drops their replay.
	RecentlySent int64 `json:"recently_sent,omitempty"`
	// Refused lists named events that were not acted on, and why. When it
	// is not empty, nothing was changed.
	Refused []Refusal `json:"refused,omitempty"`
	DryRun  bool      `json:"dry_run,omitempty"`
}

// RecentWindow is the span Result.RecentlySent looks back: NATS
// JetStream's default duplicate window.
const RecentWindow = 2 * time.Minute

// ErrRefused is returned (wrapped) when named events cannot be acted on;
// Result.Refused says why, one by one.
var ErrRefused = errors.New("some named events cannot be acted on; nothing was changed")

// Requeue makes FAILED events pending again, due now, attempts reset, and
// releases the rows of their keys held behind them, in id order, in
// batches of at most BatchSize (each one transaction), or all in one with
// Selection.OneTransaction.
func (a *Admin) Requeue(ctx context.Context, sel Selection) (Result, error) {
	return a.act(ctx, "requeue", driver.Failed, sel, a.drv.RequeueAndRelease)
}

// Replay makes SENT events pending again, so the relay publishes them
// again: same event id, payload and headers, so consumers' inboxes skip
// the ones they handled (see ForgetInbox). Rows the janitor already
// deleted cannot be replayed.
func (a *Admin) Replay(ctx context.Context, sel Selection) (Result, error) {
	return a.act(ctx, "replay", driver.Sent, sel, func(ctx context.Context, ids []int64) (int64, int64, error) {
		n, err := a.drv.Replay(ctx, ids)
		return n, 0, err
	})
}

// Delete deletes FAILED events for good (named events in another status
// are refused, like Requeue refuses them) and releases the rows of their
// keys held behind them, in id order, in batches of at most BatchSize
// (each one transaction), or all in one with Selection.OneTransaction.
// The events are gone: nothing publishes them, and only the database's
// backups hold them. Result.Action is "delete".
func (a *Admin) Delete(ctx context.Context, sel Selection) (Result, error) {
	return a.act(ctx, "delete", driver.Failed, sel, a.drv.DeleteFailed)
}

// applyFunc changes ids in one transaction and returns the rows changed
// and the held rows released.
type applyFunc func(context.Context, []int64) (changed, released int64, err error)

func (a *Admin) act(ctx context.Context, action string, want driver.RowStatus, sel Selection, apply applyFunc) (Result, error) {
	res := Result{Action: action, DryRun: sel.DryRun}
	if len(sel.Refs) > 0 && !sel.Filter.Empty() {
		return res, errors.New("name events or give a filter, not both")
	}
	if sel.Expect != nil && !sel.OneTransaction {
		return res, errors.New("Selection.Expect needs OneTransaction: a batched action cannot act on exactly the events confirmed")
	}
	if len(sel.Refs) == 0 && sel.Filter.Empty() && !sel.All {
		return res, fmt.Errorf("no events named and no filter given: to %s every %s event, confirm it (All)", action, want)
	}
	keys := map[string]bool{}
	note := func(evs []driver.Event) []int64 {
		ids := make([]int64, len(evs))
		for i, e := range evs {
			ids[i] = e.ID
			if res.FirstID == 0 || e.ID < res.FirstID {
				res.FirstID = e.ID
			}
			res.LastID = max(res.LastID, e.ID)
			keys[e.Key] = true
			if want == driver.Sent && !e.SentAt.IsZero() && time.Since(e.SentAt) < RecentWindow {
				res.RecentlySent++
			}
		}
		res.Matched += int64(len(evs))
		res.Keys = len(keys)
		return ids
	}
	run := func(ids []int64) error {
		if sel.DryRun || len(ids) == 0 {
			return nil
		}
		sctx, cancel := a.stmt(ctx)
		n, rel, err := apply(sctx, ids)
		cancel()
		res.Changed += n
		res.Released += rel
		if n > 0 {
			res.Batches++
		}
		return err
	}
	if sel.OneTransaction {
		return a.actOnce(ctx, action, want, sel, apply, &res, note)
	}
	if len(sel.Refs) > 0 {
		evs, err := a.resolve(ctx, want, action, sel.Refs, &res)
		if err != nil || len(res.Refused) > 0 {
			return res, err
		}
		ids := note(evs)
		for len(ids) > 0 {
			n := min(len(ids), BatchSize)
			if err := run(ids[:n]); err != nil {
				return res, err
			}
			ids = ids[n:]
		}
		return res, nil
	}
	var after int64
	for {
		sctx, cancel := a.stmt(ctx)
		evs, err := a.drv.FindEvents(sctx, sel.Filter.query(int(want), after, BatchSize))
		cancel()
		if err != nil {
			return res, err
		}
		if len(evs) == 0 {
			return res, nil
		}
		after = evs[len(evs)-1].ID
		if err := run(note(evs)); err != nil {
			return res, err
		}
	}
}

// actOnce is act with Selection.OneTransaction: it collects every
// selected id (at most MaxRefs) and changes them with one driver call,
// one transaction.
func (a *Admin) actOnce(ctx context.Context, action string, want driver.RowStatus, sel Selection, apply applyFunc,
	res *Result, note func([]driver.Event) []int64) (Result, error) {
	var ids []int64
	if len(sel.Refs) > 0 {
		evs, err := a.resolve(ctx, want, action, sel.Refs, res)
		if err != nil || len(res.Refused) > 0 {
			return *res, err
		}
		ids = note(evs)
	} else {
		var evs []driver.Event
		var after int64
		for {
			sctx, cancel := a.stmt(ctx)
			page, err := a.drv.FindEvents(sctx, sel.Filter.query(int(want), after, min(BatchSize, MaxRefs+1-len(evs))))
			cancel()
			if err != nil {
				return *res, err
			}
			evs = append(evs, page...)
			if len(evs) > MaxRefs {
				return *res, fmt.Errorf("%s: more than %d %s events match: narrow the filter (e.g. by type, key or id range), or use the outboxgen command, which works in batches", action, MaxRefs, want)
			}
			if len(page) == 0 {
				break
			}
			after = page[len(page)-1].ID
		}
		ids = note(evs)
	}
	res.Digest = Digest(ids)
	if x := sel.Expect; x != nil && (x.Count != res.Matched || x.Digest != res.Digest) {
		return *res, &SelectionChangedError{Then: x.Count, Now: res.Matched}
	}
	if sel.DryRun || len(ids) == 0 {
		return *res, nil
	}
	sctx, cancel := a.stmt(ctx)
	n, rel, err := apply(sctx, ids)
	cancel()
	res.Changed, res.Released = n, rel
	if n > 0 {
		res.Batches = 1
	}
	return *res, err
}

// resolve looks up named events, in id order, and refuses (filling
// res.Refused) those that are missing or not in status want.
func (a *Admin) resolve(ctx context.Context, want driver.RowStatus, action string, refs []string, res *Result) ([]driver.Event, error) {
	if len(refs) > MaxRefs {
		return nil, fmt.Errorf("%d events named: name at most %d at once, or use a filter", len(refs), MaxRefs)
	}
	var ids []int64
	var eventIDs []string
	refOf := map[string]string{} // "id:1" / "event:uuid" -> the ref as given
	for _, r := range refs {
		id, eid, err := ParseRef(r)
		if err != nil {
			return nil, err
		}
		if eid != "" {
			eventIDs = append(eventIDs, eid)
			refOf["event:"+eid] = r
		} else {
			ids = append(ids, id)
			refOf["id:"+strconv.FormatInt(id, 10)] = r
		}
	}
	found := map[string]driver.Event{}
	lookup := func(f driver.EventFilter) error {
		sctx, cancel := a.stmt(ctx)
		defer cancel()
		evs, err := a.drv.FindEvents(sctx, f)
		for _, e := range evs {
			found["id:"+strconv.FormatInt(e.ID, 10)] = e
			found["event:"+e.EventID] = e
		}
		return err
	}
	for len(ids) > 0 {
		n := min(len(ids), dialect.MaxInList)
		if err := lookup(driver.EventFilter{Status: -1, IDs: ids[:n], Limit: n}); err != nil {
			return nil, err
		}
		ids = ids[n:]
	}
	for len(eventIDs) > 0 {
		n := min(len(eventIDs), dialect.MaxInList)
		if err := lookup(driver.EventFilter{Status: -1, EventIDs: eventIDs[:n], Limit: n}); err != nil {
			return nil, err
		}
		eventIDs = eventIDs[n:]
	}
	var out []driver.Event
	seen := map[int64]bool{}
	for _, r := range refs {
		id, eid, _ := ParseRef(r)
		k := "event:" + eid
		if eid == "" {
			k = "id:" + strconv.FormatInt(id, 10)
		}
		e, ok := found[k]
		switch {
		case !ok:
			res.Refused = append(res.Refused, Refusal{Ref: r, Reason: "no such event in the outbox table (never written, or deleted by the janitor)"})
		case e.Status != want:
			res.Refused = append(res.Refused, Refusal{Ref: r, Reason: refusal(action, e)})
		case !seen[e.ID]:
			seen[e.ID] = true
			out = append(out, e)
		}
	}
	if len(res.Refused) > 0 {
		return nil, fmt.Errorf("%s: %w", action, ErrRefused)
	}
	slices.SortFunc(out, func(a, b driver.Event) int { return cmp.Compare(a.ID, b.ID) })
	return out, nil
}

func refusal(action string, e driver.Event) string {
	switch {
	case action == "requeue" && e.Status == driver.Sent:
		return fmt.Sprintf("row %d is sent, not failed: to publish it again, replay it", e.ID)
	case action == "requeue" && e.Status == driver.Pending:
		return fmt.Sprintf("row %d is pending, not failed: the relay will publish it (attempts so far: %d)", e.ID, e.RetryCount)
	case action == "replay" && e.Status == driver.Failed:
		return fmt.Sprintf("row %d is failed, not sent: requeue it instead", e.ID)
	case action == "replay" && e.Status == driver.Pending:
		return fmt.Sprintf("row %d is pending, not sent yet: the relay will publish it", e.ID)
	case action == "delete" && e.Status == driver.Sent:
		return fmt.Sprintf("row %d is sent, not failed: only FAILED rows are deleted by hand (the janitor deletes sent rows)", e.ID)
	case action == "delete" && e.Status == driver.Pending:
		return fmt.Sprintf("row %d is pending, not failed: the relay will publish it (attempts so far: %d)", e.ID, e.RetryCount)
	}
	return fmt.Sprintf("row %d is %s", e.ID, e.Status)
}

// InboxSelection names the inbox rows of one consumer that ForgetInbox
// deletes: by event ids, or by a filter; an empty filter (every row of
// the consumer) needs All.
type InboxSelection struct {
	Consumer    string
	EventIDs    []string
	Types, Keys []string
	// Since and Until bound processed_at, as Filter's bound created_at.
	Since, Until time.Duration
	All          bool
	DryRun       bool
	// OneTransaction forgets every selected row in one transaction: the
	// event ids are collected first (at most MaxRefs; a bigger selection
	// is refused with an error saying to narrow it), then deleted
	// together. Result.Digest is DigestEventIDs of them. Without it,
	// ForgetInbox works in batches of at most BatchSize, each its own
	// statement.
	OneTransaction bool
	// Expect, with OneTransaction, is what a confirmation counted (a
	// DryRun's Result.Matched and Result.Digest): ForgetInbox collects
	// the event ids again and forgets nothing, returning a
	// *SelectionChangedError, unless they are exactly the ones counted
	// (an event handled, or a row deleted by the janitor, since then).
	Expect *Expect
}

// DigestEventIDs returns the hex SHA-256 of event ids, sorted, each
// followed by a newline: Result.Digest of a ForgetInbox, and what its
// Expect.Digest holds.
func DigestEventIDs(ids []string) string {
	s := slices.Clone(ids)
	slices.Sort(s)
	h := sha256.New()
	for _, id := range s {
		h.Write([]byte(id))
		h.Write([]byte{'\n'})
	}
	return hex.EncodeToString(h.Sum(nil))
}

// ForgetInbox deletes a consumer's inbox rows, so that the consumer
// handles those events again when they are delivered again (by Replay).
// It works in batches of at most BatchSize, each one statement, or
// with OneTransaction in one transaction.
func (a *Admin) ForgetInbox(ctx context.Context, sel InboxSelection) (Result, error) {
	res := Result{Action: "forget", DryRun: sel.DryRun}
	if sel.Consumer == "" {
		return res, errors.New("name the consumer whose inbox rows to forget")
	}
	if sel.Expect != nil && !sel.OneTransaction {
		return res, errors.New("InboxSelection.Expect needs OneTransaction: a batched forget cannot act on exactly the rows confirmed")
	}
	if len(sel.EventIDs) > MaxRefs {
		return res, fmt.Errorf("%d event ids: name at most %d at once, or use a filter", len(sel.EventIDs), MaxRefs)
	}
	for i, e := range sel.EventIDs {
		sel.EventIDs[i] = strings.TrimSpace(e)
	}
	empty := len(sel.EventIDs) == 0 && len(sel.Types) == 0 && len(sel.Keys) == 0 && sel.Since == 0 && sel.Until == 0
	if empty && !sel.All {
		return res, fmt.Errorf("no event ids and no filter given: to forget every event consumer %q handled, confirm it (All)", sel.Consumer)
	}
	cctx, cancel := a.stmt(ctx)
	err := a.drv.Check(cctx, driver.Inbox)
	cancel()
	if err != nil {
		return res, err
	}
	keys := map[string]bool{}
	page := func(after string, ids []string) ([]driver.InboxRow, error) {
		sctx, cancel := a.stmt(ctx)
		defer cancel()
		return a.drv.FindInbox(sctx, driver.InboxFilter{Consumer: sel.Consumer, AfterEventID: after, EventIDs: ids,
			Types: sel.Types, Keys: sel.Keys, MaxAge: sel.Since, MinAge: sel.Until, Limit: BatchSize})
	}
	var collected []string // OneTransaction: every selected event id
	forget := func(rows []driver.InboxRow) error {
		res.Matched += int64(len(rows))
		ids := make([]string, len(rows))
		for i, r := range rows {
			ids[i] = r.EventID
			keys[r.Key] = true
		}
		res.Keys = len(keys)
		if sel.OneTransaction {
			if res.Matched > MaxRefs {
				return fmt.Errorf("forget: more than %d inbox rows of consumer %q match: narrow the selection (event ids, type, key, -since/-until), or forget in batches (without OneTransaction)", MaxRefs, sel.Consumer)
			}
			collected = append(collected, ids...)
			return nil
		}
		if sel.DryRun || len(ids) == 0 {
			return nil
		}
		sctx, cancel := a.stmt(ctx)
		n, err := a.drv.ForgetInbox(sctx, sel.Consumer, ids)
		cancel()
		res.Changed += n
		if n > 0 {
			res.Batches++
		}
		return err
	}
	lists := [][]string{nil}
	if len(sel.EventIDs) > 0 {
		lists = nil
		for ids := sel.EventIDs; len(ids) > 0; {
			n := min(len(ids), BatchSize)
			lists = append(lists, ids[:n])
			ids = ids[n:]
		}
	}
	for _, ids := range lists {
		after := ""
		for {
			rows, err := page(after, ids)
			if err != nil {
				return res, err
			}
			if len(rows) == 0 {
				break
			}
			after = rows[len(rows)-1].EventID
			if err := forget(rows); err != nil {
				return res, err
			}
		}
	}
	if !sel.OneTransaction {
		return res, nil
	}
	res.Digest = DigestEventIDs(collected)
	if x := sel.Expect; x != nil && (x.Count != res.Matched || x.Digest != res.Digest) {
		return res, &SelectionChangedError{Then: x.Count, Now: res.Matched}
	}
	if sel.DryRun || len(collected) == 0 {
		return res, nil
	}
	sctx, cancel := a.stmt(ctx)
	n, err := a.drv.ForgetInbox(sctx, sel.Consumer, collected)
	cancel()
	res.Changed = n
	if n > 0 {
		res.Batches = 1
	}
	return res, err
}

// Bounds of the console's queries.
const (
	// MaxRelays is the most relay instances Relays returns.
	MaxRelays = 1000
	// MaxPage is the most rows one page of BlockedKeys or
	// RecentDuplicates returns.
	MaxPage = dialect.MaxInList
	// DefaultInboxWindow is Inbox's window when none is given; MaxInboxWindow
	// the longest it takes.
	DefaultInboxWindow = time.Hour
	MaxInboxWindow     = 7 * 24 * time.Hour
	// InboxScanRows bounds the inbox rows Inbox reads per call: a consumer
	// that handled more within the window is reported as Capped. 50,000
	// keeps the inbox page near 50 ms on MariaDB (which materializes the
	// rows it counts) on a busy two-core machine; PostgreSQL reads 100,000
	// in about 30 ms.
	InboxScanRows = 50000
)

// Relays returns the relay instances holding leases on pending rows,
// most rows first (at most MaxRelays), with how many of their leases
// lapsed: a relay that died shows with every lease expired until the
// sweeper or another relay claims its rows again.
func (a *Admin) Relays(ctx context.Context) ([]driver.RelayLeases, error) {
	ctx, cancel := a.stmt(ctx)
	defer cancel()
	return a.drv.Leases(ctx, MaxRelays)
}

// BlockedKeys returns up to limit (1 to MaxPage) keys whose pending rows
// wait behind a FAILED or backing-off row of the key, in key order after
// afterKey ("" for the first page; then the last key returned). Event
// types listed unordered in the schema never block a key.
func (a *Admin) BlockedKeys(ctx context.Context, afterKey string, limit int) ([]driver.BlockedKey, error) {
	if limit < 1 || limit > MaxPage {
		return nil, fmt.Errorf("limit %d: use 1 to %d", limit, MaxPage)
	}
	ctx, cancel := a.stmt(ctx)
	defer cancel()
	return a.drv.BlockedKeys(ctx, driver.BlockedKeysParams{Unordered: a.unordered, AfterKey: afterKey, Limit: limit})
}

// Inbox returns, per consumer, the events handled and the duplicate
// deliveries recorded within window (0: DefaultInboxWindow; at most
// MaxInboxWindow). It reads at most InboxScanRows inbox rows: a consumer
// that handled more is marked Capped. Duplicates need schema version 2
// (outboxgen migrate up); before it they count 0.
func (a *Admin) Inbox(ctx context.Context, window time.Duration) ([]driver.InboxConsumer, error) {
	if window == 0 {
		window = DefaultInboxWindow
	}
	if window < 0 || window > MaxInboxWindow {
		return nil, fmt.Errorf("inbox window %s: use a positive span of at most %s", window, MaxInboxWindow)
	}
	ctx, cancel := a.stmt(ctx)
	defer cancel()
	if err := a.drv.Check(ctx, driver.Inbox); err != nil {
		return nil, err
	}
	return a.drv.InboxConsumers(ctx, window, InboxScanRows)
}

// RecentDuplicates returns up to limit (1 to MaxPage) of consumer's most
// recent duplicate deliveries, newest first: events delivered again after
// the consumer handled them, which its inbox skipped. None before schema
// version 2 (outboxgen migrate up).
func (a *Admin) RecentDuplicates(ctx context.Context, consumer string, limit int) ([]driver.InboxDuplicate, error) {
	if consumer == "" {
		return nil, errors.New("name the consumer whose duplicate deliveries to list")
	}
	if limit < 1 || limit > MaxPage {
		return nil, fmt.Errorf("limit %d: use 1 to %d", limit, MaxPage)
	}
	ctx, cancel := a.stmt(ctx)
	defer cancel()
	return a.drv.RecentDuplicates(ctx, consumer, limit)
}
