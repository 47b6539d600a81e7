package monitor_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/outboxgen/outboxgen/runtime/driver"
	"github.com/outboxgen/outboxgen/runtime/monitor"
)

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

// fakeSource returns the stats it is set to.
type fakeSource struct {
	mu    sync.Mutex
	st    driver.Stats
	err   error
	calls int
	stale []time.Duration
}

func (f *fakeSource) Stats(_ context.Context, staleAfter time.Duration) (driver.Stats, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls++
	f.stale = append(f.stale, staleAfter)
	return f.st, f.err
}

func (f *fakeSource) set(st driver.Stats, err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.st, f.err = st, err
}

// recorder collects OnAlert and OnResolve calls.
type recorder struct {
	mu       sync.Mutex
	alerts   []monitor.Alert
	resolves []monitor.Alert
	fired    chan monitor.Kind
}

func newRecorder() *recorder { return &recorder{fired: make(chan monitor.Kind, 64)} }

func (r *recorder) onAlert(a monitor.Alert) {
	r.mu.Lock()
	r.alerts = append(r.alerts, a)
	r.mu.Unlock()
	r.fired <- a.Kind
}

func (r *recorder) onResolve(a monitor.Alert) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.resolves = append(r.resolves, a)
}

func (r *recorder) counts() (alerts, resolves map[monitor.Kind]int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	alerts, resolves = map[monitor.Kind]int{}, map[monitor.Kind]int{}
	for _, a := range r.alerts {
		alerts[a.Kind]++
	}
	for _, a := range r.resolves {
		resolves[a.Kind]++
	}
	return alerts, resolves
}

func TestNewValidates(t *testing.T) {
	if _, err := monitor.New(nil, monitor.Config{}); err == nil || !strings.Contains(err.Error(), "driver.Driver") {
		t.Errorf("New(nil) error = %v, want one naming the driver", err)
	}
	for _, o := range []monitor.Config{
		{Interval: -time.Second},
		{StaleAfter: -time.Minute},
		{Attributes: []monitor.Attribute{{Key: "", Value: "x"}}},
	} {
		_, err := monitor.New(&fakeSource{}, o)
		if err == nil || !strings.Contains(err.Error(), "monitor: Config.") {
			t.Errorf("New(%+v) error = %v, want an Config error", o, err)
		}
	}
	var o monitor.Config
	if err := o.Validate(); err == nil {
		t.Error("zero Config validate before defaults, want errors naming Interval, StaleAfter, Meter, Logger")
	}
}

