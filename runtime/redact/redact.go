// Package redact removes credentials from text before it reaches an error
// message, a log line or a database column: passwords in URLs and DSNs,
// password=, token= and similar settings, and secrets the caller names.
//
//	return redact.Error(fmt.Errorf("connect to %s: %w", dsn, err))
//	logger := slog.New(redact.NewHandler(slog.NewTextHandler(os.Stderr, nil)))
//
// What String masks (each secret becomes Mask, "xxxxx", as net/url's
// URL.Redacted writes it):
//
//   - the password of a URL's userinfo: postgres://app:xxxxx@db/orders,
//     nats://u:xxxxx@host:4222 (the user name is kept);
//   - the password of a go-sql-driver/mysql DSN, which is not a URL:
//     app:xxxxx@tcp(db:3306)/orders, app:xxxxx@/orders,
//     app:xxxxx@unix(/run/mysqld.sock)/orders (the driver takes the last
//     '@', so a password may hold '@' and ':');
//   - user:password@host:port, a URL without its scheme (a broker
//     address written with credentials);
//   - the value of a key=value setting whose key names a secret: password,
//     passwd, pwd, pass, and any key ending in password, passwd, secret,
//     token or apikey/api_key (sslpassword, client_secret, access_token,
//     auth_token, ...), plus nkey and seed; in PostgreSQL keyword/value
//     DSNs (password=s3cret or password='with spaces'), in URL query
//     parameters (?password=...&sslmode=...), and as JSON members
//     ("password":"...");
//   - bearer tokens (Authorization: Bearer ...).
//
// The patterns cannot know every secret: a NATS token given as a URL's
// user name (nats://TOKEN@host), a password in a custom format, or a
// secret echoed in a server's own words. Callers that know the secrets
// (a broker adapter holding its configuration) pass them to StringWith or
// ErrorWith as well.
//
// Redaction is for text only. Error wraps an error in one whose Error()
// is redacted and whose Unwrap returns the original, so errors.Is and
// errors.As keep working; the original's text is still reachable through
// Unwrap, so never log an unwrapped error by hand.
package redact

import (
	"net/url"
	"regexp"
	"slices"
	"strings"

	"github.com/outboxgen/outboxgen/runtime/internal/errtext"
)

// Mask replaces every secret.
const Mask = "xxxxx"

// MinSecretLen is the shortest secret StringWith and ErrorWith mask
// wherever it occurs. Masking every occurrence of a one- or two-character
// password would garble the whole message; such secrets are still masked
// where a pattern finds them (a URL's or DSN's password, password=...).
const MinSecretLen = 3

var (
	// A URL with a password: scheme://user:password@. The password runs
	// to the last '@' before the end of the authority (whitespace, '/',
	// '?', '#'), as net/url reads it.
	urlRE = regexp.MustCompile(`(?i)\b([a-z][a-z0-9+.\-]*://)([^\s/?#@:'"` + "`" + `]*):([^\s/?#]*)@`)

	// A go-sql-driver/mysql DSN: user:password@proto(addr)/ or
	// user:password@/. The password runs to the last '@' that is followed
	// by an address and a '/' (the driver takes the last '@').
	mysqlRE = regexp.MustCompile(`([^\s:@/'"` + "`" + `(=]*):(\S*)@((?:[a-z0-9]*\([^()\s]*\))?/)`)

	// user:password@host:port, the form of a URL without its scheme (a
	// broker address written with credentials). The port is required, so
	// that "a:b@c" prose is left alone.
	hostRE = regexp.MustCompile(`(^|[\s"'(\[,;=])([A-Za-z0-9_.\-]+):([^\s@/'"]+)@((?:[A-Za-z0-9.\-]+|\[[0-9A-Fa-f:.]+\]):[0-9]+)`)

	// key=value settings whose key names a secret. The value is a quoted
	// string ('...' with '' or \' inside, "..." with \" inside) or runs
	// to whitespace, '&', ';', ',', a quote or a closing bracket.
	kvRE = regexp.MustCompile(`(?i)(^|[^a-z0-9_])((?:[a-z0-9_.\-]*(?:password|passwd|secret|token|api_?key))|pwd|pass|nkey|seed)(\s*=\s*)('(?:[^'\\]|''|\\.)*'|"(?:[^"\\]|\\.)*"|[^\s&;,'"()\[\]{}<>]+)`)

	// JSON members: "password": "value".
	jsonRE = regexp.MustCompile(`(?i)("(?:[a-z0-9_.\-]*(?:password|passwd|secret|token|api_?key)|pwd|pass|nkey|seed)"\s*:\s*)"(?:[^"\\]|\\.)*"`)

	bearerRE = regexp.MustCompile(`(?i)\b(bearer\s+)[a-z0-9\-._~+/]+=*`)
)

