package bench

import (
	"flag"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/outboxgen/outboxgen/runtime/relay"
)

var (
	flagFewRows = flag.Int("fewrows", 30_000, "BenchmarkFewKeys: backlog of each drain")
	flagFewKeys = flag.String("fewkeys", "10,100,1000", "BenchmarkFewKeys: distinct keys of the drains")
	flagHotRows = flag.Int("hotrows", 10_000, "BenchmarkFewKeys: rows of the one hot key queued before the others")
)

// BenchmarkFewKeys drains backlogs made of few keys, where each claim
// leases a batch of every key and the rows left wait behind them until
// their results are recorded:
//
//   - keys/<dialect>/<K>: -fewrows rows of K keys round robin (-fewkeys),
//     the relay with its defaults, no publish latency: rows per second;
//   - hot/<dialect>/<delay>: -hotrows rows of one key, then 2 × -hotrows
//     rows of 1,000 other keys (one relay, every publish delayed by
//     delay): when the other keys were drained, and when the hot one was.
//     A key is published in order, one row after the other, so the hot
//     key takes -hotrows × delay at least; the other keys should not wait
//     for it.
//
// Run it with (about 2 minutes):
//
//	go test ./bench -run '^$' -bench '^BenchmarkFewKeys$' -benchtime 1x
func BenchmarkFewKeys(b *testing.B) {
	if testing.Short() {
		b.Skip("heavy benchmark; not run with -short")
	}
	srv := openServers(b)
	b.Cleanup(func() { srv.restore(b) })
	for _, d := range []string{"postgres", "mysql"} {
		for _, f := range strings.Split(*flagFewKeys, ",") {
			var k int
			if _, err := fmt.Sscan(strings.TrimSpace(f), &k); err != nil || k < 1 {
				b.Fatalf("-fewkeys: %q is not a number of keys", f)
			}
			b.Run(fmt.Sprintf("keys/%s/%d", d, k), func(b *testing.B) {
				defer withKeys(k)()
				for range b.N {
					r := runRelay(b, srv, d, *flagFewRows, relayRun{instances: 1})
					b.ReportMetric(r.rate, "rows/s")
					b.ReportMetric(r.claimMean, "claim_ms")
				}
			})
		}
	}
	for _, d := range []string{"postgres", "mysql"} {
		for _, delay := range []time.Duration{0, time.Millisecond} {
			b.Run(fmt.Sprintf("hot/%s/%v", d, delay), func(b *testing.B) {
				for range b.N {
					others, hot := drainHotKey(b, srv, d, delay)
					b.ReportMetric(others.Seconds(), "others_s")
					b.ReportMetric(hot.Seconds(), "hot_s")
				}
			})
		}
	}
}

// drainHotKey fills a fresh outbox of dialect d with -hotrows rows of key
// "hot", then twice as many of 1,000 other keys, and drains it with one
// relay whose publishes each take delay first. It returns when the last
// message of the other keys and of the hot key arrived, from the relay's
// start. The sink tells, not the database: a query of the pending rows
// every 20 ms took 4.1 s of the 11.8 s MariaDB spent in statements in a
// 1 ms run, on the cores the relay and the database share.
func drainHotKey(b *testing.B, srv *servers, d string, delay time.Duration) (others, hot time.Duration) {
	db := freshOutbox(b, d)
	srv.fill(b)
	insertRows(b, db, d, *flagHotRows, func(string) string { return "'hot'" })
	insertRows(b, db, d, 2**flagHotRows, func(g string) string { return concat(d, "order-", g+" % 1000") })
	analyze(b, db, d)
	s := newSink(b, 3**flagHotRows)
	r, err := relay.New(benchDriver(b, db, d), relay.Config{Publisher: s.publisher(delay), InstanceID: "bench-hot", Logger: discard})
	if err != nil {
		b.Fatal(err)
	}
	srv.measure(b)
	start, stop := background(b, "relay", r.Run)
	s.wait(b, 10*time.Minute)
	stop()
	var pending int
	if err := db.QueryRow(`SELECT COUNT(*) FROM outbox_event WHERE status <> 1`).Scan(&pending); err != nil {
		b.Fatal(err)
	}
	if pending != 0 {
		b.Fatalf("every message arrived, but %d rows are not marked sent", pending)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for key, at := range s.lastOf {
		if key == "hot" {
			hot = at.Sub(start)
		} else {
			others = max(others, at.Sub(start))
		}
	}
	return others, hot
}
