package testdb

import (
	"database/sql"
	"net"
	"net/url"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// These tests run scripts/testdb.sh against a private OUTBOXGEN_TESTDB_DIR
// (never the shared /tmp/outboxgen-testdb) with ports nobody listens on, so
// the servers other tests use are never stopped or started. The script
// runs as root only; elsewhere they skip.

// runScript runs scripts/testdb.sh cmd with dir as its data directory and
// returns its combined output and whether it exited 0.
func runScript(t *testing.T, dir, cmd string, extraEnv ...string) (string, bool) {
	t.Helper()
	stdout, stderr, ok := runScriptArgs(t, dir, []string{cmd}, extraEnv...)
	return stdout + stderr, ok
}

// runScriptArgs runs scripts/testdb.sh with args and dir as its data
// directory and returns its stdout, its stderr and whether it exited 0.
func runScriptArgs(t *testing.T, dir string, args []string, extraEnv ...string) (stdout, stderr string, ok bool) {
	t.Helper()
	script, err := filepath.Abs(filepath.Join("..", "..", "scripts", "testdb.sh"))
	if err != nil {
		t.Fatal(err)
	}
	if s := os.Getenv("OUTBOXGEN_TESTDB_SCRIPT"); s != "" {
		script = s // another version of the script, e.g. to show a test fails on it
	}
	c := exec.Command("bash", append([]string{script}, args...)...)
	env := []string{
		"PATH=" + os.Getenv("PATH"),
		"HOME=" + os.Getenv("HOME"),
		"OUTBOXGEN_TESTDB_DIR=" + dir,
		// Ports nothing listens on: the script's own servers are never
		// reached from a test.
		"OUTBOXGEN_TESTDB_PG_PORT=1",
		"OUTBOXGEN_TESTDB_MYSQL_PORT=2",
	}
	c.Env = append(env, extraEnv...)
	var out, errOut strings.Builder
	c.Stdout, c.Stderr = &out, &errOut
	if err := c.Run(); err != nil {
		if _, ok := err.(*exec.ExitError); !ok {
			t.Fatalf("run %s %q: %v", script, args, err)
		}
		return out.String(), errOut.String(), false
	}
	return out.String(), errOut.String(), true
}

func needScriptRoot(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("scripts/testdb.sh runs as root only")
	}
	for _, bin := range []string{"bash", "flock", "stat"} {
		if _, err := exec.LookPath(bin); err != nil {
			t.Skipf("%s not installed", bin)
		}
	}
}

