package monitor_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/outboxgen/outboxgen/runtime/monitor"
)

// pgError mimics a PostgreSQL driver error (pgconn.PgError's SQLState).
type pgError struct{ code, msg string }

func (e pgError) Error() string    { return e.msg + " (SQLSTATE " + e.code + ")" }
func (e pgError) SQLState() string { return e.code }

// Failed checks back off: with Interval 1ms and a failing source, a
// handful of checks in a second (the bound is generous) where there used
// to be hundreds.
func TestRunBacksOffOnDatabaseErrors(t *testing.T) {
	src := &fakeSource{err: errors.New("connection refused")}
	m, err := monitor.New(src, monitor.Config{Logger: quiet, Interval: time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- m.Run(ctx) }()
	time.Sleep(time.Second)
	src.mu.Lock()
	n := src.calls
	src.mu.Unlock()
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("Run = %v, want nil (transient errors are retried)", err)
	}
	t.Logf("failing source, Interval 1ms: %d checks in 1s", n)
	if n >= 30 {
		t.Fatalf("%d checks in 1s with a failing source, want fewer than 30 (backoff from 100ms)", n)
	}
}

// A missing table ends Run at start, with advice; once a check has
// succeeded, the same error is retried instead.
func TestRunMissingTable(t *testing.T) {
	missing := pgError{"42P01", `relation "outbox_event" does not exist`}
	src := &fakeSource{err: missing}
	m, err := monitor.New(src, monitor.Config{Logger: quiet, Interval: time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second) // a hang guard
	defer cancel()
	err = m.Run(ctx)
	if ctx.Err() != nil || !errors.As(err, new(pgError)) || !strings.Contains(err.Error(), "apply the schema") {
		t.Fatalf("Run = %v (context: %v), want the missing-table error, explained", err, ctx.Err())
	}
	if _, _, err := m.Check(ctx); err == nil || !strings.Contains(err.Error(), "monitor: a table or column it uses does not exist") {
		t.Fatalf("Check = %v, want the explained error", err)
	}

	src.set(src.st, nil)
	ctx2, cancel2 := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- m.Run(ctx2) }()
	for {
		src.mu.Lock()
		n := src.calls
		src.mu.Unlock()
		if n >= 3 {
			break
		}
		time.Sleep(time.Millisecond)
	}
	src.set(src.st, missing) // the table is dropped while running
	src.mu.Lock()
	n := src.calls
	src.mu.Unlock()
	for {
		src.mu.Lock()
		m := src.calls
		src.mu.Unlock()
		if m >= n+2 {
			break
		}
		time.Sleep(time.Millisecond)
	}
	cancel2()
	if err := <-done; err != nil {
		t.Fatalf("Run = %v after it had started, want nil (retried)", err)
	}
}
