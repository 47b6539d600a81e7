package dialect

// Binding: how a prepared statement (sql.go) and a call's arguments become
// the text and the arguments a driver sends. This runs per call, so it
// only copies: the text of a statement without a run-time list or a
// literal is final when the statement is prepared, and a statement with
// one (an id list, a claim's row limit) is the prepared text with the
// list's placeholders or the literal's number written in.

import (
	"fmt"
	"strconv"
	"strings"
	"time"
)

// render returns the statement's text and its arguments in bind order;
// vals are the arguments in the order of the stmtDef's args; literal args
// (stmtDef.asLiteral) are ints, written into the text. A nil
// prepared (a statement the dialect does not have) renders as "", nil.
func (p *prepared) render(vals ...any) (string, []any) {
	if p == nil {
		return "", nil
	}
	if !p.dynamic {
		args := make([]any, len(p.segs))
		for i, sg := range p.segs {
			if sg.arg < 0 {
				args[i] = sg.val
			} else {
				args[i] = p.s.encode(vals[sg.arg])
			}
		}
		return p.static, args
	}
	var b strings.Builder
	args := make([]any, 0, len(p.segs)+16)
	b.Grow(p.size + 8*len(p.segs) + 16)
	var num [20]byte
	ph := func() {
		if p.s.dollar {
			b.WriteByte('$')
			b.Write(strconv.AppendInt(num[:0], int64(len(args)), 10))
		} else {
			b.WriteByte('?')
		}
	}
	// item binds the i-th value v of a list argument.
	item := func(i int, v any) {
		if i > 0 {
			b.WriteString(", ")
		}
		args = append(args, v)
		ph()
	}
	for _, sg := range p.segs {
		b.WriteString(sg.text)
		switch {
		case sg.arg < 0:
			args = append(args, sg.val)
			ph()
		case sg.lit:
			n, ok := vals[sg.arg].(int)
			if !ok {
				panic(fmt.Sprintf("dialect: %s: literal argument of type %T", p.name, vals[sg.arg]))
			}
			b.Write(strconv.AppendInt(num[:0], int64(n), 10))
		case sg.list:
			switch l := vals[sg.arg].(type) {
			case []int64:
				for i, v := range l {
					item(i, v)
				}
			case []string:
				for i, v := range l {
					item(i, v)
				}
			case []time.Time:
				for i, v := range l {
					item(i, v)
				}
			case []any:
				for i, v := range l {
					item(i, p.s.encode(v))
				}
			default:
				panic(fmt.Sprintf("dialect: %s: list argument of type %T", p.name, l))
			}
		default:
			args = append(args, p.s.encode(vals[sg.arg]))
			ph()
		}
	}
	b.WriteString(p.tail)
	return b.String(), args
}

// encode turns a Go argument into what the dialect binds: a duration
// becomes the dialect's duration (seconds, microseconds, a strftime
// modifier); everything else is bound as it is.
func (s *spec) encode(v any) any {
	if d, ok := v.(time.Duration); ok {
		return s.duration(d)
	}
	return v
}

// placeholder returns the n-th (1-based) bind parameter marker.
func (s *spec) placeholder(n int) string {
	if s.dollar {
		return "$" + strconv.Itoa(n)
	}
	return "?"
}
