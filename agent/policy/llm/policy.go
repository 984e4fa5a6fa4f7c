package llm

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"sort"
	"sync"
	"time"

	"github.com/hapilot/hapilot/agent"
	"github.com/hapilot/hapilot/agent/policy/llm/modelapi"
	"github.com/hapilot/hapilot/agent/policy/llm/prompt"
	"github.com/hapilot/hapilot/agent/policy/rules"
	"github.com/hapilot/hapilot/internal/lib/promtext"
	"github.com/rs/zerolog"
)

// Report is what one step of the policy did, for the audit log.
type Report struct {
	Called     bool     `json:"called"`
	Gated      string   `json:"gated,omitempty"` // why the model was not called
	Candidates []string `json:"candidates,omitempty"`
	// Spent are the servers left out of the candidates because the
	// model's own word drained them within ZoneEvery (drainedLately):
	// the model is not asked about them until then, each with why.
	Spent []string `json:"spent,omitempty"`
	// Floor is what the rules decided on their own this step: it applies
	// whatever the model says.
	Floor        agent.Plan `json:"floor,omitempty"`
	Call         *Call      `json:"call,omitempty"`
	Proposed     agent.Plan `json:"proposed,omitempty"`    // the model's plan before the checks
	ModelPlan    agent.Plan `json:"model_plan,omitempty"`  // the model's actions that go on, confirmed
	Pending      []string   `json:"pending,omitempty"`     // proposals awaiting confirmation
	Held         []string   `json:"held,omitempty"`        // undo proposals refused by the hold
	Unsupported  []string   `json:"unsupported,omitempty"` // drains or weight cuts the windows do not support, each with why
	Fallback     string     `json:"fallback,omitempty"`    // why only the floor acted
	DeadlineMiss bool       `json:"deadline_miss,omitempty"`
	ThinkNote    string     `json:"think_note,omitempty"`
	PromptNote   string     `json:"prompt_note,omitempty"`
}

// Policy asks the model, under every protection. The rules are its floor:
// their drains always apply, and the model decides what they cannot
// decide well (the grey zone, latency below their test, overload, when a
// drained server should be probed, several faults at once).
//
// The exported fields are set before Start and not changed after. Four
// mutexes split the rest, so that /metrics and /status never wait for a
// step, nor a step for the life cycle. Lock order: mu before lmu and fmu,
// fmu before cmu; Model's own mutex is taken under any of them and takes
// none.
type Policy struct {
	Model *Model
	// Floor is the policy whose plan always applies: the rules as
	// --policy rules runs them (rules.NewPolicy, or the daemon's per-backend
	// rules), their sequential test fed every observation, the steps' and
	// the loop's evidence checks' between them (Hooks' Evidence is the
	// floor's). With the model out of the way, the policy decides exactly
	// as the rules do. The agent always sets it; none (a nil Decider) is
	// for the lab's rerun of the study's loop
	// (internal/lab/bench.StudyLoop).
	Floor  agent.Policy
	Config Config
	Log    zerolog.Logger
	Now    func() time.Time
	// WatchEvery is how often a ready model is checked for still being
	// loaded (/api/ps): someone else's keep_alive or a restart of Ollama
	// unloads it, and it is then loaded again before a step needs it.
	WatchEvery time.Duration
	// Admit, when set, is asked once Ollama answers whether the model may
	// act (its calibration record); a refusal keeps the floor alone in
	// charge, with the reason in /status.
	Admit func(ctx context.Context) error
	// NoEvidenceCheck lets the model's drains and weight cuts run
	// without the windows' support (supported). No setting of the agent
	// sets it: only the lab's rerun of the study's unguarded loop does,
	// to measure what the check buys.
	NoEvidenceCheck bool

	// Set by New, never changed.
	rules  rules.Config  // the operator's: the suspects, FleetWide and evidence are judged by it
	loose  *rules.Policy // the candidates' test: the rules' sequential one, looser (candidates.go)
	looseH float64       // its threshold
	// ownLat: each server's own latency baseline, fed every evidence
	// check: a latency candidate must be slower than its own usual, not
	// only than its peers (candidates.go).
	ownLat *rules.OwnLatency

	flagMu sync.Mutex         // guards flags: the evidence hook and Decide write them
	flags  map[agent.Key]flag // what the candidates' test flagged, and when (candidates.go)
	ctx    context.Context    // the policy's life: Close ends it
	cancel context.CancelFunc
	wg     sync.WaitGroup // the life-cycle goroutine and calls in flight

	// mu is held by Decide for its whole step (one step at a time), and
	// by the life cycle to switch thinking off.
	mu       sync.Mutex              // guards pending, own, asked, think, thinkOff, shown, history, judge, report
	pending  map[proposal]int        // consecutive proposals of each action
	own      map[agent.Key]time.Time // when the model last drained each server on its own word (applied)
	asked    map[agent.Key]bool      // the drains on its own word it planned last step (remember)
	think    modelapi.Think          // the mode in force
	thinkOff int                     // steps left with thinking forced off
	shown    int                     // servers per backend the prompt lists in full
	history  []string                // the model's decisions and their outcomes
	judge    []agent.Action          // last step's model actions, to judge now
	brief    map[agent.Key]string    // this step's errors candidates in a few words (candidates)
	report   Report

	lmu  sync.Mutex // guards life: the life cycle writes it, steps and /status read it
	life lifeState

	fmu      sync.Mutex // guards inflight: the call in flight, which may outlive its step
	inflight *flight

	cmu      sync.Mutex // guards counters, read by /metrics and /status while a step waits
	counters counters
}

