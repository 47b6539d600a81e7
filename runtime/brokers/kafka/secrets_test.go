package kafka_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/IBM/sarama"
	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/outboxgen/outboxgen/runtime/brokers/kafka"
)

const secret = "S3cret-kafka-pw"

// saslConfig is a base sarama configuration with SASL/PLAIN credentials and
// short timeouts.
func saslConfig(user, password string) *sarama.Config {
	sc := sarama.NewConfig()
	sc.Net.SASL.Enable = true
	sc.Net.SASL.Mechanism = sarama.SASLTypePlaintext
	sc.Net.SASL.User = user
	sc.Net.SASL.Password = password
	sc.Net.DialTimeout = kafka.DefaultDialTimeout
	sc.Net.ReadTimeout = kafka.DefaultReadTimeout
	sc.Net.WriteTimeout = kafka.DefaultWriteTimeout
	sc.Metadata.Retry.Max = 0
	return sc
}

// TestErrorsHideSecrets: the errors of NewPublisher, NewSubscriber and
// Subscribe never contain the SASL password or a password written into a
// broker address, and errors.Is still sees sarama's sentinel.
func TestErrorsHideSecrets(t *testing.T) {
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(1, topic), kfake.EnableSASL(),
		kfake.Superuser("PLAIN", "admin", "right-password"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	addrs := c.ListenAddrs()
	check := func(t *testing.T, what string, err error, want string) {
		t.Helper()
		if err == nil {
			t.Fatalf("%s: no error", what)
		}
		if strings.Contains(err.Error(), secret) {
			t.Errorf("%s: the error shows the password: %v", what, err)
		}
		if !strings.Contains(err.Error(), want) {
			t.Errorf("%s: the error lacks %q: %v", what, want, err)
		}
		t.Logf("%s: %v", what, err)
	}

	t.Run("wrong SASL password", func(t *testing.T) {
		sc := saslConfig("admin", secret)
		_, err := kafka.NewPublisher(kafka.PublisherConfig{Brokers: addrs, Sarama: sc})
		check(t, "NewPublisher", err, "run out of available brokers")
		if !errors.Is(err, sarama.ErrOutOfBrokers) {
			t.Errorf("errors.Is(err, sarama.ErrOutOfBrokers) is false: %v", err)
		}
		sub, err := kafka.NewSubscriber(kafka.SubscriberConfig{Brokers: addrs, ConsumerGroup: "g", Sarama: sc})
		if err != nil {
			t.Fatal(err)
		}
		defer sub.Close()
		_, err = sub.Subscribe(context.Background(), topic)
		check(t, "Subscribe", err, "run out of available brokers")
	})

	// Addresses with credentials: sarama's dial error would quote them
	// ("dial tcp: address admin:<password>@127.0.0.1:9092: too many
	// colons in address"); they are refused, redacted, up front.
	for name, addr := range map[string]string{
		"user:password@host": "admin:" + secret + "@" + addrs[0],
		"URL":                "kafka://admin:" + secret + "@" + addrs[0],
		"token@host":         secret + "@" + addrs[0],
	} {
		t.Run(name, func(t *testing.T) {
			_, err := kafka.NewPublisher(kafka.PublisherConfig{Brokers: []string{addr}})
			check(t, "NewPublisher", err, "is not host:port")
			_, err = kafka.NewSubscriber(kafka.SubscriberConfig{Brokers: []string{addr}, ConsumerGroup: "g"})
			check(t, "NewSubscriber", err, "is not host:port")
		})
	}
}
