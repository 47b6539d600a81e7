package gocode

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/dave/jennifer/jen"

	"github.com/outboxgen/outboxgen/generator/spec"
)

// specName is the spec file as the generated comments cite it; see
// spec.Spec.SourceName.
func (g *gen) specName() string { return g.s.SourceName() }

// eventsFile renders events.go: named types, then per event its constants,
// payload struct, Validate and DecodeX, then EventTypes.
func (g *gen) eventsFile() (*jen.File, error) {
	g.decideValidates()
	f := g.newFile()
	f.PackageComment(docText(fmt.Sprintf("Package %s holds the events declared in %s: typed payloads, their validation and decoding, and the functions that write them to the transactional outbox.", g.s.Go.Package, g.specName())))

	for _, t := range g.s.Types {
		var err error
		if t.IsEnum() {
			g.enum(f, t)
		} else {
			err = g.object(f, t)
		}
		if err != nil {
			return nil, fmt.Errorf("%s: type %s: %w", position(g.s, t.Pos), t.Name, err)
		}
	}
	for _, e := range g.s.Events {
		if err := g.event(f, e); err != nil {
			return nil, fmt.Errorf("%s: event %s: %w", position(g.s, e.Pos), e.Name, err)
		}
	}

	f.Line()
	f.Add(doc(fmt.Sprintf("EventTypes lists every event type declared in %s, in file order.", g.specName())))
	items := make([]jen.Code, len(g.s.Events))
	for i, e := range g.s.Events {
		items[i] = jen.Values(
			jen.Id("Name").Op(":").Id(e.GoName+"Type"),
			jen.Id("Topic").Op(":").Id(e.GoName+"Topic"),
			jen.Id("Version").Op(":").Id(e.GoName+"Version"),
			jen.Id("Ordered").Op(":").Lit(e.Ordered),
		)
	}
	f.Var().Id("EventTypes").Op("=").Index().Qual(pathOutbox, "EventType").Custom(multiValues, items...)
	if err := g.validatorFuncs(f); err != nil {
		return nil, err
	}
	return f, nil
}

// multiValues renders a composite literal with one element per line.
var multiValues = jen.Options{Open: "{", Close: "}", Separator: ",", Multi: true}

func (g *gen) enum(f *jen.File, t *spec.Type) {
	f.Line()
	if first, rest, ok := fold(t.Name, t.Description); ok {
		f.Add(doc(fmt.Sprintf("%s Its values are the %s constants.", first, t.Name), rest))
	} else {
		f.Add(doc(
			fmt.Sprintf("%s is an enum declared in %s: its values are the %s constants.", t.Name, g.specName(), t.Name),
			t.Description,
		))
	}
	f.Type().Id(t.Name).String()
	f.Line()
	f.Add(doc(fmt.Sprintf("The %s values.", t.Name)))
	consts := make([]jen.Code, len(t.Values))
	names := make([]jen.Code, len(t.Values))
	for i, v := range t.Values {
		consts[i] = jen.Id(v.GoName).Id(t.Name).Op("=").Lit(v.Value)
		names[i] = jen.Id(v.GoName)
	}
	f.Const().Defs(consts...)
	f.Line()
	f.Add(doc(fmt.Sprintf("Valid reports whether v is one of the declared %s values.", t.Name)))
	body := []jen.Code{jen.Return(jen.False())}
	if len(names) > 0 {
		body = append([]jen.Code{jen.Switch(jen.Id("v")).Block(
			jen.Case(names...).Block(jen.Return(jen.True())),
		)}, body...)
	}
	f.Func().Params(jen.Id("v").Id(t.Name)).Id("Valid").Params().Bool().Block(body...)
}

