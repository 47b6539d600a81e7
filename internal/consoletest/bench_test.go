package consoletest

// BenchmarkConsolePages times each console page through the real handler
// over HTTP, on PostgreSQL and MariaDB tables of 1,000,000 sent, 10,000
// pending (a quarter of them held back behind FAILED heads of their keys)
// and 1,000 FAILED rows, plus an inbox of 100,000 handled events and 5,000
// duplicate deliveries:
//
//	eval "$(scripts/testdb.sh start)"
//	go test ./internal/consoletest -run '^$' -bench ConsolePages -benchtime 20x
//
// Seeding takes a minute or two, once: the tables live in a database of
// their own, outboxgen_consolebench, on each server, reused by later runs
// while the seed and outboxgen's DDL are unchanged (its consolebench_seed
// table records the seed's version and a hash of the DDL). -consolebench.reseed
// drops and seeds it again; to remove it for good:
//
//	psql "$OUTBOXGEN_TEST_POSTGRES_DSN" -c 'DROP DATABASE outboxgen_consolebench'
//	mariadb -h 127.0.0.1 -P 33069 -u outboxgen -poutboxgen -e 'DROP DATABASE outboxgen_consolebench'

import (
	"crypto/sha256"
	"database/sql"
	"encoding/hex"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/cookiejar"
	"net/http/httptest"
	"net/url"
	"os"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/outboxgen/outboxgen/internal/testdb"
	"github.com/outboxgen/outboxgen/runtime/admin"
	"github.com/outboxgen/outboxgen/runtime/console"
	"github.com/outboxgen/outboxgen/runtime/dialect"
	"github.com/outboxgen/outboxgen/runtime/driver/sqldriver"
	"github.com/outboxgen/outboxgen/runtime/outbox"
	"github.com/outboxgen/outboxgen/templates"
)

var reseed = flag.Bool("consolebench.reseed", false, "drop the outboxgen_consolebench databases and seed them again")

// The big table's shape.
const (
	benchDB      = "outboxgen_consolebench"
	benchSent    = 1000000
	benchFailed  = 1000
	benchPending = 10000
	benchKeys    = 4000 // keys k0..k3999, round robin over the rows
	benchInbox   = 100000
	benchDups    = 5000
	// seedVersion changes when the seed does: an older database is
	// seeded again.
	seedVersion = 1
)

// benchOpen returns the bench database of dialect d, creating and seeding
// it when it is missing, incomplete or of another seed version.
func benchOpen(b *testing.B, d string) *sql.DB {
	b.Helper()
	var server, dsn, driverName string
	switch d {
	case "postgres":
		base := os.Getenv(testdb.PostgresEnv)
		if base == "" {
			b.Skipf("%s is not set: run eval \"$(scripts/testdb.sh start)\"", testdb.PostgresEnv)
		}
		u, err := url.Parse(base)
		if err != nil {
			b.Fatal(err)
		}
		server, driverName = base, "pgx"
		u.Path = "/" + benchDB
		dsn = u.String()
	case "mysql":
		base := os.Getenv(testdb.MySQLEnv)
		if base == "" {
			b.Skipf("%s is not set: run eval \"$(scripts/testdb.sh start)\"", testdb.MySQLEnv)
		}
		cfg, err := mysql.ParseDSN(base)
		if err != nil {
			b.Fatal(err)
		}
		driverName = "mysql"
		cfg.DBName = ""
		server = cfg.FormatDSN()
		cfg.DBName = benchDB
		dsn = cfg.FormatDSN()
	}
	srv, err := sql.Open(driverName, server)
	if err != nil {
		b.Fatal(err)
	}
	defer srv.Close()
	exists := func() bool {
		var n int
		q := "SELECT COUNT(*) FROM pg_database WHERE datname = $1"
		if d == "mysql" {
			q = "SELECT COUNT(*) FROM information_schema.schemata WHERE schema_name = ?"
		}
		if err := srv.QueryRow(q, benchDB).Scan(&n); err != nil {
			b.Fatal(err)
		}
		return n > 0
	}
	drop := func() {
		q := "DROP DATABASE IF EXISTS " + benchDB
		if d == "postgres" {
			q += " WITH (FORCE)"
		}
		if _, err := srv.Exec(q); err != nil {
			b.Fatal(err)
		}
	}
	if *reseed {
		drop()
	}
	if exists() {
		db, err := sql.Open(driverName, dsn)
		if err != nil {
			b.Fatal(err)
		}
		var v int
		var hash string
		if err := db.QueryRow("SELECT version, ddl FROM consolebench_seed").Scan(&v, &hash); err == nil && v == seedVersion && hash == ddlHash(b, d) {
			b.Logf("%s: reusing database %s (seeded before; -consolebench.reseed seeds it again)", d, benchDB)
			return db
		}
		db.Close()
		b.Logf("%s: database %s is incomplete, of another seed version or of older DDL: seeding it again", d, benchDB)
		drop()
	}
	create := "CREATE DATABASE " + benchDB
	if d == "mysql" {
		create += " CHARACTER SET utf8mb4 COLLATE utf8mb4_bin"
	}
	if _, err := srv.Exec(create); err != nil {
		b.Fatal(err)
	}
	db, err := sql.Open(driverName, dsn)
	if err != nil {
		b.Fatal(err)
	}
	start := time.Now()
	testdb.ApplySchema(b, db, d, templates.DefaultTables)
	seedBench(b, db, d)
	b.Logf("%s: seeded %s in %s", d, benchDB, time.Since(start).Round(time.Second))
	return db
}

