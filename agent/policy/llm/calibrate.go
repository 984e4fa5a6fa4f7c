package llm

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"github.com/hapilot/hapilot/agent"
	"github.com/hapilot/hapilot/agent/policy/rules"
	"github.com/hapilot/hapilot/haproxy"
	"github.com/hapilot/hapilot/internal/window"
	"github.com/rs/zerolog"
)

// A Sequence is a few steps of one situation, run through Policy.Decide
// as production runs them (the rules' floor, the prompt, the schema,
// the checks), each step with the answers a sound model gives.
type Sequence struct {
	Name  string
	Steps []SeqStep
}

// SeqStep is one observation and what the model should propose, as
// "kind backend/server" keys. Expected actions count as found or missed;
// Optional ones are neither right nor wrong; anything else is wrong, and
// a drain, cut or ready of a server in Harmless is also harm.
type SeqStep struct {
	Obs      agent.Observation
	Expected map[string]bool
	AnyOf    bool // one of Expected is enough
	Optional map[string]bool
}

// srv describes one server of a calibration observation.
type srv struct {
	name          string
	weight        int
	req, e5       uint64
	p50, p95      int
	maxconn, rt   int     // maxconn and HAProxy's rtime, for overload
	rps           float64 // recent requests per second
	drainedAgo    time.Duration
	operatorMaint bool
}

func backend(now time.Time, name string, servers []srv) agent.BackendView {
	b := agent.BackendView{Name: name}
	for _, s := range servers {
		w := max(s.weight, 1)
		p50, p95 := max(s.p50, 9), max(s.p95, 13)
		v := agent.ServerView{Backend: name, Server: s.name, Owner: agent.OwnerNone, MaxConn: s.maxconn, RespTimeMs: s.rt,
			State:  haproxy.ServerState{Backend: name, Server: s.name, OpState: haproxy.OpRunning, Weight: w, Initial: w},
			Window: window.Stats{Backend: name, Server: s.name, Requests: s.req, Err5xx: s.e5, P50Ms: p50, P95Ms: p95, P99Ms: p95 + p95/5},
			Recent: window.Stats{Backend: name, Server: s.name, Requests: s.req / 6, Err5xx: s.e5 / 6, P50Ms: p50, P95Ms: p95, P99Ms: p95 + p95/5,
				Seconds: 10, RatePerSec: max(s.rps, float64(s.req)/60)}}
		switch {
		case s.operatorMaint:
			v.State.AdminState, v.Owner = haproxy.AdminForcedMaint, agent.OwnerOperator
		case s.drainedAgo > 0:
			v.State.AdminState, v.Owner = haproxy.AdminForcedDrain, agent.OwnerAgent
			v.Changed = &agent.Change{Phase: agent.PhaseDrained, At: now.Add(-s.drainedAgo), ErrorRate: 0.05}
			v.Window.Requests, v.Window.Err5xx, v.Recent = 0, 0, window.Stats{Backend: name, Server: s.name}
		}
		b.Servers = append(b.Servers, v)
	}
	return b
}

// healthy is n servers named prefix+i, weight w, 3000 requests with a
// background of 0.1% errors.
func healthy(prefix string, n, w int) []srv {
	out := make([]srv, n)
	for i := range out {
		out[i] = srv{name: fmt.Sprintf("%s%d", prefix, i+1), weight: w, req: 3000, e5: 3}
	}
	return out
}

func keys(k ...string) map[string]bool {
	m := map[string]bool{}
	for _, s := range k {
		m[s] = true
	}
	return m
}

