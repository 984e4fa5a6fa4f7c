package bench

import (
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/hapilot/hapilot/internal/lab/fleet"
	"github.com/hapilot/hapilot/internal/lab/scenario"
)

const step = 10 * time.Second

func tr(k float64, drained bool) scenario.Transition {
	return scenario.Transition{At: time.Duration(k * float64(step)), Drained: drained}
}

func truth(faulty ...string) Truth {
	return Truth{Servers: []string{"srv1", "srv2", "srv3", "srv4", "srv5", "srv6"}, Faulty: faulty, EndFaulty: faulty, Steps: 60, Interval: step}
}

func f(v *float64) string {
	if v == nil {
		return "nil"
	}
	return strconv.FormatFloat(*v, 'f', -1, 64)
}

func boolStr(b bool) string { return strconv.FormatBool(b) }

func itoa(i int) string { return strconv.Itoa(i) }

func TestLocalise(t *testing.T) {
	tests := []struct {
		name  string
		tl    map[string][]scenario.Transition
		truth Truth
		// want, as printed: precision recall f1 everExact endCorrect flipsFaulty flipsHealthy resolution
		want string
	}{
		{
			// The example: drained at step 3, undone at 5, drained
			// again at 8: three flips, resolved at step 3 (30 s).
			name:  "drain undo drain",
			tl:    map[string][]scenario.Transition{"srv3": {tr(3, true), tr(5, false), tr(8, true)}},
			truth: truth("srv3"),
			want:  "p=1 r=1 f1=1 exact=true end=true flipsF=3 flipsH=0 res=30 tp=1 fp=0 fn=0",
		},
		{
			name:  "never acted",
			tl:    nil,
			truth: truth("srv3", "srv6"),
			want:  "p=nil r=0 f1=0 exact=false end=false flipsF=0 flipsH=0 res=nil tp=0 fp=0 fn=2",
		},
		{
			// Resolved only once the second drain lands; a healthy drain
			// at step 2 undone at 4 costs precision and two healthy flips.
			name: "one healthy mistake then both faulty",
			tl: map[string][]scenario.Transition{
				"srv1": {tr(2, true), tr(4, false)},
				"srv3": {tr(1, true)},
				"srv6": {tr(4.5, true)},
			},
			truth: truth("srv3", "srv6"),
			want:  "p=0.6666666666666666 r=1 f1=0.8 exact=true end=true flipsF=1 flipsH=0.5 res=45 tp=2 fp=1 fn=0",
		},
		{
			// Exact match only between step ends: the drained set equals
			// the faulty set from 1.2 to 1.8 steps, never at a step's end;
			// resolution is still timed, exact match is not.
			name:  "exact between steps only",
			tl:    map[string][]scenario.Transition{"srv3": {tr(1.2, true), tr(1.8, false)}},
			truth: truth("srv3"),
			want:  "p=1 r=1 f1=1 exact=false end=false flipsF=2 flipsH=0 res=12 tp=1 fp=0 fn=0",
		},
		{
			name:  "fleet-wide fault, nothing drained",
			tl:    nil,
			truth: truth(),
			want:  "p=nil r=nil f1=nil exact=nil end=true flipsF=nil flipsH=0 res=nil tp=0 fp=0 fn=0",
		},
		{
			name:  "fleet-wide fault, one drained",
			tl:    map[string][]scenario.Transition{"srv2": {tr(6, true)}},
			truth: truth(),
			want:  "p=0 r=nil f1=nil exact=nil end=false flipsF=nil flipsH=0.16666666666666666 res=nil tp=0 fp=1 fn=0",
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			l := Localise(tc.tl, tc.truth)
			exact := "nil"
			if l.EverExact != nil {
				exact = boolStr(*l.EverExact)
			}
			got := "p=" + f(l.Precision) + " r=" + f(l.Recall) + " f1=" + f(l.F1) + " exact=" + exact +
				" end=" + boolStr(l.EndCorrect) + " flipsF=" + f(l.FlipsFaulty) + " flipsH=" + f(l.FlipsHealthy) +
				" res=" + f(l.ResolutionS) + " tp=" + itoa(l.TP) + " fp=" + itoa(l.FP) + " fn=" + itoa(l.FN)
			if got != tc.want {
				t.Errorf("\n got %s\nwant %s", got, tc.want)
			}
		})
	}
}

