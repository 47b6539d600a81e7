package main

// The plumbing every operations command shares: which database (-db or
// OUTBOXGEN_DB), which tables (-f events.yaml or the table flags), and the
// output format (-o text|json).

import (
	"context"
	"database/sql"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/outboxgen/outboxgen/generator"
	"github.com/outboxgen/outboxgen/generator/spec"
	"github.com/outboxgen/outboxgen/runtime/dialect"
	"github.com/outboxgen/outboxgen/runtime/driver/sqldriver"
	"github.com/outboxgen/outboxgen/runtime/dsn"
	"github.com/outboxgen/outboxgen/runtime/outbox"
	"github.com/outboxgen/outboxgen/templates"
)

// envDB is the environment variable read when -db is not given.
const envDB = "OUTBOXGEN_DB"

// dbFlags are the flags of every command that works on the database.
type dbFlags struct {
	db       string
	spec     string
	outbox   string
	inbox    string
	archive  string
	output   string
	timeout  time.Duration
	fl       *flag.FlagSet
	noOutput bool
}

// addDBFlags defines -db, -f, the table flags, -o and -timeout on fl.
// withOutput false leaves -o out (for commands that print no report).
func addDBFlags(fl *flag.FlagSet, withOutput bool) *dbFlags {
	f := &dbFlags{fl: fl, noOutput: !withOutput}
	fl.StringVar(&f.db, "db", "", "the database: postgres://…, mysql://user:pass@tcp(host:3306)/db, sqlite:path or a *.db file (default $"+envDB+")")
	fl.StringVar(&f.spec, "f", "", "read table names and event types from this events.yaml (default: events.yaml when present)")
	fl.StringVar(&f.outbox, "outbox-table", "", "outbox table name (default from events.yaml, else "+templates.DefaultTables.Outbox+")")
	fl.StringVar(&f.inbox, "inbox-table", "", "inbox table name (default from events.yaml, else "+templates.DefaultTables.Inbox+")")
	fl.StringVar(&f.archive, "archive-table", "", "archive table name (default from events.yaml: sql.archive_table)")
	if withOutput {
		fl.StringVar(&f.output, "o", "text", "output format: text (tables for people) or json (for scripts)")
	}
	fl.DurationVar(&f.timeout, "timeout", 30*time.Second, "give up connecting and querying after this long")
	return f
}

// check validates the flags that need no database (exit code 2 when wrong).
func (f *dbFlags) check() error {
	if !f.noOutput && f.output != "text" && f.output != "json" {
		fmt.Fprintf(f.fl.Output(), "outboxgen %s: -o %q: use text or json\n", f.fl.Name(), f.output)
		return errUsage
	}
	if f.db == "" {
		f.db = os.Getenv(envDB)
	}
	if f.db == "" {
		fmt.Fprintf(f.fl.Output(), "outboxgen %s: no database: pass -db DSN or set %s\n", f.fl.Name(), envDB)
		return errUsage
	}
	return nil
}

// json reports whether -o json was asked for.
func (f *dbFlags) json() bool { return f.output == "json" }

// opsDB is an open outbox database with the schema the commands use.
type opsDB struct {
	DB     *sql.DB
	Source dsn.Source
	Schema outbox.Schema
	Driver *sqldriver.Driver
}

// Close closes the database.
func (o *opsDB) Close() error { return o.DB.Close() }

// open reads the schema, opens the database (failing fast when it is
// unreachable) and builds the driver. Errors never show a password.
func (f *dbFlags) open(ctx context.Context) (*opsDB, error) {
	if err := f.check(); err != nil {
		return nil, err
	}
	src, err := dsn.Parse(f.db, "")
	if err != nil {
		return nil, fmt.Errorf("-db: %w", err)
	}
	schema, err := f.schema(src.Dialect)
	if err != nil {
		return nil, err
	}
	db, src, err := dsn.Open(ctx, f.db, "", f.timeout)
	if err != nil {
		return nil, err
	}
	drv, err := sqldriver.New(db, schema)
	if err != nil {
		db.Close()
		return nil, err
	}
	return &opsDB{DB: db, Source: src, Schema: schema, Driver: drv}, nil
}

// schema is the runtime schema for a database in dialect d: from
// events.yaml (-f, or events.yaml in the working directory) when there is
// one, else the default table names; the table flags override either.
// Without events.yaml every event type counts as ordered (the safe choice:
// per-key order is kept for all of them).
func (f *dbFlags) schema(d dialect.Dialect) (outbox.Schema, error) {
	s := outbox.Schema{Source: defaultSpec, Dialects: []outbox.Dialect{d}}
	t := templates.DefaultTables
	path := f.spec
	if path == "" {
		if _, err := os.Stat(defaultSpec); err == nil {
			path = defaultSpec
		}
	}
	if path != "" {
		sp, err := spec.ParseFile(path)
		if err != nil {
			return s, err
		}
		t = generator.Tables(sp)
		s = runtimeSchema(sp)
	}
	if f.outbox != "" {
		t.Outbox = f.outbox
	}
	if f.inbox != "" {
		t.Inbox = f.inbox
	}
	if f.archive != "" {
		t.Archive = f.archive
	}
	s.Tables = outbox.Tables{Outbox: t.Outbox, Inbox: t.Inbox, Archive: t.Archive}
	if err := s.Validate(); err != nil {
		return s, err
	}
	return s, nil
}

// runtimeSchema is what the generated package's Schema variable holds for
// sp (tables are set by the caller).
func runtimeSchema(sp *spec.Spec) outbox.Schema {
	s := outbox.Schema{Source: sp.SourceName(), WAL: sp.SQL.WAL}
	for _, d := range sp.SQL.Dialects {
		s.Dialects = append(s.Dialects, outbox.Dialect(d))
	}
	for _, e := range sp.Events {
		s.EventTypes = append(s.EventTypes, outbox.EventType{Name: e.Name, Topic: e.Topic, Version: e.Version, Ordered: e.Ordered})
	}
	return s
}

// writeJSON writes v as indented JSON.
func writeJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}
