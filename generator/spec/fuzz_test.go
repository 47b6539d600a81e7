package spec

import (
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// fuzzBudget is the most one Parse call may take in FuzzParse. Inputs are
// bounded by MaxSpecBytes and every other limit, so a real spec parses in
// milliseconds; an input that takes longer is a bug (a blow-up the limits
// miss), and failing on it makes the fuzzer save it. This is the one place
// a timing check is right: it bounds one call, generously.
const fuzzBudget = time.Second

// fuzzMinimizeTime replaces go test's default -fuzzminimizetime of 60s.
// Minimizing an input costs O(n²) calls for n bytes: a 1 KB YAML input,
// at about 75µs a call with coverage instrumentation, needs more than a
// minute, during which the worker reports no executions. With two workers
// minimizing, a short fuzz run (make fuzz) stalled at 0 execs/s after
// about 15 s and fuzzed nothing after that.
const fuzzMinimizeTime = "1s"

func TestMain(m *testing.M) {
	flag.Parse()
	set := false
	flag.Visit(func(f *flag.Flag) { set = set || f.Name == "test.fuzzminimizetime" })
	if !set {
		if err := flag.Set("test.fuzzminimizetime", fuzzMinimizeTime); err != nil {
			panic(err)
		}
	}
	os.Exit(m.Run())
}

// FuzzParse checks that Parse never panics, that failures are always a
// non-empty ErrorList with real positions, and that successes are fully
// resolved.
func FuzzParse(f *testing.F) {
	files, _ := filepath.Glob("testdata/*.yaml")
	files = append(files, filepath.Join("..", "..", "events.yaml"))
	for _, name := range files {
		if data, err := os.ReadFile(name); err == nil {
			f.Add(data)
		}
	}
	for _, tc := range errorCases {
		f.Add([]byte(tc.src))
	}
	for _, tc := range previousErrorCases {
		f.Add([]byte(tc.src))
	}
	f.Add([]byte(previousHead + "  - &e {name: A, topic: a, key: id, version: 3, fields: [{name: id, type: string}], previous: [{version: 1, fields: [{name: id, type: string}]}, {version: 2, fields: *e}]}\n"))
	// The inputs of issue 8 that exhausted memory, at a size that still
	// crosses each limit.
	// sql.wal (valid beside other dialects; errorCases hold the invalid ones).
	f.Add([]byte("version: 1\ngo: {package: events, out: gen}\nsql: {dialects: [sqlite, postgres], wal: true}\nevents:\n  - {name: A, topic: a, key: id, fields: [{name: id, type: string}]}\n"))
	f.Add([]byte(aliasBomb(300)))
	f.Add([]byte(manyEvents(MaxEvents+1, 1)))
	f.Add([]byte(specHead + "x-deep: " + strings.Repeat("[", MaxNestingDepth+1) + strings.Repeat("]", MaxNestingDepth+1) + "\n"))
	f.Add([]byte(specHead + "events: &a [{name: A, topic: a, key: id, fields: [*a]}]\n"))
	f.Add([]byte(specHead + "events:\n  - {name: A, topic: a, key: id, fields: [{name: id, type: string, description: \"a\\0b\\ufeff\\u202e\"}]}\n"))
	f.Add([]byte(specHead + "events:\n  - {name: A, description: a\x00b}\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		var s *Spec
		var err error
		done := make(chan struct{})
		go func() {
			defer close(done)
			s, err = Parse("fuzz.yaml", data)
		}()
		select {
		case <-done:
		case <-time.After(fuzzBudget):
			t.Fatalf("Parse took more than %v on this %d-byte input; find what makes it slow and bound it", fuzzBudget, len(data))
		}
		if err != nil {
			if s != nil {
				t.Fatalf("Parse returned both a spec and an error")
			}
			list, ok := err.(ErrorList)
			if !ok {
				t.Fatalf("error is %T, want ErrorList", err)
			}
			if len(list) == 0 {
				t.Fatalf("empty ErrorList")
			}
			for _, e := range list {
				if e == nil || e.Pos.Line < 1 || e.Pos.Col < 1 || e.Msg == "" || e.File != "fuzz.yaml" ||
					strings.HasPrefix(e.Msg, internalError) {
					t.Fatalf("bad error entry %#v in\n%s", e, list.Error())
				}
			}
			return
		}
		if s == nil || len(s.Events) == 0 {
			t.Fatalf("Parse succeeded without a spec or events")
		}
		checkFields := func(fields []*Field) {
			for _, fl := range fields {
				if fl.GoName == "" || fl.Type == nil {
					t.Fatalf("field %q unresolved: %+v", fl.Name, fl)
				}
				for r := fl.Type; r != nil; r = r.Elem {
					if r.Kind == KindNamed && r.Named == nil {
						t.Fatalf("field %q has a nil named type", fl.Name)
					}
				}
			}
		}
		for _, ty := range s.Types {
			checkFields(ty.Fields)
			for _, v := range ty.Values {
				if v.GoName == "" {
					t.Fatalf("enum value %q has no Go name", v.Value)
				}
			}
		}
		for _, e := range s.Events {
			if e.GoName == "" || e.Key == nil || e.Version < 1 || len(e.Fields) == 0 {
				t.Fatalf("event %q incomplete: %+v", e.Name, e)
			}
			checkFields(e.Fields)
		}
		for _, c := range s.Consumers {
			if c.GoName == "" || len(c.Events) == 0 {
				t.Fatalf("consumer %q incomplete: %+v", c.Name, c)
			}
		}
		if len(s.SQL.Dialects) == 0 || s.Go.Package == "" || s.Go.Out == "" {
			t.Fatalf("spec incomplete: %+v", s)
		}
	})
}
