// Package brokerurl opens a watermill publisher (for the relay) or
// subscriber (for tests and tools) from one broker URL, as given to
// `outboxgen relay -broker URL`:
//
//	pub, err := brokerurl.Open(ctx, "nats://127.0.0.1:4222", brokerurl.Options{Logger: logger})
//	if err != nil {
//		return err // names the broker, never its password
//	}
//	defer pub.Close()
//	r, err := relay.New(drv, relay.Config{Publisher: pub})
//
// Published messages keep watermill's UUID (the relay's event_id) and every
// metadata entry (the relay's outbox_* entries and the stored headers) on
// every broker, and a subscriber opened on the same URL gets them back.
//
// # Schemes
//
// Query parameters below are brokerurl's own; they are removed before the
// rest of the URL reaches the broker client. An unknown parameter is an
// error for nats, kafka and stdout; for amqp and redis the remaining
// parameters go to the client library (amqp091-go's heartbeat,
// connection_timeout..., go-redis's dial_timeout, pool_size...), which
// checks them.
//
// nats://[user:pass@]host:4222[,host2:4222] — NATS JetStream, through
// package natsjs: Nats-Msg-Id = message UUID, so the stream drops the
// relay's re-sends inside its duplicate window. The topic is the subject.
//
//	stream=NAME          provisioning puts every topic in the one stream NAME
//	                     (created with the first topic, then extended by the
//	                     subjects of the others); default: a stream per topic,
//	                     named by natsjs.DefaultStreamName ("OUTBOX_ORDERS_PAID")
//	provision=1|0        create (or extend) the stream of a topic when no stream
//	                     captures its subject, before the first publish or
//	                     subscribe to it (default 1, see Options.Provision)
//	duplicate_window=2m  de-duplication window of streams created (default 2m)
//	publish_timeout=5s   wait for JetStream's acknowledgement (default 5s)
//	ack_wait=30s         subscriber: redelivery after this long unacknowledged
//
// kafka://broker1:9092[,broker2:9092] — Kafka, through package kafka:
// idempotent producer, record key = the outbox key (per-key order), acks
// from all in-sync replicas. No credentials in the URL: for SASL or TLS use
// package kafka with a sarama configuration.
//
//	client_id=NAME       client id (default "outboxgen-relay", and
//	                     "outboxgen-consumer" for subscribers)
//	version=2.1.0        Kafka protocol version (default kafka.DefaultVersion)
//	from=oldest|newest   subscriber: where a new consumer group starts
//	                     (default oldest)
//
// amqp://user:pass@host:5672/vhost (also amqps://) — RabbitMQ (AMQP 0.9.1).
// The publisher declares the exchange and publishes with the topic as
// routing key, all of a call's messages before it waits for the broker's
// publisher confirms. When the broker closes its connection, it dials
// again (100 ms, doubling to 30 s; calls fail meanwhile, and the relay
// retries them). A subscriber declares its queue (named by the group, see
// OpenSubscriber), binds it to the exchange with the topic as routing key
// and consumes it, one message at a time: the next once the handler acked
// or nacked (back to the queue) the one before. When its connection is
// lost, or the queue deleted, it reconnects the same way, declares the
// queue and binding again and consumes on; the broker puts what was not
// acknowledged back in the queue. RabbitMQ drops a message that no queue
// is bound to: start the consumers (or declare and bind their queues)
// before the relay publishes.
//
//	exchange=NAME        exchange (default "outbox")
//	exchange_type=topic  topic, direct or fanout (default topic)
//	durable=1|0          durable exchange and queues, persistent messages
//	                     (default 1)
//	queue=NAME           subscriber: the queue name (default GROUP.TOPIC)
//	prefetch=N           subscriber: unacknowledged messages in flight (default 1)
//
// redis://[[user]:pass@]host:6379/0 (also rediss://) — Redis Streams, through
// watermill-redisstream: the topic is the stream key; a subscriber is a
// member of a consumer group that starts at the beginning of the stream.
// Entries a member read and did not acknowledge (the one its handler
// held, and the few it had read ahead) stay pending in the group when it
// stops. A subscription that ends (its context, or Close) gives them
// back: it marks them idle for a day, so a member that starts takes them
// at once and a running one within a second (its claim interval).
// Without that, after a crash or when the give-back fails, another member
// claims them once idle for a minute (watermill-redisstream's
// MaxIdleTime); nothing is lost either way.
//
//	maxlen=N             trim streams to about N entries on every publish
//	                     (default 0: no trimming; trimming drops events a
//	                     slow consumer group has not read yet)
//	consumer=NAME        subscriber: the consumer's name in its group
//	                     (default: random); one running subscriber's at a
//	                     time (a pod's name, not one shared by replicas):
//	                     a subscription that ends gives back the name's
//	                     pending entries
//
// stdout: — one JSON line per message on Options.Stdout, for trying the
// relay without a broker: {"topic":...,"uuid":...,"metadata":{...},
// "payload":...}, the payload as JSON when it is valid JSON, else as a
// string. Publish only; it takes no parameters.
//
// # Errors and time limits
//
// An unknown scheme, a malformed URL or parameter, and a broker that does
// not answer are each reported as one error naming the URL with its
// password (and a NATS token) masked, by package redact; errors.Is and
// errors.As still see the client's error. Connecting is bounded (5s per
// attempt, less when ctx has an earlier deadline), and Open fails rather
// than retrying in the background: a relay started against a wrong URL
// exits with the reason. Once open, the clients reconnect by themselves and
// a Publish during an outage fails (bounded by the broker's publish
// timeouts) instead of queueing in an unbounded client buffer.
package brokerurl

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/url"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/outboxgen/outboxgen/runtime/redact"
)

