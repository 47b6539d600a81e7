package bench

// BenchmarkWAL: issue 15's benchmark, the WAL mode (outbox.WALWriter and
// runtime/walrelay) beside the table outbox and the polling relay, in one
// run on one PostgreSQL server with wal_level=logical, with fsync,
// synchronous_commit and full_page_writes on for the whole run (-durable,
// the default; durable_test.go), restored at its end:
//
//  1. writer tx/s (-wal-slices rounds of -wal-slice per mode, the modes in
//     rotating order on one database, so outside load hits all alike),
//     -wal-clients (16) clients, each transaction a 1-row
//     UPDATE of its aggregate alone, + the generated writer's outbox
//     INSERT, + the WAL write path's pg_logical_emit_message, + an INSERT
//     into a table without any index (the floor of the "insert variant",
//     a table the relay would stream instead of poll);
//  2. end to end at saturation: the same writers (UPDATE + event) for
//     -wal-for while the relay runs, events/s from the first commit to the
//     last event published: the polling relay (pgxdriver, 10 ms poll,
//     in-process Notify) against the WAL relay;
//  3. commit→publish latency p50/p99 at -wal-rate (1000) events/s, from
//     the moment the writer sends COMMIT (so the commit's own fsync is
//     included: the relay can publish before the writer sees COMMIT return): the
//     polling relay (in-process Notify after commit, its fastest mode)
//     against the WAL relay;
//  4. the WAL a slot retains per hour while the relay is down, writing
//     -wal-rate events/s (UPDATE + event);
//  5. the WAL relay's commit→publish latency of 3 with a fraction
//     -chaos-slow (0.5 %) of its publishes taking -chaos-delay (3 s, row
//     4 of BenchmarkOutbox), without and with Config.Hedge.
//
// The publisher is an in-memory sink (the broker is not the subject).
//
//	OUTBOXGEN_TEST_POSTGRES_DSN=... go test ./bench -run '^$' -bench '^BenchmarkWAL$' -benchtime 1x

import (
	"context"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxgen/outboxgen/internal/testdb"
	"github.com/outboxgen/outboxgen/runtime/driver/pgxdriver"
	"github.com/outboxgen/outboxgen/runtime/outbox"
	"github.com/outboxgen/outboxgen/runtime/outbox/pgxoutbox"
	"github.com/outboxgen/outboxgen/runtime/relay"
	"github.com/outboxgen/outboxgen/runtime/walrelay"
	"github.com/outboxgen/outboxgen/templates"
)

var (
	flagWALClients = flag.Int("wal-clients", 16, "BenchmarkWAL: writer clients")
	flagWALFor     = flag.Duration("wal-for", 5*time.Second, "BenchmarkWAL: how long each writer and end-to-end scenario writes")
	flagWALRounds  = flag.Int("wal-rounds", 3, "BenchmarkWAL: rounds of the end-to-end scenarios (medians shown)")
	flagWALSlice   = flag.Duration("wal-slice", time.Second, "BenchmarkWAL: duration of one writer slice")
	flagWALSlices  = flag.Int("wal-slices", 10, "BenchmarkWAL: writer rounds (one slice of each mode per round, rotating order)")
	flagWALRate    = flag.Int("wal-rate", 1000, "BenchmarkWAL: events/s of the latency and retention scenarios")
	flagWALLatFor  = flag.Duration("wal-latency-for", 10*time.Second, "BenchmarkWAL: how long each latency scenario writes")
	flagWALKeys    = flag.Int("wal-keys", 1000, "BenchmarkWAL: aggregates (rows updated, event keys)")
	flagWALFloor   = flag.Bool("wal-floor", false, "BenchmarkWAL: also measure the writer floors: UPDATE + SELECT 1 (one more round trip) and the first WAL statement (three parameters, extract(epoch))")
)

// walSink is the in-memory broker: it records when each event arrived.
type walSink struct {
	mu   sync.Mutex
	recv map[string]time.Time
	dups int
	last time.Time
}

func newWALSink() *walSink { return &walSink{recv: map[string]time.Time{}} }

