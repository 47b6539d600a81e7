package main

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/nats-io/nats.go"

	"github.com/outboxgen/outboxgen/internal/gentest/walevents"
	"github.com/outboxgen/outboxgen/internal/testdb"
	"github.com/outboxgen/outboxgen/runtime/outbox"
	"github.com/outboxgen/outboxgen/templates"
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

// walSpecPath is the WAL-mode fixture spec (sql.wal: true, tables
// wal_outbox and wal_inbox); internal/gentest/walevents is generated from
// it.
var walSpecPath, _ = filepath.Abs(filepath.Join("..", "..", "internal", "gentest", "walevents.yaml"))

// walTestDB returns the DSN of a fresh PostgreSQL database with the WAL
// fixture's tables and a pgx pool on it, skipping (outside CI) when the
// server does not run with wal_level=logical. The database's replication
// slots are dropped before it is.
func walTestDB(t *testing.T) (string, *pgxpool.Pool) {
	t.Helper()
	dsn := testdb.DSN(t, "postgres")
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	var level string
	if err := pool.QueryRow(ctx, "SELECT current_setting('wal_level')").Scan(&level); err != nil {
		t.Fatal(err)
	}
	if level != "logical" {
		msg := "the test PostgreSQL server runs with wal_level=" + level + "; WAL mode needs logical (scripts/testdb.sh sets it at the server's next start)"
		if os.Getenv("CI") == "true" {
			t.Fatal(msg)
		}
		t.Skip(msg)
	}
	db := stdlib.OpenDBFromPool(pool)
	t.Cleanup(func() { db.Close() })
	testdb.ApplySchema(t, db, "postgres", templates.Tables{Outbox: "wal_outbox", Inbox: "wal_inbox"})
	t.Cleanup(func() {
		c, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		for c.Err() == nil {
			_, _ = pool.Exec(c, "SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots WHERE database = current_database() AND active_pid IS NOT NULL")
			_, _ = pool.Exec(c, "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE database = current_database() AND NOT active")
			var n int
			if pool.QueryRow(c, "SELECT count(*) FROM pg_replication_slots WHERE database = current_database()").Scan(&n) == nil && n == 0 {
				return
			}
			time.Sleep(100 * time.Millisecond)
		}
		t.Error("could not drop the test database's replication slots")
	})
	return dsn, pool
}

