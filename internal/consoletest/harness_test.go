package consoletest

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/google/uuid"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"

	"github.com/outboxgen/outboxgen/internal/gentest/sqlevents"
	"github.com/outboxgen/outboxgen/internal/natstest"
	"github.com/outboxgen/outboxgen/internal/syncbuf"
	"github.com/outboxgen/outboxgen/internal/testdb"
	"github.com/outboxgen/outboxgen/runtime/admin"
	"github.com/outboxgen/outboxgen/runtime/brokers/natsjs"
	"github.com/outboxgen/outboxgen/runtime/console"
	"github.com/outboxgen/outboxgen/runtime/driver/sqldriver"
	"github.com/outboxgen/outboxgen/runtime/dsn"
	"github.com/outboxgen/outboxgen/runtime/inbox"
	"github.com/outboxgen/outboxgen/runtime/outbox"
	"github.com/outboxgen/outboxgen/runtime/relay"
	"github.com/outboxgen/outboxgen/templates"
)

// The data every environment holds once newEnv returns.
const (
	// orders are the ORDER_PAID events (topic orders.paid: its stream
	// exists), one per order, for customers c-1..c-3; the points consumer
	// handles each and writes a POINTS_CREDITED event keyed by customer.
	orders = 6
	// skus each get stockPerSKU STOCK_RESERVED events (topic
	// stock.reserved: no stream until the test creates it).
	skus        = 3
	stockPerSKU = 3
	// customers: POINTS_CREDITED (topic points.credited: no stream) fails
	// for each, the first of each customer FAILED, the rest held back.
	customers = 3
	// statuses are ORDER_STATUS_CHANGED events (topic orders.status,
	// stream exists), sent.
	statuses = 3
	// xssOrder is the order whose coupon and header hold markup.
	xssOrder   = "o-xss"
	xssPayload = `<script>alert("payload")</script>`
	xssHeader  = `<img src=x onerror=alert("header")>`
	// rawOrder's ORDER_STATUS_CHANGED is written with plain SQL, as a
	// producer in another language might: its payload and header hold
	// markup as raw characters (Go's encoding/json, which the generated
	// writers use, stores < and > as \u003c and \u003e).
	rawOrder   = "o-raw"
	rawPayload = `{"order_id": "o-raw", "status": "<script>alert('raw')</script>"}`
	rawHeaders = `{"x-note": "<img src=x onerror=alert('raw-header')>"}`
)

// Counts of newEnv's rows once the relay is through with them. The paid
// orders (orders + the xss one) are sent, and so are the status changes;
// their POINTS_CREDITED events fail: the first of each customer FAILED,
// the others held back behind it; each sku's first STOCK_RESERVED is
// FAILED and the others held back.
const (
	paidOrders = orders + 1
	wantFailed = skus + customers
	wantHeld   = skus*(stockPerSKU-1) + paidOrders - customers
	wantSent   = paidOrders + statuses + 1 // the raw one
	stockTopic = sqlevents.StockReservedTopic
	pointTopic = sqlevents.PointsCreditedTopic
	stockType  = sqlevents.StockReservedType
	pointType  = sqlevents.PointsCreditedType
	paidType   = sqlevents.OrderPaidType
)

// env is one database with the outbox tables, a relay publishing to an
// embedded NATS JetStream server, the generated points consumer, and the
// console on httptest servers (read-write and read-only).
type env struct {
	t       *testing.T
	dialect string
	db      *sql.DB
	admin   *admin.Admin
	pub     *natsjs.Publisher
	js      nats.JetStreamContext
	url     string // the read-write console, ending in "/"
	roURL   string // the read-only console, ending in "/"
	logs    *syncbuf.Buffer
}