// DefaultConnectTimeout bounds each connection attempt of Open and
// OpenSubscriber (a shorter ctx deadline wins).
const DefaultConnectTimeout = 5 * time.Second

// Provision says whether Open and OpenSubscriber create missing NATS
// JetStream streams. The URL parameter provision=1|0, when present, wins
// over Options.Provision.
type Provision int

const (
	// ProvisionDefault is the zero value: provision (as ProvisionOn)
	// unless the URL says provision=0.
	ProvisionDefault Provision = iota
	// ProvisionOn creates the stream of a topic when no stream captures
	// its subject (or adds the subject to the stream named by stream=).
	// An existing stream capturing the subject is never changed.
	ProvisionOn
	// ProvisionOff leaves streams to the operator: publishing to a
	// subject no stream captures fails (nats.ErrNoStreamResponse).
	ProvisionOff
)

// Options tune Open and OpenSubscriber; the zero value is usable.
type Options struct {
	// Logger receives the broker clients' logs (default slog.Default()).
	Logger *slog.Logger

	// Stdout is where "stdout:" writes (default os.Stdout). Writes are
	// serialized: one Write call per message line.
	Stdout io.Writer

	// Provision decides, for NATS JetStream, whether streams are created
	// when missing (default: yes; see Provision). Other brokers ignore it:
	// Kafka topics are the cluster's job (or its automatic topic
	// creation), the AMQP exchange and queues are always declared, Redis
	// streams are created by the first publish.
	Provision Provision

	// ConnectTimeout bounds each connection attempt (default
	// DefaultConnectTimeout).
	ConnectTimeout time.Duration
}

func (o *Options) setDefaults() {
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	if o.Stdout == nil {
		o.Stdout = os.Stdout
	}
	if o.ConnectTimeout == 0 {
		o.ConnectTimeout = DefaultConnectTimeout
	}
}

// Validate reports every invalid option. It checks the options as given;
// Open applies the defaults first.
func (o Options) Validate() error {
	var errs []error
	if o.Provision < ProvisionDefault || o.Provision > ProvisionOff {
		errs = append(errs, fmt.Errorf("brokerurl: Options.Provision is %d: use ProvisionDefault, ProvisionOn or ProvisionOff", o.Provision))
	}
	if o.ConnectTimeout < 0 {
		errs = append(errs, fmt.Errorf("brokerurl: Options.ConnectTimeout is %s: use a positive duration (or 0 for %s)", o.ConnectTimeout, DefaultConnectTimeout))
	}
	return errors.Join(errs...)
}

