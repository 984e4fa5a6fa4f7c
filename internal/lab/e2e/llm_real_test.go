//go:build e2e && modelserver

package e2e

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hapilot/hapilot/agent"
	"github.com/hapilot/hapilot/agent/policy/llm"
	"github.com/hapilot/hapilot/agent/policy/llm/calibrate"
	"github.com/hapilot/hapilot/agent/policy/llm/modelapi"
	"github.com/hapilot/hapilot/internal/lab/bench"
	"github.com/hapilot/hapilot/internal/lab/haproxyproc"
	"github.com/hapilot/hapilot/internal/lab/modelserver"
	"github.com/hapilot/hapilot/internal/lab/scenario"
	"github.com/ollama/ollama/api"
)

// tinyModel is a random-weight model the lab writes: a 2-layer, 64-wide
// llama with a byte tokenizer, whose context holds the agent's largest
// prompt at a byte a token.
var tinyModel = modelserver.Model{Name: "tiny", Spec: modelserver.Spec{ContextLength: 32768, Seed: 7}}

// labThreads is the model's threads on the lab's machine, which the load
// generator, HAProxy, the backends and the agent share: at Ollama's
// default (every physical core) the tiny model answered 256 tokens at
// 9.6 tokens/s on 2 cores, at one thread at 323 (BenchmarkOllamaThreads).
// The native API sends it as --num-thread; /v1 cannot carry options, so
// tinyModelV1 has it in its Modelfile; llama-server gets -t.
const labThreads = 1

var tinyModelV1 = modelserver.Model{Name: "tiny-v1", Spec: tinyModel.Spec, Threads: labThreads}

// `hapilot calibrate` against the real Ollama refuses a random-weight
// model and says why: the server's replies are judged, not an emulation's.
func TestRealOllamaCalibrateRefusesARandomModel(t *testing.T) {
	o := modelserver.OllamaT(t, tinyModel)
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	dir := t.TempDir()
	cmd := exec.CommandContext(ctx, agentBinary, "calibrate", "--model", tinyModel.Name, "--ollama-host", o.URL.String(),
		"--num-thread", fmt.Sprint(labThreads), "--calibration-dir", dir, "--interval", "10s")
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
	// Its prompts include two backends of 14 servers: none overflowed
	// the context the agent sized, tokenizer measured after the load.
	records, _ := filepath.Glob(filepath.Join(dir, "*.json"))
	if len(records) != 1 {
		t.Fatalf("calibration records %v", records)
	}
	b, err := os.ReadFile(records[0])
	if err != nil {
		t.Fatal(err)
	}
	var sc calibrate.Scorecard
	if err := json.Unmarshal(b, &sc); err != nil {
		t.Fatal(err)
	}
	largest := 0
	for _, st := range sc.Steps {
		if st.Call == nil {
			continue
		}
		largest = max(largest, st.Call.PromptTokens)
		if strings.Contains(st.Call.Error, modelapi.ErrContextOverflow.Error()) {
			t.Errorf("%s, step %d: %s", st.Sequence, st.Step, st.Call.Error)
		}
	}
	t.Logf("%d steps, largest prompt %d tokens, no context overflow", len(sc.Steps), largest)
}

// modelServer is a real model server as the agent reaches it: what it
// is, for every figure's log line, and the agent's flags for it.
type modelServer struct {
	name string
	args []string
}

func ollamaNative(o *modelserver.Ollama) modelServer {
	return modelServer{fmt.Sprintf("%s, native API, random-weight model %s", o, tinyModel.Name),
		[]string{"--model", tinyModel.Name, "--ollama-host", o.URL.String(), "--num-thread", fmt.Sprint(labThreads)}}
}

func ollamaOpenAI(o *modelserver.Ollama) modelServer {
	return modelServer{fmt.Sprintf("%s, OpenAI API (/v1), random-weight model %s (tiny's weights, num_thread %d in its Modelfile)", o, tinyModelV1.Name, labThreads),
		[]string{"--model", tinyModelV1.Name, "--llm-api", "openai", "--llm-url", o.URL.String()}}
}

// llamaServer serves tinyModel's weights, under its name, with one slot
// of a context that holds the largest prompt at a byte a token.
func llamaServer(t *testing.T) modelServer {
	s := modelserver.LlamaServerT(t, tinyModel.Spec, 16384, "--alias", tinyModel.Name, "--parallel", "1", "--threads", fmt.Sprint(labThreads))
	return modelServer{fmt.Sprintf("%s, OpenAI API, random-weight model %s", s, tinyModel.Name),
		[]string{"--model", tinyModel.Name, "--llm-api", "openai", "--llm-url", s.URL}}
}

