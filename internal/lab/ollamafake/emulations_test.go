package ollamafake_test

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/hapilot/hapilot/agent/policy/llm"
	"github.com/hapilot/hapilot/internal/lab/ollamafake"
)

// request is the prompt hapilot sends for a calibration scenario.
func request(t *testing.T, name string, think string) ollamafake.Request {
	t.Helper()
	for _, s := range llm.Scenarios(time.Now()) {
		if s.Name == name {
			return ollamafake.Request{Messages: []ollamafake.Message{{Role: "user", Content: llm.Prompt(s.Obs, nil, 12)}}, Think: json.RawMessage(think)}
		}
	}
	t.Fatalf("no calibration scenario %q", name)
	return ollamafake.Request{}
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
	req := request(t, "one faulty of 9", "false")
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
	req := request(t, "healthy with 0.2% noise", "false")
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
	on := respond(request(t, "one faulty of 3", "true"))
	off := respond(request(t, "one faulty of 3", "false"))
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
	rep := respond(request(t, "recovered server drained 10 min ago", "false"))
	if !strings.Contains(rep.Content, `"ready"`) {
		t.Errorf("flip-flop left its drain: %s", rep.Content)
	}
}

func TestUnknownEmulation(t *testing.T) {
	if _, err := ollamafake.Emulation("oracle", 1, time.Second); err == nil || !strings.Contains(err.Error(), "capable") {
		t.Errorf("want an error listing the emulations, got %v", err)
	}
}
