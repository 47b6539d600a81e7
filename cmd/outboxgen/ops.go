package main

// The operations commands: status, failed list/show, requeue, replay,
// inbox forget. Each parses its flags, opens the database (db.go) and
// calls package runtime/admin, then prints a table (or JSON with -o json).

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"
	"unicode/utf8"

	"github.com/outboxgen/outboxgen/runtime/admin"
	"github.com/outboxgen/outboxgen/runtime/dialect"
	"github.com/outboxgen/outboxgen/runtime/driver"
)

// stdin is where typed confirmations are read from (a variable for tests).
var stdin io.Reader = os.Stdin

// listFlag is a flag that may be repeated, each value possibly a
// comma-separated list.
type listFlag []string

func (l *listFlag) String() string { return strings.Join(*l, ",") }
func (l *listFlag) Set(v string) error {
	for _, s := range strings.Split(v, ",") {
		if s = strings.TrimSpace(s); s != "" {
			*l = append(*l, s)
		}
	}
	return nil
}

// ageFlag is a point in time given as a duration ago ("2h") or an
// RFC 3339 time, kept as a duration ago (the queries bound ages by the
// database clock; an RFC 3339 time is converted with this machine's).
type ageFlag struct{ d time.Duration }

func (a *ageFlag) String() string {
	if a.d == 0 {
		return ""
	}
	return a.d.String()
}
func (a *ageFlag) Set(v string) error {
	if d, err := time.ParseDuration(v); err == nil {
		if d <= 0 {
			return errors.New("use a positive duration (how long ago)")
		}
		a.d = d
		return nil
	}
	t, err := time.Parse(time.RFC3339, v)
	if err != nil {
		return errors.New("use a duration ago (90m, 2h) or an RFC 3339 time (2026-12-01T09:00:00Z)")
	}
	a.d = max(time.Since(t), time.Millisecond)
	return nil
}

// filterFlags are the event selection flags of failed list, requeue and
// replay.
type filterFlags struct {
	types, keys, topics listFlag
	since, until        ageFlag
	errText             string
	fromID, toID        int64
}

func addFilterFlags(fl *flag.FlagSet, withError bool) *filterFlags {
	f := &filterFlags{}
	fl.Var(&f.types, "type", "only events of this type (repeat or comma-separate for several)")
	fl.Var(&f.keys, "key", "only events of this key (biz_id; repeatable)")
	fl.Var(&f.topics, "topic", "only events for this topic (repeatable)")
	fl.Var(&f.since, "since", "only events created since: a duration ago (2h) or an RFC 3339 time")
	fl.Var(&f.until, "until", "only events created before: a duration ago (30m) or an RFC 3339 time")
	if withError {
		fl.StringVar(&f.errText, "error", "", "only events whose last error contains this text (any case)")
	}
	fl.Int64Var(&f.fromID, "from-id", 0, "only rows with id >= this")
	fl.Int64Var(&f.toID, "to-id", 0, "only rows with id <= this")
	return f
}

func (f *filterFlags) filter() admin.Filter {
	return admin.Filter{Types: f.types, Keys: f.keys, Topics: f.topics, Since: f.since.d, Until: f.until.d,
		ErrorContains: f.errText, FromID: f.fromID, ToID: f.toID}
}

// interruptContext is cancelled by SIGINT or SIGTERM.
func interruptContext() (context.Context, context.CancelFunc) {
	return signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
}

// withDB opens the database (within -timeout), runs fn and closes it.
// -timeout bounds connecting and each statement fn runs, not fn as a
// whole: a typed confirmation may take its time, and a requeue of many
// batches is not cut off half-way. Ctrl-C stops fn between statements.
// Errors are one line.
func withDB(dbf *dbFlags, fn func(ctx context.Context, o *opsDB, a *admin.Admin) error) error {
	ctx, cancel := interruptContext()
	defer cancel()
	if err := dbf.check(); err != nil {
		return err
	}
	octx, cancelT := context.WithTimeout(ctx, dbf.timeout)
	defer cancelT()
	o, err := dbf.open(octx)
	if err != nil {
		return fmt.Errorf("outboxgen %s: %s", dbf.fl.Name(), oneLine(err))
	}
	defer o.Close()
	a, err := admin.New(o.Driver)
	if err != nil {
		return err
	}
	if err := fn(ctx, o, a.WithStatementTimeout(dbf.timeout)); err != nil {
		return fmt.Errorf("outboxgen %s: %s", dbf.fl.Name(), oneLine(err))
	}
	return nil
}

func cmdStatus(args []string, stdout, stderr io.Writer) error {
	fl := newFlags("status", "status [-db DSN] [-f events.yaml] [-stale-after 10m] [-o json]", stderr)
	dbf := addDBFlags(fl, true)
	stale := fl.Duration("stale-after", admin.DefaultStaleAfter, "a pending event older than this counts as stale")
	window := fl.Duration("window", admin.DefaultWindow, "report the events sent over this last span")
	scan := fl.Int64("scan-rows", admin.DefaultScanRows, "count the send rate among at most this many newest rows (bounds the cost on a big table)")
	countSent := fl.Bool("count-sent", false, "also count every sent row the table keeps (on PostgreSQL and SQLite this reads them all)")
	walSlot := fl.String("wal-slot", "", "with sql.wal: the WAL relay's replication slot to report (default outboxgen_<outbox table>)")
	if err := parseFlags(fl, args); err != nil {
		return err
	}
	if *scan < 1 || *window <= 0 || *stale <= 0 {
		fmt.Fprintln(stderr, "outboxgen status: -scan-rows, -window and -stale-after must be positive")
		return errUsage
	}
	return withDB(dbf, func(ctx context.Context, o *opsDB, a *admin.Admin) error {
		st, err := a.Status(ctx, admin.StatusOptions{StaleAfter: *stale, Window: *window, ScanRows: *scan, CountSent: *countSent})
		if err != nil {
			return err
		}
		// With sql.wal the replication slot is half of the picture: the
		// table holds only the events the stream parked.
		wal, err := readWALStatus(ctx, dbf, o, *walSlot)
		if err != nil {
			return fmt.Errorf("read the WAL relay's replication slot: %w", err)
		}
		if dbf.json() {
			r := statusJSON(o, st)
			r.WAL = wal
			return writeJSON(stdout, r)
		}
		printStatus(stdout, o, st)
		if wal != nil {
			fmt.Fprintf(stdout, "\nWAL mode (sql.wal): %s\n", wal)
		}
		return nil
	})
}

