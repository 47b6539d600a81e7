package gocode

import (
	"fmt"
	"strings"
	"testing"

	"github.com/outboxgen/outboxgen/generator/spec"
)

// bigYAML returns an events.yaml with n events of 8 fields each, using an
// enum, an object type, a list and a map, so Validate has work to emit.
func bigYAML(n int) []byte {
	var b strings.Builder
	b.WriteString(`version: 1
go:
  package: big
  out: big
  driver: database/sql
sql:
  dialects: [postgres, mysql]
types:
  - name: Status
    description: The state of an entity.
    enum: [active, paused, closed]
  - name: Address
    fields:
      - name: street
        type: string
      - name: country
        type: Status
events:
`)
	for i := range n {
		fmt.Fprintf(&b, `  - name: EVENT_%d_HAPPENED
    description: Something happened to entity %d, described at enough length that the comment wraps.
    topic: topic.%d
    key: entity_id
    fields:
      - name: entity_id
        type: string
        description: The entity the event is about.
      - name: amount
        type: int64
      - name: status
        type: Status
      - name: note
        type: string
        optional: true
      - name: at
        type: time
      - name: address
        type: Address
      - name: tags
        type: list<string>
      - name: history
        type: map<Status>
`, i, i, i)
	}
	return []byte(b.String())
}

func parseBig(b *testing.B, n int) (*spec.Spec, []byte) {
	b.Helper()
	data := bigYAML(n)
	s, err := spec.Parse("events.yaml", data)
	if err != nil {
		b.Fatal(err)
	}
	return s, data
}

// BenchmarkGenerate1000 generates the code of 1,000 events × 8 fields.
func BenchmarkGenerate1000(b *testing.B) {
	s, _ := parseBig(b, 1000)
	b.ReportAllocs()
	for b.Loop() {
		if _, err := Generate(s, testVersion); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkParseGenerate1000 is BenchmarkGenerate1000 plus parsing the YAML:
// what `outboxgen generate` costs on such a spec.
func BenchmarkParseGenerate1000(b *testing.B) {
	_, data := parseBig(b, 1000)
	b.ReportAllocs()
	for b.Loop() {
		s, err := spec.Parse("events.yaml", data)
		if err != nil {
			b.Fatal(err)
		}
		if _, err := Generate(s, testVersion); err != nil {
			b.Fatal(err)
		}
	}
}

// TestGenerate1000 keeps the large spec in the normal test run: it must
// generate, compile-free checks included, well within a second.
func TestGenerate1000(t *testing.T) {
	s, err := spec.Parse("events.yaml", bigYAML(1000))
	if err != nil {
		t.Fatal(err)
	}
	out, err := Generate(s, testVersion)
	if err != nil {
		t.Fatal(err)
	}
	checkOutput(t, s, out)
	if n := strings.Count(string(out[WritersFile]), "\nfunc Insert"); n != 1000 {
		t.Errorf("%d Insert functions, want 1000", n)
	}
}