// Sequences are the calibration cases. Names, row orders and weights
// vary (1, 100, mixed), some have several backends and more than 12
// servers, and several steps each, so that a model that answers by rote
// ("drain the top row") fails.
func Sequences(now time.Time) []Sequence {
	at := func(d time.Duration) time.Time { return now.Add(d) }
	obs := func(t time.Time, cycle uint64, bs ...agent.BackendView) agent.Observation {
		return agent.Observation{Time: t, Cycle: cycle, Lookback: time.Minute, RecentSpan: 10 * time.Second, Backends: bs}
	}
	var seqs []Sequence

	// A fault in the grey zone, among weight-100 servers, in the middle
	// of the rows: suspicious, not significant at the rules' alpha.
	grey := healthy("web-", 7, 100)
	grey[4] = srv{name: "web-5", weight: 100, req: 600, e5: 6} // 1% against 0.1%: p about 2e-4
	seqs = append(seqs, Sequence{Name: "grey-zone fault among weight-100 servers", Steps: []SeqStep{
		{Obs: obs(at(0), 1, backend(at(0), "shop", grey)), Expected: keys("drain shop/web-5", "set_weight shop/web-5"), AnyOf: true},
		{Obs: obs(at(10*time.Second), 2, backend(at(10*time.Second), "shop", grey)), Expected: keys("drain shop/web-5", "set_weight shop/web-5"), AnyOf: true},
	}})

	// Noise: a little more error on one server, within chance.
	noise := healthy("api", 6, 1)
	noise[0].e5 = 9
	seqs = append(seqs, Sequence{Name: "noise: 0.3% against 0.2%", Steps: []SeqStep{
		{Obs: obs(at(0), 1, backend(at(0), "api", noise)), Expected: keys()},
		{Obs: obs(at(10*time.Second), 2, backend(at(10*time.Second), "api", noise)), Expected: keys()},
	}})

	// Every server fails alike: the fault is not one server's.
	wide := healthy("n", 6, 1)
	for i := range wide {
		wide[i].e5 = uint64(85 + 5*(i%3))
	}
	seqs = append(seqs, Sequence{Name: "fleet-wide 3%", Steps: []SeqStep{
		{Obs: obs(at(0), 1, backend(at(0), "pool", wide)), Expected: keys()},
	}})

	// Moderately slow: below the rules' 5x median test.
	slow := healthy("s", 5, 100)
	slow[2].p50, slow[2].p95 = 24, 60
	seqs = append(seqs, Sequence{Name: "latency below the rules' test: p95 4x its peers", Steps: []SeqStep{
		{Obs: obs(at(0), 1, backend(at(0), "img", slow)), Expected: keys("drain img/s3", "set_weight img/s3"), AnyOf: true},
		{Obs: obs(at(10*time.Second), 2, backend(at(10*time.Second), "img", slow)), Expected: keys("drain img/s3", "set_weight img/s3"), AnyOf: true},
	}})

	// Overload: one server near its maxconn while its peers are not. A
	// drain would pile its load on the others; a cut or waiting is right.
	over := healthy("db", 4, 10)
	for i := range over {
		over[i].maxconn, over[i].rt, over[i].rps = 20, 40, 250
	}
	over[1].rps = 480
	seqs = append(seqs, Sequence{Name: "overload: one server at 96% of its maxconn", Steps: []SeqStep{
		{Obs: obs(at(0), 1, backend(at(0), "rw", over)), Expected: keys("set_weight rw/db2")},
		{Obs: obs(at(10*time.Second), 2, backend(at(10*time.Second), "rw", over)), Expected: keys("set_weight rw/db2")},
	}})

	// A server drained 20-60 s ago has no traffic, so its "0 requests,
	// 0.00%" looks healthy: the right answer is to wait for the probes.
	drained := healthy("cache-", 5, 1)
	var waits []SeqStep
	for i, age := range []time.Duration{20, 40, 60} {
		d := append([]srv(nil), drained...)
		t := at(time.Duration(i) * 20 * time.Second)
		d[3].drainedAgo = age * time.Second
		waits = append(waits, SeqStep{Obs: obs(t, uint64(i+1), backend(t, "kv", d)), Expected: keys()})
	}
	seqs = append(seqs, Sequence{Name: "a server drained 20-60 s ago, no traffic: wait", Steps: waits})

	// Two faults, one after the other, in two backends of 14 servers with
	// mixed weights: the second is found while the first stays drained.
	fleetA, fleetB := healthy("a", 14, 1), healthy("b", 14, 37)
	fleetA[12] = srv{name: "a13", weight: 1, req: 700, e5: 7}
	first := backend(at(0), "edge", fleetA)
	fleetA[12].drainedAgo = 10 * time.Second
	fleetB[0] = srv{name: "b1", weight: 37, req: 700, e5: 7}
	seqs = append(seqs, Sequence{Name: "two grey-zone faults over two steps, 2 backends x 14 servers", Steps: []SeqStep{
		{Obs: obs(at(0), 1, first, backend(at(0), "origin", healthy("b", 14, 37))), Expected: keys("drain edge/a13", "set_weight edge/a13"), AnyOf: true},
		{Obs: obs(at(10*time.Second), 2, backend(at(10*time.Second), "edge", fleetA), backend(at(10*time.Second), "origin", fleetB)),
			Expected: keys("drain origin/b1", "set_weight origin/b1"), AnyOf: true},
	}})

	// A clear fault (the rules drain it themselves) beside an operator's
	// maint: the model may agree, and must never name the operator's.
	op := healthy("m", 5, 100)
	op[1] = srv{name: "m2", weight: 100, req: 3000, e5: 300, operatorMaint: true}
	op[3].e5 = 150
	seqs = append(seqs, Sequence{Name: "a clear fault beside an operator's maint", Steps: []SeqStep{
		{Obs: obs(at(0), 1, backend(at(0), "app", op)), Expected: keys(), Optional: keys("drain app/m4", "set_weight app/m4")},
	}})

	// No traffic yet.
	quiet := []srv{{name: "q1"}, {name: "q2"}, {name: "q3"}}
	for i := range quiet {
		quiet[i].req = 0
	}
	seqs = append(seqs, Sequence{Name: "no traffic yet", Steps: []SeqStep{
		{Obs: obs(at(0), 1, backend(at(0), "idle", quiet)), Expected: keys()},
	}})
	return seqs
}