func TestDefaults(t *testing.T) {
	src := &fakeSource{}
	m, err := monitor.New(src, monitor.Config{Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	o := m.Config()
	if o.Interval != time.Minute || o.StaleAfter != 10*time.Minute || o.Thresholds.OldestPendingAge != 10*time.Minute || o.Meter == nil {
		t.Errorf("defaults = %+v", o)
	}
	if _, _, err := m.Check(context.Background()); err != nil {
		t.Fatal(err)
	}
	if src.stale[0] != 10*time.Minute {
		t.Errorf("Stats asked with staleAfter %s, want 10m", src.stale[0])
	}
}

func TestAlertOnceAndResolve(t *testing.T) {
	ctx := context.Background()
	src := &fakeSource{}
	rec := newRecorder()
	m, err := monitor.New(src, monitor.Config{Logger: quiet, StaleAfter: time.Minute, OnAlert: rec.onAlert, OnResolve: rec.onResolve})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	bad := driver.Stats{Pending: 5, OldestPendingAge: time.Hour, Stale: 3, Failed: 1, ExpiredLeases: 2}
	steps := []struct {
		st               driver.Stats
		err              error
		alerts, resolves map[monitor.Kind]int
	}{
		{st: driver.Stats{Pending: 2, OldestPendingAge: time.Second}, alerts: map[monitor.Kind]int{}, resolves: map[monitor.Kind]int{}},
		{st: bad, alerts: map[monitor.Kind]int{"stale": 1, "oldest_pending_age": 1, "failed": 1, "expired_leases": 1}, resolves: map[monitor.Kind]int{}},
		{st: bad, alerts: map[monitor.Kind]int{"stale": 1, "oldest_pending_age": 1, "failed": 1, "expired_leases": 1}, resolves: map[monitor.Kind]int{}},
		// A failed check changes nothing.
		{err: errors.New("db down"), alerts: map[monitor.Kind]int{"stale": 1, "oldest_pending_age": 1, "failed": 1, "expired_leases": 1}, resolves: map[monitor.Kind]int{}},
		// Failed rows requeued and published, relays back: only failed and expired clear.
		{st: driver.Stats{Pending: 3, OldestPendingAge: time.Hour, Stale: 3}, alerts: map[monitor.Kind]int{"stale": 1, "oldest_pending_age": 1, "failed": 1, "expired_leases": 1}, resolves: map[monitor.Kind]int{"failed": 1, "expired_leases": 1}},
		{st: driver.Stats{}, alerts: map[monitor.Kind]int{"stale": 1, "oldest_pending_age": 1, "failed": 1, "expired_leases": 1}, resolves: map[monitor.Kind]int{"stale": 1, "oldest_pending_age": 1, "failed": 1, "expired_leases": 1}},
		{st: driver.Stats{}, alerts: map[monitor.Kind]int{"stale": 1, "oldest_pending_age": 1, "failed": 1, "expired_leases": 1}, resolves: map[monitor.Kind]int{"stale": 1, "oldest_pending_age": 1, "failed": 1, "expired_leases": 1}},
		// Crossing again alerts again.
		{st: driver.Stats{Failed: 1}, alerts: map[monitor.Kind]int{"stale": 1, "oldest_pending_age": 1, "failed": 2, "expired_leases": 1}, resolves: map[monitor.Kind]int{"stale": 1, "oldest_pending_age": 1, "failed": 1, "expired_leases": 1}},
	}
	for i, s := range steps {
		src.set(s.st, s.err)
		err := m.Tick(ctx)
		if (err != nil) != (s.err != nil) {
			t.Fatalf("step %d: Tick error %v, want %v", i, err, s.err)
		}
		alerts, resolves := rec.counts()
		if !equalCounts(alerts, s.alerts) || !equalCounts(resolves, s.resolves) {
			t.Fatalf("step %d: alerts %v resolves %v, want %v and %v", i, alerts, resolves, s.alerts, s.resolves)
		}
	}
	for _, a := range rec.resolves {
		if !a.Resolved || !strings.HasPrefix(a.Message, "resolved:") {
			t.Errorf("resolve %+v: want Resolved and a resolved: message", a)
		}
	}
	if a := rec.alerts[0]; a.Resolved || a.Message == "" || a.Stats != bad {
		t.Errorf("first alert %+v: want the crossing snapshot and a message", a)
	}
}

func equalCounts(a, b map[monitor.Kind]int) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if b[k] != v {
			return false
		}
	}
	return true
}

func TestThresholds(t *testing.T) {
	st := driver.Stats{Pending: 5, OldestPendingAge: 30 * time.Minute, Stale: 3, Failed: 1, ExpiredLeases: 2}
	cases := []struct {
		th   monitor.Thresholds
		want []monitor.Kind
	}{
		{monitor.Thresholds{}, []monitor.Kind{monitor.Stale, monitor.OldestPending, monitor.Failed, monitor.ExpiredLeases}},
		{monitor.Thresholds{Stale: 3, Failed: 1, ExpiredLeases: 2, OldestPendingAge: 30 * time.Minute}, nil},
		{monitor.Thresholds{Stale: 2, Failed: monitor.Never, ExpiredLeases: monitor.Never, OldestPendingAge: monitor.Never}, []monitor.Kind{monitor.Stale}},
		{monitor.Thresholds{Stale: monitor.Never, Failed: monitor.Never, ExpiredLeases: 1, OldestPendingAge: time.Hour}, []monitor.Kind{monitor.ExpiredLeases}},
	}
	for i, c := range cases {
		m, err := monitor.New(&fakeSource{st: st}, monitor.Config{Logger: quiet, Thresholds: c.th})
		if err != nil {
			t.Fatal(err)
		}
		_, alerts, err := m.Check(context.Background())
		m.Close()
		if err != nil {
			t.Fatal(err)
		}
		var got []monitor.Kind
		for _, a := range alerts {
			got = append(got, a.Kind)
		}
		if strings.Join(kinds(got), ",") != strings.Join(kinds(c.want), ",") {
			t.Errorf("case %d (%+v): alerts %v, want %v", i, c.th, got, c.want)
		}
	}
}

