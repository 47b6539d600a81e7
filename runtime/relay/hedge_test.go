package relay

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"github.com/outboxgen/outboxgen/runtime/internal/hedge"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/outboxgen/outboxgen/runtime/dialect"
	"github.com/outboxgen/outboxgen/runtime/driver"
	"github.com/outboxgen/outboxgen/runtime/internal/telemetry"
)

// A key whose head's first publish hangs goes out through the hedge,
// in order, while that call still hangs; Run then waits for the hung
// call (it returns at the test's end) before it returns.
func TestHedgeFreesKeyBehindStalledCall(t *testing.T) {
	forEachDialect(t, func(t *testing.T, db *sql.DB, d dialect.Dialect, drv driver.Driver) {
		var evs []ev
		for range 5 {
			evs = append(evs, ev{Key: "stall"})
			for k := range 20 {
				evs = append(evs, ev{Key: fmt.Sprintf("k%02d", k)})
			}
		}
		ins := insertEvents(t, db, d, evs...)
		head := ins[0].ID
		pub := newRecPub(t)
		unblock := make(chan struct{})
		var once sync.Once
		release := func() { once.Do(func() { close(unblock) }) }
		t.Cleanup(release)
		var calls atomic.Int64
		pub.setFail(func(m *message.Message) error {
			if m.UUID == head && calls.Add(1) == 1 {
				<-unblock
			}
			return nil
		})
		opts := testOptions(pub, "hedge")
		opts.Hedge = true
		opts.HedgeAfter = 20 * time.Millisecond
		failOnPollErrors(t, &opts)
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		done := make(chan error, 1)
		go func() { done <- mustRelay(t, drv, opts).Run(ctx) }()
		waitFor(t, "every row sent while the head's first call hangs", func() bool {
			return count(t, db, "status = 1") == len(ins)
		})
		if n := pub.attemptsOf(head); n < 2 || n > 1+MaxHedges {
			t.Fatalf("head published %d times, want the hung call and 1 to %d hedges", n, MaxHedges)
		}
		checkKeyOrder(t, pub, ins)
		cancel()
		select {
		case err := <-done:
			t.Fatalf("Run returned (%v) while a publisher call it started still ran", err)
		case <-time.After(100 * time.Millisecond):
		}
		release()
		select {
		case err := <-done:
			if err != nil {
				t.Fatalf("Run: %v", err)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("Run did not return after the hung call did")
		}
	})
}

// hedgeRig is a relay on a SQLite file whose publishRow a test calls
// directly, with its hedge metric readable.
type hedgeRig struct {
	r      *Relay
	f      *flow
	reader *sdkmetric.ManualReader
}

func newHedgeRig(t *testing.T, pub message.Publisher) *hedgeRig {
	return newHedgeRigAfter(t, pub, 20*time.Millisecond)
}

func newHedgeRigAfter(t *testing.T, pub message.Publisher, after time.Duration) *hedgeRig {
	t.Helper()
	_, drv := sqliteRelayDB(t)
	reader := sdkmetric.NewManualReader()
	opts := testOptions(pub, "rig")
	opts.Hedge = true
	opts.HedgeAfter = after
	opts.MeterProvider = sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	r := mustRelay(t, drv, opts)
	f := newFlow(r.opts)
	t.Cleanup(func() {
		<-f.callsDone()
		f.pool.Stop()
	})
	return &hedgeRig{r: r, f: f, reader: reader}
}

// publish runs publishRow for a row with id 1 holding a slot, as
// publishUnit does.
func (h *hedgeRig) publish(abandon <-chan struct{}) error {
	h.f.slots <- struct{}{}
	held, err := h.r.publishRow(context.Background(), abandon, h.f, driver.Row{ID: 1, EventID: "0190a8e2-0000-7000-8000-000000000001", Type: "T", Key: "k", Topic: "t", Payload: []byte(`{}`)})
	if held {
		<-h.f.slots
	}
	return err
}

// gaugeValue reads the last value of the int64 gauge name, failing the
// test if it was never recorded.
func gaugeValue(t *testing.T, reader *sdkmetric.ManualReader, name string) int64 {
	t.Helper()
	var rm metricdata.ResourceMetrics
	if err := reader.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	var n int64
	found := false
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if m.Name == name {
				for _, p := range m.Data.(metricdata.Gauge[int64]).DataPoints {
					n += p.Value
					found = true
				}
			}
		}
	}
	if !found {
		t.Fatalf("%s was never recorded", name)
	}
	return n
}

