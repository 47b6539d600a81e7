package main

// End to end on PostgreSQL, MariaDB and SQLite with a real NATS JetStream
// server: a topic no stream captures makes a row FAILED and holds back the
// later events of its key; status and failed list/show report it; requeue
// refuses what is not FAILED, and once the stream is fixed, requeues it
// and the standalone `outboxgen relay` process publishes the key's events
// in order; replay publishes sent events again through it; inbox forget
// deletes a consumer's rows.

import (
	"bytes"
	"context"
	"database/sql"
	"encoding/json"
	"io"
	"log/slog"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/outboxgen/outboxgen/internal/natstest"
	"github.com/outboxgen/outboxgen/internal/testdb"
	"github.com/outboxgen/outboxgen/runtime/brokers/natsjs"
	"github.com/outboxgen/outboxgen/runtime/dialect"
	"github.com/outboxgen/outboxgen/runtime/driver/drivertest"
	"github.com/outboxgen/outboxgen/runtime/driver/sqldriver"
	"github.com/outboxgen/outboxgen/runtime/outbox"
	"github.com/outboxgen/outboxgen/runtime/relay"
	"github.com/outboxgen/outboxgen/templates"
)

// opsTestDB returns a fresh test database of dialect d with outboxgen's
// tables, closed when the test ends, and the CLI's -db flag for it.
func opsTestDB(t *testing.T, d string) (*sql.DB, string) {
	t.Helper()
	dsn := testdb.DSN(t, d)
	db, err := sql.Open(testdb.Driver(t, d), dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	testdb.ApplySchema(t, db, d, templates.DefaultTables)
	return db, "-db=" + cliDSN(d, dsn)
}

// cliDSN is the -db value for a testdb DSN.
func cliDSN(d, dsn string) string {
	switch d {
	case "mysql":
		return "mysql://" + dsn
	case "sqlite":
		return strings.TrimPrefix(strings.SplitN(dsn, "?", 2)[0], "file:") // a path
	}
	return dsn
}

func opsNATS(t *testing.T) string {
	t.Helper()
	return natstest.Start(t, nil).ClientURL()
}

// cli runs the command line and returns stdout, stderr and the exit code.
func opsCLI(t *testing.T, args ...string) (string, string, int) {
	t.Helper()
	var out, errb bytes.Buffer
	code := run(args, &out, &errb)
	return out.String(), errb.String(), code
}

func opsMust(t *testing.T, args ...string) string {
	t.Helper()
	out, errs, code := opsCLI(t, args...)
	if code != 0 {
		t.Fatalf("outboxgen %s: exit %d\nstdout: %s\nstderr: %s", strings.Join(args, " "), code, out, errs)
	}
	return out
}

func TestOperationsEndToEnd(t *testing.T) {
	for _, d := range testdb.Dialects() {
		t.Run(d, func(t *testing.T) {
			t.Parallel()
			testOperations(t, d)
		})
	}
}

func testOperations(t *testing.T, d string) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	db, dbFlag := opsTestDB(t, d)

	natsURL := opsNATS(t)
	nc, err := nats.Connect(natsURL)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	// One stream for every topic, so its sequence is the publish order. It
	// captures "orders" only: publishing to "refunds" fails (no stream).
	// A short duplicate window, so that the replay below is not dropped
	// as a duplicate of the first publish.
	streamCfg := jetstream.StreamConfig{Name: "ALL", Subjects: []string{"orders"}, Duplicates: 500 * time.Millisecond, Storage: jetstream.MemoryStorage}
	if _, err := js.CreateStream(ctx, streamCfg); err != nil {
		t.Fatal(err)
	}

	schema := outbox.Schema{Source: "test", Tables: outbox.Tables{Outbox: "outbox_event", Inbox: "outbox_inbox"}, Dialects: []outbox.Dialect{outbox.Dialect(d)}}
	w, err := schema.NewWriter(dialect.Dialect(d))
	if err != nil {
		t.Fatal(err)
	}
	type ev struct{ typ, topic, key string }
	evs := []ev{
		{"ORDER_PAID", "orders", "k1"}, {"ORDER_PAID", "orders", "k2"}, {"ORDER_REFUNDED", "refunds", "k1"},
		{"ORDER_PAID", "orders", "k2"}, {"ORDER_SHIPPED", "orders", "k1"}, {"ORDER_PAID", "orders", "k3"},
	}
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	for i, e := range evs {
		if _, err := w.Insert(ctx, tx, outbox.Event{Type: e.typ, Topic: e.topic, Key: e.key, Version: 1, Payload: map[string]any{"n": i, "note": "<script>x</script>"}}); err != nil {
			t.Fatal(err)
		}
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}

	drv, err := sqldriver.New(db, schema)
	if err != nil {
		t.Fatal(err)
	}
	pub, err := natsjs.NewPublisher(natsjs.Config{URL: natsURL, PublishTimeout: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close()
	r, err := relay.New(drv, relay.Config{Publisher: pub, MaxAttempts: 2, Backoff: func(int) time.Duration { return 50 * time.Millisecond },
		PollInterval: 50 * time.Millisecond, ShutdownTimeout: time.Second, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	rctx, stopRelay := context.WithCancel(ctx)
	relayDone := make(chan error, 1)
	go func() { relayDone <- r.Run(rctx) }()
	stopInProcess := sync.OnceFunc(func() { stopRelay(); <-relayDone })
	defer stopInProcess()

	// The refund fails twice and becomes FAILED; k1's shipment waits behind it.
	var st statusReport
	opsWait(t, 30*time.Second, "the refund to become FAILED and four events sent", func() bool {
		st = statusReport{}
		out := opsMust(t, "status", dbFlag, "-o", "json")
		if err := json.Unmarshal([]byte(out), &st); err != nil {
			t.Fatalf("status -o json: %v\n%s", err, out)
		}
		return st.Failed == 1 && st.SentInWindow == 4
	})
	if st.Pending != 1 || st.HeldBackKeys != 1 || st.HeldBackRows != 1 || len(st.FailedGroups) != 1 ||
		st.FailedGroups[0].Type != "ORDER_REFUNDED" || st.FailedGroups[0].Topic != "refunds" || st.FailedGroups[0].Count != 1 {
		t.Errorf("status: %+v", st)
	}
	text := opsMust(t, "status", dbFlag)
	for _, want := range []string{"failed            1", "1 key", "ORDER_REFUNDED  refunds  1"} {
		if !strings.Contains(strings.Join(strings.Fields(text), " "), strings.Join(strings.Fields(want), " ")) {
			t.Errorf("status text lacks %q:\n%s", want, text)
		}
	}

	// failed list: filters, JSON.
	var list struct {
		Events []map[string]any `json:"events"`
	}
	out := opsMust(t, "failed", "list", dbFlag, "-o", "json", "-error", "NO RESPONSE", "-type", "ORDER_REFUNDED")
	if err := json.Unmarshal([]byte(out), &list); err != nil || len(list.Events) != 1 {
		t.Fatalf("failed list: %v\n%s", err, out)
	}
	failedID := int64(list.Events[0]["id"].(float64))
	eventID := list.Events[0]["event_id"].(string)
	if out := opsMust(t, "failed", "list", dbFlag, "-type", "ORDER_PAID"); !strings.Contains(out, "no failed events match") {
		t.Errorf("failed list -type ORDER_PAID: %s", out)
	}
	show := opsMust(t, "failed", "show", eventID, dbFlag)
	for _, want := range []string{"status      failed", "attempts    2", `"note": "<script>x</script>"`, "key         k1"} {
		if !strings.Contains(show, want) {
			t.Errorf("failed show lacks %q:\n%s", want, show)
		}
	}

	// requeue refuses a sent row and changes nothing.
	out, errs, code := opsCLI(t, "requeue", dbFlag, strconv.FormatInt(failedID, 10), "1")
	if code != 1 || !strings.Contains(errs, "row 1 is sent, not failed") || !strings.Contains(errs, "nothing was changed") {
		t.Errorf("requeue of a sent row: exit %d\n%s%s", code, out, errs)
	}
	if n := opsCount(t, db, 2); n != 1 {
		t.Fatalf("after the refused requeue, %d FAILED rows, want 1", n)
	}
	// -all without -yes asks, and an empty answer changes nothing.
	stdinMu.Lock()
	stdin = strings.NewReader("\n")
	_, _, code = opsCLI(t, "requeue", dbFlag, "-all")
	stdinMu.Unlock()
	if code != 1 {
		t.Errorf("requeue -all without confirmation: exit %d, want 1", code)
	}

	// From here on the standalone relay process publishes.
	stopInProcess()
	proc := start(t, relayArgs(strings.TrimPrefix(dbFlag, "-db="), natsURL)...)
	defer func() {
		proc.cmd.Process.Signal(syscall.SIGTERM)
		if code := proc.wait(t, 10*time.Second); code != 0 {
			t.Errorf("outboxgen relay exited %d after SIGTERM", code)
		}
	}()

	// Fix the cause (the stream captures refunds too), then requeue: the
	// refund and then k1's shipment are published, in order.
	streamCfg.Subjects = []string{"orders", "refunds"}
	if _, err := js.UpdateStream(ctx, streamCfg); err != nil {
		t.Fatal(err)
	}
	// The answer comes after -timeout: the timeout bounds statements,
	// not the person typing.
	pr, pw := io.Pipe()
	go func() {
		time.Sleep(1500 * time.Millisecond)
		pw.Write([]byte("requeue 1\n"))
		pw.Close()
	}()
	stdinMu.Lock()
	stdin = pr
	out = opsMust(t, "requeue", dbFlag, "-all", "-timeout", "1s")
	stdinMu.Unlock()
	if !strings.Contains(out, "requeued 1 event (ids "+strconv.FormatInt(failedID, 10)) || !strings.Contains(out, "1 key); 1 event held behind them released in 1 transaction") {
		t.Errorf("requeue -all: %s", out)
	}
	opsWait(t, 30*time.Second, "every event sent", func() bool { return opsCount(t, db, 1) == len(evs) })
	msgs := opsReadStream(t, ctx, js, 6)
	if got := keyOrder(msgs, "k1"); !slices.Equal(got, []string{"ORDER_PAID", "ORDER_REFUNDED", "ORDER_SHIPPED"}) {
		t.Errorf("k1 published in order %v", got)
	}

	// Replay k2's events: published again with the same event ids.
	time.Sleep(600 * time.Millisecond) // past the stream's duplicate window
	out = opsMust(t, "replay", dbFlag, "-key", "k2")
	if !strings.Contains(out, "replayed 2 events") || !strings.Contains(out, "warning: 2 of them were sent less than 2m0s ago") {
		t.Errorf("replay -key k2: %s", out)
	}
	opsWait(t, 30*time.Second, "the replayed events sent", func() bool { return opsCount(t, db, 1) == len(evs) })
	msgs = opsReadStream(t, ctx, js, 8)
	if first, again := msgs[:6], msgs[6:]; again[0].id != idOf(first, "k2", 0) || again[1].id != idOf(first, "k2", 1) {
		t.Errorf("replayed %v, want k2's event ids %v in order", again, first)
	}
	// Replay refuses what is not sent.
	if _, errs, code := opsCLI(t, "replay", dbFlag, "999999"); code != 1 || !strings.Contains(errs, "no such event") {
		t.Errorf("replay of a missing row: exit %d: %s", code, errs)
	}

	// inbox forget: a consumer's rows for k2 go, the others stay.
	for i, e := range msgs[:6] {
		if _, err := db.ExecContext(ctx, opsRebind(d, "INSERT INTO outbox_inbox (consumer, event_id, biz_type, biz_id) VALUES (?, ?, ?, ?)"), "points", e.id, e.typ, e.key); err != nil {
			t.Fatalf("inbox row %d: %v", i, err)
		}
	}
	out = opsMust(t, "inbox", "forget", dbFlag, "-consumer", "points", "-key", "k2")
	if !strings.Contains(out, "forgot 2 events") {
		t.Errorf("inbox forget: %s", out)
	}
	var left int
	if err := db.QueryRowContext(ctx, "SELECT COUNT(*) FROM outbox_inbox").Scan(&left); err != nil || left != 4 {
		t.Errorf("inbox rows left: %d, %v; want 4", left, err)
	}
}

// stdinMu serialises the parallel subtests' use of the package's stdin.
var stdinMu sync.Mutex

type published struct{ id, typ, key string }

func idOf(msgs []published, key string, n int) string {
	for _, m := range msgs {
		if m.key == key {
			if n == 0 {
				return m.id
			}
			n--
		}
	}
	return ""
}

func keyOrder(msgs []published, key string) []string {
	var out []string
	for _, m := range msgs {
		if m.key == key {
			out = append(out, m.typ)
		}
	}
	return out
}

// readStream reads the first n messages of stream ALL in stream order.
func opsReadStream(t *testing.T, ctx context.Context, js jetstream.JetStream, n int) []published {
	t.Helper()
	c, err := js.OrderedConsumer(ctx, "ALL", jetstream.OrderedConsumerConfig{})
	if err != nil {
		t.Fatal(err)
	}
	batch, err := c.Fetch(n, jetstream.FetchMaxWait(10*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	var out []published
	for m := range batch.Messages() {
		h := m.Headers()
		out = append(out, published{id: h.Get(outbox.MetadataEventID), typ: h.Get(outbox.MetadataType), key: h.Get(outbox.MetadataKey)})
	}
	if len(out) != n {
		t.Fatalf("stream holds %d messages, want %d: %v", len(out), n, out)
	}
	return out
}

func opsCount(t *testing.T, db *sql.DB, status int) int {
	t.Helper()
	var n int
	if err := db.QueryRow("SELECT COUNT(*) FROM outbox_event WHERE status = " + strconv.Itoa(status)).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

func opsRebind(d, q string) string {
	if d != "postgres" {
		return q
	}
	for i := 1; strings.Contains(q, "?"); i++ {
		q = strings.Replace(q, "?", "$"+strconv.Itoa(i), 1)
	}
	return q
}

func opsWait(t *testing.T, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func TestOperationsBadInput(t *testing.T) {
	t.Setenv(envDB, "")
	for _, tc := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{"status"}, 2, "no database: pass -db DSN or set OUTBOXGEN_DB"},
		{[]string{"status", "-db", "oracle://scott:tiger@db/x"}, 1, "cannot tell the database"},
		{[]string{"status", "-db", "postgres://app:s3cret@127.0.0.1:1/x", "-timeout", "3s"}, 1, "127.0.0.1:1"},
		{[]string{"status", "-db", "mysql://app:s3cret@tcp(127.0.0.1:1)/x", "-timeout", "3s"}, 1, "127.0.0.1:1"},
		{[]string{"status", "-db", "sqlite:" + t.TempDir() + "/missing.db"}, 1, "no such file"},
		{[]string{"requeue", "-db", "x.db"}, 2, "name events"},
		{[]string{"requeue", "-db", "x.db", "12", "-type", "A"}, 2, "not both"},
		{[]string{"requeue", "-db", "x.db", "not-an-id"}, 2, "neither a row id"},
		{[]string{"failed", "list", "-db", "x.db", "-since", "yesterday"}, 2, "RFC 3339"},
		{[]string{"inbox", "forget", "-db", "x.db", "-key", "k"}, 2, "-consumer is required"},
		{[]string{"failed"}, 2, "usage"},
	} {
		out, errs, code := opsCLI(t, tc.args...)
		if code != tc.code || !strings.Contains(out+errs, tc.want) {
			t.Errorf("outboxgen %q: exit %d, want %d with %q\n%s%s", tc.args, code, tc.code, tc.want, out, errs)
		}
		if strings.Contains(out+errs, "s3cret") {
			t.Errorf("outboxgen %q shows the password: %s%s", tc.args, out, errs)
		}
	}
	// A database without the outbox table: one line naming the table.
	path := t.TempDir() + "/empty.db"
	if err := os.WriteFile(path, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	_, errs, code := opsCLI(t, "status", "-db", path)
	if code != 1 || !strings.Contains(errs, `table "outbox_event"`) || strings.Count(strings.TrimSpace(errs), "\n") != 0 {
		t.Errorf("status on an empty database: exit %d: %s", code, errs)
	}
}

// `outboxgen failed delete` deletes FAILED events only, always after a
// typed confirmation naming the number (or -yes), and says what it did.
func TestFailedDelete(t *testing.T) {
	for _, d := range testdb.Dialects() {
		t.Run(d, func(t *testing.T) {
			db, dbFlag := opsTestDB(t, d)
			ids := drivertest.OpsSeed(t, db, dialect.Dialect(d), "outbox_event",
				drivertest.OpsSeedRow{Count: 3, Status: 2, CreatedAgo: time.Hour},
				drivertest.OpsSeedRow{Count: 1, Status: 1, CreatedAgo: time.Hour, SentAgo: time.Minute})
			failed, sent := ids[0], ids[1]
			one := strconv.FormatInt(failed[0], 10)

			// No answer: nothing deleted.
			stdinMu.Lock()
			stdin = strings.NewReader("\n")
			out, errs, code := opsCLI(t, "failed", "delete", dbFlag, one)
			stdinMu.Unlock()
			if code != 1 || !strings.Contains(out, `Type "delete 1" to go on`) || !strings.Contains(errs, "not confirmed: nothing was changed") {
				t.Errorf("delete without confirmation: exit %d\n%s%s", code, out, errs)
			}
			if n := opsCount(t, db, 2); n != 3 {
				t.Fatalf("%d FAILED rows after an unconfirmed delete, want 3", n)
			}
			// A sent row is refused, nothing deleted.
			out, errs, code = opsCLI(t, "failed", "delete", dbFlag, "-yes", one, strconv.FormatInt(sent[0], 10))
			if code != 1 || !strings.Contains(errs, "is sent, not failed") || opsCount(t, db, 2) != 3 {
				t.Errorf("delete naming a sent row: exit %d\n%s%s", code, out, errs)
			}
			// Confirmed.
			stdinMu.Lock()
			stdin = strings.NewReader("delete 1\n")
			out = opsMust(t, "failed", "delete", dbFlag, one)
			stdinMu.Unlock()
			if !strings.Contains(out, "deleted 1 event (ids "+one+".."+one) || !strings.Contains(out, "gone for good") {
				t.Errorf("confirmed delete: %s", out)
			}
			// Dry run, then -all -yes.
			out = opsMust(t, "failed", "delete", dbFlag, "-all", "-dry-run")
			if !strings.Contains(out, "dry run: would delete 2 events") {
				t.Errorf("delete -all -dry-run: %s", out)
			}
			out = opsMust(t, "failed", "delete", dbFlag, "-all", "-yes")
			if !strings.Contains(out, "deleted 2 events") {
				t.Errorf("delete -all -yes: %s", out)
			}
			if n, s := opsCount(t, db, 2), opsCount(t, db, 1); n != 0 || s != 1 {
				t.Errorf("after the deletes: %d FAILED, %d sent rows; want 0 and 1", n, s)
			}
		})
	}
}

// typist answers a typed confirmation. Before its first read, when the
// command has counted and asked, it runs meanwhile: what happens in the
// database while the operator types.
type typist struct {
	meanwhile func()
	answer    *strings.Reader
	once      sync.Once
}

func (r *typist) Read(p []byte) (int, error) {
	r.once.Do(r.meanwhile)
	return r.answer.Read(p)
}

// opsCLIAnswer runs the command line with meanwhile run while the operator
// types answer.
func opsCLIAnswer(t *testing.T, meanwhile func(), answer string, args ...string) (string, string, int) {
	t.Helper()
	stdinMu.Lock()
	defer stdinMu.Unlock()
	stdin = &typist{meanwhile: meanwhile, answer: strings.NewReader(answer + "\n")}
	return opsCLI(t, args...)
}

// opsSet sets the status of outbox row id (a sent row gets a sent_at).
func opsSet(t *testing.T, db *sql.DB, d string, id int64, status int) {
	t.Helper()
	sentAt := "NULL"
	if status == 1 {
		sentAt = drivertest.OpsAgo(dialect.Dialect(d), time.Hour)
	}
	if _, err := db.Exec(opsRebind(d, "UPDATE outbox_event SET status = "+strconv.Itoa(status)+", sent_at = "+sentAt+" WHERE id = ?"), id); err != nil {
		t.Fatal(err)
	}
}

// opsStatuses returns the status of each row of ids.
func opsStatuses(t *testing.T, db *sql.DB, ids []int64) []int {
	t.Helper()
	out := make([]int, len(ids))
	for i, id := range ids {
		out[i] = -1 // deleted
		err := db.QueryRow("SELECT status FROM outbox_event WHERE id = " + strconv.FormatInt(id, 10)).Scan(&out[i])
		if err != nil && err != sql.ErrNoRows {
			t.Fatal(err)
		}
	}
	return out
}

// A confirmed action changes the rows the operator confirmed or nothing:
// a row that matches only after the count (a pending row that turns
// FAILED, or is sent, while the operator types, whatever its id) is never
// changed unconfirmed. The command refuses, changes nothing and exits 1.
func TestOpsConfirmedActionRefusesChangedSelection(t *testing.T) {
	for _, d := range testdb.Dialects() {
		t.Run(d, func(t *testing.T) {
			db, dbFlag := opsTestDB(t, d)
			for _, tc := range []struct {
				args   []string
				status int // the status the action acts on
				verb   string
			}{
				{[]string{"failed", "delete", "-type"}, 2, "delete"}, // + the seeded type
				{[]string{"requeue", "-all"}, 2, "requeue"},
				{[]string{"replay", "-all"}, 1, "replay"},
			} {
				name := strings.Join(tc.args, " ")
				seed := drivertest.OpsSeedRow{Count: 4, Status: tc.status, CreatedAgo: time.Hour}
				if tc.status == 1 {
					seed.SentAgo = time.Hour
				}
				ids := drivertest.OpsSeed(t, db, dialect.Dialect(d), "outbox_event", seed)[0]
				args := append(slices.Clone(tc.args), dbFlag)
				if tc.verb == "delete" {
					var typ string
					if err := db.QueryRow("SELECT biz_type FROM outbox_event WHERE id = " + strconv.FormatInt(ids[0], 10)).Scan(&typ); err != nil {
						t.Fatal(err)
					}
					args = append(args[:3], typ, dbFlag)
				}
				all := []int{tc.status, tc.status, tc.status, tc.status}
				// The second row is pending when counted; it turns FAILED
				// (or is sent) while the operator types "<verb> 3": its id
				// is below the highest id counted.
				opsSet(t, db, d, ids[1], 0)
				out, errs, code := opsCLIAnswer(t, func() { opsSet(t, db, d, ids[1], tc.status) }, tc.verb+" 3", args...)
				if code != 1 || !strings.Contains(out, `Type "`+tc.verb+` 3"`) || !strings.Contains(errs, "changed since the count") || !strings.Contains(errs, "nothing was changed") {
					t.Errorf("%s while a row turned %d: exit %d\n%s%s", name, tc.status, code, out, errs)
				}
				if got := opsStatuses(t, db, ids); !slices.Equal(got, all) {
					t.Errorf("%s refused: statuses %v, want %v (nothing changed)", name, got, all)
				}
				// A counted row changes state meanwhile: refused too.
				out, errs, code = opsCLIAnswer(t, func() { opsSet(t, db, d, ids[3], 0) }, tc.verb+" 4", args...)
				if code != 1 || !strings.Contains(errs, "changed since the count") || !strings.Contains(errs, "nothing was changed") {
					t.Errorf("%s while a counted row changed: exit %d\n%s%s", name, code, out, errs)
				}
				if got, want := opsStatuses(t, db, ids), []int{tc.status, tc.status, tc.status, 0}; !slices.Equal(got, want) {
					t.Errorf("%s refused: statuses %v, want %v", name, got, want)
				}
				// Nothing changes meanwhile: the rows confirmed are changed.
				out, errs, code = opsCLIAnswer(t, func() {}, tc.verb+" 3", args...)
				if code != 0 || !strings.Contains(out, " 3 events (ids "+strconv.FormatInt(ids[0], 10)+"..") || !strings.Contains(out, "in 1 transaction") {
					t.Errorf("%s confirmed: exit %d\n%s%s", name, code, out, errs)
				}
				if _, err := db.Exec("DELETE FROM outbox_event"); err != nil {
					t.Fatal(err)
				}
			}
		})
	}
}

// failed delete of named rows: a named row that is no longer FAILED when
// the confirmation is answered refuses the whole delete.
func TestFailedDeleteNamedRefusesChangedRow(t *testing.T) {
	for _, d := range testdb.Dialects() {
		t.Run(d, func(t *testing.T) {
			db, dbFlag := opsTestDB(t, d)
			ids := drivertest.OpsSeed(t, db, dialect.Dialect(d), "outbox_event", drivertest.OpsSeedRow{Count: 2, Status: 2, CreatedAgo: time.Hour})[0]
			a, b := strconv.FormatInt(ids[0], 10), strconv.FormatInt(ids[1], 10)
			// Someone requeues b while the operator types.
			out, errs, code := opsCLIAnswer(t, func() { opsSet(t, db, d, ids[1], 0) }, "delete 2", "failed", "delete", dbFlag, a, b)
			if code != 1 || !strings.Contains(errs, "row "+b+" is pending, not failed") || !strings.Contains(errs, "nothing was changed") {
				t.Errorf("delete of a row requeued meanwhile: exit %d\n%s%s", code, out, errs)
			}
			if got := opsStatuses(t, db, ids); !slices.Equal(got, []int{2, 0}) {
				t.Errorf("after the refused delete: statuses %v, want [2 0]", got)
			}
			// A dry run that refuses asks nothing and changes nothing.
			out, errs, code = opsCLIAnswer(t, func() { t.Error("asked to confirm a refused delete") }, "delete 2", "failed", "delete", dbFlag, a, b)
			if code != 1 || strings.Contains(out, "Type") || !strings.Contains(errs, "row "+b+" is pending, not failed") {
				t.Errorf("delete naming a pending row: exit %d\n%s%s", code, out, errs)
			}
			if got := opsStatuses(t, db, ids); !slices.Equal(got, []int{2, 0}) {
				t.Errorf("after the refused delete: statuses %v, want [2 0]", got)
			}
		})
	}
}

// inbox forget -all forgets the rows it counted, not the events the
// consumer handled while the operator typed.
func TestInboxForgetAllPinned(t *testing.T) {
	for _, d := range testdb.Dialects() {
		t.Run(d, func(t *testing.T) {
			db, dbFlag := opsTestDB(t, d)
			handle := func(consumer string) string {
				id := outbox.NewEventID().String()
				if _, err := db.Exec(opsRebind(d, "INSERT INTO outbox_inbox (consumer, event_id, biz_type, biz_id) VALUES (?, ?, 'T', 'k')"), consumer, id); err != nil {
					t.Fatal(err)
				}
				return id
			}
			inbox := func(consumer string) []string {
				rows, err := db.Query(opsRebind(d, "SELECT event_id FROM outbox_inbox WHERE consumer = ? ORDER BY event_id"), consumer)
				if err != nil {
					t.Fatal(err)
				}
				defer rows.Close()
				var out []string
				for rows.Next() {
					var s string
					if err := rows.Scan(&s); err != nil {
						t.Fatal(err)
					}
					out = append(out, strings.ToLower(s))
				}
				return out
			}
			for range 3 {
				handle("points")
			}
			other := handle("mail")
			var late string
			out, errs, code := opsCLIAnswer(t, func() { late = handle("points") }, "forget 3", "inbox", "forget", dbFlag, "-consumer", "points", "-all")
			if code != 0 || !strings.Contains(out, `Type "forget 3"`) || !strings.Contains(out, "forgot 3 events") {
				t.Errorf("inbox forget -all: exit %d\n%s%s", code, out, errs)
			}
			if got := inbox("points"); !slices.Equal(got, []string{late}) {
				t.Errorf("points' inbox after forget -all: %v, want only the event handled meanwhile %s", got, late)
			}
			if got := inbox("mail"); !slices.Equal(got, []string{other}) {
				t.Errorf("mail's inbox: %v, want %s", got, other)
			}
		})
	}
}

// A confirmed selection bigger than one transaction takes (admin.MaxRefs;
// 2 here) is pinned in consecutive id ranges, each checked before any is
// changed: a row that turns FAILED between two ranges' rows refuses the
// whole requeue.
func TestRequeueConfirmedInChunks(t *testing.T) {
	defer func(n int) { actionChunk = n }(actionChunk)
	actionChunk = 2
	for _, d := range testdb.Dialects() {
		t.Run(d, func(t *testing.T) {
			db, dbFlag := opsTestDB(t, d)
			ids := drivertest.OpsSeed(t, db, dialect.Dialect(d), "outbox_event", drivertest.OpsSeedRow{Count: 5, Status: 2, CreatedAgo: time.Hour})[0]
			// Counted: rows 0, 1 | 3, 4. Row 2 turns FAILED meanwhile.
			opsSet(t, db, d, ids[2], 0)
			out, errs, code := opsCLIAnswer(t, func() { opsSet(t, db, d, ids[2], 2) }, "requeue 4", "requeue", dbFlag, "-all")
			if code != 1 || !strings.Contains(errs, "failed events selected changed since the count you confirmed (ids "+strconv.FormatInt(ids[1]+1, 10)+" to "+strconv.FormatInt(ids[4], 10)+": 2 then, 3 now): nothing was changed") {
				t.Errorf("requeue -all while a row between two chunks turned FAILED: exit %d\n%s%s", code, out, errs)
			}
			if got := opsStatuses(t, db, ids); !slices.Equal(got, []int{2, 2, 2, 2, 2}) {
				t.Errorf("after the refused requeue: statuses %v, want every row FAILED", got)
			}
			// The last chunk changes: refused before the first is changed.
			out, errs, code = opsCLIAnswer(t, func() { opsSet(t, db, d, ids[4], 1) }, "requeue 5", "requeue", dbFlag, "-all")
			if code != 1 || !strings.Contains(errs, "(ids "+strconv.FormatInt(ids[4], 10)+" to "+strconv.FormatInt(ids[4], 10)+": 1 then, 0 now): nothing was changed") {
				t.Errorf("requeue -all while the last chunk changed: exit %d\n%s%s", code, out, errs)
			}
			if got := opsStatuses(t, db, ids); !slices.Equal(got, []int{2, 2, 2, 2, 1}) {
				t.Errorf("after the refused requeue: statuses %v, want [2 2 2 2 1]", got)
			}
			opsSet(t, db, d, ids[4], 2)
			out, errs, code = opsCLIAnswer(t, func() {}, "requeue 5", "requeue", dbFlag, "-all")
			want := "requeued 5 events (ids " + strconv.FormatInt(ids[0], 10) + ".." + strconv.FormatInt(ids[4], 10) + ", 5 keys) in 3 transactions"
			if code != 0 || !strings.Contains(out, want) {
				t.Errorf("requeue -all in chunks: exit %d, want %q\n%s%s", code, want, out, errs)
			}
			if got := opsStatuses(t, db, ids); !slices.Equal(got, []int{0, 0, 0, 0, 0}) {
				t.Errorf("after the requeue: statuses %v, want every row pending", got)
			}
		})
	}
}

// inbox forget -all of a consumer with more rows than it pins by event id
// (inboxPinMax; 2 here) counts again after the confirmation and refuses
// when the count changed.
func TestInboxForgetAllRecount(t *testing.T) {
	defer func(n int) { inboxPinMax = n }(inboxPinMax)
	inboxPinMax = 2
	for _, d := range testdb.Dialects() {
		t.Run(d, func(t *testing.T) {
			db, dbFlag := opsTestDB(t, d)
			handle := func() {
				if _, err := db.Exec(opsRebind(d, "INSERT INTO outbox_inbox (consumer, event_id, biz_type, biz_id) VALUES ('points', ?, 'T', 'k')"), outbox.NewEventID().String()); err != nil {
					t.Fatal(err)
				}
			}
			for range 3 {
				handle()
			}
			out, errs, code := opsCLIAnswer(t, handle, "forget 3", "inbox", "forget", dbFlag, "-consumer", "points", "-all")
			if code != 1 || !strings.Contains(errs, `the inbox rows of consumer "points" changed since the count you confirmed (3 then, 4 now): nothing was forgotten`) {
				t.Errorf("inbox forget -all while the consumer handled an event: exit %d\n%s%s", code, out, errs)
			}
			if n := drivertest.OpsCount(t, db, "outbox_inbox", ""); n != 4 {
				t.Errorf("%d inbox rows after the refused forget, want 4", n)
			}
			out, errs, code = opsCLIAnswer(t, func() {}, "forget 4", "inbox", "forget", dbFlag, "-consumer", "points", "-all")
			if code != 0 || !strings.Contains(out, "forgot 4 events") {
				t.Errorf("inbox forget -all: exit %d\n%s%s", code, out, errs)
			}
			if n := drivertest.OpsCount(t, db, "outbox_inbox", ""); n != 0 {
				t.Errorf("%d inbox rows after forget -all, want 0", n)
			}
		})
	}
}
