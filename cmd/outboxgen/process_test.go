package main

// Process tests: the real outboxgen binary, run as a subprocess against
// real PostgreSQL, MariaDB and SQLite databases and a real NATS JetStream
// server (embedded in the test process), signalled and killed as
// Kubernetes would.

import (
	"bufio"
	"database/sql"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/nats-io/nats.go"

	"github.com/outboxgen/outboxgen/internal/natstest"
	"github.com/outboxgen/outboxgen/internal/syncbuf"
	"github.com/outboxgen/outboxgen/internal/testdb"
	"github.com/outboxgen/outboxgen/runtime/dialect"
	"github.com/outboxgen/outboxgen/runtime/driver/drivertest"
	"github.com/outboxgen/outboxgen/templates"
)

var binary struct {
	once sync.Once
	path string
	err  error
}

// outboxgenBinary builds the command once per test binary.
func outboxgenBinary(t *testing.T) string {
	t.Helper()
	binary.once.Do(func() {
		dir, err := os.MkdirTemp("", "outboxgen-bin-")
		if err != nil {
			binary.err = err
			return
		}
		binary.path = filepath.Join(dir, "outboxgen")
		out, err := exec.Command("go", "build", "-o", binary.path, ".").CombinedOutput()
		if err != nil {
			binary.err = fmt.Errorf("go build: %v\n%s", err, out)
		}
	})
	if binary.err != nil {
		t.Fatal(binary.err)
	}
	return binary.path
}

// testDB is a fresh database with the outbox tables (default names).
type testDB struct {
	d    dialect.Dialect
	db   *sql.DB
	flag string // what -db takes
}

// newTestDB creates a database of dialect name ("postgres", "mysql",
// "sqlite") with the outbox and inbox tables.
func newTestDB(t *testing.T, name string) *testDB {
	t.Helper()
	var tdb testDB
	switch name {
	case "sqlite":
		path := filepath.Join(t.TempDir(), "outbox.db")
		db, err := sql.Open("sqlite", testdb.SQLiteDSN(path))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { db.Close() })
		tdb = testDB{d: dialect.SQLite, db: db, flag: "sqlite:" + path}
	default:
		dsn := testdb.DSN(t, name)
		db, err := sql.Open(testdb.Driver(t, name), dsn)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { db.Close() })
		tdb = testDB{d: dialect.Postgres, db: db, flag: dsn}
		if name == "mysql" {
			tdb.d, tdb.flag = dialect.MySQL, "mysql://"+dsn
		}
	}
	testdb.ApplySchema(t, tdb.db, name, templates.DefaultTables)
	return &tdb
}

// insert writes n events per key, payload {"key":..,"seq":i} (i from
// start), in one statement per 200 rows, in key-interleaved order.
func (db *testDB) insert(t *testing.T, topic string, keys []string, start, n int) {
	t.Helper()
	type row struct {
		key string
		seq int
	}
	var rows []row
	for i := start; i < start+n; i++ {
		for _, k := range keys {
			rows = append(rows, row{k, i})
		}
	}
	for len(rows) > 0 {
		chunk := rows[:min(200, len(rows))]
		rows = rows[len(chunk):]
		var b strings.Builder
		b.WriteString("INSERT INTO " + templates.DefaultTables.Outbox + " (event_id, biz_type, biz_id, topic, payload) VALUES ")
		var args []any
		for j, r := range chunk {
			if j > 0 {
				b.WriteString(", ")
			}
			p := len(args)
			fmt.Fprintf(&b, "(%s, %s, %s, %s, %s)", db.d.Placeholder(p+1), db.d.Placeholder(p+2), db.d.Placeholder(p+3), db.d.Placeholder(p+4), db.d.Placeholder(p+5))
			args = append(args, uuid.NewString(), "ORDER_PAID", r.key, topic, fmt.Sprintf(`{"key":%q,"seq":%d}`, r.key, r.seq))
		}
		if _, err := db.db.Exec(b.String(), args...); err != nil {
			t.Fatalf("insert: %v", err)
		}
	}
}

