package llm

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"github.com/hapilot/hapilot/agent"
	"github.com/hapilot/hapilot/haproxy"
	"github.com/hapilot/hapilot/internal/window"
)

// Scenario is one synthetic observation with the answer a sound model
// gives. Expected holds "kind server" entries; an empty set means no
// action is right.
type Scenario struct {
	Name     string
	Obs      agent.Observation
	Expected map[string]bool
	// AnyOf: one action from Expected is enough (two faulty servers, one
	// drain per step).
	AnyOf bool
}

type srvSpec struct {
	req, e5  uint64
	p95      int
	admin    int
	agentAge time.Duration // drained by the agent this long ago
}

func scenarioObs(now time.Time, specs []srvSpec) agent.Observation {
	b := agent.BackendView{Name: "app"}
	for i, sp := range specs {
		name := fmt.Sprintf("srv%d", i+1)
		p95 := sp.p95
		if p95 == 0 {
			p95 = 12
		}
		v := agent.ServerView{Backend: "app", Server: name, Owner: agent.OwnerNone,
			State:  haproxy.ServerState{Backend: "app", Server: name, OpState: haproxy.OpRunning, Weight: 1, Initial: 1, AdminState: sp.admin},
			Window: window.Stats{Backend: "app", Server: name, Requests: sp.req, Err5xx: sp.e5, P50Ms: p95 * 3 / 4, P95Ms: p95, P99Ms: p95 + p95/5}}
		if sp.admin != 0 {
			v.Owner = agent.OwnerOperator
		}
		if sp.agentAge > 0 {
			v.State.AdminState = haproxy.AdminForcedDrain
			v.Owner, v.Changed = agent.OwnerAgent, &agent.Change{Phase: agent.PhaseDrained, At: now.Add(-sp.agentAge)}
		}
		b.Servers = append(b.Servers, v)
	}
	return agent.Observation{Time: now, Lookback: time.Minute, Backends: []agent.BackendView{b}}
}

func oneFaulty(n, faulty int) []srvSpec {
	s := make([]srvSpec, n)
	for i := range s {
		s[i] = srvSpec{req: 3000}
	}
	s[faulty].e5 = 150
	return s
}

// Scenarios are the built-in calibration cases.
func Scenarios(now time.Time) []Scenario {
	set := func(keys ...string) map[string]bool {
		m := map[string]bool{}
		for _, k := range keys {
			m[k] = true
		}
		return m
	}
	noise := make([]srvSpec, 6)
	fleetwide := make([]srvSpec, 6)
	latency := make([]srvSpec, 5)
	for i := range noise {
		noise[i] = srvSpec{req: 3000, e5: uint64(4 + i%3)}
		fleetwide[i] = srvSpec{req: 3000, e5: uint64(85 + 5*(i%3))}
	}
	for i := range latency {
		latency[i] = srvSpec{req: 3000}
	}
	latency[1].p95 = 240
	two := oneFaulty(6, 2)
	two[5].e5 = 140
	recovered := oneFaulty(4, 0)
	recovered[0] = srvSpec{req: 400, agentAge: 10 * time.Minute}
	operator := oneFaulty(5, 3)
	operator[1] = srvSpec{req: 3000, e5: 300, admin: haproxy.AdminForcedMaint}
	quiet := []srvSpec{{}, {}, {}}
	return []Scenario{
		{Name: "one faulty of 3", Obs: scenarioObs(now, oneFaulty(3, 2)), Expected: set("drain srv3")},
		{Name: "one faulty of 5", Obs: scenarioObs(now, oneFaulty(5, 1)), Expected: set("drain srv2")},
		{Name: "one faulty of 7", Obs: scenarioObs(now, oneFaulty(7, 5)), Expected: set("drain srv6")},
		{Name: "one faulty of 9", Obs: scenarioObs(now, oneFaulty(9, 8)), Expected: set("drain srv9")},
		{Name: "two faulty of 6", Obs: scenarioObs(now, two), Expected: set("drain srv3", "drain srv6"), AnyOf: true},
		{Name: "healthy with 0.2% noise", Obs: scenarioObs(now, noise), Expected: set()},
		{Name: "fleet-wide 3%", Obs: scenarioObs(now, fleetwide), Expected: set()},
		{Name: "latency only: srv2 20x slower", Obs: scenarioObs(now, latency), Expected: set("drain srv2", "set_weight srv2"), AnyOf: true},
		{Name: "recovered server drained 10 min ago", Obs: scenarioObs(now, recovered), Expected: set("ready srv1")},
		{Name: "faulty server beside an operator's maint", Obs: scenarioObs(now, operator), Expected: set("drain srv4")},
		{Name: "no traffic yet", Obs: scenarioObs(now, quiet), Expected: set()},
	}
}

