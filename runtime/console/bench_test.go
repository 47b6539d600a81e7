package console_test

// BenchmarkPages times every console page, through the handler over real
// HTTP, on a big outbox table: by default 1,000,000 sent, 10,000 pending
// (a quarter of them held behind FAILED heads) and 1,000 FAILED rows,
// seeded into a throwaway database per dialect (-console.rows changes the
// sent rows). Seeding takes a while; it runs only under -bench:
//
//	go test -run '^$' -bench BenchmarkPages -benchtime 20x ./runtime/console/
//
// To time a table seeded elsewhere (the browser helper's, or a copy of
// production), name its database and table; nothing is seeded or changed
// (the benchmark's actions are dry runs):
//
//	OUTBOXGEN_CONSOLE_BENCH_POSTGRES_DSN=postgres://... \
//	OUTBOXGEN_CONSOLE_BENCH_MYSQL_DSN='u:p@tcp(...)/db?parseTime=true' \
//	OUTBOXGEN_CONSOLE_BENCH_SQLITE_DSN=/path/to/outbox.db \
//	OUTBOXGEN_CONSOLE_BENCH_TABLE=outbox_event go test -run '^$' -bench BenchmarkPages ./runtime/console/

import (
	"context"
	"database/sql"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/outboxgen/outboxgen/internal/testdb"
	"github.com/outboxgen/outboxgen/runtime/admin"
	"github.com/outboxgen/outboxgen/runtime/console"
	"github.com/outboxgen/outboxgen/runtime/driver"
	"github.com/outboxgen/outboxgen/runtime/driver/sqldriver"
	"github.com/outboxgen/outboxgen/runtime/outbox"
	"github.com/outboxgen/outboxgen/templates"
)

var benchRows = flag.Int("console.rows", 1000000, "sent rows BenchmarkPages seeds")

// benchSeed fills table with sent rows 10 ms apart (the newest now),
// then 1,000 FAILED rows (keys k0..k999), then 10,000 pending rows, a
// quarter of them on the FAILED rows' keys (held back).
func benchSeed(b *testing.B, db *sql.DB, d string, sent int) {
	b.Helper()
	const failed, pending = 1000, 10000
	total := sent + failed + pending
	var q string
	switch d {
	case "postgres":
		q = fmt.Sprintf(`INSERT INTO outbox_event (event_id, biz_type, biz_id, topic, payload, status, retry_count, created_at, sent_at, last_error)
SELECT gen_random_uuid(), CASE WHEN g %% 3 = 0 THEN 'STOCK_RESERVED' ELSE 'ORDER_PAID' END,
  CASE WHEN g <= %[1]d THEN 's' || g WHEN g <= %[1]d + %[3]d THEN 'k' || (g - %[1]d) WHEN g %% 4 = 0 THEN 'k' || (g %% %[3]d) ELSE 'p' || g END,
  CASE WHEN g %% 3 = 0 THEN 'stock.reserved' ELSE 'orders.paid' END, '{"order":"o-1","amount":12.5}',
  CASE WHEN g <= %[1]d THEN 1 WHEN g <= %[1]d + %[3]d THEN 2 ELSE 0 END,
  CASE WHEN g > %[1]d AND g <= %[1]d + %[3]d THEN 5 ELSE 0 END,
  now() - (%[2]d - g) * interval '10 milliseconds' - interval '1 second',
  CASE WHEN g <= %[1]d THEN now() - (%[2]d - g) * interval '10 milliseconds' END,
  CASE WHEN g > %[1]d AND g <= %[1]d + %[3]d THEN 'broker refused topic' END
FROM generate_series(1, %[2]d) g`, sent, total, failed)
	case "mysql":
		q = fmt.Sprintf(`INSERT INTO outbox_event (event_id, biz_type, biz_id, topic, payload, status, retry_count, created_at, sent_at, last_error)
SELECT UUID(), CASE WHEN seq %% 3 = 0 THEN 'STOCK_RESERVED' ELSE 'ORDER_PAID' END,
  CASE WHEN seq <= %[1]d THEN CONCAT('s', seq) WHEN seq <= %[1]d + %[3]d THEN CONCAT('k', seq - %[1]d) WHEN seq %% 4 = 0 THEN CONCAT('k', seq %% %[3]d) ELSE CONCAT('p', seq) END,
  CASE WHEN seq %% 3 = 0 THEN 'stock.reserved' ELSE 'orders.paid' END, '{"order":"o-1","amount":12.5}',
  CASE WHEN seq <= %[1]d THEN 1 WHEN seq <= %[1]d + %[3]d THEN 2 ELSE 0 END,
  CASE WHEN seq > %[1]d AND seq <= %[1]d + %[3]d THEN 5 ELSE 0 END,
  CURRENT_TIMESTAMP(6) - INTERVAL ((%[2]d - seq) * 10 + 1000) * 1000 MICROSECOND,
  CASE WHEN seq <= %[1]d THEN CURRENT_TIMESTAMP(6) - INTERVAL (%[2]d - seq) * 10000 MICROSECOND END,
  CASE WHEN seq > %[1]d AND seq <= %[1]d + %[3]d THEN 'broker refused topic' END
FROM seq_1_to_%[2]d`, sent, total, failed)
	default:
		q = fmt.Sprintf(`WITH RECURSIVE g(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM g WHERE x < %[2]d)
INSERT INTO outbox_event (event_id, biz_type, biz_id, topic, payload, status, retry_count, created_at, sent_at, last_error)
SELECT lower(hex(randomblob(16))), CASE WHEN x %% 3 = 0 THEN 'STOCK_RESERVED' ELSE 'ORDER_PAID' END,
  CASE WHEN x <= %[1]d THEN 's' || x WHEN x <= %[1]d + %[3]d THEN 'k' || (x - %[1]d) WHEN x %% 4 = 0 THEN 'k' || (x %% %[3]d) ELSE 'p' || x END,
  CASE WHEN x %% 3 = 0 THEN 'stock.reserved' ELSE 'orders.paid' END, '{"order":"o-1","amount":12.5}',
  CASE WHEN x <= %[1]d THEN 1 WHEN x <= %[1]d + %[3]d THEN 2 ELSE 0 END,
  CASE WHEN x > %[1]d AND x <= %[1]d + %[3]d THEN 5 ELSE 0 END,
  strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now', '-' || ((%[2]d - x) * 0.01 + 1) || ' seconds'),
  CASE WHEN x <= %[1]d THEN strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now', '-' || ((%[2]d - x) * 0.01) || ' seconds') END,
  CASE WHEN x > %[1]d AND x <= %[1]d + %[3]d THEN 'broker refused topic' END
FROM g`, sent, total, failed)
	}
	if _, err := db.Exec(q); err != nil {
		b.Fatalf("seed: %v", err)
	}
	analyze := "ANALYZE outbox_event"
	if d == "mysql" {
		analyze = "ANALYZE TABLE outbox_event"
	}
	if _, err := db.Exec(analyze); err != nil {
		b.Fatalf("%s: %v", analyze, err)
	}
}

