package export

import (
	"bytes"
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"math"
	"math/big"
	"net/netip"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/google/uuid"
	"github.com/santhosh-tekuri/jsonschema/v6"
	_ "modernc.org/sqlite"

	"github.com/outboxgen/outboxgen/generator"
	"github.com/outboxgen/outboxgen/generator/export/internal/allkinds"
	"github.com/outboxgen/outboxgen/generator/spec"
	"github.com/outboxgen/outboxgen/internal/testdb"
	"github.com/outboxgen/outboxgen/runtime/driver/sqldriver"
	"github.com/outboxgen/outboxgen/runtime/relay"
)

// schemas holds, for every payload version of allkinds.yaml, its schema
// in both exported forms: the standalone draft 2020-12 file and the
// AsyncAPI document's components/schemas entry (draft-07), plus the
// headers schema of its AsyncAPI message.
type schemas struct {
	standalone map[string]*jsonschema.Schema // by "EVENT vN"
	asyncAPI   map[string]*jsonschema.Schema
	headers    map[string]*jsonschema.Schema
}

func versionKey(event string, version int) string { return fmt.Sprintf("%s v%d", event, version) }

// compileSchemas compiles every exported schema of s with format
// assertions on, offline.
func compileSchemas(t testing.TB, s *spec.Spec) schemas {
	t.Helper()
	out := schemas{standalone: map[string]*jsonschema.Schema{}, asyncAPI: map[string]*jsonschema.Schema{}, headers: map[string]*jsonschema.Schema{}}

	files, err := JSONSchema(s)
	if err != nil {
		t.Fatal(err)
	}
	c := newCompiler()
	for _, f := range files {
		url := "https://outboxgen.test/" + f.Name
		if err := c.AddResource(url, readJSON(t, f.Content)); err != nil {
			t.Fatal(err)
		}
		// Compiling also validates the schema against the draft 2020-12
		// meta-schema.
		sch, err := c.Compile(url)
		if err != nil {
			t.Fatalf("%s: %v", f.Name, err)
		}
		out.standalone[versionKey(f.Event, f.Version)] = sch
	}

	doc, err := AsyncAPI(s, WithFormat(JSON))
	if err != nil {
		t.Fatal(err)
	}
	// The AsyncAPI Schema Object is draft-07: compile the components as
	// draft-07 schemas, at the same place, so that their references hold.
	var parsed struct {
		Components json.RawMessage `json:"components"`
	}
	if err := json.Unmarshal(doc, &parsed); err != nil {
		t.Fatal(err)
	}
	c = newCompiler()
	c.DefaultDraft(jsonschema.Draft7)
	const docURL = "https://outboxgen.test/asyncapi.json"
	if err := c.AddResource(docURL, readJSON(t, []byte(`{"components":`+string(parsed.Components)+`}`))); err != nil {
		t.Fatal(err)
	}
	for _, e := range s.Events {
		for _, v := range versions(e) {
			sch, err := c.Compile(docURL + "#/components/schemas/" + v.goName)
			if err != nil {
				t.Fatalf("%s: %v", v.goName, err)
			}
			out.asyncAPI[versionKey(e.Name, v.version)] = sch
			h, err := c.Compile(docURL + "#/components/messages/" + messageID(v) + "/headers")
			if err != nil {
				t.Fatalf("%s headers: %v", messageID(v), err)
			}
			out.headers[versionKey(e.Name, v.version)] = h
		}
	}
	if len(out.standalone) != len(out.asyncAPI) || len(out.standalone) == 0 {
		t.Fatalf("%d standalone schemas, %d AsyncAPI schemas", len(out.standalone), len(out.asyncAPI))
	}
	return out
}

// validate checks payload against both schemas of the version and
// returns the first error (nil when both accept it); both must agree.
func (sc schemas) validate(t testing.TB, key string, payload []byte) error {
	t.Helper()
	a, b := sc.standalone[key], sc.asyncAPI[key]
	if a == nil || b == nil {
		t.Fatalf("no schema for %s", key)
	}
	v := readJSON(t, payload)
	errA, errB := a.Validate(v), b.Validate(v)
	if (errA == nil) != (errB == nil) {
		t.Fatalf("%s: the JSON Schema file and the AsyncAPI schema disagree on\n%s\nfile: %v\nAsyncAPI: %v", key, payload, errA, errB)
	}
	return errA
}

