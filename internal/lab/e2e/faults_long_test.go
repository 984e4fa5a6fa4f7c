//go:build e2e && faults

package e2e

// The fault classes end to end, one real HAProxy, fleet and agent at a
// time (about 40 s each): `make test-faults`, which CI runs, not `make
// test`, whose e2e suite they would lengthen by about a quarter of an hour.

import (
	"os"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/hapilot/hapilot/internal/lab/fleet"
	"github.com/hapilot/hapilot/internal/lab/labtest"
	"github.com/hapilot/hapilot/internal/lab/scenario"
)

// Each way a real server fails, on the stats path and on SPOE (the
// README's stanza, with the stats path beside it, as the agent runs by
// default): the server that fails is drained, no healthy one is; a 500,
// the server's own answer, is the control. One run at a time: each holds
// a real HAProxy, a fleet and an agent at 300 req/s, and the drain times
// are what is tested. Before, on both paths,
// a hang, garbage, a reset and a refused connection reached no window.
func TestEveryFaultDrained(t *testing.T) {
	for _, path := range []string{"stats", "spoe"} {
		for _, r := range []faultRun{
			{fault: fleet.Fault500}, // the control: the server's own 500
			{fault: fleet.FaultHang}, {fault: fleet.FaultGarbage}, {fault: fleet.FaultReset}, {fault: fleet.FaultReset, close: true}, {fault: fleet.FaultRefuse},
		} {
			r.path = path
			t.Run(r.name(), func(t *testing.T) { drainsFaulty(t, r) })
		}
	}
}

// The Lua companion's stanza (http-after-response) and the log stanza see
// HAProxy's own 504 for a server that hangs and its 502 for one that
// answers garbage; the stats path beside them adds the resets and the
// refused connections they cannot see. Before, the Lua stanza's
// http-response rules never ran for HAProxy's own answers.
func TestEveryFaultDrainedLuaAndLogs(t *testing.T) {
	for _, path := range []string{"lua", "syslog"} {
		for _, r := range []faultRun{
			{fault: fleet.FaultHang}, {fault: fleet.FaultGarbage}, {fault: fleet.FaultReset}, {fault: fleet.FaultRefuse},
		} {
			r.path = path
			t.Run(r.name(), func(t *testing.T) { drainsFaulty(t, r) })
		}
	}
}

// `hapilot-bench demo --fault hang`, as a reader runs it (45 s a policy):
// the table's rules row finds both faulty servers, and no healthy one is
// drained. Not shortened: the demo's servers draw their faults from fixed
// seeds, and srv3's first 1,000 requests fail 3.1%, not 5%, so that from
// a cold start it is found after 21-26 s (measured); a 25 s run failed CI.
func TestDemoFault(t *testing.T) {
	labtest.RequireHAProxy(t)
	cmd := exec.Command(benchBinary, "demo", "--fault", "hang")
	out, err := cmd.CombinedOutput()
	t.Logf("%s", out)
	if err != nil {
		t.Fatalf("demo: %v", err)
	}
	var rules string
	for _, l := range strings.Split(string(out), "\n") {
		if f := strings.Fields(l); len(f) > 0 && f[0] == "rules" {
			rules = l
		}
	}
	if rules == "" || strings.Contains(rules, "never") {
		t.Errorf("rules row %q: want srv3 and srv6 drained", rules)
	}
	for _, want := range []string{"fault: hang: ", "HAProxy answers 504 itself", "healthy servers drained: none"} {
		if !strings.Contains(string(out), want) {
			t.Errorf("the demo's output lacks %q", want)
		}
	}
}

// A deploy, as an operator's HAProxy sees it (retries 3, option
// redispatch): a healthy server restarted for 0.5 s, then for 3 s, is not
// drained: each restart is a burst of retries shorter than the minimum
// duration. A server that resets 5% of its connections for the whole run
// is drained. Issue 41's deploy case: before, the first restart's retries
// drained the server.
func TestDeployRestartNotDrained(t *testing.T) {
	servers := paperFleet(0.002, 0.002, 0.002, 0.002, 0.002, 0.002)
	servers[2].Fault = fleet.FaultRefuse // healthy: refuses 0.2% of the time, and on Restart
	restart := func(d time.Duration) func(*scenario.Env) {
		return func(env *scenario.Env) {
			if !env.Backends[2].Restart(d) {
				t.Errorf("srv3 could not restart")
			}
		}
	}
	out := run(t, scenario.Scenario{Servers: servers, Rate: 300, Duration: 45 * time.Second, Policy: "rules",
		Name: "deploy", Telemetry: "stats", Redispatch: true, AgentArgs: noTailGuard,
		At: map[time.Duration]func(*scenario.Env){10 * time.Second: restart(500 * time.Millisecond), 25 * time.Second: restart(3 * time.Second)}})
	t.Logf("client: %d 5xx, %d failed; drained %v", out.Load.Err5xx, out.Load.Failed, out.DrainedAt)
	for s, at := range out.DrainedAt {
		t.Errorf("%s drained at %v", s, at)
	}
}

