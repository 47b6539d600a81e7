package console

import "testing"

// TestShowBodyUnescapesHTML: payloads written by encoding/json (<, > and
// & escaped as \u003c, \u003e, \u0026) are shown with the characters;
// other escapes, and an escaped backslash before "u003c", are kept.
func TestShowBodyUnescapesHTML(t *testing.T) {
	for in, want := range map[string]string{
		`{"coupon":"\u003cscript\u003e \u0026"}`: "{\n  \"coupon\": \"<script> &\"\n}",
		`{"a":"\\u003c"}`:                        "{\n  \"a\": \"\\\\u003c\"\n}",
		`{"a":"\u003C\n\u00e9"}`:                 "{\n  \"a\": \"<\\n\\u00e9\"\n}",
		`["x"]`:                                  "[\n  \"x\"\n]",
	} {
		if got := showBody([]byte(in)).Text; got != want {
			t.Errorf("showBody(%s) = %q, want %q", in, got, want)
		}
	}
}
