package relay

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/google/uuid"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"

	"github.com/outboxgen/outboxgen/runtime/dialect"
	"github.com/outboxgen/outboxgen/runtime/driver"
	"github.com/outboxgen/outboxgen/runtime/internal/telemetry"
	"github.com/outboxgen/outboxgen/runtime/internal/workers"
	"github.com/outboxgen/outboxgen/runtime/outbox"
)

// A publish that hangs holds back its own key only: with one slot
// (Concurrency 1) and batches of 10, every other key is claimed, published
// and recorded sent while it hangs, and the hung key's later rows wait
// for it; then the key goes out in order.
func TestSlowPublishHoldsBackOnlyItsKey(t *testing.T) {
	forEachDialect(t, func(t *testing.T, db *sql.DB, d dialect.Dialect, drv driver.Driver) {
		var evs []ev
		for i := range 4 {
			for k := range 50 {
				evs = append(evs, ev{Key: fmt.Sprintf("k%02d", k)})
			}
			if i < 3 {
				evs = append(evs, ev{Key: "slow"})
			}
		}
		ins := insertEvents(t, db, d, evs...)
		var slow []string
		for _, e := range ins {
			if e.Key == "slow" {
				slow = append(slow, e.ID)
			}
		}
		pub := newRecPub(t)
		unblock := make(chan struct{})
		var once sync.Once
		t.Cleanup(func() { once.Do(func() { close(unblock) }) })
		pub.setFail(func(m *message.Message) error {
			if m.UUID == slow[0] {
				<-unblock // far longer than SlowPublish
			}
			return nil
		})
		opts := testOptions(pub, "pipe")
		opts.Concurrency = 1
		opts.BatchSize = 10
		opts.MaxInFlight = 40
		failOnPollErrors(t, &opts)
		stop := runRelay(t, mustRelay(t, drv, opts))
		others := len(ins) - len(slow)
		waitFor(t, "every other key sent while the slow publish hangs", func() bool {
			return count(t, db, "status = 1") == others
		})
		for _, id := range slow[1:] {
			if n := pub.attemptsOf(id); n != 0 {
				t.Fatalf("row %s of the slow key published %d times before its head", id, n)
			}
		}
		if s := state(t, db, d, slow[0]); s.Status != 0 || s.LeaseOwner.String != "pipe" {
			t.Fatalf("hung head: %+v, want pending and leased while it publishes", s)
		}
		// Where claims hold rows behind a slow publish (PostgreSQL), the
		// head's rows wait out of every claim's path, and the recording of
		// the head (sent) ends the hold in its own commit.
		q, err := dialect.NewRelayQueries(d, table, nil)
		if err != nil {
			t.Fatal(err)
		}
		held := "lease_owner = '" + dialect.HeldOwner + "'"
		if q.HoldsInFlight() {
			waitFor(t, "the rows behind the slow head held", func() bool { return count(t, db, held) == len(slow)-1 })
		}
		once.Do(func() { close(unblock) })
		if q.HoldsInFlight() {
			waitFor(t, "the slow head sent", func() bool { return state(t, db, d, slow[0]).Status == 1 })
			if n := count(t, db, held); n != 0 {
				t.Fatalf("%d rows still held after the head they waited for was sent", n)
			}
		}
		waitFor(t, "all sent", func() bool { return count(t, db, "status = 1") == len(ins) })
		stop()
		checkKeyOrder(t, pub, ins)
	})
}

// While a key's rows hang in a publish, the relay's claims pass the key
// over where the dialect reads SkipKeys (MySQL/MariaDB), and every other
// key goes out meanwhile; then the key goes out in order. Elsewhere no
// key is passed. (That the driver then passes the key over is
// drivertest's ClaimSkipKeys.)
func TestClaimsPassOverKeyInFlight(t *testing.T) {
	forEachDialect(t, func(t *testing.T, db *sql.DB, d dialect.Dialect, drv driver.Driver) {
		var evs []ev
		for range 20 {
			evs = append(evs, ev{Key: "run"})
		}
		evs = append(evs, roundRobin(100, 50)...)
		ins := insertEvents(t, db, d, evs...)
		pub := newRecPub(t)
		unblock := make(chan struct{})
		var once sync.Once
		t.Cleanup(func() { once.Do(func() { close(unblock) }) })
		pub.setFail(func(m *message.Message) error {
			if m.UUID == ins[0].ID {
				<-unblock
			}
			return nil
		})
		opts := testOptions(pub, "pass")
		opts.BatchSize = 10
		failOnPollErrors(t, &opts)
		spy := &skipSpy{Driver: drv}
		stop := runRelay(t, mustRelay(t, spy, opts))
		waitFor(t, "every other key sent while the run's head hangs", func() bool {
			return count(t, db, "status = 1") == len(ins)-20
		})
		if got := spy.keys(); d.ClaimSkipsKeys() != got["run"] || !d.ClaimSkipsKeys() && len(got) > 0 {
			t.Fatalf("keys passed as SkipKeys: %v; want the hung key among them: %v", got, d.ClaimSkipsKeys())
		}
		once.Do(func() { close(unblock) })
		waitFor(t, "all sent", func() bool { return count(t, db, "status = 1") == len(ins) })
		stop()
		checkKeyOrder(t, pub, ins)
	})
}

// skipSpy records every key a claim passed in SkipKeys.
type skipSpy struct {
	driver.Driver
	mu   sync.Mutex
	seen map[string]bool
}

func (s *skipSpy) Claim(ctx context.Context, p driver.ClaimParams) ([]driver.Row, error) {
	s.mu.Lock()
	for _, k := range p.SkipKeys {
		if s.seen == nil {
			s.seen = map[string]bool{}
		}
		s.seen[k] = true
	}
	s.mu.Unlock()
	return s.Driver.Claim(ctx, p)
}

func (s *skipSpy) keys() map[string]bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return maps.Clone(s.seen)
}

// A claim passes over the keys of which the relay holds several rows
// leased and does not record them in it: a key with a row recorded and
// two still leased is passed over, one whose rows are all recorded is
// not, nor one with a single row in flight; a row whose result belongs to
// an earlier lease of it counts as leased.
func TestSkipKeysLeaveRecordedKeys(t *testing.T) {
	b1, b2, b3, b4, old := &batch{}, &batch{}, &batch{}, &batch{}, &batch{}
	p := &pipeline{
		leased: map[int64]*batch{1: b1, 2: b1, 3: b1, 4: b2, 5: b3, 6: b3, 7: b4, 8: b4, 9: b1},
		keys:   map[int64]string{1: "a", 2: "a", 3: "a", 4: "b", 5: "c", 6: "c", 7: "d", 8: "d", 9: "e"},
	}
	of := map[int64]*batch{1: b1, 4: b2, 5: old, 7: b4, 8: b4}
	got := p.skipKeys(of)
	slices.Sort(got)
	if want := []string{"a", "c"}; !slices.Equal(got, want) {
		t.Fatalf("skipKeys = %v, want %v", got, want)
	}
	if got := p.skipKeys(map[int64]*batch{1: b1, 2: b1, 3: b1, 4: b2, 5: b3, 6: b3, 7: b4, 8: b4, 9: b1}); len(got) != 0 {
		t.Fatalf("skipKeys with every row recorded = %v, want none", got)
	}
	if got := (&pipeline{}).skipKeys(nil); got != nil {
		t.Fatalf("skipKeys with nothing leased = %v", got)
	}
	// At most MaxInList keys.
	for i := range dialect.MaxInList + 10 {
		for j := range 2 {
			id := int64(100 + 2*i + j)
			p.leased[id], p.keys[id] = b1, fmt.Sprint("k", i)
		}
	}
	if got := p.skipKeys(nil); len(got) != dialect.MaxInList {
		t.Fatalf("skipKeys of %d keys: %d, want %d", dialect.MaxInList+13, len(got), dialect.MaxInList)
	}
}

