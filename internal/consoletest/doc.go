// Package consoletest checks the operator console (package runtime/console)
// end to end, in a real headless Chromium driven by chromedp, on a real
// database (SQLite; PostgreSQL and MariaDB for the main flow) with a real
// relay publishing to an embedded NATS JetStream server and a real
// generated consumer.
//
// The story of the tests is the one operators live: a JetStream stream is
// missing for some topics, so the relay marks their events FAILED and the
// later events of their keys wait behind them; the overview shows it, the
// operator finds the events, creates the stream (the cause is fixed),
// requeues them through the confirmation page, and the relay publishes
// them, the held-back keys flowing again.
//
// The tests need Debian's chromium (/usr/bin/chromium, or the binary
// OUTBOXGEN_CHROMIUM names); `make test` installs it (scripts/chromium.sh).
// Without it they skip, except under CI, where they fail. go test -short
// skips them too.
//
// Screenshots: with OUTBOXGEN_SCREENSHOTS=DIR the SQLite run writes PNGs of
// the main pages to DIR (docs/console in the repository):
//
//	OUTBOXGEN_SCREENSHOTS=docs/console go test -run 'TestConsole/sqlite' ./internal/consoletest
//
// BenchmarkConsolePages times every page over HTTP on PostgreSQL and
// MariaDB tables of 1M sent, 10k pending and 1k FAILED rows (see
// bench_test.go).
package consoletest
