package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

const contractV1 = `version: 1
go: {package: events, out: events}
sql: {dialects: [sqlite]}
events:
  - name: DELIVERY_FAILED
    topic: deliveries.failed
    key: delivery_id
    fields:
      - {name: delivery_id, type: string}
      - {name: attempt, type: int32}
consumers:
  - name: alerts
    events: [DELIVERY_FAILED]
`

// contractTypeChanged is the change the issue starts from: attempt from
// int32 to string, without a version bump.
var contractTypeChanged = strings.Replace(contractV1, "{name: attempt, type: int32}", "{name: attempt, type: string}", 1)

// contractBumped is the same change with a bump, keeping version 1.
var contractBumped = strings.Replace(contractTypeChanged, "    key: delivery_id\n", `    key: delivery_id
    version: 2
    previous:
      - version: 1
        fields:
          - {name: delivery_id, type: string}
          - {name: attempt, type: int32}
`, 1)

// gitRepo makes a git repository in a new directory holding
// sub/events.yaml with src, committed, and returns the directory.
func gitRepo(t *testing.T, src string) string {
	t.Helper()
	if _, err := exec.LookPath("git"); err != nil {
		t.Skip("no git in PATH")
	}
	dir := t.TempDir()
	write(t, filepath.Join(dir, "sub", "events.yaml"), src)
	for _, args := range [][]string{
		{"init", "-q", "-b", "main"},
		{"-c", "user.name=t", "-c", "user.email=t@example.com", "add", "sub/events.yaml"},
		{"-c", "user.name=t", "-c", "user.email=t@example.com", "commit", "-q", "-m", "v1"},
	} {
		cmd := exec.Command("git", append([]string{"-C", dir}, args...)...)
		cmd.Env = append(os.Environ(), "GIT_CONFIG_GLOBAL=/dev/null", "GIT_CONFIG_NOSYSTEM=1")
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("git %s: %v\n%s", args[0], err, out)
		}
	}
	return dir
}

func write(t *testing.T, path, src string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(src), 0o644); err != nil {
		t.Fatal(err)
	}
}

func TestCheckAgainstGit(t *testing.T) {
	dir := gitRepo(t, contractV1)
	sub := filepath.Join(dir, "sub")
	// Unchanged: compatible (and the generated files are checked as before).
	if code, stdout, stderr := cli(t, sub, "generate"); code != 0 {
		t.Fatalf("generate: exit %d: %s%s", code, stdout, stderr)
	}
	code, stdout, stderr := cli(t, sub, "check", "-against", "git:HEAD")
	if code != 0 || stdout != "events.yaml: up to date (3 files)\nevents.yaml: no breaking changes against git:HEAD (1 event compared)\n" || stderr != "" {
		t.Fatalf("unchanged: exit %d, stdout %q, stderr %q", code, stdout, stderr)
	}

	// The type change without a bump is refused, at the field in the new
	// file, naming the base revision and the rule; from the repository
	// root too (the path in git is the file's, not the argument's).
	write(t, filepath.Join(sub, "events.yaml"), contractTypeChanged)
	cli(t, sub, "generate")
	want := "events.yaml:10:9: field attempt of DELIVERY_FAILED changed type from int32 (HEAD:sub/events.yaml:10:9) to string: payloads of one side do not decode on the other; to make this change, bump DELIVERY_FAILED to version 2 and keep version 1's fields under previous: (FIELD_TYPE_CHANGED)\noutboxgen check: 1 breaking change against git:HEAD\n"
	code, stdout, stderr = cli(t, sub, "check", "-against", "git:HEAD")
	if code != 1 || stderr != want || stdout != "events.yaml: up to date (3 files)\n" {
		t.Fatalf("type change: exit %d\nstdout %q\nstderr %q\nwant   %q", code, stdout, stderr, want)
	}
	code, _, stderr = cli(t, dir, "check", "-f", "sub/events.yaml", "-against", "git:main")
	if code != 1 || !strings.HasPrefix(stderr, "sub/events.yaml:10:9: field attempt of DELIVERY_FAILED changed type from int32 (main:sub/events.yaml:10:9)") {
		t.Fatalf("from the root: exit %d, stderr %q", code, stderr)
	}
	// -allow accepts a rule for this run.
	if code, _, stderr := cli(t, sub, "check", "-against", "git:HEAD", "-allow", "field_type_changed"); code != 0 {
		t.Fatalf("-allow FIELD_TYPE_CHANGED: exit %d, stderr %q", code, stderr)
	}

	// With the bump and version 1 kept: accepted. Generated code now calls
	// the upgrade function, which lives in a hand-written file.
	write(t, filepath.Join(sub, "events.yaml"), contractBumped)
	cli(t, sub, "generate")
	if code, stdout, stderr := cli(t, sub, "check", "-against", "git:HEAD"); code != 0 || !strings.Contains(stdout, "no breaking changes against git:HEAD") {
		t.Fatalf("bumped: exit %d, stdout %q, stderr %q", code, stdout, stderr)
	}

	// Stale files and breaking changes are both reported.
	write(t, filepath.Join(sub, "events.yaml"), contractTypeChanged)
	code, stdout, stderr = cli(t, sub, "check", "-against", "git:HEAD")
	if code != 1 || !strings.Contains(stdout, "--- ") || !strings.Contains(stderr, "(FIELD_TYPE_CHANGED)") || !strings.Contains(stderr, "generated files are out of date") {
		t.Fatalf("stale and breaking: exit %d\nstdout %s\nstderr %s", code, stdout, stderr)
	}
}