// The other side: resets on 5% of srv3's connections, for the run, behind
// the same retries and redispatch, are a sustained fault: drained.
func TestResettingServerDrained(t *testing.T) {
	drainsFaulty(t, faultRun{path: "stats", fault: fleet.FaultReset})
}

// A slow tail, issue 42's: srv3 answers 5% of its requests after 1.5 s,
// its median unchanged, in front of a real HAProxy at 300 req/s. The tail
// begins mid-stream, after 15 s of steady traffic, as detection times are
// counted (a cold start is apart: the backend's p95 and each server's
// slow share are still forming). On every path srv3 is drained, and no
// healthy server is. On the per-response paths the tail test drains it
// (the reason names the slow tail) within 12 s of the onset: the slow
// answers come 1.5 s after their requests, the minimum duration's cut
// takes the tail's first 5 s, and the test's bound is about 3 s at 50
// answers a second (5% against 0.1%); the rest is room for the draws
// (7.1-10.1 s measured). Issue 42's target is 10 s, twice the stats
// path's 5.0 s in its measurement (from a cold start); docs/explanation/
// detection.md gives the times against it. On the stats path, whose only
// answer time is a mean (its last 10 s of answers, read out of HAProxy's
// rtime), the mean is judged and the reason says so, within 30 s: a 5%
// tail at 1.5 s moves it past the threshold (50 ms above the peers') once
// the tail is srv3's typical grain, half of 20 s (haproxy.RecentMean). Before, SPOE, Lua and syslog judged the
// median alone and never drained it. Each run goes on 35 s past the
// bound, beyond the drain's cooldown (30 s ± 10%) and its probe burst:
// srv3, still slow, stays drained, drained once. Before, the burst judged
// the median alone and let it back (drained at 23.5 s, back at 56.5 s,
// drained again at 63.6 s). The paths run side by side (each is light:
// 300 req/s).
func TestSlowTailDrained(t *testing.T) {
	for _, path := range []string{"stats", "spoe", "lua", "syslog"} {
		t.Run(path, func(t *testing.T) {
			t.Parallel()
			servers := faultFleet(fleet.FaultSlow)
			servers[2].ErrorRate = 0
			onset, within := 15*time.Second, 12*time.Second
			if path == "stats" {
				within = 30 * time.Second
			}
			out := run(t, scenario.Scenario{Servers: servers, Rate: 300, Duration: onset + within + 35*time.Second, Policy: "rules",
				Name: "slow-" + path, Telemetry: path, Redispatch: true, AgentArgs: noTailGuard,
				At: map[time.Duration]func(*scenario.Env){onset: func(env *scenario.Env) { env.Backends[2].SetErrorRate(0.05) }}})
			slowDrained(t, out, onset, within, path == "stats")
			if out.Flips["srv3"] != 1 || !finalState(out, "srv3").Drain() {
				t.Errorf("srv3, still slow, let back: %d flips, timeline %v", out.Flips["srv3"], out.Timeline["srv3"])
			}
		})
	}
}

