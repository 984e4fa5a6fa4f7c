package daemon

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"reflect"
	"testing"
	"time"

	"github.com/hapilot/hapilot/agent"
	"github.com/hapilot/hapilot/agent/policy/llm"
	"github.com/hapilot/hapilot/haproxy"
	"github.com/hapilot/hapilot/internal/lab/ollamafake"
	"github.com/hapilot/hapilot/internal/lib/window"
	"github.com/rs/zerolog"
)

// floorStream is what the loop reads of one backend of n servers at rps
// requests a second each, every second for secs seconds: each server's
// healthy 5xx rate is 0.2% times e^(σ·z) (a fleet whose servers differ by
// σ), and faulty fails at fault from faultAt on. Each observation's
// windows hold the last minute and the running totals, as the loop's do.
func floorStream(seed uint64, n int, rps int, sigma float64, faulty int, fault float64, faultAt, secs int) []agent.Observation {
	r := rand.New(rand.NewPCG(seed, 41))
	rate := make([]float64, n)
	for i := range rate {
		rate[i] = 0.002 * math.Exp(sigma*r.NormFloat64())
	}
	type sec struct{ n, x uint64 }
	hist := make([][]sec, n)
	tot := make([]sec, n)
	start := time.Date(2026, 12, 4, 0, 0, 0, 0, time.UTC)
	var out []agent.Observation
	for t := 0; t < secs; t++ {
		b := agent.BackendView{Name: "app"}
		for i := range n {
			p := rate[i]
			if i == faulty && t >= faultAt {
				p = fault
			}
			var c sec
			for range rps {
				c.n++
				if r.Float64() < p {
					c.x++
				}
			}
			hist[i] = append(hist[i], c)
			tot[i].n += c.n
			tot[i].x += c.x
			var w sec
			for _, h := range hist[i][max(0, len(hist[i])-60):] {
				w.n += h.n
				w.x += h.x
			}
			name := fmt.Sprintf("srv%d", i+1)
			st := window.Stats{Backend: "app", Server: name, Requests: w.n, Err5xx: w.x, P50Ms: 9, P95Ms: 12, P99Ms: 14,
				TotalRequests: tot[i].n, TotalErr5xx: tot[i].x}
			b.Servers = append(b.Servers, agent.ServerView{Backend: "app", Server: name, Owner: agent.OwnerNone, Window: st,
				Recent: window.Stats{Backend: "app", Server: name, Requests: c.n, Err5xx: c.x, Seconds: 1, RatePerSec: float64(c.n)},
				State:  haproxy.ServerState{Backend: "app", Server: name, OpState: haproxy.OpRunning, Weight: 1, Initial: 1}})
		}
		out = append(out, agent.Observation{Time: start.Add(time.Duration(t) * time.Second), Cycle: uint64(t/5 + 1),
			Lookback: time.Minute, RecentSpan: time.Second, Backends: []agent.BackendView{b}})
	}
	return out
}

// drive feeds a policy a stream as the loop does: the evidence check
// every second, and every fifth second a step (Decide, then the evidence
// on the step's own observation). It returns each step's plan and each
// check's findings.
func drive(t *testing.T, pol agent.Policy, stream []agent.Observation) (plans []agent.Plan, found [][]agent.Key) {
	t.Helper()
	for i, obs := range stream {
		if i%5 == 4 {
			plan, err := pol.Decide(context.Background(), obs)
			if err != nil {
				t.Fatal(err)
			}
			plans = append(plans, plan)
		}
		if pol.Evidence != nil {
			found = append(found, pol.Evidence(obs))
		} else {
			found = append(found, nil)
		}
	}
	return plans, found
}

func drains(plans []agent.Plan) int {
	n := 0
	for _, p := range plans {
		for _, a := range p {
			if a.Kind == agent.Drain {
				n++
			}
		}
	}
	return n
}

