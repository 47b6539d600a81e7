package admin

import (
	"bytes"
	"encoding/json"
)

// IndentJSON returns the JSON document b indented by two spaces per level,
// each line after the first starting with prefix, for an operator to
// read; ok is false when b is not valid JSON or its indented form could
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
	return out.String(), true
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
