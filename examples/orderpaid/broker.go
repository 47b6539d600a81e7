package main

import (
	"fmt"
	"log/slog"
	"os"
	"strings"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"

	"github.com/outboxgen/outboxgen/runtime/brokers/natsjs"
	"github.com/outboxgen/outboxgen/runtime/redact"
)

// broker is the message broker between the relay and the consumers.
type broker struct {
	desc string
	pub  message.Publisher
	// subscriber returns the subscriber for one consumer.
	subscriber func(consumer string) (message.Subscriber, error)
	closers    []func()
}

func (b *broker) close() {
	for i := len(b.closers) - 1; i >= 0; i-- {
		b.closers[i]()
	}
}

// openBroker starts the broker named by spec: "" or "gochannel" (watermill's
// in-process GoChannel), "nats-embedded" (a NATS server with JetStream
// started inside this process) or a nats:// URL.
func openBroker(spec string, logger *slog.Logger) (*broker, error) {
	switch {
	case spec == "" || spec == "gochannel":
		// BlockPublishUntilSubscriberAck: Publish returns once every
		// consumer acked (committed), so a relay "sent" means "consumed",
		// and an event is delivered only after the previous event of its
		// key was (per-key order end to end). Nothing is persisted: this
		// broker lives and dies with the process.
		gc := gochannel.NewGoChannel(gochannel.Config{BlockPublishUntilSubscriberAck: true}, watermill.NewSlogLogger(logger))
		return &broker{
			desc:       "GoChannel (watermill, in-process; Publish waits for the consumers' ack)",
			pub:        gc,
			subscriber: func(string) (message.Subscriber, error) { return gc, nil },
			closers:    []func(){func() { gc.Close() }},
		}, nil
	case spec == "nats-embedded":
		dir, err := os.MkdirTemp("", "orderpaid-nats-")
		if err != nil {
			return nil, err
		}
		srv, err := server.NewServer(&server.Options{
			ServerName: "orderpaid-embedded",
			Host:       "127.0.0.1",
			Port:       server.RANDOM_PORT,
			JetStream:  true,
			StoreDir:   dir,
			NoLog:      true,
			NoSigs:     true,
		})
		if err != nil {
			os.RemoveAll(dir)
			return nil, fmt.Errorf("embedded nats-server: %w", err)
		}
		go srv.Start()
		if !srv.ReadyForConnections(10 * time.Second) {
			srv.Shutdown()
			os.RemoveAll(dir)
			return nil, fmt.Errorf("embedded nats-server: not ready after 10s")
		}
		b, err := openNATS(srv.ClientURL(), logger)
		if err != nil {
			srv.Shutdown()
			os.RemoveAll(dir)
			return nil, err
		}
		b.desc = "NATS JetStream, embedded nats-server at " + srv.ClientURL() + " (store in " + dir + ", removed at exit)"
		b.closers = append([]func(){func() { srv.Shutdown(); srv.WaitForShutdown(); os.RemoveAll(dir) }}, b.closers...)
		return b, nil
	case strings.HasPrefix(spec, "nats://") || strings.HasPrefix(spec, "tls://"):
		b, err := openNATS(spec, logger)
		if err != nil {
			return nil, err
		}
		b.desc = "NATS JetStream at " + natsjs.RedactURL(spec)
		return b, nil
	}
	return nil, fmt.Errorf("-broker %q: use gochannel, nats-embedded or a nats:// URL", redact.URL(spec))
}

// openNATS connects the relay's publisher and one subscriber per consumer
// to the NATS server at url. Streams are created on first use, one per
// topic ("OUTBOX_orders_paid" capturing the subject "orders.paid").
func openNATS(url string, logger *slog.Logger) (*broker, error) {
	pub, err := natsjs.NewPublisher(natsjs.Config{
		URL:            url,
		AutoProvision:  true,
		PublishTimeout: 2 * time.Second,
		Logger:         logger,
	})
	if err != nil {
		return nil, fmt.Errorf("nats publisher (%s): %w", natsjs.RedactURL(url), err) // err is redacted by natsjs
	}
	b := &broker{pub: pub, closers: []func(){func() { pub.Close() }}}
	b.subscriber = func(consumer string) (message.Subscriber, error) {
		// One subscriber, so one JetStream consumer per topic, per
		// consumer: points and sms each get every event of their topics.
		// They are ephemeral and start at the first message published
		// after they subscribe (DeliverNew), because the demo starts
		// from an empty database on every run and must not replay the
		// events of earlier runs kept in the streams. A real service
		// sets Durable (e.g. the consumer name) instead, so a restarted
		// consumer resumes after its last acknowledged message.
		sub, err := natsjs.NewSubscriber(natsjs.SubscriberConfig{
			URL:              url,
			AutoProvision:    true,
			AckWait:          10 * time.Second,
			SubscribeOptions: []nats.SubOpt{nats.DeliverNew()},
			CloseTimeout:     5 * time.Second,
			Logger:           logger,
		})
		if err != nil {
			return nil, fmt.Errorf("nats subscriber for %s (%s): %w", consumer, natsjs.RedactURL(url), err)
		}
		b.closers = append(b.closers, func() { sub.Close() })
		return sub, nil
	}
	return b, nil
}