// StepResult is one step of the scorecard.
type StepResult struct {
	Sequence   string   `json:"sequence"`
	Step       int      `json:"step"`
	Valid      bool     `json:"valid"`
	Actions    []string `json:"actions"`
	TP         int      `json:"tp"`
	FP         int      `json:"fp"`
	FN         int      `json:"fn"`
	Collateral int      `json:"collateral"` // drains, cuts or readies that do harm
	Call       *Call    `json:"call,omitempty"`
}

// Key is what a calibration record holds for: the model's digest, its
// think mode, and a hash of the prompt's form, the schema and the options
// it is called with. A record whose key differs from the running
// configuration's is stale.
type Key struct {
	Digest      string `json:"digest"`
	Think       Think  `json:"think"`
	PromptHash  string `json:"prompt_hash"`
	SchemaHash  string `json:"schema_hash"`
	OptionsHash string `json:"options_hash"`
}

// PromptVersion changes whenever the prompt's form changes.
const PromptVersion = "2"

func hash(parts ...string) string {
	h := sha256.New()
	for _, p := range parts {
		fmt.Fprintf(h, "%d:%s;", len(p), p)
	}
	return hex.EncodeToString(h.Sum(nil))[:16]
}

// KeyFor is the record key of model m as configured.
func KeyFor(digest string, m *Model) Key {
	c := m.Config
	return Key{Digest: digest, Think: c.Think,
		PromptHash:  promptHash(c.Prompt, m.SystemPrompt),
		SchemaHash:  hash(string(Schema([]string{"b"}, []string{"s"}, 1, c.NumPredict))),
		OptionsHash: hash(options(c))}
}

// promptHash names the prompt's form. The full form hashes as it did
// before styles existed, so that records written then stay valid.
func promptHash(style PromptStyle, system string) string {
	switch style {
	case PromptCompact:
		return hash(PromptVersion, "compact", CompactHeader, system)
	case PromptNumbered:
		return hash(PromptVersion, "numbered", NumberedHeader, system)
	}
	return hash(PromptVersion, Header, system)
}

// options is what of c a call's timing and answers depend on. NumThread
// joins only when set, so that records written before it stay valid.
func options(c Config) string {
	o := fmt.Sprint(c.NumPredict, c.ThinkBudget, c.NumCtx, c.Seed, c.MaxShown)
	if c.NumThread > 0 {
		o += fmt.Sprintf(" threads %d", c.NumThread)
	}
	return o
}

// Stale says what differs between a record's key and the running one,
// "" when nothing does.
func (k Key) Stale(now Key) string {
	var d []string
	if k.Digest != now.Digest {
		d = append(d, fmt.Sprintf("the model's digest (%s, now %s)", k.Digest, now.Digest))
	}
	if k.Think != now.Think {
		d = append(d, fmt.Sprintf("the think mode (%s, now %s)", k.Think, now.Think))
	}
	if k.PromptHash != now.PromptHash {
		d = append(d, "the prompt (the system prompt or the prompt's form)")
	}
	if k.SchemaHash != now.SchemaHash {
		d = append(d, "the reply schema")
	}
	if k.OptionsHash != now.OptionsHash {
		d = append(d, "the call options (num-predict, think-budget, num-ctx, seed or servers shown)")
	}
	if len(d) == 0 {
		return ""
	}
	return "calibrated with another " + strings.Join(d, ", ") + ": run `hapilot calibrate` again"
}