// seedBench fills the outbox: sent rows 10 ms apart (the newest a second
// ago), then the FAILED rows, then the pending ones; the types and topics
// rotate, keys round robin over benchKeys, so a quarter of the pending
// rows share a key with a FAILED row older than them (held back). Then the
// inbox and its duplicates, and the marker table.
func seedBench(b *testing.B, db *sql.DB, d string) {
	b.Helper()
	total := benchSent + benchFailed + benchPending
	var stmts []string
	switch d {
	case "postgres":
		stmts = []string{
			fmt.Sprintf(`INSERT INTO outbox_event (event_id, biz_type, biz_id, topic, payload, headers, status, retry_count, created_at, updated_at, sent_at, last_error)
SELECT gen_random_uuid(), (ARRAY['ORDER_PAID','STOCK_RESERVED','POINTS_CREDITED'])[g %% 3 + 1], 'k' || (g %% %[4]d),
  (ARRAY['orders.paid','stock.reserved','points.credited'])[g %% 3 + 1],
  jsonb_build_object('order_id', 'o-' || g, 'amount_cents', g %% 100000, 'currency', 'EUR'), '{"traceparent":"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"}',
  CASE WHEN g <= %[1]d THEN 1 WHEN g <= %[1]d + %[2]d THEN 2 ELSE 0 END,
  CASE WHEN g > %[1]d AND g <= %[1]d + %[2]d THEN 5 ELSE 0 END,
  now() - (%[3]d - g) * interval '10 milliseconds' - interval '1 second',
  now() - (%[3]d - g) * interval '10 milliseconds',
  CASE WHEN g <= %[1]d THEN now() - (%[3]d - g) * interval '10 milliseconds' END,
  CASE WHEN g > %[1]d AND g <= %[1]d + %[2]d THEN
    CASE WHEN g %% 2 = 0 THEN 'sending message failed: nats: no response from stream' ELSE 'kafka: topic authorization failed' END END
FROM generate_series(1, %[3]d) g`, benchSent, benchFailed, total, benchKeys),
			fmt.Sprintf(`INSERT INTO outbox_inbox (consumer, event_id, biz_type, biz_id, processed_at)
SELECT (ARRAY['points','billing','search'])[g %% 3 + 1], gen_random_uuid()::text, 'ORDER_PAID', 'k' || (g %% %[2]d),
  now() - (%[1]d - g) * interval '30 milliseconds'
FROM generate_series(1, %[1]d) g`, benchInbox, benchKeys),
			fmt.Sprintf(`INSERT INTO outbox_inbox_duplicate (consumer, event_id, biz_type, biz_id, count, first_seen_at, last_seen_at)
SELECT (ARRAY['points','billing','search'])[g %% 3 + 1], gen_random_uuid()::text, 'ORDER_PAID', 'k' || (g %% %[2]d), 1 + g %% 4,
  now() - (%[1]d - g) * interval '600 milliseconds' - interval '1 minute', now() - (%[1]d - g) * interval '600 milliseconds'
FROM generate_series(1, %[1]d) g`, benchDups, benchKeys),
			"ANALYZE outbox_event", "ANALYZE outbox_inbox", "ANALYZE outbox_inbox_duplicate",
		}
	case "mysql":
		stmts = []string{
			fmt.Sprintf(`INSERT INTO outbox_event (event_id, biz_type, biz_id, topic, payload, headers, status, retry_count, created_at, updated_at, sent_at, last_error)
SELECT UUID(), ELT(seq %% 3 + 1, 'ORDER_PAID', 'STOCK_RESERVED', 'POINTS_CREDITED'), CONCAT('k', seq %% %[4]d),
  ELT(seq %% 3 + 1, 'orders.paid', 'stock.reserved', 'points.credited'),
  JSON_OBJECT('order_id', CONCAT('o-', seq), 'amount_cents', seq %% 100000, 'currency', 'EUR'), '{"traceparent":"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"}',
  CASE WHEN seq <= %[1]d THEN 1 WHEN seq <= %[1]d + %[2]d THEN 2 ELSE 0 END,
  CASE WHEN seq > %[1]d AND seq <= %[1]d + %[2]d THEN 5 ELSE 0 END,
  CURRENT_TIMESTAMP(6) - INTERVAL ((%[3]d - seq) * 10 + 1000) * 1000 MICROSECOND,
  CURRENT_TIMESTAMP(6) - INTERVAL (%[3]d - seq) * 10000 MICROSECOND,
  CASE WHEN seq <= %[1]d THEN CURRENT_TIMESTAMP(6) - INTERVAL (%[3]d - seq) * 10000 MICROSECOND END,
  CASE WHEN seq > %[1]d AND seq <= %[1]d + %[2]d THEN
    CASE WHEN seq %% 2 = 0 THEN 'sending message failed: nats: no response from stream' ELSE 'kafka: topic authorization failed' END END
FROM seq_1_to_%[3]d`, benchSent, benchFailed, total, benchKeys),
			fmt.Sprintf(`INSERT INTO outbox_inbox (consumer, event_id, biz_type, biz_id, processed_at)
SELECT ELT(seq %% 3 + 1, 'points', 'billing', 'search'), UUID(), 'ORDER_PAID', CONCAT('k', seq %% %[2]d),
  CURRENT_TIMESTAMP(6) - INTERVAL (%[1]d - seq) * 30000 MICROSECOND
FROM seq_1_to_%[1]d`, benchInbox, benchKeys),
			fmt.Sprintf(`INSERT INTO outbox_inbox_duplicate (consumer, event_id, biz_type, biz_id, count, first_seen_at, last_seen_at)
SELECT ELT(seq %% 3 + 1, 'points', 'billing', 'search'), UUID(), 'ORDER_PAID', CONCAT('k', seq %% %[2]d), 1 + seq %% 4,
  CURRENT_TIMESTAMP(6) - INTERVAL (%[1]d - seq) * 600000 MICROSECOND - INTERVAL 1 MINUTE,
  CURRENT_TIMESTAMP(6) - INTERVAL (%[1]d - seq) * 600000 MICROSECOND
FROM seq_1_to_%[1]d`, benchDups, benchKeys),
			"ANALYZE TABLE outbox_event, outbox_inbox, outbox_inbox_duplicate",
		}
	}
	stmts = append(stmts, "CREATE TABLE consolebench_seed (version int NOT NULL, ddl varchar(64) NOT NULL)",
		fmt.Sprintf("INSERT INTO consolebench_seed VALUES (%d, '%s')", seedVersion, ddlHash(b, d)))
	for _, s := range stmts {
		rows, err := db.Query(s) // ANALYZE TABLE returns rows on MariaDB
		if err != nil {
			b.Fatalf("seed: %v\n%s", err, s)
		}
		rows.Close()
	}
}

