package spec

import (
	"strings"
	"testing"
)

// errorCases are bad specs with the exact error output Parse must give.
// They also seed FuzzParse.
var errorCases = []struct {
	name string
	src  string
	want string
}{
	{
		name: "yaml syntax error",
		src: `version: 1
go:
  package: events
 out: x
`,
		want: `testdata.yaml:4:2: invalid YAML: did not find expected key (check the indentation)`,
	},
	{
		name: "yaml tab indentation",
		src: `version: 1
go:
	package: events
`,
		want: `testdata.yaml:3:1: invalid YAML: found character that cannot start any token (a tab; indent with spaces)`,
	},
	{
		name: "yaml tab indentation after a plain scalar",
		src:  "version: 1\ngo:\n  package: events\n\tout: x\n",
		want: `testdata.yaml:4:1: invalid YAML: found a tab character that violates indentation; indent with spaces`,
	},
	{
		name: "yaml tab starting a token",
		src:  "version: 1\ngo:\n  package: events\nsql:\n  dialects:\n\t- postgres\n",
		want: `testdata.yaml:6:1: invalid YAML: found character that cannot start any token (a tab; indent with spaces)`,
	},
	{
		name: "yaml reserved character",
		src:  "version: 1\ngo:\n  package: events\n  out: @gen\n",
		want: `testdata.yaml:4:8: invalid YAML: found character that cannot start any token ('@' is reserved; quote the value)`,
	},
	{
		name: "yaml unclosed flow list",
		src:  "version: 1\ngo: {package: events, out: gen}\nsql: {dialects: [postgres]}\nevents: [x\nconsumers: []\n",
		want: `testdata.yaml:4:9: invalid YAML: did not find expected ',' or ']' (this bracket is not closed)`,
	},
	{
		name: "yaml unclosed flow mapping",
		src:  "version: 1\ngo: {package: events\nsql: x\n",
		want: `testdata.yaml:2:5: invalid YAML: did not find expected ',' or '}' (this bracket is not closed)`,
	},
	{
		name: "yaml unclosed quote",
		src:  "version: 1\ngo:\n  package: \"events\n  out: x\n",
		want: `testdata.yaml:3:12: invalid YAML: found unexpected end of stream (this quote is not closed)`,
	},
	{
		name: "yaml list item indentation",
		src:  "version: 1\nevents:\n  - name: a\n    topic: b\n  key: c\n",
		want: `testdata.yaml:5:3: invalid YAML: did not find expected '-' indicator (check the indentation)`,
	},
	{
		name: "yaml mapping value in a plain scalar",
		src:  "version: 1\ngo:\n  package: events\n  out: x\n   deeper: y\n",
		want: `testdata.yaml:5:10: invalid YAML: mapping values are not allowed in this context`,
	},
	{
		name: "empty file",
		src: `# nothing here
`,
		want: `testdata.yaml:1:1: the spec file is empty; it needs version, go, sql and events`,
	},
	{
		name: "not a mapping",
		src: `- version: 1
`,
		want: `testdata.yaml:1:1: the spec file must be a mapping, got a list`,
	},
	{
		name: "two documents",
		src: `version: 1
---
version: 1
`,
		want: `testdata.yaml:1:1: the spec file is missing required key "go"; add go: with package and out
testdata.yaml:1:1: the spec file is missing required key "sql"; add sql: with dialects, e.g. dialects: [postgres]
testdata.yaml:1:1: the spec file is missing required key "events"; declare at least one event under events:
testdata.yaml:2:1: the spec file must hold a single YAML document; remove the second one (after ---)`,
	},
	{
		name: "duplicate keys",
		src: `version: 1
go:
  package: events
  out: gen
  package: other
sql:
  dialects: [postgres]
events:
  - name: A
    topic: a
    key: id
    key: id
    fields: [{name: id, type: string}]
version: 1
`,
		want: `testdata.yaml:5:3: duplicate key "package" in go (first at line 3); remove one of them
testdata.yaml:12:5: duplicate key "key" in event A (first at line 11); remove one of them
testdata.yaml:14:1: duplicate key "version" in the top-level mapping (first at line 1); remove one of them`,
	},
	{
		name: "unknown keys with suggestions",
		src: `version: 1
go:
  package: events
  out: gen
  drivr: pgx/v5
sql:
  dialect: [postgres]
evnts: []
events:
  - name: A
    topic: a
    key: id
    partition: 3
    fields: [{name: id, type: string, optinal: true}]
`,
		want: `testdata.yaml:5:3: unknown key "drivr" in go; did you mean "driver"?
testdata.yaml:7:3: unknown key "dialect" in sql; did you mean "dialects"?
testdata.yaml:7:3: sql is missing required key "dialects"; add dialects: [postgres] (or mysql, sqlite)
testdata.yaml:8:1: unknown key "evnts" in the top-level mapping; did you mean "events"?
testdata.yaml:13:5: unknown key "partition" in event A; allowed keys are name, description, topic, key, version, ordered, fields, previous
testdata.yaml:14:39: unknown key "optinal" in field id of event A; did you mean "optional"?`,
	},
	{
		name: "missing required keys",
		src: `go: {}
events:
  - fields:
      - {}
`,
		want: `testdata.yaml:1:1: the spec file is missing required key "version"; add version: 1
testdata.yaml:1:1: the spec file is missing required key "sql"; add sql: with dialects, e.g. dialects: [postgres]
testdata.yaml:1:5: go is missing required key "package"; add package: events (the Go package name of the generated code)
testdata.yaml:1:5: go is missing required key "out"; add out: the directory for the generated code, relative to the spec file
testdata.yaml:3:5: events[0] is missing required key "name"; add name: a SCREAMING_SNAKE event name, e.g. ORDER_PAID
testdata.yaml:3:5: events[0] is missing required key "topic"; add topic: the broker topic to publish to, e.g. orders.paid
testdata.yaml:3:5: events[0] is missing required key "key"; add key: the name of the required field that identifies the aggregate, e.g. order_id
testdata.yaml:4:9: fields[0] of events[0] is missing required key "name"; add name: the field's JSON name, e.g. order_id
testdata.yaml:4:9: fields[0] of events[0] is missing required key "type"; add type: e.g. string, int64, list<string> or a type from types:`,
	},
	{
		name: "wrong node kinds",
		src: `version: 1
go: [events]
sql:
  dialects: postgres
types: {}
events: ORDER_PAID
consumers: points
`,
		want: `testdata.yaml:2:5: go must be a mapping, got a list
testdata.yaml:4:13: sql.dialects must be a list, got the string "postgres"
testdata.yaml:5:8: types must be a list, got a mapping
testdata.yaml:6:9: events must be a list, got the string "ORDER_PAID"
testdata.yaml:7:12: consumers must be a list, got the string "points"`,
	},
	{
		name: "wrong scalar kinds",
		src: `version: "1"
go:
  package: [a]
  out: gen
sql:
  dialects: [postgres]
events:
  - name: A
    topic: a
    key: id
    version: 1.5
    ordered: "no"
    fields:
      - name: id
        type: string
        optional: 1
        description: {a: b}
`,
		want: `testdata.yaml:1:10: version must be an integer, got the string "1"
testdata.yaml:3:12: go.package must be a string, got a list
testdata.yaml:11:14: version of event A must be an integer, got the number 1.5
testdata.yaml:12:14: ordered of event A must be true or false, got the string "no"
testdata.yaml:16:19: optional of field id of event A must be true or false, got the integer 1
testdata.yaml:17:22: description of field id of event A must be a string, got a mapping`,
	},
	{
		name: "bad version",
		src: `version: 2
go: {package: events, out: gen}
sql: {dialects: [postgres]}
events:
  - {name: A, topic: a, key: id, version: 0, fields: [{name: id, type: string}]}
  - {name: B, topic: b, key: id, version: 99999999999, fields: [{name: id, type: string}]}
`,
		want: `testdata.yaml:1:10: unsupported version 2; this outboxgen reads version 1
testdata.yaml:5:43: version of event A must be at least 1, got 0
testdata.yaml:6:43: version of event B must be an integer that fits in 32 bits, got 99999999999`,
	},
	{
		name: "go package and out",
		src: `version: 1
go:
  package: Events
  out: /abs/dir
sql: {dialects: [postgres]}
events:
  - {name: A, topic: a, key: id, fields: [{name: id, type: string}]}
`,
		want: `testdata.yaml:3:12: go.package "Events" is not a valid Go package name; use a lower-case identifier such as events
testdata.yaml:4:8: go.out "/abs/dir" must be relative to the spec file's directory, not absolute`,
	},
	{
		name: "go package keyword and empty out",
		src: `version: 1
go:
  package: func
  out: ""
sql: {dialects: [postgres]}
events:
  - {name: A, topic: a, key: id, fields: [{name: id, type: string}]}
`,
		want: `testdata.yaml:3:12: go.package "func" is a Go keyword; choose another name such as events
testdata.yaml:4:8: go.out must not be empty; give a directory relative to the spec file`,
	},
	{
		name: "unknown driver",
		src: `version: 1
go: {package: events, out: gen, driver: pgx}
sql: {dialects: [postgres]}
events:
  - {name: A, topic: a, key: id, fields: [{name: id, type: string}]}
`,
		want: `testdata.yaml:2:41: unknown go.driver "pgx"; did you mean "pgx/v5"?`,
	},
	{
		name: "pgx with other dialects",
		src: `version: 1
go:
  package: events
  out: gen
  driver: pgx/v5
sql:
  dialects: [postgres, mysql, sqlite3]
events:
  - {name: A, topic: a, key: id, fields: [{name: id, type: string}]}
`,
		want: `testdata.yaml:5:11: go.driver pgx/v5 works only with postgres, but sql.dialects also lists mysql, sqlite; use driver database/sql, or set dialects: [postgres]`,
	},
	{
		name: "dialects",
		src: `version: 1
go: {package: events, out: gen}
sql:
  dialects:
    - postgres
    - Postgres
    - postgresql
    - oracle
    - sqlite
    - sqlite
events:
  - {name: A, topic: a, key: id, fields: [{name: id, type: string}]}
`,
		want: `testdata.yaml:6:7: unknown dialect "Postgres"; did you mean "postgres"?
testdata.yaml:7:7: dialect postgresql duplicates postgres (line 5): both mean postgres; remove one
testdata.yaml:8:7: unknown dialect "oracle"; use postgres, mysql or sqlite
testdata.yaml:10:7: duplicate dialect sqlite (first at line 9); remove one`,
	},
	{
		name: "empty dialects",
		src: `version: 1
go: {package: events, out: gen}
sql:
  dialects: []
events:
  - {name: A, topic: a, key: id, fields: [{name: id, type: string}]}
`,
		want: `testdata.yaml:4:13: sql.dialects must list at least one dialect: postgres, mysql or sqlite`,
	},
	{
		name: "unsafe table names",
		src: `version: 1
go: {package: events, out: gen}
sql:
  dialects: [postgres]
  outbox_table: "outbox; DROP TABLE users"
  inbox_table: Inbox
events:
  - {name: A, topic: a, key: id, fields: [{name: id, type: string}]}
`,
		want: `testdata.yaml:5:17: sql.outbox_table "outbox; DROP TABLE users" is not a safe SQL identifier; use 1 to 63 lower-case letters, digits and underscores, starting with a letter or underscore (this prevents SQL injection, as the name is spliced into SQL)
testdata.yaml:6:16: sql.inbox_table "Inbox" is not a safe SQL identifier; use 1 to 63 lower-case letters, digits and underscores, starting with a letter or underscore (this prevents SQL injection, as the name is spliced into SQL)`,
	},
	{
		name: "same and reserved table names",
		src: `version: 1
go: {package: events, out: gen}
sql:
  dialects: [postgres]
  outbox_table: order
  inbox_table: outbox_event
events:
  - {name: A, topic: a, key: id, fields: [{name: id, type: string}]}
`,
		want: `testdata.yaml:5:17: sql.outbox_table "order" is a reserved SQL word (in PostgreSQL, MySQL, MariaDB and SQLite), which the DDL cannot use unquoted; choose another name, e.g. order_log
testdata.yaml:6:16: sql.inbox_table "outbox_event" is the same as sql.outbox_table (line 5); the two tables must have different names`,
	},
	{
		name: "table names reserved in PostgreSQL",
		src: `version: 1
go: {package: events, out: gen}
sql:
  dialects: [postgres]
  outbox_table: desc
  inbox_table: window
  archive_table: grant
events:
  - {name: A, topic: a, key: id, fields: [{name: id, type: string}]}
`,
		want: `testdata.yaml:5:17: sql.outbox_table "desc" is a reserved SQL word (in PostgreSQL, MySQL and MariaDB), which the DDL cannot use unquoted; choose another name, e.g. desc_log
testdata.yaml:6:16: sql.inbox_table "window" is a reserved SQL word (in PostgreSQL and MySQL), which the DDL cannot use unquoted; choose another name, e.g. window_log
testdata.yaml:7:18: sql.archive_table "grant" is a reserved SQL word (in PostgreSQL, MySQL and MariaDB), which the DDL cannot use unquoted; choose another name, e.g. grant_log`,
	},
	{
		name: "table names reserved in another dialect than those listed",
		src: `version: 1
go: {package: events, out: gen}
sql:
  dialects: [postgres]
  outbox_table: interval
  inbox_table: range
  archive_table: commit
events:
  - {name: A, topic: a, key: id, fields: [{name: id, type: string}]}
`,
		want: `testdata.yaml:5:17: sql.outbox_table "interval" is a reserved SQL word (in MySQL and MariaDB), which the DDL cannot use unquoted; choose another name, e.g. interval_log
testdata.yaml:6:16: sql.inbox_table "range" is a reserved SQL word (in MySQL and MariaDB), which the DDL cannot use unquoted; choose another name, e.g. range_log
testdata.yaml:7:18: sql.archive_table "commit" is a reserved SQL word (in SQLite), which the DDL cannot use unquoted; choose another name, e.g. commit_log`,
	},
	{
		name: "table names reserved as functions or types in PostgreSQL",
		src: `version: 1
go: {package: events, out: gen}
sql: {dialects: [sqlite], outbox_table: offset, inbox_table: case, archive_table: verbose}
events:
  - {name: A, topic: a, key: id, fields: [{name: id, type: string}]}
`,
		want: `testdata.yaml:3:41: sql.outbox_table "offset" is a reserved SQL word (in PostgreSQL and MariaDB), which the DDL cannot use unquoted; choose another name, e.g. offset_log
testdata.yaml:3:62: sql.inbox_table "case" is a reserved SQL word (in PostgreSQL, MySQL, MariaDB and SQLite), which the DDL cannot use unquoted; choose another name, e.g. case_log
testdata.yaml:3:83: sql.archive_table "verbose" is a reserved SQL word (in PostgreSQL), which the DDL cannot use unquoted; choose another name, e.g. verbose_log`,
	},
	{
		name: "inbox equals outbox",
		src: `version: 1
go: {package: events, out: gen}
sql:
  dialects: [postgres]
  outbox_table: events_out
  inbox_table: events_out
events:
  - {name: A, topic: a, key: id, fields: [{name: id, type: string}]}
`,
		want: `testdata.yaml:6:16: sql.inbox_table "events_out" is the same as sql.outbox_table (line 5); the two tables must have different names`,
	},
	{
		name: "table name too long for derived index names",
		src: `version: 1
go: {package: events, out: gen}
sql:
  dialects: [postgres]
  inbox_table: inbox_table_name_that_is_long_enough_to_overflow_63
events:
  - {name: A, topic: a, key: id, fields: [{name: id, type: string}]}
`,
		want: `testdata.yaml:5:16: sql.inbox_table "inbox_table_name_that_is_long_enough_to_overflow_63" is 51 characters long; the limit is 46, so that the names derived from it, such as inbox_table_name_that_is_long_enough_to_overflow_63_processed_at_idx, fit in 63 characters`,
	},
	{
		name: "every table name too long",
		src: `version: 1
go: {package: events, out: gen}
sql:
  dialects: [postgres]
  outbox_table: outbox_table_name_that_is_long_enough_to_overflow_6
  inbox_table: inbox_table_name_that_is_long_enough_to_overflow_63
  archive_table: archive_table_name_that_is_long_enough_to_overflow
events:
  - {name: A, topic: a, key: id, fields: [{name: id, type: string}]}
`,
		want: `testdata.yaml:5:17: sql.outbox_table "outbox_table_name_that_is_long_enough_to_overflow_6" is 51 characters long; the limit is 50, so that the names derived from it, such as outbox_table_name_that_is_long_enough_to_overflow_6_event_id_key, fit in 63 characters
testdata.yaml:6:16: sql.inbox_table "inbox_table_name_that_is_long_enough_to_overflow_63" is 51 characters long; the limit is 46, so that the names derived from it, such as inbox_table_name_that_is_long_enough_to_overflow_63_processed_at_idx, fit in 63 characters
testdata.yaml:7:18: sql.archive_table "archive_table_name_that_is_long_enough_to_overflow" is 50 characters long; the limit is 47, so that the names derived from it, such as archive_table_name_that_is_long_enough_to_overflow_archived_at_idx, fit in 63 characters`,
	},
	{
		name: "package main and a cgo go_type",
		src: `version: 1
go: {package: main, out: gen}
sql: {dialects: [postgres]}
events:
  - {name: A, topic: a, key: id, fields: [{name: id, type: string}, {name: x, type: int64, go_type: C.Foo}, {name: y, type: int64, go_type: {import: C, type: Bar}}]}
`,
		want: `testdata.yaml:2:15: go.package main cannot hold the generated code: a main package cannot be imported by the code that writes and handles the events; choose another name such as events
testdata.yaml:5:101: go_type import path "C" is cgo's pseudo-package, which the generated code cannot import (a C type does not marshal to JSON); use a Go type, e.g. github.com/shopspring/decimal.Decimal
testdata.yaml:5:159: go_type import path "C" is cgo's pseudo-package, which the generated code cannot import (a C type does not marshal to JSON); use a Go type, e.g. github.com/shopspring/decimal.Decimal`,
	},
	{
		name: "package documentation",
		src: `version: 1
go: {package: documentation, out: gen}
sql: {dialects: [postgres]}
events:
  - {name: A, topic: a, key: id, fields: [{name: id, type: string}]}
`,
		want: `testdata.yaml:2:15: go.package documentation cannot hold the generated code: the go tool ignores the files of a package named documentation, so nothing could import it; choose another name such as events`,
	},
	{
		name: "go.out not a Go import path",
		src: `version: 1
go: {package: events, out: "internal/my events"}
sql: {dialects: [postgres], out: "db/my schema"}
events:
  - {name: A, topic: a, key: id, fields: [{name: id, type: string}]}
`,
		want: `testdata.yaml:2:28: go.out "internal/my events" cannot hold a Go package: the directory name "my events" contains ' ', which Go import paths do not allow; use only ASCII letters, digits and - . _ ~ +`,
	},
	{
		name: "sql.out inside a generated Go file",
		src: `version: 1
go: {package: events, out: events}
sql: {dialects: [postgres, mysql], out: events/writers.go}
events:
  - {name: A, topic: a, key: id, fields: [{name: id, type: string}]}
`,
		want: `testdata.yaml:3:41: sql.out "events/writers.go" puts the postgres DDL in events/writers.go/postgres, inside events/writers.go, a Go file that go.out generates; choose another directory, e.g. db/schema`,
	},
	{
		name: "go.out is the spec file",
		src: `version: 1
go: {package: events, out: testdata.yaml}
sql: {dialects: [postgres], out: ./testdata.yaml/schema}
events:
  - {name: A, topic: a, key: id, fields: [{name: id, type: string}]}
`,
		want: `testdata.yaml:2:28: go.out "testdata.yaml" is the spec file; choose a directory for the generated Go code, e.g. events
testdata.yaml:3:34: sql.out "./testdata.yaml/schema" puts the postgres DDL in testdata.yaml/schema/postgres, inside testdata.yaml, the spec file; choose another directory, e.g. db/schema`,
	},
	{
		name: "go.out inside a generated DDL file",
		src: `version: 1
go: {package: events, out: db/sqlite/migrations/0001_outbox_tables.up.sql/events}
sql: {dialects: [postgres, sqlite], out: db}
events:
  - {name: A, topic: a, key: id, fields: [{name: id, type: string}]}
`,
		want: `testdata.yaml:2:28: go.out "db/sqlite/migrations/0001_outbox_tables.up.sql/events" is inside db/sqlite/migrations/0001_outbox_tables.up.sql, the sqlite DDL file that sql.out generates; choose a directory for the generated Go code, e.g. events`,
	},
	{
		name: "output directories outside the spec's directory",
		src: `version: 1
go: {package: events, out: ../../x}
sql: {dialects: [postgres], out: a/../../../x}
events:
  - {name: A, topic: a, key: id, fields: [{name: id, type: string}]}
`,
		want: `testdata.yaml:2:28: go.out "../../x" leaves the spec file's directory; outboxgen writes only inside the directory tree of the spec file, so move the spec file up or the output directory down
testdata.yaml:3:34: sql.out "a/../../../x" leaves the spec file's directory; outboxgen writes only inside the directory tree of the spec file, so move the spec file up or the output directory down`,
	},
	{
		name: "NUL, byte order mark and bidi controls in descriptions",
		src: "version: 1\ngo: {package: events, out: gen}\nsql: {dialects: [postgres]}\n" +
			"types:\n  - {name: T, enum: [a], description: \"x\\0y\"}\n" +
			"events:\n  - name: A\n    description: ok \ufeffthen\n    topic: a\n    key: id\n" +
			"    fields:\n      - {name: id, type: string, description: admin \u202e nimda}\n" +
			"consumers:\n  - {name: c, events: [A], description: \"a\\rb\"}\n",
		want: `testdata.yaml:5:39: description of type T contains a NUL character (U+0000); remove it (descriptions become Go comments)
testdata.yaml:8:21: description of event A contains a byte order mark (U+FEFF); remove it (descriptions become Go comments)
testdata.yaml:12:53: description of field id of event A contains the invisible bidirectional control U+202E, which can make text display differently from what it is; remove it (descriptions become Go comments)
testdata.yaml:14:41: description of consumer c contains a carriage return (U+000D) that does not end a line; remove it (descriptions become Go comments)`,
	},
	{
		name: "raw NUL byte",
		src:  "version: 1\ngo: {package: events, out: gen}\nsql: {dialects: [postgres]}\nevents:\n  - {name: A, description: a\x00b}\n",
		want: `testdata.yaml:5:29: invalid YAML: control characters are not allowed: a NUL character (U+0000); remove it`,
	},
	{
		name: "archive table",
		src: `version: 1
go: {package: events, out: gen}
sql:
  dialects: [postgres]
  archive_table: outbox_event
events:
  - {name: A, topic: a, key: id, fields: [{name: id, type: string}]}
`,
		want: `testdata.yaml:5:18: table names "outbox_event", "outbox_inbox" and "outbox_event" produce the identifier "outbox_event" twice`,
	},
	{
		name: "sql.wal without postgres",
		src: `version: 1
go: {package: events, out: gen}
sql:
  dialects: [mysql, sqlite]
  wal: true
events:
  - {name: A, topic: a, key: id, fields: [{name: id, type: string}]}
`,
		want: `testdata.yaml:5:8: sql.wal: true needs postgres in sql.dialects (WAL mode uses PostgreSQL logical decoding); add postgres to sql.dialects or remove sql.wal`,
	},
	{
		name: "sql.wal not a boolean",
		src: `version: 1
go: {package: events, out: gen}
sql: {dialects: [postgres], wal: "yes"}
events:
  - {name: A, topic: a, key: id, fields: [{name: id, type: string}]}
`,
		want: `testdata.yaml:3:34: sql.wal must be true or false, got the string "yes"`,
	},
	{
		name: "unsafe archive table",
		src: `version: 1
go: {package: events, out: gen}
sql:
  dialects: [postgres]
  archive_table: Archive
events:
  - {name: A, topic: a, key: id, fields: [{name: id, type: string}]}
`,
		want: `testdata.yaml:5:18: sql.archive_table "Archive" is not a safe SQL identifier; use 1 to 63 lower-case letters, digits and underscores, starting with a letter or underscore (this prevents SQL injection, as the name is spliced into SQL)`,
	},
	{
		name: "event names",
		src: `version: 1
go: {package: events, out: gen}
sql: {dialects: [postgres]}
events:
  - {name: order_paid, topic: a, key: id, fields: [{name: id, type: string}]}
  - {name: ORDER__PAID, topic: a, key: id, fields: [{name: id, type: string}]}
  - {name: A_VERY_LONG_EVENT_NAME_THAT_GOES_ON_AND_ON_AND_ON_FOR_WAY_TOO_MANY_CHARS, topic: a, key: id, fields: [{name: id, type: string}]}
  - {name: OK, topic: a, key: id, fields: [{name: id, type: string}]}
  - {name: OK, topic: b, key: id, fields: [{name: id, type: string}]}
`,
		want: `testdata.yaml:5:12: event name "order_paid" must be SCREAMING_SNAKE_CASE (upper-case letters and digits separated by single underscores), e.g. ORDER_PAID
testdata.yaml:6:12: event name "ORDER__PAID" must be SCREAMING_SNAKE_CASE (upper-case letters and digits separated by single underscores), e.g. ORDER_PAID
testdata.yaml:7:12: event name A_VERY_LONG_EVENT_NAME_THAT_GOES_ON_AND_ON_AND_ON_FOR_WAY_TOO_MANY_CHARS is 72 characters long; the limit is 64
testdata.yaml:9:12: duplicate event OK (first at line 8); rename or remove one`,
	},
	{
		name: "no events",
		src: `version: 1
go: {package: events, out: gen}
sql: {dialects: [postgres]}
events: []
`,
		want: `testdata.yaml:4:9: events must list at least one event`,
	},
	{
		name: "topics",
		src: `version: 1
go: {package: events, out: gen}
sql: {dialects: [postgres]}
events:
  - {name: A, topic: "orders paid", key: id, fields: [{name: id, type: string}]}
  - {name: B, topic: "orders.*", key: id, fields: [{name: id, type: string}]}
  - {name: C, topic: ">", key: id, fields: [{name: id, type: string}]}
  - {name: D, topic: "", key: id, fields: [{name: id, type: string}]}
`,
		want: `testdata.yaml:5:22: invalid topic "orders paid"; use 1 to 249 letters, digits, '.', '_', '-' or '/', starting with a letter or digit (no spaces or wildcards)
testdata.yaml:6:22: invalid topic "orders.*"; use 1 to 249 letters, digits, '.', '_', '-' or '/', starting with a letter or digit (no spaces or wildcards)
testdata.yaml:7:22: invalid topic ">"; use 1 to 249 letters, digits, '.', '_', '-' or '/', starting with a letter or digit (no spaces or wildcards)
testdata.yaml:8:22: invalid topic ""; use 1 to 249 letters, digits, '.', '_', '-' or '/', starting with a letter or digit (no spaces or wildcards)`,
	},
	{
		name: "fields",
		src: `version: 1
go: {package: events, out: gen}
sql: {dialects: [postgres]}
events:
  - name: A
    topic: a
    key: order_id
    fields:
      - name: order_id
        type: string
      - name: orderID
        type: string
      - name: order_id
        type: int64
      - name: 2fast
        type: string
      - name: _
        type: string
  - name: B
    topic: b
    key: id
    fields: []
`,
		want: `testdata.yaml:11:15: field orderID collides with order_id (line 9) as Go name OrderID; rename one of them
testdata.yaml:13:15: duplicate field order_id in event A (first at line 9); rename or remove one
testdata.yaml:15:15: field name "2fast" is invalid; use letters, digits and underscores, not starting with a digit
testdata.yaml:17:15: field name "_" does not make a valid Go name; start it with a letter
testdata.yaml:21:10: key "id" of event B names no field; declare it under fields:
testdata.yaml:22:13: event B must have at least one field`,
	},
	{
		name: "type syntax",
		src: `version: 1
go: {package: events, out: gen}
sql: {dialects: [postgres]}
events:
  - name: A
    topic: a
    key: id
    fields:
      - {name: id, type: string}
      - name: a
        type: list<string
      - name: b
        type: map<int64, string>
      - name: c
        type: list
      - name: d
        type: Money<int64>
      - name: e
        type: list<string> extra
      - name: f
        type: ""
      - name: g
        type: map<string, >
      - name: h
        type: list<int64, string>
`,
		want: `testdata.yaml:11:19: invalid type "list<string": unclosed "<"; add the missing ">"
testdata.yaml:13:19: invalid type "map<int64, string>": map keys must be string (JSON object keys are strings), not int64; write map<T> or map<string, T>
testdata.yaml:15:15: invalid type "list": list needs an element type, e.g. list<string>
testdata.yaml:17:20: invalid type "Money<int64>": Money does not take a type parameter; only list<T> and map<T> do
testdata.yaml:19:28: invalid type "list<string> extra": unexpected "extra" after type "list<string>"; a field has exactly one type
testdata.yaml:21:15: invalid type "": type must not be empty; use a scalar (string, bool, int32, int64, float64, bytes, time, uuid, decimal, json), a type from types:, list<T> or map<T>
testdata.yaml:23:27: invalid type "map<string, >": expected a type name, found ">"
testdata.yaml:25:25: invalid type "list<int64, string>": list takes one type parameter: list<T>`,
	},
	{
		name: "unknown types",
		src: `version: 1
go: {package: events, out: gen}
sql: {dialects: [postgres]}
types:
  - name: Address
    fields: [{name: street, type: strng}]
events:
  - name: A
    topic: a
    key: id
    fields:
      - {name: id, type: String}
      - {name: home, type: Adress}
      - {name: tags, type: list<map<Tag>>}
      - {name: x, type: float}
      - {name: y, type: zzzzzz}
`,
		want: `testdata.yaml:6:35: unknown type "strng"; did you mean string?
testdata.yaml:12:26: unknown type "String"; did you mean string?
testdata.yaml:13:28: unknown type "Adress"; did you mean Address?
testdata.yaml:14:37: unknown type "Tag"; use a scalar (string, bool, int32, int64, float64, bytes, time, uuid, decimal, json), list<T>, map<T> or a type declared under types:
testdata.yaml:15:25: unknown type "float"; did you mean float64?
testdata.yaml:16:25: unknown type "zzzzzz"; use a scalar (string, bool, int32, int64, float64, bytes, time, uuid, decimal, json), list<T>, map<T> or a type declared under types:`,
	},
	{
		name: "key problems",
		src: `version: 1
go: {package: events, out: gen}
sql: {dialects: [postgres]}
types:
  - {name: Money, fields: [{name: cents, type: int64}]}
events:
  - name: A
    topic: a
    key: order
    fields: [{name: order_id, type: string}]
  - name: B
    topic: b
    key: reason
    fields: [{name: reason, type: string, optional: true}]
  - name: C
    topic: c
    key: amount
    fields: [{name: amount, type: float64}]
  - name: D
    topic: d
    key: price
    fields: [{name: price, type: Money}]
  - name: E
    topic: e
    key: ids
    fields: [{name: ids, type: list<string>}]
  - name: F
    topic: f
    key: ""
    fields: [{name: id, type: string}]
`,
		want: `testdata.yaml:9:10: key "order" of event A names no field; did you mean order_id?
testdata.yaml:13:10: key reason of event B is an optional field (line 14); a key must always be set, so make the field required or choose another key
testdata.yaml:17:10: key amount of event C has type float64; a key must be a string, int32, int64, uuid or enum field
testdata.yaml:21:10: key price of event D has type object Money; a key must be a string, int32, int64, uuid or enum field
testdata.yaml:25:10: key ids of event E has type list<string>; a key must be a string, int32, int64, uuid or enum field
testdata.yaml:29:10: key of event F must not be empty; name one of its required fields, e.g. id`,
	},
	{
		name: "key of an event with a nameless field",
		src: `version: 1
go: {package: events, out: gen}
sql: {dialects: [postgres]}
events:
  - name: A
    topic: a
    key: id
    fields:
      - {type: string}
`,
		want: `testdata.yaml:7:10: key "id" of event A names no field; declare it under fields:
testdata.yaml:9:9: fields[0] of event A is missing required key "name"; add name: the field's JSON name, e.g. order_id`,
	},
	{
		name: "pointer go_type on a key",
		src: `version: 1
go: {package: events, out: gen}
sql: {dialects: [postgres]}
events:
  - name: A
    topic: a
    key: id
    fields:
      - {name: id, type: string, go_type: "*string"}
  - name: B
    topic: b
    key: id
    fields:
      - name: id
        type: uuid
        go_type: {import: github.com/google/uuid, type: UUID, pointer: true}
`,
		want: `testdata.yaml:9:43: go_type of key id of event A is a pointer; a key must always be set (it becomes the row's biz_id), so use the type itself: write "string"
testdata.yaml:16:72: go_type of key id of event B is a pointer; a key must always be set (it becomes the row's biz_id), so use the type itself: remove pointer: true`,
	},
	{
		name: "unknown alias",
		src: `version: 1
go: *nope
sql: {dialects: [postgres]}
events:
  - {name: A, topic: a, key: id, fields: [{name: id, type: string}]}
`,
		want: `testdata.yaml:2:5: invalid YAML: unknown anchor 'nope' referenced; define it with &nope before this alias, or remove the alias`,
	},
	{
		name: "unknown alias after comments, quotes and a block scalar",
		src: `version: 1
# not *nope
x-a: "*nope"
x-b: |
  *nope
go: {package: events, out: gen}
sql: {dialects: [postgres]}
events:
  - {name: A, topic: a, key: id, fields: [*nope]}
`,
		want: `testdata.yaml:9:43: invalid YAML: unknown anchor 'nope' referenced; define it with &nope before this alias, or remove the alias`,
	},
	{
		name: "unknown escape",
		src: `version: 1
go: {package: events, out: gen}
sql: {dialects: [postgres]}
events:
  - name: A
    key: id
    fields: [{name: id, type: string}]
    description: "tab\there"
    topic: "orders\q"
`,
		want: `testdata.yaml:9:19: invalid YAML: found unknown escape character (\q is not a YAML escape; write \\ for a backslash, or use single quotes)`,
	},
	{
		name: "types",
		src: `version: 1
go: {package: events, out: gen}
sql: {dialects: [postgres]}
types:
  - name: address
    fields: [{name: a, type: string}]
  - name: Uuid
    enum: [a]
  - name: Both
    fields: [{name: a, type: string}]
    enum: [a]
  - name: Neither
  - name: Color
    enum: [red, red, 1st, "dark blue"]
  - name: Color
    enum: []
  - name: Empty
    fields: []
events:
  - {name: A, topic: a, key: id, fields: [{name: id, type: string}]}
`,
		want: `testdata.yaml:5:11: type name "address" must be PascalCase (letters and digits, starting upper-case), e.g. Address
testdata.yaml:7:11: type name "Uuid" is too close to the built-in type uuid; choose another name
testdata.yaml:11:5: type Both has both fields and enum; a type is either an object (fields) or an enum (enum), remove one
testdata.yaml:12:5: type Neither needs fields (for an object type) or enum (for an enum type)
testdata.yaml:14:17: duplicate enum value red in type Color (first at line 14); remove one
testdata.yaml:14:22: enum value "1st" of type Color is invalid; start with a letter and use letters, digits, '_', '.' or '-'
testdata.yaml:14:27: enum value "dark blue" of type Color is invalid; start with a letter and use letters, digits, '_', '.' or '-'
testdata.yaml:15:11: duplicate type Color (first at line 13); rename or remove one
testdata.yaml:16:11: enum of type Color must list at least one value
testdata.yaml:18:13: type Empty must have at least one field`,
	},
	{
		name: "reference cycles",
		src: `version: 1
go: {package: events, out: gen}
sql: {dialects: [postgres]}
types:
  - name: Node
    fields:
      - {name: next, type: Node}
  - name: A
    fields:
      - {name: b, type: B}
  - name: B
    fields:
      - {name: a, type: A}
  - name: Tree
    fields:
      - {name: children, type: list<Tree>}
      - {name: parent, type: Tree, optional: true}
      - {name: index, type: map<Tree>}
  - name: Wrapped
    fields:
      - {name: self, type: Wrapped, go_type: encoding/json.RawMessage}
events:
  - {name: E, topic: a, key: id, fields: [{name: id, type: string}]}
`,
		want: `testdata.yaml:7:9: type Node refers to itself through Node.next; make one of the fields optional
testdata.yaml:10:9: type A refers to itself through A.b -> B.a; make one of the fields optional`,
	},
	{
		name: "go_type",
		src: `version: 1
go: {package: events, out: gen}
sql: {dialects: [postgres]}
events:
  - name: A
    topic: a
    key: id
    fields:
      - {name: id, type: string}
      - {name: a, type: decimal, go_type: github.com/shopspring/decimal.decimal}
      - {name: b, type: decimal, go_type: Decimal}
      - {name: c, type: decimal, go_type: "github.com//x.Y"}
      - {name: d, type: decimal, go_type: "*"}
      - {name: e, type: decimal, go_type: {import: "bad path", type: X}}
      - {name: f, type: decimal, go_type: {import: x/y, typ: X}}
      - {name: g, type: decimal, go_type: {type: Decimal}}
      - {name: h, type: decimal, go_type: [x]}
      - {name: i, type: decimal, go_type: {import: x/y, type: X, pointer: "yes"}}
      - {name: j, type: decimal, go_type: github.com/foo/bar}
      - {name: k, type: decimal, go_type: "*github.com/foo/bar"}
`,
		want: `testdata.yaml:10:43: go_type name "decimal" in package github.com/shopspring/decimal is not an exported Go identifier; it must start with an upper-case letter, e.g. github.com/shopspring/decimal.Decimal
testdata.yaml:11:43: go_type "Decimal" has no import path; write "import/path.Decimal", or use a predeclared type such as string or int64
testdata.yaml:12:43: go_type import path "github.com//x" has an empty path element; write e.g. github.com/shopspring/decimal
testdata.yaml:13:43: go_type must not be empty; write "import/path.TypeName", e.g. "github.com/shopspring/decimal.Decimal"
testdata.yaml:14:70: go_type import path "bad path" contains the invalid character ' '; write e.g. github.com/shopspring/decimal
testdata.yaml:15:43: go_type of field f of event A is missing required key "type"; add type: the Go type name, e.g. Decimal
testdata.yaml:15:57: unknown key "typ" in go_type of field f of event A; did you mean "type"?
testdata.yaml:16:50: go_type Decimal has no import path; add the package that declares it
testdata.yaml:17:43: go_type of field h of event A must be a string "import/path.Type" or a mapping {import, type, pointer}, got a list
testdata.yaml:18:75: go_type.pointer must be true or false, got the string "yes"
testdata.yaml:19:43: go_type "github.com/foo/bar" has no type name: write import/path.TypeName, e.g. "github.com/foo/bar.TypeName"
testdata.yaml:20:43: go_type "*github.com/foo/bar" has no type name: write import/path.TypeName, e.g. "*github.com/foo/bar.TypeName"`,
	},
	{
		name: "consumers",
		src: `version: 1
go: {package: events, out: gen}
sql: {dialects: [postgres]}
events:
  - {name: ORDER_PAID, topic: a, key: id, fields: [{name: id, type: string}]}
consumers:
  - name: Points
    events: [ORDER_PAID]
  - name: sms
    events: [ORDER_PAYED, ORDER_PAID, ORDER_PAID, NOTHING_LIKE_IT]
  - name: sms
    events: [ORDER_PAID]
  - name: email
    events: []
  - name: push
`,
		want: `testdata.yaml:7:11: consumer name "Points" must be snake_case: a lower-case letter, then up to 62 lower-case letters, digits or underscores
testdata.yaml:10:14: consumer sms handles unknown event "ORDER_PAYED"; did you mean ORDER_PAID?
testdata.yaml:10:39: consumer sms lists event ORDER_PAID twice (first at line 10); remove one
testdata.yaml:10:51: consumer sms handles unknown event "NOTHING_LIKE_IT"; declare it under events: or remove it
testdata.yaml:11:11: duplicate consumer sms (first at line 9); rename or remove one
testdata.yaml:14:13: consumer email must handle at least one event; list it under events:
testdata.yaml:15:5: consumer push is missing required key "events"; add events: the list of events it handles, e.g. [ORDER_PAID]`,
	},
	{
		name: "latest_only",
		src: `version: 1
go: {package: events, out: gen}
sql: {dialects: [postgres]}
events:
  - {name: ORDER_PAID, topic: a, key: id, fields: [{name: id, type: string}]}
  - {name: ORDER_STATUS, topic: b, key: id, fields: [{name: id, type: string}]}
consumers:
  - name: points
    events: [ORDER_STATUS]
    latest_only: [ORDER_STATUS, ORDER_STATUS, ORDER_PAID, ORDER_STATSU, NOPE, {name: x}]
  - name: sms
    events: [ORDER_PAID]
    latest_only: ORDER_PAID
  - name: push
    events: [ORDER_PAID]
    latest_only: []
`,
		want: `testdata.yaml:10:33: consumer points lists event ORDER_STATUS twice in latest_only (first at line 10); remove one
testdata.yaml:10:47: consumer points lists ORDER_PAID under latest_only but does not handle it; add it to its events or remove it from latest_only
testdata.yaml:10:59: consumer points lists unknown event "ORDER_STATSU" under latest_only; did you mean ORDER_STATUS?
testdata.yaml:10:73: consumer points lists unknown event "NOPE" under latest_only; list events of its events: there
testdata.yaml:10:79: each event of latest_only of consumer points must be a string, got a mapping
testdata.yaml:13:18: latest_only of consumer sms must be a list, got the string "ORDER_PAID"`,
	},
	{
		name: "go name collisions",
		src: `version: 1
go: {package: events, out: gen}
sql: {dialects: [postgres]}
types:
  - name: OrderPaid
    enum: [a]
  - name: Writer
    fields: [{name: a, type: string}]
  - name: Status
    enum: [in_stock, in-stock]
events:
  - {name: ORDER_PAID, topic: a, key: id, fields: [{name: id, type: string}]}
  - {name: ORDER, topic: a, key: id, fields: [{name: id, type: string}]}
  - {name: ORDER_TYPE, topic: a, key: id, fields: [{name: id, type: string}]}
  - {name: ORDER_I_D, topic: a, key: id, fields: [{name: id, type: string}]}
  - {name: ORDER_ID, topic: a, key: id, fields: [{name: id, type: string}]}
  - {name: EVENT_TYPES, topic: a, key: id, fields: [{name: id, type: string}]}
  - {name: SMS_HANDLER, topic: a, key: id, fields: [{name: id, type: string}]}
  - {name: BIND, topic: a, key: id, fields: [{name: id, type: string}]}
consumers:
  - {name: sms, events: [ORDER]}
`,
		want: `testdata.yaml:7:5: type Writer collides with the reserved package-level name Writer of the generated code; rename it
testdata.yaml:10:22: enum constant StatusInStock for value in-stock of type Status collides with enum constant StatusInStock for value in_stock of type Status (line 10); rename one of them
testdata.yaml:12:5: Go type OrderPaid of event ORDER_PAID collides with type OrderPaid (line 5); rename one of them
testdata.yaml:14:5: Go type OrderType of event ORDER_TYPE collides with constant OrderType of event ORDER (line 13); rename one of them
testdata.yaml:16:5: Go type OrderID of event ORDER_ID collides with Go type OrderID of event ORDER_I_D (line 15); rename one of them
testdata.yaml:17:5: Go type EventTypes of event EVENT_TYPES collides with the reserved package-level name EventTypes of the generated code; rename it
testdata.yaml:19:5: Go type Bind of event BIND collides with the reserved package-level name Bind of the generated code; rename it
testdata.yaml:21:5: handler type SmsHandler of consumer sms collides with Go type SmsHandler of event SMS_HANDLER (line 18); rename one of them`,
	},
	{
		name: "go name clashes reported in one run",
		src: `version: 1
go: {package: events, out: gen}
sql: {dialects: [postgres]}
types:
  - name: OrderPaidType
    enum: [a]
  - name: Line
    fields:
      - {name: validate, type: string}
      - {name: sku, type: string}
events:
  - name: ORDER_PAID
    topic: orders
    key: id
    fields:
      - {name: id, type: string}
      - {name: Validate, type: bool}
      - {name: line, type: Line}
      - {name: total, type: Mony}
`,
		want: `testdata.yaml:9:16: field validate of type Line has the Go name Validate, which collides with the generated Validate method; rename it
testdata.yaml:12:5: constant OrderPaidType of event ORDER_PAID collides with type OrderPaidType (line 5); rename one of them
testdata.yaml:17:16: field Validate of event ORDER_PAID has the Go name Validate, which collides with the generated Validate method; rename it
testdata.yaml:19:29: unknown type "Mony"; use a scalar (string, bool, int32, int64, float64, bytes, time, uuid, decimal, json), list<T>, map<T> or a type declared under types:`,
	},
	{
		name: "list items of the wrong kind",
		src: `version: 1
go: {package: events, out: gen}
sql: {dialects: [postgres, [mysql]]}
types: [Address]
events:
  - ORDER_PAID
  - name: B
    topic: b
    key: id
    fields: [id]
consumers:
  - points
  - {name: sms, events: [{name: B}]}
`,
		want: `testdata.yaml:3:28: each dialect must be a string, got a list
testdata.yaml:4:9: types[0] must be a mapping, got the string "Address"
testdata.yaml:6:5: events[0] must be a mapping, got the string "ORDER_PAID"
testdata.yaml:9:10: key "id" of event B names no field; declare it under fields:
testdata.yaml:10:14: fields[0] of event B must be a mapping, got the string "id"
testdata.yaml:12:5: consumers[0] must be a mapping, got the string "points"
testdata.yaml:13:26: each event of consumer sms must be a string, got a mapping`,
	},
	{
		name: "non-string keys",
		src: `version: 1
go: {package: events, out: gen}
sql: {dialects: [postgres]}
? [a, b]
: c
events:
  - {name: A, topic: a, key: id, fields: [{name: id, type: string}]}
`,
		want: `testdata.yaml:4:3: keys in the top-level mapping must be plain strings, got a list`,
	},
	{
		name: "aliases and merge keys",
		src: `version: 1
go: {package: events, out: gen}
sql: {dialects: [postgres]}
x-common: &idfield {name: id, type: string}
events:
  - name: A
    topic: a
    key: id
    fields: [*idfield]
  - name: B
    <<: {topic: b}
    key: id
    fields: [*idfield, *idfield]
`,
		want: `testdata.yaml:10:5: event B is missing required key "topic"; add topic: the broker topic to publish to, e.g. orders.paid
testdata.yaml:11:5: merge keys (<<) are not supported in event B; write the keys out
testdata.yaml:13:24: duplicate field id in event B (first at line 13); rename or remove one`,
	},
	{
		name: "many problems at once",
		src: `version: 3
go:
  package: events
  out: gen
  driver: pgx/v5
sql:
  dialects: [postgres, mysql]
  outbox_table: Outbox
types:
  - name: Money
    fields:
      - {name: cents, type: int64}
      - {name: cents, type: int32}
events:
  - name: ORDER_PAID
    topic: orders paid
    key: total
    fields:
      - {name: id, type: string}
      - {name: total, type: Mony}
  - name: ORDER_PAID
    topic: orders.paid
    key: id
    fields: [{name: id, type: list<>}]
consumers:
  - {name: points, events: [ORDER_SHIPPED]}
`,
		want: `testdata.yaml:1:10: unsupported version 3; this outboxgen reads version 1
testdata.yaml:5:11: go.driver pgx/v5 works only with postgres, but sql.dialects also lists mysql; use driver database/sql, or set dialects: [postgres]
testdata.yaml:8:17: sql.outbox_table "Outbox" is not a safe SQL identifier; use 1 to 63 lower-case letters, digits and underscores, starting with a letter or underscore (this prevents SQL injection, as the name is spliced into SQL)
testdata.yaml:13:16: duplicate field cents in type Money (first at line 12); rename or remove one
testdata.yaml:16:12: invalid topic "orders paid"; use 1 to 249 letters, digits, '.', '_', '-' or '/', starting with a letter or digit (no spaces or wildcards)
testdata.yaml:20:29: unknown type "Mony"; did you mean Money?
testdata.yaml:21:11: duplicate event ORDER_PAID (first at line 15); rename or remove one
testdata.yaml:24:36: invalid type "list<>": expected a type name, found ">"
testdata.yaml:26:29: consumer points handles unknown event "ORDER_SHIPPED"; declare it under events: or remove it`,
	},
	{
		name: "naming keys misspelt or misplaced",
		src: `version: 1
go: {package: events, out: gen, initialism: [sms]}
sql: {dialects: [postgres]}
rename: {sms: SMS}
events:
  - {name: SMS_SENT, topic: a, key: id, fields: [{name: id, type: string}]}
`,
		want: `testdata.yaml:2:33: unknown key "initialism" in go; did you mean "initialisms"?
testdata.yaml:4:1: unknown key "rename" in the top-level mapping; did you mean go.rename (under go:)?`,
	},
	{
		name: "bad go.initialisms",
		src: `version: 1
go:
  package: events
  out: gen
  initialisms: [id, sms_code, "-", ID, [x], "2"]
sql: {dialects: [postgres]}
events:
  - {name: SMS_SENT, topic: a, key: id, fields: [{name: id, type: string}]}
`,
		want: `testdata.yaml:5:21: go.initialisms entry "sms_code" is not one word; list its words (sms, code) one by one, or map the whole name to its Go name under go.rename
testdata.yaml:5:31: go.initialisms entry "-" is not a word; use letters and digits, e.g. sms
testdata.yaml:5:36: duplicate go.initialisms entry ID (first at line 5); remove one
testdata.yaml:5:40: each entry of go.initialisms must be a string, got a list
testdata.yaml:5:45: go.initialisms entry "2" is not a word; use letters and digits, e.g. sms`,
	},
	{
		name: "go.initialisms not a list",
		src: `version: 1
go: {package: events, out: gen, initialisms: sms}
sql: {dialects: [postgres]}
events:
  - {name: SMS_SENT, topic: a, key: id, fields: [{name: id, type: string}]}
`,
		want: `testdata.yaml:2:46: go.initialisms must be a list, got the string "sms"`,
	},
	{
		name: "bad go.rename",
		src: `version: 1
go:
  package: events
  out: gen
  rename:
    Country_DE: CountryDE
    sms!: SMS
    sent: sent
    id: Order-ID
    code: [Code]
    msisdn: Phone Number
    " ": X
    text: Body
    text: Text
sql: {dialects: [postgres]}
types:
  - {name: Country, enum: [DE]}
events:
  - name: SMS_SENT
    topic: a
    key: id
    fields:
      - {name: id, type: string}
      - {name: code, type: string}
      - {name: msisdn, type: string}
      - {name: text, type: Country}
`,
		want: `testdata.yaml:6:5: go.rename key "Country_DE" must be a name or name part in lower-case snake_case; did you mean "country_de"?
testdata.yaml:7:5: go.rename key "sms!" must be a name or name part in lower-case snake_case; did you mean "sms"?
testdata.yaml:8:11: go.rename of "sent": "sent" is not an exported Go identifier; use an upper-case ASCII letter, then letters, digits or underscores; did you mean Sent?
testdata.yaml:9:9: go.rename of "id": "Order-ID" is not an exported Go identifier; use an upper-case ASCII letter, then letters, digits or underscores; did you mean OrderID?
testdata.yaml:10:11: go.rename of "code" must be a string, got a list
testdata.yaml:11:13: go.rename of "msisdn": "Phone Number" is not an exported Go identifier; use an upper-case ASCII letter, then letters, digits or underscores; did you mean PhoneNumber?
testdata.yaml:12:5: go.rename key " " must be a name or name part in lower-case snake_case, e.g. sms or country_de
testdata.yaml:14:5: duplicate key "text" in go.rename (first at line 13); remove one of them`,
	},
	{
		name: "go.rename not a mapping",
		src: `version: 1
go: {package: events, out: gen, rename: [sms, SMS]}
sql: {dialects: [postgres]}
events:
  - {name: SMS_SENT, topic: a, key: id, fields: [{name: id, type: string}]}
`,
		want: `testdata.yaml:2:41: go.rename must be a mapping, got a list`,
	},
	{
		name: "go.rename keys that match nothing",
		src: `version: 1
go:
  package: events
  out: gen
  rename:
    smss: SMS
    address: Addr
    paid_order: PaidOrder
    sms_sent_at: SentAt
sql: {dialects: [postgres]}
types:
  - name: Address
    fields: [{name: street, type: string}]
events:
  - name: SMS_SENT
    topic: a
    key: id
    fields:
      - {name: id, type: string}
      - {name: sent_at, type: time}
`,
		want: `testdata.yaml:6:5: go.rename key "smss" matches no name or name part in the spec; did you mean "sms"?
testdata.yaml:7:5: go.rename key "address" matches no name it applies to: type Address is named as written; rename it under types: instead
testdata.yaml:8:5: go.rename key "paid_order" matches no name or name part in the spec (event, consumer, field or enum value names, or their snake_case words); remove it
testdata.yaml:9:5: go.rename key "sms_sent_at" matches no name or name part in the spec; did you mean "sms_sent"?`,
	},
	{
		name: "collisions made by go.rename",
		src: `version: 1
go:
  package: events
  out: gen
  rename:
    sms: SMS
    body: Text
    sms_sent: Notice
    de: DE
    deu: DE
    texts: SMS
    order_paid: Writer
    check: Validate
sql: {dialects: [postgres]}
types:
  - name: Notice
    fields: [{name: id, type: string}]
  - name: Country
    enum: [DE, Deu]
events:
  - name: SMS_SENT
    topic: a
    key: id
    fields:
      - {name: id, type: string}
      - {name: text, type: string}
      - {name: body, type: string}
      - {name: check, type: bool}
  - {name: SMS_HANDLER, topic: a, key: id, fields: [{name: id, type: string}]}
  - {name: ORDER_PAID, topic: a, key: id, fields: [{name: id, type: string}]}
consumers:
  - {name: texts, events: [SMS_HANDLER]}
`,
		want: `testdata.yaml:19:16: enum constant CountryDE for value Deu of type Country (named by go.rename deu: DE at line 10) collides with enum constant CountryDE for value DE of type Country (line 19; named by go.rename de: DE at line 9); rename one of them
testdata.yaml:21:5: Go type Notice of event SMS_SENT (named by go.rename sms_sent: Notice at line 8) collides with type Notice (line 16); rename one of them
testdata.yaml:27:16: field body (named by go.rename body: Text at line 7) collides with text (line 26) as Go name Text; rename one of them
testdata.yaml:28:16: field check of event SMS_SENT has the Go name Validate (named by go.rename check: Validate at line 13), which collides with the generated Validate method; rename it
testdata.yaml:30:5: Go type Writer of event ORDER_PAID (named by go.rename order_paid: Writer at line 12) collides with the reserved package-level name Writer of the generated code; rename it
testdata.yaml:32:5: handler type SMSHandler of consumer texts (named by go.rename texts: SMS at line 11) collides with Go type SMSHandler of event SMS_HANDLER (line 29; named by go.rename sms: SMS at line 6); rename one of them`,
	},
}

