//go:build unix

package relay

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/outboxgen/outboxgen/internal/testdb"
	"github.com/outboxgen/outboxgen/runtime/dialect"
	"github.com/outboxgen/outboxgen/runtime/driver"
	"github.com/outboxgen/outboxgen/runtime/driver/sqldriver"
	"github.com/outboxgen/outboxgen/templates"
)

func sqliteEnv(t *testing.T) (*sql.DB, dialect.Dialect, driver.Driver) {
	db := testdb.Open(t, "sqlite")
	testdb.ApplySchema(t, db, "sqlite", templates.Tables{Outbox: tables.Outbox, Inbox: tables.Inbox})
	drv, err := sqldriver.New(db, testdb.SchemaWith(dialect.SQLite, tables))
	if err != nil {
		t.Fatal(err)
	}
	return db, dialect.SQLite, drv
}

// cpuTime returns the process's user+system CPU time.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

func cpuOver(d time.Duration) time.Duration {
	c0 := cpuTime()
	time.Sleep(d)
	return cpuTime() - c0
}

// rows in flight at the bound (slow publishes) after a short
// claim: the loop spins once PollInterval has passed.
func TestPipelineSpinWhenInFlightFull(t *testing.T) {
	db, d, drv := sqliteEnv(t)
	var evs []ev
	for k := range 6 {
		evs = append(evs, ev{Key: fmt.Sprintf("k%d", k)})
	}
	insertEvents(t, db, d, evs...)
	pub := newRecPub(t)
	unblock := make(chan struct{})
	var started atomic.Int64
	pub.setFail(func(m *message.Message) error { started.Add(1); <-unblock; return nil })
	opts := testOptions(pub, "spin")
	opts.BatchSize = 10
	opts.MaxInFlight = 10
	stop := runRelay(t, mustRelay(t, drv, opts))
	waitFor(t, "publishes started", func() bool { return started.Load() == 6 })
	time.Sleep(100 * time.Millisecond)
	idle := cpuOver(time.Second)
	t.Logf("CPU used in 1s while 6 slow publishes run (MaxInFlight reached): %v", idle)
	close(unblock)
	waitFor(t, "all sent", func() bool { return count(t, db, "status = 1") == 6 })
	stop()
	if idle > 300*time.Millisecond {
		t.Errorf("busy loop: %v CPU in 1s of waiting", idle)
	}
}

// the breaker opens while another batch's publish is slow: once
// the probe is due, the loop spins until the slow publish returns.
func TestPipelineSpinWhenProbeWaitsForInFlight(t *testing.T) {
	db, d, drv := sqliteEnv(t)
	slow := insertEvents(t, db, d, ev{Key: "slow"})
	pub := newRecPub(t)
	unblock := make(chan struct{})
	var slowStarted atomic.Bool
	pub.setFail(func(m *message.Message) error {
		if m.UUID == slow[0].ID {
			slowStarted.Store(true)
			<-unblock
			return nil
		}
		return errBrokerDown
	})
	opts := testOptions(pub, "spin2")
	h := &errLog{info: true}
	opts.Logger = slogNew(h)
	r := mustRelay(t, drv, opts)
	stop := runRelay(t, r)
	waitFor(t, "slow publish started", slowStarted.Load)
	insertEvents(t, db, d, ev{Key: "a"}, ev{Key: "b"})
	r.Notify()
	waitFor(t, "breaker open", func() bool {
		h.mu.Lock()
		defer h.mu.Unlock()
		for _, m := range h.msgs {
			if len(m) > 0 && contains(m, "circuit breaker open") {
				return true
			}
		}
		return false
	})
	time.Sleep(100 * time.Millisecond)
	used := cpuOver(time.Second)
	t.Logf("CPU used in 1s while the probe waits for a slow publish: %v", used)
	close(unblock)
	stop()
	if used > 300*time.Millisecond {
		t.Errorf("busy loop: %v CPU in 1s of waiting", used)
	}
}

