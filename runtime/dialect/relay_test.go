package dialect

import (
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
	"unicode/utf8"
)

func TestRelayQueriesBindAllMarkers(t *testing.T) {
	for _, d := range All {
		for _, unordered := range [][]string{nil, {"A", "B"}} {
			q, err := NewRelayQueries(d, "outbox_event", unordered)
			if err != nil {
				t.Fatal(err)
			}
			stmts := map[string][2]any{}
			add := func(name, s string, args []any) { stmts[name] = [2]any{s, args} }
			s, a := q.Claim("me", time.Second, 10, time.Minute, time.Second)
			add("claim", s, a)
			s, a = q.ClaimOverdue("me", time.Second, 10, time.Minute, time.Minute, time.Second)
			add("overdue", s, a)
			if !strings.Contains(s, "created_at <=") {
				t.Errorf("%s: overdue claim without a created_at cutoff: %s", d, s)
			}
			if q.ClaimInTransaction() {
				s, a = q.ClaimBlocked([]int64{1, 2}, time.Minute)
				add("blocked", s, a)
				s, a = q.ClaimLease("me", time.Second, []int64{1})
				add("lease", s, a)
			}
			s, a = q.MarkSent("me", []int64{1, 2, 3})
			add("sent", s, a)
			s, a = q.MarkRetry("me", 1, "x", time.Second, 5)
			add("retry", s, a)
			s, a = q.Release("me", []int64{1})
			add("release", s, a)
			s, a = q.ExtendLease("me", []int64{1, 2}, time.Second)
			add("extend", s, a)
			s, a = q.Requeue([]int64{1})
			add("requeue", s, a)
			for name, sa := range stmts {
				s, args := sa[0].(string), sa[1].([]any)
				for _, m := range []string{":owner", ":lease", ":limit", ":ids", ":u)", ":overdue"} {
					if strings.Contains(s, m) {
						t.Errorf("%s %s: marker %s left in %s", d, name, m, s)
					}
				}
				n := strings.Count(s, "?")
				if d == Postgres {
					n = strings.Count(s, "$")
				}
				if n != len(args) {
					t.Errorf("%s %s: %d placeholders, %d args: %s", d, name, n, len(args), s)
				}
			}
		}
	}
	if _, err := NewRelayQueries(Postgres, "bad name", nil); err == nil {
		t.Error("bad table name accepted")
	}
}

func TestRelayQueriesArrayIDs(t *testing.T) {
	q, err := NewRelayQueries(Postgres, "outbox_event", nil)
	if err != nil {
		t.Fatal(err)
	}
	a := q.ArrayIDs()
	ids := []int64{1, 2, 3}
	for name, f := range map[string]func(q *RelayQueries) (string, []any){
		"sent":    func(q *RelayQueries) (string, []any) { return q.MarkSent("me", ids) },
		"release": func(q *RelayQueries) (string, []any) { return q.Release("me", ids) },
		"requeue": func(q *RelayQueries) (string, []any) { return q.Requeue(ids) },
	} {
		s, args := f(a)
		if !strings.Contains(s, "id = ANY($1)") || strings.Count(s, "$") != len(args) {
			t.Errorf("%s: %s %v", name, s, args)
		}
		if _, ok := args[0].([]int64); !ok {
			t.Errorf("%s: ids bound as %T", name, args[0])
		}
		if s2, _ := f(q); strings.Contains(s2, "ANY") {
			t.Errorf("%s: ArrayIDs changed the original: %s", name, s2)
		}
	}
	// ExtendLease binds the lease first.
	if s, args := a.ExtendLease("me", ids, time.Second); !strings.Contains(s, "id = ANY($2)") || len(args) != 3 || args[2] != "me" {
		t.Errorf("extend: %s %v", s, args)
	} else if _, ok := args[1].([]int64); !ok {
		t.Errorf("extend: ids bound as %T", args[1])
	}
	m, _ := NewRelayQueries(MySQL, "outbox_event", nil)
	if m.ArrayIDs() != m {
		t.Error("ArrayIDs must be a no-op off PostgreSQL")
	}
}

func TestNotifyStatements(t *testing.T) {
	if got := NotifyInsert("outbox_event"); got != "SELECT pg_notify('outbox_event_insert', '')" {
		t.Fatal(got)
	}
	if got := Listen("outbox_event"); got != "LISTEN outbox_event_insert" {
		t.Fatal(got)
	}
	long := strings.Repeat("x", 63)
	if c := NotifyChannel(long); len(c) != 63 || !ValidIdentifier(c) {
		t.Fatalf("channel %q", c)
	}
}

