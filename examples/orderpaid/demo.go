package main

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/outboxgen/outboxgen/examples/orderpaid/db/sqlitedb"
	"github.com/outboxgen/outboxgen/examples/orderpaid/events"
	"github.com/outboxgen/outboxgen/runtime/driver"
	"github.com/outboxgen/outboxgen/runtime/driver/sqldriver"
	"github.com/outboxgen/outboxgen/runtime/inbox"
	"github.com/outboxgen/outboxgen/runtime/outbox"
	"github.com/outboxgen/outboxgen/runtime/redact"
	"github.com/outboxgen/outboxgen/runtime/relay"
)

// Config is one run of the demo; main fills it from flags and environment.
type Config struct {
	DB     string // DSN; empty: a SQLite file in the temp directory
	Driver string // sqlite, postgres or mysql; empty: from DB
	Broker string // gochannel (default), nats-embedded or a nats:// URL
	Reset  bool   // drop the demo's tables when they exist

	Orders        int // orders to pay
	Customers     int
	Workers       int // concurrent payers
	Rate          int // payments started per second, all payers together (0: as fast as they go)
	RefundEvery   int // every n-th order is refunded right after it was paid (0: none)
	FailEvery     int // every n-th payment fails after its writes and rolls back (0: none)
	Chaos         bool
	FailRate      float64 // -chaos: fraction of publishes that fail
	LostAckRate   float64 // -chaos: fraction of publishes sent but reported failed
	DupRate       float64 // -chaos: fraction of messages published twice
	Seed          uint64  // chaos dice; 0: random
	Timeout       time.Duration
	Progress      time.Duration // progress line interval
	Verbose       bool
	Out           io.Writer
	RelaySettings relay.Config // the demo's relay settings; see defaultRelayOptions
}

// Result is what a run established.
type Result struct {
	Reconciled bool
	Checks     []Check
	Elapsed    time.Duration
}

// Check is one line of the reconciliation table.
type Check struct {
	What string
	Got  int64
	Want int64
	Info bool // informational: not compared
	OK   bool
}

// defaultRelayOptions are the demo's relay settings. The demo runs for
// seconds, so its clock is faster than the production defaults: it polls
// every 200 ms instead of 2 s (and is woken by Notify after each commit
// anyway), retries after 200 ms doubling to 2 s instead of 1 min doubling
// to 64 min, leases rows for 5 s instead of 30 s, and allows 10 attempts
// instead of 5, so that -chaos failure rates (about one publish in five
// fails) do not exhaust them.
func defaultRelayOptions() relay.Config {
	return relay.Config{
		BatchSize:       relay.DefaultBatchSize,
		PollInterval:    200 * time.Millisecond,
		LeaseDuration:   5 * time.Second,
		ShutdownTimeout: 2 * time.Second,
		Concurrency:     relay.DefaultConcurrency,
		MaxAttempts:     10,
		Backoff:         relay.ExponentialBackoff(backoffInitial, backoffMax, 0.2),
	}
}

// The demo's relay backoff (the default is 1 min doubling to 64 min).
const (
	backoffInitial = 200 * time.Millisecond
	backoffMax     = 2 * time.Second
)

// app is one running instance of the service.
type app struct {
	cfg    Config
	out    io.Writer
	start  time.Time
	store  *store
	events events.Writer // writes events in the database's dialect
	drv    driver.Driver
	brk    *broker
	pub    *countingPublisher
	poison *poisonCounter
	track  *tracker

	relayMu sync.Mutex
	relay   *relay.Relay
}

// Run runs the demo: it sets up the database, broker, consumers and relay,
// pays and refunds orders, waits until every effect is visible, shuts down
// and reconciles. The error is for set-up failures; a run that does not
// reconcile returns Result.Reconciled false.
func Run(ctx context.Context, cfg Config) (Result, error) {
	if cfg.Out == nil {
		cfg.Out = io.Discard
	}
	if cfg.Seed == 0 {
		cfg.Seed = rand.Uint64() % 1_000_000
	}
	a := &app{cfg: cfg, out: &syncWriter{w: cfg.Out}, start: time.Now(), track: newTracker()}
	res, err := a.run(ctx)
	res.Elapsed = time.Since(a.start)
	return res, err
}

func (a *app) printf(format string, args ...any) { fmt.Fprintf(a.out, format, args...) }