func (s *walSink) Publish(_ string, msgs ...*message.Message) error {
	now := time.Now()
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, m := range msgs {
		if _, ok := s.recv[m.UUID]; ok {
			s.dups++
			continue
		}
		s.recv[m.UUID] = now
		s.last = now
	}
	return nil
}

func (s *walSink) Close() error { return nil }

func (s *walSink) count() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.recv)
}

// walDB is a fresh database with the outbox schema and the aggregates.
func walDB(b *testing.B) *pgxpool.Pool {
	b.Helper()
	cfg, err := pgxpool.ParseConfig(testdb.DSN(b, "postgres"))
	if err != nil {
		b.Fatal(err)
	}
	cfg.MaxConns = int32(*flagWALClients + 8)
	ctx := context.Background()
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(pool.Close)
	var level string
	if err := pool.QueryRow(ctx, "SELECT current_setting('wal_level')").Scan(&level); err != nil {
		b.Fatal(err)
	}
	if level != "logical" {
		b.Skipf("BenchmarkWAL needs a server with wal_level=logical (this one: %s)", level)
	}
	ddl, err := templates.Render("postgres", templates.DefaultTables)
	if err != nil {
		b.Fatal(err)
	}
	for _, st := range templates.Statements(ddl) {
		if _, err := pool.Exec(ctx, st); err != nil {
			b.Fatal(err)
		}
	}
	// The insert variant's floor: the relay would stream these rows (no
	// index at all, no claim, no mark), but they still cost an INSERT now
	// and a DELETE and vacuum later.
	if _, err := pool.Exec(ctx, `CREATE TABLE outbox_stream (event_id uuid NOT NULL, biz_type varchar(64) NOT NULL, biz_id varchar(128) NOT NULL,
		topic varchar(255) NOT NULL, payload_version int NOT NULL, payload json NOT NULL, headers json, created_at timestamptz NOT NULL DEFAULT now())`); err != nil {
		b.Fatal(err)
	}
	if _, err := pool.Exec(ctx, "CREATE TABLE account (id int PRIMARY KEY, n bigint NOT NULL DEFAULT 0)"); err != nil {
		b.Fatal(err)
	}
	if _, err := pool.Exec(ctx, "INSERT INTO account (id) SELECT generate_series(0, $1::int - 1)", *flagWALKeys); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		for ctx.Err() == nil {
			_, _ = pool.Exec(ctx, "SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots WHERE database = current_database() AND active_pid IS NOT NULL")
			_, _ = pool.Exec(ctx, "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE database = current_database() AND NOT active")
			var n int
			if pool.QueryRow(ctx, "SELECT count(*) FROM pg_replication_slots WHERE database = current_database()").Scan(&n) == nil && n == 0 {
				return
			}
			time.Sleep(100 * time.Millisecond)
		}
	})
	return pool
}

// walMode is what a writer transaction does besides its UPDATE.
type walMode int

const (
	modeUpdate  walMode = iota // the UPDATE alone
	modeTable                  // + the outbox INSERT (the generated writer's)
	modeWAL                    // + pg_logical_emit_message (outbox.WALWriter)
	modeLean                   // + INSERT into a table without any index (the insert variant's floor)
	modeSelect1                // + SELECT 1 (-wal-floor): the cost of one more statement
	modeWALv1                  // + the first WAL statement (-wal-floor): prefix and sequence as parameters, extract(epoch)
)

func (m walMode) String() string {
	return [...]string{"UPDATE alone", "+ table outbox INSERT", "+ WAL message", "+ INSERT into an index-free table (insert variant)",
		"+ SELECT 1 (one more statement)", "+ WAL message, first statement"}[m]
}

// emitWALv1 is the WAL write path's first statement, kept for -wal-floor:
// prefix and sequence name bound as parameters, the time computed with
// extract(epoch ...) (numeric).
const emitWALv1 = `SELECT pg_logical_emit_message(true, $1::text, '\x01'::bytea` +
	` || int8send(nextval($2::regclass))` +
	` || int8send((extract(epoch FROM now()) * 1000000)::int8)` +
	` || $3::bytea)`

