package dialect

// The statement files sql/<dialect>.sql are the query catalog: sqlc checks
// them as written against the DDL templates/ renders, which this test
// writes to sql/schema/<dialect>.sql (`make check-generated` runs this
// test, then `sqlc compile -f runtime/dialect/sql/sqlc.yaml`). Regenerate
// the schema with
//
//	go test ./runtime/dialect -run TestQueryCatalog -update
//
// The tests here check what sqlc cannot: every dialect defines every
// statement its capabilities need and nothing else, every statement
// renders through the Go API (tables filled in, no marker left, one
// argument per placeholder), and on SQLite every rendered statement, with
// and without its optional sections, prepares on the DDL.

import (
	"bytes"
	"database/sql"
	"flag"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/outboxgen/outboxgen/templates"

	_ "modernc.org/sqlite"
)

var update = flag.Bool("update", false, "rewrite the DDL sqlc checks the statements against (sql/schema/)")

// catalogArchive is the archive table of the catalog: the janitor's archive
// has no default name, so the catalog picks one and templates renders it.
const catalogArchive = "outbox_archive"

// catalogTables are the tables of the catalog: the events.yaml defaults
// plus catalogArchive. They are the defaults written in sql/<dialect>.sql.
func catalogTables() templates.Tables {
	t := templates.DefaultTables
	t.Archive = catalogArchive
	return t
}

// catalogUnordered is the unordered type list of the "Unordered" variants.
var catalogUnordered = []string{"AUDIT_LOGGED", "METRIC_SAMPLED"}

// Representative arguments. Only the number of ids changes the text.
var (
	catalogIDs   = []int64{101, 102}
	catalogKeys  = []string{"order-1", "order-2"}
	catalogOwner = "relay-1"
)

// rendered is one statement as the Go API renders it.
type rendered struct {
	name    string // the statement's name in sql/<dialect>.sql
	variant string // "" or what distinguishes this rendering
	sql     string
	args    []any
}

