package main

// `outboxgen console`: the real binary on a real SQLite file, reached over
// HTTP; and the refusals that need no database.

import (
	"context"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"
)

// consoleToken is the token of the tests (long enough for the command).
const consoleToken = "tok-5f2c9a7e41b8d03c6e"

// readOnlyMark matches the body's read-only attribute: present, and not
// "false".
var readOnlyMark = regexp.MustCompile(`<body[^>]* data-readonly(="true"|="")?[ >]`)

// startConsole runs `outboxgen console` with args on a random loopback
// port and returns the process and the URL it prints.
func startConsole(t *testing.T, env []string, args ...string) (*proc, string) {
	t.Helper()
	p := startEnv(t, env, append([]string{"console", "-listen", "127.0.0.1:0"}, args...)...)
	re := regexp.MustCompile(`serving (http://\S+)`)
	var u string
	waitFor(t, 30*time.Second, "the console's serving line", func() bool {
		select {
		case <-p.done:
			t.Fatalf("outboxgen console exited: %v\nstdout:\n%s\nstderr:\n%s", p.err, p.stdout.String(), p.stderr.String())
		default:
		}
		if m := re.FindStringSubmatch(p.stdout.String()); m != nil {
			u = m[1]
			return true
		}
		return false
	})
	return p, u
}

// request makes a request with optional header key/values and returns the
// status and body.
func request(t *testing.T, method, u string, form url.Values, header ...string) (int, string) {
	t.Helper()
	var body *strings.Reader
	if form != nil {
		body = strings.NewReader(form.Encode())
	} else {
		body = strings.NewReader("")
	}
	req, err := http.NewRequest(method, u, body)
	if err != nil {
		t.Fatal(err)
	}
	if form != nil {
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	}
	for i := 0; i+1 < len(header); i += 2 {
		if header[i] == "Host" {
			req.Host = header[i+1]
			continue
		}
		req.Header.Set(header[i], header[i+1])
	}
	c := &http.Client{Timeout: 30 * time.Second, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	resp, err := c.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, u, err)
	}
	defer resp.Body.Close()
	var b strings.Builder
	buf := make([]byte, 32<<10)
	for {
		n, err := resp.Body.Read(buf)
		b.Write(buf[:n])
		if err != nil {
			break
		}
	}
	return resp.StatusCode, b.String()
}

// stopConsole sends SIGTERM and checks the clean exit.
func stopConsole(t *testing.T, p *proc) {
	t.Helper()
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if code := p.wait(t, 20*time.Second); code != 0 {
		t.Errorf("exit code after SIGTERM: %d, want 0; stderr:\n%s", code, p.stderr.String())
	}
	if !strings.Contains(p.stdout.String(), "outboxgen console: stopped") {
		t.Errorf("no stopped line after SIGTERM; stdout:\n%s", p.stdout.String())
	}
}

// TestConsoleProcess: the binary serves the overview of a real SQLite
// outbox on loopback without authentication, read-write; stops cleanly on
// SIGTERM.
func TestConsoleProcess(t *testing.T) {
	db := newTestDB(t, "sqlite")
	db.insert(t, "console.events", []string{"k1", "k2"}, 0, 3)
	p, u := startConsole(t, nil, "-db", db.flag)
	if !strings.Contains(p.stdout.String(), "read-write") || !strings.Contains(p.stdout.String(), "no authentication: loopback only") {
		t.Errorf("serving line does not say the mode and the authentication:\n%s", p.stdout.String())
	}
	code, body := request(t, "GET", u, nil)
	if code != http.StatusOK {
		t.Fatalf("GET %s: %d\n%s", u, code, body)
	}
	for _, want := range []string{`id="count-pending"`, `id="nav-failed"`} {
		if !strings.Contains(body, want) {
			t.Errorf("overview lacks %s", want)
		}
	}
	if readOnlyMark.MatchString(body) || strings.Contains(body, `id="readonly-badge"`) {
		t.Error("overview is marked read-only without -read-only")
	}
	stopConsole(t, p)
}

// TestConsoleHostCheck: without authentication the console answers to
// loopback host names and -allowed-host ones only (DNS rebinding).
func TestConsoleHostCheck(t *testing.T) {
	db := newTestDB(t, "sqlite")
	p, u := startConsole(t, nil, "-db", db.flag, "-allowed-host", "ops.example")
	for host, want := range map[string]int{"evil.example": http.StatusMisdirectedRequest, "ops.example:8080": http.StatusOK, "localhost": http.StatusOK} {
		if code, body := request(t, "GET", u+"failed", nil, "Host", host); code != want {
			t.Errorf("GET with Host %s: %d, want %d\n%s", host, code, want, body)
		}
	}
	stopConsole(t, p)
}

