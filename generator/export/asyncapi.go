package export

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/outboxgen/outboxgen/generator/spec"
)

// AsyncAPIVersion is the AsyncAPI specification version of the documents
// AsyncAPI writes.
const AsyncAPIVersion = "3.0.0"

// The message metadata (headers) the outboxgen relay sets on every message
// (runtime/outbox's Metadata* constants; runtime/relay sets them).
const (
	headerType         = "outbox_type"
	headerKey          = "outbox_key"
	headerVersion      = "outbox_version"
	headerCreatedAt    = "outbox_created_at"
	headerEventID      = "outbox_event_id"
	headerSequence     = "outbox_seq"
	headerPartitionKey = "partition_key"
)

// kafkaBindingVersion is the version of the AsyncAPI Kafka message binding
// used for the record key.
const kafkaBindingVersion = "0.5.0"

// patternCreatedAt is created_at as the relay writes it: RFC 3339 with
// nanoseconds (trailing zeros trimmed), in UTC.
const patternCreatedAt = `^[0-9]{4}-(0[1-9]|1[0-2])-(0[1-9]|[12][0-9]|3[01])T([01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9](\.[0-9]+)?Z$`

// AsyncAPI returns an AsyncAPI 3.0.0 document describing the events of s
// as the application that produces them (and runs the consumers s
// declares) sees them:
//
//   - a channel per topic (address = the topic), holding the messages of
//     the events published to it;
//   - a send operation per event (the generated InsertX writers), and a
//     receive operation per event a consumer handles;
//   - a message per event payload version: the current one (message id =
//     the event type, e.g. ORDER_PAID) and each earlier version declared
//     under previous: (ORDER_PAID.v1), with the payload schema, the headers
//     the relay sets (type and version as constants, so that the messages
//     of one channel are told apart by them), the key as correlationId and
//     as the Kafka record key binding, and an x-outboxgen extension;
//   - the payload schemas and the named types they use in
//     components/schemas.
//
// The document is YAML unless WithFormat(JSON) is given.
func AsyncAPI(s *spec.Spec, opts ...Option) ([]byte, error) {
	o, err := buildOptions(opts)
	if err != nil {
		return nil, err
	}
	doc, err := asyncAPIDoc(s, o)
	if err != nil {
		return nil, err
	}
	if o.format == JSON {
		return encodeJSON(doc)
	}
	head := []string{GeneratedComment, "source: " + s.SourceName()}
	if o.version != "" {
		head = append(head, "outboxgen version: "+o.version)
	}
	return encodeYAML(doc, head)
}

func asyncAPIDoc(s *spec.Spec, o options) (obj, error) {
	title := o.title
	if title == "" {
		title = s.Go.Package
		if !strings.HasSuffix(title, "events") && !strings.HasSuffix(title, "event") {
			title += " events"
		}
	}
	info := obj{{"title", title}, {"version", o.apiVersion}, {"description", infoDescription(s)}}

	b := newBuilder(asyncAPISchema)
	channelIDs := channelIDs(s)
	channels := obj{}
	messages := obj{}
	schemas := obj{}
	operations := obj{}
	schemaOwner := map[string]string{}
	claim := func(name, owner string) error {
		if other, dup := schemaOwner[name]; dup {
			return fmt.Errorf("%s: %s and %s both need components/schemas/%s in the AsyncAPI document; rename one", s.File, other, owner, name)
		}
		schemaOwner[name] = owner
		return nil
	}

	for _, e := range s.Events {
		chID := channelIDs[e.Topic]
		ch, _ := channels.get(chID).(obj)
		if ch == nil {
			ch = obj{{"address", e.Topic}, {"description", fmt.Sprintf("The broker topic %s.", e.Topic)}, {"messages", obj{}}}
		}
		chMessages := ch.get("messages").(obj)
		for _, v := range versions(e) {
			id := messageID(v)
			if err := claim(v.goName, fmt.Sprintf("event %s version %d", e.Name, v.version)); err != nil {
				return nil, err
			}
			payload := append(obj{{"title", v.title()}, {"description", v.describeVersion()}}, b.object(v.fields)...)
			schemas.set(v.goName, payload)
			messages.set(id, messageObject(v))
			chMessages.set(id, obj{{"$ref", "#/components/messages/" + id}})
		}
		ch.set("messages", chMessages)
		channels.set(chID, ch)

		operations.set("send"+e.GoName, obj{
			{"action", "send"},
			{"channel", obj{{"$ref", "#/channels/" + chID}}},
			{"title", "Send " + e.Name},
			{"description", sendDescription(e)},
			{"messages", []any{obj{{"$ref", "#/channels/" + chID + "/messages/" + e.Name}}}},
		})
	}
	for _, c := range s.Consumers {
		for _, e := range c.Events {
			chID := channelIDs[e.Topic]
			var refs []any
			for _, v := range versions(e) {
				refs = append(refs, obj{{"$ref", "#/channels/" + chID + "/messages/" + messageID(v)}})
			}
			operations.set(c.Name+".receive"+e.GoName, obj{
				{"action", "receive"},
				{"channel", obj{{"$ref", "#/channels/" + chID}}},
				{"title", fmt.Sprintf("Consumer %s receives %s", c.Name, e.Name)},
				{"description", receiveDescription(s, c, e)},
				{"messages", refs},
				{"x-outboxgen-consumer", c.Name},
			})
		}
	}
	for _, t := range s.Types {
		if err := claim(t.Name, "type "+t.Name); err != nil {
			return nil, err
		}
	}
	if err := claim(headersSchemaName, "the message headers"); err != nil {
		return nil, err
	}
	schemas.set(headersSchemaName, commonHeaders())
	for name, def := range b.definitions(s).members() {
		schemas.set(name, def)
	}

	doc := obj{
		{"asyncapi", AsyncAPIVersion},
		{"info", info},
		{"defaultContentType", "application/json"},
	}
	if len(channels) > 0 {
		doc.set("channels", channels)
	}
	if len(operations) > 0 {
		doc.set("operations", operations)
	}
	components := obj{}
	if len(messages) > 0 {
		components.set("messages", messages)
	}
	if len(schemas) > 0 {
		components.set("schemas", schemas)
	}
	if len(components) > 0 {
		doc.set("components", components)
	}
	return doc, nil
}