// While a publish outlasts the lease several times over, the heartbeat
// keeps its row (and the rows published and waiting to be recorded)
// leased: a second relay never publishes them, and nothing is published
// twice.
func TestHeartbeatCoversRowsInFlight(t *testing.T) {
	forEachDialect(t, func(t *testing.T, db *sql.DB, d dialect.Dialect, drv driver.Driver) {
		var evs []ev
		for k := range 30 {
			evs = append(evs, ev{Key: fmt.Sprintf("k%d", k)}, ev{Key: fmt.Sprintf("k%d", k)})
		}
		ins := insertEvents(t, db, d, evs...)
		pub := newRecPub(t)
		pub.setFail(func(m *message.Message) error {
			if m.UUID == ins[0].ID {
				time.Sleep(2500 * time.Millisecond) // the lease is 900 ms
			}
			return nil
		})
		mk := func(id string) *Relay {
			opts := testOptions(pub, id)
			opts.LeaseDuration = 900 * time.Millisecond
			opts.ShutdownTimeout = 300 * time.Millisecond
			opts.BatchSize = 8
			failOnPollErrors(t, &opts)
			return mustRelay(t, drv, opts)
		}
		stopA := runRelay(t, mk("a"))
		waitFor(t, "the slow publish started", func() bool { return pub.attemptsOf(ins[0].ID) == 1 })
		stopB := runRelay(t, mk("b"))
		waitFor(t, "all sent", func() bool { return count(t, db, "status = 1") == len(ins) })
		stopA()
		stopB()
		checkPublishedOnce(t, pub, ins)
	})
}

// recordCounter counts how the relay records results.
type recordCounter struct {
	driver.Driver
	mu                                sync.Mutex
	claims, claimsWithRecord, records int
	markSent, markRetry, release      int
}

func (c *recordCounter) Claim(ctx context.Context, p driver.ClaimParams) ([]driver.Row, error) {
	c.mu.Lock()
	c.claims++
	if !p.Record.Empty() {
		c.claimsWithRecord++
	}
	c.mu.Unlock()
	return c.Driver.Claim(ctx, p)
}

func (c *recordCounter) Record(ctx context.Context, owner string, r driver.Results) (driver.Recorded, error) {
	c.mu.Lock()
	c.records++
	c.mu.Unlock()
	return c.Driver.Record(ctx, owner, r)
}

func (c *recordCounter) MarkSent(ctx context.Context, owner string, ids []int64) (int64, error) {
	c.mu.Lock()
	c.markSent++
	c.mu.Unlock()
	return c.Driver.MarkSent(ctx, owner, ids)
}

func (c *recordCounter) MarkRetry(ctx context.Context, owner string, fs []driver.Failure, maxAttempts int) (int64, []int64, error) {
	c.mu.Lock()
	c.markRetry++
	c.mu.Unlock()
	return c.Driver.MarkRetry(ctx, owner, fs, maxAttempts)
}

func (c *recordCounter) Release(ctx context.Context, owner string, ids []int64) (int64, error) {
	c.mu.Lock()
	c.release++
	c.mu.Unlock()
	return c.Driver.Release(ctx, owner, ids)
}

// Draining a backlog, the relay records each batch's results with a later
// claim (one transaction) rather than with statements of their own.
func TestResultsRecordedWithNextClaim(t *testing.T) {
	forEachDialect(t, func(t *testing.T, db *sql.DB, d dialect.Dialect, drv driver.Driver) {
		ins := insertEvents(t, db, d, roundRobin(600, 60)...)
		cd := &recordCounter{Driver: drv}
		pub := newRecPub(t)
		opts := testOptions(pub, "rec")
		failOnPollErrors(t, &opts)
		n, err := mustRelay(t, cd, opts).RunOnce(context.Background())
		if err != nil || n != len(ins) {
			t.Fatalf("RunOnce = %d, %v; want %d", n, err, len(ins))
		}
		if c := count(t, db, "status = 1"); c != len(ins) {
			t.Fatalf("%d rows sent, want %d", c, len(ins))
		}
		cd.mu.Lock()
		defer cd.mu.Unlock()
		if cd.markSent+cd.markRetry+cd.release != 0 || cd.claimsWithRecord == 0 {
			t.Fatalf("claims %d (with results %d), records alone %d, MarkSent %d, MarkRetry %d, Release %d: want results recorded with claims",
				cd.claims, cd.claimsWithRecord, cd.records, cd.markSent, cd.markRetry, cd.release)
		}
		t.Logf("claims %d (with results %d), records alone %d", cd.claims, cd.claimsWithRecord, cd.records)
	})
}

// failsAfterRecordApart gives the first claim that carries results the
// fate a claim of sqldriver on MySQL/MariaDB can have: its results are
// recorded and committed apart (driver.ClaimResult.RecordedApart), then
// the claim fails without leasing anything. It notes the ids of rows
// recorded sent there that a later claim or Record carries again.
type failsAfterRecordApart struct {
	driver.Driver
	failed atomic.Bool
	mu     sync.Mutex
	apart  map[int64]bool
	again  []int64
}

func (f *failsAfterRecordApart) carriedAgain(r *driver.Results) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, id := range r.Sent {
		if f.apart[id] {
			f.again = append(f.again, id)
		}
	}
}

func (f *failsAfterRecordApart) Claim(ctx context.Context, p driver.ClaimParams) ([]driver.Row, error) {
	if p.Record.Empty() {
		return f.Driver.Claim(ctx, p)
	}
	if !f.failed.CompareAndSwap(false, true) {
		f.carriedAgain(p.Record)
		return f.Driver.Claim(ctx, p)
	}
	got, err := f.Driver.Record(ctx, p.Owner, *p.Record)
	if err != nil {
		return nil, err
	}
	f.mu.Lock()
	f.apart = map[int64]bool{}
	for _, id := range p.Record.Sent {
		f.apart[id] = true
	}
	f.mu.Unlock()
	if p.Result != nil {
		p.Result.Recorded, p.Result.RecordedApart = got, true
	}
	return nil, errors.New("claim failed after its results were committed (injected)")
}

func (f *failsAfterRecordApart) Record(ctx context.Context, owner string, r driver.Results) (driver.Recorded, error) {
	f.carriedAgain(&r)
	return f.Driver.Record(ctx, owner, r)
}

// A claim that fails after its results were committed apart
// (RecordedApart) leaves them recorded: the relay does not record them
// again (which would find their leases gone and warn of lost leases) and
// every row is sent once.
func TestClaimFailingAfterRecordApart(t *testing.T) {
	forEachDialect(t, func(t *testing.T, db *sql.DB, d dialect.Dialect, drv driver.Driver) {
		ins := insertEvents(t, db, d, roundRobin(300, 30)...)
		fd := &failsAfterRecordApart{Driver: drv}
		pub := newRecPub(t)
		opts := testOptions(pub, "apart")
		opts.BatchSize = 20
		h := &errLog{}
		opts.Logger = slog.New(h)
		reader := sdkmetric.NewManualReader()
		opts.MeterProvider = sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
		stop := runRelay(t, mustRelay(t, fd, opts))
		waitFor(t, "all sent", func() bool { return count(t, db, "status = 1") == len(ins) })
		stop()
		if !fd.failed.Load() {
			t.Fatal("no claim carried results: nothing was injected")
		}
		checkPublishedOnce(t, pub, ins)
		// The rows recorded apart left the relay's books: nothing in flight,
		// nothing leased.
		if n := gaugeValue(t, reader, telemetry.MetricInFlight); n != 0 {
			t.Errorf("%s = %d after the drain, want 0", telemetry.MetricInFlight, n)
		}
		if n := count(t, db, "lease_owner IS NOT NULL"); n != 0 {
			t.Errorf("%d rows still leased after the drain", n)
		}
		fd.mu.Lock()
		defer fd.mu.Unlock()
		if len(fd.apart) == 0 || len(fd.again) > 0 {
			t.Fatalf("%d rows recorded apart, %d of them carried again: %v", len(fd.apart), len(fd.again), fd.again)
		}
		h.mu.Lock()
		defer h.mu.Unlock()
		for _, m := range h.msgs {
			if strings.Contains(m, "lease lost") {
				t.Errorf("unexpected relay log: %s", m)
			}
		}
	})
}

