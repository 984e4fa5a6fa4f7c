package llm

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/hapilot/hapilot/agent"
	"github.com/hapilot/hapilot/agent/policy/rules"
	"github.com/hapilot/hapilot/haproxy"
	"github.com/hapilot/hapilot/internal/lib/window"
	"github.com/rs/zerolog"
)

// TestLatencyCandidatesJudgeTheServersOwnUsual: a server whose p95 is
// over twice its peers' is a latency candidate while the agent has no
// history of it (the first ten minutes, as before), and no longer once
// its own usual is learned and it is at it; a server that slows down to
// 3× its usual is a candidate then. The model's drain of a latency
// candidate waits for its history; a weight cut does not.
func TestLatencyCandidatesJudgeTheServersOwnUsual(t *testing.T) {
	p := New(nil, rules.NewPolicy(rules.DefaultConfig()), rules.DefaultConfig(), DefaultConfig(), zerolog.Nop())
	defer p.Close()
	t0 := time.Unix(1_700_000_000, 0)
	var total uint64
	obs := func(sec int, s4p50 int) agent.Observation {
		total += 33
		b := agent.BackendView{Name: "app"}
		for i := range 6 {
			p50, p95 := 5, 8
			switch i {
			case 5: // always slower than its peers
				p50, p95 = 12, 25
			case 4:
				p50, p95 = s4p50, s4p50*5/3
			}
			b.Servers = append(b.Servers, agent.ServerView{Backend: "app", Server: fmt.Sprintf("s%d", i),
				State:  haproxy.ServerState{Backend: "app", Server: fmt.Sprintf("s%d", i), OpState: haproxy.OpRunning, Weight: 1, Initial: 1},
				Window: window.Stats{Requests: 2000, P50Ms: p50, P95Ms: p95, TotalRequests: total, Seconds: 60, RatePerSec: 33}})
		}
		return agent.Observation{Time: t0.Add(time.Duration(sec) * time.Second), Lookback: time.Minute, Backends: []agent.BackendView{b}}
	}
	latency := func(o agent.Observation) []string {
		var out []string
		for k, c := range p.candidates(context.Background(), o, nil) {
			if slices.Contains(c.Signals, rules.SignalLatency) {
				out = append(out, k.Server)
			}
		}
		slices.Sort(out)
		return out
	}
	// supported: whether the model's drain, or its weight cut, of s gets
	// through the policy's checks.
	supported := func(o agent.Observation, s string, kind agent.Kind) bool {
		a := agent.Action{Kind: kind, Backend: "app", Server: s}
		if kind == agent.SetWeight {
			a.Weight = 0 // under the server's weight 1: a cut
		}
		p.report = Report{}
		return len(p.supported(o, agent.Plan{a}, p.candidates(context.Background(), o, nil), nil)) == 1
	}
	sec := 0
	o := obs(sec, 5)
	p.Hooks().Evidence(o)
	if got := latency(o); !slices.Equal(got, []string{"s5"}) {
		t.Fatalf("at the start, latency candidates %v, want [s5] (its peers alone judge it)", got)
	}
	if supported(o, "s5", agent.Drain) || !supported(o, "s5", agent.SetWeight) {
		t.Errorf("with no history of s5: drain supported %v (want false), cut supported %v (want true); %q",
			supported(o, "s5", agent.Drain), supported(o, "s5", agent.SetWeight), p.report.Unsupported)
	}
	for sec = 1; sec <= 11*60; sec++ {
		o = obs(sec, 5)
		p.Hooks().Evidence(o)
	}
	if got := latency(o); len(got) != 0 {
		t.Errorf("after 11 minutes at their usual, latency candidates %v, want none", got)
	}
	o = obs(sec, 15) // s4 three times its usual
	p.Hooks().Evidence(o)
	if got := latency(o); !slices.Equal(got, []string{"s4"}) {
		t.Errorf("s4 at 3× its usual: latency candidates %v, want [s4]", got)
	}
	if !supported(o, "s4", agent.Drain) {
		t.Errorf("s4 at 3× its learned usual: the model's drain refused: %q", p.report.Unsupported)
	}
}
