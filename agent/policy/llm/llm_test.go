package llm

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hapilot/hapilot/agent"
	"github.com/hapilot/hapilot/agent/guard"
	"github.com/hapilot/hapilot/agent/loop"
	"github.com/hapilot/hapilot/agent/policy/llm/calibrate/fixtures"
	"github.com/hapilot/hapilot/agent/policy/llm/modelapi"
	"github.com/hapilot/hapilot/agent/policy/llm/prompt"
	"github.com/hapilot/hapilot/agent/policy/rules"
	"github.com/hapilot/hapilot/haproxy"
	"github.com/hapilot/hapilot/internal/lab/fakes"
	"github.com/hapilot/hapilot/internal/lab/ollamafake"
	"github.com/hapilot/hapilot/internal/lib/window"
	"github.com/ollama/ollama/api"
	"github.com/rs/zerolog"
)

// These tests meet the Ollama stand-in (internal/lab/ollamafake) through
// Ollama's own client. The emulated models test the plumbing and the
// guards, not a model's judgment.

const model = "fake-capable:latest"

// fleet is one backend of n servers, 1,200 requests a minute each;
// faulty ones fail 5%, clearly: the rules' floor drains them on its own
// (its sequential test, on the window read a second at a time: see steps).
func fleet(now time.Time, n int, faulty ...string) agent.Observation {
	b := agent.BackendView{Name: "app"}
	for i := 1; i <= n; i++ {
		name := "srv" + string(rune('0'+i))
		x := uint64(0)
		for _, f := range faulty {
			if f == name {
				x = 60
			}
		}
		b.Servers = append(b.Servers, agent.ServerView{Backend: "app", Server: name, Owner: agent.OwnerNone,
			State:  haproxy.ServerState{Backend: "app", Server: name, OpState: haproxy.OpRunning, Weight: 1, Initial: 1},
			Window: window.Stats{Backend: "app", Server: name, Requests: 1200, Err5xx: x, P50Ms: 9, P95Ms: 12, P99Ms: 14}})
	}
	return agent.Observation{Time: now, Cycle: 1, Backends: []agent.BackendView{b}}
}

// grey is six servers of which srv4 fails 24 of 1,200 (2% at 20 req/s):
// read a second at a time over the window, the rules' sequential test
// has it a candidate (past the candidates' threshold) and condemns it
// only about 87 s in: the grey zone, the model's to decide.
func grey(now time.Time) agent.Observation {
	obs := fleet(now, 6)
	obs.Backends[0].Servers[3].Window.Err5xx = 24
	return obs
}

func newPolicy(t *testing.T, respond ollamafake.Responder, mod func(*Config)) (*Policy, *ollamafake.Server) {
	t.Helper()
	fake := ollamafake.New(map[string]string{model: "sha256:fa4e"}, respond)
	t.Cleanup(fake.Close)
	u, _ := url.Parse(fake.URL)
	cfg := DefaultConfig()
	cfg.Model = model
	cfg.Deadline = 2 * time.Second
	cfg.LoadTimeout = 10 * time.Second
	if mod != nil {
		mod(&cfg)
	}
	m := &Model{Server: &modelapi.Ollama{Client: api.NewClient(u, fake.Client())}, Config: cfg, SystemPrompt: prompt.DefaultSystemPrompt}
	p := New(m, rules.NewPolicy(rules.DefaultConfig()), rules.DefaultConfig(), cfg, zerolog.Nop())
	t.Cleanup(p.Close)
	return p, fake
}

// steps runs the policy n times on obs and vets each plan as the loop
// would, returning every accepted action. Before the first step, the
// window is read a second at a time through the policy's evidence hook,
// as the loop's checks read it: the rules' floor, a sequential test,
// judges what it has read, not a window.
func steps(t *testing.T, p *Policy, obs agent.Observation, n int) []agent.Action {
	t.Helper()
	var accepted []agent.Action
	g := guard.DefaultGuardrails().For(p.Needs())
	for i := 0; i < n; i++ {
		obs := feed(p, obs)
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
		obs.Cycle++
	}
	return accepted
}