// statusReport is status -o json.
type statusReport struct {
	Database         string               `json:"database"`
	Table            string               `json:"table"`
	Pending          int64                `json:"pending"`
	OldestPendingAge float64              `json:"oldest_pending_age_seconds"`
	StaleAfter       float64              `json:"stale_after_seconds"`
	Stale            int64                `json:"stale"`
	BackingOff       int64                `json:"backing_off"`
	InFlight         int64                `json:"in_flight"`
	Relays           int64                `json:"relays_holding_leases"`
	ExpiredLeases    int64                `json:"expired_leases"`
	Failed           int64                `json:"failed"`
	Sent             int64                `json:"sent,omitempty"`
	FailedGroups     []driver.FailedGroup `json:"failed_by_type"`
	HeldBackKeys     int64                `json:"held_back_keys"`
	HeldBackRows     int64                `json:"held_back_rows"`
	WindowSeconds    float64              `json:"window_seconds"`
	SentInWindow     int64                `json:"sent_in_window"`
	SentFromID       int64                `json:"sent_counted_above_id,omitempty"`
	SentPerMinute    []driver.MinuteStat  `json:"sent_per_minute"`
	TookSeconds      float64              `json:"took_seconds"`
	// WAL is the WAL relay's replication slot, with sql.wal only.
	WAL *walStatus `json:"wal,omitempty"`
}

func statusJSON(o *opsDB, st admin.Status) statusReport {
	r := statusReport{
		Database: o.Source.Where, Table: o.Schema.Tables.Outbox,
		Pending: st.Pending, OldestPendingAge: st.OldestPendingAge.Seconds(), StaleAfter: st.StaleAfter.Seconds(), Stale: st.Stale,
		BackingOff: st.BackingOff, InFlight: st.InFlight, Relays: st.Relays, ExpiredLeases: st.ExpiredLeases,
		Failed: st.Failed, Sent: max(st.Sent, 0), SentFromID: st.SentFromID, FailedGroups: st.FailedGroups, HeldBackKeys: st.HeldBackKeys, HeldBackRows: st.HeldBackRows,
		WindowSeconds: st.Window.Seconds(), SentInWindow: st.SentInWindow, SentPerMinute: st.SentPerMinute, TookSeconds: st.Took.Seconds(),
	}
	if r.FailedGroups == nil {
		r.FailedGroups = []driver.FailedGroup{}
	}
	if r.SentPerMinute == nil {
		r.SentPerMinute = []driver.MinuteStat{}
	}
	return r
}

func printStatus(w io.Writer, o *opsDB, st admin.Status) {
	fmt.Fprintf(w, "outbox %s on %s\n\n", o.Schema.Tables.Outbox, o.Source.Where)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintf(tw, "pending\t%d\toldest %s\n", st.Pending, roundAge(st.OldestPendingAge))
	fmt.Fprintf(tw, "  stale\t%d\tpending longer than %s%s\n", st.Stale, st.StaleAfter, alert(st.Stale > 0, "ALERT"))
	fmt.Fprintf(tw, "  in flight\t%d\tleased by %d relay %s\n", st.InFlight, st.Relays, plural(int(st.Relays), "instance", "instances"))
	fmt.Fprintf(tw, "  backing off\t%d\twaiting to retry after a failed publish\n", st.BackingOff)
	fmt.Fprintf(tw, "  expired leases\t%d\tclaimed by a relay that stopped; claimable again%s\n", st.ExpiredLeases, alert(st.ExpiredLeases > 0, "a relay died"))
	fmt.Fprintf(tw, "failed\t%d\twaiting for an operator%s\n", st.Failed, alert(st.Failed > 0, "see: outboxgen failed list"))
	fmt.Fprintf(tw, "held back\t%d\trows of %d %s waiting behind a failed or backing-off event of the same key\n",
		st.HeldBackRows, st.HeldBackKeys, plural(int(st.HeldBackKeys), "key", "keys"))
	var maxLag float64
	var lagSum float64
	for _, m := range st.SentPerMinute {
		maxLag = max(maxLag, m.MaxLag)
		lagSum += m.AvgLag * float64(m.Sent)
	}
	lag := ""
	if st.SentInWindow > 0 {
		lag = fmt.Sprintf(", commit-to-publish lag avg %s, max %s", roundAge(time.Duration(lagSum/float64(st.SentInWindow)*float64(time.Second))), roundAge(time.Duration(maxLag*float64(time.Second))))
	}
	among := ""
	if st.SentFromID > 0 {
		among = fmt.Sprintf(" among the rows after id %d", st.SentFromID)
	}
	fmt.Fprintf(tw, "sent\t%d\tin the last %s%s (%s/min)%s\n", st.SentInWindow, st.Window, among, rate(float64(st.SentInWindow)/st.Window.Minutes()), lag)
	if st.Sent >= 0 {
		fmt.Fprintf(tw, "  kept\t%d\tsent rows kept until the janitor's retention\n", st.Sent)
	}
	tw.Flush()
	if st.SentFromID > 0 {
		fmt.Fprintf(w, "\n(the send rate counts the newest rows only, ids after %d: a bigger -scan-rows counts further back)\n", st.SentFromID)
	}
	if len(st.FailedGroups) > 0 {
		fmt.Fprintln(w, "\nfailed by type and topic:")
		tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
		fmt.Fprintln(tw, "  TYPE\tTOPIC\tCOUNT\tFIRST ID\tLAST FAILED")
		for _, g := range st.FailedGroups {
			fmt.Fprintf(tw, "  %s\t%s\t%d\t%d\t%s\n", clean(g.Type, 40), clean(g.Topic, 40), g.Count, g.FirstID, stamp(g.LastFailedAt))
		}
		tw.Flush()
	}
	if len(st.SentPerMinute) > 0 {
		fmt.Fprintf(w, "\nsent per minute, newest first (minutes with none left out):\n")
		tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
		fmt.Fprintln(tw, "  MINUTES AGO\tSENT\tAVG LAG\tMAX LAG")
		for i, m := range st.SentPerMinute {
			if i == 10 {
				break
			}
			fmt.Fprintf(tw, "  %d\t%d\t%s\t%s\n", m.MinutesAgo, m.Sent, roundAge(seconds(m.AvgLag)), roundAge(seconds(m.MaxLag)))
		}
		tw.Flush()
		if n := len(st.SentPerMinute) - 10; n > 0 {
			fmt.Fprintf(w, "  … and %d earlier %s (-o json lists them all)\n", n, plural(n, "minute", "minutes"))
		}
	}
	fmt.Fprintf(w, "\n(queried in %s)\n", st.Took.Round(time.Millisecond))
}