// catalog renders every statement the runtime sends on dialect d with the
// catalog tables, through the exported API.
func catalog(t *testing.T, d Dialect) []rendered {
	t.Helper()
	tb := catalogTables()
	var es []rendered
	add := func(name, variant, sql string, args []any) {
		es = append(es, rendered{name: name, variant: variant, sql: sql, args: args})
	}
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	ins := InsertEventArgs("0190c7a4-0000-7000-8000-000000000001", "ORDER_PAID", "order-1", "orders", 1, `{}`, nil)
	add("OutboxInsertEvent", "", d.InsertEvent(tb.Outbox, false), ins)
	add("OutboxInsertEventIfAbsent", "", d.InsertEvent(tb.Outbox, true), ins)
	add("OutboxEventIdentity", "", d.EventIdentity(tb.Outbox), []any{"0190c7a4-0000-7000-8000-000000000001"})
	if d == Postgres {
		add("OutboxNotifyInsert", "", NotifyInsert(tb.Outbox), nil)
		add("RelayListen", "", Listen(tb.Outbox), nil)
		wq, err := NewWALQueries(d, tb.Outbox)
		must(err)
		s, a := wq.UnsentKeys(100000)
		add("WALUnsentKeys", "", s, a)
		row := ParkedRow{ID: 101, EventID: "0190c7a4-0000-7000-8000-000000000001", Type: "ORDER_PAID", Key: "order-1", Topic: "orders",
			Version: 1, Payload: `{}`, CreatedAt: time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC), Attempts: 1, Delay: time.Minute, LastError: "broker down"}
		s, a = wq.Park(row)
		add("WALPark", "", s, a)
		s, a = wq.ParkIfBlocked(row)
		add("WALParkIfBlocked", "", s, a)
	} else if _, err := NewWALQueries(d, tb.Outbox); err == nil {
		t.Errorf("NewWALQueries accepted %s", d)
	}

	for _, unordered := range [][]string{nil, catalogUnordered} {
		v := ""
		if unordered != nil {
			v = "unordered"
		}
		rq, err := NewRelayQueries(d, tb.Outbox, unordered)
		must(err)
		s, a := rq.Claim(catalogOwner, 30*time.Second, 100, 5*time.Minute, 500*time.Millisecond)
		add("RelayClaim", v, s, a)
		s, a = rq.ClaimOverdue(catalogOwner, 30*time.Second, 100, 5*time.Minute, time.Minute, 500*time.Millisecond)
		add("RelayClaim", strings.TrimPrefix(v+" overdue", " "), s, a)
		if rq.ClaimInTransaction() {
			s, a = rq.ClaimBlocked(catalogIDs, 5*time.Minute)
			add("RelayClaimBlocked", v, s, a)
		}
		if rq.ClaimByCandidates() {
			s, a = rq.ClaimCandidates(200, 0, nil)
			add("RelayClaim", strings.TrimPrefix(v+" candidates", " "), s, a)
			s, a = rq.ClaimCandidates(200, time.Minute, nil)
			add("RelayClaim", strings.TrimPrefix(v+" candidates overdue", " "), s, a)
			for _, overdue := range []time.Duration{0, time.Minute} {
				w := ""
				if overdue > 0 {
					w = " overdue"
				}
				s, a = rq.ClaimCandidates(200, overdue, catalogKeys)
				add("RelayClaim", strings.TrimPrefix(v+" candidates"+w+" skip", " "), s, a)
				s, a = rq.ClaimWindow(100, overdue, catalogKeys)
				add("RelayClaim", strings.TrimPrefix(v+" locking"+w+" skip", " "), s, a)
			}
			s, a = rq.ClaimLock(catalogIDs, 100)
			add("RelayClaimLock", v, s, a)
		}
	}
	rq, err := NewRelayQueries(d, tb.Outbox, nil)
	must(err)
	if rq.ClaimInTransaction() {
		s, a := rq.ClaimLease(catalogOwner, 30*time.Second, catalogIDs)
		add("RelayClaimLease", "", s, a)
		var until any = "2026-12-01 10:00:00.000"
		if rq.HoldsEach() {
			each := make([]any, len(catalogIDs))
			for i := range each {
				each[i] = until
			}
			until = each
		}
		s, a = rq.ClaimHold(until, catalogIDs)
		add("RelayClaimHold", "", s, a)
	}
	{
		s, a := rq.ReleaseHeld(catalogIDs)
		add("RelayReleaseHeld", "", s, a)
		if s, a := rq.LockKeys(catalogIDs); s != "" {
			add("RelayLockKeys", "", s, a)
		}
	}
	if rq.HoldsInFlight() {
		s, a := rq.ReleaseInFlightHeld(catalogIDs)
		add("RelayReleaseInFlightHeld", "", s, a)
		s, a = rq.ArrayIDs().ReleaseInFlightHeld(catalogIDs)
		add("RelayReleaseInFlightHeldArray", "", s, a)
		s, a = rq.ReleaseOrphanHeld()
		add("RelayReleaseOrphanHeld", "", s, a)
	}
	for _, q := range []*RelayQueries{rq, rq.ArrayIDs()} {
		suffix := ""
		if q.arrays {
			suffix = "Array"
		} else if q != rq {
			continue
		}
		s, a := q.MarkSent(catalogOwner, catalogIDs)
		add("RelayMarkSent"+suffix, "", s, a)
		s, a = q.Release(catalogOwner, catalogIDs)
		add("RelayRelease"+suffix, "", s, a)
		s, a = q.ExtendLease(catalogOwner, catalogIDs, 30*time.Second)
		add("RelayExtendLease"+suffix, "", s, a)
		s, a = q.Requeue(catalogIDs)
		add("RelayRequeue"+suffix, "", s, a)
	}
	s, a := rq.MarkRetry(catalogOwner, 101, "broker down", 2*time.Second, 10)
	add("RelayMarkRetry", "", s, a)
	if rq.HoldsEach() {
		s, a = rq.MarkRetryEach(catalogOwner, []RetryEach{{101, "broker down", 2 * time.Second}, {102, "timeout", time.Minute}}, 10)
		add("RelayMarkRetryEach", "", s, a)
	}

	iq, err := NewInboxQueries(d, tb.Inbox)
	must(err)
	s, a = iq.Record("billing", "0190c7a4-0000-7000-8000-000000000001", "ORDER_PAID", "order-1")
	add("InboxRecord", "", s, a)
	s, a = iq.Recorded("billing", "0190c7a4-0000-7000-8000-000000000001")
	add("InboxRecorded", "", s, a)
	s, a = iq.Guard("billing", "ORDER_PAID", "order-1", 101)
	add("InboxGuard", "", s, a)
	s, a = iq.RecordDuplicate("billing", "0190c7a4-0000-7000-8000-000000000001", "ORDER_PAID", "order-1")
	add("InboxRecordDuplicate", "", s, a)

	oq, err := NewOpsQueries(d, tb.Outbox, tb.Inbox)
	must(err)
	s, a = oq.Stats(5 * time.Minute)
	add("OpsStats", "", s, a)
	s, a = oq.IDRange()
	add("OpsIDRange", "", s, a)
	s, a = oq.BoundProbe(7*24*time.Hour, 1)
	add("OpsBoundProbe", "", s, a)
	s, a = oq.DeleteSent(7*24*time.Hour, 1<<40, 1000)
	add("OpsDeleteSent", "", s, a)
	s, a = oq.DeleteInbox(7*24*time.Hour, 1000)
	add("OpsDeleteInbox", "", s, a)
	s, a = oq.DeleteInboxDuplicates(7*24*time.Hour, 1000)
	add("OpsDeleteInboxDuplicates", "", s, a)
	if oq.ArchiveInOneStatement() {
		s, a, err = oq.ArchiveMove(tb.Archive, 7*24*time.Hour, 1<<40, 1000)
		must(err)
		add("OpsArchiveMove", "", s, a)
	} else {
		s, a, err = oq.ArchivePick(tb.Archive, 7*24*time.Hour, 1<<40, 1000)
		must(err)
		add("OpsArchivePick", "", s, a)
		if !oq.ArchiveCopiesOnPick() {
			s, a, err = oq.ArchiveCopy(tb.Archive, catalogIDs)
			must(err)
			add("OpsArchiveCopy", "", s, a)
		}
		s, a = oq.ArchiveDelete(catalogIDs)
		add("OpsArchiveDelete", "", s, a)
	}

	aq, err := NewAdminQueries(d, tb.Outbox, tb.Inbox)
	must(err)
	s, a = aq.PendingStates()
	add("AdminPendingStates", "", s, a)
	s, a = aq.FailedGroups(100)
	add("AdminFailedGroups", "", s, a)
	s, a = aq.HeldBack(nil)
	add("AdminHeldBack", "", s, a)
	s, a = aq.HeldBack(catalogUnordered)
	add("AdminHeldBack", "unordered", s, a)
	s, a = aq.CountSent()
	add("AdminCountSent", "", s, a)
	s, a = aq.MaxID()
	add("AdminMaxID", "", s, a)
	s, a = aq.SentPerMinute(100000, time.Hour)
	add("AdminSentPerMinute", "", s, a)
	s, a, err = aq.FindEvents(EventFilter{Status: -1, Limit: 100})
	must(err)
	add("AdminFindEvents", "", s, a)
	for _, st := range []int{StatusPending, StatusSent, StatusFailed} {
		s, a, err = aq.FindEvents(EventFilter{Status: st, AfterID: 1, ToID: 1000, IDs: catalogIDs,
			EventIDs: []string{"0190c7a4-0000-7000-8000-000000000001"}, Types: []string{"ORDER_PAID"}, Keys: []string{"order-1"},
			Topics: []string{"orders"}, MaxAge: time.Hour, MinAge: time.Minute, ErrorContains: "50%_off!", Limit: 100})
		must(err)
		add("AdminFindEvents", "all filters, status "+strconv.Itoa(st), s, a)
	}
	s, a = aq.GetEvent(101)
	add("AdminGetEvent", "", s, a)
	s, a = aq.GetEventByEventID("0190c7a4-0000-7000-8000-000000000001")
	add("AdminGetEventByEventID", "", s, a)
	s, a = aq.Replay(catalogIDs)
	add("AdminReplay", "", s, a)
	s, a, err = aq.FindInbox(InboxFilter{Consumer: "billing", Limit: 100})
	must(err)
	add("AdminFindInbox", "", s, a)
	s, a, err = aq.FindInbox(InboxFilter{Consumer: "billing", AfterEventID: "a", EventIDs: []string{"e1"}, Types: []string{"ORDER_PAID"},
		Keys: []string{"order-1"}, MaxAge: time.Hour, MinAge: time.Minute, Limit: 100})
	must(err)
	add("AdminFindInbox", "all filters", s, a)
	s, a = aq.ForgetInbox("billing", []string{"e1", "e2"})
	add("AdminForgetInbox", "", s, a)
	s, a = aq.Leases(1000)
	add("AdminLeases", "", s, a)
	s, a = aq.BlockedKeys(nil, "", 100)
	add("AdminBlockedKeys", "", s, a)
	s, a = aq.BlockedKeys(catalogUnordered, "order-1", 100)
	add("AdminBlockedKeys", "unordered", s, a)
	s, a = aq.LockFailed(catalogIDs)
	add("AdminLockFailed", "", s, a)
	s, a = aq.DeleteFailed(catalogIDs)
	add("AdminDeleteFailed", "", s, a)
	s, a = aq.InboxHandled(time.Hour, 100000)
	add("AdminInboxHandled", "", s, a)
	s, a = aq.InboxDuplicates(time.Hour, 100000)
	add("AdminInboxDuplicates", "", s, a)
	s, a = aq.RecentDuplicates("billing", 100)
	add("AdminRecentDuplicates", "", s, a)

	vq, err := NewVersionQueries(d, tb.Outbox)
	must(err)
	add("SchemaVersion", "", vq.Current(), nil)
	add("SchemaVersions", "", vq.Applied(), nil)
	if s, a, ok := vq.Lock(5); ok {
		add("MigrateLock", "", s, a)
	}
	if s, a, ok := vq.Unlock(); ok {
		add("MigrateUnlock", "", s, a)
	}
	return es
}

