package runner_test

import (
	"context"
	"database/sql"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"
	"github.com/google/uuid"

	"github.com/outboxgen/outboxgen/internal/testdb"
	"github.com/outboxgen/outboxgen/runtime/driver/sqldriver"
	"github.com/outboxgen/outboxgen/runtime/janitor"
	"github.com/outboxgen/outboxgen/runtime/monitor"
	"github.com/outboxgen/outboxgen/runtime/relay"
	"github.com/outboxgen/outboxgen/runtime/runner"
	"github.com/outboxgen/outboxgen/runtime/sweeper"
	"github.com/outboxgen/outboxgen/templates"
)

func sqliteDB(t *testing.T) *sql.DB {
	t.Helper()
	db, err := sql.Open("sqlite", testdb.SQLiteDSN(filepath.Join(t.TempDir(), "o.db")))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	testdb.ApplySchema(t, db, "sqlite", templates.DefaultTables)
	return db
}

func get(t *testing.T, h http.Handler, path string) (int, string) {
	t.Helper()
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest("GET", path, nil))
	return rec.Code, rec.Body.String()
}

// TestRunner runs every part on SQLite: events are published, /metrics
// shows the monitor's gauges and the runner's counters, /readyz follows
// the database, and Run returns nil after cancellation.
func TestRunner(t *testing.T) {
	db := sqliteDB(t)
	drv, err := sqldriver.New(db, testdb.Schema("sqlite"))
	if err != nil {
		t.Fatal(err)
	}
	pub := gochannel.NewGoChannel(gochannel.Config{Persistent: true}, watermill.NopLogger{})
	defer pub.Close()
	msgs, err := pub.Subscribe(context.Background(), "t.orders")
	if err != nil {
		t.Fatal(err)
	}
	for i := range 20 {
		if _, err := db.Exec("INSERT INTO outbox_event (event_id, biz_type, biz_id, topic, payload) VALUES (?, 'T', ?, 't.orders', '{}')", uuid.NewString(), fmt.Sprint("k", i%3)); err != nil {
			t.Fatal(err)
		}
	}
	r, err := runner.New(drv, runner.Config{
		Publisher:   pub,
		Relay:       &relay.Config{PollInterval: 50 * time.Millisecond},
		Sweeper:     &sweeper.Config{},
		Monitor:     &monitor.Config{Interval: 100 * time.Millisecond},
		Janitor:     &janitor.Config{},
		ReadyWindow: time.Second,
		Logger:      slog.New(slog.NewJSONHandler(io.Discard, nil)),
	})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	if got := strings.Join(r.Parts(), ","); got != "relay,sweeper,monitor,janitor" {
		t.Errorf("Parts() = %s", got)
	}
	h := r.Handler()
	if code, body := get(t, h, "/readyz"); code != 503 || !strings.Contains(body, "starting") {
		t.Errorf("before Run: /readyz = %d %q, want 503 starting", code, body)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	for i := range 20 {
		select {
		case m := <-msgs:
			m.Ack()
		case <-time.After(10 * time.Second):
			t.Fatalf("got %d of 20 messages", i)
		}
	}
	deadline := time.Now().Add(5 * time.Second)
	var metrics string
	for {
		_, metrics = get(t, h, "/metrics")
		if strings.Contains(metrics, "outboxgen_relay_sent_total") && strings.Contains(metrics, "outboxgen_outbox_pending") || time.Now().After(deadline) {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	for _, want := range []string{`outboxgen_relay_sent_total{part="relay"} 20`, "outboxgen_outbox_pending{", "outboxgen_outbox_failed{", "outboxgen_runner_ready 1", "go_goroutines"} {
		if !strings.Contains(metrics, want) {
			t.Errorf("/metrics lacks %q", want)
		}
	}
	if code, body := get(t, h, "/readyz"); code != 200 {
		t.Errorf("/readyz = %d %q, want 200", code, body)
	}
	if code, _ := get(t, h, "/healthz"); code != 200 {
		t.Errorf("/healthz = %d, want 200", code)
	}

	// The database goes away: not ready (liveness stays up).
	db.Close()
	deadline = time.Now().Add(10 * time.Second)
	for {
		code, body := get(t, h, "/readyz")
		if code == 503 {
			if !strings.Contains(body, "database") {
				t.Errorf("/readyz body %q does not name the database", body)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("/readyz still %d %q after the database closed", code, body)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if code, _ := get(t, h, "/healthz"); code != 200 {
		t.Errorf("/healthz = %d with the database down, want 200", code)
	}
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("Run = %v, want nil after cancellation", err)
		}
	case <-time.After(15 * time.Second):
		t.Fatal("Run did not return within 15s of cancellation")
	}
	if code, _ := get(t, h, "/readyz"); code != 503 {
		t.Errorf("after shutdown: /readyz = %d, want 503", code)
	}
}

// TestRunnerMissingTable: a part that cannot start ends Run with its error.
func TestRunnerMissingTable(t *testing.T) {
	db, err := sql.Open("sqlite", testdb.SQLiteDSN(filepath.Join(t.TempDir(), "empty.db")))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	drv, err := sqldriver.New(db, testdb.Schema("sqlite"))
	if err != nil {
		t.Fatal(err)
	}
	pub := gochannel.NewGoChannel(gochannel.Config{}, watermill.NopLogger{})
	r, err := runner.New(drv, runner.Config{Publisher: pub, Relay: &relay.Config{}, Monitor: &monitor.Config{}, Logger: slog.New(slog.NewJSONHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	err = r.Run(ctx)
	if err == nil || !strings.Contains(err.Error(), "outbox_event") {
		t.Fatalf("Run = %v, want an error naming outbox_event", err)
	}
}

// TestConfigValidate: a runner with no part is refused with advice.
func TestConfigValidate(t *testing.T) {
	err := runner.Config{ReadyWindow: -1}.Validate()
	if err == nil || !strings.Contains(err.Error(), "no part to run") || !strings.Contains(err.Error(), "ReadyWindow") {
		t.Fatalf("Validate = %v", err)
	}
}
