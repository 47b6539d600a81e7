package relay_test

import (
	"errors"
	"fmt"
	"slices"
	"testing"

	"github.com/outboxgen/outboxgen/runtime/redact"
	"github.com/outboxgen/outboxgen/runtime/relay"
)

func TestPartial(t *testing.T) {
	refused := errors.New("refused")
	if err := relay.Partial(nil, []bool{true}); err != nil {
		t.Fatalf("Partial(nil) = %v, want nil", err)
	}
	if err := relay.Partial(refused, []bool{false, false}); err != refused {
		t.Fatalf("Partial with nothing stored = %v, want the error itself", err)
	}
	stored := []bool{true, false, true}
	err := relay.Partial(relay.Permanent(refused), stored)
	if got, want := err.Error(), "2 of 3 messages stored, the others not: refused"; got != want {
		t.Errorf("Error() = %q, want %q", got, want)
	}
	// Wrapped as the adapters wrap it (fmt, redaction), it is still found.
	wrapped := redact.ErrorWith(fmt.Errorf("publish: %w", err), "secret")
	if got := relay.StoredOf(wrapped, 3); !slices.Equal(got, stored) {
		t.Errorf("StoredOf(wrapped, 3) = %v, want %v", got, stored)
	}
	if got := relay.StoredOf(wrapped, 4); got != nil {
		t.Errorf("StoredOf of another length = %v, want nil: it says nothing of 4 messages", got)
	}
	if got := relay.StoredOf(refused, 1); got != nil {
		t.Errorf("StoredOf(plain error) = %v, want nil", got)
	}
	if !errors.Is(wrapped, relay.ErrPermanent) || !errors.Is(wrapped, refused) {
		t.Error("the PartialError hides its error from errors.Is")
	}
}
