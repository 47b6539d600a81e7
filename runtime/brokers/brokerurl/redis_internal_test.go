package brokerurl

import (
	"strings"
	"testing"

	"github.com/ThreeDotsLabs/watermill-redisstream/pkg/redisstream"
)

// TestRedisUnmarshallerFieldTypes: a field the default unmarshaller
// asserts to be text flags the message unreadable instead of panicking
// in it; an entry a watermill publisher wrote reads as it did.
func TestRedisUnmarshallerFieldTypes(t *testing.T) {
	for _, c := range []struct {
		name   string
		values map[string]any
		want   string // in the unreadable flag; "" when readable
	}{
		{"watermill", map[string]any{redisstream.UUIDHeaderKey: "id-1", "payload": "p"}, ""},
		{"no uuid", map[string]any{"payload": "p"}, "missing"},
		{"uuid not text", map[string]any{redisstream.UUIDHeaderKey: 7, "payload": "p"}, `field "_watermill_message_uuid" is not text but int`},
		{"payload not text", map[string]any{redisstream.UUIDHeaderKey: "id-1", "payload": []byte("p")}, `field "payload" is not text but []uint8`},
		{"metadata not text", map[string]any{redisstream.UUIDHeaderKey: "id-1", "payload": "p", "metadata": 1.5}, `field "metadata" is not text but float64`},
		{"metadata not msgpack", map[string]any{redisstream.UUIDHeaderKey: "id-1", "payload": "p", "metadata": "{"}, "unmarshal metadata fail"},
	} {
		t.Run(c.name, func(t *testing.T) {
			msg, err := redisUnmarshaller{}.Unmarshal(c.values)
			if err != nil || msg == nil {
				t.Fatalf("Unmarshal = %v, %v; want a message", msg, err)
			}
			flag := msg.Metadata.Get(MetadataUnreadable)
			if c.want == "" {
				if flag != "" || msg.UUID != "id-1" || string(msg.Payload) != "p" {
					t.Fatalf("readable entry read as %q %q, flag %q", msg.UUID, msg.Payload, flag)
				}
				return
			}
			if !strings.Contains(flag, c.want) || msg.UUID != "" {
				t.Fatalf("flag %q (uuid %q), want it to say %q", flag, msg.UUID, c.want)
			}
		})
	}
}
