package gocode

import (
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/outboxgen/outboxgen/generator/spec"
)

// clashYAML declares at least one of everything the generator makes a
// package-level identifier for (enum, enum value, object type, event,
// previous versions, consumer; with several dialects, Bind, Use and
// DialectWriter), plus fields, one per import path in imports, whose
// go_type is T in that package.
func clashYAML(imports []string) string {
	var b strings.Builder
	b.WriteString(`version: 1
go: {package: clash, out: clash}
sql: {dialects: [postgres, sqlite]}
types:
  - {name: Color, enum: [red, blue]}
  - name: Point
    fields:
      - {name: color, type: Color}
  - name: Shape
    fields:
      - {name: points, type: list<list<Point>>}
  - name: ColorMap
    fields:
      - {name: color, type: Color}
events:
  - name: THING_DONE
    topic: things
    key: id
    version: 4
    fields:
      - {name: id, type: string}
      - {name: steps, type: list<string>}
      - {name: point, type: Point, optional: true}
      - {name: grid, type: map<list<map<Color>>>, optional: true}
      - {name: shape, type: Shape, optional: true}
      - {name: shapes, type: list<Shape>, optional: true}
      - {name: grids, type: list<list<map<Color>>>, optional: true}
      - {name: color_maps, type: list<list<ColorMap>>, optional: true}
`)
	for i, path := range imports {
		fmt.Fprintf(&b, "      - {name: ext_%d, type: string, go_type: %q}\n", i, path+".T")
	}
	b.WriteString(`    previous:
      - {version: 3, fields: [{name: id, type: string}, {name: steps, type: list<string>}]}
      - {version: 1, fields: [{name: id, type: string}]}
      - {version: 2, fields: [{name: id, type: string}, {name: steps, type: list<string>}]}
consumers:
  - {name: auditor, events: [THING_DONE]}
`)
	return b.String()
}

// clashUpgrades are the hand-written upgrade functions of THING_DONE: each
// records its step in Steps, and fails for the id "fail<version>".
const clashUpgrades = `package clash

import "errors"

func UpgradeThingDoneV1(v ThingDoneV1) (ThingDoneV2, error) {
	if v.ID == "fail1" {
		return ThingDoneV2{}, errors.New("step 1 failed")
	}
	return ThingDoneV2{ID: v.ID, Steps: []string{"1-2"}}, nil
}

func UpgradeThingDoneV2(v ThingDoneV2) (ThingDoneV3, error) {
	if v.ID == "fail2" {
		return ThingDoneV3{}, errors.New("step 2 failed")
	}
	v.Steps = append(v.Steps, "2-3")
	return ThingDoneV3(v), nil
}

func UpgradeThingDoneV3(v ThingDoneV3) (ThingDone, error) {
	if v.ID == "fail3" {
		return ThingDone{}, errors.New("step 3 failed")
	}
	return ThingDone{ID: v.ID, Steps: append(v.Steps, "3-4")}, nil
}
`

