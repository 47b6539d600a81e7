package brokerurl

import (
	"errors"
	"log/slog"
	"sync"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/outboxgen/outboxgen/runtime/internal/backoff"
	"github.com/outboxgen/outboxgen/runtime/redact"
)

// amqpConn is the publisher's connection to an AMQP broker. When the
// broker closes it (a restart, a lost network), it dials again, with a
// pause growing from 100 ms to 30 s; calls made meanwhile fail at once,
// and the relay retries them. watermill-amqp's ConnectionWrapper did the
// same, but swapped its connection without a lock under running calls (a
// data race on every reconnect), and could leave a connection open when
// closed while reconnecting.
type amqpConn struct {
	uri     string
	cfg     amqp.Config
	log     *slog.Logger
	secrets []string // masked in logged errors

	mu     sync.Mutex
	conn   *amqp.Connection // nil while reconnecting, or once closed
	closed bool
	done   chan struct{} // closed by Close: the reconnect loop ends
	wg     sync.WaitGroup
}

// errAMQPReconnecting is a call's error while the connection is down.
var errAMQPReconnecting = errors.New("not connected to AMQP: reconnecting")

// dialAMQP connects to uri, and keeps the connection up until Close.
func dialAMQP(uri string, cfg amqp.Config, log *slog.Logger, secrets []string) (*amqpConn, error) {
	conn, err := amqp.DialConfig(uri, cfg)
	if err != nil {
		return nil, err
	}
	c := &amqpConn{uri: uri, cfg: cfg, log: log, secrets: secrets, conn: conn, done: make(chan struct{})}
	c.wg.Add(1)
	go c.keep(conn)
	return c, nil
}

// current is the open connection; an error while reconnecting or closed.
func (c *amqpConn) current() (*amqp.Connection, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	switch {
	case c.closed:
		return nil, errors.New("AMQP publisher closed")
	case c.conn == nil || c.conn.IsClosed():
		return nil, errAMQPReconnecting
	}
	return c.conn, nil
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
		case <-c.done:
			return
		case err := <-closed:
			msg := "connection closed"
			if err != nil {
				msg = redact.StringWith(err.Error(), c.secrets...)
			}
			c.log.Warn("AMQP connection lost: reconnecting; publishes fail until it is back, and the relay retries them", slog.String("error", msg))
		}
		c.mu.Lock()
		c.conn = nil
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
		case <-c.done:
			t.Stop()
			return nil
		case <-t.C:
		}
		conn, err := amqp.DialConfig(c.uri, c.cfg)
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
		c.conn = conn
		c.mu.Unlock()
		c.log.Info("AMQP connection restored", slog.Int("attempts", bo.Failures()))
		return conn
	}
}

// Close stops the reconnecting and closes the connection.
func (c *amqpConn) Close() error {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return nil
	}
	c.closed = true
	conn := c.conn
	c.conn = nil
	close(c.done)
	c.mu.Unlock()
	c.wg.Wait()
	if conn == nil || conn.IsClosed() {
		return nil
	}
	return conn.Close()
}
