package sqldriver_test

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/google/uuid"

	"github.com/outboxgen/outboxgen/internal/testdb"
	"github.com/outboxgen/outboxgen/runtime/dialect"
	"github.com/outboxgen/outboxgen/runtime/driver"
	"github.com/outboxgen/outboxgen/runtime/driver/drivertest"
	"github.com/outboxgen/outboxgen/runtime/driver/sqldriver"
	"github.com/outboxgen/outboxgen/runtime/internal/dberr"
	"github.com/outboxgen/outboxgen/templates"
)

// TestConformance runs the driver conformance suite on every dialect.
func TestConformance(t *testing.T) {
	for _, name := range testdb.Dialects() {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			drivertest.Run(t, func(t *testing.T) drivertest.Env {
				db, _, drv := openDriver(t, name)
				return drivertest.Env{Driver: drv, DB: db}
			})
		})
	}
}

// openDriver opens a fresh test database of the dialect named with the
// outbox schema, and a driver on it.
func openDriver(t *testing.T, name string) (*sql.DB, dialect.Dialect, *sqldriver.Driver) {
	t.Helper()
	d, err := dialect.Parse(name)
	if err != nil {
		t.Fatal(err)
	}
	db := testdb.Open(t, name)
	testdb.ApplySchema(t, db, name, templates.DefaultTables)
	drv, err := sqldriver.New(db, testdb.Schema(d))
	if err != nil {
		t.Fatal(err)
	}
	return db, d, drv
}

// On MySQL/MariaDB, a driver whose sessions are not in UTC refuses to
// claim, saying how to fix the DSN; with time_zone '+00:00' it claims.
func TestMySQLTimeZone(t *testing.T) {
	dsn := testdb.DSN(t, "mysql")
	for _, tc := range []struct {
		zone string
		ok   bool
	}{{"'+02:00'", false}, {"'+00:00'", true}} {
		t.Run(tc.zone, func(t *testing.T) {
			cfg, err := mysql.ParseDSN(dsn)
			if err != nil {
				t.Fatal(err)
			}
			cfg.Params = map[string]string{"time_zone": tc.zone}
			db, err := sql.Open("mysql", cfg.FormatDSN())
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { db.Close() })
			if tc.ok {
				testdb.ApplySchema(t, db, "mysql", templates.DefaultTables)
			}
			drv, err := sqldriver.New(db, testdb.Schema(dialect.MySQL))
			if err != nil {
				t.Fatal(err)
			}
			p := driver.ClaimParams{Owner: "tz", Lease: time.Minute, Limit: 10}
			for range 2 { // the verdict is not cached when it fails
				_, err = drv.Claim(context.Background(), p)
				if tc.ok != (err == nil) {
					t.Fatalf("Claim in time zone %s: %v", tc.zone, err)
				}
				if !tc.ok && (!strings.Contains(err.Error(), "time_zone=%27%2B00%3A00%27") || !strings.Contains(err.Error(), "+02:00")) {
					t.Fatalf("error does not tell the fix: %v", err)
				}
			}
		})
	}
}