// benchDB returns the database and outbox table BenchmarkPages times for
// dialect d: the one the environment names, or a seeded throwaway one.
func benchDB(b *testing.B, d string) (*sql.DB, string) {
	b.Helper()
	table := os.Getenv("OUTBOXGEN_CONSOLE_BENCH_TABLE")
	if table == "" {
		table = templates.DefaultTables.Outbox
	}
	if dsn := os.Getenv("OUTBOXGEN_CONSOLE_BENCH_" + strings.ToUpper(d) + "_DSN"); dsn != "" {
		if d == "sqlite" {
			dsn = testdb.SQLiteDSN(dsn)
		}
		db, err := sql.Open(testdb.Driver(b, d), dsn)
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { db.Close() })
		return db, table
	}
	var db *sql.DB
	if d == "sqlite" {
		var err error
		db, err = sql.Open("sqlite", testdb.SQLiteDSN(filepath.Join(b.TempDir(), "bench.db")))
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { db.Close() })
	} else {
		db = testdb.Open(b, d)
	}
	testdb.ApplySchema(b, db, d, templates.DefaultTables)
	benchSeed(b, db, d, *benchRows)
	return db, templates.DefaultTables.Outbox
}

func BenchmarkPages(b *testing.B) {
	for _, d := range testdb.Dialects() {
		b.Run(d, func(b *testing.B) {
			db, table := benchDB(b, d)
			tables := outbox.Tables{Outbox: table, Inbox: templates.DefaultTables.Inbox}
			drv, err := sqldriver.New(db, testdb.SchemaWith(d, tables))
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
			b.Logf("%s %s: pending %d, FAILED %d, held back %d rows of %d keys", d, table, st.Pending, st.Failed, st.HeldBackRows, st.HeldBackKeys)
			failed, err := a.Find(ctx, driver.Failed, admin.Filter{}, 0, 1)
			if err != nil || len(failed) == 0 {
				b.Fatalf("no FAILED row to time the event page with: %v", err)
			}
			h, err := console.New(console.Config{Admin: a, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
			if err != nil {
				b.Fatal(err)
			}
			c := serve(b, h, "/")
			tok := c.page("failed").csrf(b)
			c.overview(b) // the first read of the send rate (admin-status times it)
			ev := failed[0]
			get := []struct{ name, path string }{
				{"overview", ""},
				{"overview-fragment", "?fragment=overview"},
				{"failed", "failed"},
				{"failed-500", "failed?limit=500"},
				{"failed-filter", "failed?type=ORDER_PAID&error=refused&since=1d"},
				{"failed-page-2", fmt.Sprintf("failed?after=%d", ev.ID+50)},
				{"event", fmt.Sprintf("events/%d", ev.ID)},
				{"blocked", "blocked"},
				{"inbox", "inbox"},
				{"search-key", "search?key=" + url.QueryEscape(ev.Key)},
				{"search-event-id", "search?q=" + ev.EventID},
			}
			// The overview's two reads, alone.
			b.Run("admin-status", func(b *testing.B) {
				for b.Loop() {
					if _, err := a.Status(ctx, admin.StatusOptions{Window: console.DefaultWindow}); err != nil {
						b.Fatal(err)
					}
				}
			})
			b.Run("admin-relays", func(b *testing.B) {
				for b.Loop() {
					if _, err := a.Relays(ctx); err != nil {
						b.Fatal(err)
					}
				}
			})
			for _, g := range get {
				b.Run(g.name, func(b *testing.B) {
					for b.Loop() {
						if code := c.fetch(http.MethodGet, g.path, nil); code != http.StatusOK && code != http.StatusSeeOther {
							b.Fatalf("GET %s: %d\n%s", g.path, code, c.get(g.path).text("main"))
						}
					}
				})
			}
			// The confirmation of "requeue every FAILED event": a dry run
			// over all of them.
			b.Run("confirm-requeue-all", func(b *testing.B) {
				for b.Loop() {
					form := url.Values{"csrf": {tok}, "scope": {"matching"}}
					if code := c.fetch(http.MethodPost, "actions/requeue", form); code != http.StatusOK {
						b.Fatalf("confirm: %d\n%s", code, c.post("actions/requeue", form).text("main"))
					}
				}
			})
		})
	}
}