// claimGauge counts the claims running at once (each made to last at
// least hold, so that overlaps show), the lease extensions, the claims
// of one stripe of the keys (in all, per stripe, started beside a claim
// of another stripe, and beside one of the same: clash).
type claimGauge struct {
	driver.Driver
	hold     time.Duration
	mu       sync.Mutex
	cur      int
	max      int
	extends  int
	striped  int
	clash    int
	beside   int
	stripes  map[driver.Stripe]int // of the claims running
	perIndex map[int]int           // striped claims per Stripe.Index
}

func (g *claimGauge) Claim(ctx context.Context, p driver.ClaimParams) ([]driver.Row, error) {
	g.mu.Lock()
	g.cur++
	g.max = max(g.max, g.cur)
	if p.Stripe.Of > 0 {
		g.striped++
		if g.stripes == nil {
			g.stripes, g.perIndex = map[driver.Stripe]int{}, map[int]int{}
		}
		if g.stripes[p.Stripe] > 0 || p.Stripe.Index >= p.Stripe.Of {
			g.clash++
		}
		for st, n := range g.stripes {
			if n > 0 && st != p.Stripe {
				g.beside++
				break
			}
		}
		g.stripes[p.Stripe]++
		g.perIndex[p.Stripe.Index]++
	}
	g.mu.Unlock()
	defer func() {
		g.mu.Lock()
		g.cur--
		if p.Stripe.Of > 0 {
			g.stripes[p.Stripe]--
		}
		g.mu.Unlock()
	}()
	t := time.NewTimer(g.hold)
	defer t.Stop()
	select {
	case <-t.C:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	return g.Driver.Claim(ctx, p)
}

func (g *claimGauge) ExtendLease(ctx context.Context, owner string, ids []int64, lease time.Duration) (int64, error) {
	g.mu.Lock()
	g.extends++
	g.mu.Unlock()
	return g.Driver.ExtendLease(ctx, owner, ids, lease)
}

func (g *claimGauge) peak() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.max
}

// While a backlog lasts, ParallelClaims claims run at once (and never
// more; one on SQLite), on PostgreSQL each of a stripe of the keys of its
// own; every event is still published once, each key in order.
func TestParallelClaimsKeepKeyOrder(t *testing.T) {
	forEachDialect(t, func(t *testing.T, db *sql.DB, d dialect.Dialect, drv driver.Driver) {
		ins := insertEvents(t, db, d, roundRobin(900, 30)...)
		for _, parallel := range []int{1, 2, 3} {
			if parallel > 1 {
				if _, err := db.Exec("UPDATE " + table + " SET status = 0, sent_at = NULL"); err != nil {
					t.Fatal(err)
				}
			}
			g := &claimGauge{Driver: drv, hold: 5 * time.Millisecond}
			pub := newRecPub(t)
			opts := testOptions(pub, fmt.Sprintf("par%d", parallel))
			opts.BatchSize = 20
			opts.MaxInFlight = 200
			opts.ParallelClaims = parallel
			failOnPollErrors(t, &opts)
			n, err := mustRelay(t, g, opts).RunOnce(context.Background())
			if err != nil || n != len(ins) {
				t.Fatalf("ParallelClaims %d: RunOnce = %d, %v; want %d", parallel, n, err, len(ins))
			}
			want := parallel
			if d == dialect.SQLite {
				want = 1 // one writer: New caps ParallelClaims
			}
			if p := g.peak(); p != want {
				t.Fatalf("ParallelClaims %d: at most %d claims ran at once, want %d", parallel, p, want)
			}
			g.mu.Lock()
			striped, clash := g.striped, g.clash
			g.mu.Unlock()
			if clash > 0 {
				t.Fatalf("ParallelClaims %d: %d claims ran beside one of the same stripe (or of none of %d)", parallel, clash, parallel)
			}
			if striped > 0 && (d != dialect.Postgres || parallel == 1) {
				t.Fatalf("ParallelClaims %d on %s: %d claims of one stripe of the keys, want none", parallel, d, striped)
			}
			checkPublishedOnce(t, pub, ins)
			checkKeyOrder(t, pub, ins)
		}
	})
}

// While a backlog of many keys drains on PostgreSQL, the claims running
// beside each other read stripes of the keys of their own: no two at once
// of the same stripe, and every event still published once. Claims that
// run mostly one at a time (MaxInFlight leaves room for one batch) take
// the stripes in turn, not the first until it drains.
func TestParallelClaimsReadStripes(t *testing.T) {
	forEachDialect(t, func(t *testing.T, db *sql.DB, d dialect.Dialect, drv driver.Driver) {
		if d != dialect.Postgres {
			t.Skip("stripes: PostgreSQL's claims from a front")
		}
		ins := insertEvents(t, db, d, roundRobin(1200, 1200)...)
		// peak: the claims at once to see (0: any; MaxInFlight 20 leaves
		// room for one batch, and for a second only beside results a
		// claim carries).
		for _, tc := range []struct {
			parallel, inFlight, peak int
		}{{3, 200, 3}, {2, 20, 0}} {
			if _, err := db.Exec("UPDATE " + table + " SET status = 0, sent_at = NULL"); err != nil {
				t.Fatal(err)
			}
			g := &claimGauge{Driver: drv, hold: 5 * time.Millisecond}
			pub := newRecPub(t)
			opts := testOptions(pub, fmt.Sprintf("stripes%d", tc.parallel))
			opts.BatchSize = 20
			opts.MaxInFlight = tc.inFlight
			opts.ParallelClaims = tc.parallel
			failOnPollErrors(t, &opts)
			n, err := mustRelay(t, g, opts).RunOnce(context.Background())
			if err != nil || n != len(ins) {
				t.Fatalf("ParallelClaims %d: RunOnce = %d, %v; want %d", tc.parallel, n, err, len(ins))
			}
			g.mu.Lock()
			striped, clash, beside, peak := g.striped, g.clash, g.beside, g.max
			per := maps.Clone(g.perIndex)
			g.mu.Unlock()
			t.Logf("ParallelClaims %d, MaxInFlight %d: %d claims of one stripe (per stripe %v), %d beside one of another", tc.parallel, tc.inFlight, striped, per, beside)
			if (tc.peak > 0 && peak != tc.peak) || clash > 0 || striped < 10 {
				t.Fatalf("ParallelClaims %d, MaxInFlight %d: at most %d claims at once (want %d), %d claims of one stripe of the keys (want 10 or more), %d beside one of the same stripe (want none)", tc.parallel, tc.inFlight, peak, tc.peak, striped, clash)
			}
			if tc.peak > 1 && beside == 0 {
				t.Fatalf("ParallelClaims %d: no claim of one stripe ran beside one of another", tc.parallel)
			}
			for i := range tc.parallel {
				if per[i] < striped/(4*tc.parallel) {
					t.Fatalf("ParallelClaims %d, MaxInFlight %d: stripes taken %v times of %d claims, want each at least a quarter of its share", tc.parallel, tc.inFlight, per, striped)
				}
			}
			checkPublishedOnce(t, pub, ins)
		}
	})
}

