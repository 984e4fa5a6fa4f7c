// Package status serves the agent's read-only HTTP endpoints: GET / (the
// live page, embedded: no external asset), GET /status (the loop's latest
// view, as JSON), GET /series (each server's last 60 s, second by second)
// and GET /metrics (Prometheus text).
package status

import (
	"context"
	"crypto/subtle"
	_ "embed"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"runtime"
	"sort"
	"time"

	"github.com/hapilot/hapilot/agent"
	"github.com/hapilot/hapilot/agent/loop"
	"github.com/hapilot/hapilot/internal/lib/netx"
	"github.com/hapilot/hapilot/internal/lib/promtext"
	"github.com/rs/zerolog"
	"github.com/valyala/fasthttp"
)

// Server serves GET /status and GET /metrics, read-only.
type Server struct {
	Loop *loop.Loop
	// Extra writes further metrics (ingest counters, window store).
	Extra []func(io.Writer)
	// Warnings, when set, lists what an operator should fix (no telemetry
	// arriving, say), shown in /status as "warnings".
	Warnings func() []string
	// Unseen, when set, says what the per-response paths cannot see and
	// what makes up for it, shown in /status as "unseen".
	Unseen func() string
	// Ingest, when set, gives the ingest paths' counters, shown in
	// /status as "ingest".
	Ingest func() map[string]uint64
	// Fleet, when set, gives the fleet's state (members, each backend's
	// decider, pooled against local evidence, the last sync's age), shown
	// in /status as "fleet".
	Fleet func() any
	// Series, when set, gives each server's last n seconds for /series.
	Series func(n int) any
	// Token, when set, is required of every request: an Authorization:
	// Bearer header, or a token query parameter (the page's own link).
	Token string
	// Log receives the HTTP server's complaints (a refused POST, a broken
	// connection), at debug level: they are the client's faults.
	Log zerolog.Logger
}

// printf adapts a zerolog.Logger to fasthttp's Logger.
type printf struct{ log zerolog.Logger }

func (p printf) Printf(format string, args ...any) { p.log.Debug().Msgf(format, args...) }

// WriteLoopMetrics writes the loop's counters, and its policy's if it
// keeps any.
func WriteLoopMetrics(w io.Writer, l *loop.Loop) {
	m := l.View().Metrics()
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
	unsaved := 0
	if m.StateUnsaved {
		unsaved = 1
	}
	promtext.Gauge(w, "hapilot_state_unsaved", "1 while the last write of the state file failed: the agent's changes since are in memory only, and it tries again every step.", unsaved)
	promtext.Counter(w, "hapilot_state_failed_writes_total", "Writes of the state file that failed.", m.StateFailedWrites)
	promtext.Gauge(w, "hapilot_goroutines", "Goroutines running in the agent.", runtime.NumGoroutine())
	writeControlMetrics(w, l, m)
	if l.Policy.Metrics != nil {
		l.Policy.Metrics(w)
	}
}

// writeControlMetrics writes what an operator alerts on: the mode, the
// pauses, what the agent holds, its refusals and would-actions, and
// whether it still steps.
func writeControlMetrics(w io.Writer, l *loop.Loop, m agent.Counters) {
	st := l.View().Status()
	var modes []promtext.Sample
	for _, md := range agent.Modes {
		modes = append(modes, promtext.Sample{Labels: []string{"mode", string(md)}, Value: b2f(st.Mode == md)})
	}
	promtext.Family(w, "hapilot_mode", "gauge", "1 for the mode in force: observe sends nothing to HAProxy.", modes)
	var pauses []promtext.Sample
	for _, p := range st.Pauses {
		pauses = append(pauses, promtext.Sample{Labels: []string{"backend", p.Backend}, Value: 1})
	}
	promtext.Family(w, "hapilot_paused", "gauge", "1 for each pause in force (backend \"*\": every backend): the agent observes there.", pauses)
	var held []promtext.Sample
	for _, h := range l.View().List() {
		held = append(held, promtext.Sample{Labels: []string{"backend", h.Server.Backend, "server", h.Server.Server, "phase", string(h.Phase)}, Value: 1})
	}
	promtext.Family(w, "hapilot_held", "gauge", "1 for each server the agent holds out of its configured state, by phase (drained, cut, canary).", held)
	var would []promtext.Sample
	for _, k := range agent.WouldKinds {
		would = append(would, promtext.Sample{Labels: []string{"kind", string(k)}, Value: float64(m.Would[k])})
	}
	promtext.Family(w, "hapilot_would_actions_total", "counter", "Vetted actions held back (observe mode, a pause), by what they would have done; one held back step after step counts once.", would)
	var wouldNow []promtext.Sample
	for _, a := range l.View().WouldNow() {
		wouldNow = append(wouldNow, promtext.Sample{Labels: []string{"backend", a.Action.Backend, "server", a.Action.Server, "kind", string(a.Kind)}, Value: 1})
	}
	promtext.Family(w, "hapilot_would_action", "gauge", "1 for each action the last step vetted and held back (observe mode, a pause), by server and what it would have done: alert on hapilot_would_action{kind=\"drain\"}.", wouldNow)
	var refused []promtext.Sample
	for _, code := range sortedCodes(m.RefusedBy) {
		refused = append(refused, promtext.Sample{Labels: []string{"code", string(code)}, Value: float64(m.RefusedBy[code])})
	}
	promtext.Family(w, "hapilot_refusals_total", "counter", "Actions the guardrails refused, by refusal code (agent/guard.go).", refused)
	var last float64
	if !m.LastOK.IsZero() {
		last = float64(m.LastOK.UnixNano()) / 1e9
	}
	promtext.Gauge(w, "hapilot_last_step_success_timestamp_seconds", "When the last step that read HAProxy ended (Unix time; 0: none yet).", last)
	promtext.Histogram(w, "hapilot_step_duration_seconds", "Time one step took.", agent.DurationBuckets[:], m.Durations[:], m.DurationSum, m.Cycles)
}

