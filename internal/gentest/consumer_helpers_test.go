package gentest

// Shared machinery of the consumer tests (consumer_test.go): one "backend"
// per database flavour (database/sql on PostgreSQL, MariaDB, SQLite; pgx/v5
// on PostgreSQL), a points handler that counts its calls and can fail,
// panic, emit a chained event or lose its session before commit, and a
// real in-process broker (watermill GoChannel) feeding a real watermill
// Router.

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/outboxgen/outboxgen/internal/gentest/pgxevents"
	"github.com/outboxgen/outboxgen/internal/gentest/sqlevents"
	"github.com/outboxgen/outboxgen/internal/testdb"
	"github.com/outboxgen/outboxgen/runtime/inbox"
	"github.com/outboxgen/outboxgen/runtime/outbox"
)

// businessDDL is the consumer's own schema: a points balance per customer
// (a delta effect: applying an event twice shows), a log of credits, and an
// order status mirror (a state effect, for the stale guard).
var businessDDL = []string{
	`CREATE TABLE balances (customer_id VARCHAR(64) PRIMARY KEY, points BIGINT NOT NULL)`,
	`CREATE TABLE credit_log (order_id VARCHAR(64) NOT NULL, event_id VARCHAR(64) NOT NULL)`,
	`CREATE TABLE order_state (order_id VARCHAR(64) PRIMARY KEY, status VARCHAR(32) NOT NULL, applied INT NOT NULL)`,
}

// backend is one database flavour the consumer runs on.
type backend struct {
	name    string
	dialect outbox.Dialect
	db      *sql.DB       // database/sql backends only
	pool    *pgxpool.Pool // pgx backend only
	// exec and queryInt run outside any consumer transaction.
	exec     func(ctx context.Context, query string, args ...any) error
	queryInt func(ctx context.Context, query string, args ...any) (int64, error)
	// register registers the generated points consumer.
	register func(r *message.Router, sub message.Subscriber, h *points, cfg inbox.Config) error
}

func (b *backend) q(query string) string { return env{dialect: b.dialect}.q(query) }

func (b *backend) mustExec(t testing.TB, query string, args ...any) {
	t.Helper()
	if err := b.exec(t.Context(), b.q(query), args...); err != nil {
		t.Fatalf("%s: %v", query, err)
	}
}

func (b *backend) mustInt(t testing.TB, query string, args ...any) int64 {
	t.Helper()
	n, err := b.queryInt(t.Context(), b.q(query), args...)
	if err != nil {
		t.Fatalf("%s: %v", query, err)
	}
	return n
}

// sqlBackend prepares a fresh database of dialect d for database/sql.
// SQLite goes through the crashy driver (a transparent wrapper that can
// fail one commit on demand).
func sqlBackend(t testing.TB, d string) *backend {
	var db *sql.DB
	if d == "sqlite" {
		var err error
		db, err = sql.Open(crashyDriverName, testdb.DSN(t, d))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { db.Close() })
	} else {
		db = testdb.Open(t, d)
	}
	testdb.ApplySchema(t, db, d, tables)
	db.SetMaxOpenConns(12)
	dl := outbox.Dialect(d)
	// A writer per database (the crashy SQLite driver wraps the real one,
	// so the dialect is named), never the process-wide package writer:
	// dialect subtests may run in parallel.
	w, err := sqlevents.DialectWriter(dl)
	if err != nil {
		t.Fatal(err)
	}
	b := &backend{
		name:    d,
		dialect: dl,
		db:      db,
		exec: func(ctx context.Context, query string, args ...any) error {
			_, err := db.ExecContext(ctx, query, args...)
			return err
		},
		queryInt: func(ctx context.Context, query string, args ...any) (int64, error) {
			var n int64
			err := db.QueryRowContext(ctx, query, args...).Scan(&n)
			return n, err
		},
		register: func(r *message.Router, sub message.Subscriber, h *points, cfg inbox.Config) error {
			cfg.Dialect = dl
			return sqlevents.RegisterPoints(r, sub, db, sqlPoints{h, w}, cfg)
		},
	}
	for _, s := range businessDDL {
		b.mustExec(t, s)
	}
	return b
}

