package dialect

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/outboxgen/outboxgen/runtime/internal/dberr"
)

// pgErr is an error with a PostgreSQL SQLSTATE, as pgx returns.
type pgErr string

func (e pgErr) Error() string    { return "ERROR: sqlstate " + string(e) }
func (e pgErr) SQLState() string { return string(e) }

func TestCheckSchemaVersion(t *testing.T) {
	check := func(answer string, err error) error {
		return CheckSchemaVersion(context.Background(), Postgres, "outbox_event", "sqldriver", "events.yaml",
			func(_ context.Context, q string) (string, error) {
				if !strings.Contains(q, "FROM outbox_event_version") {
					t.Errorf("query %q", q)
				}
				return answer, err
			})
	}
	for _, ok := range []struct {
		answer string
		err    error
	}{
		{"1 1", nil},
		{"0 0", nil},         // an empty version table
		{"", pgErr("42P01")}, // no version table: created before versioned migrations
		{"7 1", nil},         // newer, additive
		{"1 1\n", nil},       // tolerant of whitespace
	} {
		if err := check(ok.answer, ok.err); err != nil {
			t.Errorf("%q, %v: %v", ok.answer, ok.err, err)
		}
	}
	newer, needs := SchemaVersion+2, SchemaVersion+1
	err := check(fmt.Sprintf("%d %d", newer, needs), nil)
	if dberr.Classify(err) != dberr.Mismatch || !strings.Contains(err.Error(), fmt.Sprintf("schema version %d, which needs a runtime that knows version %d or later", newer, needs)) ||
		!strings.Contains(err.Error(), "upgrade github.com/outboxgen/outboxgen") {
		t.Errorf("newer: %v", err)
	}
	err = check("", pgErr("42501"))
	if dberr.Classify(err) != dberr.Denied || !strings.Contains(err.Error(), "outbox_event_version (the start-up check needs SELECT on it") {
		t.Errorf("denied: %v", err)
	}
	down := errors.New("connection refused")
	if err := check("", down); !errors.Is(err, down) || dberr.Classify(err) != dberr.Transient {
		t.Errorf("down: %v", err)
	}
	if err := check("garbage", nil); err == nil {
		t.Error("garbage accepted")
	}
	if Compatibility(MinSchemaVersion-1, 1) != "old" || Compatibility(SchemaVersion+1, SchemaVersion+1) != "new" || Compatibility(SchemaVersion, MinSchemaVersion) != "" {
		t.Error("Compatibility")
	}
}
