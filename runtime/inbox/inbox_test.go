package inbox

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/message/router/middleware"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/outboxgen/outboxgen/runtime/dialect"
	"github.com/outboxgen/outboxgen/runtime/outbox"
)

// runRouter runs a router with one always-failing handler on topic "in",
// its middlewares added in the given order, publishes one message and
// returns how often the handler ran before the message reached "poison".
func runRouter(t *testing.T, order func(r *message.Router, poison, retry message.HandlerMiddleware)) int64 {
	h := NewHarness(t)
	defer h.Close()
	poison, err := middleware.PoisonQueue(h.PubSub, harnessPoisonTopic)
	if err != nil {
		t.Fatal(err)
	}
	retry := middleware.Retry{MaxRetries: 2, InitialInterval: time.Millisecond, MaxInterval: time.Millisecond, Multiplier: 1}.Middleware
	var calls atomic.Int64
	h.Router.AddConsumerHandler("h", "in", h.PubSub, func(*message.Message) error {
		calls.Add(1)
		return errors.New("always fails")
	})
	order(h.Router, poison, retry)
	h.Run()
	h.Publish("in", message.NewMessage(watermill.NewUUID(), nil))
	if _, ok := h.PoisonedWithin(time.Minute); !ok {
		t.Fatal("nothing poisoned")
	}
	return calls.Load()
}

// Watermill runs the first added middleware outermost. PoisonQueue must be
// added before Retry so that it wraps Retry: the message is tried
// 1+MaxRetries times, then poisoned. The other order poisons it after the
// first failure (PoisonQueue swallows the error, Retry sees success).
// RegisterStore adds them in the right order; this pins watermill's rule.
func TestWatermillMiddlewareOrder(t *testing.T) {
	if n := runRouter(t, func(r *message.Router, poison, retry message.HandlerMiddleware) {
		r.AddMiddleware(poison, retry)
	}); n != 3 {
		t.Errorf("AddMiddleware(poison, retry): handler ran %d times, want 3", n)
	}
	if n := runRouter(t, func(r *message.Router, poison, retry message.HandlerMiddleware) {
		r.AddMiddleware(retry, poison)
	}); n != 1 {
		t.Errorf("AddMiddleware(retry, poison): handler ran %d times, want 1 (the pitfall)", n)
	}
}

func TestConfig(t *testing.T) {
	var o Config
	o.setDefaults("points")
	if o.PoisonTopic != "points.poison" || o.InboxTable != "" || o.MaxAttempts != DefaultMaxAttempts || o.MeterProvider == nil {
		t.Errorf("defaults %+v", o)
	}
	err := o.Validate()
	for _, want := range []string{"dialect", "poison queue", "no inbox table"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("Validate() = %v, want it to mention %q", err, want)
		}
	}
	o.Dialect, o.NoPoisonQueue, o.InboxTable = dialect.Postgres, true, "outbox_inbox"
	if err := o.Validate(); err != nil {
		t.Errorf("Validate() = %v", err)
	}
	for name, bad := range map[string]func(*Config){
		"table":    func(o *Config) { o.InboxTable = "inbox; DROP TABLE x" },
		"long":     func(o *Config) { o.InboxTable = strings.Repeat("i", 61) },
		"attempts": func(o *Config) { o.MaxAttempts = -1 },
		"backoff":  func(o *Config) { o.RetryMaxInterval = o.RetryInitialInterval - 1 },
		"poison":   func(o *Config) { o.PoisonPublisher = gochannel.NewGoChannel(gochannel.Config{}, nil) },
	} {
		c := o
		bad(&c)
		if c.Validate() == nil {
			t.Errorf("%s: Validate() accepted %+v", name, c)
		}
	}
}