// members iterates over o's members in order.
func (o obj) members() func(yield func(string, any) bool) {
	return func(yield func(string, any) bool) {
		for _, m := range o {
			if !yield(m.key, m.val) {
				return
			}
		}
	}
}

// messageID is the components/messages id of a payload version: the event
// type for the current version, with ".v" and the version for earlier ones.
func messageID(v payloadVersion) string {
	if v.current {
		return v.event.Name
	}
	return v.event.Name + ".v" + strconv.Itoa(v.version)
}

// channelIDs gives every topic a channel id: the topic with each character
// other than letters, digits, '.', '_' and '-' (the topic may contain '/')
// replaced by '_', made unique with a numeric suffix, in event order.
func channelIDs(s *spec.Spec) map[string]string {
	ids := map[string]string{}
	taken := map[string]bool{}
	for _, e := range s.Events {
		if _, ok := ids[e.Topic]; ok {
			continue
		}
		base := strings.Map(func(r rune) rune {
			if 'a' <= r && r <= 'z' || 'A' <= r && r <= 'Z' || '0' <= r && r <= '9' || r == '.' || r == '_' || r == '-' {
				return r
			}
			return '_'
		}, e.Topic)
		id := base
		for n := 2; taken[id]; n++ {
			id = base + "_" + strconv.Itoa(n)
		}
		taken[id] = true
		ids[e.Topic] = id
	}
	return ids
}

func infoDescription(s *spec.Spec) string {
	return fmt.Sprintf("The events declared in %s (Go package %s), published through a transactional outbox generated by outboxgen: "+
		"each event is written to the outbox table in the same database transaction as the business change, and the outboxgen relay publishes it afterwards, at least once.\n\n"+
		"Every message carries the relay's metadata as headers: %s (the event type) and %s (the payload version) say how to decode the payload; "+
		"%s is the event's global id (a UUIDv7, also the message id), by which consumers deduplicate; "+
		"%s is the event's key (the aggregate id, also in %s), and the events of one key are published in the order they were written unless the event is declared unordered; "+
		"%s is the outbox row id, growing with commit order within a key; %s is when the event was written (RFC 3339, UTC). "+
		"Headers the producer added to an event are passed on beside them.\n\n"+
		"A consumer must accept every payload version listed for a message's event type: producers write the current version, "+
		"and earlier versions can still be in flight (in outboxes, on the broker, in replays).",
		s.SourceName(), s.Go.Package, headerType, headerVersion, headerEventID, headerKey, headerPartitionKey, headerSequence, headerCreatedAt)
}

func sendDescription(e *spec.Event) string {
	text := fmt.Sprintf("The service writes %s with the generated Insert%s inside the database transaction that makes the business change; "+
		"the outboxgen relay publishes it after the commit, at least once, with payload version %d.", e.Name, e.GoName, e.Version)
	if e.Ordered {
		text += fmt.Sprintf(" Events with the same key (field %s) are published in the order they were written.", e.Key.Name)
	} else {
		text += " The event is declared unordered: events with the same key may be published in any order."
	}
	return text
}

func receiveDescription(s *spec.Spec, c *spec.Consumer, e *spec.Event) string {
	text := fmt.Sprintf("Consumer %s (generated Register%s) handles %s in a database transaction, once per event id: the inbox table %s records the %s of every event handled.",
		c.Name, c.GoName, e.Name, s.SQL.InboxTable, headerEventID)
	if len(e.Previous) > 0 {
		text += fmt.Sprintf(" It decodes payload versions %s; earlier versions are upgraded to the current one before the handler sees them.", joinVersions(e.Versions()))
	}
	if c.IsLatestOnly(e) {
		text += fmt.Sprintf(" Latest only: an event older (by %s) than the newest one applied for its key is skipped.", headerSequence)
	}
	text += " A message it cannot decode goes to the poison topic."
	return text
}

