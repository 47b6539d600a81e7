package consoletest

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/chromedp/cdproto/emulation"
	"github.com/chromedp/cdproto/page"
	"github.com/chromedp/chromedp"
)

// chromiumEnv names a browser binary to use instead of /usr/bin/chromium.
const chromiumEnv = "OUTBOXGEN_CHROMIUM"

// chromiumPath returns the browser binary, skipping the test when there is
// none (failing it under CI) or under -short.
func chromiumPath(t *testing.T) string {
	t.Helper()
	if testing.Short() {
		t.Skip("browser test: skipped under -short")
	}
	p := os.Getenv(chromiumEnv)
	if p == "" {
		p = "/usr/bin/chromium"
	}
	if fi, err := os.Stat(p); err == nil && !fi.IsDir() && fi.Mode()&0o111 != 0 {
		return p
	}
	msg := p + " is missing: run scripts/chromium.sh as root (apt-get install chromium), or set " + chromiumEnv + " to a Chromium binary"
	if os.Getenv("CI") != "" {
		t.Fatal("browser test: " + msg)
	}
	t.Skip("browser test skipped: " + msg)
	return ""
}

// startBrowser starts a headless Chromium for the test (closed at its
// end) and returns the browser's context. The flags keep it off the
// network: this machine's is closed, and Chromium otherwise hangs on its
// background connections. extra adds options (e.g. flags) to them.
func startBrowser(t *testing.T, extra ...chromedp.ExecAllocatorOption) context.Context {
	t.Helper()
	path := chromiumPath(t)
	opts := append([]chromedp.ExecAllocatorOption{
		chromedp.ExecPath(path), chromedp.Headless, chromedp.NoSandbox, chromedp.DisableGPU, chromedp.NoFirstRun,
		chromedp.NoDefaultBrowserCheck,
		chromedp.Flag("disable-quic", true), chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true), chromedp.Flag("disable-sync", true),
		chromedp.Flag("disable-dev-shm-usage", true),
		chromedp.UserDataDir(t.TempDir()), chromedp.WindowSize(1280, 800)}, extra...)
	actx, cancel := chromedp.NewExecAllocator(context.Background(), opts...)
	t.Cleanup(cancel)
	bctx, cancelB := chromedp.NewContext(actx)
	t.Cleanup(cancelB)
	if err := chromedp.Do(bctx); err != nil {
		t.Fatalf("start %s: %v", path, err)
	}
	return bctx
}

// tab is one browser tab on a console.
type tab struct {
	t       *testing.T
	ctx     context.Context
	base    string // the console's URL, ending in "/"
	dialogs atomic.Int32
}

// newTab opens a tab on the console at base, 1280×800, counting (and
// dismissing) every JavaScript dialog it opens. Tabs share the browser's
// cookies unless opts hold chromedp.WithNewBrowserContext().
func newTab(t *testing.T, bctx context.Context, base string, opts ...chromedp.ContextOption) *tab {
	t.Helper()
	ctx, cancel := chromedp.NewContext(bctx, opts...)
	t.Cleanup(cancel)
	b := &tab{t: t, ctx: ctx, base: base}
	if err := chromedp.Do(ctx); err != nil {
		t.Fatal(err)
	}
	dialogs := chromedp.Events(ctx, page.JavascriptDialogOpening)
	go func() {
		for ev, err := range dialogs {
			if err != nil {
				return
			}
			b.dialogs.Add(1)
			t.Logf("JavaScript dialog opened: %s %q", ev.Type, ev.Message)
			_, _ = chromedp.Call(ctx, page.HandleJavaScriptDialog, page.HandleJavaScriptDialogParams{Accept: false})
		}
	}()
	b.do(chromedp.EmulateViewport(1280, 800))
	return b
}

// do runs actions, failing the test on an error (30s at most).
func (b *tab) do(actions ...chromedp.Action[chromedp.Void]) {
	b.t.Helper()
	ctx, cancel := context.WithTimeout(b.ctx, 30*time.Second)
	defer cancel()
	if err := chromedp.Do(ctx, actions...); err != nil {
		b.t.Fatalf("browser: %v (at %s)", err, b.location())
	}
}