type counters struct {
	calls, gated, invalid, httpErrors, deadlineMisses, fallbacks, busy, late, promptTokens, completionTokens, loads uint64
	totalMs, loadMs                                                                                                 float64
}

// Life is where the model stands.
type Life string

const (
	LifeUnknown     Life = "unknown" // until Start
	LifeInspecting  Life = "inspecting"
	LifeLoading     Life = "loading"
	LifeReady       Life = "ready"
	LifeUnreachable Life = "unreachable"
	LifeRefused     Life = "refused" // Admit said no
)

// lifeState is the model's life and what it knows of the model.
type lifeState struct {
	state Life
	since time.Time
	err   string
	info  modelapi.Info
	// admitted: Admit passed the model (its calibration record).
	admitted bool
	// history is the last maxLifeHistory changes of state, oldest
	// first: /status shows how the model got where it is (unloaded from
	// outside and loaded again, say).
	history []LifeChange
}

// LifeChange is the model entering a state.
type LifeChange struct {
	State Life      `json:"state"`
	At    time.Time `json:"at"`
	Error string    `json:"error,omitempty"`
}

// maxLifeHistory bounds lifeState.history.
const maxLifeHistory = 16

type flight struct {
	started time.Time
	done    chan callResult
}

type callResult struct {
	plan agent.Plan
	call Call
	err  error
}

// New returns the LLM policy. Start warms the model; Close ends every call and the warm-up.
func New(m *Model, floor agent.Policy, rc rules.Config, cfg Config, log zerolog.Logger) *Policy {
	ctx, cancel := context.WithCancel(context.Background())
	return &Policy{
		Model: m, Floor: floor, Config: cfg, Log: log, Now: time.Now, WatchEvery: 30 * time.Second,
		pending: map[proposal]int{}, own: map[agent.Key]time.Time{}, asked: map[agent.Key]bool{}, think: cfg.Think, shown: cfg.MaxShown,
		// The operator's rules find the candidates (their sequential test,
		// looser: candidates.go) and say whether a drained server's own
		// window is healthy again (mayUndo).
		rules: rc,
		loose: rules.New(candidateConfig(rc)), looseH: candidateConfig(rc).Threshold(), flags: map[agent.Key]flag{},
		ownLat: rules.NewOwnLatency(rc),
		ctx:    ctx, cancel: cancel, life: lifeState{state: LifeUnknown},
	}
}

