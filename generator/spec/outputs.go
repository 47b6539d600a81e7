package spec

import (
	"fmt"
	"path"
	"path/filepath"
	"strings"
	"unicode/utf8"

	"github.com/outboxgen/outboxgen/templates"
)

// goFileNames are the files the generated Go package is made of, in
// go.out: gocode's EventsFile, WritersFile and ConsumersFile (consumers.go
// only when the spec declares consumers, but kept free always, so that
// adding one does not break the layout).
var goFileNames = []string{"events.go", "writers.go", "consumers.go"}

// sqlSchemaFile and sqlMigrationsDir are generator.SchemaFileName and
// generator.MigrationsDir: the DDL goes to <sql.out>/<dialect>/outbox.sql,
// the migrations to <sql.out>/<dialect>/migrations/.
const (
	sqlSchemaFile    = "outbox.sql"
	sqlMigrationsDir = "migrations"
)

// windowsReservedNames are the file names Windows reserves, which
// golang.org/x/mod/module.CheckImportPath refuses as path elements (with
// any extension).
var windowsReservedNames = []string{
	"CON", "PRN", "AUX", "NUL",
	"COM1", "COM2", "COM3", "COM4", "COM5", "COM6", "COM7", "COM8", "COM9",
	"LPT1", "LPT2", "LPT3", "LPT4", "LPT5", "LPT6", "LPT7", "LPT8", "LPT9",
}

// goPackageDir returns why the go command could not import a package in
// directory dir (cleaned, slash-separated, relative), or "": each of its
// directory names must be a valid element of an import path, by the rules
// of golang.org/x/mod/module.CheckImportPath.
func goPackageDir(dir string) string {
	if dir == "." {
		return ""
	}
	for _, elem := range strings.Split(dir, "/") {
		if why := importPathElem(elem); why != "" {
			return fmt.Sprintf("cannot hold a Go package: the directory name %q %s", elem, why)
		}
	}
	return ""
}

// importPathElem returns why elem is not a valid import path element, or
// "" (module.CheckImportPath's checkElem for import paths).
func importPathElem(elem string) string {
	const notAllowed = "which Go import paths do not allow"
	switch {
	case elem == "":
		return "is empty, " + notAllowed
	case strings.Count(elem, ".") == len(elem):
		return "is only dots, " + notAllowed
	case elem[len(elem)-1] == '.':
		return "ends with a dot, " + notAllowed
	}
	for _, r := range elem {
		ok := r < utf8.RuneSelf && (r == '-' || r == '.' || r == '_' || r == '~' || r == '+' ||
			'0' <= r && r <= '9' || 'A' <= r && r <= 'Z' || 'a' <= r && r <= 'z')
		if !ok {
			return fmt.Sprintf("contains %q, %s; use only ASCII letters, digits and - . _ ~ +", r, notAllowed)
		}
	}
	short, _, _ := strings.Cut(elem, ".")
	for _, bad := range windowsReservedNames {
		if strings.EqualFold(bad, short) {
			return fmt.Sprintf("is reserved on Windows (%s), %s", bad, notAllowed)
		}
	}
	if tilde := strings.LastIndexByte(short, '~'); tilde >= 0 && tilde < len(short)-1 {
		if strings.Trim(short[tilde+1:], "0123456789") == "" {
			return "ends with a tilde and digits like a Windows short name, " + notAllowed
		}
	}
	return ""
}

// within reports whether the relative, cleaned path p is f or inside f.
func within(p, f string) bool {
	return p == f || strings.HasPrefix(p, f+"/")
}

// checkOutputs reports output paths that collide: go.out being the spec
// file or a generated DDL file (or inside one), a generated Go file
// overwriting the spec file, and a dialect's DDL directory
// (<sql.out>/<dialect>) being the spec file or a generated Go file (or
// inside one). Generating would otherwise fail halfway, without a
// position, or overwrite the spec.
func (p *parser) checkOutputs() {
	specName := ""
	if p.file != "" {
		specName = filepath.ToSlash(filepath.Base(p.file))
	}
	goOut, sqlOut := p.spec.Go.Out, p.spec.SQL.Out
	if p.goOutNode == nil {
		goOut = ""
	}
	if p.sqlOutNode == nil {
		sqlOut = ""
	}
	if goOut != "" {
		p.checkGoOut(goOut, sqlOut, specName)
	}
	if sqlOut == "" {
		return
	}
	for _, d := range p.spec.SQL.Dialects {
		dir := path.Join(sqlOut, string(d))
		where := ""
		switch {
		case specName != "" && within(dir, specName):
			where = placed(dir, specName, "the spec file")
		case goOut != "":
			for _, f := range goFileNames {
				if gf := path.Join(goOut, f); within(dir, gf) {
					where = placed(dir, gf, "a Go file that go.out generates")
					break
				}
			}
		}
		if where != "" {
			p.errorf(p.sqlOutNode, "sql.out %q puts the %s DDL in %s, %s; choose another directory, e.g. db/schema", deref(p.sqlOutNode).Value, d, dir, where)
			return
		}
	}
}

// placed describes where path p is relative to the file f, which is what:
// "which is what" or "inside f, what".
func placed(p, f, what string) string {
	if p == f {
		return "which is " + what
	}
	return "inside " + f + ", " + what
}

// isPlaced is placed for a subject: "is what" or "is inside f, what".
func isPlaced(p, f, what string) string {
	if p == f {
		return "is " + what
	}
	return "is inside " + f + ", " + what
}

// checkGoOut is checkOutputs for go.out.
func (p *parser) checkGoOut(goOut, sqlOut, specName string) {
	value := deref(p.goOutNode).Value
	if specName != "" {
		if within(goOut, specName) {
			p.errorf(p.goOutNode, "go.out %q %s; choose a directory for the generated Go code, e.g. events", value, isPlaced(goOut, specName, "the spec file"))
			return
		}
		for _, f := range goFileNames {
			if path.Join(goOut, f) == specName {
				p.errorf(p.goOutNode, "go.out %q would write the generated %s over the spec file; rename the spec file or choose another directory, e.g. events", value, f)
				return
			}
		}
	}
	if sqlOut == "" {
		return
	}
	for _, d := range p.spec.SQL.Dialects {
		files := []string{path.Join(sqlOut, string(d), sqlSchemaFile)}
		for _, m := range templates.Builtin().Infos() {
			files = append(files, path.Join(sqlOut, string(d), sqlMigrationsDir, m.FileName()))
		}
		for _, f := range files {
			if within(goOut, f) {
				p.errorf(p.goOutNode, "go.out %q %s; choose a directory for the generated Go code, e.g. events", value, isPlaced(goOut, f, fmt.Sprintf("the %s DDL file that sql.out generates", d)))
				return
			}
		}
	}
}
