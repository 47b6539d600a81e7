package bench

import (
	"context"
	"database/sql"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"runtime"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"

	"github.com/outboxgen/outboxgen/internal/testdb"
	"github.com/outboxgen/outboxgen/templates"
)

var (
	flagRows       = flag.Int("rows", 100_000, "backlog size of the drain scenarios (a), (b), (c)")
	flagSlowRows   = flag.Int("slowrows", 0, "backlog size of the drain scenarios with 1 ms publish latency (0: -rows)")
	flagKeys       = flag.Int("keys", 1000, "distinct keys (biz_id) in the backlog, assigned round robin")
	flagRounds     = flag.Int("rounds", 1, "run every scenario this many times, interleaved; the table shows the median")
	flagRate       = flag.Int("rate", 1000, "scenario (d): events per second the writers commit")
	flagWriters    = flag.Int("writers", 16, "scenario (d): writer goroutines")
	flagLatencyFor = flag.Duration("latency-for", 12*time.Second, "scenario (d): how long the writers run per mode")
	flagTable      = flag.String("table", "", "also write the markdown table to this file")
)

const (
	topic    = "orders"
	fwdTopic = "forwarder_topic" // watermill forwarder's default topic
	slowBy   = time.Millisecond  // the stand-in broker round trip
)

var discard = slog.New(slog.DiscardHandler)

// BenchmarkOutbox runs every scenario side by side and prints the table.
// It is heavy (minutes): run it alone with -benchtime 1x (each
// sub-benchmark runs its scenario b.N times on fresh databases).
func BenchmarkOutbox(b *testing.B) {
	if testing.Short() {
		b.Skip("heavy side-by-side benchmark; not run with -short")
	}
	rep := newReport()
	for round := range max(*flagRounds, 1) {
		_ = round
		for _, sc := range drainScenarios() {
			b.Run(sc.name, func(b *testing.B) {
				for range b.N {
					res := sc.run(b, sc.rows())
					res.scenario = sc
					rep.addDrain(res)
					b.ReportMetric(res.rate(), "rows/s")
				}
			})
		}
		for _, m := range latencyModes() {
			b.Run("d_latency_"+m.name, func(b *testing.B) {
				for range b.N {
					res := runLatency(b, m)
					rep.addLatency(res)
					b.ReportMetric(float64(res.pubP50.Microseconds())/1000, "p50-ms")
					b.ReportMetric(float64(res.pubP99.Microseconds())/1000, "p99-ms")
					b.ReportMetric(res.txPerSec, "writer-tx/s")
				}
			})
		}
	}
	table := rep.markdown(b)
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

// freshOutbox returns a fresh PostgreSQL database with outboxgen's schema.
func freshOutbox(b *testing.B) *sql.DB {
	b.Helper()
	db := testdb.Open(b, "postgres")
	testdb.ApplySchema(b, db, "postgres", templates.DefaultTables)
	return db
}

// payloadSQL and payloadJSON build the same ~60-byte JSON payload in SQL and
// in Go, so every scenario moves the same bytes.
const payloadSQL = `json_build_object('order_id', 'order-' || g, 'amount', g % 1000, 'currency', 'EUR')::json`

func payloadJSON(i int) []byte {
	return fmt.Appendf(nil, `{"order_id":"order-%d","amount":%d,"currency":"EUR"}`, i, i%1000)
}

func keyOf(i int) string { return fmt.Sprintf("order-%d", i%max(*flagKeys, 1)) }

// fillOutbox inserts n pending events into outbox_event in one statement
// (the fill is not measured), then VACUUM ANALYZE so every drain starts
// from the same state.
func fillOutbox(b *testing.B, db *sql.DB, n int) {
	b.Helper()
	ctx := context.Background()
	q := `INSERT INTO outbox_event (event_id, biz_type, biz_id, topic, payload_version, payload)
		SELECT gen_random_uuid(), 'ORDER_PAID', 'order-' || (g % $2), $3, 1, ` + payloadSQL + `
		FROM generate_series(1, $1) g`
	if _, err := db.ExecContext(ctx, q, n, max(*flagKeys, 1), topic); err != nil {
		b.Fatalf("fill outbox: %v", err)
	}
	if _, err := db.ExecContext(ctx, "VACUUM ANALYZE outbox_event"); err != nil {
		b.Fatalf("vacuum: %v", err)
	}
}

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
}

