package wmlog

import (
	"bytes"
	"log/slog"
	"strings"
	"testing"

	"github.com/ThreeDotsLabs/watermill"
)

func TestAdapter(t *testing.T) {
	if _, ok := Adapter(nil).(watermill.NopLogger); !ok {
		t.Errorf("Adapter(nil) = %T, want watermill.NopLogger", Adapter(nil))
	}
	var buf bytes.Buffer
	Adapter(slog.New(slog.NewTextHandler(&buf, nil))).Info("subscribed", watermill.LogFields{"topic": "orders"})
	if out := buf.String(); !strings.Contains(out, "subscribed") || !strings.Contains(out, "topic=orders") {
		t.Errorf("logged %q, want the message and its fields", out)
	}
}
