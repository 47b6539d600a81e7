package spec

import (
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
)

// specHead is a valid spec up to the events list.
const specHead = "version: 1\ngo: {package: events, out: gen}\nsql: {dialects: [postgres]}\n"

// aliasBomb is the spec of issue 8: n events sharing one anchored list of
// n fields. With n = 3000 it is 240 KB and used to need gigabytes.
func aliasBomb(n int) string {
	var b strings.Builder
	b.WriteString(specHead)
	b.WriteString("x-f: &f\n")
	for i := range n {
		fmt.Fprintf(&b, "  - {name: f%d, type: string}\n", i)
	}
	b.WriteString("events:\n")
	for i := range n {
		fmt.Fprintf(&b, "  - {name: E%d, topic: t, key: f0, fields: *f}\n", i)
	}
	return b.String()
}

// manyEvents is a spec of events events with fields fields each, written
// out (no aliases).
func manyEvents(events, fields int) string {
	var b strings.Builder
	b.WriteString(specHead)
	b.WriteString("events:\n")
	for i := range events {
		fmt.Fprintf(&b, "  - name: E%d\n    topic: t\n    key: f0\n    fields:\n", i)
		for j := range fields {
			fmt.Fprintf(&b, "      - {name: f%d, type: string}\n", j)
		}
	}
	return b.String()
}

// parseErrors parses src and returns its errors, failing the test when
// there are none or one lacks a position.
func parseErrors(t *testing.T, src string) ErrorList {
	t.Helper()
	s, err := Parse("limits.yaml", []byte(src))
	if err == nil {
		t.Fatalf("Parse succeeded (%d events), want an error", len(s.Events))
	}
	list, ok := err.(ErrorList)
	if !ok || len(list) == 0 {
		t.Fatalf("error is %T %v, want an ErrorList", err, err)
	}
	for _, e := range list {
		if e.Pos.Line < 1 || e.Pos.Col < 1 {
			t.Errorf("error without a position: %v", e)
		}
	}
	return list
}

// wantError checks that list holds exactly one error, containing msg, at
// line:col.
func wantError(t *testing.T, list ErrorList, line, col int, msg string) {
	t.Helper()
	if len(list) != 1 || list[0].Pos != (Pos{line, col}) || !strings.Contains(list[0].Msg, msg) {
		t.Errorf("errors:\n%v\nwant one at %d:%d containing %q", list, line, col, msg)
	}
}

// allocatedBy returns the bytes allocated while f runs.
func allocatedBy(f func()) uint64 {
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	f()
	runtime.ReadMemStats(&after)
	return after.TotalAlloc - before.TotalAlloc
}

// TestAliasBomb: a spec whose aliases expand to millions of nodes is
// refused at the alias that crosses MaxAliasExpansion, cheaply.
func TestAliasBomb(t *testing.T) {
	src := aliasBomb(3000)
	var list ErrorList
	alloc := allocatedBy(func() { list = parseErrors(t, src) })
	// Line 3006 is the first event; each alias adds 15,001 nodes (the list
	// and 3,000 fields of 5 nodes), so the seventh one crosses 100,000.
	wantError(t, list, 3006+6, 43, "MaxAliasExpansion")
	if alloc > 100<<20 {
		t.Errorf("Parse allocated %d MB, want < 100 MB", alloc>>20)
	}
}

// TestAliasCycle: an alias inside the value it names is refused at the
// alias.
func TestAliasCycle(t *testing.T) {
	list := parseErrors(t, specHead+"events: &a [{name: A, topic: a, key: id, fields: [*a]}]\n")
	wantError(t, list, 4, 51, "this alias refers to a value that contains it")
}

// TestNestingLimit: YAML nested deeper than MaxNestingDepth is refused,
// even under an ignored x- key and even when an alias does the nesting.
func TestNestingLimit(t *testing.T) {
	deep := strings.Repeat("[", MaxNestingDepth) + strings.Repeat("]", MaxNestingDepth)
	list := parseErrors(t, specHead+"x-deep: "+deep+"\nevents:\n  - {name: A, topic: a, key: id, fields: [{name: id, type: string}]}\n")
	wantError(t, list, 4, 9+MaxNestingDepth-1, "MaxNestingDepth")

	half := strings.Repeat("[", 20) + strings.Repeat("]", 20)
	list = parseErrors(t, specHead+"x-half: &h "+half+"\nx-more: "+strings.Repeat("[", 20)+"*h"+strings.Repeat("]", 20)+"\nevents:\n  - {name: A, topic: a, key: id, fields: [{name: id, type: string}]}\n")
	wantError(t, list, 5, 29, "MaxNestingDepth")
}

