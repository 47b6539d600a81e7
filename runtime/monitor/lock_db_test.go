package monitor_test

import (
	"context"
	"database/sql"
	"errors"
	"testing"
	"time"

	"github.com/outboxgen/outboxgen/runtime/dialect"
	"github.com/outboxgen/outboxgen/runtime/monitor"
)

// The reviewer's case on real servers: another session locks the outbox
// table (PostgreSQL LOCK TABLE ... ACCESS EXCLUSIVE, as an ALTER TABLE
// does; MySQL LOCK TABLES ... WRITE, a metadata lock), so the monitor's
// SELECT queues behind it. The check fails at CheckTimeout with the
// explained timeout, and succeeds again once the lock is gone.
func TestCheckTimesOutOnLockedTable(t *testing.T) {
	run := func(t *testing.T, db *sql.DB, d dialect.Dialect, src statsSource) {
		ctx := context.Background()
		m, err := monitor.New(src, monitor.Config{Logger: quiet, Interval: time.Second, CheckTimeout: 300 * time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		defer m.Close()
		if _, _, err := m.Check(ctx); err != nil {
			t.Fatal(err)
		}
		conn, err := db.Conn(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		lock, unlock := []string{"LOCK TABLES " + src.Tables().Outbox + " WRITE"}, "UNLOCK TABLES"
		if d == dialect.Postgres {
			lock, unlock = []string{"BEGIN", "LOCK TABLE " + src.Tables().Outbox + " IN ACCESS EXCLUSIVE MODE"}, "ROLLBACK"
		}
		for _, q := range lock {
			if _, err := conn.ExecContext(ctx, q); err != nil {
				t.Fatal(err)
			}
		}
		locked := true
		release := func() {
			if locked {
				locked = false
				if _, err := conn.ExecContext(ctx, unlock); err != nil {
					t.Error(err)
				}
			}
		}
		defer release()

		start := time.Now()
		done := make(chan error, 1)
		go func() { _, _, err := m.Check(ctx); done <- err }()
		select {
		case err := <-done:
			t.Logf("Check on a locked table returned after %s: %v", time.Since(start).Round(time.Millisecond), err)
			wantTimeout(t, err, "the check did not finish within 300ms")
		case <-time.After(hangGuard):
			t.Fatal("Check on a locked table did not return: not bounded by CheckTimeout")
		}

		release()
		deadline := time.Now().Add(hangGuard)
		for {
			_, _, err := m.Check(ctx)
			if err == nil {
				break
			}
			if !errors.Is(err, context.DeadlineExceeded) || time.Now().After(deadline) {
				t.Fatalf("Check after the lock was released = %v, want success", err)
			}
			time.Sleep(10 * time.Millisecond) // the timed-out statement is giving up
		}
	}
	onDrivers(t, []string{"postgres", "mysql"}, run)
}