// TestConsoleToken: with $OUTBOXGEN_CONSOLE_TOKEN the pages need the
// token (Bearer header), and neither the output nor the pages show it.
func TestConsoleToken(t *testing.T) {
	db := newTestDB(t, "sqlite")
	p, u := startConsole(t, []string{envConsoleToken + "=" + consoleToken}, "-db", db.flag)
	if code, _ := request(t, "GET", u, nil); code != http.StatusUnauthorized {
		t.Errorf("GET without the token: %d, want 401", code)
	}
	if code, _ := request(t, "GET", u, nil, "Authorization", "Bearer wrong-token-of-some-length"); code != http.StatusUnauthorized {
		t.Errorf("GET with a wrong token: %d, want 401", code)
	}
	code, body := request(t, "GET", u, nil, "Authorization", "Bearer "+consoleToken)
	if code != http.StatusOK || !strings.Contains(body, `id="count-pending"`) {
		t.Fatalf("GET with the token: %d\n%s", code, body)
	}
	if strings.Contains(body, consoleToken) {
		t.Error("the overview shows the token")
	}
	if !strings.Contains(p.stdout.String(), "token required") {
		t.Errorf("serving line does not say a token is required:\n%s", p.stdout.String())
	}
	stopConsole(t, p)
	if out := p.stdout.String() + p.stderr.String(); strings.Contains(out, consoleToken) {
		t.Errorf("the output shows the token:\n%s", out)
	}
}

