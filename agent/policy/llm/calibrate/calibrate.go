// Package calibrate is the gate a model passes before it may act: the
// calibration's situations (fixtures) run through the LLM policy as
// production builds it, each step's proposals scored, the scorecard
// saved as the record of the model's digest and settings, and the check
// of that record when the agent starts.
package calibrate

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"github.com/hapilot/hapilot/agent"
	"github.com/hapilot/hapilot/agent/policy/llm"
	"github.com/hapilot/hapilot/agent/policy/llm/calibrate/fixtures"
	"github.com/hapilot/hapilot/agent/policy/llm/modelapi"
	"github.com/hapilot/hapilot/agent/policy/llm/prompt"
	"github.com/hapilot/hapilot/agent/policy/rules"
	"github.com/rs/zerolog"
)

// StepResult is one step of the scorecard.
type StepResult struct {
	Sequence   string    `json:"sequence"`
	Step       int       `json:"step"`
	Valid      bool      `json:"valid"`
	Actions    []string  `json:"actions"`
	TP         int       `json:"tp"`
	FP         int       `json:"fp"`
	FN         int       `json:"fn"`
	Collateral int       `json:"collateral"` // drains, cuts or readies that do harm
	Call       *llm.Call `json:"call,omitempty"`
}

// RecordKey is what a calibration record holds for: the model's digest, its
// think mode, and a hash of the prompt's form, the schema and the options
// it is called with. A record whose key differs from the running
// configuration's is stale.
type RecordKey struct {
	Digest      string         `json:"digest"`
	Think       modelapi.Think `json:"think"`
	PromptHash  string         `json:"prompt_hash"`
	SchemaHash  string         `json:"schema_hash"`
	OptionsHash string         `json:"options_hash"`
}

// promptVersion changes whenever the prompt's form changes. 3: the
// candidates and their figures come from the rules' sequential test, so
// a record calibrated on the windowed test's prompts is stale.
const promptVersion = "3"

func hash(parts ...string) string {
	h := sha256.New()
	for _, p := range parts {
		fmt.Fprintf(h, "%d:%s;", len(p), p)
	}
	return hex.EncodeToString(h.Sum(nil))[:16]
}

// keyFor is the record key of model m as configured.
func keyFor(digest string, m *llm.Model) RecordKey {
	c := m.Config
	return RecordKey{Digest: digest, Think: c.Think,
		PromptHash:  promptHash(m.Form(), m.System()),
		SchemaHash:  hash(string(prompt.Schema([]string{"b"}, []string{"s"}, 1, c.NumPredict))),
		OptionsHash: hash(options(c))}
}

// promptHash names the prompt's form. The full form hashes as it did
// before styles existed, so that records written then stay valid.
func promptHash(style prompt.Style, system string) string {
	switch style {
	case prompt.Compact:
		return hash(promptVersion, "compact", prompt.CompactHeader, system)
	case prompt.Numbered:
		return hash(promptVersion, "numbered", prompt.NumberedHeader, system)
	}
	return hash(promptVersion, prompt.Header, system)
}

// options is what of c a call's timing and answers depend on. NumThread
// joins only when set, so that records written before it stay valid.
func options(c llm.Config) string {
	o := fmt.Sprint(c.NumPredict, c.ThinkBudget, c.NumCtx, c.Seed, c.MaxShown)
	if c.NumThread > 0 {
		o += fmt.Sprintf(" threads %d", c.NumThread)
	}
	return o
}