func TestPermanent(t *testing.T) {
	if Permanent(nil) != nil {
		t.Error("Permanent(nil) != nil")
	}
	base := errors.New("boom")
	err := Permanent(base)
	if !errors.Is(err, ErrPermanent) || !errors.Is(err, base) || Permanent(err) != err {
		t.Errorf("Permanent(%v) = %v", base, err)
	}
	// Decode errors from On's decoder are permanent.
	rt := On(outbox.MetadataType, "t", func([]byte, int) (int, error) {
		return 0, &outbox.DecodeError{Type: "X", Reason: "bad"}
	}, func(context.Context, struct{}, int, outbox.Meta) error { return nil })
	if err := rt.call(context.Background(), struct{}{}, nil, outbox.Meta{}); !errors.Is(err, ErrPermanent) || !errors.Is(err, outbox.ErrUndecodable) {
		t.Errorf("decode error = %v, want permanent and undecodable", err)
	}
	// A panic becomes an error of one line; the stack goes to the log.
	rt = On("X", "t", func([]byte, int) (int, error) { return 1, nil }, func(context.Context, struct{}, int, outbox.Meta) error { panic("oops") })
	logger := watermill.NewCaptureLogger()
	h := &handler[struct{}]{name: "c", logger: logger}
	err = h.callSafely(context.Background(), rt, struct{}{}, nil, outbox.Meta{Type: "X", EventID: "e1"})
	if err == nil || err.Error() != "inbox: handler for X e1 panicked: oops" {
		t.Errorf("panic = %q, want one line", err)
	}
	logged := logger.Captured()[watermill.ErrorLogLevel]
	if len(logged) != 1 || !strings.Contains(logged[0].Fields["stack"].(string), "inbox_test.go") {
		t.Errorf("logged %+v, want the stack at ERROR", logged)
	}
}

// The text of a failure, as the poison queue records it, is one line of at
// most MaxReasonLen bytes; errors.Is sees through it, and a shortened
// error is logged whole.
func TestOneLine(t *testing.T) {
	if oneLine(nil, nil) != nil {
		t.Fatal("oneLine(nil) != nil")
	}
	short := errors.New("short")
	if oneLine(nil, short) != short {
		t.Error("a one-line error is returned as is")
	}
	base := Permanent(errors.New("first\nsecond\r\nthird\x00"))
	err := oneLine(nil, base)
	if got, want := err.Error(), "inbox: permanent failure: first | second | third "; got != want || !errors.Is(err, ErrPermanent) {
		t.Errorf("oneLine = %q (permanent %v), want %q", got, errors.Is(err, ErrPermanent), want)
	}
	logger := watermill.NewCaptureLogger()
	long := errors.New(strings.Repeat("é", MaxReasonLen) + "\n" + strings.Repeat("x", 3000))
	err = oneLine(logger, long)
	if n := len(err.Error()); n > MaxReasonLen || strings.ContainsAny(err.Error(), "\r\n") || !utf8.ValidString(err.Error()) || !strings.HasSuffix(err.Error(), "...") {
		t.Errorf("long error: %d bytes, %.40q...", n, err.Error())
	}
	if !errors.Is(err, long) || !logger.HasError(long) {
		t.Error("the long error is not wrapped, or not logged whole")
	}
}

func TestRegisterRejects(t *testing.T) {
	logger := watermill.NopLogger{}
	ps := gochannel.NewGoChannel(gochannel.Config{}, logger)
	defer ps.Close()
	r, err := message.NewRouter(message.RouterConfig{}, logger)
	if err != nil {
		t.Fatal(err)
	}
	route := On("X", "t", func([]byte, int) (int, error) { return 1, nil }, func(context.Context, struct{}, int, outbox.Meta) error { return nil })
	s := fakeStore{}
	cfg := Config{Dialect: dialect.Postgres, NoPoisonQueue: true, InboxTable: "outbox_inbox"}
	for name, c := range map[string]Consumer[struct{}]{
		"no name":   {Routes: []Route[struct{}]{route}},
		"no routes": {Name: "c"},
		"dup":       {Name: "c", Routes: []Route[struct{}]{route, route}},
		"raw route": {Name: "c", Routes: []Route[struct{}]{{Type: "X", Topic: "t"}}},
	} {
		if err := RegisterStore(r, ps, s, c, cfg); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
	long := On(strings.Repeat("T", MaxTypeLen+1), "t", func([]byte, int) (int, error) { return 1, nil }, func(context.Context, struct{}, int, outbox.Meta) error { return nil })
	if err := RegisterStore(r, ps, s, Consumer[struct{}]{Name: "c", Routes: []Route[struct{}]{long}}, cfg); err == nil || !strings.Contains(err.Error(), "biz_type holds 64") {
		t.Errorf("event type of %d characters: %v, want an error naming the column size", MaxTypeLen+1, err)
	}
	if err := RegisterStore(r, ps, s, Consumer[struct{}]{Name: "c", Routes: []Route[struct{}]{route}}, cfg); err != nil {
		t.Fatal(err)
	}
	if _, ok := r.Handlers()["c/t"]; !ok {
		t.Errorf("handlers %v, want c/t", r.Handlers())
	}
}

type fakeStore struct{}

func (fakeStore) Begin(context.Context) (struct{}, error) { return struct{}{}, nil }
func (fakeStore) Exec(context.Context, struct{}, string, ...any) (int64, error) {
	return 1, nil
}
func (fakeStore) QueryRow(context.Context, struct{}, string, []any, ...any) (bool, error) {
	return false, nil
}
func (fakeStore) Commit(context.Context, struct{}) error   { return nil }
func (fakeStore) Rollback(context.Context, struct{}) error { return nil }

func TestCheckFits(t *testing.T) {
	ok := outbox.Meta{EventID: strings.Repeat("e", MaxEventIDLen), Type: strings.Repeat("T", MaxTypeLen), Key: strings.Repeat("é", MaxKeyLen)}
	if err := checkFits(ok); err != nil {
		t.Errorf("values at the limits (in characters): %v", err)
	}
	for name, c := range map[string]struct {
		m    outbox.Meta
		want string
	}{
		"id":        {outbox.Meta{EventID: strings.Repeat("é", MaxEventIDLen+1), Type: "X"}, "event id (\"outbox_event_id\" metadata) has 65 characters"},
		"type":      {outbox.Meta{EventID: "e", Type: strings.Repeat("T", MaxTypeLen+1)}, "event type (\"outbox_type\" metadata) has 65 characters"},
		"key":       {outbox.Meta{EventID: "e", Type: "X", Key: strings.Repeat("k", MaxKeyLen+1)}, "key (\"outbox_key\" metadata) has 129 characters"},
		"not utf-8": {outbox.Meta{EventID: "e", Type: "X", Key: "k\xff"}, "key (\"outbox_key\" metadata) is not valid UTF-8"},
		"nul":       {outbox.Meta{EventID: "e\x00", Type: "X"}, "event id (\"outbox_event_id\" metadata) is not valid UTF-8 text without NUL"},
	} {
		if err := checkFits(c.m); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want an error containing %q", name, err, c.want)
		}
	}
}

