package llm

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sort"
	"sync"
	"time"

	"github.com/hapilot/hapilot/agent"
	"github.com/hapilot/hapilot/agent/policy/rules"
	"github.com/hapilot/hapilot/internal/promtext"
	"github.com/rs/zerolog"
)

// Report is what one step of the policy did, for the audit log.
type Report struct {
	Called       bool       `json:"called"`
	Gated        string     `json:"gated,omitempty"` // why the model was not called
	Candidates   []string   `json:"candidates,omitempty"`
	Call         *Call      `json:"call,omitempty"`
	Proposed     agent.Plan `json:"proposed,omitempty"`    // the model's plan before confirmation
	Pending      []string   `json:"pending,omitempty"`     // proposals awaiting confirmation
	Held         []string   `json:"held,omitempty"`        // undo proposals refused by the hold
	Unsupported  []string   `json:"unsupported,omitempty"` // drains or weight cuts the windows do not support
	Fallback     string     `json:"fallback,omitempty"`    // why the fallback policy acted
	DeadlineMiss bool       `json:"deadline_miss,omitempty"`
	ThinkNote    string     `json:"think_note,omitempty"`
}

// Policy asks the model, under every protection.
type Policy struct {
	Model    *Model
	Fallback agent.Policy // rules, or agent.Static for none
	Config   Config
	Log      zerolog.Logger
	Now      func() time.Time

	mu       sync.Mutex
	prev     map[string]float64 // error rate per server at the previous step
	pending  map[string]int     // consecutive proposals per action
	think    Think              // the mode in force
	thinkOff int                // steps left with thinking forced off
	report   Report
	gate     *rules.Policy
	evidence *rules.Policy
	counters struct {
		calls, gated, invalid, httpErrors, deadlineMisses, fallbacks, promptTokens, completionTokens uint64
		totalMs, loadMs                                                                              float64
	}
}

// New returns the LLM policy; cfg is resolved for the loop's interval
// (Config.ForInterval) by the caller.
func New(m *Model, fallback agent.Policy, cfg Config, log zerolog.Logger) *Policy {
	return &Policy{
		Model: m, Fallback: fallback, Config: cfg, Log: log, Now: time.Now,
		prev: map[string]float64{}, pending: map[string]int{}, think: m.Config.Think,
		// A loose version of the rule test finds candidates worth a call.
		gate: rules.New(rules.Config{Alpha: 0.05, MinRequests: 50, MinErrors: 3, MinRatio: 1.5}),
		// The default rule test decides whether a drained server's own
		// window still condemns it.
		evidence: rules.New(rules.DefaultConfig()),
	}
}

func (*Policy) Name() string { return "llm" }

// Needs: fleet-size adaptation, a backend of N servers may lose up to
// N/10 servers a step (at least one), floor permitting. The unprotected
// study loop waits for the model however long it takes.
func (p *Policy) Needs() agent.Needs {
	return agent.Needs{DrainsPer: 10, NoStepBudget: p.Config.Unprotected}
}

// Report returns the last step's report.
func (p *Policy) Report() any {
	p.mu.Lock()
	defer p.mu.Unlock()
	r := p.report
	return r
}