func TestCheckAgainstErrors(t *testing.T) {
	dir := gitRepo(t, contractV1)
	sub := filepath.Join(dir, "sub")
	cli(t, sub, "generate")
	for _, tc := range []struct {
		args   []string
		code   int
		stdout string
		stderr string
	}{
		{[]string{"-against", "git:no-such-branch"}, 1, "", `outboxgen check: -against git:no-such-branch: unknown git revision "no-such-branch" (fetch it first, e.g. git fetch origin main)`},
		{[]string{"-against", "git:"}, 1, "", "outboxgen check: -against git:: git: names no revision; write e.g. git:origin/main or git:HEAD~1"},
		{[]string{"-against", "missing.yaml"}, 1, "", "outboxgen check: -against missing.yaml: missing.yaml: cannot read spec file: no such file or directory"},
		{[]string{"-allow", "FIELD_REMOVED"}, 2, "", "outboxgen check: -allow needs -against"},
		{[]string{"-against", "git:HEAD", "-allow", "NOPE"}, 2, "", `outboxgen check: unknown rule "NOPE"; the rules are FIELD_REMOVED,`},
	} {
		code, stdout, stderr := cli(t, sub, append([]string{"check"}, tc.args...)...)
		if code != tc.code || !strings.Contains(stdout, tc.stdout) || !strings.Contains(stderr, tc.stderr) {
			t.Errorf("check %s: exit %d, stdout %q, stderr %q; want exit %d and %q", strings.Join(tc.args, " "), code, stdout, stderr, tc.code, tc.stderr)
		}
	}

	// A spec that is not in the base revision yet has no contract.
	write(t, filepath.Join(sub, "new.yaml"), strings.Replace(contractV1, "out: events", "out: newevents", 1))
	cli(t, sub, "generate", "-f", "new.yaml")
	if code, stdout, stderr := cli(t, sub, "check", "-f", "new.yaml", "-against", "git:HEAD"); code != 0 || !strings.Contains(stdout, "new.yaml: not in git:HEAD (a new spec): no contract to compare with") {
		t.Errorf("new spec: exit %d, stdout %q, stderr %q", code, stdout, stderr)
	}

	// A base file that does not parse is reported with its own positions.
	write(t, filepath.Join(sub, "broken.yaml"), "version: 1\ngo: {package: events}\n")
	if code, _, stderr := cli(t, sub, "check", "-against", "broken.yaml"); code != 1 || !strings.Contains(stderr, "broken.yaml:2:5: go is missing required key \"out\"") {
		t.Errorf("broken base: exit %d, stderr %q", code, stderr)
	}
	// A plain file as the base.
	write(t, filepath.Join(sub, "base.yaml"), contractV1)
	if code, stdout, _ := cli(t, sub, "check", "-against", "base.yaml"); code != 0 || !strings.Contains(stdout, "no breaking changes against base.yaml") {
		t.Errorf("file base: exit %d, stdout %q", code, stdout)
	}
}

// A spec renamed (git mv) since the base revision is compared with its
// old path's file there: a rename does not turn the check into a pass.
func TestCheckAgainstGitRenamed(t *testing.T) {
	dir := gitRepo(t, contractV1)
	cmd := exec.Command("git", "-C", dir, "mv", "sub/events.yaml", "sub/contract.yaml")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("git mv: %v\n%s", err, out)
	}
	sub := filepath.Join(dir, "sub")
	write(t, filepath.Join(sub, "contract.yaml"), contractTypeChanged)
	cli(t, sub, "generate", "-f", "contract.yaml")
	code, _, stderr := cli(t, sub, "check", "-f", "contract.yaml", "-against", "git:HEAD")
	if code != 1 || !strings.Contains(stderr, "(HEAD:sub/events.yaml:10:9)") || !strings.Contains(stderr, "(FIELD_TYPE_CHANGED)") {
		t.Fatalf("renamed spec: exit %d, stderr %q; want the type change against HEAD:sub/events.yaml", code, stderr)
	}
}
