//go:build unix

package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestSpecNotRegular: generate and check refuse a FIFO, a directory and a
// device as the spec file, saying what it is, instead of blocking on the
// FIFO or reading /dev/zero until memory runs out.
func TestSpecNotRegular(t *testing.T) {
	dir := t.TempDir()
	t.Chdir(dir)
	fifo := filepath.Join(dir, "events.yaml")
	if err := syscall.Mkfifo(fifo, 0o644); err != nil {
		t.Skipf("mkfifo: %v", err)
	}
	for _, c := range []struct{ path, want string }{
		{fifo, "named pipe"},
		{dir, "directory"},
		{"/dev/zero", "device"},
	} {
		if _, err := os.Stat(c.path); err != nil {
			continue
		}
		for _, cmd := range []string{"generate", "check"} {
			type result struct {
				code   int
				stderr string
			}
			done := make(chan result, 1)
			go func() {
				var out, errOut bytes.Buffer
				code := run([]string{cmd, "-f", c.path}, &out, &errOut)
				done <- result{code, errOut.String()}
			}()
			var r result
			select {
			case r = <-done:
			case <-time.After(10 * time.Second):
				// Opening the FIFO blocked: open its other end to let the
				// command go on, and fail.
				if f, err := os.OpenFile(fifo, os.O_WRONLY, 0); err == nil {
					f.Close()
				}
				r = <-done
				t.Errorf("%s -f %s blocked", cmd, c.path)
			}
			if r.code != 1 || !strings.Contains(r.stderr, c.want) || !strings.Contains(r.stderr, "not a regular file") {
				t.Errorf("%s -f %s: exit %d, stderr %q; want 1 and a message saying it is a %s, not a regular file", cmd, c.path, r.code, r.stderr, c.want)
			}
		}
	}
}