// On MariaDB, the claim's window reads each key's front (its oldest
// pending row) once per statement, not once per candidate: its per-key
// subqueries name only the candidate's key, so MariaDB's subquery cache
// serves the candidates of a key after the first. Each such read passes
// the delete-marked index entries of the key's rows sent since InnoDB's
// last purge; read per candidate, that made a drain of 10 keys 2.2x
// slower. ANALYZE counts how often each subquery ran, over two keys of
// 100 rows, one of them behind a leased front.
func TestMariaDBWindowReadsKeyFrontsOnce(t *testing.T) {
	db, drv := openMariaDB(t, "no subquery cache, no ANALYZE FORMAT=JSON")
	ctx := context.Background()
	keys := []string{"a", "b"}
	const perKey = 100
	ins := "INSERT INTO " + testdb.Tables.Outbox + " (event_id, biz_type, biz_id, topic, payload) VALUES (UUID(), 'T', ?, 't', '{}')"
	for range perKey {
		for _, k := range keys {
			if _, err := db.ExecContext(ctx, ins, k); err != nil {
				t.Fatal(err)
			}
		}
	}
	// Lease a's front: a's other rows wait behind a row in flight.
	rows, err := drv.Claim(ctx, driver.ClaimParams{Owner: "r1", Lease: time.Hour, Limit: 1})
	if err != nil || len(rows) != 1 || rows[0].Key != "a" {
		t.Fatalf("claim of a's front: %v %v", rows, err)
	}
	q, err := dialect.NewRelayQueries(dialect.MySQL, testdb.Tables.Outbox, nil)
	if err != nil {
		t.Fatal(err)
	}
	query, args := q.ClaimCandidates(2*perKey, 0, nil)
	ids, err := db.QueryContext(ctx, query, args...)
	if err != nil {
		t.Fatal(err)
	}
	got := 0
	for ids.Next() {
		got++
	}
	if err := ids.Close(); err != nil {
		t.Fatal(err)
	}
	if got != perKey {
		t.Fatalf("window: %d candidates, want b's %d rows (a's wait behind its leased front)", got, perKey)
	}

	var out string
	if err := db.QueryRowContext(ctx, "ANALYZE FORMAT=JSON "+query, args...).Scan(&out); err != nil {
		t.Fatal(err)
	}
	var plan struct {
		QueryBlock struct {
			Subqueries []struct {
				Cache struct {
					Block struct {
						Loops int `json:"r_loops"`
					} `json:"query_block"`
				} `json:"expression_cache"`
			} `json:"subqueries"`
		} `json:"query_block"`
	}
	if err := json.Unmarshal([]byte(out), &plan); err != nil {
		t.Fatalf("ANALYZE: %v\n%s", err, out)
	}
	if len(plan.QueryBlock.Subqueries) != 2 {
		t.Fatalf("ANALYZE: want the window's 2 per-key subqueries, each behind the subquery cache:\n%s", out)
	}
	for i, sq := range plan.QueryBlock.Subqueries {
		if n := sq.Cache.Block.Loops; n < 1 || n > len(keys) {
			t.Errorf("per-key subquery %d ran %d times for %d candidates of %d keys, want once per key:\n%s", i+1, n, 2*perKey-1, len(keys), out)
		}
	}
}

// On MySQL/MariaDB, RelayClaimLock reads, for each row it locks, its
// key's oldest pending row outside the candidates it was given, so that
// a batch with several rows of one key is leased without the per-key
// statement (dialect.FreeToLease).
func TestClaimLockProbesOutsideCandidates(t *testing.T) {
	db := testdb.Open(t, "mysql")
	testdb.ApplySchema(t, db, "mysql", templates.DefaultTables)
	ctx := context.Background()
	ins := "INSERT INTO " + testdb.Tables.Outbox + " (event_id, biz_type, biz_id, topic, payload) VALUES (UUID(), 'T', ?, 't', '{}')"
	var ids []int64
	for _, k := range []string{"a", "a", "b", "a"} {
		res, err := db.ExecContext(ctx, ins, k)
		if err != nil {
			t.Fatal(err)
		}
		id, _ := res.LastInsertId()
		ids = append(ids, id)
	}
	a1, a2, b1, a3 := ids[0], ids[1], ids[2], ids[3]
	q, err := dialect.NewRelayQueries(dialect.MySQL, testdb.Tables.Outbox, nil)
	if err != nil {
		t.Fatal(err)
	}
	given := []dialect.Candidate{{ID: a1, Key: "a"}, {ID: a2, Key: "a"}, {ID: b1, Key: "b"}}
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback()
	query, args := q.ClaimLock([]int64{a1, a2, b1}, 10)
	rs, err := tx.QueryContext(ctx, query, args...)
	if err != nil {
		t.Fatal(err)
	}
	var probes []dialect.LockProbe
	for rs.Next() {
		var r driver.Row
		var created any
		var p dialect.LockProbe
		if err := rs.Scan(&r.ID, &r.EventID, &r.Type, &r.Key, &r.Topic, &r.Version, &r.Payload, &r.Headers, &r.RetryCount, &created, &p.OutsideFront, &p.FailedBefore); err != nil {
			t.Fatal(err)
		}
		p.ID, p.Key = r.ID, r.Key
		probes = append(probes, p)
	}
	if err := rs.Err(); err != nil {
		t.Fatal(err)
	}
	want := []dialect.LockProbe{{ID: a1, Key: "a", OutsideFront: a3}, {ID: a2, Key: "a", OutsideFront: a3}, {ID: b1, Key: "b", OutsideFront: b1}}
	if len(probes) != len(want) {
		t.Fatalf("ClaimLock: %+v, want %+v", probes, want)
	}
	for i := range want {
		if probes[i] != want[i] {
			t.Fatalf("ClaimLock: %+v, want %+v", probes, want)
		}
	}
	if !dialect.FreeToLease(given, probes) {
		t.Fatalf("FreeToLease(%+v, %+v) = false: a1 and a2 are locked together, a3 is newer", given, probes)
	}
}