func (*Policy) Name() string { return "llm" }

// Hooks is the policy as the loop runs it: its decision, needs, report,
// status, metrics and life cycle, and its floor's evidence test. The
// loop checks that test between ticks, which feeds the floor's
// sequential test as it feeds --policy rules (and the candidates' test
// the same observations), and steps at once when the
// rules condemn a server: the floor's drain does not wait for the tick.
// The model is asked on such a step only if the gate lets it, as on any.
func (p *Policy) Hooks() agent.Policy {
	hooks := agent.Policy{Decider: p, Needs: p.Needs(), Report: p.Report, Status: p.PolicyStatus,
		Metrics: p.WriteMetrics, Start: p.Start, Close: p.Close, Notes: p.Floor.Notes}
	if p.Floor.Evidence != nil {
		hooks.Evidence = p.evidenceHook
	}
	return hooks
}

// Needs: as the rules, a backend of N servers may lose up to N/3 servers
// a step, floor and capacity permitting.
func (p *Policy) Needs() agent.Needs {
	return agent.Needs{DrainsPer: 3}
}

// LastReport is the last step's report: what calibration scores and
// shadow mode compares.
func (p *Policy) LastReport() Report {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.report
}

// Report is LastReport as the loop's audit hook takes it.
func (p *Policy) Report() any { return p.LastReport() }

// Close stops the warm-up and every call in flight, and waits for them.
func (p *Policy) Close() {
	p.cancel()
	p.wg.Wait()
}

// Decide runs one step.
func (p *Policy) Decide(ctx context.Context, obs agent.Observation) (agent.Plan, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.report = Report{}
	p.judgeOutcomes(obs)
	p.applied(obs)

	floor, err := p.floorPlan(ctx, obs)
	if err != nil {
		return nil, err
	}
	cands := p.candidates(ctx, obs, floor)
	for k, c := range cands {
		// Nothing the model says of a server its word drained lately
		// may cut it (supported), so it is not asked: in the
		// scoreboard's zone-days, the stand-in's emulated capable
		// profile was asked about such a zone server, a candidate again
		// after its re-admission, 67.9 times a server-day, every drain
		// it proposed refused.
		if why := p.drainedLately(k); why != "" {
			delete(cands, k)
			p.report.Spent = append(p.report.Spent, k.String()+": "+why)
			continue
		}
		p.report.Candidates = append(p.report.Candidates, k.String()+" "+c.Why)
	}
	sort.Strings(p.report.Candidates)
	sort.Strings(p.report.Spent)
	if p.Config.Gate != GateAlways && len(cands) == 0 && len(p.pending) == 0 {
		p.report.Gated = "nothing for the model: no candidate beyond the rules' own and nothing awaiting confirmation"
		p.count(func(c *counters) { c.gated++ })
		return floor, nil
	}
	if why := p.unusable(); why != "" {
		return p.fallback(floor, why, false), nil
	}
	think := p.thinkFor()
	in, note := p.promptInput(obs, cands, floor, think)
	p.report.PromptNote = note
	text := prompt.Render(in)
	res, err := p.call(ctx, text, p.schema(in), think)
	if err != nil {
		var late overran
		isLate := errors.As(err, &late)
		p.costOfThinking(think, Call{}, isLate)
		return p.fallback(floor, err.Error(), isLate), nil
	}
	p.report.Called, p.report.Call = true, &res.call
	p.costOfThinking(think, res.call, false)
	if res.err == nil && in.Style == prompt.Numbered {
		var named agent.Plan
		if named, res.err = in.Refs().Resolve(res.plan); res.err != nil {
			res.err = fmt.Errorf("llm: invalid reply from %s: %w", p.Config.Model, res.err)
			// The reply parsed, so its text is not kept: the plan as
			// parsed, references and all, stands for it.
			res.call.Raw, res.call.Error = fmt.Sprint(res.plan), res.err.Error()
		}
		res.plan = named
	}
	if res.err != nil {
		p.failed(res)
		return p.fallback(floor, res.err.Error(), false), nil
	}
	p.report.Proposed = res.plan
	mine := p.confirm(obs, p.supported(obs, res.plan, cands, floor))
	p.remember(floor, mine)
	p.report.ModelPlan = mine
	p.judge = mine
	return merge(floor, mine), nil
}

