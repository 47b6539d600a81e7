package pgxdriver_test

import (
	"context"
	"database/sql"
	"fmt"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"

	"github.com/outboxgen/outboxgen/internal/testdb"
	"github.com/outboxgen/outboxgen/runtime/dialect"
	"github.com/outboxgen/outboxgen/runtime/driver"
	"github.com/outboxgen/outboxgen/runtime/driver/drivertest"
	"github.com/outboxgen/outboxgen/runtime/driver/pgxdriver"
	"github.com/outboxgen/outboxgen/templates"
)

// openPgx returns a pgx driver on a fresh database with the schema
// applied, its pool, and a database/sql handle on the same database.
func openPgx(t *testing.T) (*pgxdriver.Driver, *pgxpool.Pool, *sql.DB) {
	t.Helper()
	pool := testdb.PgxPool(t)
	db := stdlib.OpenDBFromPool(pool)
	t.Cleanup(func() { db.Close() })
	testdb.ApplySchema(t, db, "postgres", templates.DefaultTables)
	drv, err := pgxdriver.New(pool, testdb.Schema(dialect.Postgres))
	if err != nil {
		t.Fatal(err)
	}
	return drv, pool, db
}

// TestConformance runs the driver conformance suite on a pgx pool.
func TestConformance(t *testing.T) {
	drivertest.Run(t, func(t *testing.T) drivertest.Env {
		drv, _, db := openPgx(t)
		return drivertest.Env{Driver: drv, DB: db}
	})
}

// The claim is planned once per connection: PostgreSQL switches a
// prepared statement to its generic plan only when that plan is as cheap
// as planning for each call, which it is not when the limit is bound (the
// generic plan then guesses a tenth of the table and joins it back by a
// sequential scan). The limit is therefore written into the text
// (dialect: asLiteral), and after a few claims the connection runs the
// cached generic plan.
func TestClaimUsesGenericPlan(t *testing.T) {
	ctx := context.Background()
	base := testdb.PgxPool(t)
	cfg := base.Config()
	cfg.MaxConns = 1 // the claims and pg_prepared_statements on one session
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	db := stdlib.OpenDBFromPool(base)
	defer db.Close()
	testdb.ApplySchema(t, db, "postgres", templates.DefaultTables)
	if _, err := db.ExecContext(ctx, `INSERT INTO outbox_event (event_id, biz_type, biz_id, topic, payload)
SELECT gen_random_uuid(), 'ORDER_PAID', 'k' || g, 'orders', '{}' FROM generate_series(1, 5000) g`); err != nil {
		t.Fatal(err)
	}
	if _, err := db.ExecContext(ctx, "ANALYZE outbox_event"); err != nil {
		t.Fatal(err)
	}
	drv, err := pgxdriver.New(pool, testdb.Schema(dialect.Postgres))
	if err != nil {
		t.Fatal(err)
	}
	for i := range 10 {
		rows, err := drv.Claim(ctx, driver.ClaimParams{Owner: "r1", Lease: time.Minute, Limit: 50})
		if err != nil || len(rows) != 50 {
			t.Fatalf("claim %d: %d rows, %v", i, len(rows), err)
		}
	}
	wantGenericPlan(t, pool, "WITH cand AS MATERIALIZED%", "the claim")

	// The claim from a front likewise, and its generic plan starts its
	// read of the due index at the position (an index condition), not at
	// the first entry.
	var res driver.ClaimResult
	if _, err := drv.Claim(ctx, driver.ClaimParams{Owner: "r1", Lease: time.Minute, Limit: 50, Front: true, Result: &res}); err != nil || res.Front.IsZero() {
		t.Fatalf("claim: front %+v, %v", res.Front, err)
	}
	for i := range 10 {
		rows, err := drv.Claim(ctx, driver.ClaimParams{Owner: "r1", Lease: time.Minute, Limit: 50, From: res.Front})
		if err != nil || len(rows) != 50 {
			t.Fatalf("claim %d from the front: %d rows, %v", i, len(rows), err)
		}
	}
	wantGenericPlan(t, pool, "WITH cand AS MATERIALIZED%(c.next_retry_time, c.id) >=%", "the claim from a front")
	q, err := dialect.NewRelayQueries(dialect.Postgres, "outbox_event", nil)
	if err != nil {
		t.Fatal(err)
	}
	query, args := q.ClaimFrom("r1", time.Minute, 50, time.Minute, 0, 500*time.Millisecond, res.Front.DueMicros, res.Front.ID, 0, 0)
	conn, err := pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	if _, err := conn.Exec(ctx, "PREPARE claim_from AS "+query); err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Exec(ctx, "SET plan_cache_mode = force_generic_plan"); err != nil {
		t.Fatal(err)
	}
	rs, err := conn.Query(ctx, "EXPLAIN EXECUTE claim_from("+literals(args)+")")
	plan := readPlan(t, rs, err)
	// The candidates' scan and the front's: each a scan of the due index
	// whose condition is the position.
	re := regexp.MustCompile(`Scan using outbox_event_due_idx on outbox_event \w+ [^\n]*\n\s+Index Cond: \([^\n]*ROW\(next_retry_time, id\) >= ROW\(`)
	if n := len(re.FindAllString(plan, -1)); n != 2 {
		t.Errorf("the generic plan of the claim from a front reads the due index from the position in %d scans, want 2 (candidates and front):\n%s", n, plan)
	}

	// A claim of one stripe of the keys likewise, planned for its
	// arguments or not: were the stripe taken for a condition few rows
	// meet, the candidates would be read by a scan of the whole table,
	// then sorted.
	query, args = q.ClaimFrom("r1", time.Minute, 50, time.Minute, 0, 500*time.Millisecond, res.Front.DueMicros, res.Front.ID, 2, 1)
	if _, err := conn.Exec(ctx, "PREPARE claim_stripe AS "+query); err != nil {
		t.Fatal(err)
	}
	for _, mode := range []string{"force_custom_plan", "force_generic_plan"} {
		if _, err := conn.Exec(ctx, "SET plan_cache_mode = "+mode); err != nil {
			t.Fatal(err)
		}
		rs, err := conn.Query(ctx, "EXPLAIN EXECUTE claim_stripe("+literals(args)+")")
		plan := readPlan(t, rs, err)
		if n := len(re.FindAllString(plan, -1)); n != 2 {
			t.Errorf("the plan (%s) of the claim of one stripe from a front reads the due index from the position in %d scans, want 2 (candidates and front):\n%s", mode, n, plan)
		}
	}
}

