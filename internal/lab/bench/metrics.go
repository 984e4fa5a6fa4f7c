package bench

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"slices"
	"sort"
	"time"

	"github.com/hapilot/hapilot/agent"
	"github.com/hapilot/hapilot/internal/lab/fleet"
	"github.com/hapilot/hapilot/internal/lab/scenario"
)

// The study's metrics (Chauhan & Pendyala, "Benchmarking LLM-Guided
// Control-Plane Policies for Backend Fault Isolation in HAProxy", 2026),
// as docs/reference/metrics.md defines them, computed from what the clients
// saw, HAProxy's own record of each server's state, and the agent's audit
// log. A value that does not apply (no faulty server, no agent, no drain)
// is nil, written null and printed "-", never a made-up zero.

// Truth is what a run is scored against.
type Truth struct {
	Servers   []string // every server of the backend
	Faulty    []string // the truly faulty set
	EndFaulty []string // the set that should be out of rotation at the end
	Steps     int
	Interval  time.Duration
	Heal      time.Duration // when the faults healed, from the load's start; 0 never
}

// Localisation is how well the drains found the faulty set.
type Localisation struct {
	TP, FP, FN int
	Precision  *float64 `json:"precision"` // nil: nothing drained
	Recall     *float64 `json:"recall"`    // nil: no faulty server
	F1         *float64 `json:"f1"`
	// EverExact: at some step's end the drained set equalled the faulty
	// set (nil with no faulty server).
	EverExact *bool `json:"ever_exact"`
	// EndCorrect: at the end of the run the drained set equals EndFaulty.
	EndCorrect bool `json:"end_correct"`
	// Flips per slot: changes of drained state, averaged over the faulty
	// and over the healthy servers (nil: no such server).
	FlipsFaulty  *float64       `json:"flips_per_faulty_slot"`
	FlipsHealthy *float64       `json:"flips_per_healthy_slot"`
	Flips        map[string]int `json:"flips"`
	// ResolutionS: seconds from the load's start until the drained set
	// first equalled the faulty set (nil: never, or no faulty server).
	ResolutionS *float64 `json:"time_to_resolution_s"`
	// ReadmitS: seconds from the heal until every healed server that was
	// drained serves again (nil: no heal, or not back by the end).
	ReadmitS *float64 `json:"readmitted_after_heal_s"`
	// DetectS: seconds from the fault's onset (the load's start, or the
	// scenario's OnsetStep) to the first change after it of a faulty
	// server's state or weight in HAProxy, whoever made it (nil: none, or
	// no faulty server).
	DetectS *float64 `json:"time_to_detect_s"`
	// DrainedAtEnd lists the servers out of rotation when the run ended.
	DrainedAtEnd []string `json:"drained_at_end"`
}

