package compat

import (
	"os"
	"slices"
	"strings"
	"testing"

	"github.com/outboxgen/outboxgen/generator/spec"
)

// baseSpec is the contract every case changes.
const baseSpec = `version: 1
go: {package: events, out: ev}
sql:
  dialects: [sqlite]
  archive_table: outbox_archive
types:
  - name: Method
    enum: [card, wallet]
  - name: Address
    fields:
      - {name: city, type: string}
      - {name: zip, type: string, optional: true}
      - {name: previous, type: Address, optional: true}
events:
  - name: ORDER_PAID
    topic: orders.paid
    key: order_id
    fields:
      - {name: order_id, type: string}
      - {name: amount_cents, type: int64}
      - {name: method, type: Method}
      - {name: tags, type: list<string>}
      - {name: totals, type: map<int64>}
      - {name: coupon, type: string, optional: true}
      - {name: ship_to, type: Address}
  - name: DELIVERY_FAILED
    topic: deliveries.failed
    key: delivery_id
    version: 2
    ordered: false
    fields:
      - {name: delivery_id, type: string}
      - {name: attempt, type: int32}
    previous:
      - version: 1
        fields:
          - {name: delivery_id, type: string}
  - name: AUDITED
    topic: audit
    key: id
    fields:
      - {name: id, type: string}
consumers:
  - name: points
    events: [ORDER_PAID, DELIVERY_FAILED]
`

// edit applies pairs of old, new replacements to baseSpec; each old must
// occur.
func edit(t *testing.T, pairs ...string) string {
	t.Helper()
	s := baseSpec
	for i := 0; i+1 < len(pairs); i += 2 {
		if !strings.Contains(s, pairs[i]) {
			t.Fatalf("edit: %q not in the base spec", pairs[i])
		}
		s = strings.Replace(s, pairs[i], pairs[i+1], 1)
	}
	return s
}

func parse(t *testing.T, file, src string) *spec.Spec {
	t.Helper()
	s, err := spec.Parse(file, []byte(src))
	if err != nil {
		t.Fatalf("%s does not parse:\n%v\n%s", file, err, src)
	}
	return s
}

const bumpOrderPaid = `    key: order_id
    version: 2
    previous:
      - version: 1
        fields:
          - {name: order_id, type: string}
          - {name: amount_cents, type: int64}
          - {name: method, type: Method}
          - {name: tags, type: list<string>}
          - {name: totals, type: map<int64>}
          - {name: coupon, type: string, optional: true}
          - {name: ship_to, type: Address}
    fields:`

