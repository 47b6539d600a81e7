// Command outboxgen generates typed transactional-outbox code from events.yaml.
//
// Usage:
//
//	outboxgen init     [-f events.yaml]         write a starter events.yaml
//	outboxgen generate [-f events.yaml]         write the Go code and SQL DDL
//	outboxgen check    [-f events.yaml]         validate; fail with a diff when generated files are stale
//	outboxgen schema   -dialect D [-f events.yaml] print the DDL for one dialect
//	outboxgen grants   -dialect D -database DB [role flags] print the least-privilege GRANT script
//	outboxgen version                           print the version
//
// Exit codes: 0 success, 1 the work failed (invalid events.yaml, stale
// files, I/O), 2 the command line was wrong.
//
// In a Go package, add
//
//	//go:generate go tool outboxgen generate
//
// next to events.yaml (with `tool github.com/outboxgen/outboxgen/cmd/outboxgen`
// in go.mod), or `go run github.com/outboxgen/outboxgen/cmd/outboxgen generate`.
package main

import (
	_ "embed"
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"os"
	"runtime/debug"
	"slices"

	"github.com/outboxgen/outboxgen/generator"
	"github.com/outboxgen/outboxgen/generator/spec"
	"github.com/outboxgen/outboxgen/templates"
)

//go:embed starter.yaml
var starter []byte

const defaultSpec = "events.yaml"

// errUsage marks command-line mistakes (exit code 2).
var errUsage = errors.New("usage")

// errStale marks a failed check whose diff was already printed.
var errStale = errors.New("generated files are out of date")

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

const usage = `outboxgen generates typed transactional-outbox code from events.yaml.

Usage:
  outboxgen <command> [flags]

Commands:
  init       write a starter events.yaml
  generate   write the Go code and SQL DDL described by events.yaml
  check      validate events.yaml and fail with a diff when generated files are stale
  schema     print the outbox and inbox DDL for one dialect
  grants     print the GRANT script giving each component's role exactly what it needs
  version    print the version

Run "outboxgen <command> -h" for a command's flags.
Exit codes: 0 success, 1 failure, 2 bad command line.
`

func run(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return 2
	}
	cmd, args := args[0], args[1:]
	var err error
	switch cmd {
	case "init":
		err = cmdInit(args, stdout, stderr)
	case "generate", "gen":
		err = cmdGenerate(args, stdout, stderr)
	case "check", "diff":
		err = cmdCheck(args, stdout, stderr)
	case "schema":
		err = cmdSchema(args, stdout, stderr)
	case "grants":
		err = cmdGrants(args, stdout, stderr)
	case "version":
		fmt.Fprintln(stdout, "outboxgen", version())
	case "-h", "-help", "--help", "help":
		fmt.Fprint(stdout, usage)
	default:
		fmt.Fprintf(stderr, "outboxgen: unknown command %q\n\n%s", cmd, usage)
		return 2
	}
	switch {
	case err == nil:
		return 0
	case errors.Is(err, flag.ErrHelp):
		return 0
	case errors.Is(err, errUsage):
		return 2
	case errors.Is(err, errStale):
		return 1
	default:
		fmt.Fprintln(stderr, err)
		return 1
	}
}

// newFlags returns a FlagSet whose -h text starts with the command's usage line.
func newFlags(name, synopsis string, stderr io.Writer) *flag.FlagSet {
	fl := flag.NewFlagSet(name, flag.ContinueOnError)
	fl.SetOutput(stderr)
	fl.Usage = func() {
		fmt.Fprintf(stderr, "usage: outboxgen %s\n\n", synopsis)
		fl.PrintDefaults()
	}
	return fl
}

// parseFlags parses args and rejects positional arguments.
func parseFlags(fl *flag.FlagSet, args []string) error {
	if err := fl.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return err
		}
		return errUsage
	}
	if fl.NArg() > 0 {
		fmt.Fprintf(fl.Output(), "outboxgen %s: unexpected argument %q\n", fl.Name(), fl.Arg(0))
		fl.Usage()
		return errUsage
	}
	return nil
}

