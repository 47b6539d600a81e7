package export

import (
	"fmt"
	"reflect"
	"strconv"
	"strings"
	"testing"

	"github.com/outboxgen/outboxgen/generator/spec"
)

// TestExportAsyncAPIValid validates the document of every test spec, in both
// formats, against the official AsyncAPI 3.0.0 JSON Schema, and checks
// that the YAML and JSON documents are the same document.
func TestExportAsyncAPIValid(t *testing.T) {
	validator := asyncAPIValidator(t)
	for _, path := range specFiles(t) {
		t.Run(path, func(t *testing.T) {
			s, err := spec.ParseFile(path)
			if err != nil {
				t.Fatal(err)
			}
			yamlDoc, err := AsyncAPI(s)
			if err != nil {
				t.Fatal(err)
			}
			jsonDoc, err := AsyncAPI(s, WithFormat(JSON))
			if err != nil {
				t.Fatal(err)
			}
			fromYAML := readJSON(t, yamlToJSON(t, yamlDoc))
			fromJSON := readJSON(t, jsonDoc)
			if err := validator.Validate(fromJSON); err != nil {
				t.Fatalf("the JSON document is not valid AsyncAPI 3.0.0:\n%s", errorText(err))
			}
			if err := validator.Validate(fromYAML); err != nil {
				t.Fatalf("the YAML document is not valid AsyncAPI 3.0.0:\n%s", errorText(err))
			}
			if !reflect.DeepEqual(fromYAML, fromJSON) {
				t.Error("the YAML and JSON documents differ")
			}
			checkRefs(t, fromJSON)
			checkOperations(t, s, fromJSON)
		})
	}
}

// TestExportAsyncAPIValidatorRejects shows that the validation above can fail:
// documents broken in ways a hand edit or a generator bug would break
// them are refused.
func TestExportAsyncAPIValidatorRejects(t *testing.T) {
	validator := asyncAPIValidator(t)
	doc, err := AsyncAPI(allKinds(t), WithFormat(JSON))
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct{ from, to string }{
		{`"asyncapi": "3.0.0"`, `"asyncapi": "2.6.0"`},
		{`"version": "1.0.0"`, `"versio": "1.0.0"`},
		{`"action": "send"`, `"action": "publish"`},
		{`"location": "$message.header#/outbox_key"`, `"location": "header:outbox_key"`},
		{`"bindingVersion": "0.5.0"`, `"bindingVersion": "9.9.9"`},
		{`"contentType": "application/json"`, `"contentType": 1`},
		{`"type": "object"`, `"type": "objekt"`},
		{`"minimum": -2147483648`, `"minimum": "low"`},
		{`"required": [`, `"required": "yes", "x": [`},
		{`"x-outboxgen-consumer"`, `"outboxgen-consumer"`},
	} {
		t.Run(c.to, func(t *testing.T) {
			bad := strings.Replace(string(doc), c.from, c.to, 1)
			if bad == string(doc) {
				t.Fatalf("the document has no %s", c.from)
			}
			if err := validator.Validate(readJSON(t, []byte(bad))); err == nil {
				t.Errorf("a document with %s instead of %s validates", c.to, c.from)
			}
		})
	}
}

// checkRefs checks that every local $ref of doc points at a value.
func checkRefs(t *testing.T, doc any) {
	t.Helper()
	n := 0
	var walk func(v any, at string)
	walk = func(v any, at string) {
		switch v := v.(type) {
		case map[string]any:
			if ref, ok := v["$ref"].(string); ok {
				n++
				if _, err := pointer(doc, ref); err != nil {
					t.Errorf("%s: $ref %s: %v", at, ref, err)
				}
			}
			for k, x := range v {
				walk(x, at+"/"+k)
			}
		case []any:
			for i, x := range v {
				walk(x, at+"/"+strconv.Itoa(i))
			}
		}
	}
	walk(doc, "#")
	if n == 0 {
		t.Error("no $ref in the document")
	}
}

