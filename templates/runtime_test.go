package templates_test

import (
	"fmt"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/outboxgen/outboxgen/runtime/dialect"
	"github.com/outboxgen/outboxgen/templates"
)

// The generator and the runtime never import each other, so each defines
// the values both need once; these tests check that the two definitions
// agree.

// The default inbox table of the runtime is events.yaml's default.
func TestRuntimeDefaultTables(t *testing.T) {
	for _, name := range []string{templates.DefaultTables.Outbox, templates.DefaultTables.Inbox} {
		if !dialect.ValidIdentifier(name) {
			t.Errorf("default table %q is not a dialect.ValidIdentifier", name)
		}
	}
}

// The generator's identifier rule is the runtime's.
func TestRuntimeIdentifierRule(t *testing.T) {
	names := []string{
		"", "a", "_", "_a", "a1", "1a", "outbox_event", "Outbox", "a-b", "a b", "a.b", "é", "a\x00",
		strings.Repeat("a", templates.MaxIdentifier-1), strings.Repeat("a", templates.MaxIdentifier),
		strings.Repeat("a", templates.MaxIdentifier+1), strings.Repeat("_", templates.MaxIdentifier),
	}
	for _, name := range names {
		if g, r := templates.ValidIdentifier(name), dialect.ValidIdentifier(name); g != r {
			t.Errorf("%q: templates.ValidIdentifier = %v, dialect.ValidIdentifier = %v", name, g, r)
		}
	}
}

// The generator accepts the dialect names and aliases the runtime does,
// and both map them to the same dialect.
func TestRuntimeDialects(t *testing.T) {
	var all []string
	for _, d := range dialect.All {
		all = append(all, string(d))
	}
	if !slices.Equal(templates.Dialects(), all) {
		t.Errorf("templates.Dialects() = %v, dialect.All = %v", templates.Dialects(), all)
	}
	// dialect.Parse also ignores case; events.yaml spells names exactly.
	names := append(templates.DialectNames(), "oracle", "postgre", "maria", "sqlite4", "mssql", "")
	for _, name := range names {
		g, gerr := templates.ParseDialect(name)
		r, rerr := dialect.Parse(name)
		if (gerr == nil) != (rerr == nil) || g != string(r) {
			t.Errorf("%q: templates.ParseDialect = %q, %v; dialect.Parse = %q, %v", name, g, gerr, r, rerr)
		}
	}
}

// The column sizes the generator checks events.yaml against are the ones
// the runtime checks values against (and the runtime's query catalog test
// checks those against the DDL).
func TestRuntimeColumnSizes(t *testing.T) {
	for _, c := range []struct {
		name string
		g, r int
	}{
		{"biz_type", templates.MaxTypeLen, dialect.MaxTypeLen},
		{"biz_id", templates.MaxKeyLen, dialect.MaxKeyLen},
		{"topic", templates.MaxTopicLen, dialect.MaxTopicLen},
	} {
		if c.g != c.r {
			t.Errorf("%s: templates says %d characters, dialect %d", c.name, c.g, c.r)
		}
	}
}

// The column sizes match the DDL of every dialect that sizes its columns.
func TestColumnSizesInDDL(t *testing.T) {
	for _, d := range []string{"postgres", "mysql"} {
		ddl, err := templates.Render(d, templates.Tables{Outbox: "o", Inbox: "i", Archive: "a"})
		if err != nil {
			t.Fatal(err)
		}
		for col, size := range map[string]int{"biz_type": templates.MaxTypeLen, "biz_id": templates.MaxKeyLen, "topic": templates.MaxTopicLen} {
			re := regexp.MustCompile(`(?m)^\s*` + col + `\s+(?i:varchar)\((\d+)\)`)
			found := re.FindAllStringSubmatch(string(ddl), -1)
			if len(found) == 0 {
				t.Errorf("%s: no %s column", d, col)
			}
			for _, m := range found {
				if m[1] != fmt.Sprint(size) {
					t.Errorf("%s: %s is varchar(%s), want %d", d, col, m[1], size)
				}
			}
		}
	}
}
