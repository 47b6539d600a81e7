package templates

import (
	"strings"
	"testing"
)

// TestMaxNames checks that the Max*Name constants follow the longest
// derived-name suffix of each table.
func TestMaxNames(t *testing.T) {
	longest := func(suffixes []string) int {
		n := 0
		for _, s := range suffixes {
			n = max(n, len(s))
		}
		return n
	}
	for _, c := range []struct {
		name     string
		max      int
		suffixes []string
	}{
		{"outbox", MaxOutboxName, outboxSuffixes},
		{"inbox", MaxInboxName, inboxSuffixes},
		{"archive", MaxArchiveName, archiveSuffixes},
	} {
		if want := MaxIdentifier - longest(c.suffixes); c.max != want {
			t.Errorf("Max name of the %s table = %d, want %d", c.name, c.max, want)
		}
		long := strings.Repeat("a", c.max)
		tables := Tables{Outbox: "o", Inbox: "i", Archive: "r"}
		switch c.name {
		case "outbox":
			tables.Outbox = long
		case "inbox":
			tables.Inbox = long
		case "archive":
			tables.Archive = long
		}
		if err := tables.Validate(); err != nil {
			t.Errorf("%s table name of %d characters: %v", c.name, c.max, err)
		}
		switch c.name {
		case "outbox":
			tables.Outbox += "a"
		case "inbox":
			tables.Inbox += "a"
		case "archive":
			tables.Archive += "a"
		}
		if err := tables.Validate(); err == nil {
			t.Errorf("%s table name of %d characters: no error", c.name, c.max+1)
		}
	}
}
