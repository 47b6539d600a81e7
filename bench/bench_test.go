package bench

import (
	"context"
	"database/sql"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"runtime"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"

	"github.com/outboxgen/outboxgen/internal/testdb"
	"github.com/outboxgen/outboxgen/runtime/outbox"
	"github.com/outboxgen/outboxgen/templates"
)

var (
	flagRounds  = flag.Int("rounds", 3, "run every scenario this many times, interleaved; the table shows medians (ratios: the median of the ratios within each round)")
	flagDurable = flag.Bool("durable", true, "measure with fsync/synchronous_commit/full_page_writes on (PostgreSQL) and innodb_flush_log_at_trx_commit=1 (MariaDB); false: the test servers' own settings")
	flagKeys    = flag.Int("keys", 1000, "distinct keys (biz_id) in a backlog, assigned round robin")
	flagPgx     = flag.Bool("pgx", true, "run the relay on PostgreSQL through pgxdriver (a pgx pool: a claim and the results it records are one round trip); false: sqldriver over database/sql")
	flagRows    = flag.Int("rows", 100_000, "row 1: PostgreSQL backlog")
	flagBigRows = flag.Int("bigrows", 1_000_000, "row 2: the big PostgreSQL backlog")
	flagBigPart = flag.Int("bigdrain", 200_000, "row 2: rows drained of the big backlog (0: all)")
	flagHeld    = flag.String("held", "5000,20000,50000", "row 3: pending rows held behind the FAILED heads (comma-separated)")
	flagMyRows  = flag.Int("myrows", 50_000, "row 5: MariaDB backlog")
	flagSlowRow = flag.Int("slowrows", 50_000, "row 6: backlog of the relay's 1 ms publish latency drains")
	flagWmSlow  = flag.Int("wmslowrows", 20_000, "row 6: backlog of watermill's 1 ms publish latency drain (it runs at ~750 rows/s)")
	flagScale   = flag.Int("scaleout", 4, "row 6: relay instances of the scale-out run")
	flagScaleK  = flag.Int("scalekeys", 100_000, "row 6: keys of the second scale-out backlog (0: none)")

	flagChaosFor      = flag.Duration("chaos-for", 10*time.Second, "row 4: how long the writers write")
	flagChaosRate     = flag.Int("chaos-rate", 0, "row 4: events/s of all writers together (0: as fast as they can)")
	flagChaosPerTx    = flag.Int("chaos-per-tx", 10, "row 4: events per writer transaction")
	flagChaosSlow     = flag.Float64("chaos-slow", 0.005, "row 4: fraction of slow publishes")
	flagChaosDelay    = flag.Duration("chaos-delay", 3*time.Second, "row 4: duration of a slow publish")
	flagChaosDrainMax = flag.Duration("chaos-drain-max", 20*time.Second, "row 4: longest wait for the drain after the writers stop (the rate is then measured over it)")

	flagTable = flag.String("table", "", "also write the markdown table to this file")

	flagFillfactor = flag.Int("pg-fillfactor", 0, "the fillfactor of the PostgreSQL outbox tables of BenchmarkOutbox, BenchmarkHeldBack and BenchmarkClaimBacklog (0: the DDL's, 100); see BenchmarkFillfactor")
)

const (
	topic    = "orders"
	fwdTopic = "forwarder_topic" // watermill forwarder's default topic
	slowBy   = time.Millisecond  // the stand-in broker round trip
	// drainable is row 3's number of rows of healthy keys.
	drainable = 10_000
)

var discard = slog.New(slog.DiscardHandler)

// step is one measurement of a round: it returns named values.
type step struct {
	group, name string
	run         func(b *testing.B) map[string]float64
}