// TestRelayProcessWAL: with sql.wal, `outboxgen wal setup` creates the
// slot, the generated InsertX write into the WAL (no outbox row), and
// `outboxgen relay` streams every committed event, in per-key order, to
// NATS JetStream, never a rolled-back one; `outboxgen status` shows the
// slot active; SIGTERM exits 0.
func TestRelayProcessWAL(t *testing.T) {
	dsn, pool := walTestDB(t)
	url, js := startNATS(t)
	if _, err := js.AddStream(&nats.StreamConfig{Name: "PARCELS", Subjects: []string{"parcels.>"}, Duplicates: 5 * time.Minute}); err != nil {
		t.Fatal(err)
	}
	type got struct {
		id, key string
		seq     int64
	}
	var mu sync.Mutex
	var msgs []got
	sub, err := js.Subscribe("parcels.>", func(m *nats.Msg) {
		var p walevents.ParcelShipped
		if err := json.Unmarshal(m.Data, &p); err != nil {
			t.Errorf("payload %q: %v", m.Data, err)
		}
		mu.Lock()
		msgs = append(msgs, got{m.Header.Get(nats.MsgIdHdr), p.ParcelID, p.Seq})
		mu.Unlock()
	}, nats.OrderedConsumer(), nats.DeliverAll())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sub.Unsubscribe() })
	count := func() int { mu.Lock(); defer mu.Unlock(); return len(msgs) }

	// The slot first: events written before it exists are never streamed.
	var out, errOut bytes.Buffer
	if err := cmdWAL([]string{"setup", "-db", dsn, "-f", walSpecPath}, &out, &errOut); err != nil {
		t.Fatalf("wal setup: %v\n%s", err, errOut.String())
	}
	if !strings.Contains(out.String(), "replication slot outboxgen_wal_outbox and publication ready") {
		t.Fatalf("wal setup printed %q", out.String())
	}
	// What it did, and what it waited for, on stderr.
	for _, want := range []string{"publication created", "creating the replication slot", "replication slot created"} {
		if !strings.Contains(errOut.String(), want) {
			t.Errorf("wal setup's stderr lacks %q:\n%s", want, errOut.String())
		}
	}
	if err := cmdWAL([]string{"setup", "-db", dsn, "-f", walSpecPath}, io.Discard, io.Discard); err != nil {
		t.Fatalf("a second wal setup: %v, want success (the slot is kept)", err)
	}

	ctx := context.Background()
	keys := []string{"p1", "p2", "p3", "p4"}
	const perKey = 50
	write := func(from, to int, rollback bool) {
		t.Helper()
		for i := from; i < to; i++ {
			tx, err := pool.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			for _, k := range keys {
				if _, err := walevents.InsertParcelShipped(ctx, tx, walevents.ParcelShipped{ParcelID: k, Seq: int64(i)}); err != nil {
					t.Fatal(err)
				}
			}
			if rollback {
				err = tx.Rollback(ctx)
			} else {
				err = tx.Commit(ctx)
			}
			if err != nil {
				t.Fatal(err)
			}
		}
	}
	write(0, perKey/2, false) // before the relay runs: the slot holds them
	write(1000, 1001, true)   // rolled back: never published

	p := start(t, "relay", "-db", dsn, "-f", walSpecPath, "-broker", url, "-poll-interval", "100ms", "-shutdown-timeout", "1s",
		"-sweeper=false", "-janitor=false", "-monitor-interval", "1s", "-timeout", "10s")
	write(perKey/2, perKey, false)
	waitFor(t, 60*time.Second, "every event", func() bool { return count() >= len(keys)*perKey })

	var rows int
	if err := pool.QueryRow(ctx, "SELECT count(*) FROM wal_outbox").Scan(&rows); err != nil || rows != 0 {
		t.Errorf("%d outbox rows (%v): WAL-mode writers must not insert, and nothing should be parked", rows, err)
	}
	out.Reset()
	errOut.Reset()
	if err := cmdStatus([]string{"-db", dsn, "-f", walSpecPath}, &out, &errOut); err != nil {
		t.Fatalf("status: %v\n%s", err, errOut.String())
	}
	if !strings.Contains(out.String(), "WAL mode (sql.wal): slot outboxgen_wal_outbox: active,") {
		t.Errorf("status does not show the slot active:\n%s", out.String())
	}
	t.Logf("outboxgen status:\n%s", out.String())
	out.Reset()
	if err := cmdStatus([]string{"-db", dsn, "-f", walSpecPath, "-o", "json"}, &out, &errOut); err != nil {
		t.Fatal(err)
	}
	var rep statusReport
	if err := json.Unmarshal(out.Bytes(), &rep); err != nil || rep.WAL == nil || !rep.WAL.Exists || !rep.WAL.Active || rep.WAL.Slot != "outboxgen_wal_outbox" {
		t.Errorf("status -o json wal = %+v (%v)", rep.WAL, err)
	}

	p.cmd.Process.Signal(syscall.SIGTERM)
	if code := p.wait(t, 20*time.Second); code != 0 {
		t.Fatalf("relay exited %d after SIGTERM, want 0; stderr:\n%s", code, p.stderr.String())
	}
	if !strings.Contains(p.stderr.String(), `"walrelay"`) {
		t.Errorf("the started line does not list walrelay among the parts:\n%s", p.stderr.String())
	}
	mu.Lock()
	defer mu.Unlock()
	next := map[string]int64{}
	seen := map[string]bool{}
	for _, m := range msgs {
		if m.seq >= 1000 {
			t.Fatalf("rolled-back event %s/%d was published", m.key, m.seq)
		}
		if seen[m.id] {
			continue
		}
		seen[m.id] = true
		if m.seq != next[m.key] {
			t.Fatalf("key %s: event %d arrived when %d was due (per-key order)", m.key, m.seq, next[m.key])
		}
		next[m.key]++
	}
	for _, k := range keys {
		if next[k] != perKey {
			t.Errorf("key %s: %d distinct events, want %d", k, next[k], perKey)
		}
	}
}