func TestTruncateError(t *testing.T) {
	if got := TruncateError("short"); got != "short" {
		t.Fatal(got)
	}
	long := strings.Repeat("ab", 2000) + "€"
	if got := TruncateError(long); len(got) != ErrorTextLimit {
		t.Fatalf("len %d", len(got))
	}
	multi := strings.Repeat("€", 1000) // 3 bytes each
	got := TruncateError(multi)
	if len(got) > ErrorTextLimit || !utf8.ValidString(got) || len(got) < ErrorTextLimit-3 {
		t.Fatalf("len %d valid %v", len(got), utf8.ValidString(got))
	}
	if got := TruncateError("a\xff\xfeb\x00c"); got != "a\uFFFDbc" {
		t.Fatalf("not text: %q", got)
	}
	// Cleaned before it is cut: the limit holds with replacements too.
	bad := strings.Repeat("\xff.", 2000)
	if got := TruncateError(bad); len(got) > ErrorTextLimit || !utf8.ValidString(got) {
		t.Fatalf("bad bytes: len %d valid %v", len(got), utf8.ValidString(got))
	}
}

func TestFreeToLease(t *testing.T) {
	c := func(id int64, key string) Candidate { return Candidate{ID: id, Key: key} }
	l := func(id int64, key string, outside int64) LockProbe {
		return LockProbe{ID: id, Key: key, OutsideFront: outside}
	}
	for _, tc := range []struct {
		name   string
		given  []Candidate
		locked []LockProbe
		want   bool
	}{
		{"nothing locked", []Candidate{c(3, "a")}, nil, true},
		{"every row its key's front", []Candidate{c(3, "a"), c(7, "b")}, []LockProbe{l(3, "a", 3), l(7, "b", 7)}, true},
		{"a newer row of the key outside", []Candidate{c(3, "a")}, []LockProbe{l(3, "a", 9)}, true},
		{"an older row of the key locked beside it", []Candidate{c(8, "a"), c(9, "a")}, []LockProbe{l(8, "a", 8), l(9, "a", 9)}, true},
		{"newer candidates of the key not locked", []Candidate{c(8, "a"), c(9, "a"), c(12, "a")}, []LockProbe{l(8, "a", 8), l(9, "a", 9)}, true},
		{"an older candidate of another key not locked", []Candidate{c(4, "b"), c(8, "a"), c(9, "a")}, []LockProbe{l(8, "a", 8), l(9, "a", 9)}, true},
		// 4 is held by another claim, or no longer due: only the
		// per-key statement can tell whether 9 waits for it.
		{"an older candidate of the key not locked", []Candidate{c(4, "a"), c(8, "b"), c(9, "a")}, []LockProbe{l(8, "b", 8), l(9, "a", 9)}, false},
		{"behind a row outside the candidates", []Candidate{c(5, "a")}, []LockProbe{l(5, "a", 2)}, false},
		{"behind a FAILED row", []Candidate{c(4, "a")}, []LockProbe{{ID: 4, Key: "a", OutsideFront: 4, FailedBefore: true}}, false},
	} {
		if got := FreeToLease(tc.given, tc.locked); got != tc.want {
			t.Errorf("%s: FreeToLease = %v, want %v", tc.name, got, tc.want)
		}
	}
}

func TestBehindNotLocked(t *testing.T) {
	c := func(id int64, key string) Candidate { return Candidate{ID: id, Key: key} }
	l := func(id int64, key string) LockProbe { return LockProbe{ID: id, Key: key, OutsideFront: id} }
	failed := LockProbe{ID: 9, Key: "f", OutsideFront: 9, FailedBefore: true}
	for _, tc := range []struct {
		name     string
		given    []Candidate
		locked   []LockProbe
		wantIDs  []int64
		wantKeys []string
		restFree bool // FreeToLease of the rows left
	}{
		{"every candidate locked", []Candidate{c(3, "a"), c(4, "a")}, []LockProbe{l(3, "a"), l(4, "a")}, nil, nil, true},
		{"newer candidates not locked", []Candidate{c(3, "a"), c(4, "a"), c(5, "b")}, []LockProbe{l(3, "a")}, nil, nil, true},
		// Another claim locked a's 3 and 4 (SKIP LOCKED): 5 and 6 wait
		// for them; b's 7 does not.
		{"behind rows another claim locked", []Candidate{c(3, "a"), c(4, "a"), c(5, "a"), c(6, "a"), c(7, "b")},
			[]LockProbe{l(5, "a"), l(6, "a"), l(7, "b")}, []int64{5, 6}, []string{"a"}, true},
		{"two keys", []Candidate{c(1, "a"), c(2, "b"), c(3, "a"), c(4, "b"), c(5, "c")},
			[]LockProbe{l(3, "a"), l(4, "b"), l(5, "c")}, []int64{3, 4}, []string{"a", "b"}, true},
		// 3 is older than the row not locked, 4: it stays.
		{"a gap in the key", []Candidate{c(3, "a"), c(4, "a"), c(5, "a")}, []LockProbe{l(3, "a"), l(5, "a")}, []int64{5}, []string{"a"}, true},
		// A row behind a FAILED one is not BehindNotLocked's to judge.
		{"behind a FAILED row", []Candidate{c(9, "f")}, []LockProbe{failed}, nil, nil, false},
	} {
		ids, keys := BehindNotLocked(tc.given, tc.locked)
		var got []int64
		for id := range ids {
			got = append(got, id)
		}
		slices.Sort(got)
		if !slices.Equal(got, tc.wantIDs) || !slices.Equal(keys, tc.wantKeys) {
			t.Errorf("%s: BehindNotLocked = %v %v, want %v %v", tc.name, got, keys, tc.wantIDs, tc.wantKeys)
		}
		// What is left is free to lease: nothing older of its key is
		// left out.
		var rest []LockProbe
		for _, r := range tc.locked {
			if !ids[r.ID] {
				rest = append(rest, r)
			}
		}
		if got := FreeToLease(tc.given, rest); got != tc.restFree {
			t.Errorf("%s: FreeToLease of the rest %v = %v, want %v", tc.name, rest, got, tc.restFree)
		}
	}
}