// rate prints a per-minute rate with two significant digits when small.
func rate(r float64) string {
	if r < 10 {
		return strconv.FormatFloat(r, 'g', 2, 64)
	}
	return strconv.FormatFloat(r, 'f', 0, 64)
}

func alert(on bool, what string) string {
	if on {
		return "  <- " + what
	}
	return ""
}

func seconds(s float64) time.Duration { return time.Duration(s * float64(time.Second)) }

// roundAge prints an age to a precision a person reads.
func roundAge(d time.Duration) string {
	switch {
	case d <= 0:
		return "-"
	case d < time.Second:
		return d.Round(time.Millisecond).String()
	case d < time.Minute:
		return d.Round(100 * time.Millisecond).String()
	}
	return d.Round(time.Second).String()
}

func stamp(t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	return t.UTC().Format("2006-01-02 15:04:05Z")
}

// clean makes text from the database safe to print on a terminal: control
// characters (escape sequences) become spaces, invalid UTF-8 '?', and it is
// cut to n runes (0: no cut).
func clean(s string, n int) string { return cleanText(s, n, false) }

// cleanText is clean, keeping line breaks and tabs when multiline.
func cleanText(s string, n int, multiline bool) string {
	var b strings.Builder
	count := 0
	for i, r := range s {
		if multiline && (r == '\n' || r == '\t') {
			b.WriteRune(r)
			continue
		}
		if n > 0 && count == n {
			b.WriteString("…")
			break
		}
		switch {
		case r == utf8.RuneError && !strings.HasPrefix(s[i:], "\uFFFD"):
			b.WriteByte('?')
		case r < 0x20 || r == 0x7f || (r >= 0x80 && r < 0xa0):
			b.WriteByte(' ')
		default:
			b.WriteRune(r)
		}
		count++
	}
	return b.String()
}

const failedUsage = "usage: outboxgen failed list [flags] | outboxgen failed show ID|EVENT_ID | outboxgen failed delete [ID|EVENT_ID ...] [flags]"

func cmdFailed(args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 || (args[0] != "list" && args[0] != "show" && args[0] != "delete") {
		if len(args) > 0 && (args[0] == "-h" || args[0] == "-help" || args[0] == "--help") {
			fmt.Fprintln(stdout, failedUsage)
			return nil
		}
		fmt.Fprintln(stderr, failedUsage)
		return errUsage
	}
	switch args[0] {
	case "show":
		return cmdShow(args[1:], stdout, stderr)
	case "delete":
		return cmdDeleteFailed(args[1:], stdout, stderr)
	}
	fl := newFlags("failed list", "failed list [-type T] [-key K] [-topic T] [-since 2h] [-error TEXT] [-limit 50] [-after ID] [-o json]", stderr)
	dbf := addDBFlags(fl, true)
	ff := addFilterFlags(fl, true)
	limit := fl.Int("limit", 50, "list at most this many (1 to 1000)")
	after := fl.Int64("after", 0, "list rows with a larger id (the next page: pass the last id listed)")
	if err := parseFlags(fl, args[1:]); err != nil {
		return err
	}
	if *limit < 1 || *limit > 1000 {
		fmt.Fprintln(stderr, "outboxgen failed list: -limit: use 1 to 1000")
		return errUsage
	}
	return withDB(dbf, func(ctx context.Context, o *opsDB, a *admin.Admin) error {
		if err := o.Driver.Check(ctx, driver.Outbox); err != nil {
			return err
		}
		evs, err := a.Find(ctx, driver.Failed, ff.filter(), *after, *limit)
		if err != nil {
			return err
		}
		if dbf.json() {
			out := struct {
				Events []eventJSON `json:"events"`
				Next   int64       `json:"next_after,omitempty"`
			}{Events: []eventJSON{}}
			for _, e := range evs {
				out.Events = append(out.Events, toJSON(e))
			}
			if len(evs) == *limit {
				out.Next = evs[len(evs)-1].ID
			}
			return writeJSON(stdout, out)
		}
		if len(evs) == 0 {
			fmt.Fprintln(stdout, "no failed events match")
			return nil
		}
		tw := tabwriter.NewWriter(stdout, 0, 0, 2, ' ', 0)
		fmt.Fprintln(tw, "ID\tEVENT ID\tTYPE\tKEY\tTOPIC\tATTEMPTS\tFAILED AT\tLAST ERROR")
		for _, e := range evs {
			fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\t%d\t%s\t%s\n", e.ID, e.EventID, clean(e.Type, 40), clean(e.Key, 40), clean(e.Topic, 40),
				e.RetryCount, stamp(e.UpdatedAt), clean(e.LastError, 60))
		}
		tw.Flush()
		if len(evs) == *limit {
			fmt.Fprintf(stdout, "\nmore may follow: outboxgen failed list -after %d\n", evs[len(evs)-1].ID)
		}
		return nil
	})
}

