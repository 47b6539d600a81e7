package brokerurl

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"sync"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/outboxgen/outboxgen/runtime/internal/backoff"
	"github.com/outboxgen/outboxgen/runtime/redact"
)

// amqpConn is a publisher's or a subscriber's connection to an AMQP
// broker. When the broker closes it (a restart, a lost network), it dials
// again, with a pause growing from 100 ms to 30 s; a publisher's calls
// made meanwhile fail at once (the relay retries them), and a
// subscriber's subscriptions wait for the new connection. watermill-amqp's
// ConnectionWrapper did the same, but swapped its connection without a
// lock under running calls (a data race on every reconnect,
// ThreeDotsLabs/watermill#693), and could leave a connection open when
// closed while reconnecting.
type amqpConn struct {
	uri       string
	cfg       amqp.Config   // its Dial is dial
	timeout   time.Duration // of a dial: the TCP connect, then the TLS and AMQP handshakes
	log       *slog.Logger
	secrets   []string // masked in logged errors
	meanwhile string   // the log's word on what happens while reconnecting

	ctx    context.Context // cancelled by Close: a dial, and the reconnecting, end
	cancel context.CancelFunc
	wg     sync.WaitGroup

	mu          sync.Mutex
	conn        *amqp.Connection // nil while reconnecting, or once closed
	up          chan struct{}    // closed while conn is set: wait's signal
	gen         uint64           // conn's generation: 1, then one more per reconnect
	sock        net.Conn         // conn's socket: Close closes it when the broker does not answer
	handshaking net.Conn         // a dial's socket before its connection is made: Close closes it
	closed      bool
}

// A call's error while the connection is down, and once it is closed.
var (
	errAMQPReconnecting = errors.New("not connected to AMQP: reconnecting")
	errAMQPClosed       = errors.New("AMQP connection closed (Close was called)")
)

// Log words on what happens while a connection is down (amqpConn's
// meanwhile).
const (
	amqpPublishesMeanwhile     = "publishes fail until it is back, and the relay retries them"
	amqpSubscriptionsMeanwhile = "subscriptions resume when it is back; unacknowledged messages go back to their queues"
)

// dialAMQP connects to uri within timeout, cut short by ctx (Open's: its
// cancellation ends the dial), and keeps the connection up until Close,
// each later dial within timeout. The URL's connection_timeout
// (milliseconds), if set, replaces timeout: amqp091-go reads it only when
// it dials itself. meanwhile is the log's word on what happens while it
// reconnects.
func dialAMQP(ctx context.Context, uri string, cfg amqp.Config, timeout time.Duration, log *slog.Logger, secrets []string, meanwhile string) (*amqpConn, error) {
	if u, err := amqp.ParseURI(uri); err == nil && u.ConnectionTimeout > 0 {
		timeout = time.Duration(u.ConnectionTimeout) * time.Millisecond
	}
	first := timeout
	if dl, ok := ctx.Deadline(); ok {
		first = max(min(first, time.Until(dl)), time.Millisecond)
	}
	c := &amqpConn{uri: uri, cfg: cfg, timeout: first, log: log, secrets: secrets, meanwhile: meanwhile, up: make(chan struct{})}
	c.ctx, c.cancel = context.WithCancel(context.Background())
	c.cfg.Dial = c.dial
	abort := context.AfterFunc(ctx, func() { c.Close() }) //nolint:errcheck // no connection yet
	conn, sock, err := c.connect()
	if !abort() { // ctx ended: Close ran, or is running
		if err == nil {
			conn.Close() //nolint:errcheck // not kept
		}
		return nil, context.Cause(ctx)
	}
	if err != nil {
		c.cancel()
		return nil, err
	}
	c.timeout = timeout // before keep starts: no dial runs meanwhile
	c.conn, c.sock, c.gen = conn, sock, 1
	close(c.up)
	c.wg.Add(1)
	go c.keep(conn)
	return c, nil
}

// dial is amqp091-go's DefaultDial (a TCP connect, then a deadline on the
// socket for the handshakes), except that Close ends it: the connect
// through its context, the handshakes by closing the socket.
func (c *amqpConn) dial(network, addr string) (net.Conn, error) {
	ctx, cancel := context.WithTimeout(c.ctx, c.timeout)
	defer cancel()
	sock, err := (&net.Dialer{}).DialContext(ctx, network, addr)
	if err != nil {
		return nil, err
	}
	if err := sock.SetDeadline(time.Now().Add(c.timeout)); err != nil {
		sock.Close()
		return nil, err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		sock.Close()
		return nil, errAMQPClosed
	}
	c.handshaking = sock
	return sock, nil
}

// connect dials a connection; sock is its socket.
func (c *amqpConn) connect() (conn *amqp.Connection, sock net.Conn, err error) {
	conn, err = amqp.DialConfig(c.uri, c.cfg)
	c.mu.Lock()
	sock, c.handshaking = c.handshaking, nil
	c.mu.Unlock()
	return conn, sock, err
}