// run runs one action returning a value.
func run[T any](b *tab, a chromedp.Action[T]) T {
	b.t.Helper()
	ctx, cancel := context.WithTimeout(b.ctx, 30*time.Second)
	defer cancel()
	v, err := chromedp.Run(ctx, a)
	if err != nil {
		b.t.Fatalf("browser: %v (at %s)", err, b.location())
	}
	return v
}

// location is the tab's URL, for messages.
func (b *tab) location() string {
	ctx, cancel := context.WithTimeout(b.ctx, 5*time.Second)
	defer cancel()
	u, err := chromedp.Run(ctx, chromedp.Location())
	if err != nil {
		return "?"
	}
	return u
}

// open loads the console page at path (relative to the console's URL).
func (b *tab) open(path string) {
	b.t.Helper()
	b.do(chromedp.Navigate(b.base+path), chromedp.WaitReady(chromedp.CSS("body")))
}

// clickNav clicks sel and waits for the page it loads.
func (b *tab) clickNav(sel string) {
	b.t.Helper()
	run(b, chromedp.WaitEvent(page.LoadEventFired, nil, chromedp.Click(chromedp.CSS(sel), chromedp.NodeVisible)))
	b.do(chromedp.WaitReady(chromedp.CSS("body")))
}

// submitNav submits the form sel and waits for the page it loads.
func (b *tab) submitNav(sel string) {
	b.t.Helper()
	run(b, chromedp.WaitEvent(page.LoadEventFired, nil, chromedp.Submit(chromedp.CSS(sel))))
	b.do(chromedp.WaitReady(chromedp.CSS("body")))
}

// eval evaluates a JavaScript expression and decodes its result.
func eval[T any](b *tab, js string) T {
	b.t.Helper()
	return run(b, chromedp.Evaluate[T](js, chromedp.EvalAwaitPromise))
}

// jsString quotes s for JavaScript.
func jsString(s string) string {
	q, _ := json.Marshal(s)
	return string(q)
}

// count returns how many elements match the CSS selector.
func (b *tab) count(sel string) int {
	b.t.Helper()
	return eval[int](b, "document.querySelectorAll("+jsString(sel)+").length")
}

// text returns the trimmed textContent of the first element matching sel
// ("" when none does).
func (b *tab) text(sel string) string {
	b.t.Helper()
	return eval[string](b, "(document.querySelector("+jsString(sel)+")||{textContent:''}).textContent.trim()")
}

// attr returns an attribute of the first element matching sel.
func (b *tab) attr(sel, name string) string {
	b.t.Helper()
	return eval[string](b, "((document.querySelector("+jsString(sel)+")||{getAttribute:()=>''}).getAttribute("+jsString(name)+")||'')")
}

// wantText fails unless the text of sel contains every want.
func (b *tab) wantText(sel string, want ...string) string {
	b.t.Helper()
	got := b.text(sel)
	for _, w := range want {
		if !strings.Contains(got, w) {
			b.t.Errorf("%s at %s: text %q lacks %q", sel, b.location(), got, w)
		}
	}
	return got
}

// wantCount fails unless n elements match sel.
func (b *tab) wantCount(sel string, n int) {
	b.t.Helper()
	if got := b.count(sel); got != n {
		b.t.Errorf("%s at %s: %d elements, want %d", sel, b.location(), got, n)
	}
}

// shot writes a PNG of the viewport as DIR/name.png when
// OUTBOXGEN_SCREENSHOTS=DIR is set.
func (b *tab) shot(name string) {
	b.t.Helper()
	dir := screenshotDir(b.t)
	if dir == "" {
		return
	}
	// Let the charts and fonts settle.
	time.Sleep(200 * time.Millisecond)
	png := run(b, chromedp.CaptureScreenshot())
	if err := os.MkdirAll(dir, 0o755); err != nil {
		b.t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, name+".png"), png, 0o644); err != nil {
		b.t.Fatal(err)
	}
}

// colorScheme emulates prefers-color-scheme (light or dark).
func (b *tab) colorScheme(scheme string) {
	b.t.Helper()
	b.do(chromedp.Func(func(ctx context.Context, _ *chromedp.Target) error {
		_, err := chromedp.Call(ctx, emulation.SetEmulatedMedia, emulation.SetEmulatedMediaParams{
			Features: []*emulation.MediaFeature{{Name: "prefers-color-scheme", Value: scheme}},
		})
		return err
	}))
}