// writeTx runs one writer transaction on aggregate k; committing is when
// its COMMIT was sent.
func writeTx(ctx context.Context, pool *pgxpool.Pool, m walMode, tw *outbox.Writer, ww *outbox.WALWriter, k, seq int) (id outbox.EventID, committing time.Time, err error) {
	tx, err := pool.Begin(ctx)
	if err != nil {
		return outbox.EventID{}, time.Time{}, err
	}
	defer tx.Rollback(ctx) //nolint:errcheck
	if _, err := tx.Exec(ctx, "UPDATE account SET n = n + 1 WHERE id = $1", k); err != nil {
		return outbox.EventID{}, time.Time{}, err
	}
	ev := outbox.Event{Type: "ORDER_PAID", Topic: topic, Key: fmt.Sprintf("order-%d", k), Version: 1,
		Payload: map[string]any{"order_id": seq, "amount": seq % 1000, "currency": "EUR"}}
	switch m {
	case modeTable:
		id, err = tw.InsertTx(ctx, pgxoutbox.Tx(tx), ev)
	case modeWAL:
		id, err = ww.InsertTx(ctx, pgxoutbox.Tx(tx), ev)
	case modeSelect1:
		id = outbox.NewEventID()
		_, err = tx.Exec(ctx, "SELECT 1")
	case modeWALv1:
		var st outbox.Statement
		if st, err = ww.Prepare(ev); err == nil {
			id = st.ID
			_, err = tx.Exec(ctx, emitWALv1, ww.Prefix(), templates.DefaultTables.Outbox+"_id_seq", st.Args[0])
		}
	case modeLean:
		var st outbox.Statement
		if st, err = tw.Prepare(ev); err == nil {
			id = st.ID
			_, err = tx.Exec(ctx, "INSERT INTO outbox_stream (event_id, biz_type, biz_id, topic, payload_version, payload, headers) VALUES ($1, $2, $3, $4, $5, $6, $7)", st.Args...)
		}
	}
	if err != nil {
		return outbox.EventID{}, time.Time{}, err
	}
	committing = time.Now()
	return id, committing, tx.Commit(ctx)
}

func walWriters() (*outbox.Writer, *outbox.WALWriter) {
	tw := outbox.MustNewWriter(outbox.Postgres, templates.DefaultTables.Outbox)
	ww, err := outbox.NewWALWriter(tw)
	if err != nil {
		panic(err)
	}
	return tw, ww
}

// saturate runs the clients as fast as they go for d, calling after (if
// set) with each committed event; it returns the transactions committed
// and when the first began.
func saturate(b *testing.B, pool *pgxpool.Pool, m walMode, d time.Duration, after func(outbox.EventID)) (int, time.Time) {
	tw, ww := walWriters()
	ctx := context.Background()
	var n atomic.Int64
	var wg sync.WaitGroup
	start := time.Now()
	end := start.Add(d)
	errc := make(chan error, *flagWALClients)
	for c := range *flagWALClients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(c), 15))
			for i := 0; time.Now().Before(end); i++ {
				id, _, err := writeTx(ctx, pool, m, tw, ww, rng.IntN(*flagWALKeys), c*1_000_000+i)
				if err != nil {
					errc <- err
					return
				}
				n.Add(1)
				if after != nil {
					after(id)
				}
			}
		}()
	}
	wg.Wait()
	close(errc)
	for err := range errc {
		b.Fatalf("writer (%s): %v", m, err)
	}
	return int(n.Load()), start
}

// walRelay starts a WAL relay on pool publishing to pub and waits until
// it streams; the returned function stops it.
func walRelay(b *testing.B, pool *pgxpool.Pool, pub message.Publisher, mods ...func(*walrelay.Config)) (*walrelay.Relay, func()) {
	cfg := walrelay.Config{Publisher: pub, Logger: discard, StatusInterval: 100 * time.Millisecond}
	for _, m := range mods {
		m(&cfg)
	}
	r, err := walrelay.New(pool, testdb.Schema(outbox.Postgres), cfg)
	if err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	deadline := time.Now().Add(30 * time.Second)
	for !r.Status().Streaming {
		if time.Now().After(deadline) {
			b.Fatal("the WAL relay did not start streaming within 30s")
		}
		time.Sleep(10 * time.Millisecond)
	}
	return r, func() {
		cancel()
		if err := <-done; err != nil {
			b.Errorf("walrelay: %v", err)
		}
	}
}