// TestRelayProcessWALMessageTooLarge: an event larger than
// -wal-max-message-bytes is not skipped: the process stops with exit 1
// and an error naming the flag; with the default, the next process
// publishes it. The flag layers like the others ($OUTBOXGEN_..., -config).
func TestRelayProcessWALMessageTooLarge(t *testing.T) {
	p := newRelayFlags(io.Discard)
	if err := p.parse([]string{"-db", "sqlite:x.db", "-broker", "stdout:"}); err != nil {
		t.Fatal(err)
	}
	if p.walMaxMessage != outbox.MaxWALEnvelope {
		t.Errorf("-wal-max-message-bytes defaults to %d, want outbox.MaxWALEnvelope (%d)", p.walMaxMessage, outbox.MaxWALEnvelope)
	}
	t.Setenv("OUTBOXGEN_WAL_MAX_MESSAGE_BYTES", "4194304")
	p = newRelayFlags(io.Discard)
	if err := p.parse([]string{"-db", "sqlite:x.db", "-broker", "stdout:"}); err != nil || p.walMaxMessage != 4<<20 {
		t.Errorf("$OUTBOXGEN_WAL_MAX_MESSAGE_BYTES: %d, %v; want 4194304", p.walMaxMessage, err)
	}

	dsn, pool := walTestDB(t)
	url, js := startNATS(t)
	if _, err := js.AddStream(&nats.StreamConfig{Name: "PARCELS", Subjects: []string{"parcels.>"}}); err != nil {
		t.Fatal(err)
	}
	if err := cmdWAL([]string{"setup", "-db", dsn, "-f", walSpecPath}, io.Discard, io.Discard); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := walevents.InsertParcelShipped(ctx, tx, walevents.ParcelShipped{ParcelID: "big", Seq: 1}); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	args := []string{"relay", "-db", dsn, "-f", walSpecPath, "-broker", url, "-poll-interval", "100ms", "-shutdown-timeout", "1s",
		"-sweeper=false", "-janitor=false", "-monitor=false", "-timeout", "10s"}
	small := start(t, append(args, "-wal-max-message-bytes", "64")...)
	if code := small.wait(t, 60*time.Second); code != 1 {
		t.Fatalf("relay with -wal-max-message-bytes 64 exited %d, want 1; stderr:\n%s", code, small.stderr.String())
	}
	for _, want := range []string{"was not skipped", "-wal-max-message-bytes", "to at least"} {
		if !strings.Contains(small.stderr.String(), want) {
			t.Errorf("stderr lacks %q:\n%s", want, small.stderr.String())
		}
	}
	info, err := js.StreamInfo("PARCELS")
	if err != nil || info.State.Msgs != 0 {
		t.Fatalf("stream PARCELS: %+v, %v; want nothing published", info, err)
	}

	p2 := start(t, args...)
	waitFor(t, 60*time.Second, "the event, once the limit allows it", func() bool {
		info, err := js.StreamInfo("PARCELS")
		return err == nil && info.State.Msgs == 1
	})
	p2.cmd.Process.Signal(syscall.SIGTERM)
	if code := p2.wait(t, 20*time.Second); code != 0 {
		t.Fatalf("relay exited %d after SIGTERM, want 0", code)
	}
}

// `outboxgen wal setup` refuses, before touching a database, a spec
// without sql.wal and a command line without "setup".
func TestWALSetupRefuses(t *testing.T) {
	var errOut bytes.Buffer
	if err := cmdWAL(nil, io.Discard, &errOut); err != errUsage || !strings.Contains(errOut.String(), "outboxgen wal setup -db DSN") {
		t.Errorf("wal without setup: %v, %q; want the usage", err, errOut.String())
	}
	plain := filepath.Join("..", "..", "internal", "gentest", "pgxevents.yaml")
	err := cmdWAL([]string{"setup", "-db", "postgres://u:secret@127.0.0.1:1/x", "-f", plain}, io.Discard, io.Discard)
	if err == nil || !strings.Contains(err.Error(), "does not set sql.wal: true") || strings.Contains(err.Error(), "secret") {
		t.Errorf("wal setup on a spec without sql.wal: %v", err)
	}
	// sql.wal on a database that is not PostgreSQL: nothing to set up.
	err = cmdWAL([]string{"setup", "-db", "sqlite:" + filepath.Join(t.TempDir(), "x.db"), "-f", walSpecPath}, io.Discard, io.Discard)
	if err == nil || !strings.Contains(err.Error(), "is not PostgreSQL") {
		t.Errorf("wal setup on SQLite: %v", err)
	}
}

func TestHumanBytes(t *testing.T) {
	for n, want := range map[int64]string{0: "0 B", 999: "999 B", 12_300_000: "12.3 MB", 1 << 30: "1.1 GB"} {
		if got := humanBytes(n); got != want {
			t.Errorf("humanBytes(%d) = %q, want %q", n, got, want)
		}
	}
}

// TestWALStatusLine: each state of the slot has its own status line; a
// slot being created is not reported as merely active.
func TestWALStatusLine(t *testing.T) {
	for _, c := range []struct {
		st   walStatus
		want []string
	}{
		{walStatus{Slot: "s"}, []string{"slot s: MISSING"}},
		{walStatus{Slot: "s", Exists: true, Active: true, Creating: true, WALStatus: "reserved", SafeWALSize: -1}, []string{"slot s: BEING CREATED (", "0 B behind (wal_status reserved"}},
		{walStatus{Slot: "s", Exists: true, Active: true, LagBytes: 37_600, WALStatus: "reserved", SafeWALSize: -1}, []string{"slot s: active, 37.6 kB behind (wal_status reserved, safe_wal_size unlimited)"}},
		{walStatus{Slot: "s", Exists: true, WALStatus: "lost"}, []string{"slot s: inactive (no relay streams from it: WAL accumulates), 0 B behind (wal_status lost, safe_wal_size 0 B)", "<< ALERT"}},
		// Whatever the state, a slot losing WAL gets the alert.
		{walStatus{Slot: "s", Exists: true, Active: true, Creating: true, WALStatus: "unreserved"}, []string{"slot s: BEING CREATED (", "<< ALERT"}},
	} {
		got := c.st.String()
		if !strings.HasPrefix(got, c.want[0]) {
			t.Errorf("%+v: %q, want it to start with %q", c.st, got, c.want[0])
		}
		for _, w := range c.want[1:] {
			if !strings.Contains(got, w) {
				t.Errorf("%+v: %q, want it to contain %q", c.st, got, w)
			}
		}
	}
}
