package evolution

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"
)

// specV1 is the contract the service starts with.
const specV1 = `version: 1
go: {package: events, out: events}
sql: {dialects: [sqlite], out: schema}
events:
  - name: ORDER_PAID
    topic: orders.paid
    key: order_id
    fields:
      - {name: order_id, type: string}
      - {name: amount_cents, type: int64}
consumers:
  - name: ledger
    events: [ORDER_PAID]
`

// fieldsV2 is the breaking change: the amount becomes an exact decimal with
// a currency.
const fieldsV2 = `    fields:
      - {name: order_id, type: string}
      - {name: amount, type: decimal}
      - {name: currency, type: string}
`

var fieldsV1 = "    fields:\n      - {name: order_id, type: string}\n      - {name: amount_cents, type: int64}\n"

// specNoBump makes the change in place: refused.
var specNoBump = strings.Replace(specV1, fieldsV1, fieldsV2, 1)

// specBumpOnly bumps the version but forgets version 1: refused too.
var specBumpOnly = strings.Replace(specNoBump, "    key: order_id\n", "    key: order_id\n    version: 2\n", 1)

// specV2 bumps the version and keeps version 1's fields under previous:.
var specV2 = strings.Replace(specBumpOnly, fieldsV2, fieldsV2+`    previous:
      - version: 1
        fields:
          - {name: order_id, type: string}
          - {name: amount_cents, type: int64}
`, 1)

// upgrades is the hand-written upgrade function the version 2 package
// needs.
const upgrades = `package events

import (
	"encoding/json"
	"fmt"
)

// UpgradeOrderPaidV1 turns a version 1 ORDER_PAID (integer cents, always
// euros then) into the current version.
func UpgradeOrderPaidV1(v OrderPaidV1) (OrderPaid, error) {
	if v.AmountCents < 0 {
		return OrderPaid{}, fmt.Errorf("negative amount %d", v.AmountCents)
	}
	return OrderPaid{
		OrderID:  v.OrderID,
		Amount:   json.Number(fmt.Sprintf("%d.%02d", v.AmountCents/100, v.AmountCents%100)),
		Currency: "EUR",
	}, nil
}
`

// producer writes events into the SQLite file os.Args[1], applying the
// generated DDL first when os.Args[2] is "init". NEWEVENT(i) is the event
// literal for the spec version at hand.
const producer = `package main

import (
	"context"
	"database/sql"
	"encoding/json"
	"log"
	"os"
	"strconv"

	_ "modernc.org/sqlite"

	"example.com/shop/events"
	"github.com/outboxgen/outboxgen/templates"
)

func main() {
	ctx := context.Background()
	db, err := sql.Open("sqlite", "file:"+os.Args[1]+"?_pragma=busy_timeout(10000)&_pragma=journal_mode(WAL)")
	if err != nil {
		log.Fatal(err)
	}
	defer db.Close()
	if os.Args[2] == "init" {
		ddl, err := os.ReadFile("schema/sqlite/outbox.sql")
		if err != nil {
			log.Fatal(err)
		}
		for _, stmt := range templates.Statements(ddl) {
			if _, err := db.ExecContext(ctx, stmt); err != nil {
				log.Fatal(err)
			}
		}
	}
	if err := events.Bind(db); err != nil {
		log.Fatal(err)
	}
	for i := range 3 {
		tx, err := db.BeginTx(ctx, nil)
		if err != nil {
			log.Fatal(err)
		}
		if _, err := events.InsertOrderPaid(ctx, tx, NEWEVENT); err != nil {
			log.Fatal(err)
		}
		if err := tx.Commit(); err != nil {
			log.Fatal(err)
		}
	}
	_, _ = strconv.Itoa, json.Number.String
}
`

