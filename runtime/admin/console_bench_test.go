package admin_test

// BenchmarkConsole measures what the console (issue 14) asks of a big
// table on PostgreSQL and MariaDB: by default 1,000,000 sent, 10,000
// pending (some leased to 3 relays, some backing off, some held behind
// FAILED heads) and 1,000 FAILED rows in the outbox; 1,000,000 inbox rows
// of 10 consumers over two days and 100,000 rows of the duplicate record.
// Seeding takes a while; it runs only under -bench (-console.rows changes
// the number of sent rows and of inbox rows).

import (
	"context"
	"database/sql"
	"flag"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/outboxgen/outboxgen/internal/testdb"
	"github.com/outboxgen/outboxgen/runtime/admin"
	"github.com/outboxgen/outboxgen/runtime/dialect"
	"github.com/outboxgen/outboxgen/runtime/driver"
	"github.com/outboxgen/outboxgen/runtime/driver/sqldriver"
	"github.com/outboxgen/outboxgen/runtime/outbox"
	"github.com/outboxgen/outboxgen/templates"
)

var (
	consoleRows    = flag.Int("console.rows", 1000000, "sent rows (and inbox rows) BenchmarkConsole seeds")
	consoleExplain = flag.Bool("console.explain", false, "BenchmarkConsole logs the plan of each console statement (EXPLAIN ANALYZE)")
)

const (
	consolePending = 10000
	consoleFailed  = 1000
	consoleKeys    = 4000 // keys of the outbox rows: 'k' || (n % consoleKeys)
)