// pointer resolves a local reference ("#/a/b") in doc.
func pointer(doc any, ref string) (any, error) {
	if !strings.HasPrefix(ref, "#/") {
		return nil, fmt.Errorf("not a local reference")
	}
	v := doc
	for _, tok := range strings.Split(ref[2:], "/") {
		tok = strings.ReplaceAll(strings.ReplaceAll(tok, "~1", "/"), "~0", "~")
		m, ok := v.(map[string]any)
		if !ok {
			return nil, fmt.Errorf("%q is not inside an object", tok)
		}
		if v, ok = m[tok]; !ok {
			return nil, fmt.Errorf("no %q", tok)
		}
	}
	return v, nil
}

// checkOperations checks what the JSON Schema cannot: each operation's
// messages are messages of its channel, every event is sent, every handled
// event is received, and each message's headers fix its type and version.
func checkOperations(t *testing.T, s *spec.Spec, doc any) {
	t.Helper()
	ops, _ := pointer(doc, "#/operations")
	sends, receives := map[string]bool{}, map[string]bool{}
	for id, op := range ops.(map[string]any) {
		op := op.(map[string]any)
		ch := op["channel"].(map[string]any)["$ref"].(string)
		for _, m := range op["messages"].([]any) {
			ref := m.(map[string]any)["$ref"].(string)
			if !strings.HasPrefix(ref, ch+"/messages/") {
				t.Errorf("operation %s: message %s is not on its channel %s", id, ref, ch)
			}
			msg, err := pointer(doc, ref)
			if err != nil {
				t.Fatalf("operation %s: %v", id, err)
			}
			target := msg.(map[string]any)["$ref"].(string)
			resolved, _ := pointer(doc, target)
			name := resolved.(map[string]any)["name"].(string)
			switch op["action"] {
			case "send":
				sends[name] = true
			case "receive":
				receives[op["x-outboxgen-consumer"].(string)+" "+name] = true
			}
		}
	}
	for _, e := range s.Events {
		if !sends[e.Name] {
			t.Errorf("no send operation for %s", e.Name)
		}
		for _, v := range versions(e) {
			id := messageID(v)
			m, err := pointer(doc, "#/components/messages/"+strings.ReplaceAll(id, "/", "~1"))
			if err != nil {
				t.Fatalf("message %s: %v", id, err)
			}
			props := m.(map[string]any)["headers"].(map[string]any)["properties"].(map[string]any)
			if got := props[headerType].(map[string]any)["const"]; got != e.Name {
				t.Errorf("message %s: %s const %v", id, headerType, got)
			}
			if got := props[headerVersion].(map[string]any)["const"]; got != strconv.Itoa(v.version) {
				t.Errorf("message %s: %s const %v", id, headerVersion, got)
			}
			if _, err := pointer(doc, "#/channels/"+channelIDs(s)[e.Topic]+"/messages/"+id); err != nil {
				t.Errorf("message %s is not on the channel of topic %s", id, e.Topic)
			}
			addr, _ := pointer(doc, "#/channels/"+channelIDs(s)[e.Topic]+"/address")
			if addr != e.Topic {
				t.Errorf("channel of %s has address %v", e.Topic, addr)
			}
		}
	}
	for _, c := range s.Consumers {
		for _, e := range c.Events {
			if !receives[c.Name+" "+e.Name] {
				t.Errorf("no receive operation for consumer %s, event %s", c.Name, e.Name)
			}
		}
	}
}

// TestExportChannelIDs checks that topics that are not valid channel ids (a
// '/'), or that collide once made valid, get distinct ids.
func TestExportChannelIDs(t *testing.T) {
	ids := channelIDs(allKinds(t))
	want := map[string]string{
		"every.type": "every.type", "orders/paid": "orders_paid", "orders_paid": "orders_paid_2",
		"stock": "stock", "sessions": "sessions", "007": "007", "tiers": "tiers",
	}
	if !reflect.DeepEqual(ids, want) {
		t.Errorf("channel ids = %v, want %v", ids, want)
	}
}

// TestExportAsyncAPIJSONNumbers checks that the int64 bounds survive as exact
// numbers in JSON (a float64 would round them).
func TestExportAsyncAPIJSONNumbers(t *testing.T) {
	doc, err := AsyncAPI(allKinds(t), WithFormat(JSON))
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{`"minimum": -9223372036854775808`, `"maximum": 9223372036854775807`} {
		if !strings.Contains(string(doc), want) {
			t.Errorf("the document lacks %s", want)
		}
	}
}