// connectTimeout returns the time a connection attempt may take: the
// option, cut to ctx's deadline.
func (o Options) connectTimeout(ctx context.Context) time.Duration {
	d := o.ConnectTimeout
	if dl, ok := ctx.Deadline(); ok {
		if left := time.Until(dl); left < d {
			d = max(left, time.Millisecond)
		}
	}
	return d
}

// The schemes Open accepts.
const (
	SchemeNATS   = "nats"
	SchemeKafka  = "kafka"
	SchemeAMQP   = "amqp"
	SchemeAMQPS  = "amqps"
	SchemeRedis  = "redis"
	SchemeRediss = "rediss"
	SchemeStdout = "stdout"
)

// Schemes lists the accepted URL schemes, for help texts: "nats", "kafka",
// "amqp", "amqps", "redis", "rediss", "stdout". OpenSubscriber accepts all
// but "stdout".
func Schemes() []string {
	return []string{SchemeNATS, SchemeKafka, SchemeAMQP, SchemeAMQPS, SchemeRedis, SchemeRediss, SchemeStdout}
}

// schemeHelp is the list of URL forms for error messages.
const schemeHelp = "nats://host:4222, kafka://host:9092, amqp://user:pass@host:5672/vhost, redis://host:6379/0 or stdout:"

// Open returns a publisher for rawURL (see the package documentation for
// the schemes and their parameters). Closing the publisher closes its
// connection. ctx bounds the connection; the publisher outlives it.
//
// Its errors never show the URL's password (nor a NATS token); they say
// which URL, and what to change.
func Open(ctx context.Context, rawURL string, opt Options) (message.Publisher, error) {
	u, err := parse(rawURL)
	if err != nil {
		return nil, err
	}
	opt.setDefaults()
	if err := opt.Validate(); err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, u.errorf("%w", err)
	}
	var pub message.Publisher
	switch u.scheme {
	case SchemeNATS:
		pub, err = openNATS(ctx, u, opt)
	case SchemeKafka:
		pub, err = openKafka(u, opt)
	case SchemeAMQP, SchemeAMQPS:
		pub, err = openAMQP(ctx, u, opt)
	case SchemeRedis, SchemeRediss:
		pub, err = openRedis(ctx, u, opt)
	case SchemeStdout:
		pub, err = openStdout(u, opt)
	}
	if err != nil {
		return nil, redact.ErrorWith(err, u.secrets...)
	}
	return pub, nil
}

// OpenSubscriber returns a subscriber for rawURL ("nats", "kafka", "amqp",
// "amqps", "redis" or "rediss") that reads as the consumer group group,
// which is required and names, per broker:
//
//   - nats: the durable JetStream consumer, group + "_" + the subject with
//     dots as '_' (natsjs.DurableName); it survives restarts;
//   - kafka: the consumer group;
//   - amqp: the queue, group + "." + topic (unless queue= is given),
//     bound to the exchange with the topic as routing key;
//   - redis: the stream's consumer group.
//
// Every subscriber of one group shares the work; give each consuming
// service its own group. A new group starts at the oldest message the
// broker keeps (kafka: unless from=newest; amqp: the queue only receives
// what is published after it is bound). Subscribers redeliver what is not
// acknowledged: consumers deduplicate by the message UUID (the event_id).
func OpenSubscriber(ctx context.Context, rawURL string, group string, opt Options) (message.Subscriber, error) {
	u, err := parse(rawURL)
	if err != nil {
		return nil, err
	}
	if group == "" {
		return nil, u.errorf("the consumer group is empty: name it (it is the durable consumer, consumer group or queue that keeps this consumer's position)")
	}
	if strings.ContainsFunc(group, func(r rune) bool { return r <= ' ' || r == 0x7f }) {
		return nil, u.errorf("the consumer group %q contains whitespace or a control character: use letters, digits, '_' and '-'", group)
	}
	opt.setDefaults()
	if err := opt.Validate(); err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, u.errorf("%w", err)
	}
	var sub message.Subscriber
	switch u.scheme {
	case SchemeNATS:
		sub, err = openNATSSubscriber(ctx, u, group, opt)
	case SchemeKafka:
		sub, err = openKafkaSubscriber(ctx, u, group, opt)
	case SchemeAMQP, SchemeAMQPS:
		sub, err = openAMQPSubscriber(ctx, u, group, opt)
	case SchemeRedis, SchemeRediss:
		sub, err = openRedisSubscriber(ctx, u, group, opt)
	case SchemeStdout:
		err = u.errorf("stdout: only publishes: subscribe on nats://, kafka://, amqp:// or redis://")
	}
	if err != nil {
		return nil, redact.ErrorWith(err, u.secrets...)
	}
	return sub, nil
}

