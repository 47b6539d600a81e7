package brokerurl

import (
	"context"
	"errors"
	"net"
	"strings"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/outboxgen/outboxgen/runtime/brokers/kafka"
)

var kafkaParams = []string{"client_id", "version", "from"}

type kafkaSettings struct {
	brokers    []string
	clientID   string
	version    sarama.KafkaVersion
	fromNewest bool
}

func kafkaParse(u *brokerURL) (kafkaSettings, error) {
	var s kafkaSettings
	rest := strings.TrimPrefix(u.base[len(u.scheme)+1:], "//")
	if strings.Contains(rest, "@") {
		return s, u.errorf("kafka:// URLs carry no credentials: for SASL or TLS build the publisher with package kafka and a sarama configuration (Net.SASL, Net.TLS)")
	}
	if strings.Contains(strings.TrimRight(rest, "/"), "/") {
		return s, u.errorf("a kafka:// URL has no path: write kafka://host:9092[,host2:9092]")
	}
	s.brokers = u.hosts()
	for _, b := range s.brokers {
		if _, port, err := net.SplitHostPort(b); err != nil || port == "" {
			return s, u.errorf("broker %q is not host:port: write kafka://host:9092[,host2:9092]", b)
		}
	}
	s.clientID, _ = u.take("client_id")
	if v, ok := u.take("version"); ok {
		ver, err := sarama.ParseKafkaVersion(v)
		if err != nil {
			return s, u.errorf("parameter version=%q: use a Kafka version such as 2.8.0", v)
		}
		s.version = ver
	}
	if v, ok := u.take("from"); ok {
		switch v {
		case "oldest":
		case "newest":
			s.fromNewest = true
		default:
			return s, u.errorf("parameter from=%q: use oldest or newest", v)
		}
	}
	return s, u.noMoreParams(kafkaParams...)
}

func openKafka(u *brokerURL, opt Options) (message.Publisher, error) {
	if _, ok := u.query["from"]; ok {
		return nil, u.errorf("parameter from= is for subscribers: a publisher takes %s", strings.Join(kafkaParams[:2], ", "))
	}
	s, err := kafkaParse(u)
	if err != nil {
		return nil, err
	}
	pub, err := kafka.NewPublisher(kafka.PublisherConfig{
		Brokers:  s.brokers,
		ClientID: s.clientID,
		Version:  s.version,
		Logger:   opt.Logger,
	})
	if err != nil {
		return nil, u.wrap("connect to Kafka", err)
	}
	return pub, nil
}

func openKafkaSubscriber(ctx context.Context, u *brokerURL, group string, opt Options) (message.Subscriber, error) {
	s, err := kafkaParse(u)
	if err != nil {
		return nil, err
	}
	// watermill-kafka connects on the first Subscribe; fail now when no
	// broker answers.
	if err := dialAny(ctx, s.brokers, opt); err != nil {
		return nil, u.wrap("connect to Kafka", err)
	}
	sub, err := kafka.NewSubscriber(kafka.SubscriberConfig{
		Brokers:       s.brokers,
		ConsumerGroup: group,
		ClientID:      s.clientID,
		Version:       s.version,
		FromNewest:    s.fromNewest,
		Logger:        opt.Logger,
	})
	if err != nil {
		return nil, u.wrap("Kafka subscriber", err)
	}
	return sub, nil
}

// dialAny opens (and closes) a TCP connection to the first address of
// addrs that answers within the connect timeout.
func dialAny(ctx context.Context, addrs []string, opt Options) error {
	var errs []error
	for _, a := range addrs {
		dctx, cancel := context.WithTimeout(ctx, opt.connectTimeout(ctx))
		c, err := (&net.Dialer{}).DialContext(dctx, "tcp", a)
		cancel()
		if err == nil {
			return c.Close()
		}
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}
