package gocode

import (
	"fmt"

	"github.com/dave/jennifer/jen"

	"github.com/outboxgen/outboxgen/generator/spec"
)

// dialectConsts maps a spec dialect to its runtime constant and a name for
// comments.
var dialectConsts = map[spec.Dialect]struct{ ident, title string }{
	spec.Postgres: {"Postgres", "PostgreSQL"},
	spec.MySQL:    {"MySQL", "MySQL"},
	spec.SQLite:   {"SQLite", "SQLite"},
}

// writersFile renders writers.go: the table names, the Writer and one
// InsertX function per event.
func (g *gen) writersFile() (*jen.File, error) {
	s := g.s
	pgx := s.Go.Driver == spec.DriverPgx
	switch s.Go.Driver {
	case spec.DriverDatabaseSQL, spec.DriverPgx:
	default:
		return nil, fmt.Errorf("unknown go.driver %q", s.Go.Driver)
	}
	if len(s.SQL.Dialects) == 0 {
		return nil, fmt.Errorf("sql.dialects is empty")
	}
	for _, d := range s.SQL.Dialects {
		if _, ok := dialectConsts[d]; !ok {
			return nil, fmt.Errorf("unknown SQL dialect %q", d)
		}
	}
	first := dialectConsts[s.SQL.Dialects[0]]
	if pgx && s.SQL.Dialects[0] != spec.Postgres {
		return nil, fmt.Errorf("go.driver %s needs postgres as the first SQL dialect, not %s", s.Go.Driver, s.SQL.Dialects[0])
	}

	f := g.newFile()
	f.Add(doc("Table names from " + g.specName() + "."))
	f.Const().Defs(
		doc("OutboxTable is the outbox table the writers insert into."),
		jen.Id("OutboxTable").Op("=").Lit(s.SQL.OutboxTable),
		doc("InboxTable is the consumer idempotency table."),
		jen.Id("InboxTable").Op("=").Lit(s.SQL.InboxTable),
	)

	var writerDoc, writerExample string
	switch {
	case pgx:
		writerDoc = "Writer inserts events into the outbox table. It targets PostgreSQL, the only database pgx/v5 speaks."
	case len(s.SQL.Dialects) == 1:
		writerDoc = fmt.Sprintf("Writer inserts events into the outbox table. It targets %s, the only dialect in %s.", first.title, g.specName())
	default:
		other := dialectConsts[s.SQL.Dialects[1]]
		writerDoc = fmt.Sprintf("Writer inserts events into the outbox table. It targets %s, the first dialect in %s. When one binary runs against several databases, replace it at start-up:", first.title, g.specName())
		writerExample = fmt.Sprintf("\tWriter = outbox.MustNewWriter(outbox.%s, OutboxTable)", other.ident)
	}
	f.Line()
	f.Add(doc(writerDoc, writerExample))
	f.Var().Id("Writer").Op("=").Qual(pathOutbox, "MustNewWriter").Call(jen.Qual(pathOutbox, first.ident), jen.Id("OutboxTable"))

	for _, e := range s.Events {
		if err := g.insertFunc(f, e, pgx); err != nil {
			return nil, fmt.Errorf("%s: event %s: %w", position(s, e.Pos), e.Name, err)
		}
	}
	return f, nil
}

func (g *gen) insertFunc(f *jen.File, e *spec.Event, pgx bool) error {
	name := e.GoName
	key, err := keyString(e.Key)
	if err != nil {
		return err
	}
	var txType jen.Code
	var txWhat string
	if pgx {
		txType = jen.Qual(pathPgx, "Tx")
		txWhat = "the pgx transaction"
	} else {
		txType = jen.Op("*").Qual(pathSQL, "Tx")
		txWhat = "the transaction"
	}
	event := jen.Qual(pathOutbox, "Event").Custom(multiValues,
		jen.Id("Type").Op(":").Id(name+"Type"),
		jen.Id("Topic").Op(":").Id(name+"Topic"),
		jen.Id("Key").Op(":").Add(key),
		jen.Id("Version").Op(":").Id(name+"Version"),
		jen.Id("Payload").Op(":").Id("e"),
	)
	var insert *jen.Statement
	if pgx {
		insert = jen.Qual(pathPgxOutbox, "Insert").Call(jen.Id("ctx"), jen.Id("tx"), jen.Id("Writer"), event, jen.Id("opts").Op("..."))
	} else {
		insert = jen.Id("Writer").Dot("Insert").Call(jen.Id("ctx"), jen.Id("tx"), event, jen.Id("opts").Op("..."))
	}

	f.Line()
	f.Add(doc(fmt.Sprintf("Insert%s writes %s %s event into the outbox table inside tx, %s that makes the business change, so the event is published if and only if tx commits. It validates e first; an invalid event returns an error and leaves tx usable.", name, article(e.Name), e.Name, txWhat)))
	f.Func().Id("Insert"+name).Params(
		jen.Id("ctx").Qual(pathContext, "Context"),
		jen.Id("tx").Add(txType),
		jen.Id("e").Id(name),
		jen.Id("opts").Op("...").Qual(pathOutbox, "InsertOption"),
	).Params(jen.Qual(pathOutbox, "EventID"), jen.Error()).Block(
		jen.If(jen.Err().Op(":=").Id("e").Dot("Validate").Call(), jen.Err().Op("!=").Nil()).Block(
			jen.Return(jen.Qual(pathOutbox, "EventID").Values(), jen.Err()),
		),
		jen.Return(insert),
	)
	return nil
}

// keyString returns the expression that turns the key field of e into
// the outbox row's biz_id.
func keyString(k *spec.Field) (jen.Code, error) {
	if k == nil {
		return nil, fmt.Errorf("no key field")
	}
	val := jen.Id("e").Dot(k.GoName)
	ref := k.Type
	switch {
	case ref.GoType != nil && ref.GoType.Pointer:
		return nil, fmt.Errorf("key field %s: a go_type key cannot be a pointer", k.Name)
	case ref.GoType != nil:
		return jen.Qual(pathFmt, "Sprint").Call(val), nil
	case ref.Kind == spec.KindNamed && ref.Named != nil && ref.Named.IsEnum():
		return jen.String().Call(val), nil
	case ref.Kind == spec.KindScalar:
		switch ref.Scalar {
		case spec.String:
			return val, nil
		case spec.Int64:
			return jen.Qual(pathStrconv, "FormatInt").Call(val, jen.Lit(10)), nil
		case spec.Int32:
			return jen.Qual(pathStrconv, "FormatInt").Call(jen.Int64().Call(val), jen.Lit(10)), nil
		case spec.UUID:
			return val.Dot("String").Call(), nil
		case spec.Bool:
			return jen.Qual(pathStrconv, "FormatBool").Call(val), nil
		case spec.Decimal:
			return val.Dot("String").Call(), nil
		}
	}
	return nil, fmt.Errorf("key field %s: a key must be a string, int32, int64, uuid, decimal, bool or enum field", k.Name)
}
