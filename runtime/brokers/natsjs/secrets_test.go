package natsjs_test

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"

	"github.com/outboxgen/outboxgen/internal/natstest"
	"github.com/outboxgen/outboxgen/runtime/brokers/natsjs"
)

const secret = "S3cret-nats-pw"

// startAuthNATS starts a server that accepts user app with password
// right-password only.
func startAuthNATS(t *testing.T) *server.Server {
	t.Helper()
	return natstest.Start(t, func(o *server.Options) {
		o.JetStream, o.StoreDir = false, ""
		o.Username, o.Password = "app", "right-password"
	})
}

// TestErrorsHideSecrets: NewPublisher's and NewSubscriber's errors never
// contain a password or token, whether it came in the URL (user:password,
// a token as the URL's user) or in NatsOptions, and errors.Is still sees
// the nats error.
func TestErrorsHideSecrets(t *testing.T) {
	srv := startAuthNATS(t)
	hostPort := fmt.Sprintf("127.0.0.1:%d", port(srv))
	cases := []struct {
		name   string
		url    string
		opts   []nats.Option
		wantIs error
	}{
		{"wrong password in the URL", "nats://app:" + secret + "@" + hostPort, nil, nats.ErrAuthorization},
		{"token in the URL", "nats://" + secret + "@" + hostPort, nil, nats.ErrAuthorization},
		{"password with an @ in the URL", "nats://app:" + secret + "@x@" + hostPort, nil, nats.ErrAuthorization},
		{"server list", "nats://app:" + secret + "@" + hostPort + ", nats://app:" + secret + "@127.0.0.1:1", nil, nil}, // auth violation or no servers, by the random server order
		{"bad port", "nats://app:" + secret + "@127.0.0.1:notaport", nil, nil},
		{"UserInfo option", "nats://" + hostPort, []nats.Option{nats.UserInfo("app", secret)}, nats.ErrAuthorization},
		{"Token option", "nats://" + hostPort, []nats.Option{nats.Token(secret)}, nats.ErrAuthorization},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			opts := append([]nats.Option{nats.Timeout(2 * time.Second)}, tc.opts...)
			_, perr := natsjs.NewPublisher(natsjs.Config{URL: tc.url, NatsOptions: opts})
			_, serr := natsjs.NewSubscriber(natsjs.SubscriberConfig{URL: tc.url, NatsOptions: opts})
			for what, err := range map[string]error{"NewPublisher": perr, "NewSubscriber": serr} {
				if err == nil {
					t.Fatalf("%s: no error", what)
				}
				if strings.Contains(err.Error(), secret) {
					t.Errorf("%s: the error shows the secret: %v", what, err)
				}
				if !strings.Contains(err.Error(), "natsjs: connect to nats://") {
					t.Errorf("%s: the error no longer names the server: %v", what, err)
				}
				if tc.wantIs != nil && !errors.Is(err, tc.wantIs) {
					t.Errorf("%s: errors.Is(err, %v) is false: %v", what, tc.wantIs, err)
				}
				t.Logf("%s: %v", what, err)
			}
		})
	}
}

func TestRedactURL(t *testing.T) {
	for in, want := range map[string]string{
		"nats://app:" + secret + "@h:4222":                          "nats://app:xxxxx@h:4222",
		"nats://" + secret + "@h:4222, tls://u:" + secret + "@h2:1": "nats://xxxxx@h:4222, tls://u:xxxxx@h2:1",
		"nats://h:4222":                   "nats://h:4222",
		"nats://app:" + secret + "@h:bad": "nats://app:xxxxx@h:bad",
	} {
		if got := natsjs.RedactURL(in); got != want {
			t.Errorf("RedactURL(%q) = %q, want %q", in, got, want)
		}
	}
}
