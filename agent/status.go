package agent

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"time"

	"github.com/valyala/fasthttp"
)

// Status is what GET /status answers.
type Status struct {
	Policy    string            `json:"policy"`
	Interval  string            `json:"interval"`
	Cycle     uint64            `json:"cycle"`
	Observed  time.Time         `json:"observed"`
	Backends  []BackendView     `json:"backends"`
	Changes   map[string]Change `json:"changes"`
	Decisions []Decision        `json:"decisions"`
}

// Status is a copy of the loop's latest view, for people and scripts.
func (l *Loop) Status() Status {
	changes := l.Ledger()
	l.mu.Lock()
	defer l.mu.Unlock()
	return Status{
		Policy: l.Policy.Name(), Interval: l.Interval.String(), Cycle: l.cycle, Observed: l.last.Time,
		Backends: l.last.Backends, Changes: changes, Decisions: append([]Decision(nil), l.recent...),
	}
}

// WriteMetrics writes the loop's counters in Prometheus text format.
func (l *Loop) WriteMetrics(w io.Writer) {
	l.mu.Lock()
	m := l.metrics
	l.mu.Unlock()
	metric(w, "hapilot_cycles_total", "counter", "Control-loop steps run.", m.cycles)
	metric(w, "hapilot_cycles_skipped_total", "counter", "Schedule slots skipped because a step overran.", m.skipped)
	fmt.Fprintf(w, "# HELP hapilot_cycle_duration_seconds Time one step took.\n# TYPE hapilot_cycle_duration_seconds summary\n")
	fmt.Fprintf(w, "hapilot_cycle_duration_seconds_sum %g\nhapilot_cycle_duration_seconds_count %d\n", m.durationSum, m.cycles)
	metric(w, "hapilot_cycle_duration_last_seconds", "gauge", "Duration of the latest step.", m.durationLast)
	metric(w, "hapilot_cycle_duration_max_seconds", "gauge", "Longest step so far.", m.durationMax)
	metric(w, "hapilot_actions_applied_total", "counter", "Actions that passed the guardrails and were sent.", m.applied)
	metric(w, "hapilot_actions_refused_total", "counter", "Actions the guardrails refused.", m.refused)
	metric(w, "hapilot_command_errors_total", "counter", "Runtime commands HAProxy failed or never answered.", m.commandErrors)
	metric(w, "hapilot_policy_errors_total", "counter", "Steps whose policy returned an error.", m.policyErrors)
	metric(w, "hapilot_state_errors_total", "counter", "Steps that could not read server states.", m.stateErrors)
	if mw, ok := l.Policy.(interface{ WriteMetrics(io.Writer) }); ok {
		mw.WriteMetrics(w)
	}
}

func metric[T uint64 | float64 | int](w io.Writer, name, typ, help string, v T) {
	fmt.Fprintf(w, "# HELP %s %s\n# TYPE %s %s\n%s %v\n", name, help, name, typ, name, v)
}

// Metric writes one metric; other packages' counters use it too.
func Metric(w io.Writer, name, typ, help string, v uint64) { metric(w, name, typ, help, v) }

// StatusServer serves GET /status and GET /metrics, read-only.
type StatusServer struct {
	Loop *Loop
	// Extra writes further metrics (ingest counters, window store).
	Extra []func(io.Writer)
}

// Handler is the fasthttp handler, exposed for tests.
func (s *StatusServer) Handler(ctx *fasthttp.RequestCtx) {
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
		if err := enc.Encode(s.Loop.Status()); err != nil {
			ctx.Error(err.Error(), fasthttp.StatusInternalServerError)
		}
	case "/metrics":
		ctx.SetContentType("text/plain; version=0.0.4")
		s.Loop.WriteMetrics(ctx)
		for _, f := range s.Extra {
			f(ctx)
		}
	default:
		ctx.Error("not found: GET /status or /metrics", fasthttp.StatusNotFound)
	}
}

// Serve listens on ln until ctx ends.
func (s *StatusServer) Serve(ctx context.Context, ln net.Listener) error {
	srv := &fasthttp.Server{Handler: s.Handler, Name: "hapilot", ReadTimeout: 5 * time.Second, WriteTimeout: 5 * time.Second}
	stop := context.AfterFunc(ctx, func() { _ = srv.Shutdown() })
	defer stop()
	if err := srv.Serve(ln); err != nil && ctx.Err() == nil {
		return fmt.Errorf("status server: %w", err)
	}
	return nil
}