func TestReadmitAfterHeal(t *testing.T) {
	base := truth("srv3", "srv6")
	base.EndFaulty, base.Heal = nil, 30*step
	tests := []struct {
		name string
		tl   map[string][]scenario.Transition
		want string
	}{
		{"both back", map[string][]scenario.Transition{"srv3": {tr(1, true), tr(33, false)}, "srv6": {tr(2, true), tr(35, false)}}, "50"},
		{"one still out", map[string][]scenario.Transition{"srv3": {tr(1, true), tr(33, false)}, "srv6": {tr(2, true)}}, "nil"},
		{"back, out again, back", map[string][]scenario.Transition{"srv3": {tr(1, true), tr(31, false), tr(32, true), tr(40, false)}}, "100"},
		{"never drained", nil, "0"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			l := Localise(tc.tl, base)
			if got := f(l.ReadmitS); got != tc.want {
				t.Errorf("readmitted after %s s, want %s", got, tc.want)
			}
		})
	}
}

func TestClientAgainstStatic(t *testing.T) {
	static := Client{Client5xx: 200, MeanMs: 10, P50Ms: 10, P95Ms: 12, P99Ms: 14}
	c := Client{Client5xx: 10, MeanMs: 11, P50Ms: 10, P95Ms: 15, P99Ms: 21}
	c.Against(static)
	if got := f(c.Reduction) + " " + f(c.MeanRatio) + " " + f(c.P95Ratio) + " " + f(c.P99Ratio); got != "0.95 1.1 1.25 1.5" {
		t.Errorf("reduction and ratios %s", got)
	}
	var none Client
	none.Against(Client{})
	if none.Reduction != nil || none.P99Ratio != nil {
		t.Error("ratios to a static run with no 5xx and no latency must be nil")
	}
}

func TestClientViewCountsUnansweredAs5xx(t *testing.T) {
	r := &fleet.Result{Completed: 90, Failed: 10, Err5xx: 5}
	if c := ClientView(r); c.Requests != 100 || c.Client5xx != 15 || c.Failed != 10 {
		t.Errorf("%+v", c)
	}
}

func TestAgentView(t *testing.T) {
	start := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
	line := func(sec float64, cmds int, prompt, completion int, miss bool) string {
		at := start.Add(time.Duration(sec * float64(time.Second))).Format(time.RFC3339Nano)
		c := `[]`
		if cmds > 0 {
			c = `[{"socket":"unix:/x","command":"set server app/srv3 state drain"}]`
		}
		rep := `{"called":false}`
		if prompt > 0 {
			rep = `{"called":true,"deadline_miss":` + boolStr(miss) + `,"call":{"prompt_tokens":` + itoa(prompt) + `,"completion_tokens":` + itoa(completion) + `}}`
		}
		return `{"time":"` + at + `","cycle":1,"policy":"llm","commands":` + c + `,"policy_report":` + rep + "}\n"
	}
	audit := line(-0.5, 1, 0, 0, false) + // before the load: not the run's
		line(0.01, 0, 350, 40, false) +
		line(10.01, 0, 350, 1500, true) +
		line(22.01, 1, 350, 40, false) +
		line(30.01, 0, 0, 0, false) +
		line(40.5, 0, 0, 0, false) // after 4 steps of 10 s: not the run's
	a, marks, err := AgentView(strings.NewReader(audit), start, 4, step)
	if err != nil {
		t.Fatal(err)
	}
	got := "steps=" + itoa(a.StepsCompleted) + "/" + itoa(a.StepsPlanned) + " cadence=" + f(a.CadenceS) + " misses=" + itoa(a.DeadlineMisses) +
		" action=" + f(a.TimeToActionS) + " cmds=" + itoa(a.Commands) + " prompt=" + itoa(a.PromptTokens) + " completion=" + itoa(a.CompletionTokens)
	if want := "steps=4/4 cadence=10 misses=1 action=22.01 cmds=1 prompt=1050 completion=1580"; got != want {
		t.Errorf("\n got %s\nwant %s", got, want)
	}
	a.Avoided(Client{Client5xx: 21}, Client{Client5xx: 100})
	if got := f(a.AvoidedPer1kTokens); got != "50" {
		t.Errorf("avoided per 1k tokens %s, want (100-21)/1.58 = 50", got)
	}
	// The commands of the run's steps, and none from before it.
	if len(marks) != 1 || marks[0].AtS != 22.01 || marks[0].Command != "set server app/srv3 state drain" {
		t.Errorf("marks %+v", marks)
	}
	if _, _, err := AgentView(strings.NewReader("{not json\n"), start, 4, step); err == nil {
		t.Error("a garbled audit line must be an error")
	}
}

