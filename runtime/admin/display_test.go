package admin

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
)

// TestIndentJSON: documents are indented as json.Indent does, and the
// bound of their indented size holds (and is met exactly by documents
// without empty containers), so a deeply nested one is refused before it
// is written.
func TestIndentJSON(t *testing.T) {
	for _, doc := range []string{
		`{"order_id":"o-1","amount":12.5,"tags":["a","b"],"note":"x, y: [z]","esc":"\"}\\"}`,
		`[1,[2,[3,[4]]],{"a":{"b":{}}},[]]`,
		`"just text"`,
		` {"a" : 1 } `,
	} {
		var want bytes.Buffer
		if err := json.Indent(&want, []byte(doc), "  ", "  "); err != nil {
			t.Fatal(err)
		}
		got, ok := IndentJSON([]byte(doc), "  ", 1<<20)
		if !ok || got != want.String() {
			t.Errorf("IndentJSON(%s) = %q, %v; want %q", doc, got, ok, want.String())
		}
		if n := indentedSize([]byte(doc), 2); n < want.Len() {
			t.Errorf("indentedSize(%s) = %d, below the indented size %d", doc, n, want.Len())
		}
	}
	if _, ok := IndentJSON([]byte(`{"a":`), "", 1<<20); ok {
		t.Error("invalid JSON indented")
	}
	// 6 KB of nested arrays would take 18 MB indented.
	deep := strings.Repeat("[", 3000) + strings.Repeat("]", 3000)
	if n := indentedSize([]byte(deep), 0); n < 18_000_000 {
		t.Errorf("indentedSize of 3,000 nested arrays = %d, want the 18 MB json.Indent writes", n)
	}
	if _, ok := IndentJSON([]byte(deep), "", 1<<20); ok {
		t.Error("3,000 nested arrays indented within 1 MiB")
	}
}
