package main

import (
	"bytes"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// runCmd runs the command in process and returns its exit code and output.
func runCmd(args ...string) (code int, stdout, stderr string) {
	var out, errOut bytes.Buffer
	code = run(args, &out, &errOut)
	return code, out.String(), errOut.String()
}

// TestLayering: flag > $OUTBOXGEN_<FLAG> > -config file > default.
func TestLayering(t *testing.T) {
	cfg := filepath.Join(t.TempDir(), "relay.yaml")
	os.WriteFile(cfg, []byte("# settings\nbatch-size: 300\nconcurrency: 3\npoll-interval: 5s\nsweeper: false\nbroker: \"stdout:\"\n"), 0o644)
	t.Setenv("OUTBOXGEN_CONCURRENCY", "6")
	t.Setenv("OUTBOXGEN_POLL_INTERVAL", "7s")
	t.Setenv("OUTBOXGEN_DB", "sqlite:/nonexistent.db")
	p := newRelayFlags(io.Discard)
	if err := p.parse([]string{"-config", cfg, "-poll-interval", "9s"}); err != nil {
		t.Fatal(err)
	}
	if p.batchSize != 300 {
		t.Errorf("batch-size = %d, want 300 (file)", p.batchSize)
	}
	if p.concurrency != 6 {
		t.Errorf("concurrency = %d, want 6 (env over file)", p.concurrency)
	}
	if p.pollInterval != 9*time.Second {
		t.Errorf("poll-interval = %s, want 9s (flag over env and file)", p.pollInterval)
	}
	if p.runSweeper {
		t.Error("sweeper = true, want false (file)")
	}
	if p.maxAttempts != 5 || p.lease != 30*time.Second {
		t.Errorf("max-attempts %d, lease %s: want the runtime defaults 5, 30s", p.maxAttempts, p.lease)
	}
	if p.broker != "stdout:" || p.db.db != "sqlite:/nonexistent.db" {
		t.Errorf("broker %q, db %q: want them from the file and $OUTBOXGEN_DB", p.broker, p.db.db)
	}

	// The config file named by the environment.
	t.Setenv("OUTBOXGEN_CONFIG", cfg)
	p = newRelayFlags(io.Discard)
	if err := p.parse(nil); err != nil {
		t.Fatal(err)
	}
	if p.batchSize != 300 {
		t.Errorf("with $OUTBOXGEN_CONFIG: batch-size = %d, want 300", p.batchSize)
	}
}

// TestLayeringErrors: unknown keys name file:line; bad env values name
// the variable.
func TestLayeringErrors(t *testing.T) {
	dir := t.TempDir()
	bad := filepath.Join(dir, "bad.yaml")
	os.WriteFile(bad, []byte("batch-size: 10\nbatchsize: 20\n"), 0o644)
	code, _, stderr := runCmd("relay", "-db", "sqlite:x.db", "-broker", "stdout:", "-config", bad)
	if code != 1 || !strings.Contains(stderr, bad+`:2: unknown key "batchsize"`) {
		t.Errorf("unknown key: exit %d, stderr %q; want 1 naming %s:2", code, stderr, bad)
	}
	typo := filepath.Join(dir, "typo.yaml")
	os.WriteFile(typo, []byte("\nlease-duration: soon\n"), 0o644)
	code, _, stderr = runCmd("relay", "-db", "sqlite:x.db", "-broker", "stdout:", "-config", typo)
	if code != 1 || !strings.Contains(stderr, typo+":2: lease-duration") {
		t.Errorf("bad value: exit %d, stderr %q; want 1 naming %s:2", code, stderr, typo)
	}
	t.Setenv("OUTBOXGEN_BATCH_SIZE", "many")
	code, _, stderr = runCmd("relay", "-db", "sqlite:x.db", "-broker", "stdout:")
	if code != 1 || !strings.Contains(stderr, "$OUTBOXGEN_BATCH_SIZE") {
		t.Errorf("bad env: exit %d, stderr %q; want 1 naming $OUTBOXGEN_BATCH_SIZE", code, stderr)
	}
}

// TestBadInput: each mistake is one line on stderr and exit 1 (2 for the
// command line), never showing a password.
func TestBadInput(t *testing.T) {
	clearEnv(t)
	good := newTestDB(t, "sqlite")
	empty := filepath.Join(t.TempDir(), "empty.db")
	newEmptySQLite(t, empty)
	cases := []struct {
		name string
		args []string
		code int
		want string
	}{
		{"unknown broker scheme", []string{"relay", "-db", good.flag, "-broker", "zmq://u:hunter2secret@host:1"}, 1, "zmq"},
		{"unknown DSN scheme", []string{"relay", "-db", "oracle://u:hunter2secret@host/db", "-broker", "stdout:"}, 1, "oracle"},
		{"unreachable database", []string{"relay", "-db", "postgres://u:hunter2secret@127.0.0.1:1/db?sslmode=disable", "-broker", "stdout:", "-timeout", "2s"}, 1, "127.0.0.1:1"},
		{"unreachable mysql", []string{"sweep", "-once", "-db", "mysql://u:hunter2secret@tcp(127.0.0.1:1)/db", "-broker", "stdout:", "-timeout", "2s"}, 1, "127.0.0.1:1"},
		{"missing tables", []string{"relay", "-db", "sqlite:" + empty, "-broker", "stdout:"}, 1, "outbox_event"},
		{"missing tables janitor", []string{"janitor", "-once", "-db", "sqlite:" + empty}, 1, "outbox_event"},
		{"archive without table", []string{"janitor", "-once", "-archive", "-db", good.flag}, 1, "archive"},
		{"no broker", []string{"relay", "-db", good.flag}, 2, "-broker"},
		{"no database", []string{"sweep", "-once", "-broker", "stdout:"}, 2, "-db"},
		{"bad flag value", []string{"relay", "-db", good.flag, "-broker", "stdout:", "-batch-size", "x"}, 2, "batch-size"},
		{"invalid setting", []string{"relay", "-db", good.flag, "-broker", "stdout:", "-shutdown-timeout", "1m"}, 1, "ShutdownTimeout"},
		{"nothing to run", []string{"relay", "-db", good.flag, "-broker", "stdout:", "-relay=false", "-sweeper=false", "-monitor=false", "-janitor=false"}, 2, "nothing to run"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			code, _, stderr := runCmd(c.args...)
			if code != c.code {
				t.Fatalf("exit %d, want %d; stderr:\n%s", code, c.code, stderr)
			}
			if !strings.Contains(stderr, c.want) {
				t.Errorf("stderr lacks %q:\n%s", c.want, stderr)
			}
			if strings.Contains(stderr, "hunter2secret") {
				t.Errorf("stderr shows the password:\n%s", stderr)
			}
			if c.code == 1 && strings.Count(strings.TrimSpace(stderr), "\n") != 0 {
				t.Errorf("want one line, got:\n%s", stderr)
			}
		})
	}
}

// TestJanitorOnce: janitor -once on a healthy database exits 0 and logs
// what it removed.
func TestJanitorOnce(t *testing.T) {
	clearEnv(t)
	db := newTestDB(t, "sqlite")
	code, _, stderr := runCmd("janitor", "-once", "-db", db.flag)
	if code != 0 || !strings.Contains(stderr, `"msg":"janitor pass completed"`) {
		t.Fatalf("exit %d; stderr:\n%s", code, stderr)
	}
}

// clearEnv unsets the OUTBOXGEN_ variables that would set flags.
func clearEnv(t *testing.T) {
	t.Helper()
	for _, kv := range os.Environ() {
		k, _, _ := strings.Cut(kv, "=")
		if strings.HasPrefix(k, "OUTBOXGEN_") && !strings.HasPrefix(k, "OUTBOXGEN_TEST_") {
			t.Setenv(k, "")
			os.Unsetenv(k)
		}
	}
}

// newEmptySQLite creates an empty SQLite database file (no tables).
func newEmptySQLite(t *testing.T, path string) {
	t.Helper()
	if err := os.WriteFile(path, nil, 0o644); err != nil {
		t.Fatal(err)
	}
}
