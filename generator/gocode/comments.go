package gocode

import (
	"strings"
	"unicode"
	"unicode/utf8"

	"github.com/dave/jennifer/jen"
)

// commentWidth is the width that comment text is wrapped to, not counting
// the "// " prefix or indentation.
const commentWidth = 76

// doc returns a comment rendered line by line ("// ..."), from paragraphs
// separated by an empty string. Each paragraph is wrapped to commentWidth;
// blank-line separated paragraphs within a paragraph (from multi-line
// descriptions) are kept, and lines that look like a list item or are
// indented are kept as written.
func doc(paragraphs ...string) *jen.Statement {
	text := docText(paragraphs...)
	if text == "" {
		return jen.Null()
	}
	return jen.Comment(text)
}

// docText is doc as text: "// "-prefixed lines joined by newlines, which
// jennifer renders verbatim.
func docText(paragraphs ...string) string {
	var lines []string
	for _, p := range paragraphs {
		for _, block := range splitBlocks(p) {
			if len(lines) > 0 {
				lines = append(lines, "")
			}
			lines = append(lines, block...)
		}
	}
	var b strings.Builder
	for i, l := range lines {
		if i > 0 {
			b.WriteByte('\n')
		}
		if l == "" {
			b.WriteString("//")
		} else {
			b.WriteString("// ")
			b.WriteString(neutralize(l))
		}
	}
	return b.String()
}

// directivePrefixes start comment text that a tool reads as a directive
// even after "// ": build constraints (go/printer even hoists a "// +build"
// line from anywhere in the file into the header, as "//go:build") and cgo
// flags. The compiler's //go:, //line, //export and //extern need the text
// right after "//", which docText never writes; "go:" is escaped anyway,
// as it only reads like one.
var directivePrefixes = []string{"+build", "#cgo", "go:"}

// neutralize makes one line of comment text safe to follow "// ": no
// character that breaks or disguises the line (controls, line separators,
// a byte order mark, bidirectional controls, invalid UTF-8; spec.Parse
// refuses them, this guards hand-built specs), and no directive: a line
// starting like one gets a leading backslash, "// \+build ignore".
func neutralize(l string) string {
	l = strings.Map(func(r rune) rune {
		switch {
		case r == '\t':
			return r
		case r == utf8.RuneError, unicode.IsControl(r), unicode.Is(unicode.Bidi_Control, r),
			r == '\ufeff', r == '\u2028', r == '\u2029':
			return '\ufffd'
		}
		return r
	}, l)
	t := strings.TrimLeft(l, " \t")
	for _, p := range directivePrefixes {
		if strings.HasPrefix(t, p) {
			return `\` + l
		}
	}
	return l
}

// splitBlocks splits text into blocks at blank lines and wraps each block.
func splitBlocks(text string) [][]string {
	text = strings.ReplaceAll(text, "\r\n", "\n")
	text = strings.Trim(strings.TrimRight(text, " \t\n"), "\n")
	if text == "" {
		return nil
	}
	var blocks [][]string
	var cur []string
	flush := func() {
		if len(cur) > 0 {
			blocks = append(blocks, wrapBlock(cur))
			cur = nil
		}
	}
	for _, l := range strings.Split(text, "\n") {
		l = strings.TrimRight(l, " \t")
		if l == "" {
			flush()
			continue
		}
		cur = append(cur, l)
	}
	flush()
	return blocks
}

// wrapBlock reflows the lines of one block, unless it is preformatted.
func wrapBlock(lines []string) []string {
	for _, l := range lines {
		if l[0] == ' ' || l[0] == '\t' || strings.HasPrefix(l, "- ") || strings.HasPrefix(l, "* ") {
			out := make([]string, len(lines))
			for i, l := range lines {
				out[i] = strings.ReplaceAll(l, "\t", "    ")
			}
			return out
		}
	}
	return wrap(strings.Join(lines, " "), commentWidth)
}

// wrap splits text into lines of at most width bytes at spaces; a word
// longer than width (a URL, say) gets a line of its own.
func wrap(text string, width int) []string {
	var lines []string
	var line strings.Builder
	for _, w := range strings.Fields(text) {
		if line.Len() > 0 && line.Len()+1+len(w) > width {
			lines = append(lines, line.String())
			line.Reset()
		}
		if line.Len() > 0 {
			line.WriteByte(' ')
		}
		line.WriteString(w)
	}
	if line.Len() > 0 {
		lines = append(lines, line.String())
	}
	return lines
}

// fieldDoc returns the doc comment text of a field from its description,
// folded into the field's first sentence: "The order number." becomes
// "OrderID is the order number.", see fold.
func fieldDoc(goName, description string) string {
	first, rest, ok := fold(goName, description)
	if !ok {
		return strings.TrimSpace(description)
	}
	if rest != "" {
		return first + "\n\n" + rest
	}
	return first
}

// fold turns a description into the first sentence of name's doc comment,
// deterministically: "<name> is <description>", with the description's
// first letter lower-cased unless its second letter is upper-case (an
// acronym such as "SKU ..." or "URL ..."), ending in a full stop. A
// description that already starts with "<name> " is kept as written. Only
// the first paragraph is folded; later ones are returned as rest. ok is
// false for an empty description, or one whose first paragraph is
// preformatted (indented lines or list items), which cannot be folded.
func fold(name, description string) (first, rest string, ok bool) {
	text := strings.Trim(strings.TrimRight(strings.ReplaceAll(description, "\r\n", "\n"), " \t\n"), "\n")
	if strings.TrimSpace(text) == "" {
		return "", "", false
	}
	lines := strings.Split(text, "\n")
	n := 0
	for n < len(lines) && strings.TrimSpace(lines[n]) != "" {
		l := lines[n]
		if l[0] == ' ' || l[0] == '\t' || strings.HasPrefix(l, "- ") || strings.HasPrefix(l, "* ") {
			return "", "", false
		}
		n++
	}
	para := strings.Join(strings.Fields(strings.Join(lines[:n], " ")), " ")
	rest = strings.Trim(strings.Join(lines[n:], "\n"), "\n")
	if !strings.HasPrefix(para, name+" ") {
		r := []rune(para)
		if len(r) < 2 || !unicode.IsUpper(r[1]) {
			r[0] = unicode.ToLower(r[0])
		}
		para = name + " is " + string(r)
	}
	if !strings.HasSuffix(para, ".") && !strings.HasSuffix(para, "!") && !strings.HasSuffix(para, "?") {
		para += "."
	}
	return para, rest, true
}
