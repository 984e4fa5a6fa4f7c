package llm

import (
	"context"
	"encoding/json"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/hapilot/hapilot/agent"
	"github.com/hapilot/hapilot/agent/policy/rules"
	"github.com/hapilot/hapilot/haproxy"
	"github.com/hapilot/hapilot/internal/lab/fakes"
	"github.com/hapilot/hapilot/internal/lab/ollamafake"
	"github.com/hapilot/hapilot/internal/window"
	"github.com/ollama/ollama/api"
	"github.com/rs/zerolog"
)

const model = "fake-capable:latest"

// fleet is one backend of n servers, 600 requests each; faulty ones fail 5%.
func fleet(now time.Time, n int, faulty ...string) agent.Observation {
	b := agent.BackendView{Name: "app"}
	for i := 1; i <= n; i++ {
		name := "srv" + string(rune('0'+i))
		x := uint64(0)
		for _, f := range faulty {
			if f == name {
				x = 30
			}
		}
		b.Servers = append(b.Servers, agent.ServerView{Backend: "app", Server: name, Owner: agent.OwnerNone,
			State:  haproxy.ServerState{Backend: "app", Server: name, OpState: haproxy.OpRunning, Weight: 1, Initial: 1},
			Window: window.Stats{Backend: "app", Server: name, Requests: 600, Err5xx: x, P95Ms: 12, P99Ms: 14}})
	}
	return agent.Observation{Time: now, Backends: []agent.BackendView{b}}
}

func newPolicy(t *testing.T, respond ollamafake.Responder, mod func(*Config)) (*Policy, *ollamafake.Server) {
	t.Helper()
	fake := ollamafake.New(map[string]string{model: "sha256:fa4e"}, respond)
	t.Cleanup(fake.Close)
	u, _ := url.Parse(fake.URL)
	cfg := DefaultConfig()
	cfg.Model = model
	cfg.Deadline = 2 * time.Second
	if mod != nil {
		mod(&cfg)
	}
	m := &Model{Client: api.NewClient(u, fake.Client()), Config: cfg, SystemPrompt: DefaultSystemPrompt}
	return New(m, rules.New(rules.DefaultConfig()), cfg, zerolog.Nop()), fake
}

// steps runs the policy n times on obs and vets each plan as the loop
// would, returning every accepted action.
func steps(t *testing.T, p *Policy, obs agent.Observation, n int) []agent.Action {
	t.Helper()
	var accepted []agent.Action
	g := agent.DefaultGuardrails()
	for i := 0; i < n; i++ {
		plan, err := p.Decide(context.Background(), obs)
		if err != nil {
			t.Fatalf("step %d: %v", i, err)
		}
		for _, v := range g.Vet(&obs, plan) {
			if v.Accepted {
				accepted = append(accepted, v.Applied)
			}
		}
		obs.Time = obs.Time.Add(time.Second)
	}
	return accepted
}

func TestCapableModelDrainsAfterConfirmation(t *testing.T) {
	p, fake := newPolicy(t, ollamafake.Capable, nil)
	obs := fleet(time.Unix(1000, 0), 6, "srv3")
	first := steps(t, p, obs, 1)
	if len(first) != 0 {
		t.Fatalf("acted on the first proposal: %v", first)
	}
	if r := p.Report().(Report); len(r.Pending) != 1 || !r.Called {
		t.Fatalf("report %+v", r)
	}
	second := steps(t, p, obs, 1)
	if len(second) != 1 || second[0].Kind != agent.Drain || second[0].Server != "srv3" {
		t.Fatalf("second step %v", second)
	}
	// The request was what Ollama expects.
	req := fake.Requests()[0]
	if req.Stream == nil || *req.Stream || string(req.Think) != "false" || len(req.Format) == 0 || len(req.KeepAlive) == 0 {
		t.Fatalf("request stream=%v think=%s format=%d keep_alive=%s", req.Stream, req.Think, len(req.Format), req.KeepAlive)
	}
	if req.Options["temperature"] != 0.0 || req.Options["seed"] != 42.0 || req.Options["num_predict"] != 256.0 {
		t.Fatalf("options %v", req.Options)
	}
	if req.Messages[0].Role != "system" || !strings.Contains(req.Messages[1].Content, "srv3 ready none 1 600 30 5.00") {
		t.Fatalf("prompt:\n%s", req.Messages[1].Content)
	}
	var c Call
	if r := p.Report().(Report); r.Call != nil {
		c = *r.Call
	}
	if c.PromptTokens != 350 || c.CompletionTokens != 40 || c.TotalMs <= 0 || c.LoadMs <= 1 {
		t.Fatalf("call metrics %+v", c)
	}
	var m strings.Builder
	p.WriteMetrics(&m)
	for _, want := range []string{"hapilot_llm_calls_total 2\n", "hapilot_llm_prompt_tokens_total 700\n", "hapilot_llm_completion_tokens_total 80\n", "hapilot_llm_load_duration_seconds_total 0.00266"} {
		if !strings.Contains(m.String(), want) {
			t.Errorf("metrics lack %q:\n%s", want, m.String())
		}
	}
}