// during shutdown, results that arrive while a hung publish runs
// are recorded with the cancelled context, fail, are put back, and tried
// again at once: a hot loop of failing Record calls until ShutdownTimeout.
func TestPipelineShutdownRecordSpin(t *testing.T) {
	db, d, drv := sqliteEnv(t)
	ins := insertEvents(t, db, d, ev{Key: "hung"}, ev{Key: "late"})
	pub := newRecPub(t)
	release := make(chan struct{})
	hang := make(chan struct{})
	var n atomic.Int64
	pub.setFail(func(m *message.Message) error {
		n.Add(1)
		if m.UUID == ins[0].ID {
			<-hang
		} else {
			<-release
		}
		return nil
	})
	defer close(hang)
	cd := &recordCounter{Driver: drv}
	opts := testOptions(pub, "shut")
	opts.BatchSize = 2
	opts.ShutdownTimeout = 2 * time.Second
	r := mustRelay(t, cd, opts)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	waitFor(t, "both publishing", func() bool { return n.Load() == 2 })
	cancel()
	time.Sleep(50 * time.Millisecond)
	cd.mu.Lock()
	before := cd.records
	cd.mu.Unlock()
	close(release) // "late" returns: its result is pending during shutdown
	c := cpuOver(time.Second)
	cd.mu.Lock()
	during := cd.records - before
	cd.mu.Unlock()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	t.Logf("during 1s of shutdown: %d Record calls, %v CPU", during, c)
	if during > 10 {
		t.Errorf("Record called %d times in 1s of shutdown (hot retry with a cancelled context)", during)
	}
}

// downDriver fails every call while down is set.
type downDriver struct {
	driver.Driver
	down   atomic.Bool
	hbDown atomic.Bool
	mu     sync.Mutex
	claims []time.Time
}

var errDown = errors.New("connection refused (injected)")

func (f *downDriver) Claim(ctx context.Context, p driver.ClaimParams) ([]driver.Row, error) {
	f.mu.Lock()
	f.claims = append(f.claims, time.Now())
	f.mu.Unlock()
	if f.down.Load() {
		return nil, errDown
	}
	return f.Driver.Claim(ctx, p)
}
func (f *downDriver) Record(ctx context.Context, o string, r driver.Results) (driver.Recorded, error) {
	if f.down.Load() {
		return driver.Recorded{}, errDown
	}
	return f.Driver.Record(ctx, o, r)
}
func (f *downDriver) ExtendLease(ctx context.Context, o string, ids []int64, l time.Duration) (int64, error) {
	f.mu.Lock()
	f.claims = append(f.claims, time.Now())
	f.mu.Unlock()
	if f.down.Load() || f.hbDown.Load() {
		return 0, errDown
	}
	return f.Driver.ExtendLease(ctx, o, ids, l)
}

// a database error on a claim made with claimNow set (start-up,
// a full window, Notify) is retried at the next heartbeat tick
// (LeaseDuration/3), not after the documented backoff (PollInterval
// doubling).
func TestPipelineDBBackoffStretched(t *testing.T) {
	db, d, drv := sqliteEnv(t)
	insertEvents(t, db, d, ev{Key: "a"})
	fd := &downDriver{Driver: drv}
	fd.down.Store(true)
	pub := newRecPub(t)
	opts := testOptions(pub, "dbb")
	opts.PollInterval = 100 * time.Millisecond
	opts.LeaseDuration = 30 * time.Second
	r := mustRelay(t, fd, opts)
	stop := runRelay(t, r)
	time.Sleep(3 * time.Second)
	fd.mu.Lock()
	n := len(fd.claims)
	fd.mu.Unlock()
	stop()
	t.Logf("claims attempted in 3s with the database down (PollInterval 100ms, backoff 100ms doubling): %d", n)
	if n < 3 {
		t.Errorf("only %d claim attempts in 3s: the retry waits for the heartbeat tick (10s), not the backoff", n)
	}
}

