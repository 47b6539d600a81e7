package natstest

import (
	"errors"
	"net"
	"testing"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
)

// A started server takes connections and JetStream publishes: a stream,
// a message, its acknowledgement.
func TestStart(t *testing.T) {
	s := Start(t, nil)
	js := jetStream(t, s.ClientURL())
	if _, err := js.AddStream(&nats.StreamConfig{Name: "T", Subjects: []string{"t.>"}}); err != nil {
		t.Fatal(err)
	}
	ack, err := js.Publish("t.a", []byte("hello"))
	if err != nil {
		t.Fatal(err)
	}
	if ack.Stream != "T" || ack.Sequence != 1 {
		t.Fatalf("ack = %+v, want stream T sequence 1", ack)
	}
}

// mod changes the options: a server that requires a password refuses a
// client without one and takes a client with it.
func TestStartMod(t *testing.T) {
	s := Start(t, func(o *server.Options) { o.Username, o.Password = "app", "pw" })
	if nc, err := nats.Connect(s.ClientURL()); !errors.Is(err, nats.ErrAuthorization) {
		if nc != nil {
			nc.Close()
		}
		t.Fatalf("connect without a password: %v, want %v", err, nats.ErrAuthorization)
	}
	nc, err := nats.Connect(s.ClientURL(), nats.UserInfo("app", "pw"))
	if err != nil {
		t.Fatal(err)
	}
	nc.Close()
}

// Run restarts a server on the same port and store: a stream created
// before the restart is still there, at the same URL.
func TestRunRestart(t *testing.T) {
	opts := Options(t.TempDir())
	s, err := Run(&opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Shutdown(); s.WaitForShutdown() }) // the one running by then
	url := s.ClientURL()
	if _, err := jetStream(t, url).AddStream(&nats.StreamConfig{Name: "T", Subjects: []string{"t.>"}}); err != nil {
		t.Fatal(err)
	}
	opts.Port = s.Addr().(*net.TCPAddr).Port
	s.Shutdown()
	s.WaitForShutdown()

	restarted, err := Run(&opts)
	if err != nil {
		t.Fatal(err)
	}
	s = restarted
	if s.ClientURL() != url {
		t.Fatalf("restarted at %s, want %s", s.ClientURL(), url)
	}
	if _, err := jetStream(t, url).StreamInfo("T"); err != nil {
		t.Fatalf("stream after the restart: %v", err)
	}
}

// jetStream connects to the server at url for the rest of the test.
func jetStream(t *testing.T, url string) nats.JetStreamContext {
	t.Helper()
	nc, err := nats.Connect(url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := nc.JetStream()
	if err != nil {
		t.Fatal(err)
	}
	return js
}