func ptr[T any](v T) *T { return &v }

var (
	sampleTime  = time.Date(2026, 12, 1, 9, 30, 15, 123456789, time.UTC)
	sampleUUID  = uuid.MustParse("0190f3c8-7a4e-7b1c-9d2e-1f2a3b4c5d6e")
	sampleUUID2 = uuid.MustParse("f47ac10b-58cc-4372-a567-0e02b2c3d479")
	gold        = allkinds.TierGold
)

// everyTypeFull sets every field, optional ones included, to values at
// the edges of their encodings.
func everyTypeFull() allkinds.EveryType {
	lucky, _ := new(big.Int).SetString("-9223372036854775808", 10)
	return allkinds.EveryType{
		ID:        "cust-<1>&\"ü\"",
		Flag:      true,
		OptFlag:   ptr(false),
		Small:     math.MinInt32,
		OptSmall:  ptr(int32(math.MaxInt32)),
		Big:       math.MaxInt64,
		OptBig:    ptr(int64(math.MinInt64)),
		Ratio:     -1.5e300,
		OptRatio:  ptr(5e-324),
		Blob:      []byte{0xff, 0x00, 0xfe},
		OptBlob:   []byte{1},
		At:        sampleTime,
		OptAt:     ptr(time.Date(1999, 12, 31, 23, 59, 59, 0, time.FixedZone("IST", 5*3600+1800))),
		Ref:       sampleUUID,
		OptRef:    ptr(uuid.Nil),
		Amount:    json.Number("123456789012345678901234567890.123456789"),
		OptAmount: ptr(json.Number("-1e-7")),
		Doc:       json.RawMessage(`{"any": ["json", 1, null, true]}`),
		OptDoc:    json.RawMessage(`"a string"`),
		Tier:      allkinds.TierBronze,
		OptTier:   ptr(allkinds.TierSilver),
		Address: allkinds.Address{Street: "Main St 1", City: "Berlin", Lines: []string{"c/o X"},
			Previous: &allkinds.Address{Street: "Old St 2", City: "Paris", Previous: &allkinds.Address{}}},
		OptAddress: &allkinds.Address{Street: "s", City: "c"},
		Names:      []string{"a", "", "ü"},
		OptNames:   []string{"x"},
		Scores:     map[string]int64{"max": math.MaxInt64, "": -1},
		OptScores:  map[string]float64{"pi": math.Pi},
		Matrix:     [][]int32{{1, 2}, nil, {}},
		Blobs:      map[string][]byte{"one": {1}, "two": {1, 2}, "nil": nil, "empty": {}},
		Tiers:      []allkinds.Tier{allkinds.TierGold, allkinds.TierSilver},
		Addresses:  map[string]allkinds.Address{"home": {Street: "h", City: "c", Previous: &allkinds.Address{Street: "p"}}},
		Tree: allkinds.Node{Label: "root", Tier: &gold, Children: []allkinds.Node{
			{Label: "leaf", Children: []allkinds.Node{}},
			{Label: "nil children"},
		}},
		Times:     []time.Time{sampleTime, time.Date(2026, 1, 1, 0, 0, 0, 0, time.FixedZone("", -8*3600))},
		Refs:      map[string]uuid.UUID{"a": sampleUUID2},
		Prices:    []allkinds.Money{{Amount: "9.99", Currency: "EUR"}, {}},
		Docs:      []json.RawMessage{json.RawMessage(`1`), nil, json.RawMessage(`{}`)},
		Amounts:   map[string]json.Number{"a": "0.1", "b": ""},
		TierLists: map[string][]allkinds.Tier{"x": {allkinds.TierBronze}, "nil": nil},
		IP:        netip.MustParseAddr("2001:db8::1"),
		OptIP:     ptr(netip.MustParseAddr("192.0.2.1")),
		Lucky:     lucky,
	}
}