func (p *Policy) floorPlan(ctx context.Context, obs agent.Observation) (agent.Plan, error) {
	if p.Floor.Decider == nil {
		return nil, nil
	}
	plan, err := p.Floor.Decide(ctx, obs)
	if err != nil {
		return nil, fmt.Errorf("llm: the rules' floor: %w", err)
	}
	p.report.Floor = plan
	return plan, nil
}

// merge puts the model's actions after the floor's, one per server.
func merge(floor, model agent.Plan) agent.Plan {
	out := append(agent.Plan(nil), floor...)
	seen := map[agent.Key]bool{}
	for _, a := range floor {
		seen[a.Key()] = true
	}
	for _, a := range model {
		if !seen[a.Key()] {
			out = append(out, a)
		}
	}
	return out
}

func (p *Policy) count(f func(*counters)) {
	p.cmu.Lock()
	defer p.cmu.Unlock()
	f(&p.counters)
}

// fallback is a step the model did not decide: the floor alone acts.
func (p *Policy) fallback(floor agent.Plan, why string, overran bool) agent.Plan {
	p.report.Fallback, p.report.DeadlineMiss = why, overran
	p.count(func(c *counters) {
		c.fallbacks++
		if overran {
			c.deadlineMisses++
		}
	})
	p.Log.Warn().Str("why", why).Int("floor_actions", len(floor)).Msg("the model did not decide this step; the rules' floor acts")
	// Proposals awaiting confirmation lapse: they were not repeated.
	clear(p.pending)
	return floor
}

// failed counts a call that came back unusable, and learns from it.
func (p *Policy) failed(res callResult) {
	switch {
	case errors.Is(res.err, modelapi.ErrThinkUnsupported):
		p.think = modelapi.ThinkOff
		p.report.ThinkNote = "the model does not support thinking: off from now on"
	case errors.Is(res.err, modelapi.ErrContextOverflow):
		p.shown = max(2, p.shown/2)
		p.report.PromptNote = fmt.Sprintf("the prompt did not fit the model's context: %d servers a backend in full from now on", p.shown)
	}
	p.count(func(c *counters) {
		if res.call.Raw != "" || errors.Is(res.err, modelapi.ErrCutShort) || errors.Is(res.err, modelapi.ErrUnfinished) || errors.Is(res.err, modelapi.ErrContextOverflow) {
			c.invalid++
		} else {
			c.httpErrors++
		}
	})
}

// thinkFor is the think mode of this step's call.
func (p *Policy) thinkFor() modelapi.Think {
	if p.thinkOff > 0 {
		p.thinkOff--
		if p.thinkOff == 0 {
			p.report.ThinkNote = "thinking allowed again from the next step"
		}
		return modelapi.ThinkOff
	}
	return p.think
}

// costOfThinking switches thinking off for ThinkRetry steps after a call
// that showed it costs too much, by what can be observed: the call
// overran its deadline, was cut at num_predict, or spent more completion
// tokens than TokenBudget.
func (p *Policy) costOfThinking(think modelapi.Think, call Call, overran bool) {
	if think == modelapi.ThinkOff || p.Config.ThinkRetry <= 0 {
		return
	}
	var why string
	switch {
	case overran:
		why = "the call overran its deadline"
	case call.DoneReason == "length":
		why = fmt.Sprintf("the call was cut at num_predict %d", call.NumPredict)
	case call.CompletionTokens > p.Config.TokenBudget:
		why = fmt.Sprintf("the call spent %d completion tokens (budget %d)", call.CompletionTokens, p.Config.TokenBudget)
	default:
		return
	}
	p.thinkOff = p.Config.ThinkRetry
	p.report.ThinkNote = fmt.Sprintf("thinking (%s) off for %d steps: %s", think, p.thinkOff, why)
	p.Log.Warn().Str("think", string(think)).Str("why", why).Msg("switching thinking off")
}