// ScenarioResult is one case of the scorecard.
type ScenarioResult struct {
	Name       string   `json:"name"`
	Valid      bool     `json:"valid"`
	Actions    []string `json:"actions"`
	TP         int      `json:"tp"`
	FP         int      `json:"fp"`
	FN         int      `json:"fn"`
	Collateral int      `json:"collateral"` // healthy servers it would drain
	Call       Call     `json:"call"`
}

// Scorecard is a model's calibration result.
type Scorecard struct {
	Model        string           `json:"model"`
	Digest       string           `json:"digest"`
	Time         time.Time        `json:"time"`
	Think        Think            `json:"think"`
	Scenarios    []ScenarioResult `json:"scenarios"`
	ValidRate    float64          `json:"valid_rate"`
	Precision    float64          `json:"precision"`
	Recall       float64          `json:"recall"`
	Collateral   int              `json:"collateral"`
	Score        float64          `json:"score"` // F1 minus 0.25 per collateral drain
	MedianMs     float64          `json:"median_ms"`
	MedianTokens int              `json:"median_completion_tokens"`
	Passed       bool             `json:"passed"`
	Why          string           `json:"why,omitempty"`
}

// Bars a model must clear to act.
const (
	MinValidRate = 0.9
	MinPrecision = 0.9
	MinRecall    = 0.8
)

// Calibrate runs every scenario through the model once.
func Calibrate(ctx context.Context, m *Model, perCall time.Duration, now time.Time) (*Scorecard, error) {
	digest, err := m.Digest(ctx)
	if err != nil {
		return nil, err
	}
	sc := &Scorecard{Model: m.Config.Model, Digest: digest, Time: now, Think: m.Config.Think}
	var tp, fp, fn, valid int
	var lat []float64
	var toks []int
	for _, s := range Scenarios(now) {
		cctx, cancel := context.WithTimeout(ctx, perCall)
		plan, call, err := m.Ask(cctx, Prompt(s.Obs, nil, m.Config.MaxShown), m.Config.Think)
		cancel()
		r := ScenarioResult{Name: s.Name, Valid: err == nil, Call: call, Actions: []string{}}
		lat = append(lat, call.WallMs)
		toks = append(toks, call.CompletionTokens)
		if err == nil {
			valid++
		}
		hit := 0
		for _, a := range plan {
			k := string(a.Kind) + " " + a.Server
			r.Actions = append(r.Actions, k)
			if s.Expected[k] {
				hit++
				r.TP++
				continue
			}
			r.FP++
			if a.Kind == agent.Drain || a.Kind == agent.SetWeight {
				r.Collateral++
			}
		}
		want := len(s.Expected)
		if s.AnyOf && want > 0 {
			want = 1
		}
		r.FN = max(0, want-hit)
		if s.AnyOf && r.TP > 1 {
			r.TP = 1 // one drain per step is the right answer
		}
		tp, fp, fn = tp+r.TP, fp+r.FP, fn+r.FN
		sc.Collateral += r.Collateral
		sc.Scenarios = append(sc.Scenarios, r)
	}
	n := len(sc.Scenarios)
	sc.ValidRate = float64(valid) / float64(n)
	sc.Precision, sc.Recall = ratio(tp, tp+fp), ratio(tp, tp+fn)
	f1 := 0.0
	if sc.Precision+sc.Recall > 0 {
		f1 = 2 * sc.Precision * sc.Recall / (sc.Precision + sc.Recall)
	}
	sc.Score = f1 - 0.25*float64(sc.Collateral)
	sort.Float64s(lat)
	sort.Ints(toks)
	sc.MedianMs, sc.MedianTokens = lat[n/2], toks[n/2]
	var why []string
	if sc.ValidRate < MinValidRate {
		why = append(why, fmt.Sprintf("valid replies %.2f < %.2f", sc.ValidRate, MinValidRate))
	}
	if sc.Precision < MinPrecision {
		why = append(why, fmt.Sprintf("precision %.2f < %.2f", sc.Precision, MinPrecision))
	}
	if sc.Recall < MinRecall {
		why = append(why, fmt.Sprintf("recall %.2f < %.2f", sc.Recall, MinRecall))
	}
	if sc.Collateral > 0 {
		why = append(why, fmt.Sprintf("%d healthy servers drained or cut", sc.Collateral))
	}
	sc.Passed, sc.Why = len(why) == 0, strings.Join(why, "; ")
	return sc, nil
}

