package observetest

import (
	"context"
	"database/sql"
	"log/slog"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
	tnoop "go.opentelemetry.io/otel/trace/noop"

	"github.com/outboxgen/outboxgen/internal/gentest/sqlevents"
	"github.com/outboxgen/outboxgen/internal/testdb"
	"github.com/outboxgen/outboxgen/runtime/driver/sqldriver"
	"github.com/outboxgen/outboxgen/runtime/relay"
	"github.com/outboxgen/outboxgen/templates"
)

// The overhead of tracing, side by side: "off" is no TracerProvider
// installed (OpenTelemetry's no-op; the writer stores nothing), "recording"
// a recording SDK provider (every span sampled and recorded, exported
// nowhere). Metrics are on in both.
//
//	go test ./internal/observetest -run '^$' -bench . -benchtime 2000x -count 5

func benchTracer(b *testing.B, mode string) trace.TracerProvider {
	if mode == "off" {
		return tnoop.NewTracerProvider()
	}
	tp := sdktrace.NewTracerProvider(sdktrace.WithSampler(sdktrace.AlwaysSample()))
	b.Cleanup(func() { tp.Shutdown(context.Background()) })
	return tp
}

func benchDB(b *testing.B, dialect string) *sql.DB {
	db := testdb.Open(b, dialect)
	testdb.ApplySchema(b, db, dialect, templates.DefaultTables)
	return db
}

// requestContexts returns a function giving the ctx of the next insert: in
// a request span of tp, a fresh one every 100 inserts (the request's own
// span is the application's cost, not the writer's).
func requestContexts(tp trace.TracerProvider) func() context.Context {
	var ctx context.Context
	var span trace.Span
	n := 0
	return func() context.Context {
		if n%100 == 0 {
			if span != nil {
				span.End()
			}
			ctx, span = tp.Tracer("app").Start(context.Background(), "POST /orders")
		}
		n++
		return ctx
	}
}

// BenchmarkWriter: one business transaction per op (begin, the generated
// InsertOrderPaid, commit) on a real database.
func BenchmarkWriter(b *testing.B) {
	for _, d := range []string{"sqlite", "postgres"} {
		for _, mode := range []string{"off", "recording"} {
			b.Run(d+"/"+mode, func(b *testing.B) {
				db := benchDB(b, d)
				w, err := sqlevents.NewWriter(db)
				if err != nil {
					b.Fatal(err)
				}
				next := requestContexts(benchTracer(b, mode))
				e := sqlevents.OrderPaid{OrderID: "o-1", CustomerID: "c-1", AmountCents: 1299, Currency: "EUR", Method: sqlevents.PaymentMethodCard, PaidAt: time.Now().UTC()}
				b.ReportAllocs()
				for b.Loop() {
					ctx := next()
					tx, err := db.BeginTx(ctx, nil)
					if err != nil {
						b.Fatal(err)
					}
					if _, err := w.InsertOrderPaid(ctx, tx, e); err != nil {
						b.Fatal(err)
					}
					if err := tx.Commit(); err != nil {
						b.Fatal(err)
					}
				}
			})
		}
	}
}

// BenchmarkWriterInsert: the generated InsertOrderPaid alone, b.N inserts
// in one open SQLite transaction (no commit per op, so the database's
// fsync does not drown the writer's own cost).
func BenchmarkWriterInsert(b *testing.B) {
	for _, mode := range []string{"off", "recording"} {
		b.Run(mode, func(b *testing.B) {
			db := benchDB(b, "sqlite")
			w, err := sqlevents.NewWriter(db)
			if err != nil {
				b.Fatal(err)
			}
			next := requestContexts(benchTracer(b, mode))
			tx, err := db.BeginTx(context.Background(), nil)
			if err != nil {
				b.Fatal(err)
			}
			defer tx.Rollback()
			e := sqlevents.OrderPaid{OrderID: "o-1", CustomerID: "c-1", AmountCents: 1299, Currency: "EUR", Method: sqlevents.PaymentMethodCard, PaidAt: time.Now().UTC()}
			b.ReportAllocs()
			for b.Loop() {
				if _, err := w.InsertOrderPaid(next(), tx, e); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkRelay: the relay drains b.N rows (written inside request spans
// when recording) into a real in-process broker (watermill GoChannel);
// ns/op is per row.
func BenchmarkRelay(b *testing.B) {
	for _, d := range []string{"sqlite", "postgres"} {
		for _, mode := range []string{"off", "recording"} {
			b.Run(d+"/"+mode, func(b *testing.B) {
				db := benchDB(b, d)
				tp := benchTracer(b, mode)
				w, err := sqlevents.NewWriter(db)
				if err != nil {
					b.Fatal(err)
				}
				next := requestContexts(tp)
				e := sqlevents.OrderPaid{OrderID: "o-1", CustomerID: "c-1", AmountCents: 1299, Currency: "EUR", Method: sqlevents.PaymentMethodCard, PaidAt: time.Now().UTC()}
				for i := 0; i < b.N; i++ {
					ctx := next()
					tx, err := db.BeginTx(ctx, nil)
					if err != nil {
						b.Fatal(err)
					}
					e.OrderID = "o-" + string(rune('a'+i%26))
					if _, err := w.InsertOrderPaid(ctx, tx, e); err != nil {
						b.Fatal(err)
					}
					if err := tx.Commit(); err != nil {
						b.Fatal(err)
					}
				}
				pub := gochannel.NewGoChannel(gochannel.Config{}, watermill.NopLogger{})
				defer pub.Close()
				drv, err := sqldriver.New(db, sqlevents.Schema)
				if err != nil {
					b.Fatal(err)
				}
				mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(sdkmetric.NewManualReader()))
				defer mp.Shutdown(context.Background())
				rl, err := relay.New(drv, relay.Config{
					Publisher: pub, BatchSize: 100,
					TracerProvider: tp, MeterProvider: mp,
					Logger: slog.New(slog.DiscardHandler),
				})
				if err != nil {
					b.Fatal(err)
				}
				b.ReportAllocs()
				b.ResetTimer()
				n, err := rl.RunOnce(context.Background())
				b.StopTimer()
				if err != nil || n != b.N {
					b.Fatalf("published %d of %d: %v", n, b.N, err)
				}
			})
		}
	}
}