// literals returns args as SQL literals, comma-separated (for EXECUTE).
func literals(args []any) string {
	lits := make([]string, len(args))
	for i, a := range args {
		switch v := a.(type) {
		case string:
			lits[i] = "'" + v + "'"
		default:
			lits[i] = fmt.Sprint(v)
		}
	}
	return strings.Join(lits, ", ")
}

// readPlan returns the lines of an EXPLAIN's result rs (err: its
// error), one per line.
func readPlan(t *testing.T, rs pgx.Rows, err error) string {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
	defer rs.Close()
	var plan strings.Builder
	for rs.Next() {
		var line string
		if err := rs.Scan(&line); err != nil {
			t.Fatal(err)
		}
		plan.WriteString(line + "\n")
	}
	if rs.Err() != nil {
		t.Fatal(rs.Err())
	}
	return plan.String()
}

// wantGenericPlan fails t unless the session's prepared statement whose
// text is LIKE like ran its generic plan (after the 10 calls made of it).
func wantGenericPlan(t *testing.T, pool *pgxpool.Pool, like, what string) {
	t.Helper()
	var generic, custom int64
	err := pool.QueryRow(context.Background(), `SELECT generic_plans, custom_plans FROM pg_prepared_statements
WHERE statement LIKE $1`, like).Scan(&generic, &custom)
	if err != nil {
		t.Fatalf("%s is not a prepared statement of the session: %v", what, err)
	}
	if generic < 1 {
		t.Errorf("10 calls of %s: %d generic plans, %d custom plans: it is planned on every call", what, generic, custom)
	}
}

