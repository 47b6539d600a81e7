package dberr

import (
	"errors"
	"fmt"
	"testing"
)

// A mismatch (another dialect, an undeclared table) found by a start-up
// check is fatal at start and keeps its class through wrapping.
func TestMismatch(t *testing.T) {
	err := fmt.Errorf("relay: %w", &Error{Class: Mismatch, Advice: "the database is sqlite, not postgres", Err: errors.New("x")})
	if c := Classify(err); c != Mismatch || !c.FatalAtStart() || !c.Permanent() || c.String() != "mismatch" {
		t.Fatalf("Classify = %v", c)
	}
	if got := Explain(err, Need{Component: "relay"}); got != err {
		t.Fatalf("Explain re-explained an explained error: %v", got)
	}
}
