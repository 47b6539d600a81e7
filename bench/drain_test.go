package bench

// Drains of a backlog: the two raw ceilings (a1, a2), the relay and
// watermill's Forwarder, on PostgreSQL and MariaDB.

import (
	"context"
	"database/sql"
	"fmt"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	wsql "github.com/ThreeDotsLabs/watermill-sql/v4/pkg/sql"
	"github.com/ThreeDotsLabs/watermill/components/forwarder"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxgen/outboxgen/internal/testdb"
	"github.com/outboxgen/outboxgen/runtime/dialect"
	"github.com/outboxgen/outboxgen/runtime/driver"
	"github.com/outboxgen/outboxgen/runtime/driver/pgxdriver"
	"github.com/outboxgen/outboxgen/runtime/driver/sqldriver"
	"github.com/outboxgen/outboxgen/runtime/relay"
)

// ---------------------------------------------------------------------------
// The raw ceilings, one client, batches of 100, nothing published. Both
// read the columns a publisher needs (the relay's Row).
//
//	a1: one transaction per batch: SELECT ... FOR UPDATE SKIP LOCKED, UPDATE
//	    to sent, COMMIT.
//	a2: what a lease-based relay must minimally do: lease the batch (one
//	    commit), then mark it sent (a second commit). PostgreSQL: UPDATE ...
//	    WHERE id IN (SELECT ... FOR UPDATE SKIP LOCKED) RETURNING. MariaDB
//	    has no UPDATE ... RETURNING: SELECT ... FOR UPDATE SKIP LOCKED and
//	    the lease UPDATE in one transaction.

const rowCols = `id, event_id, biz_type, biz_id, topic, payload_version, payload, headers, retry_count, created_at`

const ceilingBatch = 100

// ceiling is a1, a2 or a3 (BenchmarkLeaseAside, PostgreSQL only).
type ceiling string

const (
	a1 ceiling = "a1"
	a2 ceiling = "a2"
)

// inList returns "(p1, p2, ...)" for n placeholders of dialect d starting
// at $from, and the ids as arguments.
func inList(d string, from int, ids []int64) (string, []any) {
	ph := make([]string, len(ids))
	args := make([]any, len(ids))
	for i, id := range ids {
		ph[i] = "?"
		if d == "postgres" {
			ph[i] = fmt.Sprintf("$%d", from+i)
		}
		args[i] = id
	}
	return "(" + strings.Join(ph, ", ") + ")", args
}

type querier interface {
	QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error)
}

// readRows runs a query returning rowCols and returns the ids, after
// scanning every column as the relay's driver does.
func readRows(ctx context.Context, q querier, query string, args ...any) ([]int64, error) {
	rs, err := q.QueryContext(ctx, query, args...)
	if err != nil {
		return nil, err
	}
	defer rs.Close()
	var ids []int64
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
			return nil, err
		}
		ids = append(ids, id)
	}
	return ids, rs.Err()
}

// ceilingBatchOnce drains one batch with a1, a2 or a3 and returns how many
// rows it took.
func ceilingBatchOnce(ctx context.Context, db *sql.DB, d string, c ceiling, owner string) (int, error) {
	now := dialect.Dialect(d).Now()
	lim := "?"
	if d == "postgres" {
		lim = "$1"
	}
	if c == a3 {
		return leaseAsideBatch(ctx, db, owner)
	}
	if c == a2 && d == "postgres" {
		ids, err := readRows(ctx, db, `UPDATE outbox_event SET lease_owner = $1, lease_expires_at = now() + interval '30 seconds', updated_at = now()
			WHERE id IN (SELECT id FROM outbox_event WHERE status = 0 AND lease_owner IS NULL ORDER BY id LIMIT $2 FOR UPDATE SKIP LOCKED)
			RETURNING `+rowCols, owner, ceilingBatch)
		if err != nil || len(ids) == 0 {
			return 0, err
		}
		_, err = db.ExecContext(ctx, `UPDATE outbox_event SET status = 1, sent_at = now(), lease_owner = NULL, lease_expires_at = NULL, updated_at = now()
			WHERE id = ANY($1) AND lease_owner = $2 AND status = 0`, ids, owner)
		return len(ids), err
	}
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return 0, err
	}
	defer tx.Rollback() //nolint:errcheck
	where := "status = 0"
	if c == a2 {
		where += " AND lease_owner IS NULL"
	}
	ids, err := readRows(ctx, tx, `SELECT `+rowCols+` FROM outbox_event WHERE `+where+` ORDER BY id LIMIT `+lim+` FOR UPDATE SKIP LOCKED`, ceilingBatch)
	if err != nil || len(ids) == 0 {
		return 0, err
	}
	switch c {
	case a1:
		in, args := inList(d, 1, ids)
		if _, err := tx.ExecContext(ctx, `UPDATE outbox_event SET status = 1, sent_at = `+now+`, updated_at = `+now+` WHERE id IN `+in, args...); err != nil {
			return 0, err
		}
		return len(ids), tx.Commit()
	default: // a2 on MariaDB
		in, args := inList(d, 1, ids)
		if _, err := tx.ExecContext(ctx, `UPDATE outbox_event SET lease_owner = ?, lease_expires_at = NOW(6) + INTERVAL 30 SECOND WHERE id IN `+in, append([]any{owner}, args...)...); err != nil {
			return 0, err
		}
		if err := tx.Commit(); err != nil {
			return 0, err
		}
		_, err := db.ExecContext(ctx, `UPDATE outbox_event SET status = 1, sent_at = NOW(6), lease_owner = NULL, lease_expires_at = NULL
			WHERE id IN `+in+` AND lease_owner = ? AND status = 0`, append(args, owner)...)
		return len(ids), err
	}
}

