# outboxgen — developer tasks. `make help` lists them.
#
# Database tests read OUTBOXGEN_TEST_POSTGRES_DSN and OUTBOXGEN_TEST_MYSQL_DSN.
# When they are unset, `make test` and `make bench` start throwaway PostgreSQL
# and MariaDB servers on loopback with scripts/testdb.sh (installing them with
# apt-get when missing) and export the DSNs for you. `make test` also installs
# Debian's chromium when /usr/bin/chromium is missing (scripts/chromium.sh):
# the console's browser tests (internal/consoletest) drive it.

SHELL      := /bin/bash
GO         ?= go
SQLC       := $(GO) tool -modfile=tools/go.mod sqlc
STATICCHECK := $(GO) tool -modfile=tools/go.mod staticcheck
OUTBOXGEN  := $(GO) run ./cmd/outboxgen
# Starts the servers (or reuses running ones) and exports their DSNs; a
# failure to start them stops the recipe.
TESTDB     := testdb_env=$$(scripts/testdb.sh start) && eval "$$testdb_env"
# Every events.yaml in the repository; generated output is committed.
SPECS      := events.yaml internal/gentest/sqlevents.yaml internal/gentest/pgxevents.yaml internal/gentest/walevents.yaml internal/readmetest/events.yaml internal/readmetest/pgonly.yaml
# A count, not a duration (about 20 s here): with a duration, Go 1.26's fuzz
# coordinator can report "context deadline exceeded" as a failure when the
# time runs out (golang/go#75804, fixed in Go 1.27).
FUZZTIME   ?= 600000x
BENCHTIME  ?= 2s
# Flags of the relay benchmark (bench/doc.go), e.g. BENCHFLAGS='-rounds 1 -rows 20000' or '-table /tmp/bench.md'.
BENCHFLAGS ?= -rounds 3

.PHONY: help generate check-generated test test-unit fuzz lint bench demo testdb-start testdb-stop

help: ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-16s %s\n", $$1, $$2}'

generate: ## regenerate everything: outboxgen output for every spec, then sqlc output
	@set -e; for f in $(SPECS); do echo "outboxgen generate -f $$f"; $(OUTBOXGEN) generate -f $$f; done
	$(GO) test -count=1 ./runtime/dialect -run TestQueryCatalog -update
	$(SQLC) generate

check-generated: ## fail when any generated file is stale, and check the runtime's SQL against the schema with sqlc
	@set -e; for f in $(SPECS); do echo "outboxgen check -f $$f"; $(OUTBOXGEN) check -f $$f; done
	$(SQLC) diff
	$(GO) test -count=1 ./runtime/dialect -run TestQueryCatalog
	$(SQLC) compile -f runtime/dialect/sql/sqlc.yaml

lint: ## go vet, staticcheck and gofmt
	$(GO) vet ./...
	$(STATICCHECK) ./...
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi

# Outside CI a missing chromium that cannot be installed (no root) only
# warns (the browser tests then skip); under CI it stops the run.
# The WAL relay's tests time a replication stream, a killed child process
# and broker outages: `make test` runs them alone, after the others, not
# beside the relay's heavy tests on a 2-core machine.
test: lint check-generated ## everything CI runs: lint, generated-code check, all tests with -race on real databases and a real Chromium, a short fuzz run
	scripts/chromium.sh >/dev/null || [ -z "$$CI" ]
	$(TESTDB) && $(GO) test -race -count=1 $$($(GO) list ./... | grep -v '/runtime/walrelay$$')
	$(TESTDB) && $(GO) test -race -count=1 ./runtime/walrelay
	$(MAKE) fuzz

test-unit: ## tests that need no database server (SQLite only)
	$(GO) test -race -short ./...

fuzz: ## a short fuzz run of the events.yaml parser
	$(GO) test -run='^$$' -fuzz=FuzzParse -fuzztime=$(FUZZTIME) -fuzzminimizetime=1s ./generator/spec/

bench: ## benchmarks on real databases: micro-benchmarks, then the relay benchmark, fsync on (~20 min; prints the README table)
	$(TESTDB) && $(GO) test -run='^$$' -bench=. -benchmem -benchtime=$(BENCHTIME) $$($(GO) list ./... | grep -v '/bench$$')
	$(TESTDB) && $(GO) test ./bench -run='^$$' -bench='^BenchmarkOutbox$$' -benchtime=1x -timeout=60m -args $(BENCHFLAGS)

demo: ## run the example service on the embedded default (SQLite file + in-process broker)
	$(GO) run ./examples/orderpaid

testdb-start: ## start the throwaway PostgreSQL and MariaDB servers
	scripts/testdb.sh start

testdb-stop: ## stop them
	scripts/testdb.sh stop