func (g *gen) object(f *jen.File, t *spec.Type) error {
	f.Line()
	if first, rest, ok := fold(t.Name, t.Description); ok {
		f.Add(doc(first, rest))
	} else {
		f.Add(doc(
			fmt.Sprintf("%s is an object type declared in %s.", t.Name, g.specName()),
			t.Description,
		))
	}
	fields, err := structFields(t.Fields, g.specName())
	if err != nil {
		return err
	}
	f.Type().Id(t.Name).Struct(fields...)
	if !g.objectValidates(t) {
		return nil
	}
	f.Line()
	f.Add(doc(fmt.Sprintf("Validate reports the first field of v that holds an invalid value; events that contain %s %s call it from their own Validate.", article(t.Name), t.Name)))
	body := g.fieldChecks(jen.Lit(t.Name), jen.Id("v"), t.Fields)
	body = append(body, jen.Return(jen.Nil()))
	f.Func().Params(jen.Id("v").Id(t.Name)).Id("Validate").Params().Error().Block(body...)
	return nil
}

// structFields renders the fields of a payload or object struct.
func structFields(fields []*spec.Field, specName string) ([]jen.Code, error) {
	var out []jen.Code
	for _, fd := range fields {
		typ, err := fieldType(fd)
		if err != nil {
			return nil, fmt.Errorf("field %s: %w", fd.Name, err)
		}
		tag := fd.Name
		if fd.Optional {
			tag += ",omitempty"
		}
		text := fieldDoc(fd.GoName, fd.Description)
		if fd.Type.GoType == nil && fd.Type.Kind == spec.KindScalar && fd.Type.Scalar == spec.Decimal {
			// json.Number surprises; say why and how to get a real decimal type.
			note := fmt.Sprintf("%s holds an exact decimal as its JSON number text; for arithmetic, give it a go_type such as github.com/shopspring/decimal.Decimal in %s.", fd.GoName, specName)
			if text == "" {
				text = note
			} else {
				text += " " + note
			}
		}
		if d := docText(text); d != "" {
			out = append(out, jen.Comment(d))
		}
		out = append(out, jen.Id(fd.GoName).Add(typ).Tag(map[string]string{"json": tag}))
	}
	return out, nil
}

func (g *gen) event(f *jen.File, e *spec.Event) error {
	name := e.GoName
	typeConst := jen.Id(name + "Type")

	f.Line()
	f.Add(doc(fmt.Sprintf("The %s event's type (stored as biz_type), broker topic and current payload version.", e.Name)))
	f.Const().Defs(
		jen.Id(name+"Type").Op("=").Lit(e.Name),
		jen.Id(name+"Topic").Op("=").Lit(e.Topic),
		jen.Id(name+"Version").Op("=").Lit(e.Version),
	)

	f.Line()
	f.Add(doc(
		fmt.Sprintf("%s is the payload of the %s event (topic %q, key %s).", name, e.Name, e.Topic, e.Key.Name),
		e.Description,
	))
	fields, err := structFields(e.Fields, g.specName())
	if err != nil {
		return err
	}
	f.Type().Id(name).Struct(fields...)

	// Validate.
	var body []jen.Code
	keyCheck, err := keyCheck(e)
	if err != nil {
		return err
	}
	if keyCheck != nil {
		body = append(body, keyCheck)
	}
	body = append(body, g.fieldChecks(typeConst, jen.Id("e"), e.Fields)...)
	body = append(body, jen.Return(jen.Nil()))
	f.Line()
	validateDoc := fmt.Sprintf("Validate reports the first problem that would make the event unusable. Insert%s calls it before any SQL runs, and Decode%s after decoding.", name, name)
	if len(body) == 1 {
		validateDoc += fmt.Sprintf(" %s %s has nothing to check beyond its Go types, so it always returns nil.", strings.ToUpper(article(name)[:1])+article(name)[1:], name)
	}
	f.Add(doc(validateDoc))
	f.Func().Params(jen.Id("e").Id(name)).Id("Validate").Params().Error().Block(body...)

	for _, pv := range e.Previous {
		if err := g.previousVersion(f, e, pv); err != nil {
			return err
		}
	}

	// DecodeX.
	f.Line()
	f.Add(doc(decodeDoc(e)))
	f.Func().Id("Decode"+name).Params(jen.Id("payload").Index().Byte(), jen.Id("version").Int()).Params(jen.Id(name), jen.Error()).Block(decodeBody(e)...)
	return nil
}