func newSink(b *testing.B, want int) *sink {
	b.Helper()
	s := &sink{
		pub:  gochannel.NewGoChannel(gochannel.Config{OutputChannelBuffer: int64(want) + 4096, BlockPublishUntilSubscriberAck: false}, watermill.NopLogger{}),
		want: want,
		done: make(chan struct{}),
		recv: make(map[string]time.Time, want),
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

// ---------------------------------------------------------------------------
// Report.

type report struct {
	mu      sync.Mutex
	drains  map[string][]drainResult // by scenario name
	order   []string
	lat     map[string][]latencyResult
	latOrd  []string
	pgVer   string
	started time.Time
}

func newReport() *report {
	return &report{drains: map[string][]drainResult{}, lat: map[string][]latencyResult{}, started: time.Now()}
}

func (r *report) addDrain(res drainResult) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if _, ok := r.drains[res.scenario.name]; !ok {
		r.order = append(r.order, res.scenario.name)
	}
	r.drains[res.scenario.name] = append(r.drains[res.scenario.name], res)
	if res.pgVersion != "" {
		r.pgVer = res.pgVersion
	}
}

func (r *report) addLatency(res latencyResult) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if _, ok := r.lat[res.mode.name]; !ok {
		r.latOrd = append(r.latOrd, res.mode.name)
	}
	r.lat[res.mode.name] = append(r.lat[res.mode.name], res)
}

// median returns the run with the median rate.
func medianDrain(rs []drainResult) drainResult {
	s := append([]drainResult(nil), rs...)
	sort.Slice(s, func(i, j int) bool { return s[i].rate() < s[j].rate() })
	return s[len(s)/2]
}