// runCeiling fills a fresh database with n pending rows and drains limit
// of them (0: all) with c; it returns rows/s and the drain's CPU.
func runCeiling(b *testing.B, srv *servers, d string, c ceiling, n, limit int) (float64, cpuUse) {
	db := freshOutbox(b, d)
	if c == a3 {
		leaseAsideTable(b, db)
	}
	srv.fill(b)
	fillBacklog(b, db, d, n)
	srv.measure(b)
	if limit <= 0 || limit > n {
		limit = n
	}
	ctx := context.Background()
	total := 0
	start, cpu := time.Now(), startCPU()
	for total < limit {
		k, err := ceilingBatchOnce(ctx, db, d, c, "raw-"+string(c))
		if err != nil {
			b.Fatalf("%s %s: %v", d, c, err)
		}
		if k == 0 {
			b.Fatalf("%s %s: drained %d of %d rows", d, c, total, limit)
		}
		total += k
	}
	rate, use := float64(total)/time.Since(start).Seconds(), cpu.stop(total)
	// Every row taken was marked sent: a mark that changed nothing would
	// make a ceiling look faster than it is.
	if sent := countWhere(b, db, "status = 1"); sent != total {
		b.Fatalf("%s %s: %d rows sent, want the %d taken", d, c, sent, total)
	}
	return rate, use
}

// ---------------------------------------------------------------------------
// The relay.

type relayRun struct {
	instances int           // relay.Relay values, distinct InstanceIDs (1: one)
	delay     time.Duration // added to every Publish
	limit     int           // stop after this many rows were received (0: all)
	keys      int           // distinct keys of the backlog (0: -keys)
}

type relayResult struct {
	rate      float64 // rows/s
	claimMean float64 // ms per Claim call that leased rows
	claimMax  float64 // ms, the slowest of them
	claims    int
	rows      float64 // rows leased per such call
	asked     float64 // rows asked for per such call
	extends   int     // ExtendLease calls of the heartbeat
	cpu       cpuUse  // of the drain
}

// timedDriver times the Claim calls of the relay (calls that leased no
// row are not counted: they are the idle polls).
type timedDriver struct {
	driver.Driver
	mu     sync.Mutex
	n      int
	total  time.Duration
	max    time.Duration
	rows   int // rows those calls leased
	asked  int // rows they asked for (ClaimParams.Limit)
	extend int // ExtendLease calls of the heartbeat (not the start-up probe of row 0)
}

func (t *timedDriver) Claim(ctx context.Context, p driver.ClaimParams) ([]driver.Row, error) {
	t0 := time.Now()
	rows, err := t.Driver.Claim(ctx, p)
	d := time.Since(t0)
	if len(rows) > 0 {
		t.mu.Lock()
		t.n++
		t.total += d
		t.max = max(t.max, d)
		t.rows += len(rows)
		t.asked += p.Limit
		t.mu.Unlock()
	}
	return rows, err
}

func (t *timedDriver) ExtendLease(ctx context.Context, owner string, ids []int64, lease time.Duration) (int64, error) {
	// Relay.Run first probes the table with a lease extension of row 0,
	// which no row has.
	if len(ids) != 1 || ids[0] != 0 {
		t.mu.Lock()
		t.extend++
		t.mu.Unlock()
	}
	return t.Driver.ExtendLease(ctx, owner, ids, lease)
}

// benchDriver is the relay's driver on db: pgxdriver over a pool of its
// own on PostgreSQL with -pgx, sqldriver otherwise.
func benchDriver(b *testing.B, db *sql.DB, d string) driver.Driver {
	if d == "postgres" && *flagPgx {
		var name string
		if err := db.QueryRow("SELECT current_database()").Scan(&name); err != nil {
			b.Fatal(err)
		}
		cfg, err := pgxpool.ParseConfig(os.Getenv("OUTBOXGEN_TEST_POSTGRES_DSN"))
		if err != nil {
			b.Fatal(err)
		}
		cfg.ConnConfig.Database = name // db's fresh database
		pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(pool.Close)
		drv, err := pgxdriver.New(pool, testdb.Schema(dialect.Postgres))
		if err != nil {
			b.Fatal(err)
		}
		return drv
	}
	drv, err := sqldriver.New(db, testdb.Schema(dialect.Dialect(d)))
	if err != nil {
		b.Fatal(err)
	}
	return drv
}