// newEnv builds the environment on dialect d ("sqlite", "postgres",
// "mysql") and waits until the relay has sent, failed and held back
// every row as the constants above say.
func newEnv(t *testing.T, d string) *env {
	t.Helper()
	e := &env{t: t, dialect: d, logs: &syncbuf.Buffer{}}
	if d == "sqlite" {
		// As outboxgen and services open it (runtime/dsn): BEGIN
		// IMMEDIATE, so that transactions beside the relay's wait for the
		// write lock instead of failing with SQLITE_BUSY.
		db, err := sql.Open("sqlite", dsn.SQLiteDSN(filepath.Join(t.TempDir(), "outbox.db")))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { db.Close() })
		e.db = db
	} else {
		e.db = testdb.Open(t, d)
	}
	testdb.ApplySchema(t, e.db, d, templates.DefaultTables)
	if sqlevents.OutboxTable != templates.DefaultTables.Outbox || sqlevents.InboxTable != templates.DefaultTables.Inbox {
		t.Fatal("sqlevents' tables are not the default ones ApplySchema created")
	}
	url := startNATS(t)
	pub, err := natsjs.NewPublisher(natsjs.Config{URL: url, DuplicateWindow: 200 * time.Millisecond, PublishTimeout: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pub.Close() })
	e.pub = pub
	// The streams that exist from the start; stock.reserved and
	// points.credited have none, so their publishes fail.
	for _, tp := range []string{sqlevents.OrderPaidTopic, sqlevents.OrderStatusChangedTopic, "points.poison"} {
		if err := pub.EnsureStream(tp); err != nil {
			t.Fatal(err)
		}
	}
	nc, err := nats.Connect(url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	if e.js, err = nc.JetStream(); err != nil {
		t.Fatal(err)
	}

	drv, err := sqldriver.New(e.db, sqlevents.Schema)
	if err != nil {
		t.Fatal(err)
	}
	if e.admin, err = admin.New(drv); err != nil {
		t.Fatal(err)
	}
	log := slog.New(slog.NewTextHandler(e.logs, &slog.HandlerOptions{Level: slog.LevelWarn}))
	rl, err := relay.New(drv, relay.Config{
		Publisher: pub, PollInterval: 50 * time.Millisecond, LeaseDuration: 5 * time.Second, ShutdownTimeout: 2 * time.Second, MaxAttempts: 2,
		Backoff:        func(int) time.Duration { return 20 * time.Millisecond },
		BreakerBackoff: func(int) time.Duration { return 20 * time.Millisecond },
		HoldRecheck:    200 * time.Millisecond,
		InstanceID:     "relay-" + d,
		Logger:         log,
	})
	if err != nil {
		t.Fatal(err)
	}
	rctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- rl.Run(rctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil && !errors.Is(err, context.Canceled) {
			t.Errorf("relay: %v", err)
		}
	})
	e.runConsumer(url, log)
	e.write()
	e.eventually("the relay to send, fail and hold back every row", 60*time.Second, func() bool {
		return e.count(2) == wantFailed && e.count(1) == wantSent && e.count(0) == wantHeld
	})
	e.url = e.serve(false)
	e.roURL = e.serve(true)
	return e
}

// serve starts the console on an httptest server and returns its URL.
func (e *env) serve(readOnly bool) string {
	e.t.Helper()
	return e.serveConfig(console.Config{ReadOnly: readOnly})
}

// serveConfig starts the console with cfg (Admin, Database, the
// intervals and Logger set here) and returns its URL.
func (e *env) serveConfig(cfg console.Config) string {
	e.t.Helper()
	// What outboxgen console shows for a database (runtime/dsn's Where).
	where := map[string]string{"sqlite": "orders.db (SQLite)", "postgres": "postgres://app:xxxxx@127.0.0.1:54329/orders (PostgreSQL)",
		"mysql": "app:xxxxx@tcp(127.0.0.1:33069)/orders (MySQL)"}
	cfg.Admin, cfg.Database = e.admin, where[e.dialect]
	cfg.StaleAfter, cfg.Window, cfg.Refresh = time.Minute, 30*time.Minute, time.Second
	cfg.Logger = slog.New(slog.NewTextHandler(e.logs, nil))
	h, err := console.New(cfg)
	if err != nil {
		e.t.Fatal(err)
	}
	srv := httptest.NewServer(h)
	e.t.Cleanup(srv.Close)
	return srv.URL + "/"
}

// points is the consumer's handler: it credits points for each order, in
// the handler's transaction, with the generated writer.
type points struct{ w sqlevents.Writer }

func (p points) HandleOrderPaid(ctx context.Context, tx *sql.Tx, ev sqlevents.OrderPaid, _ outbox.Meta) error {
	_, err := p.w.InsertPointsCredited(ctx, tx, sqlevents.PointsCredited{CustomerID: ev.CustomerID, OrderID: ev.OrderID, Points: ev.AmountCents / 100})
	return err
}

func (points) HandleOrderStatusChanged(context.Context, *sql.Tx, sqlevents.OrderStatusChanged, outbox.Meta) error {
	return nil
}