// clashDecodeTest checks that DecodeThingDone decodes every version and
// chains the upgrades from the payload's version to the current one, and
// the errors of Validate for nested lists and maps.
const clashDecodeTest = `package clash

import (
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/outboxgen/outboxgen/runtime/outbox"
)

func TestDecodeChain(t *testing.T) {
	for _, tc := range []struct {
		version int
		payload string
		steps   []string
		err     error
		reason  string
	}{
		{version: 1, payload: ` + "`" + `{"id":"a"}` + "`" + `, steps: []string{"1-2", "2-3", "3-4"}},
		{version: 2, payload: ` + "`" + `{"id":"a","steps":["x"]}` + "`" + `, steps: []string{"x", "2-3", "3-4"}},
		{version: 3, payload: ` + "`" + `{"id":"a","steps":["x"]}` + "`" + `, steps: []string{"x", "3-4"}},
		{version: 4, payload: ` + "`" + `{"id":"a","steps":["x"]}` + "`" + `, steps: []string{"x"}},
		{version: 1, payload: ` + "`" + `{"id":"fail1"}` + "`" + `, err: outbox.ErrUndecodable, reason: "upgrading payload version 1 to 2: step 1 failed"},
		{version: 1, payload: ` + "`" + `{"id":"fail2"}` + "`" + `, err: outbox.ErrUndecodable, reason: "upgrading payload version 2 to 3: step 2 failed"},
		{version: 1, payload: ` + "`" + `{"id":"fail3"}` + "`" + `, err: outbox.ErrUndecodable, reason: "upgrading payload version 3 to 4: step 3 failed"},
		{version: 2, payload: ` + "`" + `{"id":"fail3"}` + "`" + `, err: outbox.ErrUndecodable, reason: "upgrading payload version 3 to 4: step 3 failed"},
		{version: 3, payload: ` + "`" + `{"id":"fail2"}` + "`" + `, steps: []string{"3-4"}},
		{version: 1, payload: ` + "`" + `{"id":""}` + "`" + `, err: outbox.ErrInvalidEvent, reason: "the key is empty"},
		{version: 2, payload: ` + "`" + `{` + "`" + `, err: outbox.ErrUndecodable, reason: "invalid JSON"},
		{version: 5, payload: ` + "`" + `{"id":"a"}` + "`" + `, err: outbox.ErrUndecodable, reason: "newer than this build understands (4)"},
		{version: 0, payload: ` + "`" + `{"id":"a"}` + "`" + `, err: outbox.ErrUndecodable, reason: "not valid"},
	} {
		got, err := DecodeThingDone([]byte(tc.payload), tc.version)
		if tc.err != nil {
			if !errors.Is(err, tc.err) || !strings.Contains(err.Error(), tc.reason) {
				t.Errorf("version %d %s: error %v, want %v containing %q", tc.version, tc.payload, err, tc.err, tc.reason)
			}
			if got.ID != "" || got.Steps != nil {
				t.Errorf("version %d %s: got %+v with the error, want the zero value", tc.version, tc.payload, got)
			}
			continue
		}
		if err != nil || got.ID != "a" && got.ID != "fail2" || !slices.Equal(got.Steps, tc.steps) {
			t.Errorf("version %d %s: got %+v, %v; want steps %v", tc.version, tc.payload, got, err, tc.steps)
		}
	}
}

func TestValidateNested(t *testing.T) {
	for _, tc := range []struct {
		e      ThingDone
		field  string
		reason string
	}{
		{ThingDone{ID: "a", Grid: map[string][]map[string]Color{"g": {{"a": ColorRed}, {"c": "pink", "b": "rose"}}}}, "grid[g][1][b]", ` + "`" + `unknown Color "rose"` + "`" + `},
		{ThingDone{ID: "a", Shape: &Shape{Points: [][]Point{{{Color: ColorRed}}, {{Color: ColorBlue}, {Color: "x"}}}}}, "shape.points[1][1].color", ` + "`" + `unknown Color "x"` + "`" + `},
		{ThingDone{ID: "a", Shapes: []Shape{{}, {Points: [][]Point{{{Color: "y"}}}}}}, "shapes[1].points[0][0].color", ` + "`" + `unknown Color "y"` + "`" + `},
		{ThingDone{ID: "a", Grids: [][]map[string]Color{{}, {nil, {"m": "w"}}}}, "grids[1][1][m]", ` + "`" + `unknown Color "w"` + "`" + `},
		{ThingDone{ID: "a", ColorMaps: [][]ColorMap{{{Color: ColorRed}, {Color: "q"}}}}, "color_maps[0][1].color", ` + "`" + `unknown Color "q"` + "`" + `},
	} {
		err := tc.e.Validate()
		var ie *outbox.InvalidEventError
		if !errors.As(err, &ie) || ie.Type != ThingDoneType || ie.Field != tc.field || ie.Reason != tc.reason {
			t.Errorf("Validate() = %v, want type %s, field %s, reason %s", err, ThingDoneType, tc.field, tc.reason)
		}
	}
	ok := ThingDone{ID: "a", Grid: map[string][]map[string]Color{"g": {{"a": ColorRed}}}, Shapes: []Shape{{Points: [][]Point{{{Color: ColorBlue}}}}}}
	if err := ok.Validate(); err != nil {
		t.Errorf("Validate() of a valid event = %v", err)
	}
	err := Shape{Points: [][]Point{nil, {{Color: "z"}}}}.Validate()
	var ie *outbox.InvalidEventError
	if !errors.As(err, &ie) || ie.Type != "Shape" || ie.Field != "points[1][0].color" {
		t.Errorf("Shape.Validate() = %+v, want type Shape, field points[1][0].color", err)
	}
}
`

// packageNames returns the package-level identifiers the Go files srcs
// declare, except the blank one.
func packageNames(t *testing.T, srcs map[string][]byte) []string {
	t.Helper()
	var names []string
	for file, src := range srcs {
		f, err := parser.ParseFile(token.NewFileSet(), file, src, parser.SkipObjectResolution)
		if err != nil {
			t.Fatal(err)
		}
		for _, decl := range f.Decls {
			switch d := decl.(type) {
			case *ast.FuncDecl:
				if d.Recv == nil {
					names = append(names, d.Name.Name)
				}
			case *ast.GenDecl:
				for _, spec := range d.Specs {
					switch s := spec.(type) {
					case *ast.TypeSpec:
						names = append(names, s.Name.Name)
					case *ast.ValueSpec:
						for _, n := range s.Names {
							names = append(names, n.Name)
						}
					}
				}
			}
		}
	}
	names = slices.DeleteFunc(names, func(n string) bool { return n == "_" })
	slices.Sort(names)
	return slices.Compact(names)
}