// TestConsoleNonLoopbackWithAuth: a token from -token-file, or basic auth
// from -basic-auth-file, lets the console listen on every interface.
func TestConsoleNonLoopbackWithAuth(t *testing.T) {
	db := newTestDB(t, "sqlite")
	dir := t.TempDir()
	tokenFile := filepath.Join(dir, "token")
	authFile := filepath.Join(dir, "basic")
	if err := os.WriteFile(tokenFile, []byte(consoleToken+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(authFile, []byte("ops:s3cret-pass-0123456\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	basic, _ := http.NewRequest("GET", "/", nil)
	basic.SetBasicAuth("ops", "s3cret-pass-0123456")
	for _, c := range []struct {
		flag, file, auth string
	}{
		{"-token-file", tokenFile, "Bearer " + consoleToken},
		{"-basic-auth-file", authFile, basic.Header.Get("Authorization")},
	} {
		p := startEnv(t, nil, "console", "-db", db.flag, "-listen", "0.0.0.0:0", c.flag, c.file)
		re := regexp.MustCompile(`serving http://0\.0\.0\.0:(\d+)/`)
		var port string
		waitFor(t, 30*time.Second, "the console's serving line", func() bool {
			select {
			case <-p.done:
				t.Fatalf("outboxgen console %s exited: %v\nstderr:\n%s", c.flag, p.err, p.stderr.String())
			default:
			}
			m := re.FindStringSubmatch(p.stdout.String())
			if m != nil {
				port = m[1]
			}
			return m != nil
		})
		u := "http://127.0.0.1:" + port + "/"
		if code, _ := request(t, "GET", u, nil); code != http.StatusUnauthorized {
			t.Errorf("%s: GET without credentials: %d, want 401", c.flag, code)
		}
		if code, _ := request(t, "GET", u, nil, "Authorization", c.auth); code != http.StatusOK {
			t.Errorf("%s: GET with the credentials: %d, want 200", c.flag, code)
		}
		stopConsole(t, p)
		if out := p.stdout.String() + p.stderr.String(); strings.Contains(out, "s3cret-pass") || strings.Contains(out, consoleToken) {
			t.Errorf("%s: the output shows a secret:\n%s", c.flag, out)
		}
	}
}

// TestConsoleReadOnly: -read-only marks the pages and refuses every POST.
func TestConsoleReadOnly(t *testing.T) {
	db := newTestDB(t, "sqlite")
	p, u := startConsole(t, nil, "-db", db.flag, "-read-only", "-base-path", "/outbox")
	if !strings.HasSuffix(u, "/outbox/") {
		t.Errorf("URL %s does not end in the base path /outbox/", u)
	}
	if !strings.Contains(p.stdout.String(), "(read-only") {
		t.Errorf("serving line does not say read-only:\n%s", p.stdout.String())
	}
	code, body := request(t, "GET", u, nil)
	if code != http.StatusOK || !readOnlyMark.MatchString(body) || !strings.Contains(body, `id="readonly-badge"`) {
		t.Fatalf("GET %s: %d, read-only marks missing\n%s", u, code, body)
	}
	if code, _ := request(t, "POST", u+"actions/requeue", url.Values{"scope": {"matching"}}); code != http.StatusForbidden {
		t.Errorf("POST in read-only mode: %d, want 403", code)
	}
	stopConsole(t, p)
}

// TestConsoleRefusesNonLoopback: without a token or basic auth the console
// refuses to listen anywhere but loopback, and says how to fix it.
func TestConsoleRefusesNonLoopback(t *testing.T) {
	t.Setenv(envConsoleToken, "")
	for _, addr := range []string{"0.0.0.0:8080", ":8080", "[::]:8080", "192.168.1.20:8080", "no-such-host.invalid:8080"} {
		code, _, stderr := cli(t, t.TempDir(), "console", "-db", "sqlite:x.db", "-listen", addr)
		if code != 2 {
			t.Errorf("-listen %s: exit %d, want 2", addr, code)
		}
		for _, want := range []string{"no authentication", envConsoleToken, "-token-file", "-basic-auth-file", "127.0.0.1"} {
			if !strings.Contains(stderr, want) {
				t.Errorf("-listen %s: the error lacks %q:\n%s", addr, want, stderr)
			}
		}
	}
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"-listen", "127.0.0.1"}, "use host:port"},
		{[]string{"-token-file", "/nonexistent/token"}, "-token-file"},
		{[]string{"-basic-auth-file", writeTemp(t, "no-colon\n")}, "user:password"},
		{[]string{"-token-file", writeTemp(t, "short\n")}, "shorter than 16"},
		{[]string{"-token-file", writeTemp(t, consoleToken), "-basic-auth-file", writeTemp(t, "ops:pw")}, "use one"},
		{[]string{"-refresh", "10ms"}, "-refresh at least 1s"},
	} {
		code, _, stderr := cli(t, t.TempDir(), append([]string{"console", "-db", "sqlite:x.db"}, c.args...)...)
		if code != 2 || !strings.Contains(stderr, c.want) {
			t.Errorf("%v: exit %d, want 2 and an error saying %q:\n%s", c.args, code, c.want, stderr)
		}
	}
}

// writeTemp writes content to a fresh file and returns its path.
func writeTemp(t *testing.T, content string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "f")
	if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// TestCheckListen: without authentication, loopback addresses and names
// resolving only to them pass; anything else is refused with the fix.
func TestCheckListen(t *testing.T) {
	ctx := context.Background()
	for host, want := range map[string]bool{
		"127.0.0.1": true, "127.3.4.5": true, "::1": true, "localhost": true,
		"": false, "0.0.0.0": false, "::": false, "10.0.0.1": false, "2001:db8::1": false, "no-such-host.invalid": false,
	} {
		c := consoleFlags{listen: net.JoinHostPort(host, "8080")}
		err := c.checkListen(ctx)
		if (err == nil) != want {
			t.Errorf("checkListen(%q) = %v, want ok %v", c.listen, err, want)
		}
		if err != nil && !strings.Contains(err.Error(), "-token-file") {
			t.Errorf("checkListen(%q) = %v: the error does not say how to fix it", c.listen, err)
		}
		c.token = "0123456789abcdef"
		if err := c.checkListen(ctx); err != nil {
			t.Errorf("checkListen(%q) with a token = %v", c.listen, err)
		}
	}
}

// TestConsoleMissingTable: a database without the outbox table is one
// error at start, not an error on every page.
func TestConsoleMissingTable(t *testing.T) {
	t.Setenv(envConsoleToken, "")
	dir := t.TempDir()
	empty := filepath.Join(dir, "empty.db")
	if err := os.WriteFile(empty, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	code, stdout, stderr := cli(t, dir, "console", "-db", "sqlite:"+empty, "-listen", "127.0.0.1:0")
	if code != 1 || !strings.Contains(stderr, `table "outbox_event"`) || !strings.Contains(stderr, "outboxgen schema") || stdout != "" {
		t.Errorf("exit %d, want 1 and an error naming the table and the fix; stdout %q, stderr:\n%s", code, stdout, stderr)
	}
}
