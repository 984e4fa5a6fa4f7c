package daemon

import (
	"context"
	"encoding/base64"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/hapilot/hapilot/agent"
	"github.com/hapilot/hapilot/agent/policy/llm"
	"github.com/hapilot/hapilot/agent/policy/llm/calibrate"
	"github.com/hapilot/hapilot/agent/status"
	"github.com/hapilot/hapilot/haproxy"
	"github.com/hapilot/hapilot/internal/lab/ollamafake"
	"github.com/hapilot/hapilot/internal/lib/window"
	"github.com/rs/zerolog"
)

// The capability gate: a model acts only with a passing calibration
// record for its digest, unless --skip-calibration; --shadow never lets it.
// daemon.New makes no network call: the gate is the policy's Admit, run
// once the model server answers; a refusal leaves the rules' floor alone.
func TestCapabilityGate(t *testing.T) {
	fake := ollamafake.New(map[string]string{"m": "sha256:m1"}, ollamafake.Capable)
	defer fake.Close()
	dir := t.TempDir()
	// gate builds the daemon and says what its policy's gate says:
	// "none" without one, "admitted", or why it refuses.
	gate := func(extra ...string) (name, verdict string) {
		args := append([]string{"--policy", "llm", "--model", "m", "--ollama-host", fake.URL, "--calibration-dir", dir,
			"--spoe-listen", "127.0.0.1:0", "--status-listen", "off", "--haproxy-socket", "/nonexistent.sock"}, extra...)
		c := parseConfig(t, args)
		d, err := New(*c, zerolog.Nop())
		if err != nil {
			t.Fatal(err)
		}
		defer d.Close()
		p, ok := d.Loop.Policy.Decider.(*llm.Policy)
		if !ok || p.Admit == nil {
			return d.Loop.Policy.Name(), "none"
		}
		if err := p.Admit(context.Background()); err != nil {
			return d.Loop.Policy.Name(), err.Error()
		}
		return d.Loop.Policy.Name(), "admitted"
	}
	for _, tc := range []struct {
		name        string
		args        []string
		policy      string
		wantVerdict string
	}{
		{"uncalibrated", nil, "llm", "no calibration record"},
		{"--skip-calibration", []string{"--skip-calibration"}, "llm", "none"},
		{"--policy shadow", []string{"--policy", "shadow"}, "shadow:rules", "none"},
	} {
		if name, verdict := gate(tc.args...); name != tc.policy || !strings.Contains(verdict, tc.wantVerdict) {
			t.Fatalf("%s: policy %s, gate %q; want %s, %q", tc.name, name, verdict, tc.policy, tc.wantVerdict)
		}
	}
	c := parseConfig(t, []string{"--model", "m", "--ollama-host", fake.URL})
	m, err := llm.NewModel(c.LLM)
	if err != nil {
		t.Fatal(err)
	}
	fake.SetResponder(ollamafake.TriggerHappy)
	sc, err := calibrate.RunModel(context.Background(), m, c.Rules, c.Loop.PolicyBudget(), time.Now())
	if err != nil || sc.Passed {
		t.Fatalf("trigger-happy passed: %v", err)
	}
	if _, err := sc.Save(dir); err != nil {
		t.Fatal(err)
	}
	if _, verdict := gate(); !strings.Contains(verdict, "failed calibration") || !strings.Contains(verdict, "hapilot calibrate --model m") {
		t.Fatalf("failing model: gate %q", verdict)
	}
	fake.SetResponder(ollamafake.Capable)
	if sc, err = calibrate.RunModel(context.Background(), m, c.Rules, c.Loop.PolicyBudget(), time.Now()); err != nil || !sc.Passed {
		t.Fatalf("capable failed: %v %+v", err, sc)
	}
	if _, err := sc.Save(dir); err != nil {
		t.Fatal(err)
	}
	if _, verdict := gate(); verdict != "admitted" {
		t.Fatalf("calibrated model: gate %q", verdict)
	}
	// The record holds for the settings it was made with: another think
	// mode, prompt or options make it stale, and the gate refuses.
	fake.Thinking = true
	if _, verdict := gate("--think", "on"); !strings.Contains(verdict, "stale calibration record") {
		t.Fatalf("stale record (think on): gate %q", verdict)
	}
	if _, verdict := gate("--num-predict", "128"); !strings.Contains(verdict, "stale calibration record") {
		t.Fatalf("stale record (num-predict): gate %q", verdict)
	}
}

