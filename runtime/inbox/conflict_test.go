package inbox

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/go-sql-driver/mysql"
	"github.com/jackc/pgx/v5/pgconn"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	tracenoop "go.opentelemetry.io/otel/trace/noop"

	"github.com/outboxgen/outboxgen/runtime/dialect"
	"github.com/outboxgen/outboxgen/runtime/internal/dberr"
	"github.com/outboxgen/outboxgen/runtime/outbox"
)

func pgErr(code, msg string) error {
	return &pgconn.PgError{Severity: "ERROR", Code: code, Message: msg}
}

func myErr(n uint16, msg string) error { return &mysql.MySQLError{Number: n, Message: msg} }

// scriptStore is a store whose commits fail with the errors in commitErrs,
// one per commit, then succeed.
type scriptStore struct {
	fakeStore
	mu         sync.Mutex
	commitErrs []error
	commits    int // successful
}

func (s *scriptStore) Commit(context.Context, struct{}) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.commitErrs) > 0 {
		err := s.commitErrs[0]
		s.commitErrs = s.commitErrs[1:]
		return err
	}
	s.commits++
	return nil
}

// scriptRun delivers one message to a consumer on s whose handler fails
// with the errors in handlerErrs, one per call, then succeeds, with
// MaxAttempts 1 and a poison queue. It returns the successful handler
// calls, all calls, whether the message was poisoned (and why), and the
// outcomes counted, by outcome and by "infrastructure/<error_class>".
func scriptRun(t *testing.T, s *scriptStore, handlerErrs ...error) (succeeded, calls int64, poisoned string, counted map[string]int64) {
	t.Helper()
	h := NewHarness(t)
	defer h.Close()
	var mu sync.Mutex
	var ok, n atomic.Int64
	route := On("X", "in", func([]byte, int) (int, error) { return 1, nil }, func(context.Context, struct{}, int, outbox.Meta) error {
		n.Add(1)
		mu.Lock()
		defer mu.Unlock()
		if len(handlerErrs) > 0 {
			err := handlerErrs[0]
			handlerErrs = handlerErrs[1:]
			return err
		}
		ok.Add(1)
		return nil
	})
	cfg := h.Config(dialect.Postgres)
	cfg.RetryMaxInterval = 2 * time.Millisecond
	cfg.TracerProvider = tracenoop.NewTracerProvider()
	if err := RegisterStore(h.Router, h.PubSub, s, Consumer[struct{}]{Name: "c", Routes: []Route[struct{}]{route}}, cfg); err != nil {
		t.Fatal(err)
	}
	finished := h.Finished()
	h.Run()
	h.PublishX("in")
	select {
	case <-finished:
	case <-time.After(time.Minute):
		t.Fatal("the delivery did not end")
	}
	poisoned, _ = h.PoisonedWithin(50 * time.Millisecond)
	return ok.Load(), n.Load(), poisoned, h.Outcomes()
}

