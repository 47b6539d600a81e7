package walrelay

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxgen/outboxgen/runtime/outbox"
)

// TestParkError: a park that failed for a cause waiting cannot mend stops
// Run with what to do; one that may clear is retried (nil).
func TestParkError(t *testing.T) {
	// Not connected: parkError only reads the role from the pool's
	// configuration, and must not repeat the password.
	pool, err := pgxpool.New(context.Background(), "postgres://outbox_relay:s3cret-pw@127.0.0.1:1/shop")
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	r := &Relay{pool: pool, table: "outbox_event"}
	ev := &event{WALEvent: outbox.WALEvent{Key: "order-1"}}
	pg := func(code string) error {
		return fmt.Errorf("wrapped: %w", &pgconn.PgError{Severity: "ERROR", Code: code, Message: "test " + code})
	}
	for _, c := range []struct {
		code      string
		privilege string
		want      []string // nil: retried
		not       []string
	}{
		{"42501", "INSERT", []string{"GRANT INSERT ON outbox_event TO outbox_relay", "outboxgen grants", "42501", "neither published nor parked"}, []string{"migrate"}},
		{"42501", "SELECT, INSERT", []string{"GRANT SELECT, INSERT ON outbox_event TO outbox_relay"}, nil},
		{"42P01", "INSERT", []string{"outboxgen migrate up", "outbox_event"}, []string{"GRANT"}},
		{"42703", "INSERT", []string{"outboxgen migrate up"}, []string{"GRANT"}},
		{"22008", "INSERT", []string{"Config.Backoff", "refuses this event's row"}, []string{"GRANT"}},
		{"23502", "INSERT", []string{"upgrade the relay"}, nil},
		{"40001", "INSERT", nil, nil}, // serialization failure
		{"40P01", "INSERT", nil, nil}, // deadlock
		{"57P01", "INSERT", nil, nil}, // admin shutdown
		{"08006", "INSERT", nil, nil}, // connection failure
		{"53100", "INSERT", nil, nil}, // disk full
		{"55P03", "INSERT", nil, nil}, // lock not available
	} {
		got := r.parkError(ev, c.privilege, pg(c.code))
		if c.want == nil {
			if got != nil {
				t.Errorf("%s: %v; want it retried", c.code, got)
			}
			continue
		}
		if !isFatal(got) {
			t.Errorf("%s: %v; want a fatal error", c.code, got)
			continue
		}
		for _, w := range c.want {
			if !strings.Contains(got.Error(), w) {
				t.Errorf("%s: error %q lacks %q", c.code, got, w)
			}
		}
		for _, n := range append(c.not, "s3cret") {
			if strings.Contains(got.Error(), n) {
				t.Errorf("%s: error %q has %q", c.code, got, n)
			}
		}
	}
	for _, err := range []error{io.ErrUnexpectedEOF, context.DeadlineExceeded, errors.New("dial tcp: connection refused")} {
		if got := r.parkError(ev, "INSERT", err); got != nil {
			t.Errorf("%v: %v; want it retried", err, got)
		}
	}
	// The GRANT INSERT advice is the park's: a 42501 elsewhere (set-up)
	// keeps its own.
	if err := classify("start replication from slot s", pg("42501")); !isFatal(err) || strings.Contains(err.Error(), "GRANT INSERT") {
		t.Errorf("set-up 42501: %v", err)
	}
}

// TestCheckServerVersion: WAL mode needs pgoutput's messages option,
// PostgreSQL 14 or later.
func TestCheckServerVersion(t *testing.T) {
	for _, v := range []int{120015, 130011, 139999} {
		err := checkServerVersion(v)
		if !isFatal(err) || !strings.Contains(err.Error(), "needs PostgreSQL 14 or later") {
			t.Errorf("%d: %v; want a fatal error naming PostgreSQL 14", v, err)
		}
	}
	if err := checkServerVersion(130011); err == nil || !strings.Contains(err.Error(), "13.11") {
		t.Errorf("130011: %v; want the version named 13.11", err)
	}
	for _, v := range []int{140000, 150018, 170002} {
		if err := checkServerVersion(v); err != nil {
			t.Errorf("%d: %v", v, err)
		}
	}
}