func (a *app) run(ctx context.Context) (Result, error) {
	cfg := a.cfg
	var err error
	a.store, err = openStore(ctx, cfg.DB, cfg.Driver)
	if err != nil {
		return Result{}, err
	}
	defer a.store.db.Close()
	if err := a.store.applySchema(ctx, cfg.Reset); err != nil {
		return Result{}, err
	}
	// Everything is wired from the generated package: the writer and the
	// driver take the dialect from the database's driver and refuse one
	// events.yaml does not list, and the tables from events.yaml. A
	// writer per run (rather than events.Bind, which binds the process):
	// the tests run the demo on several databases in one process.
	a.events, err = events.NewWriter(a.store.db)
	if err != nil {
		return Result{}, err
	}
	a.drv, err = sqldriver.New(a.store.db, events.Schema)
	if err != nil {
		return Result{}, err
	}

	level := slog.LevelError
	if cfg.Verbose {
		level = slog.LevelDebug
	}
	// Every log line, the relay's and watermill's included, goes through
	// redact: no password of a DSN or URL reaches the output.
	logger := slog.New(redact.NewHandler(slog.NewTextHandler(a.out, &slog.HandlerOptions{Level: level})))
	wlogger := watermill.NewSlogLogger(logger)

	a.brk, err = openBroker(cfg.Broker, logger)
	if err != nil {
		return Result{}, err
	}
	brokerClosed := false
	closeBroker := func() {
		if !brokerClosed {
			brokerClosed = true
			a.brk.close()
		}
	}
	defer closeBroker()
	failRate, lostAckRate, dupRate := 0.0, 0.0, 0.0
	if cfg.Chaos {
		failRate, lostAckRate, dupRate = cfg.FailRate, cfg.LostAckRate, cfg.DupRate
	}
	a.pub = newCountingPublisher(a.brk.pub, cfg.Seed, failRate, lostAckRate, dupRate)
	a.poison = &poisonCounter{Publisher: a.brk.pub}

	ropts := cfg.RelaySettings
	ropts.Publisher = a.pub
	ropts.EventTypes = events.EventTypes
	ropts.Logger = logger

	a.printSettings(ropts)

	// Consumers first: the relay starts once they are subscribed.
	router, err := message.NewRouter(message.RouterConfig{CloseTimeout: 10 * time.Second}, wlogger)
	if err != nil {
		return Result{}, err
	}
	router.AddMiddleware(a.observe) // before RegisterX: runs outside the inbox's retry and poison queue
	inboxCfg := inbox.Config{PoisonPublisher: a.poison, RetryInitialInterval: 50 * time.Millisecond, RetryMaxInterval: time.Second}
	pointsSub, err := a.brk.subscriber("points")
	if err != nil {
		return Result{}, err
	}
	if err := events.RegisterPoints(router, pointsSub, a.store.db, pointsConsumer{a}, inboxCfg); err != nil {
		return Result{}, err
	}
	smsSub, err := a.brk.subscriber("sms")
	if err != nil {
		return Result{}, err
	}
	if err := events.RegisterSMS(router, smsSub, a.store.db, smsConsumer{a}, inboxCfg); err != nil {
		return Result{}, err
	}
	routerCtx, stopRouter := context.WithCancel(context.WithoutCancel(ctx))
	defer stopRouter()
	routerDone := make(chan struct{})
	go func() { defer close(routerDone); _ = router.Run(routerCtx) }()
	select {
	case <-router.Running():
	case <-time.After(30 * time.Second):
		return Result{}, errors.New("the consumers did not start within 30s")
	}

	// The data: customers and new orders.
	if err := a.seed(ctx); err != nil {
		return Result{}, err
	}

	q := a.store.queries(a.store.db)
	a.printf("\nrunning\n")
	stopRelay, err := a.startRelay(ctx, ropts, 1)
	if err != nil {
		return Result{}, err
	}
	stopProgress := a.progressLoop(q)

	// The workload, and in -chaos a relay restart once a third is paid.
	work := a.payAll(ctx)
	if cfg.Chaos {
		for a.track.paid.Load() < int64(cfg.Orders/3) && !work.done() {
			time.Sleep(5 * time.Millisecond)
		}
		stopRelay()
		a.printf("  %5.1fs  chaos: relay orderpaid-relay-1 stopped (%d orders paid so far); payments go on, their events wait in the outbox\n",
			a.elapsed(), a.track.paid.Load())
		time.Sleep(500 * time.Millisecond)
		stopRelay, err = a.startRelay(ctx, ropts, 2)
		if err != nil {
			return Result{}, err
		}
		a.printf("  %5.1fs  chaos: relay orderpaid-relay-2 started\n", a.elapsed())
	}
	if err := work.wait(); err != nil {
		stopRelay()
		stopProgress()
		return Result{}, err
	}

	// Wait until every effect is visible, something FAILED, or time is up.
	deadline := time.Now().Add(cfg.Timeout)
	var timedOut bool
	for {
		done, failed, err := a.settled(ctx, q)
		if err != nil {
			stopRelay()
			stopProgress()
			return Result{}, err
		}
		if done || failed {
			break
		}
		if time.Now().After(deadline) {
			timedOut = true
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	stopProgress()
	a.printProgress(q)

	// Shut down in order: relay, consumers, broker.
	stopRelay()
	stopRouter()
	select {
	case <-routerDone:
	case <-time.After(15 * time.Second):
		a.printf("warning: the consumers did not stop within 15s\n")
	}
	closeBroker()

	res, err := a.reconcile(ctx, q)
	if err != nil {
		return res, err
	}
	if timedOut {
		a.printf("\ntimed out after %s waiting for the events to be consumed\n", cfg.Timeout)
		res.Reconciled = false
	}
	a.printResult(res)
	return res, nil
}

func (a *app) elapsed() float64 { return time.Since(a.start).Seconds() }

func (a *app) printSettings(r relay.Config) {
	c := a.cfg
	a.printf("orderpaid: the transactional outbox end to end (events.yaml -> examples/orderpaid/events)\n\n")
	a.printf("database   %s\n", a.store.where)
	a.printf("broker     %s\n", a.brk.desc)
	rate := "as fast as they go"
	if c.Rate > 0 {
		rate = fmt.Sprintf("%d payments/s", c.Rate)
	}
	a.printf("workload   %d orders of %d customers, %d payers, %s; every %s order refunded right after payment; every %s payment fails after its writes (rolled back, no event)\n",
		c.Orders, c.Customers, c.Workers, rate, nth(c.RefundEvery), nth(c.FailEvery))
	a.printf("relay      poll %s (and Notify after each commit), batch %d, %d keys at once, lease %s, backoff %s doubling to %s (±20%%), FAILED after %d attempts\n",
		r.PollInterval, r.BatchSize, r.Concurrency, r.LeaseDuration, backoffInitial, backoffMax, r.MaxAttempts)
	a.printf("consumers  points [ORDER_PAID ORDER_REFUNDED] -> ledger, balance, POINTS_CREDITED; sms [ORDER_PAID POINTS_CREDITED] -> messages\n")
	a.printf("           each delivery in one transaction with its inbox row; %d attempts, then the poison topic <consumer>.poison\n", inbox.DefaultMaxAttempts)
	if c.Chaos {
		a.printf("chaos      seed %d: %.0f%% of publishes fail, %.0f%% are sent but reported failed (lost ack), %.0f%% of messages are published twice with a fresh message UUID; the relay is stopped and replaced after a third of the payments\n",
			c.Seed, c.FailRate*100, c.LostAckRate*100, c.DupRate*100)
	} else {
		a.printf("chaos      off (try -chaos)\n")
	}
}

func nth(n int) string {
	switch {
	case n <= 0:
		return "no"
	case n == 1:
		return "each"
	case n == 2:
		return "2nd"
	case n == 3:
		return "3rd"
	}
	return fmt.Sprintf("%dth", n)
}

// seed creates the customers and the new orders.
func (a *app) seed(ctx context.Context) error {
	return a.store.inTx(ctx, func(tx *sql.Tx) error {
		q := a.store.queries(tx)
		for c := 0; c < a.cfg.Customers; c++ {
			if err := q.CreateCustomer(ctx, sqlitedb.CreateCustomerParams{ID: customerID(c), Phone: fmt.Sprintf("+4915%08d", c)}); err != nil {
				return err
			}
		}
		for i := 1; i <= a.cfg.Orders; i++ {
			if err := q.CreateOrder(ctx, sqlitedb.CreateOrderParams{
				ID: orderID(i), CustomerID: customerID(i % a.cfg.Customers), AmountCents: 500 + int64(i*7919%20000), Currency: "EUR",
			}); err != nil {
				return err
			}
		}
		return nil
	})
}

func customerID(c int) string { return fmt.Sprintf("c-%03d", c) }
func orderID(i int) string    { return fmt.Sprintf("o-%05d", i) }

// workload is the payers at work.
type workload struct {
	finished atomic.Bool
	errc     chan error
}

func (w *workload) done() bool  { return w.finished.Load() }
func (w *workload) wait() error { return <-w.errc }

// payAll pays every order with cfg.Workers concurrent payers, refunding
// every RefundEvery-th right after its payment committed.
func (a *app) payAll(ctx context.Context) *workload {
	w := &workload{errc: make(chan error, 1)}
	next := make(chan int)
	var wg sync.WaitGroup
	var firstErr error
	var errOnce sync.Once
	for range a.cfg.Workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range next {
				if err := a.payOne(ctx, i); err != nil {
					errOnce.Do(func() { firstErr = err })
				}
			}
		}()
	}
	go func() {
		start := time.Now()
		for i := 1; i <= a.cfg.Orders; i++ {
			if a.cfg.Rate > 0 {
				time.Sleep(time.Until(start.Add(time.Duration(i-1) * time.Second / time.Duration(a.cfg.Rate))))
			}
			next <- i
		}
		close(next)
		wg.Wait()
		w.finished.Store(true)
		w.errc <- firstErr
	}()
	return w
}

