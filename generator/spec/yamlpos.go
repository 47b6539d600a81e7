package spec

import (
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"unicode/utf8"
)

var yamlLineErr = regexp.MustCompile(`(?s)^yaml: line (\d+): (.*)$`)

// yamlError records a yaml.v3 syntax error of the source data at the
// position of its cause, as far as it can be found: see yamlErrorPos.
func (p *parser) yamlError(data []byte, err error) {
	msg := err.Error()
	line := 0
	if m := yamlLineErr.FindStringSubmatch(msg); m != nil {
		if n, err := strconv.Atoi(m[1]); err == nil && n > 0 {
			line = n
		}
		msg = m[2]
	} else {
		msg = strings.TrimPrefix(msg, "yaml: ")
	}
	if line == 0 && (strings.Contains(msg, "control characters") || strings.Contains(msg, "UTF-8")) {
		// The reader's errors have no position: find the character.
		if pos, what, ok := sourceRunePos(string(data)); ok {
			p.errorAt(pos, "invalid YAML: %s: %s; remove it", msg, what)
			return
		}
	}
	if m := yamlUnknownAnchor.FindStringSubmatch(msg); m != nil {
		// The composer's error has no position: find the alias.
		if pos, ok := findAlias(string(data), m[1]); ok {
			p.errorAt(pos, "invalid YAML: %s; define it with &%s before this alias, or remove the alias", msg, m[1])
			return
		}
	}
	pos, hint := yamlErrorPos(string(data), line, msg)
	p.errorAt(pos, "invalid YAML: %s%s", msg, hint)
}

var yamlUnknownAnchor = regexp.MustCompile(`^unknown anchor '(.*)' referenced$`)

// yamlErrorPos finds where the syntax error msg, which yaml.v3 reported on
// line reported (0 if none), is in src, and returns a hint to append to
// the message. yaml.v3 gives no column, and its line is that of the
// construct the error happened in (the mapping, the flow list, the plain
// scalar), often one line before the offending character: for the errors
// whose cause can be recognised, the source is searched for it; otherwise
// the position is the start of the line yaml reported.
func yamlErrorPos(src string, reported int, msg string) (Pos, string) {
	lines := strings.Split(strings.ReplaceAll(src, "\r\n", "\n"), "\n")
	if reported < 1 {
		reported = 1
	}
	if reported > len(lines) {
		reported = len(lines)
	}
	fallback := Pos{reported, 1}
	// lineStart is the position of line n's first non-blank character.
	lineStart := func(n int) Pos {
		if n < 1 || n > len(lines) {
			return fallback
		}
		l := lines[n-1]
		return Pos{n, len([]rune(l)) - len([]rune(strings.TrimLeft(l, " \t"))) + 1}
	}
	col := func(l string, byteOff int) int { return len([]rune(l[:byteOff])) + 1 }

	switch {
	case strings.HasPrefix(msg, "found character that cannot start any token"):
		// A tab, '@' or '`' where a token starts, at or after the line
		// of the construct being scanned.
		for n := reported; n <= len(lines); n++ {
			l := lines[n-1]
			tokenStart := true
			for i := 0; i < len(l); i++ {
				c := l[i]
				switch {
				case c == '#' && (i == 0 || l[i-1] == ' '):
					i = len(l) // a comment
				case tokenStart && (c == '\t' || c == '@' || c == '`'):
					if c == '\t' {
						return Pos{n, col(l, i)}, " (a tab; indent with spaces)"
					}
					return Pos{n, col(l, i)}, fmtHint(c)
				case c == ' ':
					tokenStart = true
				case c == ':' || c == '-' || c == ',' || c == '[' || c == '{':
					tokenStart = true
				default:
					tokenStart = false
				}
			}
		}
	case strings.HasPrefix(msg, "found a tab character that violates indentation"):
		for n := reported; n <= len(lines); n++ {
			l := lines[n-1]
			indent := l[:len(l)-len(strings.TrimLeft(l, " \t"))]
			if i := strings.IndexByte(indent, '\t'); i >= 0 && len(indent) < len(l) {
				return Pos{n, col(l, i)}, "; indent with spaces"
			}
		}
	case strings.HasPrefix(msg, "did not find expected ',' or ']'"), strings.HasPrefix(msg, "did not find expected ',' or '}'"):
		if pos, ok := unclosedFlow(lines); ok {
			return pos, " (this bracket is not closed)"
		}
		return lineStart(reported + 1), ""
	case strings.HasPrefix(msg, "did not find expected key"):
		// Reported on the line before the misplaced key.
		n := reported + 1
		for n <= len(lines) && strings.TrimSpace(lines[n-1]) == "" {
			n++
		}
		if n <= len(lines) {
			return lineStart(n), " (check the indentation)"
		}
	case strings.HasPrefix(msg, "did not find expected '-' indicator"):
		// Reported on the line before the list's first item: find the
		// first line indented like the list's "-" but not an item.
		first := reported + 1
		if first > len(lines) {
			break
		}
		dash := strings.Index(lines[first-1], "-")
		if dash < 0 || strings.TrimSpace(lines[first-1][:dash]) != "" {
			return lineStart(first), ""
		}
		for n := first + 1; n <= len(lines); n++ {
			l := lines[n-1]
			t := strings.TrimLeft(l, " ")
			if t == "" || t[0] == '#' {
				continue
			}
			indent := len(l) - len(t)
			if indent < dash {
				break
			}
			if indent == dash && t[0] != '-' {
				return Pos{n, indent + 1}, " (check the indentation)"
			}
		}
		return lineStart(first), ""
	case strings.HasPrefix(msg, "mapping values are not allowed in this context"):
		l := lines[reported-1]
		i := strings.LastIndex(l, ": ")
		if strings.HasSuffix(l, ":") {
			i = len(l) - 1
		}
		if i >= 0 {
			return Pos{reported, col(l, i)}, ""
		}
	case strings.HasPrefix(msg, "found unknown escape character"):
		// Reported at the line where the double-quoted scalar starts.
		if pos, c, ok := findBadEscape(lines, reported); ok {
			return pos, fmt.Sprintf(" (%s is not a YAML escape; write \\\\ for a backslash, or use single quotes)", c)
		}
	case strings.HasPrefix(msg, "found unexpected end of stream"):
		// An unclosed quoted string, opened on the reported line.
		l := lines[reported-1]
		if i := strings.IndexAny(l, `"'`); i >= 0 {
			return Pos{reported, col(l, i)}, " (this quote is not closed)"
		}
	}
	return fallback, ""
}

