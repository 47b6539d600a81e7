package redact_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net/url"
	"strings"
	"testing"

	"github.com/go-sql-driver/mysql"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/outboxgen/outboxgen/runtime/redact"
)

func TestString(t *testing.T) {
	cases := []struct{ in, want string }{
		// URLs.
		{"postgres://app:S3cret@db:5432/orders?sslmode=disable", "postgres://app:xxxxx@db:5432/orders?sslmode=disable"},
		{"connect to postgresql://app:S3cret@db/orders: refused", "connect to postgresql://app:xxxxx@db/orders: refused"},
		{`natsjs: connect to "nats://u:S3cret@127.0.0.1:4222": x`, `natsjs: connect to "nats://u:xxxxx@127.0.0.1:4222": x`},
		{"nats://u:p@ss:w0rd@host:4222,nats://v:Other1@h2:4222", "nats://u:xxxxx@host:4222,nats://v:xxxxx@h2:4222"},
		{"nats://u:S3cret@host:port-not-a-number", "nats://u:xxxxx@host:port-not-a-number"},
		{"amqp://guest:guest@localhost:5672/", "amqp://guest:xxxxx@localhost:5672/"},
		{"postgres://app@db/orders", "postgres://app@db/orders"},                                    // no password: nothing to hide
		{"https://example.com/a:b@c", "https://example.com/a:b@c"},                                  // path, not userinfo
		{"postgres://app:xxxxx@db/orders", "postgres://app:xxxxx@db/orders"},                        // idempotent
		{"mysql://root:S3cret@tcp(127.0.0.1:3306)/db", "mysql://root:xxxxx@tcp(127.0.0.1:3306)/db"}, // the example's form
		// go-sql-driver/mysql DSNs.
		{"app:S3cret@tcp(db:3306)/orders?parseTime=true", "app:xxxxx@tcp(db:3306)/orders?parseTime=true"},
		{"-db \"app:S3cret@tcp(db:3306)/orders\": cannot tell", "-db \"app:xxxxx@tcp(db:3306)/orders\": cannot tell"},
		{"app:p@ss:w@rd@tcp(db:3306)/orders", "app:xxxxx@tcp(db:3306)/orders"},
		{"app:S3cret@/orders", "app:xxxxx@/orders"},
		{"app:S3cret@unix(/run/mysqld/mysqld.sock)/orders", "app:xxxxx@unix(/run/mysqld/mysqld.sock)/orders"},
		{"app@tcp(db:3306)/orders", "app@tcp(db:3306)/orders"},
		{"at 10:30@home/work", "at 10:30@home/work"},
		{"ab:cd@/x and ef:gh@tcp(h)/y", "ab:xxxxx@/x and ef:xxxxx@tcp(h)/y"},
		// user:password@host:port.
		{"dial tcp: address admin:S3cret@127.0.0.1:9092: too many colons", "dial tcp: address admin:xxxxx@127.0.0.1:9092: too many colons"},
		{"brokers [a:S3cret@[::1]:9092,b:Other@h:1]", "brokers [a:xxxxx@[::1]:9092,b:xxxxx@h:1]"},
		{"see a:b@c, 10:30@home", "see a:b@c, 10:30@home"},
		// key=value.
		{"host=db user=app password=S3cret dbname=orders", "host=db user=app password=xxxxx dbname=orders"},
		{"host=db password='it''s s3cret' dbname=orders", "host=db password=xxxxx dbname=orders"},
		{`host=db password='a\'b c' dbname=orders`, "host=db password=xxxxx dbname=orders"},
		{"host=db PASSWORD = S3cret", "host=db PASSWORD = xxxxx"},
		{"postgres://db/orders?user=app&password=S3cret&sslmode=disable", "postgres://db/orders?user=app&password=xxxxx&sslmode=disable"},
		{"postgres://db/orders?sslpassword=S3cret", "postgres://db/orders?sslpassword=xxxxx"},
		{"wss://h/x?token=abc.def&access_token=ghi", "wss://h/x?token=xxxxx&access_token=xxxxx"},
		{"client_secret=abc api_key=def apikey=ghi pwd=jkl pass=mno passwd=pqr nkey=SUAX seed=SUAY", "client_secret=xxxxx api_key=xxxxx apikey=xxxxx pwd=xxxxx pass=xxxxx passwd=xxxxx nkey=xxxxx seed=xxxxx"},
		{`{"user":"app","password":"S3cret","token": "t0k"}`, `{"user":"app","password":"xxxxx","token": "xxxxx"}`},
		{"Authorization: Bearer eyJhbGciOi.abc-def_ghi", "Authorization: Bearer xxxxx"},
		// Left alone.
		{"password authentication failed for user \"app\"", "password authentication failed for user \"app\""},
		{"passage=1 bypass=2 compass=3", "passage=1 bypass=2 compass=3"},
		{"kafka: client has run out of available brokers to talk to: dial tcp 10.0.0.1:9092: connection refused", "kafka: client has run out of available brokers to talk to: dial tcp 10.0.0.1:9092: connection refused"},
		{"", ""},
	}
	for _, c := range cases {
		if got := redact.String(c.in); got != c.want {
			t.Errorf("String(%q)\n got %q\nwant %q", c.in, got, c.want)
		}
		if got := redact.String(c.want); got != c.want {
			t.Errorf("String is not idempotent on %q: %q", c.want, got)
		}
	}
}

