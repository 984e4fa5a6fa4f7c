package bench

import (
	"bytes"
	"flag"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/hapilot/hapilot/internal/lab/fleet"
	"github.com/hapilot/hapilot/internal/lab/scenario"
)

var update = flag.Bool("update", false, "rewrite testdata golden files")

// fixture is a sweep cell of hand-made runs: static, the rules, and an
// emulated model that drained a healthy server once.
func fixture(t *testing.T) []*RunResult {
	truth := Truth{Servers: []string{"srv1", "srv2", "srv3"}, Faulty: []string{"srv3"}, EndFaulty: []string{"srv3"}, Steps: 6, Interval: step}
	static := &RunResult{Variant: "static", Cell: Cell{"paper", 3, "roundrobin"}, Dir: t.TempDir(),
		Client: Client{Requests: 9000, Client5xx: 150, MeanMs: 11, P50Ms: 11, P95Ms: 13, P99Ms: 14},
		Config: RunSettings{Steps: 6, Interval: "10s", Weight: 100, Rate: 150, Seed: 1, Telemetry: "spoe", Capacity: 4}}
	static.Static = static.Client
	static.Loc = Localise(nil, truth)
	rules := &RunResult{Variant: "rules", Cell: static.Cell, Dir: t.TempDir(), Config: static.Config,
		Client: Client{Requests: 9000, Client5xx: 9, MeanMs: 11, P50Ms: 11, P95Ms: 13.5, P99Ms: 15}, Static: static.Client,
		Loc:   Localise(map[string][]scenario.Transition{"srv3": {tr(0.45, true)}}, truth),
		Agent: &Agent{StepsPlanned: 6, StepsCompleted: 6, CadenceS: ptr(10.0), TimeToActionS: ptr(4.5), Commands: 1}}
	rules.Client.Against(static.Client)
	rules.Loc.DetectS = ptr(4.5)
	model := &RunResult{Variant: "llm/flip-flop/unprotected", Emulated: true, Cell: static.Cell, Dir: t.TempDir(), Config: static.Config,
		Client: Client{Requests: 9000, Client5xx: 60, MeanMs: 12, P50Ms: 11, P95Ms: 20, P99Ms: 30}, Static: static.Client,
		Loc: Localise(map[string][]scenario.Transition{"srv3": {tr(1, true), tr(2, false), tr(3, true)}, "srv1": {tr(4, true), tr(5, false)}}, truth),
		Agent: &Agent{StepsPlanned: 6, StepsCompleted: 5, CadenceS: ptr(12.0), TimeToActionS: ptr(10.0), Commands: 5,
			DeadlineMisses: 1, PromptTokens: 1750, CompletionTokens: 200, PromptPerStep: 350, CompletionPerStep: 40}}
	model.Client.Against(static.Client)
	model.Loc.DetectS = ptr(1.0)
	model.Config.Model, model.Config.AgentArgs, model.Config.StudyLoop = "emulation:flip-flop", []string{"--model", "emulated-flip-flop"}, true
	model.Agent.Avoided(model.Client, static.Client)
	for _, r := range []*RunResult{static, rules, model} {
		r.Config.Backends = []BackendSettings{{Server: "srv1"}, {Server: "srv2"}, {Server: "srv3", ErrorRate: 0.05}}
		r.Truth = TruthView{About: "srv3 fails 5%", Expect: "drain srv3", Faulty: []string{"srv3"}, EndFaulty: []string{"srv3"}}
		r.Series = Series{PerSecond: []fleet.Second{{Requests: 150, Err5xx: 3}}, States: map[string][]scenario.StateChange{"srv3": {{At: 0, State: "ready", Weight: 100}, {At: 4500 * time.Millisecond, State: "drain", Weight: 100}}}}
	}
	model.Series.Actions = []ActionMark{{AtS: 10, Command: "set server app/srv3 state drain"}, {AtS: 20, Command: "set server app/srv3 state ready"}}
	return []*RunResult{static, rules, model}
}

func golden(t *testing.T, name string, got []byte) {
	t.Helper()
	path := filepath.Join("testdata", name)
	if *update {
		if err := os.WriteFile(path, got, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Errorf("%s differs (go test -run %s -update to accept):\n%s", path, t.Name(), got)
	}
}

func TestTableGolden(t *testing.T) {
	var b bytes.Buffer
	WriteTable(&b, fixture(t))
	golden(t, "table.golden", b.Bytes())
}

func TestRunReportGolden(t *testing.T) {
	runs := fixture(t)
	if err := writeRun(runs[2]); err != nil {
		t.Fatal(err)
	}
	md, err := os.ReadFile(filepath.Join(runs[2].Dir, "report.md"))
	if err != nil {
		t.Fatal(err)
	}
	golden(t, "report.golden", md)
}

// Sweep aggregates: precision and recall micro-averaged, counts summed.
func TestSummarise(t *testing.T) {
	runs := fixture(t)
	second := *runs[2]
	second.Loc = Localise(nil, Truth{Servers: []string{"srv1", "srv2", "srv3"}, Faulty: []string{"srv3"}, EndFaulty: []string{"srv3"}, Steps: 6, Interval: step})
	aggs := Summarise(append(runs, &second))
	if len(aggs) != 2 || aggs[1].Variant != "llm/flip-flop/unprotected" || aggs[1].Runs != 2 {
		t.Fatalf("%+v", aggs)
	}
	// tp 1, fp 1, fn 1 over the two runs.
	a := aggs[1]
	if f(a.Precision) != "0.5" || f(a.Recall) != "0.5" || f(a.F1) != "0.5" || a.EndCorrect != 0.5 {
		t.Errorf("precision %s recall %s f1 %s end %v", f(a.Precision), f(a.Recall), f(a.F1), a.EndCorrect)
	}
	if a.MaxResolutionS == nil || *a.MaxResolutionS != -1 {
		t.Errorf("a run that never resolved must flag the aggregate: %v", a.MaxResolutionS)
	}
}
