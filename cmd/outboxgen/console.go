package main

// `outboxgen console`: the operator's web console (package
// runtime/console) served over HTTP by this process. It listens on
// loopback by default; any other address needs a token or basic auth.

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/outboxgen/outboxgen/runtime/admin"
	"github.com/outboxgen/outboxgen/runtime/console"
	"github.com/outboxgen/outboxgen/runtime/driver"
	"github.com/outboxgen/outboxgen/runtime/redact"
)

// envConsoleToken is the environment variable holding the console's
// bearer token (never a flag: a flag shows in ps).
const envConsoleToken = "OUTBOXGEN_CONSOLE_TOKEN"

// The HTTP server's bounds: slow or oversized clients are cut off.
const (
	consoleReadHeaderTimeout = 5 * time.Second
	consoleReadTimeout       = 15 * time.Second
	consoleWriteTimeout      = 60 * time.Second // well above a page's statements (each bounded by -timeout, default console.DefaultStatementTimeout)
	consoleIdleTimeout       = 2 * time.Minute
	consoleMaxHeaderBytes    = 64 << 10
	consoleShutdownTimeout   = 10 * time.Second
)

// consoleFlags are the flags of `outboxgen console`.
type consoleFlags struct {
	db                  *dbFlags
	listen              string
	readOnly            bool
	basePath            string
	tokenFile           string
	basicAuthFile       string
	staleAfter, window  time.Duration
	refresh             time.Duration
	statementTimeout    time.Duration // -timeout when given, else the console's default
	logLevel            string
	allowedHosts        []string // -allowed-host, repeated
	secureCookies       bool
	token, user, passwd string // read from the environment and the files
}

func cmdConsole(args []string, stdout, stderr io.Writer) error {
	fl := newFlags("console", "console [-db DSN] [-f events.yaml] [-listen 127.0.0.1:8080] [-read-only] [-base-path /outbox] [-token-file FILE | -basic-auth-file FILE]", stderr)
	c := &consoleFlags{db: addDBFlags(fl, false)}
	fl.StringVar(&c.listen, "listen", "127.0.0.1:8080", "serve on this address; anything but loopback needs a token ($"+envConsoleToken+" or -token-file) or -basic-auth-file")
	fl.BoolVar(&c.readOnly, "read-only", false, "show the pages only: no requeue, replay or delete (every POST is refused)")
	fl.StringVar(&c.basePath, "base-path", "", "serve under this path prefix (e.g. /outbox behind a reverse proxy)")
	fl.StringVar(&c.tokenFile, "token-file", "", "read the bearer token from this file (first line); default $"+envConsoleToken)
	fl.StringVar(&c.basicAuthFile, "basic-auth-file", "", "ask for HTTP basic auth with the user:password on this file's first line")
	fl.DurationVar(&c.staleAfter, "stale-after", admin.DefaultStaleAfter, "a pending event older than this counts as stale")
	fl.DurationVar(&c.window, "window", console.DefaultWindow, "the overview's charts cover this last span (at most "+console.MaxWindow.String()+")")
	fl.DurationVar(&c.refresh, "refresh", console.DefaultRefresh, "the overview refreshes itself this often (at least 1s)")
	fl.StringVar(&c.logLevel, "log-level", "info", "debug, info, warn or error")
	fl.Func("allowed-host", "also answer to this host name (repeat the flag for more; * for any): the console answers to localhost, 127.0.0.1, [::1] and the -listen host only, so that a web page re-pointed at it (DNS rebinding) cannot use it", func(v string) error {
		v = strings.TrimSpace(v)
		if v == "" {
			return errors.New("give a host name, such as ops.example.com")
		}
		c.allowedHosts = append(c.allowedHosts, v)
		return nil
	})
	fl.BoolVar(&c.secureCookies, "secure-cookies", false, "mark the cookies Secure: set it when a TLS-terminating proxy serves the console over HTTPS")
	fl.Lookup("timeout").Usage = "give up connecting after this long; given, it also bounds each statement a page or an action runs (default there: " + console.DefaultStatementTimeout.String() + ")"
	if err := parseFlags(fl, args); err != nil {
		return err
	}
	fl.Visit(func(f *flag.Flag) {
		if f.Name == "timeout" {
			c.statementTimeout = c.db.timeout
		}
	})
	if err := c.readSecrets(); err != nil {
		fmt.Fprintf(stderr, "outboxgen console: %v\n", err)
		return errUsage
	}
	if err := c.checkListen(context.Background()); err != nil {
		fmt.Fprintf(stderr, "outboxgen console: %v\n", err)
		return errUsage
	}
	if c.staleAfter <= 0 || c.window < time.Minute || c.window > console.MaxWindow || c.refresh < time.Second {
		fmt.Fprintf(stderr, "outboxgen console: -stale-after must be positive, -window from 1m to %s, -refresh at least 1s\n", console.MaxWindow)
		return errUsage
	}
	lvl, err := parseLevel(c.logLevel)
	if err != nil {
		fmt.Fprintf(stderr, "outboxgen console: %v\n", err)
		return errUsage
	}
	return c.serve(stdout, stderr, lvl)
}

