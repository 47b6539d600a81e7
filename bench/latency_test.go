package bench

import (
	"context"
	"database/sql"
	"flag"
	"fmt"
	"os"
	"sort"
	"strings"
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

// BenchmarkLatency: commit→publish latency at a steady event rate with
// each wake-up mode of the relay, and what each mode costs the writers
// (the test servers' own settings). It prints its own markdown table; it
// is not part of `make bench`:
//
//	go test ./bench -run '^$' -bench '^BenchmarkLatency$' -benchtime 1x

var (
	flagRate       = flag.Int("rate", 1000, "BenchmarkLatency: events per second the writers commit")
	flagWriters    = flag.Int("writers", 16, "BenchmarkLatency: writer goroutines")
	flagLatencyFor = flag.Duration("latency-for", 12*time.Second, "BenchmarkLatency: how long the writers run per mode")
)

func BenchmarkLatency(b *testing.B) {
	if testing.Short() {
		b.Skip("heavy benchmark; not run with -short")
	}
	byMode := map[string][]latencyResult{}
	var order []latencyMode
	for range max(*flagRounds, 1) {
		for _, m := range latencyModes() {
			b.Run(m.name, func(b *testing.B) {
				for range b.N {
					res := runLatency(b, m)
					if _, ok := byMode[m.name]; !ok {
						order = append(order, m)
					}
					byMode[m.name] = append(byMode[m.name], res)
					b.ReportMetric(float64(res.pubP50.Microseconds())/1000, "p50-ms")
					b.ReportMetric(float64(res.pubP99.Microseconds())/1000, "p99-ms")
					b.ReportMetric(res.txPerSec, "writer-tx/s")
				}
			})
		}
	}
	var sb strings.Builder
	w := func(format string, args ...any) { fmt.Fprintf(&sb, format, args...) }
	w("Commit→publish latency: %d writers commit one event per transaction at %d events/s for %s; latency = subscriber receive time − writer's Commit return time. Relay BatchSize 100, Concurrency 8. Median of %d round(s) by p50.\n\n",
		*flagWriters, *flagRate, *flagLatencyFor, max(*flagRounds, 1))
	w("| Wake-up mode | PollInterval | Writers tx/s | Writer tx p50 / p99 (ms) | Writer COMMIT p50 / p99 (ms) | Publish latency p50 / p99 / max (ms) | Lost | p50 < 10 ms, p99 < 50 ms |\n")
	w("|---|---|---:|---:|---:|---:|---:|---|\n")
	for _, m := range order {
		rs := byMode[m.name]
		sort.Slice(rs, func(i, j int) bool { return rs[i].pubP50 < rs[j].pubP50 })
		l := rs[len(rs)/2]
		pubs, poll, lost, target := "—", "—", "—", "—"
		if m.relay {
			pubs = fmt.Sprintf("%s / %s / %s", ms(l.pubP50), ms(l.pubP99), ms(l.pubMax))
			poll, lost = m.poll.String(), fmt.Sprint(l.lost)
			target = verdict(l.pubP50 < 10*time.Millisecond && l.pubP99 < 50*time.Millisecond)
		}
		w("| %s | %s | %.0f | %s / %s | %s / %s | %s | %s | %s |\n", m.title, poll, l.txPerSec,
			ms(l.txP50), ms(l.txP99), ms(l.commitP50), ms(l.commitP99), pubs, lost, target)
	}
	fmt.Println()
	fmt.Println(sb.String())
	if *flagTable != "" {
		if err := os.WriteFile(*flagTable, []byte(sb.String()), 0o644); err != nil {
			b.Errorf("write -table: %v", err)
		}
	}
}

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
