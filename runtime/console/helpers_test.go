package console_test

import (
	"database/sql"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/cookiejar"
	"net/http/httptest"
	"net/url"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/net/html"
	_ "modernc.org/sqlite"

	"github.com/outboxgen/outboxgen/internal/testdb"
	"github.com/outboxgen/outboxgen/runtime/admin"
	"github.com/outboxgen/outboxgen/runtime/console"
	"github.com/outboxgen/outboxgen/runtime/dialect"
	"github.com/outboxgen/outboxgen/runtime/driver"
	"github.com/outboxgen/outboxgen/runtime/driver/sqldriver"
	"github.com/outboxgen/outboxgen/templates"
)

// env is one throwaway outbox database with an Admin over it.
type env struct {
	db  *sql.DB
	d   dialect.Dialect
	drv driver.Driver
	a   *admin.Admin
}

// each runs f on a SQLite file and on PostgreSQL and MariaDB when their
// servers are configured (testdb skips them otherwise, or fails under CI).
func each(t *testing.T, f func(t *testing.T, e env)) {
	t.Helper()
	for _, d := range testdb.Dialects() {
		t.Run(d, func(t *testing.T) {
			t.Parallel()
			var db *sql.DB
			if d == "sqlite" {
				var err error
				db, err = sql.Open("sqlite", testdb.SQLiteDSN(filepath.Join(t.TempDir(), "outbox.db")))
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { db.Close() })
			} else {
				db = testdb.Open(t, d)
			}
			testdb.ApplySchema(t, db, d, templates.DefaultTables)
			drv, err := sqldriver.New(db, testdb.Schema(d))
			if err != nil {
				t.Fatal(err)
			}
			a, err := admin.New(drv)
			if err != nil {
				t.Fatal(err)
			}
			f(t, env{db: db, d: dialect.Dialect(d), drv: drv, a: a})
		})
	}
}

func (e env) outbox() string { return e.drv.Tables().Outbox }

// row is an outbox row to insert.
type row struct {
	typ, key, topic  string
	payload, headers string
	status, attempts int
	lastError        string
	createdAgo       time.Duration
	sentAgo          time.Duration
	nextRetryIn      time.Duration // pending rows: next_retry_time = now + it
}

var uuidSeq atomic.Int64

// insert adds r and returns its id.
func (e env) insert(t testing.TB, r row) int64 {
	t.Helper()
	eid := fmt.Sprintf("0190a8b4-0000-7000-8000-%012d", uuidSeq.Add(1))
	if r.payload == "" {
		r.payload = `{"n":1}`
	}
	if r.topic == "" {
		r.topic = "orders.paid"
	}
	if r.typ == "" {
		r.typ = "ORDER_PAID"
	}
	p := e.d.Placeholder
	var headers any
	if r.headers != "" {
		headers = r.headers
	}
	var lastErr any
	if r.lastError != "" {
		lastErr = r.lastError
	}
	q := fmt.Sprintf("INSERT INTO %s (event_id, biz_type, biz_id, topic, payload, headers, status, retry_count, last_error) VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s)",
		e.outbox(), p(1), p(2), p(3), p(4), p(5), p(6), p(7), p(8), p(9))
	if _, err := e.db.Exec(q, eid, r.typ, r.key, r.topic, r.payload, headers, r.status, r.attempts, lastErr); err != nil {
		t.Fatalf("insert: %v", err)
	}
	var id int64
	if err := e.db.QueryRow("SELECT id FROM "+e.outbox()+" WHERE event_id = "+p(1), eid).Scan(&id); err != nil {
		t.Fatal(err)
	}
	sent := "NULL"
	if r.sentAgo > 0 {
		sent = ago(e.d, r.sentAgo)
	}
	e.exec(t, fmt.Sprintf("UPDATE %s SET created_at = %s, updated_at = %s, sent_at = %s, next_retry_time = %s WHERE id = %d",
		e.outbox(), ago(e.d, r.createdAgo), ago(e.d, r.createdAgo/2), sent, ago(e.d, -r.nextRetryIn), id))
	return id
}