// TestQueryCatalog checks that sql/schema/ holds the DDL templates/ renders
// (with -update it rewrites it) and that every dialect's file defines
// exactly the statements its capabilities need, each of which prepares.
func TestQueryCatalog(t *testing.T) {
	for _, s := range specs {
		d := s.dialect
		ddl, err := templates.Render(string(d), catalogTables())
		if err != nil {
			t.Fatal(err)
		}
		golden(t, filepath.Join("sql", "schema", string(d)+".sql"), ddl)

		known := map[string]bool{}
		for _, def := range defs {
			known[def.name] = true
			_, has := s.file[def.name]
			switch {
			case def.needed(s) && !has:
				t.Errorf("%s: sql/%s.sql lacks statement %s", d, d, def.name)
			case !def.needed(s) && has:
				t.Errorf("%s: sql/%s.sql defines %s, which its capabilities (spec in dialect.go) do not use", d, d, def.name)
			case has:
				for _, fixed := range []map[string][]string{nil, {"unordered": catalogUnordered}} {
					if _, err := s.prepare(def, tables{outbox: "outbox_event", inbox: "outbox_inbox", archive: catalogArchive}, fixed); err != nil {
						t.Error(err)
					}
				}
			}
		}
		var names []string
		for name := range s.file {
			names = append(names, name)
		}
		sort.Strings(names)
		for _, name := range names {
			if !known[name] {
				t.Errorf("%s: sql/%s.sql defines %s, which no Go code runs: add it to a define(...) list or remove it", d, d, name)
			}
		}
	}
}

