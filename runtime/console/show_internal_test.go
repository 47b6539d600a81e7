package console

import (
	"strings"
	"testing"
	"unicode/utf8"
)

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

// TestShowBodyBounded: a payload nested so deep that its indented form
// would take megabytes is shown as stored; one cut at MaxPayloadDisplay
// in the middle of a character is still shown as text, not as a hex dump.
func TestShowBodyBounded(t *testing.T) {
	deep := strings.Repeat("[", 9000) + strings.Repeat("]", 9000)
	got := showBody([]byte(deep))
	if got.Text != deep || !strings.Contains(got.Note, "shown as stored") {
		t.Errorf("9,000 nested arrays: %d bytes shown, note %q; want them as stored", len(got.Text), got.Note)
	}
	// "x", then 2-byte characters: the cut falls inside one.
	long := "x" + strings.Repeat("é", MaxPayloadDisplay)
	got = showBody([]byte(long))
	if strings.Contains(got.Note, "hex dump") || !utf8.ValidString(got.Text) || len(got.Text) != MaxPayloadDisplay-1 {
		t.Errorf("text cut inside a character at %d bytes: %d bytes shown, note %q; want text of %d bytes", MaxPayloadDisplay, len(got.Text), got.Note, MaxPayloadDisplay-1)
	}
}