func joinVersions(vs []int) string {
	parts := make([]string, len(vs))
	for i, v := range vs {
		parts[i] = strconv.Itoa(v)
	}
	return strings.Join(parts, ", ")
}

// messageObject returns the message object of payload version v.
func messageObject(v payloadVersion) obj {
	e := v.event
	m := obj{
		{"name", e.Name},
		{"title", v.title()},
	}
	if d := strings.TrimSpace(v.description); d != "" {
		m.set("description", d)
	}
	m.set("contentType", "application/json")
	m.set("headers", headers(v))
	m.set("payload", obj{{"$ref", "#/components/schemas/" + v.goName}})
	m.set("correlationId", obj{
		{"description", "The event's key (the aggregate id): the events of one key are related, and published in order unless the event is unordered."},
		{"location", "$message.header#/" + headerKey},
	})
	m.set("bindings", obj{{"kafka", obj{
		{"key", append(obj{{"description", "With outboxgen's Kafka publisher (runtime/brokers/kafka) the record key is the event's key (" + headerPartitionKey + "), so the events of one key share a partition."}}, keySchema(e)...)},
		{"bindingVersion", kafkaBindingVersion},
	}}})
	m.set("x-outboxgen", eventExtension(v))
	return m
}

// keySchema is the schema of the event's key as text (biz_id), as the
// generated writers turn the key field into it.
func keySchema(e *spec.Event) obj {
	ref := e.Key.Type
	if ref.GoType != nil {
		return obj{{"type", "string"}}
	}
	if ref.Kind == spec.KindNamed && ref.Named != nil && ref.Named.IsEnum() {
		values := make([]any, len(ref.Named.Values))
		for i, v := range ref.Named.Values {
			values[i] = v.Value
		}
		return obj{{"type", "string"}, {"enum", values}}
	}
	switch ref.Scalar {
	case spec.String:
		return obj{{"type", "string"}, {"minLength", 1}}
	case spec.Int32, spec.Int64:
		return obj{{"type", "string"}, {"pattern", patternInteger}}
	case spec.UUID:
		return obj{{"type", "string"}, {"format", "uuid"}, {"pattern", patternUUID}}
	case spec.Bool:
		return obj{{"type", "string"}, {"enum", []any{"true", "false"}}}
	case spec.Decimal:
		return obj{{"type", "string"}, {"pattern", patternDecimal}}
	}
	return obj{{"type", "string"}}
}

// headersSchemaName is the components/schemas entry describing the
// metadata the relay sets on every message.
const headersSchemaName = "OutboxHeaders"

// commonHeaders is the schema of the metadata the outboxgen relay sets on
// every message: each message's headers refine it with the event type,
// payload version and key format.
func commonHeaders() obj {
	key := obj{{"description", "The event's key (biz_id), as text: the aggregate whose events are kept in order."}, {"type", "string"}}
	props := obj{
		{headerType, obj{{"description", "The event type."}, {"type", "string"}}},
		{headerKey, key},
		{headerVersion, obj{{"description", "The payload version, in decimal."}, {"type", "string"}, {"pattern", `^[1-9][0-9]*$`}}},
		{headerCreatedAt, obj{{"description", "When the event was written (the outbox row's created_at), RFC 3339 with nanoseconds, UTC."}, {"type", "string"}, {"format", "date-time"}, {"pattern", patternCreatedAt}}},
		{headerEventID, obj{{"description", "The event's global id, a UUIDv7, also the message id: consumers deduplicate by it."}, {"type", "string"}, {"format", "uuid"}, {"pattern", patternUUID}}},
		{headerSequence, obj{{"description", "The outbox row id, in decimal: within a key it grows with commit order."}, {"type", "string"}, {"pattern", `^[1-9][0-9]*$`}}},
		{headerPartitionKey, obj{{"description", "The event's key again, for publishers that partition by it (Kafka)."}, {"type", "string"}}},
	}
	required := make([]any, len(props))
	for i, p := range props {
		required[i] = p.key
	}
	return obj{
		{"title", "Outbox message headers"},
		{"description", "The metadata the outboxgen relay sets on every message (Kafka record headers, NATS and AMQP message headers, watermill metadata), and the headers the producer added to the event (outbox.WithHeader: trace context, tenant, ...), all strings."},
		{"type", "object"},
		{"properties", props},
		{"required", required},
		{"additionalProperties", obj{{"type", "string"}}},
	}
}

// headers is the schema of the headers of a message of payload version v:
// the common ones, with the event type and version fixed (they tell the
// messages of one channel apart) and the key in the format of the key
// field.
func headers(v payloadVersion) obj {
	e := v.event
	return obj{
		{"type", "object"},
		{"allOf", []any{obj{{"$ref", "#/components/schemas/" + headersSchemaName}}}},
		{"properties", obj{
			{headerType, obj{{"type", "string"}, {"const", e.Name}}},
			{headerVersion, obj{{"type", "string"}, {"const", strconv.Itoa(v.version)}}},
			{headerKey, keySchema(e)},
			{headerPartitionKey, keySchema(e)},
		}},
	}
}
