package gocode

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/dave/jennifer/jen"

	"github.com/outboxgen/outboxgen/generator/spec"
)

// ConsumersFile is the file holding the consumer handlers, generated only
// when the spec declares consumers.
const ConsumersFile = "consumers.go"

// Import paths the consumer code uses.
const (
	pathMessage  = "github.com/ThreeDotsLabs/watermill/message"
	pathPgxpool  = "github.com/jackc/pgx/v5/pgxpool"
	pathInbox    = "github.com/outboxgen/outboxgen/runtime/inbox"
	pathPgxInbox = "github.com/outboxgen/outboxgen/runtime/inbox/pgxinbox"
)

// consumersFile renders consumers.go: per consumer a handler interface with
// one typed method per event, and a RegisterX function that wires it into a
// watermill router through package inbox.
func (g *gen) consumersFile() (*jen.File, error) {
	s := g.s
	pgx := s.Go.Driver == spec.DriverPgx
	f := g.newFile()
	f.ImportNames(map[string]string{
		pathMessage:  "message",
		pathPgxpool:  "pgxpool",
		pathInbox:    "inbox",
		pathPgxInbox: "pgxinbox",
	})
	for _, c := range s.Consumers {
		if c.GoName == "" || len(c.Events) == 0 {
			return nil, fmt.Errorf("%s: consumer %s is incomplete", position(s, c.Pos), c.Name)
		}
		g.consumer(f, c, pgx)
	}
	return f, nil
}

func (g *gen) consumer(f *jen.File, c *spec.Consumer, pgx bool) {
	var txType, dbType jen.Code
	var dbName, dbWhat string
	if pgx {
		txType = jen.Qual(pathPgx, "Tx")
		dbType = jen.Op("*").Qual(pathPgxpool, "Pool")
		dbName, dbWhat = "pool", "pool"
	} else {
		txType = jen.Op("*").Qual(pathSQL, "Tx")
		dbType = jen.Op("*").Qual(pathSQL, "DB")
		dbName, dbWhat = "db", "db"
	}
	iface := c.GoName + "Handler"

	// The handler interface.
	intro := fmt.Sprintf("%s handles the events of consumer %s", iface, c.Name)
	if d := strings.TrimSpace(c.Description); d != "" {
		intro += ": " + strings.TrimSuffix(d, ".") + "."
	} else {
		intro += "."
	}
	f.Line()
	f.Add(doc(
		intro,
		fmt.Sprintf("Register%s calls one method per delivered event, inside tx: the transaction that also records the event id in the inbox table (consumer %q). Make the business change through tx, and emit follow-up events with the InsertX writers on the same tx: they commit together, exactly once in effect. Return an error to roll all of it back; the event is then retried and, when it keeps failing, sent to the poison topic. Redeliveries of a handled event are skipped without calling the handler.", c.GoName, c.Name),
	))
	var methods []jen.Code
	for i, e := range c.Events {
		if i > 0 {
			methods = append(methods, jen.Line())
		}
		d := fmt.Sprintf("Handle%s handles %s %s event (topic %s); m holds its event id, key, outbox sequence and headers.", e.GoName, article(e.Name), e.Name, e.Topic)
		if len(e.Previous) > 0 {
			var vs []string
			for _, pv := range e.Previous {
				vs = append(vs, strconv.Itoa(pv.Version))
			}
			d += fmt.Sprintf(" Events of the earlier versions declared under previous: (%s) arrive upgraded to %s by Decode%s.", strings.Join(vs, ", "), e.GoName, e.GoName)
		}
		var extra string
		if c.IsLatestOnly(e) {
			extra = fmt.Sprintf("Stale guard (latest_only): %s %s event whose outbox sequence is not newer than the newest one already applied for its key is skipped without calling this method. That is right for state events, where each event carries the whole new state and the last writer wins; it is wrong for deltas (an increment, a line added), where skipping an older event loses its change.", article(e.Name), e.Name)
		}
		methods = append(methods, doc(d, extra))
		methods = append(methods, jen.Id("Handle"+e.GoName).Params(
			jen.Id("ctx").Qual(pathContext, "Context"),
			jen.Id("tx").Add(txType),
			jen.Id("e").Id(e.GoName),
			jen.Id("m").Qual(pathOutbox, "Meta"),
		).Error())
	}
	f.Type().Id(iface).Interface(methods...)

	// RegisterX.
	var routes []jen.Code
	for _, e := range c.Events {
		on := "On"
		if c.IsLatestOnly(e) {
			on = "OnLatest"
		}
		routes = append(routes, jen.Qual(pathInbox, on).Call(
			jen.Id(e.GoName+"Type"), jen.Id(e.GoName+"Topic"), jen.Id("Decode"+e.GoName), jen.Id("h").Dot("Handle"+e.GoName),
		))
	}
	consumer := jen.Qual(pathInbox, "Consumer").Types(txType).Values(jen.Dict{
		jen.Id("Name"):   jen.Lit(c.Name),
		jen.Id("Routes"): jen.Index().Qual(pathInbox, "Route").Types(txType).Custom(multiValues, routes...),
	})
	var register *jen.Statement
	var dialectNote string
	if pgx {
		register = jen.Qual(pathPgxInbox, "Register")
		dialectNote = " The inbox table is Schema's."
	} else {
		register = jen.Qual(pathInbox, "Register")
		dialectNote = fmt.Sprintf(" The inbox table is Schema's, and the SQL dialect db's driver's, which must be one of sql.dialects in %s: another is an error here, at start-up.", g.specName())
	}
	var topics []string
	seen := map[string]bool{}
	for _, e := range c.Events {
		if !seen[e.Topic] {
			seen[e.Topic] = true
			topics = append(topics, e.Topic)
		}
	}
	f.Line()
	f.Add(doc(
		fmt.Sprintf("Register%s adds consumer %s to r: one handler per topic (%s), named %q, reading from sub and running each delivery in a transaction of %s.%s", c.GoName, c.Name, strings.Join(topics, ", "), c.Name+"/<topic>", dbWhat, dialectNote),
		fmt.Sprintf("cfg configures the consumer: set PoisonPublisher (or NoPoisonQueue) and any other inbox.Config field; Register%s sets cfg.Schema to Schema. When r is already running, call r.RunHandlers afterwards.", c.GoName),
	))
	f.Func().Id("Register"+c.GoName).Params(
		jen.Id("r").Op("*").Qual(pathMessage, "Router"),
		jen.Id("sub").Qual(pathMessage, "Subscriber"),
		jen.Id(dbName).Add(dbType),
		jen.Id("h").Id(iface),
		jen.Id("cfg").Qual(pathInbox, "Config"),
	).Error().Block(
		jen.If(jen.Id("h").Op("==").Nil()).Block(
			jen.Return(jen.Qual(pathFmt, "Errorf").Call(jen.Lit("Register"+c.GoName+": nil "+iface))),
		),
		jen.Id("cfg").Dot("Schema").Op("=").Id("Schema"),
		jen.Return(register.Call(
			jen.Id("r"), jen.Id("sub"), jen.Id(dbName), consumer, jen.Id("cfg"),
		)),
	)
}
