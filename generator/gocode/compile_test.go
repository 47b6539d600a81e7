package gocode

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"

	"github.com/outboxgen/outboxgen/generator/spec"
)

// TestGeneratedCodeCompiles builds and vets the code generated for every
// testdata spec in a throwaway module that uses it the way an application
// would, runs that module's tests (testdata/<name>/*_test.go.txt, if any),
// and checks that passing a *sql.DB (or a pgx connection) where the
// transaction belongs does not compile.
//
// The module requires the same versions as this repository's go.mod and
// copies its go.sum, so it builds offline once the module cache is warm.
func TestGeneratedCodeCompiles(t *testing.T) {
	if testing.Short() {
		t.Skip("builds a Go module; skipped with -short")
	}
	goBin, err := exec.LookPath("go")
	if err != nil {
		t.Skip("no go command in PATH")
	}
	root := repoRoot(t)
	for name, s := range testSpecs(t) {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			dir := writeModule(t, root, name, s)

			run(t, goBin, dir, "vet", "./...")
			run(t, goBin, dir, "build", "./...")
			run(t, goBin, dir, "test", "-count=1", "./...")

			// The transaction type is the point of the generated API: a
			// connection or pool must not be accepted.
			e := s.Events[0]
			var bad, wrongType, wantType string
			if s.Go.Driver == spec.DriverPgx {
				bad = fmt.Sprintf("package bad\n\nimport (\n\t\"context\"\n\n\t\"github.com/jackc/pgx/v5\"\n\n\t%q\n)\n\nfunc insert(ctx context.Context, conn *pgx.Conn) {\n\t_, _ = %s.Insert%s(ctx, conn, %s.%s{})\n}\n",
					"example.com/gen/"+s.Go.Package, s.Go.Package, e.GoName, s.Go.Package, e.GoName)
				wrongType, wantType = "*pgx.Conn", "pgx.Tx"
			} else {
				bad = fmt.Sprintf("package bad\n\nimport (\n\t\"context\"\n\t\"database/sql\"\n\n\t%q\n)\n\nfunc insert(ctx context.Context, db *sql.DB) {\n\t_, _ = %s.Insert%s(ctx, db, %s.%s{})\n}\n",
					"example.com/gen/"+s.Go.Package, s.Go.Package, e.GoName, s.Go.Package, e.GoName)
				wrongType, wantType = "*sql.DB", "*sql.Tx"
			}
			writeFile(t, filepath.Join(dir, "bad", "bad.go"), bad)
			cmd := exec.Command(goBin, "build", "./bad")
			cmd.Dir = dir
			cmd.Env = goEnv()
			out, err := cmd.CombinedOutput()
			if err == nil {
				t.Fatalf("passing %s to Insert%s compiled; want a type error", wrongType, e.GoName)
			}
			if !strings.Contains(string(out), wrongType) || !strings.Contains(string(out), wantType) {
				t.Fatalf("passing %s to Insert%s failed, but not with a type error naming %s and %s:\n%s", wrongType, e.GoName, wrongType, wantType, out)
			}
		})
	}
}

// repoRoot returns the directory of this repository's go.mod.
func repoRoot(t *testing.T) string {
	t.Helper()
	dir, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(dir, "go.mod")); err != nil {
		t.Fatalf("repository root not found: %v", err)
	}
	return dir
}

var moduleLine = regexp.MustCompile(`(?m)^module\s+\S+\s*$`)

// writeModule lays out a module example.com/gen in a temporary directory:
// the generated package in <package>/, a use_test.go that calls every
// InsertX and DecodeX with typed values, and any testdata/<name>/*.go.txt
// (hand-written files, such as the upgrade functions of previous versions,
// and tests).
func writeModule(t *testing.T, root, name string, s *spec.Spec) string {
	t.Helper()
	dir := t.TempDir()
	gomod, err := os.ReadFile(filepath.Join(root, "go.mod"))
	if err != nil {
		t.Fatal(err)
	}
	if !moduleLine.Match(gomod) {
		t.Fatal("no module line in go.mod")
	}
	mod := moduleLine.ReplaceAllString(string(gomod), "module example.com/gen")
	mod += "\nrequire github.com/outboxgen/outboxgen v0.0.0-00010101000000-000000000000\n"
	mod += fmt.Sprintf("\nreplace github.com/outboxgen/outboxgen => %s\n", filepath.ToSlash(root))
	writeFile(t, filepath.Join(dir, "go.mod"), mod)
	sum, err := os.ReadFile(filepath.Join(root, "go.sum"))
	if err != nil {
		t.Fatal(err)
	}
	writeFile(t, filepath.Join(dir, "go.sum"), string(sum))

	files, err := Generate(s, testVersion)
	if err != nil {
		t.Fatal(err)
	}
	pkgDir := filepath.Join(dir, s.Go.Package)
	for file, src := range files {
		writeFile(t, filepath.Join(pkgDir, file), string(src))
	}
	writeFile(t, filepath.Join(pkgDir, "use_test.go"), useTest(s))
	if len(s.Consumers) > 0 {
		writeFile(t, filepath.Join(pkgDir, "consumers_use_test.go"), consumersUseTest(s))
	}
	extra, err := filepath.Glob(filepath.Join("testdata", name, "*.go.txt"))
	if err != nil {
		t.Fatal(err)
	}
	for _, path := range extra {
		src, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		writeFile(t, filepath.Join(pkgDir, strings.TrimSuffix(filepath.Base(path), ".txt")), string(src))
	}
	return dir
}