// pollRelay starts the polling relay (pgxdriver) on pool.
func pollRelay(b *testing.B, pool *pgxpool.Pool, pub message.Publisher) (*relay.Relay, func()) {
	drv, err := pgxdriver.New(pool, testdb.Schema(outbox.Postgres))
	if err != nil {
		b.Fatal(err)
	}
	r, err := relay.New(drv, relay.Config{Publisher: pub, PollInterval: 10 * time.Millisecond, Logger: discard})
	if err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	return r, func() {
		cancel()
		if err := <-done; err != nil {
			b.Errorf("relay: %v", err)
		}
	}
}

// e2eResult is one end-to-end round: events/s from the first commit to the
// last publish, the writers' own rate while they ran, and how long the
// relay took after the writers stopped to publish the rest (a relay that
// keeps up drains at once; then the writers bound the figure).
type e2eResult struct {
	rate, writers float64
	drain         time.Duration
}

// endToEnd measures events/s from the first commit to the last publish,
// writers and relay running together.
func endToEnd(b *testing.B, wal bool) e2eResult {
	pool := walDB(b)
	sink := newWALSink()
	var stop func()
	var notify func()
	if wal {
		_, stop = walRelay(b, pool, sink)
	} else {
		var r *relay.Relay
		r, stop = pollRelay(b, pool, sink)
		notify = r.Notify
	}
	defer stop()
	mode := modeTable
	if wal {
		mode = modeWAL
	}
	n, start := saturate(b, pool, mode, *flagWALFor, func(outbox.EventID) {
		if notify != nil {
			notify()
		}
	})
	wrote := time.Now()
	deadline := time.Now().Add(5 * time.Minute)
	for sink.count() < n {
		if time.Now().After(deadline) {
			b.Fatalf("only %d of %d events published after 5 minutes", sink.count(), n)
		}
		time.Sleep(5 * time.Millisecond)
	}
	sink.mu.Lock()
	last := sink.last
	sink.mu.Unlock()
	return e2eResult{rate: float64(n) / last.Sub(start).Seconds(), writers: float64(n) / wrote.Sub(start).Seconds(), drain: max(last.Sub(wrote), 0)}
}

// latency writes -wal-rate events/s for -wal-latency-for and returns the
// commit→publish p50 and p99.
func latency(b *testing.B, wal bool) (p50, p99, r50, r99 time.Duration, lost int) {
	pool := walDB(b)
	sink := newWALSink()
	var stop, notify func()
	if wal {
		_, stop = walRelay(b, pool, sink)
	} else {
		var r *relay.Relay
		r, stop = pollRelay(b, pool, sink)
		notify = r.Notify
	}
	defer stop()
	commits, returned := paced(b, pool, map[bool]walMode{false: modeTable, true: modeWAL}[wal], *flagWALLatFor, notify)
	deadline := time.Now().Add(time.Minute)
	for sink.count() < len(commits) && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	sink.mu.Lock()
	defer sink.mu.Unlock()
	lat := make([]time.Duration, 0, len(commits))
	ret := make([]time.Duration, 0, len(commits))
	for id, at := range commits {
		got, ok := sink.recv[id]
		if !ok {
			lost++
			continue
		}
		lat = append(lat, got.Sub(at))
		ret = append(ret, max(got.Sub(returned[id]), 0))
	}
	sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
	sort.Slice(ret, func(i, j int) bool { return ret[i] < ret[j] })
	return percentile(lat, 0.50), percentile(lat, 0.99), percentile(ret, 0.50), percentile(ret, 0.99), lost
}

