package spec

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// dump renders a parsed spec as text, one declaration per line, so tests can
// compare the whole model at once.
func dump(s *Spec) string {
	var b strings.Builder
	fmt.Fprintf(&b, "file=%s version=%d\n", s.File, s.Version)
	fmt.Fprintf(&b, "go package=%s out=%s driver=%s\n", s.Go.Package, s.Go.Out, s.Go.Driver)
	fmt.Fprintf(&b, "sql dialects=%v out=%q outbox=%s inbox=%s\n", s.SQL.Dialects, s.SQL.Out, s.SQL.OutboxTable, s.SQL.InboxTable)
	for _, t := range s.Types {
		fmt.Fprintf(&b, "type %s enum=%v @%d:%d %q\n", t.Name, t.IsEnum(), t.Pos.Line, t.Pos.Col, t.Description)
		for _, v := range t.Values {
			fmt.Fprintf(&b, "  value %s %s @%d:%d\n", v.Value, v.GoName, v.Pos.Line, v.Pos.Col)
		}
		dumpFields(&b, t.Fields)
	}
	for _, e := range s.Events {
		key := "<nil>"
		if e.Key != nil {
			key = e.Key.Name
		}
		fmt.Fprintf(&b, "event %s %s topic=%s key=%s version=%d ordered=%v @%d:%d %q\n",
			e.Name, e.GoName, e.Topic, key, e.Version, e.Ordered, e.Pos.Line, e.Pos.Col, e.Description)
		dumpFields(&b, e.Fields)
	}
	for _, c := range s.Consumers {
		var names []string
		for _, e := range c.Events {
			names = append(names, e.Name)
		}
		fmt.Fprintf(&b, "consumer %s %s events=%v @%d:%d %q\n", c.Name, c.GoName, names, c.Pos.Line, c.Pos.Col, c.Description)
	}
	return b.String()
}

func dumpFields(b *strings.Builder, fields []*Field) {
	for _, f := range fields {
		fmt.Fprintf(b, "  field %s %s %s optional=%v @%d:%d", f.Name, f.GoName, refString(f.Type), f.Optional, f.Pos.Line, f.Pos.Col)
		if g := f.Type.GoType; g != nil {
			fmt.Fprintf(b, " go_type=%q.%s pointer=%v", g.Import, g.Name, g.Pointer)
		}
		if f.Description != "" {
			fmt.Fprintf(b, " %q", f.Description)
		}
		b.WriteString("\n")
	}
}

func refString(t *TypeRef) string {
	switch t.Kind {
	case KindScalar:
		return string(t.Scalar)
	case KindList:
		return "list<" + refString(t.Elem) + ">"
	case KindMap:
		return "map<" + refString(t.Elem) + ">"
	case KindNamed:
		return "named:" + t.Named.Name
	}
	return fmt.Sprintf("kind(%d)", t.Kind)
}

