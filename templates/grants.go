package templates

import (
	"bytes"
	"embed"
	"fmt"
	"regexp"
	"text/template"
)

//go:embed grants/*.sql.tmpl
var grantFiles embed.FS

var grantTmpl = template.Must(template.New("").Option("missingkey=error").ParseFS(grantFiles, "grants/*.sql.tmpl"))

// Roles names the database role (PostgreSQL) or account user name
// (MySQL/MariaDB) of each outboxgen component. An empty name leaves that
// component out of the script.
type Roles struct {
	Writer   string // services calling the generated InsertX writers (and txpublisher)
	Relay    string // runtime/relay, including ListFailed and Requeue
	Sweeper  string // runtime/sweeper
	Monitor  string // runtime/monitor
	Janitor  string // runtime/janitor (and its archive mode when Tables.Archive is set)
	Consumer string // generated RegisterX consumers (runtime/inbox)
}

// GrantParams parameterises RenderGrants.
type GrantParams struct {
	// Tables are the table names (Tables.Archive optional: the janitor's
	// archive table).
	Tables Tables
	// Database is the database holding the tables: PostgreSQL grants
	// CONNECT on it, MySQL qualifies the tables with it. Required.
	Database string
	// Schema is the PostgreSQL schema of the tables (default "public").
	Schema string
	// Host is the MySQL account host of every role (default "%").
	Host string
	// Roles names the roles; at least one is required.
	Roles Roles
	// WAL is sql.wal (PostgreSQL only): the writer also gets USAGE on the
	// outbox id sequence (the WAL statement numbers each event with
	// nextval), and the relay role, which then also runs the streaming
	// relay (runtime/walrelay), gets the REPLICATION attribute, INSERT on
	// the outbox table (parking) and the publication
	// outboxgen_<outbox table>, created empty if missing, so that it
	// needs no CREATE on the database.
	WAL bool
}

var hostRE = regexp.MustCompile(`^[A-Za-z0-9_.%:\-]{1,255}$`)

// RenderGrants returns the GRANT script of dialect d ("postgres" or
// "mysql"): for each role in p.Roles, exactly the privileges its component
// needs on p.Tables (internal/privtest proves each one necessary and the
// set sufficient). SQLite has no privileges: it returns an error saying
// so. Roles and the database are identifiers like the table names
// (lower-case letters, digits, '_'), as they are spliced into SQL.
func RenderGrants(d string, p GrantParams) ([]byte, error) {
	switch d {
	case "postgres", "mysql":
	case "sqlite":
		return nil, fmt.Errorf("SQLite has no GRANT: protect the database file with file permissions (a read-only file or mode=ro DSN is enough for a monitor)")
	default:
		return nil, fmt.Errorf("unknown dialect %q: use postgres or mysql", d)
	}
	if err := p.Tables.Validate(); err != nil {
		return nil, err
	}
	if p.Schema == "" {
		p.Schema = "public"
	}
	if p.Host == "" {
		p.Host = "%"
	}
	idents := []struct{ what, name string }{{"database", p.Database}, {"schema", p.Schema}}
	named := false
	for _, r := range []struct{ what, name string }{
		{"writer role", p.Roles.Writer}, {"relay role", p.Roles.Relay}, {"sweeper role", p.Roles.Sweeper},
		{"monitor role", p.Roles.Monitor}, {"janitor role", p.Roles.Janitor}, {"consumer role", p.Roles.Consumer},
	} {
		if r.name != "" {
			idents = append(idents, r)
			named = true
		}
	}
	if !named {
		return nil, fmt.Errorf("no role named (GrantParams.Roles is empty)")
	}
	for _, id := range idents {
		if err := checkIdentifier(id.what, id.name); err != nil {
			return nil, err
		}
	}
	if !hostRE.MatchString(p.Host) {
		return nil, fmt.Errorf("MySQL host %q: use letters, digits, '.', '-', ':', '_' and the wildcard '%%'", p.Host)
	}
	var buf bytes.Buffer
	if err := grantTmpl.ExecuteTemplate(&buf, d+".sql.tmpl", p); err != nil {
		return nil, fmt.Errorf("render the %s grants: %w", d, err)
	}
	out := buf.Bytes()
	if len(out) == 0 || out[len(out)-1] != '\n' {
		out = append(out, '\n')
	}
	return out, nil
}