// Decide runs one step.
func (p *Policy) Decide(ctx context.Context, obs agent.Observation) (agent.Plan, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.report = Report{}
	defer p.remember(obs)

	cands := p.candidates(obs)
	for k, why := range cands {
		p.report.Candidates = append(p.report.Candidates, k+" "+why)
	}
	sort.Strings(p.report.Candidates)
	if p.Config.Gate != GateAlways && len(cands) == 0 && len(p.pending) == 0 {
		p.report.Gated = "no candidate in the windows and nothing awaiting confirmation"
		p.counters.gated++
		return nil, nil
	}

	think := p.think
	if p.thinkOff > 0 {
		p.thinkOff--
		think = ThinkOff
		if p.thinkOff == 0 {
			p.report.ThinkNote = "thinking allowed again from the next step"
		}
	}
	dctx, cancel := context.WithCancel(ctx)
	if p.Config.Deadline > 0 {
		dctx, cancel = context.WithTimeout(ctx, p.Config.Deadline)
	}
	defer cancel()
	p.counters.calls++
	p.report.Called = true
	plan, call, err := p.Model.Ask(dctx, Prompt(obs, p.prev, p.Config.MaxShown), think)
	p.report.Call = &call
	p.counters.promptTokens += uint64(call.PromptTokens)
	p.counters.completionTokens += uint64(call.CompletionTokens)
	p.counters.totalMs += call.TotalMs
	p.counters.loadMs += call.LoadMs
	// A call cut by the agent stopping is no deadline miss.
	overran := errors.Is(dctx.Err(), context.DeadlineExceeded)
	if think != ThinkOff && p.Config.ThinkRetry > 0 && (overran || call.CompletionTokens > p.Config.TokenBudget) {
		p.thinkOff = p.Config.ThinkRetry
		p.report.ThinkNote = fmt.Sprintf("thinking (%s) overran the deadline or spent %d tokens (budget %d): off for %d steps",
			think, call.CompletionTokens, p.Config.TokenBudget, p.thinkOff)
		p.Log.Warn().Str("think", string(think)).Int("tokens", call.CompletionTokens).Bool("overran", overran).Msg("switching thinking off")
	}
	if errors.Is(err, ErrThinkUnsupported) {
		p.think = ThinkOff
		p.report.ThinkNote = "the model does not support thinking: off from now on"
	}
	if err != nil {
		return p.fallback(ctx, obs, err, overran)
	}
	p.report.Proposed = plan
	return p.confirm(obs, p.supported(obs, plan, cands)), nil
}

// supported drops drains and weight cuts of servers the windows do not
// show departing from their peers: the model proposes, the data must
// agree. A model that drains healthy servers therefore cannot do worse
// than the rules.
func (p *Policy) supported(obs agent.Observation, plan agent.Plan, cands map[string]string) agent.Plan {
	var out agent.Plan
	for _, a := range plan {
		cut := a.Kind == agent.Drain
		if a.Kind == agent.SetWeight {
			if _, s := obs.Find(a.Backend, a.Server); s != nil && a.Weight < s.State.Weight {
				cut = true
			}
		}
		if _, flagged := cands[a.Backend+"/"+a.Server]; cut && !flagged && !p.Config.Unprotected {
			p.report.Unsupported = append(p.report.Unsupported, actionKey(a))
			continue
		}
		out = append(out, a)
	}
	return out
}

func (p *Policy) fallback(ctx context.Context, obs agent.Observation, cause error, overran bool) (agent.Plan, error) {
	switch {
	case overran:
		p.counters.deadlineMisses++
		p.report.DeadlineMiss = true
	case p.report.Call != nil && p.report.Call.Raw != "":
		p.counters.invalid++
	default:
		p.counters.httpErrors++
	}
	p.counters.fallbacks++
	p.report.Fallback = cause.Error()
	p.Log.Warn().Err(cause).Str("fallback", p.Fallback.Name()).Msg("model failed; the fallback policy decides this step")
	// Proposals awaiting confirmation lapse: they were not repeated.
	clear(p.pending)
	return p.Fallback.Decide(ctx, obs)
}

func actionKey(a agent.Action) string {
	return fmt.Sprintf("%s %s/%s %d", a.Kind, a.Backend, a.Server, a.Weight)
}

// confirm keeps the actions proposed in Config.Confirm consecutive steps,
// and refuses undoing a recent drain without evidence.
func (p *Policy) confirm(obs agent.Observation, plan agent.Plan) agent.Plan {
	seen := map[string]bool{}
	var out agent.Plan
	for _, a := range plan {
		k := actionKey(a)
		if seen[k] {
			continue
		}
		seen[k] = true
		p.pending[k]++
		if p.pending[k] < p.Config.Confirm {
			p.report.Pending = append(p.report.Pending, k)
			continue
		}
		if a.Kind == agent.Ready && !p.mayUndo(obs, a) {
			p.report.Held = append(p.report.Held, k)
			continue
		}
		out = append(out, a)
	}
	for k := range p.pending {
		if !seen[k] {
			delete(p.pending, k) // not repeated: the count starts again
		}
	}
	for _, a := range out {
		delete(p.pending, actionKey(a))
	}
	return out
}

