package monitor_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/outboxgen/outboxgen/runtime/driver"
	"github.com/outboxgen/outboxgen/runtime/monitor"
)

// hangGuard bounds every wait of these tests for something that the fix
// makes happen within a few CheckTimeouts; it only runs out when the
// checks are not bounded.
const hangGuard = 10 * time.Second

// hangingSource succeeds once, then every Stats call hangs until release
// is closed, like a SELECT queued behind an ACCESS EXCLUSIVE lock or a
// half-open TCP connection. With honour set it returns ctx.Err() when ctx
// is done (as pgx and database/sql do); without, it ignores ctx.
type hangingSource struct {
	honour  bool
	st      driver.Stats
	release chan struct{}
	once    sync.Once

	mu                           sync.Mutex
	calls, inFlight, maxInFlight int
}

func newHangingSource(honour bool, st driver.Stats) *hangingSource {
	return &hangingSource{honour: honour, st: st, release: make(chan struct{})}
}

func (h *hangingSource) Stats(ctx context.Context, _ time.Duration) (driver.Stats, error) {
	h.mu.Lock()
	h.calls++
	first := h.calls == 1
	h.inFlight++
	h.maxInFlight = max(h.maxInFlight, h.inFlight)
	h.mu.Unlock()
	defer func() {
		h.mu.Lock()
		h.inFlight--
		h.mu.Unlock()
	}()
	if first {
		return h.st, nil
	}
	if h.honour {
		select {
		case <-ctx.Done():
			return driver.Stats{}, ctx.Err()
		case <-h.release:
		}
	} else {
		<-h.release
	}
	return h.st, nil
}

// unblock lets every hanging and later call return (the lock is gone).
func (h *hangingSource) unblock() { h.once.Do(func() { close(h.release) }) }

func (h *hangingSource) counts() (calls, maxInFlight int) {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.calls, h.maxInFlight
}

// boundedTick runs m.Tick, failing the test if it does not return within
// hangGuard: an unbounded check.
func boundedTick(t *testing.T, m *monitor.Monitor) error {
	t.Helper()
	done := make(chan error, 1)
	go func() { done <- m.Tick(context.Background()) }()
	select {
	case err := <-done:
		return err
	case <-time.After(hangGuard):
		t.Fatalf("Tick did not return within %s although CheckTimeout is %s: a hung check is not bounded", hangGuard, m.Config().CheckTimeout)
		return nil
	}
}

// wantTimeout checks that err is a timed-out check that says what to look
// at, and contains each of also.
func wantTimeout(t *testing.T, err error, also ...string) {
	t.Helper()
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("error %v: want one matching context.DeadlineExceeded", err)
	}
	if err == nil {
		return
	}
	for _, s := range append([]string{"(Config.CheckTimeout)", "lock on the outbox table", "ACCESS EXCLUSIVE", "metadata lock", "half-open TCP connection"}, also...) {
		if !strings.Contains(err.Error(), s) {
			t.Errorf("error %q: want it to say %q", err, s)
		}
	}
}

func lastAlert(rec *recorder) monitor.Alert {
	rec.mu.Lock()
	defer rec.mu.Unlock()
	return rec.alerts[len(rec.alerts)-1]
}

func TestCheckTimeoutConfig(t *testing.T) {
	for _, c := range []struct {
		interval, timeout, want time.Duration
	}{
		{0, 0, 30 * time.Second},                               // default Interval 1m: capped at 30s
		{10 * time.Second, 0, 10 * time.Second},                // Interval
		{10 * time.Minute, 0, 30 * time.Second},                // capped
		{100 * time.Millisecond, 0, time.Second},               // at least 1s
		{time.Minute, 5 * time.Second, 5 * time.Second},        // as set
		{10 * time.Second, 20 * time.Second, 20 * time.Second}, // 2×Interval is the most
		{100 * time.Millisecond, time.Second, time.Second},     // 1s for short intervals
	} {
		m, err := monitor.New(&fakeSource{}, monitor.Config{Logger: quiet, Interval: c.interval, CheckTimeout: c.timeout})
		if err != nil {
			t.Fatalf("Interval %s, CheckTimeout %s: %v", c.interval, c.timeout, err)
		}
		if got := m.Config().CheckTimeout; got != c.want {
			t.Errorf("Interval %s, CheckTimeout %s: in effect %s, want %s", c.interval, c.timeout, got, c.want)
		}
		m.Close()
	}
	for _, o := range []monitor.Config{
		{CheckTimeout: -time.Second},
		{Interval: 10 * time.Second, CheckTimeout: 21 * time.Second},
		{Interval: 100 * time.Millisecond, CheckTimeout: 1001 * time.Millisecond},
	} {
		o.Logger = quiet
		if _, err := monitor.New(&fakeSource{}, o); err == nil || !strings.Contains(err.Error(), "monitor: Config.CheckTimeout") {
			t.Errorf("New(Interval %s, CheckTimeout %s) error = %v, want one naming Config.CheckTimeout", o.Interval, o.CheckTimeout, err)
		}
	}
	// An invalid Interval is reported once, not again as a CheckTimeout
	// derived from it.
	if _, err := monitor.New(&fakeSource{}, monitor.Config{Logger: quiet, Interval: -time.Second}); err == nil || strings.Contains(err.Error(), "CheckTimeout") {
		t.Errorf("New(Interval -1s) error = %v, want the Interval error only", err)
	}
}

