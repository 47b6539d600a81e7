package console

import (
	"net/http"
	"time"
)

// SetClock makes the login throttle of h, a handler New returned, read
// the time from now: tests move time on instead of sleeping. Call it
// before h serves.
func SetClock(h http.Handler, now func() time.Time) { h.(*handler).throttle.now = now }

// ThrottledAddresses returns how many addresses the login throttle of h
// remembers.
func ThrottledAddresses(h http.Handler) int { return h.(*handler).throttle.len() }