// --policy llm's floor is --policy rules itself: with its model
// unreachable ("the rules act meanwhile"), it decides exactly as
// --policy rules does, step for step, and its evidence hook (which lets
// the loop step between ticks) finds what theirs finds. Before, its
// floor was the old windowed test, which drained healthy servers of a
// σ 0.3 fleet the rules left alone.
func TestLLMWithoutItsModelDecidesAsTheRules(t *testing.T) {
	common := []string{"--spoe-listen", "off", "--status-listen", "off", "--haproxy-socket", "/nonexistent.sock"}
	// Nothing listens there: the model is unreachable.
	down := []string{"--model", "m", "--ollama-host", "127.0.0.1:1", "--calibration-dir", t.TempDir()}
	for _, tc := range []struct {
		name   string
		stream []agent.Observation
		drains bool // what the rules do (the fixture's check)
	}{
		{"healthy: σ 0.3 around 0.2%, 9 servers at 33 req/s", floorStream(1, 9, 33, 0.3, -1, 0, 0, 600), false},
		{"a 5% fault from 60 s, 9 servers at 33 req/s", floorStream(2, 9, 33, 0.3, 3, 0.05, 60, 180), true},
		{"a 5% fault from 60 s, 3 servers at 33 req/s", floorStream(3, 3, 33, 0.3, 0, 0.05, 60, 180), true},
	} {
		for _, variant := range [][]string{{"--policy", "llm"}, {"--policy", "llm", "--skip-calibration"}} {
			t.Run(tc.name+" "+fmt.Sprint(variant), func(t *testing.T) {
				rulesPol, err := NewPolicy(*parseConfig(t, append([]string{"--policy", "rules"}, common...)), zerolog.Nop())
				if err != nil {
					t.Fatal(err)
				}
				llmPol, err := NewPolicy(*parseConfig(t, append(append(variant, down...), common...)), zerolog.Nop())
				if err != nil {
					t.Fatal(err)
				}
				if llmPol.Evidence == nil {
					t.Fatal("--policy llm has no evidence hook: the loop would not step on the rules' evidence between ticks")
				}
				llmPol.Start()
				defer llmPol.Close()
				waitUntil(t, func() bool { return llmPol.Status().(llm.Status).State == llm.LifeUnreachable })
				want, wantFound := drive(t, rulesPol, tc.stream)
				got, gotFound := drive(t, llmPol, tc.stream)
				if (drains(want) > 0) != tc.drains {
					t.Fatalf("the rules made %d drains: the fixture is not what it says", drains(want))
				}
				for i := range want {
					if !reflect.DeepEqual(got[i], want[i]) {
						t.Fatalf("step %d: --policy llm planned %v, --policy rules %v", i+1, got[i], want[i])
					}
				}
				for i := range wantFound {
					if !reflect.DeepEqual(gotFound[i], wantFound[i]) {
						t.Fatalf("check %d: --policy llm's evidence %v, --policy rules' %v", i+1, gotFound[i], wantFound[i])
					}
				}
				if r := llmPol.Report().(llm.Report); r.Fallback == "" && r.Gated == "" {
					t.Fatalf("the model decided a step while unreachable: %+v", r)
				}
			})
		}
	}
}

// With a model that answers (the stand-in's emulated profiles, careful
// or trigger-happy), every drain the rules make is still made, at the
// same step: the model adds to the floor, it never takes from it.
func TestTheFloorsDrainsStandWithAModel(t *testing.T) {
	stream := floorStream(2, 9, 33, 0.3, 3, 0.05, 60, 180)
	rulesPol, err := NewPolicy(*parseConfig(t, []string{"--policy", "rules", "--spoe-listen", "off", "--status-listen", "off",
		"--haproxy-socket", "/nonexistent.sock"}), zerolog.Nop())
	if err != nil {
		t.Fatal(err)
	}
	want, _ := drive(t, rulesPol, stream)
	if drains(want) == 0 {
		t.Fatal("the rules drained nothing: the fixture is not a fault")
	}
	for _, emulation := range []string{"capable", "conservative", "trigger-happy", "flip-flop"} {
		t.Run(emulation, func(t *testing.T) {
			respond, err := ollamafake.Emulation(emulation, 1, 5*time.Second)
			if err != nil {
				t.Fatal(err)
			}
			fake := ollamafake.New(map[string]string{"m": "sha256:m1"}, respond)
			defer fake.Close()
			pol, err := NewPolicy(*parseConfig(t, []string{"--policy", "llm", "--model", "m", "--ollama-host", fake.URL, "--skip-calibration",
				"--llm-gate", "always", "--spoe-listen", "off", "--status-listen", "off", "--haproxy-socket", "/nonexistent.sock"}), zerolog.Nop())
			if err != nil {
				t.Fatal(err)
			}
			pol.Start()
			defer pol.Close()
			waitUntil(t, func() bool { return pol.Status().(llm.Status).State == llm.LifeReady })
			got, _ := drive(t, pol, stream)
			called := 0
			for i := range want {
				in := map[agent.ActionID]bool{}
				for _, a := range got[i] {
					in[a.ID()] = true
				}
				for _, a := range want[i] {
					if a.Kind == agent.Drain && !in[a.ID()] {
						t.Fatalf("step %d: the rules' %s is not in the plan %v", i+1, a.ID(), got[i])
					}
				}
			}
			for _, r := range fake.Requests() {
				if len(r.Messages) == 2 {
					called++
				}
			}
			if called == 0 {
				t.Fatal("the model was never asked: the test shows nothing of a model beside the floor")
			}
		})
	}
}

// waitUntil waits for cond, for up to ten seconds.
func waitUntil(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("timed out waiting for the condition")
		}
		time.Sleep(10 * time.Millisecond)
	}
}