// after a database outage longer than the lease, the relay
// re-claims its own rows while a publish of the old batch is still
// running; the old batch's stale release then clears the new batch's
// lease (the owner fence cannot tell two batches of one instance apart),
// and the key goes out of order.
func TestPipelineOwnReclaimStaleRelease(t *testing.T) {
	db, d, drv := sqliteEnv(t)
	ins := insertEvents(t, db, d, ev{Key: "k"}, ev{Key: "k"}, ev{Key: "k"})
	fd := &downDriver{Driver: drv}
	pub := newRecPub(t)
	row2Started := make(chan struct{})
	row3Sent := make(chan struct{})
	var att sync.Map
	pub.setFail(func(m *message.Message) error {
		v, _ := att.LoadOrStore(m.UUID, new(atomic.Int64))
		a := v.(*atomic.Int64).Add(1)
		switch {
		case m.UUID == ins[0].ID && a == 1:
			fd.hbDown.Store(true) // lease extensions fail while row 1 publishes
			time.Sleep(1300 * time.Millisecond)
			fd.hbDown.Store(false)
			select {
			case <-row2Started:
			case <-time.After(5 * time.Second):
			}
		case m.UUID == ins[1].ID && a == 1:
			close(row2Started)
			select {
			case <-row3Sent:
			case <-time.After(5 * time.Second):
			}
		}
		return nil
	})
	opts := testOptions(pub, "own")
	opts.LeaseDuration = time.Second
	opts.ShutdownTimeout = 500 * time.Millisecond
	h := &errLog{}
	opts.Logger = slogNew(h)
	go func() {
		for {
			for _, s := range pub.successes() {
				if s.Msg.UUID == ins[2].ID {
					close(row3Sent)
					return
				}
			}
			time.Sleep(5 * time.Millisecond)
		}
	}()
	stop := runRelay(t, mustRelay(t, fd, opts))
	waitFor(t, "all sent", func() bool { return count(t, db, "status = 1") == 3 })
	time.Sleep(6 * time.Second)
	stop()
	var order []int
	for _, s := range pub.successes() {
		for i, e := range ins {
			if e.ID == s.Msg.UUID {
				order = append(order, i+1)
			}
		}
	}
	t.Logf("successful publishes of key k, in order: %v", order)
	h.mu.Lock()
	for _, m := range h.msgs {
		t.Log(m)
	}
	h.mu.Unlock()
	for i := 1; i < len(order); i++ {
		for j := 0; j < i; j++ {
			if order[j] > order[i] {
				t.Fatalf("row %d published after row %d (order %v)", order[i], order[j], order)
			}
		}
	}
}

// leaseDownDriver fails lease extensions while down is set, but not the
// start-up probe (of id 0).
type leaseDownDriver struct {
	driver.Driver
	down atomic.Bool
}

func (f *leaseDownDriver) ExtendLease(ctx context.Context, o string, ids []int64, l time.Duration) (int64, error) {
	if f.down.Load() && !(len(ids) == 1 && ids[0] == 0) {
		return 0, errDown
	}
	return f.Driver.ExtendLease(ctx, o, ids, l)
}