// Claims that keep overlapping (a long backlog, slow claims) do not starve
// the heartbeat: a publish outlasting the lease keeps its row, so a second
// relay never publishes it again.
func TestHeartbeatBetweenOverlappingClaims(t *testing.T) {
	forEachDialect(t, func(t *testing.T, db *sql.DB, d dialect.Dialect, drv driver.Driver) {
		ins := insertEvents(t, db, d, roundRobin(1500, 300)...)
		pub := newRecPub(t)
		pub.setFail(func(m *message.Message) error {
			if m.UUID == ins[0].ID {
				time.Sleep(2500 * time.Millisecond) // the lease is 900 ms
			}
			return nil
		})
		ga := &claimGauge{Driver: drv, hold: 60 * time.Millisecond}
		mk := func(id string, drv driver.Driver) *Relay {
			opts := testOptions(pub, id)
			opts.LeaseDuration = 900 * time.Millisecond
			opts.ShutdownTimeout = 300 * time.Millisecond
			opts.BatchSize = 5
			opts.MaxInFlight = 100
			failOnPollErrors(t, &opts)
			return mustRelay(t, drv, opts)
		}
		stopA := runRelay(t, mk("a", ga))
		waitFor(t, "the slow publish started", func() bool { return pub.attemptsOf(ins[0].ID) == 1 })
		stopB := runRelay(t, mk("b", &claimGauge{Driver: drv, hold: 60 * time.Millisecond}))
		waitFor(t, "all sent", func() bool { return count(t, db, "status = 1") == len(ins) })
		stopA()
		stopB()
		checkPublishedOnce(t, pub, ins)
		ga.mu.Lock()
		defer ga.mu.Unlock()
		if (ga.max < 2 && d != dialect.SQLite) || ga.extends == 0 {
			t.Fatalf("relay a: at most %d claims at once, %d lease extensions: want overlapping claims and heartbeats", ga.max, ga.extends)
		}
	})
}

// cutOffAfterCommit is a driver whose claims commit and then, when their
// context ended meanwhile, report the context's error: what a claim cut
// off between its COMMIT and the reply looks like to the relay.
type cutOffAfterCommit struct {
	driver.Driver
	inFlight atomic.Int32
}

func (c *cutOffAfterCommit) Claim(ctx context.Context, p driver.ClaimParams) ([]driver.Row, error) {
	c.inFlight.Add(1)
	defer c.inFlight.Add(-1)
	rows, err := c.Driver.Claim(context.WithoutCancel(ctx), p)
	time.Sleep(150 * time.Millisecond)
	if ctx.Err() != nil {
		return nil, ctx.Err()
	}
	return rows, err
}

// Shutdown lets the claims in flight finish and gives their rows back:
// a clean stop leaves no row leased, even when a claim was under way.
func TestShutdownDuringClaimLeavesNothingLeased(t *testing.T) {
	forEachDialect(t, func(t *testing.T, db *sql.DB, d dialect.Dialect, drv driver.Driver) {
		insertEvents(t, db, d, roundRobin(400, 40)...)
		cd := &cutOffAfterCommit{Driver: drv}
		pub := newRecPub(t)
		opts := testOptions(pub, "stop")
		opts.BatchSize = 10
		failOnPollErrors(t, &opts)
		stop := runRelay(t, mustRelay(t, cd, opts))
		waitFor(t, "some rows sent and a claim under way", func() bool {
			return count(t, db, "status = 1") > 0 && cd.inFlight.Load() > 0
		})
		stop()
		if n := count(t, db, "status = 0 AND lease_owner = 'stop'"); n != 0 {
			t.Fatalf("%d rows still leased after a clean stop, want 0", n)
		}
		if sent := count(t, db, "status = 1"); sent != len(pub.successes()) {
			t.Fatalf("%d rows marked sent, %d published", sent, len(pub.successes()))
		}
	})
}

// slowToReport holds back the return of the first claim that records a
// failure, after it committed, until until() reports true (at most 5 s).
type slowToReport struct {
	driver.Driver
	until func() bool
	once  sync.Once
}

func (s *slowToReport) Claim(ctx context.Context, p driver.ClaimParams) ([]driver.Row, error) {
	rows, err := s.Driver.Claim(ctx, p)
	if p.Record != nil && len(p.Record.Failures) > 0 {
		s.once.Do(func() {
			for end := time.Now().Add(5 * time.Second); !s.until() && time.Now().Before(end); {
				time.Sleep(5 * time.Millisecond)
			}
		})
	}
	return rows, err
}

// A claim that returns late, after a claim beside it leased one of its
// rows again (a failed row due again at once) and while that row
// publishes again, does not take the row from the new batch: it is marked
// sent once published, not left to wait for its lease to lapse.
func TestLateClaimKeepsNewerLease(t *testing.T) {
	forEachDialect(t, func(t *testing.T, db *sql.DB, d dialect.Dialect, drv driver.Driver) {
		if d == dialect.SQLite {
			t.Skip("SQLite runs one claim at a time")
		}
		ins := insertEvents(t, db, d, roundRobin(600, 200)...)
		poison := ins[0].ID
		var failed atomic.Bool
		pub := newRecPub(t)
		pub.setFail(func(m *message.Message) error {
			if m.UUID == poison {
				if failed.CompareAndSwap(false, true) {
					return errors.New("broker hiccup")
				}
				time.Sleep(time.Second) // still publishing when the late claim returns
			}
			return nil
		})
		opts := testOptions(pub, "late")
		opts.BatchSize = 20
		opts.MaxInFlight = 1000
		opts.Backoff = func(int) time.Duration { return 0 } // due again at once
		failOnPollErrors(t, &opts)
		relet := func() bool { // the poison row failed, and is leased again
			return failed.Load() && state(t, db, d, poison).LeaseOwner.String == "late"
		}
		stop := runRelay(t, mustRelay(t, &slowToReport{Driver: drv, until: relet}, opts))
		// The lease is 20 s: a row whose result was dropped would wait
		// for it to lapse.
		deadline := time.Now().Add(8 * time.Second)
		for count(t, db, "status = 1") < len(ins) {
			if time.Now().After(deadline) {
				t.Fatalf("%d of %d rows sent after 8 s; the poison row: %+v", count(t, db, "status = 1"), len(ins), state(t, db, d, poison))
			}
			time.Sleep(20 * time.Millisecond)
		}
		stop()
		if n := pub.attemptsOf(poison); n != 2 {
			t.Fatalf("the row that failed once was attempted %d times, want 2", n)
		}
	})
}

// roundRobin is n events over the keys k000, k001, ... in turn.
func roundRobin(n, keys int) []ev {
	evs := make([]ev, n)
	for i := range evs {
		evs[i] = ev{Key: fmt.Sprintf("k%03d", i%keys)}
	}
	return evs
}

// checkPublishedOnce fails unless every event of ins was published
// exactly once (attempts, failed ones included).
func checkPublishedOnce(t *testing.T, pub *recPub, ins []inserted) {
	t.Helper()
	for _, e := range ins {
		if n := pub.attemptsOf(e.ID); n != 1 {
			t.Fatalf("event %s (key %s) published %d times, want once", e.ID, e.Key, n)
		}
	}
}

// The driver's default for how long a row is in flight before claims
// hold the rows behind it is documented as twice SlowPublish.
func TestHoldBehindSlowIsTwiceSlowPublish(t *testing.T) {
	if driver.DefaultHoldBehindSlow != 2*SlowPublish {
		t.Errorf("driver.DefaultHoldBehindSlow is %s, SlowPublish %s: keep the first twice the second", driver.DefaultHoldBehindSlow, SlowPublish)
	}
}

// A claim asks for a full batch, or what fits in quarter-batch steps, or
// below one step a power of two: few distinct limits, each a prepared
// statement on PostgreSQL.
func TestClaimSize(t *testing.T) {
	for _, c := range []struct{ room, batch, want int }{
		{100, 100, 100}, {400, 100, 100}, {99, 100, 75}, {75, 100, 75}, {74, 100, 50},
		{50, 100, 50}, {26, 100, 25}, {24, 100, 16}, {3, 100, 2}, {1, 100, 1}, {1, 1, 1},
		{7, 8, 6}, {1, 8, 1}, {9, 10, 7}, {5, 10, 5}, {6, 10, 5}, {2, 10, 2}, {1, 10, 1},
		{25, 50, 25}, {49, 50, 37}, {1000, 1000, 1000}, {999, 1000, 750},
	} {
		if got := claimSize(c.room, c.batch); got != c.want {
			t.Errorf("claimSize(%d, %d) = %d, want %d", c.room, c.batch, got, c.want)
		}
	}
	for _, batch := range []int{1, 2, 3, 7, 10, 50, 100, 1000} {
		seen := map[int]bool{}
		for room := 1; room <= batch; room++ {
			got := claimSize(room, batch)
			if got < 1 || got > room || (room >= batch/2 && got < batch/2) {
				t.Errorf("claimSize(%d, %d) = %d: want 1..room, and half a batch when half fits", room, batch, got)
			}
			seen[got] = true
		}
		if len(seen) > 12 {
			t.Errorf("%d distinct limits for BatchSize %d: %v", len(seen), batch, seen)
		}
	}
}