// seedConsole fills the outbox: sent rows 10 ms apart (the newest now),
// then the FAILED rows, then the pending ones (whose keys meet the FAILED
// rows' keys: some are held back); leases and backoff on some pending
// rows; the inbox and its duplicate record.
func seedConsole(b *testing.B, db *sql.DB, d string, sent int) {
	b.Helper()
	total := sent + consoleFailed + consolePending
	var stmts []string
	switch d {
	case "postgres":
		stmts = []string{
			fmt.Sprintf(`INSERT INTO outbox_event (event_id, biz_type, biz_id, topic, payload, status, retry_count, created_at, sent_at, last_error)
SELECT gen_random_uuid(), 'ORDER_PAID', 'k' || (g %% %[3]d), 'orders', '{"n":1}',
  CASE WHEN g <= %[1]d THEN 1 WHEN g <= %[1]d + %[4]d THEN 2 ELSE 0 END,
  CASE WHEN g > %[1]d AND g <= %[1]d + %[4]d THEN 5 ELSE 0 END,
  now() - (%[2]d - g) * interval '10 milliseconds' - interval '1 second',
  CASE WHEN g <= %[1]d THEN now() - (%[2]d - g) * interval '10 milliseconds' END,
  CASE WHEN g > %[1]d AND g <= %[1]d + %[4]d THEN 'broker refused topic' END
FROM generate_series(1, %[2]d) g`, sent, total, consoleKeys, consoleFailed),
			`INSERT INTO outbox_inbox (consumer, event_id, biz_type, biz_id, processed_at)
SELECT 'consumer-' || (g % 10), 'e-' || g, 'ORDER_PAID', 'k' || (g % 40000), now() - (` + strconv.Itoa(sent) + ` - g) * interval '170 milliseconds'
FROM generate_series(1, ` + strconv.Itoa(sent) + `) g`,
			`INSERT INTO outbox_inbox_duplicate (consumer, event_id, biz_type, biz_id, count, first_seen_at, last_seen_at)
SELECT 'consumer-' || (g % 10), 'e-' || (g * 10), 'ORDER_PAID', 'k' || (g % 40000), 1 + g % 3,
  now() - (100000 - g) * interval '1700 milliseconds', now() - (100000 - g) * interval '1700 milliseconds'
FROM generate_series(1, 100000) g`,
		}
	case "mysql":
		stmts = []string{
			fmt.Sprintf(`INSERT INTO outbox_event (event_id, biz_type, biz_id, topic, payload, status, retry_count, created_at, sent_at, last_error)
SELECT UUID(), 'ORDER_PAID', CONCAT('k', seq %% %[3]d), 'orders', '{"n":1}',
  CASE WHEN seq <= %[1]d THEN 1 WHEN seq <= %[1]d + %[4]d THEN 2 ELSE 0 END,
  CASE WHEN seq > %[1]d AND seq <= %[1]d + %[4]d THEN 5 ELSE 0 END,
  CURRENT_TIMESTAMP(6) - INTERVAL ((%[2]d - seq) * 10 + 1000) * 1000 MICROSECOND,
  CASE WHEN seq <= %[1]d THEN CURRENT_TIMESTAMP(6) - INTERVAL (%[2]d - seq) * 10000 MICROSECOND END,
  CASE WHEN seq > %[1]d AND seq <= %[1]d + %[4]d THEN 'broker refused topic' END
FROM seq_1_to_%[2]d`, sent, total, consoleKeys, consoleFailed),
			`INSERT INTO outbox_inbox (consumer, event_id, biz_type, biz_id, processed_at)
SELECT CONCAT('consumer-', seq % 10), CONCAT('e-', seq), 'ORDER_PAID', CONCAT('k', seq % 40000), CURRENT_TIMESTAMP(6) - INTERVAL (` + strconv.Itoa(sent) + ` - seq) * 170000 MICROSECOND
FROM seq_1_to_` + strconv.Itoa(sent),
			`INSERT INTO outbox_inbox_duplicate (consumer, event_id, biz_type, biz_id, count, first_seen_at, last_seen_at)
SELECT CONCAT('consumer-', seq % 10), CONCAT('e-', seq * 10), 'ORDER_PAID', CONCAT('k', seq % 40000), 1 + seq % 3,
  CURRENT_TIMESTAMP(6) - INTERVAL (100000 - seq) * 1700000 MICROSECOND, CURRENT_TIMESTAMP(6) - INTERVAL (100000 - seq) * 1700000 MICROSECOND
FROM seq_1_to_100000`,
		}
	default:
		b.Fatalf("BenchmarkConsole seeds PostgreSQL and MariaDB only, not %s", d)
	}
	// Pending rows: every 20th leased to one of 3 relays (relay-2's
	// leases lapsed), every 50th backing off after a failed publish.
	firstPending := sent + consoleFailed
	stmts = append(stmts,
		fmt.Sprintf("UPDATE outbox_event SET lease_owner = CONCAT('relay-', id %% 3), lease_expires_at = %s WHERE id > %d AND id %% 20 = 0",
			map[string]string{"postgres": "now() + interval '30 seconds'", "mysql": "CURRENT_TIMESTAMP(6) + INTERVAL 30 SECOND"}[d], firstPending),
		fmt.Sprintf("UPDATE outbox_event SET lease_expires_at = %s WHERE lease_owner = 'relay-2'",
			map[string]string{"postgres": "now() - interval '5 minutes'", "mysql": "CURRENT_TIMESTAMP(6) - INTERVAL 5 MINUTE"}[d]),
		fmt.Sprintf("UPDATE outbox_event SET retry_count = 2, next_retry_time = %s, last_error = 'timeout' WHERE id > %d AND id %% 50 = 1 AND lease_owner IS NULL",
			map[string]string{"postgres": "now() + interval '10 minutes'", "mysql": "CURRENT_TIMESTAMP(6) + INTERVAL 10 MINUTE"}[d], firstPending),
	)
	for _, s := range stmts {
		if _, err := db.Exec(s); err != nil {
			b.Fatalf("seed: %v\n%s", err, s)
		}
	}
	for _, t := range []string{"outbox_event", "outbox_inbox", "outbox_inbox_duplicate"} {
		s := "ANALYZE " + t
		if d == "mysql" {
			s = "ANALYZE TABLE " + t
		}
		if _, err := db.Exec(s); err != nil {
			b.Fatalf("%s: %v", s, err)
		}
	}
}

