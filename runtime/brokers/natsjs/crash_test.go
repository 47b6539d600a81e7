package natsjs_test

import (
	"context"
	"database/sql"
	"log/slog"
	"os"
	"os/exec"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/outboxgen/outboxgen/internal/syncbuf"
	"github.com/outboxgen/outboxgen/internal/testdb"
	"github.com/outboxgen/outboxgen/runtime/brokers/internal/brokertest"
	"github.com/outboxgen/outboxgen/runtime/dialect"
	"github.com/outboxgen/outboxgen/runtime/driver/sqldriver"
	"github.com/outboxgen/outboxgen/runtime/relay"
	"github.com/outboxgen/outboxgen/templates"
)

// The child relay process reads its settings from these variables.
const (
	envChildDSN     = "OUTBOXGEN_CHILD_DSN"
	envChildDriver  = "OUTBOXGEN_CHILD_DRIVER"
	envChildDialect = "OUTBOXGEN_CHILD_DIALECT"
	envChildNATS    = "OUTBOXGEN_CHILD_NATS"
	childOwner      = "child-relay"
	childLease      = 3 * time.Second
)

// slowPublisher stands in for a broker with a round trip of delay, so the
// child is always somewhere inside a batch when it is killed.
type slowPublisher struct {
	message.Publisher
	delay time.Duration
}

func (p slowPublisher) Publish(topic string, msgs ...*message.Message) error {
	time.Sleep(p.delay)
	return p.Publisher.Publish(topic, msgs...)
}

// TestRelayChildProcess is the relay process TestRelayProcessKilled starts
// and kills; run on its own it does nothing.
func TestRelayChildProcess(t *testing.T) {
	dsn := os.Getenv(envChildDSN)
	if dsn == "" {
		t.Skip("helper process of TestRelayProcessKilled")
	}
	db, err := sql.Open(os.Getenv(envChildDriver), dsn)
	if err != nil {
		t.Fatal(err)
	}
	drv, err := sqldriver.New(db, testdb.Schema(dialect.Dialect(os.Getenv(envChildDialect))))
	if err != nil {
		t.Fatal(err)
	}
	pub := newPublisher(t, os.Getenv(envChildNATS), 2*time.Second)
	r, err := relay.New(drv, relay.Config{
		Publisher:       slowPublisher{Publisher: pub, delay: 20 * time.Millisecond},
		InstanceID:      childOwner,
		BatchSize:       25,
		Concurrency:     2,
		PollInterval:    20 * time.Millisecond,
		LeaseDuration:   childLease,
		ShutdownTimeout: time.Second,
		Logger:          slog.New(slog.NewTextHandler(os.Stderr, nil)),
	})
	if err != nil {
		t.Fatal(err)
	}
	// Runs until the parent kills the process with SIGKILL.
	if err := r.Run(context.Background()); err != nil {
		t.Fatal(err)
	}
}

// TestRelayProcessKilled is the seed design's acceptance check 3: a relay
// process is killed with SIGKILL in the middle of a batch, holding leased
// rows; another instance publishes everything once the lease lapses.
// Nothing is lost, nothing stays stuck, and JetStream's de-duplication by
// event id keeps the stream free of the re-sends.
func TestRelayProcessKilled(t *testing.T) {
	for _, name := range testdb.Dialects() {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			dsn := testdb.DSN(t, name)
			db, err := sql.Open(testdb.Driver(t, name), dsn)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { db.Close() })
			testdb.ApplySchema(t, db, name, templates.DefaultTables)
			d := dialect.Dialect(name)

			srv := startNATS(t, -1, t.TempDir())
			url := srv.ClientURL()
			w := brokertest.NewWriter(db, d, topic, keys...)
			all := w.Write(t, 40) // 160 events on 4 keys

			var out syncbuf.Buffer
			child := exec.Command(os.Args[0], "-test.run=^TestRelayChildProcess$", "-test.v")
			child.Env = append(os.Environ(),
				envChildDSN+"="+dsn, envChildDriver+"="+testdb.Driver(t, name),
				envChildDialect+"="+name, envChildNATS+"="+url)
			child.Stdout, child.Stderr = &out, &out
			if err := child.Start(); err != nil {
				t.Fatal(err)
			}
			killed := false
			t.Cleanup(func() {
				if !killed {
					child.Process.Kill()
					child.Wait()
				}
			})

			// Kill it once it has published some events and holds a lease
			// on others: mid-batch by construction.
			leased := func() int {
				var n int
				if err := db.QueryRow("SELECT COUNT(*) FROM " + brokertest.Table + " WHERE status = 0 AND lease_owner = '" + childOwner + "'").Scan(&n); err != nil {
					t.Fatal(err)
				}
				return n
			}
			brokertest.Eventually(t, 60*time.Second, "the child relay publishing with rows leased", func() bool {
				return brokertest.CountStatus(t, db, 1) >= 20 && leased() > 0
			})
			if err := child.Process.Kill(); err != nil {
				t.Fatal(err)
			}
			child.Wait()
			killed = true
			sentAtKill, leasedAtKill := brokertest.CountStatus(t, db, 1), leased()
			t.Logf("killed the child relay with %d of %d events sent and %d rows leased", sentAtKill, len(all), leasedAtKill)
			if leasedAtKill == 0 || sentAtKill == len(all) {
				t.Fatalf("the child was not killed mid-batch (sent %d, leased %d); output:\n%s", sentAtKill, leasedAtKill, out.String())
			}

			// Another instance takes over; the killed one's rows come back
			// when its lease lapses.
			pub := newPublisher(t, url, 2*time.Second)
			rs := brokertest.StartRelays(t, db, d, 1, pub, relay.Config{})
			defer rs.Stop()
			brokertest.WaitSent(t, db, len(all), 30*time.Second)

			var stuck int
			if err := db.QueryRow("SELECT COUNT(*) FROM " + brokertest.Table + " WHERE status <> 1 OR lease_owner IS NOT NULL").Scan(&stuck); err != nil {
				t.Fatal(err)
			}
			if stuck != 0 {
				t.Fatalf("%d rows not sent or still leased after the takeover", stuck)
			}
			got := consume(t, url, "")
			got.WaitUnique(t, len(all), 20*time.Second)
			brokertest.Check(t, all, got.Got())
			if m := streamMsgs(t, pub); m != uint64(len(all)) {
				t.Fatalf("stream holds %d messages, want %d (the re-sent events were not de-duplicated)", m, len(all))
			}
		})
	}
}