// Stale says what differs between a record's key and the running one,
// "" when nothing does.
func (k RecordKey) Stale(now RecordKey) string {
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
	Model string `json:"model"`
	// Form is the prompt form the model was called with: --llm-prompt's,
	// or the one the model names.
	Form       prompt.Style `json:"prompt_form,omitempty"`
	Key        RecordKey    `json:"key"`
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

// Run scores the model cfg names as `hapilot run` with the loop's
// settings and the operator's rules would call it: the same options, the
// same floor and candidate tests, and its calls' p95 against the same
// deadline.
func Run(ctx context.Context, cfg llm.Config, rc rules.Config, loop agent.Settings, now time.Time) (*Scorecard, error) {
	m, err := llm.NewModel(cfg)
	if err != nil {
		return nil, err
	}
	return RunModel(ctx, m, rc, cfg.CallBudget(loop.PolicyBudget()), now)
}

// RunModel runs every sequence through a policy built as production
// builds it (the rules rc as its floor, fed each step's window a second at
// a time as the loop's evidence checks feed it; the prompt, the schema), with the model
// asked at every step, one confirmation, and no call cut short: each
// call's time is measured and its 95th percentile must fit budget, the
// deadline the loop would give each call (Config.CallBudget of the
// loop's agent.Settings.PolicyBudget).
func RunModel(ctx context.Context, m *llm.Model, rc rules.Config, budget time.Duration, now time.Time) (*Scorecard, error) {
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
		_ = m.Measure(wctx, llm.TokenSample(now))
	}
	cancel()
	if err != nil {
		return nil, err
	}
	sc := &Scorecard{Model: m.Config.Model, Form: m.Form(), Key: keyFor(digest, m), Time: now, DeadlineMs: float64(budget) / 1e6}
	var tp, fp, fn, valid, calls int
	var lat []float64
	var toks []int
	for _, seq := range fixtures.Sequences(now) {
		cfg := m.Config
		cfg.Confirm, cfg.Gate, cfg.Deadline, cfg.MinHold = 1, llm.GateAlways, 0, 0
		p := llm.New(m, rules.NewPolicy(rc), rc, cfg, zerolog.Nop())
		// The floor is the rules' sequential test: it reads each
		// step's window a second at a time, through the evidence hook
		// the loop checks between ticks.
		var tl fixtures.Timeline
		evidence := p.Hooks().Evidence
		for i, st := range seq.Steps {
			st.Obs = tl.Feed(st.Obs, evidence)
			if _, err := p.Decide(ctx, st.Obs); err != nil {
				p.Close()
				return nil, fmt.Errorf("calibrate %s: %w", seq.Name, err)
			}
			rep := p.LastReport()
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
func score(seq string, step int, st fixtures.Step, rep llm.Report) StepResult {
	r := StepResult{Sequence: seq, Step: step, Valid: rep.Call != nil && rep.Call.Error == "" && rep.Fallback == "", Call: rep.Call, Actions: []string{}}
	floor := map[agent.Key]bool{}
	for _, a := range rep.Floor {
		floor[a.Key()] = true
	}
	hit := 0
	for _, a := range rep.Proposed {
		k := a.ID()
		r.Actions = append(r.Actions, k.String())
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
	fmt.Fprintf(w, "calibration of %s (%s), think %s, prompt %s\n", sc.Model, sc.Key.Digest, sc.Key.Think, sc.Form)
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

func truncate(s string, n int) string {
	if len(s) > n {
		return strings.ToValidUTF8(s[:n], "") + "..."
	}
	return s
}

// check says why model may not act, nil when its record for digest in
// dir passed and holds for the running settings; the record comes back
// either way when it could be read.
func check(model *llm.Model, dir, digest string) (*Scorecard, error) {
	sc, err := Load(dir, digest)
	if err != nil {
		return nil, fmt.Errorf("no calibration record for digest %s: %w", digest, err)
	}
	if stale := sc.Key.Stale(keyFor(digest, model)); stale != "" {
		return sc, errors.New("stale calibration record: " + stale)
	}
	if !sc.Passed {
		return sc, errors.New("failed calibration: " + sc.Why)
	}
	return sc, nil
}

// Admit is the gate the agent runs once the model server answers (the
// daemon's llm.Policy.Admit): the model's digest is read, and its record
// in dir checked.
func Admit(ctx context.Context, model *llm.Model, dir string) (*Scorecard, error) {
	digest, err := model.Digest(ctx)
	if err != nil {
		return nil, err
	}
	return check(model, dir, digest)
}