// hedged reads outboxgen.relay.hedged.
func (h *hedgeRig) hedged(t *testing.T) int64 {
	t.Helper()
	var rm metricdata.ResourceMetrics
	if err := h.reader.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	var n int64
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if m.Name != telemetry.MetricHedged {
				continue
			}
			for _, p := range m.Data.(metricdata.Sum[int64]).DataPoints {
				n += p.Value
			}
		}
	}
	return n
}

// scriptPub answers the n-th call (from 0) with script[n]: it writes to
// the message's metadata (as some publishers do), waits for its gate
// (nil: no wait), for call afterCall to start (0: none), then its delay,
// and returns its error.
type scriptPub struct {
	mu      sync.Mutex
	calls   int
	script  []scripted
	started [4]chan struct{} // closed when call n starts
}

type scripted struct {
	delay     time.Duration
	gate      <-chan struct{}
	afterCall int
	err       error
}

func (p *scriptPub) Publish(_ string, msgs ...*message.Message) error {
	p.mu.Lock()
	s := scripted{}
	if p.calls < len(p.script) {
		s = p.script[p.calls]
	}
	if p.started[0] == nil {
		for i := range p.started {
			p.started[i] = make(chan struct{})
		}
	}
	if p.calls < len(p.started) {
		close(p.started[p.calls])
	}
	p.calls++
	wait := p.started[s.afterCall]
	p.mu.Unlock()
	for _, m := range msgs {
		m.Metadata.Set("published_by", "scriptPub")
	}
	if s.gate != nil {
		<-s.gate
	}
	if s.afterCall > 0 {
		<-wait
	}
	time.Sleep(s.delay)
	return s.err
}

func (p *scriptPub) Close() error { return nil }

func (p *scriptPub) count() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.calls
}

