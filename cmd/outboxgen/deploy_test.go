package main

// The example Kubernetes manifests under deploy/ parse, use only commands
// and flags that exist, and alert only on metrics the relay process
// exposes.

import (
	"bytes"
	"context"
	"database/sql"
	"errors"
	"flag"
	"io"
	"log/slog"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"
	"gopkg.in/yaml.v3"

	"github.com/outboxgen/outboxgen/generator/spec"
	"github.com/outboxgen/outboxgen/internal/testdb"
	"github.com/outboxgen/outboxgen/runtime/driver/sqldriver"
	"github.com/outboxgen/outboxgen/runtime/monitor"
	"github.com/outboxgen/outboxgen/runtime/relay"
	"github.com/outboxgen/outboxgen/runtime/runner"
	"github.com/outboxgen/outboxgen/runtime/sweeper"
	"github.com/outboxgen/outboxgen/templates"
)

const deployDir = "../../deploy/kubernetes"

// manifests returns every YAML document under deploy/kubernetes.
func manifests(t *testing.T) map[string][]map[string]any {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(deployDir, "*.yaml"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no manifests in %s (%v)", deployDir, err)
	}
	out := map[string][]map[string]any{}
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		dec := yaml.NewDecoder(bytes.NewReader(data))
		for {
			var doc map[string]any
			err := dec.Decode(&doc)
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				t.Fatalf("%s: %v", f, err)
			}
			if doc == nil {
				continue
			}
			if doc["apiVersion"] == nil || doc["kind"] == nil || dig(doc, "metadata", "name") == nil {
				t.Errorf("%s: a document without apiVersion, kind or metadata.name", f)
			}
			out[filepath.Base(f)] = append(out[filepath.Base(f)], doc)
		}
	}
	return out
}

// dig walks maps by keys.
func dig(v any, keys ...string) any {
	for _, k := range keys {
		m, ok := v.(map[string]any)
		if !ok {
			return nil
		}
		v = m[k]
	}
	return v
}

// podSpec returns the pod spec of a Deployment or CronJob.
func podSpec(doc map[string]any) map[string]any {
	var v any
	switch doc["kind"] {
	case "Deployment":
		v = dig(doc, "spec", "template", "spec")
	case "CronJob":
		v = dig(doc, "spec", "jobTemplate", "spec", "template", "spec")
	}
	m, _ := v.(map[string]any)
	return m
}

func TestDeployManifests(t *testing.T) {
	docs := manifests(t)
	kinds := map[string]int{}
	commands := map[string]bool{}
	for file, ds := range docs {
		for _, doc := range ds {
			kind := doc["kind"].(string)
			kinds[kind]++
			ps := podSpec(doc)
			if ps == nil {
				continue
			}
			for _, c := range ps["containers"].([]any) {
				c := c.(map[string]any)
				var args []string
				for _, a := range c["args"].([]any) {
					args = append(args, a.(string))
				}
				var env []string
				for _, e := range asList(c["env"]) {
					env = append(env, dig(e, "name").(string))
				}
				commands[args[0]] = true
				checkArgs(t, file, args, env)
				if args[0] == "relay" {
					checkRelayPod(t, file, doc, ps, c)
				}
			}
		}
	}
	for _, want := range []string{"Deployment", "CronJob", "PrometheusRule"} {
		if kinds[want] == 0 {
			t.Errorf("no %s among the manifests", want)
		}
	}
	for _, want := range []string{"relay", "sweep", "janitor"} {
		if !commands[want] {
			t.Errorf("no manifest runs outboxgen %s", want)
		}
	}
	// The events.yaml of the example ConfigMap is a valid spec.
	for _, doc := range docs["events-configmap.yaml"] {
		src, _ := dig(doc, "data", "events.yaml").(string)
		if _, err := spec.Parse("events.yaml", []byte(src)); err != nil {
			t.Errorf("events-configmap.yaml: events.yaml: %v", err)
		}
	}
}

func asList(v any) []any { l, _ := v.([]any); return l }

// checkArgs parses args against the command's real FlagSet, with the
// environment variables the manifest sets standing for flags.
func checkArgs(t *testing.T, file string, args, env []string) {
	t.Helper()
	var p *procFlags
	switch args[0] {
	case "relay":
		p = newRelayFlags(io.Discard)
	case "sweep":
		p = newSweepFlags(io.Discard)
	case "janitor":
		p = newJanitorFlags(io.Discard)
	default:
		t.Errorf("%s: unknown outboxgen command %q", file, args[0])
		return
	}
	if err := p.fl.Parse(args[1:]); err != nil || p.fl.NArg() > 0 {
		t.Errorf("%s: outboxgen %s %v: %v (stray arguments %v)", file, args[0], args[1:], err, p.fl.Args())
	}
	for _, e := range env {
		if !strings.HasPrefix(e, "OUTBOXGEN_") {
			continue
		}
		found := false
		p.fl.VisitAll(func(f *flag.Flag) { found = found || envName(f.Name) == e })
		if !found && e != envName(configFlag) {
			t.Errorf("%s: env %s names no flag of outboxgen %s", file, e, args[0])
		}
	}
	// A -config file of the manifests sets only known keys.
	if cf := p.fl.Lookup(configFlag).Value.String(); cf != "" {
		checkConfigMapKeys(t, file, p)
	}
}

