// Package wmlog adapts the *slog.Logger every outboxgen component takes to
// the logger interface watermill's publishers, subscribers and router want.
package wmlog

import (
	"log/slog"

	"github.com/ThreeDotsLabs/watermill"
)

// Adapter returns l as a watermill.LoggerAdapter, or watermill's no-op
// logger when l is nil.
func Adapter(l *slog.Logger) watermill.LoggerAdapter {
	if l == nil {
		return watermill.NopLogger{}
	}
	return watermill.NewSlogLogger(l)
}
