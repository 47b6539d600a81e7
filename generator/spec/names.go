package spec

import (
	"fmt"
	"slices"
	"strings"
	"unicode"
)

// commonInitialisms is golint's list of initialisms kept upper-case in Go
// names.
var commonInitialisms = map[string]bool{
	"ACL": true, "API": true, "ASCII": true, "CPU": true, "CSS": true,
	"DNS": true, "EOF": true, "GUID": true, "HTML": true, "HTTP": true,
	"HTTPS": true, "ID": true, "IP": true, "JSON": true, "LHS": true,
	"QPS": true, "RAM": true, "RHS": true, "RPC": true, "SLA": true,
	"SMTP": true, "SQL": true, "SSH": true, "TCP": true, "TLS": true,
	"TTL": true, "UDP": true, "UI": true, "UID": true, "UUID": true,
	"URI": true, "URL": true, "UTF8": true, "VM": true, "XML": true,
	"XMPP": true, "XSRF": true, "XSS": true,
}

// GoName turns a spec name into an exported Go identifier with the default
// naming (no go.rename, the default go.initialisms), deterministically: it
// splits s into words at any character other than an ASCII letter or digit,
// at lower-case/digit→upper-case boundaries ("orderID") and before the last
// upper-case letter of an upper-case run followed by lower-case
// ("HTTPServer"); then it writes each word as a golint initialism if it is
// one (case-insensitively) and Title-cased otherwise. So ORDER_PAID →
// OrderPaid, order_id → OrderID, orderId → OrderID, points_v2 → PointsV2.
//
// The result is empty if s has no letters or digits, and may start with a
// digit; callers must check it with token.IsIdentifier.
func GoName(s string) string {
	name, _ := defaultNaming.goName(s)
	return name
}

// naming holds the go.initialisms and go.rename settings that turn spec
// names into Go names, as sqlc's initialisms and rename options do.
type naming struct {
	// initialisms are the words written in upper case, upper-cased.
	initialisms map[string]bool
	// rename maps a name or a word, in lower-case snake_case (see
	// snakeKey), to the Go name written for it.
	rename map[string]*renameEntry
}

// renameEntry is one go.rename entry.
type renameEntry struct {
	key, to string
	line    int
}

// defaultNaming is the naming of a spec without go.initialisms and
// go.rename.
var defaultNaming = &naming{initialisms: commonInitialisms}

// snakeKey is the go.rename key of words: lower-case, joined by "_"
// (ORDER_PAID, orderPaid and order_paid are all order_paid).
func snakeKey(words []string) string {
	return strings.ToLower(strings.Join(words, "_"))
}

// goName turns the spec name s into a Go name (see GoName) and returns
// the go.rename entries it used: an entry for the whole name wins, else
// each word is renamed, written as an initialism or Title-cased.
func (n *naming) goName(s string) (string, []*renameEntry) {
	words := splitWords(s)
	if r := n.rename[snakeKey(words)]; r != nil && len(words) > 0 {
		return r.to, []*renameEntry{r}
	}
	return n.words(words)
}

// words writes words as parts of a Go name (no whole-name renames).
func (n *naming) words(words []string) (string, []*renameEntry) {
	var b strings.Builder
	var used []*renameEntry
	for _, w := range words {
		if r := n.rename[strings.ToLower(w)]; r != nil {
			b.WriteString(r.to)
			if !slices.Contains(used, r) {
				used = append(used, r)
			}
			continue
		}
		up := strings.ToUpper(w)
		if n.initialisms[up] {
			b.WriteString(up)
			continue
		}
		b.WriteString(up[:1])
		b.WriteString(strings.ToLower(w[1:]))
	}
	return b.String(), used
}

// enumConst returns the Go constant name for value of enum type typ (a
// valid Go type name): a go.rename entry for the whole constant
// (country_de for Country and DE) wins, then one for the whole value
// (typ + its Go name), else typ followed by the value's words.
func (n *naming) enumConst(typ, value string) (string, []*renameEntry) {
	words := splitWords(value)
	if len(words) == 0 {
		return typ, nil
	}
	if r := n.rename[snakeKey(append(splitWords(typ), words...))]; r != nil {
		return r.to, []*renameEntry{r}
	}
	if r := n.rename[snakeKey(words)]; r != nil {
		return typ + r.to, []*renameEntry{r}
	}
	name, used := n.words(words)
	return typ + name, used
}

