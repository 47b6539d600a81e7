package spec

import (
	"fmt"
	"slices"
	"strings"
	"testing"
)

const previousHead = `version: 1
go: {package: events, out: ev}
sql: {dialects: [sqlite]}
types:
  - name: Method
    enum: [card, wallet]
events:
`

func TestPrevious(t *testing.T) {
	src := previousHead + `  - name: ORDER_PAID
    topic: orders.paid
    key: order_id
    version: 4
    fields:
      - {name: order_id, type: string}
      - {name: method, type: Method}
    previous:
      - version: 2
        description: With the method as free text.
        fields:
          - {name: order_id, type: string}
          - {name: method, type: string}
      - version: 1
        fields:
          - {name: id, type: string}
          - {name: tags, type: list<Method>, optional: true}
`
	s, err := Parse("events.yaml", []byte(src))
	if err != nil {
		t.Fatal(err)
	}
	e := s.Events[0]
	if got := e.Versions(); !slices.Equal(got, []int{1, 2, 4}) {
		t.Errorf("Versions() = %v, want [1 2 4]", got)
	}
	if len(e.Previous) != 2 || e.Previous[0].GoName != "OrderPaidV1" || e.Previous[1].GoName != "OrderPaidV2" {
		t.Fatalf("Previous = %+v, want versions 1 and 2 in ascending order", e.Previous)
	}
	v1, v2 := e.Previous[0], e.Previous[1]
	if v1.Pos != (Pos{21, 9}) || v2.Description != "With the method as free text." {
		t.Errorf("version 1 at %v, version 2 description %q", v1.Pos, v2.Description)
	}
	if f := v1.Fields[1]; f.GoName != "Tags" || !f.Optional || f.Type.Kind != KindList || f.Type.Elem.Named != s.Types[0] {
		t.Errorf("version 1 field tags = %+v (type %+v), want an optional list of the Method type", f, f.Type)
	}
	if e.VersionFields(4)[1].Type.Named == nil || e.VersionFields(2)[1].Type.Scalar != String || e.VersionFields(3) != nil {
		t.Error("VersionFields does not return each declared version's fields")
	}
	if fn, to := e.Upgrader(v1); fn != "UpgradeOrderPaidV1" || to != "OrderPaidV2" {
		t.Errorf("Upgrader(v1) = %s, %s; want UpgradeOrderPaidV1, OrderPaidV2", fn, to)
	}
	if fn, to := e.Upgrader(v2); fn != "UpgradeOrderPaidV2" || to != "OrderPaid" {
		t.Errorf("Upgrader(v2) = %s, %s; want UpgradeOrderPaidV2, OrderPaid", fn, to)
	}
	if s.EventsPos != (Pos{8, 3}) {
		t.Errorf("EventsPos = %v, want 8:3", s.EventsPos)
	}
}

