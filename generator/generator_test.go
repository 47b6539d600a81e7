package generator

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/outboxgen/outboxgen/generator/spec"
)

const testSpec = `version: 1
go: {package: events, out: gen}
sql: {dialects: [postgres, sqlite], out: schema}
events:
  - {name: A, topic: a, key: id, fields: [{name: id, type: string}]}
`

// project writes events.yaml (with src) into a new directory proj inside a
// temporary directory, next to a directory outside, and returns both.
func project(t *testing.T, src string) (proj, outside string) {
	t.Helper()
	dir := t.TempDir()
	proj, outside = filepath.Join(dir, "proj"), filepath.Join(dir, "outside")
	for _, d := range []string{proj, outside} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(proj, "events.yaml"), []byte(src), 0o644); err != nil {
		t.Fatal(err)
	}
	return proj, outside
}

func parse(t *testing.T, proj string) *spec.Spec {
	t.Helper()
	s, err := spec.ParseFile(filepath.Join(proj, "events.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func symlink(t *testing.T, target, link string) {
	t.Helper()
	if err := os.Symlink(target, link); err != nil {
		t.Skipf("cannot create symbolic links: %v", err)
	}
}

// generate runs Files and Write, as outboxgen generate does.
func generate(s *spec.Spec) error {
	files, err := Files(s, DevelVersion)
	if err != nil {
		return err
	}
	_, err = Write(files)
	return err
}

// wantError checks that err mentions every one of parts.
func wantError(t *testing.T, err error, parts ...string) {
	t.Helper()
	if err == nil {
		t.Fatalf("no error, want one mentioning %q", parts)
	}
	for _, p := range parts {
		if !strings.Contains(err.Error(), p) {
			t.Errorf("error %q does not mention %q", err, p)
		}
	}
}

// emptyDir fails the test unless dir holds nothing.
func emptyDir(t *testing.T, dir string) {
	t.Helper()
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		t.Errorf("%s was written outside the spec's directory", filepath.Join(dir, e.Name()))
	}
}

func TestGenerate(t *testing.T) {
	proj, _ := project(t, testSpec)
	if err := generate(parse(t, proj)); err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{"gen/events.go", "gen/writers.go", "schema/postgres/outbox.sql", "schema/sqlite/outbox.sql"} {
		if _, err := os.Stat(filepath.Join(proj, f)); err != nil {
			t.Error(err)
		}
	}
}

// TestOutputOutsideSpecDir: output directories that leave the spec's
// directory through ".." are refused, even in a hand-built spec.
func TestOutputOutsideSpecDir(t *testing.T) {
	proj, outside := project(t, testSpec)
	s := parse(t, proj)
	s.Go.Out = "../outside"
	wantError(t, generate(s), "outside", "directory of the spec file")
	s = parse(t, proj)
	s.SQL.Out = "a/../../outside"
	wantError(t, generate(s), "outside", "directory of the spec file")
	emptyDir(t, outside)
}

// TestSymlinkedOutputDir: an output directory that is a symbolic link to a
// directory outside is refused; nothing is written there.
func TestSymlinkedOutputDir(t *testing.T) {
	proj, outside := project(t, testSpec)
	symlink(t, outside, filepath.Join(proj, "gen"))
	wantError(t, generate(parse(t, proj)), "resolves to", "check for symbolic links")
	emptyDir(t, outside)
}

// TestSymlinkedOutputFile: a generated file that is a symbolic link to a
// file outside is refused; that file is not overwritten.
func TestSymlinkedOutputFile(t *testing.T) {
	proj, outside := project(t, testSpec)
	victim := filepath.Join(outside, "victim.go")
	if err := os.WriteFile(victim, []byte("package victim\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(filepath.Join(proj, "gen"), 0o755); err != nil {
		t.Fatal(err)
	}
	symlink(t, victim, filepath.Join(proj, "gen", "events.go"))
	wantError(t, generate(parse(t, proj)), "resolves to", "victim.go")
	if b, _ := os.ReadFile(victim); string(b) != "package victim\n" {
		t.Errorf("the file outside was overwritten:\n%s", b)
	}
}

// TestSymlinkedInsideIsFine: symbolic links that stay inside the spec's
// directory tree are followed.
func TestSymlinkedInsideIsFine(t *testing.T) {
	proj, _ := project(t, testSpec)
	if err := os.Mkdir(filepath.Join(proj, "real"), 0o755); err != nil {
		t.Fatal(err)
	}
	symlink(t, "real", filepath.Join(proj, "gen"))
	if err := generate(parse(t, proj)); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(proj, "real", "events.go")); err != nil {
		t.Error(err)
	}
}

// TestSymlinkLoop: a symbolic link loop as the output directory is
// reported as such, not as "mkdir: file exists".
func TestSymlinkLoop(t *testing.T) {
	proj, _ := project(t, testSpec)
	symlink(t, "gen", filepath.Join(proj, "gen"))
	wantError(t, generate(parse(t, proj)), "symbolic link loop")

	proj, _ = project(t, testSpec)
	symlink(t, "missing", filepath.Join(proj, "gen"))
	wantError(t, generate(parse(t, proj)), "symbolic link to a missing file or directory")
}

// TestStaleSymlinkOutside: a stale-looking file in go.out that is a
// symbolic link to a generated file outside is neither followed nor
// removed.
func TestStaleSymlinkOutside(t *testing.T) {
	proj, outside := project(t, testSpec)
	target := filepath.Join(outside, "old.go")
	content := "// Code generated by outboxgen. DO NOT EDIT.\n\npackage old\n"
	if err := os.WriteFile(target, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(filepath.Join(proj, "gen"), 0o755); err != nil {
		t.Fatal(err)
	}
	symlink(t, target, filepath.Join(proj, "gen", "old.go"))
	wantError(t, generate(parse(t, proj)), "resolves to", "old.go")
	if b, _ := os.ReadFile(target); string(b) != content {
		t.Errorf("the file outside changed")
	}
}

// TestRemoveOnlyGenerated: Write removes a stale file only if it still
// starts with the generated-file header when it is removed.
func TestRemoveOnlyGenerated(t *testing.T) {
	proj, _ := project(t, testSpec)
	if err := os.MkdirAll(filepath.Join(proj, "gen"), 0o755); err != nil {
		t.Fatal(err)
	}
	stale := filepath.Join(proj, "gen", "consumers.go")
	hand := filepath.Join(proj, "gen", "hand.go")
	for path, content := range map[string]string{
		stale: "// Code generated by outboxgen. DO NOT EDIT.\n\npackage events\n",
		hand:  "package events\n",
	} {
		if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	files, err := Files(parse(t, proj), DevelVersion)
	if err != nil {
		t.Fatal(err)
	}
	var deletes []string
	for _, f := range files {
		if f.Delete {
			deletes = append(deletes, f.Path)
		}
	}
	if len(deletes) != 1 || deletes[0] != stale {
		t.Fatalf("deletions %v, want only %s", deletes, stale)
	}
	// The user edits the stale file by hand before Write runs.
	if err := os.WriteFile(stale, []byte("package events // mine now\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	_, err = Write(files)
	wantError(t, err, "refusing to remove", "consumers.go")
	for _, path := range []string{stale, hand} {
		if _, err := os.Stat(path); err != nil {
			t.Errorf("%s was removed", path)
		}
	}
}

// TestWriteNeedsRoot: Write refuses files that do not come from Files.
func TestWriteNeedsRoot(t *testing.T) {
	dir := t.TempDir()
	_, err := Write([]File{{Path: filepath.Join(dir, "x.go"), Content: []byte("package x\n")}})
	wantError(t, err, "no root directory")
}