// count returns the number of rows with the given status.
// leased returns the number of pending rows under a lease.
func (db *testDB) leased(t *testing.T) int {
	t.Helper()
	var n int
	if err := db.db.QueryRow("SELECT COUNT(*) FROM " + templates.DefaultTables.Outbox + " WHERE status = 0 AND lease_owner IS NOT NULL").Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

func (db *testDB) count(t *testing.T, status int) int {
	t.Helper()
	var n int
	if err := db.db.QueryRow(fmt.Sprintf("SELECT COUNT(*) FROM %s WHERE status = %d", templates.DefaultTables.Outbox, status)).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// startNATS starts an embedded JetStream server and creates the stream
// capturing "outbox.>" (de-duplicating by Nats-Msg-Id, the event id).
func startNATS(t *testing.T) (url string, js nats.JetStreamContext) {
	t.Helper()
	s := natstest.Start(t, nil)
	url = fmt.Sprintf("nats://127.0.0.1:%d", s.Addr().(*net.TCPAddr).Port)
	nc, err := nats.Connect(url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err = nc.JetStream()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := js.AddStream(&nats.StreamConfig{Name: "OUTBOX", Subjects: []string{"outbox.>"}, Duplicates: 5 * time.Minute}); err != nil {
		t.Fatal(err)
	}
	return url, js
}

// delivery is one message read back from the stream.
type delivery struct {
	id  string // Nats-Msg-Id: the event id
	key string
	seq int
}

// collector reads every message of subject from the start of the stream,
// in stream order.
type collector struct {
	mu   sync.Mutex
	msgs []delivery
}

func collect(t *testing.T, js nats.JetStreamContext, subject string) *collector {
	t.Helper()
	c := &collector{}
	sub, err := js.Subscribe(subject, func(m *nats.Msg) {
		var p struct {
			Key string `json:"key"`
			Seq int    `json:"seq"`
		}
		if err := json.Unmarshal(m.Data, &p); err != nil {
			t.Errorf("payload %q: %v", m.Data, err)
		}
		c.mu.Lock()
		c.msgs = append(c.msgs, delivery{id: m.Header.Get(nats.MsgIdHdr), key: p.Key, seq: p.Seq})
		c.mu.Unlock()
	}, nats.OrderedConsumer(), nats.DeliverAll())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sub.Unsubscribe() })
	return c
}

func (c *collector) len() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.msgs)
}

// waitFor waits until cond holds, failing after d.
func waitFor(t *testing.T, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s", d, what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// check verifies that every (key, seq < n) arrived and that the first
// delivery of each key's events came in seq order; duplicates are allowed.
func (c *collector) check(t *testing.T, keys []string, n int) (dups int) {
	t.Helper()
	c.mu.Lock()
	defer c.mu.Unlock()
	seen := map[string]bool{}
	next := map[string]int{}
	for _, m := range c.msgs {
		k := fmt.Sprintf("%s/%d", m.key, m.seq)
		if seen[k] {
			dups++
			continue
		}
		seen[k] = true
		if m.seq != next[m.key] {
			t.Errorf("key %s: first delivery of seq %d came when seq %d was expected next", m.key, m.seq, next[m.key])
		}
		next[m.key] = m.seq + 1
	}
	for _, k := range keys {
		if next[k] != n {
			t.Errorf("key %s: %d events delivered in order, want %d", k, next[k], n)
		}
	}
	return dups
}

// proc is a running outboxgen subprocess.
type proc struct {
	cmd    *exec.Cmd
	stderr *syncbuf.Buffer
	stdout *syncbuf.Buffer
	done   chan struct{}
	err    error
}

// start runs the binary with args; it is killed in t.Cleanup if still
// running, and its logs are shown when the test fails.
func start(t *testing.T, args ...string) *proc {
	t.Helper()
	return startEnv(t, nil, args...)
}

// startEnv is start with extra environment variables (KEY=value).
func startEnv(t *testing.T, env []string, args ...string) *proc {
	t.Helper()
	p := &proc{cmd: exec.Command(outboxgenBinary(t), args...), stderr: &syncbuf.Buffer{}, stdout: &syncbuf.Buffer{}, done: make(chan struct{})}
	p.cmd.Stderr, p.cmd.Stdout = p.stderr, p.stdout
	p.cmd.Env = append(cleanEnv(), env...)
	p.cmd.Dir = t.TempDir() // no events.yaml there: default tables
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { p.err = p.cmd.Wait(); close(p.done) }()
	t.Cleanup(func() {
		select {
		case <-p.done:
		default:
			p.cmd.Process.Kill()
			<-p.done
		}
		if t.Failed() {
			t.Logf("outboxgen %s stderr:\n%s", args[0], p.stderr.String())
		}
	})
	return p
}

// cleanEnv is the environment without OUTBOXGEN_ settings that would
// change the commands' flags, and without OTEL_ settings (tracing).
func cleanEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		if strings.HasPrefix(kv, "OUTBOXGEN_") || strings.HasPrefix(kv, "OTEL_") {
			continue
		}
		env = append(env, kv)
	}
	return env
}

