package soak

import (
	"testing"
	"time"

	"github.com/hapilot/hapilot/agent/policy/llm"
	"github.com/hapilot/hapilot/agent/policy/rules"
)

// llmAgent is the LLM policy behind an emulated profile
// of the stand-in.
func llmAgent(t *testing.T, profile string, unprotected bool) *AgentPolicy {
	t.Helper()
	host, model, stop, err := Emulated(profile, 1, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(stop)
	cfg := llm.DefaultConfig()
	cfg.Model, cfg.Host, cfg.LoadTimeout = model, host, 10*time.Second
	a, err := LLMAgent(rules.DefaultConfig(), cfg, 0, unprotected)
	if err != nil {
		t.Fatal(err)
	}
	return a
}

// TestLLMSoak: a short soak of the LLM policy through the agent path,
// behind emulated profiles of the stand-in (Go code, not models). The
// capable profile finds every 5% fault and drains no healthy server, its
// own actions included. The drain-all profile, which proposes draining
// every server the prompt shows, drains none either: the model is shown
// a backend only when it has a candidate, and its drains need the
// windows' support. Without those protections (unprotected, as the
// study's loop ran), its drains of healthy servers get through the
// guardrails and the soak counts them: it can tell a harmful model from
// a good one.
func TestLLMSoak(t *testing.T) {
	// a backend-day a seed; one seed under the race detector (scale)
	seeds := []uint64{1, 2}
	if scale < 1 {
		seeds = seeds[:1]
	}
	healthy := Cell{Servers: 9, Rate: 33, Noise: 0.002, Hetero: 0.3, Seeds: seeds, Warmup: 10 * time.Minute,
		DrainFor: 30 * time.Second, Config: rules.DefaultConfig(), ServerDays: 9 * float64(len(seeds))}
	fault := healthy
	fault.Hetero, fault.ServerDays, fault.Fault, fault.Trials = 0, 0, 0.05, 5
	tests := []struct {
		name, profile string
		unprotected   bool
		c             Cell
		// the model's drains of healthy servers: at most, at least
		maxHealthy, minHealthy int
		calls                  bool // the model must have been asked
	}{
		{"capable, healthy days", "capable", false, healthy, 0, 0, false},
		{"capable, 5% faults", "capable", false, fault, 0, 0, true},
		{"drain-all, 5% faults", "drain-all", false, fault, 0, 0, true},
		{"drain-all unprotected, 5% faults", "drain-all", true, fault, 1 << 30, 1, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := tt.c
			c.Agent = llmAgent(t, tt.profile, tt.unprotected)
			r, err := Run(c, 2)
			if err != nil {
				t.Fatal(err)
			}
			if r.ModelCalls == nil || r.ModelActions == nil || r.ModelHealthyDrains == nil {
				t.Fatalf("no model figures: %+v", r)
			}
			t.Logf("%s: %.0f server-days, %d steps, %d calls (%.2f a healthy server-day), %d model actions, %d of them healthy drains, %d refused, %d unsupported; %d false drains; faults %d/%d, median %.1f s; %.1f s",
				r.Cell, r.ServerDays, r.Steps, *r.ModelCalls, deref(r.CallsPerServerDay), *r.ModelActions, *r.ModelHealthyDrains,
				r.ModelRefused, r.ModelUnsupported, r.FalseDrains+r.FaultFalseDrains, r.Trials-r.Missed, r.Trials, r.DetectMedian, r.WallSeconds)
			if got := *r.ModelHealthyDrains; got > tt.maxHealthy || got < tt.minHealthy {
				t.Errorf("%d healthy servers drained by the model, want %d to %d", got, tt.minHealthy, tt.maxHealthy)
			}
			if r.Steps == 0 || (tt.calls && *r.ModelCalls == 0) {
				t.Errorf("%d steps, %d calls: the model was never asked", r.Steps, *r.ModelCalls)
			}
			if c.Fault > 0 && r.Missed > 0 {
				t.Errorf("%d of %d faults missed", r.Missed, r.Trials)
			}
			if !tt.unprotected && (r.FalseDrains > 0 || r.FaultFalseDrains > 0) {
				t.Errorf("%d healthy servers drained on healthy days, %d in the fault trials", r.FalseDrains, r.FaultFalseDrains)
			}
		})
	}
}

func deref(p *float64) float64 {
	if p == nil {
		return 0
	}
	return *p
}

