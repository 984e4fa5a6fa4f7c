package ollamafake_test

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/hapilot/hapilot/agent"
	"github.com/hapilot/hapilot/agent/policy/llm/prompt"
	"github.com/hapilot/hapilot/haproxy"
	"github.com/hapilot/hapilot/internal/lab/ollamafake"
	"github.com/hapilot/hapilot/internal/lib/window"
)

// request is the prompt hapilot sends for a backend of n servers named
// srv1..srvN; faulty (0: none) fails 5% and is flagged as a candidate,
// noisy ones fail 0.2%, and drained (0: none) was drained by the agent.
func request(n, faulty, drained int, noisy bool, think string) ollamafake.Request {
	now := time.Unix(1000, 0)
	b := agent.BackendView{Name: "app"}
	cands := map[agent.Key]string{}
	for i := 1; i <= n; i++ {
		name := fmt.Sprintf("srv%d", i)
		v := agent.ServerView{Backend: "app", Server: name, Owner: agent.OwnerNone,
			State:  haproxy.ServerState{Backend: "app", Server: name, OpState: haproxy.OpRunning, Weight: 1, Initial: 1},
			Window: window.Stats{Requests: 3000, P50Ms: 9, P95Ms: 12, P99Ms: 14}}
		if noisy {
			v.Window.Err5xx = 6
		}
		if i == faulty {
			v.Window.Err5xx = 150
			cands[agent.Key{Backend: "app", Server: name}] = "errors 5.00% vs peers 0.00%"
		}
		if i == drained {
			v.State.AdminState, v.Owner = haproxy.AdminForcedDrain, agent.OwnerAgent
			v.Changed = &agent.Change{Phase: agent.PhaseDrained, At: now.Add(-10 * time.Minute)}
			v.Window = window.Stats{}
		}
		b.Servers = append(b.Servers, v)
	}
	in := prompt.Input{Obs: agent.Observation{Time: now, Backends: []agent.BackendView{b}}, Candidates: cands, MaxShown: 12,
		Only: map[string]bool{"app": true}}
	return ollamafake.Request{Messages: []ollamafake.Message{{Role: "user", Content: prompt.Render(in)}}, Think: json.RawMessage(think)}
}

func drains(content string) []string {
	var r struct{ Actions []ollamafake.Action }
	_ = json.Unmarshal([]byte(content), &r)
	var out []string
	for _, a := range r.Actions {
		if a.Action == "drain" {
			out = append(out, a.Server)
		}
	}
	return out
}

// Over many seeds (runs), the share of runs in which an emulation acts on
// a faulty server is its recall; the study's figures are the targets.
func TestEmulationRecall(t *testing.T) {
	req := request(9, 9, 0, false, "false")
	for _, tc := range []struct {
		name     string
		lo, hi   float64
		expected string
	}{
		{"capable", 1, 1, "srv9"},
		{"conservative", 0.27, 0.41, "srv9"},  // about 0.34
		{"trigger-happy", 0.90, 0.98, "srv9"}, // about 0.94
		{"slow-thinker", 1, 1, "srv9"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			const runs = 600
			hit := 0
			for seed := uint64(1); seed <= runs; seed++ {
				respond, err := ollamafake.Emulation(tc.name, seed, time.Second)
				if err != nil {
					t.Fatal(err)
				}
				if d := drains(respond(req).Content); len(d) == 1 && d[0] == tc.expected {
					hit++
				}
			}
			if got := float64(hit) / runs; got < tc.lo || got > tc.hi {
				t.Errorf("drained the faulty server in %.2f of runs, want [%.2f, %.2f]", got, tc.lo, tc.hi)
			}
		})
	}
}

func TestEmulationRepeatable(t *testing.T) {
	req := request(6, 0, 0, true, "false")
	answers := func() string {
		respond, _ := ollamafake.Emulation("trigger-happy", 7, time.Second)
		var b strings.Builder
		for i := 0; i < 300; i++ {
			b.WriteString(respond(req).Content)
		}
		return b.String()
	}
	if a, b := answers(), answers(); a != b {
		t.Error("the same seed gave different answers")
	}
}

// With reasoning on, the slow thinker costs what the study measured
// (about 1,546 completion tokens, 1.2 intervals); off, about 157 and no
// delay. Its decision is the capable one either way.
func TestSlowThinker(t *testing.T) {
	respond, _ := ollamafake.Emulation("slow-thinker", 1, 10*time.Second)
	on := respond(request(3, 3, 0, false, "true"))
	off := respond(request(3, 3, 0, false, "false"))
	if on.CompletionTokens != 1546 || on.Delay != 12*time.Second || on.Thinking == "" {
		t.Errorf("thinking: %d tokens, delay %v, thinking %q", on.CompletionTokens, on.Delay, on.Thinking[:min(len(on.Thinking), 20)])
	}
	if off.CompletionTokens != 157 || off.Delay != 0 {
		t.Errorf("not thinking: %d tokens, delay %v", off.CompletionTokens, off.Delay)
	}
	if d := drains(on.Content); len(d) != 1 || d[0] != "srv3" {
		t.Errorf("thinking drained %v, want srv3", d)
	}
}

func TestFlipFlopUndoes(t *testing.T) {
	respond, _ := ollamafake.Emulation("flip-flop", 1, time.Second)
	rep := respond(request(4, 0, 1, false, "false"))
	if !strings.Contains(rep.Content, `"ready"`) {
		t.Errorf("flip-flop left its drain: %s", rep.Content)
	}
}

func TestUnknownEmulation(t *testing.T) {
	if _, err := ollamafake.Emulation("oracle", 1, time.Second); err == nil || !strings.Contains(err.Error(), "capable") {
		t.Errorf("want an error listing the emulations, got %v", err)
	}
}

// The misbehaving emulations misbehave as named.
func TestMisbehavingEmulations(t *testing.T) {
	drained := request(6, 0, 2, false, "false")
	faulty := request(6, 3, 0, false, "false")
	for _, tc := range []struct {
		name string
		req  ollamafake.Request
		want string
	}{
		{"drain-all", faulty, `"drain","backend":"app","server":"srv6"`},
		{"readies-all", drained, `"action":"ready","backend":"app","server":"srv2"`},
		{"raises-weights", faulty, `"action":"set_weight","backend":"app","server":"srv1","weight":51`},
		{"garbage", faulty, `reboot`},
	} {
		respond, err := ollamafake.Emulation(tc.name, 1, time.Second)
		if err != nil {
			t.Fatal(err)
		}
		if got := respond(tc.req).Content; !strings.Contains(got, tc.want) {
			t.Errorf("%s: %s", tc.name, got)
		}
	}
	s := ollamafake.New(map[string]string{"m": "x"}, nil)
	defer s.Close()
	ollamafake.Traits("cold", 10*time.Second)(s)
	ollamafake.Traits("small-context", time.Second)(s)
	if s.LoadTime != 20*time.Second || s.ContextLength != 1536 {
		t.Errorf("traits: load %v, context %d", s.LoadTime, s.ContextLength)
	}
}
