//go:build e2e && modelserver

package e2e

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/hapilot/hapilot/internal/lab/llmprompts"

	"github.com/hapilot/hapilot/agent"
	"github.com/hapilot/hapilot/agent/policy/llm/prompt"
	"github.com/hapilot/hapilot/internal/lab/dataset"
	"github.com/hapilot/hapilot/internal/lab/modelserver"
	"github.com/hapilot/hapilot/internal/lab/scenario"
	"github.com/ollama/ollama/api"
)

// hapilot's own models (internal/lab/models/NAME, trained here on
// simulated scenarios in the prompt form their recipe names, which each
// GGUF names in turn, so that calibrate and run use it untold), each
// imported into the real Ollama from its committed GGUF and Modelfile as
// a user would, which tokenizes prompts as the
// training text did, and run with `hapilot run --policy
// llm` in front of a real HAProxy. It passes calibration (docs/lab/own-model.md has
// its scorecard): `hapilot calibrate` must say so, and the run reads the
// record it wrote, as an operator's agent would, and lets it act, asked
// every step (the rules drain the paper's faults at once, so the anomaly gate
// would leave nothing to ask). The model is really called through the
// server and answers valid replies; no healthy server is drained; the
// faulty ones are; no step overruns its interval.
//
// Both committed models: hapilot-tiny (drawn on the windowed test's
// situations) and hapilot-grey (trained for the grey band the sequential
// test leaves to a model, recipe-grey.env), one after the other on one
// Ollama.
func TestRealOllamaOwnModels(t *testing.T) {
	o := modelserver.OllamaT(t)
	for _, model := range []string{"hapilot-tiny", "hapilot-grey"} {
		t.Run(model, func(t *testing.T) { realOwnModel(t, o, model) })
	}
}

func realOwnModel(t *testing.T, o *modelserver.Ollama, model string) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	dir, err := filepath.Abs(filepath.Join("..", "models", model))
	if err != nil {
		t.Fatal(err)
	}
	if err := o.CreateFrom(ctx, model, dir); err != nil {
		t.Fatal(err)
	}
	// The server tokenizes a prompt as the training text did: the
	// dataset's count, through Ollama's own tokenizer over the GGUF's
	// vocabulary, is the server's prompt_eval_count.
	v, err := dataset.ReadVocab(filepath.Join(dir, model+".gguf"))
	if err != nil {
		t.Fatal(err)
	}
	tok := v.Tokenizer()
	prompt := recipePrompt(t)
	examples, err := dataset.Generate(77, 6, prompt, dataset.DefaultRecipe().Draw, llmprompts.New)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range examples {
		stream := false
		var resp api.ChatResponse
		err := o.Client().Chat(ctx, &api.ChatRequest{Model: model, Stream: &stream,
			Messages: []api.Message{{Role: "system", Content: e.System}, {Role: "user", Content: e.User}},
			Options:  map[string]any{"temperature": 0, "num_predict": 1, "num_ctx": 2048}}, func(r api.ChatResponse) error { resp = r; return nil })
		if err != nil {
			t.Fatal(err)
		}
		if n := v.Count(tok, e.Prompt()); n != resp.PromptEvalCount {
			t.Errorf("a prompt of %d tokens in the dataset is %d tokens to Ollama", n, resp.PromptEvalCount)
		}
	}
	const interval = 5 * time.Second
	calDir := t.TempDir()
	// No --llm-prompt: the model's GGUF names its form, and calibrate and
	// run use it.
	cal := exec.CommandContext(ctx, agentBinary, "calibrate", "--model", model, "--ollama-host", o.URL.String(),
		"--calibration-dir", calDir, "--interval", interval.String())
	out, err := cal.CombinedOutput()
	t.Logf("hapilot calibrate --interval %v against %s:\n%s", interval, o, out)
	if err != nil || !bytes.Contains(out, []byte("PASSED: ")) {
		t.Fatalf("calibrate: %v: the committed model passed calibration here (if it does not now, this test and docs/lab/own-model.md are out of date)", err)
	}
	if !bytes.Contains(out, []byte(", prompt "+string(prompt)+"\n")) {
		t.Fatalf("calibrate did not call the model with the %s form its GGUF names", prompt)
	}
	s := scenario.Scenario{Policy: "llm", Name: model, AgentArgs: []string{"--model", model, "--ollama-host", o.URL.String(), "--calibration-dir", calDir, "--llm-gate", "always"},
		Servers: paperFleet(0, 0, 0.05, 0, 0, 0.05), Rate: 300, Duration: 40 * time.Second, Interval: interval}
	outs, audits := sideBySide(t, map[string]scenario.Scenario{model: s})
	tiny, ok := outs[model]
	if !ok {
		t.Fatal("the run failed")
	}
	t.Logf("rules and %s: drained %v", model, tiny.DrainedAt)
	for s := range tiny.DrainedAt {
		if s != "srv3" && s != "srv6" {
			t.Errorf("healthy %s drained with %s", s, model)
		}
	}
	for _, s := range []string{"srv3", "srv6"} {
		if _, ok := tiny.DrainedAt[s]; !ok {
			t.Errorf("the faulty %s was not drained", s)
		}
	}
	calls, valid, steps := 0, 0, 0
	sc := bufio.NewScanner(bytes.NewReader(audits[model]))
	sc.Buffer(make([]byte, 1<<20), 16<<20)
	for sc.Scan() {
		var rec struct {
			agent.Record
			PolicyReport struct {
				Called bool `json:"called"`
				Call   *struct {
					Error string `json:"error"`
				} `json:"call"`
			} `json:"policy_report"`
		}
		if err := json.Unmarshal(sc.Bytes(), &rec); err != nil {
			t.Fatal(err)
		}
		if rec.Type != agent.EventStep {
			continue // an event: the steps are the --audit-steps lines
		}
		steps++
		if pr := rec.PolicyReport; pr.Called {
			calls++
			if pr.Call != nil && pr.Call.Error == "" {
				valid++
			}
		}
		if rec.DurationMs >= float64(interval.Milliseconds()) {
			t.Errorf("step %d took %.0f ms, past its %v interval", rec.Cycle, rec.DurationMs, interval)
		}
	}
	t.Logf("%s: %d steps, %d calls answered by %s, %d of them valid", model, steps, calls, o, valid)
	if calls == 0 || valid == 0 {
		t.Fatalf("%d calls, %d valid: the model was never called, or never answered a valid reply", calls, valid)
	}
}

// recipePrompt is the prompt form internal/lab/models/recipe.env trained
// the committed models on (its PROMPT=).
func recipePrompt(t *testing.T) prompt.Style {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("..", "models", "recipe.env"))
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "PROMPT="); ok {
			var style prompt.Style
			if err := style.Set(strings.TrimSpace(v)); err != nil {
				t.Fatalf("recipe.env: %v", err)
			}
			return style
		}
	}
	t.Fatal("recipe.env names no PROMPT")
	return ""
}