// Scorecard is a model's calibration result.
type Scorecard struct {
	Model      string       `json:"model"`
	Key        Key          `json:"key"`
	Time       time.Time    `json:"time"`
	Steps      []StepResult `json:"steps"`
	ValidRate  float64      `json:"valid_rate"`
	Precision  float64      `json:"precision"`
	Recall     float64      `json:"recall"`
	Collateral int          `json:"collateral"`
	// P95Ms is the 95th percentile of the calls' wall time, against
	// DeadlineMs, the step deadline the model will work under.
	P95Ms        float64 `json:"p95_ms"`
	DeadlineMs   float64 `json:"deadline_ms"`
	MedianTokens int     `json:"median_completion_tokens"`
	Passed       bool    `json:"passed"`
	Why          string  `json:"why,omitempty"`
}

// Bars a model must clear to act.
const (
	MinValidRate = 0.9
	MinPrecision = 0.9
	MinRecall    = 0.8
)

// CalibrateAs scores the model cfg names as `hapilot run` with the
// loop's settings would call it: the same options, and its calls' p95
// against the same deadline.
func CalibrateAs(ctx context.Context, cfg Config, loop agent.Settings, now time.Time) (*Scorecard, error) {
	cfg = cfg.Resolved()
	m, err := NewModel(cfg)
	if err != nil {
		return nil, err
	}
	return Calibrate(ctx, m, cfg.CallBudget(loop.PolicyBudget()), now)
}

// Calibrate runs every sequence through a policy built as production
// builds it (the rules' floor, the prompt, the schema), with the model
// asked at every step, one confirmation, and no call cut short: each
// call's time is measured and its 95th percentile must fit budget, the
// deadline the loop would give each call (Config.CallBudget of the
// loop's agent.Settings.PolicyBudget).
func Calibrate(ctx context.Context, m *Model, budget time.Duration, now time.Time) (*Scorecard, error) {
	digest, err := m.Digest(ctx)
	if err != nil {
		return nil, err
	}
	if _, err := m.Inspect(ctx); err != nil {
		return nil, err
	}
	// Loaded first, as the agent's warm-up loads it: the calls are timed
	// as a resident model answers them.
	wctx, cancel := context.WithTimeout(ctx, m.Config.LoadTimeout)
	_, err = m.Warm(wctx, 2048)
	if err == nil {
		// As the agent does after a load: a failed measure leaves the
		// estimate, and the scorecard shows what that costs.
		_ = m.Measure(wctx, TokenSample(now))
	}
	cancel()
	if err != nil {
		return nil, err
	}
	sc := &Scorecard{Model: m.Config.Model, Key: KeyFor(digest, m), Time: now, DeadlineMs: float64(budget) / 1e6}
	var tp, fp, fn, valid, calls int
	var lat []float64
	var toks []int
	for _, seq := range Sequences(now) {
		cfg := m.Config
		cfg.Confirm, cfg.Gate, cfg.Deadline, cfg.MinHold = 1, GateAlways, 0, 0
		p := New(m, rules.NewWindowed(rules.DefaultConfig()), cfg, zerolog.Nop())
		for i, st := range seq.Steps {
			if _, err := p.Decide(ctx, st.Obs); err != nil {
				p.Close()
				return nil, fmt.Errorf("calibrate %s: %w", seq.Name, err)
			}
			rep := p.report
			r := score(seq.Name, i+1, st, rep)
			if rep.Call != nil {
				calls++
				lat = append(lat, rep.Call.WallMs)
				toks = append(toks, rep.Call.CompletionTokens)
			}
			if r.Valid {
				valid++
			}
			tp, fp, fn = tp+r.TP, fp+r.FP, fn+r.FN
			sc.Collateral += r.Collateral
			sc.Steps = append(sc.Steps, r)
		}
		p.Close()
	}
	sc.judge(calls, valid, tp, fp, fn, lat, toks)
	return sc, nil
}