func BenchmarkConsole(b *testing.B) {
	for _, d := range []string{"postgres", "mysql"} {
		b.Run(d, func(b *testing.B) {
			db := testdb.Open(b, d)
			testdb.ApplySchema(b, db, d, templates.DefaultTables)
			seedConsole(b, db, d, *consoleRows)
			drv, err := sqldriver.New(db, outbox.Schema{Tables: outbox.Tables{Outbox: "outbox_event", Inbox: "outbox_inbox"}, Dialects: []outbox.Dialect{dialect.Dialect(d)}})
			if err != nil {
				b.Fatal(err)
			}
			a, err := admin.New(drv)
			if err != nil {
				b.Fatal(err)
			}
			ctx := context.Background()
			st, err := a.Status(ctx, admin.StatusOptions{})
			if err != nil {
				b.Fatal(err)
			}
			failed, err := a.Find(ctx, driver.Failed, admin.Filter{}, 0, 50)
			if err != nil || len(failed) == 0 {
				b.Fatalf("Find failed: %d, %v", len(failed), err)
			}
			relays, err := a.Relays(ctx)
			if err != nil {
				b.Fatal(err)
			}
			keys, err := a.BlockedKeys(ctx, "", 50)
			if err != nil || len(keys) == 0 {
				b.Fatalf("BlockedKeys: %d keys, %v", len(keys), err)
			}
			consumers, err := a.Inbox(ctx, 0)
			if err != nil {
				b.Fatal(err)
			}
			b.Logf("%s: pending %d, failed %d, held back %d rows of %d keys; %d relays; first blocked-keys page %d; %d consumers (capped %v)",
				d, st.Pending, st.Failed, st.HeldBackRows, st.HeldBackKeys, len(relays), len(keys), len(consumers), len(consumers) > 0 && consumers[0].Capped)
			if *consoleExplain {
				explainConsole(b, db, d, keys[0].Key)
			}
			head := failed[len(failed)/2]
			// A key with sent, FAILED and pending rows, and one that has none.
			key := head.Key
			cases := []struct {
				name string
				f    func() error
			}{
				{"Status", func() error { _, err := a.Status(ctx, admin.StatusOptions{}); return err }},
				{"Relays", func() error { _, err := a.Relays(ctx); return err }},
				{"BlockedKeys", func() error { _, err := a.BlockedKeys(ctx, "", 50); return err }},
				{"BlockedKeysPage2", func() error { _, err := a.BlockedKeys(ctx, keys[max(len(keys)-1, 0)].Key, 50); return err }},
				{"InboxConsumers", func() error { _, err := a.Inbox(ctx, 0); return err }},
				{"RecentDuplicates", func() error { _, err := a.RecentDuplicates(ctx, "consumer-3", 50); return err }},
				{"FindFailedPage", func() error { _, err := a.Find(ctx, driver.Failed, admin.Filter{}, 0, 50); return err }},
				{"FindFailedPage2", func() error {
					_, err := a.Find(ctx, driver.Failed, admin.Filter{}, failed[len(failed)-1].ID, 50)
					return err
				}},
				{"FindFailedByError", func() error {
					_, err := a.Find(ctx, driver.Failed, admin.Filter{ErrorContains: "refused"}, 0, 50)
					return err
				}},
				{"GetByID", func() error { _, err := a.Get(ctx, strconv.FormatInt(head.ID, 10)); return err }},
				{"GetByEventID", func() error { _, err := a.Get(ctx, head.EventID); return err }},
				{"SearchKey", func() error { _, err := a.Find(ctx, -1, admin.Filter{Keys: []string{key}}, 0, 50); return err }},
				{"SearchKeyMissing", func() error {
					_, err := a.Find(ctx, -1, admin.Filter{Keys: []string{"no-such-key"}}, 0, 50)
					return err
				}},
			}
			for _, c := range cases {
				b.Run(c.name, func(b *testing.B) {
					for b.Loop() {
						if err := c.f(); err != nil {
							b.Fatal(err)
						}
					}
				})
			}
		})
	}
}