// TestAgentPathAgreesWithDirect: the rules through the agent path (the
// loop's cadence, Decide, the guardrails) find a fault when the direct
// path does, on the same traffic. Not to the second: the loop's first
// read, before any traffic, feeds the test one empty chunk, which the
// direct path does not, and a trial's stream drifts from there.
func TestAgentPathAgreesWithDirect(t *testing.T) {
	for _, fault := range []float64{0.02, 0.05} {
		c := Cell{Servers: 9, Rate: 33, Noise: 0.002, Seeds: []uint64{1, 2}, Warmup: 10 * time.Minute,
			DrainFor: 30 * time.Second, Config: rules.DefaultConfig(), Fault: fault, Trials: 20}
		direct, viaAgent := bothPaths(t, c)
		t.Logf("%.0f%%: direct median %.1f s p90 %.1f s, %d missed; agent path median %.1f s p90 %.1f s, %d missed, %d steps",
			100*fault, direct.DetectMedian, direct.DetectP90, direct.Missed, viaAgent.DetectMedian, viaAgent.DetectP90, viaAgent.Missed, viaAgent.Steps)
		if viaAgent.Missed != direct.Missed || viaAgent.FaultFalseDrains != direct.FaultFalseDrains {
			t.Errorf("%.0f%%: the agent path missed %d and drained %d healthy, the direct path %d and %d",
				100*fault, viaAgent.Missed, viaAgent.FaultFalseDrains, direct.Missed, direct.FaultFalseDrains)
		}
		if d := viaAgent.DetectMedian - direct.DetectMedian; d > 0.1*direct.DetectMedian+1 || d < -0.1*direct.DetectMedian-1 {
			t.Errorf("%.0f%%: median %.1f s on the agent path, %.1f s on the direct one", 100*fault, viaAgent.DetectMedian, direct.DetectMedian)
		}
	}
}

// bothPaths runs c on the direct path, then through the rules on the
// agent path.
func bothPaths(t *testing.T, c Cell) (direct, viaAgent Result) {
	t.Helper()
	direct, err := Run(c, 2)
	if err != nil {
		t.Fatal(err)
	}
	c.Agent = RulesAgent(c.Config, 0)
	viaAgent, err = Run(c, 2)
	if err != nil {
		t.Fatal(err)
	}
	return direct, viaAgent
}

// TestCooldownBacksOff: on the agent path a server drained again stays
// out twice as long each time, up to recovery's 10 minutes; each server
// has its own count.
func TestCooldownBacksOff(t *testing.T) {
	d, err := newDriver(RulesAgent(rules.DefaultConfig(), 0), 3)
	if err != nil {
		t.Fatal(err)
	}
	var got []float64
	for range 7 {
		got = append(got, d.cooldown(0, 30))
	}
	want := []float64{30, 60, 120, 240, 480, 600, 600}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("cooldowns %v, want %v", got, want)
		}
	}
	if c := d.cooldown(1, 30); c != 30 {
		t.Errorf("another server's first cooldown %v, want 30", c)
	}
}

// TestAgentPathLatency: with a latency model, the agent path feeds every
// answer through the agent's own window store, and the rules' latency
// tests, judging the windows the store gives, find a slow server as the
// direct path's simulated medians and tallies do (every trial, medians
// within 25% and 2 s: the direct path models the window's median, the
// store reads it off its histogram); a slowdown under every latency test
// (3 x at a 5 ms median: under the 50 ms floors) is found by neither.
func TestAgentPathLatency(t *testing.T) {
	for _, tc := range []struct {
		name     string
		lat      Latency
		slow     float64
		tail     float64
		findable bool
	}{
		{"6x slower", Latency{MedianMs: 20, Sigma: 0.5}, 6, 0, true},
		{"2.5x slower", Latency{MedianMs: 20, Sigma: 0.5}, 2.5, 0, true},
		{"a 10% slow tail", Latency{MedianMs: 20, Sigma: 0.5}, 0, 0.1, true},
		{"3x slower at 5 ms", Latency{MedianMs: 5, Sigma: 0.3}, 3, 0, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// Four trials a row with or without the race detector (the
			// soak is deterministic by seed, and a row's figures must not
			// depend on it); one for the slowdown never found, whose
			// trial runs its hour after the onset.
			trials := 4
			if !tc.findable {
				trials = 1
			}
			c := Cell{Servers: 9, Rate: 33, Noise: 0.002, Seeds: []uint64{1}, Warmup: 15 * time.Minute,
				DrainFor: 30 * time.Second, Config: rules.DefaultConfig(), Latency: tc.lat, Slow: tc.slow, Tail: tc.tail, TailMs: 1500, Trials: trials}
			direct, viaAgent := bothPaths(t, c)
			t.Logf("direct: median %.1f s, %d of %d missed; agent path: median %.1f s, %d missed, %d steps",
				direct.DetectMedian, direct.Missed, direct.Trials, viaAgent.DetectMedian, viaAgent.Missed, viaAgent.Steps)
			if viaAgent.FaultFalseDrains != 0 || direct.FaultFalseDrains != 0 {
				t.Errorf("healthy servers drained: %d on the agent path, %d on the direct one", viaAgent.FaultFalseDrains, direct.FaultFalseDrains)
			}
			if !tc.findable {
				if viaAgent.Missed != viaAgent.Trials || direct.Missed != direct.Trials {
					t.Errorf("found under every latency test: %d of %d on the agent path, %d on the direct one",
						viaAgent.Trials-viaAgent.Missed, viaAgent.Trials, direct.Trials-direct.Missed)
				}
				return
			}
			if viaAgent.Missed != 0 || direct.Missed != 0 {
				t.Fatalf("missed %d on the agent path, %d on the direct one", viaAgent.Missed, direct.Missed)
			}
			if d := viaAgent.DetectMedian - direct.DetectMedian; d > 0.25*direct.DetectMedian+2 || d < -0.25*direct.DetectMedian-2 {
				t.Errorf("median %.1f s on the agent path, %.1f s on the direct one", viaAgent.DetectMedian, direct.DetectMedian)
			}
		})
	}
}
