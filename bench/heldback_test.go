package bench

// BenchmarkHeldBack: what rows waiting behind FAILED heads cost the
// others. 500 FAILED heads (keys held-0..499) with H pending rows queued
// behind them; a relay has run over them already (as it would have since
// the heads failed), then 10,000 new rows of 1,000 other keys arrive and
// the relay drains them. The rate is compared with H = 0, in the same run.
// "first" is the same drain when the H rows arrive interleaved with the
// 10,000 and the relay meets them for the first time.
//
//	go test ./bench -run '^$' -bench BenchmarkHeldBack -benchtime 1x

import (
	"context"
	"database/sql"
	"fmt"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"

	"github.com/outboxgen/outboxgen/internal/testdb"
	"github.com/outboxgen/outboxgen/runtime/dialect"
	"github.com/outboxgen/outboxgen/runtime/driver/sqldriver"
	"github.com/outboxgen/outboxgen/runtime/relay"
)

// insertRows inserts n pending rows: key(g) for g in 1..n, in one
// statement, with the ~60-byte payload of payloadJSON(g) (on SQLite, of
// BenchmarkFailing only, random version 4 UUIDs as event ids).
func insertRows(b *testing.B, db *sql.DB, d string, n int, key func(col string) string) {
	b.Helper()
	if n == 0 {
		return
	}
	var q string
	switch d {
	case "postgres":
		q = fmt.Sprintf(`INSERT INTO outbox_event (event_id, biz_type, biz_id, topic, payload_version, payload)
SELECT gen_random_uuid(), 'ORDER_PAID', %s, 'orders', 1,
	json_build_object('order_id', 'order-' || g, 'amount', g %% 1000, 'currency', 'EUR')
FROM generate_series(1, %d) g`, key("g"), n)
	case "mysql":
		q = fmt.Sprintf(`INSERT INTO outbox_event (event_id, biz_type, biz_id, topic, payload_version, payload)
SELECT UUID(), 'ORDER_PAID', %s, 'orders', 1,
	JSON_OBJECT('order_id', CONCAT('order-', seq), 'amount', seq %% 1000, 'currency', 'EUR')
FROM seq_1_to_%d`, key("seq"), n)
	case "sqlite":
		q = fmt.Sprintf(`WITH RECURSIVE s(g) AS (SELECT 1 UNION ALL SELECT g + 1 FROM s WHERE g < %d)
INSERT INTO outbox_event (event_id, biz_type, biz_id, topic, payload_version, payload)
SELECT lower(hex(randomblob(4)) || '-' || hex(randomblob(2)) || '-4' || substr(hex(randomblob(2)), 2) || '-a' || substr(hex(randomblob(2)), 2) || '-' || hex(randomblob(6))),
	'ORDER_PAID', %s, 'orders', 1,
	json_object('order_id', 'order-' || g, 'amount', g %% 1000, 'currency', 'EUR')
FROM s`, n, key("g"))
	}
	if _, err := db.ExecContext(context.Background(), q); err != nil {
		b.Fatalf("insert rows: %v", err)
	}
}

// fillHeads inserts the 500 FAILED heads.
func fillHeads(b *testing.B, db *sql.DB, d string) {
	b.Helper()
	q := `INSERT INTO outbox_event (event_id, biz_type, biz_id, topic, payload_version, payload, status, retry_count, last_error)
SELECT gen_random_uuid(), 'ORDER_PAID', 'held-' || g, 'orders', 1, '{"n":1}', 2, 5, 'broker refused'
FROM generate_series(0, 499) g`
	if d == "mysql" {
		q = `INSERT INTO outbox_event (event_id, biz_type, biz_id, topic, payload_version, payload, status, retry_count, last_error)
SELECT UUID(), 'ORDER_PAID', CONCAT('held-', seq), 'orders', 1, '{"n":1}', 2, 5, 'broker refused'
FROM seq_0_to_499`
	}
	if _, err := db.ExecContext(context.Background(), q); err != nil {
		b.Fatalf("fill heads: %v", err)
	}
}