// auditSummary is what one run's audit log says of the model.
type auditSummary struct {
	steps, calls, fallbacks, overflows int
	// asked: steps whose call reached the server, answered in time
	// (calls) or after the step's deadline.
	asked            int
	why              map[string]int
	completionTokens []int
	maxStepMs        float64
	// readiesWithoutProbes: ready actions applied that were not the
	// recovery's (which probes first).
	readiesWithoutProbes int
}

func summarize(t *testing.T, audit []byte) auditSummary {
	t.Helper()
	sum := auditSummary{why: map[string]int{}}
	sc := bufio.NewScanner(bytes.NewReader(audit))
	sc.Buffer(make([]byte, 1<<20), 16<<20)
	for sc.Scan() {
		var rec struct {
			agent.Record
			PolicyReport struct {
				Called   bool      `json:"called"`
				Fallback string    `json:"fallback"`
				Call     *llm.Call `json:"call"`
			} `json:"policy_report"`
		}
		if err := json.Unmarshal(sc.Bytes(), &rec); err != nil {
			t.Fatal(err)
		}
		if rec.Type != agent.EventStep {
			continue // an event: the steps are the --audit-steps lines
		}
		sum.steps++
		sum.maxStepMs = max(sum.maxStepMs, rec.DurationMs)
		r := rec.PolicyReport
		if r.Called {
			sum.calls++
		}
		if r.Called || strings.Contains(r.Fallback, "overran") {
			sum.asked++
		}
		if r.Call != nil && r.Call.CompletionTokens > 0 {
			sum.completionTokens = append(sum.completionTokens, r.Call.CompletionTokens)
		}
		if r.Fallback != "" {
			sum.fallbacks++
			// Grouped by kind: numbers (tokens, seconds) vary.
			why := regexp.MustCompile(`[0-9.]+(ms|s)?`).ReplaceAllString(r.Fallback, "N")
			sum.why[why[:min(len(why), 100)]]++
		}
		if r.Call != nil && strings.Contains(r.Call.Error, modelapi.ErrContextOverflow.Error()) {
			sum.overflows++
		}
		for _, v := range rec.Verdicts {
			if v.Accepted && v.Applied.Kind == agent.Ready && v.Proposed.Origin != agent.OriginRecovery {
				sum.readiesWithoutProbes++
			}
		}
	}
	return sum
}

func (s auditSummary) String() string {
	return fmt.Sprintf("%d steps, %d calls made, %d answered in time, %d on the floor alone %v, %d context overflows, completion tokens a call %v, longest step %.0f ms",
		s.steps, s.asked, s.calls, s.fallbacks, s.why, s.overflows, s.completionTokens, s.maxStepMs)
}

// scrape GETs the agent's /status and /metrics.
func scrape(addr string) (status []byte, metrics string, err error) {
	for _, path := range []string{"/status", "/metrics"} {
		resp, err := http.Get("http://" + addr + path)
		if err != nil {
			return nil, "", err
		}
		b, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil {
			return nil, "", err
		}
		if path == "/status" {
			status = b
		} else {
			metrics = string(b)
		}
	}
	return status, metrics, nil
}

// metric reads one counter's value from /metrics text.
func metric(text, name string) (float64, bool) {
	m := regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(name) + ` (\S+)$`).FindStringSubmatch(text)
	if m == nil {
		return 0, false
	}
	v, err := strconv.ParseFloat(m[1], 64)
	return v, err == nil
}

// lifeOf reads the model's life history from /status.
func lifeOf(t *testing.T, status []byte) []llm.Life {
	t.Helper()
	var st struct {
		PolicyStatus struct {
			History []llm.LifeChange `json:"history"`
		} `json:"policy_status"`
	}
	if err := json.Unmarshal(status, &st); err != nil {
		t.Fatalf("/status: %v", err)
	}
	var out []llm.Life
	for _, c := range st.PolicyStatus.History {
		out = append(out, c.State)
	}
	return out
}

func freeAddr(t *testing.T) string {
	t.Helper()
	ports, err := haproxyproc.FreePorts(1)
	if err != nil {
		t.Fatal(err)
	}
	return fmt.Sprintf("127.0.0.1:%d", ports[0])
}

