package gocode

import (
	"fmt"

	"github.com/dave/jennifer/jen"

	"github.com/outboxgen/outboxgen/generator/spec"
)

// goType returns the Go type of ref as a required field.
func goType(ref *spec.TypeRef) (jen.Code, error) {
	if ref == nil {
		return nil, fmt.Errorf("missing type")
	}
	if gt := ref.GoType; gt != nil {
		return goTypeOverride(gt), nil
	}
	switch ref.Kind {
	case spec.KindScalar:
		return scalarType(ref.Scalar)
	case spec.KindList:
		elem, err := goType(ref.Elem)
		if err != nil {
			return nil, err
		}
		return jen.Index().Add(elem), nil
	case spec.KindMap:
		elem, err := goType(ref.Elem)
		if err != nil {
			return nil, err
		}
		return jen.Map(jen.String()).Add(elem), nil
	case spec.KindNamed:
		if ref.Named == nil {
			return nil, fmt.Errorf("unresolved named type")
		}
		return jen.Id(ref.Named.Name), nil
	}
	return nil, fmt.Errorf("unknown type kind %d", ref.Kind)
}

func goTypeOverride(gt *spec.GoType) *jen.Statement {
	var t *jen.Statement
	if gt.Import == "" {
		t = jen.Id(gt.Name)
	} else {
		t = jen.Qual(gt.Import, gt.Name)
	}
	if gt.Pointer {
		return jen.Op("*").Add(t)
	}
	return t
}

func scalarType(s spec.Scalar) (jen.Code, error) {
	switch s {
	case spec.String:
		return jen.String(), nil
	case spec.Bool:
		return jen.Bool(), nil
	case spec.Int32:
		return jen.Int32(), nil
	case spec.Int64:
		return jen.Int64(), nil
	case spec.Float64:
		return jen.Float64(), nil
	case spec.Bytes:
		return jen.Index().Byte(), nil
	case spec.Time:
		return jen.Qual(pathTime, "Time"), nil
	case spec.UUID:
		return jen.Qual(pathUUID, "UUID"), nil
	case spec.Decimal:
		return jen.Qual(pathJSON, "Number"), nil
	case spec.JSON:
		return jen.Qual(pathJSON, "RawMessage"), nil
	}
	return nil, fmt.Errorf("unknown scalar type %q", s)
}

// isPointer reports whether field f is generated as a pointer: optional
// fields are, except those whose zero value (nil) already means absent,
// and go_type fields that are pointers anyway.
func isPointer(f *spec.Field) bool {
	ref := f.Type
	if gt := ref.GoType; gt != nil {
		return gt.Pointer || f.Optional
	}
	if !f.Optional {
		return false
	}
	switch ref.Kind {
	case spec.KindList, spec.KindMap:
		return false
	case spec.KindScalar:
		return ref.Scalar != spec.Bytes && ref.Scalar != spec.JSON
	}
	return true
}

// fieldType returns the Go type of field f, a pointer when isPointer.
func fieldType(f *spec.Field) (jen.Code, error) {
	if gt := f.Type.GoType; gt != nil {
		t := goTypeOverride(gt)
		if f.Optional && !gt.Pointer {
			return jen.Op("*").Add(t), nil
		}
		return t, nil
	}
	t, err := goType(f.Type)
	if err != nil {
		return nil, err
	}
	if isPointer(f) {
		return jen.Op("*").Add(t), nil
	}
	return t, nil
}

// needsValidate reports whether values of type ref can be invalid in a way
// a generated Validate can check: enums, and objects that contain enums at
// any depth. Values of go_type overrides are taken as they are.
func (g *gen) needsValidate(ref *spec.TypeRef) bool {
	if ref == nil || ref.GoType != nil {
		return false
	}
	switch ref.Kind {
	case spec.KindList, spec.KindMap:
		return g.needsValidate(ref.Elem)
	case spec.KindNamed:
		if ref.Named == nil {
			return false
		}
		if ref.Named.IsEnum() {
			return true
		}
		return g.objectValidates(ref.Named)
	}
	return false
}

// objectValidates reports whether object type t gets a Validate method.
func (g *gen) objectValidates(t *spec.Type) bool { return g.validates[t] }

// decideValidates fills g.validates by iterating to a fixed point, which
// settles recursive types: an object validates when any of its fields can
// be invalid, and a cycle that meets no enum has nothing to check.
func (g *gen) decideValidates() {
	g.validates = make(map[*spec.Type]bool, len(g.s.Types))
	for changed := true; changed; {
		changed = false
		for _, t := range g.s.Types {
			if t.IsEnum() || g.validates[t] {
				continue
			}
			for _, f := range t.Fields {
				if g.needsValidate(f.Type) {
					g.validates[t] = true
					changed = true
					break
				}
			}
		}
	}
}
