//go:build e2e && modelserver

package e2e

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/hapilot/hapilot/agent"
	"github.com/hapilot/hapilot/internal/lab/modelserver"
	"github.com/hapilot/hapilot/internal/lab/scenario"
)

// hapilot's own model (internal/lab/models/hapilot-tiny, trained here on
// simulated scenarios), imported into the real Ollama from its committed
// GGUF and Modelfile as a user would, calibrated, then run with
// `hapilot run --policy llm` in front of a real HAProxy beside the rules
// alone: a fault at a few requests a second, where evidence is slow. The
// model is really called and answers valid replies within the step's
// deadline, it drains the faulty server, and no healthy one.
func TestRealOllamaHapilotTiny(t *testing.T) {
	const model = "hapilot-tiny"
	o := modelserver.OllamaT(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	dir, err := filepath.Abs(filepath.Join("..", "models", model))
	if err != nil {
		t.Fatal(err)
	}
	if err := o.CreateFrom(ctx, model, dir); err != nil {
		t.Fatal(err)
	}
	const interval = 2 * time.Second
	calDir := t.TempDir()
	cal := exec.CommandContext(ctx, agentBinary, "calibrate", "--model", model, "--ollama-host", o.URL.String(),
		"--calibration-dir", calDir, "--interval", interval.String())
	out, err := cal.CombinedOutput()
	t.Logf("hapilot calibrate --interval %v against %s:\n%s", interval, o, out)
	if err != nil {
		t.Fatalf("calibrate: %v: the committed model no longer passes", err)
	}
	// srv4 fails 5% of 5 requests a second: the rules need tens of
	// seconds of evidence, the model acts on the grey zone.
	servers := paperFleet(0, 0, 0, 0.05, 0, 0)
	runs := map[string]scenario.Scenario{
		"rules": {Policy: "rules"},
		model: {Policy: "llm", Name: model, AgentArgs: []string{"--model", model, "--ollama-host", o.URL.String(),
			"--calibration-dir", calDir}},
	}
	for name, s := range runs {
		s.Servers, s.Rate, s.Duration, s.Interval = servers, 30, 50*time.Second, interval
		runs[name] = s
	}
	outs, audits := sideBySide(t, runs)
	if len(outs) != 2 {
		t.Fatal("a run failed")
	}
	rules, tiny := outs["rules"], outs[model]
	t.Logf("rules alone: drained %v; rules and %s: drained %v", rules.DrainedAt, model, tiny.DrainedAt)
	for s := range tiny.DrainedAt {
		if s != "srv4" {
			t.Errorf("healthy %s drained with %s", s, model)
		}
	}
	if _, ok := tiny.DrainedAt["srv4"]; !ok {
		t.Errorf("the faulty srv4 was not drained with %s", model)
	}
	calls, invalid, late, steps := 0, 0, 0, 0
	sc := bufio.NewScanner(bytes.NewReader(audits[model]))
	sc.Buffer(make([]byte, 1<<20), 16<<20)
	for sc.Scan() {
		var rec struct {
			agent.Record
			PolicyReport struct {
				Called       bool   `json:"called"`
				Fallback     string `json:"fallback"`
				DeadlineMiss bool   `json:"deadline_miss"`
				Call         *struct {
					Error string `json:"error"`
				} `json:"call"`
			} `json:"policy_report"`
		}
		if err := json.Unmarshal(sc.Bytes(), &rec); err != nil {
			t.Fatal(err)
		}
		steps++
		pr := rec.PolicyReport
		if pr.Called {
			calls++
		}
		if pr.Call != nil && pr.Call.Error != "" {
			invalid++
			t.Logf("step %d: %s", rec.Cycle, pr.Call.Error)
		}
		if pr.DeadlineMiss {
			late++
		}
	}
	t.Logf("%s: %d steps, %d calls, %d invalid, %d past the deadline", model, steps, calls, invalid, late)
	if calls == 0 {
		t.Fatal("the model was never called")
	}
	if invalid > 0 || late > calls/4 {
		t.Errorf("%d invalid replies and %d calls past the deadline out of %d", invalid, late, calls)
	}
}