// TestCountLimits: more events, fields or enum values than allowed are
// refused at the list, naming the limit.
func TestCountLimits(t *testing.T) {
	list := parseErrors(t, manyEvents(MaxEvents+1, 1))
	wantError(t, list, 5, 3, fmt.Sprintf("the events list has %d events; the limit is %d (MaxEvents)", MaxEvents+1, MaxEvents))

	list = parseErrors(t, manyEvents(1, MaxFields+1))
	wantError(t, list, 9, 7, fmt.Sprintf("event E0 has %d fields; the limit is %d (MaxFields)", MaxFields+1, MaxFields))

	values := strings.TrimSuffix(strings.Repeat("a,", MaxEnumValues+1), ",")
	list = parseErrors(t, specHead+"types:\n  - {name: T, enum: ["+values+"]}\nevents:\n  - {name: A, topic: a, key: id, fields: [{name: id, type: string}]}\n")
	wantError(t, list, 5, 21, fmt.Sprintf("enum of type T has %d values; the limit is %d (MaxEnumValues)", MaxEnumValues+1, MaxEnumValues))

	const event = "events:\n  - {name: A, topic: a, key: id, fields: [{name: id, type: string}]}\n"
	var b strings.Builder
	b.WriteString(specHead + event + "types:\n")
	for i := range MaxTypes + 1 {
		fmt.Fprintf(&b, "  - {name: T%d, enum: [a]}\n", i)
	}
	list = parseErrors(t, b.String())
	wantError(t, list, 7, 3, fmt.Sprintf("the types list has %d types; the limit is %d (MaxTypes)", MaxTypes+1, MaxTypes))

	b.Reset()
	b.WriteString(specHead + event + "consumers:\n")
	for i := range MaxConsumers + 1 {
		fmt.Fprintf(&b, "  - {name: c%d, events: [A]}\n", i)
	}
	list = parseErrors(t, b.String())
	wantError(t, list, 7, 3, fmt.Sprintf("the consumers list has %d consumers; the limit is %d (MaxConsumers)", MaxConsumers+1, MaxConsumers))
}

// TestDeclarationLimit: a spec within each per-list limit but with more
// than MaxDeclarations in total is refused once, where the total is
// crossed.
func TestDeclarationLimit(t *testing.T) {
	n := MaxDeclarations/MaxEnumValues + 1
	var b strings.Builder
	b.WriteString(specHead + "events:\n  - {name: A, topic: a, key: id, fields: [{name: id, type: string}]}\ntypes:\n")
	for i := range n {
		fmt.Fprintf(&b, "  - name: T%d\n    enum: [", i)
		for j := range MaxEnumValues {
			if j > 0 {
				b.WriteString(",")
			}
			fmt.Fprintf(&b, "v%d", j)
		}
		b.WriteString("]\n")
	}
	if b.Len() > MaxSpecBytes {
		t.Fatalf("test spec is %d bytes, more than MaxSpecBytes", b.Len())
	}
	list := parseErrors(t, b.String())
	// The n types count first, then the values of each: those of type n-2
	// (0-based) cross the limit. Types start at line 7, two lines each.
	wantError(t, list, 7+2*(n-2)+1, 11, "MaxDeclarations")
}

// TestMaxErrors: a file with thousands of problems reports MaxErrors of
// them and says it stopped.
func TestMaxErrors(t *testing.T) {
	var b strings.Builder
	b.WriteString(specHead + "events:\n  - name: A\n    topic: a\n    key: f0\n    fields:\n")
	for i := range MaxFields {
		fmt.Fprintf(&b, "      - {name: f%d, type: Unknown}\n", i)
	}
	list := parseErrors(t, b.String())
	if len(list) != MaxErrors+1 {
		t.Fatalf("got %d errors, want %d", len(list), MaxErrors+1)
	}
	if last := list[len(list)-1]; !strings.Contains(last.Msg, "too many problems") {
		t.Errorf("last error = %v, want the too-many note", last)
	}
}

