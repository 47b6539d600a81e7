// Package syncbuf holds Buffer, a text buffer safe for concurrent
// writers: tests collect a process's or a logger's output in one while
// goroutines write to it, and read it when they fail.
package syncbuf

import (
	"strings"
	"sync"
)

// Buffer is an io.Writer whose writes and String may run concurrently.
// The zero value is empty and ready to use.
type Buffer struct {
	mu sync.Mutex
	b  strings.Builder
}

// Write appends p.
func (s *Buffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

// String returns what was written so far.
func (s *Buffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}