// wait waits for the process to exit and returns its exit code.
func (p *proc) wait(t *testing.T, d time.Duration) int {
	t.Helper()
	select {
	case <-p.done:
	case <-time.After(d):
		t.Fatalf("outboxgen did not exit within %s; stderr:\n%s", d, p.stderr.String())
	}
	return p.cmd.ProcessState.ExitCode()
}

// freeAddr returns a free 127.0.0.1 TCP address.
func freeAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// get returns the status and body of an HTTP GET, or 0 when it fails.
func get(url string) (int, string) {
	resp, err := http.Get(url)
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// relayArgs are the flags of a fast relay for the tests.
func relayArgs(db, broker string, extra ...string) []string {
	return append([]string{"relay", "-db", db, "-broker", broker,
		"-poll-interval", "100ms", "-lease-duration", "3s", "-shutdown-timeout", "1s", "-batch-size", "50",
		"-concurrency", "4", "-sweeper=false", "-janitor=false", "-monitor-interval", "1s", "-timeout", "10s"}, extra...)
}

var processDialects = []string{"postgres", "mysql", "sqlite"}

// TestRelayProcess: relays publish every row, in order per key, through
// a SIGTERM mid-batch (clean exit 0), a SIGKILL, and a fresh process that
// finishes the work.
func TestRelayProcess(t *testing.T) {
	for _, name := range processDialects {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			db := newTestDB(t, name)
			url, js := startNATS(t)
			got := collect(t, js, "outbox.>")
			keys := []string{"a", "b", "c", "d", "e", "f", "g", "h"}
			const perKey = 400
			db.insert(t, "outbox.orders.paid", keys, 0, perKey)
			total := len(keys) * perKey

			// 1: runs with the metrics server; SIGTERM while it publishes.
			addr := freeAddr(t)
			p1 := start(t, relayArgs(db.flag, url, "-metrics-addr", addr)...)
			waitFor(t, 30*time.Second, "first deliveries", func() bool { return got.len() >= 300 })
			if code, body := get("http://" + addr + "/readyz"); code != 200 {
				t.Errorf("/readyz = %d %q, want 200", code, body)
			}
			if code, _ := get("http://" + addr + "/healthz"); code != 200 {
				t.Errorf("/healthz = %d, want 200", code)
			}
			_, metrics := get("http://" + addr + "/metrics")
			for _, m := range []string{"outboxgen_relay_sent_total", "outboxgen_runner_ready"} {
				if !strings.Contains(metrics, m) {
					t.Errorf("/metrics lacks %s", m)
				}
			}
			p1.cmd.Process.Signal(syscall.SIGTERM)
			if code := p1.wait(t, 15*time.Second); code != 0 {
				t.Fatalf("SIGTERMed relay exited %d, want 0; stderr:\n%s", code, p1.stderr.String())
			}
			if !strings.Contains(p1.stderr.String(), `"msg":"shutting down"`) {
				t.Errorf("no shutdown log line; stderr:\n%s", p1.stderr.String())
			}
			// A clean shutdown gives back every row it held: none waits
			// for its lease to lapse.
			if n := db.leased(t); n != 0 {
				t.Errorf("%d rows still leased after a clean SIGTERM exit, want 0", n)
			}
			afterTerm := got.len()
			if afterTerm >= total {
				t.Fatalf("the first relay published everything (%d) before SIGTERM: the test needs more rows", afterTerm)
			}

			// 2: SIGKILL while it publishes: its leased rows wait for the lease.
			p2 := start(t, relayArgs(db.flag, url)...)
			waitFor(t, 30*time.Second, "deliveries of the second relay", func() bool { return got.len() >= afterTerm+300 })
			p2.cmd.Process.Kill()
			p2.wait(t, 10*time.Second)
			t.Logf("%s: %d rows left leased by the SIGKILLed relay", name, db.leased(t))
			if got.len() >= total {
				t.Fatalf("the second relay published everything before SIGKILL: the test needs more rows")
			}

			// More rows meanwhile, then a third relay finishes the work.
			db.insert(t, "outbox.orders.paid", keys, perKey, 50)
			p3 := start(t, relayArgs(db.flag, url)...)
			// Up to 2 minutes: on a loaded machine (CI runs packages side
			// by side) this phase was seen to take 40-55 s on PostgreSQL,
			// 50 rows a second with steady progress (8 keys, so about one
			// batch in flight at a time, each waiting for its NATS
			// publishes), where it usually takes 3 s.
			waitFor(t, 2*time.Minute, "every event", func() bool { return db.count(t, 0) == 0 })
			waitFor(t, 10*time.Second, "every delivery", func() bool { return got.len() >= len(keys)*(perKey+50) })
			p3.cmd.Process.Signal(syscall.SIGTERM)
			if code := p3.wait(t, 15*time.Second); code != 0 {
				t.Errorf("third relay exited %d, want 0", code)
			}
			dups := got.check(t, keys, perKey+50)
			t.Logf("%s: %d events, %d deliveries (%d duplicates); %d published before SIGTERM", name, len(keys)*(perKey+50), got.len(), dups, afterTerm)
		})
	}
}

