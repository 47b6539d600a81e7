package spec

import (
	"fmt"
	"testing"
)

// outputsSpec is a valid spec with go.out and sql.out set to the %s verbs.
const outputsSpec = `version: 1
go: {package: events, out: %s}
sql: {dialects: [postgres], out: %s}
events:
  - {name: A, topic: a, key: id, fields: [{name: id, type: string}]}
`

// TestGoOutImportPath: go.out must be a directory the go command can
// import: each of its names a valid import path element
// (golang.org/x/mod/module.CheckImportPath), reported at the value.
func TestGoOutImportPath(t *testing.T) {
	const at = "events.yaml:2:28: go.out "
	for _, tc := range []struct{ out, want string }{
		{`"my events"`, `"my events" cannot hold a Go package: the directory name "my events" contains ' ', which Go import paths do not allow; use only ASCII letters, digits and - . _ ~ +`},
		{`évents`, `"évents" cannot hold a Go package: the directory name "évents" contains 'é', which Go import paths do not allow; use only ASCII letters, digits and - . _ ~ +`},
		{`internal/ev@1`, `"internal/ev@1" cannot hold a Go package: the directory name "ev@1" contains '@', which Go import paths do not allow; use only ASCII letters, digits and - . _ ~ +`},
		{`'a\b'`, `"a\\b" cannot hold a Go package: the directory name "a\\b" contains '\\', which Go import paths do not allow; use only ASCII letters, digits and - . _ ~ +`},
		{`gen/events.`, `"gen/events." cannot hold a Go package: the directory name "events." ends with a dot, which Go import paths do not allow`},
		{`gen/...`, `"gen/..." cannot hold a Go package: the directory name "..." is only dots, which Go import paths do not allow`},
		{`gen/aux.d/x`, `"gen/aux.d/x" cannot hold a Go package: the directory name "aux.d" is reserved on Windows (AUX), which Go import paths do not allow`},
		{`EVENT~1`, `"EVENT~1" cannot hold a Go package: the directory name "EVENT~1" ends with a tilde and digits like a Windows short name, which Go import paths do not allow`},
	} {
		t.Run(tc.out, func(t *testing.T) {
			_, err := Parse("events.yaml", fmt.Appendf(nil, outputsSpec, tc.out, "db"))
			if want := at + tc.want; err == nil || err.Error() != want {
				t.Errorf("go.out %s: got\n%v\nwant\n%s", tc.out, err, want)
			}
		})
	}
	for _, out := range []string{".", "internal/events", "gen/v2.1/x-y_z~a+b", ".hidden/_events", "a/./b/../c"} {
		if _, err := Parse("events.yaml", fmt.Appendf(nil, outputsSpec, out, "db")); err != nil {
			t.Errorf("go.out %s: %v", out, err)
		}
	}
}

// TestOverlappingOutputs: generated files that would collide with each
// other or with the spec file are reported where the output is set.
func TestOverlappingOutputs(t *testing.T) {
	for _, tc := range []struct{ file, goOut, sqlOut, want string }{
		{"dir/postgres", "events", ".", `dir/postgres:3:34: sql.out "." puts the postgres DDL in postgres, which is the spec file; choose another directory, e.g. db/schema`},
		{"events.go", ".", "db", `events.go:2:28: go.out "." would write the generated events.go over the spec file; rename the spec file or choose another directory, e.g. events`},
		{"events.yaml", "events.yaml/x", "db", `events.yaml:2:28: go.out "events.yaml/x" is inside events.yaml, the spec file; choose a directory for the generated Go code, e.g. events`},
		{"events.yaml", "db/postgres/outbox.sql", "db", `events.yaml:2:28: go.out "db/postgres/outbox.sql" is the postgres DDL file that sql.out generates; choose a directory for the generated Go code, e.g. events`},
		{"events.yaml", ".", "consumers.go", `events.yaml:3:34: sql.out "consumers.go" puts the postgres DDL in consumers.go/postgres, inside consumers.go, a Go file that go.out generates; choose another directory, e.g. db/schema`},
	} {
		_, err := Parse(tc.file, fmt.Appendf(nil, outputsSpec, tc.goOut, tc.sqlOut))
		if err == nil || err.Error() != tc.want {
			t.Errorf("%s with go.out %s, sql.out %s: got\n%v\nwant\n%s", tc.file, tc.goOut, tc.sqlOut, err, tc.want)
		}
	}
	// Sharing a directory is fine: the file names differ.
	for _, outs := range [][2]string{{"events", "events"}, {"db/postgres", "db"}, {"events", "events/writers"}} {
		if _, err := Parse("events.yaml", fmt.Appendf(nil, outputsSpec, outs[0], outs[1])); err != nil {
			t.Errorf("go.out %s, sql.out %s: %v", outs[0], outs[1], err)
		}
	}
}