// TestPipelineStaleHeldFailureLeavesNewLease (review helper-104): a
// transient failure held for the circuit breaker's verdict, because
// the rest of its batch was still publishing, was filed when the batch
// was judged without checking that its row was still leased to that
// batch. Here the batch's lease lapses (its extensions fail), the relay
// leases the failed row x again and publishes it; the old batch's
// failure, filed then, ended the new lease through the owner fence, and
// the relay leased x a third time and published it beside that publish
// ("publish attempts of row x: 3; overlapping publishes of x: 1").
func TestPipelineStaleHeldFailureLeavesNewLease(t *testing.T) {
	db, d, drv := sqliteEnv(t)
	ins := insertEvents(t, db, d, ev{Key: "a"}, ev{Key: "a"}, ev{Key: "h"})
	x, h := ins[0].ID, ins[2].ID
	fd := &leaseDownDriver{Driver: drv}
	fd.down.Store(true) // the first batch's lease cannot be extended
	pub := newRecPub(t)
	var att sync.Map
	var xs publishCount
	pub.setFail(func(m *message.Message) error {
		v, _ := att.LoadOrStore(m.UUID, new(atomic.Int64))
		a := v.(*atomic.Int64).Add(1)
		if m.UUID == x {
			n, done := xs.start()
			a = int64(n)
			defer done()
		}
		switch {
		case m.UUID == x && a == 1:
			// Fails after the batch's lease lapsed.
			time.Sleep(850 * time.Millisecond)
			return errors.New("transient (injected)")
		case m.UUID == x && a == 2:
			time.Sleep(600 * time.Millisecond) // the new batch's publish of x
		case m.UUID == h && a == 1:
			time.Sleep(1500 * time.Millisecond) // keeps the first batch unjudged
		}
		return nil
	})
	opts := testOptions(pub, "stale")
	opts.LeaseDuration = time.Second
	opts.ShutdownTimeout = 500 * time.Millisecond
	opts.BatchSize = 3
	el := &errLog{}
	opts.Logger = slogNew(el)
	stop := runRelay(t, mustRelay(t, fd, opts))
	time.AfterFunc(1050*time.Millisecond, func() { fd.down.Store(false) })
	waitFor(t, "all sent", func() bool { return count(t, db, "status = 1") == 3 })
	time.Sleep(1500 * time.Millisecond) // a stale recording would come by now
	stop()
	xs.atMostTwice(t, el)
}

func slogNew(h *errLog) *slog.Logger { return slog.New(h) }
func contains(s, sub string) bool    { return strings.Contains(s, sub) }

// RunOnce on a Relay whose breaker is open (a previous RunOnce
// ended in an outage) stops right after the probe claim, even when the
// probe succeeds and the breaker closes: it publishes one row instead of
// draining.
func TestPipelineRunOnceStopsAfterSuccessfulProbe(t *testing.T) {
	db, d, drv := sqliteEnv(t)
	var evs []ev
	for k := range 20 {
		evs = append(evs, ev{Key: fmt.Sprintf("k%d", k)})
	}
	ins := insertEvents(t, db, d, evs...)
	pub := newRecPub(t)
	pub.setFail(func(*message.Message) error { return errBrokerDown })
	opts := testOptions(pub, "once")
	opts.BreakerBackoff = func(int) time.Duration { return 50 * time.Millisecond }
	opts.BatchSize = 5
	r := mustRelay(t, drv, opts)
	if _, err := r.RunOnce(context.Background()); err != nil {
		t.Fatal(err)
	}
	if !r.brk.open {
		t.Fatal("breaker not open after the outage")
	}
	pub.setFail(nil) // the broker is back
	time.Sleep(100 * time.Millisecond)
	n, err := r.RunOnce(context.Background())
	t.Logf("RunOnce after the outage: published %d of %d, breaker open %v, sent %d", n, len(ins), r.brk.open, count(t, db, "status = 1"))
	if err != nil || n != len(ins) {
		t.Fatalf("RunOnce = %d, %v; want %d (the probe succeeded: drain)", n, err, len(ins))
	}
}

