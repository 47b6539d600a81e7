package wmlog

import (
	"bytes"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"

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

// captured returns an Adapter writing to a text handler, its output, and
// a clock the test moves.
func captured(t *testing.T) (watermill.LoggerAdapter, *bytes.Buffer, *time.Time) {
	t.Helper()
	var buf bytes.Buffer
	a := Adapter(slog.New(slog.NewTextHandler(&buf, nil)))
	now := time.Date(2026, 12, 6, 8, 0, 0, 0, time.UTC)
	a.(*limited).seen.now = func() time.Time { return now }
	return a, &buf, &now
}

func lines(buf *bytes.Buffer) []string {
	return strings.FieldsFunc(buf.String(), func(r rune) bool { return r == '\n' })
}

func TestAdapterHoldsBackRepeatedErrors(t *testing.T) {
	a, buf, now := captured(t)
	down := errors.New("dial tcp 127.0.0.1:6379: connect: connection refused")
	fields := watermill.LogFields{"stream": "orders"}
	for range 100 { // four a second for 25 s: within one window
		a.Error("read fail", down, fields)
		*now = now.Add(250 * time.Millisecond)
	}
	if got := lines(buf); len(got) != 1 || strings.Contains(got[0], "repeated") {
		t.Fatalf("100 repeats within %s logged %d lines, want the first alone:\n%s", RepeatWindow, len(got), buf)
	}
	*now = now.Add(RepeatWindow)
	a.Error("read fail", down, fields)
	got := lines(buf)
	if len(got) != 2 || !strings.Contains(got[1], "repeated=99") {
		t.Fatalf("after the window logged:\n%s\nwant a second line with repeated=99", buf)
	}
	// The count starts again.
	a.Error("read fail", down, fields)
	*now = now.Add(RepeatWindow)
	a.Error("read fail", down, fields)
	if got := lines(buf); len(got) != 3 || !strings.Contains(got[2], "repeated=1") {
		t.Fatalf("logged:\n%s\nwant a third line with repeated=1", buf)
	}
}

func TestAdapterLogsDistinctErrors(t *testing.T) {
	a, buf, _ := captured(t)
	down := errors.New("connection refused")
	a.Error("read fail", down, watermill.LogFields{"stream": "orders"})
	a.Error("read fail", down, watermill.LogFields{"stream": "payments"})                    // other fields
	a.Error("read fail", errors.New("i/o timeout"), watermill.LogFields{"stream": "orders"}) // other error
	a.Error("xpendingext fail", down, watermill.LogFields{"stream": "orders"})               // other message
	a.With(watermill.LogFields{"consumer": "b"}).Error("read fail", down, watermill.LogFields{"stream": "orders"})
	a.Error("read fail", nil, nil)
	a.Error("read fail", nil, nil) // a repeat
	for range 3 {
		a.Info("subscribing", nil) // not held back
	}
	if got := lines(buf); len(got) != 9 {
		t.Fatalf("logged %d lines, want 9 (6 distinct errors, 3 infos):\n%s", len(got), buf)
	}
}

func TestAdapterRemembersBoundedErrors(t *testing.T) {
	a, buf, now := captured(t)
	for i := range maxRepeats + 50 {
		a.Error("processMessage fail", errors.New("handler failed"), watermill.LogFields{"message_uuid": i})
	}
	if got := lines(buf); len(got) != maxRepeats+50 {
		t.Fatalf("logged %d lines, want every one of %d distinct errors", len(got), maxRepeats+50)
	}
	if n := len(a.(*limited).seen.last); n != maxRepeats {
		t.Fatalf("remembers %d errors, want at most %d", n, maxRepeats)
	}
	// Once their window ended, the old ones make room.
	*now = now.Add(RepeatWindow)
	a.Error("read fail", errors.New("connection refused"), nil)
	a.Error("read fail", errors.New("connection refused"), nil)
	if n := len(a.(*limited).seen.last); n != 1 {
		t.Fatalf("remembers %d errors after the window, want 1", n)
	}
	if got := lines(buf); len(got) != maxRepeats+51 {
		t.Fatalf("logged %d lines, want %d (the repeat held back)", len(got), maxRepeats+51)
	}
}