// TestStringMatchesNetURL: for URLs with a password, String agrees with
// net/url's Redacted.
func TestStringMatchesNetURL(t *testing.T) {
	for _, raw := range []string{
		"postgres://app:S3cret@db:5432/orders?sslmode=disable",
		"nats://u:p%40ss@127.0.0.1:4222",
		"kafka://u:S3cret@broker:9092",
	} {
		u, err := url.Parse(raw)
		if err != nil {
			t.Fatal(err)
		}
		if got, want := redact.String(raw), u.Redacted(); got != want {
			t.Errorf("String(%q) = %q, net/url says %q", raw, got, want)
		}
	}
}

// TestStringDrivers: the DSN formats the drivers accept, written by the
// drivers themselves, come out without their passwords.
func TestStringDrivers(t *testing.T) {
	const pw = "S3cret-x@y:z/q"
	cfg := mysql.NewConfig()
	cfg.User, cfg.Passwd, cfg.Net, cfg.Addr, cfg.DBName = "app", pw, "tcp", "db:3306", "orders"
	dsn := cfg.FormatDSN()
	if got := redact.String(dsn); strings.Contains(got, "S3cret") {
		t.Errorf("mysql DSN %q redacted to %q", dsn, got)
	}
	u := url.URL{Scheme: "postgres", User: url.UserPassword("app", pw), Host: "db", Path: "/orders"}
	if got := redact.String(u.String()); strings.Contains(got, "S3cret") || got != u.Redacted() {
		t.Errorf("postgres URL %q redacted to %q (net/url: %q)", u.String(), got, u.Redacted())
	}
	// pgx's own parse error quotes the connection string (redacting it);
	// redacting again changes nothing.
	_, err := pgconn.ParseConfig("host=db password='" + pw + "' port=notaport")
	if err == nil {
		t.Fatal("want a parse error")
	}
	if got := redact.String(err.Error()); strings.Contains(got, "S3cret") {
		t.Errorf("pgx error %q redacted to %q", err, got)
	}
}

func TestStringWith(t *testing.T) {
	got := redact.StringWith("nats: authorization for token s3cr3t-t0ken (s3cr3t-t0ken) failed; user ab", "s3cr3t-t0ken", "ab", "")
	if want := "nats: authorization for token xxxxx (xxxxx) failed; user ab"; got != want {
		t.Errorf("got %q, want %q", got, want)
	}
	// Escaped forms of a secret are masked too.
	got = redact.StringWith("dial nats://TOK%2FEN@host: refused", "TOK/EN")
	if want := "dial nats://xxxxx@host: refused"; got != want {
		t.Errorf("got %q, want %q", got, want)
	}
}

type codeError struct{ code int }

func (e *codeError) Error() string { return fmt.Sprintf("code %d", e.code) }

func TestError(t *testing.T) {
	if redact.Error(nil) != nil {
		t.Fatal("Error(nil) != nil")
	}
	clean := errors.New("nothing secret")
	if redact.Error(clean) != clean {
		t.Fatal("an error without secrets is returned as it is")
	}
	inner := &codeError{42}
	err := fmt.Errorf("connect to postgres://app:S3cret@db/orders: %w: %w", inner, fs.ErrNotExist)
	red := redact.Error(err)
	if strings.Contains(red.Error(), "S3cret") || !strings.Contains(red.Error(), "postgres://app:xxxxx@db/orders: code 42") {
		t.Fatalf("Error() = %q", red)
	}
	for _, s := range []string{fmt.Sprint(red), fmt.Sprintf("%v %+v %s %q", red, red, red, red)} {
		if strings.Contains(s, "S3cret") {
			t.Errorf("formatted: %s", s)
		}
	}
	if !errors.Is(red, fs.ErrNotExist) {
		t.Error("errors.Is lost the wrapped sentinel")
	}
	var ce *codeError
	if !errors.As(red, &ce) || ce.code != 42 {
		t.Error("errors.As lost the wrapped type")
	}
	if errors.Unwrap(red) != err {
		t.Error("Unwrap does not return the original")
	}
	// Wrapping a redacted error keeps it redacted.
	if w := fmt.Errorf("start: %w", red); strings.Contains(w.Error(), "S3cret") || !errors.Is(w, fs.ErrNotExist) {
		t.Errorf("wrapped: %v", w)
	}
	if e := redact.ErrorWith(errors.New("token tok-123 rejected"), "tok-123"); e.Error() != "token xxxxx rejected" {
		t.Errorf("ErrorWith: %v", e)
	}
}