// everyTypeZero is the smallest valid event: a key and valid enums, every
// other field its zero value (nil slices and maps are written as null).
func everyTypeZero() allkinds.EveryType {
	return allkinds.EveryType{ID: "k", Tier: allkinds.TierGold}
}

// everyTypeEmpty has empty, not nil, slices and maps, and optional fields
// pointing at zero values.
func everyTypeEmpty() allkinds.EveryType {
	return allkinds.EveryType{
		ID: "k", Tier: allkinds.TierSilver,
		OptFlag: ptr(false), OptSmall: ptr(int32(0)), OptBig: ptr(int64(0)), OptRatio: ptr(0.0),
		Blob: []byte{}, OptBlob: []byte{}, OptAt: &time.Time{}, OptRef: &uuid.UUID{}, OptAmount: ptr(json.Number("")),
		Doc: json.RawMessage(`null`), OptDoc: json.RawMessage{}, OptTier: ptr(allkinds.TierBronze), OptAddress: &allkinds.Address{},
		Names: []string{}, OptNames: []string{}, Scores: map[string]int64{}, OptScores: map[string]float64{},
		Matrix: [][]int32{}, Blobs: map[string][]byte{}, Tiers: []allkinds.Tier{}, Addresses: map[string]allkinds.Address{},
		Times: []time.Time{}, Refs: map[string]uuid.UUID{}, Prices: []allkinds.Money{}, Docs: []json.RawMessage{},
		Amounts: map[string]json.Number{}, TierLists: map[string][]allkinds.Tier{}, OptIP: &netip.Addr{}, Lucky: new(big.Int),
	}
}

// goPayload is a payload as the generated code writes it.
type goPayload struct {
	name    string
	event   string
	version int
	value   any
}

func goPayloads() []goPayload {
	return []goPayload{
		{"EveryType full", allkinds.EveryTypeType, allkinds.EveryTypeVersion, everyTypeFull()},
		{"EveryType zero", allkinds.EveryTypeType, allkinds.EveryTypeVersion, everyTypeZero()},
		{"EveryType empty", allkinds.EveryTypeType, allkinds.EveryTypeVersion, everyTypeEmpty()},
		{"OrderPaid", allkinds.OrderPaidType, allkinds.OrderPaidVersion, allkinds.OrderPaid{OrderID: "o-1", Total: allkinds.Money{Amount: "12.50", Currency: "EUR"}, PaidAt: sampleTime}},
		{"OrderPaidV2", allkinds.OrderPaidType, 2, allkinds.OrderPaidV2{OrderID: "o-1", Amount: "12.50", Currency: "EUR"}},
		{"OrderPaidV1", allkinds.OrderPaidType, 1, allkinds.OrderPaidV1{OrderID: "o-1", AmountCents: 1250}},
		{"OrderRefunded", allkinds.OrderRefundedType, 1, allkinds.OrderRefunded{OrderID: "o-1"}},
		{"ShelfCounted", allkinds.ShelfCountedType, 1, allkinds.ShelfCounted{Shelf: -3, Count: math.MinInt64}},
		{"StockMoved", allkinds.StockMovedType, 1, allkinds.StockMoved{Sku: 0}},
		{"SessionStarted", allkinds.SessionStartedType, 1, allkinds.SessionStarted{SessionID: sampleUUID}},
		{"Switched", allkinds.SwitchedType, 1, allkinds.Switched{State: allkinds.SwitchNull, History: []allkinds.Switch{
			allkinds.SwitchOn, allkinds.SwitchOff, allkinds.SwitchYes, allkinds.SwitchNo, allkinds.SwitchY, allkinds.SwitchN,
			allkinds.SwitchNull, allkinds.SwitchTrue, allkinds.SwitchFalse, allkinds.SwitchE1, allkinds.SwitchNan, allkinds.SwitchInf,
		}}},
		{"TierChanged", allkinds.TierChangedType, 1, allkinds.TierChanged{Tier: allkinds.TierGold, Members: []uuid.UUID{sampleUUID, sampleUUID2}}},
		{"TierChanged nil members", allkinds.TierChangedType, 1, allkinds.TierChanged{Tier: allkinds.TierBronze}},
	}
}

