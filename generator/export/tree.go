package export

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strconv"

	"gopkg.in/yaml.v3"
)

// The documents are built as a tree of these values, so that the keys of
// every object keep the order they were added in (maps would sort them, or
// worse, shuffle them) and the same tree renders as JSON or YAML:
//
//	obj      an object, members in order
//	[]any    an array
//	string, bool, int, int64
type member struct {
	key string
	val any
}

type obj []member

// set appends key: val, replacing an existing key in place.
func (o *obj) set(key string, val any) *obj {
	for i := range *o {
		if (*o)[i].key == key {
			(*o)[i].val = val
			return o
		}
	}
	*o = append(*o, member{key, val})
	return o
}

// get returns the value of key, or nil.
func (o obj) get(key string) any {
	for _, m := range o {
		if m.key == key {
			return m.val
		}
	}
	return nil
}

// encodeJSON renders v as indented JSON (two spaces) with a final newline.
// Strings are not HTML-escaped: descriptions stay readable.
func encodeJSON(v any) ([]byte, error) {
	var b bytes.Buffer
	if err := writeJSON(&b, v, ""); err != nil {
		return nil, err
	}
	b.WriteByte('\n')
	return b.Bytes(), nil
}

func writeJSON(b *bytes.Buffer, v any, indent string) error {
	switch v := v.(type) {
	case obj:
		if len(v) == 0 {
			b.WriteString("{}")
			return nil
		}
		b.WriteString("{\n")
		inner := indent + "  "
		for i, m := range v {
			b.WriteString(inner)
			writeString(b, m.key)
			b.WriteString(": ")
			if err := writeJSON(b, m.val, inner); err != nil {
				return err
			}
			if i < len(v)-1 {
				b.WriteByte(',')
			}
			b.WriteByte('\n')
		}
		b.WriteString(indent)
		b.WriteByte('}')
	case []any:
		if len(v) == 0 {
			b.WriteString("[]")
			return nil
		}
		b.WriteString("[\n")
		inner := indent + "  "
		for i, x := range v {
			b.WriteString(inner)
			if err := writeJSON(b, x, inner); err != nil {
				return err
			}
			if i < len(v)-1 {
				b.WriteByte(',')
			}
			b.WriteByte('\n')
		}
		b.WriteString(indent)
		b.WriteByte(']')
	case string:
		writeString(b, v)
	case bool:
		b.WriteString(strconv.FormatBool(v))
	case int:
		b.WriteString(strconv.Itoa(v))
	case int64:
		b.WriteString(strconv.FormatInt(v, 10))
	default:
		return fmt.Errorf("export: cannot render %T", v)
	}
	return nil
}

func writeString(b *bytes.Buffer, s string) {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	_ = enc.Encode(s) // a string always encodes
	b.Write(bytes.TrimSuffix(buf.Bytes(), []byte("\n")))
}

// encodeYAML renders v as YAML (two-space indent), after the comment
// lines in head (each written as "# line").
func encodeYAML(v any, head []string) ([]byte, error) {
	n, err := yamlNode(v)
	if err != nil {
		return nil, err
	}
	var b bytes.Buffer
	for _, line := range head {
		b.WriteString("# " + line + "\n")
	}
	enc := yaml.NewEncoder(&b)
	enc.SetIndent(2)
	if err := enc.Encode(n); err != nil {
		return nil, err
	}
	if err := enc.Close(); err != nil {
		return nil, err
	}
	return b.Bytes(), nil
}

func yamlNode(v any) (*yaml.Node, error) {
	switch v := v.(type) {
	case obj:
		n := &yaml.Node{Kind: yaml.MappingNode, Tag: "!!map"}
		for _, m := range v {
			k := &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!str", Value: m.key}
			val, err := yamlNode(m.val)
			if err != nil {
				return nil, err
			}
			n.Content = append(n.Content, k, val)
		}
		if len(v) == 0 {
			n.Style = yaml.FlowStyle
		}
		return n, nil
	case []any:
		n := &yaml.Node{Kind: yaml.SequenceNode, Tag: "!!seq"}
		for _, x := range v {
			val, err := yamlNode(x)
			if err != nil {
				return nil, err
			}
			n.Content = append(n.Content, val)
		}
		if len(v) == 0 {
			n.Style = yaml.FlowStyle
		}
		return n, nil
	case string, bool, int, int64:
		n := &yaml.Node{}
		if err := n.Encode(v); err != nil {
			return nil, err
		}
		return n, nil
	}
	return nil, fmt.Errorf("export: cannot render %T", v)
}