// a batch claimed before the breaker opened, with a success from
// before the outage, closes the breaker when its last (failing) unit
// reports: claims resume long before the probe is due, during the outage.
func TestPipelineStaleSuccessClosesBreaker(t *testing.T) {
	db, d, drv := sqliteEnv(t)
	b2 := insertEvents(t, db, d, ev{Key: "x"}, ev{Key: "y"})
	pub := newRecPub(t)
	unblockY := make(chan struct{})
	var yStarted atomic.Bool
	var down atomic.Bool
	pub.setFail(func(m *message.Message) error {
		switch {
		case m.UUID == b2[0].ID:
			return nil
		case m.UUID == b2[1].ID && !yStarted.Load():
			yStarted.Store(true)
			<-unblockY
			return errBrokerDown
		case down.Load():
			return errBrokerDown
		}
		return nil
	})
	opts := testOptions(pub, "brk")
	opts.BreakerBackoff = func(int) time.Duration { return 3 * time.Second }
	h := &errLog{info: true}
	opts.Logger = slogNew(h)
	r := mustRelay(t, drv, opts)
	stop := runRelay(t, r)
	waitFor(t, "y publishing", yStarted.Load)
	down.Store(true) // the outage starts
	ab := insertEvents(t, db, d, ev{Key: "a"}, ev{Key: "b"})
	r.Notify()
	has := func(s string) bool {
		h.mu.Lock()
		defer h.mu.Unlock()
		for _, m := range h.msgs {
			if strings.Contains(m, s) {
				return true
			}
		}
		return false
	}
	waitFor(t, "breaker open", func() bool { return has("circuit breaker open") })
	opened := time.Now()
	close(unblockY) // y fails too: the broker is still down
	time.Sleep(time.Second)
	stop()
	h.mu.Lock()
	for _, m := range h.msgs {
		t.Log(m)
	}
	h.mu.Unlock()
	t.Logf("within %v of the breaker opening (next probe in 3s): attempts of a=%d b=%d", time.Since(opened).Round(time.Millisecond), pub.attemptsOf(ab[0].ID), pub.attemptsOf(ab[1].ID))
	if has("circuit breaker closed") {
		t.Errorf("breaker closed during the outage by a success from before it")
	}
}

// once one row in flight has been taken over (its publish still
// hanging here), every later heartbeat finds the count short and stops
// every batch in flight, including batches claimed long after, with
// rows that are still ours.
func TestPipelineLeaseLostStopsEveryBatchForever(t *testing.T) {
	db, d, drv := sqliteEnv(t)
	x := insertEvents(t, db, d, ev{Key: "x"})
	fd := &downDriver{Driver: drv}
	pub := newRecPub(t)
	hang := make(chan struct{})
	defer close(hang)
	var first atomic.Bool
	pub.setFail(func(m *message.Message) error {
		if m.UUID == x[0].ID && first.CompareAndSwap(false, true) {
			fd.down.Store(true)
			<-hang // A's publish of x hangs
			return nil
		}
		if m.Metadata.Get(MetadataKey) == "slow" {
			time.Sleep(800 * time.Millisecond)
		}
		return nil
	})
	mk := func(id string, dr driver.Driver, h *errLog) *Relay {
		opts := testOptions(pub, id)
		opts.LeaseDuration = time.Second
		opts.ShutdownTimeout = 300 * time.Millisecond
		opts.Logger = slogNew(h)
		return mustRelay(t, dr, opts)
	}
	ha, hb := &errLog{}, &errLog{}
	a := mk("a", fd, ha)
	stopA := runRelay(t, a)
	waitFor(t, "A publishing x", first.Load)
	stopB := runRelay(t, mk("b", drv, hb))
	waitFor(t, "B took x over and sent it", func() bool { return count(t, db, "status = 1") == 1 })
	stopB()
	fd.down.Store(false) // A's database is back
	var evs []ev
	for i := range 20 {
		evs = append(evs, ev{Key: fmt.Sprintf("slow%d", i)})
	}
	_ = evs
	for i := 0; i < 6; i++ {
		insertEvents(t, db, d, ev{Key: "slow"}, ev{Key: "slow"})
		a.Notify()
		time.Sleep(500 * time.Millisecond)
	}
	waitFor(t, "all sent", func() bool { return count(t, db, "status = 1") == 13 })
	stopA()
	lost, stopped := 0, 0
	ha.mu.Lock()
	for _, m := range ha.msgs {
		if strings.Contains(m, "lease lost while publishing") {
			lost++
		}
		if strings.Contains(m, "batch stopped early") && strings.Contains(m, "took over") {
			stopped++
		}
	}
	ha.mu.Unlock()
	t.Logf("relay A: %d 'lease lost' heartbeats, %d batches stopped for a lease lost (only x was taken over)", lost, stopped)
	if stopped > 1 {
		t.Errorf("%d batches stopped for the loss of one row of another batch", stopped)
	}
}