// compareCases are changes to baseSpec and the findings they give.
var compareCases = []struct {
	name  string
	edits []string
	want  []string // "line:col RULE event field", in order; none: compatible
}{
	// Compatible changes.
	{name: "no change"},
	{name: "optional field added", edits: []string{"      - {name: coupon, type: string, optional: true}\n", "      - {name: coupon, type: string, optional: true}\n      - {name: note, type: string, optional: true}\n"}},
	{name: "event added", edits: []string{"consumers:\n", "  - name: NEW_ONE\n    topic: new\n    key: id\n    fields:\n      - {name: id, type: string}\nconsumers:\n"}},
	{name: "enum value added", edits: []string{"enum: [card, wallet]", "enum: [card, wallet, bank]"}},
	{name: "ordered false to true", edits: []string{"    ordered: false\n", ""}},
	{name: "event no consumer handles removed", edits: []string{"  - name: AUDITED\n    topic: audit\n    key: id\n    fields:\n      - {name: id, type: string}\n", ""}},
	{name: "type renamed", edits: []string{"name: Address", "name: PostalAddress", "type: Address}", "type: PostalAddress}", "{name: previous, type: Address,", "{name: previous, type: PostalAddress,"}},
	{name: "descriptions and go_type", edits: []string{"{name: amount_cents, type: int64}", "{name: amount_cents, type: int64, description: Cents., go_type: math/big.Int}"}},
	{name: "archive table added", edits: []string{"  archive_table: outbox_archive\n", ""}, want: []string{"4:3 TABLE_RENAMED  "}},
	{name: "field order changed", edits: []string{"      - {name: order_id, type: string}\n      - {name: amount_cents, type: int64}\n", "      - {name: amount_cents, type: int64}\n      - {name: order_id, type: string}\n"}},
	{name: "consumer drops an event", edits: []string{"events: [ORDER_PAID, DELIVERY_FAILED]", "events: [ORDER_PAID]"}},

	// Payload rules, without a bump.
	{name: "field removed", edits: []string{"      - {name: amount_cents, type: int64}\n", ""}, want: []string{"15:5 FIELD_REMOVED ORDER_PAID amount_cents"}},
	{name: "field renamed", edits: []string{"{name: amount_cents, type: int64}", "{name: amount, type: int64, optional: true}"}, want: []string{"15:5 FIELD_REMOVED ORDER_PAID amount_cents"}},
	{name: "nested field removed", edits: []string{"      - {name: zip, type: string, optional: true}\n", ""}, want: []string{"9:5 FIELD_REMOVED ORDER_PAID ship_to.zip"}},
	{name: "type changed", edits: []string{"{name: attempt, type: int32}", "{name: attempt, type: string}"}, want: []string{"33:9 FIELD_TYPE_CHANGED DELIVERY_FAILED attempt"}},
	{name: "scalar to enum", edits: []string{"{name: order_id, type: string}\n      - {name: amount_cents", "{name: order_id, type: Method}\n      - {name: amount_cents"}, want: []string{"19:9 FIELD_TYPE_CHANGED ORDER_PAID order_id", "19:9 KEY_CHANGED ORDER_PAID order_id"}},
	{name: "nested type changed", edits: []string{"{name: city, type: string}", "{name: city, type: int64}"}, want: []string{"11:9 FIELD_TYPE_CHANGED ORDER_PAID ship_to.city"}},
	{name: "list element changed", edits: []string{"type: list<string>", "type: list<int64>"}, want: []string{"22:9 ELEMENT_TYPE_CHANGED ORDER_PAID tags[]"}},
	{name: "map element changed", edits: []string{"type: map<int64>", "type: map<list<int64>>"}, want: []string{"23:9 ELEMENT_TYPE_CHANGED ORDER_PAID totals{}"}},
	{name: "list to map", edits: []string{"type: list<string>", "type: map<string>"}, want: []string{"22:9 FIELD_TYPE_CHANGED ORDER_PAID tags"}},
	{name: "optional made required", edits: []string{"{name: coupon, type: string, optional: true}", "{name: coupon, type: string}"}, want: []string{"24:9 FIELD_MADE_REQUIRED ORDER_PAID coupon"}},
	{name: "required made optional", edits: []string{"{name: amount_cents, type: int64}", "{name: amount_cents, type: int64, optional: true}"}, want: []string{"20:9 FIELD_MADE_OPTIONAL ORDER_PAID amount_cents"}},
	{name: "required field added", edits: []string{"      - {name: coupon, type: string, optional: true}\n", "      - {name: coupon, type: string, optional: true}\n      - {name: currency, type: string}\n"}, want: []string{"25:9 REQUIRED_FIELD_ADDED ORDER_PAID currency"}},
	{name: "enum value removed", edits: []string{"enum: [card, wallet]", "enum: [card]"}, want: []string{"7:5 ENUM_VALUE_REMOVED ORDER_PAID method"}},

	// A bump allows payload changes, when the old version is kept.
	{name: "bump with previous", edits: []string{"    key: order_id\n    fields:", bumpOrderPaid, "{name: amount_cents, type: int64}\n      - {name: method", "{name: amount, type: string}\n      - {name: method"}},
	{name: "bump without previous", edits: []string{"    key: order_id\n    fields:", "    key: order_id\n    version: 2\n    fields:", "{name: amount_cents, type: int64}\n      - {name: method", "{name: amount, type: string}\n      - {name: method"}, want: []string{"15:5 PREVIOUS_VERSION_MISSING ORDER_PAID "}},
	{name: "bump with a wrong previous", edits: []string{"    key: order_id\n    fields:", bumpOrderPaid, "          - {name: amount_cents, type: int64}\n", "          - {name: amount_cents, type: int32}\n"}, want: []string{"23:13 PREVIOUS_VERSION_CHANGED ORDER_PAID amount_cents"}},
	{name: "previous version changed", edits: []string{"          - {name: delivery_id, type: string}\n", "          - {name: delivery_id, type: string}\n          - {name: reason, type: string}\n"}, want: []string{"38:13 PREVIOUS_VERSION_CHANGED DELIVERY_FAILED reason"}},
	{name: "previous version removed", edits: []string{"    previous:\n      - version: 1\n        fields:\n          - {name: delivery_id, type: string}\n", ""}, want: []string{"26:5 PREVIOUS_VERSION_REMOVED DELIVERY_FAILED "}},
	{name: "version decreased", edits: []string{"    version: 2\n", "", "    previous:\n      - version: 1\n        fields:\n          - {name: delivery_id, type: string}\n", ""}, want: []string{"26:5 VERSION_DECREASED DELIVERY_FAILED "}},
	{name: "bump over a bump keeps both", edits: []string{"    version: 2\n", "    version: 3\n", "      - version: 1\n", "      - version: 2\n        fields:\n          - {name: delivery_id, type: string}\n          - {name: attempt, type: int32}\n      - version: 1\n", "{name: attempt, type: int32}\n    previous", "{name: attempt, type: string}\n    previous"}},

	// Delivery rules: no bump allows them.
	{name: "key changed", edits: []string{"    key: order_id\n    fields:", bumpOrderPaid, "key: order_id", "key: coupon", "{name: coupon, type: string, optional: true}\n      - {name: ship_to", "{name: coupon, type: string}\n      - {name: ship_to"}, want: []string{"15:5 KEY_CHANGED ORDER_PAID coupon"}},
	{name: "topic changed", edits: []string{"topic: orders.paid", "topic: orders.paid.v2"}, want: []string{"15:5 TOPIC_CHANGED ORDER_PAID "}},
	{name: "ordered true to false", edits: []string{"    key: order_id\n", "    key: order_id\n    ordered: false\n"}, want: []string{"15:5 ORDERED_CHANGED ORDER_PAID "}},
	{name: "handled event removed", edits: []string{"  - name: DELIVERY_FAILED\n    topic: deliveries.failed\n    key: delivery_id\n    version: 2\n    ordered: false\n    fields:\n      - {name: delivery_id, type: string}\n      - {name: attempt, type: int32}\n    previous:\n      - version: 1\n        fields:\n          - {name: delivery_id, type: string}\n", "", "events: [ORDER_PAID, DELIVERY_FAILED]", "events: [ORDER_PAID]"}, want: []string{"32:5 EVENT_REMOVED DELIVERY_FAILED "}},
	{name: "handled event removed with its consumer", edits: []string{"  - name: DELIVERY_FAILED\n    topic: deliveries.failed\n    key: delivery_id\n    version: 2\n    ordered: false\n    fields:\n      - {name: delivery_id, type: string}\n      - {name: attempt, type: int32}\n    previous:\n      - version: 1\n        fields:\n          - {name: delivery_id, type: string}\n", "", "consumers:\n  - name: points\n    events: [ORDER_PAID, DELIVERY_FAILED]\n", ""}, want: []string{"15:3 EVENT_REMOVED DELIVERY_FAILED "}},
	{name: "tables renamed", edits: []string{"  dialects: [sqlite]\n", "  dialects: [sqlite]\n  outbox_table: events_out\n  inbox_table: events_in\n", "archive_table: outbox_archive", "archive_table: archive2"}, want: []string{"5:17 TABLE_RENAMED  ", "6:16 TABLE_RENAMED  ", "7:18 TABLE_RENAMED  "}},
}