// pgxBackend prepares a fresh PostgreSQL database for pgx/v5.
func pgxBackend(t testing.TB) *backend {
	pool := testdb.PgxPool(t)
	db := stdlibDB(t, pool)
	testdb.ApplySchema(t, db, "postgres", tables)
	b := &backend{
		name:    "pgx",
		dialect: outbox.Postgres,
		pool:    pool,
		exec: func(ctx context.Context, query string, args ...any) error {
			_, err := pool.Exec(ctx, query, args...)
			return err
		},
		queryInt: func(ctx context.Context, query string, args ...any) (int64, error) {
			var n int64
			err := pool.QueryRow(ctx, query, args...).Scan(&n)
			return n, err
		},
		register: func(r *message.Router, sub message.Subscriber, h *points, cfg inbox.Config) error {
			return pgxevents.RegisterPoints(r, sub, pool, pgxPoints{h}, cfg)
		},
	}
	for _, s := range businessDDL {
		b.mustExec(t, s)
	}
	return b
}

func stdlibDB(t testing.TB, pool *pgxpool.Pool) *sql.DB {
	t.Helper()
	db, err := sql.Open("pgx", pool.Config().ConnString())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return db
}

// forEachBackend runs f on database/sql PostgreSQL, MariaDB and SQLite, and
// on pgx/v5 PostgreSQL, one after another (the generated Writer is a
// package variable).
func forEachBackend(t *testing.T, f func(t *testing.T, b *backend)) {
	for _, d := range testdb.Dialects() {
		t.Run(d, func(t *testing.T) { f(t, sqlBackend(t, d)) })
	}
	t.Run("pgx", func(t *testing.T) { f(t, pgxBackend(t)) })
}

// txExec is what the points handler needs from a transaction.
type txExec interface {
	exec(ctx context.Context, query string, args ...any) error
	queryInt(ctx context.Context, query string, args ...any) (int64, error)
	insertPointsCredited(ctx context.Context, customerID, orderID string, points int64) error
}

// points is the handler logic, shared by the database/sql and pgx flavours.
type points struct {
	b     *backend
	calls atomic.Int64 // HandleOrderPaid calls
	// failures makes the next n HandleOrderPaid calls fail after their
	// writes (and after emitting the chained event).
	failures atomic.Int64
	// failAlways fails every call.
	failAlways atomic.Bool
	// panics makes the next n calls panic after their writes.
	panics atomic.Int64
	// chain emits a POINTS_CREDITED event in the handler's transaction.
	chain atomic.Bool
	// crash kills the next call's database session after its writes (on
	// SQLite: fails its commit), so the handler returns nil but the commit
	// fails.
	crash atomic.Bool
	// statuses records the statuses applied, in order.
	mu       sync.Mutex
	statuses []string
}

func (p *points) paid(ctx context.Context, tx txExec, orderID, customerID string, cents int64, m outbox.Meta) error {
	p.calls.Add(1)
	if err := tx.exec(ctx, p.b.q(`UPDATE balances SET points = points + ? WHERE customer_id = ?`), cents/100, customerID); err != nil {
		return err
	}
	if err := tx.exec(ctx, p.b.q(`INSERT INTO credit_log (order_id, event_id) VALUES (?, ?)`), orderID, m.EventID); err != nil {
		return err
	}
	if p.chain.Load() {
		if err := tx.insertPointsCredited(ctx, customerID, orderID, cents/100); err != nil {
			return err
		}
	}
	if p.crash.CompareAndSwap(true, false) {
		if err := p.killSession(ctx, tx); err != nil {
			return fmt.Errorf("test: kill session: %w", err)
		}
		return nil // the handler succeeded; the commit will not
	}
	if p.panics.Load() > 0 && p.panics.Add(-1) >= 0 {
		panic("test: handler panic after its writes")
	}
	if p.failAlways.Load() {
		return errors.New("test: handler always fails")
	}
	if p.failures.Load() > 0 && p.failures.Add(-1) >= 0 {
		return errors.New("test: handler fails after its writes")
	}
	return nil
}

// killSession ends the session that runs tx from another connection, the
// way a crashed process or a severed connection would: PostgreSQL
// pg_terminate_backend, MariaDB KILL CONNECTION. SQLite has no sessions:
// the crashy driver rolls back and fails the next commit instead.
func (p *points) killSession(ctx context.Context, tx txExec) error {
	switch p.b.dialect {
	case outbox.Postgres:
		pid, err := tx.queryInt(ctx, `SELECT pg_backend_pid()`)
		if err != nil {
			return err
		}
		return p.b.exec(ctx, `SELECT pg_terminate_backend($1)`, pid)
	case outbox.MySQL:
		id, err := tx.queryInt(ctx, `SELECT CONNECTION_ID()`)
		if err != nil {
			return err
		}
		return p.b.exec(ctx, "KILL CONNECTION "+strconv.FormatInt(id, 10))
	}
	crashNextCommit.Store(true)
	return nil
}