type codedError struct {
	code int
	msg  string
}

func (e codedError) Error() string { return e.msg }
func (e codedError) Code() int     { return e.code }

func TestIsBusy(t *testing.T) {
	for _, c := range []struct {
		err  error
		want bool
	}{
		{codedError{5, "database is locked (5) (SQLITE_BUSY)"}, true},
		{fmt.Errorf("inbox: record: %w", codedError{5 | 2<<8, "database is locked"}), true}, // SQLITE_BUSY_SNAPSHOT
		{codedError{6, "database table is locked"}, false},                                  // SQLITE_LOCKED: one connection's own conflict
		{errors.New("database is locked"), true},                                            // mattn/go-sqlite3
		{codedError{19, "constraint failed: UNIQUE (SQLITE_CONSTRAINT)"}, false},
		{codedError{1, "no such table: outbox_inbox (SQLITE_ERROR)"}, false},
		{errors.New("test: handler fails"), false},
	} {
		if got := isBusy(c.err); got != c.want {
			t.Errorf("isBusy(%v) = %v, want %v", c.err, got, c.want)
		}
	}
}

// Infrastructure failures are never poisoned (the PoisonQueue filter) nor
// retried by watermill's Retry (the handler retried them already): also
// when one is still failing as the router stops, and through oneLine.
// Permanent wins.
func TestIsInfrastructure(t *testing.T) {
	denied := fmt.Errorf("inbox: points: record: %w", &pgconn.PgError{Code: "42501", Message: "permission denied for table outbox_inbox"})
	for _, c := range []struct {
		err  error
		want bool
	}{
		{denied, true},
		{oneLine(nil, denied), true},
		{&infraError{err: fmt.Errorf("%w (stopped waiting: %w)", denied, context.DeadlineExceeded)}, true},
		{oneLine(nil, &infraError{err: errors.New("x\ny")}), true},
		{Permanent(denied), false},
		{errors.New("test: handler fails"), false},
		{&pgconn.PgError{Code: "23505"}, false},
		// A conflict still failing after the runs in place, and server
		// timeouts, are the database's.
		{fmt.Errorf("inbox: points: commit: %w", &pgconn.PgError{Code: "40P01"}), true},
		{fmt.Errorf("test: %w", &pgconn.PgError{Code: "57014", Message: "canceling statement due to statement timeout"}), true},
		{fmt.Errorf("test: %w", &pgconn.PgError{Code: "55P03"}), true},
		{Permanent(&pgconn.PgError{Code: "40001"}), false},
	} {
		if got := isInfrastructure(c.err); got != c.want {
			t.Errorf("isInfrastructure(%v) = %v, want %v", c.err, got, c.want)
		}
	}
}