// openMariaDB opens a fresh MySQL test database with the outbox schema
// and a driver on it, and skips the test, saying why (what MySQL lacks),
// unless the server is MariaDB.
func openMariaDB(t *testing.T, why string) (*sql.DB, *sqldriver.Driver) {
	t.Helper()
	db := testdb.Open(t, "mysql")
	var version string
	if err := db.QueryRowContext(context.Background(), "SELECT VERSION()").Scan(&version); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(version, "MariaDB") {
		t.Skipf("%s: %s", version, why)
	}
	testdb.ApplySchema(t, db, "mysql", templates.DefaultTables)
	drv, err := sqldriver.New(db, testdb.Schema(dialect.MySQL))
	if err != nil {
		t.Fatal(err)
	}
	return db, drv
}

// On MariaDB, a claim's window passes over the keys in SkipKeys from the
// due index alone (schema version 3 has biz_id in it: index condition
// pushdown), so a key with a long backlog whose front the relay is
// publishing costs the window no read of its waiting rows. Without the
// keys, the window reads every one of them.
func TestMariaDBWindowSkipsKeysInIndex(t *testing.T) {
	db, drv := openMariaDB(t, "no ANALYZE FORMAT=JSON")
	ctx := context.Background()
	// The hot key's rows first (oldest), then 20 rows each of 10 keys.
	const hot, others = 2000, 200
	ins := "INSERT INTO " + testdb.Tables.Outbox + " (event_id, biz_type, biz_id, topic, payload) SELECT UUID(), 'T', ?, 't', '{}' FROM seq_1_to_%d"
	if _, err := db.ExecContext(ctx, fmt.Sprintf(ins, hot), "hot"); err != nil {
		t.Fatal(err)
	}
	for k := range 10 {
		if _, err := db.ExecContext(ctx, fmt.Sprintf(ins, others/10), fmt.Sprint("k", k)); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := db.ExecContext(ctx, "ANALYZE TABLE "+testdb.Tables.Outbox); err != nil {
		t.Fatal(err)
	}
	rows, err := drv.Claim(ctx, driver.ClaimParams{Owner: "r1", Lease: time.Hour, Limit: 1})
	if err != nil || len(rows) != 1 || rows[0].Key != "hot" {
		t.Fatalf("claim of the hot key's front: %v %v", rows, err)
	}
	q, err := dialect.NewRelayQueries(dialect.MySQL, testdb.Tables.Outbox, nil)
	if err != nil {
		t.Fatal(err)
	}
	// read returns the window's candidates and the rows its read of c
	// examined, as ANALYZE counts them.
	read := func(skip []string) (cands int, examined float64, plan string) {
		query, args := q.ClaimCandidates(others, 0, skip)
		rs, err := db.QueryContext(ctx, query, args...)
		if err != nil {
			t.Fatal(err)
		}
		for rs.Next() {
			cands++
		}
		if err := rs.Close(); err != nil {
			t.Fatal(err)
		}
		if err := db.QueryRowContext(ctx, "ANALYZE FORMAT=JSON "+query, args...).Scan(&plan); err != nil {
			t.Fatal(err)
		}
		var p struct {
			QueryBlock struct {
				NestedLoop []struct {
					Table struct {
						Name  string  `json:"table_name"`
						Key   string  `json:"key"`
						Rows  float64 `json:"r_rows"`
						Loops float64 `json:"r_loops"`
						ICP   string  `json:"index_condition"`
					} `json:"table"`
				} `json:"nested_loop"`
			} `json:"query_block"`
		}
		if err := json.Unmarshal([]byte(plan), &p); err != nil || len(p.QueryBlock.NestedLoop) != 1 || p.QueryBlock.NestedLoop[0].Table.Name != "c" {
			t.Fatalf("ANALYZE: %v: want one read, of c, at the top of the plan:\n%s", err, plan)
		}
		tb := p.QueryBlock.NestedLoop[0].Table
		if tb.Key != testdb.Tables.Outbox+"_due_idx" {
			t.Fatalf("the window reads %q, want the due index:\n%s", tb.Key, plan)
		}
		if skip != nil && !strings.Contains(tb.ICP, "biz_id") {
			t.Fatalf("the keys passed over are not checked in the index (index condition %q):\n%s", tb.ICP, plan)
		}
		return cands, tb.Rows * tb.Loops, plan
	}
	n, all, _ := read(nil)
	if n != others || all < hot {
		t.Fatalf("window without SkipKeys: %d candidates, %.0f rows read; want %d, and every waiting row of the hot key (%d) read", n, all, others, hot-1)
	}
	n, skipped, plan := read([]string{"hot"})
	if n != others || skipped > 2*others {
		t.Fatalf("window passing over the hot key: %d candidates, %.0f rows read; want %d, reading at most %d:\n%s", n, skipped, others, 2*others, plan)
	}
	t.Logf("rows read by the window: %.0f without SkipKeys, %.0f with", all, skipped)
}

// On MySQL/MariaDB the claim names the due index and the per-key index in
// index hints, so a table without either would fail every claim: the
// start-up check says so first, naming the indexes and the DDL that
// creates them.
func TestCheckWantsClaimIndex(t *testing.T) {
	db := testdb.Open(t, "mysql")
	ctx := context.Background()
	testdb.ApplySchema(t, db, "mysql", templates.DefaultTables)
	table := testdb.Tables.Outbox
	for _, ix := range []struct{ name, cols string }{
		{dialect.DueIndex(table), "status, next_retry_time, id, biz_id"},
		{dialect.KeyIndex(table), "biz_id, status, id"},
	} {
		drv, err := sqldriver.New(db, testdb.Schema(dialect.MySQL)) // Check remembers a table found fit
		if err != nil {
			t.Fatal(err)
		}
		if _, err := db.ExecContext(ctx, "ALTER TABLE "+table+" DROP INDEX "+ix.name); err != nil {
			t.Fatal(err)
		}
		err = drv.Check(ctx, driver.Outbox)
		if dberr.Classify(err) != dberr.Missing || !strings.Contains(dberr.Explain(err, dberr.Need{}).Error(), ix.name) {
			t.Fatalf("Check(Outbox) without index %s = %v, want Missing naming it", ix.name, err)
		}
		if _, err := db.ExecContext(ctx, "ALTER TABLE "+table+" ADD INDEX "+ix.name+" ("+ix.cols+")"); err != nil {
			t.Fatal(err)
		}
		if err := drv.Check(ctx, driver.Outbox); err != nil {
			t.Fatalf("Check(Outbox) with index %s back: %v", ix.name, err)
		}
	}
}

// A claim's results are committed apart on MySQL/MariaDB, before the
// claim's transaction (ClaimResult.RecordedApart), and in it elsewhere;
// either way the claim sees them: the row after a key's head just marked
// sent is claimed by the same call, as is a row just released.
func TestClaimRecordsApartOnMySQL(t *testing.T) {
	for _, name := range testdb.Dialects() {
		t.Run(name, func(t *testing.T) {
			db, d, drv := openDriver(t, name)
			ctx := context.Background()
			ins := d.InsertEvent(testdb.Tables.Outbox, false)
			for i, key := range []string{"k", "j", "k", "k"} {
				if _, err := db.ExecContext(ctx, ins, uuid.NewString(), "T", key, "t", 1, fmt.Sprintf(`{"n":%d}`, i), nil); err != nil {
					t.Fatal(err)
				}
			}
			// ids: k 1, 3, 4; j 2.
			claim := func(limit int, rec driver.Results) ([]int64, driver.ClaimResult) {
				t.Helper()
				var res driver.ClaimResult
				p := driver.ClaimParams{Owner: "r", Lease: time.Hour, Limit: limit, Result: &res}
				if !rec.Empty() {
					p.Record = &rec
				}
				rows, err := drv.Claim(ctx, p)
				if err != nil {
					t.Fatalf("claim with %+v: %v", rec, err)
				}
				ids := make([]int64, len(rows))
				for i, r := range rows {
					ids[i] = r.ID
				}
				return ids, res
			}
			if got, _ := claim(2, driver.Results{}); fmt.Sprint(got) != "[1 2]" {
				t.Fatalf("first claim: %v, want [1 2]", got)
			}
			// One statement, on its own on MySQL.
			got, res := claim(1, driver.Results{Sent: []int64{1}})
			if fmt.Sprint(got) != "[3]" || res.Recorded.Sent != 1 || res.RecordedApart != (d == dialect.MySQL) {
				t.Fatalf("claim recording 1 sent: %v, recorded %+v, apart %v; want [3], 1 sent, apart on MySQL only", got, res.Recorded, res.RecordedApart)
			}
			// Two statements: a transaction of their own on MySQL.
			got, res = claim(2, driver.Results{Sent: []int64{3}, Release: []int64{2}})
			if fmt.Sprint(got) != "[2 4]" || res.Recorded.Sent != 1 || res.Recorded.Released != 1 || res.RecordedApart != (d == dialect.MySQL) {
				t.Fatalf("claim recording 3 sent, 2 released: %v, recorded %+v, apart %v; want [2 4], apart on MySQL only", got, res.Recorded, res.RecordedApart)
			}
			if d != dialect.MySQL {
				return
			}
			// A lease that fails after the recording committed: the claim
			// fails, and says the recording stands (row 4 is sent).
			if _, err := db.ExecContext(ctx, ins, uuid.NewString(), "T", "m", "t", 1, `{"n":4}`, nil); err != nil {
				t.Fatal(err)
			}
			if _, err := db.ExecContext(ctx, "CREATE TRIGGER refuse_lease BEFORE UPDATE ON "+testdb.Tables.Outbox+
				" FOR EACH ROW BEGIN IF NEW.lease_owner = 'r' AND OLD.lease_owner IS NULL THEN"+
				" SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = 'lease refused (test)'; END IF; END"); err != nil {
				t.Fatal(err)
			}
			res = driver.ClaimResult{}
			rows, err := drv.Claim(ctx, driver.ClaimParams{Owner: "r", Lease: time.Hour, Limit: 1, Result: &res, Record: &driver.Results{Sent: []int64{4}}})
			if err == nil || !strings.Contains(err.Error(), "lease refused") || len(rows) != 0 {
				t.Fatalf("claim whose lease fails: %d rows, %v; want the trigger's error", len(rows), err)
			}
			if !res.RecordedApart || res.Recorded.Sent != 1 {
				t.Fatalf("claim whose lease fails: recorded %+v, apart %v; want 1 sent, apart", res.Recorded, res.RecordedApart)
			}
			var status int
			var owner sql.NullString
			if err := db.QueryRowContext(ctx, "SELECT status, lease_owner FROM "+testdb.Tables.Outbox+" WHERE id = 4").Scan(&status, &owner); err != nil {
				t.Fatal(err)
			}
			if status != 1 || owner.Valid {
				t.Fatalf("row 4 after the failed claim: status %d, lease_owner %v; want sent, no lease", status, owner)
			}
			if err := db.QueryRowContext(ctx, "SELECT COUNT(*) FROM "+testdb.Tables.Outbox+" WHERE id = 5 AND lease_owner IS NULL AND status = 0").Scan(&status); err != nil || status != 1 {
				t.Fatalf("row 5 after the failed claim: %d unleased pending (%v), want 1", status, err)
			}
		})
	}
}

// On MariaDB, the window reads each candidate's key front through the
// per-key index, whatever the statistics say. A table that grew fast
// can carry statistics from when it was small; with them MariaDB read
// the front's lease (a column the index lacks) by scanning the primary
// key from its start for the key's first pending row, for each key
// whose front another relay was publishing: the tail of a 20,000-row
// drain with one publish in ten failing ran at 120 rows/s, its windows
// taking 40-100 ms each, until ANALYZE TABLE. The subqueries name the
// index (FORCE INDEX). Here the statistics say one key holds every row,
// 5,000 sent rows lie before the pending ones, and every key's front is
// leased to another relay. Before, the two reads went through the claim
// index and the primary key, and examined 299,100 rows.
func TestMariaDBWindowReadsKeyFrontsByIndex(t *testing.T) {
	db, _ := openMariaDB(t, "no ANALYZE FORMAT=JSON")
	ctx := context.Background()
	tb := testdb.Tables.Outbox
	exec := func(q string, args ...any) {
		t.Helper()
		if _, err := db.ExecContext(ctx, q, args...); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	exec("INSERT INTO " + tb + " (event_id, biz_type, biz_id, topic, payload, status, sent_at) SELECT UUID(), 'T', 'old', 't', '{}', 1, NOW(6) FROM seq_1_to_5000")
	const keys, perKey = 50, 20
	for k := range keys {
		exec(fmt.Sprintf("INSERT INTO %s (event_id, biz_type, biz_id, topic, payload) SELECT UUID(), 'T', ?, 't', '{}' FROM seq_1_to_%d", tb, perKey), fmt.Sprint("k", k))
	}
	exec("UPDATE " + tb + " SET lease_owner = 'other', lease_expires_at = NOW(6) + INTERVAL 1 HOUR WHERE id IN (SELECT id FROM (SELECT MIN(id) AS id FROM " + tb + " WHERE status = 0 GROUP BY biz_id) f)")
	// MariaDB's own statistics (the optimizer prefers them to InnoDB's),
	// then made to say one key holds every row; FLUSH TABLES reloads them.
	exec("ANALYZE TABLE " + tb + " PERSISTENT FOR ALL")
	exec("UPDATE mysql.index_stats SET avg_frequency = ? WHERE db_name = DATABASE() AND table_name = ? AND index_name = ? AND prefix_arity IN (1, 2)", 5000+keys*perKey, tb, dialect.KeyIndex(tb))
	exec("FLUSH TABLES " + tb)
	q, err := dialect.NewRelayQueries(dialect.MySQL, tb, nil)
	if err != nil {
		t.Fatal(err)
	}
	query, args := q.ClaimCandidates(2*perKey, 0, nil)
	var plan string
	if err := db.QueryRowContext(ctx, "ANALYZE FORMAT=JSON "+query, args...).Scan(&plan); err != nil {
		t.Fatal(err)
	}
	var v any
	if err := json.Unmarshal([]byte(plan), &v); err != nil {
		t.Fatal(err)
	}
	// Every read of the table f (the key fronts) and the rows it examined.
	var reads []string
	var examined float64
	var walk func(any)
	walk = func(v any) {
		switch v := v.(type) {
		case map[string]any:
			if v["table_name"] == "f" {
				reads = append(reads, fmt.Sprint(v["key"]))
				rows, _ := v["r_rows"].(float64)
				loops, _ := v["r_loops"].(float64)
				examined += rows * loops
			}
			for _, x := range v {
				walk(x)
			}
		case []any:
			for _, x := range v {
				walk(x)
			}
		}
	}
	walk(v)
	if len(reads) != 2 {
		t.Fatalf("want the window's two reads of a key front, found %d:\n%s", len(reads), plan)
	}
	for _, k := range reads {
		if k != dialect.KeyIndex(tb) || examined > 4*keys {
			t.Fatalf("the key fronts are read through %v, examining %.0f rows; want %s, at most %d rows (two per key):\n%s", reads, examined, dialect.KeyIndex(tb), 4*keys, plan)
		}
	}
	t.Logf("key fronts read through %v, %.0f rows examined", reads, examined)
}
