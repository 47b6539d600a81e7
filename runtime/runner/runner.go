// Package runner runs the outbox runtime's long-running parts together in
// one process: the relay, the sweeper, the monitor and the janitor, each
// switchable, each configured by its own package's Config, plus an HTTP
// server for Prometheus metrics and Kubernetes probes. The `outboxgen
// relay` command is a thin layer of flags over it; a service can run the
// same thing from Go:
//
//	r, err := runner.New(drv, runner.Config{
//		Publisher:   pub,
//		Relay:       &relay.Config{},
//		Sweeper:     &sweeper.Config{},
//		Monitor:     &monitor.Config{},
//		MetricsAddr: ":9090",
//	})
//	defer r.Close()
//	err = r.Run(ctx) // until ctx is cancelled (SIGTERM)
//
// The HTTP server answers:
//
//   - /metrics: the Prometheus exposition of the runtime's OpenTelemetry
//     metrics (the monitor's gauges, the relay's and sweeper's instruments
//     by event type and topic, the runner's row counters and the janitor's
//     outboxgen.janitor.deleted) from a private MeterProvider and registry,
//     plus Go and process metrics; deploy/observability holds a Grafana
//     dashboard and alert rules over them;
//   - /healthz: 200 while the process runs (liveness);
//   - /readyz: 200 once the start-up check (driver Check of the outbox
//     table) passed and while the database answers: the last database call
//     of any part succeeded within ReadyWindow, or, failing that, a probe
//     made by the request itself succeeds. 503 with the reason otherwise,
//     and during shutdown.
package runner

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	otelprom "go.opentelemetry.io/otel/exporters/prometheus"
	"go.opentelemetry.io/otel/metric"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"

	"github.com/outboxgen/outboxgen/runtime/driver"
	"github.com/outboxgen/outboxgen/runtime/internal/backoff"
	"github.com/outboxgen/outboxgen/runtime/internal/dberr"
	"github.com/outboxgen/outboxgen/runtime/janitor"
	"github.com/outboxgen/outboxgen/runtime/monitor"
	"github.com/outboxgen/outboxgen/runtime/redact"
	"github.com/outboxgen/outboxgen/runtime/relay"
	"github.com/outboxgen/outboxgen/runtime/sweeper"
)

// Defaults of Config.
const (
	// DefaultReadyWindow is how recent the last successful database call
	// must be for /readyz to answer without probing the database itself.
	DefaultReadyWindow = 10 * time.Second
	// DefaultHTTPShutdownTimeout bounds the HTTP server's graceful close
	// once every part has stopped.
	DefaultHTTPShutdownTimeout = 5 * time.Second
	// ProbeTimeout bounds /readyz's own database probe.
	ProbeTimeout = 2 * time.Second
	// MeterName is the instrumentation scope of the runner's own metrics.
	MeterName = "github.com/outboxgen/outboxgen/runtime/runner"
)

// Config configures a Runner. A part runs when its Config pointer is not
// nil (the pointed-to Config is completed with defaults by the part's New,
// as when it is used alone); at least one must be.
type Config struct {
	// Publisher is used by the relay and the sweeper when their own
	// Config.Publisher is nil. The runner never closes it: the caller
	// does, after Run returns.
	Publisher message.Publisher

	// Relay, Sweeper, Monitor and Janitor configure the parts to run; nil
	// leaves that part out.
	Relay   *relay.Config
	Sweeper *sweeper.Config
	Monitor *monitor.Config
	Janitor *janitor.Config

	// MetricsAddr is the HTTP server's listen address for /metrics,
	// /healthz and /readyz (e.g. ":9090"). Empty: no server (Handler still
	// serves them for a server of the caller's).
	MetricsAddr string

	// ReadyWindow: /readyz answers from the parts' own database calls when
	// the last one succeeded less than ReadyWindow ago, and probes the
	// database itself otherwise (default 10s), so an idle janitor-only
	// process is still checked and a failing one is not taken on trust.
	ReadyWindow time.Duration

	// Logger receives structured logs; parts whose Config.Logger is nil get
	// it too (default slog.Default()).
	Logger *slog.Logger
}