type dsnStringer string

func (s dsnStringer) String() string { return string(s) }

func TestHandler(t *testing.T) {
	var buf bytes.Buffer
	log := slog.New(redact.NewHandler(slog.NewTextHandler(&buf, nil), "n4tsT0ken"))
	err := fmt.Errorf("dial: %w", fs.ErrNotExist)
	log = log.With("db", "postgres://app:S3cret@db/orders")
	log.WithGroup("g").Info("connecting to app:S3cret@tcp(db:3306)/orders",
		"err", fmt.Errorf("connect nats://u:S3cret@h:4222: %w", err),
		"stringer", dsnStringer("host=db password=S3cret"),
		"bytes", []byte("token=S3cret"),
		slog.Group("inner", "url", "nats://n4tsT0ken@h:4222"),
		"n", 7)
	out := buf.String()
	if strings.Contains(out, "S3cret") || strings.Contains(out, "n4tsT0ken") {
		t.Fatalf("secret in the log line:\n%s", out)
	}
	for _, want := range []string{"postgres://app:xxxxx@db/orders", "app:xxxxx@tcp(db:3306)/orders", "nats://u:xxxxx@h:4222",
		"password=xxxxx", "token=xxxxx", "nats://xxxxx@h:4222", "g.n=7"} {
		if !strings.Contains(out, want) {
			t.Errorf("log line lacks %q:\n%s", want, out)
		}
	}
	// Errors stay errors for handlers that look inside.
	var seen error
	h := redact.NewHandler(errHandler{func(e error) { seen = e }})
	slog.New(h).Error("x", "error", fmt.Errorf("postgres://a:S3cret@h: %w", fs.ErrNotExist))
	if seen == nil || !errors.Is(seen, fs.ErrNotExist) || strings.Contains(seen.Error(), "S3cret") {
		t.Errorf("error attribute: %v", seen)
	}
}

type errHandler struct{ f func(error) }

func (errHandler) Enabled(context.Context, slog.Level) bool { return true }
func (h errHandler) Handle(_ context.Context, r slog.Record) error {
	r.Attrs(func(a slog.Attr) bool {
		if e, ok := a.Value.Any().(error); ok {
			h.f(e)
		}
		return true
	})
	return nil
}
func (h errHandler) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h errHandler) WithGroup(string) slog.Handler      { return h }

// FuzzPassword: a password (without whitespace) written into a URL, a
// go-sql-driver/mysql DSN or a PostgreSQL keyword/value DSN by the drivers'
// own formatting never survives String.
func FuzzPassword(f *testing.F) {
	for _, s := range []string{"S3cret", "p@ss:w/rd", "a'b\\c", "x?y#z&w=1", "))(@/", "%41%", "xxxxxyz"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, pw string) {
		if len(pw) < 6 || strings.ContainsAny(pw, " \t\r\n\v\f\u0085\u00a0") || !utf8ValidPrintable(pw) || strings.Contains(pw, redact.Mask) {
			t.Skip()
		}
		cfg := mysql.NewConfig()
		cfg.User, cfg.Passwd, cfg.Net, cfg.Addr, cfg.DBName = "app", pw, "tcp", "db:3306", "orders"
		u := url.URL{Scheme: "postgres", User: url.UserPassword("app", pw), Host: "db", Path: "/orders"}
		q := strings.NewReplacer(`\`, `\\`, `'`, `\'`).Replace(pw)
		for _, text := range []string{
			"connect to " + u.String() + ": refused",
			"open \"" + cfg.FormatDSN() + "\": refused",
			"mysql://" + cfg.FormatDSN(),
			"host=db user=app password='" + q + "' dbname=orders",
			"postgres://db/orders?password=" + url.QueryEscape(pw) + "&sslmode=disable",
		} {
			if got := redact.String(text); strings.Contains(got, pw) || (url.QueryEscape(pw) != pw && strings.Contains(got, url.QueryEscape(pw))) {
				// An escaped form that is also in the surrounding text is no leak.
				if !strings.Contains(strings.ReplaceAll(text, pw, ""), pw) {
					t.Errorf("String(%q) = %q keeps the password %q", text, got, pw)
				}
			}
		}
	})
}

func utf8ValidPrintable(s string) bool {
	for _, r := range s {
		if r == 0xFFFD || r < 0x20 || r == 0x7f {
			return false
		}
	}
	return true
}