const richWant = `file=testdata/rich.yaml version=1
go package=shopevents out=internal/events driver=database/sql
sql dialects=[postgres mysql sqlite] out="internal/db/schema" outbox=shop_outbox inbox=shop_inbox
type PaymentMethod enum=true @16:5 "How the customer paid."
  value card PaymentMethodCard @18:12
  value wallet PaymentMethodWallet @18:18
  value bank_transfer PaymentMethodBankTransfer @18:26
  value apple-pay PaymentMethodApplePay @18:41
  value v2.legacy PaymentMethodV2Legacy @18:52
type Address enum=false @19:5 "A postal address."
  field street Street string optional=false @22:9
  field zip_code ZipCode string optional=false @24:9
  field geo Geo named:GeoPoint optional=true @26:9
type GeoPoint enum=false @29:5 ""
  field lat Lat float64 optional=false @31:9
  field lng Lng float64 optional=false @32:9
type Customer enum=false @33:5 ""
  field id ID uuid optional=false @35:9
  field address Address named:Address optional=false @37:9
  field referrer Referrer named:Customer optional=true @39:9
  field friends Friends list<named:Customer> optional=false @42:9
event ORDER_PAID OrderPaid topic=shop/orders.paid_v2 key=order_id version=3 ordered=false @46:5 "An order was paid in full."
  field order_id OrderID string optional=false @53:9 "The order number."
  field customerId CustomerID uuid optional=false @56:9
  field amount Amount decimal optional=false @58:9 go_type="github.com/shopspring/decimal".Decimal pointer=false
  field tip Tip decimal optional=true @61:9 go_type="github.com/shopspring/decimal".Decimal pointer=true
  field paid Paid bool optional=false @65:9
  field quantity Quantity int32 optional=false @67:9
  field total_cents TotalCents int64 optional=false @69:9
  field rate Rate float64 optional=false @71:9
  field signature Signature bytes optional=false @73:9
  field paid_at PaidAt time optional=false @75:9
  field metadata Metadata json optional=true @77:9
  field type Type named:PaymentMethod optional=false @80:9
  field http_url HTTPURL string optional=false @82:9 go_type="net/url".URL pointer=true
  field label Label string optional=false @85:9 go_type="".string pointer=false
  field customer Customer named:Customer optional=false @88:9
  field tags Tags list<string> optional=false @90:9
  field counts Counts map<int64> optional=false @92:9
  field matrix Matrix list<map<int64>> optional=false @94:9
  field addresses Addresses map<named:Address> optional=false @96:9
  field nested Nested map<list<list<named:PaymentMethod>>> optional=false @98:9
  field raw_json RawJSON bytes optional=false @100:9 go_type="encoding/json".RawMessage pointer=false
event ORDER_REFUNDED OrderRefunded topic=orders.refunded key=method version=1 ordered=true @103:5 ""
  field method Method named:PaymentMethod optional=false @107:9
  field reason Reason string optional=true @109:9
event POINTS_V2_CREDITED PointsV2Credited topic=points.credited key=seq version=1 ordered=true @112:5 ""
  field seq Seq int64 optional=false @116:9
consumer points_v2 PointsV2 events=[ORDER_PAID POINTS_V2_CREDITED] @120:5 "Credits loyalty points."
consumer sms Sms events=[ORDER_REFUNDED] @123:5 ""
`

func TestParseRich(t *testing.T) {
	s, err := ParseFile("testdata/rich.yaml")
	if err != nil {
		t.Fatalf("ParseFile: %v", err)
	}
	if got := dump(s); got != richWant {
		t.Errorf("model mismatch\n--- got\n%s--- want\n%s", got, richWant)
	}

	// References must point at the declarations themselves, not copies.
	typ := func(name string) *Type {
		for _, t := range s.Types {
			if t.Name == name {
				return t
			}
		}
		t.Fatalf("no type %s", name)
		return nil
	}
	ev := func(name string) *Event {
		for _, e := range s.Events {
			if e.Name == name {
				return e
			}
		}
		t.Fatalf("no event %s", name)
		return nil
	}
	paid := ev("ORDER_PAID")
	if paid.Key != paid.Fields[0] {
		t.Errorf("ORDER_PAID.Key = %p, want its first field %p", paid.Key, paid.Fields[0])
	}
	if got := paid.Fields[11].Type.Named; got != typ("PaymentMethod") {
		t.Errorf("field type resolves to %p, want the PaymentMethod declaration", got)
	}
	customer := typ("Customer")
	if customer.Fields[2].Type.Named != customer {
		t.Errorf("Customer.referrer does not point back at Customer")
	}
	if customer.Fields[3].Type.Elem.Named != customer {
		t.Errorf("Customer.friends element does not point at Customer")
	}
	refunded := ev("ORDER_REFUNDED")
	if refunded.Key != refunded.Fields[0] || !refunded.Key.Type.Named.IsEnum() {
		t.Errorf("ORDER_REFUNDED key should be its enum field method")
	}
	if c := s.Consumers[0]; c.Events[0] != paid || c.Events[1] != ev("POINTS_V2_CREDITED") {
		t.Errorf("consumer points_v2 events do not point at the event declarations")
	}
	if typ("Address").IsEnum() || !typ("PaymentMethod").IsEnum() {
		t.Errorf("IsEnum wrong")
	}
}

