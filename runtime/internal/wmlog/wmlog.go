// Package wmlog adapts the *slog.Logger every outboxgen component takes to
// the logger interface watermill's publishers, subscribers and router want.
package wmlog

import (
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill"
)

// RepeatWindow is how long an error logged through Adapter holds back
// its repeats.
const RepeatWindow = 30 * time.Second

// maxRepeats bounds the errors Adapter remembers; past it, errors are
// logged as they come.
const maxRepeats = 256

// Adapter returns l as a watermill.LoggerAdapter, or watermill's no-op
// logger when l is nil. An error that repeats (the same message, error
// text and fields) is logged once per RepeatWindow; the next line says
// how many were held back since ("repeated"). A component retrying a
// broker that is down would otherwise log each attempt:
// watermill-redisstream's reader logs its failure twice a second, its
// claimer once per claim interval, per subscription.
func Adapter(l *slog.Logger) watermill.LoggerAdapter {
	if l == nil {
		return watermill.NopLogger{}
	}
	return &limited{next: watermill.NewSlogLogger(l), seen: &repeats{now: time.Now, last: map[string]*repeat{}}}
}

// limited holds back repeated errors (see Adapter); loggers made by With
// share its memory, keyed with their fields too.
type limited struct {
	next watermill.LoggerAdapter
	with string // the fields of With, as they count in the key
	seen *repeats
}

type repeats struct {
	now  func() time.Time
	mu   sync.Mutex
	last map[string]*repeat
}

type repeat struct {
	logged time.Time // when the error was last logged
	held   int       // repeats held back since
}

func (l *limited) Error(msg string, err error, fields watermill.LogFields) {
	errText := ""
	if err != nil {
		errText = err.Error()
	}
	held, ok := l.seen.admit(msg + "\x00" + errText + "\x00" + l.with + "\x00" + key(fields))
	if !ok {
		return
	}
	if held > 0 {
		fields = fields.Add(watermill.LogFields{"repeated": held})
	}
	l.next.Error(msg, err, fields)
}

// admit reports whether the error of key k is to be logged now, and how
// many of its repeats were held back since it last was.
func (r *repeats) admit(k string) (int, bool) {
	now := r.now()
	r.mu.Lock()
	defer r.mu.Unlock()
	if e, ok := r.last[k]; ok {
		if now.Sub(e.logged) < RepeatWindow {
			e.held++
			return 0, false
		}
		held := e.held
		e.logged, e.held = now, 0
		return held, true
	}
	if len(r.last) >= maxRepeats {
		// Forget the errors whose window ended (their held-back count
		// with them); when none has, log this one as it comes.
		for k, e := range r.last {
			if now.Sub(e.logged) >= RepeatWindow {
				delete(r.last, k)
			}
		}
		if len(r.last) >= maxRepeats {
			return 0, true
		}
	}
	r.last[k] = &repeat{logged: now}
	return 0, true
}

func (l *limited) Info(msg string, fields watermill.LogFields)  { l.next.Info(msg, fields) }
func (l *limited) Debug(msg string, fields watermill.LogFields) { l.next.Debug(msg, fields) }
func (l *limited) Trace(msg string, fields watermill.LogFields) { l.next.Trace(msg, fields) }

func (l *limited) With(fields watermill.LogFields) watermill.LoggerAdapter {
	return &limited{next: l.next.With(fields), with: l.with + key(fields), seen: l.seen}
}

// key writes fields in a fixed order.
func key(fields watermill.LogFields) string {
	if len(fields) == 0 {
		return ""
	}
	var b strings.Builder
	for _, k := range slices.Sorted(maps.Keys(fields)) {
		fmt.Fprintf(&b, "%s=%v;", k, fields[k])
	}
	return b.String()
}