func fmtHint(c byte) string {
	return " (" + strconv.QuoteRune(rune(c)) + " is reserved; quote the value)"
}

// unclosedFlow returns the position of the first '[' or '{' that is never
// closed, skipping quoted strings and comments.
func unclosedFlow(lines []string) (Pos, bool) {
	type open struct {
		pos Pos
		c   byte
	}
	var stack []open
	for n, l := range lines {
		var quote byte
		for i := 0; i < len(l); i++ {
			c := l[i]
			switch {
			case quote != 0:
				if c == quote {
					quote = 0
				}
			case c == '"' || c == '\'':
				if i == 0 || strings.IndexByte(" [{,:", l[i-1]) >= 0 {
					quote = c
				}
			case c == '#' && (i == 0 || l[i-1] == ' '):
				i = len(l)
			case c == '[' || c == '{':
				stack = append(stack, open{Pos{n + 1, len([]rune(l[:i])) + 1}, c})
			case c == ']' || c == '}':
				if len(stack) == 0 {
					continue
				}
				top := stack[len(stack)-1]
				if top.c == '[' && c == '}' || top.c == '{' && c == ']' {
					return top.pos, true
				}
				stack = stack[:len(stack)-1]
			}
		}
	}
	if len(stack) > 0 {
		return stack[0].pos, true
	}
	return Pos{}, false
}

// yamlEscapes are the characters that may follow a backslash in a
// double-quoted YAML scalar, as yaml.v3 reads it (a backslash at the end of
// a line continues the scalar).
const yamlEscapes = "0abt\tnvfre \"'\\N_LPxuU"

