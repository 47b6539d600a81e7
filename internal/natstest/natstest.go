// Package natstest runs an in-process NATS server for tests and
// benchmarks: a JetStream broker with a file store, on a free local port,
// started and stopped the same way wherever a test needs a real one.
package natstest

import (
	"errors"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
)

// readyTimeout is how long Run waits for the server to accept
// connections.
const readyTimeout = 10 * time.Second

// Options are a JetStream server's on a random local port (127.0.0.1,
// Port -1) with its file store in dir, without logs or signal handlers:
// what a test's broker needs, for a caller to change before Run (a name,
// a password, a fixed port to restart on).
func Options(dir string) server.Options {
	return server.Options{
		Host:      "127.0.0.1",
		Port:      -1,
		JetStream: true,
		StoreDir:  dir,
		NoLog:     true,
		NoSigs:    true,
	}
}

// Run starts a server with opts and waits until it accepts connections,
// shutting it down if it does not within 10 s. The caller stops it: for
// tests that stop a broker and start it again on the same port and store
// (an outage).
func Run(opts *server.Options) (*server.Server, error) {
	s, err := server.NewServer(opts)
	if err != nil {
		return nil, err
	}
	go s.Start()
	if !s.ReadyForConnections(readyTimeout) {
		s.Shutdown()
		s.WaitForShutdown()
		return nil, errors.New("nats server not ready after 10s")
	}
	return s, nil
}

// Start runs a server with Options(t.TempDir()) changed by mod (nil for
// none), failing the test if it does not start, and shuts it down when
// the test ends: a broker for one test.
func Start(t testing.TB, mod func(*server.Options)) *server.Server {
	t.Helper()
	opts := Options(t.TempDir())
	if mod != nil {
		mod(&opts)
	}
	s, err := Run(&opts)
	if err != nil {
		t.Fatalf("nats server: %v", err)
	}
	t.Cleanup(func() { s.Shutdown(); s.WaitForShutdown() })
	return s
}