// withArgs is base followed by more, in a new slice: runs that share
// base must not share its backing array.
func withArgs(base []string, more ...string) []string {
	return append(append([]string{}, base...), more...)
}

// paperFaultSideBySide runs each scenario on the paper's fault among 9
// servers (srv3 and srv6 fail 5%), 300 req/s for 45 s at guardedInterval,
// side by side, and fails t unless every run ran.
func paperFaultSideBySide(t *testing.T, runs map[string]scenario.Scenario) (map[string]*scenario.Outcome, map[string][]byte) {
	t.Helper()
	servers := paperFleet(0, 0, 0.05, 0, 0, 0.05, 0, 0, 0)
	for name, s := range runs {
		s.Servers, s.Rate, s.Duration, s.Interval = servers, 300, 45*time.Second, guardedInterval
		runs[name] = s
	}
	outs, audits := sideBySide(t, runs)
	if len(outs) != len(runs) {
		t.Fatal("a run failed")
	}
	return outs, audits
}

// guardedInterval: a random model on 2 cores answers in 0.6-6 s, so a
// 5 s interval gives its calls a 4 s budget and most are answered.
const guardedInterval = 5 * time.Second

// underTheGuards runs the rules alone and a random-weight model on srv,
// let act without calibration, side by side in front of real HAProxies
// (the paper's fault on srv3 and srv6 of 9), and checks that the guards
// hold: no healthy server drained, no weight raised past its
// configuration, nothing re-admitted without probes, the floor's drains
// within a step of the rules alone, no step past its interval, the model
// really called, /metrics counting the calls and /status telling how the
// model became ready. extra are further flags for the model's run.
func underTheGuards(t *testing.T, srv modelServer, extra ...string) {
	statusAddr := freeAddr(t)
	var mu sync.Mutex
	var status []byte
	var metrics string
	var scrapeErr error
	runs := map[string]scenario.Scenario{
		"rules": {Policy: "rules"},
		"random-model": {Policy: "llm", Name: "random-model", StatusListen: statusAddr,
			AgentArgs: append(withArgs(srv.args, "--skip-calibration", "--llm-gate", "always"), extra...),
			At: map[time.Duration]func(*scenario.Env){40 * time.Second: func(*scenario.Env) {
				st, m, err := scrape(statusAddr)
				mu.Lock()
				status, metrics, scrapeErr = st, m, err
				mu.Unlock()
			}}},
	}
	outs, audits := paperFaultSideBySide(t, runs)
	rules, model := outs["rules"], outs["random-model"]
	sum := summarize(t, audits["random-model"])
	t.Logf("against %s: rules alone drained %v, 5xx %d; with the model drained %v, 5xx %d, flips %v; %v",
		srv.name, rules.DrainedAt, rules.Load.Err5xx, model.DrainedAt, model.Load.Err5xx, model.Flips, sum)
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
		// which may wait for the model's call (the policy's budget).
		if m > r+guardedInterval+500*time.Millisecond {
			t.Errorf("%s: the floor drained it at %v, the rules alone at %v: more than a step later", s, m, r)
		}
	}
	if sum.maxStepMs >= float64(guardedInterval/time.Millisecond) {
		t.Errorf("a step took %.0f ms, past its %v interval", sum.maxStepMs, guardedInterval)
	}
	if sum.readiesWithoutProbes > 0 {
		t.Errorf("%d readies without probes applied", sum.readiesWithoutProbes)
	}
	if sum.overflows > 0 {
		t.Errorf("%d steps lost to a context overflow", sum.overflows)
	}
	// Made, not answered in time: on a busy 2-core machine a call may
	// take longer than the step, and the floor then acts (checked above).
	if sum.asked == 0 {
		t.Fatalf("the model on %s was never called", srv.name)
	}
	mu.Lock()
	defer mu.Unlock()
	if scrapeErr != nil || status == nil {
		t.Fatalf("scrape at 40 s: %v", scrapeErr)
	}
	calls, ok := metric(metrics, "hapilot_llm_calls_total")
	if !ok || calls < 1 || calls > float64(sum.steps) {
		t.Errorf("/metrics hapilot_llm_calls_total %v (present %v), the audit %d calls in %d steps", calls, ok, sum.calls, sum.steps)
	}
	if life := lifeOf(t, status); len(life) < 3 || fmt.Sprint(life[:3]) != "[inspecting loading ready]" {
		t.Errorf("/status history %v, want inspecting, loading, ready first", life)
	}
}