func (p *points) status(ctx context.Context, tx txExec, orderID, status string) error {
	if err := tx.exec(ctx, p.b.q(`UPDATE order_state SET status = ?, applied = applied + 1 WHERE order_id = ?`), status, orderID); err != nil {
		return err
	}
	p.mu.Lock()
	p.statuses = append(p.statuses, status)
	p.mu.Unlock()
	return nil
}

func (p *points) applied() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]string(nil), p.statuses...)
}

// sqlPoints is the points handler for the database/sql flavour.
type sqlPoints struct {
	p *points
	w sqlevents.Writer
}

var _ sqlevents.PointsHandler = sqlPoints{}

type sqlTx struct {
	tx *sql.Tx
	w  sqlevents.Writer
}

func (t sqlTx) exec(ctx context.Context, query string, args ...any) error {
	_, err := t.tx.ExecContext(ctx, query, args...)
	return err
}

func (t sqlTx) queryInt(ctx context.Context, query string, args ...any) (int64, error) {
	var n int64
	err := t.tx.QueryRowContext(ctx, query, args...).Scan(&n)
	return n, err
}

func (t sqlTx) insertPointsCredited(ctx context.Context, customerID, orderID string, points int64) error {
	_, err := t.w.InsertPointsCredited(ctx, t.tx, sqlevents.PointsCredited{CustomerID: customerID, OrderID: orderID, Points: points})
	return err
}

func (h sqlPoints) HandleOrderPaid(ctx context.Context, tx *sql.Tx, e sqlevents.OrderPaid, m outbox.Meta) error {
	return h.p.paid(ctx, sqlTx{tx, h.w}, e.OrderID, e.CustomerID, e.AmountCents, m)
}

func (h sqlPoints) HandleOrderStatusChanged(ctx context.Context, tx *sql.Tx, e sqlevents.OrderStatusChanged, m outbox.Meta) error {
	return h.p.status(ctx, sqlTx{tx, h.w}, e.OrderID, e.Status)
}

// pgxPoints is the points handler for the pgx/v5 flavour.
type pgxPoints struct{ p *points }

var _ pgxevents.PointsHandler = pgxPoints{}

type pgxTx struct{ tx pgx.Tx }

func (t pgxTx) exec(ctx context.Context, query string, args ...any) error {
	_, err := t.tx.Exec(ctx, query, args...)
	return err
}

func (t pgxTx) queryInt(ctx context.Context, query string, args ...any) (int64, error) {
	var n int64
	err := t.tx.QueryRow(ctx, query, args...).Scan(&n)
	return n, err
}

func (t pgxTx) insertPointsCredited(ctx context.Context, customerID, orderID string, points int64) error {
	_, err := pgxevents.InsertPointsCredited(ctx, t.tx, pgxevents.PointsCredited{CustomerID: customerID, OrderID: orderID, Points: points})
	return err
}

func (h pgxPoints) HandleOrderPaid(ctx context.Context, tx pgx.Tx, e pgxevents.OrderPaid, m outbox.Meta) error {
	return h.p.paid(ctx, pgxTx{tx}, e.OrderID, e.CustomerID, e.AmountCents, m)
}

func (h pgxPoints) HandleOrderStatusChanged(ctx context.Context, tx pgx.Tx, e pgxevents.OrderStatusChanged, m outbox.Meta) error {
	return h.p.status(ctx, pgxTx{tx}, e.OrderID, e.Status)
}

// broker is a running consumer: a GoChannel, a Router with the generated
// points consumer, the poisoned messages and the metrics.
type broker struct {
	t      testing.TB
	ps     *gochannel.GoChannel
	router *message.Router
	reader *sdkmetric.ManualReader
	h      *points
	// acked receives the UUID of every message the router acks.
	acked chan string
	// poisoned receives messages published to the poison topic.
	poisoned chan *message.Message
}

const poisonTopic = "points.poison"