// consumer runs the relay and consumer ledger in one process, over an
// in-process broker, until it has handled os.Args[2] events, then prints
// each as a JSON line, and the poisoned ones.
const consumer = `package main

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"log"
	"os"
	"strconv"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"
	_ "modernc.org/sqlite"

	"example.com/shop/events"
	"github.com/outboxgen/outboxgen/runtime/driver/sqldriver"
	"github.com/outboxgen/outboxgen/runtime/inbox"
	"github.com/outboxgen/outboxgen/runtime/outbox"
	"github.com/outboxgen/outboxgen/runtime/relay"
)

type handled struct {
	Key      string ` + "`json:\"key\"`" + `
	Version  int    ` + "`json:\"version\"`" + `
	Amount   string ` + "`json:\"amount\"`" + `
	Currency string ` + "`json:\"currency\"`" + `
}

// ledger is the one handler: it only ever sees the current OrderPaid.
type ledger struct {
	mu   sync.Mutex
	seen []handled
}

func (l *ledger) HandleOrderPaid(ctx context.Context, tx *sql.Tx, e events.OrderPaid, m outbox.Meta) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.seen = append(l.seen, handled{Key: m.Key, Version: m.Version, Amount: e.Amount.String(), Currency: e.Currency})
	return nil
}

func (l *ledger) count() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.seen)
}

func main() {
	want, _ := strconv.Atoi(os.Args[2])
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	db, err := sql.Open("sqlite", "file:"+os.Args[1]+"?_pragma=busy_timeout(10000)&_pragma=journal_mode(WAL)")
	if err != nil {
		log.Fatal(err)
	}
	defer db.Close()
	logger := watermill.NopLogger{}
	broker := gochannel.NewGoChannel(gochannel.Config{Persistent: true}, logger)
	poisoned, err := broker.Subscribe(ctx, "ledger.poison")
	if err != nil {
		log.Fatal(err)
	}
	var poisonMu sync.Mutex
	var poison []string
	go func() {
		for msg := range poisoned {
			poisonMu.Lock()
			poison = append(poison, msg.Metadata.Get("reason_poisoned"))
			poisonMu.Unlock()
			msg.Ack()
		}
	}()

	drv, err := sqldriver.New(db, events.Schema)
	if err != nil {
		log.Fatal(err)
	}
	r, err := relay.New(drv, relay.Config{Publisher: broker})
	if err != nil {
		log.Fatal(err)
	}
	router, err := message.NewRouter(message.RouterConfig{}, logger)
	if err != nil {
		log.Fatal(err)
	}
	h := &ledger{}
	if err := events.RegisterLedger(router, broker, db, h, inbox.Config{PoisonPublisher: broker}); err != nil {
		log.Fatal(err)
	}
	go func() {
		if err := router.Run(ctx); err != nil {
			log.Print(err)
		}
	}()
	<-router.Running()
	go r.Run(ctx)
	for h.count() < want && ctx.Err() == nil {
		poisonMu.Lock()
		n := len(poison)
		poisonMu.Unlock()
		if h.count()+n >= want {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	time.Sleep(100 * time.Millisecond) // a duplicate or a poisoned message would show by now
	h.mu.Lock()
	for _, e := range h.seen {
		b, _ := json.Marshal(e)
		fmt.Println(string(b))
	}
	h.mu.Unlock()
	poisonMu.Lock()
	for _, p := range poison {
		fmt.Println("POISONED", p)
	}
	poisonMu.Unlock()
	cancel()
	router.Close()
}
`