func medianLatency(rs []latencyResult) latencyResult {
	s := append([]latencyResult(nil), rs...)
	sort.Slice(s, func(i, j int) bool { return s[i].pubP50 < s[j].pubP50 })
	return s[len(s)/2]
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

func (r *report) markdown(b *testing.B) string {
	var sb strings.Builder
	w := func(format string, args ...any) { fmt.Fprintf(&sb, format, args...) }
	rounds := max(*flagRounds, 1)
	w("### Benchmark (`make bench`, %s)\n\n", r.started.UTC().Format("2006-01-02"))
	w("Machine: %d CPU (%s), %s/%s, %s; %s on the same machine (scripts/testdb.sh: fsync=off, synchronous_commit=off). Shared, noisy machine: compare ratios, not absolutes.",
		runtime.NumCPU(), cpuModel(), runtime.GOOS, runtime.GOARCH, runtime.Version(), r.pgVer)
	if rounds > 1 {
		w(" Each figure is the median of %d interleaved rounds.", rounds)
	}
	w("\n\n")

	get := func(name string) (drainResult, bool) {
		rs := r.drains[name]
		if len(rs) == 0 {
			return drainResult{}, false
		}
		return medianDrain(rs), true
	}
	raw, haveRaw := get(rawName)
	best := func(group string) (drainResult, bool) {
		var out drainResult
		found := false
		for _, name := range r.order {
			d, _ := get(name)
			if d.scenario.group == group && (!found || d.rate() > out.rate()) {
				out, found = d, true
			}
		}
		return out, found
	}
	wm, haveWM := get(wmName)
	wmSlow, haveWMSlow := get(wmSlowName)

	if len(r.order) > 0 {
		w("Drain a backlog of pending events (%d keys round robin, ~60-byte JSON payloads) to a watermill GoChannel:\n\n", max(*flagKeys, 1))
		w("| Scenario | Settings | Rows | Time (s) | Rows/s | vs (a) | vs (c), same latency |\n")
		w("|---|---|---:|---:|---:|---:|---:|\n")
		for _, name := range r.order {
			d, _ := get(name)
			vsA, vsC := "", ""
			if haveRaw && name != rawName {
				vsA = fmt.Sprintf("%.2f×", d.rate()/raw.rate())
			}
			switch d.scenario.group {
			case groupRelay, groupRaw:
				if haveWM {
					vsC = fmt.Sprintf("%.2f×", d.rate()/wm.rate())
				}
			case groupRelaySlow:
				if haveWMSlow {
					vsC = fmt.Sprintf("%.2f×", d.rate()/wmSlow.rate())
				}
			}
			w("| %s | %s | %d | %.2f | %.0f | %s | %s |\n", d.scenario.title, d.scenario.settings, d.rows, d.dur.Seconds(), d.rate(), vsA, vsC)
		}
		w("\n")
		if bb, ok := best(groupRelay); ok && haveRaw {
			w("- Target (b) ≥ 0.6× (a): best relay run (%s) = **%.2f×** (a) → %s.\n", bb.scenario.settings, bb.rate()/raw.rate(), verdict(bb.rate()/raw.rate() >= 0.6))
		}
		if bb, ok := best(groupRelaySlow); ok && haveWMSlow {
			w("- Target at 1 ms publish latency, relay ≥ 3× (c): best relay run (%s) = **%.1f×** (c) → %s.\n", bb.scenario.settings, bb.rate()/wmSlow.rate(), verdict(bb.rate()/wmSlow.rate() >= 3))
		}
		if d, ok := get("a_relaysql_b100_c1"); ok && haveRaw {
			w("- The relay's own claim+mark SQL with no publishing (a') = %.2f× (a): the SQL share of the gap.\n", d.rate()/raw.rate())
		}
		if d, ok := get(relayDefaultName); ok && haveRaw {
			w("- Relay with default options (BatchSize 100, Concurrency 8): %.2f× (a).\n", d.rate()/raw.rate())
		}
		w("\n")
	}

	if len(r.latOrd) > 0 {
		w("Commit→publish latency: %d writers commit one event per transaction at %d events/s for %s; latency = subscriber receive time − writer's Commit return time. Relay BatchSize 100, Concurrency 8.\n\n",
			*flagWriters, *flagRate, *flagLatencyFor)
		w("| Wake-up mode | PollInterval | Writers tx/s | Writer tx p50 / p99 (ms) | Writer COMMIT p50 / p99 (ms) | Publish latency p50 / p99 / max (ms) | Lost |\n")
		w("|---|---|---:|---:|---:|---:|---:|\n")
		for _, name := range r.latOrd {
			l := medianLatency(r.lat[name])
			pubs := "—"
			if l.mode.relay {
				pubs = fmt.Sprintf("%s / %s / %s", ms(l.pubP50), ms(l.pubP99), ms(l.pubMax))
			}
			poll := "—"
			if l.mode.relay {
				poll = l.mode.poll.String()
			}
			lost := "—"
			if l.mode.relay {
				lost = fmt.Sprint(l.lost)
			}
			w("| %s | %s | %.0f | %s / %s | %s / %s | %s | %s |\n", l.mode.title, poll, l.txPerSec,
				ms(l.txP50), ms(l.txP99), ms(l.commitP50), ms(l.commitP99), pubs, lost)
		}
		w("\nTargets: p50 < 10 ms, p99 < 50 ms.\n")
		for _, name := range r.latOrd {
			l := medianLatency(r.lat[name])
			if l.mode.relay {
				w("- %s: p50 %s ms → %s; p99 %s ms → %s.\n", l.mode.title, ms(l.pubP50), verdict(l.pubP50 < 10*time.Millisecond), ms(l.pubP99), verdict(l.pubP99 < 50*time.Millisecond))
			}
		}
	}
	_ = b
	return sb.String()
}

func verdict(ok bool) string {
	if ok {
		return "met"
	}
	return "**missed**"
}