// previousVersion renders the struct of an earlier version of e, declared
// under previous:, and the compile-time check that its hand-written
// upgrade function exists with the right signature.
func (g *gen) previousVersion(f *jen.File, e *spec.Event, pv *spec.EventVersion) error {
	name := e.GoName
	fn, to := e.Upgrader(pv)
	next := e.Version
	if n := nextPrevious(e, pv); n != 0 {
		next = n
	}
	f.Line()
	f.Add(doc(
		fmt.Sprintf("%s is version %d of the %s payload, declared under previous: in %s: Decode%s still decodes it, for events written before version %d, and upgrades it with %s.", pv.GoName, pv.Version, e.Name, g.specName(), name, next, fn),
		pv.Description,
	))
	fields, err := structFields(pv.Fields, g.specName())
	if err != nil {
		return fmt.Errorf("version %d: %w", pv.Version, err)
	}
	f.Type().Id(pv.GoName).Struct(fields...)
	f.Line()
	f.Add(doc(
		fmt.Sprintf("%s turns a version %d %s payload into version %d (%s). Write it by hand, in a file of package %s that outboxgen does not generate: Decode%s calls it for version %d payloads still in outboxes, on brokers and in replays, so that handlers only ever see %s; an error it returns sends the event to the poison topic. This declaration makes the package fail to compile until it exists with this signature.", fn, pv.Version, e.Name, next, to, g.s.Go.Package, name, pv.Version, name),
	))
	f.Var().Id("_").Func().Params(jen.Id(pv.GoName)).Params(jen.Id(to), jen.Error()).Op("=").Id(fn)
	return nil
}

// nextPrevious returns the version of the previous version of e declared
// after pv, or 0 when pv is the last one.
func nextPrevious(e *spec.Event, pv *spec.EventVersion) int {
	for i, x := range e.Previous {
		if x == pv && i+1 < len(e.Previous) {
			return e.Previous[i+1].Version
		}
	}
	return 0
}

// decodeDoc is the doc comment of DecodeX.
func decodeDoc(e *spec.Event) string {
	name := e.GoName
	d := fmt.Sprintf("Decode%s decodes %s %s payload of the given version (from the message metadata), for consumers, and validates it. ", name, article(e.Name), e.Name)
	if len(e.Previous) == 0 {
		d += fmt.Sprintf("It decodes version %sVersion only: any other version is refused. ", name)
	} else {
		var versions, fns []string
		for _, pv := range e.Previous {
			versions = append(versions, strconv.Itoa(pv.Version))
			fn, _ := e.Upgrader(pv)
			fns = append(fns, fn)
		}
		d += fmt.Sprintf("It decodes version %sVersion and the earlier versions declared under previous: (%s), which it upgrades to %s with %s; any other version is refused. ", name, strings.Join(versions, ", "), name, strings.Join(fns, ", then "))
	}
	return d + "Errors match outbox.ErrUndecodable or, for a payload that decodes but does not validate, outbox.ErrInvalidEvent."
}