// eventJSON is one event in -o json output.
type eventJSON struct {
	driver.Event
	Status  string          `json:"status"`
	Payload json.RawMessage `json:"payload,omitempty"`
	Headers json.RawMessage `json:"headers,omitempty"`
}

func toJSON(e driver.Event) eventJSON {
	j := eventJSON{Event: e, Status: e.Status.String()}
	if len(e.Payload) > 0 {
		j.Payload = rawJSON(e.Payload)
	}
	if len(e.Headers) > 0 {
		j.Headers = rawJSON(e.Headers)
	}
	return j
}

// rawJSON returns b when it is valid JSON, else b as a JSON string.
func rawJSON(b []byte) json.RawMessage {
	if json.Valid(b) {
		return json.RawMessage(b)
	}
	s, _ := json.Marshal(string(b))
	return s
}

func cmdShow(args []string, stdout, stderr io.Writer) error {
	fl := newFlags("failed show", "failed show ID|EVENT_ID [-o json]", stderr)
	dbf := addDBFlags(fl, true)
	// The ref may come before the flags.
	var ref string
	if len(args) > 0 && !strings.HasPrefix(args[0], "-") {
		ref, args = args[0], args[1:]
	}
	if err := fl.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return err
		}
		return errUsage
	}
	if ref == "" && fl.NArg() == 1 {
		ref = fl.Arg(0)
	} else if fl.NArg() > 0 || ref == "" {
		fmt.Fprintln(stderr, "outboxgen failed show: name one event: its row id or its event id")
		fl.Usage()
		return errUsage
	}
	if _, _, err := admin.ParseRef(ref); err != nil {
		fmt.Fprintf(stderr, "outboxgen failed show: %v\n", err)
		return errUsage
	}
	return withDB(dbf, func(ctx context.Context, o *opsDB, a *admin.Admin) error {
		if err := o.Driver.Check(ctx, driver.Outbox); err != nil {
			return err
		}
		e, err := a.Get(ctx, ref)
		if err != nil {
			return err
		}
		if dbf.json() {
			return writeJSON(stdout, toJSON(e))
		}
		printEvent(stdout, e)
		return nil
	})
}

func printEvent(w io.Writer, e driver.Event) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	row := func(k, v string) { fmt.Fprintf(tw, "%s\t%s\n", k, v) }
	row("id", strconv.FormatInt(e.ID, 10))
	row("event id", e.EventID)
	row("status", e.Status.String())
	row("type", clean(e.Type, 0)+" (payload version "+strconv.Itoa(e.Version)+")")
	row("key", clean(e.Key, 0))
	row("topic", clean(e.Topic, 0))
	row("attempts", strconv.Itoa(e.RetryCount))
	row("created", stamp(e.CreatedAt))
	row("updated", stamp(e.UpdatedAt))
	switch e.Status {
	case driver.Sent:
		row("sent", stamp(e.SentAt))
	case driver.Pending:
		head, inFlightHeld := dialect.InFlightHoldOf(e.LeaseOwner, e.NextRetryAt)
		switch {
		case inFlightHeld:
			row("held back", "until event "+strconv.FormatInt(head, 10)+", an older event of its key whose publish is slow, is recorded")
		case e.LeaseOwner == dialect.HeldOwner:
			row("held back", "behind an older event of its key until "+stamp(e.NextRetryAt)+" (a requeue of that event releases it)")
		case e.LeaseOwner != "" && !e.LeaseExpiresAt.IsZero():
			row("next attempt", stamp(e.NextRetryAt))
			row("leased by", clean(e.LeaseOwner, 0)+" until "+stamp(e.LeaseExpiresAt))
		default:
			row("next attempt", stamp(e.NextRetryAt))
		}
	}
	if e.LastError != "" {
		row("last error", clean(e.LastError, 0))
	}
	tw.Flush()
	fmt.Fprintln(w, "headers:")
	writeIndented(w, e.Headers)
	fmt.Fprintln(w, "payload:")
	writeIndented(w, e.Payload)
}

// writeIndented pretty-prints a JSON document (or shows the bytes as text
// when they are not JSON), indented by two spaces.
func writeIndented(w io.Writer, b []byte) {
	if len(b) == 0 || string(b) == "null" {
		fmt.Fprintln(w, "  (none)")
		return
	}
	// Bounded: indentation grows with the square of the nesting depth
	// (admin.IndentJSON); a document nested too deep is shown as stored.
	if text, ok := admin.IndentJSON(b, "  ", 1<<20); ok {
		fmt.Fprintf(w, "  %s\n", cleanText(text, 0, true))
		return
	}
	fmt.Fprintf(w, "  %s\n", clean(string(b), 0))
}

// actionFlags are the flags requeue and replay share.
type actionFlags struct {
	all, yes, dryRun bool
}

func addActionFlags(fl *flag.FlagSet, what string) *actionFlags {
	a := &actionFlags{}
	fl.BoolVar(&a.all, "all", false, "act on every "+what+" event (needs -yes, or a typed confirmation)")
	fl.BoolVar(&a.yes, "yes", false, "do not ask for confirmation")
	fl.BoolVar(&a.dryRun, "dry-run", false, "say what would change; change nothing")
	return a
}