func kinds(ks []monitor.Kind) []string {
	out := make([]string, len(ks))
	for i, k := range ks {
		out[i] = string(k)
	}
	return out
}

func TestMetricsReportLastSnapshot(t *testing.T) {
	ctx := context.Background()
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	defer mp.Shutdown(ctx)
	src := &fakeSource{st: driver.Stats{Pending: 4, OldestPendingAge: 1500 * time.Millisecond, Stale: 1, Failed: 2, ExpiredLeases: 3}}
	m, err := monitor.New(src, monitor.Config{Logger: quiet, Meter: mp.Meter("test"), Attributes: []monitor.Attribute{{Key: "service.name", Value: "orders"}}})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()

	// Before any check: nothing is reported, and collecting queries nothing.
	if got := collect(t, reader); len(got) != 0 {
		t.Errorf("before a check the gauges report %v, want nothing", got)
	}
	if _, _, err := m.Check(ctx); err != nil {
		t.Fatal(err)
	}
	calls := src.calls
	got := collect(t, reader)
	want := map[string]float64{
		"outboxgen.outbox.pending": 4, "outboxgen.outbox.oldest_pending_age": 1.5, "outboxgen.outbox.stale": 1,
		"outboxgen.outbox.failed": 2, "outboxgen.outbox.expired_leases": 3,
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("%s = %v, want %v (all: %v)", k, got[k], v, got)
		}
	}
	if src.calls != calls {
		t.Error("collecting metrics queried the database")
	}
	if attrs := collectAttrs(t, reader, "outboxgen.outbox.pending"); attrs != "service.name=orders" {
		t.Errorf("attributes %q, want service.name=orders", attrs)
	}

	src.set(driver.Stats{}, errors.New("db down"))
	if _, _, err := m.Check(ctx); err == nil {
		t.Fatal("Check with a failing source succeeded")
	}
	got = collect(t, reader)
	if got["outboxgen.monitor.check_errors"] != 1 || got["outboxgen.outbox.pending"] != 4 {
		t.Errorf("after a failed check: %v, want check_errors 1 and the last snapshot kept", got)
	}

	// Close unregisters the callback.
	m.Close()
	if got := collect(t, reader); got["outboxgen.outbox.pending"] != 0 {
		t.Errorf("after Close the gauges still report: %v", got)
	}
}

// collect reads every metric's single data point (sum of points).
func collect(t *testing.T, reader *sdkmetric.ManualReader) map[string]float64 {
	t.Helper()
	var rm metricdata.ResourceMetrics
	if err := reader.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	out := map[string]float64{}
	for _, sm := range rm.ScopeMetrics {
		for _, mt := range sm.Metrics {
			switch d := mt.Data.(type) {
			case metricdata.Gauge[int64]:
				for _, p := range d.DataPoints {
					out[mt.Name] += float64(p.Value)
				}
			case metricdata.Gauge[float64]:
				for _, p := range d.DataPoints {
					out[mt.Name] += p.Value
				}
			case metricdata.Sum[int64]:
				for _, p := range d.DataPoints {
					out[mt.Name] += float64(p.Value)
				}
			}
		}
	}
	return out
}

func collectAttrs(t *testing.T, reader *sdkmetric.ManualReader, name string) string {
	t.Helper()
	var rm metricdata.ResourceMetrics
	if err := reader.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	for _, sm := range rm.ScopeMetrics {
		for _, mt := range sm.Metrics {
			if g, ok := mt.Data.(metricdata.Gauge[int64]); ok && mt.Name == name && len(g.DataPoints) > 0 {
				return g.DataPoints[0].Attributes.Encoded(attribute.DefaultEncoder())
			}
		}
	}
	return ""
}