// supported drops drains and weight cuts of servers the windows do not
// flag: the model proposes, the data must agree. A model that drains
// healthy servers therefore cannot do worse than the rules. A server
// flagged for its errors alone must also pass the operator's rules'
// FleetWide check, against the peers the floor and the loose test have
// not set apart this step.
func (p *Policy) supported(obs agent.Observation, plan agent.Plan, cands map[agent.Key]rules.Suspect, floor agent.Plan) agent.Plan {
	apart, floorKeys := map[agent.Key]bool{}, map[agent.Key]bool{}
	for _, a := range floor {
		apart[a.Key()], floorKeys[a.Key()] = true, true
	}
	for k, c := range cands {
		if slices.Contains(c.Signals, rules.SignalErrors) {
			apart[k] = true
		}
	}
	var out agent.Plan
	for _, a := range plan {
		cut := a.Kind == agent.Drain
		b, s := obs.Find(a.Backend, a.Server)
		if a.Kind == agent.SetWeight && s != nil && a.Weight < s.State.Weight {
			cut = true
		}
		if cut && !p.NoEvidenceCheck {
			c, flagged := cands[a.Key()]
			why, lately := "", ""
			if !floorKeys[a.Key()] {
				lately = p.drainedLately(a.Key())
			}
			switch {
			case lately != "":
				// a drain or a weight cut: the model's word has acted
				// on it once in ZoneEvery
				why = lately
			case !flagged:
				why = "the windows do not flag it"
			case c.Only(rules.SignalErrors):
				why = p.rules.FleetWide(b, s, apart)
			case a.Kind == agent.Drain && c.Only(rules.SignalLatency) && !p.ownLat.Learned(a.Key()):
				// Slower than its peers, but with no history of its
				// own: at an agent's start, a fleet whose servers
				// simply differ shows several such servers, and a
				// model drained them (docs/lab/llm-scoreboard.md). A
				// weight cut, which keeps the server serving, may act.
				why = "slow against its peers, with no history of its own answer times yet (" + rules.LatencyLearn.String() + "): a drain waits for it"
			}
			if why != "" {
				p.report.Unsupported = append(p.report.Unsupported, proposalOf(a).String()+": "+why)
				continue
			}
		}
		out = append(out, a)
	}
	return out
}

// applied records, from this step's observation, the drains the model
// proposed on its own word last step that took (the server no longer
// serves): a drain the guardrails refused does not count.
func (p *Policy) applied(obs agent.Observation) {
	for k := range p.asked {
		if _, s := obs.Find(k.Backend, k.Server); s != nil && !s.Serving() {
			p.own[k] = p.Now()
		}
	}
	clear(p.asked)
	for k, at := range p.own {
		if p.Now().Sub(at) >= p.rules.ZoneEvery {
			delete(p.own, k)
		}
	}
}

// remember keeps the drains in the model's plan that the floor did not
// make, for applied to check at the next step.
func (p *Policy) remember(floor, mine agent.Plan) {
	for _, a := range mine {
		if a.Kind == agent.Drain && !slices.ContainsFunc(floor, func(f agent.Action) bool { return f.Key() == a.Key() }) {
			p.asked[a.Key()] = true
		}
	}
}

