package gocode

import (
	"fmt"
	"strings"

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

// writersFile renders writers.go: the table names, the Schema every
// runtime part is wired from, the Writer type with NewWriter, the
// package-level binding with Bind and Default, and per event a
// package-level InsertX function and a Writer.InsertX method.
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
	if pgx && (len(s.SQL.Dialects) != 1 || s.SQL.Dialects[0] != spec.Postgres) {
		return nil, fmt.Errorf("go.driver %s speaks PostgreSQL only: sql.dialects must be [postgres]", s.Go.Driver)
	}

	f := g.newFile()
	f.Add(doc("Table names from " + g.specName() + "."))
	f.Const().Defs(
		doc("OutboxTable is the outbox table the writers insert into (sql.outbox_table)."),
		jen.Id("OutboxTable").Op("=").Lit(s.SQL.OutboxTable),
		doc("InboxTable is the consumer idempotency table (sql.inbox_table)."),
		jen.Id("InboxTable").Op("=").Lit(s.SQL.InboxTable),
	)

	// Schema: the configuration every runtime part is wired from.
	var dialects []jen.Code
	var titles []string
	for _, d := range s.SQL.Dialects {
		dialects = append(dialects, jen.Qual(pathOutbox, dialectConsts[d].ident))
		titles = append(titles, dialectConsts[d].title)
	}
	tables := []jen.Code{
		jen.Id("Outbox").Op(":").Id("OutboxTable"),
		jen.Id("Inbox").Op(":").Id("InboxTable"),
	}
	if s.SQL.ArchiveTable != "" {
		tables = append(tables, jen.Id("Archive").Op(":").Lit(s.SQL.ArchiveTable))
	}
	wiring := "\tdrv, err := sqldriver.New(db, Schema) // then relay.New(drv, ...), sweeper, monitor, janitor"
	if pgx {
		wiring = "\tdrv, err := pgxdriver.New(pool, Schema) // then relay.New(drv, ...), sweeper, monitor, janitor"
	}
	f.Line()
	schemaDoc := []string{
		fmt.Sprintf("Schema is what %s says about the database: the table names, the SQL dialects (%s) and the event types. Every runtime part is wired from it, so none can use a table or dialect %s does not name:", g.specName(), strings.Join(titles, ", "), g.specName()),
		wiring,
		"The RegisterX consumer functions and the writers use it too.",
	}
	if s.SQL.WAL {
		schemaDoc = append(schemaDoc, fmt.Sprintf("WAL is sql.wal in %s: PostgreSQL writers write events into the WAL for the streaming relay (runtime/walrelay), which runs beside the polling relay; create its replication slot before deploying the writers (outboxgen wal setup).", g.specName()))
	}
	f.Add(doc(schemaDoc...))
	fields := []jen.Code{
		jen.Id("Source").Op(":").Lit(g.specName()),
		jen.Id("Tables").Op(":").Qual(pathOutbox, "Tables").Custom(multiValues, tables...),
		jen.Id("Dialects").Op(":").Index().Qual(pathOutbox, "Dialect").Values(dialects...),
		jen.Id("EventTypes").Op(":").Id("EventTypes"),
	}
	if s.SQL.WAL {
		// Only when set, so that the output of specs without sql.wal
		// does not change.
		fields = append(fields, jen.Id("WAL").Op(":").True())
	}
	f.Var().Id("Schema").Op("=").Qual(pathOutbox, "Schema").Custom(multiValues, fields...)

	// Writer, NewWriter, Bind and the package-level binding.
	f.Line()
	f.Add(doc(
		"Writer writes the events into the outbox table of one database, in its SQL dialect. Create it with NewWriter; it is a small value, safe for concurrent use, and each database (or test) can have its own. The zero Writer returns an error.",
	))
	f.Type().Id("Writer").Struct(jen.Id("w").Op("*").Qual(pathOutbox, "Writer"))

	f.Line()
	if pgx {
		f.Add(doc("NewWriter returns a Writer for PostgreSQL, the only database pgx/v5 speaks. opts set e.g. outbox.WithMaxMessageSize."))
		f.Func().Id("NewWriter").Params(jen.Id("opts").Op("...").Qual(pathOutbox, "WriterOption")).Params(jen.Id("Writer"), jen.Error()).Block(
			jen.List(jen.Id("w"), jen.Err()).Op(":=").Id("Schema").Dot("NewWriter").Call(jen.Qual(pathOutbox, "Postgres"), jen.Id("opts").Op("...")),
			jen.If(jen.Err().Op("!=").Nil()).Block(jen.Return(jen.Id("Writer").Values(), jen.Err())),
			jen.Return(jen.Id("Writer").Values(jen.Id("w").Op(":").Id("w")), jen.Nil()),
		)
	} else {
		f.Add(doc(fmt.Sprintf("NewWriter returns a Writer for db, in the SQL dialect of db's driver (see outbox.Schema.DialectOf), which must be one of sql.dialects in %s: a database of another dialect is an error here, not at the first insert. opts set e.g. outbox.WithMaxMessageSize. When db's driver wraps another (tracing, say), use DialectWriter.", g.specName())))
		f.Func().Id("NewWriter").Params(jen.Id("db").Op("*").Qual(pathSQL, "DB"), jen.Id("opts").Op("...").Qual(pathOutbox, "WriterOption")).Params(jen.Id("Writer"), jen.Error()).Block(
			jen.List(jen.Id("w"), jen.Err()).Op(":=").Id("Schema").Dot("WriterFor").Call(jen.Id("db"), jen.Id("opts").Op("...")),
			jen.If(jen.Err().Op("!=").Nil()).Block(jen.Return(jen.Id("Writer").Values(), jen.Err())),
			jen.Return(jen.Id("Writer").Values(jen.Id("w").Op(":").Id("w")), jen.Nil()),
		)
		f.Line()
		f.Add(doc(fmt.Sprintf("DialectWriter returns a Writer for dialect d, which must be one of sql.dialects in %s. Prefer NewWriter, which takes the dialect from the database.", g.specName())))
		f.Func().Id("DialectWriter").Params(jen.Id("d").Qual(pathOutbox, "Dialect"), jen.Id("opts").Op("...").Qual(pathOutbox, "WriterOption")).Params(jen.Id("Writer"), jen.Error()).Block(
			jen.List(jen.Id("w"), jen.Err()).Op(":=").Id("Schema").Dot("NewWriter").Call(jen.Id("d"), jen.Id("opts").Op("...")),
			jen.If(jen.Err().Op("!=").Nil()).Block(jen.Return(jen.Id("Writer").Values(), jen.Err())),
			jen.Return(jen.Id("Writer").Values(jen.Id("w").Op(":").Id("w")), jen.Nil()),
		)
	}

	f.Line()
	f.Add(doc("Outbox returns the runtime writer, for txpublisher.New; nil for the zero Writer."))
	f.Func().Params(jen.Id("w").Id("Writer")).Id("Outbox").Params().Op("*").Qual(pathOutbox, "Writer").Block(jen.Return(jen.Id("w").Dot("w")))

	var bindDoc string
	switch {
	case pgx:
		bindDoc = "binding is the writer behind the package-level InsertX functions: PostgreSQL, the only database pgx/v5 speaks."
	case len(s.SQL.Dialects) == 1:
		bindDoc = fmt.Sprintf("binding is the writer behind the package-level InsertX functions: %s, the only dialect in %s (Bind checks a database against it).", dialectConsts[s.SQL.Dialects[0]].title, g.specName())
	default:
		bindDoc = fmt.Sprintf("binding is the writer behind the package-level InsertX functions. %s lists several dialects, so it is unbound until Bind(db) runs at start-up; until then InsertX returns an error matching outbox.ErrUnbound, never a wrong-dialect INSERT.", g.specName())
	}
	f.Line()
	f.Add(doc(bindDoc))
	f.Var().Id(bindingVar).Op("=").Qual(pathOutbox, "NewBinding").Call(jen.Id("Schema"))

	if !pgx {
		var bindWhen string
		if len(s.SQL.Dialects) == 1 {
			bindWhen = fmt.Sprintf("%s lists one dialect, so the package-level functions work without it; Bind then only checks db (and applies opts).", g.specName())
		} else {
			bindWhen = fmt.Sprintf("%s lists several dialects, so call it once at start-up, before any InsertX: until then they return an error matching outbox.ErrUnbound. A process binds one dialect: binding another fails.", g.specName())
		}
		f.Line()
		f.Add(doc(
			"Bind makes the package-level InsertX functions write in the SQL dialect of db's driver, which must be one of sql.dialects. "+bindWhen,
			"\tif err := "+s.Go.Package+".Bind(db); err != nil { ... } // at start-up",
		))
		f.Func().Id("Bind").Params(jen.Id("db").Op("*").Qual(pathSQL, "DB"), jen.Id("opts").Op("...").Qual(pathOutbox, "WriterOption")).Error().Block(
			jen.List(jen.Id("w"), jen.Err()).Op(":=").Id("NewWriter").Call(jen.Id("db"), jen.Id("opts").Op("...")),
			jen.If(jen.Err().Op("!=").Nil()).Block(jen.Return(jen.Err())),
			jen.Return(jen.Id("Use").Call(jen.Id("w"))),
		)
		f.Line()
		f.Add(doc("Use makes w the writer of the package-level InsertX functions, as Bind does; for a Writer from DialectWriter."))
		f.Func().Id("Use").Params(jen.Id("w").Id("Writer")).Error().Block(
			jen.Return(jen.Id(bindingVar).Dot("Bind").Call(jen.Id("w").Dot("w"))),
		)
	}

	defaultDoc := "Default returns the Writer the package-level InsertX functions use."
	if !pgx && len(s.SQL.Dialects) > 1 {
		defaultDoc = "Default returns the Writer the package-level InsertX functions use, or an error matching outbox.ErrUnbound before Bind."
	}
	f.Line()
	f.Add(doc(defaultDoc))
	f.Func().Id("Default").Params().Params(jen.Id("Writer"), jen.Error()).Block(
		jen.List(jen.Id("w"), jen.Err()).Op(":=").Id(bindingVar).Dot("Writer").Call(),
		jen.Return(jen.Id("Writer").Values(jen.Id("w").Op(":").Id("w")), jen.Err()),
	)

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
		insert = jen.Qual(pathPgxOutbox, "Insert").Call(jen.Id("ctx"), jen.Id("tx"), jen.Id("w").Dot("w"), event, jen.Id("opts").Op("..."))
	} else {
		insert = jen.Id("w").Dot("w").Dot("Insert").Call(jen.Id("ctx"), jen.Id("tx"), event, jen.Id("opts").Op("..."))
	}
	params := []jen.Code{
		jen.Id("ctx").Qual(pathContext, "Context"),
		jen.Id("tx").Add(txType),
		jen.Id("e").Id(name),
		jen.Id("opts").Op("...").Qual(pathOutbox, "InsertOption"),
	}
	results := []jen.Code{jen.Qual(pathOutbox, "EventID"), jen.Error()}

	var walDoc []string
	if g.s.SQL.WAL {
		walDoc = []string{g.walInsertDoc()}
	}
	f.Line()
	f.Add(doc(append([]string{fmt.Sprintf("Insert%s writes %s %s event into the outbox table inside tx, %s that makes the business change, so the event is published if and only if tx commits. It validates e first; an invalid event returns an error and leaves tx usable. It uses the package's writer (see Default).", name, article(e.Name), e.Name, txWhat)}, walDoc...)...))
	f.Func().Id("Insert"+name).Params(params...).Params(results...).Block(
		jen.List(jen.Id("w"), jen.Err()).Op(":=").Id(bindingVar).Dot("Writer").Call(),
		jen.If(jen.Err().Op("!=").Nil()).Block(
			jen.Return(jen.Qual(pathOutbox, "EventID").Values(), jen.Err()),
		),
		jen.Return(jen.Id("Writer").Values(jen.Id("w").Op(":").Id("w")).Dot("Insert"+name).Call(jen.Id("ctx"), jen.Id("tx"), jen.Id("e"), jen.Id("opts").Op("..."))),
	)

	f.Line()
	f.Add(doc(append([]string{fmt.Sprintf("Insert%s writes %s %s event into w's outbox table inside tx, %s that makes the business change, so the event is published if and only if tx commits. It validates e first; an invalid event returns an error and leaves tx usable.", name, article(e.Name), e.Name, txWhat)}, walDoc...)...))
	f.Func().Params(jen.Id("w").Id("Writer")).Id("Insert"+name).Params(params...).Params(results...).Block(
		jen.If(jen.Err().Op(":=").Id("e").Dot("Validate").Call(), jen.Err().Op("!=").Nil()).Block(
			jen.Return(jen.Qual(pathOutbox, "EventID").Values(), jen.Err()),
		),
		jen.Return(insert),
	)
	return nil
}

// walInsertDoc is the paragraph the InsertX functions get with sql.wal.
func (g *gen) walInsertDoc() string {
	d := fmt.Sprintf("With sql.wal in %s, a PostgreSQL writer writes the event into PostgreSQL's WAL (pg_logical_emit_message), not the outbox table; the streaming relay (runtime/walrelay, outboxgen relay) publishes it.", g.specName())
	if len(g.s.SQL.Dialects) > 1 {
		d += " Writers of the other dialects insert into the outbox table."
	}
	return d
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
