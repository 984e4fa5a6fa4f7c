//go:build e2e

package e2e

import (
	"strings"
	"testing"
	"time"

	"github.com/hapilot/hapilot/internal/lab/ollamafake"
	"github.com/hapilot/hapilot/internal/lab/scenario"
)

// The LLM policy end to end against a real HAProxy, the model emulated by
// the Ollama stand-in: judgment needs a capable model, which cannot be had
// here (llm_real_test.go runs the real Ollama with a random-weight one).
// A trigger-happy emulation, let act with --skip-calibration, must leave
// client 5xx no worse than --policy static; a capable one drains the
// faulty servers.
func TestLLMPolicyEndToEnd(t *testing.T) {
	t.Parallel()
	capable := ollamafake.New(map[string]string{"capable": "sha256:c"}, ollamafake.Capable)
	defer capable.Close()
	happy := ollamafake.New(map[string]string{"happy": "sha256:h"}, ollamafake.TriggerHappy)
	defer happy.Close()
	servers := paperFleet(0, 0, 0.05, 0, 0, 0.05)
	runs := map[string]scenario.Scenario{
		"static":        {Policy: "static"},
		"capable":       {Policy: "llm", Name: "capable", AgentArgs: []string{"--model", "capable", "--ollama-host", capable.URL, "--skip-calibration"}},
		"trigger-happy": {Policy: "llm", Name: "trigger-happy", AgentArgs: []string{"--model", "happy", "--ollama-host", happy.URL, "--skip-calibration"}},
	}
	for name, s := range runs {
		s.Servers, s.Rate, s.Duration = servers, 300, 60*time.Second
		runs[name] = s
	}
	outs, audits := sideBySide(t, runs)
	if len(outs) != 3 {
		t.Fatal("a run failed")
	}
	static := outs["static"].Load.Err5xx
	for _, name := range []string{"capable", "trigger-happy"} {
		o := outs[name]
		t.Logf("%s: 5xx %d vs static %d; drained %v; flips %v", name, o.Load.Err5xx, static, o.DrainedAt, o.Flips)
		if o.Load.Err5xx > static {
			t.Errorf("%s: client 5xx %d worse than static %d", name, o.Load.Err5xx, static)
		}
		for s := range o.DrainedAt {
			if s != "srv3" && s != "srv6" {
				t.Errorf("%s: healthy %s drained", name, s)
			}
		}
	}
	for _, s := range []string{"srv3", "srv6"} {
		if at, ok := outs["capable"].DrainedAt[s]; !ok || at > 20*time.Second {
			t.Errorf("capable: %s drained at %v (%v)", s, at, ok)
		}
	}
	for _, line := range strings.Split(string(audits["capable"]), "\n") {
		if strings.Contains(line, `"accepted":true`) {
			t.Logf("capable: the audit record of the step that drained:\n%s", line)
			break
		}
	}
	asked := func(s *ollamafake.Server) int { // chat requests with a prompt, not the warm-up
		n := 0
		for _, r := range s.Requests() {
			if len(r.Messages) > 0 {
				n++
			}
		}
		return n
	}
	if asked(capable) == 0 || asked(happy) == 0 {
		t.Fatalf("the model was never asked")
	}
}