// TestImportsNamedLikeDeclarations generates a package whose go_type
// imports are named like each of its package-level identifiers (the
// generated ones, in every file, and the hand-written upgrade functions)
// and like the imports the generator names itself, then vets, builds and
// tests it: an import named binding once collided with the variable
// binding in writers.go ("binding already declared through import of
// package binding"). The package's test checks DecodeThingDone's chain of
// upgrades over three previous versions.
func TestImportsNamedLikeDeclarations(t *testing.T) {
	base, err := spec.Parse("events.yaml", []byte(clashYAML(nil)))
	if err != nil {
		t.Fatal(err)
	}
	out, err := Generate(base, testVersion)
	if err != nil {
		t.Fatal(err)
	}
	out["upgrades.go"] = []byte(clashUpgrades)
	names := packageNames(t, out)
	for _, want := range []string{bindingVar, "Bind", "DialectWriter", "AuditorHandler", "RegisterAuditor", "ThingDoneV1", "UpgradeThingDoneV1", "ColorRed", "Point", "validateColorMapList", "validateColorMapList2", "validatePointList"} {
		if !slices.Contains(names, want) {
			t.Fatalf("the package declares %v, not %s", names, want)
		}
	}

	// One import per identifier, named like it (jennifer lower-cases the
	// name), and one per import the generator names itself.
	elems := append(slices.Clone(names), "context", "sql", "json", "fmt", "maps", "slices", "strconv", "time", "uuid", "pgx", "outbox", "pgxoutbox", "message", "pgxpool", "inbox", "pgxinbox")
	var imports []string
	seen := map[string]bool{}
	for _, elem := range elems {
		// Import paths that differ in case only do not build together.
		if !seen[strings.ToLower(elem)] {
			seen[strings.ToLower(elem)] = true
			imports = append(imports, "example.com/gen/ext/"+elem)
		}
	}
	s, err := spec.Parse("events.yaml", []byte(clashYAML(imports)))
	if err != nil {
		t.Fatal(err)
	}
	out, err = Generate(s, testVersion)
	if err != nil {
		t.Fatal(err)
	}
	checkOutput(t, s, out)
	out["upgrades.go"] = []byte(clashUpgrades)
	if got := packageNames(t, out); !slices.Equal(got, names) {
		t.Fatalf("the go_type fields changed the package-level identifiers:\n got %v\nwant %v", got, names)
	}
	if !strings.Contains(string(out[EventsFile]), "\tbinding1 \"example.com/gen/ext/binding\"\n") {
		t.Errorf("%s does not import example.com/gen/ext/binding as binding1", EventsFile)
	}

	if testing.Short() {
		t.Skip("builds a Go module; skipped with -short")
	}
	goBin, err := exec.LookPath("go")
	if err != nil {
		t.Skip("no go command in PATH")
	}
	dir := writeModule(t, repoRoot(t), "clash", s)
	pkgDir := filepath.Join(dir, s.Go.Package)
	writeFile(t, filepath.Join(pkgDir, "upgrades.go"), clashUpgrades)
	writeFile(t, filepath.Join(pkgDir, "decode_test.go"), clashDecodeTest)
	for _, path := range imports {
		elem := path[strings.LastIndex(path, "/")+1:]
		// The package clause does not matter: jennifer names the import
		// after its path, and writes that name in the import.
		writeFile(t, filepath.Join(dir, "ext", elem, "t.go"), "package p\n\ntype T string\n")
	}
	run(t, goBin, dir, "vet", "./...")
	run(t, goBin, dir, "build", "./...")
	run(t, goBin, dir, "test", "-count=1", "./"+s.Go.Package)
}

// TestImportAliases: only a go_type import that jennifer would name like a
// package-level identifier gets an alias of its own; the output does not
// depend on the order of the fields.
func TestImportAliases(t *testing.T) {
	s := handSpec()
	gt := func(path string) *spec.TypeRef {
		return &spec.TypeRef{Kind: spec.KindScalar, Scalar: spec.String, GoType: &spec.GoType{Import: path, Name: "T"}}
	}
	e := s.Events[0]
	e.Fields = append(e.Fields,
		field("a", gt("example.com/m/binding")),
		field("b", gt("example.com/m/binding1")),
		field("c", gt("example.com/other/binding")),
		field("d", gt("example.com/m/decimal")),
	)
	out, err := Generate(s, testVersion)
	if err != nil {
		t.Fatal(err)
	}
	src := string(out[EventsFile])
	for _, want := range []string{
		"\tbinding2 \"example.com/m/binding\"\n",
		"\tbinding1 \"example.com/m/binding1\"\n",
		"\tbinding3 \"example.com/other/binding\"\n",
		"\tdecimal \"example.com/m/decimal\"\n",
	} {
		if !strings.Contains(src, want) {
			t.Errorf("%s lacks %q", EventsFile, want)
		}
	}
	if !regexp.MustCompile("\n\tA +binding2\\.T +`json:\"a\"`\n").MatchString(src) {
		t.Errorf("field A of %s is not a binding2.T", EventsFile)
	}
	if !strings.Contains(string(out[WritersFile]), "\nvar binding = outbox.NewBinding(Schema)\n") {
		t.Errorf("%s does not declare binding", WritersFile)
	}
}
