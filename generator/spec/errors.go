package spec

import (
	"fmt"
	"sort"
	"strings"
)

// Error is one problem found in a spec file, at a 1-based line and column.
type Error struct {
	// File is the spec file name, as given to Parse.
	File string
	// Pos is where the problem is. A zero Pos means the whole file (for
	// example when it cannot be read).
	Pos Pos
	// Msg describes the problem and how to fix it.
	Msg string
}

// Error formats e as "file:line:col: msg".
func (e *Error) Error() string {
	if e == nil {
		return "<nil>"
	}
	var b strings.Builder
	if e.File != "" {
		b.WriteString(e.File)
		b.WriteString(":")
	}
	if e.Pos.Line > 0 {
		fmt.Fprintf(&b, "%d:%d:", e.Pos.Line, e.Pos.Col)
	}
	if b.Len() > 0 {
		b.WriteString(" ")
	}
	b.WriteString(e.Msg)
	return b.String()
}

// ErrorList is every problem found in one spec file. Parse returns it sorted
// by position and without duplicates.
type ErrorList []*Error

// Error joins the errors with newlines, one "file:line:col: msg" per line.
func (l ErrorList) Error() string {
	lines := make([]string, 0, len(l))
	for _, e := range l {
		lines = append(lines, e.Error())
	}
	return strings.Join(lines, "\n")
}

// add records a problem at pos.
func (l *ErrorList) add(file string, pos Pos, format string, args ...any) {
	if pos.Line < 1 {
		pos.Line = 1
	}
	if pos.Col < 1 {
		pos.Col = 1
	}
	*l = append(*l, &Error{File: file, Pos: pos, Msg: fmt.Sprintf(format, args...)})
}

// normalize sorts l by line, then column (keeping discovery order for equal
// positions), and drops nil entries and exact duplicates.
func (l ErrorList) normalize() ErrorList {
	out := make(ErrorList, 0, len(l))
	for _, e := range l {
		if e != nil {
			out = append(out, e)
		}
	}
	sort.SliceStable(out, func(i, j int) bool {
		a, b := out[i].Pos, out[j].Pos
		if a.Line != b.Line {
			return a.Line < b.Line
		}
		return a.Col < b.Col
	})
	seen := make(map[Error]bool, len(out))
	dedup := out[:0]
	for _, e := range out {
		if seen[*e] {
			continue
		}
		seen[*e] = true
		dedup = append(dedup, e)
	}
	return dedup
}
