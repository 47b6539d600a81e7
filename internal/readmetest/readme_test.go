package readmetest

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"
	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/outboxgen/outboxgen/internal/natstest"
	"github.com/outboxgen/outboxgen/internal/readmetest/events"
	"github.com/outboxgen/outboxgen/internal/readmetest/pgonly"
	"github.com/outboxgen/outboxgen/internal/testdb"
	"github.com/outboxgen/outboxgen/runtime/driver/sqldriver"
	"github.com/outboxgen/outboxgen/runtime/outbox"
	"github.com/outboxgen/outboxgen/templates"
)

// Every README:begin region of wiring.go appears, dedented, in a ```go
// block of README.md: the README shows the tested code.
func TestSnippetsInREADME(t *testing.T) {
	src, err := os.ReadFile("wiring.go")
	if err != nil {
		t.Fatal(err)
	}
	readme, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	var blocks []string
	for _, m := range regexp.MustCompile("(?s)```go\n(.*?)```").FindAllStringSubmatch(string(readme), -1) {
		blocks = append(blocks, m[1])
	}
	regions := regexp.MustCompile(`(?s)\n[\t ]*// README:begin (\w+)\n(.*?)\n[\t ]*// README:end\n`).FindAllStringSubmatch(string(src), -1)
	if len(regions) < 5 {
		t.Fatalf("found %d README regions in wiring.go, want at least 5", len(regions))
	}
	for _, r := range regions {
		name, code := r[1], dedent(r[2])+"\n"
		found := false
		for _, b := range blocks {
			if strings.Contains(b, code) {
				found = true
				break
			}
		}
		if !found {
			t.Errorf("README.md has no ```go block containing region %q of wiring.go:\n%s", name, code)
		}
	}
}

// dedent removes the leading tabs all lines of s share.
func dedent(s string) string {
	lines := strings.Split(s, "\n")
	n := -1
	for _, l := range lines {
		if strings.TrimSpace(l) == "" {
			continue
		}
		k := len(l) - len(strings.TrimLeft(l, "\t"))
		if n < 0 || k < n {
			n = k
		}
	}
	for i, l := range lines {
		if len(l) >= n {
			lines[i] = l[n:]
		}
	}
	return strings.Join(lines, "\n")
}

// The child process runs one case on one database: Bind binds the
// process, so each database gets its own (as each service would).
const (
	envDialect = "READMETEST_DIALECT"
	envCase    = "READMETEST_CASE"
)

// The service the README's snippets build works end to end on every
// database, with the custom table names of events.yaml; the same service
// on a database without the tables fails at start-up, naming the table,
// its events.yaml key and the fix. The broker snippets (NATS, Kafka) run
// the same service on in-process brokers.
func TestREADMEService(t *testing.T) {
	type run struct{ d, c string }
	var runs []run
	for _, d := range testdb.Dialects() {
		for _, c := range []string{"service", "missing"} {
			runs = append(runs, run{d, c})
		}
	}
	// The broker snippets, on in-process brokers.
	runs = append(runs, run{"sqlite", "nats"}, run{"sqlite", "kafka"})
	for _, r := range runs {
		t.Run(r.d+"/"+r.c, func(t *testing.T) {
			t.Parallel()
			if r.d != "sqlite" {
				testdb.DSN(t, r.d) // skips (or fails in CI) without the server
			}
			cmd := exec.Command(os.Args[0], "-test.run=^TestChild$", "-test.v", "-test.count=1")
			cmd.Env = append(os.Environ(), envDialect+"="+r.d, envCase+"="+r.c)
			out, err := cmd.CombinedOutput()
			if err != nil || !strings.Contains(string(out), "--- PASS: TestChild") {
				t.Fatalf("child: %v\n%s", err, out)
			}
		})
	}
}

