package runner

import (
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// newHandler serves /metrics, /healthz and /readyz.
func (r *Runner) newHandler() http.Handler {
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(r.registry, promhttp.HandlerOpts{ErrorLog: nil}))
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		// Liveness: the process serves requests. Database trouble is
		// readiness's business: restarting would not mend it.
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		fmt.Fprintln(w, "ok")
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, req *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		if err := r.ready(req.Context()); err != nil {
			w.WriteHeader(http.StatusServiceUnavailable)
			fmt.Fprintln(w, "not ready:", err)
			return
		}
		fmt.Fprintln(w, "ready")
	})
	return mux
}

// readyGauge is the value of outboxgen.runner.ready: what /readyz would
// answer without probing (an idle process counts as ready while its last
// probe succeeded within ReadyWindow).
func (r *Runner) readyGauge() int64 {
	err := r.readyPassive()
	if err == nil {
		return 1
	}
	if errors.Is(err, errNeedProbe) {
		r.probeMu.Lock()
		defer r.probeMu.Unlock()
		if r.probeErr == nil && time.Since(r.probedAt) < r.cfg.ReadyWindow {
			return 1
		}
	}
	return 0
}
