package inbox

import "time"

// SetDupRecheck sets how often a missing duplicate table is looked for
// again, and returns a function restoring it.
func SetDupRecheck(d time.Duration) func() {
	was := dupRecheck
	dupRecheck = d
	return func() { dupRecheck = was }
}
