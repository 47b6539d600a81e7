package export

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/santhosh-tekuri/jsonschema/v6"
	"gopkg.in/yaml.v3"
)

// asyncAPISchemaFile is the official AsyncAPI 3.0.0 JSON Schema (see
// testdata/asyncapi/SOURCE.md).
const asyncAPISchemaFile = "testdata/asyncapi/3.0.0.json"

// asyncAPISchemaURL is the $id of asyncAPISchemaFile.
const asyncAPISchemaURL = "http://asyncapi.com/definitions/3.0.0/asyncapi.json"

// offlineLoader refuses every URL: the schemas must be complete without
// the network.
type offlineLoader struct{}

func (offlineLoader) Load(url string) (any, error) {
	return nil, &os.PathError{Op: "load", Path: url, Err: os.ErrNotExist}
}

// newCompiler returns a compiler that never loads anything from outside:
// every schema must be added with AddResource.
func newCompiler() *jsonschema.Compiler {
	c := jsonschema.NewCompiler()
	c.UseLoader(jsonschema.SchemeURLLoader{"http": offlineLoader{}, "https": offlineLoader{}, "file": offlineLoader{}})
	c.AssertFormat()
	return c
}

// readJSON decodes JSON as the validator wants it (numbers as json.Number).
func readJSON(t testing.TB, data []byte) any {
	t.Helper()
	v, err := jsonschema.UnmarshalJSON(bytes.NewReader(data))
	if err != nil {
		t.Fatalf("invalid JSON: %v\n%s", err, data)
	}
	return v
}

// yamlToJSON converts a YAML document to JSON.
func yamlToJSON(t testing.TB, data []byte) []byte {
	t.Helper()
	var v any
	if err := yaml.Unmarshal(data, &v); err != nil {
		t.Fatalf("invalid YAML: %v", err)
	}
	out, err := json.Marshal(v)
	if err != nil {
		t.Fatalf("YAML not representable as JSON: %v", err)
	}
	return out
}

// asyncAPIValidator compiles the official AsyncAPI 3.0.0 schema.
func asyncAPIValidator(t testing.TB) *jsonschema.Schema {
	t.Helper()
	data, err := os.ReadFile(asyncAPISchemaFile)
	if err != nil {
		t.Fatal(err)
	}
	c := newCompiler()
	if err := c.AddResource(asyncAPISchemaURL, readJSON(t, data)); err != nil {
		t.Fatal(err)
	}
	sch, err := c.Compile(asyncAPISchemaURL)
	if err != nil {
		t.Fatalf("compile the AsyncAPI 3.0.0 schema: %v", err)
	}
	return sch
}

// specFiles returns every spec the export is checked with: this package's
// testdata, the Go generator's, the generated test packages' and the
// README's.
func specFiles(t testing.TB) []string {
	t.Helper()
	var files []string
	for _, pattern := range []string{
		"testdata/*.yaml",
		"../gocode/testdata/*.yaml",
		"../../internal/gentest/*.yaml",
		"../../internal/readmetest/*.yaml",
		"../../events.yaml",
	} {
		m, err := filepath.Glob(pattern)
		if err != nil {
			t.Fatal(err)
		}
		files = append(files, m...)
	}
	if len(files) < 5 {
		t.Fatalf("found only %d specs: %v", len(files), files)
	}
	return files
}

func errorText(err error) string {
	if ve, ok := err.(*jsonschema.ValidationError); ok {
		return strings.TrimSpace(ve.Error())
	}
	return err.Error()
}
