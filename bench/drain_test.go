package bench

import (
	"context"
	"database/sql"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	wsql "github.com/ThreeDotsLabs/watermill-sql/v4/pkg/sql"
	"github.com/ThreeDotsLabs/watermill/components/forwarder"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/outboxgen/outboxgen/internal/testdb"
	"github.com/outboxgen/outboxgen/runtime/dialect"
	"github.com/outboxgen/outboxgen/runtime/driver"
	"github.com/outboxgen/outboxgen/runtime/driver/sqldriver"
	"github.com/outboxgen/outboxgen/runtime/relay"
)

const (
	groupRaw       = "raw"
	groupRelaySQL  = "relay-sql"
	groupRelay     = "relay"
	groupRelaySlow = "relay-1ms"
	groupWM        = "watermill"
	groupWMSlow    = "watermill-1ms"

	rawName          = "a_raw_b100_c1"
	relayDefaultName = "b_relay_b100_c8"
	wmName           = "c_watermill"
	wmSlowName       = "c_watermill_1ms"
)

type drainScenario struct {
	name     string // sub-benchmark name
	group    string
	title    string
	settings string
	slow     bool // 1 ms publish latency: uses -slowrows
	run      func(b *testing.B, n int) drainResult
}

func (s drainScenario) rows() int {
	if s.slow && *flagSlowRows > 0 {
		return *flagSlowRows
	}
	return *flagRows
}

type drainResult struct {
	scenario  drainScenario
	rows      int
	dur       time.Duration
	pgVersion string
}

func (r drainResult) rate() float64 {
	if r.dur <= 0 {
		return 0
	}
	return float64(r.rows) / r.dur.Seconds()
}

func drainScenarios() []drainScenario {
	var out []drainScenario
	raw := func(batch, clients int) drainScenario {
		return drainScenario{
			name:     fmt.Sprintf("a_raw_b%d_c%d", batch, clients),
			group:    groupRaw,
			title:    "(a) raw SQL claim+mark, no broker",
			settings: fmt.Sprintf("batch %d, %d client(s)", batch, clients),
			run:      func(b *testing.B, n int) drainResult { return runRaw(b, n, batch, clients, rawStatements) },
		}
	}
	out = append(out, raw(100, 1), raw(100, 4))
	// The relay's own claim and mark statements (package dialect) in the
	// same loop: the SQL share of the relay's cost, without publishing.
	out = append(out, drainScenario{
		name:     "a_relaysql_b100_c1",
		group:    groupRelaySQL,
		title:    "(a') relay's claim+mark SQL, no broker",
		settings: "batch 100, 1 client",
		run:      func(b *testing.B, n int) drainResult { return runDriverSQL(b, n, 100) },
	})
	relayRun := func(batch, conc int, slow bool) drainScenario {
		sc := drainScenario{
			name:     fmt.Sprintf("b_relay_b%d_c%d", batch, conc),
			group:    groupRelay,
			title:    "(b) outboxgen relay → GoChannel",
			settings: fmt.Sprintf("BatchSize %d, Concurrency %d", batch, conc),
			slow:     slow,
		}
		if slow {
			sc.name = fmt.Sprintf("b_relay_1ms_b%d_c%d", batch, conc)
			sc.group = groupRelaySlow
			sc.title = "(b) outboxgen relay → GoChannel +1 ms/Publish"
		}
		sc.run = func(b *testing.B, n int) drainResult { return runRelay(b, n, batch, conc, slow) }
		return sc
	}
	out = append(out,
		relayRun(100, 8, false), relayRun(500, 8, false), relayRun(1000, 8, false), relayRun(1000, 32, false),
	)
	wm := func(slow bool) drainScenario {
		sc := drainScenario{
			name: wmName, group: groupWM, title: "(c) watermill-sql + Forwarder → GoChannel",
			settings: "watermill defaults (SubscribeBatchSize 100)",
			slow:     slow,
		}
		if slow {
			sc.name, sc.group, sc.title = wmSlowName, groupWMSlow, "(c) watermill-sql + Forwarder → GoChannel +1 ms/Publish"
		}
		sc.run = func(b *testing.B, n int) drainResult { return runWatermill(b, n, slow) }
		return sc
	}
	out = append(out, wm(false))
	out = append(out,
		relayRun(100, 8, true), relayRun(100, 32, true), relayRun(500, 32, true), relayRun(1000, 32, true),
	)
	out = append(out, wm(true))
	return out
}

func pgVersion(b *testing.B, db *sql.DB) string {
	var v string
	if err := db.QueryRow("SELECT 'PostgreSQL ' || current_setting('server_version')").Scan(&v); err != nil {
		b.Fatal(err)
	}
	return v
}