// decode decodes payload with the generated DecodeX of event.
func decode(event string, payload []byte, version int) error {
	var err error
	switch event {
	case allkinds.EveryTypeType:
		_, err = allkinds.DecodeEveryType(payload, version)
	case allkinds.OrderPaidType:
		_, err = allkinds.DecodeOrderPaid(payload, version)
	case allkinds.OrderRefundedType:
		_, err = allkinds.DecodeOrderRefunded(payload, version)
	case allkinds.ShelfCountedType:
		_, err = allkinds.DecodeShelfCounted(payload, version)
	case allkinds.StockMovedType:
		_, err = allkinds.DecodeStockMoved(payload, version)
	case allkinds.SessionStartedType:
		_, err = allkinds.DecodeSessionStarted(payload, version)
	case allkinds.TierChangedType:
		_, err = allkinds.DecodeTierChanged(payload, version)
	case allkinds.SwitchedType:
		_, err = allkinds.DecodeSwitched(payload, version)
	default:
		err = fmt.Errorf("unknown event %s", event)
	}
	return err
}

// TestExportGoPayloadsValidate marshals payloads of every event version with the
// generated code and validates them against the exported schemas of their
// version; they must not validate against the other versions of the
// event, and the generated decoder must read them back.
func TestExportGoPayloadsValidate(t *testing.T) {
	s := allKinds(t)
	sc := compileSchemas(t, s)
	covered := map[string]bool{}
	for _, p := range goPayloads() {
		covered[versionKey(p.event, p.version)] = true
	}
	for key := range sc.standalone {
		if !covered[key] {
			t.Errorf("no Go payload of %s: add one to goPayloads", key)
		}
	}
	for _, p := range goPayloads() {
		t.Run(p.name, func(t *testing.T) {
			if v, ok := p.value.(interface{ Validate() error }); ok {
				if err := v.Validate(); err != nil {
					t.Fatalf("the sample is not a valid event: %v", err)
				}
			}
			payload, err := json.Marshal(p.value)
			if err != nil {
				t.Fatal(err)
			}
			if err := sc.validate(t, versionKey(p.event, p.version), payload); err != nil {
				t.Fatalf("a payload the generated code wrote does not validate:\n%s\n%s", payload, errorText(err))
			}
			if err := decode(p.event, payload, p.version); err != nil {
				t.Fatalf("the generated decoder refuses it: %v", err)
			}
			for key := range sc.standalone {
				if strings.HasPrefix(key, p.event+" v") && key != versionKey(p.event, p.version) {
					if sc.validate(t, key, payload) == nil {
						t.Errorf("the payload also validates against %s:\n%s", key, payload)
					}
				}
			}
		})
	}
}

// capture is a watermill publisher that keeps what it is given.
type capture struct {
	mu     sync.Mutex
	topics []string
	msgs   []*message.Message
}

func (c *capture) Publish(topic string, msgs ...*message.Message) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, m := range msgs {
		c.topics = append(c.topics, topic)
		c.msgs = append(c.msgs, m)
	}
	return nil
}

func (c *capture) Close() error { return nil }