func (a *app) payOne(ctx context.Context, i int) error {
	fail := a.cfg.FailEvery > 0 && i%a.cfg.FailEvery == 0
	id, err := a.pay(ctx, orderID(i), fail)
	if errors.Is(err, errProviderFailed) {
		a.track.declined.Add(1)
		return nil
	}
	if err != nil {
		return err
	}
	a.track.committed(id.String())
	a.notifyRelay()
	if a.cfg.RefundEvery > 0 && i%a.cfg.RefundEvery == 0 {
		if _, err := a.refund(ctx, orderID(i)); err != nil {
			return err
		}
		a.track.refunded.Add(1)
		a.notifyRelay()
	}
	return nil
}

// startRelay starts relay instance n; the returned function stops it and
// waits until it has recorded its results.
func (a *app) startRelay(ctx context.Context, opts relay.Config, n int) (func(), error) {
	opts.InstanceID = fmt.Sprintf("orderpaid-relay-%d", n)
	r, err := relay.New(a.drv, opts)
	if err != nil {
		return nil, err
	}
	rctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	done := make(chan struct{})
	go func() { defer close(done); _ = r.Run(rctx) }()
	a.relayMu.Lock()
	a.relay = r
	a.relayMu.Unlock()
	r.Notify()
	return func() {
		a.relayMu.Lock()
		if a.relay == r {
			a.relay = nil
		}
		a.relayMu.Unlock()
		cancel()
		<-done
	}, nil
}