func TestParsePgx(t *testing.T) {
	src := `version: 1
go:
  package: events
  out: gen
  driver: pgx/v5
sql:
  dialects: [postgresql]
events:
  - name: USER_CREATED
    topic: users
    key: user_id
    fields:
      - name: user_id
        type: int64
`
	s, err := Parse("pgx.yaml", []byte(src))
	if err != nil {
		t.Fatalf("Parse: %v", err)
	}
	want := `file=pgx.yaml version=1
go package=events out=gen driver=pgx/v5
sql dialects=[postgres] out="" outbox=outbox_event inbox=outbox_inbox
event USER_CREATED UserCreated topic=users key=user_id version=1 ordered=true @9:5 ""
  field user_id UserID int64 optional=false @13:9
`
	if got := dump(s); got != want {
		t.Errorf("model mismatch\n--- got\n%s--- want\n%s", got, want)
	}
}

// TestParseRepoSpec keeps the repository's own events.yaml valid.
func TestParseRepoSpec(t *testing.T) {
	path := filepath.Join("..", "..", "events.yaml")
	if _, err := os.Stat(path); err != nil {
		t.Skip("no events.yaml at the module root")
	}
	s, err := ParseFile(path)
	if err != nil {
		t.Fatalf("ParseFile: %v", err)
	}
	if len(s.Events) == 0 || s.Events[0].Key == nil {
		t.Fatalf("events.yaml parsed without events or keys")
	}
}

func TestParseFileMissing(t *testing.T) {
	_, err := ParseFile("testdata/does-not-exist.yaml")
	list, ok := err.(ErrorList)
	if !ok || len(list) != 1 {
		t.Fatalf("err = %#v, want a one-entry ErrorList", err)
	}
	if !strings.HasPrefix(list.Error(), "testdata/does-not-exist.yaml: cannot read spec file: ") {
		t.Errorf("err = %q", list.Error())
	}
	// The path is named once, not again by the wrapped *fs.PathError.
	if n := strings.Count(list.Error(), "does-not-exist.yaml"); n != 1 {
		t.Errorf("err = %q names the file %d times, want once", list.Error(), n)
	}
}

// TestSourceName: the spec file as generated headers and comments cite it,
// its base name, quoted with escapes when it holds anything but letters,
// digits, spaces and common punctuation, so it can neither end a comment
// line nor start a directive.
func TestSourceName(t *testing.T) {
	for file, want := range map[string]string{
		"":                          "events.yaml",
		"events.yaml":               "events.yaml",
		"internal/gentest/x.yaml":   "x.yaml",
		"/abs/dir/events.yaml":      "events.yaml",
		`dir\win.yaml`:              `"dir\\win.yaml"`,
		"my events (v2)+x.yaml":     "my events (v2)+x.yaml",
		"événements.yaml":           "événements.yaml",
		"x\n\n+build ignore\n.yaml": `"x\n\n+build ignore\n.yaml"`,
		"a*/b.yaml":                 "b.yaml",
		"drop;--.yaml":              `"drop;--.yaml"`,
		"bidi\u202e.yaml":           `"bidi\u202e.yaml"`,
	} {
		if got := (&Spec{File: file}).SourceName(); got != want {
			t.Errorf("SourceName of %q = %s, want %s", file, got, want)
		}
	}
}

func TestGoName(t *testing.T) {
	for in, want := range map[string]string{
		"ORDER_PAID":    "OrderPaid",
		"points_v2":     "PointsV2",
		"order_id":      "OrderID",
		"orderID":       "OrderID",
		"orderId":       "OrderID",
		"type":          "Type",
		"http_url":      "HTTPURL",
		"HTTPServer":    "HTTPServer",
		"utf8_text":     "UTF8Text",
		"bank_transfer": "BankTransfer",
		"apple-pay":     "ApplePay",
		"v2.legacy":     "V2Legacy",
		"api_key":       "APIKey",
		"ids":           "Ids",
		"_":             "",
		"x":             "X",
		"sha256Sum":     "Sha256Sum",
		"XML_HTTP_ACL":  "XMLHTTPACL",
	} {
		if got := GoName(in); got != want {
			t.Errorf("GoName(%q) = %q, want %q", in, got, want)
		}
	}
}

