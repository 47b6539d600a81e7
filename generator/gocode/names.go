package gocode

import (
	"fmt"

	"github.com/outboxgen/outboxgen/generator/spec"
)

// bindingVar is the package-level variable behind the InsertX functions
// (writers.go): the one unexported package-level identifier the generator
// declares, and so the one an import could be named like (see
// importAliases).
const bindingVar = "binding"

// checkNames reports the first clash between package-level identifiers of
// the generated package, or between a field and a generated method. It is a
// defensive assertion: spec.Parse reports every such clash itself, all at
// once and with positions (a field named validate, a type named
// OrderPaidType next to event ORDER_PAID, ...), so only a *spec.Spec built
// or changed by hand can get here with one.
//
// It returns the package-level identifiers of the generated package, each
// with what declares it: all but the validate functions of events.go (see
// validator), whose names start with "validate" and so clash with none of
// these, and including the UpgradeX functions written by hand.
func checkNames(s *spec.Spec) (map[string]string, error) {
	owner := map[string]string{
		"EventTypes":    "the generated EventTypes variable",
		"Writer":        "the generated Writer type",
		"OutboxTable":   "the generated OutboxTable constant",
		"InboxTable":    "the generated InboxTable constant",
		"Schema":        "the generated Schema variable",
		"NewWriter":     "the generated NewWriter function",
		"DialectWriter": "the generated DialectWriter function",
		"Bind":          "the generated Bind function",
		"Use":           "the generated Use function",
		"Default":       "the generated Default function",
		bindingVar:      "the generated " + bindingVar + " variable",
	}
	claim := func(pos spec.Pos, name, what string) error {
		if prev, ok := owner[name]; ok {
			return fmt.Errorf("%s: Go name %s of %s clashes with %s", position(s, pos), name, what, prev)
		}
		owner[name] = what
		return nil
	}
	checkFields := func(fields []*spec.Field, what string) error {
		for _, f := range fields {
			if f.GoName == "Validate" {
				return fmt.Errorf("%s: Go name Validate of field %s of %s clashes with the generated Validate method", position(s, f.Pos), f.Name, what)
			}
		}
		return nil
	}
	for _, t := range s.Types {
		if err := claim(t.Pos, t.Name, "type "+t.Name); err != nil {
			return nil, err
		}
		for _, v := range t.Values {
			if err := claim(v.Pos, v.GoName, fmt.Sprintf("value %q of enum %s", v.Value, t.Name)); err != nil {
				return nil, err
			}
		}
		if err := checkFields(t.Fields, "type "+t.Name); err != nil {
			return nil, err
		}
	}
	for _, e := range s.Events {
		what := "event " + e.Name
		for _, name := range []string{e.GoName, e.GoName + "Type", e.GoName + "Topic", e.GoName + "Version", "Insert" + e.GoName, "Decode" + e.GoName} {
			if err := claim(e.Pos, name, what); err != nil {
				return nil, err
			}
		}
		if err := checkFields(e.Fields, what); err != nil {
			return nil, err
		}
		for _, pv := range e.Previous {
			vwhat := fmt.Sprintf("version %d of %s", pv.Version, what)
			if pv.GoName == "" {
				return nil, fmt.Errorf("%s: %s has no Go name", position(s, pv.Pos), vwhat)
			}
			for _, name := range []string{pv.GoName, "Upgrade" + pv.GoName} {
				if err := claim(pv.Pos, name, vwhat); err != nil {
					return nil, err
				}
			}
		}
	}
	for _, c := range s.Consumers {
		if c.GoName == "" {
			continue // consumersFile reports it
		}
		what := "consumer " + c.Name
		for _, name := range []string{c.GoName + "Handler", "Register" + c.GoName} {
			if err := claim(c.Pos, name, what); err != nil {
				return nil, err
			}
		}
	}
	return owner, nil
}

// position formats pos as "file:line:col" like spec errors.
func position(s *spec.Spec, pos spec.Pos) string {
	file := s.File
	if file == "" {
		file = "events.yaml"
	}
	return fmt.Sprintf("%s:%d:%d", file, pos.Line, pos.Col)
}