// TestEvolution walks a version bump the way a team makes it: the service
// ships version 1 and writes events; the spec changes; CI runs outboxgen
// check -against the committed spec, which refuses the change in place and
// accepts it with a bump that keeps version 1; the regenerated package does
// not compile until the upgrade function is written; then the new build's
// relay and consumer deliver the version 1 rows still in the outbox and new
// version 2 rows to one handler, which sees the current type only.
func TestEvolution(t *testing.T) {
	if testing.Short() {
		t.Skip("builds Go programs; skipped with -short")
	}
	goBin, err := exec.LookPath("go")
	if err != nil {
		t.Skip("no go command in PATH")
	}
	if _, err := exec.LookPath("git"); err != nil {
		t.Skip("no git in PATH")
	}
	root, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	bin := filepath.Join(t.TempDir(), "outboxgen")
	run(t, root, goBin, "build", "-o", bin, "./cmd/outboxgen")
	outboxgen := func(args ...string) (string, int) {
		t.Helper()
		cmd := exec.Command(bin, args...)
		cmd.Dir = dir
		out, err := cmd.CombinedOutput()
		code := 0
		if ee, ok := err.(*exec.ExitError); ok {
			code = ee.ExitCode()
		} else if err != nil {
			t.Fatal(err)
		}
		return string(out), code
	}
	writeModule(t, root, dir)
	db := filepath.Join(dir, "shop.db")

	// Version 1: generate, commit (main is what CI compares with), and
	// write three version 1 events, which stay in the outbox: the relay
	// is not running, as during a deployment.
	write(t, filepath.Join(dir, "events.yaml"), specV1)
	if out, code := outboxgen("generate"); code != 0 {
		t.Fatalf("generate v1: %s", out)
	}
	git(t, dir, "init", "-q", "-b", "main")
	git(t, dir, "add", "-A")
	git(t, dir, "commit", "-q", "-m", "events v1")
	write(t, filepath.Join(dir, "cmd", "produce", "main.go"), strings.Replace(producer, "NEWEVENT", `events.OrderPaid{OrderID: "v1-" + strconv.Itoa(i), AmountCents: int64(1299 + i)}`, 1))
	run(t, dir, goBin, "run", "./cmd/produce", db, "init")

	// The change in place is refused, and so is a bump that forgets
	// version 1; each finding is at its place in the new file.
	check := func(src string) (string, int) {
		write(t, filepath.Join(dir, "events.yaml"), src)
		if out, code := outboxgen("generate"); code != 0 {
			t.Fatalf("generate: %s", out)
		}
		return outboxgen("check", "-against", "git:main")
	}
	out, code := check(specNoBump)
	for _, want := range []string{
		"events.yaml:5:5: field amount_cents (int64) of ORDER_PAID was removed (main:events.yaml:10:9)",
		"events.yaml:10:9: required field amount (decimal) was added to ORDER_PAID",
		"events.yaml:11:9: required field currency (string) was added to ORDER_PAID",
		"bump ORDER_PAID to version 2 and keep version 1's fields under previous:",
		"outboxgen check: 3 breaking changes against git:main",
	} {
		if code != 1 || !strings.Contains(out, want) {
			t.Fatalf("check without a bump: exit %d, want 1 and %q in:\n%s", code, want, out)
		}
	}
	t.Logf("outboxgen check -against git:main, the change without a bump:\n%s", out)
	out, code = check(specBumpOnly)
	if code != 1 || !strings.Contains(out, "events.yaml:5:5: ORDER_PAID went from version 1 (main:events.yaml:5:5) to 2 without declaring version 1 under previous:") || !strings.Contains(out, "(PREVIOUS_VERSION_MISSING)") {
		t.Fatalf("check with a bump but no previous: exit %d:\n%s", code, out)
	}
	out, code = check(specV2)
	if code != 0 || !strings.Contains(out, "events.yaml: no breaking changes against git:main (1 event compared)") {
		t.Fatalf("check with the bump: exit %d:\n%s", code, out)
	}

	// The regenerated package needs the upgrade function: the compiler
	// says so until it is written.
	build := exec.Command(goBin, "build", "./events")
	build.Dir, build.Env = dir, goEnv()
	if b, err := build.CombinedOutput(); err == nil || !strings.Contains(string(b), "undefined: UpgradeOrderPaidV1") {
		t.Fatalf("building version 2 without UpgradeOrderPaidV1: %v\n%s", err, b)
	}
	write(t, filepath.Join(dir, "events", "upgrades.go"), upgrades)
	run(t, dir, goBin, "vet", "./events")
	// Still up to date and compatible: the hand-written file is not
	// outboxgen's.
	if out, code := outboxgen("check", "-against", "git:main"); code != 0 {
		t.Fatalf("check with upgrades.go: exit %d:\n%s", code, out)
	}

	// Version 2 producers write version 2 events into the same outbox.
	write(t, filepath.Join(dir, "cmd", "produce", "main.go"), strings.Replace(producer, "NEWEVENT", `events.OrderPaid{OrderID: "v2-" + strconv.Itoa(i), Amount: json.Number("7.5" + strconv.Itoa(i)), Currency: "USD"}`, 1))
	run(t, dir, goBin, "run", "./cmd/produce", db, "append")

	// The new build's relay and consumer: six events, one handler, the
	// current type only, nothing poisoned.
	write(t, filepath.Join(dir, "cmd", "consume", "main.go"), consumer)
	got := strings.TrimSpace(run(t, dir, goBin, "run", "./cmd/consume", db, "6"))
	if strings.Contains(got, "POISONED") {
		t.Fatalf("events were poisoned:\n%s", got)
	}
	type handled struct {
		Key      string `json:"key"`
		Version  int    `json:"version"`
		Amount   string `json:"amount"`
		Currency string `json:"currency"`
	}
	var seen []handled
	for _, line := range strings.Split(got, "\n") {
		var h handled
		if err := json.Unmarshal([]byte(line), &h); err != nil {
			t.Fatalf("consumer output %q: %v", line, err)
		}
		seen = append(seen, h)
	}
	sort.Slice(seen, func(i, j int) bool { return seen[i].Key < seen[j].Key })
	want := []handled{
		{"v1-0", 1, "12.99", "EUR"}, {"v1-1", 1, "13.00", "EUR"}, {"v1-2", 1, "13.01", "EUR"},
		{"v2-0", 2, "7.50", "USD"}, {"v2-1", 2, "7.51", "USD"}, {"v2-2", 2, "7.52", "USD"},
	}
	if !slices.Equal(seen, want) {
		t.Fatalf("the handler saw\n%+v\nwant\n%+v", seen, want)
	}
}

