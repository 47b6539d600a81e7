package spec

import (
	"fmt"
	"unicode/utf8"

	"gopkg.in/yaml.v3"
)

// badRune describes why r, at byte offset off of a text, must not be copied
// into generated code, or returns "". Descriptions become Go comments: a
// NUL, a control character, a byte order mark or invalid UTF-8 would not
// compile, and bidirectional controls can make the code read differently
// from what it is (CVE-2021-42574, "Trojan Source").
func badRune(r rune, size int) string {
	switch {
	case r == utf8.RuneError && size <= 1:
		return "an invalid UTF-8 byte"
	case r == 0:
		return "a NUL character (U+0000)"
	case r == '\t' || r == '\n':
		return ""
	case r == '\r':
		return "a carriage return (U+000D) that does not end a line"
	case r < 0x20 || r == 0x7f || 0x80 <= r && r <= 0x9f:
		return fmt.Sprintf("the control character %U", r)
	case r == 0xfeff:
		return "a byte order mark (U+FEFF)"
	case r == 0x2028 || r == 0x2029:
		return fmt.Sprintf("the line separator %U", r)
	case r == 0x061c, r == 0x200e, r == 0x200f, 0x202a <= r && r <= 0x202e, 0x2066 <= r && r <= 0x2069:
		return fmt.Sprintf("the invisible bidirectional control %U, which can make text display differently from what it is", r)
	case r == 0xfffe || r == 0xffff:
		return fmt.Sprintf("the non-character %U", r)
	}
	return ""
}

// firstBadRune returns the byte offset of the first rune of s that badRune
// refuses, and why, or -1.
func firstBadRune(s string) (int, string) {
	for i := 0; i < len(s); {
		r, size := utf8.DecodeRuneInString(s[i:])
		if why := badRune(r, size); why != "" {
			return i, why
		}
		i += size
	}
	return -1, ""
}

// description returns the text of a description value, or records why it
// cannot be used and returns "".
func (p *parser) description(v *yaml.Node, subject string) string {
	s, ok := p.str(v, subject)
	if !ok {
		return ""
	}
	if off, why := firstBadRune(s); off >= 0 {
		p.errorAt(offsetPos(v, off), "%s contains %s; remove it (descriptions become Go comments)", subject, why)
		return ""
	}
	return s
}

// sourceRunePos returns the position of the first character of src that the
// YAML reader refuses (a control character, a byte order mark after the
// start, invalid UTF-8) and what it is: yaml.v3 reports those without a
// position.
func sourceRunePos(src string) (Pos, string, bool) {
	line, col := 1, 1
	for i := 0; i < len(src); {
		r, size := utf8.DecodeRuneInString(src[i:])
		var why string
		switch {
		case r == utf8.RuneError && size <= 1:
			why = fmt.Sprintf("an invalid UTF-8 byte 0x%02x", src[i])
		case r == '\t' || r == '\n' || r == '\r' || r == 0x85:
		case r == 0:
			why = "a NUL character (U+0000)"
		case r < 0x20 || r == 0x7f || 0x80 <= r && r <= 0x9f:
			why = fmt.Sprintf("the control character %U", r)
		case r == 0xfeff && i > 0:
			why = "a byte order mark (U+FEFF) after the start of the file"
		case r == 0xfffe || r == 0xffff:
			why = fmt.Sprintf("the non-character %U", r)
		}
		if why != "" {
			return Pos{line, col}, why, true
		}
		if r == '\n' {
			line, col = line+1, 1
		} else {
			col++
		}
		i += size
	}
	return Pos{}, "", false
}
