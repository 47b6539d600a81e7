// Package workers runs functions on goroutines it keeps for a while.
//
// A relay runs every publisher call on a goroutine of its own, so that a
// call that never returns can be left behind. A fresh goroutine's stack
// grows, and is copied, through the publisher's calls each time (a
// JetStream publish decodes its ack several frames deep); a kept one has
// grown already. Fresh goroutines cost the polling relay a sixth of its
// CPU.
package workers

import (
	"sync"
	"time"
)

// Idle is how long an idle worker waits for another function before it
// ends.
const Idle = 5 * time.Second

// Pool runs functions on idle workers, or on new ones when none is idle.
// The zero Pool is not usable: use New. A nil *Pool runs every function
// on a goroutine of its own.
type Pool struct {
	jobs chan func()
	quit chan struct{}
	once sync.Once
	idle time.Duration
}

// New returns a Pool whose workers end after Idle without work.
func New() *Pool { return newPool(Idle) }

func newPool(idle time.Duration) *Pool {
	return &Pool{jobs: make(chan func()), quit: make(chan struct{}), idle: idle}
}

// Go runs fn on an idle worker, or on a new one when none is idle. It
// never waits for a worker.
func (p *Pool) Go(fn func()) {
	if p == nil {
		go fn()
		return
	}
	select {
	case p.jobs <- fn:
	default:
		go p.work(fn)
	}
}

func (p *Pool) work(fn func()) {
	t := time.NewTimer(p.idle)
	defer t.Stop()
	for {
		fn()
		fn = nil // an idle worker keeps nothing of its last function alive
		t.Reset(p.idle)
		select {
		case fn = <-p.jobs:
		case <-t.C:
			return
		case <-p.quit:
			return
		}
	}
}

// Stop ends the idle workers, and each busy one once its function
// returns; it does not wait for them. Go still works after Stop, on a
// goroutine of its own each time.
func (p *Pool) Stop() {
	if p != nil {
		p.once.Do(func() { close(p.quit) })
	}
}