// judge turns the counts into the scorecard's figures and verdict.
func (sc *Scorecard) judge(calls, valid, tp, fp, fn int, lat []float64, toks []int) {
	sc.ValidRate = ratio(valid, len(sc.Steps))
	sc.Precision, sc.Recall = ratio(tp, tp+fp), ratio(tp, tp+fn)
	if len(lat) > 0 {
		sort.Float64s(lat)
		sort.Ints(toks)
		sc.P95Ms = lat[int(math.Ceil(0.95*float64(len(lat))))-1]
		sc.MedianTokens = toks[len(toks)/2]
	}
	var why []string
	if calls < len(sc.Steps) {
		why = append(why, fmt.Sprintf("%d of %d steps got no call", len(sc.Steps)-calls, len(sc.Steps)))
	}
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
		why = append(why, fmt.Sprintf("%d harmful actions (healthy servers drained or cut, drained servers readied before their probes)", sc.Collateral))
	}
	if sc.DeadlineMs > 0 && sc.P95Ms > sc.DeadlineMs {
		why = append(why, fmt.Sprintf("p95 call time %.0f ms is past the %.0f ms step deadline", sc.P95Ms, sc.DeadlineMs))
	}
	sc.Passed, sc.Why = len(why) == 0, strings.Join(why, "; ")
}

// score judges one step's proposals: the model's own plan before the
// confirmation and evidence checks, so that what it says is judged, not
// what the checks let through.
func score(seq string, step int, st SeqStep, rep Report) StepResult {
	r := StepResult{Sequence: seq, Step: step, Valid: rep.Call != nil && rep.Call.Error == "" && rep.Fallback == "", Call: rep.Call, Actions: []string{}}
	floor := map[agent.Key]bool{}
	for _, a := range rep.Floor {
		floor[a.Key()] = true
	}
	hit := 0
	for _, a := range rep.Proposed {
		k := string(a.Kind) + " " + a.Key().String()
		r.Actions = append(r.Actions, k)
		switch {
		case st.Expected[k]:
			hit++
		case st.Optional[k], floor[a.Key()] && a.Kind != agent.Ready:
		default:
			r.FP++
			r.Collateral += harm(st.Obs, a)
		}
	}
	want := len(st.Expected)
	if st.AnyOf && want > 0 {
		want = 1
	}
	r.TP = min(hit, want)
	r.FN = max(0, want-hit)
	return r
}

// harm is 1 when an action would hurt: a drain or a cut of a server that
// is not to be acted on, a ready of a drained server, or any action on an
// operator's server.
func harm(obs agent.Observation, a agent.Action) int {
	_, s := obs.Find(a.Backend, a.Server)
	if s == nil {
		return 0
	}
	if s.Owner == agent.OwnerOperator || a.Kind == agent.Drain || a.Kind == agent.Ready && s.Changed != nil ||
		a.Kind == agent.SetWeight && a.Weight < s.State.Weight {
		return 1
	}
	return 0
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
	fmt.Fprintf(w, "calibration of %s (%s), think %s\n", sc.Model, sc.Key.Digest, sc.Key.Think)
	fmt.Fprintf(w, "%-60s %-5s %-34s %3s %3s %3s %4s %8s %6s\n", "sequence, step", "valid", "proposed", "tp", "fp", "fn", "harm", "ms", "tokens")
	for _, r := range sc.Steps {
		acts := strings.Join(r.Actions, ",")
		if acts == "" {
			acts = "-"
		}
		ms, tok := 0.0, 0
		if r.Call != nil {
			ms, tok = r.Call.WallMs, r.Call.CompletionTokens
		}
		fmt.Fprintf(w, "%-60s %-5v %-34s %3d %3d %3d %4d %8.1f %6d\n", fmt.Sprintf("%s, %d", truncate(r.Sequence, 54), r.Step),
			r.Valid, truncate(acts, 34), r.TP, r.FP, r.FN, r.Collateral, ms, tok)
	}
	verdict := "PASSED: may act"
	if !sc.Passed {
		verdict = "FAILED: " + sc.Why
	}
	fmt.Fprintf(w, "valid %.2f  precision %.2f  recall %.2f  harmful %d  p95 %.1f ms (deadline %.0f ms)  median %d completion tokens\n%s\n",
		sc.ValidRate, sc.Precision, sc.Recall, sc.Collateral, sc.P95Ms, sc.DeadlineMs, sc.MedianTokens, verdict)
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
	path := recordPath(dir, sc.Key.Digest)
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
