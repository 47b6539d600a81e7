// Package bench holds outboxgen's side-by-side benchmark on real PostgreSQL
// (issue 3, "Benchmark"). Everything lives in _test.go files; the package
// has no API.
//
// One run measures, one scenario after another on fresh databases of the
// same server:
//
//	(a) the raw SQL ceiling: claim (UPDATE ... WHERE id IN (SELECT ... FOR
//	    UPDATE SKIP LOCKED) RETURNING) + mark sent of a backlog, no broker;
//	(b) runtime/relay draining the same backlog to a watermill GoChannel,
//	    with and without 1 ms of added latency per Publish;
//	(c) the watermill baseline: watermill-sql v4 (PostgreSQL schema and
//	    offsets adapters) + components/forwarder draining the same messages
//	    to the same GoChannel;
//	(d) commit→publish latency at a steady event rate with each wake-up
//	    mode of the relay, and what each mode costs the writers.
//
// It prints a markdown table. Run it with (see the Makefile's bench target):
//
//	source <(scripts/testdb.sh start)
//	go test ./bench -run '^$' -bench '^BenchmarkOutbox$' -benchtime 1x -timeout 60m
//
// Flags (after -args): -rows (backlog size, default 100000), -slowrows
// (backlog of the 1 ms latency runs, default -rows), -rounds (repeat every
// scenario and report the median), -rate and -latency-for (scenario d),
// -table FILE (also write the table there). Filter scenarios with the
// sub-benchmark name, e.g. -bench 'BenchmarkOutbox/b_'.
package bench