// A random-weight model, let act without calibration, through each API
// of each real server: the guards hold.
func TestRealOllamaRandomModelUnderTheGuards(t *testing.T) {
	underTheGuards(t, ollamaNative(modelserver.OllamaT(t, tinyModel)))
}

func TestRealOllamaOpenAIRandomModelUnderTheGuards(t *testing.T) {
	underTheGuards(t, ollamaOpenAI(modelserver.OllamaT(t, tinyModelV1)))
}

func TestRealLlamaServerRandomModelUnderTheGuards(t *testing.T) {
	underTheGuards(t, llamaServer(t))
}

// The study's loop (bench.StudyLoop: no floor, no gate, no
// confirmation) against hapilot's, with the same random-weight model on
// a real server, beside HAProxy doing nothing: the harm each does, in
// client 5xx against static and in healthy servers drained. The
// protected run must drain no healthy server; the unprotected run's
// figures are measured, not required, and reported. llama-server answers
// the tiny model several times faster than Ollama on 2 cores, and
// --num-predict 1024 lets a random model finish a reply of byte tokens
// and free whitespace, so that its replies are valid and it acts.
func TestRealUnprotectedHarm(t *testing.T) {
	srv := llamaServer(t)
	model := withArgs(srv.args, "--skip-calibration", "--num-predict", "1024")
	runs := map[string]scenario.Scenario{
		"static":      {Policy: "static"},
		"protected":   {Policy: "llm", Name: "protected", AgentArgs: withArgs(model, "--llm-gate", "always")},
		"unprotected": {Policy: "llm", Name: "unprotected", AgentArgs: model, Build: bench.StudyLoop},
	}
	outs, audits := paperFaultSideBySide(t, runs)
	base := float64(outs["static"].Load.Err5xx)
	for _, name := range []string{"protected", "unprotected"} {
		out, sum := outs[name], summarize(t, audits[name])
		healthy := 0
		for s := range out.DrainedAt {
			if s != "srv3" && s != "srv6" {
				healthy++
			}
		}
		change := "n/a"
		if base > 0 {
			change = fmt.Sprintf("%+.0f%%", 100*(float64(out.Load.Err5xx)-base)/base)
		}
		t.Logf("%s against %s: client 5xx %d against static's %.0f (%s), healthy servers drained %d, drained %v, flips %v; %v",
			name, srv.name, out.Load.Err5xx, base, change, healthy, out.DrainedAt, out.Flips, sum)
		if name == "protected" && healthy > 0 {
			t.Errorf("the protected loop drained %d healthy servers", healthy)
		}
		if sum.steps == 0 {
			t.Errorf("%s: no steps audited", name)
		}
	}
}

// Shadow mode with the real model: the rules act (the same drains as the
// rules alone would make), and each step's audit holds the model's
// proposal beside them.
func TestRealOllamaShadow(t *testing.T) {
	o := modelserver.OllamaT(t, tinyModel)
	srv := ollamaNative(o)
	// --llm-gate always: the model is asked each step, not only about
	// what the rules leave (nothing, here).
	s := scenario.Scenario{Policy: "shadow", Name: "shadow", AgentArgs: withArgs(srv.args, "--skip-calibration", "--llm-gate", "always"),
		Servers: paperFleet(0, 0, 0.05, 0, 0, 0.05), Rate: 300, Duration: 30 * time.Second, Interval: guardedInterval}
	out := run(t, s)
	audit, err := os.ReadFile(out.AuditLog)
	if err != nil {
		t.Fatal(err)
	}
	for s := range out.DrainedAt {
		if s != "srv3" && s != "srv6" {
			t.Errorf("healthy %s drained in shadow mode", s)
		}
	}
	if _, ok := out.DrainedAt["srv3"]; !ok {
		t.Errorf("the acting rules did not drain srv3: %v", out.DrainedAt)
	}
	steps, modelSteps := 0, 0
	sc := bufio.NewScanner(bytes.NewReader(audit))
	sc.Buffer(make([]byte, 1<<20), 16<<20)
	for sc.Scan() {
		var rec struct {
			Type         agent.EventType `json:"type"`
			Policy       string          `json:"policy"`
			PolicyReport struct {
				Model *struct {
					Called bool `json:"called"`
				} `json:"model"`
				ModelError string `json:"model_error"`
			} `json:"policy_report"`
		}
		if err := json.Unmarshal(sc.Bytes(), &rec); err != nil {
			t.Fatal(err)
		}
		if rec.Type != agent.EventStep {
			continue
		}
		steps++
		if r := rec.PolicyReport; r.Model != nil && (r.Model.Called || r.ModelError != "") {
			modelSteps++
		}
	}
	t.Logf("shadow against %s: %d steps, %d with the model's word audited, drained %v", srv.name, steps, modelSteps, out.DrainedAt)
	if modelSteps == 0 {
		t.Fatalf("no step audited the model beside the rules; the last step:\n%s", tail(string(audit), 3000))
	}
}

