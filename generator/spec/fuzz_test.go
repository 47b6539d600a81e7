package spec

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

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
	f.Fuzz(func(t *testing.T, data []byte) {
		s, err := Parse("fuzz.yaml", data)
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