// TestExportRelayedMessagesValidate writes every current-version sample with the
// generated writer into a real outbox (SQLite), publishes it with the real
// relay, and validates each message as a consumer receives it: the payload
// against the schemas its outbox_type and outbox_version headers select,
// the headers against its AsyncAPI message's headers schema (and not
// against another version's).
func TestExportRelayedMessagesValidate(t *testing.T) {
	s := allKinds(t)
	sc := compileSchemas(t, s)
	ctx := context.Background()
	db, err := sql.Open("sqlite", testdb.SQLiteDSN(filepath.Join(t.TempDir(), "outbox.db")))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	testdb.ApplySchema(t, db, "sqlite", generator.Tables(s))
	w, err := allkinds.NewWriter(db)
	if err != nil {
		t.Fatal(err)
	}
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	written := 0
	for _, p := range goPayloads() {
		var err error
		switch v := p.value.(type) {
		case allkinds.EveryType:
			_, err = w.InsertEveryType(ctx, tx, v)
		case allkinds.OrderPaid:
			_, err = w.InsertOrderPaid(ctx, tx, v)
		case allkinds.OrderRefunded:
			_, err = w.InsertOrderRefunded(ctx, tx, v)
		case allkinds.ShelfCounted:
			_, err = w.InsertShelfCounted(ctx, tx, v)
		case allkinds.StockMoved:
			_, err = w.InsertStockMoved(ctx, tx, v)
		case allkinds.SessionStarted:
			_, err = w.InsertSessionStarted(ctx, tx, v)
		case allkinds.TierChanged:
			_, err = w.InsertTierChanged(ctx, tx, v)
		case allkinds.Switched:
			_, err = w.InsertSwitched(ctx, tx, v)
		default:
			continue // an earlier version: writers write the current one only
		}
		if err != nil {
			t.Fatalf("%s: %v", p.name, err)
		}
		written++
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}

	pub := &capture{}
	drv, err := sqldriver.New(db, allkinds.Schema)
	if err != nil {
		t.Fatal(err)
	}
	r, err := relay.New(drv, relay.Config{Publisher: pub})
	if err != nil {
		t.Fatal(err)
	}
	for published := 0; published < written; {
		n, err := r.RunOnce(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if n == 0 {
			t.Fatalf("the relay published %d of %d events", published, written)
		}
		published += n
	}
	if len(pub.msgs) != written {
		t.Fatalf("%d messages for %d events", len(pub.msgs), written)
	}
	for i, m := range pub.msgs {
		event := m.Metadata.Get(relay.MetadataType)
		version, err := strconv.Atoi(m.Metadata.Get(relay.MetadataVersion))
		if err != nil {
			t.Fatal(err)
		}
		key := versionKey(event, version)
		var topic string
		for _, e := range s.Events {
			if e.Name == event {
				topic = e.Topic
			}
		}
		if pub.topics[i] != topic {
			t.Errorf("%s published to %s, want %s", event, pub.topics[i], topic)
		}
		if err := sc.validate(t, key, m.Payload); err != nil {
			t.Errorf("%s: the relayed payload does not validate:\n%s\n%s", key, m.Payload, errorText(err))
		}
		headers, err := json.Marshal(map[string]string(m.Metadata))
		if err != nil {
			t.Fatal(err)
		}
		if err := sc.headers[key].Validate(readJSON(t, headers)); err != nil {
			t.Errorf("%s: the relayed headers do not validate:\n%s\n%s", key, headers, errorText(err))
		}
		if event == allkinds.OrderPaidType {
			if sc.headers[versionKey(event, 1)].Validate(readJSON(t, headers)) == nil {
				t.Errorf("the headers of a v%d %s message validate as v1:\n%s", version, event, headers)
			}
		}
	}
}

// mutation changes a valid payload into one the schema must refuse.
type mutation struct {
	path []string // object keys and array indexes; the last is changed
	// value is the JSON to put there; "" removes the member.
	value string
	why   string
}

// apply returns doc with m applied, or fails when the path is not there.
func (m mutation) apply(t *testing.T, doc []byte) []byte {
	t.Helper()
	var v any
	dec := json.NewDecoder(bytes.NewReader(doc))
	dec.UseNumber()
	if err := dec.Decode(&v); err != nil {
		t.Fatal(err)
	}
	var replacement any
	if m.value != "" {
		dec := json.NewDecoder(strings.NewReader(m.value))
		dec.UseNumber()
		if err := dec.Decode(&replacement); err != nil {
			t.Fatalf("mutation value %s: %v", m.value, err)
		}
	}
	parent := v
	for i, step := range m.path {
		last := i == len(m.path)-1
		switch p := parent.(type) {
		case map[string]any:
			if _, ok := p[step]; !ok {
				t.Fatalf("path %v: no %q in %s", m.path, step, doc)
			}
			if last {
				if m.value == "" {
					delete(p, step)
				} else {
					p[step] = replacement
				}
			}
			parent = p[step]
		case []any:
			n, err := strconv.Atoi(step)
			if err != nil || n >= len(p) {
				t.Fatalf("path %v: no index %s", m.path, step)
			}
			if last {
				if m.value == "" {
					t.Fatalf("path %v: cannot remove an array element", m.path)
				}
				p[n] = replacement
			}
			parent = p[n]
		default:
			t.Fatalf("path %v: %q is inside a scalar", m.path, step)
		}
	}
	out, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// wrongType returns a JSON value of the wrong type for a field of type ref
// (as written by the generated code), or "" for json, which takes any.
func wrongType(ref *spec.TypeRef) string {
	switch ref.Kind {
	case spec.KindList:
		return `{"0": 1}`
	case spec.KindMap:
		return `[1]`
	case spec.KindNamed:
		if ref.Named.IsEnum() {
			return `1`
		}
		return `"object"`
	}
	switch ref.Scalar {
	case spec.String, spec.Bytes, spec.Time, spec.UUID:
		return `12`
	case spec.Bool:
		return `"true"`
	case spec.Int32, spec.Int64, spec.Float64:
		return `"1"`
	case spec.Decimal:
		if ref.GoType != nil {
			return `true`
		}
		return `"12.5"`
	case spec.JSON:
		return ""
	}
	panic("unknown scalar " + ref.Scalar)
}

// TestExportInvalidPayloadsFail mutates payloads the generated code wrote into
// invalid ones, for every field type: a wrong JSON type for every field, a
// missing required field, null where Go never writes null, unknown enum
// values, numbers out of range, and malformed formats, at the top level
// and nested in lists, maps and named types. Each must fail both schemas.
func TestExportInvalidPayloadsFail(t *testing.T) {
	s := allKinds(t)
	sc := compileSchemas(t, s)
	full, err := json.Marshal(everyTypeFull())
	if err != nil {
		t.Fatal(err)
	}
	key := versionKey(allkinds.EveryTypeType, allkinds.EveryTypeVersion)
	if err := sc.validate(t, key, full); err != nil {
		t.Fatalf("the unmutated payload does not validate: %v", err)
	}

	var muts []mutation
	var every *spec.Event
	for _, e := range s.Events {
		if e.Name == allkinds.EveryTypeType {
			every = e
		}
	}
	kinds := map[string]bool{}
	for _, f := range every.Fields {
		kinds[typeString(f.Type)] = true
		if w := wrongType(f.Type); w != "" {
			muts = append(muts, mutation{[]string{f.Name}, w, "wrong type for " + typeString(f.Type)})
		}
		if !f.Optional {
			muts = append(muts, mutation{[]string{f.Name}, "", "required " + typeString(f.Type) + " missing"})
		}
		if !fieldNullable(f) && f.Type.Scalar != spec.JSON { // json: any value, null too
			muts = append(muts, mutation{[]string{f.Name}, "null", "null " + typeString(f.Type) + " (Go never writes it)"})
		}
	}
	for _, sc := range []spec.Scalar{spec.String, spec.Bool, spec.Int32, spec.Int64, spec.Float64, spec.Bytes, spec.Time, spec.UUID, spec.Decimal, spec.JSON} {
		if !kinds[string(sc)] {
			t.Errorf("allkinds.yaml has no %s field", sc)
		}
	}
	muts = append(muts,
		// Ranges.
		mutation{[]string{"small"}, `2147483648`, "int32 overflow"},
		mutation{[]string{"small"}, `-2147483649`, "int32 underflow"},
		mutation{[]string{"small"}, `1.5`, "int32 fraction"},
		mutation{[]string{"big"}, `9223372036854775808`, "int64 overflow"},
		mutation{[]string{"opt_big"}, `-9223372036854775809`, "int64 underflow"},
		mutation{[]string{"big"}, `0.5`, "int64 fraction"},
		mutation{[]string{"lucky"}, `1e30`, "go_type *big.Int of an int64 field beyond int64"},
		// Enums.
		mutation{[]string{"tier"}, `"platinum"`, "unknown enum value"},
		mutation{[]string{"tier"}, `""`, "empty enum value"},
		mutation{[]string{"tier"}, `"GOLD"`, "enum values are case-sensitive"},
		mutation{[]string{"opt_tier"}, `"x"`, "unknown optional enum value"},
		mutation{[]string{"tiers", "0"}, `"x"`, "unknown enum in a list"},
		mutation{[]string{"tier_lists", "x", "0"}, `"x"`, "unknown enum in a list in a map"},
		mutation{[]string{"tree", "tier"}, `"x"`, "unknown enum in an object"},
		// Formats.
		mutation{[]string{"at"}, `"2026-12-01 09:30:15Z"`, "date-time with a space"},
		mutation{[]string{"at"}, `"2026-12-01T09:30:15z"`, "date-time with a lower-case z (Go refuses it)"},
		mutation{[]string{"at"}, `"2026-12-01T09:30Z"`, "date-time without seconds"},
		mutation{[]string{"at"}, `"2026-13-01T09:30:15Z"`, "month 13"},
		mutation{[]string{"at"}, `"2026-12-01T09:30:60Z"`, "leap second (Go refuses it)"},
		mutation{[]string{"opt_at"}, `"2026-12-01T09:30:15+0100"`, "offset without a colon"},
		mutation{[]string{"at"}, `"1733045415"`, "Unix time"},
		mutation{[]string{"times", "1"}, `"yesterday"`, "bad date-time in a list"},
		mutation{[]string{"ref"}, `"not-a-uuid"`, "bad uuid"},
		mutation{[]string{"ref"}, `"0190f3c87a4e7b1c9d2e1f2a3b4c5d6e"`, "uuid without dashes"},
		mutation{[]string{"opt_ref"}, `"0190f3c8-7a4e-7b1c-9d2e-1f2a3b4c5d6"`, "short uuid"},
		mutation{[]string{"refs", "a"}, `"x"`, "bad uuid in a map"},
		mutation{[]string{"blob"}, `"YQ"`, "base64 without padding"},
		mutation{[]string{"blob"}, `"***="`, "not base64"},
		mutation{[]string{"opt_blob"}, `"AQ==="`, "bad base64 padding"},
		mutation{[]string{"blob"}, `"_-8="`, "URL-safe base64 (Go writes standard)"},
		mutation{[]string{"blobs", "one"}, `"!"`, "bad base64 in a map"},
		mutation{[]string{"amount"}, `"1.5"`, "decimal as a string"},
		mutation{[]string{"amounts", "a"}, `"0.1"`, "decimal as a string in a map"},
		// Nesting.
		mutation{[]string{"address", "city"}, `1`, "wrong type in an object"},
		mutation{[]string{"address", "street"}, ``, "missing field in an object"},
		mutation{[]string{"address", "previous", "previous", "city"}, ``, "missing field in a recursive object"},
		mutation{[]string{"address", "lines"}, `null`, "null optional list in an object"},
		mutation{[]string{"addresses", "home", "street"}, `1`, "wrong type in an object in a map"},
		mutation{[]string{"matrix", "0", "1"}, `"2"`, "wrong type in a list of lists"},
		mutation{[]string{"matrix", "0", "1"}, `2147483648`, "int32 overflow in a list of lists"},
		mutation{[]string{"names", "0"}, `null`, "null string in a list"},
		mutation{[]string{"scores", "max"}, `1.5`, "fraction in a map of int64"},
		mutation{[]string{"opt_scores", "pi"}, `"3.14"`, "wrong type in an optional map"},
		mutation{[]string{"prices", "0", "currency"}, ``, "missing field in an object in a list"},
		mutation{[]string{"prices", "0", "amount"}, `"9.99"`, "decimal as a string in an object in a list"},
		mutation{[]string{"tree", "children", "0", "label"}, `5`, "wrong type in a recursive list"},
		mutation{[]string{"tree", "children", "0", "children"}, `{}`, "object for a list in a recursive type"},
		mutation{[]string{"tree", "children"}, `[null]`, "null object in a list"},
		mutation{[]string{"addresses", "home"}, `null`, "null object in a map"},
	)

	for _, m := range muts {
		t.Run(m.why+" "+strings.Join(m.path, "."), func(t *testing.T) {
			bad := m.apply(t, full)
			if err := sc.validate(t, key, bad); err == nil {
				t.Errorf("validates (%s at %v):\n%s", m.why, m.path, bad)
			}
		})
	}

	// The other events: a wrong type for every field, a missing required
	// one, and each enum and key format.
	for _, p := range goPayloads() {
		if p.event == allkinds.EveryTypeType {
			continue
		}
		payload, err := json.Marshal(p.value)
		if err != nil {
			t.Fatal(err)
		}
		e := eventNamed(s, p.event)
		for _, f := range e.VersionFields(p.version) {
			var muts []mutation
			if w := wrongType(f.Type); w != "" && bytes.Contains(payload, []byte(`"`+f.Name+`":`)) {
				muts = append(muts, mutation{[]string{f.Name}, w, "wrong type"})
			}
			if !f.Optional {
				muts = append(muts, mutation{[]string{f.Name}, "", "missing"})
			}
			for _, m := range muts {
				t.Run(p.name+" "+m.why+" "+f.Name, func(t *testing.T) {
					if err := sc.validate(t, versionKey(p.event, p.version), m.apply(t, payload)); err == nil {
						t.Errorf("%s %s: validates", m.why, f.Name)
					}
				})
			}
		}
	}
}

func eventNamed(s *spec.Spec, name string) *spec.Event {
	for _, e := range s.Events {
		if e.Name == name {
			return e
		}
	}
	panic("no event " + name)
}

// typeString is the spec's spelling of a field type.
func typeString(ref *spec.TypeRef) string {
	switch ref.Kind {
	case spec.KindList:
		return "list<" + typeString(ref.Elem) + ">"
	case spec.KindMap:
		return "map<" + typeString(ref.Elem) + ">"
	case spec.KindNamed:
		return ref.Named.Name
	}
	return string(ref.Scalar)
}

// TestExportForeignPayloads checks the other direction: payloads a non-Go
// producer may write that the schemas accept (other valid spellings than
// Go's) are read by the generated decoder.
func TestExportForeignPayloads(t *testing.T) {
	s := allKinds(t)
	sc := compileSchemas(t, s)
	full, err := json.Marshal(everyTypeFull())
	if err != nil {
		t.Fatal(err)
	}
	key := versionKey(allkinds.EveryTypeType, allkinds.EveryTypeVersion)
	for _, m := range []mutation{
		{[]string{"ref"}, `"0190F3C8-7A4E-7B1C-9D2E-1F2A3B4C5D6E"`, "upper-case uuid"},
		{[]string{"at"}, `"2026-12-01T10:30:15+01:00"`, "date-time with an offset"},
		{[]string{"at"}, `"2026-12-01T09:30:15.1234567891234Z"`, "more than nanosecond digits"},
		{[]string{"opt_names"}, `[]`, "empty optional list"},
		{[]string{"opt_blob"}, `""`, "empty optional bytes"},
		{[]string{"amount"}, `1E+400`, "decimal beyond float64"},
		{[]string{"doc"}, `[[[]]]`, "any json"},
		{[]string{"opt_tier"}, ``, "optional enum omitted"},
		{[]string{"blob"}, `null`, "null bytes"},
	} {
		t.Run(m.why, func(t *testing.T) {
			payload := m.apply(t, full)
			if err := sc.validate(t, key, payload); err != nil {
				t.Fatalf("refused: %v", errorText(err))
			}
			if err := decode(allkinds.EveryTypeType, payload, allkinds.EveryTypeVersion); err != nil {
				t.Errorf("the schema accepts it, the generated decoder does not: %v", err)
			}
		})
	}
	// Unknown members are accepted (adding an optional field keeps the
	// version), and Go ignores them.
	var v map[string]any
	dec := json.NewDecoder(bytes.NewReader(full))
	dec.UseNumber()
	if err := dec.Decode(&v); err != nil {
		t.Fatal(err)
	}
	v["added_later"] = map[string]any{"x": 1}
	v["address"].(map[string]any)["floor"] = 3
	extra, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	if err := sc.validate(t, key, extra); err != nil {
		t.Fatalf("a payload with members added by a later optional field is refused: %v", errorText(err))
	}
	if err := decode(allkinds.EveryTypeType, extra, allkinds.EveryTypeVersion); err != nil {
		t.Fatal(err)
	}
}