// readSecrets reads the token ($OUTBOXGEN_CONSOLE_TOKEN or -token-file)
// and the basic auth user:password (-basic-auth-file).
func (c *consoleFlags) readSecrets() error {
	env := strings.TrimSpace(os.Getenv(envConsoleToken))
	if c.tokenFile != "" && env != "" {
		return fmt.Errorf("both $%s and -token-file are set: use one", envConsoleToken)
	}
	c.token = env
	if c.tokenFile != "" {
		tok, err := firstLine(c.tokenFile)
		if err != nil {
			return fmt.Errorf("-token-file: %v", err)
		}
		if tok == "" {
			return fmt.Errorf("-token-file %s: the first line is empty; write the token there", c.tokenFile)
		}
		c.token = tok
	}
	if c.token != "" && len(c.token) < console.MinTokenLen {
		return fmt.Errorf("the console token is shorter than %d characters: use a long random one (e.g. openssl rand -hex 32)", console.MinTokenLen)
	}
	if c.basicAuthFile != "" {
		line, err := firstLine(c.basicAuthFile)
		if err != nil {
			return fmt.Errorf("-basic-auth-file: %v", err)
		}
		user, pass, ok := strings.Cut(line, ":")
		if !ok || user == "" || pass == "" {
			return fmt.Errorf("-basic-auth-file %s: the first line must be user:password", c.basicAuthFile)
		}
		c.user, c.passwd = user, pass
	}
	if c.token != "" && c.user != "" {
		return errors.New("a token and basic auth are both set: use one (-basic-auth-file, or $" + envConsoleToken + " / -token-file)")
	}
	return nil
}

// firstLine returns the first line of a small file, spaces trimmed. The
// error names the file, never its content.
func firstLine(path string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", err
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, 64<<10))
	if err != nil {
		return "", fmt.Errorf("%s: %v", path, err)
	}
	line, _, _ := strings.Cut(string(b), "\n")
	return strings.TrimSpace(line), nil
}

// authenticated reports whether a token or basic auth protects the
// console.
func (c *consoleFlags) authenticated() bool { return c.token != "" || c.user != "" }

// checkListen refuses an address other than loopback when neither a token
// nor basic auth is set (console.Config.CheckListen: ":8080", 0.0.0.0, ::,
// a LAN address, or a host name that does not resolve to loopback
// addresses only), with the flags that fix it.
func (c *consoleFlags) checkListen(ctx context.Context) error {
	cfg := console.Config{Token: c.token, BasicAuthUser: c.user, BasicAuthPassword: c.passwd}
	if err := cfg.CheckListen(ctx, c.listen); err != nil {
		return fmt.Errorf("-listen %v. Listen on 127.0.0.1 (the default) and reach it through an SSH tunnel or kubectl port-forward, "+
			"or set a token ($%s or -token-file FILE) or -basic-auth-file FILE", err, envConsoleToken)
	}
	return nil
}