// hangingMonitor returns a monitor (Interval 1m, CheckTimeout 20ms, on a
// fake clock) of a hanging source (honour: it returns when its context
// ends) after one good check, with the recorder of its alerts.
func hangingMonitor(t *testing.T, honour bool) (*hangingSource, *recorder, *monitor.Monitor, *fakeClock) {
	t.Helper()
	src := newHangingSource(honour, driver.Stats{Failed: 1})
	t.Cleanup(src.unblock)
	rec := newRecorder()
	m, err := monitor.New(src, monitor.Config{Logger: quiet, Interval: time.Minute, CheckTimeout: 20 * time.Millisecond, OnAlert: rec.onAlert, OnResolve: rec.onResolve})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	clock := newFakeClock()
	m.SetClock(clock.Now)
	if err := boundedTick(t, m); err != nil {
		t.Fatal(err)
	}
	return src, rec, m, clock
}

// untilGood ticks m a minute apart until a check succeeds (the call that
// hung is returning meanwhile), failing with stuck after hangGuard.
func untilGood(t *testing.T, m *monitor.Monitor, clock *fakeClock, stuck string) {
	t.Helper()
	deadline := time.Now().Add(hangGuard)
	for {
		clock.Add(time.Minute)
		if boundedTick(t, m) == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatal(stuck)
		}
		time.Sleep(time.Millisecond)
	}
}

// A check queued behind a lock (a source that blocks until its context
// is done) fails at CheckTimeout, saying so and what to look at; the
// failures raise check_failing once no check has succeeded for 2×Interval,
// and the next good check resolves it.
func TestCheckTimesOutBehindALock(t *testing.T) {
	src, rec, m, clock := hangingMonitor(t, true)
	var err error
	clock.Add(time.Minute)
	err = boundedTick(t, m)
	wantTimeout(t, err, "monitor: read outbox stats: the check did not finish within 20ms")
	if a, _ := rec.counts(); !equalCounts(a, map[monitor.Kind]int{monitor.Failed: 1}) {
		t.Fatalf("after one timed-out check, 1×Interval after the good one: alerts %v, want failed only", a)
	}
	clock.Add(time.Minute + time.Second)
	wantTimeout(t, boundedTick(t, m))
	if a, _ := rec.counts(); !equalCounts(a, map[monitor.Kind]int{monitor.Failed: 1, monitor.CheckFailing: 1}) {
		t.Fatalf("timing out for 2×Interval+1s: alerts %v, want check_failing raised", a)
	}
	a := lastAlert(rec)
	wantTimeout(t, a.Err)
	if a.Kind != monitor.CheckFailing || !strings.Contains(a.Message, "ACCESS EXCLUSIVE") || a.Stats != (driver.Stats{Failed: 1}) {
		t.Errorf("check_failing alert %+v: want the timeout in its message and the last good snapshot", a)
	}
	if _, most := src.counts(); most != 1 {
		t.Errorf("%d Stats calls at once, want 1", most)
	}

	// The lock is released: the next check succeeds and resolves it.
	src.unblock()
	untilGood(t, m, clock, "checks still fail after the lock was released")
	if _, r := rec.counts(); !equalCounts(r, map[monitor.Kind]int{monitor.CheckFailing: 1}) {
		t.Errorf("resolves %v, want check_failing once", r)
	}
}

// A driver that ignores its context (a read on a socket without a
// deadline) cannot hold the monitor: the check returns at CheckTimeout,
// no further statement is sent while the first one hangs, check_failing
// still fires on schedule, and checks resume once the call returns.
func TestCheckIgnoringContextIsNotStacked(t *testing.T) {
	src, rec, m, clock := hangingMonitor(t, false)
	var err error
	clock.Add(time.Minute)
	wantTimeout(t, boundedTick(t, m), "the check did not finish within 20ms")
	clock.Add(time.Minute + time.Second)
	err = boundedTick(t, m)
	wantTimeout(t, err, "has not returned 1m1s after it started", "does not honour the deadline", "no new statement is sent until it returns")
	if a, _ := rec.counts(); !equalCounts(a, map[monitor.Kind]int{monitor.Failed: 1, monitor.CheckFailing: 1}) {
		t.Fatalf("a check hanging for 2×Interval+1s: alerts %v, want check_failing raised", a)
	}
	wantTimeout(t, lastAlert(rec).Err, "has not returned")
	// Nor does a one-off Check (a health endpoint) queue behind it.
	if _, _, err := m.Check(context.Background()); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Check while a call hangs = %v, want the timeout", err)
	}
	if calls, most := src.counts(); calls != 2 || most != 1 {
		t.Errorf("%d Stats calls, %d at once; want 2 (the good one and the hanging one), 1 at once", calls, most)
	}

	src.unblock()
	untilGood(t, m, clock, "checks still refused after the hanging call returned")
	if _, r := rec.counts(); !equalCounts(r, map[monitor.Kind]int{monitor.CheckFailing: 1}) {
		t.Errorf("resolves %v, want check_failing once", r)
	}
	if calls, _ := src.counts(); calls != 3 {
		t.Errorf("%d Stats calls, want 3", calls)
	}
}