// current is the open connection and its generation; an error while
// reconnecting or closed.
func (c *amqpConn) current() (*amqp.Connection, uint64, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.currentLocked()
}

// currentLocked is current with c.mu held. A connection closed before
// keep heard of it is forgotten, so that it is not returned again.
func (c *amqpConn) currentLocked() (*amqp.Connection, uint64, error) {
	if c.closed {
		return nil, 0, errAMQPClosed
	}
	if c.conn != nil && c.conn.IsClosed() {
		c.lost()
	}
	if c.conn == nil {
		return nil, 0, errAMQPReconnecting
	}
	return c.conn, c.gen, nil
}

// wait is the open connection and its generation, once there is one:
// while reconnecting it waits for the next, until ctx ends (its error)
// or Close (errAMQPClosed).
func (c *amqpConn) wait(ctx context.Context) (*amqp.Connection, uint64, error) {
	for {
		c.mu.Lock()
		conn, gen, err := c.currentLocked()
		if !errors.Is(err, errAMQPReconnecting) {
			c.mu.Unlock()
			return conn, gen, err
		}
		up := c.up
		c.mu.Unlock()
		select {
		case <-up:
		case <-c.ctx.Done():
		case <-ctx.Done():
			return nil, 0, ctx.Err()
		}
	}
}

// lost forgets the current connection, if any; c.mu is held.
func (c *amqpConn) lost() {
	if c.conn != nil {
		c.conn = nil
		c.up = make(chan struct{})
	}
}

// keep waits for conn to close, then dials until a connection is made
// (which it keeps in turn) or Close is called.
func (c *amqpConn) keep(conn *amqp.Connection) {
	defer c.wg.Done()
	for {
		// Buffered: amqp091-go sends the error while holding the
		// connection's lock, and this loop may be past its select.
		closed := conn.NotifyClose(make(chan *amqp.Error, 1))
		select {
		case <-c.ctx.Done():
			return
		case err := <-closed:
			if c.ctx.Err() != nil {
				return // closed by Close
			}
			msg := "connection closed"
			if err != nil {
				msg = redact.StringWith(err.Error(), c.secrets...)
			}
			c.log.Warn("AMQP connection lost: reconnecting; "+c.meanwhile, slog.String("error", msg))
		}
		c.mu.Lock()
		c.lost()
		c.mu.Unlock()
		if conn = c.redial(); conn == nil {
			return
		}
	}
}

// redial dials until it connects (the new connection, now current) or
// Close is called (nil).
func (c *amqpConn) redial() *amqp.Connection {
	bo := backoff.New(backoff.Floor, backoff.DefaultMax)
	for {
		t := time.NewTimer(bo.Next())
		select {
		case <-c.ctx.Done():
			t.Stop()
			return nil
		case <-t.C:
		}
		conn, sock, err := c.connect()
		if c.ctx.Err() != nil {
			if err == nil {
				conn.Close() //nolint:errcheck // closed while dialling: not kept
			}
			return nil
		}
		if err != nil {
			c.log.Warn("AMQP reconnect failed: trying again", slog.String("error", redact.StringWith(err.Error(), c.secrets...)), slog.Int("attempt", bo.Failures()))
			continue
		}
		c.mu.Lock()
		if c.closed {
			c.mu.Unlock()
			conn.Close() //nolint:errcheck // closed while dialling: not kept
			return nil
		}
		c.conn, c.sock = conn, sock
		c.gen++
		close(c.up)
		c.mu.Unlock()
		c.log.Info("AMQP connection restored", slog.Int("attempts", bo.Failures()))
		return conn
	}
}

// amqpCloseWait bounds Close's wait for the broker's answer to closing
// the connection: a broker that stopped answering (TCP still up) would
// otherwise hold Close until the heartbeats time out. The connection is
// closed either way.
const amqpCloseWait = time.Second

// Close stops the reconnecting, ending a dial under way, and closes the
// connection, waiting at most amqpCloseWait for the broker.
func (c *amqpConn) Close() error {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return nil
	}
	c.closed = true
	conn, sock, handshaking := c.conn, c.sock, c.handshaking
	c.conn = nil
	c.mu.Unlock()
	c.cancel()
	if handshaking != nil {
		handshaking.Close() // its handshake fails at once
	}
	c.wg.Wait()
	if conn == nil || conn.IsClosed() {
		return nil
	}
	closed := make(chan error, 1)
	go func() { closed <- conn.Close() }()
	t := time.NewTimer(amqpCloseWait)
	defer t.Stop()
	select {
	case err := <-closed:
		return err
	case <-t.C:
	}
	sock.Close() // its reader fails, which ends conn.Close
	select {
	case <-closed:
	case <-time.After(amqpCloseWait):
	}
	return fmt.Errorf("the broker did not answer the close within %s: the connection was dropped", amqpCloseWait)
}