func (c *Config) setDefaults() {
	if c.ReadyWindow == 0 {
		c.ReadyWindow = DefaultReadyWindow
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
}

// Validate reports every invalid setting, joined, each saying how to fix
// it. The parts' own Configs are checked by their New.
func (c Config) Validate() error {
	var errs []error
	if c.Relay == nil && c.Sweeper == nil && c.Monitor == nil && c.Janitor == nil {
		errs = append(errs, errors.New("runner: no part to run: set at least one of Config.Relay, Sweeper, Monitor and Janitor"))
	}
	if c.ReadyWindow < 0 {
		errs = append(errs, fmt.Errorf("runner: Config.ReadyWindow is %s: use a positive duration (or 0 for %s)", c.ReadyWindow, DefaultReadyWindow))
	}
	if c.Logger == nil {
		errs = append(errs, errors.New("runner: Config.Logger is nil: set it, or leave it nil before New to use slog.Default()"))
	}
	return errors.Join(errs...)
}

// Runner runs the configured parts. Create it with New, start it with Run
// (once), release it with Close.
type Runner struct {
	cfg      Config
	drv      driver.Driver // observed, for the runner's own calls
	health   *health
	log      *slog.Logger
	provider *sdkmetric.MeterProvider
	registry *prometheus.Registry
	handler  http.Handler

	relay   *relay.Relay
	sweeper *sweeper.Sweeper
	monitor *monitor.Monitor
	janitor *janitor.Janitor
	parts   []string

	started  atomic.Bool // start-up check passed
	stopping atomic.Bool // Run's context is done
	ran      atomic.Bool

	probeMu  sync.Mutex // one /readyz probe at a time
	probedAt time.Time
	probeErr error
}

// New builds every configured part over drv (a sqldriver or pgxdriver) and
// the metrics pipeline. Nothing touches the database until Run.
func New(drv driver.Driver, cfg Config) (*Runner, error) {
	if drv == nil {
		return nil, errors.New("runner: driver is nil: pass sqldriver.New(db, events.Schema) or pgxdriver.New(pool, events.Schema)")
	}
	cfg.setDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	r := &Runner{cfg: cfg, health: &health{}, log: cfg.Logger.With(slog.String("component", "outboxgen.runner"))}

	// A private registry and provider: the process's /metrics shows
	// exactly the runtime's metrics, whatever else registers globally.
	r.registry = prometheus.NewRegistry()
	r.registry.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	exp, err := otelprom.New(otelprom.WithRegisterer(r.registry), otelprom.WithoutTargetInfo(), otelprom.WithoutScopeInfo())
	if err != nil {
		return nil, fmt.Errorf("runner: prometheus exporter: %w", err)
	}
	r.provider = sdkmetric.NewMeterProvider(sdkmetric.WithReader(exp))
	meter := r.provider.Meter(MeterName)
	c, err := newCounters(meter)
	if err != nil {
		r.provider.Shutdown(context.Background())
		return nil, fmt.Errorf("runner: metrics: %w", err)
	}
	if err := r.registerGauges(meter); err != nil {
		r.provider.Shutdown(context.Background())
		return nil, fmt.Errorf("runner: metrics: %w", err)
	}
	r.drv = observe(drv, r.health, c, "runner")

	if err := r.build(drv, c); err != nil {
		r.Close()
		return nil, err
	}
	r.handler = r.newHandler()
	return r, nil
}

// build creates the parts, each over its own observed driver.
func (r *Runner) build(drv driver.Driver, c *counters) error {
	cfg := r.cfg
	if cfg.Relay != nil {
		rc := *cfg.Relay
		if rc.Publisher == nil {
			rc.Publisher = cfg.Publisher
		}
		if rc.Logger == nil {
			rc.Logger = cfg.Logger
		}
		if rc.MeterProvider == nil {
			rc.MeterProvider = r.provider
		}
		rl, err := relay.New(observe(drv, r.health, c, "relay"), rc)
		if err != nil {
			return err
		}
		r.relay, r.parts = rl, append(r.parts, "relay")
	}
	if cfg.Sweeper != nil {
		sc := *cfg.Sweeper
		if sc.Publisher == nil {
			sc.Publisher = cfg.Publisher
		}
		if sc.Logger == nil {
			sc.Logger = cfg.Logger
		}
		if sc.MeterProvider == nil {
			sc.MeterProvider = r.provider
		}
		s, err := sweeper.New(observe(drv, r.health, c, "sweeper"), sc)
		if err != nil {
			return err
		}
		r.sweeper, r.parts = s, append(r.parts, "sweeper")
	}
	if cfg.Monitor != nil {
		mc := *cfg.Monitor
		if mc.Meter == nil {
			mc.Meter = r.provider.Meter(monitor.MeterName)
		}
		if mc.Logger == nil {
			mc.Logger = cfg.Logger
		}
		m, err := monitor.New(observe(drv, r.health, c, "monitor"), mc)
		if err != nil {
			return err
		}
		r.monitor, r.parts = m, append(r.parts, "monitor")
	}
	if cfg.Janitor != nil {
		jc := *cfg.Janitor
		if jc.Logger == nil {
			jc.Logger = cfg.Logger
		}
		j, err := janitor.New(observe(drv, r.health, c, "janitor"), jc)
		if err != nil {
			return err
		}
		r.janitor, r.parts = j, append(r.parts, "janitor")
	}
	return nil
}

// registerGauges adds the runner's readiness gauge: 1 while /readyz would
// answer 200 from what the parts last saw (without probing).
func (r *Runner) registerGauges(m metric.Meter) error {
	_, err := m.Int64ObservableGauge("outboxgen.runner.ready",
		metric.WithDescription("1 when the runner is ready (start-up check passed, database answering), else 0."),
		metric.WithInt64Callback(func(_ context.Context, o metric.Int64Observer) error {
			o.Observe(r.readyGauge())
			return nil
		}))
	return err
}

// MeterProvider returns the provider behind the runner's /metrics (nil
// without a metrics address), for parts a process runs beside the runner,
// such as the streaming relay of `outboxgen relay` with sql.wal.
func (r *Runner) MeterProvider() metric.MeterProvider {
	if r.provider == nil {
		return nil
	}
	return r.provider
}

// Parts names the parts that run, in start order.
func (r *Runner) Parts() []string { return append([]string(nil), r.parts...) }

// Relay returns the relay, or nil when it does not run (e.g. to call
// Notify).
func (r *Runner) Relay() *relay.Relay { return r.relay }

// Handler serves /metrics, /healthz and /readyz.
func (r *Runner) Handler() http.Handler { return r.handler }

// Run starts the HTTP server (when MetricsAddr is set) and the parts, and
// returns once ctx is done and every part has stopped: each finishes its
// work in hand within its own ShutdownTimeout. It returns nil after a
// clean shutdown. A part that cannot start (a missing table or column, a
// missing privilege: see each part's Run) stops the others and its error
// is returned; so is a failure to listen on MetricsAddr. Run may be called
// once.
func (r *Runner) Run(ctx context.Context) error {
	if !r.ran.CompareAndSwap(false, true) {
		return errors.New("runner: Run was already called: create another Runner")
	}
	var srv *http.Server
	var srvErr chan error
	if r.cfg.MetricsAddr != "" {
		ln, err := net.Listen("tcp", r.cfg.MetricsAddr)
		if err != nil {
			return fmt.Errorf("runner: listen on metrics address %s: %w (choose a free port with -metrics-addr)", r.cfg.MetricsAddr, err)
		}
		srv = &http.Server{Handler: r.handler, ReadHeaderTimeout: 10 * time.Second}
		srvErr = make(chan error, 1)
		go func() { srvErr <- srv.Serve(ln) }()
		r.log.InfoContext(ctx, "metrics server listening", slog.String("addr", ln.Addr().String()))
	}

	runCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	var wg sync.WaitGroup
	errs := make(chan error, len(r.parts)+1)
	start := func(name string, run func(context.Context) error) {
		wg.Go(func() {
			if err := run(runCtx); err != nil && runCtx.Err() == nil {
				errs <- fmt.Errorf("%s: %w", name, err)
				cancel() // one part cannot run: stop the others, fail the process
			}
		})
	}
	start("start-up check", r.startupCheck)
	if r.relay != nil {
		start("relay", r.relay.Run)
	}
	if r.sweeper != nil {
		start("sweeper", r.sweeper.Run)
	}
	if r.monitor != nil {
		start("monitor", r.monitor.Run)
	}
	if r.janitor != nil {
		start("janitor", r.janitor.Run)
	}

	select {
	case <-runCtx.Done():
	case err := <-srvErr:
		// The server died on its own: the probes would fail anyway.
		cancel()
		wg.Wait()
		return fmt.Errorf("runner: metrics server: %w", err)
	}
	r.stopping.Store(true)
	if ctx.Err() != nil {
		r.log.Info("shutting down", slog.String("cause", context.Cause(ctx).Error()))
	}
	wg.Wait()
	close(errs)
	var runErr []error
	for err := range errs {
		runErr = append(runErr, err)
	}
	if srv != nil {
		sctx, scancel := context.WithTimeout(context.Background(), DefaultHTTPShutdownTimeout)
		srv.Shutdown(sctx)
		scancel()
	}
	if len(runErr) > 0 {
		return errors.Join(runErr...)
	}
	r.log.Info("stopped")
	return nil
}

// startupCheck runs the driver's Check of the outbox table until it
// passes (then /readyz may answer 200) or fails in a way waiting cannot
// mend (returned: the process should exit). A database that is not up yet
// is retried with the usual backoff.
func (r *Runner) startupCheck(ctx context.Context) error {
	b := backoff.New(time.Second, backoff.DefaultMax)
	for {
		err := r.drv.Check(ctx, driver.Outbox)
		if err == nil {
			r.started.Store(true)
			return nil
		}
		if ctx.Err() != nil {
			return nil
		}
		err = dberr.Explain(err, dberr.Need{Component: "outboxgen relay", Tables: r.drv.Tables().Outbox, Privileges: "SELECT on " + r.drv.Tables().Outbox})
		if dberr.FatalAtStart(err) {
			return err
		}
		wait := b.Next()
		r.log.ErrorContext(ctx, "start-up check failed", slog.Any("error", err), slog.Duration("retry_in", wait))
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(wait):
		}
	}
}

