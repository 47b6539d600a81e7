package main

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	"github.com/outboxgen/outboxgen/generator/compat"
	"github.com/outboxgen/outboxgen/generator/spec"
)

// errBreaking marks a contract check that found breaking changes; they are
// in its message.
var errBreaking = errors.New("breaking changes")

// parseAllow parses -allow: comma-separated rule names.
func parseAllow(s string) ([]compat.Rule, error) {
	var out []compat.Rule
	for _, part := range strings.Split(s, ",") {
		if strings.TrimSpace(part) == "" {
			continue
		}
		r, err := compat.ParseRule(part)
		if err != nil {
			return nil, err
		}
		out = append(out, r)
	}
	return out, nil
}

// checkAgainst compares the spec at file with base (a file path, or
// git:REV for the same file at a git revision). It returns the line to
// print when there is no breaking change, or an error listing every
// breaking change, one "file:line:col: message (RULE)" per line.
func checkAgainst(file, against string, allow []compat.Rule) (string, error) {
	next, err := spec.ParseFile(file)
	if err != nil {
		return "", err
	}
	base, err := readBase(file, against)
	if errors.Is(err, errNoBase) {
		return fmt.Sprintf("%s: not in %s (a new spec): no contract to compare with\n", file, against), nil
	}
	if err != nil {
		return "", fmt.Errorf("outboxgen check: -against %s: %w", against, err)
	}
	findings := compat.Compare(base, next, allow...)
	if len(findings) == 0 {
		return fmt.Sprintf("%s: no breaking changes against %s (%d %s compared)\n", file, against, len(base.Events), plural(len(base.Events), "event", "events")), nil
	}
	var b strings.Builder
	for _, f := range findings {
		b.WriteString(f.Error())
		b.WriteByte('\n')
	}
	fmt.Fprintf(&b, "outboxgen check: %d breaking %s against %s", len(findings), plural(len(findings), "change", "changes"), against)
	return "", &breakingError{b.String()}
}

// breakingError lists the breaking changes found; it matches errBreaking.
type breakingError struct{ msg string }

func (e *breakingError) Error() string        { return e.msg }
func (e *breakingError) Is(target error) bool { return target == errBreaking }

// errNoBase marks a git revision that does not have the spec file.
var errNoBase = errors.New("the spec file is not in that revision")

// readBase reads and parses the base spec: the file at against, or, for
// git:REV, the file at path file in revision REV of the git repository
// holding it (read with git show).
func readBase(file, against string) (*spec.Spec, error) {
	rev, ok := strings.CutPrefix(against, "git:")
	if !ok {
		return spec.ParseFile(against)
	}
	if rev == "" || strings.HasPrefix(rev, "-") {
		return nil, fmt.Errorf("git:%s names no revision; write e.g. git:origin/main or git:HEAD~1", rev)
	}
	if _, err := exec.LookPath("git"); err != nil {
		return nil, fmt.Errorf("git:%s needs the git command, which is not installed (or not in PATH); or pass the base spec as a file", rev)
	}
	abs, err := filepath.Abs(file)
	if err != nil {
		return nil, err
	}
	if real, err := filepath.EvalSymlinks(abs); err == nil {
		abs = real
	}
	dir := filepath.Dir(abs)
	top, err := git(dir, "rev-parse", "--show-toplevel")
	if err != nil {
		return nil, fmt.Errorf("%s is not in a git work tree: %w", file, err)
	}
	root := strings.TrimSpace(string(top))
	if real, err := filepath.EvalSymlinks(root); err == nil {
		root = real
	}
	rel, err := filepath.Rel(root, abs)
	if err != nil || strings.HasPrefix(rel, "..") {
		return nil, fmt.Errorf("%s is outside the git work tree %s", file, root)
	}
	rel = filepath.ToSlash(rel)
	if _, err := git(root, "rev-parse", "--verify", "--quiet", "--end-of-options", rev+"^{commit}"); err != nil {
		return nil, fmt.Errorf("unknown git revision %q (fetch it first, e.g. git fetch origin main)", rev)
	}
	if _, err := git(root, "cat-file", "-e", rev+":"+rel); err != nil {
		// Renamed or moved since rev? Then rev's file is the base: a
		// rename must not turn the check into a pass.
		old, ok := renamedFrom(root, rev, rel)
		if !ok {
			return nil, errNoBase
		}
		rel = old
	}
	data, err := git(root, "show", rev+":"+rel)
	if err != nil {
		return nil, err
	}
	return spec.Parse(rev+":"+rel, data)
}

// renamedFrom returns the path in rev of the file now at rel, when git
// sees it as renamed (or copied) since rev, counting uncommitted changes
// too.
func renamedFrom(root, rev, rel string) (string, bool) {
	out, err := git(root, "diff", "--name-status", "-M", "-C", "--end-of-options", rev)
	if err != nil {
		return "", false
	}
	for _, line := range strings.Split(string(out), "\n") {
		f := strings.Split(line, "\t")
		if len(f) == 3 && (strings.HasPrefix(f[0], "R") || strings.HasPrefix(f[0], "C")) && f[2] == rel {
			return f[1], true
		}
	}
	return "", false
}

// git runs git in dir and returns its standard output; an error carries
// its standard error.
func git(dir string, args ...string) ([]byte, error) {
	cmd := exec.Command("git", append([]string{"-C", dir}, args...)...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	cmd.Env = append(os.Environ(), "GIT_TERMINAL_PROMPT=0")
	out, err := cmd.Output()
	if err != nil {
		if msg := strings.TrimSpace(stderr.String()); msg != "" {
			return nil, fmt.Errorf("git %s: %s", args[0], msg)
		}
		return nil, fmt.Errorf("git %s: %w", args[0], err)
	}
	return out, nil
}