func concat(d, prefix, expr string) string {
	if d == "mysql" {
		return fmt.Sprintf("CONCAT('%s', %s)", prefix, expr)
	}
	return fmt.Sprintf("'%s' || (%s)", prefix, expr)
}

func analyze(b *testing.B, db *sql.DB, d string) {
	q := "VACUUM ANALYZE outbox_event"
	switch d {
	case "mysql":
		q = "ANALYZE TABLE outbox_event"
	case "sqlite":
		q = "ANALYZE"
	}
	if _, err := db.Exec(q); err != nil {
		b.Fatalf("%s: %v", q, err)
	}
}

func countWhere(b *testing.B, db *sql.DB, where string) int {
	var n int
	if err := db.QueryRow("SELECT count(*) FROM outbox_event WHERE " + where).Scan(&n); err != nil {
		b.Fatal(err)
	}
	return n
}

func BenchmarkHeldBack(b *testing.B) {
	srv := openServers(b)
	for _, d := range []string{"postgres", "mysql"} {
		var base float64
		for _, sc := range []struct {
			held  int
			first bool
		}{{0, false}, {5000, false}, {20000, false}, {50000, false}, {50000, true}} {
			name := fmt.Sprintf("%s/held=%d", d, sc.held)
			if sc.first {
				name += "/first"
			}
			b.Run(name, func(b *testing.B) {
				var rate float64
				for b.Loop() {
					rate = drainHeldBack(b, srv, d, drainable, sc.held, sc.first)
				}
				if sc.held == 0 {
					base = rate
				}
				b.ReportMetric(rate, "rows/s")
				if base > 0 {
					b.ReportMetric(rate/base, "x_clean")
				}
			})
		}
	}
}

// drainHeldBack runs one scenario and returns the drain rate of the
// drainable rows.
func drainHeldBack(b *testing.B, srv *servers, d string, drainable, held int, first bool) float64 {
	db := freshOutbox(b, d)
	srv.fill(b)
	fillHeads(b, db, d)
	drv, err := sqldriver.New(db, testdb.Schema(dialect.Dialect(d)))
	if err != nil {
		b.Fatal(err)
	}
	heldKey := func(g string) string { return concat(d, "held-", g+" % 500") }
	orderKey := func(g string) string { return concat(d, "order-", g+" % 1000") }
	if first {
		// Interleaved: a held-key row every few drainable ones.
		every := max((drainable+held)/max(held, 1), 1)
		insertRows(b, db, d, drainable+held, func(g string) string {
			return fmt.Sprintf("CASE WHEN %[1]s %% %[2]d = 0 AND %[1]s / %[2]d <= %[3]d THEN %[4]s ELSE %[5]s END",
				g, every, held, heldKey(g), orderKey(g))
		})
	} else {
		insertRows(b, db, d, held, heldKey)
		// The relay has seen them before: it held them.
		warm, err := relay.New(drv, relay.Config{Publisher: gochannel.NewGoChannel(gochannel.Config{}, nil), Logger: discard})
		if err != nil {
			b.Fatal(err)
		}
		if _, err := warm.RunOnce(context.Background()); err != nil {
			b.Fatal(err)
		}
		insertRows(b, db, d, drainable, orderKey)
	}
	analyze(b, db, d)
	want := countWhere(b, db, "status = 0 AND biz_id LIKE 'order-%'")
	s := newSink(b, want)
	r, err := relay.New(drv, relay.Config{Publisher: s.pub, Logger: discard})
	if err != nil {
		b.Fatal(err)
	}
	srv.measure(b)
	start, stop := background(b, "relay", r.Run)
	s.wait(b, 10*time.Minute)
	dur := time.Since(start)
	stop()
	if left := countWhere(b, db, "status = 0 AND biz_id LIKE 'held-%'"); left != held {
		b.Fatalf("%d rows pending behind the FAILED heads after the drain, want %d (order broken?)", left, held)
	}
	return float64(want) / dur.Seconds()
}