// A deadlock or serialization failure, in the handler's statements or at
// the commit, rolled the whole transaction back: it runs again at once,
// without counting toward MaxAttempts (1 here), and the message is handled
// once, never poisoned. A conflict that outlasts the runs in place is an
// infrastructure failure: waited out, never poisoned. Permanent wins.
func TestConflictsAreRetriedInPlace(t *testing.T) {
	defer func(p func(int) time.Duration) { conflictPause = p }(conflictPause)
	conflictPause = func(int) time.Duration { return 0 }
	deadlock := fmt.Errorf("points: update balance: %w", pgErr("40P01", "deadlock detected"))
	serialization := fmt.Errorf("points: %w", pgErr("40001", "could not serialize access due to concurrent update"))
	myDeadlock := myErr(1213, "Deadlock found when trying to get lock; try restarting transaction")
	many := make([]error, 2*dberr.ConflictTries+1)
	for i := range many {
		many[i] = serialization
	}
	for _, c := range []struct {
		name        string
		handlerErrs []error
		commitErrs  []error
		calls       int64
		want        map[string]int64
		poisoned    bool
	}{
		{name: "handler deadlocks twice", handlerErrs: []error{deadlock, myDeadlock}, calls: 3,
			want: map[string]int64{OutcomeConflict: 2, OutcomeProcessed: 1}},
		{name: "commit fails to serialize", commitErrs: []error{serialization}, calls: 2,
			want: map[string]int64{OutcomeConflict: 1, OutcomeProcessed: 1}},
		{name: "MariaDB record changed", handlerErrs: []error{myErr(1020, "Record has changed since last read in table 't'")}, calls: 2,
			want: map[string]int64{OutcomeConflict: 1, OutcomeProcessed: 1}},
		{name: "persistent conflict", handlerErrs: many, calls: int64(len(many) + 1),
			want: map[string]int64{
				OutcomeConflict:                     int64(len(many) - 2),
				OutcomeInfrastructure + "/conflict": 2,
				OutcomeProcessed:                    1,
			}},
		{name: "permanent deadlock", handlerErrs: []error{Permanent(deadlock)}, calls: 1, poisoned: true,
			want: map[string]int64{OutcomePermanent: 1}},
	} {
		t.Run(c.name, func(t *testing.T) {
			s := &scriptStore{commitErrs: c.commitErrs}
			ok, calls, poisoned, got := scriptRun(t, s, c.handlerErrs...)
			if (poisoned != "") != c.poisoned {
				t.Fatalf("poisoned %v (%q), want %v", poisoned != "", poisoned, c.poisoned)
			}
			// The handler's writes count once: in the one committed run.
			if calls != c.calls || ok != calls-int64(len(c.handlerErrs)) || (!c.poisoned && s.commits != 1) {
				t.Errorf("handler called %d times (%d succeeded), %d commits; want %d calls and one commit", calls, ok, s.commits, c.calls)
			}
			for k, v := range c.want {
				if got[k] != v {
					t.Errorf("outcome %s counted %d times, want %d (all: %v)", k, got[k], v, got)
				}
			}
			if got[OutcomeFailed] != 0 {
				t.Errorf("outcomes %v: an attempt was charged", got)
			}
		})
	}
}

// Server-side timeouts (statement_timeout, lock_timeout, lock waits,
// max_execution_time, max_statement_time) are the database's, not the
// message's: retried until they get through, never charged to
// MaxAttempts, never poisoned.
func TestServerTimeoutsAreInfrastructure(t *testing.T) {
	for _, err := range []error{
		pgErr("57014", "canceling statement due to statement timeout"),
		pgErr("55P03", "canceling statement due to lock timeout"),
		myErr(1205, "Lock wait timeout exceeded; try restarting transaction"),
		myErr(3024, "Query execution was interrupted, maximum statement execution time exceeded"),
		myErr(1969, "Query execution was interrupted (max_statement_time exceeded)"),
	} {
		t.Run(err.Error(), func(t *testing.T) {
			wrapped := fmt.Errorf("points: %w", err)
			ok, calls, poisoned, got := scriptRun(t, &scriptStore{}, wrapped, wrapped)
			if poisoned != "" {
				t.Fatalf("poisoned: %s", poisoned)
			}
			if ok != 1 || calls != 3 || got[OutcomeInfrastructure+"/timeout"] != 2 || got[OutcomeProcessed] != 1 || got[OutcomeFailed] != 0 {
				t.Errorf("%d calls, %d succeeded, outcomes %v; want 3 calls, 2 infrastructure/timeout, 1 processed", calls, ok, got)
			}
		})
	}
}

// A statement cancelled because the message's context ended (the router
// stopping) fails as PostgreSQL 57014 with lib/pq (and pgx with a
// CancelRequestContextWatcherHandler), as a statement_timeout does: it is
// taken for the stop, not for a database failure and not for the
// message's: nacked (not poisoned, not retried), not logged at ERROR.
// The same goes for what else a driver returns then (sql.ErrTxDone, a
// closed connection).
func TestCancelledStatementIsNacked(t *testing.T) {
	for _, fail := range []error{
		pgErr("57014", "canceling statement due to user request"),
		errors.New("sql: transaction has already been committed or rolled back"),
		errors.New("invalid connection"),
	} {
		t.Run(fail.Error(), func(t *testing.T) {
			ctx, cancel := context.WithCancel(context.Background())
			var calls atomic.Int64
			rt := On("X", "in", func([]byte, int) (int, error) { return 1, nil }, func(ctx context.Context, _ struct{}, _ int, _ outbox.Meta) error {
				calls.Add(1)
				cancel() // the router stops while the statement runs
				<-ctx.Done()
				return fmt.Errorf("points: %w", fail)
			})
			logger := watermill.NewCaptureLogger()
			h, reader := scriptHandler(t, rt, time.Millisecond, logger)
			msg := NewXMessage(watermill.NewUUID())
			msg.SetContext(ctx)
			err := h.handle(msg)
			if err == nil || !errors.Is(err, context.Canceled) || !isInfrastructure(err) || !errors.Is(err, fail) {
				t.Fatalf("error %v: want it to wrap the failure and context.Canceled, and to be nacked (not poisoned, not retried by watermill)", err)
			}
			if calls.Load() != 1 {
				t.Errorf("handler ran %d times, want once", calls.Load())
			}
			for _, l := range logger.Captured()[watermill.ErrorLogLevel] {
				if strings.Contains(l.Msg, "the database failed") {
					t.Errorf("a stop was logged as a database failure: %s %v", l.Msg, l.Err)
				}
			}
			if got := outcomes(t, reader); got[OutcomeStopped] != 1 || got[OutcomeFailed] != 0 || got[OutcomeInfrastructure] != 0 {
				t.Errorf("counted %v: want the attempt counted as %q only", got, OutcomeStopped)
			}
		})
	}
}

