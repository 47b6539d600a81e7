package brokerurl

import (
	"context"
	"fmt"

	"github.com/ThreeDotsLabs/watermill-redisstream/pkg/redisstream"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/redis/go-redis/v9"

	"github.com/outboxgen/outboxgen/runtime/internal/pubguard"
	"github.com/outboxgen/outboxgen/runtime/internal/wmlog"
	"github.com/outboxgen/outboxgen/runtime/redact"
)

type redisSettings struct {
	opts     *redis.Options
	maxlen   int64
	consumer string
}

// redisParse takes brokerurl's parameters and hands the rest of the URL
// to go-redis (which rejects parameters it does not know).
func redisParse(ctx context.Context, u *brokerURL, opt Options) (redisSettings, error) {
	var s redisSettings
	var err error
	if s.maxlen, err = u.takeInt("maxlen", 0); err != nil {
		return s, err
	}
	s.consumer, _ = u.take("consumer")
	s.opts, err = redis.ParseURL(u.baseWithQuery())
	if err != nil {
		return s, u.wrap("bad Redis URL (write redis://[:password@]host:6379/0; brokerurl takes maxlen and consumer)", err)
	}
	if s.opts.DialTimeout == 0 {
		s.opts.DialTimeout = opt.connectTimeout(ctx)
	}
	if s.opts.DialerRetries == 0 {
		s.opts.DialerRetries = 1 // fail fast; the relay retries with its backoff
	}
	return s, nil
}

// connect returns a client that answered a PING within the connect
// timeout.
func (s redisSettings) connect(ctx context.Context, u *brokerURL, opt Options) (*redis.Client, error) {
	c := redis.NewClient(s.opts)
	pctx, cancel := context.WithTimeout(ctx, opt.connectTimeout(ctx))
	defer cancel()
	if err := c.Ping(pctx).Err(); err != nil {
		_ = c.Close()
		return nil, u.wrap("connect to Redis", err)
	}
	return c, nil
}

func openRedis(ctx context.Context, u *brokerURL, opt Options) (message.Publisher, error) {
	if _, ok := u.query["consumer"]; ok {
		return nil, u.errorf("parameter consumer= is for subscribers: a publisher takes maxlen")
	}
	s, err := redisParse(ctx, u, opt)
	if err != nil {
		return nil, err
	}
	c, err := s.connect(ctx, u, opt)
	if err != nil {
		return nil, err
	}
	pub, err := redisstream.NewPublisher(redisstream.PublisherConfig{
		Client:        c,
		DefaultMaxlen: s.maxlen,
	}, wmlog.Adapter(opt.Logger))
	if err != nil {
		_ = c.Close()
		return nil, u.wrap("Redis publisher", err)
	}
	return &redisPublisher{pubguard.New(pub, u.secrets)}, nil
}

// redisPublisher is watermill-redisstream's publisher behind a guard
// (package pubguard: its closed flag is read without a lock) with
// redacted errors.
type redisPublisher struct{ *pubguard.Publisher }

// Publish appends msgs to the stream topic (XADD), one at a time.
func (p *redisPublisher) Publish(topic string, msgs ...*message.Message) error {
	if topic == "" {
		return errEmptyTopic
	}
	return p.Publisher.Publish(topic, msgs...)
}

func openRedisSubscriber(ctx context.Context, u *brokerURL, group string, opt Options) (message.Subscriber, error) {
	if _, ok := u.query["maxlen"]; ok {
		return nil, u.errorf("parameter maxlen= is for publishers: a subscriber takes consumer")
	}
	s, err := redisParse(ctx, u, opt)
	if err != nil {
		return nil, err
	}
	c, err := s.connect(ctx, u, opt)
	if err != nil {
		return nil, err
	}
	sub, err := redisstream.NewSubscriber(redisstream.SubscriberConfig{
		Client:        c,
		ConsumerGroup: group,
		Consumer:      s.consumer,
		OldestId:      "0", // a new group reads the stream from its start
		Unmarshaller:  redisUnmarshaller{},
		// Block for BlockTime (not forever) on the first read, so that
		// Close never waits on a read that cannot be cancelled.
		DisableIndefiniteInitialBlock: true,
	}, wmlog.Adapter(opt.Logger))
	if err != nil {
		_ = c.Close()
		return nil, u.wrap("Redis subscriber", err)
	}
	return &redisSubscriber{Subscriber: sub, secrets: u.secrets}, nil
}

// redisSubscriber is watermill-redisstream's subscriber with redacted
// errors.
type redisSubscriber struct {
	*redisstream.Subscriber
	secrets []string
}

// Subscribe joins the consumer group of the stream topic (creating both
// when missing) and reads it.
func (s *redisSubscriber) Subscribe(ctx context.Context, topic string) (<-chan *message.Message, error) {
	if topic == "" {
		return nil, errEmptyTopic
	}
	ch, err := s.Subscriber.Subscribe(ctx, topic)
	return ch, redact.ErrorWith(err, s.secrets...)
}

// MetadataUnreadable is the metadata key of a message a subscriber could
// not read from its broker (its value says why); the message has no UUID
// and none of the relay's metadata, so a consumer's inbox poisons it.
const MetadataUnreadable = "outboxgen_unreadable"

// redisUnmarshaller is watermill-redisstream's default, except that a
// stream entry it cannot read (no message UUID field, metadata that is
// not msgpack: not written by a watermill publisher) becomes a message
// flagged MetadataUnreadable instead of an error. On an error the
// subscriber stops reading the stream and closes its channel, and the
// entry, still pending, stops the next subscriber of the group too.
type redisUnmarshaller struct{}

// Unmarshal implements redisstream.Unmarshaller.
func (redisUnmarshaller) Unmarshal(values map[string]any) (*message.Message, error) {
	msg, err := readRedisEntry(values)
	if err != nil {
		payload, _ := values["payload"].(string)
		msg = message.NewMessage("", []byte(payload))
		msg.Metadata.Set(MetadataUnreadable, "redis stream entry: "+err.Error())
	}
	return msg, nil
}

// readRedisEntry is the default unmarshaller after a check of what it
// asserts unchecked: the fields it reads hold text (go-redis returns
// stream fields as strings; anything else would panic in it).
func readRedisEntry(values map[string]any) (*message.Message, error) {
	for _, f := range []string{redisstream.UUIDHeaderKey, "payload", "metadata"} {
		if v, ok := values[f]; ok && v != nil {
			if _, text := v.(string); !text {
				return nil, fmt.Errorf("field %q is not text but %T", f, v)
			}
		}
	}
	return redisstream.DefaultMarshallerUnmarshaller{}.Unmarshal(values)
}