func cmdInit(args []string, stdout, stderr io.Writer) error {
	fl := newFlags("init", "init [-f events.yaml]", stderr)
	file := fl.String("f", defaultSpec, "path of the events.yaml to create")
	if err := parseFlags(fl, args); err != nil {
		return err
	}
	f, err := os.OpenFile(*file, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o644)
	if errors.Is(err, fs.ErrExist) {
		return fmt.Errorf("outboxgen init: %s already exists; remove it first or pass -f another.yaml", *file)
	}
	if err != nil {
		return fmt.Errorf("outboxgen init: %w", err)
	}
	if _, err := f.Write(starter); err != nil {
		f.Close()
		return fmt.Errorf("outboxgen init: %w", err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("outboxgen init: %w", err)
	}
	fmt.Fprintf(stdout, "wrote %s; edit it, then run: outboxgen generate -f %s\n", *file, *file)
	return nil
}

func cmdGenerate(args []string, stdout, stderr io.Writer) error {
	fl := newFlags("generate", "generate [-f events.yaml] [-v]", stderr)
	file := fl.String("f", defaultSpec, "path of events.yaml")
	verbose := fl.Bool("v", false, "list the files written")
	if err := parseFlags(fl, args); err != nil {
		return err
	}
	files, err := load(*file)
	if err != nil {
		return err
	}
	written, err := generator.Write(files)
	if err != nil {
		return fmt.Errorf("outboxgen generate: %w", err)
	}
	if *verbose {
		deleted := map[string]bool{}
		generated := 0
		for _, f := range files {
			if f.Delete {
				deleted[f.Path] = true
			} else {
				generated++
			}
		}
		for _, p := range written {
			if deleted[p] {
				fmt.Fprintln(stdout, "removed", p, "(no longer generated)")
			} else {
				fmt.Fprintln(stdout, "wrote", p)
			}
		}
		fmt.Fprintf(stdout, "%d files, %d changed\n", generated, len(written))
	}
	return nil
}

func cmdCheck(args []string, stdout, stderr io.Writer) error {
	fl := newFlags("check", "check [-f events.yaml]", stderr)
	file := fl.String("f", defaultSpec, "path of events.yaml")
	if err := parseFlags(fl, args); err != nil {
		return err
	}
	files, err := load(*file)
	if err != nil {
		return err
	}
	diff, err := generator.Diff(files)
	if err != nil {
		return fmt.Errorf("outboxgen check: %w", err)
	}
	if diff != "" {
		fmt.Fprint(stdout, diff)
		fmt.Fprintf(stderr, "outboxgen check: generated files are out of date; run: outboxgen generate -f %s\n", *file)
		return errStale
	}
	return nil
}

func cmdSchema(args []string, stdout, stderr io.Writer) error {
	fl := newFlags("schema", "schema -dialect postgres|mysql|sqlite [-f events.yaml] [-outbox-table T] [-inbox-table T]", stderr)
	dialect := fl.String("dialect", "", "SQL dialect: postgres, mysql (also MariaDB) or sqlite (required)")
	file := fl.String("f", "", "read table names from this events.yaml (default: events.yaml when present)")
	outbox := fl.String("outbox-table", "", "outbox table name (default from events.yaml, else outbox_event)")
	inbox := fl.String("inbox-table", "", "inbox table name (default from events.yaml, else outbox_inbox)")
	if err := parseFlags(fl, args); err != nil {
		return err
	}
	if *dialect == "" {
		fmt.Fprintln(stderr, "outboxgen schema: -dialect is required")
		fl.Usage()
		return errUsage
	}
	tables, err := specTables(*file, *outbox, *inbox)
	if err != nil {
		return err
	}
	d := normalizeDialect(*dialect)
	if !slices.Contains(templates.Dialects(), d) {
		fmt.Fprintf(stderr, "outboxgen schema: unknown dialect %q: use postgres, mysql (also MariaDB) or sqlite\n", *dialect)
		return errUsage
	}
	ddl, err := templates.Render(d, tables)
	if err != nil {
		return fmt.Errorf("outboxgen schema: %w", err)
	}
	_, err = stdout.Write(ddl)
	return err
}

// specTables returns the table names of the spec at path (events.yaml in
// the current directory when path is empty and that file exists; else the
// defaults), overridden by outbox and inbox when they are set.
func specTables(path, outbox, inbox string) (templates.Tables, error) {
	tables := templates.DefaultTables
	if path == "" {
		if _, err := os.Stat(defaultSpec); err == nil {
			path = defaultSpec
		}
	}
	if path != "" {
		s, err := spec.ParseFile(path)
		if err != nil {
			return tables, err
		}
		tables = templates.Tables{Outbox: s.SQL.OutboxTable, Inbox: s.SQL.InboxTable, Archive: s.SQL.ArchiveTable}
	}
	if outbox != "" {
		tables.Outbox = outbox
	}
	if inbox != "" {
		tables.Inbox = inbox
	}
	return tables, nil
}

func cmdGrants(args []string, stdout, stderr io.Writer) error {
	fl := newFlags("grants", "grants -dialect postgres|mysql -database DB [-f events.yaml] [-writer R] [-relay R] [-sweeper R] [-monitor R] [-janitor R] [-consumer R]", stderr)
	dialect := fl.String("dialect", "", "SQL dialect: postgres or mysql (also MariaDB); SQLite has no grants (required)")
	database := fl.String("database", "", "the database holding the tables (required)")
	file := fl.String("f", "", "read table names from this events.yaml (default: events.yaml when present)")
	outbox := fl.String("outbox-table", "", "outbox table name (default from events.yaml, else outbox_event)")
	inbox := fl.String("inbox-table", "", "inbox table name (default from events.yaml, else outbox_inbox)")
	schemaName := fl.String("schema", "", "PostgreSQL schema of the tables (default public)")
	host := fl.String("host", "", "MySQL account host of every role (default %)")
	var roles templates.Roles
	fl.StringVar(&roles.Writer, "writer", "", "role of the services calling the generated InsertX writers")
	fl.StringVar(&roles.Relay, "relay", "", "role of the relay")
	fl.StringVar(&roles.Sweeper, "sweeper", "", "role of the sweeper")
	fl.StringVar(&roles.Monitor, "monitor", "", "role of the monitor")
	fl.StringVar(&roles.Janitor, "janitor", "", "role of the janitor")
	fl.StringVar(&roles.Consumer, "consumer", "", "role of the consumers (inbox)")
	if err := parseFlags(fl, args); err != nil {
		return err
	}
	if *dialect == "" || *database == "" {
		fmt.Fprintln(stderr, "outboxgen grants: -dialect and -database are required")
		fl.Usage()
		return errUsage
	}
	if roles == (templates.Roles{}) {
		roles = templates.Roles{Writer: "outbox_writer", Relay: "outbox_relay", Sweeper: "outbox_sweeper",
			Monitor: "outbox_monitor", Janitor: "outbox_janitor", Consumer: "outbox_consumer"}
	}
	tables, err := specTables(*file, *outbox, *inbox)
	if err != nil {
		return err
	}
	script, err := templates.RenderGrants(normalizeDialect(*dialect), templates.GrantParams{
		Tables: tables, Database: *database, Schema: *schemaName, Host: *host, Roles: roles,
	})
	if err != nil {
		return fmt.Errorf("outboxgen grants: %w", err)
	}
	_, err = stdout.Write(script)
	return err
}

// normalizeDialect accepts the same aliases as events.yaml.
func normalizeDialect(d string) string {
	switch d {
	case "postgresql", "pgx":
		return "postgres"
	case "mariadb":
		return "mysql"
	case "sqlite3":
		return "sqlite"
	}
	return d
}

// load parses the spec and renders every file it describes.
func load(path string) ([]generator.File, error) {
	s, err := spec.ParseFile(path)
	if err != nil {
		return nil, err
	}
	return generator.Files(s)
}

// version reports the module version outboxgen was built from.
func version() string {
	if bi, ok := debug.ReadBuildInfo(); ok && bi.Main.Version != "" {
		return bi.Main.Version
	}
	return "(devel)"
}
