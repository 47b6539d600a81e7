package main

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	coltracepb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	"google.golang.org/protobuf/proto"
)

// otlpCollector is an OTLP/HTTP trace receiver: it decodes every export
// and keeps the spans' names and their service.name.
type otlpCollector struct {
	mu       sync.Mutex
	spans    []string
	services map[string]bool
}

func (c *otlpCollector) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path != "/v1/traces" {
		http.NotFound(w, r)
		return
	}
	body, err := io.ReadAll(io.LimitReader(r.Body, 16<<20))
	var req coltracepb.ExportTraceServiceRequest
	if err == nil {
		err = proto.Unmarshal(body, &req)
	}
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	c.mu.Lock()
	for _, rs := range req.ResourceSpans {
		for _, a := range rs.GetResource().GetAttributes() {
			if a.Key == "service.name" {
				c.services[a.GetValue().GetStringValue()] = true
			}
		}
		for _, ss := range rs.ScopeSpans {
			for _, sp := range ss.Spans {
				c.spans = append(c.spans, sp.Name)
			}
		}
	}
	c.mu.Unlock()
	out, _ := proto.Marshal(&coltracepb.ExportTraceServiceResponse{})
	w.Header().Set("Content-Type", "application/x-protobuf")
	w.Write(out)
}

func (c *otlpCollector) count(name string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := 0
	for _, s := range c.spans {
		if s == name {
			n++
		}
	}
	return n
}

// TestRelayProcessExportsTraces: with OTEL_EXPORTER_OTLP_ENDPOINT set,
// `outboxgen relay` exports a producer span per published event to that
// OTLP/HTTP endpoint (flushed at SIGTERM), under the service name from
// OTEL_SERVICE_NAME; without it, it exports nothing.
func TestRelayProcessExportsTraces(t *testing.T) {
	col := &otlpCollector{services: map[string]bool{}}
	srv := httptest.NewServer(col)
	t.Cleanup(srv.Close)
	db := newTestDB(t, "sqlite")
	url, js := startNATS(t)
	got := collect(t, js, "outbox.>")
	keys := []string{"a", "b"}
	db.insert(t, "outbox.orders.paid", keys, 0, 5)

	p := startEnv(t, []string{"OTEL_EXPORTER_OTLP_ENDPOINT=" + srv.URL, "OTEL_SERVICE_NAME=relay-under-test"}, relayArgs(db.flag, url)...)
	waitFor(t, 30*time.Second, "every delivery", func() bool { return got.len() >= 10 })
	p.cmd.Process.Signal(syscall.SIGTERM)
	if code := p.wait(t, 15*time.Second); code != 0 {
		t.Fatalf("relay exited %d; stderr:\n%s", code, p.stderr.String())
	}
	if n := col.count("send outbox.orders.paid"); n < 10 {
		t.Errorf("%d send spans exported, want one per event (10); spans: %v", n, col.spans)
	}
	if !col.services["relay-under-test"] {
		t.Errorf("service names %v, want relay-under-test", col.services)
	}
	if !strings.Contains(p.stderr.String(), "exporting traces with OTLP over HTTP") {
		t.Errorf("no log line saying where traces go; stderr:\n%s", p.stderr.String())
	}

	// Without the variable: nothing is exported.
	before := col.count("send outbox.orders.paid")
	db.insert(t, "outbox.orders.paid", keys, 5, 2)
	q := start(t, relayArgs(db.flag, url)...)
	waitFor(t, 30*time.Second, "the new deliveries", func() bool { return got.len() >= 14 })
	q.cmd.Process.Signal(syscall.SIGTERM)
	q.wait(t, 15*time.Second)
	if n := col.count("send outbox.orders.paid"); n != before {
		t.Errorf("%d spans exported without OTEL_EXPORTER_OTLP_ENDPOINT", n-before)
	}
}