func TestErrors(t *testing.T) {
	for _, tc := range errorCases {
		t.Run(strings.ReplaceAll(tc.name, " ", "_"), func(t *testing.T) {
			s, err := Parse("testdata.yaml", []byte(tc.src))
			if err == nil {
				t.Fatalf("Parse succeeded (%d events), want errors:\n%s", len(s.Events), tc.want)
			}
			if s != nil {
				t.Errorf("Parse returned a spec along with errors")
			}
			list, ok := err.(ErrorList)
			if !ok {
				t.Fatalf("error is %T, want ErrorList", err)
			}
			if got := list.Error(); got != tc.want {
				t.Errorf("errors mismatch\n--- got\n%s\n--- want\n%s", got, tc.want)
			}
			for _, e := range list {
				if e.File != "testdata.yaml" || e.Pos.Line < 1 || e.Pos.Col < 1 {
					t.Errorf("bad error position: %+v", *e)
				}
			}
		})
	}
}

func TestErrorListFormat(t *testing.T) {
	l := ErrorList{
		{File: "a.yaml", Pos: Pos{3, 1}, Msg: "third"},
		{File: "a.yaml", Pos: Pos{1, 9}, Msg: "second"},
		{File: "a.yaml", Pos: Pos{1, 2}, Msg: "first"},
		{File: "a.yaml", Pos: Pos{3, 1}, Msg: "third"},
		nil,
	}
	want := "a.yaml:1:2: first\na.yaml:1:9: second\na.yaml:3:1: third"
	if got := l.normalize().Error(); got != want {
		t.Errorf("got\n%s\nwant\n%s", got, want)
	}
	if got := (&Error{File: "a.yaml", Msg: "cannot read"}).Error(); got != "a.yaml: cannot read" {
		t.Errorf("positionless error = %q", got)
	}
}