// readyPassive judges readiness from what the parts saw, without touching
// the database: nil when ready, errNeedProbe when only a probe can tell.
func (r *Runner) readyPassive() error {
	switch {
	case r.stopping.Load():
		return errors.New("shutting down")
	case !r.started.Load():
		return errors.New("starting: the start-up check of the outbox table has not passed yet")
	}
	ok, fail, err := r.health.state()
	if fail.After(ok) {
		return fmt.Errorf("database failing: %s", redact.String(err.Error()))
	}
	if time.Since(ok) > r.cfg.ReadyWindow {
		return errNeedProbe
	}
	return nil
}

var errNeedProbe = errors.New("no recent database call")

// ready reports nil when ready, probing the database itself when the
// parts' calls say nothing recent (at most once a second).
func (r *Runner) ready(ctx context.Context) error {
	err := r.readyPassive()
	if err == nil || (!errors.Is(err, errNeedProbe) && !r.failingLongEnough()) {
		return err
	}
	r.probeMu.Lock()
	defer r.probeMu.Unlock()
	if time.Since(r.probedAt) < time.Second {
		return r.probeErr
	}
	pctx, cancel := context.WithTimeout(ctx, ProbeTimeout)
	defer cancel()
	// The cheapest read of the outbox table that proves it answers: an
	// index range past every id. Needs only SELECT, as the monitor does.
	_, perr := r.drv.FindEvents(pctx, driver.EventFilter{Status: int(driver.Failed), AfterID: 1 << 62, Limit: 1})
	r.probedAt, r.probeErr = time.Now(), nil
	if perr != nil {
		r.probeErr = fmt.Errorf("database probe failed: %s", redact.String(perr.Error()))
	}
	return r.probeErr
}

// failingLongEnough reports whether the last failure is old enough to
// re-check: a part backing off may not call again for half a minute,
// and the database may be back long before.
func (r *Runner) failingLongEnough() bool {
	if r.stopping.Load() || !r.started.Load() {
		return false
	}
	_, fail, _ := r.health.state()
	return time.Since(fail) > 2*time.Second
}

// Close releases the metrics pipeline and the monitor's callback. Call it
// after Run returned.
func (r *Runner) Close() error {
	var errs []error
	if r.monitor != nil {
		errs = append(errs, r.monitor.Close())
	}
	if r.provider != nil {
		errs = append(errs, r.provider.Shutdown(context.Background()))
	}
	return errors.Join(errs...)
}
