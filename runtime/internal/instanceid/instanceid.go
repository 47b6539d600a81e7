// Package instanceid is the default name a relay or a sweeper gives itself
// in lease_owner and in logs when Config.InstanceID is empty. One rule for
// both, so that their names have the same shape and fit the same column.
package instanceid

import (
	"crypto/rand"
	"encoding/hex"
	"os"
	"strconv"
)

// Max is the longest instance name: the width of the lease_owner column
// (relay.MaxInstanceID).
const Max = 64

// New returns prefix + hostname-pid-random, random being 8 hex digits.
// fallbackHost stands in for the hostname when the system has none; the
// hostname is cut so that the name is at most Max bytes.
func New(prefix, fallbackHost string) string {
	host, err := os.Hostname()
	if err != nil || host == "" {
		host = fallbackHost
	}
	var b [4]byte
	_, _ = rand.Read(b[:])
	suffix := "-" + strconv.Itoa(os.Getpid()) + "-" + hex.EncodeToString(b[:])
	if n := Max - len(prefix) - len(suffix); len(host) > n {
		host = host[:n]
	}
	return prefix + host + suffix
}
