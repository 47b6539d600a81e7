package dialect

import (
	"slices"
	"strings"
	"testing"
	"time"
)

// opsStatements builds every monitor and janitor statement of d.
func opsStatements(t *testing.T, d Dialect) map[string][2]any {
	t.Helper()
	q, err := NewOpsQueries(d, "outbox_event", "outbox_inbox")
	if err != nil {
		t.Fatal(err)
	}
	out := map[string][2]any{}
	add := func(name, s string, args []any) { out[name] = [2]any{s, args} }
	s, a := q.Stats(10 * time.Minute)
	add("stats", s, a)
	s, a = q.IDRange()
	add("idRange", s, a)
	s, a = q.BoundProbe(7*24*time.Hour, 42)
	add("boundProbe", s, a)
	s, a = q.DeleteSent(7*24*time.Hour, 500, 1000)
	add("deleteSent", s, a)
	s, a = q.DeleteInbox(7*24*time.Hour, 1000)
	add("deleteInbox", s, a)
	if q.ArchiveInOneStatement() {
		s, a, err = q.ArchiveMove("outbox_archive", time.Hour, 500, 10)
		if err != nil {
			t.Fatal(err)
		}
		add("archiveMove", s, a)
	} else {
		s, a, err = q.ArchivePick("outbox_archive", time.Hour, 500, 10)
		if err != nil {
			t.Fatal(err)
		}
		add("archivePick", s, a)
		if !q.ArchiveCopiesOnPick() {
			s, a, err = q.ArchiveCopy("outbox_archive", []int64{1, 2})
			if err != nil {
				t.Fatal(err)
			}
			add("archiveCopy", s, a)
		}
		s, a = q.ArchiveDelete([]int64{1, 2, 3})
		add("archiveDelete", s, a)
	}
	return out
}

func TestOpsQueriesBindings(t *testing.T) {
	for _, d := range All {
		for name, sa := range opsStatements(t, d) {
			s, args := sa[0].(string), sa[1].([]any)
			var marks int
			if d == Postgres {
				for i := len(args) + 1; i > 0; i-- {
					if strings.Contains(s, d.Placeholder(i)) {
						marks = i
						break
					}
				}
			} else {
				marks = strings.Count(s, "?")
			}
			if marks != len(args) {
				t.Errorf("%s %s: %d placeholders, %d args\n%s", d, name, marks, len(args), s)
			}
			for _, a := range args {
				if _, ok := a.(time.Time); ok {
					t.Errorf("%s %s binds a time.Time: timestamps must come from the database clock\n%s", d, name, s)
				}
			}
		}
	}
}

// The janitor's batches read no row past the bound (SentBound).
func TestOpsQueriesBounded(t *testing.T) {
	for _, d := range All {
		for name, sa := range opsStatements(t, d) {
			if name == "deleteSent" || name == "archiveMove" || name == "archivePick" {
				if s := sa[0].(string); !strings.Contains(s, "id <= ") {
					t.Errorf("%s %s lacks the bound:\n%s", d, name, s)
				}
			}
		}
	}
}

func TestSentBound(t *testing.T) {
	day := int64(24 * 3600)
	for _, c := range []struct {
		name    string
		created map[int64]int64 // id -> age in seconds
		bound   int64
		ok      bool
	}{
		{"empty", map[int64]int64{}, 0, false},
		{"all young", map[int64]int64{1: 1, 2: 1}, 0, false},
		{"all old", map[int64]int64{3: 9 * day, 4: 9 * day, 9: 8 * day}, 9, true},
		{"old then young", map[int64]int64{1: 9 * day, 2: 9 * day, 3: 8 * day, 4: day, 5: 1}, 3, true},
		{"gaps", map[int64]int64{10: 9 * day, 500: 9 * day, 501: day, 90000: 1}, 500, true},
		{"one row", map[int64]int64{7: 9 * day}, 7, true},
		{"young first", map[int64]int64{1: day, 2: 9 * day}, 0, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			var ids []int64
			for id := range c.created {
				ids = append(ids, id)
			}
			slices.Sort(ids)
			probes := 0
			bound, ok, err := SentBound(func() (int64, int64, error) {
				if len(ids) == 0 {
					return 0, 0, nil
				}
				return ids[0], ids[len(ids)-1], nil
			}, func(from int64) (int64, bool, bool, error) {
				probes++
				i, _ := slices.BinarySearch(ids, from)
				if i == len(ids) {
					return 0, false, false, nil
				}
				return ids[i], c.created[ids[i]] > 7*day, true, nil
			})
			if err != nil || bound != c.bound || ok != c.ok {
				t.Errorf("SentBound = %d, %v, %v; want %d, %v", bound, ok, err, c.bound, c.ok)
			}
			if probes > 20 {
				t.Errorf("%d probes", probes)
			}
		})
	}
}