// startConsumer registers the points consumer of b on a fresh router and
// runs it until the test ends. cfg's zero fields get the test's defaults
// (a poison queue on the GoChannel unless NoPoisonQueue, fast retries, a
// test meter provider).
func startConsumer(t testing.TB, b *backend, cfg inbox.Config) *broker {
	t.Helper()
	logger := watermill.NopLogger{}
	ps := gochannel.NewGoChannel(gochannel.Config{}, logger)
	reader := sdkmetric.NewManualReader()
	br := &broker{
		t: t, ps: ps, reader: reader, h: &points{b: b},
		acked:    make(chan string, 1000),
		poisoned: make(chan *message.Message, 100),
	}
	ctx, cancel := context.WithCancel(context.Background())
	poison, err := ps.Subscribe(ctx, poisonTopic)
	if err != nil {
		t.Fatal(err)
	}
	go func() {
		for msg := range poison {
			br.poisoned <- msg
			msg.Ack()
		}
	}()
	r, err := message.NewRouter(message.RouterConfig{CloseTimeout: 30 * time.Second}, logger)
	if err != nil {
		t.Fatal(err)
	}
	// Router-level, added first: outermost, it sees what the router acks.
	r.AddMiddleware(func(h message.HandlerFunc) message.HandlerFunc {
		return func(msg *message.Message) ([]*message.Message, error) {
			out, err := h(msg)
			if err == nil {
				br.acked <- msg.UUID
			}
			return out, err
		}
	})
	if !cfg.NoPoisonQueue && cfg.PoisonPublisher == nil {
		cfg.PoisonPublisher, cfg.PoisonTopic = ps, poisonTopic
	}
	if cfg.RetryInitialInterval == 0 && cfg.RetryMaxInterval == 0 {
		cfg.RetryInitialInterval, cfg.RetryMaxInterval = time.Millisecond, 20*time.Millisecond
	}
	if cfg.MeterProvider == nil {
		cfg.MeterProvider = sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	}
	if err := b.register(r, ps, br.h, cfg); err != nil {
		t.Fatal(err)
	}
	br.router = r
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := r.Run(ctx); err != nil {
			t.Errorf("router: %v", err)
		}
	}()
	select {
	case <-r.Running():
	case <-done:
		cancel()
		ps.Close()
		t.FailNow() // the router did not start (its error is reported)
	}
	t.Cleanup(func() {
		r.Close()
		<-done
		cancel()
		ps.Close()
	})
	b.mustExec(t, `INSERT INTO balances (customer_id, points) VALUES ('c-42', 0)`)
	b.mustExec(t, `INSERT INTO order_state (order_id, status, applied) VALUES ('o-1', 'new', 0)`)
	return br
}

// outboxMessage builds a message as the relay publishes it.
func outboxMessage(eventID, eventType, key string, version int, seq int64, payload []byte) *message.Message {
	msg := message.NewMessage(eventID, payload)
	msg.Metadata.Set(outbox.MetadataEventID, eventID)
	msg.Metadata.Set(outbox.MetadataType, eventType)
	msg.Metadata.Set(outbox.MetadataKey, key)
	msg.Metadata.Set(outbox.MetadataVersion, strconv.Itoa(version))
	msg.Metadata.Set(outbox.MetadataSequence, strconv.FormatInt(seq, 10))
	msg.Metadata.Set(outbox.MetadataCreatedAt, time.Now().UTC().Format(time.RFC3339Nano))
	msg.Metadata.Set(outbox.MetadataPartitionKey, key)
	return msg
}

func paidMessage(t testing.TB, eventID, orderID string, seq int64) *message.Message {
	t.Helper()
	return paidMessageOf(t, eventID, paid(orderID), seq)
}

func paidMessageOf(t testing.TB, eventID string, e sqlevents.OrderPaid, seq int64) *message.Message {
	t.Helper()
	payload, err := json.Marshal(e)
	if err != nil {
		t.Fatal(err)
	}
	return outboxMessage(eventID, sqlevents.OrderPaidType, e.OrderID, sqlevents.OrderPaidVersion, seq, payload)
}

func statusMessage(t testing.TB, eventID, orderID, status string, seq int64) *message.Message {
	t.Helper()
	payload, err := json.Marshal(sqlevents.OrderStatusChanged{OrderID: orderID, Status: status})
	if err != nil {
		t.Fatal(err)
	}
	return outboxMessage(eventID, sqlevents.OrderStatusChangedType, orderID, 1, seq, payload)
}

// publish publishes msgs to topic without waiting.
func (br *broker) publish(topic string, msgs ...*message.Message) {
	br.t.Helper()
	if err := br.ps.Publish(topic, msgs...); err != nil {
		br.t.Fatal(err)
	}
}

