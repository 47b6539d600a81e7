package gocode

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/outboxgen/outboxgen/generator/spec"
)

// TestRepositorySpec generates the code of the repository's own events.yaml.
func TestRepositorySpec(t *testing.T) {
	path := filepath.Join("..", "..", "events.yaml")
	data, err := os.ReadFile(path)
	if err != nil {
		t.Skip("no events.yaml at the repository root")
	}
	s, err := spec.Parse("events.yaml", data)
	if err != nil {
		t.Fatal(err)
	}
	out, err := Generate(s, testVersion)
	if err != nil {
		t.Fatal(err)
	}
	checkOutput(t, s, out)
	for _, want := range []string{
		regexp.QuoteMeta("// OrderPaid is the payload of the ORDER_PAID event (topic \"orders.paid\", key\n// order_id).\n//\n// An order was paid in full.\ntype OrderPaid struct {"),
		"\t// OrderID is the order number.\n\tOrderID +string +`json:\"order_id\"`",
		"Reason +\\*string +`json:\"reason,omitempty\"`",
		"func \\(v PaymentMethod\\) Valid\\(\\) bool \\{",
	} {
		if !regexp.MustCompile(want).Match(out[EventsFile]) {
			t.Errorf("events.go lacks %q", want)
		}
	}
}

func TestHandSpecMatchesParsed(t *testing.T) {
	data, err := os.ReadFile(filepath.Join("..", "..", "events.yaml"))
	if err != nil {
		t.Skip("no events.yaml at the repository root")
	}
	parsed, err := spec.Parse("events.yaml", data)
	if err != nil {
		t.Fatal(err)
	}
	// The hand-built spec lists the dialects in another order, so only
	// events.go is comparable.
	a, err := Generate(parsed, testVersion)
	if err != nil {
		t.Fatal(err)
	}
	b, err := Generate(handSpec(), testVersion)
	if err != nil {
		t.Fatal(err)
	}
	if string(a[EventsFile]) != string(b[EventsFile]) {
		t.Errorf("hand-built spec generates other code than the parsed one:\n%s", firstDiff(string(a[EventsFile]), string(b[EventsFile])))
	}
}

func TestNameClashes(t *testing.T) {
	tests := []struct {
		name   string
		change func(*spec.Spec)
		want   string
	}{
		{"type named like an event constant", func(s *spec.Spec) {
			s.Types = append(s.Types, enumType("OrderPaidType", "x"))
		}, "Go name OrderPaidType of event ORDER_PAID clashes with type OrderPaidType"},
		{"type named Schema", func(s *spec.Spec) {
			s.Types = append(s.Types, enumType("Schema", "x"))
		}, "Go name Schema of type Schema clashes with the generated Schema"},
		{"type named Writer", func(s *spec.Spec) {
			s.Types = append(s.Types, enumType("Writer", "x"))
		}, "Go name Writer of type Writer clashes with the generated Writer type"},
		{"enum value named like a type", func(s *spec.Spec) {
			s.Types = append(s.Types, &spec.Type{Name: "PaymentMethodCard"})
		}, "clashes with value \"card\" of enum PaymentMethod"},
		{"field named validate", func(s *spec.Spec) {
			s.Events[1].Fields = append(s.Events[1].Fields, field("validate", scalar(spec.Bool)))
		}, "field validate of event ORDER_REFUNDED clashes with the generated Validate method"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := handSpec()
			tt.change(s)
			_, err := Generate(s, testVersion)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("Generate() error = %v, want one containing %q", err, tt.want)
			}
		})
	}
}

func TestKeys(t *testing.T) {
	tier := enumType("Tier", "gold")
	tests := []struct {
		key  *spec.Field
		want string // the Key expression, or the error
	}{
		{field("k", scalar(spec.String)), "Key:     e.K,"},
		{field("k", scalar(spec.Int64)), "strconv.FormatInt(e.K, 10)"},
		{field("k", scalar(spec.Int32)), "strconv.FormatInt(int64(e.K), 10)"},
		{field("k", scalar(spec.UUID)), "e.K.String()"},
		{field("k", named(tier)), "string(e.K)"},
		{field("k", &spec.TypeRef{Kind: spec.KindScalar, Scalar: spec.String, GoType: &spec.GoType{Import: "net/netip", Name: "Addr"}}), "fmt.Sprint(e.K)"},
		{field("k", scalar(spec.Time)), "error: key field k: a key must be"},
		{field("k", &spec.TypeRef{Kind: spec.KindScalar, Scalar: spec.String, GoType: &spec.GoType{Name: "string", Pointer: true}}), "error: key field k: a go_type key cannot be a pointer"},
	}
	for _, tt := range tests {
		s := handSpec()
		s.Types = append(s.Types, tier)
		s.Events = []*spec.Event{event("THING_DONE", "things", "k", tt.key)}
		out, err := Generate(s, testVersion)
		if strings.HasPrefix(tt.want, "error: ") {
			if err == nil || !strings.Contains(err.Error(), strings.TrimPrefix(tt.want, "error: ")) {
				t.Errorf("key %+v: error %v, want %q", tt.key.Type, err, tt.want)
			}
			continue
		}
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(string(out[WritersFile]), tt.want) {
			t.Errorf("key %+v: writers.go lacks %q:\n%s", tt.key.Type, tt.want, out[WritersFile])
		}
	}
}