// The model's own actions: those of the LLM policy's model_plan not in
// its floor that the guardrails accepted, and of them the drains of
// servers the run holds healthy. A policy with no model has none.
func TestAgentViewModelActions(t *testing.T) {
	start := time.Date(2026, 12, 5, 0, 0, 0, 0, time.UTC)
	llm := `{"type":"step","time":"2026-12-05T00:00:01Z","policy":"llm",` +
		// the floor drains srv1; the model drains srv1 (the floor's), srv2
		// and srv4, and cuts srv5; srv4's drain is refused
		`"policy_report":{"called":true,"floor":[{"kind":"drain","backend":"app","server":"srv1"}],` +
		`"model_plan":[{"kind":"drain","backend":"app","server":"srv1"},{"kind":"drain","backend":"app","server":"srv2"},{"kind":"drain","backend":"app","server":"srv4"},{"kind":"set_weight","backend":"app","server":"srv5","weight":50}]},` +
		`"verdicts":[{"proposed":{"kind":"drain","backend":"app","server":"srv1"},"accepted":true,"applied":{"kind":"drain","backend":"app","server":"srv1"}},` +
		`{"proposed":{"kind":"drain","backend":"app","server":"srv2"},"accepted":true,"applied":{"kind":"drain","backend":"app","server":"srv2"}},` +
		`{"proposed":{"kind":"drain","backend":"app","server":"srv4"},"accepted":false,"code":"max_drained"},` +
		`{"proposed":{"kind":"set_weight","backend":"app","server":"srv5","weight":50},"accepted":true,"applied":{"kind":"set_weight","backend":"app","server":"srv5","weight":50}}]}
{"type":"step","time":"2026-12-05T00:00:02Z","policy":"llm","policy_report":{"called":false}}
`
	a, _, err := AgentView(strings.NewReader(llm), start, 10, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	a.Score([]string{"srv1", "srv5"})
	var got []string
	for _, m := range a.ModelActions {
		got = append(got, string(m.Kind)+" "+m.Server)
	}
	if want := "drain srv2,set_weight srv5"; strings.Join(got, ",") != want || a.ModelHealthyDrains == nil || *a.ModelHealthyDrains != 1 {
		t.Errorf("model actions %v, healthy drains %v; want %s and 1 (srv2)", got, a.ModelHealthyDrains, want)
	}
	// A model that was asked and added nothing: none, counted as 0.
	a, _, _ = AgentView(strings.NewReader(`{"type":"step","time":"2026-12-05T00:00:01Z","policy_report":{"called":true}}`+"\n"), start, 10, time.Second)
	if a.Score(nil); a.ModelActions == nil || a.ModelHealthyDrains == nil || *a.ModelHealthyDrains != 0 {
		t.Errorf("an LLM run whose model added nothing: %v, %v; want none, counted", a.ModelActions, a.ModelHealthyDrains)
	}
	// The rules: no model, nothing counted.
	rules := `{"type":"step","time":"2026-12-05T00:00:01Z","policy":"rules","verdicts":[{"proposed":{"kind":"drain","backend":"app","server":"srv2"},"accepted":true,"applied":{"kind":"drain","backend":"app","server":"srv2"}}]}` + "\n"
	a, _, _ = AgentView(strings.NewReader(rules), start, 10, time.Second)
	if a.Score(nil); a.ModelActions != nil || a.ModelHealthyDrains != nil {
		t.Errorf("the rules: model actions %v, %v; want none", a.ModelActions, a.ModelHealthyDrains)
	}
}

// The agent's events share the audit log with its steps: only the steps
// count as steps, and only their commands as marks.
func TestAgentViewSkipsEvents(t *testing.T) {
	start := time.Date(2026, 12, 3, 0, 0, 0, 0, time.UTC)
	log := `{"schema":1,"type":"start","time":"2026-12-03T00:00:00.5Z"}
{"schema":1,"type":"step","time":"2026-12-03T00:00:01Z","commands":[{"command":"set server app/srv3 state drain"}]}
{"schema":1,"type":"drain","time":"2026-12-03T00:00:01Z","server":"app/srv3"}
{"time":"2026-12-03T00:00:02Z","commands":[]}
`
	a, marks, err := AgentView(strings.NewReader(log), start, 10, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if a.StepsCompleted != 2 || a.Commands != 1 || len(marks) != 1 {
		t.Fatalf("steps %d, commands %d, marks %v", a.StepsCompleted, a.Commands, marks)
	}
}