func steps(srv *servers) []step {
	var out []step
	ceil := func(group, d string, c ceiling, n, limit int) step {
		return step{group, string(c), func(b *testing.B) map[string]float64 {
			k := group + "." + string(c)
			rate, cpu := runCeiling(b, srv, d, c, n, limit)
			out := map[string]float64{k: rate}
			cpu.values(k, out)
			return out
		}}
	}
	relayStep := func(group, name, d string, n int, rr relayRun) step {
		return step{group, name, func(b *testing.B) map[string]float64 {
			r := runRelay(b, srv, d, n, rr)
			k := group + "." + name
			out := map[string]float64{k: r.rate, k + ".claim_ms": r.claimMean, k + ".claim_max_ms": r.claimMax,
				k + ".claim_rows": r.rows, k + ".claim_asked": r.asked, k + ".claims": float64(r.claims), k + ".extends": float64(r.extends)}
			r.cpu.values(k, out)
			return out
		}}
	}
	wmStep := func(group, d string, n int, delay time.Duration) step {
		return step{group, "watermill", func(b *testing.B) map[string]float64 {
			k := group + ".watermill"
			rate, cpu := runWatermill(b, srv, d, n, delay)
			out := map[string]float64{k: rate}
			cpu.values(k, out)
			return out
		}}
	}
	// 1. PostgreSQL, -rows backlog, no publish latency.
	out = append(out,
		ceil("pg", "postgres", a1, *flagRows, 0),
		ceil("pg", "postgres", a2, *flagRows, 0),
		relayStep("pg", "relay", "postgres", *flagRows, relayRun{instances: 1}),
	)
	// 2. PostgreSQL, -bigrows backlog: the first -bigdrain rows.
	out = append(out,
		ceil("pgbig", "postgres", a1, *flagBigRows, *flagBigPart),
		ceil("pgbig", "postgres", a2, *flagBigRows, *flagBigPart),
		relayStep("pgbig", "relay", "postgres", *flagBigRows, relayRun{instances: 1, limit: *flagBigPart}),
	)
	// 3. Held-back keys.
	for _, h := range heldSizes() {
		out = append(out, step{"held", strconv.Itoa(h), func(b *testing.B) map[string]float64 {
			return map[string]float64{"held." + strconv.Itoa(h): drainHeldBack(b, srv, "postgres", drainable, h, false)}
		}})
	}
	// 4. Chaos.
	for _, run := range []struct {
		name        string
		slow, hedge bool
	}{{"clean", false, false}, {"slow", true, false}, {"hedged", true, true}} {
		name := run.name
		out = append(out, step{"chaos", name, func(b *testing.B) map[string]float64 {
			r := runChaos(b, srv, run.slow, run.hedge)
			p := "chaos." + name + "."
			drained := 0.0
			if r.drained {
				drained = 1
			}
			out := map[string]float64{p + "written": float64(r.written), p + "pending": float64(r.pendingAtEnd), p + "drain_s": r.drain.Seconds(),
				p + "rate": r.rate, p + "drained": drained, p + "slow_publishes": float64(r.slow),
				p + "delivered": float64(r.written-r.pendingAtEnd) / flagChaosFor.Seconds(), p + "tail_s": r.tail.Seconds(),
				p + "hedges": float64(r.hedges), p + "calls": float64(r.calls)}
			if r.chain > 0 {
				// A key had slow publishes to wait out after the writers
				// stopped: what per-key order allows (a round without one
				// has no bound: "—").
				out[p+"behind_slow"], out[p+"chain_s"] = float64(r.behindSlow), r.chain.Seconds()
				out[p+"rate_bound"] = float64(r.pendingAtEnd) / r.chain.Seconds()
			}
			return out
		}})
	}
	// 5. MariaDB, -myrows backlog.
	out = append(out,
		ceil("my", "mysql", a1, *flagMyRows, 0),
		ceil("my", "mysql", a2, *flagMyRows, 0),
		relayStep("my", "relay", "mysql", *flagMyRows, relayRun{instances: 1}),
		wmStep("my", "mysql", *flagMyRows, 0),
	)
	// 6. 1 ms publish latency, defaults.
	out = append(out,
		relayStep("pg1ms", "relay", "postgres", *flagSlowRow, relayRun{instances: 1, delay: slowBy}),
		relayStep("pg1ms", "relayN", "postgres", *flagSlowRow, relayRun{instances: max(*flagScale, 1), delay: slowBy}),
		// The same instances without publish latency: what they reach on
		// this machine at all.
		relayStep("pg1ms", "relayN0", "postgres", *flagSlowRow, relayRun{instances: max(*flagScale, 1)}),
		wmStep("pg1ms", "postgres", *flagWmSlow, slowBy),
	)
	if *flagScaleK > 0 {
		out = append(out,
			relayStep("pg1msK", "relay", "postgres", *flagSlowRow, relayRun{instances: 1, delay: slowBy, keys: *flagScaleK}),
			relayStep("pg1msK", "relayN", "postgres", *flagSlowRow, relayRun{instances: max(*flagScale, 1), delay: slowBy, keys: *flagScaleK}),
		)
	}
	return out
}

func heldSizes() []int {
	var out []int
	for _, f := range strings.Split(*flagHeld, ",") {
		if n, err := strconv.Atoi(strings.TrimSpace(f)); err == nil && n > 0 {
			out = append(out, n)
		}
	}
	return append([]int{0}, out...)
}