// explainConsole logs the plan of every statement the console adds, and
// of the Overview statements, with the time each took on the server.
func explainConsole(b *testing.B, db *sql.DB, d, key string) {
	b.Helper()
	aq, err := dialect.NewAdminQueries(dialect.Dialect(d), "outbox_event", "outbox_inbox")
	if err != nil {
		b.Fatal(err)
	}
	oq, err := dialect.NewOpsQueries(dialect.Dialect(d), "outbox_event", "outbox_inbox")
	if err != nil {
		b.Fatal(err)
	}
	type stmt struct {
		name string
		q    string
		args []any
	}
	var stmts []stmt
	add := func(name, q string, args []any) { stmts = append(stmts, stmt{name, q, args}) }
	q, args := aq.Leases(admin.MaxRelays)
	add("Leases", q, args)
	q, args = aq.BlockedKeys(nil, "", 50)
	add("BlockedKeys", q, args)
	q, args = aq.InboxHandled(admin.DefaultInboxWindow, admin.InboxScanRows)
	add("InboxHandled", q, args)
	q, args = aq.InboxDuplicates(admin.DefaultInboxWindow, admin.InboxScanRows)
	add("InboxDuplicates", q, args)
	q, args = aq.RecentDuplicates("consumer-3", 50)
	add("RecentDuplicates", q, args)
	q, args = oq.DeleteInboxDuplicates(7*24*time.Hour, 1000)
	add("DeleteInboxDuplicates (nothing old)", q, args)
	q, args, err = aq.FindEvents(dialect.EventFilter{Status: -1, Keys: []string{key}, Limit: 50})
	if err != nil {
		b.Fatal(err)
	}
	add("FindEvents by key", q, args)
	q, args, err = aq.FindEvents(dialect.EventFilter{Status: dialect.StatusFailed, Limit: 50})
	if err != nil {
		b.Fatal(err)
	}
	add("FindEvents FAILED", q, args)
	q, args = oq.Stats(10 * time.Minute)
	add("Overview: OpsStats", q, args)
	q, args = aq.PendingStates()
	add("Overview: PendingStates", q, args)
	q, args = aq.FailedGroups(100)
	add("Overview: FailedGroups", q, args)
	q, args = aq.HeldBack(nil)
	add("Overview: HeldBack", q, args)
	var maxID int64
	if err := db.QueryRow("SELECT MAX(id) FROM outbox_event").Scan(&maxID); err != nil {
		b.Fatal(err)
	}
	q, args = aq.SentPerMinute(max(maxID-admin.DefaultScanRows, 0), admin.DefaultWindow)
	add("Overview: SentPerMinute", q, args)
	// The statement as it was before it was tuned, for comparison.
	if d == "mysql" {
		add("Overview: SentPerMinute without FORCE INDEX (PRIMARY)", strings.Replace(q, " FORCE INDEX (PRIMARY)", "", 1), args)
	} else {
		add("Overview: SentPerMinute with EXTRACT (numeric)", strings.NewReplacer(
			"floor(date_part('epoch', now() - sent_at) / 60)::bigint", "floor(EXTRACT(EPOCH FROM (now() - sent_at)) / 60)::bigint",
			"AVG(date_part('epoch', sent_at - created_at))", "AVG(EXTRACT(EPOCH FROM (sent_at - created_at)))::float8",
			"MAX(date_part('epoch', sent_at - created_at))", "MAX(EXTRACT(EPOCH FROM (sent_at - created_at)))::float8").Replace(q), args)
	}
	for _, st := range stmts {
		prefix := "EXPLAIN (ANALYZE, COSTS OFF) "
		if d == "mysql" {
			prefix = "ANALYZE FORMAT=JSON "
		}
		if strings.HasPrefix(st.q, "DELETE") && d == "postgres" {
			prefix = "EXPLAIN (COSTS OFF) " // a plan, not a delete
		}
		rows, err := db.Query(prefix+st.q, st.args...)
		if err != nil {
			b.Fatalf("explain %s: %v", st.name, err)
		}
		var plan strings.Builder
		for rows.Next() {
			var line string
			if err := rows.Scan(&line); err != nil {
				b.Fatal(err)
			}
			plan.WriteString(line + "\n")
		}
		rows.Close()
		b.Logf("%s, %s:\n%s", d, st.name, plan.String())
	}
}