// leaseGauge records each claim's limit and, after each claim, how many
// rows the database has leased to the owner.
type leaseGauge struct {
	recordCounter
	t      *testing.T
	db     *sql.DB
	owner  string
	limits []int
	peak   int
}

func (g *leaseGauge) Claim(ctx context.Context, p driver.ClaimParams) ([]driver.Row, error) {
	rows, err := g.recordCounter.Claim(ctx, p)
	n := count(g.t, g.db, "status = 0 AND lease_owner = '"+g.owner+"'")
	g.mu.Lock()
	g.limits = append(g.limits, p.Limit)
	g.peak = max(g.peak, n)
	g.mu.Unlock()
	return rows, err
}

// The results a claim takes along make room for it: with MaxInFlight equal
// to BatchSize, the rows published but not yet recorded would otherwise
// leave no room, and every claim would wait for a recording of its own (a
// commit) first. Results are recorded with claims, claims take half a
// batch or more, and the database never has more than MaxInFlight rows
// leased to the relay after a claim.
func TestCarriedResultsMakeRoom(t *testing.T) {
	forEachDialect(t, func(t *testing.T, db *sql.DB, d dialect.Dialect, drv driver.Driver) {
		ins := insertEvents(t, db, d, roundRobin(200, 200)...)
		g := &leaseGauge{recordCounter: recordCounter{Driver: drv}, t: t, db: db, owner: "carry"}
		pub := newRecPub(t)
		opts := testOptions(pub, "carry")
		opts.BatchSize = 10
		opts.MaxInFlight = 10
		opts.ParallelClaims = 1
		failOnPollErrors(t, &opts)
		n, err := mustRelay(t, g, opts).RunOnce(context.Background())
		if err != nil || n != len(ins) {
			t.Fatalf("RunOnce = %d, %v; want %d", n, err, len(ins))
		}
		checkPublishedOnce(t, pub, ins)
		g.mu.Lock()
		defer g.mu.Unlock()
		if g.peak > opts.MaxInFlight {
			t.Errorf("%d rows leased to the relay after a claim, MaxInFlight %d", g.peak, opts.MaxInFlight)
		}
		if most := 2*len(ins)/opts.BatchSize + 2; len(g.limits) > most {
			t.Errorf("%d claims for %d rows, want at most %d (limits: %v)", len(g.limits), len(ins), most, g.limits)
		}
		// Without the room, nearly every claim waited for a recording
		// alone; a few can still happen, when results straggle in for
		// longer than recordDelay (a loaded machine).
		if g.records*4 > g.claims {
			t.Errorf("%d recordings alone beside %d claims, want results recorded with claims", g.records, g.claims)
		}
	})
}

// TestRunOnceOwedClaimRunsAtOnce: when the last short claims of a RunOnce
// ran beside other work, none of them can tell that nothing is left; the
// pipeline then makes one more claim at once, with nothing beside it, and
// that one ends RunOnce. It used to wait PollInterval for it: the
// sweeper's is a minute, and a sweep of six rows took one or two minutes
// and published rows that had become overdue meanwhile (seen in CI, then
// in about 1 of 40 runs of TestSweepRescuesStuckRows on PostgreSQL).
func TestRunOnceOwedClaimRunsAtOnce(t *testing.T) {
	forEachDialect(t, func(t *testing.T, db *sql.DB, d dialect.Dialect, drv driver.Driver) {
		opts := testOptions(newRecPub(t), "owed")
		opts.PollInterval = time.Hour
		r := mustRelay(t, drv, opts)
		p := r.newPipeline(context.Background(), modeOnce)
		defer p.flow.pool.Stop()
		// Two claims in flight, the second started beside the first; both
		// come back short, the second first (as in the sweeper's trace).
		p.claimNow = false
		batch := r.opts.BatchSize
		p.claimSeq, p.claiming, p.claimRows = 2, 2, 2*batch
		p.claimReturned(claimOutcome{seq: 2, limit: batch, claimedAt: time.Now()})
		p.claimReturned(claimOutcome{seq: 1, limit: batch, wasIdle: true, claimedAt: time.Now()})
		if p.done {
			t.Fatal("RunOnce ended on short claims that ran beside each other: rows one passed over as locked by the other would be left")
		}
		if wake := p.nextWake(time.Now()); wake != 0 {
			t.Fatalf("the loop would sleep %s before the deciding claim, want 0", wake)
		}
		acted, err := p.act()
		if err != nil || !acted || p.claiming != 1 {
			t.Fatalf("act = %v, %v with %d claims in flight; want the deciding claim started", acted, err, p.claiming)
		}
		out := <-p.claimed
		if out.err != nil || !out.wasIdle {
			t.Fatalf("deciding claim: err %v, made with nothing beside it %v", out.err, out.wasIdle)
		}
		p.claimReturned(out)
		if !p.done {
			t.Fatal("a short claim made with nothing beside it did not end RunOnce")
		}
	})
}

// fromCounter counts the claims that read from a front
// (ClaimParams.From).
type fromCounter struct {
	driver.Driver
	from atomic.Int64
}

func (c *fromCounter) Claim(ctx context.Context, p driver.ClaimParams) ([]driver.Row, error) {
	if !p.From.IsZero() {
		c.from.Add(1)
	}
	return c.Driver.Claim(ctx, p)
}

