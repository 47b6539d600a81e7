// Package msgctx joins the contexts of the messages of one Publish call.
//
// A relay gives every message a context that ends when it gives up on
// the call (its PublishTimeout, a hedge that won). A publisher that sends
// a call's messages together waits for them together, and must stop
// when any of them is given up.
package msgctx

import (
	"context"

	"github.com/ThreeDotsLabs/watermill/message"
)

// Any returns a context that ends when the context of any of msgs ends,
// with that context's cause, and a function that releases it (call it
// when the call returns). It carries the first message's values and
// deadline. A single message's context is returned as it is.
func Any(msgs []*message.Message) (context.Context, func()) {
	switch len(msgs) {
	case 0:
		return context.Background(), func() {}
	case 1:
		return msgs[0].Context(), func() {}
	}
	ctx, cancel := context.WithCancelCause(msgs[0].Context())
	stops := make([]func() bool, 0, len(msgs)-1)
	for _, m := range msgs[1:] {
		mctx := m.Context()
		if mctx.Done() == nil {
			continue
		}
		stops = append(stops, context.AfterFunc(mctx, func() { cancel(context.Cause(mctx)) }))
	}
	return ctx, func() {
		for _, stop := range stops {
			stop()
		}
		cancel(nil)
	}
}
