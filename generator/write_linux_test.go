//go:build linux

package generator

import (
	"path/filepath"
	"syscall"
	"testing"
)

// TestWriteFileTooLarge: a write that fails midway (the file size limit,
// as with `ulimit -f 10`) leaves every file as it was, with no temporary
// file behind, and says that nothing changed.
func TestWriteFileTooLarge(t *testing.T) {
	proj, before, files := changeSpec(t)
	// The limit lets the smallest changed file through, not the largest.
	var small, large int
	for _, f := range files {
		if filepath.Base(f.Path) != "events.go" && filepath.Base(f.Path) != "writers.go" {
			continue
		}
		if n := len(f.Content); small == 0 || n < small {
			small = n
		}
		if n := len(f.Content); n > large {
			large = n
		}
	}
	if small == large {
		t.Fatalf("events.go and writers.go are both %d bytes", small)
	}
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_FSIZE, &lim); err != nil {
		t.Skipf("getrlimit: %v", err)
	}
	low := lim
	low.Cur = uint64(small+large) / 2
	if low.Cur > lim.Max {
		t.Skip("the file size limit is already lower")
	}
	if err := syscall.Setrlimit(syscall.RLIMIT_FSIZE, &low); err != nil {
		t.Skipf("setrlimit: %v", err)
	}
	changed, err := Write(files)
	if err := syscall.Setrlimit(syscall.RLIMIT_FSIZE, &lim); err != nil {
		t.Fatal(err)
	}
	wantError(t, err, "file too large", "no file was changed")
	if len(changed) != 0 {
		t.Errorf("Write reports %v as changed", changed)
	}
	sameTree(t, proj, before)
}