func TestQuietStepsMakeNoCall(t *testing.T) {
	p, fake := newPolicy(t, ollamafake.Capable, nil)
	if got := steps(t, p, fleet(time.Unix(1000, 0), 6), 5); len(got) != 0 {
		t.Fatalf("actions %v", got)
	}
	if n := len(fake.Requests()); n != 0 {
		t.Fatalf("%d calls on a quiet fleet", n)
	}
	p.Config.Gate = GateAlways
	steps(t, p, fleet(time.Unix(1000, 0), 6), 2)
	if n := len(fake.Requests()); n != 2 {
		t.Fatalf("%d calls with gate always", n)
	}
}

// Each adversarial reply leads to zero unsafe actions: the only action
// ever accepted is the drain of the faulty srv3 (by the rules fallback or
// the confirmed model), never a healthy server, never a weight out of range.
func TestAdversarialReplies(t *testing.T) {
	empty := ""
	tests := []struct {
		name     string
		respond  ollamafake.Responder
		mod      func(*Config)
		fallback bool // the step must have fallen back to the rules
		wantNote string
	}{
		{"malformed JSON", ollamafake.Fixed(`{"actions": [{"action": "drain"`), nil, true, ""},
		{"prose instead of JSON", ollamafake.Fixed(`I would drain srv3.`), nil, true, ""},
		{"unknown server", ollamafake.Fixed(ollamafake.Answer(ollamafake.Action{Action: "drain", Backend: "app", Server: "srv99", Reason: "x"})), nil, false, ""},
		{"bad name", ollamafake.Fixed(ollamafake.Answer(ollamafake.Action{Action: "drain", Backend: "app", Server: "srv1;shutdown", Reason: "x"})), nil, true, ""},
		{"drain every server", func(req ollamafake.Request) ollamafake.Reply {
			var acts []ollamafake.Action
			for i := 1; i <= 6; i++ {
				acts = append(acts, ollamafake.Action{Action: "drain", Backend: "app", Server: "srv" + string(rune('0'+i)), Reason: "all bad"})
			}
			return ollamafake.Reply{Content: ollamafake.Answer(acts...)}
		}, nil, false, ""},
		{"weight 1000", ollamafake.Fixed(`{"actions":[{"action":"set_weight","backend":"app","server":"srv1","weight":1000,"reason":"more"}]}`), nil, true, ""},
		{"weight cut on a healthy server", ollamafake.Fixed(`{"actions":[{"action":"set_weight","backend":"app","server":"srv1","weight":0,"reason":"less"}]}`), nil, false, ""},
		{"unknown action", ollamafake.Fixed(`{"actions":[{"action":"reboot","backend":"app","server":"srv1","reason":"x"}]}`), nil, true, ""},
		{"extra field", ollamafake.Fixed(`{"actions":[],"note":"hi"}`), nil, true, ""},
		{"reply after the deadline", func(req ollamafake.Request) ollamafake.Reply {
			r := ollamafake.Capable(req)
			r.Delay = 300 * time.Millisecond
			return r
		}, func(c *Config) { c.Deadline = 100 * time.Millisecond }, true, ""},
		{"HTTP 500", func(ollamafake.Request) ollamafake.Reply {
			return ollamafake.Reply{Status: 500, Error: "llama runner process has terminated"}
		}, nil, true, ""},
		{"empty body", func(ollamafake.Request) ollamafake.Reply { return ollamafake.Reply{RawBody: &empty} }, nil, true, ""},
		{"think unsupported", ollamafake.Capable, func(c *Config) { c.Think = "on" }, true, "does not support thinking"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			p, _ := newPolicy(t, tc.respond, tc.mod)
			obs := fleet(time.Unix(1000, 0), 6, "srv3")
			plan, err := p.Decide(context.Background(), obs)
			if err != nil {
				t.Fatal(err)
			}
			r := p.Report().(Report)
			if (r.Fallback != "") != tc.fallback {
				t.Fatalf("fallback %q, want fallback=%v (call %+v)", r.Fallback, tc.fallback, r.Call)
			}
			if tc.wantNote != "" && !strings.Contains(r.ThinkNote, "does not support thinking") {
				t.Fatalf("think note %q", r.ThinkNote)
			}
			accepted := steps(t, p, obs, 4)
			for _, v := range agent.DefaultGuardrails().Vet(&obs, plan) {
				if v.Accepted {
					accepted = append(accepted, v.Applied)
				}
			}
			for _, a := range accepted {
				if a.Kind != agent.Drain || a.Server != "srv3" {
					t.Fatalf("unsafe action %+v (report %+v)", a, p.Report())
				}
			}
		})
	}
}