// TestStatementsRender renders every statement through the Go API: each
// statement of the files is reached, the default tables come out as
// written, no marker is left, and there is one argument per placeholder.
func TestStatementsRender(t *testing.T) {
	reached := map[string]bool{}
	for _, d := range All {
		for _, e := range catalog(t, d) {
			reached[e.name] = true
			if _, ok := specOf(d).file[e.name]; !ok {
				t.Errorf("%s: %s rendered but not in sql/%s.sql", d, e.name, d)
			}
			for _, m := range []string{"/*", "*/", "sqlc.", "--", "\n", ";", "  ", "TEMPLATE"} {
				if strings.Contains(e.sql, m) {
					t.Errorf("%s %s: %q left in %s", d, e.name, m, e.sql)
				}
			}
			if n := countPlaceholders(d, e.sql); n != len(e.args) {
				t.Errorf("%s %s %s: %d placeholders, %d args: %s", d, e.name, e.variant, n, len(e.args), e.sql)
			}
			// SQLite's claim window is not filtered: its per-key
			// check (and so the unordered list) is in
			// RelayClaimBlocked.
			windowOnly := d == SQLite && e.name == "RelayClaim"
			if strings.HasPrefix(e.variant, "unordered") && !windowOnly && !strings.Contains(e.sql, "biz_type NOT IN") {
				t.Errorf("%s %s: the unordered list is missing: %s", d, e.name, e.sql)
			}
			if e.variant == "" && strings.Contains(e.sql, "biz_type NOT IN") {
				t.Errorf("%s %s: an empty unordered list left its section: %s", d, e.name, e.sql)
			}
		}
	}
	for _, def := range defs {
		if !reached[def.name] {
			t.Errorf("statement %s is not rendered by catalog() in catalog_test.go on any dialect", def.name)
		}
	}
}

