package spec

import (
	"strings"
	"testing"
)

// TestEdgeInputs feeds alias cycles, deep nesting and odd scalars: each must
// give positioned errors, not a panic, hang or stack overflow.
func TestEdgeInputs(t *testing.T) {
	for _, src := range []string{
		"events: &a [*a]",
		"events: &a [{name: A, topic: a, key: id, fields: *a}]",
		"go: &g {package: events, out: gen, x: *g}",
		strings.Repeat("[", 20000) + strings.Repeat("]", 20000),
		strings.Repeat("- ", 5000) + "x",
		"\ufeffversion: 1",
		"version: !!int \"1\"\n",
		"version: !foo 1\n",
		"\x00\x01",
		"version: *nope",
		"events:\n  - fields:\n      - type: " + strings.Repeat("list<", 100) + "x" + strings.Repeat(">", 100),
		"events:\n  - fields:\n      - type: \"list<\\u00e9>\"",
		"events:\n  - name: A\n    key: x\n    fields:\n      - {name: x, type: X}\ntypes:\n  - {name: X, fields: [{name: y, type: Y}]}\n  - {name: Y, fields: [{name: x, type: X}, {name: z, type: Y}]}\n",
	} {
		_, err := Parse("edge.yaml", []byte(src))
		list, ok := err.(ErrorList)
		if !ok || len(list) == 0 {
			t.Errorf("Parse(%.40q) = %v, want errors", src, err)
			continue
		}
		for _, e := range list {
			if e.Pos.Line < 1 || e.Pos.Col < 1 || strings.HasPrefix(e.Msg, internalError) {
				t.Errorf("Parse(%.40q): bad position in %v", src, e)
			}
		}
	}
}
