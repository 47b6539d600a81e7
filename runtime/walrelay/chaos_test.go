package walrelay

import (
	"context"
	"errors"
	"fmt"
	mathrand "math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.opentelemetry.io/otel/metric/noop"

	"github.com/outboxgen/outboxgen/internal/testdb"
	"github.com/outboxgen/outboxgen/runtime/dialect"
	"github.com/outboxgen/outboxgen/runtime/outbox"
	"github.com/outboxgen/outboxgen/templates"
)

// chaosPub fails, stalls and splits calls at random: any call fails at
// once 15 % of the time, runs 20–60 ms 5 % of the time (long enough to
// count as slow, and with Hedge to be hedged or split) and then fails
// half of those times; a call of several messages also fails at once
// another 25 % of the time; the others return within a millisecond. It records, per key,
// the sequence numbers of its first accepted deliveries, in the order
// the calls were accepted.
type chaosPub struct {
	mu    sync.Mutex
	rng   *mathrand.Rand
	first map[string][]int64 // key → sequences, first acceptance of each
	seen  map[string]bool    // message UUIDs accepted
	calls int
}

func (p *chaosPub) roll() float64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.calls++
	return p.rng.Float64()
}

func (p *chaosPub) Publish(_ string, msgs ...*message.Message) error {
	x := p.roll()
	switch {
	case x < 0.15:
		return errors.New("refused (test)")
	case x < 0.20:
		time.Sleep(time.Duration(20+int(x*1000)%40) * time.Millisecond)
		if int(x*10000)%2 == 0 {
			return errors.New("timed out (test)")
		}
	case len(msgs) > 1 && x < 0.45:
		return errors.New("batch refused (test)")
	default:
		time.Sleep(time.Duration(x * float64(time.Millisecond)))
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, m := range msgs {
		if p.seen[m.UUID] {
			continue // a hedge's or a resent call's repeat
		}
		p.seen[m.UUID] = true
		key := m.Metadata.Get(outbox.MetadataKey)
		seq, err := strconv.ParseInt(m.Metadata.Get(outbox.MetadataSequence), 10, 64)
		if err != nil {
			return fmt.Errorf("test: sequence %q: %w", m.Metadata.Get(outbox.MetadataSequence), err)
		}
		p.first[key] = append(p.first[key], seq)
	}
	return nil
}

func (p *chaosPub) Close() error { return nil }

// TestDispatcherChaos publishes 3,000 events of 40 keys on two topics
// through a publisher that refuses, stalls and splits calls at random,
// with Hedge off and on, and with few quick retries, so that events are
// parked in a real outbox table (their keys' later events behind them)
// after verdicts that waited for failed batches' events: every event is
// settled once, each key's accepted events are its first ones, in order,
// and the rest are parked (one may be both, see below); once all are settled the breaker counts
// nothing under way (a batch's events handed over and never released, or
// a call ended twice, would leave it off zero), and every place and
// stall is free.
func TestDispatcherChaos(t *testing.T) {
	for _, tc := range []struct {
		hedge, park bool
	}{{false, false}, {true, false}, {true, true}} {
		t.Run(fmt.Sprintf("hedge=%v,park=%v", tc.hedge, tc.park), func(t *testing.T) {
			seed := uint64(time.Now().UnixNano())
			t.Logf("seed %d", seed)
			pub := &chaosPub{rng: mathrand.New(mathrand.NewPCG(seed, 1)), first: map[string][]int64{}, seen: map[string]bool{}}
			rig := newDispatchRig(t, pub, func(c *Config) {
				c.Concurrency = 4
				c.QuickRetries = 1 << 20 // never parked
				if tc.park {
					c.QuickRetries = 2
				}
				c.RetryDelay = time.Millisecond
				c.BreakerBackoff = func(int) time.Duration { return 2 * time.Millisecond }
				c.PublishTimeout = 5 * time.Second
				c.Hedge = tc.hedge
				c.HedgeAfter = 10 * time.Millisecond
			})
			d := rig.d
			var pool *pgxpool.Pool
			if tc.park {
				pool = outboxPool(t)
				wq, err := dialect.NewWALQueries(dialect.Postgres, testdb.Tables.Outbox)
				if err != nil {
					t.Fatal(err)
				}
				d.r.q, d.r.pool = queries{wq}, pool
				if d.r.met, err = newMetrics(noop.NewMeterProvider(), d.r); err != nil {
					t.Fatal(err)
				}
			}
			const keys, perKey = 40, 75
			var seq int64 // the outbox row ids: unique, increasing per key
			seqs := map[string][]int64{}
			for round := range perKey {
				batch := make([]*event, 0, keys)
				for k := range keys {
					key := "k" + strconv.Itoa(k)
					seq++
					e := ev(key, "t"+strconv.Itoa((k+round)%2))
					e.Seq = seq
					seqs[key] = append(seqs[key], seq)
					batch = append(batch, e)
				}
				d.dispatch(batch...)
			}
			rig.settle(t, keys*perKey, 120*time.Second)
			select {
			case <-rig.settled:
				t.Fatal("an event was settled twice")
			case <-time.After(50 * time.Millisecond):
			}
			parked := map[string][]int64{}
			if tc.park {
				parked = parkedSeqs(t, pool)
			}
			pub.mu.Lock()
			nParked := 0
			for key, all := range seqs {
				got, rest := pub.first[key], parked[key]
				nParked += len(rest)
				// A call split by its hedge runs on as a loser, and may be
				// accepted after its event, published on its own, failed and
				// was parked: that event is then both (a duplicate, never a
				// loss). The events behind it are parked without a call.
				if len(got) > 0 && len(rest) > 0 && got[len(got)-1] == rest[0] && tc.hedge {
					got = got[:len(got)-1]
				}
				if !slices.Equal(append(slices.Clone(got), rest...), all) {
					t.Fatalf("key %s: accepted %v, parked %v: want its first events accepted in order and the rest parked, %v", key, pub.first[key], rest, all)
				}
			}
			calls := pub.calls
			pub.mu.Unlock()
			if tc.park && nParked == 0 {
				t.Error("nothing was parked: the test did not reach a verdict")
			}
			deadline := time.Now().Add(10 * time.Second)
			for {
				d.brk.mu.Lock()
				inflight := d.brk.inflight
				d.brk.mu.Unlock()
				losers := d.losers.Load()
				if inflight == 0 && losers == 0 && len(d.singles) == 0 && len(d.stalls) == 0 {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("all settled, yet %d publishes count as under way, %d losers, %d places and %d stalls taken", inflight, losers, len(d.singles), len(d.stalls))
				}
				time.Sleep(5 * time.Millisecond)
			}
			count := func(s string) int {
				rig.log.mu.Lock()
				defer rig.log.mu.Unlock()
				n := 0
				for _, l := range rig.log.lines {
					if strings.HasPrefix(l, s) {
						n++
					}
				}
				return n
			}
			t.Logf("%d calls for %d events; batches refused %d, split %d; breaker opened %d times; %d events parked",
				calls, keys*perKey, count("batch publish failed"), count("batch publish running long"), count("circuit breaker open"), nParked)
		})
	}
}

// outboxPool is a fresh PostgreSQL database with the outbox table, where
// the dispatcher parks events.
func outboxPool(t *testing.T) *pgxpool.Pool {
	t.Helper()
	pool := testdb.PgxPool(t)
	ddl, err := templates.Render("postgres", templates.Tables{Outbox: testdb.Tables.Outbox, Inbox: testdb.Tables.Inbox})
	if err != nil {
		t.Fatal(err)
	}
	for _, stmt := range templates.Statements(ddl) {
		if _, err := pool.Exec(context.Background(), stmt); err != nil {
			t.Fatalf("apply schema: %v\n%s", err, stmt)
		}
	}
	return pool
}

// parkedSeqs reads the parked rows' ids (their outbox_seq) by key, in
// order.
func parkedSeqs(t *testing.T, pool *pgxpool.Pool) map[string][]int64 {
	t.Helper()
	rows, err := pool.Query(context.Background(), "SELECT biz_id, id FROM "+testdb.Tables.Outbox+" ORDER BY id")
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	out := map[string][]int64{}
	for rows.Next() {
		var key string
		var id int64
		if err := rows.Scan(&key, &id); err != nil {
			t.Fatal(err)
		}
		out[key] = append(out[key], id)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}
