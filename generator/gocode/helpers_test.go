package gocode

import (
	"fmt"
	"strings"

	"github.com/outboxgen/outboxgen/generator/spec"
)

// Builders for hand-made specs: tests that must not depend on the YAML
// parser (name clashes, unsupported keys) and the benchmark's baseline.

func scalar(s spec.Scalar) *spec.TypeRef { return &spec.TypeRef{Kind: spec.KindScalar, Scalar: s} }

func named(t *spec.Type) *spec.TypeRef { return &spec.TypeRef{Kind: spec.KindNamed, Named: t} }

func listOf(r *spec.TypeRef) *spec.TypeRef { return &spec.TypeRef{Kind: spec.KindList, Elem: r} }

func field(name string, t *spec.TypeRef) *spec.Field {
	return &spec.Field{Name: name, GoName: goName(name), Type: t}
}

func optional(f *spec.Field) *spec.Field { f.Optional = true; return f }

func describe(f *spec.Field, d string) *spec.Field { f.Description = d; return f }

func enumType(name string, values ...string) *spec.Type {
	t := &spec.Type{Name: name, Values: []*spec.EnumValue{}}
	for _, v := range values {
		t.Values = append(t.Values, &spec.EnumValue{Value: v, GoName: name + goName(v)})
	}
	return t
}

func event(name, topic string, key string, fields ...*spec.Field) *spec.Event {
	e := &spec.Event{Name: name, GoName: goName(strings.ToLower(name)), Topic: topic, Version: 1, Ordered: true, Fields: fields}
	for _, f := range fields {
		if f.Name == key {
			e.Key = f
		}
	}
	if e.Key == nil {
		panic(fmt.Sprintf("event %s: no field %s", name, key))
	}
	return e
}

// goName is a small PascalCase for tests (order_id → OrderID).
func goName(snake string) string {
	var b strings.Builder
	for _, part := range strings.Split(snake, "_") {
		switch part {
		case "id", "uuid", "ip", "url", "sku":
			b.WriteString(strings.ToUpper(part))
		default:
			if part != "" {
				b.WriteString(strings.ToUpper(part[:1]) + part[1:])
			}
		}
	}
	return b.String()
}

// handSpec is /work/main/events.yaml built by hand.
func handSpec() *spec.Spec {
	pm := enumType("PaymentMethod", "card", "wallet", "bank_transfer")
	pm.Description = "How the customer paid."
	paid := event("ORDER_PAID", "orders.paid", "order_id",
		describe(field("order_id", scalar(spec.String)), "The order number."),
		field("customer_id", scalar(spec.String)),
		describe(field("amount_cents", scalar(spec.Int64)), "The amount paid, in the smallest currency unit."),
		field("currency", scalar(spec.String)),
		field("method", named(pm)),
		field("paid_at", scalar(spec.Time)),
	)
	paid.Description = "An order was paid in full."
	refunded := event("ORDER_REFUNDED", "orders.refunded", "order_id",
		field("order_id", scalar(spec.String)),
		field("customer_id", scalar(spec.String)),
		field("amount_cents", scalar(spec.Int64)),
		optional(field("reason", scalar(spec.String))),
		field("refunded_at", scalar(spec.Time)),
	)
	refunded.Description = "A paid order was refunded, in part or in full."
	credited := event("POINTS_CREDITED", "points.credited", "customer_id",
		field("customer_id", scalar(spec.String)),
		field("order_id", scalar(spec.String)),
		field("points", scalar(spec.Int64)),
	)
	credited.Description = "Loyalty points were credited for a paid order."
	return &spec.Spec{
		File:    "events.yaml",
		Version: 1,
		Go:      spec.GoOutput{Package: "events", Out: "examples/orderpaid/events", Driver: spec.DriverDatabaseSQL},
		SQL: spec.SQLOutput{
			Dialects:    []spec.Dialect{spec.SQLite, spec.Postgres, spec.MySQL},
			OutboxTable: "outbox_event",
			InboxTable:  "outbox_inbox",
		},
		Types:  []*spec.Type{pm},
		Events: []*spec.Event{paid, refunded, credited},
	}
}

// testVersion is the outboxgen version the tests generate with: what a
// development build writes (see generator.Version), so the golden files
// match the repository's generated code.
const testVersion = "devel"