// TestChild is one case of TestREADMEService, in its own process.
func TestChild(t *testing.T) {
	d, c := os.Getenv(envDialect), os.Getenv(envCase)
	if d == "" {
		t.Skip("run by TestREADMEService")
	}
	db := testdb.Open(t, d)
	switch c {
	case "service":
		testdb.ApplySchema(t, db, d, templates.Tables{Outbox: events.OutboxTable, Inbox: events.InboxTable})
		runService(t, db)
	case "nats":
		testdb.ApplySchema(t, db, d, templates.Tables{Outbox: events.OutboxTable, Inbox: events.InboxTable})
		pub, sub, err := NATS(startNATS(t))
		if err != nil {
			t.Fatal(err)
		}
		defer pub.Close()
		defer sub.Close()
		runServiceOn(t, db, pub, sub)
	case "kafka":
		testdb.ApplySchema(t, db, d, templates.Tables{Outbox: events.OutboxTable, Inbox: events.InboxTable})
		cluster, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(2, events.OrderPaidTopic, "points.poison"))
		if err != nil {
			t.Fatal(err)
		}
		defer cluster.Close()
		pub, sub, err := Kafka(cluster.ListenAddrs())
		if err != nil {
			t.Fatal(err)
		}
		defer pub.Close()
		defer sub.Close()
		runServiceOn(t, db, pub, sub)
	case "missing":
		missingTables(t, db)
	default:
		t.Fatalf("unknown case %q", c)
	}
}

// handler counts ORDER_PAID deliveries.
type handler struct {
	mu   sync.Mutex
	seen map[string]int
	got  chan string
}

func (h *handler) HandleOrderPaid(_ context.Context, _ *sql.Tx, e events.OrderPaid, _ outbox.Meta) error {
	h.mu.Lock()
	h.seen[e.OrderID]++
	h.mu.Unlock()
	h.got <- e.OrderID
	return nil
}

// startNATS starts an in-process JetStream server and returns its URL.
func startNATS(t *testing.T) string {
	t.Helper()
	return natstest.Start(t, nil).ClientURL()
}

func runService(t *testing.T, db *sql.DB) {
	ps := gochannel.NewGoChannel(gochannel.Config{Persistent: true}, watermill.NopLogger{})
	defer ps.Close()
	runServiceOn(t, db, ps, ps)
}

// runServiceOn runs the service the snippets build on the broker of pub
// and sub.
func runServiceOn(t *testing.T, db *sql.DB, pub message.Publisher, sub message.Subscriber) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	logger := watermill.NopLogger{}
	h := &handler{seen: map[string]int{}, got: make(chan string, 10)}
	svc, err := Start(db, pub, sub, h, logger)
	if err != nil {
		t.Fatal(err)
	}
	routerDone := make(chan error, 1)
	go func() { routerDone <- svc.Router.Run(ctx) }()
	select {
	case <-svc.Router.Running():
	case err := <-routerDone:
		t.Fatalf("router: %v", err)
	}
	relayDone := make(chan error, 1)
	go func() { relayDone <- svc.Relay.Run(ctx) }()

	if err := PayOrder(ctx, db, "o-1"); err != nil {
		t.Fatal(err)
	}
	svc.Relay.Notify()
	select {
	case id := <-h.got:
		if id != "o-1" {
			t.Fatalf("handled %q, want o-1", id)
		}
	case err := <-relayDone:
		t.Fatalf("relay stopped: %v", err)
	case <-ctx.Done():
		t.Fatal("ORDER_PAID was not handled")
	}
	// Published once, handled once: the row is sent, the inbox holds it.
	for _, q := range []string{
		"SELECT COUNT(*) FROM shipping_outbox WHERE status = 1",
		"SELECT COUNT(*) FROM shipping_inbox WHERE consumer = 'points'",
	} {
		deadline := time.Now().Add(10 * time.Second)
		for {
			var n int
			if err := db.QueryRowContext(ctx, q).Scan(&n); err != nil {
				t.Fatal(err)
			}
			if n == 1 {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s = %d, want 1", q, n)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	// The other parts start on the same tables.
	if _, _, err := svc.Monitor.Check(ctx); err != nil {
		t.Fatalf("monitor: %v", err)
	}
	if _, err := svc.Janitor.RunOnce(ctx); err != nil {
		t.Fatalf("janitor: %v", err)
	}
	if _, err := svc.Sweeper.RunOnce(ctx); err != nil {
		t.Fatalf("sweeper: %v", err)
	}
	cancel()
	if err := <-relayDone; err != nil {
		t.Fatalf("relay: %v", err)
	}
	<-routerDone
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.seen["o-1"] != 1 {
		t.Fatalf("o-1 handled %d times, want once", h.seen["o-1"])
	}
}

// wantStartError checks that err names the table, its events.yaml key and
// the fix.
func wantStartError(t *testing.T, what string, err error, table, key string) {
	t.Helper()
	if err == nil {
		t.Fatalf("%s started on a database without its tables", what)
	}
	for _, want := range []string{fmt.Sprintf("%q", table), key + " in events.yaml", "apply the schema", "outboxgen schema -f events.yaml"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("%s: error %q does not say %q", what, err, want)
		}
	}
}

func missingTables(t *testing.T, db *sql.DB) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	logger := watermill.NopLogger{}
	ps := gochannel.NewGoChannel(gochannel.Config{Persistent: true}, logger)
	defer ps.Close()
	h := &handler{seen: map[string]int{}, got: make(chan string, 10)}
	svc, err := Start(db, ps, ps, h, logger)
	if err != nil {
		t.Fatal(err) // nothing asked the database yet
	}
	wantStartError(t, "relay", svc.Relay.Run(ctx), "shipping_outbox", "sql.outbox_table")
	_, err = svc.Sweeper.RunOnce(ctx)
	wantStartError(t, "sweeper", err, "shipping_outbox", "sql.outbox_table")
	_, _, err = svc.Monitor.Check(ctx)
	wantStartError(t, "monitor", err, "shipping_outbox", "sql.outbox_table")
	_, err = svc.Janitor.RunOnce(ctx)
	wantStartError(t, "janitor", err, "shipping_outbox", "sql.outbox_table")
	err = svc.Router.Run(ctx)
	wantStartError(t, "consumer", err, "shipping_inbox", "sql.inbox_table")
	if ctx.Err() != nil {
		t.Fatal("a part waited instead of failing at start")
	}
}

