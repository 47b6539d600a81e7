package admin

import (
	"bytes"
	"encoding/json"
	"strings"
)

// IndentJSON returns the JSON document b indented by two spaces per level,
// each line after the first starting with prefix, for an operator to
// read: the \u003c, \u003e and \u0026 escapes encoding/json writes are
// shown as the characters (unescapeHTML). ok is false when b is not valid JSON or its indented form could
// be longer than maxOut bytes (then show b as stored). Indentation grows
// with the square of the nesting depth: 6 KB of nested arrays become
// 18 MB, so the size is bounded before anything is written.
func IndentJSON(b []byte, prefix string, maxOut int) (text string, ok bool) {
	if !json.Valid(b) || indentedSize(b, len(prefix)) > maxOut {
		return "", false
	}
	var out bytes.Buffer
	if err := json.Indent(&out, b, prefix, "  "); err != nil {
		return "", false
	}
	return unescapeHTML(out.String()), true
}

// indentedSize is an upper bound of the size of valid JSON b indented by
// json.Indent with a prefix of prefixLen bytes and two spaces per level:
// b, plus a line break, the prefix and the indentation at every comma and
// after every bracket or brace (which json.Indent writes unless the
// container is empty), plus a space after every colon.
func indentedSize(b []byte, prefixLen int) int {
	size, depth, inString := len(b), 0, false
	for i := 0; i < len(b); i++ {
		c := b[i]
		if inString {
			switch c {
			case '\\':
				i++
			case '"':
				inString = false
			}
			continue
		}
		switch c {
		case '"':
			inString = true
		case '{', '[':
			depth++
			size += 1 + prefixLen + 2*depth
		case '}', ']':
			depth--
			size += 1 + prefixLen + 2*depth
		case ',':
			size += 1 + prefixLen + 2*depth
		case ':':
			size++
		}
	}
	return size
}

// unescapeHTML turns the \u003c, \u003e and \u0026 escapes Go's
// encoding/json writes for <, > and & back into the characters, for
// display (a page escapes them again; a terminal shows them as text);
// every other escape,
// and an escaped backslash before "u003c", is kept as it is. The JSON
// stays equivalent.
func unescapeHTML(s string) string {
	if !strings.Contains(s, `\u00`) {
		return s
	}
	var b strings.Builder
	b.Grow(len(s))
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c != '\\' || i+1 >= len(s) {
			b.WriteByte(c)
			continue
		}
		if s[i+1] == 'u' && i+6 <= len(s) {
			switch strings.ToLower(s[i+2 : i+6]) {
			case "003c":
				b.WriteByte('<')
				i += 5
				continue
			case "003e":
				b.WriteByte('>')
				i += 5
				continue
			case "0026":
				b.WriteByte('&')
				i += 5
				continue
			}
		}
		// Any other escape: copy it whole (so "\\u003c" stays).
		b.WriteByte(c)
		b.WriteByte(s[i+1])
		i++
	}
	return b.String()
}