// slowLatency is latency's WAL relay, with a fraction -chaos-slow of its
// publishes taking -chaos-delay (3 s; row 4's stalls: the call sleeps,
// whatever its context), with or without Config.Hedge: the sorted
// commit→publish latencies (from COMMIT returned), the events lost, and
// the Publish calls made and slowed.
func slowLatency(b *testing.B, hedge bool) (lat []time.Duration, lost int, calls, slow int64) {
	pool := walDB(b)
	sink := newWALSink()
	pub := chaosPublisher{Publisher: sink, calls: &atomic.Int64{}, frac: *flagChaosSlow, delay: *flagChaosDelay, slow: &atomic.Int64{}, busy: &slowKeys{}}
	_, stop := walRelay(b, pool, pub, func(c *walrelay.Config) { c.Hedge = hedge })
	commits, returned := paced(b, pool, modeWAL, *flagWALLatFor, nil)
	deadline := time.Now().Add(time.Minute)
	for sink.count() < len(commits) && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	stop()
	sink.mu.Lock()
	defer sink.mu.Unlock()
	for id := range commits {
		got, ok := sink.recv[id]
		if !ok {
			lost++
			continue
		}
		lat = append(lat, max(got.Sub(returned[id]), 0))
	}
	return sortDurations(lat), lost, pub.calls.Load(), pub.slow.Load()
}

// paced commits -wal-rate transactions per second (UPDATE + event) for d
// across the clients and returns when each event's COMMIT was sent and
// when it returned.
func paced(b *testing.B, pool *pgxpool.Pool, m walMode, d time.Duration, notify func()) (sent, returned map[string]time.Time) {
	tw, ww := walWriters()
	ctx := context.Background()
	rate, clients := max(*flagWALRate, 1), max(*flagWALClients, 1)
	var mu sync.Mutex
	commits, back := map[string]time.Time{}, map[string]time.Time{}
	start := time.Now().Add(10 * time.Millisecond)
	end := start.Add(d)
	var wg sync.WaitGroup
	errc := make(chan error, clients)
	for c := range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for k := 0; ; k++ {
				seq := k*clients + c
				at := start.Add(time.Duration(seq) * time.Second / time.Duration(rate))
				if !at.Before(end) {
					return
				}
				time.Sleep(time.Until(at))
				id, now, err := writeTx(ctx, pool, m, tw, ww, seq%*flagWALKeys, seq)
				if err != nil {
					errc <- err
					return
				}
				done := time.Now()
				if notify != nil {
					notify()
				}
				if m != modeUpdate {
					mu.Lock()
					commits[id.String()] = now
					back[id.String()] = done
					mu.Unlock()
				}
			}
		}()
	}
	wg.Wait()
	close(errc)
	for err := range errc {
		b.Fatalf("paced writer: %v", err)
	}
	return commits, back
}

// retained measures the WAL a slot retains while no relay reads it, at
// -wal-rate events/s, in bytes per hour, and the WAL per event.
func retained(b *testing.B) (perHour, perEvent float64) {
	pool := walDB(b)
	r, stop := walRelay(b, pool, newWALSink()) // creates the slot
	stop()
	ctx := context.Background()
	before, err := walrelay.SlotStatus(ctx, pool, r.Slot())
	if err != nil {
		b.Fatal(err)
	}
	t0 := time.Now()
	commits, _ := paced(b, pool, modeWAL, *flagWALLatFor, nil)
	took := time.Since(t0)
	after, err := walrelay.SlotStatus(ctx, pool, r.Slot())
	if err != nil {
		b.Fatal(err)
	}
	grew := float64(after.LagBytes - before.LagBytes)
	return grew / took.Seconds() * 3600, grew / float64(len(commits))
}

func med(v []float64) float64 { m, _ := median(v); return m }