// ---------------------------------------------------------------------------
// (a) Raw SQL ceiling.

const (
	rawClaim = `UPDATE outbox_event SET lease_owner = $1, lease_expires_at = now() + interval '30 seconds', updated_at = now()
		WHERE id IN (SELECT id FROM outbox_event WHERE status = 0 AND lease_owner IS NULL ORDER BY id LIMIT $2 FOR UPDATE SKIP LOCKED)
		RETURNING id, event_id, biz_type, biz_id, topic, payload_version, payload, headers, retry_count, created_at`
	rawMark = `UPDATE outbox_event SET status = 1, sent_at = now(), lease_owner = NULL, lease_expires_at = NULL, updated_at = now()
		WHERE id = ANY($1) AND lease_owner = $2 AND status = 0`
)

// statements returns the claim and the mark-sent statement of one batch.
type statements func(owner string, batch int) (claim string, claimArgs []any, mark func(ids []int64) (string, []any))

// rawStatements are the two statements above.
func rawStatements(owner string, batch int) (string, []any, func([]int64) (string, []any)) {
	return rawClaim, []any{owner, batch}, func(ids []int64) (string, []any) { return rawMark, []any{ids, owner} }
}

// runDriverSQL drains the backlog through the relay's storage driver
// (sqldriver: Claim, then MarkSent) with no publishing: the SQL share of
// the relay's cost.
func runDriverSQL(b *testing.B, n, batch int) drainResult {
	db := freshOutbox(b)
	fillOutbox(b, db, n)
	drv, err := sqldriver.New(db, testdb.Schema(dialect.Postgres))
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	total := 0
	start := time.Now()
	for {
		rows, err := drv.Claim(ctx, driver.ClaimParams{Owner: "sql-only", Lease: relay.DefaultLeaseDuration, Limit: batch})
		if err != nil {
			b.Fatalf("claim: %v", err)
		}
		if len(rows) == 0 {
			break
		}
		ids := make([]int64, len(rows))
		for i, r := range rows {
			ids[i] = r.ID
		}
		if _, err := drv.MarkSent(ctx, "sql-only", ids); err != nil {
			b.Fatalf("mark sent: %v", err)
		}
		total += len(rows)
	}
	dur := time.Since(start)
	if total != n {
		b.Fatalf("drained %d of %d rows", total, n)
	}
	return drainResult{rows: n, dur: dur, pgVersion: pgVersion(b, db)}
}

// runRaw drains the backlog with a claim and a mark statement in a loop per
// client: the same row writes as the relay (lease on claim, status on mark)
// without message building or publishing.
func runRaw(b *testing.B, n, batch, clients int, stmts statements) drainResult {
	db := freshOutbox(b)
	fillOutbox(b, db, n)
	ctx := context.Background()
	var total atomic.Int64
	var wg sync.WaitGroup
	errc := make(chan error, clients)
	start := time.Now()
	for c := range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			owner := fmt.Sprintf("raw-%d", c)
			claim, claimArgs, mark := stmts(owner, batch)
			ids := make([]int64, 0, batch)
			for {
				rs, err := db.QueryContext(ctx, claim, claimArgs...)
				if err != nil {
					errc <- err
					return
				}
				ids = ids[:0]
				for rs.Next() {
					var (
						id                int64
						eventID, typ, key string
						top               string
						version, retries  int
						payload, headers  []byte
						created           time.Time
					)
					if err := rs.Scan(&id, &eventID, &typ, &key, &top, &version, &payload, &headers, &retries, &created); err != nil {
						errc <- err
						rs.Close()
						return
					}
					ids = append(ids, id)
				}
				if err := rs.Err(); err != nil {
					errc <- err
					return
				}
				rs.Close()
				if len(ids) == 0 {
					return
				}
				markSQL, markArgs := mark(ids)
				if _, err := db.ExecContext(ctx, markSQL, markArgs...); err != nil {
					errc <- err
					return
				}
				total.Add(int64(len(ids)))
			}
		}()
	}
	wg.Wait()
	dur := time.Since(start)
	close(errc)
	for err := range errc {
		b.Fatalf("raw drain: %v", err)
	}
	if got := total.Load(); got != int64(n) {
		b.Fatalf("raw drain marked %d of %d rows", got, n)
	}
	return drainResult{rows: n, dur: dur, pgVersion: pgVersion(b, db)}
}

// ---------------------------------------------------------------------------
// (b) Our relay.