func TestPublishRowHedge(t *testing.T) {
	errFirst, errSecond := errors.New("first call failed"), errors.New("second call failed")
	after := func(d time.Duration) <-chan struct{} {
		c := make(chan struct{})
		time.AfterFunc(d, func() { close(c) })
		return c
	}
	t.Run("hedge succeeds while the first call hangs", func(t *testing.T) {
		hang := make(chan struct{})
		defer close(hang)
		pub := &scriptPub{script: []scripted{{gate: hang}, {}}}
		h := newHedgeRig(t, pub)
		if err := h.publish(nil); err != nil {
			t.Fatalf("publishRow: %v, want the hedge's success", err)
		}
		if pub.count() != 2 || h.hedged(t) != 1 {
			t.Fatalf("calls %d, hedged %d; want 2 and 1", pub.count(), h.hedged(t))
		}
		if got := h.r.hedges.Tokens(); got != hedge.Cap-hedge.Cost {
			t.Fatalf("throttle holds %d after a hedged publish, want %d: only publishes without a hedge refill it", got, hedge.Cap-hedge.Cost)
		}
	})
	t.Run("first call fails after the hedges started: the first hedge decides", func(t *testing.T) {
		hang := make(chan struct{})
		defer close(hang)
		pub := &scriptPub{script: []scripted{{delay: 60 * time.Millisecond, err: errFirst}, {delay: 120 * time.Millisecond}, {gate: hang}}}
		h := newHedgeRig(t, pub)
		if err := h.publish(nil); err != nil {
			t.Fatalf("publishRow: %v, want the first hedge's success", err)
		}
	})
	t.Run("no hedge after a failure", func(t *testing.T) {
		pub := &scriptPub{script: []scripted{{afterCall: 1, err: errFirst}, {delay: 150 * time.Millisecond}}}
		h := newHedgeRigAfter(t, pub, 50*time.Millisecond)
		if err := h.publish(nil); err != nil {
			t.Fatalf("publishRow: %v, want the hedge's success", err)
		}
		if pub.count() != 2 || h.hedged(t) != 1 {
			t.Fatalf("calls %d, hedged %d; want 2 and 1: a hedge after a failure is a retry without backoff", pub.count(), h.hedged(t))
		}
	})
	t.Run("the losing calls' contexts are cancelled", func(t *testing.T) {
		lost := make(chan error, 1)
		pub := &ctxPub{first: lost}
		h := newHedgeRig(t, pub)
		if err := h.publish(nil); err != nil {
			t.Fatalf("publishRow: %v, want the hedge's success", err)
		}
		select {
		case err := <-lost:
			if !errors.Is(err, context.Canceled) {
				t.Fatalf("the first call's context ended with %v, want context.Canceled", err)
			}
		case <-time.After(5 * time.Second):
			t.Fatal("the first call's message context was not cancelled after the hedge won")
		}
	})
	t.Run("every call fails: the first failure", func(t *testing.T) {
		pub := &scriptPub{script: []scripted{{delay: 60 * time.Millisecond, err: errFirst}, {delay: 120 * time.Millisecond, err: errSecond}, {delay: 90 * time.Millisecond, err: errSecond}}}
		h := newHedgeRig(t, pub)
		if err := h.publish(nil); !errors.Is(err, errFirst) {
			t.Fatalf("publishRow: %v, want %v", err, errFirst)
		}
		if pub.count() != 1+MaxHedges || h.hedged(t) != MaxHedges {
			t.Fatalf("calls %d, hedged %d; want %d and %d", pub.count(), h.hedged(t), 1+MaxHedges, MaxHedges)
		}
	})
	t.Run("the first hedge hangs too: a second one", func(t *testing.T) {
		hang := make(chan struct{})
		defer close(hang)
		pub := &scriptPub{script: []scripted{{gate: hang}, {gate: hang}, {}}}
		h := newHedgeRig(t, pub)
		if err := h.publish(nil); err != nil {
			t.Fatalf("publishRow: %v, want the second hedge's success", err)
		}
		if pub.count() != 3 || h.hedged(t) != 2 {
			t.Fatalf("calls %d, hedged %d; want 3 and 2", pub.count(), h.hedged(t))
		}
	})
	t.Run("a failure before the hedge delay is not hedged", func(t *testing.T) {
		pub := &scriptPub{script: []scripted{{err: errFirst}}}
		h := newHedgeRig(t, pub)
		if err := h.publish(nil); !errors.Is(err, errFirst) {
			t.Fatalf("publishRow: %v, want %v", err, errFirst)
		}
		time.Sleep(50 * time.Millisecond)
		if pub.count() != 1 || h.hedged(t) != 0 {
			t.Fatalf("calls %d, hedged %d; want 1 and 0", pub.count(), h.hedged(t))
		}
	})
	t.Run("no hedge left in the throttle", func(t *testing.T) {
		pub := &scriptPub{script: []scripted{{delay: 150 * time.Millisecond}}}
		h := newHedgeRig(t, pub)
		h.r.hedges.SetTokens(hedge.Cost - 1)
		if err := h.publish(nil); err != nil {
			t.Fatalf("publishRow: %v", err)
		}
		if pub.count() != 1 || h.hedged(t) != 0 {
			t.Fatalf("calls %d, hedged %d; want 1 and 0: the throttle was empty", pub.count(), h.hedged(t))
		}
	})
	t.Run("every call running at abandon", func(t *testing.T) {
		hang := make(chan struct{})
		defer close(hang)
		pub := &scriptPub{script: []scripted{{gate: hang}, {gate: hang}, {gate: hang}}}
		h := newHedgeRig(t, pub)
		if err := h.publish(after(100 * time.Millisecond)); !errors.Is(err, errAbandoned) {
			t.Fatalf("publishRow: %v, want errAbandoned", err)
		}
		if pub.count() != 1+MaxHedges {
			t.Fatalf("calls %d, want %d", pub.count(), 1+MaxHedges)
		}
	})
	t.Run("a failure among calls running at abandon", func(t *testing.T) {
		hang := make(chan struct{})
		defer close(hang)
		pub := &scriptPub{script: []scripted{{delay: 30 * time.Millisecond, err: errFirst}, {gate: hang}, {gate: hang}}}
		h := newHedgeRig(t, pub)
		if err := h.publish(after(100 * time.Millisecond)); !errors.Is(err, errAbandoned) {
			t.Fatalf("publishRow: %v, want errAbandoned: hedges still ran", err)
		}
	})
	t.Run("default HedgeAfter: no hedge before the typical publish is known", func(t *testing.T) {
		pub := &scriptPub{script: []scripted{{delay: 50 * time.Millisecond}, {delay: 50 * time.Millisecond}, {}}}
		h := newHedgeRigAfter(t, pub, 0)
		if err := h.publish(nil); err != nil {
			t.Fatalf("publishRow: %v", err)
		}
		if pub.count() != 1 {
			t.Fatalf("calls %d, want 1: %d publishes seen, fewer than hedge.Warmup", pub.count(), h.f.typ.Seen())
		}
		h.f.typ.Set(0, hedge.Warmup)
		if err := h.publish(nil); err != nil {
			t.Fatalf("publishRow: %v", err)
		}
		if pub.count() != 3 || h.hedged(t) != 1 {
			t.Fatalf("calls %d, hedged %d; want 3 and 1: warmed up, a 50ms publish is slow (8x the typical, at least 2ms)", pub.count(), h.hedged(t))
		}
	})
	t.Run("hedge off", func(t *testing.T) {
		pub := &scriptPub{script: []scripted{{delay: 100 * time.Millisecond}}}
		h := newHedgeRig(t, pub)
		h.r.opts.Hedge = false
		if err := h.publish(nil); err != nil {
			t.Fatalf("publishRow: %v", err)
		}
		if pub.count() != 1 {
			t.Fatalf("calls %d, want 1", pub.count())
		}
	})
}