// runConsumer runs the generated points consumer until the test ends.
func (e *env) runConsumer(url string, log *slog.Logger) {
	t := e.t
	t.Helper()
	w, err := sqlevents.NewWriter(e.db)
	if err != nil {
		t.Fatal(err)
	}
	sub, err := natsjs.NewSubscriber(natsjs.SubscriberConfig{URL: url, Durable: "points", AckWait: 5 * time.Second, CloseTimeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sub.Close() })
	r, err := message.NewRouter(message.RouterConfig{CloseTimeout: 5 * time.Second}, nil)
	if err != nil {
		t.Fatal(err)
	}
	err = sqlevents.RegisterPoints(r, sub, e.db, points{w}, inbox.Config{
		PoisonPublisher: e.pub, MaxAttempts: 2, RetryInitialInterval: 10 * time.Millisecond, Logger: log,
	})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- r.Run(context.Background()) }()
	select {
	case <-r.Running():
	case err := <-done:
		t.Fatalf("router: %v", err)
	case <-time.After(30 * time.Second):
		t.Fatal("router not running after 30s")
	}
	t.Cleanup(func() {
		r.Close()
		if err := <-done; err != nil && !strings.Contains(err.Error(), "closed") {
			t.Errorf("router: %v", err)
		}
	})
}