func TestRunAlertsAndStops(t *testing.T) {
	src := &fakeSource{st: driver.Stats{Failed: 1}}
	rec := newRecorder()
	m, err := monitor.New(src, monitor.Config{Logger: quiet, Interval: time.Millisecond, OnAlert: rec.onAlert})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- m.Run(ctx) }()
	if k := <-rec.fired; k != monitor.Failed {
		t.Fatalf("first alert %s, want failed", k)
	}
	// Let it check a few more times: the alert must not fire again.
	for {
		src.mu.Lock()
		n := src.calls
		src.mu.Unlock()
		if n >= 5 {
			break
		}
		time.Sleep(time.Millisecond)
	}
	if err := m.Run(ctx); err == nil {
		t.Error("a second concurrent Run started, want an error")
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("Run returned %v, want nil after cancel", err)
	}
	if alerts, _ := rec.counts(); alerts[monitor.Failed] != 1 || len(alerts) != 1 {
		t.Errorf("alerts %v, want failed once", alerts)
	}
}

// fakeClock is a settable clock for the staleness rules.
type fakeClock struct {
	mu  sync.Mutex
	now time.Time
}

func newFakeClock() *fakeClock {
	return &fakeClock{now: time.Date(2025, 1, 2, 3, 4, 5, 0, time.UTC)}
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *fakeClock) Add(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
}

// While the checks fail, the gauges keep the last snapshot for 2×Interval,
// then report nothing (not hours-old numbers); a successful check brings
// them back.
func TestMetricsGoSilentWhenChecksStopSucceeding(t *testing.T) {
	ctx := context.Background()
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	defer mp.Shutdown(ctx)
	src := &fakeSource{st: driver.Stats{Pending: 4, Stale: 1}}
	m, err := monitor.New(src, monitor.Config{Logger: quiet, Interval: time.Minute, Meter: mp.Meter("test")})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	clock := newFakeClock()
	m.SetClock(clock.Now)

	if err := m.Tick(ctx); err != nil {
		t.Fatal(err)
	}
	src.set(driver.Stats{}, errors.New("db down"))
	for i := range 2 {
		clock.Add(time.Minute)
		if err := m.Tick(ctx); err == nil {
			t.Fatal("Tick with a failing source succeeded")
		}
		if got := collect(t, reader); got["outboxgen.outbox.pending"] != 4 || got["outboxgen.outbox.stale"] != 1 {
			t.Errorf("%d interval(s) after the last good check: %v, want the last snapshot (pending 4, stale 1)", i+1, got)
		}
	}
	// Exactly 2×Interval is still fresh; a moment later it is not.
	clock.Add(time.Nanosecond)
	got := collect(t, reader)
	for _, name := range []string{"outboxgen.outbox.pending", "outboxgen.outbox.stale", "outboxgen.outbox.failed", "outboxgen.outbox.expired_leases", "outboxgen.outbox.oldest_pending_age"} {
		if _, ok := got[name]; ok {
			t.Errorf("last good check older than 2×Interval: %s still reported (%v), want nothing", name, got)
		}
	}
	if got["outboxgen.monitor.check_errors"] != 2 {
		t.Errorf("check_errors = %v, want 2", got["outboxgen.monitor.check_errors"])
	}
	// Hours later: still nothing.
	clock.Add(3 * time.Hour)
	if got := collect(t, reader); got["outboxgen.outbox.stale"] != 0 || len(got) != 1 {
		t.Errorf("hours after the last good check: %v, want only check_errors", got)
	}

	// Back up: fresh numbers.
	src.set(driver.Stats{Pending: 7}, nil)
	if err := m.Tick(ctx); err != nil {
		t.Fatal(err)
	}
	if got := collect(t, reader); got["outboxgen.outbox.pending"] != 7 {
		t.Errorf("after a good check: %v, want pending 7", got)
	}
}

