package templates_test

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/outboxgen/outboxgen/templates"
)

// grantParams is the example of the documentation: every role, the
// default tables plus an archive table.
var grantParams = templates.GrantParams{
	Tables:   templates.Tables{Outbox: "outbox_event", Inbox: "outbox_inbox", Archive: "outbox_archive"},
	Database: "orders",
	Roles: templates.Roles{Writer: "app_writer", Relay: "outbox_relay", Sweeper: "outbox_sweeper",
		Monitor: "outbox_monitor", Janitor: "outbox_janitor", Consumer: "app_consumer"},
}

// TestGrantsGolden keeps the rendered scripts in testdata/grants/ (the
// README's copies). internal/privtest proves them on real servers.
func TestGrantsGolden(t *testing.T) {
	for _, d := range []string{"postgres", "mysql"} {
		t.Run(d, func(t *testing.T) {
			got, err := templates.RenderGrants(d, grantParams)
			if err != nil {
				t.Fatal(err)
			}
			for _, stmt := range templates.Statements(got) {
				if !strings.Contains(stmt, "GRANT ") {
					t.Errorf("statement without GRANT: %q", stmt)
				}
			}
			path := filepath.Join("testdata", "grants", d+".sql")
			if *update {
				if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(path, got, 0o644); err != nil {
					t.Fatal(err)
				}
			}
			want, err := os.ReadFile(path)
			if err != nil {
				t.Fatalf("%v (run go test ./templates -update to create it)", err)
			}
			if !bytes.Equal(got, want) {
				t.Errorf("RenderGrants(%q) differs from %s; run go test ./templates -update and review the diff\n--- got ---\n%s", d, path, got)
			}
		})
	}
}

func TestGrantsOmitRoles(t *testing.T) {
	p := grantParams
	p.Roles = templates.Roles{Monitor: "mon"}
	p.Tables.Archive = ""
	for _, d := range []string{"postgres", "mysql"} {
		got, err := templates.RenderGrants(d, p)
		if err != nil {
			t.Fatal(err)
		}
		stmts := templates.Statements(got)
		for _, s := range stmts {
			s = s[strings.LastIndex(s, "\n")+1:] // the statement's last line: the GRANT
			if !strings.Contains(s, "mon") || strings.Contains(s, "outbox_inbox") || strings.Contains(s, "archive") {
				t.Errorf("%s: unexpected statement for a monitor-only script: %q", d, s)
			}
		}
		if len(stmts) == 0 {
			t.Errorf("%s: empty script", d)
		}
	}
}

func TestGrantsReject(t *testing.T) {
	cases := []struct {
		name string
		d    string
		edit func(*templates.GrantParams)
		want string
	}{
		{"sqlite", "sqlite", func(*templates.GrantParams) {}, "file permissions"},
		{"unknown dialect", "oracle", func(*templates.GrantParams) {}, "unknown dialect"},
		{"injected role", "postgres", func(p *templates.GrantParams) { p.Roles.Relay = "x; DROP TABLE outbox_event" }, "not a safe SQL identifier"},
		{"quoted role", "mysql", func(p *templates.GrantParams) { p.Roles.Writer = "a'@'%" }, "not a safe SQL identifier"},
		{"no database", "postgres", func(p *templates.GrantParams) { p.Database = "" }, "database"},
		{"bad schema", "postgres", func(p *templates.GrantParams) { p.Schema = "Public" }, "schema"},
		{"bad host", "mysql", func(p *templates.GrantParams) { p.Host = "h' IDENTIFIED BY 'x" }, "host"},
		{"no roles", "mysql", func(p *templates.GrantParams) { p.Roles = templates.Roles{} }, "no role"},
		{"bad table", "mysql", func(p *templates.GrantParams) { p.Tables.Inbox = "In-box" }, "not a safe SQL identifier"},
	}
	for _, tc := range cases {
		p := grantParams
		tc.edit(&p)
		if _, err := templates.RenderGrants(tc.d, p); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: err = %v, want one containing %q", tc.name, err, tc.want)
		}
	}
}
