package brokerurl

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill-redisstream/pkg/redisstream"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/redis/go-redis/v9"

	"github.com/outboxgen/outboxgen/runtime/internal/wmlog"
	"github.com/outboxgen/outboxgen/runtime/redact"
)

// Timing of Redis subscriptions.
const (
	// redisBlockTime bounds a read's wait for new entries
	// (watermill-redisstream's BlockTime); a subscription that ends waits
	// out a read under way before it gives entries back (giveBack).
	redisBlockTime = 100 * time.Millisecond
	// redisClaimInterval is how often a member looks for entries idle
	// long enough to claim: the delay of what an ended subscription gave
	// back, at most (watermill-redisstream's default: 5 s).
	redisClaimInterval = time.Second
	// redisGiveBackIdle is the idle time an ended subscription sets on the
	// entries it read and did not acknowledge: past any member's
	// MaxIdleTime (a minute by default), so the next claim takes them.
	redisGiveBackIdle = 24 * time.Hour
	// redisGiveBackWait bounds the give-back's commands.
	redisGiveBackWait = 5 * time.Second
	// redisGiveBackPage is the entries given back per command.
	redisGiveBackPage = 1000
)

func openRedisSubscriber(ctx context.Context, u *brokerURL, group string, opt Options) (message.Subscriber, error) {
	s, c, err := redisOpen(ctx, u, opt, "maxlen", "publishers: a subscriber takes consumer")
	if err != nil {
		return nil, err
	}
	consumer := s.consumer
	if consumer == "" {
		consumer = watermill.NewShortUUID() // as watermill-redisstream would: known here for the give-back
	}
	sub, err := redisstream.NewSubscriber(redisstream.SubscriberConfig{
		Client:        c,
		ConsumerGroup: group,
		Consumer:      consumer,
		OldestId:      "0", // a new group reads the stream from its start
		Unmarshaller:  redisUnmarshaller{},
		// Block for BlockTime (not forever) on the first read, so that
		// Close never waits on a read that cannot be cancelled.
		DisableIndefiniteInitialBlock: true,
		BlockTime:                     redisBlockTime,
		ClaimInterval:                 redisClaimInterval,
	}, wmlog.Adapter(opt.Logger))
	if err != nil {
		_ = c.Close()
		return nil, u.wrap("Redis subscriber", err)
	}
	log := opt.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &redisSubscriber{
		sub: sub, client: c, group: group, consumer: consumer, secrets: u.secrets, log: log,
		cancels: map[*int]context.CancelFunc{}, live: map[string]int{}, givingBack: map[string]chan struct{}{},
	}, nil
}

// redisSubscriber is watermill-redisstream's subscriber with redacted
// errors, whose subscriptions give back what they held when they end.
//
// A member of a consumer group owns every entry it read until it
// acknowledges it; watermill-redisstream's members claim another's
// entries only once they were idle for MaxIdleTime (a minute), so what a
// subscription held at its end (the entry its handler had, the few it
// had read ahead) reached the next member a minute late, at each rolling
// deploy of a consumer. An ending subscription now marks its member's
// unacknowledged entries of the stream as idle for a day (XCLAIM to
// itself with IDLE, JUSTID: the delivery count is unchanged), so a
// member that starts takes them at once, and a running one at its next
// claim (every redisClaimInterval). The consumer name must therefore be
// one running subscriber's: another process under the same name would
// see the entries its handlers hold given to other members.
type redisSubscriber struct {
	sub      *redisstream.Subscriber
	client   *redis.Client
	group    string
	consumer string
	secrets  []string
	log      *slog.Logger

	mu      sync.Mutex
	closed  bool
	cancels map[*int]context.CancelFunc // of the subscriptions running
	// live counts the subscriptions of each stream, starting ones
	// included; givingBack, while a stream's last subscription gives
	// back, is closed when it is done: a new subscription to the stream
	// waits for it, or the give-back would mark what it reads.
	live       map[string]int
	givingBack map[string]chan struct{}
	wg         sync.WaitGroup // subscriptions starting, and forwarders

	closeOnce sync.Once
	closeErr  error
}

