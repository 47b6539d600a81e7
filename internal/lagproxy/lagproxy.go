// Package lagproxy is a TCP proxy for tests and benchmarks that holds
// what a client sends for a lag that can be changed at any time: a
// broker or a database a network away, or one that turned slow, for a
// client that knows nothing of it.
package lagproxy

import (
	"io"
	"net"
	"net/url"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// Proxy forwards TCP connections to a broker, holding every chunk of
// bytes sent to it for the lag set when the chunk arrived: a network, or
// a broker, that turned slow as a whole, for a client that knows nothing
// of it. Bytes keep their order; the broker's replies are not held.
type Proxy struct {
	ln   net.Listener
	to   string
	lag  atomic.Int64 // ns
	down atomic.Bool  // SetDown
	wg   sync.WaitGroup
	mu   sync.Mutex
	open map[net.Conn]bool
	done chan struct{} // closed when the test ends: held chunks are dropped
}

// New listens on a free local port and forwards to upstream
// (host:port) until the test ends.
func New(t testing.TB, upstream string) *Proxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &Proxy{ln: ln, to: upstream, open: map[net.Conn]bool{}, done: make(chan struct{})}
	p.wg.Add(1)
	go p.accept()
	t.Cleanup(p.close)
	return p
}

// ForURL starts a proxy to the host:port of rawURL (a broker's URL) and
// returns it with rawURL pointed at it.
func ForURL(t testing.TB, rawURL string) (*Proxy, string) {
	t.Helper()
	u, err := url.Parse(rawURL)
	if err != nil {
		t.Fatal(err)
	}
	p := New(t, u.Host)
	u.Host = p.Addr()
	return p, u.String()
}

// Addr is the proxy's host:port.
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

// SetLag holds the chunks that arrive from now on for d (0: none).
func (p *Proxy) SetLag(d time.Duration) { p.lag.Store(int64(d)) }

// Cut closes every connection open through the proxy, as a network that
// failed or a broker that restarted would; new connections are forwarded
// as before.
func (p *Proxy) Cut() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for c := range p.open {
		c.Close()
		delete(p.open, c)
	}
}

// SetDown(true) makes the proxy a broker that stopped: it cuts every
// open connection and closes new ones at once, until SetDown(false).
func (p *Proxy) SetDown(down bool) {
	p.down.Store(down)
	if down {
		p.Cut()
	}
}

func (p *Proxy) accept() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		if p.down.Load() {
			c.Close()
			continue
		}
		u, err := net.Dial("tcp", p.to)
		if err != nil {
			c.Close()
			continue
		}
		if !p.track(c, u) {
			return
		}
		p.wg.Add(2)
		go func() { defer p.wg.Done(); p.held(u, c) }()
		go func() { defer p.wg.Done(); io.Copy(c, u); c.Close(); u.Close() }() //nolint:errcheck
	}
}

func (p *Proxy) track(cs ...net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.open == nil { // closed
		for _, c := range cs {
			c.Close()
		}
		return false
	}
	for _, c := range cs {
		if p.down.Load() { // SetDown ran since the check in accept
			c.Close()
			continue
		}
		p.open[c] = true
	}
	return true
}

type chunk struct {
	b   []byte
	due time.Time
}

// held copies src to dst, each chunk once its lag has passed.
func (p *Proxy) held(dst, src net.Conn) {
	defer dst.Close()
	defer src.Close()
	q := make(chan chunk, 1024)
	go func() {
		defer close(q)
		for {
			buf := make([]byte, 32<<10)
			n, err := src.Read(buf)
			if n > 0 {
				select {
				case q <- chunk{buf[:n], time.Now().Add(time.Duration(p.lag.Load()))}:
				case <-p.done:
					return
				}
			}
			if err != nil {
				return
			}
		}
	}()
	for c := range q {
		if d := time.Until(c.due); d > 0 {
			t := time.NewTimer(d)
			select {
			case <-t.C:
			case <-p.done:
				t.Stop()
				return
			}
		}
		if _, err := dst.Write(c.b); err != nil {
			src.Close()
			for range q { // let the reader end
			}
			return
		}
	}
}

func (p *Proxy) close() {
	close(p.done)
	p.ln.Close()
	p.mu.Lock()
	for c := range p.open {
		c.Close()
	}
	p.open = nil
	p.mu.Unlock()
	p.wg.Wait()
}