// timelines are each policy's stream of observations (feed).
var timelines = struct {
	sync.Mutex
	m map[*Policy]*fixtures.Timeline
}{m: map[*Policy]*fixtures.Timeline{}}

// feed is obs as the loop would give p: its window read a second at a
// time through the policy's evidence hook since p's last step (over the
// window for the first), so that the rules' sequential test (the floor
// and the candidates') reads what the window shows. A step no later than
// the last one is moved a second past it: the stream goes on.
func feed(p *Policy, obs agent.Observation) agent.Observation {
	timelines.Lock()
	tl := timelines.m[p]
	if tl == nil {
		tl = &fixtures.Timeline{}
		timelines.m[p] = tl
	}
	timelines.Unlock()
	if last := tl.At(); !last.IsZero() && !obs.Time.After(last) {
		obs.Time = last.Add(time.Second)
	}
	return tl.Feed(obs, p.Hooks().Evidence)
}

// The rules are the floor: a clear fault is drained at once, whatever the
// model would say, and the model is not even asked about it.
func TestTheRulesAreTheFloor(t *testing.T) {
	p, fake := newPolicy(t, ollamafake.Fixed(ollamafake.Answer()), nil)
	got := steps(t, p, fleet(time.Unix(1000, 0), 6, "srv3"), 1)
	if len(got) != 1 || got[0].Kind != agent.Drain || got[0].Server != "srv3" {
		t.Fatalf("the floor did not act: %v", got)
	}
	if n := len(fake.Requests()); n != 0 {
		t.Fatalf("%d calls about what the rules decide alone", n)
	}
}