// confirm asks for a typed confirmation of an action on n rows.
func confirm(stdout io.Writer, verb string, n int64) error {
	want := fmt.Sprintf("%s %d", verb, n)
	fmt.Fprintf(stdout, "This will %s %d %s. Type %q to go on: ", verb, n, plural(int(n), "event", "events"), want)
	line, _ := bufio.NewReader(io.LimitReader(stdin, 256)).ReadString('\n')
	if strings.TrimSpace(line) != want {
		return errors.New("not confirmed: nothing was changed (pass -yes to skip the question)")
	}
	return nil
}

func cmdRequeue(args []string, stdout, stderr io.Writer) error {
	return action(args, stdout, stderr, "requeue", "failed",
		"requeue [ID|EVENT_ID ...] [-type T] [-key K] [-topic T] [-since 2h] [-until 10m] [-error TEXT] [-all -yes] [-dry-run]",
		func(a *admin.Admin) func(context.Context, admin.Selection) (admin.Result, error) { return a.Requeue })
}

func cmdReplay(args []string, stdout, stderr io.Writer) error {
	return action(args, stdout, stderr, "replay", "sent",
		"replay [ID|EVENT_ID ...] [-type T] [-key K] [-topic T] [-since 2h] [-until 10m] [-from-id N] [-to-id N] [-all -yes] [-dry-run]",
		func(a *admin.Admin) func(context.Context, admin.Selection) (admin.Result, error) { return a.Replay })
}

// cmdDeleteFailed deletes FAILED events for good (`outboxgen failed
// delete`): always after a typed confirmation naming the number, unless
// -yes.
func cmdDeleteFailed(args []string, stdout, stderr io.Writer) error {
	return action(args, stdout, stderr, "delete", "failed",
		"failed delete [ID|EVENT_ID ...] [-type T] [-key K] [-topic T] [-since 2h] [-until 10m] [-error TEXT] [-all] [-yes] [-dry-run]",
		func(a *admin.Admin) func(context.Context, admin.Selection) (admin.Result, error) { return a.Delete })
}

// action runs requeue, replay or delete: events named as arguments, or
// selected by filter flags (-all for every one); a typed confirmation (for
// -all, and for every delete, unless -yes), after which the action changes
// the rows counted or nothing (confirmedAction); a report of what changed.
func action(args []string, stdout, stderr io.Writer, verb, status, synopsis string,
	do func(*admin.Admin) func(context.Context, admin.Selection) (admin.Result, error)) error {
	fl := newFlags(verb, synopsis, stderr)
	dbf := addDBFlags(fl, true)
	ff := addFilterFlags(fl, verb != "replay")
	af := addActionFlags(fl, status)
	refs, err := parseInterspersed(fl, args)
	if err != nil {
		return err
	}
	for _, r := range refs {
		if _, _, err := admin.ParseRef(r); err != nil {
			fmt.Fprintf(stderr, "outboxgen %s: %v\n", verb, err)
			return errUsage
		}
	}
	sel := admin.Selection{Refs: refs, Filter: ff.filter(), All: af.all, DryRun: af.dryRun}
	switch {
	case len(refs) > 0 && (!sel.Filter.Empty() || af.all):
		fmt.Fprintf(stderr, "outboxgen %s: name events or give filters (or -all), not both\n", verb)
		return errUsage
	case len(refs) == 0 && sel.Filter.Empty() && !af.all:
		fmt.Fprintf(stderr, "outboxgen %s: name events (row ids or event ids), give filters, or pass -all for every %s event\n", verb, status)
		fl.Usage()
		return errUsage
	case af.all && !sel.Filter.Empty():
		fmt.Fprintf(stderr, "outboxgen %s: -all acts on every %s event: drop the filters, or -all\n", verb, status)
		return errUsage
	}
	return withDB(dbf, func(ctx context.Context, o *opsDB, a *admin.Admin) error {
		if err := o.Driver.Check(ctx, driver.Outbox); err != nil {
			return err
		}
		run := do(a)
		// A delete cannot be undone: it is always confirmed. -yes asks
		// nothing, so nothing is counted first and no time passes between
		// a count and the action: it changes what the selection matches
		// when it runs, in batches of admin.BatchSize. -dry-run only
		// counts.
		if (af.all || verb == "delete") && !af.yes && !af.dryRun {
			want := driver.Failed
			if status == "sent" {
				want = driver.Sent
			}
			return confirmedAction(ctx, stdout, stderr, dbf.json(), a, run, verb, status, want, sel)
		}
		res, err := run(ctx, sel)
		if errors.Is(err, admin.ErrRefused) {
			return refused(stdout, stderr, dbf.json(), res, len(refs))
		}
		if err != nil && res.Changed == 0 {
			return err
		}
		// Report what changed, also when a later batch failed.
		if rerr := report(stdout, dbf.json(), verb, status, res); err == nil {
			err = rerr
		}
		return err
	})
}

// refused prints why named events were refused and returns the error.
func refused(stdout, stderr io.Writer, asJSON bool, res admin.Result, named int) error {
	if asJSON {
		_ = writeJSON(stdout, res)
	} else {
		for _, r := range res.Refused {
			fmt.Fprintf(stderr, "%s: %s\n", clean(r.Ref, 80), r.Reason)
		}
	}
	return fmt.Errorf("refused %d of %d named %s; nothing was changed", len(res.Refused), named, plural(named, "event", "events"))
}

// actionChunk is the most rows a confirmed action changes in one
// transaction: admin.MaxRefs, what Selection.OneTransaction takes (a
// variable for tests).
var actionChunk = admin.MaxRefs

// actionFunc is admin's Requeue, Replay or Delete.
type actionFunc func(context.Context, admin.Selection) (admin.Result, error)