// Localise scores a run's drain timeline against the truth.
func Localise(tl map[string][]scenario.Transition, t Truth) Localisation {
	faulty := set(t.Faulty)
	l := Localisation{Flips: map[string]int{}}
	ever := map[string]bool{}
	for _, s := range t.Servers {
		for _, tr := range tl[s] {
			if tr.Drained {
				ever[s] = true
			}
		}
		l.Flips[s] = len(tl[s])
	}
	for _, s := range t.Servers {
		switch {
		case ever[s] && faulty[s]:
			l.TP++
		case ever[s]:
			l.FP++
		case faulty[s]:
			l.FN++
		}
	}
	if l.TP+l.FP > 0 {
		l.Precision = ptr(float64(l.TP) / float64(l.TP+l.FP))
	}
	if len(faulty) > 0 {
		l.Recall = ptr(float64(l.TP) / float64(l.TP+l.FN))
		l.F1 = ptr(2 * float64(l.TP) / float64(2*l.TP+l.FP+l.FN))
	}

	var ff, fh []float64
	for _, s := range t.Servers {
		if faulty[s] {
			ff = append(ff, float64(l.Flips[s]))
		} else {
			fh = append(fh, float64(l.Flips[s]))
		}
	}
	l.FlipsFaulty, l.FlipsHealthy = mean(ff), mean(fh)

	l.DrainedAtEnd = drainedAt(tl, t.Servers, time.Duration(math.MaxInt64))
	l.EndCorrect = slices.Equal(l.DrainedAtEnd, sorted(t.EndFaulty))

	if len(faulty) > 0 {
		exact := false
		for k := 1; k <= t.Steps; k++ {
			if slices.Equal(drainedAt(tl, t.Servers, time.Duration(k)*t.Interval), sorted(t.Faulty)) {
				exact = true
				break
			}
		}
		l.EverExact = &exact
		for _, at := range changeTimes(tl) {
			if slices.Equal(drainedAt(tl, t.Servers, at), sorted(t.Faulty)) {
				l.ResolutionS = ptr(at.Seconds())
				break
			}
		}
	}

	if t.Heal > 0 {
		var back time.Duration
		ok := true
		for s := range faulty {
			if isDrained(tl[s], time.Duration(math.MaxInt64)) {
				ok = false // still (or again) out at the end
				break
			}
			last := t.Heal // serving since the heal unless it returned later
			for _, tr := range tl[s] {
				if tr.At > t.Heal && !tr.Drained {
					last = tr.At
				}
			}
			back = max(back, last-t.Heal)
		}
		if ok {
			l.ReadmitS = ptr(back.Seconds())
		}
	}
	return l
}

// isDrained is a server's drained state at time at.
func isDrained(tl []scenario.Transition, at time.Duration) bool {
	d := false
	for _, tr := range tl {
		if tr.At > at {
			break
		}
		d = tr.Drained
	}
	return d
}

// drainedAt lists, sorted, the servers drained at time at.
func drainedAt(tl map[string][]scenario.Transition, servers []string, at time.Duration) []string {
	out := []string{}
	for _, s := range servers {
		if isDrained(tl[s], at) {
			out = append(out, s)
		}
	}
	sort.Strings(out)
	return out
}

// changeTimes lists every transition's time, ascending, once each.
func changeTimes(tl map[string][]scenario.Transition) []time.Duration {
	var out []time.Duration
	for _, trs := range tl {
		for _, tr := range trs {
			out = append(out, tr.At)
		}
	}
	slices.Sort(out)
	return slices.Compact(out)
}

// Client is what the clients saw, and its ratio to the static run.
type Client struct {
	Requests  int     `json:"requests"`
	Client5xx int     `json:"client_5xx"` // HTTP 5xx, plus requests that got no answer
	Failed    int     `json:"no_answer"`
	MeanMs    float64 `json:"latency_mean_ms"`
	P50Ms     float64 `json:"latency_p50_ms"`
	P95Ms     float64 `json:"latency_p95_ms"`
	P99Ms     float64 `json:"latency_p99_ms"`
	// Responses HAProxy sent after retrying, and their p99 (runs with
	// HAProxy's retries).
	RetriedResponses int     `json:"retried_responses,omitempty"`
	RetriedP99Ms     float64 `json:"retried_p99_ms,omitempty"`
	// Against the paired static run (nil for static itself).
	Reduction *float64 `json:"reduction_5xx"` // 1 - 5xx / static 5xx; nil when static had none
	MeanRatio *float64 `json:"latency_mean_ratio"`
	P50Ratio  *float64 `json:"latency_p50_ratio"`
	P95Ratio  *float64 `json:"latency_p95_ratio"`
	P99Ratio  *float64 `json:"latency_p99_ratio"`
}

// ClientView summarises a load result.
func ClientView(r *fleet.Result) Client {
	return Client{
		Requests: r.Completed + r.Failed, Client5xx: r.Err5xx + r.Failed, Failed: r.Failed,
		MeanMs: ms(r.Mean()), P50Ms: ms(r.Quantile(0.50)), P95Ms: ms(r.Quantile(0.95)), P99Ms: ms(r.Quantile(0.99)),
		RetriedResponses: r.Retried, RetriedP99Ms: ms(r.RetriedQuantile(0.99)),
	}
}