// An object that only reaches an enum through a cycle must still validate,
// whatever order the types are declared in.
func TestRecursiveValidate(t *testing.T) {
	color := enumType("Color", "red")
	a := &spec.Type{Name: "A"}
	b := &spec.Type{Name: "B"}
	a.Fields = []*spec.Field{optional(field("b", named(b))), field("color", named(color))}
	b.Fields = []*spec.Field{optional(field("a", named(a)))}
	c := &spec.Type{Name: "C"}
	c.Fields = []*spec.Field{field("children", listOf(named(c))), field("n", scalar(spec.Int64))}
	s := handSpec()
	s.Types = []*spec.Type{b, a, color, c}
	s.Events = []*spec.Event{event("TREE_GROWN", "trees", "id", field("id", scalar(spec.String)), field("b", named(b)), field("c", named(c)))}
	out, err := Generate(s, testVersion)
	if err != nil {
		t.Fatal(err)
	}
	src := string(out[EventsFile])
	for _, want := range []string{"func (v A) Validate() error", "func (v B) Validate() error", "e.B.Validate()"} {
		if !strings.Contains(src, want) {
			t.Errorf("events.go lacks %q", want)
		}
	}
	if strings.Contains(src, "func (v C) Validate") || strings.Contains(src, "e.C.Validate") {
		t.Error("C has nothing to validate but got a Validate method")
	}
}

func TestGenerateErrors(t *testing.T) {
	s := handSpec()
	s.Go.Driver = spec.DriverPgx
	if _, err := Generate(s, testVersion); err == nil || !strings.Contains(err.Error(), "speaks PostgreSQL only") {
		t.Errorf("pgx with SQLite first: %v", err)
	}
	s = handSpec()
	s.SQL.Dialects = nil
	if _, err := Generate(s, testVersion); err == nil {
		t.Error("no dialects: no error")
	}
	if _, err := Generate(nil, testVersion); err == nil {
		t.Error("nil spec: no error")
	}
	// Errors read once: no "gocode:" package prefix under the CLI's own.
	for _, mutate := range []func(*spec.Spec){
		func(s *spec.Spec) { s.Go.Driver = "odbc" },
		func(s *spec.Spec) { s.SQL.Dialects = nil },
		func(s *spec.Spec) { s.SQL.Dialects = []spec.Dialect{"oracle"} },
		func(s *spec.Spec) { s.Go.Driver = spec.DriverPgx },
		func(s *spec.Spec) { s.Go.Package = "" },
	} {
		s := handSpec()
		mutate(s)
		if _, err := Generate(s, testVersion); err == nil || strings.Contains(err.Error(), "gocode:") {
			t.Errorf("error %v: want one without the package prefix", err)
		}
	}
}

func TestDocComments(t *testing.T) {
	tests := []struct{ in, want string }{
		{"", ""},
		{"short.", "// short."},
		{strings.Repeat("word ", 20), "// word word word word word word word word word word word word word word word\n// word word word word word"},
		{"First paragraph.\n\nSecond\nparagraph.", "// First paragraph.\n//\n// Second paragraph."},
		{"Values:\n- a\n- b", "// Values:\n// - a\n// - b"},
		{"see https://example.com/" + strings.Repeat("x", 90), "// see\n// https://example.com/" + strings.Repeat("x", 90)},
	}
	for _, tt := range tests {
		if got := docText(tt.in); got != tt.want {
			t.Errorf("docText(%q) =\n%s\nwant\n%s", tt.in, got, tt.want)
		}
	}
	for in, want := range map[string]string{
		"The order number.":                   "OrderID is the order number.",
		"An opaque reference.":                "OrderID is an opaque reference.",
		"Amount paid, in the smallest unit":   "OrderID is amount paid, in the smallest unit.",
		"SKU of the ordered item.":            "OrderID is SKU of the ordered item.",
		"OrderID is the shop's number.":       "OrderID is the shop's number.",
		"The order\nnumber.\n\nNever reused.": "OrderID is the order number.\n\nNever reused.",
		"Values:\n- a\n- b":                   "Values:\n- a\n- b",
		"x":                                   "OrderID is x.",
		"  ":                                  "",
	} {
		if got := fieldDoc("OrderID", in); got != want {
			t.Errorf("fieldDoc(%q) = %q, want %q", in, got, want)
		}
	}
}