func countPlaceholders(d Dialect, s string) int {
	if d != Postgres {
		return strings.Count(s, "?")
	}
	max := 0
	for _, m := range regexp.MustCompile(`\$(\d+)`).FindAllStringSubmatch(s, -1) {
		n, _ := strconv.Atoi(m[1])
		max = maxInt(max, n)
	}
	return max
}

func maxInt(a, b int) int {
	if a > b {
		return a
	}
	return b
}

// TestSQLiteStatementsPrepare prepares every rendered SQLite statement,
// with and without the unordered sections sqlc does not see removed, on an
// in-memory database created from the DDL, and runs the ones that change
// nothing observable on an empty database.
func TestSQLiteStatementsPrepare(t *testing.T) {
	db, err := sql.Open("sqlite", ":memory:")
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	db.SetMaxOpenConns(1)
	ddl, err := templates.Render("sqlite", catalogTables())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := db.Exec(string(ddl)); err != nil {
		t.Fatal(err)
	}
	for _, e := range catalog(t, SQLite) {
		st, err := db.Prepare(e.sql)
		if err != nil {
			t.Errorf("%s %s: %v\n%s", e.name, e.variant, err, e.sql)
			continue
		}
		if _, err := st.Exec(e.args...); err != nil {
			t.Errorf("%s %s: %v\n%s", e.name, e.variant, err, e.sql)
		}
		st.Close()
	}
}

// golden compares path with want, or writes it with -update.
func golden(t *testing.T, path string, want []byte) {
	t.Helper()
	if *update {
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, want, 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	got, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v: run go test ./runtime/dialect -run TestQueryCatalog -update", err)
	}
	if !bytes.Equal(got, want) {
		t.Errorf("runtime/dialect/%s is stale: run go test ./runtime/dialect -run TestQueryCatalog -update", path)
	}
}

// The column sizes the runtime checks before any SQL are the sizes the
// templates declare (SQLite's TEXT columns have none).
func TestColumnSizesMatchTemplates(t *testing.T) {
	for _, d := range []string{"postgres", "mysql"} {
		ddl, err := templates.Render(d, templates.DefaultTables)
		if err != nil {
			t.Fatal(err)
		}
		outbox, inbox := string(ddl), string(ddl[bytes.Index(ddl, []byte("CREATE TABLE outbox_inbox (")):])
		for _, c := range []struct {
			ddl, column string
			size        int
		}{
			{outbox, "biz_type", MaxTypeLen},
			{outbox, "biz_id", MaxKeyLen},
			{outbox, "topic", MaxTopicLen},
			{inbox, "event_id", MaxInboxEventIDLen},
			{inbox, "biz_type", MaxTypeLen},
			{inbox, "biz_id", MaxKeyLen},
		} {
			m := regexp.MustCompile(`(?im)^\s*` + c.column + `\s+varchar\((\d+)\)`).FindStringSubmatch(c.ddl)
			if m == nil || m[1] != strconv.Itoa(c.size) {
				t.Errorf("%s: column %s is declared %v, the runtime checks %d", d, c.column, m, c.size)
			}
		}
	}
}
