// Package status serves the agent's read-only HTTP endpoints: GET /status
// (the loop's latest view, as JSON) and GET /metrics (Prometheus text).
package status

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"runtime"
	"time"

	"github.com/hapilot/hapilot/agent"
	"github.com/hapilot/hapilot/internal/promtext"
	"github.com/rs/zerolog"
	"github.com/valyala/fasthttp"
)

// MetricsWriter is a part with counters of its own: a policy, an ingest
// path, the window store.
type MetricsWriter interface {
	WriteMetrics(w io.Writer)
}

// Server serves GET /status and GET /metrics, read-only.
type Server struct {
	Loop *agent.Loop
	// Extra writes further metrics (ingest counters, window store).
	Extra []func(io.Writer)
	// Warnings, when set, lists what an operator should fix (no telemetry
	// arriving, say), shown in /status as "warnings".
	Warnings func() []string
	// Log receives the HTTP server's complaints (a refused POST, a broken
	// connection), at debug level: they are the client's faults.
	Log zerolog.Logger
}

// printf adapts a zerolog.Logger to fasthttp's Logger.
type printf struct{ log zerolog.Logger }

func (p printf) Printf(format string, args ...any) { p.log.Debug().Msgf(format, args...) }

// WriteLoopMetrics writes the loop's counters, and its policy's if it
// keeps any.
func WriteLoopMetrics(w io.Writer, l *agent.Loop) {
	m := l.Metrics()
	promtext.Counter(w, "hapilot_cycles_total", "Control-loop steps run.", m.Cycles)
	promtext.Counter(w, "hapilot_cycles_skipped_total", "Schedule slots skipped because a step overran.", m.Skipped)
	promtext.Counter(w, "hapilot_cycles_triggered_total", "Steps run between ticks because the policy's test found a new server.", m.Triggered)
	promtext.Summary(w, "hapilot_cycle_duration_seconds", "Time one step took.", m.DurationSum, m.Cycles)
	promtext.Gauge(w, "hapilot_cycle_duration_last_seconds", "Duration of the latest step.", m.DurationLast)
	promtext.Gauge(w, "hapilot_cycle_duration_max_seconds", "Longest step so far.", m.DurationMax)
	promtext.Counter(w, "hapilot_actions_applied_total", "Actions that passed the guardrails and were sent.", m.Applied)
	promtext.Counter(w, "hapilot_actions_refused_total", "Actions the guardrails refused.", m.Refused)
	promtext.Counter(w, "hapilot_command_errors_total", "Runtime commands HAProxy failed or never answered.", m.CommandErrors)
	promtext.Counter(w, "hapilot_policy_errors_total", "Steps whose policy returned an error.", m.PolicyErrors)
	promtext.Counter(w, "hapilot_state_errors_total", "Steps that could not read server states.", m.StateErrors)
	promtext.Gauge(w, "hapilot_goroutines", "Goroutines running in the agent.", runtime.NumGoroutine())
	if mw, ok := l.Policy.(MetricsWriter); ok {
		mw.WriteMetrics(w)
	}
}

// Handler is the fasthttp handler, exposed for tests.
func (s *Server) Handler(ctx *fasthttp.RequestCtx) {
	if !ctx.IsGet() && !ctx.IsHead() {
		ctx.Response.Header.Set("Allow", "GET, HEAD")
		ctx.Error("read-only: GET /status or /metrics", fasthttp.StatusMethodNotAllowed)
		return
	}
	switch string(ctx.Path()) {
	case "/status":
		ctx.SetContentType("application/json")
		enc := json.NewEncoder(ctx)
		enc.SetIndent("", "  ")
		st := struct {
			agent.Status
			Warnings []string `json:"warnings,omitempty"`
		}{Status: s.Loop.Status()}
		if s.Warnings != nil {
			st.Warnings = s.Warnings()
		}
		if err := enc.Encode(st); err != nil {
			ctx.Error(err.Error(), fasthttp.StatusInternalServerError)
		}
	case "/metrics":
		ctx.SetContentType("text/plain; version=0.0.4")
		WriteLoopMetrics(ctx, s.Loop)
		for _, f := range s.Extra {
			f(ctx)
		}
	default:
		ctx.Error("not found: GET /status or /metrics", fasthttp.StatusNotFound)
	}
}

// Serve listens on ln until ctx ends.
func (s *Server) Serve(ctx context.Context, ln net.Listener) error {
	// Read-only and small: a request with a body is refused before the
	// body is read, and idle connections are closed.
	srv := &fasthttp.Server{Handler: s.Handler, Name: "hapilot", ReadTimeout: 5 * time.Second, WriteTimeout: 5 * time.Second,
		IdleTimeout: 30 * time.Second, GetOnly: true, MaxRequestBodySize: 1, DisablePreParseMultipartForm: true, Concurrency: 64,
		Logger: printf{s.Log}}
	stop := context.AfterFunc(ctx, func() { _ = srv.Shutdown() })
	defer stop()
	if err := srv.Serve(ln); err != nil && ctx.Err() == nil {
		return fmt.Errorf("status server: %w", err)
	}
	return nil
}
