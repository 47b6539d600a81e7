package bench

// The chaos run (issue 12, row 4): 3 relays (relay.Relay values with
// distinct InstanceIDs, one process, default configuration but
// PollInterval 100 ms) drain the outbox while 8 writers insert events
// through the runtime's outbox writer (outbox.Writer.Insert in their own
// transactions, -chaos-per-tx events each, as fast as they can or at
// -chaos-rate events/s) for -chaos-for; then the writers stop and the
// relays drain what is left. A fraction -chaos-slow of the publishes take
// -chaos-delay (3 s) instead of nothing; the same run without slow
// publishes is the reference. Reported: rows pending when the writers
// stop, how long the drain after that takes (at most -chaos-drain-max) and
// its rate: rows sent after the writers stopped / drain time; and what
// per-key order allows any relay: the pending rows whose key had a slow
// publish under way at writer stop, the longest chain of slow publishes
// one key still had to wait out after the stop (no drain ends sooner),
// and how long the drain lasted after the last slow publish returned.

import (
	"context"
	"database/sql"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/outboxgen/outboxgen/internal/testdb"
	"github.com/outboxgen/outboxgen/runtime/dialect"
	"github.com/outboxgen/outboxgen/runtime/driver/sqldriver"
	"github.com/outboxgen/outboxgen/runtime/outbox"
	"github.com/outboxgen/outboxgen/runtime/relay"
	"github.com/outboxgen/outboxgen/templates"
)

const (
	chaosRelays  = 3
	chaosWriters = 8
)

// chaosPublisher makes a fraction of the publishes slow.
type chaosPublisher struct {
	message.Publisher
	calls *atomic.Int64 // Publish calls (hedges included)
	frac  float64
	delay time.Duration
	slow  *atomic.Int64
	busy  *slowKeys
}

func (p chaosPublisher) Publish(topic string, msgs ...*message.Message) error {
	p.calls.Add(1)
	if p.frac > 0 && rand.Float64() < p.frac*float64(len(msgs)) {
		p.slow.Add(1)
		key := ""
		if len(msgs) > 0 {
			key = msgs[0].Metadata.Get(outbox.MetadataKey)
		}
		done := p.busy.start(key, time.Now().Add(p.delay))
		time.Sleep(p.delay)
		done()
	}
	return p.Publisher.Publish(topic, msgs...)
}

// slowKeys are the keys with a slow publish under way, and when each of
// those publishes ends; and every slow publish so far.
type slowKeys struct {
	mu       sync.Mutex
	n        int
	ends     map[int]slowPublish
	all      []slowPublish
	returned time.Time // when the last slow publish that ended returned
}

type slowPublish struct {
	key        string
	start, end time.Time
}

func (s *slowKeys) start(key string, end time.Time) (done func()) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.ends == nil {
		s.ends = map[int]slowPublish{}
	}
	s.n++
	id := s.n
	p := slowPublish{key, time.Now(), end}
	s.ends[id] = p
	s.all = append(s.all, p)
	return func() {
		s.mu.Lock()
		delete(s.ends, id)
		s.returned = time.Now()
		s.mu.Unlock()
	}
}

// lastEnd returns when the last slow publish that ended returned.
func (s *slowKeys) lastEnd() time.Time {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.returned
}

// now returns the keys with a slow publish under way.
func (s *slowKeys) now() (keys []string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, p := range s.ends {
		keys = append(keys, p.key)
	}
	return keys
}

// chain returns the longest time one key had to wait out slow publishes
// from t on: the rest of its slow publish under way at t, plus every slow
// publish of it that started later. Per-key order runs a key's publishes
// one after the other, so no relay that keeps it, given these slow
// publishes, drains the rows pending at t sooner. (A slow publish lasts
// end - start; a fast one is counted as taking no time. Publishes of one
// key that overlap, which per-key order allows only for a row published
// again after its lease lapsed, count once.)
func (s *slowKeys) chain(t time.Time) time.Duration {
	s.mu.Lock()
	defer s.mu.Unlock()
	spans := map[string][]slowPublish{}
	for _, p := range s.all {
		if p.end.After(t) {
			if p.start.Before(t) {
				p.start = t
			}
			spans[p.key] = append(spans[p.key], p)
		}
	}
	var longest time.Duration
	for _, ps := range spans {
		slices.SortFunc(ps, func(a, b slowPublish) int { return a.start.Compare(b.start) })
		var sum time.Duration
		var reached time.Time // the end of the union so far
		for _, p := range ps {
			if p.start.Before(reached) {
				p.start = reached
			}
			if p.end.After(p.start) {
				sum += p.end.Sub(p.start)
				reached = p.end
			}
		}
		longest = max(longest, sum)
	}
	return longest
}

type chaosResult struct {
	written      int
	pendingAtEnd int           // pending when the writers stopped
	drain        time.Duration // writers stopped → nothing pending (or the cap)
	drained      bool          // false: the cap was reached
	rate         float64       // rows sent during drain / drain
	slow         int64         // slow publishes
	// When the writers stopped: the pending rows whose key had a slow
	// publish under way (per-key order keeps them pending until it ends).
	behindSlow int
	// chain is the longest time one key had to wait out slow publishes
	// after the writers stopped (slowKeys.chain): the drain's lower bound
	// for any relay that keeps per-key order, given these slow publishes.
	chain time.Duration
	// tail is how long the drain lasted after the last slow publish
	// returned (the whole drain when none returned during it).
	tail time.Duration
	// hedges is how many publishes the relays sent again
	// (relay.Config.Hedge), of calls Publish calls in all.
	hedges, calls int64
}

