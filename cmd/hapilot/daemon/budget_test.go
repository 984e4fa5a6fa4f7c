package daemon

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/hapilot/hapilot/agent"
	"github.com/hapilot/hapilot/agent/loop"
	"github.com/hapilot/hapilot/agent/policy/llm"
	"github.com/hapilot/hapilot/internal/lab/fakes"
	"github.com/hapilot/hapilot/internal/lab/ollamafake"
	"github.com/rs/zerolog"
)

// One step budget for every policy: the loop gives the policy's call a
// deadline of Settings.PolicyBudget from the step's start, and a model
// that answers in 5 s and a Lua script that never returns both stop
// there, with the reason in the step's record. No policy keeps a share
// of the interval of its own.
func TestEveryPolicyStopsAtTheStepsDeadline(t *testing.T) {
	slow := ollamafake.New(map[string]string{"m": "sha256:m1"}, func(req ollamafake.Request) ollamafake.Reply {
		r := ollamafake.Capable(req)
		r.Delay = 5 * time.Second
		return r
	})
	defer slow.Close()
	script := filepath.Join(t.TempDir(), "spin.lua")
	if err := os.WriteFile(script, []byte(`function decide(obs) while true do end end`), 0o644); err != nil {
		t.Fatal(err)
	}
	common := []string{"--interval", "1s", "--spoe-listen", "off", "--status-listen", "off"}
	for _, tc := range []struct {
		name string
		args []string
		// stopped says, from the step's record, that the call was cut at
		// the deadline.
		stopped func(agent.Record) bool
	}{
		{"llm", []string{"--policy", "llm", "--model", "m", "--ollama-host", slow.URL, "--skip-calibration", "--llm-gate", "always"},
			func(r agent.Record) bool {
				rep, ok := r.PolicyReport.(llm.Report)
				return ok && rep.DeadlineMiss && strings.Contains(rep.Fallback, "overran its")
			}},
		{"lua", []string{"--policy", "lua", "--policy-file", script},
			func(r agent.Record) bool { return strings.Contains(r.PolicyError, "deadline") }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := parseConfig(t, append(common, tc.args...))
			pol, err := NewPolicy(*c, zerolog.Nop())
			if err != nil {
				t.Fatal(err)
			}
			if pol.Close != nil {
				defer pol.Close()
			}
			l := &loop.Loop{Settings: c.Loop, Clock: agent.RealClock{}, Policy: pol, Guard: c.Guard,
				Runtimes: []agent.Runtime{fakes.NewRuntime("s1", "s2", "s3")}, Windows: fakes.NewWindows(), Log: zerolog.Nop()}
			ctx, cancel := context.WithTimeout(context.Background(), c.Loop.StepBudget())
			defer cancel()
			rec := l.Step(ctx)
			if !tc.stopped(rec) {
				t.Fatalf("the call was not cut at the step's deadline: error %q, report %+v", rec.PolicyError, rec.PolicyReport)
			}
			// The step ran to the policy's budget, and the model's 5 s and
			// the script's forever were not waited for. The slack past the
			// budget is a second: a spinning Lua script is stopped at its
			// next instruction check, which a loaded machine (load 7 on 2
			// cores, seen) delays by a few hundred ms.
			if took := time.Duration(rec.DurationMs * float64(time.Millisecond)); took < c.Loop.PolicyBudget()-50*time.Millisecond || took >= c.Loop.PolicyBudget()+time.Second {
				t.Fatalf("the step took %v; the policy's budget is %v of a %v interval", took, c.Loop.PolicyBudget(), c.Loop.Interval)
			}
		})
	}
}