// a transient failure is held until every unit of its batch has
// reported (for the breaker): a hung publish of key A keeps key B's failed
// row leased and unrecorded, so B is held back by A's hang.
func TestPipelineHungKeyHoldsBackFailedKeyOfSameBatch(t *testing.T) {
	db, d, drv := sqliteEnv(t)
	ins := insertEvents(t, db, d, ev{Key: "A"}, ev{Key: "B"}, ev{Key: "B"})
	pub := newRecPub(t)
	hang := make(chan struct{})
	var once sync.Once
	defer once.Do(func() { close(hang) })
	var bFailed atomic.Bool
	pub.setFail(func(m *message.Message) error {
		if m.UUID == ins[0].ID {
			<-hang
			return nil
		}
		if m.UUID == ins[1].ID && bFailed.CompareAndSwap(false, true) {
			return errBrokerDown
		}
		return nil
	})
	opts := testOptions(pub, "hold")
	stop := runRelay(t, mustRelay(t, drv, opts))
	defer stop()
	time.Sleep(3 * time.Second)
	s1, s2 := state(t, db, d, ins[1].ID), state(t, db, d, ins[2].ID)
	t.Logf("3s into A's hang: B1 %+v, B2 status %d; attempts B1=%d", s1, s2.Status, pub.attemptsOf(ins[1].ID))
	once.Do(func() { close(hang) })
	if s1.Status != 1 || s2.Status != 1 {
		t.Errorf("key B (failed once, retry after 5ms) still not sent after 3s: held back by key A's hang")
	}
}

// Run returns an error on cancellation when the last recording
// fails (the documented contract: it returns nil).
func TestPipelineRunReturnsErrorOnShutdown(t *testing.T) {
	db, d, drv := sqliteEnv(t)
	insertEvents(t, db, d, ev{Key: "a"})
	pub := newRecPub(t)
	started, release := make(chan struct{}), make(chan struct{})
	pub.setFail(func(*message.Message) error { close(started); <-release; return nil })
	r := mustRelay(t, drv, testOptions(pub, "ret"))
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	<-started
	db.Close() // the database goes away while the row publishes
	close(release)
	time.Sleep(200 * time.Millisecond)
	cancel()
	err := <-done
	t.Logf("Run after cancellation = %v", err)
	if err != nil {
		t.Errorf("Run returned %v on cancellation, documented to return nil", err)
	}
}

// lostReplyDriver commits the first claim that records a row sent, then
// reports an error, as when the commit's reply is lost with the
// connection.
type lostReplyDriver struct {
	driver.Driver
	done atomic.Bool
}

func (l *lostReplyDriver) Claim(ctx context.Context, p driver.ClaimParams) ([]driver.Row, error) {
	rows, err := l.Driver.Claim(ctx, p)
	if err == nil && p.Record != nil && len(p.Record.Sent) > 0 && l.done.CompareAndSwap(false, true) {
		return nil, errors.New("connection reset after commit (injected)")
	}
	return rows, err
}

// A claim that committed its recording and then failed (the reply lost)
// leaves the relay unsure what it recorded: the next recording finds the
// rows marked already and says so, rather than warn that a lease was
// lost (before, only calls cut off at shutdown counted as unsure).
func TestPipelineCommittedFailedClaimIsNoLeaseLoss(t *testing.T) {
	db, d, drv := sqliteEnv(t)
	insertEvents(t, db, d, ev{Key: "a"})
	ld := &lostReplyDriver{Driver: drv}
	pub := newRecPub(t)
	opts := testOptions(pub, "lost-reply")
	opts.LeaseDuration = 2 * time.Second
	opts.ShutdownTimeout = time.Second
	el := &errLog{info: true}
	opts.Logger = slogNew(el)
	stop := runRelay(t, mustRelay(t, ld, opts))
	waitFor(t, "the claim that fails after its commit", ld.done.Load)
	insertEvents(t, db, d, ev{Key: "b"}) // a claim to carry the results again
	waitFor(t, "both sent", func() bool { return count(t, db, "status = 1") == 2 })
	time.Sleep(100 * time.Millisecond)
	stop()
	el.mu.Lock()
	defer el.mu.Unlock()
	said := false
	for _, m := range el.msgs {
		if contains(m, "lease lost") {
			t.Errorf("logged %q for results a failed call had recorded", m)
		}
		said = said || contains(m, "recorded already")
	}
	if !said {
		t.Errorf("no line said some results were recorded already; logged:\n%s", strings.Join(el.msgs, "\n"))
	}
}

