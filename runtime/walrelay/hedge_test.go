package walrelay_test

import (
	"encoding/json"
	"errors"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/outboxgen/outboxgen/runtime/walrelay"
)

// stallOnce passes Publish calls to a real broker, but the first call
// that carries the event of key stall with n 1 stalls instead: it sends
// nothing, and returns only once its message context is cancelled (a
// hedge won) and then hold is closed (when not nil), as a client that
// notices a cancellation late; or after the test's patience is gone.
type stallOnce struct {
	message.Publisher
	key  string
	hold chan struct{}

	mu        sync.Mutex
	stalled   bool
	cancelled atomic.Bool // the stalled call's context was cancelled
	returned  atomic.Bool // the stalled call returned
}

func (s *stallOnce) Publish(topic string, msgs ...*message.Message) error {
	var stall *message.Message
	s.mu.Lock()
	for _, m := range msgs {
		var p payload
		if err := json.Unmarshal(m.Payload, &p); err == nil && p.Key == s.key && p.N == 1 && !s.stalled {
			s.stalled, stall = true, m
		}
	}
	s.mu.Unlock()
	if stall == nil {
		return s.Publisher.Publish(topic, msgs...)
	}
	defer s.returned.Store(true)
	select {
	case <-stall.Context().Done():
		s.cancelled.Store(true)
		if s.hold != nil {
			<-s.hold
		}
		return stall.Context().Err()
	case <-time.After(time.Minute):
		return errors.New("stalled call gave up (test)")
	}
}

// TestHedgeFreesKeyBehindStalledCall: with Config.Hedge, a Publish call
// that stalls is sent again after HedgeAfter; the hedge's success lets
// the stalled key's next events go at once (the stall would hold them for
// PublishTimeout, 20s here), per-key order holds, the stalled call's
// message context is cancelled, the hedge is counted, and Run returns
// only after the stalled call did (it waits for a hedge's losing calls).
func TestHedgeFreesKeyBehindStalledCall(t *testing.T) {
	pool := logicalPool(t)
	b := startNATS(t)
	w := walWriter(t)
	reader, mp := testMeter(t)
	pub := &stallOnce{Publisher: b.pub, key: "stall", hold: make(chan struct{})}
	r := newRelay(t, pool, pub, func(c *walrelay.Config) {
		c.Hedge = true
		c.HedgeAfter = 50 * time.Millisecond
		c.PublishTimeout = 20 * time.Second
		c.MeterProvider = mp
	})
	stop := runRelay(t, r)
	waitFor(t, 30*time.Second, "the relay to stream", func() bool { return r.Status().Streaming })
	want := map[string]int{"stall": 3, "other": 3}
	start := time.Now()
	for i := 1; i <= 3; i++ {
		write(t, pool, w, false, payload{Key: "stall", N: i}, payload{Key: "other", N: i})
	}
	waitFor(t, 10*time.Second, "every event at the broker", func() bool { return distinct(b.messages(t)) >= 6 })
	took := time.Since(start)
	if dups := checkOrder(t, b.messages(t), want); dups != 0 {
		t.Errorf("%d duplicates: the stalled call sent nothing", dups)
	}
	waitFor(t, 5*time.Second, "the stalled call's message context to be cancelled once the hedge succeeded", pub.cancelled.Load)
	if took > 5*time.Second {
		t.Errorf("the events took %s: the hedge did not free the stalled key", took)
	}
	settled(t, "a hedge counted", 1, func() int64 { return int64(metricValues(t, reader)["outboxgen.relay.hedged"]) })
	stopped := make(chan struct{})
	go func() { stop(); close(stopped) }()
	select {
	case <-stopped:
		t.Error("Run returned while the stalled call was still running: it must wait for it (at most ShutdownTimeout)")
	case <-time.After(300 * time.Millisecond):
	}
	close(pub.hold)
	<-stopped
	if !pub.returned.Load() {
		t.Error("the stalled call did not return")
	}
	if st := r.Status(); st.Published != 6 || st.Parked != 0 {
		t.Errorf("status %+v: want 6 published, nothing parked", st)
	}
}

// TestNoHedgeWithoutConfig: without Config.Hedge the stalled call holds
// its key until it returns (the control of the test above).
func TestNoHedgeWithoutConfig(t *testing.T) {
	pool := logicalPool(t)
	b := startNATS(t)
	w := walWriter(t)
	pub := &stallOnce{Publisher: b.pub, key: "stall"}
	r := newRelay(t, pool, pub, func(c *walrelay.Config) { c.PublishTimeout = 2 * time.Second })
	runRelay(t, r)
	waitFor(t, 30*time.Second, "the relay to stream", func() bool { return r.Status().Streaming })
	start := time.Now()
	write(t, pool, w, false, payload{Key: "stall", N: 1}, payload{Key: "stall", N: 2})
	waitFor(t, 20*time.Second, "both events at the broker", func() bool { return distinct(b.messages(t)) >= 2 })
	if took := time.Since(start); took < 2*time.Second {
		t.Errorf("the events took %s, less than the stalled call's PublishTimeout (2s): something was hedged without Config.Hedge", took)
	}
	checkOrder(t, b.messages(t), map[string]int{"stall": 2})
}

// TestSlowCallFreesItsWorker: with one worker (Concurrency 1) and no
// hedging, a call that stalls (until PublishTimeout, 10s) holds back its
// key only: once it counts as slow, another worker takes its place, and
// the other keys' events, written after the stall began, arrive while it
// lasts; the stalled key's next event waits for it (per-key order).
func TestSlowCallFreesItsWorker(t *testing.T) {
	pool := logicalPool(t)
	b := startNATS(t)
	w := walWriter(t)
	pub := &stallOnce{Publisher: b.pub, key: "stall"}
	r := newRelay(t, pool, pub, func(c *walrelay.Config) {
		c.Concurrency = 1
		c.PublishTimeout = 10 * time.Second
	})
	runRelay(t, r)
	waitFor(t, 30*time.Second, "the relay to stream", func() bool { return r.Status().Streaming })
	write(t, pool, w, false, payload{Key: "stall", N: 1})
	waitFor(t, 10*time.Second, "the stalled call", func() bool {
		pub.mu.Lock()
		defer pub.mu.Unlock()
		return pub.stalled
	})
	start := time.Now()
	write(t, pool, w, false, payload{Key: "stall", N: 2})
	want := map[string]int{"stall": 2}
	// One at a time, each once the one before arrived: each is then
	// delivered alone (the path with a place of Concurrency of its own,
	// which the stalled delivery gives back too), not in a batch.
	for k := range 5 {
		key := "other" + strconv.Itoa(k)
		want[key] = 2
		for n := 1; n <= 2; n++ {
			write(t, pool, w, false, payload{Key: key, N: n})
			waitFor(t, 2*time.Second, key+"'s event while the call stalls", func() bool { return distinct(b.messages(t)) >= 2*k+n })
		}
	}
	if took := time.Since(start); took > 5*time.Second || pub.returned.Load() {
		t.Errorf("the other keys' events took %s (the stalled call returned: %v): they should not wait for it", took, pub.returned.Load())
	}
	for _, m := range b.messages(t) {
		if m.Key == "stall" {
			t.Errorf("event %d of the stalled key arrived before its first event's call returned", m.N)
		}
	}
	waitFor(t, 30*time.Second, "every event, once the stalled call timed out", func() bool { return distinct(b.messages(t)) >= 12 })
	checkOrder(t, b.messages(t), want)
}