// String returns s with every credential the patterns recognise replaced
// by Mask (see the package documentation). Text without credentials is
// returned unchanged.
func String(s string) string {
	if s == "" {
		return s
	}
	s = urlRE.ReplaceAllString(s, "${1}${2}:"+Mask+"@")
	s = mysqlDSNs(s)
	s = hostRE.ReplaceAllStringFunc(s, func(m string) string {
		sub := hostRE.FindStringSubmatch(m)
		return sub[1] + sub[2] + ":" + Mask + "@" + sub[4]
	})
	s = kvRE.ReplaceAllStringFunc(s, func(m string) string {
		sub := kvRE.FindStringSubmatch(m)
		return sub[1] + sub[2] + sub[3] + Mask
	})
	s = jsonRE.ReplaceAllString(s, `${1}"`+Mask+`"`)
	s = bearerRE.ReplaceAllString(s, "${1}"+Mask)
	return s
}

// mysqlDSNs masks the passwords of go-sql-driver/mysql DSNs in s, also
// behind a scheme (mysql://user:pass@tcp(host)/db, which is no URL when
// the password holds '?' or '#').
func mysqlDSNs(s string) string {
	return mysqlRE.ReplaceAllStringFunc(s, func(m string) string {
		sub := mysqlRE.FindStringSubmatch(m)
		if rest, ok := strings.CutPrefix(sub[2], "//"); ok {
			// scheme://user:pass@...: the match started at the scheme.
			inner := rest + "@" + sub[3]
			if mysqlRE.MatchString(inner) {
				return sub[1] + "://" + mysqlDSNs(inner)
			}
			// Either scheme://user@... or user://pass@... (a password
			// starting with "//"): ambiguous, so masked.
		}
		if sub[2] == Mask {
			return m
		}
		return sub[1] + ":" + Mask + "@" + sub[3]
	})
}

// StringWith is String that also masks every occurrence of each secret of
// at least MinSecretLen bytes (longest first), in its literal form and
// URL-escaped. Empty and shorter secrets are ignored.
func StringWith(s string, secrets ...string) string {
	s = String(s)
	for _, sec := range expand(secrets) {
		s = strings.ReplaceAll(s, sec, Mask)
	}
	return s
}

// expand returns the secrets worth masking: long enough, with their
// URL-escaped forms, de-duplicated, longest first (so a secret containing
// another is masked whole).
func expand(secrets []string) []string {
	var out []string
	for _, s := range secrets {
		if len(s) < MinSecretLen || s == Mask {
			continue
		}
		out = append(out, s)
		for _, e := range []string{url.PathEscape(s), url.QueryEscape(s), strings.TrimPrefix(url.UserPassword("", s).String(), ":")} {
			if e != s {
				out = append(out, e)
			}
		}
	}
	slices.SortFunc(out, func(a, b string) int { return len(b) - len(a) })
	return slices.Compact(out)
}

// URL returns a URL or DSN fit for a log line or an error: String applied
// to it. It is what services should print for "connected to ...".
func URL(dsn string) string { return String(dsn) }

// Error returns err with a redacted Error() text: nil for nil, err itself
// when its text holds nothing to redact, otherwise an error whose Error()
// is String(err.Error()) and whose Unwrap returns err (errors.Is and
// errors.As see the original).
func Error(err error) error { return ErrorWith(err) }

// ErrorWith is Error that also masks the given secrets, as StringWith.
func ErrorWith(err error, secrets ...string) error {
	if err == nil {
		return nil
	}
	return errtext.Replace(err, StringWith(err.Error(), secrets...))
}