func TestCompare(t *testing.T) {
	for _, tc := range compareCases {
		t.Run(strings.ReplaceAll(tc.name, " ", "_"), func(t *testing.T) {
			base := parse(t, "base.yaml", baseSpec)
			next := parse(t, "events.yaml", edit(t, tc.edits...))
			var got []string
			for _, f := range Compare(base, next) {
				got = append(got, strings.TrimSpace(strings.Join([]string{posString(f.Pos), string(f.Rule), f.Event, f.Field}, " ")))
				if f.File != "events.yaml" || !strings.Contains(f.Msg, "base.yaml") {
					t.Errorf("finding %s does not name the new file and mention the base", f.Error())
				}
				if f.Event != "" && !strings.Contains(f.Msg, f.Event) {
					t.Errorf("finding %s does not name its event", f.Error())
				}
			}
			var want []string
			for _, w := range tc.want {
				want = append(want, strings.TrimSpace(w))
			}
			slices.Sort(got)
			slices.Sort(want)
			if !slices.Equal(got, want) {
				t.Errorf("findings\n got %q\nwant %q", got, want)
				for _, f := range Compare(base, next) {
					t.Log(f.Error())
				}
			}
		})
	}
}

func posString(p spec.Pos) string {
	return strings.Join([]string{itoa(p.Line), itoa(p.Col)}, ":")
}