// ddlHash is a hash of outboxgen's DDL for dialect d: a bench database
// created from other DDL (a migration since) is seeded again.
func ddlHash(b *testing.B, d string) string {
	b.Helper()
	ddl, err := templates.Render(d, templates.DefaultTables)
	if err != nil {
		b.Fatal(err)
	}
	sum := sha256.Sum256(ddl)
	return hex.EncodeToString(sum[:16])
}

// benchPage is one page to time: a path, or a POST form, and a marker
// its body must hold.
type benchPage struct {
	name, path string
	post       url.Values
	want       string
}

func BenchmarkConsolePages(b *testing.B) {
	for _, d := range []string{"postgres", "mysql"} {
		b.Run(d, func(b *testing.B) {
			db := benchOpen(b, d)
			defer db.Close()
			drv, err := sqldriver.New(db, outbox.Schema{Tables: testdb.Tables, Dialects: []outbox.Dialect{dialect.Dialect(d)}})
			if err != nil {
				b.Fatal(err)
			}
			a, err := admin.New(drv)
			if err != nil {
				b.Fatal(err)
			}
			h, err := console.New(console.Config{Admin: a, Database: benchDB, Logger: slog.New(slog.DiscardHandler)})
			if err != nil {
				b.Fatal(err)
			}
			srv := httptest.NewServer(h)
			defer srv.Close()
			c := newBenchClient(b, srv.URL)

			var failedID int64
			var failedEventID, failedKey string
			if err := db.QueryRow("SELECT id, event_id, biz_id FROM outbox_event WHERE status = 2 ORDER BY id LIMIT 1 OFFSET 500").Scan(&failedID, &failedEventID, &failedKey); err != nil {
				b.Fatal(err)
			}
			var sentEventID string
			if err := db.QueryRow("SELECT event_id FROM outbox_event WHERE id = 500000").Scan(&sentEventID); err != nil {
				b.Fatal(err)
			}
			// A later page: follow "Next page" from the first page 5 times.
			later := "failed"
			for range 5 {
				later = c.nextPage(later)
			}
			csrf := c.csrf("failed")
			pages := []benchPage{
				{name: "overview", path: "", want: `id="count-failed"`},
				{name: "overview-fragment", path: "?fragment=overview", want: `id="count-failed"`},
				{name: "failed", path: "failed", want: `tr data-id=`},
				{name: "failed-filtered", path: "failed?type=STOCK_RESERVED&error=authorization", want: `tr data-id=`},
				{name: "failed-page-6", path: later, want: `tr data-id=`},
				{name: "event", path: fmt.Sprintf("events/%d", failedID), want: `id="event-status"`},
				{name: "search-key", path: "search?q=" + url.QueryEscape(failedKey), want: `tr data-id=`},
				{name: "search-event-id", path: "search?q=" + sentEventID, want: sentEventID},
				{name: "blocked", path: "blocked", want: `tr data-key=`},
				{name: "inbox", path: "inbox", want: `tr data-consumer=`},
				{name: "inbox-duplicates", path: "inbox?consumer=points", want: `tr data-event-id=`},
				{name: "confirm-requeue-all", path: "actions/requeue", post: url.Values{"csrf": {csrf}, "scope": {"matching"}, "back": {"failed"}}, want: `id="confirm-text"`},
			}
			for _, p := range pages {
				body := c.do(p)
				if !strings.Contains(body, p.want) {
					b.Fatalf("%s (/%s): the page lacks %q:\n%.2000s", p.name, p.path, p.want, body)
				}
				b.Run(p.name, func(b *testing.B) {
					for b.Loop() {
						c.do(p)
					}
					b.ReportMetric(float64(b.Elapsed().Microseconds())/1000/float64(b.N), "ms/page")
				})
			}
		})
	}
}

