package main

import (
	"bytes"
	"fmt"
	"net"
	"strings"
	"testing"

	"github.com/nats-io/nats-server/v2/server"

	"github.com/outboxgen/outboxgen/internal/natstest"
)

const secret = "S3cret-demo-pw"

// closedPort returns a loopback port nothing listens on.
func closedPort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := l.Addr().(*net.TCPAddr).Port
	l.Close()
	return p
}

// TestCommandHidesPasswords: whatever -db or -broker holds, the command's
// error output shows no password.
func TestCommandHidesPasswords(t *testing.T) {
	p := closedPort(t)
	cases := []struct {
		name string
		args []string
		want string // in stderr
	}{
		{"bare mysql DSN", []string{"-db", fmt.Sprintf("app:%s@tcp(127.0.0.1:%d)/orders", secret, p)}, "cannot tell the database"},
		{"mysql URL", []string{"-db", fmt.Sprintf("mysql://app:%s@tcp(127.0.0.1:%d)/orders", secret, p)}, "connect to mysql"},
		{"mysql URL with ? in the password", []string{"-db", fmt.Sprintf("mysql://app:%s?x@tcp(127.0.0.1:%d)/orders", secret, p)}, "connect to mysql"},
		{"postgres URL", []string{"-db", fmt.Sprintf("postgres://app:%s@127.0.0.1:%d/orders", secret, p)}, "postgres://app:xxxxx@"},
		{"postgres URL net/url cannot parse", []string{"-db", fmt.Sprintf("postgres://app:%s%%zz@127.0.0.1:%d/orders", secret, p)}, "connect to postgres"},
		{"postgres keyword/value", []string{"-driver", "postgres", "-db", fmt.Sprintf("host=127.0.0.1 port=%d user=app password='%s x' dbname=orders", p, secret)}, "connect to postgres"},
		{"mysql DSN without a database", []string{"-db", fmt.Sprintf("app:%s@tcp(127.0.0.1:%d)", secret, p)}, "cannot tell the database"},
		{"mysql DSN with a space in the password", []string{"-db", fmt.Sprintf("app:%s x@tcp(127.0.0.1:%d)/orders", secret, p)}, "-db"},
		{"nats URL", []string{"-broker", fmt.Sprintf("nats://app:%s@127.0.0.1:%d", secret, p), "-db", ""}, "nats://app:xxxxx@"},
		{"nats token URL", []string{"-broker", fmt.Sprintf("nats://%s@127.0.0.1:%d", secret, p), "-db", ""}, "nats://xxxxx@"},
		{"unknown broker", []string{"-broker", fmt.Sprintf("amqp://app:%s@127.0.0.1:%d", secret, p), "-db", ""}, "amqp://app:xxxxx@"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			code := runMain(append(tc.args, "-orders", "1", "-timeout", "5s"), &stdout, &stderr)
			out := stdout.String() + stderr.String()
			if code == 0 {
				t.Fatalf("exit 0:\n%s", out)
			}
			if strings.Contains(out, secret) {
				t.Errorf("the output shows the password:\n%s", out)
			}
			if !strings.Contains(stderr.String(), tc.want) {
				t.Errorf("stderr lacks %q:\n%s", tc.want, stderr.String())
			}
		})
	}
}

// TestRunHidesBrokerPassword: a full run against a NATS server that
// requires a password prints the broker's URL without it, in the settings
// and in every log line (-v).
func TestRunHidesBrokerPassword(t *testing.T) {
	srv := natstest.Start(t, func(o *server.Options) { o.Username, o.Password = "app", secret })
	url := fmt.Sprintf("nats://app:%s@%s", secret, srv.Addr().String())

	var out bytes.Buffer
	cfg := testConfig(t, &out)
	cfg.Broker, cfg.Orders, cfg.Verbose = url, 20, true
	res, err := Run(t.Context(), cfg)
	if err != nil {
		t.Fatalf("Run: %v\n%s", err, out.String())
	}
	if !res.Reconciled {
		t.Fatalf("not reconciled:\n%s", out.String())
	}
	if strings.Contains(out.String(), secret) {
		t.Fatalf("the output shows the password:\n%s", out.String())
	}
	if !strings.Contains(out.String(), "NATS JetStream at nats://app:xxxxx@") {
		t.Fatalf("the settings lack the redacted broker URL:\n%s", out.String())
	}
}