func TestInvalidReplyIsAudited(t *testing.T) {
	p, _ := newPolicy(t, ollamafake.Fixed("not json at all"), nil)
	if _, err := p.Decide(context.Background(), fleet(time.Unix(1000, 0), 3, "srv1")); err != nil {
		t.Fatal(err)
	}
	r := p.Report().(Report)
	if r.Call == nil || r.Call.Raw != "not json at all" || r.Call.Error == "" {
		t.Fatalf("report %+v", r)
	}
	if p.counters.invalid != 1 || p.counters.fallbacks != 1 {
		t.Fatalf("counters %+v", p.counters)
	}
}

// A model that readies what the agent drained, every cycle, is held: the
// drained server's window still condemns it.
func TestFlipFlopIsHeld(t *testing.T) {
	// Gate "always": with the anomaly gate a drained server is no
	// candidate, so the model would not even be asked.
	p, _ := newPolicy(t, ollamafake.FlipFlop, func(c *Config) { c.Gate = "always" })
	now := time.Unix(1000, 0)
	obs := fleet(now, 6, "srv3")
	s := &obs.Backends[0].Servers[2]
	s.State.AdminState = haproxy.AdminForcedDrain
	s.Owner, s.Changed = agent.OwnerAgent, &agent.Change{Phase: agent.PhaseDrained, At: now.Add(-10 * time.Second)}
	if got := steps(t, p, obs, 6); len(got) != 0 {
		t.Fatalf("actions %v", got)
	}
	if r := p.Report().(Report); len(r.Held) != 1 {
		t.Fatalf("report %+v", r)
	}
}

func TestThinkingSwitchedOffWhenOverBudget(t *testing.T) {
	p, fake := newPolicy(t, func(req ollamafake.Request) ollamafake.Reply {
		r := ollamafake.Capable(req)
		r.CompletionTokens = 1500
		return r
	}, func(c *Config) { c.Think = "high" })
	fake.Thinking = true
	obs := fleet(time.Unix(1000, 0), 6, "srv3")
	steps(t, p, obs, 3)
	reqs := fake.Requests()
	if string(reqs[0].Think) != `"high"` || string(reqs[1].Think) != "false" || string(reqs[2].Think) != "false" {
		t.Fatalf("think sent: %s %s %s", reqs[0].Think, reqs[1].Think, reqs[2].Think)
	}
}

func TestParseReply(t *testing.T) {
	plan, err := ParseReply(`{"actions":[{"action":"set_weight","backend":"app","server":"s1","weight":10,"reason":"r"},{"action":"no_op","backend":"-","server":"-","reason":"r"}]}`)
	if err != nil || len(plan) != 1 || plan[0].Weight != 10 {
		t.Fatalf("%+v %v", plan, err)
	}
	for _, bad := range []string{`{}`, `[]`, `{"actions":[{"action":"drain","backend":"app","server":"s1","weight":3,"reason":"r"}]}`,
		`{"actions":[]} {"actions":[]}`, `{"actions":[{"action":"set_weight","backend":"app","server":"s1","reason":"r"}]}`} {
		if _, err := ParseReply(bad); err == nil {
			t.Errorf("accepted %s", bad)
		}
	}
}

func TestPromptHidesQuietServersInLargeFleets(t *testing.T) {
	obs := fleet(time.Unix(1000, 0), 9, "srv5")
	p := Prompt(obs, nil, 4)
	if !strings.Contains(p, "srv5 ready") || !strings.Contains(p, "(5 more servers") {
		t.Fatalf("prompt:\n%s", p)
	}
	b, _ := json.Marshal(obs)
	if len(p) > len(b)/4 {
		t.Errorf("prompt of %d bytes for an observation of %d", len(p), len(b))
	}
}