// The janitor's outbox statements must only ever touch sent rows.
func TestOpsQueriesOnlySentRows(t *testing.T) {
	for _, d := range All {
		for name, sa := range opsStatements(t, d) {
			s := sa[0].(string)
			if name == "stats" || name == "deleteInbox" || name == "archiveCopy" {
				continue
			}
			if name == "idRange" || name == "boundProbe" {
				// The bound's reads (SentBound): they change nothing.
				if !strings.HasPrefix(s, "SELECT ") || strings.Contains(s, "FOR UPDATE") {
					t.Errorf("%s %s must be a plain read:\n%s", d, name, s)
				}
				continue
			}
			if !strings.Contains(s, "status = 1") {
				t.Errorf("%s %s lacks the status = 1 guard:\n%s", d, name, s)
			}
		}
	}
}

func TestOpsQueriesStatsUsesPendingOnly(t *testing.T) {
	for _, d := range All {
		s := opsStatements(t, d)["stats"][0].(string)
		if !strings.HasSuffix(s, "WHERE status = 0") {
			t.Errorf("%s stats must read pending rows only (the claim index):\n%s", d, s)
		}
		if strings.Contains(s, "FILTER") {
			t.Errorf("%s stats uses FILTER, which MySQL lacks:\n%s", d, s)
		}
	}
}

func TestOpsQueriesRejectBadNames(t *testing.T) {
	if _, err := NewOpsQueries("oracle", "a", "b"); err == nil {
		t.Error("unknown dialect accepted")
	}
	if _, err := NewOpsQueries(Postgres, "Bad-Name", "b"); err == nil {
		t.Error("bad outbox name accepted")
	}
	if _, err := NewOpsQueries(Postgres, "a", "b;"); err == nil {
		t.Error("bad inbox name accepted")
	}
	for _, d := range All {
		q, err := NewOpsQueries(d, "outbox_event", "outbox_inbox")
		if err != nil {
			t.Fatal(err)
		}
		for _, bad := range []string{"", "x y", "outbox_event", "outbox_inbox", "ARCHIVE"} {
			var err error
			if q.ArchiveInOneStatement() {
				_, _, err = q.ArchiveMove(bad, time.Hour, 1, 1)
			} else {
				_, _, err = q.ArchivePick(bad, time.Hour, 1, 1)
			}
			if err == nil {
				t.Errorf("%s: archive table %q accepted", d, bad)
			}
		}
	}
}

func TestOpsQueriesArchiveKindMismatch(t *testing.T) {
	pg, _ := NewOpsQueries(Postgres, "outbox_event", "outbox_inbox")
	if _, _, err := pg.ArchivePick("outbox_archive", time.Hour, 1, 1); err == nil {
		t.Error("PostgreSQL ArchivePick accepted, want an error pointing at ArchiveMove")
	}
	my, _ := NewOpsQueries(MySQL, "outbox_event", "outbox_inbox")
	if _, _, err := my.ArchiveMove("outbox_archive", time.Hour, 1, 1); err == nil {
		t.Error("MySQL ArchiveMove accepted, want an error")
	}
}

func TestDurationEncoding(t *testing.T) {
	for d, want := range map[Dialect]any{Postgres: 90.0, MySQL: int64(90_000_000), SQLite: "90.000000 seconds"} {
		if got := mustSpec(d).encode(90 * time.Second); got != want {
			t.Errorf("%s: %v (%T), want %v", d, got, got, want)
		}
	}
	if got := mustSpec(SQLite).encode("x"); got != "x" {
		t.Errorf("non-duration changed: %v", got)
	}
}
