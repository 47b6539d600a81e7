package lagproxy

import (
	"bytes"
	"io"
	"net"
	"testing"
	"time"
)

// The proxy forwards every byte, in order, both ways, with and without a
// lag.
func TestForwards(t *testing.T) {
	p := New(t, echoServer(t))
	for _, lag := range []time.Duration{0, time.Millisecond} {
		p.SetLag(lag)
		c, err := net.Dial("tcp", p.Addr())
		if err != nil {
			t.Fatal(err)
		}
		var sent bytes.Buffer
		for i := range 2000 {
			sent.WriteString(time.Duration(i).String())
		}
		go func() {
			for b := sent.Bytes(); len(b) > 0; b = b[min(len(b), 97):] {
				if _, err := c.Write(b[:min(len(b), 97)]); err != nil {
					return
				}
			}
		}()
		got := make([]byte, sent.Len())
		c.SetReadDeadline(time.Now().Add(30 * time.Second)) //nolint:errcheck
		if _, err := io.ReadFull(c, got); err != nil {
			t.Fatalf("lag %s: read back %v", lag, err)
		}
		if !bytes.Equal(got, sent.Bytes()) {
			t.Fatalf("lag %s: bytes changed or reordered through the proxy", lag)
		}
		c.Close()
	}
}

// echoServer listens on a free port and sends back what it receives.
func echoServer(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() { io.Copy(c, c); c.Close() }() //nolint:errcheck // an echo server
		}
	}()
	return ln.Addr().String()
}

// Cut ends the connections open through the proxy, and only those.
func TestCut(t *testing.T) {
	p := New(t, echoServer(t))
	echo := func(c net.Conn) error {
		if _, err := c.Write([]byte("ping")); err != nil {
			return err
		}
		c.SetReadDeadline(time.Now().Add(10 * time.Second)) //nolint:errcheck
		_, err := io.ReadFull(c, make([]byte, 4))
		return err
	}
	old, err := net.Dial("tcp", p.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer old.Close()
	if err := echo(old); err != nil {
		t.Fatal(err)
	}
	p.Cut()
	if err := echo(old); err == nil {
		t.Fatal("a connection open before Cut still works")
	}
	c, err := net.Dial("tcp", p.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if err := echo(c); err != nil {
		t.Fatalf("a connection made after Cut: %v", err)
	}
}