// mayUndo: a drain older than MinHold may be undone on the model's word;
// a younger one only if the server's window no longer condemns it.
func (p *Policy) mayUndo(obs agent.Observation, a agent.Action) bool {
	b, s := obs.Find(a.Backend, a.Server)
	if s == nil || s.Changed == nil {
		return true // the guardrails refuse it anyway
	}
	if obs.Time.Sub(s.Changed.At) >= p.Config.MinHold {
		return true
	}
	if s.Window.Requests < p.evidence.Config.MinRequests {
		return false // no traffic since the drain: no evidence either way
	}
	// Judge the server as if it were serving, against its serving peers.
	view := *b
	view.Servers = append([]agent.ServerView(nil), b.Servers...)
	for i := range view.Servers {
		if view.Servers[i].Server == a.Server {
			view.Servers[i].State.AdminState = 0
		}
	}
	for _, f := range p.evidence.Test(view) {
		if f.Server == a.Server {
			return !f.Outlier && f.Rate <= 2*f.PeerRate
		}
	}
	return false
}

// candidates maps "backend/server" to why it departs from its peers: in
// errors (the loose rule test) or latency (p95 over twice the median of
// the serving servers', plus 5 ms).
func (p *Policy) candidates(obs agent.Observation) map[string]string {
	out := map[string]string{}
	for _, b := range obs.Backends {
		for _, f := range p.gate.Test(b) {
			if f.Outlier {
				out[b.Name+"/"+f.Server] = "errors"
			}
		}
		var p95 []int
		for _, s := range b.Servers {
			if s.Serving() && s.Window.Requests >= 50 {
				p95 = append(p95, s.Window.P95Ms)
			}
		}
		if len(p95) < 2 {
			continue
		}
		med := median(p95)
		for _, s := range b.Servers {
			if s.Serving() && s.Window.Requests >= 50 && s.Window.P95Ms > 2*med+5 {
				if _, dup := out[b.Name+"/"+s.Server]; !dup {
					out[b.Name+"/"+s.Server] = "latency"
				}
			}
		}
	}
	return out
}

func median(v []int) int {
	c := append([]int(nil), v...)
	sort.Ints(c)
	return c[len(c)/2]
}

func (p *Policy) remember(obs agent.Observation) {
	for _, b := range obs.Backends {
		for _, s := range b.Servers {
			p.prev[s.Backend+"/"+s.Server] = s.Window.ErrorRate()
		}
	}
}

// WriteMetrics adds the model's counters to /metrics.
func (p *Policy) WriteMetrics(w io.Writer) {
	p.mu.Lock()
	c := p.counters
	p.mu.Unlock()
	promtext.Counter(w, "hapilot_llm_calls_total", "Model calls made.", c.calls)
	promtext.Counter(w, "hapilot_llm_gated_steps_total", "Steps that made no call: nothing to ask about.", c.gated)
	promtext.Counter(w, "hapilot_llm_invalid_replies_total", "Replies that failed validation.", c.invalid)
	promtext.Counter(w, "hapilot_llm_http_errors_total", "Calls that failed at HTTP or in Ollama.", c.httpErrors)
	promtext.Counter(w, "hapilot_llm_deadline_misses_total", "Calls that overran the deadline.", c.deadlineMisses)
	promtext.Counter(w, "hapilot_llm_fallbacks_total", "Steps decided by the fallback policy.", c.fallbacks)
	promtext.Counter(w, "hapilot_llm_prompt_tokens_total", "Prompt tokens spent.", c.promptTokens)
	promtext.Counter(w, "hapilot_llm_completion_tokens_total", "Completion tokens spent.", c.completionTokens)
	promtext.Counter(w, "hapilot_llm_total_duration_seconds_total", "Ollama's total_duration, summed.", c.totalMs/1000)
	promtext.Counter(w, "hapilot_llm_load_duration_seconds_total", "Ollama's load_duration, summed.", c.loadMs/1000)
}
