package observetest

import (
	"context"
	"encoding/json"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"regexp"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	otelprom "go.opentelemetry.io/otel/exporters/prometheus"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"gopkg.in/yaml.v3"

	"github.com/outboxgen/outboxgen/internal/gentest/sqlevents"
	"github.com/outboxgen/outboxgen/runtime/driver/sqldriver"
	"github.com/outboxgen/outboxgen/runtime/janitor"
	"github.com/outboxgen/outboxgen/runtime/monitor"
	"github.com/outboxgen/outboxgen/runtime/outbox"
	"github.com/outboxgen/outboxgen/runtime/relay"
	"github.com/outboxgen/outboxgen/runtime/runner"
	"github.com/outboxgen/outboxgen/runtime/sweeper"
)

const deployDir = "../../deploy"

// exposition is what /metrics showed: every sample line, and the metric
// names.
type exposition struct {
	names map[string]bool
	lines []string
}

func scrape(t *testing.T, h http.Handler) exposition {
	t.Helper()
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	if rec.Code != http.StatusOK {
		t.Fatalf("/metrics: %d %s", rec.Code, rec.Body)
	}
	e := exposition{names: map[string]bool{}}
	for _, line := range strings.Split(rec.Body.String(), "\n") {
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		name, _, _ := strings.Cut(line, "{")
		name, _, _ = strings.Cut(name, " ")
		e.names[name] = true
		e.lines = append(e.lines, line)
	}
	return e
}

// has reports whether a sample of metric carries every label="value" of
// labels.
func (e exposition) has(metric string, labels ...string) bool {
	for _, l := range e.lines {
		if !strings.HasPrefix(l, metric+"{") && !strings.HasPrefix(l, metric+" ") {
			continue
		}
		ok := true
		for _, lv := range labels {
			ok = ok && strings.Contains(l, lv)
		}
		if ok {
			return true
		}
	}
	return false
}

// TestDashboardAndAlertMetrics runs a relay (with the monitor and the
// janitor, then a sweeper) and the generated consumer over NATS JetStream
// on PostgreSQL, through successes, a consumer retry, a poisoned delivery,
// a transient and a permanent publish failure; then checks that every
// outboxgen metric the Grafana dashboard and the alert rules query is in
// their Prometheus expositions, with the labels the issue asks for.
func TestDashboardAndAlertMetrics(t *testing.T) {
	b := startNATS(t)
	db := openDB(t)

	// The consumer, exporting through its own Prometheus registry.
	reg := prometheus.NewRegistry()
	exp, err := otelprom.New(otelprom.WithRegisterer(reg), otelprom.WithoutTargetInfo(), otelprom.WithoutScopeInfo())
	if err != nil {
		t.Fatal(err)
	}
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(exp))
	t.Cleanup(func() { mp.Shutdown(context.Background()) })
	runConsumer(t, db, b, newPoints(t, db), nil, mp)
	consumer := promhttp.HandlerFor(reg, promhttp.HandlerOpts{})

	ctx := context.Background()
	for _, order := range []string{"order-ok", orderRetry, orderPoison} {
		writeOrder(t, ctx, db, order)
	}
	// Rows the broker refuses: a subject with a wildcard (permanent:
	// marked FAILED at once) and one no stream captures (transient:
	// rescheduled).
	w := outbox.MustNewWriter(outbox.Postgres, "outbox_event")
	for _, topic := range []string{"orders.*", "nostream.events"} {
		tx, err := db.BeginTx(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := w.Insert(ctx, tx, outbox.Event{Type: sqlevents.OrderPaidType, Topic: topic, Key: "k-" + topic, Version: 1, Payload: map[string]string{}}); err != nil {
			t.Fatal(err)
		}
		if err := tx.Commit(); err != nil {
			t.Fatal(err)
		}
	}

	drv, err := sqldriver.New(db, sqlevents.Schema)
	if err != nil {
		t.Fatal(err)
	}
	logger := slog.New(slog.DiscardHandler)
	relayWant := map[string][]string{
		"outboxgen_relay_published_total":                 {`topic="orders.paid"`, `event_type="ORDER_PAID"`},
		"outboxgen_relay_publish_failures_total":          {`topic="orders.*"`, `error_type="permanent"`},
		"outboxgen_relay_marked_failed_total":             {`topic="orders.*"`},
		"outboxgen_relay_rescheduled_total":               {`topic="nostream.events"`},
		"outboxgen_relay_publish_duration_seconds_bucket": {`topic="orders.paid"`},
		"outboxgen_relay_publish_lag_seconds_bucket":      {`topic="orders.paid"`},
		"outboxgen_relay_claim_duration_seconds_bucket":   nil,
		"outboxgen_relay_batch_size_bucket":               nil,
		"outboxgen_relay_in_flight":                       nil,
		"outboxgen_relay_breaker_open":                    nil,
		"outboxgen_janitor_deleted_total":                 {`target="outbox"`},
		"outboxgen_outbox_failed":                         nil,
	}
	relayExp := runUntil(t, drv, runner.Config{
		Publisher: b.pub, Logger: logger,
		Relay:   &relay.Config{PollInterval: 20 * time.Millisecond},
		Monitor: &monitor.Config{Interval: 50 * time.Millisecond},
		Janitor: &janitor.Config{Interval: 100 * time.Millisecond, Retention: time.Millisecond},
	}, relayWant)

	consumerWant := map[string][]string{
		"outboxgen_inbox_deliveries_total":                {`outcome="poisoned"`, `consumer="points"`},
		"outboxgen_inbox_handler_duration_seconds_bucket": {`outcome="processed"`},
		"outboxgen_inbox_lag_seconds_bucket":              {`event_type="ORDER_PAID"`},
	}
	var consumerExp exposition
	eventually(t, "the consumer's metrics", func() bool {
		consumerExp = scrape(t, consumer)
		return missing(consumerExp, consumerWant) == ""
	})

	// The sweeper rescues an overdue row.
	writeOrder(t, ctx, db, "order-late")
	sweeperExp := runUntil(t, drv, runner.Config{
		Publisher: b.pub, Logger: logger,
		Sweeper: &sweeper.Config{OverdueAfter: time.Millisecond, Interval: 50 * time.Millisecond},
	}, map[string][]string{"outboxgen_sweeper_rescued_total": {`topic="orders.paid"`}})

	exposed := map[string]bool{}
	for _, e := range []exposition{relayExp, consumerExp, sweeperExp} {
		for n := range e.names {
			exposed[n] = true
		}
	}
	queried := queriedMetrics(t)
	if len(queried) < 20 {
		t.Errorf("the dashboard and alerts query only %d outboxgen metrics: %v", len(queried), queried)
	}
	for _, q := range queried {
		if !exposed[q.metric] {
			t.Errorf("%s queries %s, which no exposition shows", q.where, q.metric)
		}
	}
}