// renamedBy describes the go.rename entries that made a Go name, for
// collision messages: "" if none, else "named by go.rename sms: SMS at
// line 5".
func renamedBy(used []*renameEntry) string {
	if len(used) == 0 {
		return ""
	}
	parts := make([]string, len(used))
	for i, r := range used {
		parts[i] = fmt.Sprintf("%s: %s at line %d", r.key, r.to, r.line)
	}
	return "named by go.rename " + strings.Join(parts, ", ")
}

// renameNote is renamedBy in parentheses after a space, or "".
func renameNote(used []*renameEntry) string {
	if by := renamedBy(used); by != "" {
		return " (" + by + ")"
	}
	return ""
}

// lineNote is "(line N)" or, for a Go name made by go.rename, "(line N;
// named by go.rename ...)".
func lineNote(line int, used []*renameEntry) string {
	if by := renamedBy(used); by != "" {
		return fmt.Sprintf("(line %d; %s)", line, by)
	}
	return fmt.Sprintf("(line %d)", line)
}

// splitWords splits s into ASCII alphanumeric words, see GoName.
func splitWords(s string) []string {
	isLower := func(c byte) bool { return 'a' <= c && c <= 'z' }
	isUpper := func(c byte) bool { return 'A' <= c && c <= 'Z' }
	isDigit := func(c byte) bool { return '0' <= c && c <= '9' }
	var words []string
	start := -1
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !isLower(c) && !isUpper(c) && !isDigit(c) {
			if start >= 0 {
				words = append(words, s[start:i])
				start = -1
			}
			continue
		}
		if start < 0 {
			start = i
			continue
		}
		prev := s[i-1]
		split := isUpper(c) && (isLower(prev) || isDigit(prev)) ||
			isUpper(c) && isUpper(prev) && i+1 < len(s) && isLower(s[i+1])
		if split {
			words = append(words, s[start:i])
			start = i
		}
	}
	if start >= 0 {
		words = append(words, s[start:])
	}
	return words
}

// isExportedIdent reports whether s is an exported ASCII-initial Go
// identifier.
func isExportedIdent(s string) bool {
	if s == "" {
		return false
	}
	for i, r := range s {
		switch {
		case i == 0 && !unicode.IsUpper(r):
			return false
		case r == '_' || unicode.IsLetter(r) || unicode.IsDigit(r):
		default:
			return false
		}
	}
	return true
}

// levenshtein returns the edit distance between a and b (bytes) if it is
// at most k, else k+1. It computes only the band of width 2k+1 around the
// diagonal, so a suggestion costs O(len*k) per candidate, and inputs longer
// than 64 bytes are never close to anything but themselves.
func levenshtein(a, b string, k int) int {
	far := k + 1
	if a == b {
		return 0
	}
	if len(a) > 64 || len(b) > 64 || len(a)-len(b) > k || len(b)-len(a) > k {
		return far
	}
	prev := make([]int, len(b)+2)
	cur := make([]int, len(b)+2)
	for j := range prev {
		prev[j] = min(j, far)
	}
	for i := 1; i <= len(a); i++ {
		lo, hi := max(1, i-k), min(len(b), i+k)
		cur[lo-1] = far
		if lo == 1 {
			cur[0] = min(i, far)
		}
		rowMin := cur[lo-1]
		for j := lo; j <= hi; j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost, far)
			rowMin = min(rowMin, cur[j])
		}
		cur[hi+1] = far
		if rowMin >= far {
			return far
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}

// suggest returns the candidate closest to s: an exact case-insensitive
// match, else the nearest one within edit distance 2, else one that s is a
// prefix of (or that is a prefix of s). It returns "" if none is close.
func suggest(s string, candidates []string) string {
	if s == "" {
		return ""
	}
	for _, c := range candidates {
		if strings.EqualFold(c, s) {
			return c
		}
	}
	best, bestD := "", 3
	for _, c := range candidates {
		if d := levenshtein(strings.ToLower(s), strings.ToLower(c), bestD-1); d < bestD && d < len(s) && (d <= 1 || len(s) > 3) {
			best, bestD = c, d
		}
	}
	if best != "" {
		return best
	}
	ls := strings.ToLower(s)
	for _, c := range candidates {
		lc := strings.ToLower(c)
		if strings.HasPrefix(lc, ls) || len(ls) >= 3 && strings.HasPrefix(ls, lc) {
			return c
		}
	}
	return ""
}
