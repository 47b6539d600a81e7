package pgxdriver_test

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxgen/outboxgen/internal/testdb"
	"github.com/outboxgen/outboxgen/runtime/dialect"
	"github.com/outboxgen/outboxgen/runtime/driver"
	"github.com/outboxgen/outboxgen/runtime/driver/pgxdriver"
	"github.com/outboxgen/outboxgen/runtime/driver/sqldriver"
	"github.com/outboxgen/outboxgen/runtime/outbox"
	"github.com/outboxgen/outboxgen/runtime/relay"
)

// hangGuard bounds every wait in these tests: far above any expected
// latency, far below the relay's one-minute PollInterval.
const hangGuard = 20 * time.Second

// WaitForNotification: the first call returns once listening; later calls
// return on a notification, concurrent callers included; a cancelled call
// returns the context's error.
func TestWaitForNotification(t *testing.T) {
	drv, pool, _ := openPgx(t)
	ctx, cancel := context.WithTimeout(context.Background(), hangGuard)
	defer cancel()
	if err := drv.WaitForNotification(ctx); err != nil {
		t.Fatalf("first wait (connect and LISTEN): %v", err)
	}
	var done atomic.Int32
	var wg sync.WaitGroup
	errs := make(chan error, 2)
	for range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs <- drv.WaitForNotification(ctx)
			done.Add(1)
		}()
	}
	for done.Load() < 2 && ctx.Err() == nil {
		if _, err := pool.Exec(ctx, dialect.NotifyInsert(testdb.Tables.Outbox)); err != nil {
			t.Fatal(err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatalf("wait: %v", err)
		}
	}

	short, stop := context.WithCancel(context.Background())
	time.AfterFunc(50*time.Millisecond, stop)
	if err := drv.WaitForNotification(short); !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled wait = %v, want context.Canceled", err)
	}
	// It reconnects afterwards.
	if err := drv.WaitForNotification(ctx); err != nil {
		t.Fatalf("wait after cancel: %v", err)
	}
	// A cancelled wait closes the connection: nothing is left behind.
	short, stop = context.WithCancel(context.Background())
	stop()
	if err := drv.WaitForNotification(short); !errors.Is(err, context.Canceled) {
		t.Fatalf("wait on a done context = %v", err)
	}
	for n := listeners(t, ctx, pool); n != 0; n = listeners(t, ctx, pool) {
		if ctx.Err() != nil {
			t.Fatalf("%d LISTEN sessions left after a cancelled wait", n)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// listeners counts the sessions of the test database listening on the
// outbox channel.
func listeners(t *testing.T, ctx context.Context, pool *pgxpool.Pool) int {
	t.Helper()
	var n int
	if err := pool.QueryRow(ctx, "SELECT COUNT(*) FROM pg_stat_activity WHERE datname = current_database() AND query = $1",
		dialect.Listen(testdb.Tables.Outbox)).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// countingDriver counts claims; embedding keeps the Notifier method.
type countingDriver struct {
	*pgxdriver.Driver
	claims atomic.Int64
}

func (c *countingDriver) Claim(ctx context.Context, p driver.ClaimParams) ([]driver.Row, error) {
	c.claims.Add(1)
	return c.Driver.Claim(ctx, p)
}

// A relay with a one-minute PollInterval publishes events that another
// connection commits with Notify (pgx and database/sql writers) within
// moments: the relay waits on LISTEN as well as on its timer.
func TestRelayWakesOnNotify(t *testing.T) {
	drv, pool, db := openPgx(t)
	cd := &countingDriver{Driver: drv}
	pub := gochannel.NewGoChannel(gochannel.Config{OutputChannelBuffer: 100}, watermill.NopLogger{})
	defer pub.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 3*hangGuard)
	defer cancel()
	msgs, err := pub.Subscribe(ctx, "orders")
	if err != nil {
		t.Fatal(err)
	}
	r, err := relay.New(cd, relay.Config{
		Publisher: pub, PollInterval: time.Minute, InstanceID: "listener",
		Logger: slog.New(slog.DiscardHandler),
	})
	if err != nil {
		t.Fatal(err)
	}
	runCtx, stop := context.WithCancel(ctx)
	runDone := make(chan error, 1)
	go func() { runDone <- r.Run(runCtx) }()
	defer func() {
		stop()
		if err := <-runDone; err != nil {
			t.Errorf("Run: %v", err)
		}
	}()

	// Wait until the relay listens and has made its start-up polls (the
	// first one, and the one after LISTEN): from then on only a
	// notification wakes it before a minute has passed.
	deadline := time.Now().Add(hangGuard)
	for {
		listening := listeners(t, ctx, pool)
		if listening == 1 && cd.claims.Load() >= 2 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("relay not listening (%d listeners, %d claims)", listening, cd.claims.Load())
		}
		time.Sleep(10 * time.Millisecond)
	}
	time.Sleep(50 * time.Millisecond) // let a start-up poll in flight finish

	w := outbox.MustNewWriter(dialect.Postgres, testdb.Tables.Outbox)
	expect := func(what string, id outbox.EventID) {
		t.Helper()
		select {
		case m := <-msgs:
			m.Ack()
			if m.UUID != id.String() {
				t.Fatalf("%s: got event %s, want %s", what, m.UUID, id)
			}
		case <-time.After(hangGuard):
			t.Fatalf("%s: event not published within %s of its notified commit (PollInterval is a minute)", what, hangGuard)
		}
	}

	// A native pgx writer.
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	id := insertPgx(t, ctx, tx)
	if err := pgxdriver.Notify(ctx, tx, testdb.Schema(dialect.Postgres)); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	expect("pgx writer", id)

	// A database/sql writer.
	sdrv, err := sqldriver.New(db, testdb.Schema(dialect.Postgres))
	if err != nil {
		t.Fatal(err)
	}
	stx, err := db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	id, err = w.Insert(ctx, stx, outbox.Event{Type: "ORDER_PAID", Topic: "orders", Key: "k2", Version: 1, Payload: map[string]int{"n": 2}})
	if err != nil {
		t.Fatal(err)
	}
	if err := sdrv.Notify(ctx, stx); err != nil {
		t.Fatal(err)
	}
	if err := stx.Commit(); err != nil {
		t.Fatal(err)
	}
	expect("database/sql writer", id)
}

// insertPgx inserts one event on a pgx transaction with the dialect's
// INSERT and returns its id.
func insertPgx(t *testing.T, ctx context.Context, tx pgx.Tx) outbox.EventID {
	t.Helper()
	id := outbox.NewEventID()
	if _, err := tx.Exec(ctx, dialect.Postgres.InsertEvent(testdb.Tables.Outbox, false),
		id.String(), "ORDER_PAID", "k1", "orders", 1, `{"n":1}`, nil); err != nil {
		t.Fatal(err)
	}
	return id
}