func TestCalibrationScorecard(t *testing.T) {
	tests := []struct {
		name    string
		respond ollamafake.Responder
		pass    bool
	}{
		{"capable", ollamafake.Capable, true},
		{"trigger-happy", ollamafake.TriggerHappy, false},
		{"garbage", ollamafake.Fixed("no"), false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			p, _ := newPolicy(t, tc.respond, nil)
			sc, err := Calibrate(context.Background(), p.Model, time.Second, time.Unix(5000, 0))
			if err != nil {
				t.Fatal(err)
			}
			var out strings.Builder
			sc.Print(&out)
			t.Logf("\n%s", out.String())
			if len(sc.Scenarios) < 10 || sc.Passed != tc.pass || sc.Digest != "sha256:fa4e" {
				t.Fatalf("passed %v (%s), %d scenarios", sc.Passed, sc.Why, len(sc.Scenarios))
			}
			dir := t.TempDir()
			if _, err := sc.Save(dir); err != nil {
				t.Fatal(err)
			}
			back, err := Load(dir, sc.Digest)
			if err != nil || back.Passed != sc.Passed || back.Precision != sc.Precision {
				t.Fatalf("record %+v %v", back, err)
			}
		})
	}
}

func TestShadowAuditsDisagreement(t *testing.T) {
	p, _ := newPolicy(t, ollamafake.TriggerHappy, func(c *Config) { c.Confirm = 1 })
	s := &Shadow{Model: p, Acting: rules.New(rules.DefaultConfig())}
	obs := fleet(time.Unix(1000, 0), 6)
	obs.Backends[0].Servers[0].Window.Err5xx = 4 // a few errors: enough for the loose gate, not for the rules
	plan, err := s.Decide(context.Background(), obs)
	if err != nil {
		t.Fatal(err)
	}
	if len(plan) != 0 {
		t.Fatalf("acting plan %v", plan)
	}
	r := s.Report().(ShadowReport)
	if !r.Model.Called || !r.Disagreement || len(r.OnlyModel) != 1 || r.OnlyModel[0] != "drain app/srv1 0" || len(r.OnlyActing) != 0 {
		t.Fatalf("report %+v", r)
	}
	t.Logf("shadow report: %+v", r)
}

// A model slower than the interval never makes the loop late: each call
// is cut at its deadline, the rules decide that step, and steps stay on
// start + k·interval with none skipped.
func TestSlowModelKeepsTheSchedule(t *testing.T) {
	p, _ := newPolicy(t, func(req ollamafake.Request) ollamafake.Reply {
		r := ollamafake.Capable(req)
		r.Delay = 2 * time.Second
		return r
	}, func(c *Config) { c.Deadline = 200 * time.Millisecond; c.Gate = "always" })
	obs := fleet(time.Now(), 3, "srv3")
	var states []haproxy.ServerState
	var stats []window.Stats
	for _, s := range obs.Backends[0].Servers {
		states = append(states, s.State)
		stats = append(stats, s.Window)
	}
	rt := fakes.WithStates("fake", states)
	audit := &strings.Builder{}
	l := &agent.Loop{Clock: agent.RealClock{}, Interval: 250 * time.Millisecond, Policy: p, Guard: agent.DefaultGuardrails(),
		Runtimes: []agent.Runtime{rt}, Windows: fakes.NewWindows(stats...), Audit: audit, Log: zerolog.Nop()}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second+100*time.Millisecond)
	defer cancel()
	start := time.Now()
	if err := l.Run(ctx); err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(audit.String()), "\n")
	if m := l.Metrics(); len(lines) < 8 || m.Skipped != 0 {
		t.Fatalf("%d steps in %v; counters %+v", len(lines), time.Since(start), m)
	}
	if p.counters.deadlineMisses < 7 || p.counters.fallbacks != p.counters.deadlineMisses {
		t.Fatalf("deadline misses %d, fallbacks %d", p.counters.deadlineMisses, p.counters.fallbacks)
	}
	var rec agent.Record
	if err := json.Unmarshal([]byte(lines[0]), &rec); err != nil {
		t.Fatal(err)
	}
	if len(rec.Plan) != 1 || rec.Plan[0].Server != "srv3" {
		t.Fatalf("fallback plan %+v", rec.Plan)
	}
	t.Logf("one audit record: %s", lines[0])
}