// ctxPub's first call waits for its message's context to end and sends
// why to first; later calls succeed at once.
type ctxPub struct {
	mu    sync.Mutex
	calls int
	first chan error
}

func (p *ctxPub) Publish(_ string, msgs ...*message.Message) error {
	p.mu.Lock()
	p.calls++
	n := p.calls
	p.mu.Unlock()
	if n == 1 {
		<-msgs[0].Context().Done()
		p.first <- msgs[0].Context().Err()
		return msgs[0].Context().Err()
	}
	return nil
}

func (p *ctxPub) Close() error { return nil }

func TestHedgeAfterNeedsHedge(t *testing.T) {
	opts := testOptions(&scriptPub{}, "x")
	opts.HedgeAfter = time.Second
	opts.setDefaults()
	if err := opts.Validate(); err == nil || !strings.Contains(err.Error(), "Config.Hedge is false") {
		t.Fatalf("Validate: %v, want HedgeAfter without Hedge refused", err)
	}
	opts.HedgeAfter = -time.Second
	opts.Hedge = true
	if err := opts.Validate(); err == nil || !strings.Contains(err.Error(), "HedgeAfter is -1s") {
		t.Fatalf("Validate: %v, want a negative HedgeAfter refused", err)
	}
}

// RunOnce waits for a call a hedge beat; once its context is done, at
// most ShutdownTimeout longer.
func TestRunOnceWaitsForBeatenCall(t *testing.T) {
	db, drv := sqliteRelayDB(t)
	ins := insertEvents(t, db, dialect.SQLite, ev{Key: "a"})
	hang := make(chan struct{})
	defer close(hang)
	pub := newRecPub(t)
	var calls atomic.Int64
	pub.setFail(func(*message.Message) error {
		if calls.Add(1) == 1 {
			<-hang // the first call never returns by itself
		}
		return nil
	})
	opts := testOptions(pub, "once")
	opts.Hedge = true
	opts.HedgeAfter = 10 * time.Millisecond
	opts.ShutdownTimeout = 300 * time.Millisecond
	r := mustRelay(t, drv, opts)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	type result struct {
		n   int
		err error
	}
	done := make(chan result, 1)
	go func() {
		n, err := r.RunOnce(ctx)
		done <- result{n, err}
	}()
	waitFor(t, "the row sent through the hedge", func() bool { return state(t, db, dialect.SQLite, ins[0].ID).Status == 1 })
	select {
	case res := <-done:
		t.Fatalf("RunOnce returned %+v while the call the hedge beat still ran", res)
	case <-time.After(100 * time.Millisecond):
	}
	cancel()
	start := time.Now()
	select {
	case res := <-done:
		if !errors.Is(res.err, context.Canceled) || res.n != 1 {
			t.Fatalf("RunOnce = %d, %v; want 1, context.Canceled", res.n, res.err)
		}
		if took := time.Since(start); took < 200*time.Millisecond {
			t.Fatalf("RunOnce returned %s after its context ended, want about ShutdownTimeout (300ms)", took)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("RunOnce did not return at ShutdownTimeout after its context ended")
	}
}
