package pubguard_test

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/outboxgen/outboxgen/runtime/internal/pubguard"
	"github.com/outboxgen/outboxgen/runtime/relay"
)

type failing struct{ err error }

func (f failing) Publish(string, ...*message.Message) error { return f.err }
func (f failing) Close() error                              { return nil }

// A *relay.PartialError is redacted inside too, outermost or wrapped, so
// that the one errors.As finds, which a caller may log, shows no secret;
// its Stored is kept.
func TestPartialErrorRedacted(t *testing.T) {
	const secret = "hunter22"
	stored := []bool{true, false}
	partial := relay.Partial(errors.New("dial redis://u:"+secret+"@h:1: refused"), stored)
	for name, err := range map[string]error{
		"outermost": partial,
		"wrapped":   fmt.Errorf("adapter: %w", partial),
	} {
		t.Run(name, func(t *testing.T) {
			got := pubguard.New(failing{err}, []string{secret}).Publish("t", message.NewMessage("a", nil), message.NewMessage("b", nil))
			var pe *relay.PartialError
			if !errors.As(got, &pe) {
				t.Fatalf("%v: the PartialError is lost", got)
			}
			if strings.Contains(got.Error(), secret) || strings.Contains(pe.Error(), secret) || strings.Contains(pe.Err.Error(), secret) {
				t.Errorf("the secret shows: %v (PartialError %v)", got, pe)
			}
			if !slices.Equal(relay.StoredOf(got, 2), stored) {
				t.Errorf("StoredOf = %v, want %v", relay.StoredOf(got, 2), stored)
			}
		})
	}
}