// A model unloaded from outside (keep_alive 0, as `ollama stop` does) is
// loaded again by the agent's watch, not left cold for the next call:
// a healthy fleet under the anomaly gate makes no call that would load it.
func TestRealOllamaWatchReloadsAnUnloadedModel(t *testing.T) {
	o := modelserver.OllamaT(t, tinyModel)
	srv := ollamaNative(o)
	statusAddr := freeAddr(t)
	var mu sync.Mutex
	var status []byte
	var unloadErr, scrapeErr error
	loadedAfter := false
	s := scenario.Scenario{Policy: "llm", Name: "watch", StatusListen: statusAddr, AgentBinary: agentBinary,
		AgentArgs: withArgs(srv.args, "--skip-calibration"),
		Servers:   paperFleet(0, 0, 0), Rate: 100, Duration: 50 * time.Second, Interval: guardedInterval,
		At: map[time.Duration]func(*scenario.Env){
			5 * time.Second: func(*scenario.Env) {
				stream := false
				ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
				defer cancel()
				err := o.Client().Chat(ctx, &api.ChatRequest{Model: tinyModel.Name, Stream: &stream, KeepAlive: &api.Duration{}},
					func(api.ChatResponse) error { return nil })
				mu.Lock()
				unloadErr = err
				mu.Unlock()
			},
			48 * time.Second: func(*scenario.Env) {
				st, _, err := scrape(statusAddr)
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				defer cancel()
				ps, psErr := o.Client().ListRunning(ctx)
				mu.Lock()
				defer mu.Unlock()
				status, scrapeErr = st, errors.Join(err, psErr)
				for _, m := range ps.Models {
					if strings.HasPrefix(m.Name, tinyModel.Name) {
						loadedAfter = true
					}
				}
			},
		}}
	out := run(t, s)
	mu.Lock()
	defer mu.Unlock()
	if unloadErr != nil || scrapeErr != nil {
		t.Fatalf("unload %v, scrape %v", unloadErr, scrapeErr)
	}
	life := lifeOf(t, status)
	t.Logf("against %s: /status history %v, loaded at the end %v", srv.name, life, loadedAfter)
	if !loadedAfter {
		t.Error("the model was not loaded again")
	}
	if !strings.Contains(fmt.Sprint(life), "ready loading ready") {
		t.Errorf("/status history %v: no reload after ready", life)
	}
	if !strings.Contains(out.AgentLog(), "the model was unloaded: loading it again") {
		t.Error("the agent's log does not say the watch reloaded the model")
	}
}

// A long run at the benchmark's largest fleet, N=9 with the paper's
// fault, against the real Ollama: no step is lost to a context overflow.
// HAPILOT_LLM_LONG sets its length (10m for the figure); CI runs
// 2 minutes.
func TestRealOllamaLongRunNeverOverflows(t *testing.T) {
	d := 2 * time.Minute
	if v := os.Getenv("HAPILOT_LLM_LONG"); v != "" {
		var err error
		if d, err = time.ParseDuration(v); err != nil {
			t.Fatalf("HAPILOT_LLM_LONG: %v", err)
		}
	}
	o := modelserver.OllamaT(t, tinyModel)
	srv := ollamaNative(o)
	s := scenario.Scenario{Policy: "llm", Name: "long", AgentArgs: withArgs(srv.args, "--skip-calibration", "--llm-gate", "always"),
		Servers: paperFleet(0, 0, 0.05, 0, 0, 0.05, 0, 0, 0), Rate: 300, Duration: d, Interval: 10 * time.Second}
	out := run(t, s)
	audit, err := os.ReadFile(out.AuditLog)
	if err != nil {
		t.Fatal(err)
	}
	sum := summarize(t, audit)
	t.Logf("%v against %s: %v", d, srv.name, sum)
	if sum.overflows > 0 {
		t.Errorf("%d steps lost to a context overflow", sum.overflows)
	}
	if sum.asked == 0 {
		t.Errorf("the model on %s was never called", srv.name)
	}
}