// brokerURL is a parsed broker URL.
type brokerURL struct {
	raw     string // as given
	scheme  string // lower case
	base    string // the URL without the query
	query   url.Values
	secrets []string // passwords (and tokens) in raw, masked in errors
	safe    string   // raw with the secrets masked, for messages
}

// parse splits rawURL into scheme, base and query, and finds its secrets.
// The query is split off by hand: a NATS or Kafka URL lists several
// hosts, which net/url does not take.
func parse(rawURL string) (*brokerURL, error) {
	u := &brokerURL{raw: rawURL, secrets: Secrets(rawURL)}
	u.safe = redact.StringWith(rawURL, u.secrets...)
	if strings.TrimSpace(rawURL) == "" {
		return nil, errors.New("brokerurl: the broker URL is empty (give one like " + schemeHelp + ")")
	}
	scheme, rest, ok := strings.Cut(rawURL, ":")
	if !ok || scheme == "" || strings.ContainsAny(scheme, "/@?") {
		return nil, fmt.Errorf("brokerurl: %q has no scheme: give a URL like %s", u.safe, schemeHelp)
	}
	u.scheme = strings.ToLower(scheme)
	if !slices.Contains(Schemes(), u.scheme) && !strings.HasPrefix(rest, "//") && strings.Trim(strings.SplitN(rest, "/", 2)[0], "0123456789") == "" {
		// host:port
		return nil, fmt.Errorf("brokerurl: %q has no scheme: give a URL like %s", u.safe, schemeHelp)
	}
	if !slices.Contains(Schemes(), u.scheme) {
		return nil, fmt.Errorf("brokerurl: unknown scheme %q in %q: use one of %s (%s)", scheme, u.safe, strings.Join(Schemes(), ", "), schemeHelp)
	}
	if strings.ContainsFunc(rawURL, func(r rune) bool { return r <= ' ' || r == 0x7f }) {
		return nil, u.errorf("the URL contains whitespace or a control character")
	}
	base, rawQuery, _ := strings.Cut(rawURL, "?")
	u.base = base
	q, err := url.ParseQuery(rawQuery)
	if err != nil {
		return nil, u.errorf("bad query %q: %v", redact.StringWith(rawQuery, u.secrets...), redact.ErrorWith(err, u.secrets...))
	}
	u.query = q
	if u.scheme != SchemeStdout {
		if !strings.HasPrefix(rest, "//") || strings.TrimPrefix(rest, "//") == "" || strings.HasPrefix(strings.TrimPrefix(rest, "//"), "?") {
			return nil, u.errorf("no host: write %s://host:port", u.scheme)
		}
	}
	return u, nil
}

// errorf returns an error prefixed by "brokerurl: <url with secrets
// masked>: ".
func (u *brokerURL) errorf(format string, args ...any) error {
	return redact.ErrorWith(fmt.Errorf("brokerurl: %s: "+format, append([]any{u.safe}, args...)...), u.secrets...)
}

// wrap prefixes err like errorf, keeping it for errors.Is and errors.As.
func (u *brokerURL) wrap(what string, err error) error {
	return redact.ErrorWith(fmt.Errorf("brokerurl: %s: %s: %w", u.safe, what, err), u.secrets...)
}

// take removes the parameter name from the query and returns its last
// value and whether it was present.
func (u *brokerURL) take(name string) (string, bool) {
	v, ok := u.query[name]
	if !ok {
		return "", false
	}
	delete(u.query, name)
	if len(v) == 0 {
		return "", true
	}
	return v[len(v)-1], true
}

