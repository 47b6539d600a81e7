package msgctx

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
)

type key struct{}

func TestAny(t *testing.T) {
	mk := func(ctx context.Context) *message.Message {
		m := message.NewMessage("m", nil)
		m.SetContext(ctx)
		return m
	}
	first, cancelFirst := context.WithTimeout(context.WithValue(context.Background(), key{}, "v"), time.Hour)
	defer cancelFirst()
	third, cancelThird := context.WithCancelCause(context.Background())
	ctx, stop := Any([]*message.Message{mk(first), mk(context.Background()), mk(third)})
	defer stop()
	if ctx.Value(key{}) != "v" {
		t.Fatal("the first message's values are lost")
	}
	if d, ok := ctx.Deadline(); !ok || time.Until(d) < 59*time.Minute {
		t.Fatalf("deadline %v, %v: want the first message's", d, ok)
	}
	if ctx.Err() != nil {
		t.Fatal("ended before any message's context")
	}
	gaveUp := errors.New("gave up")
	cancelThird(gaveUp)
	select {
	case <-ctx.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("did not end with the third message's context")
	}
	if !errors.Is(context.Cause(ctx), gaveUp) {
		t.Fatalf("cause %v, want the third message's", context.Cause(ctx))
	}

	// A single message's context is its own; stop ends the joined one.
	one := mk(first)
	if got, _ := Any([]*message.Message{one}); got != first {
		t.Fatal("a single message's context is not returned as it is")
	}
	ctx, stop = Any([]*message.Message{mk(context.Background()), mk(context.Background())})
	stop()
	if ctx.Err() == nil {
		t.Fatal("stop did not release the joined context")
	}
}
