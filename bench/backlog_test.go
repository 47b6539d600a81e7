package bench

// BenchmarkClaimBacklog: does a claim cost more when the backlog is
// bigger? For a backlog of N pending rows (1,000 keys, written by one
// statement: every row shares next_retry_time), the relay's storage
// driver claims 100 rows and marks them sent, 300 times (30,000 rows, no
// broker); the mean time per claim and per batch is reported, beside the
// raw ceiling a1 (SELECT ... FOR UPDATE SKIP LOCKED, UPDATE to sent,
// COMMIT) on the same backlog, in the same run. PostgreSQL and MariaDB.
//
//	go test ./bench -run '^$' -bench BenchmarkClaimBacklog -benchtime 1x

import (
	"context"
	"database/sql"
	"fmt"
	"testing"
	"time"

	"github.com/outboxgen/outboxgen/internal/testdb"
	"github.com/outboxgen/outboxgen/runtime/dialect"
	"github.com/outboxgen/outboxgen/runtime/driver"
	"github.com/outboxgen/outboxgen/runtime/driver/sqldriver"
	"github.com/outboxgen/outboxgen/runtime/relay"
)

func BenchmarkClaimBacklog(b *testing.B) {
	const batches, batch = 300, 100
	srv := openServers(b)
	for _, d := range []string{"postgres", "mysql"} {
		for _, n := range []int{100_000, 1_000_000} {
			b.Run(fmt.Sprintf("%s/backlog=%d", d, n), func(b *testing.B) {
				var claimMS, batchMS, rawMS float64
				for b.Loop() {
					db := freshOutbox(b, d)
					srv.fill(b)
					fillBacklog(b, db, d, n)
					srv.measure(b)
					drv, err := sqldriver.New(db, testdb.Schema(dialect.Dialect(d)))
					if err != nil {
						b.Fatal(err)
					}
					ctx := context.Background()
					var claimDur time.Duration
					start := time.Now()
					for range batches {
						n, took := claimAndMark(b, ctx, drv, "sql-only", batch)
						claimDur += took
						if n != batch {
							b.Fatalf("claim: %d rows, want %d", n, batch)
						}
					}
					total := time.Since(start)
					claimMS = float64(claimDur.Microseconds()) / 1000 / batches
					batchMS = float64(total.Microseconds()) / 1000 / batches

					// a1 on the same backlog (the rows left).
					start = time.Now()
					for range batches {
						a1Batch(b, ctx, db, d, batch)
					}
					rawMS = float64(time.Since(start).Microseconds()) / 1000 / batches
				}
				b.ReportMetric(claimMS, "ms/claim")
				b.ReportMetric(batchMS, "ms/batch")
				b.ReportMetric(rawMS, "ms/a1-batch")
				b.ReportMetric(rawMS/batchMS, "x_a1")
			})
		}
	}
}

// a1Batch is the raw ceiling a1 for one batch (see ceilingBatchOnce).
func a1Batch(b *testing.B, ctx context.Context, db *sql.DB, d string, batch int) {
	if batch != ceilingBatch {
		b.Fatalf("a1 claims %d rows per batch, not %d", ceilingBatch, batch)
	}
	if _, err := ceilingBatchOnce(ctx, db, d, a1, ""); err != nil {
		b.Fatalf("a1: %v", err)
	}
}

// claimAndMark claims up to limit rows with the relay's storage driver and
// marks them sent, as the relay does with nothing to publish; it returns
// how many rows it claimed and how long the claim took.
func claimAndMark(b *testing.B, ctx context.Context, drv driver.Driver, owner string, limit int) (int, time.Duration) {
	return claimAndMarkWith(b, ctx, drv, driver.ClaimParams{Owner: owner, Lease: relay.DefaultLeaseDuration, Limit: limit})
}

// claimAndMarkWith is claimAndMark with the claim's parameters p.
func claimAndMarkWith(b *testing.B, ctx context.Context, drv driver.Driver, p driver.ClaimParams) (int, time.Duration) {
	owner := p.Owner
	t0 := time.Now()
	rows, err := drv.Claim(ctx, p)
	took := time.Since(t0)
	if err != nil {
		b.Fatalf("claim: %v", err)
	}
	if len(rows) == 0 {
		return 0, took
	}
	ids := make([]int64, len(rows))
	for i, r := range rows {
		ids[i] = r.ID
	}
	if _, err := drv.MarkSent(ctx, owner, ids); err != nil {
		b.Fatalf("mark sent: %v", err)
	}
	return len(rows), took
}

// BenchmarkClaimFront: claims that read from the start of the due index
// against claims that read from the front of the previous one
// (driver.ClaimParams.From), as the relay does while a backlog drains. On
// a fresh PostgreSQL table of -bigrows pending rows (1,000 keys), the
// relay's storage driver claims 100 rows and marks them sent until
// -bigdrain rows are sent, once each way, on fresh tables, in one run; it
// reports the mean ms per claim over the first and the last tenth of the
// drain, and per batch (claim + mark) over all of it. Every row sent
// leaves a dead entry at the start of the due index until VACUUM (the
// drain runs faster than autovacuum comes), which claims from the start
// read past.
//
//	go test ./bench -run '^$' -bench BenchmarkClaimFront -benchtime 1x
func BenchmarkClaimFront(b *testing.B) {
	const batch = 100
	srv := openServers(b)
	defer srv.restore(b)
	batches := max(*flagBigPart/batch, 20)
	tenth := batches / 10
	for _, from := range []bool{false, true} {
		name := "start"
		if from {
			name = "front"
		}
		b.Run(name, func(b *testing.B) {
			var first, last, per float64
			for b.Loop() {
				db := freshOutbox(b, "postgres")
				srv.fill(b)
				fillBacklog(b, db, "postgres", *flagBigRows)
				srv.measure(b)
				drv := benchDriver(b, db, "postgres")
				ctx := context.Background()
				var pos driver.ScanPos
				var firstDur, lastDur time.Duration
				start := time.Now()
				for i := range batches {
					var res driver.ClaimResult
					p := driver.ClaimParams{Owner: "front-bench", Lease: relay.DefaultLeaseDuration, Limit: batch, Result: &res}
					if from {
						p.Front, p.From = true, pos
					}
					n, took := claimAndMarkWith(b, ctx, drv, p)
					if n != batch {
						b.Fatalf("claim %d: %d rows, want %d", i, n, batch)
					}
					pos = res.Front
					switch {
					case i < tenth:
						firstDur += took
					case i >= batches-tenth:
						lastDur += took
					}
				}
				per = float64(time.Since(start).Microseconds()) / 1000 / float64(batches)
				first = float64(firstDur.Microseconds()) / 1000 / float64(tenth)
				last = float64(lastDur.Microseconds()) / 1000 / float64(tenth)
			}
			b.ReportMetric(first, "ms/claim-first-tenth")
			b.ReportMetric(last, "ms/claim-last-tenth")
			b.ReportMetric(per, "ms/batch")
		})
	}
}
