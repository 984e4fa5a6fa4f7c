//go:build e2e && modelserver

package e2e

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/hapilot/hapilot/agent"
	"github.com/hapilot/hapilot/internal/lab/modelserver"
	"github.com/hapilot/hapilot/internal/lab/scenario"
)

// tinyModel is a random-weight model the lab writes: a 2-layer, 64-wide
// llama with a byte tokenizer, whose context holds the agent's largest
// prompt at a byte a token.
var tinyModel = modelserver.Model{Name: "tiny", Spec: modelserver.Spec{ContextLength: 32768, Seed: 7}}

// `hapilot calibrate` against the real Ollama refuses a random-weight
// model and says why: the server's replies are judged, not an emulation's.
func TestRealOllamaCalibrateRefusesARandomModel(t *testing.T) {
	o := modelserver.OllamaT(t, tinyModel)
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, agentBinary, "calibrate", "--model", tinyModel.Name, "--ollama-host", o.URL.String(),
		"--calibration-dir", t.TempDir(), "--interval", "10s")
	out, err := cmd.CombinedOutput()
	t.Logf("hapilot calibrate against %s, random-weight model %s:\n%s", o, tinyModel.Name, out)
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.ExitCode() != 1 {
		t.Fatalf("calibrate: %v, want exit 1 (refused)", err)
	}
	// The scorecard names what failed, and the command says what follows.
	if !strings.Contains(string(out), "FAILED: ") || !strings.Contains(string(out), "will not be allowed to act") {
		t.Fatalf("the scorecard does not say why the model is refused")
	}
}

// A random-weight model served by the real Ollama, let act without
// calibration, against a real HAProxy: the guards hold (no healthy server
// drained, no weight raised past its configuration, nothing re-admitted
// without probes), the rules' floor drains the faulty servers within a
// step of the rules alone, no step overruns its interval, and the model
// is really called.
func TestRealOllamaRandomModelUnderTheGuards(t *testing.T) {
	o := modelserver.OllamaT(t, tinyModel)
	servers := paperFleet(0, 0, 0.05, 0, 0, 0.05)
	runs := map[string]scenario.Scenario{
		"rules": {Policy: "rules"},
		"random-model": {Policy: "llm", Name: "random-model", AgentArgs: []string{"--model", tinyModel.Name, "--ollama-host", o.URL.String(),
			"--skip-calibration", "--llm-gate", "always"}},
	}
	for name, s := range runs {
		// A random model on 2 cores answers in 0.6-6 s: a 5 s interval
		// gives its calls a 4 s budget, so that most are answered.
		s.Servers, s.Rate, s.Duration, s.Interval = servers, 300, 45*time.Second, 5*time.Second
		runs[name] = s
	}
	outs, audits := sideBySide(t, runs)
	if len(outs) != 2 {
		t.Fatal("a run failed")
	}
	rules, model := outs["rules"], outs["random-model"]
	t.Logf("against %s, random-weight model %s; rules alone: drained %v, 5xx %d; model: drained %v, 5xx %d, flips %v",
		o, tinyModel.Name, rules.DrainedAt, rules.Load.Err5xx, model.DrainedAt, model.Load.Err5xx, model.Flips)
	for s := range model.DrainedAt {
		if s != "srv3" && s != "srv6" {
			t.Errorf("healthy %s drained under the random model", s)
		}
	}
	for s, changes := range model.Changes {
		for _, c := range changes {
			if c.Weight > 1 { // paperFleet's servers are configured at HAProxy's default weight, 1
				t.Errorf("%s's weight raised to %d", s, c.Weight)
			}
		}
	}
	for _, s := range []string{"srv3", "srv6"} {
		r, okR := rules.DrainedAt[s]
		m, okM := model.DrainedAt[s]
		if !okR || !okM {
			t.Errorf("%s: drained by the rules %v, under the model %v", s, okR, okM)
			continue
		}
		// The floor's drain lands in the same step as the rules' own,
		// which may wait for the model's call (PolicyBudget, 4 s here).
		if m > r+5*time.Second+500*time.Millisecond {
			t.Errorf("%s: the floor drained it at %v, the rules alone at %v: more than a step later", s, m, r)
		}
	}
	calls, fallbacks, steps := 0, 0, 0
	why := map[string]int{}
	sc := bufio.NewScanner(bytes.NewReader(audits["random-model"]))
	sc.Buffer(make([]byte, 1<<20), 16<<20)
	for sc.Scan() {
		var rec struct {
			agent.Record
			PolicyReport struct {
				Called   bool   `json:"called"`
				Fallback string `json:"fallback"`
			} `json:"policy_report"`
		}
		if err := json.Unmarshal(sc.Bytes(), &rec); err != nil {
			t.Fatal(err)
		}
		steps++
		if rec.PolicyReport.Called {
			calls++
		}
		if rec.PolicyReport.Fallback != "" {
			fallbacks++
			why[rec.PolicyReport.Fallback]++
		}
		if rec.DurationMs >= 5000 {
			t.Errorf("step %d took %.0f ms, past its 5 s interval", rec.Cycle, rec.DurationMs)
		}
		for _, v := range rec.Verdicts {
			if v.Accepted && v.Applied.Kind == agent.Ready && v.Proposed.Origin != agent.OriginRecovery {
				t.Errorf("step %d: a ready without probes was applied: %+v", rec.Cycle, v)
			}
		}
	}
	t.Logf("random model: %d steps, %d calls answered by %s, %d steps on the floor alone: %v", steps, calls, o, fallbacks, why)
	if calls == 0 {
		t.Fatal("the real Ollama never answered a call")
	}
}