// While a backlog drains, claims read from the front of the last one
// (PostgreSQL). A row that becomes pending before that front, here the
// event of a transaction that began before the backlog was written and
// commits while it drains (a row is due from its transaction's start), is
// not lost, nor left until the backlog is gone: a claim from the start
// finds it within rescanEvery.
func TestRowBeforeTheFrontPublishedWhileDraining(t *testing.T) {
	forEachDialect(t, func(t *testing.T, db *sql.DB, d dialect.Dialect, drv driver.Driver) {
		if d == dialect.SQLite {
			t.Skip("SQLite: one writer; the open transaction would hold the backlog's writes back")
		}
		ctx := context.Background()
		tx, err := db.BeginTx(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		defer tx.Rollback() //nolint:errcheck
		lateID, err := outbox.MustNewWriter(d, table).Insert(ctx, tx, outbox.Event{Type: "ORDER_PAID", Topic: "orders", Key: "late", Version: 2, Payload: map[string]any{"late": true}})
		if err != nil {
			t.Fatal(err)
		}
		late := lateID.String()
		time.Sleep(10 * time.Millisecond) // the backlog is due after it
		const n = 3000
		var evs []ev
		for i := range n {
			evs = append(evs, ev{Key: fmt.Sprintf("b%03d", i%300)})
		}
		insertEvents(t, db, d, evs...)

		pub := newRecPub(t)
		pub.setFail(func(*message.Message) error { time.Sleep(5 * time.Millisecond); return nil }) // a drain of seconds
		opts := testOptions(pub, "relay-1")
		opts.BatchSize, opts.Concurrency = 50, 4
		opts.PollInterval = time.Minute // only the relay's own claims
		counted := &fromCounter{Driver: drv}
		runRelay(t, mustRelay(t, counted, opts))
		waitFor(t, "the drain to be under way", func() bool { return count(t, db, "status = 1") >= 300 })
		if err := tx.Commit(); err != nil {
			t.Fatal(err)
		}
		committed := time.Now()
		waitFor(t, "the late event to be published", func() bool { return pub.successCount()[late] > 0 })
		took, left := time.Since(committed), count(t, db, "status = 0")
		t.Logf("the late event was published %s after its commit, with %d rows of the backlog left; %d claims read from a front", took.Round(time.Millisecond), left, counted.from.Load())
		// It takes about 4 s to drain, at most rescanEvery (1 s) plus a
		// claim to find the late row: a tenth of the backlog is a wide
		// margin. Without claims from the start it goes with the last.
		if left < n/10 {
			t.Errorf("the late event was published %s after its commit, with %d rows of the backlog left: it waited for the end of the backlog", took.Round(time.Millisecond), left)
		}
		if d == dialect.Postgres && counted.from.Load() == 0 {
			t.Error("no claim read from a front while the backlog drained")
		}
		waitFor(t, "the backlog to drain", func() bool { return count(t, db, "status = 0") == 0 })
		if got := len(pub.successCount()); got != n+1 {
			t.Errorf("%d distinct events published, want %d", got, n+1)
		}
	})
}

// emptyClaims counts the claims that came back full and those that found
// nothing to lease or hold.
type emptyClaims struct {
	driver.Driver
	mu          sync.Mutex
	full, empty int
}

func (e *emptyClaims) Claim(ctx context.Context, p driver.ClaimParams) ([]driver.Row, error) {
	var res driver.ClaimResult
	if p.Result == nil {
		p.Result = &res
	}
	rows, err := e.Driver.Claim(ctx, p)
	if err == nil {
		e.mu.Lock()
		switch {
		case len(rows)+p.Result.Moved >= p.Limit:
			e.full++
		case len(rows)+p.Result.Moved == 0:
			e.empty++
		}
		e.mu.Unlock()
	}
	return rows, err
}

// A backlog of few keys: each claim leases a row of every key, and the
// rows left wait behind them until their results are recorded. A claim
// that found nothing beside rows in flight makes the relay claim in step
// with its recordings instead of at once after every full claim (which
// found nothing again: on MySQL and SQLite after reading every due row).
func TestFewKeysClaimInStepWithRecordings(t *testing.T) {
	forEachDialect(t, func(t *testing.T, db *sql.DB, d dialect.Dialect, drv driver.Driver) {
		ins := insertEvents(t, db, d, roundRobin(600, 3)...)
		ec := &emptyClaims{Driver: drv}
		pub := newRecPub(t)
		opts := testOptions(pub, "few")
		opts.BatchSize = 6
		opts.MaxInFlight = 60
		failOnPollErrors(t, &opts)
		start := time.Now()
		n, err := mustRelay(t, ec, opts).RunOnce(context.Background())
		took := time.Since(start)
		if err != nil || n != len(ins) {
			t.Fatalf("RunOnce = %d, %v; want %d", n, err, len(ins))
		}
		checkPublishedOnce(t, pub, ins)
		checkKeyOrder(t, pub, ins)
		ec.mu.Lock()
		defer ec.mu.Unlock()
		t.Logf("%d full claims, %d found nothing, in %v", ec.full, ec.empty, took)
		// Without the rule every full claim is followed by one or two
		// that find nothing (ParallelClaims 2): 51 to 201 of them in 2 to
		// 5 s. With it, at most the two that start a window each
		// rescanEvery, and the last one.
		if want := 2*int(took/time.Second+1) + 3; ec.empty > want {
			t.Fatalf("%d claims found nothing beside %d full ones in %v, want at most %d: claims in step with the recordings", ec.empty, ec.full, took, want)
		}
	})
}

// The same backlog with slow publishes, so that the drain outlasts
// several saturated windows: when one ends, the first claim tells whether
// the rows still wait, and no claim starts beside it to read past them
// all at the same moment. At most one claim that finds nothing per
// rescanEvery.
func TestFewKeysOneRescanPerWindow(t *testing.T) {
	forEachDialect(t, func(t *testing.T, db *sql.DB, d dialect.Dialect, drv driver.Driver) {
		ins := insertEvents(t, db, d, roundRobin(900, 3)...)
		ec := &emptyClaims{Driver: drv}
		pub := newRecPub(t)
		pub.setFail(func(*message.Message) error { time.Sleep(12 * time.Millisecond); return nil })
		opts := testOptions(pub, "few")
		opts.BatchSize = 6
		opts.MaxInFlight = 60
		opts.PollInterval = 2 * time.Second // the default: polls come after the window
		failOnPollErrors(t, &opts)
		// Run, not RunOnce, which ends with claims of its own.
		start := time.Now()
		stop := runRelay(t, mustRelay(t, ec, opts))
		waitFor(t, "every event published", func() bool { return len(pub.successes()) >= len(ins) })
		took := time.Since(start)
		stop()
		checkPublishedOnce(t, pub, ins)
		checkKeyOrder(t, pub, ins)
		ec.mu.Lock()
		defer ec.mu.Unlock()
		t.Logf("%d full claims, %d found nothing, in %v", ec.full, ec.empty, took)
		// The two claims beside the first full one (before the relay
		// knows), one per window, and the last ones of the drain: 6 to 8
		// in 4.5 s (6 to 10 since a claim that finds nothing beside one
		// that leased rows no longer starts a window: the next, alone,
		// does). Before, two claims started together when a window
		// ended: 11 or 12.
		if want := int(took/time.Second+1) + 5; ec.empty > want {
			t.Fatalf("%d claims found nothing beside %d full ones in %v, want at most %d: one per rescanEvery", ec.empty, ec.full, took, want)
		}
	})
}

// orderPub records the event ids it publishes, in order, and holds the
// publish of one of them until release is closed.
type orderPub struct {
	mu      sync.Mutex
	order   []string
	hold    string
	release chan struct{}
}

func (p *orderPub) Publish(_ string, msgs ...*message.Message) error {
	for _, m := range msgs {
		p.mu.Lock()
		p.order = append(p.order, m.UUID)
		p.mu.Unlock()
		if m.UUID == p.hold {
			<-p.release
		}
	}
	return nil
}

func (p *orderPub) Close() error { return nil }

func (p *orderPub) published() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return slices.Clone(p.order)
}

// A unit keeps its slot from its first row to its last: with one slot,
// the units that queued for it while a key's first row published wait
// until the key's other rows are out too, instead of each row of the key
// queueing again behind all of them (which made a key with many rows in
// flight go out at a fraction of its publish rate while the other keys
// waited on it).
func TestUnitKeepsItsSlot(t *testing.T) {
	_, drv := sqliteRelayDB(t) // no statement runs: publishUnit alone
	row := func(id int64, key string) driver.Row {
		return driver.Row{ID: id, EventID: uuid.NewString(), Type: "T", Key: key, Topic: "t", Version: 1, Payload: []byte(`{}`)}
	}
	hot := []driver.Row{row(1, "hot"), row(2, "hot"), row(3, "hot")}
	pub := &orderPub{hold: hot[0].EventID, release: make(chan struct{})}
	opts := testOptions(pub, "slot")
	r := mustRelay(t, drv, opts)
	f := &flow{slots: make(chan struct{}, 1), kick: make(chan struct{}, 1), batch: 100, pool: workers.New()}
	defer f.pool.Stop()
	f.typ.Set(time.Second, 0) // slowAfter: SlowPublish, so the held publish stays in its slot
	ctx := context.Background()
	var wg sync.WaitGroup
	publish := func(unit []driver.Row) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var res unitResult
			r.publishUnit(ctx, nil, f, unit, &res)
			if len(res.sent) != len(unit) {
				t.Errorf("unit %s: sent %v of %d rows, release %v", unit[0].Key, res.sent, len(unit), res.release)
			}
		}()
	}
	publish(hot)
	waitFor(t, "hot's first publish under way", func() bool { return len(pub.published()) == 1 })
	var want []string
	for _, rw := range hot {
		want = append(want, rw.EventID)
	}
	for i := range 5 {
		k := row(int64(10+i), fmt.Sprintf("k%d", i))
		want = append(want, k.EventID)
		publish([]driver.Row{k})
	}
	time.Sleep(50 * time.Millisecond) // the other units queue for the slot
	close(pub.release)
	wg.Wait()
	got := pub.published()
	if len(got) != len(want) || !slices.Equal(got[:3], want[:3]) {
		key := map[string]string{}
		for i, id := range want {
			key[id] = fmt.Sprint(i)
		}
		var order []string
		for _, id := range got {
			order = append(order, key[id])
		}
		t.Fatalf("published rows %v (hot's: 0, 1, 2; the others queued for the slot while 0 published), want hot's first, one after the other", order)
	}
}