// The model decides the grey zone, after confirmation; the request is
// what Ollama expects of a careful client.
func TestGreyZoneIsTheModelsAfterConfirmation(t *testing.T) {
	p, fake := newPolicy(t, ollamafake.Capable, nil)
	obs := grey(time.Unix(1000, 0))
	if first := steps(t, p, obs, 1); len(first) != 0 {
		t.Fatalf("acted on the first proposal: %v", first)
	}
	if r := p.Report().(Report); len(r.Pending) != 1 || !r.Called || len(r.Floor) != 0 {
		t.Fatalf("report %+v", r)
	}
	second := steps(t, p, obs, 1)
	if len(second) != 1 || second[0].Kind != agent.Drain || second[0].Server != "srv4" {
		t.Fatalf("second step %v", second)
	}
	req := fake.Requests()[0]
	if req.Stream == nil || *req.Stream || string(req.Think) != "false" || string(req.KeepAlive) != "-1" || req.Truncate == nil || *req.Truncate {
		t.Fatalf("request stream=%v think=%s keep_alive=%s truncate=%v", req.Stream, req.Think, req.KeepAlive, req.Truncate)
	}
	if req.Options["temperature"] != 0.0 || req.Options["seed"] != 42.0 || req.Options["num_predict"] != 256.0 || req.Options["num_ctx"] != 2048.0 {
		t.Fatalf("options %v", req.Options)
	}
	var schema struct {
		Properties struct {
			Actions struct {
				Items struct {
					Properties map[string]struct {
						Enum    []string `json:"enum"`
						Maximum int      `json:"maximum"`
					} `json:"properties"`
				} `json:"items"`
			} `json:"actions"`
		} `json:"properties"`
	}
	if err := json.Unmarshal(req.Format, &schema); err != nil {
		t.Fatal(err)
	}
	items := schema.Properties.Actions.Items.Properties
	if len(items["server"].Enum) != 7 || items["weight"].Maximum != 1 || !strings.HasPrefix(string(req.Format), `{"type":"object","properties":{"actions":{"type":"array","maxItems":3,"items":{"type":"object","properties":{"reason"`) {
		t.Fatalf("schema %s", req.Format)
	}
	if req.Messages[0].Role != "system" || !strings.Contains(req.Messages[1].Content, "srv4 ready none 1 1 ") ||
		!strings.Contains(req.Messages[1].Content, "candidate: errors: CUSUM past 12.8 of the rules' h 19.7: 2.07% (24/1160) over its evidence's 58 checks, judged against 0.500%, degraded from 1.00%") {
		t.Fatalf("prompt:\n%s", req.Messages[1].Content)
	}
	c := p.Report().(Report).Call
	if c == nil || c.PromptTokens < 100 || c.CompletionTokens == 0 || c.TotalMs <= 0 || c.NumCtx != 2048 {
		t.Fatalf("call %+v", c)
	}
	var m strings.Builder
	p.WriteMetrics(&m)
	for _, want := range []string{"hapilot_llm_calls_total 2\n", "hapilot_llm_fallbacks_total 0\n"} {
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
// ever accepted is the drain of the faulty srv3 (by the rules' floor),
// never a healthy server, never a weight out of range.
func TestAdversarialReplies(t *testing.T) {
	empty := ""
	tests := []struct {
		name     string
		respond  ollamafake.Responder
		mod      func(*Config)
		fallback bool // the step fell back to the floor alone
	}{
		{"malformed JSON", ollamafake.Fixed(`{"actions": [{"action": "drain"`), nil, true},
		{"prose instead of JSON", ollamafake.Fixed(`I would drain srv3.`), nil, true},
		{"unknown server", ollamafake.Fixed(ollamafake.Answer(ollamafake.Action{Action: "drain", Backend: "app", Server: "srv99", Reason: "x"})), nil, false},
		{"bad name", ollamafake.Fixed(ollamafake.Answer(ollamafake.Action{Action: "drain", Backend: "app", Server: "srv1;shutdown", Reason: "x"})), nil, true},
		{"drain every server", func(req ollamafake.Request) ollamafake.Reply {
			var acts []ollamafake.Action
			for i := 1; i <= 6; i++ {
				acts = append(acts, ollamafake.Action{Action: "drain", Backend: "app", Server: "srv" + string(rune('0'+i)), Reason: "all bad"})
			}
			return ollamafake.Reply{Content: ollamafake.Answer(acts...)}
		}, nil, false},
		{"weight 1000", ollamafake.Fixed(`{"actions":[{"action":"set_weight","backend":"app","server":"srv1","weight":1000,"reason":"more"}]}`), nil, true},
		{"weight raise", ollamafake.Fixed(`{"actions":[{"action":"set_weight","backend":"app","server":"srv1","weight":51,"reason":"more"}]}`), nil, false},
		{"weight cut on a healthy server", ollamafake.Fixed(`{"actions":[{"action":"set_weight","backend":"app","server":"srv1","weight":0,"reason":"less"}]}`), nil, false},
		{"unknown action", ollamafake.Fixed(`{"actions":[{"action":"reboot","backend":"app","server":"srv1","reason":"x"}]}`), nil, true},
		{"extra field", ollamafake.Fixed(`{"actions":[],"note":"hi"}`), nil, true},
		{"reply after the deadline", func(req ollamafake.Request) ollamafake.Reply {
			r := ollamafake.Capable(req)
			r.Delay = 300 * time.Millisecond
			return r
		}, func(c *Config) { c.Deadline = 100 * time.Millisecond }, true},
		{"HTTP 500", func(ollamafake.Request) ollamafake.Reply {
			return ollamafake.Reply{Status: 500, Error: "llama runner process has terminated"}
		}, nil, true},
		{"empty body", func(ollamafake.Request) ollamafake.Reply { return ollamafake.Reply{RawBody: &empty} }, nil, true},
		{"think unsupported", ollamafake.Capable, func(c *Config) { c.Think = modelapi.ThinkOn }, true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			p, _ := newPolicy(t, tc.respond, func(c *Config) {
				c.Gate = GateAlways
				if tc.mod != nil {
					tc.mod(c)
				}
			})
			obs := fleet(time.Unix(1000, 0), 6, "srv3")
			accepted := steps(t, p, obs, 1)
			if r := p.Report().(Report); (r.Fallback != "") != tc.fallback {
				t.Fatalf("fallback %q, want fallback=%v (call %+v)", r.Fallback, tc.fallback, r.Call)
			}
			accepted = append(accepted, steps(t, p, obs, 4)...)
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
	if _, err := p.Decide(context.Background(), feed(p, grey(time.Unix(1000, 0)))); err != nil {
		t.Fatal(err)
	}
	r := p.Report().(Report)
	if r.Call == nil || r.Call.Raw != "not json at all" || r.Call.Error == "" || r.Fallback == "" {
		t.Fatalf("report %+v", r)
	}
	if p.counters.invalid != 1 || p.counters.fallbacks != 1 {
		t.Fatalf("counters %+v", p.counters)
	}
}

// A cold model loads for longer than the step deadline. The step falls
// back to the floor, but the call is never cancelled, so the load
// completes (Ollama aborts a load whose request ends) and a later step
// finds the model warm.
func TestDeadlineNeverAbortsALoad(t *testing.T) {
	p, fake := newPolicy(t, ollamafake.Capable, func(c *Config) { c.Deadline = 100 * time.Millisecond })
	fake.LoadTime = 400 * time.Millisecond
	obs := grey(time.Unix(1000, 0))
	steps(t, p, obs, 1)
	if r := p.Report().(Report); !r.DeadlineMiss {
		t.Fatalf("report %+v", r)
	}
	// The next step finds the call still running and does not stack
	// another on it.
	steps(t, p, obs, 1)
	if r := p.Report().(Report); !strings.Contains(r.Fallback, "still running") || len(fake.Requests()) != 1 {
		t.Fatalf("report %+v, %d requests", r, len(fake.Requests()))
	}
	waitFor(t, func() bool { _, ok := fake.Loaded(model); return ok })
	for _, e := range fake.Events() {
		if strings.Contains(e, "aborting load") {
			t.Fatalf("the load was aborted: %q", fake.Events())
		}
	}
	waitFor(t, func() bool { p.fmu.Lock(); defer p.fmu.Unlock(); return len(p.inflight.done) == 1 })
	steps(t, p, obs, 1) // the late reply is taken and discarded; this step's call answers warm
	if r := p.Report().(Report); !r.Called || r.Call.LoadMs > 50 || p.counters.late != 1 {
		t.Fatalf("report %+v, late %d", r, p.counters.late)
	}
}

func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		if cond() {
			return
		}
	}
	t.Fatal("condition not met within 5 s")
}

// Start inspects and loads the model in the background: while it loads,
// steps leave the decisions to the floor and /status says "loading"; it is
// loaded with keep_alive -1, and loaded again when something unloads it.
func TestWarmUpLoadingStatusAndReload(t *testing.T) {
	p, fake := newPolicy(t, ollamafake.Capable, nil)
	p.WatchEvery = 20 * time.Millisecond
	fake.LoadTime = 300 * time.Millisecond
	fake.ContextLength = 40960
	p.Start()
	waitFor(t, func() bool { return p.PolicyStatus().(Status).State == "loading" })
	steps(t, p, grey(time.Unix(1000, 0)), 1)
	r := p.Report().(Report)
	st := p.PolicyStatus().(Status)
	if r.Called || !strings.Contains(r.Fallback, "loading for") || !strings.HasPrefix(st.For, "loading ") || st.Info.ContextLength != 40960 {
		t.Fatalf("while loading: report %+v, status %+v", r, st)
	}
	waitFor(t, func() bool { return p.PolicyStatus().(Status).State == "ready" })
	if req := fake.Requests()[0]; len(req.Messages) != 0 || string(req.KeepAlive) != "-1" {
		t.Fatalf("warm-up request %+v", req)
	}
	steps(t, p, grey(time.Unix(1001, 0)), 1)
	if r := p.Report().(Report); !r.Called || r.Call.LoadMs > 50 {
		t.Fatalf("after the warm-up: %+v", r)
	}
	// What the live page shows: the calls and tokens so far.
	if st := p.PolicyStatus().(Status); st.Calls != 1 || st.PromptTokens == 0 || st.CompletionTokens == 0 || st.Calibration == "" {
		t.Fatalf("status after one call: %+v", st)
	}
	// Someone unloads the model: the watch loads it again.
	unload(t, fake)
	waitFor(t, func() bool { p.cmu.Lock(); defer p.cmu.Unlock(); return p.counters.loads == 2 })
	if _, ok := fake.Loaded(model); !ok {
		t.Fatal("not loaded again")
	}
	// /status tells the story.
	waitFor(t, func() bool { return p.PolicyStatus().(Status).State == "ready" })
	var states []Life
	for _, c := range p.PolicyStatus().(Status).History {
		states = append(states, c.State)
	}
	if fmt.Sprint(states) != "[inspecting loading ready loading ready]" {
		t.Fatalf("history %v", states)
	}
}

func unload(t *testing.T, fake *ollamafake.Server) {
	t.Helper()
	u, _ := url.Parse(fake.URL)
	stream := false
	err := api.NewClient(u, fake.Client()).Chat(context.Background(), &api.ChatRequest{Model: model, Stream: &stream, KeepAlive: &api.Duration{}},
		func(api.ChatResponse) error { return nil })
	if err != nil {
		t.Fatal(err)
	}
}

// The context is sized from the prompt and capped by the model's own;
// truncation is refused, and a prompt too large for the model is shrunk
// instead of cut from its start (which would lose the system prompt).
func TestContextSizedAndNeverTruncated(t *testing.T) {
	big := func(now time.Time) agent.Observation {
		obs := agent.Observation{Time: now, Cycle: 1}
		for b := 0; b < 5; b++ {
			o := fleet(now, 9)
			o.Backends[0].Name = "pool" + string(rune('a'+b))
			for i := range o.Backends[0].Servers {
				o.Backends[0].Servers[i].Backend = o.Backends[0].Name
			}
			o.Backends[0].Servers[2].Window.Err5xx = 24 // grey (see grey)
			obs.Backends = append(obs.Backends, o.Backends[0])
		}
		return obs
	}
	p, fake := newPolicy(t, ollamafake.Capable, func(c *Config) { c.MaxShown = 12 })
	fake.ContextLength = 1536
	if _, err := p.Model.Inspect(context.Background()); err != nil {
		t.Fatal(err)
	}
	steps(t, p, big(time.Unix(1000, 0)), 1)
	r := p.Report().(Report)
	req := fake.Requests()[len(fake.Requests())-1]
	if !r.Called || r.Call.Error != "" || r.PromptNote == "" || req.Options["num_ctx"] != 1536.0 || req.Truncated {
		t.Fatalf("report %+v (note %q), num_ctx %v, truncated %v", r.Call, r.PromptNote, req.Options["num_ctx"], req.Truncated)
	}
	// Told nothing of the model's context, a prompt that does not fit is
	// an invalid reply with its reason, never a silent cut; the next
	// prompt is smaller. (The stand-in counts four bytes a token, coarser
	// than the estimate, which counts each digit: a prompt the estimate
	// fits into 2048 is about 800 of the stand-in's, over its 512.)
	p2, fake2 := newPolicy(t, ollamafake.Capable, func(c *Config) { c.NumCtx = 2048 })
	fake2.ContextLength = 512
	steps(t, p2, big(time.Unix(1000, 0)), 1)
	r = p2.Report().(Report)
	if r.Call == nil || !strings.Contains(r.Call.Error, "exceeds the context length") || p2.shown != 6 || r.Fallback == "" {
		t.Fatalf("overflow: %+v shown %d", r.Call, p2.shown)
	}
}

// Thinking has its own budget on top of the answer's; a call cut while
// thinking is an invalid reply that turns thinking off for a while.
func TestThinkingBudget(t *testing.T) {
	thinker := func(req ollamafake.Request) ollamafake.Reply {
		r := ollamafake.Capable(req)
		r.Thinking = strings.Repeat("Let me compare srv4 with its peers. ", 200)
		r.ThinkingTokens = 700
		return r
	}
	p, fake := newPolicy(t, thinker, func(c *Config) { c.Think = modelapi.ThinkOn })
	fake.Thinking = true
	steps(t, p, grey(time.Unix(1000, 0)), 1)
	r := p.Report().(Report)
	if !r.Called || r.Call.Error != "" || r.Call.NumPredict != 256+1024 || r.Call.DoneReason != "stop" || len(r.Call.Thinking) > maxThinking+3 || r.Call.Thinking == "" {
		t.Fatalf("with a thinking budget: %+v", r.Call)
	}
	p2, fake2 := newPolicy(t, thinker, func(c *Config) { c.Think = modelapi.ThinkOn; c.ThinkBudget = 0 })
	fake2.Thinking = true
	steps(t, p2, grey(time.Unix(1000, 0)), 2)
	reqs := fake2.Requests()
	r = p2.Report().(Report)
	if string(reqs[0].Think) != "true" || string(reqs[1].Think) != "false" || !r.Called || r.Call.Error != "" {
		t.Fatalf("think sent %s then %s; second call %+v", reqs[0].Think, reqs[1].Think, r.Call)
	}
}

// A think level goes only where the model takes it: after Ollama's 400 the
// same call is sent again with thinking on, and the choice is kept.
func TestThinkLevelFallsBackToOn(t *testing.T) {
	p, fake := newPolicy(t, ollamafake.Capable, func(c *Config) { c.Think = modelapi.ThinkLow })
	fake.Thinking = true
	steps(t, p, grey(time.Unix(1000, 0)), 2)
	reqs := fake.Requests()
	if len(reqs) != 3 || string(reqs[0].Think) != `"low"` || string(reqs[1].Think) != "true" || string(reqs[2].Think) != "true" {
		t.Fatalf("think sent: %d requests", len(reqs))
	}
	if r := p.Report().(Report); !r.Called || r.Fallback != "" {
		t.Fatalf("report %+v", r)
	}
	fake.ThinkLevels = true // gpt-oss takes levels
	p2, fake2 := newPolicy(t, ollamafake.Capable, func(c *Config) { c.Think = modelapi.ThinkHigh })
	fake2.Thinking, fake2.ThinkLevels = true, true
	steps(t, p2, grey(time.Unix(1000, 0)), 1)
	if reqs := fake2.Requests(); len(reqs) != 1 || string(reqs[0].Think) != `"high"` {
		t.Fatalf("a harmony model's level: %d requests", len(reqs))
	}
}

// The cost-aware toggle uses what it can observe: a call over the token
// budget turns thinking off for the next steps.
func TestThinkingSwitchedOffWhenOverBudget(t *testing.T) {
	p, fake := newPolicy(t, func(req ollamafake.Request) ollamafake.Reply {
		r := ollamafake.Capable(req)
		r.ThinkingTokens = 900
		return r
	}, func(c *Config) { c.Think = modelapi.ThinkOn })
	fake.Thinking = true
	steps(t, p, grey(time.Unix(1000, 0)), 3)
	reqs := fake.Requests()
	if string(reqs[0].Think) != "true" || string(reqs[1].Think) != "false" || string(reqs[2].Think) != "false" {
		t.Fatalf("think sent: %s %s %s", reqs[0].Think, reqs[1].Think, reqs[2].Think)
	}
}

// /metrics and /status never wait for a model call in flight.
func TestMetricsAndStatusDoNotWaitForACall(t *testing.T) {
	release := make(chan struct{})
	p, fake := newPolicy(t, func(req ollamafake.Request) ollamafake.Reply {
		<-release
		return ollamafake.Capable(req)
	}, func(c *Config) { c.Deadline = time.Minute })
	defer close(release)
	go func() { _, _ = p.Decide(context.Background(), feed(p, grey(time.Unix(1000, 0)))) }()
	waitFor(t, func() bool { return len(fake.Requests()) == 1 })
	done := make(chan string)
	go func() {
		var m strings.Builder
		p.WriteMetrics(&m)
		st := p.PolicyStatus().(Status)
		done <- m.String() + string(st.State)
	}()
	select {
	case out := <-done:
		if !strings.Contains(out, "hapilot_llm_calls_total 1") {
			t.Fatalf("metrics %s", out)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("metrics waited for the model call")
	}
}

func TestShadowAuditsDisagreement(t *testing.T) {
	p, _ := newPolicy(t, ollamafake.TriggerHappy, func(c *Config) { c.Confirm = 1 })
	s := &shadow{Model: p, Acting: p.Floor}                                        // as the daemon builds it
	plan, err := s.Decide(context.Background(), feed(p, grey(time.Unix(1000, 0)))) // a candidate, not yet the rules'

	if err != nil {
		t.Fatal(err)
	}
	if len(plan) != 0 {
		t.Fatalf("acting plan %v", plan)
	}
	r := s.Report().(shadowReport)
	if !r.Compared || !r.Disagreement || len(r.OnlyModel) != 1 || r.OnlyModel[0] != "drain app/srv4 0" || len(r.OnlyActing) != 0 {
		t.Fatalf("report %+v", r)
	}
}

// A failed call is no agreement: the shadow report says the model did not
// decide, and compares nothing.
func TestShadowDoesNotCountAFailureAsAgreement(t *testing.T) {
	p, _ := newPolicy(t, func(ollamafake.Request) ollamafake.Reply { return ollamafake.Reply{Status: 500, Error: "boom"} }, nil)
	s := &shadow{Model: p, Acting: p.Floor} // as the daemon builds it
	if _, err := s.Decide(context.Background(), feed(p, grey(time.Unix(1000, 0)))); err != nil {
		t.Fatal(err)
	}
	r := s.Report().(shadowReport)
	if r.Compared || r.Disagreement || !strings.Contains(r.ModelError, "did not decide") {
		t.Fatalf("report %+v", r)
	}
}

// A model slower than the interval never makes the loop late: each step
// waits only until the deadline, the floor decides that step, and steps
// stay on start + k·interval with none skipped.
func TestSlowModelKeepsTheSchedule(t *testing.T) {
	p, _ := newPolicy(t, func(req ollamafake.Request) ollamafake.Reply {
		r := ollamafake.Capable(req)
		r.Delay = 2 * time.Second
		return r
	}, func(c *Config) { c.Deadline = 200 * time.Millisecond; c.Gate = GateAlways })
	// The floor has read the last minute already (as an agent that has
	// run that long): it condemns srv3 from the first step, whose window
	// (the totals as they stand) brings it nothing new.
	var tl fixtures.Timeline
	obs := tl.Feed(fleet(time.Now(), 3, "srv3"), p.Hooks().Evidence)
	var states []haproxy.ServerState
	var stats []window.Stats
	for _, s := range obs.Backends[0].Servers {
		states = append(states, s.State)
		stats = append(stats, s.Window)
	}
	rt := fakes.WithStates("fake", states)
	audit := &strings.Builder{}
	l := &loop.Loop{Clock: agent.RealClock{}, Settings: agent.Settings{Interval: 250 * time.Millisecond}, Policy: p.Hooks(), Guard: guard.DefaultGuardrails(),
		Runtimes: []agent.Runtime{rt}, Windows: fakes.NewWindows(stats...), Audit: audit, Log: zerolog.Nop()}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second+100*time.Millisecond)
	defer cancel()
	start := time.Now()
	if err := l.Run(ctx); err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(audit.String()), "\n")
	if m := l.View().Metrics(); len(lines) < 8 || m.Skipped != 0 {
		t.Fatalf("%d steps in %v; counters %+v", len(lines), time.Since(start), m)
	}
	if p.counters.deadlineMisses < 1 || p.counters.busy < 5 || p.counters.fallbacks != p.counters.deadlineMisses+p.counters.busy {
		t.Fatalf("deadline misses %d, busy %d, fallbacks %d", p.counters.deadlineMisses, p.counters.busy, p.counters.fallbacks)
	}
	var rec agent.Record
	if err := json.Unmarshal([]byte(lines[0]), &rec); err != nil {
		t.Fatal(err)
	}
	if len(rec.Plan) != 1 || rec.Plan[0].Server != "srv3" {
		t.Fatalf("the floor's plan %+v", rec.Plan)
	}
}

// A model whose gate is checked only once Ollama answers (it did not at
// the agent's start) stays out while refused, and /status says why.
func TestAdmitRefusesAtStart(t *testing.T) {
	p, fake := newPolicy(t, ollamafake.Capable, nil)
	p.Admit = func(context.Context) error { return errors.New("no calibration record") }
	steps(t, p, grey(time.Unix(1000, 0)), 1)
	if r := p.Report().(Report); r.Called || !strings.Contains(r.Fallback, "not checked yet") {
		t.Fatalf("before start: %+v", r)
	}
	p.Start()
	waitFor(t, func() bool { return p.PolicyStatus().(Status).State == "refused" })
	steps(t, p, grey(time.Unix(1001, 0)), 1)
	r := p.Report().(Report)
	if st := p.PolicyStatus().(Status); r.Called || !strings.Contains(r.Fallback, "no calibration record") || st.Error != "no calibration record" || st.Calibration != "refused" {
		t.Fatalf("refused: report %+v, status %+v", r, st)
	}
	for _, req := range fake.Requests() {
		if len(req.Messages) > 0 {
			t.Fatalf("a refused model was asked: %+v", req)
		}
	}
}

// --num-thread goes with every request that loads or asks the model, the
// warm-up, the tokenizer's measure and the calls alike: a request
// without it would load the runner again at Ollama's default. Unset, it
// is not sent.
func TestNumThreadOnEveryRequest(t *testing.T) {
	for _, threads := range []int{0, 1} {
		p, fake := newPolicy(t, ollamafake.Capable, func(c *Config) { c.NumThread = threads })
		p.Start()
		waitFor(t, func() bool { return p.PolicyStatus().(Status).State == "ready" })
		steps(t, p, grey(time.Unix(1000, 0)), 1)
		reqs := fake.Requests()
		if len(reqs) < 3 {
			t.Fatalf("threads %d: %d requests, want the warm-up, the measure and a call", threads, len(reqs))
		}
		for i, r := range reqs {
			got, sent := r.Options["num_thread"]
			if (threads == 0 && sent) || (threads > 0 && got != float64(threads)) {
				t.Errorf("threads %d: request %d has num_thread %v (sent %v)", threads, i, got, sent)
			}
		}
	}
}

// A step the gate kept from the model is no agreement either: the
// model's plan is then the floor's, the acting rules' own.
func TestShadowDoesNotCountAGatedStepAsAgreement(t *testing.T) {
	p, fake := newPolicy(t, ollamafake.Capable, nil)
	s := &shadow{Model: p, Acting: p.Floor}                                                          // as the daemon builds it
	if _, err := s.Decide(context.Background(), feed(p, fleet(time.Unix(1000, 0), 6))); err != nil { // all healthy: nothing to ask
		t.Fatal(err)
	}
	r := s.Report().(shadowReport)
	if r.Model.Called || r.Model.Gated == "" || len(fake.Requests()) != 0 {
		t.Fatalf("the model was asked about a healthy fleet: %+v", r.Model)
	}
	if r.Compared || r.Disagreement {
		t.Fatalf("a gated step counted as compared: %+v", r)
	}
}