func runChaos(b *testing.B, srv *servers, slow, hedge bool) chaosResult {
	db := freshOutbox(b, "postgres")
	db.SetMaxIdleConns(chaosWriters + 2*chaosRelays + 4)
	pubs := gochannel.NewGoChannel(gochannel.Config{}, nil) // no subscriber: publishes are dropped
	b.Cleanup(func() { pubs.Close() })
	var slowCount, calls atomic.Int64
	busy := &slowKeys{}
	pub := chaosPublisher{Publisher: pubs, calls: &calls, delay: *flagChaosDelay, slow: &slowCount, busy: busy}
	if slow {
		pub.frac = *flagChaosSlow
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	runErr := make(chan error, chaosRelays)
	reader := sdkmetric.NewManualReader()
	meters := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	srv.measure(b)
	for i := range chaosRelays {
		drv, err := sqldriver.New(db, testdb.Schema(dialect.Postgres))
		if err != nil {
			b.Fatal(err)
		}
		r, err := relay.New(drv, relay.Config{Publisher: pub, InstanceID: fmt.Sprintf("chaos-%d", i), PollInterval: 100 * time.Millisecond, Hedge: hedge, Logger: discard, MeterProvider: meters})
		if err != nil {
			b.Fatal(err)
		}
		go func() { runErr <- r.Run(ctx) }()
	}

	w := outbox.MustNewWriter(outbox.Postgres, templates.DefaultTables.Outbox)
	var (
		written atomic.Int64
		wg      sync.WaitGroup
		errOnce sync.Once
		werr    error
	)
	perTx := max(*flagChaosPerTx, 1)
	start := time.Now()
	stop := start.Add(*flagChaosFor)
	for i := range chaosWriters {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for k := 0; ; k++ {
				if *flagChaosRate > 0 {
					// Writer i's k-th transaction is due at this time.
					at := start.Add(time.Duration((k*chaosWriters+i)*perTx) * time.Second / time.Duration(*flagChaosRate))
					if d := time.Until(at); d > 0 {
						time.Sleep(d)
					}
				}
				if !time.Now().Before(stop) {
					return
				}
				tx, err := db.BeginTx(ctx, nil)
				if err == nil {
					for j := 0; j < perTx && err == nil; j++ {
						seq := int(written.Load()) + j
						_, err = w.Insert(ctx, tx, outbox.Event{Type: "ORDER_PAID", Topic: topic, Key: keyOf(seq*chaosWriters + i), Version: 1,
							Payload: map[string]any{"order_id": seq, "amount": seq % 1000, "currency": "EUR"}})
					}
					if err == nil {
						err = tx.Commit()
					} else {
						tx.Rollback() //nolint:errcheck
					}
				}
				if err != nil {
					errOnce.Do(func() { werr = err })
					return
				}
				written.Add(int64(perTx))
			}
		}()
	}
	// The table is fresh: without statistics PostgreSQL plans the claim
	// as a sort of every due row (see the README's benchmark section).
	// Autovacuum would analyze it within its naptime (1 min by default);
	// the run analyzes it once after 1 s of writes instead.
	time.Sleep(time.Second)
	analyze(b, db, "postgres")
	wg.Wait()
	if werr != nil {
		b.Fatalf("writer: %v", werr)
	}
	stopped := time.Now()
	keys := busy.now()
	res := chaosResult{written: int(written.Load()), pendingAtEnd: pending(b, db)}
	if len(keys) > 0 {
		res.behindSlow = pendingOfKeys(b, db, keys)
	}
	left := res.pendingAtEnd
	deadline := stopped.Add(*flagChaosDrainMax)
	for left > 0 && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
		left = pending(b, db)
	}
	res.drain = time.Since(stopped)
	res.drained = left == 0
	res.tail = res.drain
	if end := busy.lastEnd(); end.After(stopped) {
		res.tail = stopped.Add(res.drain).Sub(end)
	}
	if res.drain > 0 {
		res.rate = float64(res.pendingAtEnd-left) / res.drain.Seconds()
	}
	res.chain = busy.chain(stopped)
	res.slow = slowCount.Load()
	cancel()
	for range chaosRelays {
		if err := <-runErr; err != nil {
			b.Fatalf("relay Run: %v", err)
		}
	}
	res.hedges = counterSum(b, reader, "outboxgen.relay.hedged") // the relay's hedge counter
	res.calls = calls.Load()
	return res
}

// counterSum is the sum of an Int64 counter's points in reader.
func counterSum(b *testing.B, reader *sdkmetric.ManualReader, name string) int64 {
	var rm metricdata.ResourceMetrics
	if err := reader.Collect(context.Background(), &rm); err != nil {
		b.Fatalf("collect metrics: %v", err)
	}
	var n int64
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if sum, ok := m.Data.(metricdata.Sum[int64]); ok && m.Name == name {
				for _, p := range sum.DataPoints {
					n += p.Value
				}
			}
		}
	}
	return n
}

// pendingOfKeys counts the pending rows of keys.
func pendingOfKeys(b *testing.B, db *sql.DB, keys []string) int {
	var n int
	if err := db.QueryRow("SELECT count(*) FROM outbox_event WHERE status = 0 AND biz_id = ANY($1)", keys).Scan(&n); err != nil {
		b.Fatalf("count pending rows of keys: %v", err)
	}
	return n
}