// serve opens the database, listens, prints what it serves and serves
// until SIGINT or SIGTERM, then shuts down gracefully.
func (c *consoleFlags) serve(stdout, stderr io.Writer, lvl slog.Level) error {
	ctx, stop := signalContext()
	defer stop()
	octx, cancel := context.WithTimeout(ctx, c.db.timeout)
	defer cancel()
	o, err := c.db.open(octx)
	if err != nil {
		if errors.Is(err, errUsage) {
			return err
		}
		return c.failf("%v", err)
	}
	defer o.Close()
	// The outbox table must be there: a wrong -db or -f is one line now,
	// not an error on every page.
	if err := o.Driver.Check(octx, driver.Outbox); err != nil {
		return c.failf("%v", err)
	}
	cancel()
	secrets := append([]string{c.token, c.passwd}, o.Source.Secrets...)
	log := slog.New(redact.NewHandler(slog.NewJSONHandler(stderr, &slog.HandlerOptions{Level: lvl}), nonEmpty(secrets)...)).
		With(slog.String("process", "outboxgen console"))
	a, err := admin.New(o.Driver)
	if err != nil {
		return c.failf("%v", err)
	}
	h, err := console.New(console.Config{
		Admin:             a,
		StatementTimeout:  c.statementTimeout,
		ReadOnly:          c.readOnly,
		BasePath:          c.basePath,
		Token:             c.token,
		BasicAuthUser:     c.user,
		BasicAuthPassword: c.passwd,
		Database:          o.Source.Where,
		StaleAfter:        c.staleAfter,
		Window:            c.window,
		Refresh:           c.refresh,
		AllowedHosts:      c.hosts(),
		SecureCookies:     c.secureCookies,
		Logger:            log,
	})
	if err != nil {
		return c.failf("%v", err)
	}
	ln, err := net.Listen("tcp", c.listen)
	if err != nil {
		return c.failf("-listen: %v", err)
	}
	srv := &http.Server{
		Handler:           h,
		ReadHeaderTimeout: consoleReadHeaderTimeout,
		ReadTimeout:       consoleReadTimeout,
		WriteTimeout:      max(consoleWriteTimeout, 2*c.statementTimeout),
		IdleTimeout:       consoleIdleTimeout,
		MaxHeaderBytes:    consoleMaxHeaderBytes,
		ErrorLog:          slog.NewLogLogger(log.Handler(), slog.LevelWarn),
	}
	fmt.Fprintf(stdout, "outboxgen console: serving %s (%s, %s) on %s\n", consoleURL(c.listen, ln.Addr(), c.basePath), c.mode(), c.authMode(), o.Source.Where)
	log.Info("outboxgen console started", slog.String("addr", ln.Addr().String()), slog.String("base_path", c.basePath),
		slog.Bool("read_only", c.readOnly), slog.String("auth", c.authMode()), slog.String("database", o.Source.Where), slog.String("version", version()))
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	select {
	case err := <-errc:
		return c.failf("serve: %v", err)
	case <-ctx.Done():
	}
	sctx, cancelS := context.WithTimeout(context.Background(), consoleShutdownTimeout)
	defer cancelS()
	if err := srv.Shutdown(sctx); err != nil {
		srv.Close()
		return c.failf("shutdown: %v (requests still running after %s were cut off)", err, consoleShutdownTimeout)
	}
	fmt.Fprintln(stdout, "outboxgen console: stopped")
	return nil
}

// hosts returns the host names the console answers to besides the
// loopback ones: -allowed-host, and without authentication the -listen
// host (which checkListen made sure resolves to loopback, e.g. a name
// /etc/hosts maps to 127.0.0.1). With authentication and no
// -allowed-host, the console answers to any host name (console.Config's
// AllowedHosts).
func (c *consoleFlags) hosts() []string {
	hs := slices.Clone(c.allowedHosts)
	host, _, err := net.SplitHostPort(c.listen)
	if err != nil || host == "" || c.authenticated() {
		return hs
	}
	if ip := net.ParseIP(strings.Trim(host, "[]")); ip != nil && ip.IsUnspecified() {
		return hs
	}
	return append(hs, strings.Trim(host, "[]"))
}

// failf is the command's error: one line, credentials masked.
func (c *consoleFlags) failf(format string, args ...any) error {
	msg := fmt.Sprintf(format, args...)
	msg = redact.StringWith(msg, nonEmpty([]string{c.token, c.passwd})...)
	return fmt.Errorf("outboxgen console: %s", oneLine(errors.New(msg)))
}

// mode says whether actions are allowed.
func (c *consoleFlags) mode() string {
	if c.readOnly {
		return "read-only"
	}
	return "read-write"
}

// authMode names the authentication in force, never its secret.
func (c *consoleFlags) authMode() string {
	switch {
	case c.token != "" && c.user != "":
		return "token or basic auth required"
	case c.token != "":
		return "token required"
	case c.user != "":
		return "basic auth required"
	}
	return "no authentication: loopback only"
}

// consoleURL is the URL people open, http://host:port/base/: the host of
// -listen (0.0.0.0 for an empty one) and the port listened on (-listen
// may ask for port 0).
func consoleURL(listen string, addr net.Addr, base string) string {
	base = "/" + strings.Trim(base, "/")
	if base != "/" {
		base += "/"
	}
	host, _, _ := net.SplitHostPort(listen)
	if host == "" {
		host = "0.0.0.0"
	}
	_, port, err := net.SplitHostPort(addr.String())
	if err != nil {
		return "http://" + addr.String() + base
	}
	return "http://" + net.JoinHostPort(strings.Trim(host, "[]"), port) + base
}

// nonEmpty drops the empty strings of s.
func nonEmpty(s []string) []string {
	var out []string
	for _, v := range s {
		if v != "" {
			out = append(out, v)
		}
	}
	return out
}