// runRelay fills a fresh database of dialect d with n pending rows and
// drains them (or the first rr.limit) with rr.instances relays with the
// default configuration, publishing to one GoChannel.
func runRelay(b *testing.B, srv *servers, d string, n int, rr relayRun) relayResult {
	db := freshOutbox(b, d)
	srv.fill(b)
	if rr.keys > 0 {
		defer withKeys(rr.keys)()
	}
	fillBacklog(b, db, d, n)
	want := n
	if rr.limit > 0 && rr.limit < n {
		want = rr.limit
	}
	s := newSink(b, want)
	pub := s.publisher(rr.delay)
	var timed []*timedDriver
	var relays []*relay.Relay
	for i := range max(rr.instances, 1) {
		drv := benchDriver(b, db, d)
		td := &timedDriver{Driver: drv}
		timed = append(timed, td)
		r, err := relay.New(td, relay.Config{Publisher: pub, InstanceID: fmt.Sprintf("bench-%d", i), Logger: discard})
		if err != nil {
			b.Fatal(err)
		}
		relays = append(relays, r)
	}
	srv.measure(b)
	runs := make([]func(context.Context) error, len(relays))
	for i, r := range relays {
		runs[i] = r.Run
	}
	cpu := startCPU()
	start, stop := background(b, "relay", runs...)
	s.wait(b, 30*time.Minute)
	if want == n {
		waitDrained(b, db, time.Minute)
	}
	dur := time.Since(start)
	use := cpu.stop(want)
	stop()
	if s.dups > 0 {
		b.Logf("%d duplicate deliveries", s.dups)
	}
	res := relayResult{rate: float64(want) / dur.Seconds(), cpu: use}
	var total, mx time.Duration
	var rows, asked int
	for _, td := range timed {
		res.claims += td.n
		total += td.total
		mx = max(mx, td.max)
		rows += td.rows
		asked += td.asked
		res.extends += td.extend
	}
	if res.claims > 0 {
		res.claimMean = float64(total.Microseconds()) / 1000 / float64(res.claims)
		res.claimMax = float64(mx.Microseconds()) / 1000
		res.rows = float64(rows) / float64(res.claims)
		res.asked = float64(asked) / float64(res.claims)
	}
	return res
}

// ---------------------------------------------------------------------------
// watermill-sql + watermill Forwarder, configured as watermill documents
// it (components/forwarder, watermill-sql's schema and offsets adapters of
// the dialect, all defaults).

func watermillAdapters(d string) (wsql.SchemaAdapter, wsql.OffsetsAdapter) {
	if d == "mysql" {
		return wsql.DefaultMySQLSchema{}, wsql.DefaultMySQLOffsetsAdapter{}
	}
	return wsql.DefaultPostgreSQLSchema{}, wsql.DefaultPostgreSQLOffsetsAdapter{}
}

func runWatermill(b *testing.B, srv *servers, d string, n int, delay time.Duration) (float64, cpuUse) {
	db := testdb.Open(b, d)
	logger := watermill.NopLogger{}
	schema, offsets := watermillAdapters(d)
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
	srv.fill(b)
	fillWatermill(b, db, d, schema, n)

	s := newSink(b, n)
	pub := s.publisher(delay)
	fwd, err := forwarder.NewForwarder(sub, pub, logger, forwarder.Config{ForwarderTopic: fwdTopic})
	if err != nil {
		b.Fatal(err)
	}
	srv.measure(b)
	cpu := startCPU()
	start, stop := background(b, "forwarder", fwd.Run)
	s.wait(b, 30*time.Minute)
	dur := time.Since(start)
	use := cpu.stop(n)
	stop()
	_ = fwd.Close()
	if s.dups > 0 {
		b.Logf("%d duplicate deliveries", s.dups)
	}
	return float64(n) / dur.Seconds(), use
}

// fillWatermill writes n messages the way an application using watermill's
// forwarder does: a watermill-sql Publisher on the business transaction,
// wrapped in forwarder.NewPublisher, one message per transaction; 8
// writers in parallel. Then the table's statistics are refreshed, as for
// ours.
func fillWatermill(b *testing.B, db *sql.DB, d string, schema wsql.SchemaAdapter, n int) {
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
	q := `VACUUM ANALYZE "watermill_` + fwdTopic + `"`
	if d == "mysql" {
		q = "ANALYZE TABLE `watermill_" + fwdTopic + "`"
	}
	if _, err := db.ExecContext(ctx, q); err != nil {
		b.Fatalf("%s: %v", q, err)
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
