package gocode

import (
	"bytes"
	"flag"
	"go/format"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/outboxgen/outboxgen/generator/spec"
)

var update = flag.Bool("update", false, "rewrite golden files")

// testSpecs returns the name (file name without .yaml) and parsed spec of
// every testdata/*.yaml.
func testSpecs(t testing.TB) map[string]*spec.Spec {
	t.Helper()
	paths, err := filepath.Glob(filepath.Join("testdata", "*.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if len(paths) == 0 {
		t.Fatal("no testdata/*.yaml")
	}
	specs := make(map[string]*spec.Spec, len(paths))
	for _, path := range paths {
		data, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		s, err := spec.Parse(filepath.Base(path), data)
		if err != nil {
			t.Fatalf("parse %s: %v", path, err)
		}
		specs[strings.TrimSuffix(filepath.Base(path), ".yaml")] = s
	}
	return specs
}

func TestGolden(t *testing.T) {
	for name, s := range testSpecs(t) {
		t.Run(name, func(t *testing.T) {
			out, err := Generate(s, testVersion)
			if err != nil {
				t.Fatal(err)
			}
			checkOutput(t, s, out)

			again, err := Generate(s, testVersion)
			if err != nil {
				t.Fatal(err)
			}
			for file, src := range out {
				if !bytes.Equal(src, again[file]) {
					t.Errorf("%s: generating twice gave different output", file)
				}
			}

			dir := filepath.Join("testdata", name)
			if *update {
				// Only golden files are replaced: the directory also holds
				// hand-written tests for the compile check.
				stale, err := filepath.Glob(filepath.Join(dir, "*.go.golden"))
				if err != nil {
					t.Fatal(err)
				}
				for _, path := range stale {
					if err := os.Remove(path); err != nil {
						t.Fatal(err)
					}
				}
				if err := os.MkdirAll(dir, 0o755); err != nil {
					t.Fatal(err)
				}
				for file, src := range out {
					if err := os.WriteFile(filepath.Join(dir, file+".golden"), src, 0o644); err != nil {
						t.Fatal(err)
					}
				}
				return
			}
			goldens, err := filepath.Glob(filepath.Join(dir, "*.go.golden"))
			if err != nil {
				t.Fatal(err)
			}
			var want []string
			for _, g := range goldens {
				want = append(want, strings.TrimSuffix(filepath.Base(g), ".golden"))
			}
			var got []string
			for file := range out {
				got = append(got, file)
			}
			slices.Sort(got)
			if !slices.Equal(got, want) {
				t.Fatalf("generated files %v, golden files %v (run go test ./generator/gocode -run TestGolden -update)", got, want)
			}
			for file, src := range out {
				golden, err := os.ReadFile(filepath.Join(dir, file+".golden"))
				if err != nil {
					t.Fatal(err)
				}
				if !bytes.Equal(src, golden) {
					t.Errorf("%s differs from %s.golden (run go test ./generator/gocode -run TestGolden -update and review the diff):\n%s", file, file, firstDiff(string(golden), string(src)))
				}
			}
		})
	}
}

// checkOutput checks what every generated file must satisfy.
func checkOutput(t *testing.T, s *spec.Spec, out map[string][]byte) {
	t.Helper()
	var names []string
	for name := range out {
		names = append(names, name)
	}
	slices.Sort(names)
	want := []string{EventsFile, WritersFile}
	if len(s.Consumers) > 0 {
		want = []string{ConsumersFile, EventsFile, WritersFile}
	}
	if !slices.Equal(names, want) {
		t.Errorf("generated files %v, want %v", names, want)
	}
	for name, src := range out {
		if first, _, _ := strings.Cut(string(src), "\n"); first != "// "+Header {
			t.Errorf("%s starts with %q, want %q", name, first, "// "+Header)
		}
		formatted, err := format.Source(src)
		if err != nil {
			t.Errorf("%s does not parse: %v", name, err)
		} else if !bytes.Equal(formatted, src) {
			t.Errorf("%s is not gofmt'd:\n%s", name, firstDiff(string(src), string(formatted)))
		}
	}
	hasDoc := strings.Contains(string(out[EventsFile]), "\n// Package ")
	if !hasDoc {
		t.Errorf("%s has no package doc comment", EventsFile)
	}
	for _, name := range []string{WritersFile, ConsumersFile} {
		if strings.Contains(string(out[name]), "// Package ") {
			t.Errorf("%s has a package doc comment; only %s should", name, EventsFile)
		}
	}
}

// firstDiff shows the first differing line of want and got with a little
// context.
func firstDiff(want, got string) string {
	w, g := strings.Split(want, "\n"), strings.Split(got, "\n")
	for i := 0; i < len(w) || i < len(g); i++ {
		var wl, gl string
		if i < len(w) {
			wl = w[i]
		}
		if i < len(g) {
			gl = g[i]
		}
		if wl != gl {
			return "line " + strconv.Itoa(i+1) + ":\n  want: " + wl + "\n  got:  " + gl
		}
	}
	return "(no line differs)"
}