// useTest returns an external test file that calls every generated
// function with the types it declares, and checks EventTypes.
func useTest(s *spec.Spec) string {
	pkg := s.Go.Package
	var b strings.Builder
	fmt.Fprintf(&b, "package %s_test\n\nimport (\n\t\"context\"\n", pkg)
	txType := "*sql.Tx"
	if s.Go.Driver == spec.DriverPgx {
		txType = "pgx.Tx"
		fmt.Fprintf(&b, "\t\"testing\"\n\n\t\"github.com/jackc/pgx/v5\"\n")
	} else {
		fmt.Fprintf(&b, "\t\"database/sql\"\n\t\"testing\"\n\n")
	}
	fmt.Fprintf(&b, "\t\"github.com/outboxgen/outboxgen/runtime/outbox\"\n\n\t%q\n)\n\n", "example.com/gen/"+pkg)
	fmt.Fprintf(&b, "// insertAll type-checks every writer; it is never called.\nfunc insertAll(ctx context.Context, tx %s) ([]outbox.EventID, error) {\n\tvar ids []outbox.EventID\n", txType)
	for _, e := range s.Events {
		fmt.Fprintf(&b, "\tif id, err := %s.Insert%s(ctx, tx, %s.%s{}, outbox.WithHeader(\"trace\", \"1\")); err != nil {\n\t\treturn nil, err\n\t} else {\n\t\tids = append(ids, id)\n\t}\n", pkg, e.GoName, pkg, e.GoName)
	}
	b.WriteString("\treturn ids, nil\n}\n\n")
	b.WriteString("func TestEventTypes(t *testing.T) {\n\t_ = insertAll\n")
	var names []string
	for _, e := range s.Events {
		names = append(names, fmt.Sprintf("%q", e.Name))
	}
	fmt.Fprintf(&b, "\twant := []string{%s}\n", strings.Join(names, ", "))
	fmt.Fprintf(&b, "\tif len(%s.EventTypes) != len(want) {\n\t\tt.Fatalf(\"%%d event types, want %%d\", len(%s.EventTypes), len(want))\n\t}\n", pkg, pkg)
	fmt.Fprintf(&b, "\tfor i, et := range %s.EventTypes {\n\t\tif et.Name != want[i] || et.Topic == \"\" || et.Version < 1 {\n\t\t\tt.Errorf(\"EventTypes[%%d] = %%+v, want type %%s\", i, et, want[i])\n\t\t}\n\t}\n", pkg)
	fmt.Fprintf(&b, "\tif len(%s.Schema.Dialects) == 0 || len(%s.Schema.EventTypes) != len(want) {\n\t\tt.Fatal(\"Schema is incomplete\")\n\t}\n}\n", pkg, pkg)
	for _, e := range s.Events {
		fmt.Fprintf(&b, "\nfunc TestDecode%s(t *testing.T) {\n\t_, err := %s.Decode%s([]byte(\"{\"), 1)\n\tif err == nil {\n\t\tt.Fatal(\"decoding bad JSON succeeded\")\n\t}\n\t_, err = %s.Decode%s([]byte(\"{}\"), %s.%sVersion+1)\n\tif err == nil {\n\t\tt.Fatal(\"decoding a newer version succeeded\")\n\t}\n}\n",
			e.GoName, pkg, e.GoName, pkg, e.GoName, pkg, e.GoName)
	}
	return b.String()
}

