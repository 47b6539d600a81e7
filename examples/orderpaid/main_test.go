package main

import (
	"bytes"
	"context"
	"io"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/outboxgen/outboxgen/internal/testdb"
	"github.com/outboxgen/outboxgen/runtime/dialect"
)

// testConfig is a smaller, faster run than the command's default.
func testConfig(t *testing.T, out *bytes.Buffer) Config {
	return Config{
		DB:            filepath.Join(t.TempDir(), "orderpaid.db"),
		Orders:        120,
		Customers:     40,
		Workers:       4,
		Rate:          0,
		RefundEvery:   5,
		FailEvery:     20,
		FailRate:      0.15,
		LostAckRate:   0.05,
		DupRate:       0.10,
		Timeout:       40 * time.Second,
		Progress:      500 * time.Millisecond,
		Out:           out,
		RelaySettings: defaultRelayOptions(),
	}
}

// TestDemo runs the whole demo in-process in each mode and requires it to
// reconcile. The subtests run one after another: a run sets the generated
// package's Writer for its database.
func TestDemo(t *testing.T) {
	cases := []struct {
		name    string
		dialect string // a testdb dialect for a fresh server database; empty: the SQLite file
		broker  string
		chaos   bool
	}{
		{name: "sqlite"},
		{name: "sqlite-chaos", chaos: true},
		{name: "sqlite-nats-embedded", broker: "nats-embedded"},
		{name: "sqlite-nats-embedded-chaos", broker: "nats-embedded", chaos: true},
		{name: "postgres", dialect: "postgres"},
		{name: "postgres-chaos", dialect: "postgres", chaos: true},
		{name: "mysql", dialect: "mysql"},
		{name: "mysql-chaos", dialect: "mysql", chaos: true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var out bytes.Buffer
			cfg := testConfig(t, &out)
			cfg.Broker, cfg.Chaos = tc.broker, tc.chaos
			if tc.dialect != "" {
				cfg.DB, cfg.Driver = testdb.DSN(t, tc.dialect), tc.dialect // skips when the server is not configured (fails in CI)
			}
			if tc.chaos {
				cfg.Seed = 42
			}
			res, err := Run(context.Background(), cfg)
			if err != nil {
				t.Fatalf("Run: %v\n%s", err, out.String())
			}
			if !res.Reconciled {
				t.Fatalf("the run did not reconcile:\n%s", out.String())
			}
			if testing.Verbose() {
				t.Logf("reconciled in %s\n%s", res.Elapsed.Round(time.Millisecond), out.String())
			}
			checks := map[string]int64{}
			for _, c := range res.Checks {
				checks[c.What] = c.Got
			}
			paid := checks["orders paid (committed payments)"]
			if want := int64(cfg.Orders - cfg.Orders/cfg.FailEvery); paid != want {
				t.Errorf("%d orders paid, want %d", paid, want)
			}
			dups := checks["duplicates skipped by the inbox (points + sms)"]
			if tc.chaos && dups == 0 {
				t.Errorf("-chaos injected duplicates, but the inbox skipped none:\n%s", out.String())
			}
			if !tc.chaos && tc.broker == "" && dups != 0 {
				t.Errorf("%d duplicates skipped without -chaos on GoChannel, want 0", dups)
			}
			if tc.chaos && !strings.Contains(out.String(), "relay orderpaid-relay-2 started") {
				t.Errorf("-chaos did not restart the relay:\n%s", out.String())
			}
		})
	}
}

// TestRefusesExistingTables: a second run on the same database stops
// before touching it, unless -reset.
func TestRefusesExistingTables(t *testing.T) {
	var out bytes.Buffer
	cfg := testConfig(t, &out)
	cfg.Orders = 10
	if res, err := Run(context.Background(), cfg); err != nil || !res.Reconciled {
		t.Fatalf("first run: %v\n%s", err, out.String())
	}
	if _, err := Run(context.Background(), cfg); err == nil || !strings.Contains(err.Error(), "-reset") {
		t.Fatalf("second run without -reset: err = %v, want one that mentions -reset", err)
	}
	cfg.Reset = true
	if res, err := Run(context.Background(), cfg); err != nil || !res.Reconciled {
		t.Fatalf("run with -reset: %v\n%s", err, out.String())
	}
}

func TestResolveDSN(t *testing.T) {
	for _, tc := range []struct {
		dsn, driver string
		want        dialect.Dialect
		wantDSN     string // substring
		wantErr     string
	}{
		{dsn: "postgres://u:secret@h:5432/db", want: dialect.Postgres, wantDSN: "postgres://u:secret@h:5432/db"},
		{dsn: "postgresql://h/db", want: dialect.Postgres},
		{dsn: "mysql://u:p@tcp(h:3306)/db", want: dialect.MySQL, wantDSN: "parseTime=true"},
		{dsn: "u:p@tcp(h:3306)/db", driver: "mariadb", want: dialect.MySQL, wantDSN: "tcp(h:3306)/db"},
		{dsn: "/tmp/x.db", want: dialect.SQLite, wantDSN: "file:/tmp/x.db?"},
		{dsn: "sqlite:/tmp/y", want: dialect.SQLite, wantDSN: "file:/tmp/y?"},
		{dsn: "u:p@tcp(h:3306)/db", wantErr: "cannot tell"},
		{dsn: "", driver: "postgres", wantErr: "needs a DSN"},
		{dsn: "x.db", driver: "oracle", wantErr: "-driver"},
	} {
		d, dsn, where, err := resolveDSN(tc.dsn, tc.driver)
		if tc.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Errorf("resolveDSN(%q, %q): err %v, want %q", tc.dsn, tc.driver, err, tc.wantErr)
			}
			continue
		}
		if err != nil || d != tc.want || !strings.Contains(dsn, tc.wantDSN) {
			t.Errorf("resolveDSN(%q, %q) = %s, %q, %v; want %s, containing %q", tc.dsn, tc.driver, d, dsn, err, tc.want, tc.wantDSN)
		}
		if strings.Contains(where, "secret") {
			t.Errorf("resolveDSN(%q): the description %q shows the password", tc.dsn, where)
		}
	}
}

func TestBadFlags(t *testing.T) {
	for _, args := range [][]string{{"-orders", "0"}, {"-nope"}, {"-chaos-fail", "0.9"}, {"extra"}} {
		if code := runMain(args, io.Discard, io.Discard); code != 2 {
			t.Errorf("runMain(%q) = %d, want 2", args, code)
		}
	}
}

// TestReportsFailure: when events cannot be delivered (every publish fails
// and the relay gives up after one attempt), the run stops waiting at the
// first FAILED row and does not reconcile.
func TestReportsFailure(t *testing.T) {
	var out bytes.Buffer
	cfg := testConfig(t, &out)
	cfg.Orders, cfg.Chaos, cfg.FailRate, cfg.Seed = 20, true, 0.45, 1
	cfg.RelaySettings.MaxAttempts = 1
	res, err := Run(context.Background(), cfg)
	if err != nil {
		t.Fatalf("Run: %v\n%s", err, out.String())
	}
	if res.Reconciled {
		t.Fatalf("reconciled although publishes failed for good:\n%s", out.String())
	}
	for _, want := range []string{"FAILED outbox rows", "WANT 0", "NOT RECONCILED"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("output lacks %q:\n%s", want, out.String())
		}
	}
	if res.Elapsed > 15*time.Second {
		t.Errorf("took %s: a FAILED row should end the wait at once", res.Elapsed)
	}
}