// confirmedAction counts the selection, asks for a typed confirmation
// naming the count, and then changes exactly the rows it counted, or
// nothing: the selection is pinned to their ids (Selection.OneTransaction
// with an Expect of their count and digest, as the console does). A row
// that matches only after the count is never changed unconfirmed, whatever
// its id: ids are given at insert, so a pending row older than the ones
// counted can turn FAILED, or be sent, while the operator types. When a
// row counted or a row within their id range changed state meanwhile, the
// action is refused and changes nothing; rows past the highest id counted
// are left alone (they were inserted after the count, or matched only
// later, and were not confirmed).
//
// A selection of more than actionChunk rows is pinned in chunks of
// consecutive id ranges, each counted and digested: each chunk is checked
// (a dry run with its Expect) before any is changed, then each is changed
// in its own transaction, again with its Expect. Only a change in the
// moment between the check and a chunk's turn stops the action part-way:
// the chunks before it stay changed (and are reported), the rest are not
// touched.
func confirmedAction(ctx context.Context, stdout, stderr io.Writer, asJSON bool, a *admin.Admin, run actionFunc,
	verb, status string, want driver.RowStatus, sel admin.Selection) error {
	p, res, err := pinSelection(ctx, a, run, want, sel)
	switch {
	case errors.Is(err, admin.ErrRefused):
		// A named event is not in the status the action needs: refused
		// before asking, and nothing is run.
		return refused(stdout, stderr, asJSON, res, len(sel.Refs))
	case err != nil:
		return err
	case p.matched == 0:
		return report(stdout, asJSON, verb, status, admin.Result{Action: verb, DryRun: true})
	}
	if err := confirm(stdout, verb, p.matched); err != nil {
		return err
	}
	if len(p.chunks) > 1 {
		for _, c := range p.chunks {
			dry := c
			dry.DryRun = true
			if _, err := run(ctx, dry); err != nil {
				if msg := selectionChanged(err, status, c); msg != nil {
					return fmt.Errorf("%w: nothing was changed; run the command again to count anew", msg)
				}
				return err
			}
		}
	}
	total := admin.Result{Action: verb}
	for i, c := range p.chunks {
		r, err := run(ctx, c)
		if errors.Is(err, admin.ErrRefused) && total.Changed == 0 {
			// A named event changed state meanwhile.
			return refused(stdout, stderr, asJSON, r, len(sel.Refs))
		}
		if err == nil || r.Changed > 0 {
			total.Matched += r.Matched
			total.Changed += r.Changed
			total.Released += r.Released
			total.Keys += r.Keys // a key in two chunks counts twice
			total.Batches += r.Batches
			total.RecentlySent += r.RecentlySent
			if total.FirstID == 0 {
				total.FirstID = r.FirstID
			}
			total.LastID = max(total.LastID, r.LastID)
		}
		if err != nil {
			msg := selectionChanged(err, status, c)
			if total.Changed == 0 {
				if msg != nil {
					return fmt.Errorf("%w: nothing was changed; run the command again to count anew", msg)
				}
				return err
			}
			if msg != nil {
				err = msg
			}
			// Report the chunks changed before this one.
			if rerr := report(stdout, asJSON, verb, status, total); rerr != nil {
				return rerr
			}
			return fmt.Errorf("stopped after %d of %d transactions, whose changes are reported above: %w; the rest was not changed: run the command again to count what is left", i, len(p.chunks), err)
		}
	}
	return report(stdout, asJSON, verb, status, total)
}

// pinned is a selection as a confirmation counted it.
type pinned struct {
	matched int64
	// chunks are the selections to run: OneTransaction, each with the
	// Expect of what was counted in it.
	chunks []admin.Selection
}

// pinSelection counts what sel selects and pins it: named events with a
// dry run (their ids are fixed; it refuses those not in status want), a
// filter by reading the ids it selects, in id order, cut into id ranges
// of at most actionChunk rows.
func pinSelection(ctx context.Context, a *admin.Admin, run actionFunc, want driver.RowStatus, sel admin.Selection) (pinned, admin.Result, error) {
	var p pinned
	sel.OneTransaction = true
	if len(sel.Refs) > 0 {
		dry := sel
		dry.DryRun = true
		res, err := run(ctx, dry)
		if err != nil {
			return p, res, err
		}
		sel.Expect = &admin.Expect{Count: res.Matched, Digest: res.Digest}
		p.matched, p.chunks = res.Matched, []admin.Selection{sel}
		return p, res, nil
	}
	var ids []int64 // of the chunk being read: at most actionChunk
	from := sel.Filter.FromID
	cut := func() {
		c := sel
		c.Filter.FromID = from
		c.Filter.ToID = ids[len(ids)-1]
		c.Expect = &admin.Expect{Count: int64(len(ids)), Digest: admin.Digest(ids)}
		p.chunks = append(p.chunks, c)
		from = c.Filter.ToID + 1
		ids = ids[:0]
	}
	var after int64
	for {
		evs, err := a.Find(ctx, want, sel.Filter, after, dialect.MaxInList)
		if err != nil {
			return p, admin.Result{}, err
		}
		if len(evs) == 0 {
			break
		}
		for _, e := range evs {
			ids = append(ids, e.ID)
			p.matched++
			if len(ids) == actionChunk {
				cut()
			}
		}
		after = evs[len(evs)-1].ID
	}
	if len(ids) > 0 {
		cut()
	}
	return p, admin.Result{}, nil
}

// selectionChanged words the refusal of chunk c of a confirmed action
// whose selection changed after the count (its Expect no longer holds):
// the action changed nothing in c. It returns nil for other errors.
func selectionChanged(err error, status string, c admin.Selection) error {
	var sc *admin.SelectionChangedError
	switch {
	case !errors.As(err, &sc):
		return nil
	case len(c.Refs) > 0:
		return errors.New("the events named changed since the count you confirmed")
	}
	now := fmt.Sprintf("%d now", sc.Now)
	if sc.Now == sc.Then {
		now = fmt.Sprintf("%d others now", sc.Now)
	}
	return fmt.Errorf("the %s events selected changed since the count you confirmed (ids %d to %d: %d then, %s)",
		status, max(c.Filter.FromID, 1), c.Filter.ToID, sc.Then, now)
}

