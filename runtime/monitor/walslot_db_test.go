package monitor_test

import (
	"context"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/outboxgen/outboxgen/internal/testdb"
	"github.com/outboxgen/outboxgen/runtime/monitor"
	"github.com/outboxgen/outboxgen/runtime/outbox"
	"github.com/outboxgen/outboxgen/runtime/walrelay"
	"github.com/outboxgen/outboxgen/templates"
)

type discardPublisher struct{}

func (discardPublisher) Publish(string, ...*message.Message) error { return nil }
func (discardPublisher) Close() error                              { return nil }

// The wal_slot alert on a real PostgreSQL server: it fires with
// walrelay.CheckSlot's text while the slot is missing, and resolves once a
// WAL relay created the slot and streams from it.
func TestWALSlotAlert(t *testing.T) {
	pool := testdb.PgxPool(t)
	ctx := context.Background()
	var level string
	if err := pool.QueryRow(ctx, "SELECT current_setting('wal_level')").Scan(&level); err != nil {
		t.Fatal(err)
	}
	if level != "logical" {
		if os.Getenv("CI") == "true" {
			t.Fatalf("wal_level is %s: the WAL tests need wal_level=logical (scripts/testdb.sh sets it)", level)
		}
		t.Skipf("wal_level is %s, not logical: restart the test server with scripts/testdb.sh", level)
	}
	ddl, err := templates.Render("postgres", templates.Tables{Outbox: testdb.Tables.Outbox, Inbox: testdb.Tables.Inbox})
	if err != nil {
		t.Fatal(err)
	}
	for _, stmt := range templates.Statements(ddl) {
		if _, err := pool.Exec(ctx, stmt); err != nil {
			t.Fatal(err)
		}
	}
	slot := "outboxgen_mon_" + strings.ReplaceAll(testdb.Tables.Outbox, "-", "_")
	t.Cleanup(func() {
		c, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		for c.Err() == nil {
			_, _ = pool.Exec(c, "SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots WHERE slot_name = $1 AND active_pid IS NOT NULL", slot)
			if _, err := pool.Exec(c, "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name = $1 AND NOT active", slot); err == nil {
				var n int
				if pool.QueryRow(c, "SELECT count(*) FROM pg_replication_slots WHERE slot_name = $1", slot).Scan(&n) == nil && n == 0 {
					return
				}
			}
			time.Sleep(100 * time.Millisecond)
		}
	})
	src := &fakeSource{}
	rec := newRecorder()
	var gotMax int64 = -2
	m, err := monitor.New(src, monitor.Config{Logger: quiet, Interval: 20 * time.Millisecond, OnAlert: rec.onAlert, OnResolve: rec.onResolve,
		SlotCheck: func(ctx context.Context, max int64) error {
			gotMax = max
			return walrelay.CheckSlot(ctx, pool, slot, max)
		}})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	_, alerts, err := m.Check(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(alerts) != 1 || alerts[0].Kind != monitor.WALSlot || !strings.Contains(alerts[0].Message, slot) {
		t.Fatalf("alerts %+v, want one wal_slot alert naming %s", alerts, slot)
	}
	if gotMax != monitor.DefaultMaxSlotLagBytes {
		t.Errorf("SlotCheck got lag limit %d, want the default %d", gotMax, int64(monitor.DefaultMaxSlotLagBytes))
	}

	mctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- m.Run(mctx) }()
	defer func() { cancel(); <-done }()
	if k := <-rec.fired; k != monitor.WALSlot {
		t.Fatalf("Run fired %s, want wal_slot", k)
	}
	r, err := walrelay.New(pool, testdb.Schema(outbox.Postgres), walrelay.Config{Publisher: discardPublisher{}, Slot: slot, Logger: quiet, StatusInterval: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	rctx, rcancel := context.WithCancel(ctx)
	rdone := make(chan error, 1)
	go func() { rdone <- r.Run(rctx) }()
	defer func() { rcancel(); <-rdone }()
	deadline := time.Now().Add(30 * time.Second)
	for {
		if _, resolves := rec.counts(); resolves[monitor.WALSlot] == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the wal_slot alert did not resolve within 30s of the relay streaming")
		}
		time.Sleep(20 * time.Millisecond)
	}
}
