package main

// outboxgen migrate: the schema version of outboxgen's tables, and the
// numbered migrations that bring them to the latest (package
// runtime/migrate does the work).

import (
	"context"
	"fmt"
	"io"
	"os"

	"github.com/outboxgen/outboxgen/runtime/dsn"
	"github.com/outboxgen/outboxgen/runtime/migrate"
	"github.com/outboxgen/outboxgen/runtime/redact"
)

const migrateSynopsis = "migrate [-db DSN] [-f events.yaml] [-o json] [status|up]"

func cmdMigrate(args []string, stdout, stderr io.Writer) error {
	fl := newFlags("migrate", migrateSynopsis+"\n\n"+
		"  status  (the default) print the schema version, the migrations applied and pending; change nothing\n"+
		"  up      apply the pending migrations, each with its version record, and say what changed", stderr)
	dbf := addDBFlags(fl, true)
	// The action may come first (outboxgen migrate up -db ...) or last.
	action := ""
	if len(args) > 0 && (args[0] == "up" || args[0] == "status") {
		action, args = args[0], args[1:]
	}
	if err := fl.Parse(args); err != nil {
		return err
	}
	switch rest := fl.Args(); {
	case len(rest) == 1 && action == "" && (rest[0] == "up" || rest[0] == "status"):
		action = rest[0]
	case len(rest) > 0:
		fmt.Fprintf(stderr, "outboxgen migrate: unexpected argument %q: use status or up\n", rest[0])
		fl.Usage()
		return errUsage
	}
	if action == "" {
		action = "status"
	}
	if err := dbf.check(); err != nil {
		return err
	}
	// up creates the SQLite file of a new database (the other commands
	// refuse a missing one, which is most often a wrong path).
	created := ""
	if src, err := dsn.Parse(dbf.db, ""); action == "up" && err == nil && src.Path != "" {
		if f, err := os.OpenFile(src.Path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600); err == nil {
			f.Close()
			created = src.Path
		}
	}
	ctx, cancel := interruptContext()
	defer cancel()
	octx, cancelT := context.WithTimeout(ctx, dbf.timeout)
	defer cancelT()
	o, err := dbf.open(octx)
	if err != nil {
		return fmt.Errorf("outboxgen migrate: %s", oneLine(err))
	}
	defer o.Close()
	if created != "" && !dbf.json() {
		fmt.Fprintf(stdout, "created the SQLite file %s\n", created)
	}
	fail := func(err error) error {
		return fmt.Errorf("outboxgen migrate %s: %s", action, oneLine(fmt.Errorf("%s", redact.StringWith(err.Error(), o.Source.Secrets...))))
	}
	d, tables := o.Source.Dialect, o.Schema.Tables
	if action == "status" {
		// -timeout bounds the reading.
		s, err := migrate.Status(octx, o.DB, d, tables)
		if err != nil {
			return fail(err)
		}
		if dbf.json() {
			return writeJSON(stdout, struct {
				Database string `json:"database"`
				migrate.State
			}{o.Source.Where, s})
		}
		fmt.Fprintf(stdout, "database:   %s\n%s", o.Source.Where, s)
		return nil
	}
	// up: -timeout bounds connecting only; a migration of a big table may
	// take long (Ctrl-C cancels it: PostgreSQL and SQLite roll it back).
	r, err := migrate.Up(ctx, o.DB, d, tables)
	if dbf.json() {
		if jerr := writeJSON(stdout, struct {
			Database string `json:"database"`
			migrate.Report
			Changed bool   `json:"changed"`
			Created string `json:"created_file,omitempty"`
			Error   string `json:"error,omitempty"`
		}{o.Source.Where, r, r.Changed() || created != "", created, errText(err, o.Source.Secrets)}); jerr != nil {
			return jerr
		}
	} else {
		fmt.Fprintf(stdout, "database: %s\n%s", o.Source.Where, r)
	}
	if err != nil {
		return fail(err)
	}
	return nil
}

// errText is err's text with secrets masked, "" for nil.
func errText(err error, secrets []string) string {
	if err == nil {
		return ""
	}
	return redact.StringWith(err.Error(), secrets...)
}
