package workers

import (
	"bytes"
	"runtime"
	"strconv"
	"sync"
	"testing"
	"time"
)

// goid is the calling goroutine's id, from its stack trace's first line
// ("goroutine 42 [running]:").
func goid(t *testing.T) int {
	buf := make([]byte, 64)
	buf = buf[:runtime.Stack(buf, false)]
	f := bytes.Fields(buf)
	if len(f) < 2 {
		t.Fatalf("stack trace %q", buf)
	}
	id, err := strconv.Atoi(string(f[1]))
	if err != nil {
		t.Fatalf("stack trace %q: %v", buf, err)
	}
	return id
}

// on runs a function on p, waits for it and returns its goroutine's id.
func on(t *testing.T, p *Pool) int {
	t.Helper()
	ids := make(chan int)
	p.Go(func() { ids <- goid(t) })
	select {
	case id := <-ids:
		return id
	case <-time.After(10 * time.Second):
		t.Fatal("function not run within 10s")
		return 0
	}
}

// settle waits until the worker that ran the last function waits for
// the next one: it sends its result before it returns.
func settle() { time.Sleep(20 * time.Millisecond) }

// Functions run one after the other run on one worker. (A function run
// before the worker is back waiting makes another one: a slow machine
// may do that now and then, so a few are allowed; a goroutine per
// function makes 20.)
func TestReusesIdleWorker(t *testing.T) {
	p := New()
	defer p.Stop()
	seen := map[int]bool{}
	for range 20 {
		seen[on(t, p)] = true
		settle()
	}
	if len(seen) > 3 {
		t.Fatalf("20 functions run one after the other ran on %d goroutines, want the idle worker reused", len(seen))
	}
}

func TestGoDoesNotWaitForBusyWorkers(t *testing.T) {
	p := New()
	defer p.Stop()
	release := make(chan struct{})
	var started, done sync.WaitGroup
	ids := make(chan int, 50)
	for range 50 {
		started.Add(1)
		done.Add(1)
		p.Go(func() {
			defer done.Done()
			ids <- goid(t)
			started.Done()
			<-release
		})
	}
	started.Wait() // every function runs at once: none waited for a worker
	close(release)
	done.Wait()
	close(ids)
	seen := map[int]bool{}
	for id := range ids {
		if seen[id] {
			t.Fatalf("goroutine %d ran two functions at once", id)
		}
		seen[id] = true
	}
}

func TestIdleWorkerEnds(t *testing.T) {
	p := newPool(30 * time.Millisecond)
	defer p.Stop()
	first := on(t, p)
	time.Sleep(200 * time.Millisecond)
	if id := on(t, p); id == first {
		t.Fatalf("function ran on worker %d, idle for longer than its idle time", id)
	}
}

func TestStop(t *testing.T) {
	p := New()
	first := on(t, p)
	settle()
	p.Stop()
	p.Stop() // twice is fine
	// The worker ends (it may take one more function first, if it has
	// not seen Stop yet); then functions still run, each on a goroutine
	// of its own, which does not stay.
	a := on(t, p)
	for deadline := time.Now().Add(5 * time.Second); a == first && time.Now().Before(deadline); {
		settle()
		a = on(t, p)
	}
	settle()
	b := on(t, p)
	if a == first || b == first || a == b {
		t.Fatalf("after Stop: goroutines %d and %d, the worker before it %d: want three distinct", a, b, first)
	}
}

func TestNilPool(t *testing.T) {
	var p *Pool
	on(t, p)
	p.Stop()
}