// write inserts the events through the generated writer, one transaction
// each, as a service would.
func (e *env) write() {
	t := e.t
	t.Helper()
	w, err := sqlevents.NewWriter(e.db)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	in := func(f func(tx *sql.Tx) error) {
		t.Helper()
		tx, err := e.db.BeginTx(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		if err := f(tx); err != nil {
			tx.Rollback()
			t.Fatal(err)
		}
		if err := tx.Commit(); err != nil {
			t.Fatal(err)
		}
	}
	// One failing key at a time: a batch whose publishes all fail across
	// two keys or more looks like a broker outage to the relay, which then
	// opens its circuit breaker and charges no attempt, so nothing would
	// become FAILED. With one failing key at a time (and the other topics
	// publishing fine) each head fails its two attempts and is FAILED.
	failedHead := func(typ, key string) {
		t.Helper()
		e.eventually(fmt.Sprintf("%s %s to become FAILED", typ, key), 30*time.Second, func() bool {
			return e.countWhere("biz_type = ? AND biz_id = ? AND status = 2", typ, key) == 1
		})
	}
	for i := 1; i <= statuses; i++ {
		in(func(tx *sql.Tx) error {
			_, err := w.InsertOrderStatusChanged(ctx, tx, sqlevents.OrderStatusChanged{OrderID: fmt.Sprintf("o-%d", i), Status: "shipped"})
			return err
		})
	}
	raw := fmt.Sprintf("INSERT INTO %s (event_id, biz_type, biz_id, topic, payload, headers) VALUES (?, ?, ?, ?, ?, ?)", templates.DefaultTables.Outbox)
	if e.dialect == "postgres" {
		raw = fmt.Sprintf("INSERT INTO %s (event_id, biz_type, biz_id, topic, payload, headers) VALUES ($1, $2, $3, $4, $5, $6)", templates.DefaultTables.Outbox)
	}
	if _, err := e.db.ExecContext(ctx, raw, uuid.Must(uuid.NewV7()).String(), sqlevents.OrderStatusChangedType, rawOrder,
		sqlevents.OrderStatusChangedTopic, rawPayload, rawHeaders); err != nil {
		t.Fatal(err)
	}
	for sku := 1; sku <= skus; sku++ {
		for n := 1; n <= stockPerSKU; n++ {
			in(func(tx *sql.Tx) error {
				_, err := w.InsertStockReserved(ctx, tx, sqlevents.StockReserved{SkuID: int64(100 + sku), Quantity: int32(n)})
				return err
			})
		}
		failedHead(stockType, strconv.Itoa(100+sku))
	}
	paidAt := time.Date(2026, 12, 1, 9, 30, 0, 0, time.UTC)
	for i := 1; i <= orders; i++ {
		customer := fmt.Sprintf("c-%d", (i-1)%customers+1)
		in(func(tx *sql.Tx) error {
			_, err := w.InsertOrderPaid(ctx, tx, sqlevents.OrderPaid{
				OrderID: fmt.Sprintf("o-%d", i), CustomerID: customer,
				AmountCents: int64(1000 * i), Currency: "EUR", Method: sqlevents.PaymentMethodCard, PaidAt: paidAt,
			})
			return err
		})
		if i <= customers {
			// The consumer handles the order and writes the customer's
			// first POINTS_CREDITED, which fails.
			failedHead(pointType, customer)
		}
	}
	coupon := xssPayload
	in(func(tx *sql.Tx) error {
		_, err := w.InsertOrderPaid(ctx, tx, sqlevents.OrderPaid{
			OrderID: xssOrder, CustomerID: "c-1", AmountCents: 4200, Currency: "EUR", Method: sqlevents.PaymentMethodWallet,
			PaidAt: paidAt, Coupon: &coupon,
		}, outbox.WithHeader("x-note", xssHeader))
		return err
	})
}

// count returns the number of outbox rows in status (0 pending, 1 sent,
// 2 FAILED).
func (e *env) count(status int) int {
	e.t.Helper()
	var n int
	q := fmt.Sprintf("SELECT COUNT(*) FROM %s WHERE status = %d", templates.DefaultTables.Outbox, status)
	if err := e.db.QueryRow(q).Scan(&n); err != nil {
		e.t.Fatal(err)
	}
	return n
}

// countWhere returns the number of outbox rows matching a condition.
func (e *env) countWhere(cond string, args ...any) int {
	e.t.Helper()
	var n int
	if e.dialect == "postgres" {
		for i := range args {
			cond = strings.Replace(cond, "?", fmt.Sprintf("$%d", i+1), 1)
		}
	}
	if err := e.db.QueryRow("SELECT COUNT(*) FROM "+templates.DefaultTables.Outbox+" WHERE "+cond, args...).Scan(&n); err != nil {
		e.t.Fatal(err)
	}
	return n
}

// row is one outbox row as the tests look at it.
type row struct {
	id      int64
	eventID string
	typ     string
	key     string
	status  int
}

// rows returns the rows matching cond, in id order.
func (e *env) rows(cond string, args ...any) []row {
	e.t.Helper()
	if e.dialect == "postgres" {
		for i := range args {
			cond = strings.Replace(cond, "?", fmt.Sprintf("$%d", i+1), 1)
		}
	}
	rs, err := e.db.Query("SELECT id, event_id, biz_type, biz_id, status FROM "+templates.DefaultTables.Outbox+" WHERE "+cond+" ORDER BY id", args...)
	if err != nil {
		e.t.Fatal(err)
	}
	defer rs.Close()
	var out []row
	for rs.Next() {
		var r row
		if err := rs.Scan(&r.id, &r.eventID, &r.typ, &r.key, &r.status); err != nil {
			e.t.Fatal(err)
		}
		out = append(out, r)
	}
	if err := rs.Err(); err != nil {
		e.t.Fatal(err)
	}
	return out
}

// eventually polls cond every 20ms until it holds, failing after d.
func (e *env) eventually(what string, d time.Duration, cond func() bool) {
	e.t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			e.t.Fatalf("timed out after %s waiting for %s\nlogs:\n%s", d, what, e.logs.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// received collects the messages of a subject from the start of its
// stream (the stream must exist).
type received struct {
	mu  sync.Mutex
	ids []string // Nats-Msg-Id: the event ids, in stream order
}

func (e *env) subscribe(subject string) *received {
	e.t.Helper()
	r := &received{}
	sub, err := e.js.Subscribe(subject, func(m *nats.Msg) {
		r.mu.Lock()
		r.ids = append(r.ids, m.Header.Get(nats.MsgIdHdr))
		r.mu.Unlock()
	}, nats.OrderedConsumer(), nats.DeliverAll())
	if err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(func() { sub.Unsubscribe() })
	return r
}

// got returns the event ids received so far.
func (r *received) got() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.ids...)
}

// startNATS starts an embedded JetStream server for the test and returns
// its URL.
func startNATS(t *testing.T) string {
	t.Helper()
	return natstest.Start(t, func(o *server.Options) { o.ServerName = "outboxgen-console" }).ClientURL()
}

// screenshotDir is where the tests write their screenshots ("" for none):
// $OUTBOXGEN_SCREENSHOTS, a relative path taken from the repository's root
// (go test runs in the package's directory).
func screenshotDir(t testing.TB) string {
	dir := os.Getenv("OUTBOXGEN_SCREENSHOTS")
	if dir == "" || filepath.IsAbs(dir) {
		return dir
	}
	root, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(root, "go.mod")); err != nil {
		t.Fatalf("OUTBOXGEN_SCREENSHOTS=%s: no go.mod at %s to take it from: %v", dir, root, err)
	}
	return filepath.Join(root, dir)
}