// deliver publishes msg and waits until the router acks it.
func (br *broker) deliver(topic string, msg *message.Message) {
	br.t.Helper()
	br.publish(topic, msg)
	br.waitAcked(1)
}

// waitAcked waits for n acks.
func (br *broker) waitAcked(n int) []string {
	br.t.Helper()
	var ids []string
	timeout := time.After(2 * time.Minute)
	for len(ids) < n {
		select {
		case id := <-br.acked:
			ids = append(ids, id)
		case <-timeout:
			br.t.Fatalf("%d of %d messages acked before the timeout", len(ids), n)
		}
	}
	return ids
}

// waitPoisoned waits for n poisoned messages.
func (br *broker) waitPoisoned(n int) []*message.Message {
	br.t.Helper()
	var msgs []*message.Message
	timeout := time.After(2 * time.Minute)
	for len(msgs) < n {
		select {
		case m := <-br.poisoned:
			msgs = append(msgs, m)
		case <-timeout:
			br.t.Fatalf("%d of %d messages poisoned before the timeout", len(msgs), n)
		}
	}
	return msgs
}

// outcomes sums the outboxgen.inbox.deliveries counter by outcome.
func (br *broker) outcomes() map[string]int64 {
	br.t.Helper()
	var rm metricdata.ResourceMetrics
	if err := br.reader.Collect(context.Background(), &rm); err != nil {
		br.t.Fatal(err)
	}
	out := map[string]int64{}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if m.Name != "outboxgen.inbox.deliveries" {
				continue
			}
			sum, ok := m.Data.(metricdata.Sum[int64])
			if !ok {
				br.t.Fatalf("deliveries is a %T", m.Data)
			}
			for _, dp := range sum.DataPoints {
				o, _ := dp.Attributes.Value("outcome")
				out[o.AsString()] += dp.Value
			}
		}
	}
	return out
}

// Effects of the points handler, read from the database.
func (b *backend) balance(t testing.TB) int64 {
	return b.mustInt(t, `SELECT points FROM balances WHERE customer_id = 'c-42'`)
}

func (b *backend) credits(t testing.TB) int64 {
	return b.mustInt(t, `SELECT COUNT(*) FROM credit_log`)
}

func (b *backend) inboxRows(t testing.TB) int64 {
	return b.mustInt(t, `SELECT COUNT(*) FROM `+sqlevents.InboxTable)
}

func (b *backend) chained(t testing.TB) int64 {
	return b.mustInt(t, `SELECT COUNT(*) FROM `+sqlevents.OutboxTable+` WHERE biz_type = 'POINTS_CREDITED'`)
}

// The crashy driver: modernc.org/sqlite, except that a commit fails (after
// rolling back) when crashNextCommit is set, as a crash between the
// handler's writes and the commit would.
const crashyDriverName = "sqlite-crashy"

var crashNextCommit atomic.Bool

func init() {
	db, err := sql.Open("sqlite", ":memory:")
	if err != nil {
		panic(err)
	}
	drv := db.Driver()
	db.Close()
	sql.Register(crashyDriverName, crashyDriver{drv})
}

type crashyDriver struct{ driver.Driver }

func (d crashyDriver) Open(name string) (driver.Conn, error) {
	c, err := d.Driver.Open(name)
	if err != nil {
		return nil, err
	}
	return crashyConn{c}, nil
}

type crashyConn struct{ driver.Conn }

func (c crashyConn) BeginTx(ctx context.Context, opts driver.TxOptions) (driver.Tx, error) {
	tx, err := c.Conn.(driver.ConnBeginTx).BeginTx(ctx, opts)
	if err != nil {
		return nil, err
	}
	return crashyTx{tx}, nil
}

func (c crashyConn) ExecContext(ctx context.Context, query string, args []driver.NamedValue) (driver.Result, error) {
	if e, ok := c.Conn.(driver.ExecerContext); ok {
		return e.ExecContext(ctx, query, args)
	}
	return nil, driver.ErrSkip
}

func (c crashyConn) QueryContext(ctx context.Context, query string, args []driver.NamedValue) (driver.Rows, error) {
	if q, ok := c.Conn.(driver.QueryerContext); ok {
		return q.QueryContext(ctx, query, args)
	}
	return nil, driver.ErrSkip
}

type crashyTx struct{ driver.Tx }

func (tx crashyTx) Commit() error {
	if crashNextCommit.CompareAndSwap(true, false) {
		_ = tx.Tx.Rollback()
		return errors.New("test: simulated crash before commit")
	}
	return tx.Tx.Commit()
}