// staleFewKeys fills the outbox with 40,000 pending rows of 4 keys and
// takes the statistics then, as after an outage; then it runs changes
// and vacuums without analyzing (autovacuum off), so that the statistics
// stay those of the full backlog while the indexes hold no entries of the
// rows changed (their cost is another matter, see ClaimParams.From).
func staleFewKeys(t *testing.T, db *sql.DB, changes ...string) {
	t.Helper()
	stmts := append([]string{
		"ALTER TABLE outbox_event SET (autovacuum_enabled = false)",
		`INSERT INTO outbox_event (event_id, biz_type, biz_id, topic, payload)
SELECT gen_random_uuid(), 'ORDER_PAID', 'k' || (g % 4), 'orders', '{}' FROM generate_series(1, 40000) g`,
		"ANALYZE outbox_event",
	}, changes...)
	for _, q := range append(stmts, "VACUUM outbox_event") {
		if _, err := db.ExecContext(context.Background(), q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
}

// explainClaim runs the claim of owner for limit rows under EXPLAIN
// ANALYZE in a transaction it rolls back, and returns the plan.
func explainClaim(t *testing.T, pool *pgxpool.Pool, q *dialect.RelayQueries, owner string, limit int) string {
	t.Helper()
	ctx := context.Background()
	query, args := q.Claim(owner, time.Minute, limit, time.Minute, 30*time.Second)
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	rs, err := tx.Query(ctx, "EXPLAIN (ANALYZE, BUFFERS, COSTS OFF) "+query, args...)
	return readPlan(t, rs, err)
}

var planBuffers = regexp.MustCompile(`Buffers: shared hit=(\d+)(?: read=(\d+))?`)

// planPages returns the buffers the whole statement of an EXPLAIN
// (ANALYZE, BUFFERS) plan touched (its top node).
func planPages(t *testing.T, plan string) int {
	t.Helper()
	m := planBuffers.FindStringSubmatch(plan)
	if m == nil {
		t.Fatalf("no buffer counts in the plan:\n%s", plan)
	}
	var hit, read int
	fmt.Sscan(m[1], &hit)
	if m[2] != "" {
		fmt.Sscan(m[2], &read)
	}
	return hit + read
}

// A backlog of few keys whose statistics were taken while every row was
// pending, as after an outage. Its claims probe each key through the key
// index, not by walking the primary key past the rows sent since (which
// the planner chose with = on the key, expecting a key's rows soon among
// rows it thought pending: 74,000 pages for a claim of 40 rows here, and
// 5.6 million, 20 s, for one that found nothing).
func TestClaimOfFewKeysStaysBounded(t *testing.T) {
	ctx := context.Background()
	drv, pool, db := openPgx(t)
	staleFewKeys(t, db, "UPDATE outbox_event SET status = 1, sent_at = now() WHERE id <= 32000")
	const limit = 40
	q, err := dialect.NewRelayQueries(dialect.Postgres, "outbox_event", nil)
	if err != nil {
		t.Fatal(err)
	}
	explain := func(owner string) string { return explainClaim(t, pool, q, owner, limit) }
	pages := func(plan string) int { return planPages(t, plan) }
	// 8,000 pending rows of 4 keys, 32,000 sent before them. A claim reads
	// its window and probes 4 keys: a few pages per row. Walking the
	// primary key past the sent rows costs hundreds of pages per probe.
	plan := explain("a")
	if strings.Contains(plan, "Index Scan using outbox_event_pkey on outbox_event f") ||
		strings.Contains(plan, "Index Scan using outbox_event_pkey on outbox_event o") ||
		strings.Contains(plan, "Index Only Scan using outbox_event_pkey") {
		t.Errorf("a per-key probe walks the primary key:\n%s", plan)
	}
	if n := pages(plan); n > 40*limit {
		t.Errorf("a claim of %d rows touched %d pages, want at most %d:\n%s", limit, n, 40*limit, plan)
	}
	rows, err := drv.Claim(ctx, driver.ClaimParams{Owner: "a", Lease: time.Minute, Limit: limit})
	if err != nil || len(rows) != limit {
		t.Fatalf("claim: %d rows, %v; want %d", len(rows), err, limit)
	}
	// Every key now has rows in flight: the next claim finds nothing. It
	// reads past the 7,960 rows waiting behind them (and probes their keys
	// through the key index: once per key where PostgreSQL memoizes, once
	// per row at most), not past the sent rows.
	plan = explain("b")
	if !regexp.MustCompile(`(?m)^Update on outbox_event \(actual time=\S+ rows=0 loops=1\)$`).MatchString(plan) {
		t.Errorf("the claim beside the rows in flight leased or held something:\n%s", plan)
	}
	n := pages(plan)
	t.Logf("the claim beside rows in flight touched %d pages", n)
	if n > 4*8000 {
		t.Errorf("the claim beside rows in flight touched %d pages, want at most %d:\n%s", n, 4*8000, plan)
	}
}

// The read of a candidate's nearest older unsent row (prev), made for the
// rows that cannot be leased, under the statistics of TestClaimOfFewKeys-
// StaysBounded: each key's head is FAILED and sits before 32,000 sent
// rows. The claim holds the rows behind the heads, and reads each one's
// prev through the key index: walking the primary key down from the
// candidate reads past every sent row before it finds the head.
func TestClaimHoldOfFewKeysStaysBounded(t *testing.T) {
	_, pool, db := openPgx(t)
	staleFewKeys(t, db,
		"UPDATE outbox_event SET status = 2, retry_count = 5 WHERE id <= 4",
		"UPDATE outbox_event SET status = 1, sent_at = now() WHERE id > 4 AND id <= 32000")
	const limit = 40
	q, err := dialect.NewRelayQueries(dialect.Postgres, "outbox_event", nil)
	if err != nil {
		t.Fatal(err)
	}
	plan := explainClaim(t, pool, q, "a", limit)
	if !regexp.MustCompile(`(?m)^Update on outbox_event \(actual time=\S+ rows=40 loops=1\)$`).MatchString(plan) {
		t.Errorf("the claim did not hold the %d rows behind the FAILED heads:\n%s", limit, plan)
	}
	if strings.Contains(plan, "using outbox_event_pkey on outbox_event p ") {
		t.Errorf("the read of prev walks the primary key:\n%s", plan)
	}
	// 1,200 pages here; 36,500 when prev walked the primary key.
	if n := planPages(t, plan); n > 60*limit {
		t.Errorf("a claim holding %d rows touched %d pages, want at most %d:\n%s", limit, n, 60*limit, plan)
	}
}