func (u *brokerURL) takeBool(name string, def bool) (bool, error) {
	v, ok := u.take(name)
	if !ok {
		return def, nil
	}
	switch strings.ToLower(v) {
	case "1", "true", "yes", "on":
		return true, nil
	case "0", "false", "no", "off":
		return false, nil
	}
	return false, u.errorf("parameter %s=%q: use 1 or 0", name, v)
}

func (u *brokerURL) takeDuration(name string, def time.Duration) (time.Duration, error) {
	v, ok := u.take(name)
	if !ok {
		return def, nil
	}
	d, err := time.ParseDuration(v)
	if err != nil || d <= 0 {
		return 0, u.errorf("parameter %s=%q: use a positive duration such as 5s or 2m", name, v)
	}
	return d, nil
}

func (u *brokerURL) takeInt(name string, def int64) (int64, error) {
	v, ok := u.take(name)
	if !ok {
		return def, nil
	}
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil || n < 0 {
		return 0, u.errorf("parameter %s=%q: use a whole number, 0 or more", name, v)
	}
	return n, nil
}

// noMoreParams reports the parameters left after the known ones were
// taken.
func (u *brokerURL) noMoreParams(known ...string) error {
	if len(u.query) == 0 {
		return nil
	}
	var left []string
	for k := range u.query {
		left = append(left, k)
	}
	slices.Sort(left)
	if len(known) == 0 {
		return u.errorf("unknown parameter %s: %s: takes none", strings.Join(left, ", "), u.scheme)
	}
	return u.errorf("unknown parameter %s: %s:// takes %s", strings.Join(left, ", "), u.scheme, strings.Join(known, ", "))
}

// baseWithQuery returns the base URL with the parameters left in the
// query, for the client library.
func (u *brokerURL) baseWithQuery() string {
	if len(u.query) == 0 {
		return u.base
	}
	return u.base + "?" + u.query.Encode()
}

// hosts returns the comma-separated host list of a nats:// or kafka:// URL
// (without scheme, userinfo and path).
func (u *brokerURL) hosts() []string {
	rest := strings.TrimPrefix(u.base[len(u.scheme)+1:], "//")
	var hs []string
	for _, h := range strings.Split(rest, ",") {
		h = strings.TrimSpace(h)
		if i := strings.Index(h, "://"); i >= 0 {
			h = h[i+3:]
		}
		if i := strings.LastIndex(h, "@"); i >= 0 {
			h = h[i+1:]
		}
		h = strings.TrimRight(h, "/")
		if h != "" {
			hs = append(hs, h)
		}
	}
	return hs
}

// Secrets returns the secrets rawURL holds (passwords, and a NATS token
// written as a user), for masking by name wherever text might quote them
// (redact.StringWith, redact.NewHandler).
func Secrets(rawURL string) []string {
	return urlSecrets(rawURL, strings.HasPrefix(strings.ToLower(rawURL), SchemeNATS+":"))
}

// urlSecrets returns the secrets of a URL with one or more comma-separated
// authorities: each password, and, when loneUser, a user name without
// password (NATS takes it as a token).
func urlSecrets(raw string, loneUser bool) []string {
	var s []string
	base, _, _ := strings.Cut(raw, "?")
	if i := strings.Index(base, "://"); i >= 0 {
		base = base[i+3:]
	}
	if i := strings.Index(base, "/"); i >= 0 {
		base = base[:i]
	}
	for _, part := range strings.Split(base, ",") {
		if i := strings.Index(part, "://"); i >= 0 {
			part = part[i+3:]
		}
		at := strings.LastIndex(part, "@")
		if at < 0 {
			continue
		}
		ui := part[:at]
		user, pw, ok := strings.Cut(ui, ":")
		if ok {
			s = append(s, pw)
			if p, err := url.PathUnescape(pw); err == nil {
				s = append(s, p)
			}
		} else if loneUser {
			s = append(s, user)
			if p, err := url.PathUnescape(user); err == nil {
				s = append(s, p)
			}
		}
	}
	// Secrets in the query (password=, token=...) are masked by redact's
	// patterns.
	return s
}

var errEmptyTopic = errors.New("brokerurl: the topic is empty")