// decodeBody is the body of DecodeX. It decodes the payload into the
// struct of its version, in a switch on the version; a previous version is
// then upgraded one version at a time, in a second switch whose cases fall
// through to the next step (an if for a single previous version); then it
// validates. Each version takes one case in each switch, so the code grows
// linearly with the previous versions.
func decodeBody(e *spec.Event) []jen.Code {
	name := e.GoName
	typeConst := jen.Id(name + "Type")
	fail := func(err jen.Code) jen.Code { return jen.Return(jen.Id(name).Values(), err) }
	unmarshal := func(into string) *jen.Statement {
		return jen.Qual(pathOutbox, "UnmarshalPayload").Call(typeConst.Clone(), jen.Id("payload"), jen.Op("&").Id(into))
	}
	if len(e.Previous) == 0 {
		return []jen.Code{
			jen.Var().Id("e").Id(name),
			jen.Switch(jen.Id("version")).Block(
				jen.Case(jen.Id(name+"Version")).Block(
					jen.If(jen.Err().Op(":=").Add(unmarshal("e")), jen.Err().Op("!=").Nil()).Block(fail(jen.Err())),
				),
				jen.Default().Block(fail(jen.Qual(pathOutbox, "UnknownVersion").Call(typeConst.Clone(), jen.Id("version"), jen.Id(name+"Version")))),
			),
			jen.If(jen.Err().Op(":=").Id("e").Dot("Validate").Call(), jen.Err().Op("!=").Nil()).Block(fail(jen.Err())),
			jen.Return(jen.Id("e"), jen.Nil()),
		}
	}

	// One variable per version (vN for version N, e for the current one):
	// the payload is decoded into that of its version, and each upgrade
	// step fills the next.
	vars := []jen.Code{jen.Id("e").Id(name)}
	decode := []jen.Code{jen.Case(jen.Id(name + "Version")).Block(jen.Err().Op("=").Add(unmarshal("e")))}
	known := []jen.Code{typeConst.Clone(), jen.Id("version"), jen.Id(name + "Version")}
	steps := make([]jen.Code, len(e.Previous))
	for i, pv := range e.Previous {
		v := fmt.Sprintf("v%d", pv.Version)
		vars = append(vars, jen.Id(v).Id(pv.GoName))
		decode = append(decode, jen.Case(jen.Lit(pv.Version)).Block(jen.Err().Op("=").Add(unmarshal(v))))
		known = append(known, jen.Lit(pv.Version))

		fn, _ := e.Upgrader(pv)
		next, to := "e", jen.Code(jen.Id(name+"Version"))
		if i+1 < len(e.Previous) {
			next = fmt.Sprintf("v%d", e.Previous[i+1].Version)
			to = jen.Lit(e.Previous[i+1].Version)
		}
		steps[i] = jen.If(
			jen.List(jen.Id(next), jen.Err()).Op("=").Id(fn).Call(jen.Id(v)),
			jen.Err().Op("!=").Nil(),
		).Block(fail(jen.Qual(pathOutbox, "UpgradeFailed").Call(typeConst.Clone(), jen.Lit(pv.Version), to, jen.Err())))
	}
	vars = append(vars, jen.Err().Error())
	decode = append(decode, jen.Default().Block(jen.Err().Op("=").Qual(pathOutbox, "UnknownVersion").Call(known...)))

	body := []jen.Code{
		jen.Var().Defs(vars...),
		jen.Switch(jen.Id("version")).Block(decode...),
		jen.If(jen.Err().Op("!=").Nil()).Block(fail(jen.Err())),
		jen.Line(),
	}
	if len(e.Previous) == 1 {
		pv := e.Previous[0]
		body = append(body,
			doc(fmt.Sprintf("Upgrade a version %d payload to %s.", pv.Version, name)),
			jen.If(jen.Id("version").Op("==").Lit(pv.Version)).Block(steps[0]),
		)
	} else {
		cases := make([]jen.Code, len(e.Previous))
		for i, pv := range e.Previous {
			step := []jen.Code{steps[i]}
			if i+1 < len(e.Previous) {
				step = append(step, jen.Fallthrough())
			}
			cases[i] = jen.Case(jen.Lit(pv.Version)).Block(step...)
		}
		body = append(body,
			doc(fmt.Sprintf("Upgrade an earlier version to %s one version at a time: each case falls through to the next step.", name)),
			jen.Switch(jen.Id("version")).Block(cases...),
		)
	}
	return append(body,
		jen.If(jen.Err().Op("=").Id("e").Dot("Validate").Call(), jen.Err().Op("!=").Nil()).Block(fail(jen.Err())),
		jen.Return(jen.Id("e"), jen.Nil()),
	)
}

// keyUnset returns the condition under which e's key is unset, and why, or
// nil when every value is a usable key (integers, enums, which are checked
// as enums, and go_type overrides).
func keyUnset(e *spec.Event) (jen.Code, string) {
	k := e.Key
	if k == nil || k.Type.GoType != nil || k.Type.Kind != spec.KindScalar {
		return nil, ""
	}
	val := jen.Id("e").Dot(k.GoName)
	switch k.Type.Scalar {
	case spec.String:
		return val.Clone().Op("==").Lit(""), "the key is empty"
	case spec.UUID:
		return val.Clone().Op("==").Qual(pathUUID, "Nil"), "the key is the nil UUID"
	}
	return nil, ""
}

