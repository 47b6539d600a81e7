// Package bench holds outboxgen's relay benchmark on real PostgreSQL and
// MariaDB (issue 12, "Benchmark"). Everything lives in _test.go files; the
// package has no API.
//
// BenchmarkOutbox (`make bench`) measures every row of issue 12's table
// and prints them as one markdown table, each beside what it is compared
// with, measured in the same run:
//
//  1. PostgreSQL, -rows (100k) backlog, no publish latency: the relay
//     (default configuration) against the two raw ceilings a1 and a2;
//  2. PostgreSQL, -bigrows (1M) backlog, the first -bigdrain (200k) rows:
//     the same, and the relay's claim time per batch against row 1's;
//  3. 10k rows of healthy keys drained while H (-held: 5k, 20k, 50k)
//     pending rows wait behind 500 FAILED heads, against H = 0;
//  4. the chaos run: 3 relays, 8 writers writing for -chaos-for, a
//     fraction -chaos-slow (0.5 %) of the publishes taking -chaos-delay
//     (3 s): rows pending when the writers stop, the drain rate after
//     that, and the rate delivered while the writers write, against the
//     same run without slow publishes; beside them, what per-key order
//     allows: the pending rows behind a slow publish of their key at
//     writer stop, the drain rate bound (every pending row over the
//     longest time one key had to wait out slow publishes after the
//     stop: the rest of the one under way, plus those that started
//     later), and how long the drain lasted after the last slow publish
//     returned;
//  5. MariaDB, -myrows (50k) backlog: the relay against a1, a2 and
//     watermill's Forwarder (watermill-sql's MySQL adapters);
//  6. 1 ms publish latency, -slowrows (50k) backlog: the relay against
//     watermill's Forwarder (on a -wmslowrows, 20k, backlog: it drains
//     about 750 rows/s), and -scaleout (4) relays against one, beside the
//     same relays without publish latency (what they reach on the machine
//     at all); then the scale-out again over a backlog of -scalekeys
//     (100k) keys, where the keys in flight do not limit the claims.
//
// The ceilings run one client, batches of 100, nothing published, and
// read the columns the relay reads:
//
//	a1: one transaction per batch: SELECT ... FOR UPDATE SKIP LOCKED,
//	    UPDATE to sent, COMMIT;
//	a2: a lease (PostgreSQL: UPDATE ... WHERE id IN (SELECT ... FOR UPDATE
//	    SKIP LOCKED) RETURNING; MariaDB: SELECT ... FOR UPDATE SKIP LOCKED
//	    and the lease UPDATE in one transaction), then a mark-sent UPDATE:
//	    two commits, what a lease-based relay must minimally do.
//
// Every scenario runs on a fresh database, -rounds (3) times, interleaved
// (each round runs the scenarios of a row in the reverse order of the
// round before); the table shows medians, and every ratio is the median of
// the ratios measured within each round. With -durable (the default) the
// measured phases run with fsync, synchronous_commit and full_page_writes
// on (PostgreSQL, ALTER SYSTEM + pg_reload_conf()) and
// innodb_flush_log_at_trx_commit=1 (MariaDB, SET GLOBAL), not the test
// servers' fsync=off (scripts/testdb.sh); fills run with the servers' own
// settings, which are restored at the end. This needs a superuser on
// PostgreSQL and SUPER on MariaDB, which the test servers' user has. The
// table prints the settings, the versions, the CPU and the flags.
//
// Rows 1, 2 and 5 also show what each drain cost in CPU per row: this
// process's (the relay or the ceiling's client, the in-process broker and
// the sink; getrusage) and the rest of the machine's (/proc/stat less
// this process: mostly the database servers, as nothing else should run
// meanwhile), with the cores the machine kept busy. The ceilings run one
// client and leave cores idle; the relay runs claims and publishes
// concurrently and keeps the machine busy, so on a small machine it goes
// faster only by costing less per row, in either part.
//
// Run it with (see the Makefile's bench target, about 20 minutes):
//
//	eval "$(scripts/testdb.sh start)"
//	go test ./bench -run '^$' -bench '^BenchmarkOutbox$' -benchtime 1x -timeout 60m
//
// Smaller sizes for a quick look (the table says which were used):
//
//	go test ./bench -run '^$' -bench '^BenchmarkOutbox$' -benchtime 1x -args \
//	    -rounds 1 -rows 20000 -bigrows 200000 -bigdrain 20000 -held 1000,5000 \
//	    -myrows 10000 -slowrows 5000 -chaos-for 5s
//
// Other flags: -keys, -scaleout, -scalekeys, -wmslowrows, -chaos-rate, -chaos-per-tx,
// -chaos-drain-max, -durable, -pg-fillfactor N (the PostgreSQL outbox
// tables' fillfactor; see BenchmarkFillfactor), -table FILE (also write
// the table there).
// Filter scenarios with the sub-benchmark name, e.g.
// -bench 'BenchmarkOutbox/round1/my/'.
//
// Focused benchmarks, not part of `make bench`: BenchmarkFillfactor (the
// PostgreSQL outbox at fillfactor 100 and 50: HOT leases, drain time per
// batch, heap and index sizes after ten rounds), BenchmarkHeldBack (row 3
// on PostgreSQL and MariaDB, and the first encounter with the held rows),
// BenchmarkClaimBacklog (the driver's claim + mark alone at 100k and 1M
// pending rows beside a1, both dialects), BenchmarkClaimFront (claims
// from the start of the due index against claims from the previous
// claim's front over a 200k drain of a 1M PostgreSQL backlog),
// BenchmarkFewKeys (drains of backlogs of 10, 100 and 1,000 keys on both
// dialects, and a hot key queued before 1,000 others), BenchmarkFailing
// (a 20,000-row backlog whose first attempts fail one in ten, against the
// same drain without failures, on PostgreSQL, MariaDB and SQLite),
// BenchmarkLeaseAside (a third PostgreSQL ceiling, a3: the lease kept in
// an unlogged table beside the outbox instead of an UPDATE of the row,
// against a1 and a2) and BenchmarkLatency (commit →
// publish latency at a steady event rate per wake-up mode of the relay,
// -rate, -writers, -latency-for).
package bench