// A claim that finds nothing beside a claim of ours that leased rows says
// little about the backlog (the rows it needed may be the ones the other
// locked and leased, and the rows behind them looked free to it, so it
// left them alone): the relay does not take it for saturation (claims in
// step with its recordings for rescanEvery, which stalled the other keys
// whenever a key with a long backlog leased its next rows), but claims
// one at a time for that long, at once after a full claim. A claim that
// finds nothing alone still means saturation.
func TestEmptyClaimBesideLeasingClaim(t *testing.T) {
	_, drv := sqliteRelayDB(t) // the pipeline's bookkeeping: no claim runs
	r := mustRelay(t, drv, testOptions(newRecPub(t), "empty"))
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	empty := func(p *pipeline) claimOutcome {
		p.claiming++
		p.claimRows += 10
		return claimOutcome{limit: 10, inFlight: 5, leased: p.leasedClaims, claimedAt: time.Now()}
	}

	p := r.newPipeline(ctx, modeRun)
	p.claimReturned(empty(p))
	if p.saturatedAt.IsZero() {
		t.Fatal("a claim that found nothing alone, beside rows in flight: not saturated")
	}

	p = r.newPipeline(ctx, modeRun)
	out := empty(p)
	p.leasedClaims++ // a claim that ran beside it returned leased rows
	p.claimReturned(out)
	if !p.saturatedAt.IsZero() {
		t.Fatal("a claim that found nothing beside a claim that leased rows: saturated")
	}
	if !time.Now().Before(p.aloneUntil) {
		t.Fatalf("aloneUntil %v: claims still start beside each other", p.aloneUntil)
	}

	p = r.newPipeline(ctx, modeRun)
	out = empty(p)
	p.claiming++ // another claim still runs
	p.claimReturned(out)
	if !p.saturatedAt.IsZero() || p.aloneUntil.IsZero() {
		t.Fatalf("a claim that found nothing beside a claim still running: saturated at %v, alone until %v", p.saturatedAt, p.aloneUntil)
	}
}

// lostClaim makes one claim that runs beside another find nothing, as
// when the rows it needed were the ones the other claim locked and leased
// (SKIP LOCKED): it records what it carries, gives back what it leased and
// returns after the other claims, with no rows.
type lostClaim struct {
	driver.Driver
	mu      sync.Mutex
	running int
	started int
	others  *sync.Cond // signalled when a claim returns
	chosen  bool       // the claim to lose is chosen
	lost    bool       // it returned
}

func (l *lostClaim) Claim(ctx context.Context, p driver.ClaimParams) ([]driver.Row, error) {
	l.mu.Lock()
	l.running++
	l.started++
	// Not one of the first claims: rows of the relay's are in flight by
	// then.
	lose := l.running > 1 && !l.chosen && l.started > 4
	l.chosen = l.chosen || lose
	l.mu.Unlock()
	rows, err := l.Driver.Claim(ctx, p)
	if !lose || err != nil {
		l.mu.Lock()
		l.running--
		l.others.Broadcast()
		l.mu.Unlock()
		return rows, err
	}
	_, err = l.Driver.Release(ctx, p.Owner, rowIDsOf(rows))
	if p.Result != nil {
		p.Result.Moved = 0
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	for l.running > 1 {
		l.others.Wait()
	}
	l.running--
	l.lost = true
	return nil, err
}

// The same end to end: a relay whose claim lost such a race publishes
// every event once, in key order.
func TestLostClaimRace(t *testing.T) {
	forEachDialect(t, func(t *testing.T, db *sql.DB, d dialect.Dialect, drv driver.Driver) {
		if d == dialect.SQLite {
			t.Skip("SQLite runs one claim at a time")
		}
		ins := insertEvents(t, db, d, roundRobin(3000, 300)...)
		lc := &lostClaim{Driver: drv}
		lc.others = sync.NewCond(&lc.mu)
		pub := newRecPub(t)
		pub.setFail(func(*message.Message) error { time.Sleep(time.Millisecond); return nil })
		opts := testOptions(pub, "race")
		opts.BatchSize = 10
		opts.MaxInFlight = 100
		failOnPollErrors(t, &opts)
		stop := runRelay(t, mustRelay(t, lc, opts))
		waitFor(t, "every event published", func() bool { return len(pub.successes()) >= len(ins) })
		stop()
		checkPublishedOnce(t, pub, ins)
		checkKeyOrder(t, pub, ins)
		lc.mu.Lock()
		defer lc.mu.Unlock()
		if !lc.lost {
			t.Fatal("no claim ran beside another: nothing tested")
		}
	})
}

// overlapDriver counts the calls recording failures or releases
// (endsLeases) that ran beside a claim: bounded (their context ends
// before the lease of their rows could lapse) or not.
type overlapDriver struct {
	driver.Driver
	// remaining returns the shortest lease left of rows ids in the
	// database (false: none of them leased).
	remaining func(ids []int64) (time.Duration, bool)
	mu        sync.Mutex
	running   int // claims and recordings under way
	unbounded int // of them, those ending leases with no deadline
	overlaps  int // calls beside an unbounded one, or unbounded beside another
	late      int // deadlines past their rows' lease in the database
	checked   int // deadlines compared with it
	ended     int // calls that ended leases
	bounded   int // of them, bounded and beside another call
	beside    int // calls that started beside another
}

func (o *overlapDriver) enter(ctx context.Context, rec *driver.Results) func() {
	ends := endsLeases(rec)
	dl, bounded := ctx.Deadline()
	late, checked := false, false
	if ends && bounded {
		// No heartbeat runs while a claim does: the leases stand.
		ids := slices.Clone(rec.Release)
		for _, f := range rec.Failures {
			ids = append(ids, f.Row.ID)
		}
		left, ok := o.remaining(ids)
		checked = ok
		late = ok && time.Until(dl) > left+50*time.Millisecond // the query's own time
	}
	o.mu.Lock()
	if late {
		o.late++
	}
	if checked {
		o.checked++
	}
	free := ends && !bounded
	if (free && o.running > 0) || o.unbounded > 0 {
		o.overlaps++
	}
	if o.running > 0 {
		o.beside++
		if ends && bounded {
			o.bounded++
		}
	}
	o.running++
	if ends {
		o.ended++
	}
	if free {
		o.unbounded++
	}
	o.mu.Unlock()
	return func() {
		o.mu.Lock()
		o.running--
		if free {
			o.unbounded--
		}
		o.mu.Unlock()
	}
}

func (o *overlapDriver) Claim(ctx context.Context, p driver.ClaimParams) ([]driver.Row, error) {
	defer o.enter(ctx, p.Record)()
	return o.Driver.Claim(ctx, p)
}

func (o *overlapDriver) Record(ctx context.Context, owner string, r driver.Results) (driver.Recorded, error) {
	defer o.enter(ctx, &r)()
	return o.Driver.Record(ctx, owner, r)
}

// TestLeaseEndingResultsBesideClaimsEndInTime: failures and releases are
// recorded beside another claim only by a call whose context ends before
// their rows' leases could lapse (safeBeside, recordBy; each deadline is
// compared with the leases in the database, and a deadline 3 s later
// fails every call), since their
// owner fence cannot tell a lapsed lease of this relay from its new one,
// leased by a claim running beside the recording; the others with no
// claim beside them. A backlog of many keys with one publish in ten
// failing, claims running two at a time: before, claims carrying failures
// ran beside other claims, unbounded, about once each.
func TestLeaseEndingResultsBesideClaimsEndInTime(t *testing.T) {
	forEachDialect(t, func(t *testing.T, db *sql.DB, d dialect.Dialect, drv driver.Driver) {
		if d == dialect.SQLite {
			t.Skip("SQLite runs one claim at a time")
		}
		var evs []ev
		for i := range 3000 {
			evs = append(evs, ev{Key: fmt.Sprintf("k%d", i%300)})
		}
		insertEvents(t, db, d, evs...)
		pub := newRecPub(t)
		var n atomic.Int64
		pub.setFail(func(*message.Message) error {
			if n.Add(1)%10 == 0 {
				return errors.New("transient (injected)")
			}
			return nil
		})
		opts := testOptions(pub, "ending")
		opts.BatchSize = 20
		opts.ParallelClaims = 2
		failOnPollErrors(t, &opts)
		od := &overlapDriver{Driver: drv, remaining: func(ids []int64) (time.Duration, bool) {
			list := make([]string, len(ids))
			for i, id := range ids {
				list[i] = strconv.FormatInt(id, 10)
			}
			in := strings.Join(list, ", ")
			q := "SELECT EXTRACT(EPOCH FROM MIN(lease_expires_at) - clock_timestamp()) * 1000000 FROM " + table + " WHERE id IN (" + in + ")"
			if d == dialect.MySQL {
				q = "SELECT TIMESTAMPDIFF(MICROSECOND, CURRENT_TIMESTAMP(6), MIN(lease_expires_at)) FROM " + table + " WHERE id IN (" + in + ")"
			}
			var us sql.NullFloat64
			if err := db.QueryRow(q).Scan(&us); err != nil {
				t.Error(err)
				return 0, false
			}
			return time.Duration(us.Float64) * time.Microsecond, us.Valid
		}}
		start := time.Now()
		stop := runRelay(t, mustRelay(t, od, opts))
		waitFor(t, "all sent", func() bool { return count(t, db, "status = 1") == len(evs) })
		took := time.Since(start)
		stop()
		od.mu.Lock()
		defer od.mu.Unlock()
		t.Logf("drained in %v; %d calls recorded failures or releases, %d of them bounded beside another call, %d deadlines compared with the database's lease; %d calls ran beside another; %d publishes",
			took.Round(time.Millisecond), od.ended, od.bounded, od.checked, od.beside, n.Load())
		if od.ended == 0 || od.bounded == 0 || od.checked == 0 {
			t.Fatalf("%d calls recorded failures, %d of them beside another call, %d deadlines compared: the test needs all three (recording them all alone drains a quarter as fast)", od.ended, od.bounded, od.checked)
		}
		if od.overlaps > 0 || od.late > 0 {
			t.Fatalf("%d times a claim ran beside a call recording failures or releases with no deadline; %d deadlines past their rows' lease in the database (of %d such calls)", od.overlaps, od.late, od.ended)
		}
	})
}

// staleBesideDriver stages TestStaleFailureBesideClaimLeavesNewLease
// around row x (by event id): the extensions of x's first lease fail, so
// it lapses while the relay runs; the claim that leases x again (the
// second to return it) lets x's first publish fail now, and waits up to
// hold for a claim carrying that stale failure to record it, before it
// returns.
type staleBesideDriver struct {
	driver.Driver
	x        string
	hold     time.Duration
	mu       sync.Mutex
	xRow     int64         // x's row id, once claimed
	xLeases  int           // claims that returned x
	lapse    bool          // x's extensions fail
	failX    chan struct{} // closed when x is leased again
	recorded chan struct{} // closed when a claim carrying x's stale result recorded it
	once     sync.Once
}

func (s *staleBesideDriver) ExtendLease(ctx context.Context, o string, ids []int64, l time.Duration) (int64, error) {
	s.mu.Lock()
	lapse := s.lapse
	s.mu.Unlock()
	if lapse {
		// The statement extends every row but x: a failed extension
		// of x alone. The relay stops x's batch (errLeaseLost); x's
		// publish runs on, as a publish that ignores its context does.
		ids = slices.DeleteFunc(slices.Clone(ids), func(id int64) bool { return id == s.xID() })
	}
	return s.Driver.ExtendLease(ctx, o, ids, l)
}

func (s *staleBesideDriver) xID() int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.xRow
}