func itoa(n int) string {
	if n == 0 {
		return "0"
	}
	var b []byte
	for ; n > 0; n /= 10 {
		b = append([]byte{byte('0' + n%10)}, b...)
	}
	return string(b)
}

// The messages, in full, for the change the issue describes: a field's
// type changed without a version bump.
func TestFindingText(t *testing.T) {
	base := parse(t, "git:origin/main:events.yaml", baseSpec)
	next := parse(t, "events.yaml", edit(t, "{name: attempt, type: int32}", "{name: attempt, type: string}"))
	got := Compare(base, next)
	want := "events.yaml:33:9: field attempt of DELIVERY_FAILED changed type from int32 (git:origin/main:events.yaml:33:9) to string: payloads of one side do not decode on the other; to make this change, bump DELIVERY_FAILED to version 3 and keep version 2's fields under previous: (FIELD_TYPE_CHANGED)"
	if len(got) != 1 || got[0].Error() != want {
		t.Errorf("got %v\nwant %s", got, want)
	}
}

func TestAllow(t *testing.T) {
	base := parse(t, "base.yaml", baseSpec)
	next := parse(t, "events.yaml", edit(t, "topic: orders.paid", "topic: orders.paid.v2", "enum: [card, wallet]", "enum: [card]"))
	if got := Compare(base, next, TopicChanged); len(got) != 1 || got[0].Rule != EnumValueRemoved {
		t.Errorf("Compare with TOPIC_CHANGED allowed = %v, want the enum finding only", got)
	}
	for _, s := range []string{"topic_changed", "TOPIC-CHANGED", " TOPIC_CHANGED "} {
		if r, err := ParseRule(s); err != nil || r != TopicChanged {
			t.Errorf("ParseRule(%q) = %q, %v", s, r, err)
		}
	}
	if _, err := ParseRule("TOPIC"); err == nil || !strings.Contains(err.Error(), "FIELD_REMOVED") {
		t.Errorf("ParseRule(TOPIC) = %v, want an error listing the rules", err)
	}
}

// Every rule has a case in compareCases that gives it, and is in the
// package documentation's table.
func TestEveryRuleTested(t *testing.T) {
	for _, r := range Rules {
		found := false
		for _, tc := range compareCases {
			for _, w := range tc.want {
				if strings.Fields(w)[1] == string(r) {
					found = true
				}
			}
		}
		if !found {
			t.Errorf("no case of TestCompare gives %s", r)
		}
	}
	src, err := os.ReadFile("compat.go")
	if err != nil {
		t.Fatal(err)
	}
	doc, _, _ := strings.Cut(string(src), "\npackage compat")
	for _, r := range Rules {
		if !strings.Contains(doc, "//\t"+string(r)+" ") {
			t.Errorf("the package documentation's table lacks %s", r)
		}
	}
}

// Switching sql.wal either way is a deployment change, not a contract
// change: consumers see the same messages, so nothing is reported (see
// the package documentation).
func TestWALSwitchNotReported(t *testing.T) {
	table := parse(t, "base.yaml", edit(t, "  dialects: [sqlite]\n", "  dialects: [sqlite, postgres]\n"))
	wal := parse(t, "events.yaml", edit(t, "  dialects: [sqlite]\n", "  dialects: [sqlite, postgres]\n  wal: true\n"))
	if !wal.SQL.WAL {
		t.Fatal("the edited spec does not set sql.wal")
	}
	if got := Compare(table, wal); len(got) != 0 {
		t.Errorf("table -> WAL: %v, want nothing", got)
	}
	if got := Compare(wal, table); len(got) != 0 {
		t.Errorf("WAL -> table: %v, want nothing", got)
	}
}