// writeModule lays out module example.com/shop in dir, requiring this
// repository's outboxgen (by a replace) and its dependency versions.
func writeModule(t *testing.T, root, dir string) {
	t.Helper()
	gomod, err := os.ReadFile(filepath.Join(root, "go.mod"))
	if err != nil {
		t.Fatal(err)
	}
	mod := regexp.MustCompile(`(?m)^module\s+\S+\s*$`).ReplaceAllString(string(gomod), "module example.com/shop")
	mod += "\nrequire github.com/outboxgen/outboxgen v0.0.0-00010101000000-000000000000\n"
	mod += fmt.Sprintf("\nreplace github.com/outboxgen/outboxgen => %s\n", filepath.ToSlash(root))
	write(t, filepath.Join(dir, "go.mod"), mod)
	sum, err := os.ReadFile(filepath.Join(root, "go.sum"))
	if err != nil {
		t.Fatal(err)
	}
	write(t, filepath.Join(dir, "go.sum"), string(sum))
	write(t, filepath.Join(dir, ".gitignore"), "shop.db*\n")
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

// run runs a command in dir and returns its standard output; it fails the
// test with the whole output on error.
func run(t *testing.T, dir, name string, args ...string) string {
	t.Helper()
	cmd := exec.Command(name, args...)
	cmd.Dir = dir
	cmd.Env = goEnv()
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("%s %s: %v\n%s%s", name, strings.Join(args, " "), err, out, stderr.String())
	}
	return string(out)
}

func git(t *testing.T, dir string, args ...string) {
	t.Helper()
	run(t, dir, "git", append([]string{"-c", "user.name=evolution", "-c", "user.email=evolution@example.com"}, args...)...)
}

// goEnv is the environment for the go command in the throwaway module: no
// workspace, go.mod completed from the module cache, no global git config.
func goEnv() []string {
	env := []string{"GOWORK=off", "GOFLAGS=-mod=mod", "GIT_CONFIG_GLOBAL=/dev/null", "GIT_CONFIG_NOSYSTEM=1"}
	for _, kv := range os.Environ() {
		switch k, _, _ := strings.Cut(kv, "="); k {
		case "GOWORK", "GOFLAGS", "GIT_CONFIG_GLOBAL", "GIT_CONFIG_NOSYSTEM":
		default:
			env = append(env, kv)
		}
	}
	return env
}