// checkConfigMapKeys applies the ConfigMap's relay.yaml to the FlagSet.
func checkConfigMapKeys(t *testing.T, file string, p *procFlags) {
	t.Helper()
	for _, doc := range manifests(t)[file] {
		if doc["kind"] != "ConfigMap" {
			continue
		}
		for name, v := range doc["data"].(map[string]any) {
			path := filepath.Join(t.TempDir(), name)
			os.WriteFile(path, []byte(v.(string)), 0o644)
			if err := applyConfigFile(p.fl, path, map[string]bool{}); err != nil {
				t.Errorf("%s: ConfigMap %s: %v", file, name, err)
			}
		}
	}
}

// checkRelayPod: several replicas, probes on /healthz and /readyz, the
// grace period longer than the shutdown timeout, the DSN from a Secret.
func checkRelayPod(t *testing.T, file string, doc, ps, c map[string]any) {
	t.Helper()
	if r, _ := dig(doc, "spec", "replicas").(int); r < 2 {
		t.Errorf("%s: relay Deployment has %d replicas, want several", file, r)
	}
	if p := dig(c, "livenessProbe", "httpGet", "path"); p != "/healthz" {
		t.Errorf("%s: liveness probe on %v, want /healthz", file, p)
	}
	if p := dig(c, "readinessProbe", "httpGet", "path"); p != "/readyz" {
		t.Errorf("%s: readiness probe on %v, want /readyz", file, p)
	}
	grace, _ := ps["terminationGracePeriodSeconds"].(int)
	if time.Duration(grace)*time.Second <= relay.DefaultShutdownTimeout {
		t.Errorf("%s: terminationGracePeriodSeconds %d is not longer than the shutdown timeout %s", file, grace, relay.DefaultShutdownTimeout)
	}
	fromSecret := false
	for _, e := range asList(c["env"]) {
		if dig(e, "name") == envDB && dig(e, "valueFrom", "secretKeyRef") != nil {
			fromSecret = true
		}
	}
	if !fromSecret {
		t.Errorf("%s: %s does not come from a Secret", file, envDB)
	}
}

// TestDeployAlertMetrics: every outboxgen_ metric the alert rules use is
// one a running runner exposes on /metrics.
func TestDeployAlertMetrics(t *testing.T) {
	exposed := scrapeRunner(t)
	re := regexp.MustCompile(`\boutboxgen_[a-z_]+\b`)
	n := 0
	for file, ds := range manifests(t) {
		for _, doc := range ds {
			if doc["kind"] != "PrometheusRule" {
				continue
			}
			for _, g := range asList(dig(doc, "spec", "groups")) {
				for _, r := range asList(dig(g, "rules")) {
					expr, _ := dig(r, "expr").(string)
					for _, m := range re.FindAllString(expr, -1) {
						if m == "outboxgen_table" {
							continue // the table label
						}
						n++
						if !exposed[m] {
							t.Errorf("%s: alert %v uses %s, which /metrics does not expose", file, dig(r, "alert"), m)
						}
					}
				}
			}
		}
	}
	if n == 0 {
		t.Error("the alert rules use no outboxgen_ metric")
	}
}

// scrapeRunner runs a runner with every part on SQLite and returns the
// metric names of its /metrics.
func scrapeRunner(t *testing.T) map[string]bool {
	t.Helper()
	db, err := sql.Open("sqlite", testdb.SQLiteDSN(filepath.Join(t.TempDir(), "o.db")))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	testdb.ApplySchema(t, db, "sqlite", templates.DefaultTables)
	drv, err := sqldriver.New(db, testdb.Schema("sqlite"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := db.Exec("INSERT INTO outbox_event (event_id, biz_type, biz_id, topic, payload) VALUES ('0b7d0a43-3b0f-4f5e-9a57-0c6f3c9b8f1e', 'T', 'k', 't', '{}')"); err != nil {
		t.Fatal(err)
	}
	pub := gochannel.NewGoChannel(gochannel.Config{}, watermill.NopLogger{})
	defer pub.Close()
	r, err := runner.New(drv, runner.Config{
		Publisher: pub, Relay: &relay.Config{PollInterval: 50 * time.Millisecond}, Sweeper: &sweeper.Config{},
		Monitor: &monitor.Config{Interval: 50 * time.Millisecond}, Logger: slog.New(slog.NewJSONHandler(io.Discard, nil)),
	})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	defer func() { cancel(); <-done }()
	names := map[string]bool{}
	deadline := time.Now().Add(10 * time.Second)
	for !names["outboxgen_relay_sent_total"] || !names["outboxgen_outbox_pending"] {
		if time.Now().After(deadline) {
			t.Fatalf("/metrics never showed the relay's and the monitor's metrics: %v", names)
		}
		time.Sleep(50 * time.Millisecond)
		rec := httptest.NewRecorder()
		r.Handler().ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
		for _, line := range strings.Split(rec.Body.String(), "\n") {
			if line == "" || strings.HasPrefix(line, "#") {
				continue
			}
			name, _, _ := strings.Cut(line, "{")
			name, _, _ = strings.Cut(name, " ")
			names[name] = true
		}
	}
	return names
}