// Against fills the ratios to the paired static run.
func (c *Client) Against(static Client) {
	if static.Client5xx > 0 {
		c.Reduction = ptr(1 - float64(c.Client5xx)/float64(static.Client5xx))
	}
	c.MeanRatio, c.P50Ratio = ratio(c.MeanMs, static.MeanMs), ratio(c.P50Ms, static.P50Ms)
	c.P95Ratio, c.P99Ratio = ratio(c.P95Ms, static.P95Ms), ratio(c.P99Ms, static.P99Ms)
}

// Agent is the control loop's own record: its pace and its cost.
type Agent struct {
	StepsPlanned   int      `json:"steps_planned"`
	StepsCompleted int      `json:"steps_completed"`
	CadenceS       *float64 `json:"median_cadence_s"` // median time between steps
	DeadlineMisses int      `json:"deadline_misses"`
	// TimeToActionS: seconds from the load's start to the start of the
	// step that sent HAProxy the agent's first command (nil: it never
	// acted).
	TimeToActionS     *float64 `json:"time_to_action_s"`
	Commands          int      `json:"commands"`
	PromptTokens      int      `json:"prompt_tokens"`
	CompletionTokens  int      `json:"completion_tokens"`
	PromptPerStep     float64  `json:"prompt_tokens_per_step"`
	CompletionPerStep float64  `json:"completion_tokens_per_step"`
	// AvoidedPer1kTokens: client 5xx avoided (static minus this run) per
	// 1,000 completion tokens (nil: no tokens spent).
	AvoidedPer1kTokens *float64 `json:"failed_avoided_per_1k_completion_tokens"`
	// ModelActions, for the LLM policy: the model's own actions beyond its
	// floor (in the step's model_plan, on a server its floor leaves alone) that the
	// guardrails accepted, in step order. ModelHealthyDrains: those of
	// them that drained a server the run's truth holds healthy (Score);
	// nil for a policy with no model, which is how a run read back from
	// its JSON (where no actions leave ModelActions out) tells.
	ModelActions       []ModelAction `json:"model_actions,omitempty"`
	ModelHealthyDrains *int          `json:"model_healthy_drains,omitempty"`
}

// ModelAction is one of the model's own actions beyond the floor.
type ModelAction struct {
	AtS    float64    `json:"at_s"`
	Kind   agent.Kind `json:"kind"`
	Server string     `json:"server"`
}

// auditRecord is the part of an audit line the metrics read.
type auditRecord struct {
	// Type is the line's event type: the metrics read the steps only
	// (the agent's --audit-steps; the other events share the file).
	Type         string                     `json:"type"`
	Time         time.Time                  `json:"time"`
	Commands     []struct{ Command string } `json:"commands"`
	PolicyReport struct {
		DeadlineMiss bool `json:"deadline_miss"`
		Call         *struct {
			PromptTokens     int `json:"prompt_tokens"`
			CompletionTokens int `json:"completion_tokens"`
		} `json:"call"`
		// The LLM policy's (agent/policy/llm.Report): the floor's plan,
		// and the model's actions that go on.
		Floor     agent.Plan `json:"floor"`
		ModelPlan agent.Plan `json:"model_plan"`
		Called    *bool      `json:"called"`
	} `json:"policy_report"`
	Verdicts []agent.Verdict `json:"verdicts"`
}

