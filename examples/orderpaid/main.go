// Command orderpaid is outboxgen's example service: it pays and refunds
// orders, writing ORDER_PAID and ORDER_REFUNDED to the outbox in the same
// transactions; a relay publishes them; a points consumer credits loyalty
// points (and emits POINTS_CREDITED in the same transaction) and an sms
// consumer records texts, both exactly once in effect. It ends with a
// reconciliation table and exits 0 only when every count adds up.
//
// With no flags it needs no servers: a SQLite file (pure Go driver) and
// watermill's in-process GoChannel broker.
//
//	go run ./examples/orderpaid                          # SQLite + GoChannel
//	go run ./examples/orderpaid -chaos                   # publish failures, lost acks, duplicates, relay restart
//	go run ./examples/orderpaid -broker nats-embedded    # NATS JetStream, server started in-process
//	go run ./examples/orderpaid -broker nats://127.0.0.1:4222
//	go run ./examples/orderpaid -db 'postgres://user:pass@127.0.0.1:5432/orderpaid'
//	go run ./examples/orderpaid -db 'mysql://user:pass@tcp(127.0.0.1:3306)/orderpaid'
//
// Flags can also be set from the environment: ORDERPAID_DB, ORDERPAID_DRIVER
// and ORDERPAID_BROKER.
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"time"

	"github.com/outboxgen/outboxgen/runtime/redact"
)

func main() {
	os.Exit(runMain(os.Args[1:], os.Stdout, os.Stderr))
}

// runMain runs the command and returns its exit code: 0 when the run
// reconciled, 1 when it did not or could not start, 2 for a bad command
// line.
func runMain(args []string, stdout, stderr io.Writer) int {
	cfg := Config{Out: stdout, RelaySettings: defaultRelayOptions()}
	fs := flag.NewFlagSet("orderpaid", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&cfg.DB, "db", os.Getenv("ORDERPAID_DB"), "database: a postgres:// URL, a mysql://user:pass@tcp(host:3306)/db DSN, or a SQLite file; empty: a SQLite file in the temp dir, recreated (env ORDERPAID_DB)")
	fs.StringVar(&cfg.Driver, "driver", os.Getenv("ORDERPAID_DRIVER"), "sqlite, postgres or mysql (mariadb), when -db does not tell (env ORDERPAID_DRIVER)")
	fs.StringVar(&cfg.Broker, "broker", envOr("ORDERPAID_BROKER", "gochannel"), "gochannel (in-process), nats-embedded (a NATS server with JetStream in this process) or a nats:// URL (env ORDERPAID_BROKER)")
	fs.BoolVar(&cfg.Reset, "reset", false, "drop the demo's tables first when -db already has them")
	fs.IntVar(&cfg.Orders, "orders", 300, "orders to pay")
	fs.IntVar(&cfg.Customers, "customers", 20, "customers")
	fs.IntVar(&cfg.Workers, "workers", 4, "concurrent payers")
	fs.IntVar(&cfg.Rate, "rate", 200, "payments per second, all payers together (0: as fast as they go)")
	fs.IntVar(&cfg.RefundEvery, "refund-every", 5, "refund every n-th order right after its payment (0: never)")
	fs.IntVar(&cfg.FailEvery, "fail-every", 25, "make every n-th payment fail after its writes, so it rolls back (0: never)")
	fs.BoolVar(&cfg.Chaos, "chaos", false, "inject publish failures, lost acks, duplicate deliveries and a relay restart")
	fs.Float64Var(&cfg.FailRate, "chaos-fail", 0.15, "-chaos: fraction of publishes that fail")
	fs.Float64Var(&cfg.LostAckRate, "chaos-lost-ack", 0.05, "-chaos: fraction of publishes that are sent but reported failed")
	fs.Float64Var(&cfg.DupRate, "chaos-dup", 0.10, "-chaos: fraction of messages published a second time")
	fs.Uint64Var(&cfg.Seed, "seed", 0, "-chaos: seed of the fault dice (0: random; printed)")
	fs.DurationVar(&cfg.Timeout, "timeout", 45*time.Second, "give up waiting for the consumers after this long")
	fs.DurationVar(&cfg.Progress, "progress", 500*time.Millisecond, "interval of the progress lines")
	fs.BoolVar(&cfg.Verbose, "v", false, "log the relay's and watermill's info and debug messages")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if fs.NArg() > 0 || cfg.Orders < 1 || cfg.Customers < 1 || cfg.Workers < 1 || cfg.Rate < 0 || cfg.Progress <= 0 || cfg.Timeout <= 0 {
		fmt.Fprintln(stderr, "orderpaid: -orders, -customers and -workers must be at least 1, -progress and -timeout positive, and no arguments are taken")
		return 2
	}
	for _, r := range []float64{cfg.FailRate, cfg.LostAckRate, cfg.DupRate} {
		if r < 0 || r >= 0.5 {
			fmt.Fprintln(stderr, "orderpaid: -chaos-fail, -chaos-lost-ack and -chaos-dup must be in [0, 0.5)")
			return 2
		}
	}

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	res, err := Run(ctx, cfg)
	if err != nil {
		// redact: the last line of defence for a DSN or URL quoted by a
		// driver or a broker client.
		fmt.Fprintf(stderr, "orderpaid: %v\n", redact.Error(err))
		return 1
	}
	if !res.Reconciled {
		return 1
	}
	return 0
}

func envOr(key, def string) string {
	if v := os.Getenv(key); v != "" {
		return v
	}
	return def
}