// interleave orders the steps of round r: groups in order, the steps of a
// group in order in even rounds and reversed in odd ones, so that no
// scenario always runs first on a warm or cold server.
func interleave(all []step, r int) []step {
	var out []step
	for i := 0; i < len(all); {
		j := i
		for j < len(all) && all[j].group == all[i].group {
			j++
		}
		g := append([]step(nil), all[i:j]...)
		if r%2 == 1 {
			for a, z := 0, len(g)-1; a < z; a, z = a+1, z-1 {
				g[a], g[z] = g[z], g[a]
			}
		}
		out = append(out, g...)
		i = j
	}
	return out
}

// BenchmarkOutbox measures every row of issue 12's table, -rounds times
// interleaved, and prints one markdown table. It is heavy (~15 min at the
// default flags): run it alone with -benchtime 1x.
func BenchmarkOutbox(b *testing.B) {
	if testing.Short() {
		b.Skip("heavy side-by-side benchmark; not run with -short")
	}
	srv := openServers(b)
	started, load := time.Now(), loadAvg()
	all := steps(srv)
	rounds := make([]map[string]float64, max(*flagRounds, 1))
	for r := range rounds {
		vals := map[string]float64{}
		rounds[r] = vals
		for _, st := range interleave(all, r) {
			b.Run(fmt.Sprintf("round%d/%s/%s", r+1, st.group, st.name), func(b *testing.B) {
				for range b.N {
					got := st.run(b)
					keys := make([]string, 0, len(got))
					for k, v := range got {
						vals[k] = v
						keys = append(keys, k)
					}
					sort.Strings(keys)
					for _, k := range keys {
						b.ReportMetric(got[k], k)
					}
				}
			})
		}
	}
	pgDesc, myDesc := srv.describe(b)
	srv.restore(b)
	table := scaleTable(rounds, started, time.Since(started), load, pgDesc, myDesc)
	fmt.Println()
	fmt.Println(table)
	if *flagTable != "" {
		if err := os.WriteFile(*flagTable, []byte(table), 0o644); err != nil {
			b.Errorf("write -table: %v", err)
		}
	}
}

// ---------------------------------------------------------------------------
// Shared pieces.

// freshOutbox returns a fresh database of dialect d with outboxgen's
// schema.
func freshOutbox(b *testing.B, d string) *sql.DB {
	b.Helper()
	db := testdb.Open(b, d)
	testdb.ApplySchema(b, db, d, templates.DefaultTables)
	if *flagFillfactor != 0 && d == "postgres" {
		setFillfactor(b, db, *flagFillfactor)
	}
	return db
}

// fillBacklog inserts n pending events of -keys keys (round robin) in one
// statement, then refreshes the statistics, so that every drain starts
// from the same state.
func fillBacklog(b *testing.B, db *sql.DB, d string, n int) {
	b.Helper()
	k := max(*flagKeys, 1)
	insertRows(b, db, d, n, func(g string) string { return concat(d, "order-", fmt.Sprintf("%s %% %d", g, k)) })
	analyze(b, db, d)
}

// payloadJSON is the ~60-byte JSON payload every scenario moves (insertRows
// builds the same in SQL).
func payloadJSON(i int) []byte {
	return fmt.Appendf(nil, `{"order_id":"order-%d","amount":%d,"currency":"EUR"}`, i, i%1000)
}

// withKeys makes the backlogs filled until the returned function runs
// have k keys (it sets -keys back).
func withKeys(k int) func() {
	old := *flagKeys
	*flagKeys = k
	return func() { *flagKeys = old }
}

func keyOf(i int) string { return fmt.Sprintf("order-%d", i%max(*flagKeys, 1)) }

func pending(b *testing.B, db *sql.DB) int {
	var n int
	if err := db.QueryRow("SELECT count(*) FROM outbox_event WHERE status = 0").Scan(&n); err != nil {
		b.Fatalf("count pending: %v", err)
	}
	return n
}

