package dialect

// Building blocks shared by every statement builder of the package.

import (
	"fmt"
	"strings"
	"time"
)

// Now returns the dialect's current-timestamp expression, the one the DDL
// defaults use.
func (d Dialect) Now() string {
	switch d {
	case Postgres:
		return "now()"
	case MySQL:
		return "CURRENT_TIMESTAMP(6)"
	}
	return "strftime('%Y-%m-%d %H:%M:%f', 'now')"
}

// binder numbers placeholders in the order they are written.
type binder struct {
	d    Dialect
	args []any
}

func (b *binder) bind(v any) string {
	b.args = append(b.args, v)
	return b.d.Placeholder(len(b.args))
}

func (b *binder) list(vs []string) string {
	ps := make([]string, len(vs))
	for i, v := range vs {
		ps[i] = b.bind(v)
	}
	return strings.Join(ps, ", ")
}

func (b *binder) ids(ids []int64) string {
	ps := make([]string, len(ids))
	for i, v := range ids {
		ps[i] = b.bind(v)
	}
	return strings.Join(ps, ", ")
}

// nowPlus returns "now + d" in the dialect (d may be negative), binding d.
func (b *binder) nowPlus(d time.Duration) string {
	switch b.d {
	case Postgres:
		return "now() + " + b.bind(d.Seconds()) + " * interval '1 second'"
	case MySQL:
		return "CURRENT_TIMESTAMP(6) + INTERVAL " + b.bind(d.Microseconds()) + " MICROSECOND"
	}
	return "strftime('%Y-%m-%d %H:%M:%f', 'now', " + b.bind(fmt.Sprintf("%+.6f seconds", d.Seconds())) + ")"
}