func (s *staleBesideDriver) Claim(ctx context.Context, p driver.ClaimParams) ([]driver.Row, error) {
	carries := false
	if p.Record != nil {
		id := s.xID()
		carries = slices.Contains(p.Record.Release, id) || slices.ContainsFunc(p.Record.Failures, func(f driver.Failure) bool { return f.Row.ID == id })
	}
	rows, err := s.Driver.Claim(ctx, p)
	if carries && err == nil {
		s.once.Do(func() { close(s.recorded) })
	}
	for _, rw := range rows {
		if rw.EventID != s.x {
			continue
		}
		s.mu.Lock()
		s.xLeases++
		n := s.xLeases
		s.xRow = rw.ID
		s.lapse = n == 1
		s.mu.Unlock()
		if n == 2 {
			close(s.failX)
			select {
			case <-s.recorded:
			case <-time.After(s.hold):
			}
		}
	}
	return rows, err
}

// TestStaleFailureBesideClaimLeavesNewLease (argued by review
// helper-104): the lease of row x lapses while its publish runs (its
// extensions fail), and a claim leases x again; before that claim
// returns, x's first publish fails, and the failure, still x's to file
// as far as the relay knows, is carried by a claim running beside it.
// Fenced by owner name alone, that retry ended the new lease while x
// was being published again, and the relay leased and published x a
// third time beside that publish. Failures and releases of a batch whose
// extensions failed are now recorded with no claim beside them
// (safeBeside): the claim that leased x again returns first and drops
// the stale failure (dropPending).
func TestStaleFailureBesideClaimLeavesNewLease(t *testing.T) {
	forEachDialect(t, func(t *testing.T, db *sql.DB, d dialect.Dialect, drv driver.Driver) {
		if d == dialect.SQLite {
			t.Skip("SQLite runs one claim at a time")
		}
		evs := []ev{{Key: "x"}}
		for i := range 12000 {
			evs = append(evs, ev{Key: fmt.Sprintf("k%d", i%500)}) // a backlog: claims run two at a time
		}
		x := insertEvents(t, db, d, evs...)[0].ID
		sd := &staleBesideDriver{Driver: drv, x: x, hold: 500 * time.Millisecond,
			failX: make(chan struct{}), recorded: make(chan struct{})}
		pub := newRecPub(t)
		var xs publishCount
		pub.setFail(func(m *message.Message) error {
			if m.UUID != x {
				time.Sleep(2 * time.Millisecond)
				return nil
			}
			a, done := xs.start()
			defer done()
			switch a {
			case 1:
				select {
				case <-sd.failX:
				case <-time.After(20 * time.Second):
				}
				return errors.New("transient (injected)")
			case 2:
				time.Sleep(1500 * time.Millisecond) // the new lease's publish
			}
			return nil
		})
		opts := testOptions(pub, "stale-beside")
		opts.LeaseDuration = 1500 * time.Millisecond
		opts.ShutdownTimeout = time.Second
		opts.BatchSize = 20
		opts.MaxInFlight = 200
		opts.Concurrency = 4
		opts.ParallelClaims = 2
		el := &errLog{}
		opts.Logger = slogNew(el)
		stop := runRelay(t, mustRelay(t, sd, opts))
		waitFor(t, "x sent", func() bool { return state(t, db, d, x).Status == 1 })
		time.Sleep(time.Second) // a third lease of x would be published by now
		stop()
		stale := false
		select {
		case <-sd.recorded:
			stale = true
		default:
		}
		sd.mu.Lock()
		leases := sd.xLeases
		sd.mu.Unlock()
		t.Logf("leases of x: %d; a claim beside the new lease recorded the stale failure: %v", leases, stale)
		if leases < 2 {
			t.Fatalf("x was leased %d times: its first lease did not lapse and x was not leased again, the case under test", leases)
		}
		xs.atMostTwice(t, el)
	})
}