// TestNaming checks how go.initialisms and go.rename turn every kind of
// spec name into a Go name.
func TestNaming(t *testing.T) {
	const head = "version: 1\nsql: {dialects: [postgres]}\n"
	const body = `types:
  - name: Country
    enum: [DE, AT, gb, united_kingdom, de_at]
events:
  - name: SMS_SENT
    topic: sms.sent
    key: sms_id
    fields:
      - {name: sms_id, type: string}
      - {name: smsCount, type: int32}
      - {name: msisdn, type: string}
      - {name: http_status, type: int32}
      - {name: country, type: Country}
  - {name: ORDER_PAID, topic: a, key: id, fields: [{name: id, type: string}]}
consumers:
  - {name: sms_notifier, events: [SMS_SENT]}
  - {name: sms, events: [SMS_SENT]}
`
	names := func(s *Spec) string {
		var parts []string
		for _, tp := range s.Types {
			for _, v := range tp.Values {
				parts = append(parts, v.GoName)
			}
		}
		for _, e := range s.Events {
			parts = append(parts, e.GoName)
			for _, f := range e.Fields {
				parts = append(parts, f.GoName)
			}
		}
		for _, c := range s.Consumers {
			parts = append(parts, c.GoName)
		}
		return strings.Join(parts, " ")
	}
	for _, tc := range []struct{ name, goSection, want string }{
		{
			"default",
			"go: {package: events, out: gen}\n",
			"CountryDe CountryAt CountryGb CountryUnitedKingdom CountryDeAt SmsSent SmsID SmsCount Msisdn HTTPStatus Country OrderPaid ID SmsNotifier Sms",
		},
		{
			"empty settings keep the default",
			"go: {package: events, out: gen, rename: {}, initialisms: null}\n",
			"CountryDe CountryAt CountryGb CountryUnitedKingdom CountryDeAt SmsSent SmsID SmsCount Msisdn HTTPStatus Country OrderPaid ID SmsNotifier Sms",
		},
		{
			"initialisms replace the default list",
			"go: {package: events, out: gen, initialisms: [SMS, de, id]}\n",
			"CountryDE CountryAt CountryGb CountryUnitedKingdom CountryDEAt SMSSent SMSID SMSCount Msisdn HttpStatus Country OrderPaid ID SMSNotifier SMS",
		},
		{
			"no initialisms",
			"go: {package: events, out: gen, initialisms: []}\n",
			"CountryDe CountryAt CountryGb CountryUnitedKingdom CountryDeAt SmsSent SmsId SmsCount Msisdn HttpStatus Country OrderPaid Id SmsNotifier Sms",
		},
		{
			// A whole name wins over its parts; a part is renamed wherever
			// it appears, in any case.
			"rename",
			`go:
  package: events
  out: gen
  rename:
    sms: SMS
    de: DE
    country_de_at: Dach
    united_kingdom: UK
    msisdn: PhoneNumber
    sms_notifier: Notifier
    order_paid: Paid
    id: Ident
`,
			"CountryDE CountryAt CountryGb CountryUK Dach SMSSent SMSIdent SMSCount PhoneNumber HTTPStatus Country Paid Ident Notifier SMS",
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, err := Parse("events.yaml", []byte(head+tc.goSection+body))
			if err != nil {
				t.Fatal(err)
			}
			if got := names(s); got != tc.want {
				t.Errorf("Go names\n got %s\nwant %s", got, tc.want)
			}
		})
	}
}

// sql.wal: true is kept with its position; false and absent mean the
// table outbox; other dialects may be listed beside postgres.
func TestParseWAL(t *testing.T) {
	const head = "version: 1\ngo: {package: events, out: gen}\nsql:\n  dialects: [mysql, postgres]\n"
	const events = "events:\n  - {name: A, topic: a, key: id, fields: [{name: id, type: string}]}\n"
	s, err := Parse("wal.yaml", []byte(head+"  wal: true\n"+events))
	if err != nil {
		t.Fatal(err)
	}
	if !s.SQL.WAL || s.SQL.WALPos.Line != 5 || s.SQL.WALPos.Col != 8 {
		t.Fatalf("sql.wal: true parsed as WAL=%v at %+v, want true at 5:8", s.SQL.WAL, s.SQL.WALPos)
	}
	for _, src := range []string{head + "  wal: false\n" + events, head + events} {
		s, err := Parse("wal.yaml", []byte(src))
		if err != nil || s.SQL.WAL {
			t.Fatalf("%q: WAL=%v, %v; want the table outbox", src, s.SQL.WAL, err)
		}
	}
}