// parseInterspersed parses flags and positional arguments in any order.
func parseInterspersed(fl *flag.FlagSet, args []string) ([]string, error) {
	var pos []string
	for {
		if err := fl.Parse(args); err != nil {
			if errors.Is(err, flag.ErrHelp) {
				return nil, err
			}
			return nil, errUsage
		}
		if fl.NArg() == 0 {
			return pos, nil
		}
		pos = append(pos, fl.Arg(0))
		args = fl.Args()[1:]
	}
}

func report(w io.Writer, asJSON bool, verb, status string, r admin.Result) error {
	if asJSON {
		return writeJSON(w, r)
	}
	past := map[string]string{"requeue": "requeued", "replay": "replayed", "delete": "deleted", "forget": "forgot"}[verb]
	if r.Matched == 0 {
		fmt.Fprintf(w, "no %s events match: nothing changed\n", status)
		return nil
	}
	if r.DryRun {
		fmt.Fprintf(w, "dry run: would %s %d %s (ids %d..%d, %d %s); nothing changed\n", verb, r.Matched, plural(int(r.Matched), "event", "events"),
			r.FirstID, r.LastID, r.Keys, plural(r.Keys, "key", "keys"))
		return nil
	}
	released := ""
	if r.Released > 0 {
		// Requeue and delete release the rows held behind them in the
		// same transactions: say so.
		released = fmt.Sprintf("; %d %s held behind them released", r.Released, plural(int(r.Released), "event", "events"))
	}
	fmt.Fprintf(w, "%s %d %s (ids %d..%d, %d %s)%s in %d %s\n", past, r.Changed, plural(int(r.Changed), "event", "events"),
		r.FirstID, r.LastID, r.Keys, plural(r.Keys, "key", "keys"), released, r.Batches, plural(r.Batches, "transaction", "transactions"))
	if skipped := r.Matched - r.Changed; skipped > 0 {
		fmt.Fprintf(w, "%d selected %s changed state meanwhile (no longer %s) and %s left alone\n", skipped, plural(int(skipped), "event", "events"), status, plural(int(skipped), "was", "were"))
	}
	switch verb {
	case "delete":
		fmt.Fprintln(w, "they are gone for good (only a backup holds them); the events of their keys held back behind them are released and the relay publishes them in order, unless an older event of the same key is still FAILED")
	case "requeue":
		fmt.Fprintln(w, "they are pending again with attempts reset; the relay publishes them on its next poll, and the events held back behind them follow in order, unless an older event of the same key is still FAILED (outboxgen status shows the keys still held back)")
	case "replay":
		fmt.Fprintln(w, "they are pending again; the relay publishes them with their original event ids, so consumers that handled them skip them (outboxgen inbox forget makes a consumer handle them again)")
		if r.RecentlySent > 0 {
			fmt.Fprintf(w, "warning: %d of them %s sent less than %s ago: NATS JetStream drops a message id it saw within the stream's duplicate window (2 minutes by default), so there they are marked sent again without reaching consumers; replay once the window has passed\n",
				r.RecentlySent, plural(int(r.RecentlySent), "was", "were"), admin.RecentWindow)
		}
	}
	return nil
}

func cmdInbox(args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 || args[0] != "forget" {
		fmt.Fprintln(stderr, "usage: outboxgen inbox forget -consumer NAME [EVENT_ID ...] [-type T] [-key K] [-since 2h] [-until 10m] [-all -yes] [-dry-run]")
		return errUsage
	}
	fl := newFlags("inbox forget", "inbox forget -consumer NAME [EVENT_ID ...] [-type T] [-key K] [-since 2h] [-until 10m] [-all -yes] [-dry-run]", stderr)
	dbf := addDBFlags(fl, true)
	consumer := fl.String("consumer", "", "the consumer whose inbox rows to delete (its name in events.yaml) (required)")
	var types, keys listFlag
	var since, until ageFlag
	fl.Var(&types, "type", "only events of this type (repeatable)")
	fl.Var(&keys, "key", "only events of this key (repeatable)")
	fl.Var(&since, "since", "only events handled since: a duration ago (2h) or an RFC 3339 time")
	fl.Var(&until, "until", "only events handled before: a duration ago or an RFC 3339 time")
	af := addActionFlags(fl, "handled")
	ids, err := parseInterspersed(fl, args[1:])
	if err != nil {
		return err
	}
	if *consumer == "" {
		fmt.Fprintln(stderr, "outboxgen inbox forget: -consumer is required")
		return errUsage
	}
	sel := admin.InboxSelection{Consumer: *consumer, EventIDs: ids, Types: types, Keys: keys, Since: since.d, Until: until.d, All: af.all, DryRun: af.dryRun}
	filtered := len(types) > 0 || len(keys) > 0 || since.d > 0 || until.d > 0
	switch {
	case len(ids) == 0 && !filtered && !af.all:
		fmt.Fprintln(stderr, "outboxgen inbox forget: name event ids, give filters, or pass -all for every event the consumer handled")
		return errUsage
	case af.all && (filtered || len(ids) > 0):
		fmt.Fprintln(stderr, "outboxgen inbox forget: -all forgets every event the consumer handled: drop the event ids and filters, or -all")
		return errUsage
	}
	return withDB(dbf, func(ctx context.Context, o *opsDB, a *admin.Admin) error {
		// -all asks first, naming the count, and then forgets the rows
		// counted. -yes asks nothing and counts nothing first: it forgets
		// the rows there when it runs. -dry-run only counts.
		if af.all && !af.yes && !af.dryRun {
			return confirmedForget(ctx, stdout, dbf.json(), o, a, dbf.timeout, sel)
		}
		res, err := a.ForgetInbox(ctx, sel)
		if err != nil && res.Changed == 0 {
			return err
		}
		if rerr := forgetReport(stdout, dbf.json(), *consumer, res); err == nil {
			err = rerr
		}
		return err
	})
}

