package dialect

import (
	"context"
	"errors"
	"testing"
)

func TestVersionDialect(t *testing.T) {
	for v, want := range map[string]Dialect{
		"PostgreSQL 15.18 (Debian 15.18-0+deb12u1) on x86_64-pc-linux-gnu": Postgres,
		"10.11.14-MariaDB-0+deb12u2":                                       MySQL,
		"8.0.36":                                                           MySQL,
		"CockroachDB CCL v23.2.0 (x86_64-pc-linux-gnu)":                    "",
		"": "",
	} {
		if got := VersionDialect(v); got != want {
			t.Errorf("VersionDialect(%q) = %q, want %q", v, got, want)
		}
	}
}

// ServerDialect asks the guess's question first and falls back to the
// other; when both fail it returns the first question's error.
func TestServerDialect(t *testing.T) {
	down := errors.New("connection refused")
	server := func(answers map[string]string) func(context.Context, string) (string, error) {
		return func(_ context.Context, q string) (string, error) {
			if v, ok := answers[q]; ok {
				return v, nil
			}
			return "", errors.New("no such function")
		}
	}
	pg := server(map[string]string{ServerVersion: "PostgreSQL 15"})
	lite := server(map[string]string{SQLiteVersion: "3.46"})
	for _, c := range []struct {
		guess Dialect
		text  func(context.Context, string) (string, error)
		want  Dialect
	}{
		{Postgres, pg, Postgres}, {SQLite, pg, Postgres}, {MySQL, lite, SQLite}, {SQLite, lite, SQLite},
	} {
		if got, err := ServerDialect(context.Background(), c.guess, c.text); err != nil || got != c.want {
			t.Errorf("guess %s: ServerDialect = %q, %v; want %q", c.guess, got, err, c.want)
		}
	}
	_, err := ServerDialect(context.Background(), MySQL, func(context.Context, string) (string, error) { return "", down })
	if !errors.Is(err, down) {
		t.Errorf("database down: err = %v, want %v", err, down)
	}
}