func b2f(b bool) float64 {
	if b {
		return 1
	}
	return 0
}

func sortedCodes(m map[agent.Refusal]uint64) []agent.Refusal {
	out := make([]agent.Refusal, 0, len(m))
	for c := range m {
		out = append(out, c)
	}
	sort.Slice(out, func(i, j int) bool { return out[i] < out[j] })
	return out
}

//go:embed page.html
var page []byte

// SeriesSeconds is how much /series holds: the page's sparklines.
const SeriesSeconds = 60

// authorized checks the token, in constant time, when one is set.
func (s *Server) authorized(ctx *fasthttp.RequestCtx) bool {
	if s.Token == "" {
		return true
	}
	got := ctx.QueryArgs().Peek("token")
	if auth := ctx.Request.Header.Peek("Authorization"); len(auth) > 7 && string(auth[:7]) == "Bearer " {
		got = auth[7:]
	}
	return subtle.ConstantTimeCompare(got, []byte(s.Token)) == 1
}

// Handler is the fasthttp handler, exposed for tests.
func (s *Server) Handler(ctx *fasthttp.RequestCtx) {
	if !ctx.IsGet() && !ctx.IsHead() {
		ctx.Response.Header.Set("Allow", "GET, HEAD")
		ctx.Error("read-only: GET /, /status, /series or /metrics", fasthttp.StatusMethodNotAllowed)
		return
	}
	if !s.authorized(ctx) {
		// No keep-alive without the token: 64 connections that each took
		// a 401 and stayed idle once held every place a scraper needs.
		ctx.SetConnectionClose()
		ctx.Response.Header.Set("WWW-Authenticate", `Bearer realm="hapilot"`)
		ctx.Error("a token is required: Authorization: Bearer TOKEN, or ?token=TOKEN", fasthttp.StatusUnauthorized)
		return
	}
	// An authorized connection is the last the listener evicts at its cap
	// (netx.Listener): a scraper keeps its place among strangers.
	if c, ok := ctx.Conn().(*netx.Conn); ok {
		c.Proven()
	}
	switch string(ctx.Path()) {
	case "/":
		ctx.SetContentType("text/html; charset=utf-8")
		// The page is the agent's own: nothing from elsewhere may run in it.
		ctx.Response.Header.Set("Content-Security-Policy", "default-src 'self'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; img-src data:")
		ctx.Response.Header.Set("X-Frame-Options", "DENY")
		ctx.Response.Header.Set("Referrer-Policy", "no-referrer")
		ctx.SetBody(page)
	case "/series":
		ctx.SetContentType("application/json")
		var v any = []any{}
		if s.Series != nil {
			v = s.Series(SeriesSeconds)
		}
		if err := json.NewEncoder(ctx).Encode(v); err != nil {
			ctx.Error(err.Error(), fasthttp.StatusInternalServerError)
		}
	case "/status":
		ctx.SetContentType("application/json")
		enc := json.NewEncoder(ctx)
		enc.SetIndent("", "  ")
		st := struct {
			loop.Status
			Warnings []string          `json:"warnings,omitempty"`
			Unseen   string            `json:"unseen,omitempty"`
			Ingest   map[string]uint64 `json:"ingest,omitempty"`
			Fleet    any               `json:"fleet,omitempty"`
		}{Status: s.Loop.View().Status()}
		if s.Unseen != nil {
			st.Unseen = s.Unseen()
		}
		if s.Fleet != nil {
			st.Fleet = s.Fleet()
		}
		if s.Warnings != nil {
			st.Warnings = s.Warnings()
		}
		if s.Ingest != nil {
			st.Ingest = s.Ingest()
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
		ctx.Error("not found: GET /, /status, /series or /metrics", fasthttp.StatusNotFound)
	}
}

// MaxConnLife bounds a status connection's whole life (see
// netx.Listener.MaxLife): the idle timeout, renewed by every request,
// does not bound it.
const MaxConnLife = time.Minute

// Serve listens on ln until ctx ends. ln is capped by its caller
// (netx.Limit, with MaxLife set to MaxConnLife); the server's own
// concurrency is far above any such cap, so that a connection the
// listener let in is never turned away while one it evicted winds down.
func (s *Server) Serve(ctx context.Context, ln net.Listener) error {
	// Read-only and small: a request with a body is refused before the
	// body is read, and idle connections are closed.
	srv := &fasthttp.Server{Handler: s.Handler, Name: "hapilot", ReadTimeout: 5 * time.Second, WriteTimeout: 5 * time.Second,
		IdleTimeout: 30 * time.Second, GetOnly: true, MaxRequestBodySize: 1, DisablePreParseMultipartForm: true, Concurrency: 1024,
		Logger: printf{s.Log}}
	stop := context.AfterFunc(ctx, func() { _ = srv.Shutdown() })
	defer stop()
	if err := srv.Serve(ln); err != nil && ctx.Err() == nil {
		return fmt.Errorf("status server: %w", err)
	}
	return nil
}
