package walrelay_test

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"testing"
)

// pgServer is a PostgreSQL server the crash test may crash: a data
// directory and the binaries that serve it.
type pgServer struct {
	data, bin  string
	dsn        string
	asPostgres bool // run the binaries as the postgres user (runuser): we are root
}

// command runs the PostgreSQL binary name as the server's owner.
func (s *pgServer) command(name string, args ...string) *exec.Cmd {
	path := filepath.Join(s.bin, name)
	if s.asPostgres {
		return exec.Command("runuser", append([]string{"-u", "postgres", "--", path}, args...)...)
	}
	return exec.Command(path, args...)
}

// latestPGBin returns the newest /usr/lib/postgresql/<version>/bin, the
// binaries scripts/testdb.sh uses, or "" when there are none.
func latestPGBin(t testing.TB) string {
	dirs, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	var ok []string
	for _, d := range dirs {
		if _, err := os.Stat(filepath.Join(d, "initdb")); err == nil {
			ok = append(ok, d)
		}
	}
	sort.Slice(ok, func(i, j int) bool {
		vi, _ := strconv.ParseFloat(filepath.Base(filepath.Dir(ok[i])), 64)
		vj, _ := strconv.ParseFloat(filepath.Base(filepath.Dir(ok[j])), 64)
		return vi < vj
	})
	if len(ok) == 0 {
		return ""
	}
	return ok[len(ok)-1]
}

// startPrivatePostgres initialises and starts a throw-away PostgreSQL
// server with wal_level=logical on a free port, stopped and removed in
// t.Cleanup. Without PostgreSQL binaries it skips, except under CI where
// it fails. As root, the server runs as the postgres user, as
// scripts/testdb.sh runs its own.
func startPrivatePostgres(t *testing.T) *pgServer {
	t.Helper()
	s := &pgServer{bin: latestPGBin(t), asPostgres: os.Geteuid() == 0}
	if s.bin == "" {
		msg := "no PostgreSQL binaries under /usr/lib/postgresql/*/bin for a private server (scripts/testdb.sh installs them)"
		if os.Getenv("CI") == "true" {
			t.Fatal(msg)
		}
		t.Skip(msg)
	}
	// Under the system temp directory, not t.TempDir(): the postgres user
	// must reach it, and the test's temp parents are private to us.
	dir, err := os.MkdirTemp("", "outboxgen-walcrash-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if s.asPostgres {
		u, err := user.Lookup("postgres")
		if err != nil {
			t.Fatalf("running as root, the private server needs the postgres user: %v", err)
		}
		uid, _ := strconv.Atoi(u.Uid)
		gid, _ := strconv.Atoi(u.Gid)
		if err := os.Chown(dir, uid, gid); err != nil {
			t.Fatal(err)
		}
	}
	s.data = filepath.Join(dir, "data")
	if out, err := s.command("initdb", "-D", s.data, "-U", "postgres", "--auth=trust", "--no-locale", "-E", "UTF8", "--no-sync").CombinedOutput(); err != nil {
		t.Fatalf("initdb: %v\n%s", err, out)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := ln.Addr().(*net.TCPAddr).Port
	ln.Close()
	conf := fmt.Sprintf(`
listen_addresses = '127.0.0.1'
port = %d
unix_socket_directories = '%s'
wal_level = logical
max_replication_slots = 10
max_wal_senders = 10
max_connections = 50
shared_buffers = 32MB
fsync = off
full_page_writes = off
`, port, dir)
	// As the postgres user: the data directory is its own.
	var app *exec.Cmd
	if s.asPostgres {
		app = exec.Command("runuser", "-u", "postgres", "--", "sh", "-c", "cat >> \"$0\"", filepath.Join(s.data, "postgresql.conf"))
	} else {
		app = exec.Command("sh", "-c", "cat >> \"$0\"", filepath.Join(s.data, "postgresql.conf"))
	}
	app.Stdin = strings.NewReader(conf)
	if out, err := app.CombinedOutput(); err != nil {
		t.Fatalf("configure the private server: %v\n%s", err, out)
	}
	if out, err := s.command("pg_ctl", "-D", s.data, "-w", "-l", filepath.Join(dir, "server.log"), "start").CombinedOutput(); err != nil {
		log, _ := os.ReadFile(filepath.Join(dir, "server.log"))
		t.Fatalf("pg_ctl start: %v\n%s\n%s", err, out, log)
	}
	t.Cleanup(func() {
		if out, err := s.command("pg_ctl", "-D", s.data, "-m", "immediate", "-w", "stop").CombinedOutput(); err != nil {
			t.Logf("pg_ctl stop of the private server: %v\n%s", err, out)
		}
	})
	s.dsn = fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?sslmode=disable", port)
	return s
}