// findAlias returns the position of the first alias *name in src: the one
// yaml.v3 reports as referring to an unknown anchor, since an alias may only
// follow its anchor.
func findAlias(src, name string) (Pos, bool) {
	var found Pos
	ok := false
	scanYAML(yamlLines(src), 1, func(pos Pos, l string, i int, inDouble, tokenStart bool) bool {
		if inDouble || !tokenStart || l[i] != '*' || !strings.HasPrefix(l[i+1:], name) {
			return true
		}
		if end := i + 1 + len(name); end < len(l) && !strings.ContainsRune(" \t,]}", rune(l[end])) {
			return true // a longer name
		}
		found, ok = pos, true
		return false
	})
	return found, ok
}

// findBadEscape returns the position of the first backslash in a
// double-quoted scalar, from line from on, that does not start a YAML
// escape, and the escape as written (\q).
func findBadEscape(lines []string, from int) (Pos, string, bool) {
	var found Pos
	var esc string
	scanYAML(lines, from, func(pos Pos, l string, i int, inDouble, _ bool) bool {
		if !inDouble || l[i] != '\\' || i+1 >= len(l) || strings.IndexByte(yamlEscapes, l[i+1]) >= 0 {
			return true
		}
		r, _ := utf8.DecodeRuneInString(l[i+1:])
		found, esc = pos, `\`+string(r)
		return false
	})
	return found, esc, esc != ""
}

// yamlLines splits src into lines, as yamlErrorPos does.
func yamlLines(src string) []string {
	return strings.Split(strings.ReplaceAll(src, "\r\n", "\n"), "\n")
}

// blockScalarRe is a block scalar indicator (| or >, with optional
// indentation and chomping indicators) ending a line.
var blockScalarRe = regexp.MustCompile(`(^\s*(-\s+)*|[:-]\s+)[|>][1-9+-]{0,2}$`)

// scanYAML walks lines (1-based) from line from on, approximately as the
// YAML scanner sees them: comments, the text of single-quoted scalars and
// of block scalars (| and >) are skipped. visit is called with each other
// byte: outside quotes, with whether a token can start there, and inside a
// double-quoted scalar (inDouble), where the byte after a backslash is not
// visited. It returns false to stop the walk.
func scanYAML(lines []string, from int, visit func(pos Pos, l string, i int, inDouble, tokenStart bool) bool) {
	var quote byte
	block := -1 // a block scalar's content is indented more than this
	for n := max(from, 1); n <= len(lines); n++ {
		l := lines[n-1]
		if block >= 0 {
			t := strings.TrimLeft(l, " ")
			if t == "" || len(l)-len(t) > block {
				continue
			}
			block = -1
		}
		tokenStart := true
		code := len(l)     // where a comment starts
		col, colAt := 1, 0 // the column of byte colAt, counted as i grows
		for i := 0; i < len(l); i++ {
			c := l[i]
			for ; colAt < i; colAt++ {
				if !utf8.RuneStart(l[colAt+1]) {
					continue
				}
				col++
			}
			pos := Pos{n, col}
			switch {
			case quote == '\'':
				if c == '\'' && i+1 < len(l) && l[i+1] == '\'' {
					i++
				} else if c == '\'' {
					quote, tokenStart = 0, false
				}
				continue
			case quote == '"':
				if !visit(pos, l, i, true, false) {
					return
				}
				if c == '\\' {
					i++
				} else if c == '"' {
					quote, tokenStart = 0, false
				}
				continue
			case c == '#' && (i == 0 || l[i-1] == ' ' || l[i-1] == '\t'):
				code = i
				i = len(l)
				continue
			case tokenStart && (c == '"' || c == '\''):
				quote = c
				continue
			}
			if !visit(pos, l, i, false, tokenStart) {
				return
			}
			tokenStart = c == ' ' || c == '\t' || c == ',' || c == '[' || c == '{'
		}
		if quote == 0 && blockScalarRe.MatchString(strings.TrimRight(l[:code], " \t")) {
			// Its content is indented more than the key (or list item) it
			// is the value of.
			block = 0
			for block < len(l) && (l[block] == ' ' || l[block] == '-' && block+1 < len(l) && l[block+1] == ' ') {
				block++
			}
		}
	}
}