// The reviewer's case, under Run: a source that succeeds once, then
// hangs, with a 100 ms interval. check_failing fires within a few
// intervals whether or not the driver honours its context, one statement
// at a time, and Run stops when asked even while the call still hangs.
func TestRunRaisesCheckFailingWhileCheckHangs(t *testing.T) {
	for _, honour := range []bool{true, false} {
		name := map[bool]string{true: "honours_ctx", false: "ignores_ctx"}[honour]
		t.Run(name, func(t *testing.T) {
			src := newHangingSource(honour, driver.Stats{})
			t.Cleanup(src.unblock) // after Run has returned
			rec := newRecorder()
			m, err := monitor.New(src, monitor.Config{Logger: quiet, Interval: 100 * time.Millisecond, CheckTimeout: 50 * time.Millisecond, OnAlert: rec.onAlert})
			if err != nil {
				t.Fatal(err)
			}
			defer m.Close()
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			done := make(chan error, 1)
			start := time.Now()
			go func() { done <- m.Run(ctx) }()
			select {
			case k := <-rec.fired:
				if k != monitor.CheckFailing {
					t.Fatalf("alert %s, want check_failing", k)
				}
				t.Logf("check_failing after %s", time.Since(start).Round(time.Millisecond))
			case <-time.After(hangGuard):
				calls, _ := src.counts()
				t.Fatalf("no check_failing within %s of a hung check (Interval 100ms, CheckTimeout 50ms; %d Stats calls)", hangGuard, calls)
			}
			wantTimeout(t, lastAlert(rec).Err)
			cancel()
			select {
			case err := <-done:
				if err != nil {
					t.Fatalf("Run = %v, want nil", err)
				}
			case <-time.After(hangGuard):
				t.Fatal("Run did not return after cancel while a check hangs")
			}
			calls, most := src.counts()
			if most != 1 {
				t.Errorf("%d Stats calls at once, want 1", most)
			}
			if !honour && calls != 2 {
				t.Errorf("%d Stats calls, want 2: none while the second one hangs", calls)
			}
		})
	}
}

// SlotCheck is bounded the same way: a hanging one raises wal_slot with a
// timeout message at CheckTimeout and is not called again until it
// returns; the table check is unaffected.
func TestSlotCheckTimesOut(t *testing.T) {
	release := make(chan struct{})
	var once sync.Once
	unblock := func() { once.Do(func() { close(release) }) }
	t.Cleanup(unblock)
	var mu sync.Mutex
	calls := 0
	m, err := monitor.New(&fakeSource{}, monitor.Config{Logger: quiet, Interval: time.Minute, CheckTimeout: 20 * time.Millisecond,
		SlotCheck: func(context.Context, int64) error {
			mu.Lock()
			calls++
			mu.Unlock()
			<-release // ignores its context
			return nil
		}})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	check := func() []monitor.Alert {
		t.Helper()
		type result struct {
			alerts []monitor.Alert
			err    error
		}
		done := make(chan result, 1)
		go func() { _, a, err := m.Check(context.Background()); done <- result{a, err} }()
		select {
		case r := <-done:
			if r.err != nil {
				t.Fatalf("Check = %v, want the table check to succeed", r.err)
			}
			return r.alerts
		case <-time.After(hangGuard):
			t.Fatal("Check did not return: a hung SlotCheck is not bounded")
			return nil
		}
	}
	for i, want := range []string{"monitor: the WAL slot check did not finish within 20ms (Config.CheckTimeout)", "has not returned"} {
		alerts := check()
		if len(alerts) != 1 || alerts[0].Kind != monitor.WALSlot || !strings.Contains(alerts[0].Message, want) ||
			!strings.Contains(alerts[0].Message, "connection to PostgreSQL") || !errors.Is(alerts[0].Err, context.DeadlineExceeded) {
			t.Fatalf("check %d: alerts %+v, want a wal_slot alert saying %q", i+1, alerts, want)
		}
	}
	mu.Lock()
	n := calls
	mu.Unlock()
	if n != 1 {
		t.Errorf("SlotCheck called %d times, want once while it hangs", n)
	}
	unblock()
	deadline := time.Now().Add(hangGuard)
	for len(check()) != 0 {
		if time.Now().After(deadline) {
			t.Fatal("wal_slot still raised after SlotCheck returned")
		}
		time.Sleep(time.Millisecond)
	}
}
