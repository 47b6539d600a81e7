package gocode

import (
	"fmt"
	"regexp"
	"strings"
	"testing"

	"github.com/outboxgen/outboxgen/generator/spec"
)

// directiveRe matches a line that the go command, the compiler or cgo
// reads as a directive: //go:..., //line, //export, //extern, // +build,
// and #cgo lines in comments.
var directiveRe = regexp.MustCompile(`(?m)^[ \t]*(//(go:|line |export |extern |[ \t]*\+build|[ \t]*#cgo)|/\*line )`)

// TestNoDirectivesFromUserText: no description or spec file name, however
// it is written or wrapped, becomes a directive in the generated code.
func TestNoDirectivesFromUserText(t *testing.T) {
	payloads := []string{
		"+build ignore",
		"x.\n\n+build ignore",
		"x.\n\n  +build ignore",
		"x.\n\n- +build ignore",
		"//go:build ignore",
		"x.\n\n#cgo LDFLAGS: -levil",
		"x.\n\n/*line evil.go:1*/",
		strings.Repeat("word ", 15) + "+build ignore",
		strings.Repeat("w", 75) + " +build ignore",
	}
	quote := func(s string) string { return fmt.Sprintf("%q", s) }
	for i, payload := range payloads {
		d := quote(payload)
		src := `version: 1
go: {package: events, out: gen}
sql: {dialects: [postgres]}
types:
  - {name: T, description: ` + d + `, fields: [{name: a, type: string, description: ` + d + `}]}
  - {name: E, description: ` + d + `, enum: [a]}
events:
  - name: A
    description: ` + d + `
    topic: a
    key: id
    fields:
      - {name: id, type: string, description: ` + d + `}
      - {name: t, type: T, optional: true}
      - {name: e, type: E, optional: true}
consumers:
  - {name: c, events: [A], description: ` + d + `}
`
		for _, file := range []string{"events.yaml", payload + ".yaml", "x\n\n" + payload + "\n\n.yaml", "+build ignore.yaml"} {
			s, err := spec.Parse(file, []byte(src))
			if err != nil {
				t.Fatalf("payload %d: %v", i, err)
			}
			out, err := Generate(s, testVersion)
			if err != nil {
				t.Fatalf("payload %d, file %q: %v", i, file, err)
			}
			for name, code := range out {
				if m := directiveRe.FindString(string(code)); m != "" {
					t.Errorf("payload %q, spec file %q: %s holds the directive %q", payload, file, name, m)
				}
			}
		}
	}
}

func TestNeutralize(t *testing.T) {
	for in, want := range map[string]string{
		"plain text":           "plain text",
		"+build ignore":        `\+build ignore`,
		"  +build ignore":      `\  +build ignore`,
		"#cgo LDFLAGS: -l":     `\#cgo LDFLAGS: -l`,
		"go:generate rm":       `\go:generate rm`,
		"line 3 of the order":  "line 3 of the order",
		"a\x00b\u202ec\ufeffd": "a\ufffdb\ufffdc\ufffdd",
		"bad \xff utf-8":       "bad \ufffd utf-8",
	} {
		if got := neutralize(in); got != want {
			t.Errorf("neutralize(%q) = %q, want %q", in, got, want)
		}
	}
}

// TestHandBuiltSpecControlCharacters: a spec built in Go (not parsed, so
// not checked) with NUL, a byte order mark or bidi controls in a
// description still renders.
func TestHandBuiltSpecControlCharacters(t *testing.T) {
	s := handSpec()
	s.Events[0].Description = "a\x00b\ufeffc\u202ed"
	s.Events[0].Fields[0].Description = "x\r+build ignore"
	out, err := Generate(s, testVersion)
	if err != nil {
		t.Fatalf("Generate: %v", err)
	}
	for name, code := range out {
		if strings.ContainsAny(string(code), "\x00\ufeff\u202e\r") {
			t.Errorf("%s holds a control character", name)
		}
		if m := directiveRe.FindString(string(code)); m != "" {
			t.Errorf("%s holds the directive %q", name, m)
		}
	}
}