// TestSweepOnceProcess: sweep -once publishes the overdue rows (and only
// them) through stdout: and exits 0.
func TestSweepOnceProcess(t *testing.T) {
	for _, name := range processDialects {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			db := newTestDB(t, name)
			db.insert(t, "outbox.orders.paid", []string{"old"}, 0, 3)
			if _, err := db.db.Exec("UPDATE " + templates.DefaultTables.Outbox + " SET created_at = " + drivertest.OpsAgo(db.d, 5*time.Minute)); err != nil {
				t.Fatal(err)
			}
			db.insert(t, "outbox.orders.paid", []string{"new"}, 0, 2)
			p := start(t, "sweep", "-once", "-db", db.flag, "-broker", "stdout:", "-overdue-after", "1m")
			if code := p.wait(t, 30*time.Second); code != 0 {
				t.Fatalf("sweep -once exited %d; stderr:\n%s", code, p.stderr.String())
			}
			var keys []string
			sc := bufio.NewScanner(strings.NewReader(p.stdout.String()))
			for sc.Scan() {
				var m struct {
					Topic   string `json:"topic"`
					Payload struct {
						Key string `json:"key"`
						Seq int    `json:"seq"`
					} `json:"payload"`
				}
				if err := json.Unmarshal(sc.Bytes(), &m); err != nil {
					t.Fatalf("stdout line %q: %v", sc.Text(), err)
				}
				keys = append(keys, fmt.Sprintf("%s/%d", m.Payload.Key, m.Payload.Seq))
			}
			if want := "old/0 old/1 old/2"; strings.Join(keys, " ") != want {
				t.Errorf("sweep published %v, want %s", keys, want)
			}
			if n := db.count(t, 0); n != 2 {
				t.Errorf("%d rows still pending, want the 2 young ones", n)
			}
			if !strings.Contains(p.stderr.String(), `"msg":"sweep completed"`) || !strings.Contains(p.stderr.String(), `"published":3`) {
				t.Errorf("no completion log; stderr:\n%s", p.stderr.String())
			}
		})
	}
}

// TestSweepOnceUnreachable: sweep -once against a database that does not
// answer exits 1 with one line, password masked.
func TestSweepOnceUnreachable(t *testing.T) {
	t.Parallel()
	p := start(t, "sweep", "-once", "-db", "postgres://app:hunter2secret@127.0.0.1:1/shop?sslmode=disable", "-broker", "stdout:", "-timeout", "3s")
	if code := p.wait(t, 30*time.Second); code != 1 {
		t.Fatalf("exit %d, want 1; stderr:\n%s", code, p.stderr.String())
	}
	errText := p.stderr.String()
	if strings.Count(strings.TrimSpace(errText), "\n") != 0 || strings.Contains(errText, "hunter2secret") {
		t.Errorf("want one line without the password, got:\n%s", errText)
	}
}

// TestRelayProcessSIGTERMIdle: an idle relay exits 0 promptly on SIGTERM.
func TestRelayProcessSIGTERMIdle(t *testing.T) {
	t.Parallel()
	db := newTestDB(t, "sqlite")
	p := start(t, relayArgs(db.flag, "stdout:")...)
	waitFor(t, 20*time.Second, "the started log", func() bool { return strings.Contains(p.stderr.String(), "outboxgen relay started") })
	p.cmd.Process.Signal(syscall.SIGTERM)
	if code := p.wait(t, 10*time.Second); code != 0 {
		t.Fatalf("exit %d, want 0; stderr:\n%s", code, p.stderr.String())
	}
}