// previousErrorCases are bad previous: lists and the errors Parse gives;
// they also seed FuzzParse.
var previousErrorCases = []struct {
	name, src, want string
}{
	{
		name: "duplicate, not below current, unknown type, bad keys",
		src: previousHead + `  - name: ORDER_PAID
    topic: orders.paid
    key: order_id
    version: 3
    fields:
      - {name: order_id, type: string}
    previous:
      - version: 1
        fields:
          - {name: order_id, type: strng}
      - version: 1
        fields:
          - {name: order_id, type: string}
      - version: 3
        fields:
          - {name: order_id, type: string}
      - version: 0
        fields:
          - {name: order_id, type: string}
      - version: 2
        fieldz: []
      - fields:
          - {name: order_id, type: string}
      - version: two
        fields:
          - {name: order_id, type: string}
`,
		want: `events.yaml:17:36: unknown type "strng"; did you mean string?
events.yaml:18:18: duplicate previous version 1 of event ORDER_PAID (first at line 15); remove one
events.yaml:21:18: previous version 3 of event ORDER_PAID is not below its current version 3; previous: lists earlier versions only, so bump the version of event ORDER_PAID above 3
events.yaml:24:18: version of previous[3] of event ORDER_PAID must be at least 1, got 0
events.yaml:27:9: version 2 of event ORDER_PAID is missing required key "fields"; add fields: the payload fields of that version
events.yaml:28:9: unknown key "fieldz" in version 2 of event ORDER_PAID; did you mean "fields"?
events.yaml:29:9: previous[5] of event ORDER_PAID is missing required key "version"; add version: the earlier payload version these fields describe, e.g. 1
events.yaml:31:18: version of previous[6] of event ORDER_PAID must be an integer, got the string "two"`,
	},
	{
		name: "version defaults to 1",
		src: previousHead + `  - name: ORDER_PAID
    topic: orders.paid
    key: order_id
    fields:
      - {name: order_id, type: string}
    previous:
      - version: 1
        fields:
          - {name: order_id, type: string}
`,
		want: `events.yaml:14:18: previous version 1 of event ORDER_PAID is not below its current version 1; previous: lists earlier versions only, so set version: 2 (or higher) on event ORDER_PAID, whose version defaults to 1`,
	},
	{
		name: "Go names collide",
		src: previousHead + `  - name: ORDER_PAID
    topic: orders.paid
    key: order_id
    version: 2
    fields:
      - {name: order_id, type: string}
    previous:
      - version: 1
        fields:
          - {name: order_id, type: string}
          - {name: orderId, type: string}
  - name: ORDER_PAID_V1
    topic: orders.paid
    key: order_id
    fields:
      - {name: order_id, type: string}
`,
		want: `events.yaml:18:20: field orderId collides with order_id (line 17) as Go name OrderID; rename one of them
events.yaml:19:5: Go type OrderPaidV1 of event ORDER_PAID_V1 collides with Go type OrderPaidV1 of version 1 of event ORDER_PAID (line 15); rename one of them`,
	},
	{
		name: "not a list",
		src: previousHead + `  - name: ORDER_PAID
    topic: orders.paid
    key: order_id
    version: 2
    fields:
      - {name: order_id, type: string}
    previous: {version: 1}
`,
		want: `events.yaml:14:15: previous of event ORDER_PAID must be a list, got a mapping`,
	},
}

func TestPreviousErrors(t *testing.T) {
	for _, tc := range previousErrorCases {
		t.Run(strings.ReplaceAll(tc.name, " ", "_"), func(t *testing.T) {
			_, err := Parse("events.yaml", []byte(tc.src))
			if err == nil {
				t.Fatalf("Parse succeeded, want:\n%s", tc.want)
			}
			if got := err.Error(); got != tc.want {
				t.Errorf("errors mismatch\n--- got\n%s\n--- want\n%s", got, tc.want)
			}
		})
	}
}

// previousVersions is an event of version n+1 listing versions 1 to n
// under previous:.
func previousVersions(n int) string {
	var b strings.Builder
	b.WriteString(previousHead)
	fmt.Fprintf(&b, "  - name: ORDER_PAID\n    topic: orders.paid\n    key: id\n    version: %d\n    fields:\n      - {name: id, type: string}\n    previous:\n", n+1)
	for v := 1; v <= n; v++ {
		fmt.Fprintf(&b, "      - version: %d\n        fields: [{name: id, type: string}]\n", v)
	}
	return b.String()
}

// TestPreviousLimit: an event may list at most MaxPreviousVersions earlier
// versions; more are refused at the previous: list.
func TestPreviousLimit(t *testing.T) {
	s, err := Parse("events.yaml", []byte(previousVersions(MaxPreviousVersions)))
	if err != nil {
		t.Fatalf("%d previous versions: %v", MaxPreviousVersions, err)
	}
	if got := len(s.Events[0].Previous); got != MaxPreviousVersions {
		t.Errorf("%d previous versions parsed, want %d", got, MaxPreviousVersions)
	}
	_, err = Parse("events.yaml", []byte(previousVersions(MaxPreviousVersions+1)))
	want := fmt.Sprintf("events.yaml:15:7: previous of event ORDER_PAID has %d versions; the limit is %d (MaxPreviousVersions): retire the versions that no event in flight still has (in an outbox, on the broker or in a replay you may run): remove them from previous: together with their upgrade functions", MaxPreviousVersions+1, MaxPreviousVersions)
	if err == nil || err.Error() != want {
		t.Errorf("got\n%v\nwant\n%s", err, want)
	}
}
