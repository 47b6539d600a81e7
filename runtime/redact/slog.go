package redact

import (
	"context"
	"fmt"
	"log/slog"
)

// NewHandler returns a slog.Handler that redacts every record before h
// sees it: the message, string attributes, errors (as Error does, so the
// value stays an error), fmt.Stringer values (as their redacted text) and
// the attributes inside groups, with secrets masked as StringWith does.
// Other values (numbers, times, structs) are passed on unchanged.
//
//	logger := slog.New(redact.NewHandler(slog.NewTextHandler(os.Stderr, nil)))
func NewHandler(h slog.Handler, secrets ...string) slog.Handler {
	return &handler{h: h, secrets: secrets}
}

type handler struct {
	h       slog.Handler
	secrets []string
}

func (r *handler) Enabled(ctx context.Context, l slog.Level) bool { return r.h.Enabled(ctx, l) }

func (r *handler) Handle(ctx context.Context, rec slog.Record) error {
	out := slog.NewRecord(rec.Time, rec.Level, StringWith(rec.Message, r.secrets...), rec.PC)
	rec.Attrs(func(a slog.Attr) bool {
		out.AddAttrs(r.attr(a))
		return true
	})
	return r.h.Handle(ctx, out)
}

func (r *handler) WithAttrs(as []slog.Attr) slog.Handler {
	red := make([]slog.Attr, len(as))
	for i, a := range as {
		red[i] = r.attr(a)
	}
	return &handler{h: r.h.WithAttrs(red), secrets: r.secrets}
}

func (r *handler) WithGroup(name string) slog.Handler {
	return &handler{h: r.h.WithGroup(name), secrets: r.secrets}
}

func (r *handler) attr(a slog.Attr) slog.Attr {
	v := a.Value.Resolve()
	switch v.Kind() {
	case slog.KindString:
		return slog.String(a.Key, StringWith(v.String(), r.secrets...))
	case slog.KindGroup:
		g := v.Group()
		red := make([]any, len(g))
		for i, ga := range g {
			red[i] = r.attr(ga)
		}
		return slog.Group(a.Key, red...)
	case slog.KindAny:
		switch x := v.Any().(type) {
		case error:
			return slog.Any(a.Key, ErrorWith(x, r.secrets...))
		case fmt.Stringer:
			return slog.String(a.Key, StringWith(x.String(), r.secrets...))
		case []byte:
			return slog.String(a.Key, StringWith(string(x), r.secrets...))
		}
	}
	return slog.Attr{Key: a.Key, Value: v}
}