// Each policy declares its needs; the loop reads them, never the
// policy's name. Shadow mode's acting rules therefore get the rules'
// N/3 drains a step, as --policy rules does (before, "shadow:rules"
// matched no name and got one drain a step). Nine servers with three
// significant outliers: all three go in one step.
func TestShadowActsWithTheRulesNeeds(t *testing.T) {
	fake := ollamafake.New(map[string]string{"m": "sha256:m1"}, ollamafake.Capable)
	defer fake.Close()
	build := func(extra ...string) *Daemon {
		args := append([]string{"--model", "m", "--ollama-host", fake.URL, "--calibration-dir", t.TempDir(),
			"--spoe-listen", "off", "--status-listen", "off", "--haproxy-socket", "/nonexistent.sock"}, extra...)
		c := parseConfig(t, args)
		d, err := New(*c, zerolog.Nop())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(d.Close)
		return d
	}
	for _, tc := range []struct {
		name   string
		args   []string
		policy string
	}{
		{"rules", []string{"--policy", "rules"}, "rules"},
		{"shadow", []string{"--policy", "shadow"}, "shadow:rules"},
		{"shadow's old spelling", []string{"--shadow"}, "shadow:rules"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := build(tc.args...)
			if got := d.Loop.Policy.Name(); got != tc.policy {
				t.Fatalf("policy %s, want %s", got, tc.policy)
			}
			// The rules' sequential test reads the requests between
			// calls: the window comes in over ten checks.
			obs := nineWithThreeFaulty()
			var plan agent.Plan
			for k := range uint64(11) {
				obs.Time = obs.Time.Add(time.Second)
				for i := range obs.Backends[0].Servers {
					w := &obs.Backends[0].Servers[i].Window
					w.TotalRequests, w.TotalErr5xx = k*w.Requests/10, k*w.Err5xx/10
				}
				var err error
				if plan, err = d.Loop.Policy.Decide(context.Background(), obs); err != nil {
					t.Fatal(err)
				}
			}
			accepted := 0
			for _, v := range d.Loop.Guard.For(d.Loop.Policy.Needs).Vet(&obs, plan) {
				if v.Accepted && v.Applied.Kind == agent.Drain {
					accepted++
				}
			}
			if accepted != 3 {
				t.Fatalf("%d drains accepted of plan %v, want 3 (N/3 at N=9)", accepted, plan)
			}
		})
	}
}

func nineWithThreeFaulty() agent.Observation {
	b := agent.BackendView{Name: "app"}
	for i := 1; i <= 9; i++ {
		name := fmt.Sprintf("srv%d", i)
		x := uint64(0)
		if i%3 == 0 {
			x = 100
		}
		b.Servers = append(b.Servers, agent.ServerView{Backend: "app", Server: name, Owner: agent.OwnerNone,
			State:  haproxy.ServerState{Backend: "app", Server: name, OpState: haproxy.OpRunning, Weight: 1, Initial: 1},
			Window: window.Stats{Backend: "app", Server: name, Requests: 2000, Err5xx: x, P50Ms: 10, P95Ms: 12, P99Ms: 14}})
	}
	return agent.Observation{Time: time.Unix(1000, 0), Backends: []agent.BackendView{b}}
}

// Ollama down at the agent's start: the model's gate is checked once it
// answers; until then, and if it refuses, the rules act alone.
func TestGateWaitsForOllama(t *testing.T) {
	c := parseConfig(t, []string{"--policy", "llm", "--model", "m", "--ollama-host", "127.0.0.1:1", "--calibration-dir", t.TempDir(),
		"--spoe-listen", "off", "--status-listen", "off", "--haproxy-socket", "/nonexistent.sock"})
	d, err := New(*c, zerolog.Nop())
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	p, ok := d.Loop.Policy.Decider.(*llm.Policy)
	if !ok || p.Admit == nil {
		t.Fatalf("policy %T without a pending gate", d.Loop.Policy)
	}
	if err := p.Admit(context.Background()); err == nil {
		t.Fatal("admitted with Ollama down")
	}
}

// Fleet mode wraps the policy: the model's own counters must still reach
// /metrics, its status /status, and its life cycle the daemon. Before the
// policy was one value, the wrapper dropped WriteMetrics, and every
// hapilot_llm_* series vanished with --fleet-* and --policy llm.
func TestFleetKeepsTheModelsHooks(t *testing.T) {
	fake := ollamafake.New(map[string]string{"m": "sha256:m1"}, ollamafake.Capable)
	defer fake.Close()
	key := filepath.Join(t.TempDir(), "fleet.key")
	if err := os.WriteFile(key, []byte(base64.StdEncoding.EncodeToString(make([]byte, 32))), 0o600); err != nil {
		t.Fatal(err)
	}
	c := parseConfig(t, []string{"--policy", "llm", "--model", "m", "--ollama-host", fake.URL, "--skip-calibration",
		"--fleet-bind", "127.0.0.1:0", "--fleet-key", key, "--fleet-name", "solo",
		"--spoe-listen", "off", "--status-listen", "off", "--haproxy-socket", "/nonexistent.sock"})
	d, err := New(*c, zerolog.Nop())
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	if d.Fleet == nil {
		t.Fatal("fleet mode is off")
	}
	p := d.Loop.Policy
	if _, wrapped := p.Decider.(*llm.Policy); wrapped || p.Name() != "llm" {
		t.Fatalf("decider %T (%s): not the fleet's wrapper of the model", p.Decider, p.Name())
	}
	if p.Metrics == nil || p.Status == nil || p.Report == nil || p.Start == nil || p.Close == nil || p.Needs.DrainsPer != 3 {
		t.Fatalf("the wrapper lost a hook of the model's: %+v", p)
	}
	var out strings.Builder
	status.WriteLoopMetrics(&out, d.Loop)
	for _, want := range []string{"hapilot_llm_calls_total", "hapilot_llm_completion_tokens_total", "hapilot_cycles_total"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("/metrics lacks %s with fleet mode and the LLM", want)
		}
	}
	if st, ok := p.Status().(llm.Status); !ok || st.Model != "m" {
		t.Errorf("/status's policy_status %+v", p.Status())
	}
}