func BenchmarkWAL(b *testing.B) {
	if testing.Short() {
		b.Skip("heavy benchmark; not run with -short")
	}
	// The whole run with -durable's settings (durable_test.go): with the
	// test server's synchronous_commit off, WAL reaches the walsender only
	// when the WAL writer flushes it (wal_writer_delay, 200 ms), which
	// would be the WAL relay's latency.
	openServers(b).measure(b)
	// Writers: one database, the four modes in short slices, in rotating
	// order, so that load from outside the benchmark (a shared host) falls
	// on every mode alike; a round is one slice of each mode, and each
	// ratio is the median of the ratios within the rounds.
	writer := map[walMode][]float64{}
	b.Run("writer", func(b *testing.B) {
		for range b.N {
			pool := walDB(b)
			_, stop := walRelay(b, pool, newWALSink()) // the slot exists, as in production
			stop()
			modes := []walMode{modeUpdate, modeTable, modeWAL, modeLean}
			if *flagWALFloor {
				modes = append(modes, modeSelect1, modeWALv1)
			}
			saturate(b, pool, modeUpdate, *flagWALSlice, nil) // warm up
			for round := range max(*flagWALSlices, 1) {
				for i := range modes {
					m := modes[(i+round)%len(modes)]
					n, start := saturate(b, pool, m, *flagWALSlice, nil)
					writer[m] = append(writer[m], float64(n)/time.Since(start).Seconds())
				}
			}
			for _, m := range modes {
				b.ReportMetric(med(writer[m]), fmt.Sprintf("tx/s-mode%d", m))
			}
		}
	})
	e2e := map[bool][]float64{}
	e2eWriters := map[bool][]float64{}
	e2eDrain := map[bool][]float64{}
	for round := range max(*flagWALRounds, 1) {
		for _, wal := range []bool{round%2 == 1, round%2 == 0} {
			b.Run(fmt.Sprintf("round%d/e2e/wal=%v", round+1, wal), func(b *testing.B) {
				for range b.N {
					res := endToEnd(b, wal)
					e2e[wal] = append(e2e[wal], res.rate)
					e2eWriters[wal] = append(e2eWriters[wal], res.writers)
					e2eDrain[wal] = append(e2eDrain[wal], float64(res.drain.Microseconds())/1000)
					b.ReportMetric(res.rate, "events/s")
					b.ReportMetric(res.writers, "writer-tx/s")
					b.ReportMetric(float64(res.drain.Microseconds())/1000, "drain-ms")
				}
			})
		}
	}
	type lat struct {
		p50, p99, r50, r99 time.Duration
		lost               int
	}
	lats := map[bool]lat{}
	for _, wal := range []bool{false, true} {
		b.Run(fmt.Sprintf("latency/wal=%v", wal), func(b *testing.B) {
			for range b.N {
				p50, p99, r50, r99, lost := latency(b, wal)
				lats[wal] = lat{p50, p99, r50, r99, lost}
				b.ReportMetric(float64(p50.Microseconds())/1000, "p50-ms")
				b.ReportMetric(float64(p99.Microseconds())/1000, "p99-ms")
			}
		})
	}
	type slowRun struct {
		lat               []time.Duration
		lost              int
		calls, slow, over int64
	}
	slowRuns := map[bool]slowRun{}
	for _, hedge := range []bool{false, true} {
		b.Run(fmt.Sprintf("slow/hedge=%v", hedge), func(b *testing.B) {
			for range b.N {
				lat, lost, calls, slow := slowLatency(b, hedge)
				var over int64
				for _, d := range lat {
					if d > 100*time.Millisecond {
						over++
					}
				}
				slowRuns[hedge] = slowRun{lat, lost, calls, slow, over}
				b.ReportMetric(float64(percentile(lat, 0.99).Microseconds())/1000, "p99-ms")
				b.ReportMetric(float64(percentile(lat, 0.999).Microseconds())/1000, "p99.9-ms")
			}
		})
	}
	var perHour, perEvent float64
	b.Run("retained", func(b *testing.B) {
		for range b.N {
			perHour, perEvent = retained(b)
		}
	})

	ratios := func(num, den []float64) []float64 {
		var rs []float64
		for i := range min(len(num), len(den)) {
			rs = append(rs, num[i]/den[i])
		}
		sort.Float64s(rs)
		return rs
	}
	ratio := func(num, den []float64) float64 { return med(ratios(num, den)) }
	// span is the range of the per-round ratios.
	span := func(num, den []float64) string {
		rs := ratios(num, den)
		if len(rs) == 0 {
			return "no rounds"
		}
		return fmt.Sprintf("per-round %.2f× to %.2f×", rs[0], rs[len(rs)-1])
	}
	var sb strings.Builder
	fmt.Fprintf(&sb, "\n### WAL mode (issue 15): %d clients; writers %d rounds of %s slices; end to end %d rounds of %s (medians); %s; load %s\n\n",
		*flagWALClients, max(*flagWALSlices, 1), *flagWALSlice, max(*flagWALRounds, 1), *flagWALFor, cpuModel(), loadAvg())
	fmt.Fprintf(&sb, "| writer transaction | tx/s | vs UPDATE alone | vs table outbox |\n|---|---:|---:|---:|\n")
	for _, m := range []walMode{modeUpdate, modeTable, modeWAL, modeLean, modeSelect1, modeWALv1} {
		if len(writer[m]) == 0 {
			continue
		}
		fmt.Fprintf(&sb, "| %s | %s | %.2f× | %.2f× |\n", m, thousands(med(writer[m])), ratio(writer[m], writer[modeUpdate]), ratio(writer[m], writer[modeTable]))
	}
	fmt.Fprintf(&sb, "\nGoal WAL ≥ 1.15× table outbox: %.2f× (%s) %s\n\n", ratio(writer[modeWAL], writer[modeTable]), span(writer[modeWAL], writer[modeTable]), verdict(ratio(writer[modeWAL], writer[modeTable]) >= 1.15))
	fmt.Fprintf(&sb, "| end to end at saturation (writers + relay) | events/s | writers' own tx/s | drain after the writers stopped, ms |\n|---|---:|---:|---:|\n")
	fmt.Fprintf(&sb, "| polling relay (table outbox, pgxdriver, Notify) | %s | %s | %.0f |\n| WAL relay | %s | %s | %.0f |\n",
		thousands(med(e2e[false])), thousands(med(e2eWriters[false])), med(e2eDrain[false]),
		thousands(med(e2e[true])), thousands(med(e2eWriters[true])), med(e2eDrain[true]))
	fmt.Fprintf(&sb, "\nGoal WAL ≥ 1.3× polling: %.2f× (%s) %s\n\n", ratio(e2e[true], e2e[false]), span(e2e[true], e2e[false]), verdict(ratio(e2e[true], e2e[false]) >= 1.3))
	fmt.Fprintf(&sb, "| %d events/s, ms | COMMIT sent → published p50 | p99 | COMMIT returned → published p50 | p99 | lost |\n|---|---:|---:|---:|---:|---:|\n", *flagWALRate)
	for _, wal := range []bool{false, true} {
		l := lats[wal]
		name := map[bool]string{false: "polling relay (in-process Notify after commit)", true: "WAL relay"}[wal]
		fmt.Fprintf(&sb, "| %s | %s | %s | %s | %s | %d |\n", name, ms(l.p50), ms(l.p99), ms(l.r50), ms(l.r99), l.lost)
	}
	fmt.Fprintf(&sb, "\nGoal p99 < 5 ms: from COMMIT returned %s; from COMMIT sent (the commit's own fsync included) %s\n\n",
		verdict(lats[true].r99 < 5*time.Millisecond), verdict(lats[true].p99 < 5*time.Millisecond))
	if len(slowRuns) > 0 {
		fmt.Fprintf(&sb, "| WAL relay, %d events/s, %.1f %% of publishes take %s, COMMIT returned → published, ms | p50 | p99 | p99.9 | max | events over 100 ms | Publish calls (slowed) | lost |\n|---|---:|---:|---:|---:|---:|---:|---:|\n",
			*flagWALRate, *flagChaosSlow*100, *flagChaosDelay)
		for _, hedge := range []bool{false, true} {
			r, ok := slowRuns[hedge]
			if !ok {
				continue
			}
			name := map[bool]string{false: "without Hedge", true: "with Hedge (HedgeAfter default)"}[hedge]
			fmt.Fprintf(&sb, "| %s | %s | %s | %s | %s | %d of %d | %d (%d) | %d |\n", name, ms(percentile(r.lat, 0.5)), ms(percentile(r.lat, 0.99)),
				ms(percentile(r.lat, 0.999)), ms(percentile(r.lat, 1)), r.over, len(r.lat), r.calls, r.slow, r.lost)
		}
		fmt.Fprintln(&sb)
	}
	fmt.Fprintf(&sb, "Relay down, %d events/s (UPDATE + event each): the slot retains %.1f GiB of WAL per hour (%.0f bytes per transaction).\n",
		*flagWALRate, perHour/(1<<30), perEvent)
	fmt.Fprint(os.Stdout, sb.String())
}