func (e env) exec(t testing.TB, q string, args ...any) {
	t.Helper()
	if _, err := e.db.Exec(q, args...); err != nil {
		t.Fatalf("%s: %v", q, err)
	}
}

// ago is the SQL expression "database now minus d".
func ago(d dialect.Dialect, dur time.Duration) string {
	switch d {
	case dialect.Postgres:
		return fmt.Sprintf("now() - interval '%d microseconds'", dur.Microseconds())
	case dialect.MySQL:
		return fmt.Sprintf("CURRENT_TIMESTAMP(6) - INTERVAL %d MICROSECOND", dur.Microseconds())
	}
	return fmt.Sprintf("strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now', '%+.3f seconds')", -dur.Seconds())
}

// count counts the outbox rows where cond holds.
func (e env) count(t testing.TB, cond string) int64 {
	t.Helper()
	var n int64
	if err := e.db.QueryRow("SELECT COUNT(*) FROM " + e.outbox() + " WHERE " + cond).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// snapshot returns every row's id, status and attempts.
func (e env) snapshot(t testing.TB) string {
	t.Helper()
	rows, err := e.db.Query("SELECT id, status, retry_count FROM " + e.outbox() + " ORDER BY id")
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var b strings.Builder
	for rows.Next() {
		var id, st, rc int64
		if err := rows.Scan(&id, &st, &rc); err != nil {
			t.Fatal(err)
		}
		fmt.Fprintf(&b, "%d:%d:%d ", id, st, rc)
	}
	return b.String()
}

// client talks to a console served by httptest, keeping cookies and not
// following redirects.
type client struct {
	t    testing.TB
	srv  *httptest.Server
	c    *http.Client
	base string
	hdr  http.Header // added to every request
}

func (e env) console(t testing.TB, cfg console.Config) *client {
	t.Helper()
	cfg.Admin = e.a
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	h, err := console.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return serve(t, h, cfg.BasePath)
}

func serve(t testing.TB, h http.Handler, base string) *client {
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	jar, _ := cookiejar.New(nil)
	if base == "" {
		base = "/"
	}
	return &client{t: t, srv: srv, base: base, hdr: http.Header{},
		c: &http.Client{Jar: jar, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}}
}

// resp is an answer, its body read and parsed.
type resp struct {
	*http.Response
	body string
	doc  *html.Node
}

func (c *client) do(req *http.Request) *resp {
	c.t.Helper()
	for k, v := range c.hdr {
		req.Header[k] = v
	}
	r, err := c.c.Do(req)
	if err != nil {
		c.t.Fatal(err)
	}
	defer r.Body.Close()
	b, err := io.ReadAll(r.Body)
	if err != nil {
		c.t.Fatal(err)
	}
	doc, err := html.Parse(strings.NewReader(string(b)))
	if err != nil {
		c.t.Fatal(err)
	}
	return &resp{Response: r, body: string(b), doc: doc}
}

// url resolves p against the base path (an absolute p is taken as is).
func (c *client) url(p string) string {
	if strings.HasPrefix(p, "/") {
		return c.srv.URL + p
	}
	return c.srv.URL + c.base + p
}

func (c *client) get(p string) *resp {
	c.t.Helper()
	req, err := http.NewRequest(http.MethodGet, c.url(p), nil)
	if err != nil {
		c.t.Fatal(err)
	}
	return c.do(req)
}

func (c *client) post(p string, form url.Values) *resp {
	c.t.Helper()
	req, err := http.NewRequest(http.MethodPost, c.url(p), strings.NewReader(form.Encode()))
	if err != nil {
		c.t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	return c.do(req)
}

// fetch gets p and returns the status code, reading the body without
// parsing it (for benchmarks).
func (c *client) fetch(method, p string, form url.Values) int {
	c.t.Helper()
	var body io.Reader
	if form != nil {
		body = strings.NewReader(form.Encode())
	}
	req, err := http.NewRequest(method, c.url(p), body)
	if err != nil {
		c.t.Fatal(err)
	}
	if form != nil {
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	}
	r, err := c.c.Do(req)
	if err != nil {
		c.t.Fatal(err)
	}
	defer r.Body.Close()
	if _, err := io.Copy(io.Discard, r.Body); err != nil {
		c.t.Fatal(err)
	}
	return r.StatusCode
}

// page gets p and fails unless it answers 200.
func (c *client) page(p string) *resp {
	c.t.Helper()
	r := c.get(p)
	if r.StatusCode != http.StatusOK {
		c.t.Fatalf("GET %s: %d, want 200\n%s", p, r.StatusCode, r.text("main"))
	}
	return r
}

// csrf returns the page's synchronizer token.
func (r *resp) csrf(t testing.TB) string {
	t.Helper()
	for _, n := range r.all(func(n *html.Node) bool { return n.Data == "input" && attr(n, "name") == "csrf" }) {
		return attr(n, "value")
	}
	t.Fatalf("no csrf field in the page:\n%s", r.body)
	return ""
}

func attr(n *html.Node, key string) string {
	for _, a := range n.Attr {
		if a.Key == key {
			return a.Val
		}
	}
	return ""
}

func hasAttr(n *html.Node, key string) bool {
	for _, a := range n.Attr {
		if a.Key == key {
			return true
		}
	}
	return false
}

// all returns the elements f selects, in document order.
func (r *resp) all(f func(*html.Node) bool) []*html.Node {
	var out []*html.Node
	var walk func(*html.Node)
	walk = func(n *html.Node) {
		if n.Type == html.ElementNode && f(n) {
			out = append(out, n)
		}
		for c := n.FirstChild; c != nil; c = c.NextSibling {
			walk(c)
		}
	}
	walk(r.doc)
	return out
}

// id returns the element with id, or nil.
func (r *resp) id(id string) *html.Node {
	if n := r.all(func(n *html.Node) bool { return attr(n, "id") == id }); len(n) > 0 {
		return n[0]
	}
	return nil
}

// text returns the text of the element with id ("main" for <main>),
// whitespace collapsed; "" when there is none.
func (r *resp) text(id string) string {
	var n *html.Node
	if id == "main" {
		if m := r.all(func(n *html.Node) bool { return n.Data == "main" }); len(m) > 0 {
			n = m[0]
		}
	} else {
		n = r.id(id)
	}
	if n == nil {
		return ""
	}
	return textOf(n)
}

func textOf(n *html.Node) string {
	var b strings.Builder
	var walk func(*html.Node)
	walk = func(n *html.Node) {
		if n.Type == html.TextNode {
			b.WriteString(n.Data)
			b.WriteString(" ")
		}
		for c := n.FirstChild; c != nil; c = c.NextSibling {
			walk(c)
		}
	}
	walk(n)
	return strings.Join(strings.Fields(b.String()), " ")
}

// rowsOf returns the tbody rows of the table with id.
func (r *resp) rowsOf(id string) []*html.Node {
	t := r.id(id)
	if t == nil {
		return nil
	}
	var out []*html.Node
	var walk func(*html.Node)
	walk = func(n *html.Node) {
		if n.Type == html.ElementNode && n.Data == "tr" && n.Parent != nil && n.Parent.Data == "tbody" {
			out = append(out, n)
		}
		for c := n.FirstChild; c != nil; c = c.NextSibling {
			walk(c)
		}
	}
	walk(t)
	return out
}

// dataIDs returns the data-id of each row of table#events.
func (r *resp) dataIDs() []string {
	var ids []string
	for _, tr := range r.rowsOf("events") {
		ids = append(ids, attr(tr, "data-id"))
	}
	return ids
}

// flash returns the flash text.
func (r *resp) flash() string { return r.text("flash") }