// drainedLately says why a drain on the model's own word is refused: the
// model drained the server so within ZoneEvery. The rules drain a server
// in the zone (above healthy, not shown degraded) once a ZoneEvery and
// then leave it serving, never cycled; without their evidence, the
// model's word may drain a server no more often (a candidate stays one
// after its re-admission, and the stand-in's emulated capable profile drained one zone server 81
// times in a simulated day: hapilot-bench soak scoreboard). "" when it
// may.
func (p *Policy) drainedLately(k agent.Key) string {
	at, ok := p.own[k]
	if !ok || p.Now().Sub(at) >= p.rules.ZoneEvery {
		return ""
	}
	return fmt.Sprintf("drained on the model's word %s ago: without the rules' evidence a server is drained so at most once in %s, never cycled",
		p.Now().Sub(at).Round(time.Second), p.rules.ZoneEvery)
}

// proposal names a proposal across steps: the same action (verb and
// server) with the same weight proposed again is the same proposal.
type proposal struct {
	id     agent.ActionID
	weight int
}

func proposalOf(a agent.Action) proposal { return proposal{a.ID(), a.Weight} }

func (p proposal) String() string { return fmt.Sprintf("%s %d", p.id, p.weight) }

// confirm keeps the actions proposed in Config.Confirm consecutive steps,
// and refuses undoing a recent drain without evidence.
func (p *Policy) confirm(obs agent.Observation, plan agent.Plan) agent.Plan {
	seen := map[proposal]bool{}
	var out agent.Plan
	for _, a := range plan {
		k := proposalOf(a)
		if seen[k] {
			continue
		}
		seen[k] = true
		p.pending[k]++
		if p.pending[k] < p.Config.Confirm {
			p.report.Pending = append(p.report.Pending, k.String())
			continue
		}
		if a.Kind == agent.Ready && !p.mayUndo(obs, a) {
			p.report.Held = append(p.report.Held, k.String())
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
		delete(p.pending, proposalOf(a))
	}
	return out
}

// mayUndo: a drain older than MinHold may be undone on the model's word
// (which, for a drained server, only asks recovery to probe it); a
// younger one only if the server's own window (the last minute, its
// traffic before the drain included) lies in the rules' healthy region:
// at most max(HealthyFloor, HealthyRatio × the lower median of its
// serving peers' rates), the sequential test's own terms.
func (p *Policy) mayUndo(obs agent.Observation, a agent.Action) bool {
	b, s := obs.Find(a.Backend, a.Server)
	if s == nil || s.Changed == nil {
		return true // the guardrails refuse it anyway
	}
	if obs.Time.Sub(s.Changed.At) >= p.Config.MinHold {
		return true
	}
	if s.Window.Requests < p.rules.MinRequests {
		return false // no traffic since the drain: no evidence either way
	}
	var peers []float64
	for _, v := range b.Servers {
		if v.Server != s.Server && v.Serving() && v.Window.Requests > 0 {
			peers = append(peers, v.Window.ErrorRate())
		}
	}
	median := 0.0
	if len(peers) > 0 {
		sort.Float64s(peers)
		median = peers[(len(peers)-1)/2]
	}
	return s.Window.ErrorRate() <= p.rules.HealthyMax(median)
}

// whys is the candidates as the prompt shows them.
func whys(cands map[agent.Key]rules.Suspect) map[agent.Key]string {
	out := make(map[agent.Key]string, len(cands))
	for k, c := range cands {
		out[k] = c.Why
	}
	return out
}

// judgeOutcomes writes how last step's model actions turned out into the
// history the next prompts show: memory across steps.
func (p *Policy) judgeOutcomes(obs agent.Observation) {
	for _, a := range p.judge {
		k := a.Key()
		outcome := "not in force"
		_, s := obs.Find(a.Backend, a.Server)
		switch why, refused := obs.Refused[k]; {
		case refused:
			outcome = "refused: " + why
		case s != nil && s.Changed != nil:
			outcome = fmt.Sprintf("in force (%s)", s.Changed.Phase)
		case s != nil && a.Kind == agent.Ready && s.Changed == nil:
			outcome = "back to normal"
		}
		p.history = append(p.history, fmt.Sprintf("step %d: %s %s: %s", obs.Cycle-1, a.Kind, k, outcome))
	}
	p.judge = nil
	if n := len(p.history); n > 5 {
		p.history = p.history[n-5:]
	}
}

// promptInput assembles what this call shows, shrunk to fit the model's
// context: fewer servers in full, then only the backend with the most
// candidates (the others get their turn on later steps).
func (p *Policy) promptInput(obs agent.Observation, cands map[agent.Key]rules.Suspect, floor agent.Plan, think modelapi.Think) (prompt.Input, string) {
	pending := map[agent.Key]int{}
	for k, n := range p.pending {
		pending[k.id.Server] = n
	}
	fl := map[agent.Key]string{}
	for _, a := range floor {
		fl[a.Key()] = string(a.Kind)
	}
	in := prompt.Input{Obs: obs, Candidates: whys(cands), Brief: p.brief, Floor: fl, Pending: pending, Confirm: p.Config.Confirm,
		History: p.history, DrainsPer: p.Needs().DrainsPer, MaxShown: p.shown, Style: p.Model.Form()}
	room := p.Model.Room(think)
	fits := func() bool {
		return room <= 0 || p.Model.EstimatePrompt(prompt.Render(in)) <= room
	}
	note := ""
	for !fits() && in.MaxShown > 2 {
		in.MaxShown /= 2
		note = fmt.Sprintf("%d servers a backend in full, to fit the model's context", in.MaxShown)
	}
	if !fits() {
		best, most := "", -1
		for _, b := range in.Shown() {
			n := 0
			for k := range cands {
				if k.Backend == b {
					n++
				}
			}
			if n > most {
				best, most = b, n
			}
		}
		in.Only = map[string]bool{best: true}
		note = "only backend " + best + " this call, to fit the model's context"
	}
	return in, note
}

// schema is the reply schema for the servers this prompt shows and the
// agent may act on.
func (p *Policy) schema(in prompt.Input) []byte {
	if in.Style == prompt.Numbered {
		r := in.Refs()
		return prompt.Schema(r.Backends, r.Servers, r.MaxWeight, p.Config.NumPredict)
	}
	var backends, servers []string
	maxWeight := 1
	shown := map[string]bool{}
	for _, b := range in.Shown() {
		shown[b] = true
		backends = append(backends, b)
	}
	seen := map[string]bool{}
	for _, b := range in.Obs.Backends {
		if !shown[b.Name] {
			continue
		}
		for _, s := range b.Servers {
			if s.Owner != agent.OwnerOperator && !seen[s.Server] {
				seen[s.Server] = true
				servers = append(servers, s.Server)
				maxWeight = max(maxWeight, s.State.Initial)
			}
		}
	}
	return prompt.Schema(backends, servers, maxWeight, p.Config.NumPredict)
}

// overran is a call the step's deadline came before: budget is what the
// step gave it.
type overran struct{ budget time.Duration }

func (o overran) Error() string {
	return fmt.Sprintf("the call overran its %v deadline: it goes on in the background, so a load is not aborted", o.budget.Round(time.Millisecond))
}

// errStopping: the agent stopped during the call.
var errStopping = errors.New("the agent is stopping")

// call asks the model once, never more than one call at a time. The step
// waits for the answer until ctx's deadline, the step's (or the tighter
// --llm-deadline); a call still running then goes on in the background,
// under the policy's life and LoadTimeout, because Ollama aborts a load
// whose request ends. Its late answer keeps the model warm and is
// discarded. The error is an overran past the deadline.
func (p *Policy) call(ctx context.Context, text string, schema []byte, think modelapi.Think) (callResult, error) {
	if p.Config.Deadline > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, p.Config.Deadline)
		defer cancel()
	}
	var budget time.Duration
	if d, ok := ctx.Deadline(); ok {
		budget = d.Sub(p.Now())
	}
	p.fmu.Lock()
	if f := p.inflight; f != nil {
		select {
		case res := <-f.done:
			p.inflight = nil
			p.account(res, true)
		default:
			p.fmu.Unlock()
			p.count(func(c *counters) { c.busy++ })
			return callResult{}, fmt.Errorf("the previous call is still running after %v: not asking again", p.Now().Sub(f.started).Round(time.Second))
		}
	}
	f := &flight{started: p.Now(), done: make(chan callResult, 1)}
	p.inflight = f
	p.fmu.Unlock()
	p.count(func(c *counters) { c.calls++ })
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		cctx, cancel := context.WithTimeout(p.ctx, p.Config.LoadTimeout)
		defer cancel()
		plan, call, err := p.Model.Ask(cctx, text, schema, think)
		f.done <- callResult{plan, call, err}
	}()
	select {
	case res := <-f.done:
		p.fmu.Lock()
		p.inflight = nil
		p.fmu.Unlock()
		p.account(res, false)
		return res, nil
	case <-ctx.Done():
		if errors.Is(ctx.Err(), context.DeadlineExceeded) {
			return callResult{}, overran{budget}
		}
		return callResult{}, errStopping
	}
}

