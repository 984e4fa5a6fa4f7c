//go:build e2e

package e2e

import (
	"encoding/json"
	"encoding/xml"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/hapilot/hapilot/internal/lab/bench"
)

// `hapilot-bench bench` end to end, as a researcher runs it: the paper scenario
// at N=3 in compressed time, rules and an emulated capable model with and
// without protections, each paired with static; every run's result.json,
// report.md and charts, the summary, and --report writing them again.
func TestBenchCommand(t *testing.T) {
	t.Parallel()
	out := t.TempDir()
	cmd := exec.Command(benchBinary, "bench", "--scenario", "paper", "--servers", "3", "--steps", "30", "--interval", "1s",
		"--policy", "rules,llm", "--emulate", "capable", "--protections", "on,off", "--out", out)
	cmd.Env = append(os.Environ(), "CI=true")
	stdout, err := cmd.CombinedOutput()
	t.Logf("%s", stdout)
	if err != nil {
		t.Fatalf("hapilot-bench bench: %v", err)
	}
	// The side-by-side table of the cell, each policy's row saying what
	// decides (an emulation is marked as one).
	for _, want := range []string{"**paper n=3 roundrobin**", "| static | HAProxy alone |", "| rules | hapilot rules |",
		"| llm/capable | emulated model |", "| llm/capable/unprotected | emulated model |"} {
		if !strings.Contains(string(stdout), want) {
			t.Errorf("table has no row %q", want)
		}
	}
	runs := map[string]*bench.RunResult{}
	for _, v := range []string{"static", "rules", "llm-capable", "llm-capable-unprotected"} {
		dir := filepath.Join(out, "paper", "n3-roundrobin", v)
		b, err := os.ReadFile(filepath.Join(dir, "result.json"))
		if err != nil {
			t.Fatal(err)
		}
		r := &bench.RunResult{}
		if err := json.Unmarshal(b, r); err != nil {
			t.Fatalf("%s result.json: %v", v, err)
		}
		runs[v] = r
		for _, svg := range []string{"5xx.svg", "states.svg", "latency.svg"} {
			wellFormed(t, filepath.Join(dir, svg))
		}
		if md, _ := os.ReadFile(filepath.Join(dir, "report.md")); !strings.Contains(string(md), "| static |") {
			t.Errorf("%s report.md has no table:\n%s", v, md)
		}
	}
	static, rules := runs["static"], runs["rules"]
	if static.Client.Client5xx == 0 || static.Agent != nil {
		t.Errorf("static: %d client 5xx (a 5%% fault must show), agent %v (none runs)", static.Client.Client5xx, static.Agent)
	}
	if l := rules.Loc; l.TP != 1 || l.FP != 0 || !l.EndCorrect || l.ResolutionS == nil {
		t.Errorf("rules: %+v, want srv3 drained, alone, to the end", l)
	}
	if rules.Client.Reduction == nil || *rules.Client.Reduction <= 0 || rules.Static.Client5xx != static.Client.Client5xx {
		t.Errorf("rules: reduction %v against static %d", rules.Client.Reduction, rules.Static.Client5xx)
	}
	if a := rules.Agent; a == nil || a.StepsCompleted < 10 || a.TimeToActionS == nil || a.CompletionTokens != 0 {
		t.Errorf("rules agent: %+v", a)
	}
	capable, unprotected := runs["llm-capable"], runs["llm-capable-unprotected"]
	if !capable.Emulated || capable.Config.Model != "emulation:capable" || capable.Config.StudyLoop {
		t.Errorf("capable: emulated %v, model %q, args %v", capable.Emulated, capable.Config.Model, capable.Config.AgentArgs)
	}
	if g := capable.Config.Calibration; g == nil || !g.Passed || unprotected.Config.Calibration != nil {
		t.Errorf("capability gate: protected %+v (want passed), unprotected %+v (want none)", g, unprotected.Config.Calibration)
	}
	if !unprotected.Config.StudyLoop {
		t.Errorf("unprotected: not the study's loop (args %v)", unprotected.Config.AgentArgs)
	}
	for _, r := range []*bench.RunResult{capable, unprotected} {
		if r.Loc.TP != 1 || r.Loc.FP != 0 || r.Agent == nil {
			t.Errorf("%s: %+v, agent %+v", r.Variant, r.Loc, r.Agent)
		}
	}
	// The unprotected model is asked every step. The protected one only
	// while a candidate stands and the floor has not drained it yet: from
	// a cold start, the 2 to 3 s between the candidates' looser threshold
	// and the floor's, which a busy machine's steps may skip (one run in
	// make test's parallel e2e suite asked it never, the floor drained).
	if a := unprotected.Agent; a == nil || a.CompletionTokens == 0 || a.AvoidedPer1kTokens == nil {
		t.Errorf("unprotected: agent %+v, want the model asked", a)
	}
	// The unprotected model is asked every step; the protected one only
	// when the windows show a candidate.
	if unprotected.Agent.PromptTokens <= capable.Agent.PromptTokens {
		t.Errorf("prompt tokens: unprotected %d, protected %d", unprotected.Agent.PromptTokens, capable.Agent.PromptTokens)
	}

	summary, err := os.ReadFile(filepath.Join(out, "summary.md"))
	if err != nil || !strings.Contains(string(summary), "emulated model") || !strings.Contains(string(summary), "precision (micro)") {
		t.Errorf("summary.md: %v\n%s", err, summary)
	}
	for _, want := range []string{"| paper n=3 roundrobin | static |", "| paper n=3 roundrobin | rules |",
		"| paper n=3 roundrobin | llm/capable (emulated) |", "| paper n=3 roundrobin | llm/capable/unprotected (emulated) |"} {
		if !strings.Contains(string(summary), want) {
			t.Errorf("summary.md has no row %q", want)
		}
	}
	wellFormed(t, filepath.Join(out, "summary.svg"))
	// --report writes the same tables again from result.json alone.
	again, err := exec.Command(benchBinary, "bench", "--report", out).CombinedOutput()
	if err != nil {
		t.Fatalf("bench --report: %v\n%s", err, again)
	}
	resummary, _ := os.ReadFile(filepath.Join(out, "summary.md"))
	if string(resummary) != string(summary) {
		t.Errorf("--report changed summary.md:\n%s\nwas\n%s", resummary, summary)
	}
}

func wellFormed(t *testing.T, path string) {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	d := xml.NewDecoder(f)
	for {
		if _, err := d.Token(); err == io.EOF {
			return
		} else if err != nil {
			t.Fatalf("%s: not well-formed SVG: %v", path, err)
		}
	}
}