func runRelay(b *testing.B, n, batch, conc int, slow bool) drainResult {
	db := freshOutbox(b)
	fillOutbox(b, db, n)
	s := newSink(b, n)
	var pub message.Publisher = s.pub
	if slow {
		pub = slowPublisher{Publisher: s.pub, delay: slowBy}
	}
	drv, err := sqldriver.New(db, testdb.Schema(dialect.Postgres))
	if err != nil {
		b.Fatal(err)
	}
	r, err := relay.New(drv, relay.Config{
		Publisher:   pub,
		BatchSize:   batch,
		Concurrency: conc,
		Logger:      discard,
	})
	if err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	runErr := make(chan error, 1)
	start := time.Now()
	go func() { runErr <- r.Run(ctx) }()
	s.wait(b, 30*time.Minute)
	waitDrained(b, db, time.Minute)
	dur := time.Since(start)
	cancel()
	if err := <-runErr; err != nil {
		b.Fatalf("relay Run: %v", err)
	}
	if s.dups > 0 {
		b.Logf("%d duplicate deliveries", s.dups)
	}
	return drainResult{rows: n, dur: dur, pgVersion: pgVersion(b, db)}
}

// ---------------------------------------------------------------------------
// (c) watermill-sql + watermill Forwarder, configured as watermill documents
// it (components/forwarder, watermill-sql's PostgreSQL schema and offsets
// adapters, all defaults).

func runWatermill(b *testing.B, n int, slow bool) drainResult {
	db := testdb.Open(b, "postgres")
	logger := watermill.NopLogger{}
	schema := wsql.DefaultPostgreSQLSchema{}
	offsets := wsql.DefaultPostgreSQLOffsetsAdapter{}
	sub, err := wsql.NewSubscriber(wsql.BeginnerFromStdSQL(db), wsql.SubscriberConfig{
		SchemaAdapter:    schema,
		OffsetsAdapter:   offsets,
		InitializeSchema: true,
	}, logger)
	if err != nil {
		b.Fatal(err)
	}
	if err := sub.SubscribeInitialize(fwdTopic); err != nil {
		b.Fatal(err)
	}
	fillWatermill(b, db, schema, n)

	s := newSink(b, n)
	var pub message.Publisher = s.pub
	if slow {
		pub = slowPublisher{Publisher: s.pub, delay: slowBy}
	}
	fwd, err := forwarder.NewForwarder(sub, pub, logger, forwarder.Config{ForwarderTopic: fwdTopic})
	if err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	runErr := make(chan error, 1)
	start := time.Now()
	go func() { runErr <- fwd.Run(ctx) }()
	s.wait(b, 30*time.Minute)
	dur := time.Since(start)
	cancel()
	if err := <-runErr; err != nil {
		b.Fatalf("forwarder Run: %v", err)
	}
	_ = fwd.Close()
	if s.dups > 0 {
		b.Logf("%d duplicate deliveries", s.dups)
	}
	return drainResult{rows: n, dur: dur, pgVersion: pgVersion(b, db)}
}

// fillWatermill writes n messages the way an application using watermill's
// forwarder does: a watermill-sql Publisher on the business transaction,
// wrapped in forwarder.NewPublisher, one message per transaction; 8
// writers in parallel. Then VACUUM ANALYZE, as for our table.
func fillWatermill(b *testing.B, db *sql.DB, schema wsql.SchemaAdapter, n int) {
	b.Helper()
	const writers = 8
	ctx := context.Background()
	var next atomic.Int64
	var wg sync.WaitGroup
	errc := make(chan error, writers)
	for range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(1))
				if i > n {
					return
				}
				if err := publishInTx(ctx, db, schema, i); err != nil {
					errc <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errc)
	for err := range errc {
		b.Fatalf("fill watermill: %v", err)
	}
	if _, err := db.ExecContext(ctx, `VACUUM ANALYZE "watermill_`+fwdTopic+`"`); err != nil {
		b.Fatalf("vacuum: %v", err)
	}
}

func publishInTx(ctx context.Context, db *sql.DB, schema wsql.SchemaAdapter, i int) error {
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer tx.Rollback() //nolint:errcheck
	p, err := wsql.NewPublisher(wsql.TxFromStdSQL(tx), wsql.PublisherConfig{SchemaAdapter: schema}, watermill.NopLogger{})
	if err != nil {
		return err
	}
	msg := message.NewMessage(watermill.NewUUID(), payloadJSON(i))
	msg.Metadata.Set("outbox_type", "ORDER_PAID")
	msg.Metadata.Set("outbox_key", keyOf(i))
	if err := forwarder.NewPublisher(p, forwarder.PublisherConfig{ForwarderTopic: fwdTopic}).Publish(topic, msg); err != nil {
		return err
	}
	return tx.Commit()
}