// waitDrained polls until no row is pending (the relay marks a batch sent
// right after publishing it, so this returns within one mark statement of
// the last receipt).
func waitDrained(b *testing.B, db *sql.DB, timeout time.Duration) {
	deadline := time.Now().Add(timeout)
	for pending(b, db) > 0 {
		if time.Now().After(deadline) {
			b.Fatalf("still %d pending after %s", pending(b, db), timeout)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// sink is the in-process broker every scenario publishes to: a watermill
// GoChannel that never blocks the publisher (buffer larger than the
// backlog), and one subscriber that acks, counts unique UUIDs and records
// receive times.
type sink struct {
	pub  *gochannel.GoChannel
	want int
	done chan struct{}

	mu    sync.Mutex
	recv  map[string]time.Time
	dups  int
	first time.Time
	last  time.Time
	// lastOf is when the last new message of each key (its outbox_key)
	// arrived: a drain's per-key progress without querying the database
	// it would slow.
	lastOf map[string]time.Time
}

func newSink(b *testing.B, want int) *sink {
	b.Helper()
	s := &sink{
		pub:    gochannel.NewGoChannel(gochannel.Config{OutputChannelBuffer: int64(want) + 4096, BlockPublishUntilSubscriberAck: false}, watermill.NopLogger{}),
		want:   want,
		done:   make(chan struct{}),
		recv:   make(map[string]time.Time, want),
		lastOf: make(map[string]time.Time),
	}
	ctx, cancel := context.WithCancel(context.Background())
	ch, err := s.pub.Subscribe(ctx, topic)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { cancel(); s.pub.Close() })
	go func() {
		for m := range ch {
			now := time.Now()
			m.Ack()
			s.mu.Lock()
			if _, dup := s.recv[m.UUID]; dup {
				s.dups++
			} else {
				s.recv[m.UUID] = now
				if len(s.recv) == 1 {
					s.first = now
				}
				s.last = now
				s.lastOf[m.Metadata.Get(outbox.MetadataKey)] = now
				if len(s.recv) == s.want {
					close(s.done)
				}
			}
			s.mu.Unlock()
		}
	}()
	return s
}

func (s *sink) received() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.recv)
}

func (s *sink) wait(b *testing.B, timeout time.Duration) {
	b.Helper()
	select {
	case <-s.done:
	case <-time.After(timeout):
		b.Fatalf("sink got %d of %d messages in %s", s.received(), s.want, timeout)
	}
}

// slowPublisher adds a fixed delay to every Publish call: a stand-in for a
// broker round trip. The delay is outside the GoChannel's per-topic lock,
// so concurrent publishes overlap as they would on a real broker.
type slowPublisher struct {
	message.Publisher
	delay time.Duration
}

func (p slowPublisher) Publish(topic string, msgs ...*message.Message) error {
	time.Sleep(p.delay)
	return p.Publisher.Publish(topic, msgs...)
}

// background runs each of runs (a relay's or a forwarder's Run) on a
// goroutine of its own until stop, which ends their context and fails b
// if one returned an error; start is when they were started.
func background(b *testing.B, what string, runs ...func(context.Context) error) (start time.Time, stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	errs := make(chan error, len(runs))
	start = time.Now()
	for _, run := range runs {
		go func() { errs <- run(ctx) }()
	}
	return start, func() {
		cancel()
		for range runs {
			if err := <-errs; err != nil {
				b.Fatalf("%s Run: %v", what, err)
			}
		}
	}
}

// publisher returns the sink's publisher, each Publish delayed by delay
// first when it is not 0.
func (s *sink) publisher(delay time.Duration) message.Publisher {
	if delay > 0 {
		return slowPublisher{Publisher: s.pub, delay: delay}
	}
	return s.pub
}

func percentile(sorted []time.Duration, p float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	i := int(float64(len(sorted)-1) * p)
	return sorted[i]
}

func sortDurations(d []time.Duration) []time.Duration {
	sort.Slice(d, func(i, j int) bool { return d[i] < d[j] })
	return d
}

func ms(d time.Duration) string {
	return fmt.Sprintf("%.1f", float64(d.Microseconds())/1000)
}

func cpuModel() string {
	data, err := os.ReadFile("/proc/cpuinfo")
	if err != nil {
		return runtime.GOARCH
	}
	for _, line := range strings.Split(string(data), "\n") {
		if strings.HasPrefix(line, "model name") {
			if _, v, ok := strings.Cut(line, ":"); ok {
				return strings.TrimSpace(v)
			}
		}
	}
	return runtime.GOARCH
}

// revision names the code measured: the commit, and whether runtime/ had
// uncommitted changes.
func revision() string {
	out, err := exec.Command("git", "rev-parse", "--short", "HEAD").Output()
	if err != nil {
		return "unknown revision"
	}
	rev := strings.TrimSpace(string(out))
	if st, err := exec.Command("git", "status", "--porcelain", "--", "../runtime").Output(); err == nil && len(strings.TrimSpace(string(st))) > 0 {
		rev += " + uncommitted changes in runtime/"
	}
	return rev
}

