package generator

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// failAt sets testHook to fail step on the file whose path ends in suffix
// (and to call do first, if not nil), until the test ends.
func failAt(t *testing.T, step, suffix string, do func()) {
	t.Helper()
	testHook = func(s, path string) error {
		if s == step && strings.HasSuffix(path, filepath.FromSlash(suffix)) {
			if do != nil {
				do()
			}
			return errors.New("injected failure")
		}
		return nil
	}
	t.Cleanup(func() { testHook = nil })
}

// changeSpec generates testSpec in a new project, backdates it and
// switches it to testSpec2, returning the project, what is on disk and the
// files testSpec2 renders.
func changeSpec(t *testing.T) (proj string, before map[string]entry, files []File) {
	t.Helper()
	proj, _ = project(t, testSpec)
	if err := generate(parse(t, proj)); err != nil {
		t.Fatal(err)
	}
	respec(t, proj, testSpec2)
	backdate(t, proj)
	before = snapshot(t, proj)
	files, err := Files(parse(t, proj), DevelVersion)
	if err != nil {
		t.Fatal(err)
	}
	return proj, before, files
}

// TestWriteFailsMidway: the last temporary file fails to write, after the
// others (in a directory Write created) were written: every file is as
// before, with no temporary file or new directory left.
func TestWriteFailsMidway(t *testing.T) {
	proj, before, files := changeSpec(t)
	failAt(t, "write", "schema/mysql/outbox.sql", nil)
	changed, err := Write(files)
	wantError(t, err, "write ", "mysql", "injected failure", "no file was changed")
	if len(changed) != 0 {
		t.Errorf("Write reports %v as changed", changed)
	}
	sameTree(t, proj, before)
}

// TestWriteRenameFailsPutsBack: the last rename fails after the others
// replaced their files: those get their old content back (new files and
// directories go), and the error says so.
func TestWriteRenameFailsPutsBack(t *testing.T) {
	proj, before, files := changeSpec(t)
	failAt(t, "rename", "schema/mysql/outbox.sql", nil)
	changed, err := Write(files)
	wantError(t, err, "replace ", "injected failure", "no file was changed", "got their old content back")
	if len(changed) != 0 {
		t.Errorf("Write reports %v as changed", changed)
	}
	// The old content is back; the files are new ones, with new times.
	for name, e := range before {
		if e.mode.IsRegular() {
			e.mtime = time.Time{}
			before[name] = e
		}
	}
	after := snapshot(t, proj)
	for name, e := range after {
		if e.mode.IsRegular() {
			e.mtime = time.Time{}
			after[name] = e
		}
	}
	for name := range after {
		if _, ok := before[name]; !ok {
			t.Errorf("%s was created", name)
		}
	}
	for name, b := range before {
		if a, ok := after[name]; !ok || a.content != b.content || a.mode != b.mode {
			t.Errorf("%s is not as before", name)
		}
	}
}

// TestWriteRemoveFails: a stale file that cannot be removed fails Write
// after every file was written; the error names the files changed.
func TestWriteRemoveFails(t *testing.T) {
	proj, _ := project(t, testSpec2)
	if err := generate(parse(t, proj)); err != nil {
		t.Fatal(err)
	}
	respec(t, proj, testSpec)
	files, err := Files(parse(t, proj), DevelVersion)
	if err != nil {
		t.Fatal(err)
	}
	failAt(t, "remove", "schema/mysql/outbox.sql", nil)
	changed, err := Write(files)
	wantError(t, err, "remove ", "injected failure", "changed before the failure", filepath.Join("gen", "events.go"))
	for _, f := range files {
		if f.Delete {
			continue
		}
		if b, _ := os.ReadFile(f.Path); string(b) != string(f.Content) {
			t.Errorf("%s not written", f.Path)
		}
	}
	if !contains(changed, filepath.Join(proj, "gen", "events.go")) {
		t.Errorf("changed %v does not name gen/events.go", changed)
	}
	if _, err := os.Stat(filepath.Join(proj, "schema", "mysql", SchemaFileName)); err != nil {
		t.Errorf("the stale file that failed to go is gone: %v", err)
	}
	noTemps(t, proj)
}

// TestWriteDirSwappedForSymlink: an output directory replaced by a
// symbolic link to a directory outside between the check and the rename
// stops Write; nothing is written outside, and the temporary files go.
func TestWriteDirSwappedForSymlink(t *testing.T) {
	proj, outside := project(t, testSpec)
	gen := filepath.Join(proj, "gen")
	moved := filepath.Join(proj, "moved")
	files, err := Files(parse(t, proj), DevelVersion)
	if err != nil {
		t.Fatal(err)
	}
	testHook = func(step, path string) error {
		if step == "rename" && strings.HasSuffix(path, filepath.Join("gen", "events.go")) {
			if _, err := os.Lstat(moved); err != nil {
				if err := os.Rename(gen, moved); err != nil {
					t.Error(err)
				}
				symlink(t, outside, gen)
			}
		}
		return nil
	}
	t.Cleanup(func() { testHook = nil })
	_, err = Write(files)
	wantError(t, err, "resolves to", "outside")
	emptyDir(t, outside)
	if entries, err := os.ReadDir(moved); err != nil || len(entries) != 0 {
		t.Errorf("left in the directory written first: %v, %v", entries, err)
	}
	if _, err := os.Lstat(filepath.Join(proj, "schema")); !os.IsNotExist(err) {
		t.Errorf("the directory schema, created by Write, is left: %v", err)
	}
}