// scriptHandler is a handler of route rt on a scriptStore (PostgreSQL's
// inbox queries), waiting backoff between attempts, whose counts reader
// collects.
func scriptHandler(t *testing.T, rt Route[struct{}], backoff time.Duration, logger watermill.LoggerAdapter) (*handler[struct{}], *sdkmetric.ManualReader) {
	t.Helper()
	q, err := dialect.NewInboxQueries(dialect.Postgres, "outbox_inbox")
	if err != nil {
		t.Fatal(err)
	}
	reader := sdkmetric.NewManualReader()
	in, err := newInstruments(Config{MeterProvider: sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader)), TracerProvider: tracenoop.NewTracerProvider()}, nil)
	if err != nil {
		t.Fatal(err)
	}
	return &handler[struct{}]{name: "c", store: &scriptStore{}, q: q, routes: map[string]Route[struct{}]{"X": rt}, in: in,
		dups: &dupRecorder{table: q.DuplicateTable()}, backoff: backoff, maxBackoff: backoff, logger: logger}, reader
}

// cancelOnError is a logger that calls cancel on its first ERROR line.
type cancelOnError struct {
	watermill.LoggerAdapter
	cancel context.CancelFunc
}

func (l cancelOnError) Error(msg string, err error, fields watermill.LogFields) {
	l.cancel()
	l.LoggerAdapter.Error(msg, err, fields)
}

// A delivery waiting out a database failure when the router stops is
// given back (nacked, not poisoned): the failed attempt is counted as
// infrastructure, the delivery once more as stopped.
func TestStopWhileWaitingIsNacked(t *testing.T) {
	unreachable := pgErr("57P03", "the database system is starting up")
	var calls atomic.Int64
	rt := On("X", "in", func([]byte, int) (int, error) { return 1, nil }, func(context.Context, struct{}, int, outbox.Meta) error {
		calls.Add(1)
		return fmt.Errorf("points: %w", unreachable)
	})
	ctx, cancel := context.WithCancel(context.Background())
	// The router stops as the hour's wait begins: the handler logs the
	// failure at ERROR just before it waits.
	h, reader := scriptHandler(t, rt, time.Hour, cancelOnError{watermill.NewCaptureLogger(), cancel})
	msg := NewXMessage(watermill.NewUUID())
	msg.SetContext(ctx)
	err := h.handle(msg)
	if err == nil || !isInfrastructure(err) || !errors.Is(err, unreachable) || !errors.Is(err, context.Canceled) {
		t.Fatalf("error %v: want the database failure and context.Canceled, nacked (not poisoned)", err)
	}
	if calls.Load() != 1 {
		t.Errorf("handler ran %d times, want once", calls.Load())
	}
	if got := outcomes(t, reader); got[OutcomeInfrastructure] != 1 || got[OutcomeStopped] != 1 || got[OutcomeFailed] != 0 {
		t.Errorf("counted %v: want one %q attempt and the delivery %q", got, OutcomeInfrastructure, OutcomeStopped)
	}
}

// The pause before running a conflicted transaction again is a few
// random milliseconds, longer with each try.
func TestConflictPause(t *testing.T) {
	for try := 1; try < dberr.ConflictTries; try++ {
		for range 100 {
			if p := conflictPause(try); p < time.Duration(try)*2*time.Millisecond || p >= time.Duration(try)*10*time.Millisecond {
				t.Fatalf("conflictPause(%d) = %v, want %v..%v", try, p, time.Duration(try)*2*time.Millisecond, time.Duration(try)*10*time.Millisecond)
			}
		}
	}
}