func verdict(ok bool) string {
	if ok {
		return "met"
	}
	return "**missed**"
}

// ---------------------------------------------------------------------------
// The table.

func median(v []float64) (float64, bool) {
	if len(v) == 0 {
		return 0, false
	}
	s := append([]float64(nil), v...)
	sort.Float64s(s)
	if len(s)%2 == 1 {
		return s[len(s)/2], true
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2, true
}

type results []map[string]float64

// med is the median of a value over the rounds that measured it.
func (rs results) med(k string) (float64, bool) {
	var v []float64
	for _, r := range rs {
		if x, ok := r[k]; ok {
			v = append(v, x)
		}
	}
	return median(v)
}

// ratios are num/den of every round that measured both.
func (rs results) ratios(num, den string) []float64 {
	var v []float64
	for _, r := range rs {
		n, ok1 := r[num]
		d, ok2 := r[den]
		if ok1 && ok2 && d > 0 {
			v = append(v, n/d)
		}
	}
	return v
}

// ratio is the median over the rounds of num/den, each measured in the
// same round.
func (rs results) ratio(num, den string) (float64, bool) {
	return median(rs.ratios(num, den))
}

func (rs results) rate(k string) string {
	if v, ok := rs.med(k); ok {
		return fmt.Sprintf("%s rows/s", thousands(v))
	}
	return "—"
}

// x is the median ratio, with the range over the rounds.
func (rs results) x(num, den string) string {
	v := rs.ratios(num, den)
	m, ok := median(v)
	if !ok {
		return "—"
	}
	if len(v) == 1 {
		return fmt.Sprintf("%.2f×", m)
	}
	return fmt.Sprintf("%.2f× [%.2f–%.2f]", m, slices.Min(v), slices.Max(v))
}

// check returns the verdict of num/den ≥ want (≤ want if atMost).
func (rs results) check(num, den string, want float64, atMost bool) string {
	v, ok := rs.ratio(num, den)
	if !ok {
		return "—"
	}
	if atMost {
		return verdict(v <= want)
	}
	return verdict(v >= want)
}

func thousands(v float64) string {
	switch {
	case v >= 10_000:
		return fmt.Sprintf("%.1fk", v/1000)
	case v >= 1000:
		return fmt.Sprintf("%.2fk", v/1000)
	}
	return fmt.Sprintf("%.0f", v)
}

func count(n int) string {
	switch {
	case n >= 1_000_000 && n%1_000_000 == 0:
		return fmt.Sprintf("%dM", n/1_000_000)
	case n >= 1000 && n%1000 == 0:
		return fmt.Sprintf("%dk", n/1000)
	}
	return strconv.Itoa(n)
}

func joinVerdicts(vs ...string) string {
	var out []string
	for _, v := range vs {
		if v != "—" {
			out = append(out, v)
		}
	}
	if len(out) == 0 {
		return "—"
	}
	return strings.Join(out, ", ")
}

// loadAvg returns the 1-minute load average, or "?".
func loadAvg() string {
	data, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "?"
	}
	return strings.Fields(string(data))[0]
}

