package export

import (
	"bytes"
	"flag"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/outboxgen/outboxgen/generator/gocode"
	"github.com/outboxgen/outboxgen/generator/spec"
)

var update = flag.Bool("update", false, "rewrite the golden files and the generated package internal/allkinds")

// testVersion is the outboxgen version the golden files are generated with.
const testVersion = "v0.0.0-test"

// allKinds parses testdata/allkinds.yaml.
func allKinds(t testing.TB) *spec.Spec {
	t.Helper()
	s, err := spec.ParseFile(filepath.Join("testdata", "allkinds.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// checkGolden compares got with the file at path, or rewrites it with -update.
func checkGolden(t *testing.T, path string, got []byte) {
	t.Helper()
	if *update {
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, got, 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run go test ./generator/export -update)", err)
	}
	if !bytes.Equal(got, want) {
		t.Errorf("%s is stale; run go test ./generator/export -update and review the diff\n%s", path, firstDiff(string(want), string(got)))
	}
}

// firstDiff describes the first line where want and got differ.
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
	return "(same lines)"
}

func TestExportGoldenAsyncAPI(t *testing.T) {
	s := allKinds(t)
	for _, f := range []Format{YAML, JSON} {
		got, err := AsyncAPI(s, WithFormat(f), WithGeneratorVersion(testVersion))
		if err != nil {
			t.Fatal(err)
		}
		again, err := AsyncAPI(s, WithFormat(f), WithGeneratorVersion(testVersion))
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, again) {
			t.Errorf("%s: two runs gave different documents", f)
		}
		checkGolden(t, filepath.Join("testdata", "golden", "allkinds.asyncapi."+string(f)), got)
	}
}

func TestExportGoldenJSONSchema(t *testing.T) {
	s := allKinds(t)
	files, err := JSONSchema(s, WithGeneratorVersion(testVersion))
	if err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join("testdata", "golden", "jsonschema")
	var names []string
	for _, f := range files {
		names = append(names, f.Name)
		checkGolden(t, filepath.Join(dir, f.Name), f.Content)
	}
	// No golden file may outlive its schema.
	old, err := filepath.Glob(filepath.Join(dir, "*.schema.json"))
	if err != nil {
		t.Fatal(err)
	}
	for _, path := range old {
		if !slices.Contains(names, filepath.Base(path)) {
			if *update {
				if err := os.Remove(path); err != nil {
					t.Fatal(err)
				}
				continue
			}
			t.Errorf("%s is no longer generated; run go test ./generator/export -update", path)
		}
	}
	want := []string{
		"every_type.v1.schema.json",
		"order_paid.v3.schema.json", "order_paid.v2.schema.json", "order_paid.v1.schema.json",
		"order_refunded.v1.schema.json", "shelf_counted.v1.schema.json", "stock_moved.v1.schema.json",
		"session_started.v1.schema.json", "switched.v1.schema.json", "tier_changed.v1.schema.json",
	}
	if !slices.Equal(names, want) {
		t.Errorf("schema files:\n got %v\nwant %v", names, want)
	}
}

// standardKeywords are the JSON Schema draft 2020-12 keywords the files
// may use: strict validators refuse any other.
var standardKeywords = map[string]bool{
	"$schema": true, "$id": true, "$comment": true, "$ref": true, "$defs": true,
	"title": true, "description": true, "type": true, "enum": true, "const": true,
	"properties": true, "required": true, "additionalProperties": true, "items": true,
	"anyOf": true, "allOf": true, "minimum": true, "maximum": true, "minLength": true,
	"pattern": true, "format": true, "contentEncoding": true,
}

// TestExportJSONSchemaKeywords checks that the files use standard
// keywords only.
func TestExportJSONSchemaKeywords(t *testing.T) {
	files, err := JSONSchema(allKinds(t), WithBaseURI("https://example.com/"))
	if err != nil {
		t.Fatal(err)
	}
	var walk func(name string, schema any)
	walk = func(name string, schema any) {
		m, ok := schema.(map[string]any)
		if !ok {
			t.Errorf("%s: a schema that is not an object: %v", name, schema)
			return
		}
		for k, v := range m {
			if !standardKeywords[k] {
				t.Errorf("%s: keyword %q", name, k)
			}
			switch k {
			case "properties", "$defs":
				for _, sub := range v.(map[string]any) {
					walk(name, sub)
				}
			case "additionalProperties", "items":
				walk(name, v)
			case "anyOf", "allOf":
				for _, sub := range v.([]any) {
					walk(name, sub)
				}
			}
		}
	}
	for _, f := range files {
		walk(f.Name, readJSON(t, f.Content))
	}
}

// TestExportGeneratedPackage checks that internal/allkinds, whose payloads the
// tests validate, is what the Go generator makes of allkinds.yaml today.
func TestExportGeneratedPackage(t *testing.T) {
	files, err := gocode.Generate(allKinds(t), testVersion)
	if err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join("internal", "allkinds")
	for name, src := range files {
		checkGolden(t, filepath.Join(dir, name), src)
	}
	// A generated file the generator no longer makes must go; upgrade.go
	// is hand-written.
	paths, err := filepath.Glob(filepath.Join(dir, "*.go"))
	if err != nil {
		t.Fatal(err)
	}
	for _, path := range paths {
		b, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		if _, ok := files[filepath.Base(path)]; ok || !bytes.HasPrefix(b, []byte("// Code generated by outboxgen. DO NOT EDIT.")) {
			continue
		}
		if *update {
			if err := os.Remove(path); err != nil {
				t.Fatal(err)
			}
			continue
		}
		t.Errorf("%s is no longer generated; run go test ./generator/export -update", path)
	}
}