// slowRecordDriver holds the first claim that records a failure with a
// deadline until its context ends, then fails with the context's error:
// a database too slow to finish the call before the failure's lease
// could lapse. Claims recording a failure with no deadline go through.
type slowRecordDriver struct {
	driver.Driver
	held      atomic.Bool
	deadline  atomic.Int64 // how far ahead the held call's deadline was, ns
	unbounded atomic.Bool  // a claim recorded a failure with no deadline
}

func (s *slowRecordDriver) Claim(ctx context.Context, p driver.ClaimParams) ([]driver.Row, error) {
	if p.Record != nil && len(p.Record.Failures) > 0 {
		dl, ok := ctx.Deadline()
		if !ok {
			s.unbounded.Store(true)
		} else if s.held.CompareAndSwap(false, true) {
			s.deadline.Store(int64(time.Until(dl)))
			<-ctx.Done()
			return nil, ctx.Err()
		}
	}
	return s.Driver.Claim(ctx, p)
}

// A claim recording failures that are safe beside other claims is cut
// off before their lease could lapse (a claim beside it may lease their
// rows again after that); the relay says so, and records them again,
// alone, with the retry charged once. With one claim at a time (SQLite
// always) no deadline is set: nothing could lease the rows beside it.
func TestPipelineSlowRecordingCutOffBeforeLeaseLapses(t *testing.T) {
	forEachDialect(t, func(t *testing.T, db *sql.DB, d dialect.Dialect, drv driver.Driver) {
		x := insertEvents(t, db, d, ev{Key: "a"})[0].ID
		sd := &slowRecordDriver{Driver: drv}
		pub := newRecPub(t)
		var failed atomic.Bool
		pub.setFail(func(m *message.Message) error {
			if m.UUID == x && failed.CompareAndSwap(false, true) {
				return errors.New("transient (injected)")
			}
			return nil
		})
		opts := testOptions(pub, "cut-off")
		opts.LeaseDuration = 2 * time.Second
		opts.ShutdownTimeout = time.Second
		opts.ParallelClaims = 2
		opts.Backoff = func(int) time.Duration { return 10 * time.Millisecond }
		el := &errLog{}
		opts.Logger = slogNew(el)
		stop := runRelay(t, mustRelay(t, sd, opts))
		waitFor(t, "x sent", func() bool { return state(t, db, d, x).Status == 1 })
		stop()
		if d == dialect.SQLite {
			if sd.held.Load() || !sd.unbounded.Load() {
				t.Fatalf("SQLite (one claim at a time): a failure recorded with a deadline %v, without one %v; want without", sd.held.Load(), sd.unbounded.Load())
			}
			return
		}
		ahead, keep := time.Duration(sd.deadline.Load()), opts.LeaseDuration-leaseMargin(opts.LeaseDuration)
		if !sd.held.Load() || ahead <= 0 || ahead > keep {
			t.Fatalf("the claim recording the failure ran with a deadline %v ahead (held: %v); want one within the trusted lease (%v)", ahead, sd.held.Load(), keep)
		}
		if st := state(t, db, d, x); st.RetryCount != 1 {
			t.Errorf("retry_count %d, want the one failure charged once", st.RetryCount)
		}
		el.mu.Lock()
		defer el.mu.Unlock()
		said := false
		for _, m := range el.msgs {
			said = said || contains(m, "cut off before the lease")
		}
		if !said {
			t.Errorf("no line said the claim was cut off; logged:\n%s", strings.Join(el.msgs, "\n"))
		}
		t.Logf("deadline %v ahead", ahead.Round(time.Millisecond))
	})
}
