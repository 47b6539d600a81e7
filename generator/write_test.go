package generator

import (
	"bytes"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/outboxgen/outboxgen/generator/spec"
)

// testSpec2 is testSpec changed: one more event (events.go and writers.go
// change) and one more dialect (schema/mysql/ is new).
const testSpec2 = `version: 1
go: {package: events, out: gen}
sql: {dialects: [postgres, sqlite, mysql], out: schema}
events:
  - {name: A, topic: a, key: id, fields: [{name: id, type: string}]}
  - {name: B, topic: b, key: id, fields: [{name: id, type: string}, {name: n, type: int32}]}
`

// entry is what snapshot records of one file or directory.
type entry struct {
	mode    fs.FileMode
	mtime   time.Time
	content string
}

// snapshot records every file and directory under dir (not dir itself).
func snapshot(t *testing.T, dir string) map[string]entry {
	t.Helper()
	out := map[string]entry{}
	err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil || path == dir {
			return err
		}
		fi, err := os.Lstat(path)
		if err != nil {
			return err
		}
		e := entry{mode: fi.Mode(), mtime: fi.ModTime()}
		if fi.Mode().IsRegular() {
			b, err := os.ReadFile(path)
			if err != nil {
				return err
			}
			e.content = string(b)
		}
		rel, _ := filepath.Rel(dir, path)
		out[rel] = e
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// sameTree fails the test unless dir is as before: the same files and
// directories (so no temporary file was left behind either), with the same
// mode, and for files the same content and modification time.
func sameTree(t *testing.T, dir string, before map[string]entry) {
	t.Helper()
	after := snapshot(t, dir)
	var names []string
	for name := range before {
		names = append(names, name)
	}
	for name := range after {
		if _, ok := before[name]; !ok {
			names = append(names, name)
		}
	}
	sort.Strings(names)
	for _, name := range names {
		b, inBefore := before[name]
		a, inAfter := after[name]
		switch {
		case !inAfter:
			t.Errorf("%s was removed", name)
		case !inBefore:
			t.Errorf("%s was created (%d bytes)", name, len(a.content))
		case a.content != b.content:
			t.Errorf("%s changed: %d bytes, was %d", name, len(a.content), len(b.content))
		case a.mode != b.mode:
			t.Errorf("%s: mode %v, was %v", name, a.mode, b.mode)
		case !a.mtime.Equal(b.mtime) && a.mode.IsRegular():
			// Directories are left out: creating and removing a
			// temporary file changes the modification time of its
			// directory, and nothing keys on that.
			t.Errorf("%s was rewritten (modification time %v, was %v)", name, a.mtime, b.mtime)
		}
	}
}

// respec replaces the events.yaml of proj with src.
func respec(t *testing.T, proj, src string) {
	t.Helper()
	if err := os.WriteFile(filepath.Join(proj, "events.yaml"), []byte(src), 0o644); err != nil {
		t.Fatal(err)
	}
}

// backdate sets the modification time of every file under dir to one in
// the past, so that a rewrite shows even on a coarse clock.
func backdate(t *testing.T, dir string) {
	t.Helper()
	old := time.Date(2001, 2, 3, 4, 5, 6, 0, time.UTC)
	err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.Type()&fs.ModeSymlink != 0 {
			return err
		}
		return os.Chtimes(path, old, old)
	})
	if err != nil {
		t.Fatal(err)
	}
}

