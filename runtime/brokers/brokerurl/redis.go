package brokerurl

import (
	"context"
	"fmt"

	"github.com/ThreeDotsLabs/watermill-redisstream/pkg/redisstream"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/redis/go-redis/v9"

	"github.com/outboxgen/outboxgen/runtime/brokers/internal/msgctx"
	"github.com/outboxgen/outboxgen/runtime/internal/pubguard"
	"github.com/outboxgen/outboxgen/runtime/relay"
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

// redisOpen refuses the other side's parameter (other: its name, hint:
// what to write), then parses the URL and connects: the start of both
// openRedis and openRedisSubscriber.
func redisOpen(ctx context.Context, u *brokerURL, opt Options, other, hint string) (redisSettings, *redis.Client, error) {
	if _, ok := u.query[other]; ok {
		return redisSettings{}, nil, u.errorf("parameter %s= is for %s", other, hint)
	}
	s, err := redisParse(ctx, u, opt)
	if err != nil {
		return s, nil, err
	}
	c, err := s.connect(ctx, u, opt)
	return s, c, err
}

func openRedis(ctx context.Context, u *brokerURL, opt Options) (message.Publisher, error) {
	s, c, err := redisOpen(ctx, u, opt, "consumer", "subscribers: a publisher takes maxlen")
	if err != nil {
		return nil, err
	}
	return &redisPublisher{pubguard.New(redisProducer{c: c, maxlen: s.maxlen}, u.secrets)}, nil
}

// redisPublisher appends to Redis streams behind a guard (package
// pubguard: safe to close while Publish calls are under way) with
// redacted errors.
type redisPublisher struct{ *pubguard.Publisher }

// Publish appends msgs to the stream topic (XADD, approximately trimmed
// to maxlen when set), marshalled as watermill-redisstream's publisher
// does. It sends a call's XADDs in one pipeline, one round trip, instead
// of one at a time; the entries keep the call's order. When one fails,
// the error names the first that failed. When others were appended, it is
// a *relay.PartialError saying which: the relay sends only the others
// again, since a stream appends a message sent twice twice. A message
// whose reply was not read (the connection broke, the context ended)
// counts as not appended, and may be appended twice (consumers drop
// repeats by event id).
func (p *redisPublisher) Publish(topic string, msgs ...*message.Message) error {
	if topic == "" {
		return errEmptyTopic
	}
	return p.Publisher.Publish(topic, msgs...)
}

// redisProducer is the publisher behind the guard.
type redisProducer struct {
	c      *redis.Client
	maxlen int64
}

func (p redisProducer) Publish(topic string, msgs ...*message.Message) error {
	args := make([]*redis.XAddArgs, len(msgs))
	for i, msg := range msgs {
		values, err := redisstream.DefaultMarshallerUnmarshaller{}.Marshal(topic, msg)
		if err != nil {
			return fmt.Errorf("cannot marshal message %s: %w", msg.UUID, err)
		}
		args[i] = &redis.XAddArgs{Stream: topic, Values: values, MaxLen: p.maxlen, Approx: true}
	}
	ctx, stop := msgctx.Any(msgs)
	defer stop()
	if len(args) == 1 { // the polling relay's calls: no pipeline needed
		if err := p.c.XAdd(ctx, args[0]).Err(); err != nil {
			return fmt.Errorf("cannot xadd message %s: %w", msgs[0].UUID, err)
		}
		return nil
	}
	cmds := make([]*redis.StringCmd, len(msgs))
	_, err := p.c.Pipelined(ctx, func(pipe redis.Pipeliner) error {
		for i, a := range args {
			cmds[i] = pipe.XAdd(ctx, a)
		}
		return nil
	})
	// An XADD counts as appended only with its entry id: go-redis sets the
	// error of every command whose reply it did not read (a write or read
	// that broke midway, an ended context; after a broken connection it
	// sends the whole pipeline again, and the commands hold the last
	// attempt's replies), except when it failed before sending any with a
	// Redis error (the connection's AUTH, say), which leaves them without
	// error and without an id.
	stored := make([]bool, len(cmds))
	for i, cmd := range cmds {
		id, cerr := cmd.Result()
		stored[i] = cerr == nil && id != ""
	}
	for i, cmd := range cmds {
		if cerr := cmd.Err(); cerr != nil {
			return relay.Partial(fmt.Errorf("cannot xadd message %s: %w", msgs[i].UUID, cerr), stored)
		}
	}
	return relay.Partial(err, stored)
}

func (p redisProducer) Close() error { return p.c.Close() }

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
