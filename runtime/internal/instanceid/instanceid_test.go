package instanceid

import (
	"os"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

var pid = strconv.Itoa(os.Getpid())

func TestNew(t *testing.T) {
	want := regexp.MustCompile(`^sweeper-.+-` + pid + `-[0-9a-f]{8}$`)
	a, b := New("sweeper-", "host"), New("sweeper-", "host")
	for _, id := range []string{a, b} {
		if !want.MatchString(id) {
			t.Errorf("New = %q, want sweeper-hostname-pid-random", id)
		}
		if len(id) > Max {
			t.Errorf("New = %q: %d bytes, want at most %d", id, len(id), Max)
		}
	}
	if a == b {
		t.Errorf("two names are both %q, want them to differ", a)
	}
	if host, err := os.Hostname(); err == nil && host != "" {
		if id := New("", "relay"); !strings.HasPrefix(id, host[:min(len(host), 16)]) {
			t.Errorf("New = %q, want it to start with the hostname %q", id, host)
		}
	}
}

// TestNewCutsHost: a prefix that leaves no room cuts the hostname, never
// the pid or the random part.
func TestNewCutsHost(t *testing.T) {
	suffix := len("-" + pid + "-12345678")
	prefix := strings.Repeat("p", Max-suffix-1) // room for 1 byte of hostname
	id := New(prefix, "host")
	if len(id) != Max {
		t.Errorf("len(New) = %d, want %d", len(id), Max)
	}
	if !regexp.MustCompile(`^` + prefix + `.-` + pid + `-[0-9a-f]{8}$`).MatchString(id) {
		t.Errorf("New = %q, want the hostname cut to 1 byte", id)
	}
}
