package admin_test

// BenchmarkStatus measures Status on a big table: by default 1,000,000
// sent, 10,000 pending (a quarter of them behind 100 FAILED heads) and 100
// FAILED rows, on PostgreSQL, MariaDB and SQLite (make bench; -status.rows
// changes the size). Seeding takes a while; it runs only under -bench.

import (
	"context"
	"database/sql"
	"flag"
	"fmt"
	"path/filepath"
	"testing"

	"github.com/outboxgen/outboxgen/internal/testdb"
	"github.com/outboxgen/outboxgen/runtime/admin"
	"github.com/outboxgen/outboxgen/runtime/dialect"
	"github.com/outboxgen/outboxgen/runtime/driver/sqldriver"
	"github.com/outboxgen/outboxgen/runtime/outbox"
	"github.com/outboxgen/outboxgen/templates"
)

var statusRows = flag.Int("status.rows", 1000000, "sent rows BenchmarkStatus seeds")

// seedStatus fills the outbox with sent rows 10 ms apart (the newest
// now), then 100 FAILED rows, then 10,000 pending rows, some of them
// held back behind the FAILED rows of their keys.
func seedStatus(b *testing.B, db *sql.DB, d string, sent int) {
	b.Helper()
	total := sent + 10000 + 100
	var q string
	switch d {
	case "postgres":
		q = fmt.Sprintf(`INSERT INTO outbox_event (event_id, biz_type, biz_id, topic, payload, status, retry_count, created_at, sent_at, last_error)
SELECT gen_random_uuid(), 'ORDER_PAID', 'k' || (g %% 4000), 'orders', '{"n":1}',
  CASE WHEN g <= %[1]d THEN 1 WHEN g <= %[1]d + 100 THEN 2 ELSE 0 END,
  CASE WHEN g > %[1]d AND g <= %[1]d + 100 THEN 5 ELSE 0 END,
  now() - (%[2]d - g) * interval '10 milliseconds' - interval '1 second',
  CASE WHEN g <= %[1]d THEN now() - (%[2]d - g) * interval '10 milliseconds' END,
  CASE WHEN g > %[1]d AND g <= %[1]d + 100 THEN 'broker refused topic' END
FROM generate_series(1, %[2]d) g`, sent, total)
	case "mysql":
		q = fmt.Sprintf(`INSERT INTO outbox_event (event_id, biz_type, biz_id, topic, payload, status, retry_count, created_at, sent_at, last_error)
SELECT UUID(), 'ORDER_PAID', CONCAT('k', seq %% 4000), 'orders', '{"n":1}',
  CASE WHEN seq <= %[1]d THEN 1 WHEN seq <= %[1]d + 100 THEN 2 ELSE 0 END,
  CASE WHEN seq > %[1]d AND seq <= %[1]d + 100 THEN 5 ELSE 0 END,
  CURRENT_TIMESTAMP(6) - INTERVAL ((%[2]d - seq) * 10 + 1000) * 1000 MICROSECOND,
  CASE WHEN seq <= %[1]d THEN CURRENT_TIMESTAMP(6) - INTERVAL (%[2]d - seq) * 10000 MICROSECOND END,
  CASE WHEN seq > %[1]d AND seq <= %[1]d + 100 THEN 'broker refused topic' END
FROM seq_1_to_%[2]d`, sent, total)
	default:
		q = fmt.Sprintf(`WITH RECURSIVE g(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM g WHERE x < %[2]d)
INSERT INTO outbox_event (event_id, biz_type, biz_id, topic, payload, status, retry_count, created_at, sent_at, last_error)
SELECT lower(hex(randomblob(16))), 'ORDER_PAID', 'k' || (x %% 4000), 'orders', '{"n":1}',
  CASE WHEN x <= %[1]d THEN 1 WHEN x <= %[1]d + 100 THEN 2 ELSE 0 END,
  CASE WHEN x > %[1]d AND x <= %[1]d + 100 THEN 5 ELSE 0 END,
  strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now', '-' || ((%[2]d - x) * 0.01 + 1) || ' seconds'),
  CASE WHEN x <= %[1]d THEN strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now', '-' || ((%[2]d - x) * 0.01) || ' seconds') END,
  CASE WHEN x > %[1]d AND x <= %[1]d + 100 THEN 'broker refused topic' END
FROM g`, sent, total)
	}
	if _, err := db.Exec(q); err != nil {
		b.Fatalf("seed: %v", err)
	}
	for _, s := range []string{"ANALYZE outbox_event", "ANALYZE TABLE outbox_event"} {
		if (s == "ANALYZE outbox_event") == (d != "mysql") {
			if _, err := db.Exec(s); err != nil {
				b.Fatalf("%s: %v", s, err)
			}
		}
	}
}

func BenchmarkStatus(b *testing.B) {
	for _, d := range testdb.Dialects() {
		b.Run(d, func(b *testing.B) {
			var db *sql.DB
			if d == "sqlite" {
				var err error
				db, err = sql.Open("sqlite", testdb.SQLiteDSN(filepath.Join(b.TempDir(), "bench.db")))
				if err != nil {
					b.Fatal(err)
				}
				defer db.Close()
			} else {
				db = testdb.Open(b, d)
			}
			testdb.ApplySchema(b, db, d, templates.DefaultTables)
			seedStatus(b, db, d, *statusRows)
			drv, err := sqldriver.New(db, outbox.Schema{Tables: outbox.Tables{Outbox: "outbox_event", Inbox: "outbox_inbox"}, Dialects: []outbox.Dialect{dialect.Dialect(d)}})
			if err != nil {
				b.Fatal(err)
			}
			a, err := admin.New(drv)
			if err != nil {
				b.Fatal(err)
			}
			st, err := a.Status(context.Background(), admin.StatusOptions{})
			if err != nil {
				b.Fatal(err)
			}
			b.Logf("%s: pending %d, failed %d, held back %d rows of %d keys, sent in the last hour %d (scan bounded)", d, st.Pending, st.Failed, st.HeldBackRows, st.HeldBackKeys, st.SentInWindow)
			for _, count := range []bool{false, true} {
				name := "default"
				if count {
					name = "count-sent"
				}
				b.Run(name, func(b *testing.B) {
					for b.Loop() {
						if _, err := a.Status(context.Background(), admin.StatusOptions{CountSent: count}); err != nil {
							b.Fatal(err)
						}
					}
				})
			}
		})
	}
}