func scaleTable(rs results, started time.Time, took time.Duration, load, pgDesc, myDesc string) string {
	var sb strings.Builder
	w := func(format string, args ...any) { fmt.Fprintf(&sb, format, args...) }
	w("### Relay benchmark (`make bench`, %s, %s)\n\n", started.UTC().Format("2006-01-02"), revision())
	w("%d CPU (%s), %s/%s, %s. Servers on the same machine: %s; %s. ", runtime.NumCPU(), cpuModel(), runtime.GOOS, runtime.GOARCH, runtime.Version(), pgDesc, myDesc)
	if *flagDurable {
		w("Those settings hold during the measured phases only (fills run with the test servers' fsync=off / innodb_flush_log_at_trx_commit=0). ")
	}
	w("Medians of %d interleaved rounds; every ratio is the median of the ratios measured within each round, [lowest–highest] of the rounds after it (took %s; load average %s at the start, %s at the end). ", len(rs), took.Round(time.Second), load, loadAvg())
	pgDriver := "sqldriver (database/sql, pgx stdlib)"
	if *flagPgx {
		pgDriver = "pgxdriver (a pgx pool)"
	}
	w("Backlogs: %d keys round robin, ~60-byte JSON payloads; the relay runs with its defaults (BatchSize 100, Concurrency 8), on PostgreSQL through %s, and publishes to a watermill GoChannel. ", max(*flagKeys, 1), pgDriver)
	if *flagFillfactor != 0 {
		w("The PostgreSQL outbox tables have fillfactor %d (-pg-fillfactor; the DDL's is 100). ", *flagFillfactor)
	}
	w("Ceilings, one client, batches of 100, nothing published, reading the columns the relay reads: **a1** one transaction per batch (SELECT … FOR UPDATE SKIP LOCKED, UPDATE to sent, COMMIT); **a2** a lease (PostgreSQL: UPDATE … WHERE id IN (SELECT … SKIP LOCKED) RETURNING; MariaDB, which has no UPDATE … RETURNING: SELECT … FOR UPDATE SKIP LOCKED + the lease UPDATE in one transaction), then a mark-sent UPDATE: two commits.\n\n")

	w("| # | scenario | outboxgen relay | a1 | a2 | result (ratios within a round) | wanted | verdict |\n")
	w("|---|---|---:|---:|---:|---|---|---|\n")

	claim := func(k string) string {
		if v, ok := rs.med(k); ok {
			return fmt.Sprintf("%.1f ms", v)
		}
		return "—"
	}
	// cpu says what the drains of group cost per row (cpuMeter).
	cpu := func(group string, names ...string) string {
		var parts []string
		for _, name := range names {
			k := group + "." + name
			own, ok := rs.med(k + ".cpu_own_us")
			if !ok {
				continue
			}
			part := fmt.Sprintf("%s %.0f", name, own)
			if rest, ok := rs.med(k + ".cpu_rest_us"); ok {
				busy, _ := rs.med(k + ".busy_cores")
				part += fmt.Sprintf(" + %.0f (%.1f cores busy)", rest, busy)
			}
			parts = append(parts, part)
		}
		if len(parts) == 0 {
			return ""
		}
		return "; CPU µs/row, process + rest of machine: " + strings.Join(parts, ", ")
	}
	// 1.
	w("| 1 | PostgreSQL %s backlog, no publish latency | %s (claim %s/batch) | %s | %s | %s a2, %s a1%s | ≥ 0.9× a2 and ≥ 0.6× a1 | %s |\n",
		count(*flagRows), rs.rate("pg.relay"), claim("pg.relay.claim_ms"), rs.rate("pg.a1"), rs.rate("pg.a2"),
		rs.x("pg.relay", "pg.a2"), rs.x("pg.relay", "pg.a1"), cpu("pg", "relay", "a2", "a1"), joinVerdicts(rs.check("pg.relay", "pg.a2", 0.9, false), rs.check("pg.relay", "pg.a1", 0.6, false)))
	// 2.
	part := ""
	if *flagBigPart > 0 && *flagBigPart < *flagBigRows {
		part = fmt.Sprintf(" (rate over its first %s rows)", count(*flagBigPart))
	}
	claimMax := "—"
	if v, ok := rs.med("pgbig.relay.claim_max_ms"); ok {
		claimMax = fmt.Sprintf("%.0f ms", v)
	}
	w("| 2 | PostgreSQL %s backlog%s | %s | %s | %s | %s a2 (%s a1); relay claim %s/batch at %s vs %s at %s = %s (slowest claim %s)%s | ≥ 0.85× a2; claim cost flat (taken as ≤ 1.2×) | %s |\n",
		count(*flagBigRows), part, rs.rate("pgbig.relay"), rs.rate("pgbig.a1"), rs.rate("pgbig.a2"),
		rs.x("pgbig.relay", "pgbig.a2"), rs.x("pgbig.relay", "pgbig.a1"),
		claim("pgbig.relay.claim_ms"), count(*flagBigRows), claim("pg.relay.claim_ms"), count(*flagRows), rs.x("pgbig.relay.claim_ms", "pg.relay.claim_ms"), claimMax,
		cpu("pgbig", "relay", "a2", "a1"), joinVerdicts(rs.check("pgbig.relay", "pgbig.a2", 0.85, false), rs.check("pgbig.relay.claim_ms", "pg.relay.claim_ms", 1.2, true)))
	// 3.
	sizes := heldSizes()
	last := sizes[len(sizes)-1]
	for _, h := range sizes[1:] {
		k := "held." + strconv.Itoa(h)
		wanted, ver := "(≥ 0.9× clean at the largest H)", "—"
		if h == last {
			wanted, ver = "≥ 0.9× clean", rs.check(k, "held.0", 0.9, false)
		}
		w("| 3 | %s drainable rows + H = %s pending rows held behind 500 FAILED heads (PostgreSQL) | %s | (row 1) | (row 1) | %s clean (%s) | %s | %s |\n",
			count(drainable), count(h), rs.rate(k), rs.x(k, "held.0"), rs.rate("held.0"), wanted, ver)
	}
	// 4.
	rate := "as fast as they can"
	if *flagChaosRate > 0 {
		rate = fmt.Sprintf("%d events/s", *flagChaosRate)
	}
	pend := func(k string) string {
		if v, ok := rs.med(k); ok {
			return strconv.Itoa(int(v))
		}
		return "—"
	}
	drainS := func(p string) string {
		v, ok := rs.med(p + "drain_s")
		if !ok {
			return "—"
		}
		s := fmt.Sprintf("%.1f s", v)
		if v < 1 {
			s = fmt.Sprintf("%.2f s", v) // drains of a few hundred rows
		}
		if d, _ := rs.med(p + "drained"); d < 1 {
			s = "> " + s + " (cap)"
		}
		return s
	}
	chain, tail := "—", "—"
	if v, ok := rs.med("chaos.slow.chain_s"); ok {
		chain = fmt.Sprintf("%.1f s", v)
	}
	if v, ok := rs.med("chaos.slow.tail_s"); ok {
		tail = fmt.Sprintf("%.2f s", v)
	}
	w("| 4 | %.1f %% of publishes take %s (PostgreSQL; %d relays, PollInterval 100 ms; %d writers, %d events/tx, %s, for %s, then stop) | %s rows written (%s without), %s pending at writer stop (%s without; %s of them behind a slow publish of their key), drain %s (%s without) | (row 1) | (row 1) | drain rate %s vs %s without = %s (per-key order allows at most %s = %s, reached here at %s: one key still had %s of slow publishes to wait out after the writers stopped; the drain ended %s after the last slow publish returned); delivered while the writers write %s vs %s without = %s | drain rate ≥ 0.8× the run without slow publishes | %s (delivered: %s) |\n",
		*flagChaosSlow*100, *flagChaosDelay, chaosRelays, chaosWriters, max(*flagChaosPerTx, 1), rate, *flagChaosFor,
		pend("chaos.slow.written"), pend("chaos.clean.written"), pend("chaos.slow.pending"), pend("chaos.clean.pending"), pend("chaos.slow.behind_slow"), drainS("chaos.slow."), drainS("chaos.clean."),
		rs.rate("chaos.slow.rate"), rs.rate("chaos.clean.rate"), rs.x("chaos.slow.rate", "chaos.clean.rate"),
		rs.rate("chaos.slow.rate_bound"), rs.x("chaos.slow.rate_bound", "chaos.clean.rate"), rs.x("chaos.slow.rate", "chaos.slow.rate_bound"), chain, tail,
		rs.rate("chaos.slow.delivered"), rs.rate("chaos.clean.delivered"), rs.x("chaos.slow.delivered", "chaos.clean.delivered"),
		rs.check("chaos.slow.rate", "chaos.clean.rate", 0.8, false), rs.check("chaos.slow.delivered", "chaos.clean.delivered", 0.8, false))
	share := "—"
	if h, ok := rs.med("chaos.hedged.hedges"); ok {
		if c, ok := rs.med("chaos.hedged.calls"); ok && c > 0 {
			share = fmt.Sprintf("%d hedges = %.2f %% of %d Publish calls", int(h), 100*h/c, int(c))
		}
	}
	w("| 4h | the same, relays with Hedge (HedgeAfter default: 8× the typical publish, 2 ms to 250 ms) | %s rows written, %s pending at writer stop, drain %s (%s without slow publishes); %s | (row 1) | (row 1) | drain rate %s vs %s without slow publishes = %s; delivered while the writers write %s = %s | drain rate ≥ 0.8× the run without slow publishes | %s (delivered: %s) |\n",
		pend("chaos.hedged.written"), pend("chaos.hedged.pending"), drainS("chaos.hedged."), drainS("chaos.clean."), share,
		rs.rate("chaos.hedged.rate"), rs.rate("chaos.clean.rate"), rs.x("chaos.hedged.rate", "chaos.clean.rate"),
		rs.rate("chaos.hedged.delivered"), rs.x("chaos.hedged.delivered", "chaos.clean.delivered"),
		rs.check("chaos.hedged.rate", "chaos.clean.rate", 0.8, false), rs.check("chaos.hedged.delivered", "chaos.clean.delivered", 0.8, false))
	// 5.
	w("| 5 | MariaDB %s backlog, no publish latency | %s | %s | %s | %s a2 (%s a1), %s watermill Forwarder (%s)%s | ≥ 0.85× a2, ≥ 2× watermill | %s |\n",
		count(*flagMyRows), rs.rate("my.relay"), rs.rate("my.a1"), rs.rate("my.a2"),
		rs.x("my.relay", "my.a2"), rs.x("my.relay", "my.a1"), rs.x("my.relay", "my.watermill"), rs.rate("my.watermill"),
		cpu("my", "relay", "a2", "a1", "watermill"), joinVerdicts(rs.check("my.relay", "my.a2", 0.85, false), rs.check("my.relay", "my.watermill", 2, false)))
	// 6.
	n := max(*flagScale, 1)
	w("| 6 | 1 ms publish latency, defaults (PostgreSQL %s backlog; watermill's %s): relay vs watermill Forwarder | %s | (row 1) | (row 1) | %s watermill (%s) | keep ≥ 5× | %s |\n",
		count(*flagSlowRow), count(*flagWmSlow), rs.rate("pg1ms.relay"), rs.x("pg1ms.relay", "pg1ms.watermill"), rs.rate("pg1ms.watermill"),
		rs.check("pg1ms.relay", "pg1ms.watermill", 5, false))
	w("| 6 | same, scale-out: %d relay instances vs 1 | %s | (row 1) | (row 1) | %s one instance; %s the same %d instances without publish latency (%s) | ≥ 3.5× | %s |\n",
		n, rs.rate("pg1ms.relayN"), rs.x("pg1ms.relayN", "pg1ms.relay"), rs.x("pg1ms.relayN", "pg1ms.relayN0"), n, rs.rate("pg1ms.relayN0"),
		rs.check("pg1ms.relayN", "pg1ms.relay", 3.5, false))
	if *flagScaleK > 0 {
		w("| 6 | same, scale-out over a backlog of %s keys: %d relay instances vs 1 (%s) | %s | (row 1) | (row 1) | %s one instance | (≥ 3.5×) | %s |\n",
			count(*flagScaleK), n, rs.rate("pg1msK.relay"), rs.rate("pg1msK.relayN"), rs.x("pg1msK.relayN", "pg1msK.relay"),
			rs.check("pg1msK.relayN", "pg1msK.relay", 3.5, false))
	}

	w("\nClaim times are the relay's own driver.Claim calls that leased rows, timed around the driver (mean per call over the drain; a Claim that also records earlier results, ClaimParams.Record, counts whole; row 1 drains %s → 0 pending rows, row 2 %s → %s). ",
		count(*flagRows), count(*flagBigRows), count(*flagBigRows-min(*flagBigPart, *flagBigRows)))
	w("CPU µs/row (rows 1, 2 and 5): CPU time per row drained, of this process (the relay or the ceiling's client, the in-process GoChannel broker the relay publishes to and the sink that counts the messages; for watermill, its Forwarder and subscriber) and of the rest of the machine (mostly the database servers, also the kernel's network work and the servers' background work), from getrusage and /proc/stat over the drain; \"cores busy\" is the whole machine's average; each is a median of its own, so the three may come from different rounds. Both parts share the %d cores, so a relay that costs more per row in either drains slower even when neither waits for the other. ", runtime.NumCPU())
	w("Row 3: a relay ran over the H rows first (as it would have since the heads failed), then drains %s new rows of 1,000 other keys; clean = H = 0. ", count(drainable))
	w("Row 4: drain rate = rows sent after the writers stopped / time until none is pending (at most %s); delivered = (rows written − rows pending when the writers stop) / the writing time, the rate the relays kept up with while slow publishes happened. The drain cannot be fast with slow publishes: a key whose next publish takes %s waits that long, so the fewer rows the relays left behind, the lower the drain rate; \"at most\" is every row pending at writer stop over the longest time one key had to wait out slow publishes after the stop: the rest of its slow publish under way then, plus each of its publishes that turned slow later (per-key order runs them one after the other, so no relay that keeps it drains sooner given those slow publishes; fast publishes counted as taking no time). ", *flagChaosDrainMax, *flagChaosDelay)
	w("Row 6: the %d instances are relay.Relay values in one process with distinct InstanceIDs, each with its own driver on one connection pool; every Publish sleeps 1 ms first; \"without publish latency\" is the same instances, backlog and machine with Publish not sleeping, the most they reach here. ", n)
	w("\"(row 1)\": the ceilings of those PostgreSQL rows are row 1's.\n")
	return sb.String()
}