// keyCheck returns the Validate check that the key is set, or nil when
// every value is a usable key (integers, enums, which are checked as
// enums, and go_type overrides).
func keyCheck(e *spec.Event) (jen.Code, error) {
	if e.Key == nil {
		return nil, fmt.Errorf("no key field")
	}
	cond, reason := keyUnset(e)
	if cond == nil {
		return nil, nil
	}
	return jen.If(cond).Block(jen.Return(jen.Qual(pathOutbox, "Invalid").Call(jen.Id(e.GoName+"Type"), jen.Lit(e.Key.Name), jen.Lit(reason)))), nil
}

// fieldChecks returns the Validate statements for fields of the value
// recv; eventType is the event type (or object type name) for errors.
func (g *gen) fieldChecks(eventType jen.Code, recv *jen.Statement, fields []*spec.Field) []jen.Code {
	var out []jen.Code
	for _, fd := range fields {
		if !g.needsValidate(fd.Type) {
			continue
		}
		val := recv.Clone().Dot(fd.GoName)
		path := fieldPath{format: strings.ReplaceAll(fd.Name, "%", "%%")}
		// An optional enum or object is a pointer: checked when present.
		out = append(out, g.check(eventType, val, fd.Type, path, isPointer(fd)))
	}
	return out
}

// fieldPath is the JSON path of the value being checked, as a fmt format
// and its arguments (loop indexes and keys).
type fieldPath struct {
	format string
	args   []jen.Code
}

func (p fieldPath) with(suffix string, arg jen.Code) fieldPath {
	args := append(append([]jen.Code(nil), p.args...), arg)
	return fieldPath{format: p.format + suffix, args: args}
}

// code returns the path as a Go string expression.
func (p fieldPath) code() jen.Code {
	if len(p.args) == 0 {
		return jen.Lit(strings.ReplaceAll(p.format, "%%", "%"))
	}
	return jen.Qual(pathFmt, "Sprintf").Call(append([]jen.Code{jen.Lit(p.format)}, p.args...)...)
}

// check returns the statement that validates val of type ref; optional
// means val is a pointer that may be nil. A list or map is checked in one
// loop; when its elements are lists or maps themselves, the loop calls
// their validator (see validator), so that the code of a field does not
// grow with the depth of its type.
func (g *gen) check(eventType jen.Code, val *jen.Statement, ref *spec.TypeRef, path fieldPath, optional bool) jen.Code {
	switch ref.Kind {
	case spec.KindList, spec.KindMap:
		var inner fieldPath
		var keyVar string
		if ref.Kind == spec.KindList {
			keyVar = "i"
			inner = path.with("[%d]", jen.Id(keyVar))
		} else {
			keyVar = "k"
			inner = path.with("[%s]", jen.Id(keyVar))
		}
		var inside jen.Code
		if elem := ref.Elem; elem.Kind == spec.KindList || elem.Kind == spec.KindMap {
			inside = jen.If(jen.Err().Op(":=").Id(g.validator(elem)).Call(jen.Id("x")), jen.Err().Op("!=").Nil()).Block(
				jen.Return(jen.Qual(pathOutbox, "WithinField").Call(jen.Err(), eventType, inner.code())),
			)
		} else {
			inside = g.check(eventType, jen.Id("x"), elem, inner, false)
		}
		if ref.Kind == spec.KindMap {
			// Keys in sorted order, so the first error reported does not
			// depend on Go's random map iteration order.
			return jen.For(jen.List(jen.Id("_"), jen.Id(keyVar)).Op(":=").Range().Qual(pathSlices, "Sorted").Call(jen.Qual(pathMaps, "Keys").Call(val))).Block(
				jen.Id("x").Op(":=").Add(val.Clone()).Index(jen.Id(keyVar)),
				inside,
			)
		}
		return jen.For(jen.List(jen.Id(keyVar), jen.Id("x")).Op(":=").Range().Add(val)).Block(inside)
	case spec.KindNamed:
		t := ref.Named
		if t.IsEnum() {
			shown := val.Clone()
			if optional {
				shown = jen.Op("*").Add(val.Clone())
			}
			cond := jen.Op("!").Add(val.Clone()).Dot("Valid").Call()
			if optional {
				cond = val.Clone().Op("!=").Nil().Op("&&").Add(cond)
			}
			return jen.If(cond).Block(jen.Return(jen.Qual(pathOutbox, "Invalid").Call(
				eventType, path.code(), jen.Qual(pathFmt, "Sprintf").Call(jen.Lit("unknown "+t.Name+" %q"), shown),
			)))
		}
		errCheck := jen.If(jen.Err().Op(":=").Add(val.Clone()).Dot("Validate").Call(), jen.Err().Op("!=").Nil()).Block(
			jen.Return(jen.Qual(pathOutbox, "WithinField").Call(jen.Err(), eventType, path.code())),
		)
		if optional {
			return jen.If(val.Clone().Op("!=").Nil()).Block(errCheck)
		}
		return errCheck
	}
	return jen.Null()
}