// benchClient requests the console's pages with a session cookie.
type benchClient struct {
	b    *testing.B
	base string
	c    *http.Client
}

func newBenchClient(b *testing.B, base string) *benchClient {
	jar, err := cookiejar.New(nil)
	if err != nil {
		b.Fatal(err)
	}
	return &benchClient{b: b, base: base + "/", c: &http.Client{Jar: jar, Timeout: time.Minute}}
}

// do requests p and returns its body, failing unless the status is 200.
func (c *benchClient) do(p benchPage) string {
	c.b.Helper()
	var resp *http.Response
	var err error
	if p.post != nil {
		resp, err = c.c.PostForm(c.base+p.path, p.post)
	} else {
		resp, err = c.c.Get(c.base + p.path)
	}
	if err != nil {
		c.b.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		c.b.Fatal(err)
	}
	if resp.StatusCode != http.StatusOK {
		c.b.Fatalf("%s /%s: %s\n%.2000s", p.name, p.path, resp.Status, body)
	}
	return string(body)
}

var (
	nextRe = regexp.MustCompile(`id="next-page" href="([^"]+)"`)
	csrfRe = regexp.MustCompile(`name="csrf" value="([^"]+)"`)
)

// nextPage returns the path of the page after path.
func (c *benchClient) nextPage(path string) string {
	c.b.Helper()
	m := nextRe.FindStringSubmatch(c.do(benchPage{name: "next", path: path}))
	if m == nil {
		c.b.Fatalf("/%s has no next page", path)
	}
	return strings.TrimPrefix(htmlUnescape(m[1]), "/")
}

// csrf returns the form token of the session on the page at path.
func (c *benchClient) csrf(path string) string {
	c.b.Helper()
	m := csrfRe.FindStringSubmatch(c.do(benchPage{name: "csrf", path: path}))
	if m == nil {
		c.b.Fatalf("/%s has no csrf field", path)
	}
	return htmlUnescape(m[1])
}

// htmlUnescape undoes html/template's escaping of an attribute value.
func htmlUnescape(s string) string {
	return strings.NewReplacer("&amp;", "&", "&#43;", "+", "&#34;", `"`, "&#39;", "'", "&lt;", "<", "&gt;", ">").Replace(s)
}