// Every fault class in one fleet of twelve on each telemetry path, the
// four paths side by side: srv2 answers 500 (the control), srv4 hangs,
// srv6 answers garbage, srv8 resets keep-alive connections, srv10
// refuses connections, srv12 has a slow tail, each on 5% of its requests
// from its own onset, 10 s apart from 25 s in, after a steady state; the
// other six fail 0.2% with 500s, 50 req/s a server as in the one-class
// runs. The onsets are apart so that the fleet is not half faulty at
// once, which the peer test rightly reads as something shared (at 30 req/s
// a server and onsets together, the drains took 21-45 s). The servers'
// faults are drawn from fixed seeds, so each path sees the same draws.
// Behind retries 3 and option redispatch, each faulty
// server is drained within 30 s of its onset and is still drained at the
// run's end (the first four past their cooldown and probe burst, the last
// two not yet), and no healthy server is drained. Short enough for the version matrix (`make
// test-matrix` runs it on 3.0 and 3.2), where the one-class runs of `make
// test-faults` would take a quarter of an hour a version: it proves each
// class is seen and drained on each version, and prints each drain time
// beside the 500's.
func TestEveryFaultAtOnce(t *testing.T) {
	type faultyServer struct {
		server string
		fault  fleet.Fault
	}
	faulty := []faultyServer{{"srv2", fleet.Fault500}, {"srv4", fleet.FaultHang}, {"srv6", fleet.FaultGarbage}, {"srv8", fleet.FaultReset}, {"srv10", fleet.FaultRefuse}, {"srv12", fleet.FaultSlow}}
	const first, apart, within = 25 * time.Second, 10 * time.Second, 30 * time.Second
	for _, path := range []string{"stats", "spoe", "lua", "syslog"} {
		t.Run(path, func(t *testing.T) {
			t.Parallel()
			servers := paperFleet(0.002, 0, 0.002, 0, 0.002, 0, 0.002, 0, 0.002, 0, 0.002, 0)
			at := map[time.Duration]func(*scenario.Env){}
			for k, f := range faulty {
				i := 2*k + 1
				servers[i].Fault = f.fault
				at[first+time.Duration(k)*apart] = func(env *scenario.Env) { env.Backends[i].SetErrorRate(0.05) }
			}
			last := first + time.Duration(len(faulty)-1)*apart
			out := run(t, scenario.Scenario{Servers: servers, Rate: 600, Duration: last + within, Policy: "rules",
				Name: "every-fault-" + path, Telemetry: path, Redispatch: true, AgentArgs: noTailGuard, At: at})
			control := out.DrainedAt["srv2"] - first
			for k, f := range faulty {
				onset := first + time.Duration(k)*apart
				drained, ok := out.DrainedAt[f.server]
				t.Logf("%s: %s (%s) drained %v after its onset (%v), the 500 %v: %.2fx; final %+v", path, f.server, f.fault, drained-onset, ok, control,
					float64(drained-onset)/float64(max(control, time.Second)), finalState(out, f.server))
				if !ok || drained < onset || drained-onset > within {
					t.Errorf("%s (%s) drained at %v (%v), want within %v of %v", f.server, f.fault, drained, ok, within, onset)
				}
				if !finalState(out, f.server).Drain() {
					t.Errorf("%s (%s) let back while it still fails: timeline %v", f.server, f.fault, out.Timeline[f.server])
				}
			}
			for s, at := range out.DrainedAt {
				if !slices.ContainsFunc(faulty, func(f faultyServer) bool { return f.server == s }) {
					t.Errorf("healthy %s drained at %v", s, at)
				}
			}
		})
	}
}

// slowDrained: srv3 drained within `within` of onset and no other
// server; the audit log's reason is the tail test's, or, on the stats
// path (mean), says the figure is a mean read out of HAProxy's rtime.
func slowDrained(t *testing.T, out *scenario.Outcome, onset, within time.Duration, mean bool) {
	t.Helper()
	at, ok := out.DrainedAt["srv3"]
	t.Logf("srv3 drained at %v (%v), %v after the onset", at, ok, at-onset)
	if !ok || at < onset || at-onset > within {
		t.Errorf("srv3 drained at %v (%v), want within %v of %v", at, ok, within, onset)
	}
	for s := range out.DrainedAt {
		if s != "srv3" {
			t.Errorf("healthy %s drained", s)
		}
	}
	audit, err := os.ReadFile(out.AuditLog)
	if err != nil {
		t.Fatal(err)
	}
	var reason string
	for _, l := range strings.Split(string(audit), "\n") {
		if strings.Contains(l, `"srv3"`) && strings.Contains(l, "drain") && (strings.Contains(l, "slow") || strings.Contains(l, "median")) {
			reason = l
			break
		}
	}
	t.Logf("audit: %s", tail(reason, 1500))
	switch {
	case mean && !strings.Contains(reason, "rtime"):
		t.Errorf("the stats path's drain does not say its figure is a mean read out of HAProxy's rtime")
	case !mean && !strings.Contains(reason, "slow tail"):
		t.Errorf("the drain is not the tail test's")
	}
}