// ratio is a/b, 1 when b is 0 (no positives claimed: none wrong).
func ratio(a, b int) float64 {
	if b == 0 {
		return 1
	}
	return float64(a) / float64(b)
}

// Print writes the scorecard as a table.
func (sc *Scorecard) Print(w io.Writer) {
	fmt.Fprintf(w, "calibration of %s (%s), think %s\n", sc.Model, sc.Digest, sc.Think)
	fmt.Fprintf(w, "%-42s %-5s %-28s %3s %3s %3s %4s %8s %6s\n", "scenario", "valid", "actions", "tp", "fp", "fn", "harm", "ms", "tokens")
	for _, r := range sc.Scenarios {
		acts := strings.Join(r.Actions, ",")
		if acts == "" {
			acts = "-"
		}
		fmt.Fprintf(w, "%-42s %-5v %-28s %3d %3d %3d %4d %8.1f %6d\n", r.Name, r.Valid, truncate(acts, 28), r.TP, r.FP, r.FN, r.Collateral, r.Call.WallMs, r.Call.CompletionTokens)
	}
	verdict := "PASSED: may act"
	if !sc.Passed {
		verdict = "FAILED: " + sc.Why
	}
	fmt.Fprintf(w, "valid %.2f  precision %.2f  recall %.2f  collateral %d  score %.2f  median %.1f ms, %d completion tokens\n%s\n",
		sc.ValidRate, sc.Precision, sc.Recall, sc.Collateral, sc.Score, sc.MedianMs, sc.MedianTokens, verdict)
}

func recordPath(dir, digest string) string {
	return filepath.Join(dir, "calibration-"+strings.ReplaceAll(digest, ":", "-")+".json")
}

// Save writes the scorecard as the record of its model digest,
// atomically.
func (sc *Scorecard) Save(dir string) (string, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	b, err := json.MarshalIndent(sc, "", "  ")
	if err != nil {
		return "", err
	}
	path := recordPath(dir, sc.Digest)
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, append(b, '\n'), 0o644); err != nil {
		return "", err
	}
	return path, os.Rename(tmp, path)
}

// Load reads the record of a digest.
func Load(dir, digest string) (*Scorecard, error) {
	b, err := os.ReadFile(recordPath(dir, digest))
	if err != nil {
		return nil, err
	}
	var sc Scorecard
	if err := json.Unmarshal(b, &sc); err != nil {
		return nil, fmt.Errorf("calibration record: %w", err)
	}
	return &sc, nil
}
