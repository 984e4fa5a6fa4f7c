//go:build e2e

package e2e

import (
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/hapilot/hapilot/internal/lab/haproxyproc"
	"github.com/hapilot/hapilot/internal/lab/scenario"
)

// The core fault test through the Lua companion and through syslog (UDP,
// and batched through a ring over TCP), and through SPOE and the Lua
// companion over unix sockets (HAProxy reaching a local agent with no
// port open to anyone else): the
// faulty servers drained, the healthy never. The Lua companion runs in an
// HAProxy of two threads: lua-load-per-thread gives each its own copy, its
// own table and its own flushing task, and the agent must hear from both.
func TestLuaAndSyslogPathsDrainFaulty(t *testing.T) {
	t.Parallel()
	for _, path := range []string{"lua", "syslog", "syslog-ring", "spoe-unix", "lua-unix", "syslog-unix", "syslog-ring-unix"} {
		t.Run(path, func(t *testing.T) {
			t.Parallel()
			threads := 1
			if path == "lua" {
				threads = 2
			}
			out := run(t, scenario.Scenario{Servers: paperFleet(0, 0, 0.05, 0, 0, 0.05), Rate: 300, Duration: 40 * time.Second,
				Policy: "rules", Name: path, Telemetry: path, Threads: threads})
			for _, s := range []string{"srv3", "srv6"} {
				if at, ok := out.DrainedAt[s]; !ok || at > coldDrain {
					t.Errorf("%s drained at %v (%v)", s, at, ok)
				}
			}
			if len(out.DrainedAt) != 2 {
				t.Errorf("drained %v", out.DrainedAt)
			}
			if out.Events < uint64(out.Load.Completed)*9/10 {
				t.Errorf("agent recorded %d events for %d responses", out.Events, out.Load.Completed)
			}
		})
	}
}

// With the agent (a `hapilot run` process) killed mid-load, the Lua and
// syslog paths add no errors and no latency: every request succeeds and
// p99 stays near a plain HAProxy's, run at the same time.
func TestAgentKilledLuaAndSyslog(t *testing.T) {
	t.Parallel()
	runs := map[string]scenario.Scenario{
		"plain":       {NoSPOE: true},
		"lua":         {Policy: "rules", Name: "lua", Telemetry: "lua", AgentBinary: agentBinary, KillAgentAt: 10 * time.Second},
		"syslog":      {Policy: "rules", Name: "syslog", Telemetry: "syslog", AgentBinary: agentBinary, KillAgentAt: 10 * time.Second},
		"syslog-ring": {Policy: "rules", Name: "syslog-ring", Telemetry: "syslog-ring", AgentBinary: agentBinary, KillAgentAt: 10 * time.Second},
	}
	for name, s := range runs {
		s.Servers, s.Rate, s.Duration = paperFleet(0, 0, 0, 0), 300, 30*time.Second
		runs[name] = s
	}
	outs, _ := sideBySide(t, runs)
	if len(outs) != len(runs) {
		t.Fatal("a run failed")
	}
	plain := outs["plain"].Load.Quantile(0.99)
	for _, name := range []string{"lua", "syslog", "syslog-ring"} {
		o := outs[name].Load
		p99 := o.Quantile(0.99)
		t.Logf("%s: %d requests, %d failed, %d 5xx, p99 %v (plain HAProxy %v)", name, o.Scheduled, o.Failed, o.Err5xx, p99, plain)
		if o.Failed != 0 || o.Err5xx != 0 || o.Completed != o.Scheduled {
			t.Errorf("%s: %d failed, %d 5xx, %d of %d completed", name, o.Failed, o.Err5xx, o.Completed, o.Scheduled)
		}
		if p99 > plain*3/2+2*time.Millisecond {
			t.Errorf("%s: p99 %v against plain %v", name, p99, plain)
		}
	}
}

// A user's Lua policy (examples/policies/ratio.lua) in charge, end to end:
// the guardrails apply as to any policy, and the faulty servers go.
func TestLuaPolicyEndToEnd(t *testing.T) {
	t.Parallel()
	script, err := filepath.Abs("../../../examples/policies/ratio.lua")
	if err != nil {
		t.Fatal(err)
	}
	out := run(t, scenario.Scenario{Servers: paperFleet(0, 0, 0.05, 0, 0, 0.05), Rate: 300, Duration: 40 * time.Second,
		Policy: "lua", AgentArgs: []string{"--policy-file", script}})
	for _, s := range []string{"srv3", "srv6"} {
		if _, ok := out.DrainedAt[s]; !ok {
			t.Errorf("%s not drained: %v", s, out.DrainedAt)
		}
	}
	if len(out.DrainedAt) != 2 {
		t.Errorf("drained %v", out.DrainedAt)
	}
}

// A hostile Lua policy in the real binary: decide doubles a string 29
// times (512 MiB) at every step. The script runs in the agent's worker
// process, which meets its memory bound and dies; the agent breaks the
// policy, keeps running and answering, and its own peak RSS stays small.
// Before, the string was the agent's: 1.8 GB. The interval is 10 s, so
// that the call's deadline (8 s of the step) cannot end the hog before
// its memory bound does: at a 1 s interval, on a busy machine, the
// deadline fired first (0.8 s) and the bound this test is about was never
// met.
func TestHostileLuaPolicyCannotGrowTheAgent(t *testing.T) {
	t.Parallel()
	script := filepath.Join(t.TempDir(), "hog.lua")
	if err := os.WriteFile(script, []byte(`function decide(obs) local s = "x" for i = 1, 29 do s = s .. s end return {} end`), 0o644); err != nil {
		t.Fatal(err)
	}
	ports, err := haproxyproc.FreePorts(1)
	if err != nil {
		t.Fatal(err)
	}
	status := fmt.Sprintf("127.0.0.1:%d", ports[0])
	var alive error
	var peak int
	var statusCode int
	out := run(t, scenario.Scenario{Servers: paperFleet(0, 0, 0, 0), Rate: 100, Duration: 10 * time.Second, Interval: 10 * time.Second,
		Policy: "lua", AgentBinary: agentBinary, AgentArgs: []string{"--policy-file", script}, StatusListen: status,
		At: map[time.Duration]func(*scenario.Env){8 * time.Second: func(env *scenario.Env) {
			alive = env.SignalAgent(syscall.Signal(0))
			peak = peakRSS(env.AgentPID())
			if resp, err := http.Get("http://" + status + "/status"); err == nil {
				statusCode = resp.StatusCode
				resp.Body.Close()
			}
		}}})
	t.Logf("at 8 s: agent alive %v, its peak RSS %d MiB, /status %d", alive == nil, peak>>20, statusCode)
	if alive != nil || statusCode != 200 {
		t.Fatalf("the agent at 8 s: %v, /status %d", alive, statusCode)
	}
	if peak == 0 || peak > 128<<20 {
		t.Errorf("the agent's peak RSS is %d MiB: the script's memory was the agent's", peak>>20)
	}
	if !strings.Contains(out.AgentLog(), "memory bound") {
		t.Errorf("the agent's log never says the script met its memory bound")
	}
}

// peakRSS is a process's peak resident set (VmHWM) in bytes, 0 if unknown.
func peakRSS(pid int) int {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "VmHWM:"); ok {
			kb, _ := strconv.Atoi(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")))
			return kb << 10
		}
	}
	return 0
}