// consumersUseTest returns an external test file that implements every
// generated handler interface and registers it on a watermill router: the
// registration must succeed, add one handler per topic, refuse a nil
// handler, and refuse to run without a decision about the poison queue.
func consumersUseTest(s *spec.Spec) string {
	pkg := s.Go.Package
	pgx := s.Go.Driver == spec.DriverPgx
	var b strings.Builder
	fmt.Fprintf(&b, "package %s_test\n\nimport (\n\t\"context\"\n", pkg)
	if !pgx {
		b.WriteString("\t\"database/sql\"\n")
	}
	b.WriteString("\t\"testing\"\n\n\t\"github.com/ThreeDotsLabs/watermill\"\n\t\"github.com/ThreeDotsLabs/watermill/message\"\n\t\"github.com/ThreeDotsLabs/watermill/pubsub/gochannel\"\n")
	if pgx {
		b.WriteString("\t\"github.com/jackc/pgx/v5\"\n\t\"github.com/jackc/pgx/v5/pgxpool\"\n")
	} else {
		b.WriteString("\t_ \"modernc.org/sqlite\"\n")
	}
	fmt.Fprintf(&b, "\n\t\"github.com/outboxgen/outboxgen/runtime/inbox\"\n\t\"github.com/outboxgen/outboxgen/runtime/outbox\"\n\n\t%q\n)\n", "example.com/gen/"+pkg)
	txType := "*sql.Tx"
	if pgx {
		txType = "pgx.Tx"
	}
	for _, c := range s.Consumers {
		typ := "my" + c.GoName
		fmt.Fprintf(&b, "\ntype %s struct{}\n\nvar _ %s.%sHandler = %s{}\n", typ, pkg, c.GoName, typ)
		for _, e := range c.Events {
			fmt.Fprintf(&b, "\nfunc (%s) Handle%s(ctx context.Context, tx %s, e %s.%s, m outbox.Meta) error {\n\treturn nil\n}\n", typ, e.GoName, txType, pkg, e.GoName)
		}
	}
	b.WriteString("\nfunc TestRegisterConsumers(t *testing.T) {\n\tlogger := watermill.NopLogger{}\n\tps := gochannel.NewGoChannel(gochannel.Config{}, logger)\n\tdefer ps.Close()\n")
	if pgx {
		b.WriteString("\tdb, err := pgxpool.New(context.Background(), \"postgres://user@127.0.0.1:1/none\")\n\tif err != nil {\n\t\tt.Fatal(err)\n\t}\n\tdefer db.Close()\n")
	} else {
		b.WriteString("\tdb, err := sql.Open(\"sqlite\", \":memory:\")\n\tif err != nil {\n\t\tt.Fatal(err)\n\t}\n\tdefer db.Close()\n")
	}
	b.WriteString("\tr, err := message.NewRouter(message.RouterConfig{}, logger)\n\tif err != nil {\n\t\tt.Fatal(err)\n\t}\n")
	want := 0
	for _, c := range s.Consumers {
		topics := map[string]bool{}
		for _, e := range c.Events {
			topics[e.Topic] = true
		}
		want += len(topics)
		fmt.Fprintf(&b, "\tif err := %s.Register%s(r, ps, db, my%s{}, inbox.Config{PoisonPublisher: ps}); err != nil {\n\t\tt.Fatal(err)\n\t}\n", pkg, c.GoName, c.GoName)
		fmt.Fprintf(&b, "\tif err := %s.Register%s(r, ps, db, nil, inbox.Config{PoisonPublisher: ps}); err == nil {\n\t\tt.Error(\"nil handler accepted\")\n\t}\n", pkg, c.GoName)
		fmt.Fprintf(&b, "\tif err := %s.Register%s(r, ps, db, my%s{}, inbox.Config{}); err == nil {\n\t\tt.Error(\"registered without a poison queue decision\")\n\t}\n", pkg, c.GoName, c.GoName)
	}
	fmt.Fprintf(&b, "\tif n := len(r.Handlers()); n != %d {\n\t\tt.Errorf(\"%%d handlers, want %d\", n)\n\t}\n}\n", want, want)
	return b.String()
}

// run runs the go command in dir and fails with its output on error.
func run(t *testing.T, goBin, dir string, args ...string) {
	t.Helper()
	cmd := exec.Command(goBin, args...)
	cmd.Dir = dir
	cmd.Env = goEnv()
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("go %s: %v\n%s", strings.Join(args, " "), err, out)
	}
}

// goEnv is the environment for the go command in the throwaway module:
// no workspace, and go.mod may be completed from the module cache.
func goEnv() []string {
	env := []string{"GOWORK=off", "GOFLAGS=-mod=mod"}
	for _, kv := range os.Environ() {
		if k, _, _ := strings.Cut(kv, "="); k != "GOWORK" && k != "GOFLAGS" {
			env = append(env, kv)
		}
	}
	sort.Strings(env)
	return env
}

func writeFile(t *testing.T, path, content string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}