// notifyRelay wakes the running relay (if any) after a commit that wrote
// events, so they go out within milliseconds instead of at the next poll.
func (a *app) notifyRelay() {
	a.relayMu.Lock()
	r := a.relay
	a.relayMu.Unlock()
	if r != nil {
		r.Notify()
	}
}

// handledKey marks, in a delivery's context, that the consumer's handler
// ran and committed: the inbox calls handlers only for events it has not
// seen, so a successful delivery without the mark was a duplicate.
type handledKey struct{}

func markHandled(ctx context.Context) {
	if f, ok := ctx.Value(handledKey{}).(*atomic.Bool); ok {
		f.Store(true)
	}
}

// observe is router middleware around every consumer handler: it counts
// processed and skipped deliveries, takes the commit-to-consumer latency of
// ORDER_PAID at the points consumer, and wakes the relay after a consumer
// wrote an event (POINTS_CREDITED).
func (a *app) observe(h message.HandlerFunc) message.HandlerFunc {
	return func(msg *message.Message) ([]*message.Message, error) {
		handled := new(atomic.Bool)
		msg.SetContext(context.WithValue(msg.Context(), handledKey{}, handled))
		out, err := h(msg)
		if err != nil {
			return out, err
		}
		consumer, _, _ := strings.Cut(message.HandlerNameFromCtx(msg.Context()), "/")
		eventID := msg.Metadata.Get(outbox.MetadataEventID)
		typ := msg.Metadata.Get(outbox.MetadataType)
		a.track.delivered(consumer, typ, eventID, handled.Load())
		if handled.Load() && consumer == "points" && typ == events.OrderPaidType {
			a.notifyRelay()
		}
		return out, nil
	}
}

// poisonCounter counts the messages the consumers gave up on.
type poisonCounter struct {
	message.Publisher
	n atomic.Int64
}

func (p *poisonCounter) Publish(topic string, msgs ...*message.Message) error {
	p.n.Add(int64(len(msgs)))
	return p.Publisher.Publish(topic, msgs...)
}

// syncWriter serialises the writes of the progress loop, the main
// goroutine and the loggers.
type syncWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (s *syncWriter) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.w.Write(p)
}