// plantLockSymlink makes dir/.lock a symlink to a file outside dir holding
// known content and returns that file's path.
func plantLockSymlink(t *testing.T, dir string) (target, content string) {
	t.Helper()
	content = "precious: must survive testdb.sh\n"
	target = filepath.Join(t.TempDir(), "victim")
	if err := os.WriteFile(target, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(target, filepath.Join(dir, ".lock")); err != nil {
		t.Fatal(err)
	}
	return target, content
}

func checkUntouched(t *testing.T, target, content string) {
	t.Helper()
	b, err := os.ReadFile(target)
	if err != nil {
		t.Fatalf("read symlink target: %v", err)
	}
	if string(b) != content {
		t.Fatalf("testdb.sh changed the file the .lock symlink points to: now %q, was %q", b, content)
	}
}

// TestScriptLockSymlinkStop: `testdb.sh stop` with a symlink planted at
// $DIR/.lock refuses to follow it and leaves its target alone.
func TestScriptLockSymlinkStop(t *testing.T) {
	needScriptRoot(t)
	dir := filepath.Join(t.TempDir(), "testdb")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	target, content := plantLockSymlink(t, dir)
	out, ok := runScript(t, dir, "stop")
	checkUntouched(t, target, content)
	if ok || !strings.Contains(out, "symlink") {
		t.Fatalf("stop with a symlinked .lock: want a refusal naming the symlink, got ok=%v:\n%s", ok, out)
	}
}

// TestScriptLockSymlinkStart: the same for `testdb.sh start`. The servers
// configured in the environment are passed as external ones, so that a
// script that did get past the lock would use them instead of starting
// anything (it reaches no server of its own on the ports above).
func TestScriptLockSymlinkStart(t *testing.T) {
	needScriptRoot(t)
	pg, my := os.Getenv(PostgresEnv), os.Getenv(MySQLEnv)
	if pg == "" || my == "" {
		t.Skipf("%s and %s must name running servers (so that the script starts none)", PostgresEnv, MySQLEnv)
	}
	dir := filepath.Join(t.TempDir(), "testdb")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	target, content := plantLockSymlink(t, dir)
	out, ok := runScript(t, dir, "start", PostgresEnv+"="+pg, MySQLEnv+"="+my)
	checkUntouched(t, target, content)
	if ok || !strings.Contains(out, "symlink") {
		t.Fatalf("start with a symlinked .lock: want a refusal naming the symlink, got ok=%v:\n%s", ok, out)
	}
}

// TestScriptLockRegularFile: a regular .lock file is used, and not
// truncated, and stop on a directory with no servers succeeds.
func TestScriptLockRegularFile(t *testing.T) {
	needScriptRoot(t)
	dir := filepath.Join(t.TempDir(), "testdb")
	if err := os.Mkdir(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	lock := filepath.Join(dir, ".lock")
	if err := os.WriteFile(lock, []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	out, ok := runScript(t, dir, "stop")
	if !ok || !strings.Contains(out, "postgres: not running") || !strings.Contains(out, "mariadb: not running") {
		t.Fatalf("stop on an empty directory: ok=%v\n%s", ok, out)
	}
	if b, _ := os.ReadFile(lock); string(b) != "x" {
		t.Fatalf(".lock truncated: %q", b)
	}
	if fi, err := os.Stat(dir); err != nil || fi.Mode().Perm() != 0o755 {
		t.Fatalf("data directory mode: %v %v, want 0755 (the postgres and mysql users must reach it)", fi.Mode(), err)
	}
}

// TestScriptRefusesForeignDir: a data directory owned by another user (in
// /tmp anyone can create /tmp/outboxgen-testdb first and plant symlinks in
// it) or a symlinked one is refused before anything is written there.
func TestScriptRefusesForeignDir(t *testing.T) {
	needScriptRoot(t)
	nobody, err := user.Lookup("nobody")
	if err != nil {
		t.Skip("no user nobody")
	}
	uid, _ := strconv.Atoi(nobody.Uid)
	gid, _ := strconv.Atoi(nobody.Gid)

	t.Run("foreign owner", func(t *testing.T) {
		dir := filepath.Join(t.TempDir(), "testdb")
		if err := os.Mkdir(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.Chown(dir, uid, gid); err != nil {
			t.Fatal(err)
		}
		out, ok := runScript(t, dir, "stop")
		if ok || !strings.Contains(out, "refusing") {
			t.Fatalf("stop in a directory owned by nobody: want a refusal, got ok=%v:\n%s", ok, out)
		}
		if _, err := os.Lstat(filepath.Join(dir, ".lock")); err == nil {
			t.Fatal("the script created .lock in a directory it refused")
		}
	})
	t.Run("symlinked dir", func(t *testing.T) {
		real := t.TempDir()
		dir := filepath.Join(t.TempDir(), "testdb")
		if err := os.Symlink(real, dir); err != nil {
			t.Fatal(err)
		}
		out, ok := runScript(t, dir, "stop")
		if ok || !strings.Contains(out, "symlink") {
			t.Fatalf("stop with a symlinked data directory: want a refusal, got ok=%v:\n%s", ok, out)
		}
		if _, err := os.Lstat(filepath.Join(real, ".lock")); err == nil {
			t.Fatal("the script wrote through the symlinked directory")
		}
	})
}

// TestScriptSelectiveStart: `start postgres` sets up PostgreSQL alone: it
// prints only its DSN, never touches MariaDB, and `env` then lists only
// PostgreSQL; `start mariadb` adds MariaDB; `stop postgres` drops
// PostgreSQL from env; `stop` drops the rest. Both servers configured in
// the environment are passed as external ones, so nothing is started or
// stopped: the data directory is a fresh one, with no servers of its own.
func TestScriptSelectiveStart(t *testing.T) {
	needScriptRoot(t)
	pg, my := os.Getenv(PostgresEnv), os.Getenv(MySQLEnv)
	if pg == "" || my == "" {
		t.Skipf("%s and %s must name running servers (so that the script starts none)", PostgresEnv, MySQLEnv)
	}
	dir := filepath.Join(t.TempDir(), "testdb")
	external := []string{PostgresEnv + "=" + pg, MySQLEnv + "=" + my}
	squote := func(s string) string { return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'" }
	pgLine := "export " + PostgresEnv + "=" + squote(pg) + "\n"
	myLine := "export " + MySQLEnv + "=" + squote(my) + "\n"
	step := func(args []string, wantOut string, wantOK bool, notInLog string) {
		t.Helper()
		stdout, stderr, ok := runScriptArgs(t, dir, args, external...)
		if ok != wantOK || stdout != wantOut {
			t.Fatalf("testdb.sh %q: ok=%v, want %v\nstdout:\n%s\nwant:\n%s\nstderr:\n%s", args, ok, wantOK, stdout, wantOut, stderr)
		}
		if notInLog != "" && strings.Contains(stderr, notInLog) {
			t.Fatalf("testdb.sh %q acted on %s:\n%s", args, notInLog, stderr)
		}
	}
	step([]string{"start", "postgres"}, pgLine, true, "mariadb")
	step([]string{"env"}, pgLine, true, "")
	step([]string{"start", "mysql"}, myLine, true, "postgres")
	step([]string{"env"}, pgLine+myLine, true, "")
	step([]string{"start", "postgres", "mariadb"}, pgLine+myLine, true, "")
	step([]string{"stop", "postgresql"}, "", true, "mariadb")
	step([]string{"env"}, myLine, true, "")
	step([]string{"stop", "mariadb"}, "", true, "postgres")
	step([]string{"env"}, "", false, "")
}

// TestScriptUsage: an unknown server or argument is a usage error (exit
// 2) before anything is done.
func TestScriptUsage(t *testing.T) {
	if _, err := exec.LookPath("bash"); err != nil {
		t.Skip("bash not installed")
	}
	dir := filepath.Join(t.TempDir(), "testdb")
	for _, args := range [][]string{{"start", "oracle"}, {"stop", "postgres", "sqlite"}, {"env", "postgres"}, {"restart"}, {}} {
		stdout, stderr, ok := runScriptArgs(t, dir, args)
		if ok || stdout != "" || !strings.Contains(stderr, "usage:") {
			t.Errorf("testdb.sh %q: ok=%v, stdout %q, stderr %q; want a usage error", args, ok, stdout, stderr)
		}
		if len(args) == 2 && args[0] != "env" && !strings.Contains(stderr, args[len(args)-1]) {
			t.Errorf("testdb.sh %q: stderr %q does not name %q", args, stderr, args[len(args)-1])
		}
	}
	if _, err := os.Lstat(dir); err == nil {
		t.Error("a usage error created the data directory")
	}
}

// TestScriptDropsLeftovers: a start that starts a server drops the og_
// databases (and, on PostgreSQL, their replication slots) that killed test
// runs left behind, and says how many; other databases stay, and a start
// that finds the server running drops nothing (a live test may use it).
// It runs private servers on free ports in a data directory of its own.
func TestScriptDropsLeftovers(t *testing.T) {
	needScriptRoot(t)
	if testing.Short() {
		t.Skip("starts PostgreSQL and MariaDB servers of its own")
	}
	for _, bin := range []string{"mariadbd", "mariadb-install-db", "runuser"} {
		if _, err := exec.LookPath(bin); err != nil {
			if _, err := os.Stat("/usr/sbin/" + bin); err != nil {
				t.Skipf("%s not installed", bin)
			}
		}
	}
	if m, _ := filepath.Glob("/usr/lib/postgresql/*/bin/initdb"); len(m) == 0 {
		t.Skip("PostgreSQL not installed")
	}
	top := t.TempDir()
	// The servers run as postgres and mysql: they must reach the directory.
	for _, d := range []string{filepath.Dir(top), top} {
		if err := os.Chmod(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	dir := filepath.Join(top, "testdb")
	ports := []string{"OUTBOXGEN_TESTDB_PG_PORT=" + freePort(t), "OUTBOXGEN_TESTDB_MYSQL_PORT=" + freePort(t)}
	script := func(args ...string) (map[string]string, string) {
		t.Helper()
		stdout, stderr, ok := runScriptArgs(t, dir, args, ports...)
		if !ok {
			t.Fatalf("testdb.sh %q failed:\n%s%s", args, stdout, stderr)
		}
		env := map[string]string{}
		for _, line := range strings.Split(stdout, "\n") {
			if k, v, ok := strings.Cut(strings.TrimPrefix(line, "export "), "="); ok {
				env[k] = strings.Trim(v, "'")
			}
		}
		return env, stderr
	}
	t.Cleanup(func() { runScriptArgs(t, dir, []string{"stop", "postgres", "mariadb"}, ports...) })
	env, _ := script("start", "postgres", "mariadb")

	open := func(driver, dsn string) *sql.DB {
		t.Helper()
		db, err := sql.Open(driver, dsn)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { db.Close() })
		return db
	}
	pg := open("pgx", env[PostgresEnv])
	my := open("mysql", env[MySQLEnv])
	run := func(db *sql.DB, q string) {
		t.Helper()
		if _, err := db.Exec(q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	// Two of internal/testdb's names, and names close to them that are
	// not (OG_… on MariaDB, whose schema names compare without regard
	// to case; PostgreSQL folds the unquoted name).
	const left1, left2 = "og_00000000000000a1", "og_00000000000000a2"
	for _, db := range []*sql.DB{pg, my} {
		for _, name := range []string{left1, left2, "keep_me", "og_left", "ogx0000000000000000", "og_00000000000000a3x"} {
			run(db, "CREATE DATABASE "+name)
		}
	}
	run(my, "CREATE DATABASE OG_00000000000000A4")
	pgDSN, err := url.Parse(env[PostgresEnv])
	if err != nil {
		t.Fatal(err)
	}
	pgDSN.Path = "/" + left1
	slotDB := open("pgx", pgDSN.String())
	run(slotDB, "SELECT pg_create_logical_replication_slot('og_left_slot', 'pgoutput')")
	slotDB.Close()
	pg.Close()
	my.Close()

	names := func(db *sql.DB, q string) []string {
		t.Helper()
		rows, err := db.Query(q)
		if err != nil {
			t.Fatalf("%s: %v", q, err)
		}
		defer rows.Close()
		var out []string
		for rows.Next() {
			var s string
			if err := rows.Scan(&s); err != nil {
				t.Fatal(err)
			}
			out = append(out, s)
		}
		slices.Sort(out) // MariaDB's ORDER BY ignores case
		return out
	}
	const pgDBs = "SELECT datname FROM pg_database WHERE datname NOT IN ('postgres', 'template0', 'template1') ORDER BY 1"
	const myDBs = "SELECT schema_name FROM information_schema.schemata WHERE schema_name NOT IN ('information_schema', 'mysql', 'performance_schema', 'sys') ORDER BY 1"
	const kept = "keep_me,og_00000000000000a3x,og_left,ogx0000000000000000"

	// Running: nothing is dropped.
	_, stderr := script("start", "postgres", "mariadb")
	if strings.Contains(stderr, "dropped") {
		t.Fatalf("a start of running servers dropped databases:\n%s", stderr)
	}
	// Stopped and started: the leftovers go.
	script("stop", "postgres", "mariadb")
	env, stderr = script("start", "postgres", "mariadb")
	for _, want := range []string{"postgres: dropped 2 test database(s)", "mariadb: dropped 2 test database(s)"} {
		if !strings.Contains(stderr, want) {
			t.Errorf("start after a stop: log lacks %q:\n%s", want, stderr)
		}
	}
	pg = open("pgx", env[PostgresEnv])
	my = open("mysql", env[MySQLEnv])
	if got := strings.Join(names(pg, pgDBs), ","); got != kept {
		t.Errorf("postgres databases after the start: %s, want %s", got, kept)
	}
	if got := names(pg, "SELECT slot_name FROM pg_replication_slots"); len(got) != 0 {
		t.Errorf("postgres replication slots after the start: %q, want none", got)
	}
	if got, want := strings.Join(names(my, myDBs), ","), "OG_00000000000000A4,"+kept; got != want {
		t.Errorf("mariadb databases after the start: %s, want %s", got, want)
	}
}

// freePort returns a TCP port on 127.0.0.1 nothing listens on now.
func freePort(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return strconv.Itoa(l.Addr().(*net.TCPAddr).Port)
}