// Subscribe joins the consumer group of the stream topic (creating both
// when missing) and reads it. When the subscription ends (ctx, or Close),
// what it read and did not acknowledge goes back to the group (see
// redisSubscriber) before its channel closes. A handler still running
// then may see its message delivered again to another member, as with
// the other brokers: consumers deduplicate by event id.
func (s *redisSubscriber) Subscribe(ctx context.Context, topic string) (<-chan *message.Message, error) {
	if topic == "" {
		return nil, errEmptyTopic
	}
	s.mu.Lock()
	for s.givingBack[topic] != nil && !s.closed {
		done := s.givingBack[topic]
		s.mu.Unlock()
		select {
		case <-done:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
		s.mu.Lock()
	}
	if s.closed {
		s.mu.Unlock()
		return nil, errors.New("subscriber closed")
	}
	// Counted before the call, made without the lock (it waits for
	// Redis): Close waits for it, and no give-back of the stream starts.
	s.live[topic]++
	s.wg.Add(1)
	s.mu.Unlock()
	sctx, cancel := context.WithCancel(ctx)
	in, err := s.sub.Subscribe(sctx, topic)
	s.mu.Lock()
	if err != nil {
		s.live[topic]--
		if s.live[topic] == 0 {
			delete(s.live, topic)
		}
		s.mu.Unlock()
		cancel()
		s.wg.Done()
		return nil, redact.ErrorWith(err, s.secrets...)
	}
	id := new(int)
	s.cancels[id] = cancel
	if s.closed {
		cancel() // Close began meanwhile: it ends at once, giving back what it read
	}
	s.mu.Unlock()
	out := make(chan *message.Message)
	go func() {
		defer s.wg.Done()
		defer close(out)
		defer cancel()
		for m := range in {
			// Once the subscription ended, nothing is handed out (the
			// reader may hand over one more, as it notices the end): its
			// handler gives up on it, and it stays pending, given back
			// below. Checked first: a select would pick at random when
			// the receiver waits too.
			if sctx.Err() != nil {
				continue
			}
			select {
			case out <- m:
			case <-sctx.Done():
			}
		}
		s.mu.Lock()
		delete(s.cancels, id)
		s.live[topic]--
		// Another subscription of this member to the stream may hold
		// entries its handlers are working on: only the last gives back.
		last := s.live[topic] == 0
		var done chan struct{}
		if last {
			delete(s.live, topic)
			done = make(chan struct{})
			s.givingBack[topic] = done
		}
		s.mu.Unlock()
		if last {
			s.giveBack(topic)
			s.mu.Lock()
			delete(s.givingBack, topic)
			close(done)
			s.mu.Unlock()
		}
	}()
	return out, nil
}

// giveBackScript marks as idle for ARGV[3] ms the entries ARGV[4:] of
// stream KEYS[1] that group ARGV[1]'s consumer ARGV[2] still owns, and
// returns how many: checked and claimed in one step, so that an entry
// another member claimed meanwhile (idle past its MaxIdleTime) stays its.
var giveBackScript = redis.NewScript(`
local n = 0
for i = 4, #ARGV do
  local p = redis.call('XPENDING', KEYS[1], ARGV[1], ARGV[i], ARGV[i], 1)
  if #p == 1 and p[1][2] == ARGV[2] then
    redis.call('XCLAIM', KEYS[1], ARGV[1], ARGV[2], 0, ARGV[i], 'IDLE', ARGV[3], 'JUSTID')
    n = n + 1
  end
end
return n
`)

// giveBack marks the member's unacknowledged entries of stream as idle
// for redisGiveBackIdle, so that another member claims them now. It
// first waits out a read under way: watermill-redisstream does not wait
// for its reader, whose last read may still take an entry for up to
// BlockTime.
func (s *redisSubscriber) giveBack(stream string) {
	time.Sleep(redisBlockTime + 100*time.Millisecond)
	ctx, cancel := context.WithTimeout(context.Background(), redisGiveBackWait)
	defer cancel()
	start, n := "-", 0
	for {
		pending, err := s.client.XPendingExt(ctx, &redis.XPendingExtArgs{
			Stream: stream, Group: s.group, Consumer: s.consumer, Start: start, End: "+", Count: redisGiveBackPage,
		}).Result()
		if err != nil {
			s.warn(stream, n, err)
			return
		}
		if len(pending) == 0 {
			break
		}
		args := []any{s.group, s.consumer, redisGiveBackIdle.Milliseconds()}
		for _, p := range pending {
			args = append(args, p.ID)
		}
		given, err := giveBackScript.Run(ctx, s.client, []string{stream}, args...).Int()
		if err != nil {
			s.warn(stream, n, err)
			return
		}
		n += given
		if len(pending) < redisGiveBackPage {
			break
		}
		start = "(" + pending[len(pending)-1].ID
	}
	if n > 0 {
		s.log.Info("Redis subscription ended: the entries it read and did not acknowledge go back to its group now",
			slog.String("stream", stream), slog.String("group", s.group), slog.String("consumer", s.consumer), slog.Int("entries", n))
	}
}

func (s *redisSubscriber) warn(stream string, n int, err error) {
	s.log.Warn("Redis subscription ended, giving back what it read and did not acknowledge failed: another member claims those entries once idle for its MaxIdleTime (a minute by default)",
		slog.String("stream", stream), slog.String("group", s.group), slog.String("consumer", s.consumer),
		slog.Int("given_back", n), slog.String("error", redact.ErrorWith(err, s.secrets...).Error()))
}

// Close ends the subscriptions, which give back what they held (at most
// about redisGiveBackWait), then closes the connection. A Close beside
// it waits for it too.
func (s *redisSubscriber) Close() error {
	s.closeOnce.Do(func() {
		s.mu.Lock()
		s.closed = true
		for _, cancel := range s.cancels {
			cancel()
		}
		s.mu.Unlock()
		s.wg.Wait()
		s.closeErr = redact.ErrorWith(s.sub.Close(), s.secrets...)
	})
	return s.closeErr
}