// inboxPinMax is the most inbox rows inbox forget -all pins by their event
// ids (about 100 bytes each in memory; a variable for tests).
var inboxPinMax = 100000

// confirmedForget is inbox forget -all with a typed confirmation: it
// counts the consumer's inbox rows, asks, and then forgets those rows and
// no others. The rows are pinned by the event ids read at the count
// (up to inboxPinMax, where admin.InboxSelection.Expect takes at most
// admin.MaxRefs): ForgetInbox then forgets the rows of those event ids that
// are still there (rows deleted meanwhile, by the janitor or another
// operator, count as not forgotten), never an event the consumer handled
// while the operator typed. A consumer with more than inboxPinMax rows is
// counted again after the confirmation instead, and the forget is refused,
// changing nothing, when the count differs: only the moment between that
// recount and the forget is left unpinned.
func confirmedForget(ctx context.Context, stdout io.Writer, asJSON bool, o *opsDB, a *admin.Admin, timeout time.Duration, sel admin.InboxSelection) error {
	cctx, cancel := context.WithTimeout(ctx, timeout)
	err := o.Driver.Check(cctx, driver.Inbox)
	cancel()
	if err != nil {
		return err
	}
	ids, keys, err := inboxEventIDs(ctx, o.Driver, timeout, sel.Consumer, inboxPinMax+1)
	if err != nil {
		return err
	}
	if len(ids) > inboxPinMax {
		return confirmedForgetRecount(ctx, stdout, asJSON, a, sel)
	}
	if len(ids) == 0 {
		return forgetReport(stdout, asJSON, sel.Consumer, admin.Result{Action: "forget", DryRun: true})
	}
	if err := confirm(stdout, "forget", int64(len(ids))); err != nil {
		return err
	}
	total := admin.Result{Action: "forget"}
	for len(ids) > 0 {
		n := min(len(ids), admin.MaxRefs)
		res, err := a.ForgetInbox(ctx, admin.InboxSelection{Consumer: sel.Consumer, EventIDs: ids[:n]})
		total.Matched += res.Matched
		total.Changed += res.Changed
		total.Batches += res.Batches
		total.Keys = keys
		if err != nil {
			if total.Changed > 0 {
				_ = forgetReport(stdout, asJSON, sel.Consumer, total)
			}
			return err
		}
		ids = ids[n:]
	}
	return forgetReport(stdout, asJSON, sel.Consumer, total)
}

// confirmedForgetRecount is confirmedForget for a consumer with more
// inbox rows than it pins: count, confirm, count again and forget only
// when the count is the one confirmed.
func confirmedForgetRecount(ctx context.Context, stdout io.Writer, asJSON bool, a *admin.Admin, sel admin.InboxSelection) error {
	dry := sel
	dry.DryRun = true
	res, err := a.ForgetInbox(ctx, dry)
	if err != nil {
		return err
	}
	if res.Matched == 0 {
		return forgetReport(stdout, asJSON, sel.Consumer, res)
	}
	if err := confirm(stdout, "forget", res.Matched); err != nil {
		return err
	}
	again, err := a.ForgetInbox(ctx, dry)
	if err != nil {
		return err
	}
	if again.Matched != res.Matched {
		return fmt.Errorf("the inbox rows of consumer %q changed since the count you confirmed (%d then, %d now): nothing was forgotten; run the command again to count anew",
			clean(sel.Consumer, 64), res.Matched, again.Matched)
	}
	res, err = a.ForgetInbox(ctx, sel)
	if err != nil && res.Changed == 0 {
		return err
	}
	if rerr := forgetReport(stdout, asJSON, sel.Consumer, res); err == nil {
		err = rerr
	}
	return err
}

// inboxEventIDs returns the event ids of consumer's inbox rows, at most
// limit, and the number of distinct keys among them.
func inboxEventIDs(ctx context.Context, drv driver.Driver, timeout time.Duration, consumer string, limit int) ([]string, int, error) {
	var ids []string
	keys := map[string]bool{}
	after := ""
	for len(ids) < limit {
		sctx, cancel := context.WithTimeout(ctx, timeout)
		rows, err := drv.FindInbox(sctx, driver.InboxFilter{Consumer: consumer, AfterEventID: after, Limit: min(admin.BatchSize, limit-len(ids))})
		cancel()
		if err != nil {
			return nil, 0, err
		}
		if len(rows) == 0 {
			break
		}
		for _, r := range rows {
			ids = append(ids, r.EventID)
			keys[r.Key] = true
		}
		after = rows[len(rows)-1].EventID
	}
	return ids, len(keys), nil
}

func forgetReport(w io.Writer, asJSON bool, consumer string, r admin.Result) error {
	if asJSON {
		return writeJSON(w, r)
	}
	switch {
	case r.Matched == 0:
		fmt.Fprintf(w, "consumer %q has no inbox rows that match: nothing changed\n", clean(consumer, 64))
	case r.DryRun:
		fmt.Fprintf(w, "dry run: would make consumer %q forget %d %s; nothing changed\n", clean(consumer, 64), r.Matched, plural(int(r.Matched), "event", "events"))
	default:
		fmt.Fprintf(w, "consumer %q forgot %d %s (%d inbox rows deleted in %d %s): it handles them again when they are delivered again (outboxgen replay), except latest_only events, which its stale guard still skips unless they are newer than the last one it applied\n",
			clean(consumer, 64), r.Changed, plural(int(r.Changed), "event", "events"), r.Changed, r.Batches, plural(r.Batches, "transaction", "transactions"))
	}
	return nil
}