// A database of a dialect events.yaml does not list is refused when the
// writer and the driver are set up, with the listed dialects and the fix;
// the package-level InsertX of a package listing several dialects refuses
// to guess before Bind.
func TestWrongDialect(t *testing.T) {
	for _, d := range []string{"sqlite", "mysql"} {
		t.Run(d, func(t *testing.T) {
			db := testdb.Open(t, d)
			for what, err := range map[string]error{
				"Bind":          pgonly.Bind(db),
				"sqldriver.New": func() error { _, err := sqldriver.New(db, pgonly.Schema); return err }(),
				"NewWriter":     func() error { _, err := pgonly.NewWriter(db); return err }(),
			} {
				var de *outbox.DialectError
				if !errors.As(err, &de) || de.Dialect != outbox.Dialect(d) {
					t.Errorf("%s = %v, want a DialectError for %s", what, err, d)
					continue
				}
				for _, want := range []string{"speaks " + d, "sql.dialects in pgonly.yaml is [postgres]", "add " + d + " to sql.dialects"} {
					if !strings.Contains(err.Error(), want) {
						t.Errorf("%s: %q does not say %q", what, err, want)
					}
				}
			}
		})
	}
	// Unbound: events.yaml here lists three dialects, and this process
	// never binds.
	_, err := events.InsertOrderPaid(context.Background(), nil, events.OrderPaid{OrderID: "o-1", Method: events.PaymentMethodCard})
	if !errors.Is(err, outbox.ErrUnbound) || !strings.Contains(err.Error(), "Bind(db)") {
		t.Fatalf("unbound InsertOrderPaid = %v, want outbox.ErrUnbound saying to Bind", err)
	}
	var zero events.Writer
	if _, err := zero.InsertOrderPaid(context.Background(), nil, events.OrderPaid{OrderID: "o-1", Method: events.PaymentMethodCard}); !errors.Is(err, outbox.ErrNilWriter) {
		t.Fatalf("zero Writer = %v, want outbox.ErrNilWriter", err)
	}
}
