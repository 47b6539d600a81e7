package gocode

import (
	"fmt"
	"strings"
	"testing"

	"github.com/outboxgen/outboxgen/generator/spec"
)

// previousSpec returns a spec with one event at version n+1 that declares
// the n versions before it under previous:, built by hand so that no limit
// of the parser on previous versions applies.
func previousSpec(n int) *spec.Spec {
	e := event("THING_DONE", "things", "k", field("k", scalar(spec.String)))
	e.Version = n + 1
	for v := 1; v <= n; v++ {
		e.Previous = append(e.Previous, &spec.EventVersion{
			Version: v,
			GoName:  fmt.Sprintf("ThingDoneV%d", v),
			Fields:  []*spec.Field{field("k", scalar(spec.String))},
		})
	}
	s := handSpec()
	s.Types = nil
	s.Events = []*spec.Event{e}
	return s
}

// TestPreviousVersionsGrowLinearly: each previous version adds a fixed
// amount of code. DecodeX once spelled out, for every previous version,
// the whole chain of upgrades up to the current version: P²/2 steps, 70 MB
// of events.go and 3 GB of memory for 1,000 previous versions.
func TestPreviousVersionsGrowLinearly(t *testing.T) {
	size := map[int]int{}
	for _, n := range []int{100, 200, 300} {
		out, err := Generate(previousSpec(n), testVersion)
		if err != nil {
			t.Fatal(err)
		}
		src := string(out[EventsFile])
		size[n] = len(src)
		// Each upgrade function is called once, whatever version the
		// payload has.
		for v := 1; v <= n; v++ {
			if c := strings.Count(src, fmt.Sprintf("UpgradeThingDoneV%d(", v)); c != 1 {
				t.Errorf("%d previous versions: UpgradeThingDoneV%d is called %d times in %s, want once", n, v, c, EventsFile)
				break
			}
		}
		if n == 300 {
			checkOutput(t, previousSpec(n), out)
		}
	}
	if r := float64(size[200]) / float64(size[100]); r >= 2.5 {
		t.Errorf("events.go is %d bytes with 100 previous versions and %d bytes with 200 (%.1f times as much); want linear growth", size[100], size[200], r)
	}
	if r := float64(size[300]) / float64(size[100]); r >= 3.5 {
		t.Errorf("events.go is %d bytes with 100 previous versions and %d bytes with 300 (%.1f times as much); want linear growth", size[100], size[300], r)
	}
}

// nestedSpec returns a spec with one event of n fields, each a map of maps
// ... (depth maps in all) of an enum.
func nestedSpec(n, depth int) *spec.Spec {
	color := enumType("Color", "red")
	fields := []*spec.Field{field("k", scalar(spec.String))}
	for i := range n {
		ref := named(color)
		for range depth {
			ref = &spec.TypeRef{Kind: spec.KindMap, Elem: ref}
		}
		fields = append(fields, field(fmt.Sprintf("f%d", i), ref))
	}
	s := handSpec()
	s.Types = []*spec.Type{color}
	s.Events = []*spec.Event{event("THING_DONE", "things", "k", fields...)}
	return s
}

// TestNestedChecksDoNotGrowWithDepth: a field of a deeply nested list or
// map type is checked in one loop that calls the validator of its
// elements' type, emitted once. Each such field once had its own loop per
// level: 16 nested loops for a map of maps ... of an enum, 14 MB of
// events.go from a 770 KB spec.
func TestNestedChecksDoNotGrowWithDepth(t *testing.T) {
	const n = 100
	lines := map[int]int{}
	for _, depth := range []int{2, 16} {
		out, err := Generate(nestedSpec(n, depth), testVersion)
		if err != nil {
			t.Fatal(err)
		}
		checkOutput(t, nestedSpec(n, depth), out)
		src := string(out[EventsFile])
		_, validate, ok := strings.Cut(src, "\nfunc (e ThingDone) Validate() error {\n")
		if !ok {
			t.Fatalf("depth %d: no ThingDone.Validate in %s", depth, EventsFile)
		}
		validate, _, _ = strings.Cut(validate, "\n}\n")
		lines[depth] = strings.Count(validate, "\n")
		// One validator per element type: map<Color>, map<map<Color>>, ...
		if got := strings.Count(src, "\nfunc validate"); got != depth-1 {
			t.Errorf("depth %d: %d validator functions, want %d", depth, got, depth-1)
		}
	}
	if lines[16] != lines[2] {
		t.Errorf("ThingDone.Validate has %d lines for %d fields of depth 2, and %d for depth 16; want as many", lines[2], n, lines[16])
	}
}