// TestHandlerLimit: consumers handling more than MaxHandlers events in
// total are refused at the list that crosses the limit.
func TestHandlerLimit(t *testing.T) {
	var b strings.Builder
	b.WriteString(specHead + "events:\n")
	for i := range MaxEvents {
		fmt.Fprintf(&b, "  - {name: E%d, topic: t, key: id, fields: [{name: id, type: string}]}\n", i)
	}
	b.WriteString("consumers:\n")
	all := make([]string, MaxEvents)
	for i := range all {
		all[i] = fmt.Sprintf("E%d", i)
	}
	n := MaxHandlers/MaxEvents + 1
	for i := range n {
		fmt.Fprintf(&b, "  - {name: c%d, events: [%s]}\n", i, strings.Join(all, ","))
	}
	list := parseErrors(t, b.String())
	wantError(t, list, 6+MaxEvents+n-1, 24, "MaxHandlers")
}

// TestSpecSizeLimit: Parse and ParseFile refuse more than MaxSpecBytes.
func TestSpecSizeLimit(t *testing.T) {
	big := specHead + "x-pad: \"" + strings.Repeat("a", MaxSpecBytes) + "\"\nevents:\n  - {name: A, topic: a, key: id, fields: [{name: id, type: string}]}\n"
	list := parseErrors(t, big)
	wantError(t, list, 1, 1, "MaxSpecBytes")

	path := filepath.Join(t.TempDir(), "events.yaml")
	if err := os.WriteFile(path, []byte(big), 0o644); err != nil {
		t.Fatal(err)
	}
	_, err := ParseFile(path)
	if list, ok := err.(ErrorList); !ok || len(list) != 1 || list[0].Pos != (Pos{1, 1}) || !strings.Contains(list[0].Msg, "MaxSpecBytes") {
		t.Errorf("ParseFile(%d bytes) = %v, want the MaxSpecBytes error at 1:1", len(big), err)
	}
}

// TestParseFileNotRegular: ParseFile refuses directories and devices
// instead of reading them forever.
func TestParseFileNotRegular(t *testing.T) {
	paths := map[string]string{t.TempDir(): "a directory"}
	if _, err := os.Stat(os.DevNull); err == nil {
		paths[os.DevNull] = "device"
	}
	if _, err := os.Stat("/dev/zero"); err == nil {
		paths["/dev/zero"] = "device"
	}
	for path, want := range paths {
		_, err := ParseFile(path)
		if err == nil || !strings.Contains(err.Error(), want) || !strings.Contains(err.Error(), "not a regular file") {
			t.Errorf("ParseFile(%s) = %v, want an error saying it is %s, not a regular file", path, err, want)
		}
	}
}

func TestLevenshtein(t *testing.T) {
	naive := func(a, b string) int {
		prev := make([]int, len(b)+1)
		for j := range prev {
			prev[j] = j
		}
		for i := 1; i <= len(a); i++ {
			cur := make([]int, len(b)+1)
			cur[0] = i
			for j := 1; j <= len(b); j++ {
				cost := 1
				if a[i-1] == b[j-1] {
					cost = 0
				}
				cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
			}
			prev = cur
		}
		return prev[len(b)]
	}
	words := []string{"", "a", "ab", "ba", "abc", "acb", "order_id", "orderid", "ORDER_PAID", "ORDER_PAYED", "strng", "string", "int64", "int32", "xyzxyz", "zyxzyx", "aaaa", "aaab", "baaa"}
	for _, a := range words {
		for _, b := range words {
			for k := 0; k <= 3; k++ {
				want := min(naive(a, b), k+1)
				if got := levenshtein(a, b, k); got != want {
					t.Errorf("levenshtein(%q, %q, %d) = %d, want %d", a, b, k, got, want)
				}
			}
		}
	}
}

// BenchmarkParseAliasBomb measures refusing the 240 KB alias bomb of issue
// 8 (3,000 events sharing a list of 3,000 fields), which used to take
// seconds and gigabytes.
func BenchmarkParseAliasBomb(b *testing.B) {
	data := []byte(aliasBomb(3000))
	b.ReportAllocs()
	b.SetBytes(int64(len(data)))
	for b.Loop() {
		if _, err := Parse("bomb.yaml", data); err == nil {
			b.Fatal("no error")
		}
	}
}