// validatorFunc is a function of events.go that validates the values of one
// list or map type, for the checks of fields whose elements have that type.
type validatorFunc struct {
	name string
	ref  *spec.TypeRef
}

// validator returns the name of the function that validates values of the
// list or map type ref, and queues the function for validatorFuncs to
// emit: once per type, however many fields and types use it. Its name
// spells the type from the inside out, validateTierMapList for
// list<map<Tier>>, numbered when a type name makes two types read alike
// (validateTierMapList2 for list<TierMap>).
func (g *gen) validator(ref *spec.TypeRef) string {
	key := typeText(ref)
	if name, ok := g.validatorNames[key]; ok {
		return name
	}
	if g.validatorNames == nil {
		g.validatorNames = map[string]string{}
		g.validatorTaken = map[string]bool{}
	}
	base := "validate" + typeName(ref)
	name := base
	for i := 2; g.validatorTaken[name]; i++ {
		name = base + strconv.Itoa(i)
	}
	g.validatorNames[key] = name
	g.validatorTaken[name] = true
	g.validators = append(g.validators, validatorFunc{name: name, ref: ref})
	return name
}

// validatorFuncs emits the functions queued by validator, in the order they
// were first used; emitting one can queue the validator of its elements.
func (g *gen) validatorFuncs(f *jen.File) error {
	for i := 0; i < len(g.validators); i++ {
		v := g.validators[i]
		typ, err := goType(v.ref)
		if err != nil {
			return fmt.Errorf("type %s: %w", typeText(v.ref), err)
		}
		what, order, container, path := "element", "", "list", "[index]"
		if v.ref.Kind == spec.KindMap {
			what, order, container, path = "value", ", by key in sorted order", "map", "[key]"
		}
		f.Line()
		f.Add(doc(fmt.Sprintf("%s reports the first invalid %s of a %s%s, for the Validate methods and validate functions of values holding one. Its error names no event type and only the path within the %s (%q): the caller adds both with outbox.WithinField.", v.name, what, typeText(v.ref), order, container, path+"...")))
		body := []jen.Code{g.check(jen.Lit(""), jen.Id("v"), v.ref, fieldPath{}, false), jen.Return(jen.Nil())}
		f.Func().Id(v.name).Params(jen.Id("v").Add(typ)).Error().Block(body...)
	}
	return nil
}

// typeText is ref as events.yaml writes it, e.g. list<map<Tier>>.
func typeText(ref *spec.TypeRef) string {
	switch ref.Kind {
	case spec.KindList:
		return "list<" + typeText(ref.Elem) + ">"
	case spec.KindMap:
		return "map<" + typeText(ref.Elem) + ">"
	case spec.KindNamed:
		return ref.Named.Name
	}
	return string(ref.Scalar)
}

// typeName is ref as part of a Go name, from the inside out: TierMapList
// for list<map<Tier>>.
func typeName(ref *spec.TypeRef) string {
	switch ref.Kind {
	case spec.KindList:
		return typeName(ref.Elem) + "List"
	case spec.KindMap:
		return typeName(ref.Elem) + "Map"
	}
	// A named type: scalars have nothing to validate.
	return typeText(ref)
}