// check_failing is raised once when no check has succeeded for longer than
// 2×Interval, and resolved by the next successful check; the threshold
// alerts stay as they were.
func TestCheckFailingAlert(t *testing.T) {
	ctx := context.Background()
	src := &fakeSource{st: driver.Stats{Failed: 1}}
	rec := newRecorder()
	m, err := monitor.New(src, monitor.Config{Logger: quiet, Interval: time.Minute, OnAlert: rec.onAlert, OnResolve: rec.onResolve})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	clock := newFakeClock()
	m.SetClock(clock.Now)
	tick := func(wantErr bool) {
		t.Helper()
		if err := m.Tick(ctx); (err != nil) != wantErr {
			t.Fatalf("Tick error %v, want error %v", err, wantErr)
		}
	}
	want := func(step string, alerts, resolves map[monitor.Kind]int) {
		t.Helper()
		a, r := rec.counts()
		if !equalCounts(a, alerts) || !equalCounts(r, resolves) {
			t.Fatalf("%s: alerts %v resolves %v, want %v and %v", step, a, r, alerts, resolves)
		}
	}

	tick(false)
	want("good check", map[monitor.Kind]int{monitor.Failed: 1}, map[monitor.Kind]int{})
	down := errors.New("db down")
	src.set(driver.Stats{}, down)
	for i := range 2 {
		clock.Add(time.Minute)
		tick(true)
		want(fmt.Sprintf("failure %d (%d×Interval since the good check)", i+1, i+1), map[monitor.Kind]int{monitor.Failed: 1}, map[monitor.Kind]int{})
	}
	clock.Add(time.Second)
	tick(true)
	want("failing for 2×Interval+1s", map[monitor.Kind]int{monitor.Failed: 1, monitor.CheckFailing: 1}, map[monitor.Kind]int{})
	rec.mu.Lock()
	a := rec.alerts[len(rec.alerts)-1]
	rec.mu.Unlock()
	if a.Kind != monitor.CheckFailing || !errors.Is(a.Err, down) || !strings.Contains(a.Message, "db down") || a.Stats != (driver.Stats{Failed: 1}) {
		t.Errorf("check_failing alert %+v: want the error, a message naming it and the last good snapshot", a)
	}
	for range 5 {
		clock.Add(time.Minute)
		tick(true)
	}
	want("still failing", map[monitor.Kind]int{monitor.Failed: 1, monitor.CheckFailing: 1}, map[monitor.Kind]int{})

	src.set(driver.Stats{Failed: 1}, nil)
	clock.Add(time.Minute)
	tick(false)
	want("good again", map[monitor.Kind]int{monitor.Failed: 1, monitor.CheckFailing: 1}, map[monitor.Kind]int{monitor.CheckFailing: 1})

	// A new streak alerts again.
	src.set(driver.Stats{}, down)
	for range 3 {
		clock.Add(time.Minute)
		tick(true)
	}
	want("second streak", map[monitor.Kind]int{monitor.Failed: 1, monitor.CheckFailing: 2}, map[monitor.Kind]int{monitor.CheckFailing: 1})
}

// A monitor that starts with the database down counts from its first
// failed check.
func TestCheckFailingFromStart(t *testing.T) {
	ctx := context.Background()
	src := &fakeSource{err: errors.New("connection refused")}
	rec := newRecorder()
	m, err := monitor.New(src, monitor.Config{Logger: quiet, Interval: time.Minute, OnAlert: rec.onAlert, OnResolve: rec.onResolve})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	clock := newFakeClock()
	m.SetClock(clock.Now)
	for i := range 4 {
		if i > 0 {
			clock.Add(time.Minute)
		}
		if err := m.Tick(ctx); err == nil {
			t.Fatal("Tick with a failing source succeeded")
		}
		a, _ := rec.counts()
		if want := map[monitor.Kind]int{}; i == 3 {
			want[monitor.CheckFailing] = 1
			if !equalCounts(a, want) {
				t.Fatalf("after %d failed checks over %d min: alerts %v, want %v", i+1, i, a, want)
			}
		} else if !equalCounts(a, want) {
			t.Fatalf("after %d failed checks over %d min: alerts %v, want none", i+1, i, a)
		}
	}
	rec.mu.Lock()
	a := rec.alerts[0]
	rec.mu.Unlock()
	if !strings.Contains(a.Message, "no check has succeeded yet") {
		t.Errorf("message %q", a.Message)
	}
}