// AgentView reads an audit log in one pass: the steps that began within
// the run [start, start+steps*interval) are the run's, and their commands
// are the marks on its charts.
func AgentView(audit io.Reader, start time.Time, steps int, interval time.Duration) (Agent, []ActionMark, error) {
	a := Agent{StepsPlanned: steps}
	marks := []ActionMark{}
	end := start.Add(time.Duration(steps) * interval)
	var times []time.Time
	sc := bufio.NewScanner(audit)
	sc.Buffer(make([]byte, 1<<20), 64<<20)
	for n := 1; sc.Scan(); n++ {
		var r auditRecord
		if err := json.Unmarshal(sc.Bytes(), &r); err != nil {
			return a, nil, fmt.Errorf("audit line %d: %w", n, err)
		}
		if r.Type != "" && r.Type != "step" {
			continue
		}
		if r.Time.Before(start) || !r.Time.Before(end) {
			continue
		}
		times = append(times, r.Time)
		for _, cmd := range r.Commands {
			marks = append(marks, ActionMark{AtS: r.Time.Sub(start).Seconds(), Command: cmd.Command})
		}
		if len(r.Commands) > 0 {
			a.Commands += len(r.Commands)
			if a.TimeToActionS == nil {
				a.TimeToActionS = ptr(r.Time.Sub(start).Seconds())
			}
		}
		if r.PolicyReport.DeadlineMiss {
			a.DeadlineMisses++
		}
		if c := r.PolicyReport.Call; c != nil {
			a.PromptTokens += c.PromptTokens
			a.CompletionTokens += c.CompletionTokens
		}
		if r.PolicyReport.Called != nil && a.ModelActions == nil {
			a.ModelActions = []ModelAction{} // the LLM policy's report: a model decides
		}
		// As the soak's agent path counts them (internal/lab/soak): the
		// model's actions on servers the floor's plan leaves alone.
		floor := map[agent.Key]bool{}
		for _, f := range r.PolicyReport.Floor {
			floor[f.Key()] = true
		}
		model := map[agent.ActionID]bool{}
		for _, m := range r.PolicyReport.ModelPlan {
			if !floor[m.Key()] {
				model[m.ID()] = true
			}
		}
		for _, v := range r.Verdicts {
			if v.Accepted && model[v.Applied.ID()] {
				a.ModelActions = append(a.ModelActions, ModelAction{AtS: r.Time.Sub(start).Seconds(), Kind: v.Applied.Kind, Server: v.Applied.Server})
			}
		}
	}
	if err := sc.Err(); err != nil {
		return a, nil, fmt.Errorf("audit: %w", err)
	}
	a.StepsCompleted = len(times)
	if a.StepsCompleted > 0 {
		a.PromptPerStep = float64(a.PromptTokens) / float64(a.StepsCompleted)
		a.CompletionPerStep = float64(a.CompletionTokens) / float64(a.StepsCompleted)
	}
	var gaps []float64
	for i := 1; i < len(times); i++ {
		gaps = append(gaps, times[i].Sub(times[i-1]).Seconds())
	}
	if len(gaps) > 0 {
		sort.Float64s(gaps)
		a.CadenceS = ptr(gaps[len(gaps)/2])
	}
	return a, marks, nil
}

// Score counts the model's own drains of servers not in faulty
// (ModelHealthyDrains), for a run where a model decided.
func (a *Agent) Score(faulty []string) {
	if a.ModelActions == nil {
		return
	}
	bad := set(faulty)
	n := 0
	for _, m := range a.ModelActions {
		if m.Kind == agent.Drain && !bad[m.Server] {
			n++
		}
	}
	a.ModelHealthyDrains = &n
}

// Avoided fills the failed requests avoided per 1,000 completion tokens.
func (a *Agent) Avoided(c, static Client) {
	if a.CompletionTokens > 0 {
		a.AvoidedPer1kTokens = ptr(float64(static.Client5xx-c.Client5xx) / (float64(a.CompletionTokens) / 1000))
	}
}

func ptr[T any](v T) *T { return &v }

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

func ratio(a, b float64) *float64 {
	if b <= 0 {
		return nil
	}
	return ptr(a / b)
}

func mean(v []float64) *float64 {
	if len(v) == 0 {
		return nil
	}
	s := 0.0
	for _, x := range v {
		s += x
	}
	return ptr(s / float64(len(v)))
}

func set(v []string) map[string]bool {
	m := map[string]bool{}
	for _, s := range v {
		m[s] = true
	}
	return m
}

func sorted(v []string) []string {
	out := append([]string{}, v...)
	sort.Strings(out)
	return out
}
