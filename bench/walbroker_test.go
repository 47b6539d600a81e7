package bench

import (
	"flag"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/outboxgen/outboxgen/internal/lagproxy"
	"github.com/outboxgen/outboxgen/internal/natstest"
	"github.com/outboxgen/outboxgen/runtime/brokers/natsjs"
	"github.com/outboxgen/outboxgen/runtime/walrelay"
)

var (
	flagBrokerLag   = flag.Duration("broker-lag", time.Millisecond, "BenchmarkWALBroker: how long the proxy holds what the relay's NATS client sends")
	flagBrownoutLag = flag.Duration("brownout-lag", 50*time.Millisecond, "BenchmarkWALBroker: the proxy's lag during the brownout runs' middle third")
)

// BenchmarkWALBroker is BenchmarkWAL's latency scenario (-wal-rate
// events/s for -wal-latency-for, COMMIT returned → published, fsync on)
// with a real broker a network away: the WAL relay publishes to NATS
// JetStream (nats-server in process, file store) through a proxy that
// holds what the client sends for -broker-lag (1 ms). "pipelined" is
// natsjs.Publisher, which sends a call's messages before it waits for
// their acknowledgements; "sequential" publishes them one by one, each
// waiting for its acknowledgement (what natsjs did before cd78d31).
// "brownout" runs are pipelined, with the broker -brownout-lag (50 ms)
// away for the middle third of the writing (a broker slow as a whole),
// without and with walrelay.Config.Hedge: how many messages the relay
// sends per event (hedges, split batches) and how many the stream
// stored (JetStream drops repeats by Nats-Msg-Id). -wal-rounds rounds,
// the modes in alternating order; medians.
//
//	OUTBOXGEN_TEST_POSTGRES_DSN=... go test ./bench -run '^$' -bench '^BenchmarkWALBroker$' -benchtime 1x
func BenchmarkWALBroker(b *testing.B) {
	if testing.Short() {
		b.Skip("heavy benchmark; not run with -short")
	}
	openServers(b).measure(b)
	srv := natstest.Start(b, nil)
	proxy := lagproxy.New(b, srv.Addr().String())
	pub, err := natsjs.NewPublisher(natsjs.Config{URL: "nats://" + proxy.Addr(), PublishTimeout: 10 * time.Second, AutoProvision: true})
	if err != nil {
		b.Fatal(err)
	}
	defer pub.Close()
	if err := pub.EnsureStream(topic); err != nil {
		b.Fatal(err)
	}
	proxy.SetLag(*flagBrokerLag)

	type result struct {
		lat         []time.Duration
		lost        int
		calls, msgs int64
		stored      uint64 // messages the stream stored during the run
	}
	js, err := pub.Conn().JetStream()
	if err != nil {
		b.Fatal(err)
	}
	storedNow := func() uint64 {
		info, err := js.StreamInfo(natsjs.DefaultStreamName(topic))
		if err != nil {
			b.Fatal(err)
		}
		return info.State.Msgs
	}
	runs := map[string][]result{}
	for round := range max(*flagWALRounds, 1) {
		modes := []string{"pipelined", "sequential", "brownout/hedge=off", "brownout/hedge=on"}
		if round%2 == 1 {
			slices.Reverse(modes)
		}
		for _, mode := range modes {
			b.Run(fmt.Sprintf("round%d/%s", round+1, mode), func(b *testing.B) {
				for range b.N {
					proxy.SetLag(*flagBrokerLag)
					rec := &ackedAt{recv: map[string]time.Time{}, seq: mode == "sequential", pub: pub}
					pool := walDB(b)
					_, stop := walRelay(b, pool, rec, func(c *walrelay.Config) { c.Hedge = mode == "brownout/hedge=on" })
					before := storedNow()
					if strings.HasPrefix(mode, "brownout") {
						// The broker turns slow as a whole for the middle
						// third of the writing.
						third := *flagWALLatFor / 3
						t := time.AfterFunc(third, func() {
							proxy.SetLag(*flagBrownoutLag)
							time.AfterFunc(third, func() { proxy.SetLag(*flagBrokerLag) })
						})
						defer t.Stop()
					}
					commits, returned := paced(b, pool, modeWAL, *flagWALLatFor, nil)
					deadline := time.Now().Add(time.Minute)
					for rec.count() < len(commits) && time.Now().Before(deadline) {
						time.Sleep(10 * time.Millisecond)
					}
					stop()
					var r result
					rec.mu.Lock()
					for id := range commits {
						got, ok := rec.recv[id]
						if !ok {
							r.lost++
							continue
						}
						r.lat = append(r.lat, max(got.Sub(returned[id]), 0))
					}
					rec.mu.Unlock()
					r.lat = sortDurations(r.lat)
					r.calls, r.msgs = rec.calls.Load(), rec.msgs.Load()
					r.stored = storedNow() - before
					if r.stored != uint64(len(commits)-r.lost) {
						b.Errorf("%s: the stream stored %d messages of %d events", mode, r.stored, len(commits)-r.lost)
					}
					runs[mode] = append(runs[mode], r)
					b.ReportMetric(float64(percentile(r.lat, 0.99).Microseconds())/1000, "p99-ms")
					b.ReportMetric(float64(r.msgs)/float64(max(len(commits), 1)), "msgs/event")
				}
			})
		}
	}
	var sb strings.Builder
	fmt.Fprintf(&sb, "\nWAL relay → NATS JetStream %s away (lagproxy), %d events/s for %s, COMMIT returned → acknowledged, ms (medians of %d rounds); brownout: %s away for the middle third\n\n",
		*flagBrokerLag, *flagWALRate, *flagWALLatFor, max(*flagWALRounds, 1), *flagBrownoutLag)
	sb.WriteString("| natsjs | p50 | p99 | p99.9 | max | events over 100 ms | events per Publish call | messages sent per event | stored per event | lost |\n|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n")
	for _, mode := range []string{"pipelined", "sequential", "brownout/hedge=off", "brownout/hedge=on"} {
		rs := runs[mode]
		if len(rs) == 0 {
			continue
		}
		col := func(f func(result) float64) float64 {
			v := make([]float64, len(rs))
			for i, r := range rs {
				v[i] = f(r)
			}
			return med(v)
		}
		q := func(p float64) func(result) float64 {
			return func(r result) float64 { return float64(percentile(r.lat, p).Microseconds()) / 1000 }
		}
		over := func(r result) float64 {
			n := 0
			for _, d := range r.lat {
				if d > 100*time.Millisecond {
					n++
				}
			}
			return float64(n)
		}
		events := func(r result) float64 { return float64(max(len(r.lat)+r.lost, 1)) }
		fmt.Fprintf(&sb, "| %s | %.1f | %.1f | %.1f | %.1f | %.0f | %.2f | %.3f | %.3f | %.0f |\n", mode, col(q(0.5)), col(q(0.99)), col(q(0.999)), col(q(1)), col(over),
			col(func(r result) float64 { return float64(r.msgs) / float64(max(r.calls, 1)) }),
			col(func(r result) float64 { return float64(r.msgs) / events(r) }),
			col(func(r result) float64 { return float64(r.stored) / events(r) }),
			col(func(r result) float64 { return float64(r.lost) }))
	}
	fmt.Println(sb.String())
}

// ackedAt publishes through pub (one call, or, with seq, one call per
// message) and records when each event was first acknowledged.
type ackedAt struct {
	pub         message.Publisher
	seq         bool
	calls, msgs atomic.Int64

	mu   sync.Mutex
	recv map[string]time.Time
}

func (a *ackedAt) Publish(topic string, msgs ...*message.Message) error {
	a.calls.Add(1)
	a.msgs.Add(int64(len(msgs)))
	if a.seq {
		for _, m := range msgs {
			if err := a.pub.Publish(topic, m); err != nil {
				return err
			}
		}
	} else if err := a.pub.Publish(topic, msgs...); err != nil {
		return err
	}
	now := time.Now()
	a.mu.Lock()
	for _, m := range msgs {
		if _, ok := a.recv[m.UUID]; !ok {
			a.recv[m.UUID] = now
		}
	}
	a.mu.Unlock()
	return nil
}

func (a *ackedAt) Close() error { return nil }

func (a *ackedAt) count() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return len(a.recv)
}
