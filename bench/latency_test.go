package bench

import (
	"context"
	"database/sql"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outboxgen/outboxgen/internal/testdb"
	"github.com/outboxgen/outboxgen/runtime/dialect"
	"github.com/outboxgen/outboxgen/runtime/driver/sqldriver"
	"github.com/outboxgen/outboxgen/runtime/outbox"
	"github.com/outboxgen/outboxgen/runtime/relay"
	"github.com/outboxgen/outboxgen/templates"
)

// latencyMode is one way of waking the relay in scenario (d).
type latencyMode struct {
	name  string
	title string
	relay bool          // false: writers only, the baseline writer cost
	poll  time.Duration // relay PollInterval (0: default 2s)
	// notify: writers call Relay.Notify() after Commit (in-process).
	notify bool
	// pgNotify: writers run SELECT pg_notify(...) inside the transaction;
	// a LISTEN connection in the relay process calls Relay.Notify() (what
	// a LISTEN/NOTIFY wake-up in the relay would cost the writers).
	pgNotify bool
}

func latencyModes() []latencyMode {
	return []latencyMode{
		{name: "no_relay", title: "no relay running (writer baseline)"},
		{name: "notify", title: "in-process Notify() after commit", relay: true, poll: relay.DefaultPollInterval, notify: true},
		{name: "pg_notify", title: "PostgreSQL NOTIFY in tx → LISTEN → Notify()", relay: true, poll: relay.DefaultPollInterval, pgNotify: true},
		{name: "poll_10ms", title: "polling only", relay: true, poll: 10 * time.Millisecond},
		{name: "poll_50ms", title: "polling only", relay: true, poll: 50 * time.Millisecond},
	}
}

type latencyResult struct {
	mode                 latencyMode
	committed            int
	txPerSec             float64
	txP50, txP99         time.Duration // BEGIN .. COMMIT returned
	commitP50, commitP99 time.Duration // the COMMIT call alone
	pubP50, pubP99       time.Duration // commit returned .. received
	pubMax               time.Duration
	lost                 int
}

func runLatency(b *testing.B, m latencyMode) latencyResult {
	dsn := testdb.DSN(b, "postgres")
	db, err := sql.Open(testdb.Driver(b, "postgres"), dsn)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { db.Close() })
	db.SetMaxIdleConns(*flagWriters + 8)
	testdb.ApplySchema(b, db, "postgres", templates.DefaultTables)

	rate, writers, dur := max(*flagRate, 1), max(*flagWriters, 1), *flagLatencyFor
	expected := int(float64(rate)*dur.Seconds()) + writers
	s := newSink(b, expected)

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var r *relay.Relay
	runErr := make(chan error, 1)
	if m.relay {
		drv, err := sqldriver.New(db, testdb.Schema(dialect.Postgres))
		if err != nil {
			b.Fatal(err)
		}
		r, err = relay.New(drv, relay.Config{Publisher: s.pub, PollInterval: m.poll, Logger: discard})
		if err != nil {
			b.Fatal(err)
		}
		go func() { runErr <- r.Run(ctx) }()
	}
	if m.pgNotify {
		conn, err := pgx.Connect(ctx, dsn)
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { conn.Close(context.Background()) })
		if _, err := conn.Exec(ctx, dialect.Listen(templates.DefaultTables.Outbox)); err != nil {
			b.Fatal(err)
		}
		go func() {
			for {
				if _, err := conn.WaitForNotification(ctx); err != nil {
					return
				}
				r.Notify()
			}
		}()
	}
	// Let the relay start and the pools warm up before the clock runs.
	warm := make([]*sql.Conn, 0, writers)
	for range writers {
		c, err := db.Conn(ctx)
		if err != nil {
			b.Fatal(err)
		}
		warm = append(warm, c)
	}
	for _, c := range warm {
		c.Close()
	}
	time.Sleep(200 * time.Millisecond)

	w := outbox.MustNewWriter(outbox.Postgres, templates.DefaultTables.Outbox)
	notifier, err := sqldriver.New(db, testdb.Schema(dialect.Postgres))
	if err != nil {
		b.Fatal(err)
	}
	var (
		mu       sync.Mutex
		commitAt = make(map[string]time.Time, expected)
		txLat    = make([]time.Duration, 0, expected)
		comLat   = make([]time.Duration, 0, expected)
		errs     []error
	)
	start := time.Now().Add(10 * time.Millisecond)
	end := start.Add(dur)
	var wg sync.WaitGroup
	for i := range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for k := 0; ; k++ {
				seq := k*writers + i
				at := start.Add(time.Duration(seq) * time.Second / time.Duration(rate))
				if !at.Before(end) {
					return
				}
				if d := time.Until(at); d > 0 {
					time.Sleep(d)
				}
				t0 := time.Now()
				tx, err := db.BeginTx(ctx, nil)
				if err != nil {
					mu.Lock()
					errs = append(errs, err)
					mu.Unlock()
					return
				}
				id, err := w.Insert(ctx, tx, outbox.Event{Type: "ORDER_PAID", Topic: topic, Key: keyOf(seq), Version: 1, Payload: map[string]any{"order_id": seq, "amount": seq % 1000, "currency": "EUR"}})
				if err == nil && m.pgNotify {
					err = notifier.Notify(ctx, tx)
				}
				if err != nil {
					tx.Rollback() //nolint:errcheck
					mu.Lock()
					errs = append(errs, err)
					mu.Unlock()
					return
				}
				t1 := time.Now()
				if err := tx.Commit(); err != nil {
					mu.Lock()
					errs = append(errs, err)
					mu.Unlock()
					return
				}
				t2 := time.Now()
				if m.notify {
					r.Notify()
				}
				mu.Lock()
				commitAt[id.String()] = t2
				txLat = append(txLat, t2.Sub(t0))
				comLat = append(comLat, t2.Sub(t1))
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	writeDur := time.Since(start)
	for _, err := range errs {
		b.Fatalf("writer: %v", err)
	}
	res := latencyResult{mode: m, committed: len(commitAt), txPerSec: float64(len(commitAt)) / writeDur.Seconds()}
	txLat, comLat = sortDurations(txLat), sortDurations(comLat)
	res.txP50, res.txP99 = percentile(txLat, 0.50), percentile(txLat, 0.99)
	res.commitP50, res.commitP99 = percentile(comLat, 0.50), percentile(comLat, 0.99)
	if !m.relay {
		return res
	}

	// Wait for the stragglers: at most a poll interval plus a batch.
	deadline := time.Now().Add(m.poll + 10*time.Second)
	for s.received() < len(commitAt) && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	cancel()
	if err := <-runErr; err != nil {
		b.Fatalf("relay Run: %v", err)
	}
	s.mu.Lock()
	pub := make([]time.Duration, 0, len(commitAt))
	for id, c := range commitAt {
		at, ok := s.recv[id]
		if !ok {
			res.lost++
			continue
		}
		pub = append(pub, at.Sub(c)) // may be slightly negative: received before Commit returned
	}
	s.mu.Unlock()
	pub = sortDurations(pub)
	res.pubP50, res.pubP99 = percentile(pub, 0.50), percentile(pub, 0.99)
	if len(pub) > 0 {
		res.pubMax = pub[len(pub)-1]
	}
	return res
}