// TestWriteFailsBeforeChanging: a target that cannot be written (here its
// directory is a regular file, put there after Files) fails Write before
// any file changes, the files sorted before it included.
func TestWriteFailsBeforeChanging(t *testing.T) {
	proj, _ := project(t, testSpec)
	if err := generate(parse(t, proj)); err != nil {
		t.Fatal(err)
	}
	respec(t, proj, testSpec2)
	files, err := Files(parse(t, proj), DevelVersion)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(proj, "schema", "mysql"), []byte("in the way\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	backdate(t, proj)
	before := snapshot(t, proj)
	changed, err := Write(files)
	wantError(t, err, "mysql", "no file was changed")
	if len(changed) != 0 {
		t.Errorf("Write reports %v as changed", changed)
	}
	sameTree(t, proj, before)
}

// TestWriteHardLinkNotWrittenThrough: a generated file that is a hard link
// to a file outside the spec's directory is replaced; the file outside
// keeps its content.
func TestWriteHardLinkNotWrittenThrough(t *testing.T) {
	proj, outside := project(t, testSpec)
	victim := filepath.Join(outside, "victim.go")
	if err := os.WriteFile(victim, []byte("package victim\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(filepath.Join(proj, "gen"), 0o755); err != nil {
		t.Fatal(err)
	}
	target := filepath.Join(proj, "gen", "events.go")
	if err := os.Link(victim, target); err != nil {
		t.Skipf("cannot create hard links: %v", err)
	}
	if err := generate(parse(t, proj)); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(victim); string(b) != "package victim\n" {
		t.Errorf("the file outside was written through its hard link:\n%.200s", b)
	}
	if b, _ := os.ReadFile(target); !bytes.HasPrefix(b, []byte("// Code generated by outboxgen. DO NOT EDIT.")) {
		t.Errorf("%s was not generated:\n%.200s", target, b)
	}
	vi, err1 := os.Stat(victim)
	ti, err2 := os.Stat(target)
	if err1 != nil || err2 != nil || os.SameFile(vi, ti) {
		t.Errorf("%s is still the file outside (%v, %v)", target, err1, err2)
	}
}

// TestWriteUnchangedNotRewritten: a second Write of the same files touches
// nothing, so build caches keyed on modification times stay valid, and
// leaves no temporary file.
func TestWriteUnchangedNotRewritten(t *testing.T) {
	proj, _ := project(t, testSpec)
	if err := generate(parse(t, proj)); err != nil {
		t.Fatal(err)
	}
	backdate(t, proj)
	before := snapshot(t, proj)
	files, err := Files(parse(t, proj), DevelVersion)
	if err != nil {
		t.Fatal(err)
	}
	changed, err := Write(files)
	if err != nil || len(changed) != 0 {
		t.Fatalf("Write: %v, changed %v; want no error and nothing changed", err, changed)
	}
	sameTree(t, proj, before)
}

// TestWriteKeepsMode: a rewritten file keeps the permissions of the file
// it replaces; a new one gets 0644 (less the umask); no temporary file is
// left.
func TestWriteKeepsMode(t *testing.T) {
	proj, _ := project(t, testSpec)
	if err := generate(parse(t, proj)); err != nil {
		t.Fatal(err)
	}
	events := filepath.Join(proj, "gen", "events.go")
	if err := os.Chmod(events, 0o600); err != nil {
		t.Fatal(err)
	}
	respec(t, proj, testSpec2)
	files, err := Files(parse(t, proj), DevelVersion)
	if err != nil {
		t.Fatal(err)
	}
	changed, err := Write(files)
	if err != nil {
		t.Fatal(err)
	}
	if !contains(changed, events) {
		t.Fatalf("changed %v, want %s among them", changed, events)
	}
	if fi, err := os.Stat(events); err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("%s: %v, %v; want mode 0600 kept", events, fi.Mode(), err)
	}
	if fi, err := os.Stat(filepath.Join(proj, "schema", "mysql", SchemaFileName)); err != nil || fi.Mode().Perm()&^0o644 != 0 {
		t.Errorf("new file: %v; want 0644 at most", err)
	}
	for _, f := range files {
		if !f.Delete {
			if b, err := os.ReadFile(f.Path); err != nil || !bytes.Equal(b, f.Content) {
				t.Errorf("%s not written: %v", f.Path, err)
			}
		}
	}
	noTemps(t, proj)
}

// noTemps fails the test if a temporary file of Write is left under dir.
func noTemps(t *testing.T, dir string) {
	t.Helper()
	for name := range snapshot(t, dir) {
		if strings.Contains(filepath.Base(name), ".outboxgen-") {
			t.Errorf("temporary file %s left behind", name)
		}
	}
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// TestStaleSharedSQLOut: two specs in one directory share sql.out, with a
// dialect each. Generating one does not remove the other's DDL and
// migrations as stale; it still removes its own when it drops a dialect.
func TestStaleSharedSQLOut(t *testing.T) {
	dir := t.TempDir()
	specs := map[string]string{
		"orders.yaml": `version: 1
go: {package: orders, out: orders}
sql: {dialects: [postgres], out: db, outbox_table: orders_outbox, inbox_table: orders_inbox}
events:
  - {name: A, topic: a, key: id, fields: [{name: id, type: string}]}
`,
		"billing.yaml": `version: 1
go: {package: billing, out: billing}
sql: {dialects: [sqlite], out: db, outbox_table: billing_outbox, inbox_table: billing_inbox}
events:
  - {name: B, topic: b, key: id, fields: [{name: id, type: string}]}
`,
	}
	gen := func(name string) []string {
		t.Helper()
		s, err := spec.ParseFile(filepath.Join(dir, name))
		if err != nil {
			t.Fatal(err)
		}
		files, err := Files(s, DevelVersion)
		if err != nil {
			t.Fatal(err)
		}
		var deletes []string
		for _, f := range files {
			if f.Delete {
				deletes = append(deletes, f.Path)
			}
		}
		if _, err := Write(files); err != nil {
			t.Fatal(err)
		}
		return deletes
	}
	for name, src := range specs {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(src), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	gen("billing.yaml")
	billing := snapshot(t, filepath.Join(dir, "db", "sqlite"))
	if len(billing) < 2 {
		t.Fatalf("billing generated only %v", billing)
	}
	if deletes := gen("orders.yaml"); len(deletes) != 0 {
		t.Errorf("generating orders.yaml removes %v", deletes)
	}
	sameTree(t, filepath.Join(dir, "db", "sqlite"), billing)

	// orders.yaml moves to mysql: its postgres files go, billing's stay.
	src := strings.Replace(specs["orders.yaml"], "[postgres]", "[mysql]", 1)
	if err := os.WriteFile(filepath.Join(dir, "orders.yaml"), []byte(src), 0o644); err != nil {
		t.Fatal(err)
	}
	deletes := gen("orders.yaml")
	if len(deletes) < 2 {
		t.Errorf("removes %v, want orders.yaml's postgres DDL and migrations", deletes)
	}
	for _, p := range deletes {
		if !strings.Contains(p, filepath.Join("db", "postgres")) {
			t.Errorf("removes %s, not a postgres file of orders.yaml", p)
		}
	}
	if _, err := os.Stat(filepath.Join(dir, "db", "postgres", SchemaFileName)); !os.IsNotExist(err) {
		t.Errorf("orders.yaml's postgres DDL survived: %v", err)
	}
	sameTree(t, filepath.Join(dir, "db", "sqlite"), billing)
}

// TestWriteSweepsLeftovers: a later Write removes the temporary files a
// killed generate left next to its targets, once they are old enough not
// to be another generate's at work; other files stay.
func TestWriteSweepsLeftovers(t *testing.T) {
	proj, _ := project(t, testSpec)
	if err := generate(parse(t, proj)); err != nil {
		t.Fatal(err)
	}
	gen := filepath.Join(proj, "gen")
	old := filepath.Join(gen, ".events.go.outboxgen-k3x9.tmp")
	fresh := filepath.Join(gen, ".writers.go.outboxgen-a1b2.tmp")
	other := filepath.Join(gen, ".notes.tmp")
	for _, p := range []string{old, fresh, other} {
		if err := os.WriteFile(p, []byte("half"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	long := time.Now().Add(-time.Hour)
	for _, p := range []string{old, other} {
		if err := os.Chtimes(p, long, long); err != nil {
			t.Fatal(err)
		}
	}
	respec(t, proj, testSpec2)
	if err := generate(parse(t, proj)); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(old); !os.IsNotExist(err) {
		t.Errorf("the old leftover %s is still there (%v)", old, err)
	}
	for _, p := range []string{fresh, other} {
		if _, err := os.Stat(p); err != nil {
			t.Errorf("%s was removed: %v", p, err)
		}
	}
}