// account adds a call's cost to the counters, and logs a server's
// refusal of the reply schema once, when the call stepped down from it.
func (p *Policy) account(res callResult, late bool) {
	if res.call.SchemaNote != "" {
		p.Log.Warn().Str("model", p.Config.Model).Str("schema", res.call.Schema).Str("why", res.call.SchemaNote).
			Msg("the server refused the reply schema: a simpler form is sent from now on, and the reply is still checked strictly")
	}
	p.count(func(c *counters) {
		c.promptTokens += uint64(res.call.PromptTokens)
		c.completionTokens += uint64(res.call.CompletionTokens)
		c.totalMs += res.call.TotalMs
		c.loadMs += res.call.LoadMs
		if late {
			c.late++
		}
	})
	if late {
		p.Log.Info().Float64("wall_ms", res.call.WallMs).Float64("load_ms", res.call.LoadMs).AnErr("error", res.err).
			Msg("a call that overran its step answered late: discarded")
	}
}

// WriteMetrics adds the model's counters to /metrics. It never waits for
// a call.
func (p *Policy) WriteMetrics(w io.Writer) {
	p.cmu.Lock()
	c := p.counters
	p.cmu.Unlock()
	promtext.Counter(w, "hapilot_llm_calls_total", "Model calls made.", c.calls)
	promtext.Counter(w, "hapilot_llm_gated_steps_total", "Steps that made no call: nothing to ask about.", c.gated)
	promtext.Counter(w, "hapilot_llm_invalid_replies_total", "Replies that failed validation, were cut short, or did not fit the context.", c.invalid)
	promtext.Counter(w, "hapilot_llm_http_errors_total", "Calls that failed at HTTP or in Ollama.", c.httpErrors)
	promtext.Counter(w, "hapilot_llm_deadline_misses_total", "Calls that overran the deadline.", c.deadlineMisses)
	promtext.Counter(w, "hapilot_llm_busy_steps_total", "Steps that did not call because a call was still running.", c.busy)
	promtext.Counter(w, "hapilot_llm_late_replies_total", "Answers that came after their step, discarded.", c.late)
	promtext.Counter(w, "hapilot_llm_fallbacks_total", "Steps in which only the rules' floor acted.", c.fallbacks)
	promtext.Counter(w, "hapilot_llm_loads_total", "Times the model was loaded by the agent's warm-up.", c.loads)
	promtext.Counter(w, "hapilot_llm_prompt_tokens_total", "Prompt tokens spent.", c.promptTokens)
	promtext.Counter(w, "hapilot_llm_completion_tokens_total", "Completion tokens spent.", c.completionTokens)
	promtext.Counter(w, "hapilot_llm_total_duration_seconds_total", "Ollama's total_duration, summed.", c.totalMs/1000)
	promtext.Counter(w, "hapilot_llm_load_duration_seconds_total", "Ollama's load_duration, summed.", c.loadMs/1000)
}