func TestInFlightHoldStamp(t *testing.T) {
	for _, id := range []int64{1, 42, 1 << 40} {
		head, ok := InFlightHoldOf(HeldOwner, InFlightHoldStamp(id))
		if !ok || head != id {
			t.Errorf("InFlightHoldOf(InFlightHoldStamp(%d)) = %d, %v", id, head, ok)
		}
	}
	if _, ok := InFlightHoldOf("relay-1", InFlightHoldStamp(7)); ok {
		t.Error("a leased row taken for a held one")
	}
	if _, ok := InFlightHoldOf(HeldOwner, time.Date(2999, 12, 31, 0, 0, 0, 0, time.UTC)); ok {
		t.Error("a hold behind a FAILED or backing-off row taken for one behind a row in flight")
	}
	// The claim and the releases of sql/postgres.sql compute the same
	// stamps in SQL: their base must be inFlightHoldBase.
	src, err := os.ReadFile(filepath.Join("sql", "postgres.sql"))
	if err != nil {
		t.Fatal(err)
	}
	base := "timestamptz '" + inFlightHoldBase.Format("2006-01-02 15:04:05") + "+00'"
	if n, all := strings.Count(string(src), base), strings.Count(string(src), "timestamptz '"); n == 0 || n != all {
		t.Errorf("sql/postgres.sql: %d of its %d timestamptz literals are the hold base %s", n, all, base)
	}
}

// The claim's row limit is in its text, not bound (see asLiteral), on
// every dialect, and the placeholders after it are still numbered 1..n.
func TestClaimLimitIsLiteral(t *testing.T) {
	for _, d := range All {
		q, err := NewRelayQueries(d, "outbox_event", []string{"A"})
		if err != nil {
			t.Fatal(err)
		}
		for name, f := range map[string]func(limit int) (string, []any){
			"claim": func(n int) (string, []any) { return q.Claim("me", time.Second, n, time.Minute, time.Second) },
			"overdue": func(n int) (string, []any) {
				return q.ClaimOverdue("me", time.Second, n, time.Minute, time.Hour, time.Second)
			},
		} {
			s37, a37 := f(37)
			s64, a64 := f(64)
			if !strings.Contains(s37, "LIMIT 37") || !strings.Contains(s64, "LIMIT 64") {
				t.Errorf("%s %s: limit not written into the text: %s", d, name, s37)
			}
			if strings.ReplaceAll(s37, "LIMIT 37", "LIMIT 64") != s64 {
				t.Errorf("%s %s: texts differ by more than the limit:\n%s\n%s", d, name, s37, s64)
			}
			if len(a37) != len(a64) {
				t.Errorf("%s %s: %d args for 37, %d for 64", d, name, len(a37), len(a64))
			}
			if d == Postgres {
				for i := 1; i <= len(a37); i++ {
					if !strings.Contains(s37, "$"+strconv.Itoa(i)+" ") && !strings.Contains(s37, "$"+strconv.Itoa(i)+")") {
						t.Errorf("%s %s: placeholder $%d missing: %s", d, name, i, s37)
					}
				}
				if strings.Contains(s37, "$"+strconv.Itoa(len(a37)+1)) {
					t.Errorf("%s %s: placeholder beyond the %d args: %s", d, name, len(a37), s37)
				}
			}
		}
	}
}