// runUntil runs a runner over drv until its /metrics shows every metric
// of want (with its labels), and returns that exposition.
func runUntil(t *testing.T, drv *sqldriver.Driver, cfg runner.Config, want map[string][]string) exposition {
	t.Helper()
	r, err := runner.New(drv, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("runner: %v", err)
		}
	}()
	var e exposition
	deadline := time.Now().Add(60 * time.Second)
	for {
		e = scrape(t, r.Handler())
		m := missing(e, want)
		if m == "" {
			return e
		}
		if time.Now().After(deadline) {
			t.Fatalf("the runner's /metrics lacks %s:\n%s", m, strings.Join(e.lines, "\n"))
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func missing(e exposition, want map[string][]string) string {
	var out []string
	for m, labels := range want {
		if !e.has(m, labels...) {
			out = append(out, m+"{"+strings.Join(labels, ",")+"}")
		}
	}
	sort.Strings(out)
	return strings.Join(out, ", ")
}

type query struct{ where, metric string }

var metricRE = regexp.MustCompile(`\boutboxgen_[a-z_]+\b`)

// labelNames are outboxgen_ words that are labels, not metrics.
var labelNames = map[string]bool{"outboxgen_table": true}

// queriedMetrics returns every outboxgen metric the dashboard, the alert
// rules and the Kubernetes PrometheusRule query.
func queriedMetrics(t *testing.T) []query {
	t.Helper()
	var exprs []query
	raw, err := os.ReadFile(deployDir + "/observability/outboxgen-dashboard.json")
	if err != nil {
		t.Fatal(err)
	}
	var dash struct {
		Panels []struct {
			Title   string
			Targets []struct{ Expr string }
		}
	}
	if err := json.Unmarshal(raw, &dash); err != nil {
		t.Fatalf("dashboard: %v", err)
	}
	for _, p := range dash.Panels {
		for _, tg := range p.Targets {
			exprs = append(exprs, query{"dashboard panel " + p.Title, tg.Expr})
		}
	}
	type rules struct {
		Groups []struct {
			Rules []struct {
				Alert string
				Expr  string
			}
		}
		Spec struct {
			Groups []struct {
				Rules []struct {
					Alert string
					Expr  string
				}
			}
		}
	}
	for _, f := range []string{"observability/outboxgen-alerts.yaml", "kubernetes/prometheusrule.yaml"} {
		raw, err := os.ReadFile(deployDir + "/" + f)
		if err != nil {
			t.Fatal(err)
		}
		dec := yaml.NewDecoder(strings.NewReader(string(raw)))
		for {
			var r rules
			if err := dec.Decode(&r); err != nil {
				break
			}
			for _, g := range append(r.Groups, r.Spec.Groups...) {
				for _, rl := range g.Rules {
					exprs = append(exprs, query{f + " alert " + rl.Alert, rl.Expr})
				}
			}
		}
	}
	var out []query
	seen := map[string]bool{}
	for _, e := range exprs {
		for _, m := range metricRE.FindAllString(e.metric, -1) {
			if labelNames[m] {
				continue
			}
			if !seen[m] {
				seen[m] = true
			}
			out = append(out, query{e.where, m})
		}
	}
	if len(exprs) == 0 {
		t.Fatal("no expressions found")
	}
	return dedupe(out)
}

func dedupe(qs []query) []query {
	seen := map[string]bool{}
	var out []query
	for _, q := range qs {
		if !seen[q.metric] {
			seen[q.metric] = true
			out = append(out, q)
		}
	}
	return out
}
