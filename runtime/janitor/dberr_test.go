package janitor_test

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/outboxgen/outboxgen/runtime/janitor"
)

// failingStore fails every call with err and counts them.
type failingStore struct {
	err   error
	calls atomic.Int64
}

func (f *failingStore) DeleteSent(context.Context, time.Duration, int) (int64, error) {
	f.calls.Add(1)
	return 0, f.err
}

func (f *failingStore) ArchiveSent(context.Context, string, time.Duration, int) (int64, error) {
	f.calls.Add(1)
	return 0, f.err
}

func (f *failingStore) DeleteInbox(context.Context, time.Duration, int) (int64, error) {
	f.calls.Add(1)
	return 0, f.err
}

// pgError mimics a PostgreSQL driver error (pgconn.PgError's SQLState).
type pgError struct{ code, msg string }

func (e pgError) Error() string    { return e.msg + " (SQLSTATE " + e.code + ")" }
func (e pgError) SQLState() string { return e.code }

// Failed runs back off: with Interval 1ms and a failing store, a handful
// of runs in a second (the bound is generous) where there used to be
// hundreds.
func TestRunBacksOffOnDatabaseErrors(t *testing.T) {
	f := &failingStore{err: errors.New("connection refused")}
	j, err := janitor.New(f, janitor.Config{Logger: quiet, Interval: time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- j.Run(ctx) }()
	time.Sleep(time.Second)
	n := f.calls.Load()
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("Run = %v, want nil (transient errors are retried)", err)
	}
	t.Logf("failing store, Interval 1ms: %d runs in 1s", n)
	if n >= 30 {
		t.Fatalf("%d runs in 1s with a failing store, want fewer than 30 (backoff from 100ms)", n)
	}
}

// A missing privilege ends Run at start, with advice naming what the
// janitor needs.
func TestRunPermissionDenied(t *testing.T) {
	f := &failingStore{err: pgError{"42501", "permission denied for table outbox_event"}}
	j, err := janitor.New(f, janitor.Config{Logger: quiet, Interval: time.Millisecond, ArchiveTable: "outbox_archive"})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second) // a hang guard
	defer cancel()
	err = j.Run(ctx)
	if ctx.Err() != nil || !errors.As(err, new(pgError)) ||
		!strings.Contains(err.Error(), "needs SELECT and DELETE (and UPDATE on PostgreSQL) on the outbox table, INSERT on outbox_archive") {
		t.Fatalf("Run = %v (context: %v), want the permission error, explained", err, ctx.Err())
	}
	if _, err := j.RunOnce(ctx); err == nil || !strings.Contains(err.Error(), "janitor: permission denied") {
		t.Fatalf("RunOnce = %v, want the explained error", err)
	}
}
