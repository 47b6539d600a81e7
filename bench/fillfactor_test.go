package bench

// BenchmarkFillfactor: what a lower fillfactor of the PostgreSQL outbox
// table buys and costs. The relay writes every row three times (insert,
// lease, mark as sent); the lease changes no indexed column, so with free
// space on its page it is a HOT update (no new index entries). For each
// fillfactor, ten rounds of: insert 20,000 pending rows (-keys keys, 1,000 by default),
// drain them with the relay's storage driver (claim 100 + mark sent, as
// in BenchmarkClaimBacklog, durable settings), VACUUM. Reported: the
// drain's ms per batch, the share of leases that were HOT, and the heap
// and index sizes holding the 200,000 sent rows at the end (what the
// janitor's retention keeps). It reads the HOT count from
// pg_stat_user_tables, exact from PostgreSQL 15 on (before 15 the
// statistics collector may drop reports, and the wait for them fails).
//
//	go test ./bench -run '^$' -bench BenchmarkFillfactor -benchtime 1x

import (
	"context"
	"database/sql"
	"fmt"
	"strconv"
	"testing"
	"time"

	"github.com/outboxgen/outboxgen/internal/testdb"
	"github.com/outboxgen/outboxgen/runtime/dialect"
	"github.com/outboxgen/outboxgen/runtime/driver/sqldriver"
)

// setFillfactor sets the fillfactor of the PostgreSQL outbox table.
func setFillfactor(b *testing.B, db *sql.DB, ff int) {
	b.Helper()
	if _, err := db.Exec("ALTER TABLE outbox_event SET (fillfactor = " + strconv.Itoa(ff) + ")"); err != nil {
		b.Fatalf("set fillfactor %d: %v", ff, err)
	}
}

func BenchmarkFillfactor(b *testing.B) {
	const rounds, perRound, batch = 10, 20_000, 100
	srv := openServers(b)
	if srv.pg == nil {
		b.Skipf("%s is not set", testdb.PostgresEnv)
	}
	for _, ff := range []int{100, 50} {
		b.Run(fmt.Sprintf("fillfactor=%d", ff), func(b *testing.B) {
			var batchMS, hot, heapMB, indexMB float64
			for b.Loop() {
				db := freshOutbox(b, "postgres")
				setFillfactor(b, db, ff)
				drv, err := sqldriver.New(db, testdb.Schema(dialect.Postgres))
				if err != nil {
					b.Fatal(err)
				}
				ctx := context.Background()
				var drain time.Duration
				batches := 0
				for range rounds {
					srv.fill(b)
					fillBacklog(b, db, "postgres", perRound)
					srv.measure(b)
					start := time.Now()
					for {
						if n, _ := claimAndMark(b, ctx, drv, "ff", batch); n == 0 {
							break
						}
						batches++
					}
					drain += time.Since(start)
				}
				srv.fill(b)
				analyze(b, db, "postgres")
				if n := countWhere(b, db, "status = 1"); n != rounds*perRound {
					b.Fatalf("%d rows sent, want %d", n, rounds*perRound)
				}
				// A session reports its statistics when it ends (or idle,
				// at most once a second): end the pool's sessions, then wait
				// until every lease and mark is counted.
				db.SetMaxIdleConns(0)
				db.SetMaxIdleConns(2)
				var hotUpd, upd, heap, index int64
				deadline := time.Now().Add(30 * time.Second)
				for upd < 2*rounds*perRound {
					if time.Now().After(deadline) {
						b.Fatalf("pg_stat_user_tables counts %d updates, want %d", upd, 2*rounds*perRound)
					}
					time.Sleep(100 * time.Millisecond)
					if err := db.QueryRow(`SELECT n_tup_hot_upd, n_tup_upd, pg_relation_size('outbox_event'), pg_indexes_size('outbox_event')
						FROM pg_stat_user_tables WHERE relname = 'outbox_event'`).Scan(&hotUpd, &upd, &heap, &index); err != nil {
						b.Fatal(err)
					}
				}
				batchMS = float64(drain.Microseconds()) / 1000 / float64(batches)
				hot = 100 * float64(hotUpd) / float64(rounds*perRound) // the marks are never HOT: status is indexed
				heapMB = float64(heap) / 1e6
				indexMB = float64(index) / 1e6
			}
			b.ReportMetric(batchMS, "ms/batch")
			b.ReportMetric(hot, "%hot_leases")
			b.ReportMetric(heapMB, "heap_MB")
			b.ReportMetric(indexMB, "index_MB")
		})
	}
	srv.restore(b)
}
