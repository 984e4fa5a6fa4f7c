//go:build e2e

package e2e

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/hapilot/hapilot/agent"
	"github.com/hapilot/hapilot/haproxy"
	"github.com/hapilot/hapilot/internal/lab/fleet"
	"github.com/hapilot/hapilot/internal/lab/scenario"
)

// noTailGuard turns the tail-latency guard off in tests of something else:
// eight scenarios at once on 2 cores make the backend's p99 swing with
// the machine's load, and the guard (tested on its own in agent/recovery)
// then undoes drains those tests are not about. Seen in CI on a quiet
// machine: "p99 207 ms is 5.9x the 35 ms before the drain".
var noTailGuard = []string{"--p99-guard", "0"}

// Kill the agent (a `hapilot run` process with a state file) with SIGKILL
// after it drained, and start it again: no drained server flaps, and the
// operator's maint is untouched.
func TestAgentRestartKeepsItsDrains(t *testing.T) {
	t.Parallel()
	killAt := coldDrain // once both drains are in
	out := run(t, scenario.Scenario{Servers: paperFleet(0.05, 0, 0.05, 0, 0, 0.05, 0, 0), Rate: 300, Duration: killAt + 20*time.Second,
		Policy: "rules", AgentBinary: agentBinary, KillAgentAt: killAt, RestartAgentAt: killAt + 2*time.Second, AgentArgs: noTailGuard,
		Prepare: func(ctx context.Context, rt *haproxy.Client) error {
			return rt.SetServerState(ctx, fleet.BackendName, "srv1", haproxy.StateMaint)
		}})
	for _, s := range []string{"srv3", "srv6"} {
		if out.Flips[s] != 1 || !finalState(out, s).Drain() {
			t.Errorf("%s: %d flips, final %+v (timeline %v)", s, out.Flips[s], finalState(out, s), out.Timeline[s])
		}
		if at := out.DrainedAt[s]; at > killAt {
			t.Errorf("%s drained at %v, after the kill: the test proves nothing", s, at)
		}
	}
	if st := finalState(out, "srv1"); st.AdminState != haproxy.AdminForcedMaint || out.Flips["srv1"] != 0 {
		t.Errorf("operator's srv1: %+v, flips %d", st, out.Flips["srv1"])
	}
	if len(out.DrainedAt) != 2 {
		t.Errorf("drained %v", out.DrainedAt)
	}
}

// Reload HAProxy (-sf) and then restart it, under load, with the
// package's 10 s interval: each time the stats path sees the new process
// and the agent's drains are back within 1.5 s, in a step it woke for
// (audited `woken`), not at the next tick.
func TestHAProxyReloadAndRestart(t *testing.T) {
	t.Parallel()
	reloadAt := coldDrain // once both drains are in
	restartAt := reloadAt + 12*time.Second
	var reloadErr, restartErr error
	out := run(t, scenario.Scenario{Servers: paperFleet(0, 0, 0.05, 0, 0, 0.05), Rate: 300, Duration: restartAt + 12*time.Second, Policy: "rules",
		Interval: 10 * time.Second, AgentArgs: noTailGuard,
		At: map[time.Duration]func(*scenario.Env){
			reloadAt:  func(env *scenario.Env) { reloadErr = env.HAProxy.Reload(context.Background()) },
			restartAt: func(env *scenario.Env) { restartErr = env.HAProxy.Restart(context.Background()) },
		}})
	if reloadErr != nil || restartErr != nil {
		t.Fatalf("reload: %v, restart: %v", reloadErr, restartErr)
	}
	drainsComeBack(t, out, reloadAt, 2, 1500*time.Millisecond, "srv3", "srv6")
	if len(out.DrainedAt) != 2 {
		t.Errorf("drained %v", out.DrainedAt)
	}
	// The drains went back in steps the reloads woke, one per new process.
	audit, err := os.ReadFile(out.AuditLog)
	if err != nil {
		t.Fatal(err)
	}
	woken := 0
	for _, line := range strings.Split(string(audit), "\n") {
		var rec agent.Record
		if json.Unmarshal([]byte(line), &rec) != nil || rec.Woken == "" {
			continue
		}
		for _, c := range rec.Commands {
			if strings.Contains(c.Command, "state drain") {
				woken++
				break
			}
		}
	}
	if woken < 2 {
		t.Errorf("%d woken steps re-applied drains, want one per reload and restart", woken)
	}
}

// The transient fault: srv3 heals half way and is re-admitted (probe
// burst, canary weight, full weight) well within 60 s of healing; srv6
// keeps failing and, probed twice, is never re-admitted.
func TestTransientFaultReadmitted(t *testing.T) {
	t.Parallel()
	healAt := 30 * time.Second
	out := run(t, scenario.Scenario{Servers: paperFleet(0, 0, 0.05, 0, 0, 0.05), Weight: 8, Rate: 300, Duration: 75 * time.Second,
		Policy: "rules", AgentArgs: append([]string{"--probe-cooldown", "10s"}, noTailGuard...),
		At: map[time.Duration]func(*scenario.Env){
			healAt: func(env *scenario.Env) { env.Backends[2].SetErrorRate(0) },
		}})
	t.Logf("srv3 %v; srv6 %v", out.Timeline["srv3"], out.Timeline["srv6"])
	tl := out.Timeline["srv3"]
	if len(tl) != 2 || !tl[0].Drained || tl[0].At > healAt || tl[1].Drained {
		t.Fatalf("srv3: want drained before %v and re-admitted once: %v", healAt, tl)
	}
	if back := tl[1].At - healAt; back < 0 || back > 60*time.Second {
		t.Errorf("srv3 re-admitted %v after healing", back)
	}
	if st := finalState(out, "srv3"); st.AdminState != 0 || st.Weight != 8 {
		t.Errorf("srv3 final %+v: want ready at full weight", st)
	}
	if out.Flips["srv6"] != 1 || !finalState(out, "srv6").Drain() {
		t.Errorf("srv6 (still failing): flips %d, final %+v", out.Flips["srv6"], finalState(out, "srv6"))
	}
	for _, s := range []string{"srv1", "srv2", "srv4", "srv5"} {
		if out.Flips[s] != 0 {
			t.Errorf("healthy %s flipped", s)
		}
	}
}

// A capacity-tight fleet: 4 servers that each serve 16 requests at a
// time in about 88 ms (182 req/s), at 540 req/s in all (74% busy). A plain
// drain of the faulty one runs the other three at 99%: the "drain" run,
// capacity-awareness off, is logged as the counterfactual. The agent, told
// that pools of 16 may run at 95% (--max-utilization 0.95), cuts the faulty
// server's weight instead: p99 stays within 1.5x of the no-policy run while
// most of the 5xx go.
//
// The cut's depth rests on the service time HAProxy measures, and the
// slack at 95% is thin: 4% more measured time leaves weight 3 where 2
// would do, and 3 of 27 keeps too much of the fault. So the servers are
// slow and the rate low (88 ms at 540 req/s, not 44 ms at 1100): the three
// runs side by side load the 2 cores half as much, and a millisecond of
// scheduling delay weighs half as much in 88 ms. At 44 ms, CI saw weight 3
// and 49% of the 5xx removed.
func TestCapacityTightFleet(t *testing.T) {
	// Not parallel: the agent's capacity estimate rests on measured
	// service times, which other tests' load on the same 2 cores would
	// inflate. It runs alone, before the parallel tests.
	servers := paperFleet(0, 0, 0.05, 0)
	for i := range servers {
		servers[i].Capacity, servers[i].Latency, servers[i].Jitter = 16, 80*time.Millisecond, 16*time.Millisecond
	}
	// "drain" is the counterfactual: the rules with capacity-awareness
	// off, for the log.
	runs := map[string]scenario.Scenario{
		"static": {Policy: "static"},
		"rules":  {Policy: "rules", AgentArgs: []string{"--max-utilization", "0.95"}},
		"drain":  {Policy: "rules", Name: "drain", AgentArgs: []string{"--max-utilization", "0"}},
	}
	for name, s := range runs {
		s.Servers, s.Weight, s.MaxConn, s.Rate, s.Duration = servers, 8, 16, 540, coldDrain+40*time.Second
		runs[name] = s
	}
	outs, audits := sideBySide(t, runs)
	for name, audit := range audits {
		logCommands(t, name, audit)
	}
	if d := outs["drain"]; d != nil && outs["static"] != nil {
		t.Logf("counterfactual, a plain drain: p99 %v (%.2fx static), 5xx %d", d.Load.Quantile(0.99),
			float64(d.Load.Quantile(0.99))/float64(outs["static"].Load.Quantile(0.99)), d.Load.Err5xx)
	}
	static, rules := outs["static"], outs["rules"]
	if static == nil || rules == nil {
		t.Fatal("a run failed")
	}
	sp99, rp99 := static.Load.Quantile(0.99), rules.Load.Quantile(0.99)
	// The 5xx once the cut is in (coldDrain from the cold start): what the
	// weight does, not when the test found the fault.
	after := func(r *fleet.Result) (n int) {
		for _, s := range r.PerSecond[int(coldDrain/time.Second):] {
			n += s.Err5xx
		}
		return n
	}
	sAfter, rAfter := after(static.Load), after(rules.Load)
	reduction := 1 - float64(rAfter)/float64(max(sAfter, 1))
	t.Logf("p99 static %v, rules %v (%.2fx); 5xx static %d, rules %d; after %v: static %d, rules %d (%.0f%% fewer); srv3 final %+v",
		sp99, rp99, float64(rp99)/float64(sp99), static.Load.Err5xx, rules.Load.Err5xx, coldDrain, sAfter, rAfter, 100*reduction, finalState(rules, "srv3"))
	if float64(rp99) > 1.5*float64(sp99) {
		t.Errorf("p99 %v is more than 1.5x the no-policy %v", rp99, sp99)
	}
	if reduction < 0.5 {
		t.Errorf("only %.0f%% of the 5xx removed once the cut is in", 100*reduction)
	}
	if st := finalState(rules, "srv3"); st.Drain() || st.Weight >= 8 {
		t.Errorf("srv3 final %+v: want a reduced weight, not a drain", st)
	}
}

// SIGTERM with --on-exit restore: the agent readies every server it
// drained before it exits; the operator's maint stays.
func TestGracefulShutdownRestores(t *testing.T) {
	t.Parallel()
	termAt := coldDrain // once both drains are in
	out := run(t, scenario.Scenario{Servers: paperFleet(0.05, 0, 0.05, 0, 0, 0.05), Rate: 300, Duration: termAt + 4*time.Second,
		Policy: "rules", AgentBinary: agentBinary, AgentArgs: []string{"--on-exit", "restore"},
		KillAgentAt: termAt, KillSignal: syscall.SIGTERM,
		Prepare: func(ctx context.Context, rt *haproxy.Client) error {
			return rt.SetServerState(ctx, fleet.BackendName, "srv1", haproxy.StateMaint)
		}})
	for _, s := range []string{"srv3", "srv6"} {
		tl := out.Timeline[s]
		if len(tl) != 2 || !tl[0].Drained || tl[0].At > termAt || tl[1].Drained || tl[1].At < termAt {
			t.Errorf("%s: want drained, then readied at the shutdown: %v", s, tl)
		}
		if st := finalState(out, s); st.AdminState != 0 {
			t.Errorf("%s final %+v", s, st)
		}
	}
	if st := finalState(out, "srv1"); st.AdminState != haproxy.AdminForcedMaint {
		t.Errorf("operator's srv1 final %+v", st)
	}
}

// SIGHUP, what logrotate sends, reopens the audit log and never stops
// the agent: the log is moved away at 12 s and SIGHUP sent, the agent
// writes a new one at the path, and SIGTERM at 18 s still finds it
// running, so --on-exit restore readies the server it drained. Before,
// SIGHUP killed the agent: no new log, and srv2 stayed drained.
func TestSIGHUPReopensTheAuditLog(t *testing.T) {
	t.Parallel()
	var hupErr, moveErr error
	// The rotation comes once the drain is in (coldDrain).
	hupAt, termAt := coldDrain, coldDrain+6*time.Second
	out := run(t, scenario.Scenario{Servers: paperFleet(0, 0.05, 0, 0, 0, 0), Rate: 300, Duration: termAt + 4*time.Second,
		Policy: "rules", AgentBinary: agentBinary, AgentArgs: []string{"--on-exit", "restore"},
		KillAgentAt: termAt, KillSignal: syscall.SIGTERM,
		At: map[time.Duration]func(*scenario.Env){hupAt: func(env *scenario.Env) {
			if moveErr = os.Rename(env.AuditLog, env.AuditLog+".1"); moveErr == nil {
				hupErr = env.SignalAgent(syscall.SIGHUP)
			}
		}}})
	if moveErr != nil || hupErr != nil {
		t.Fatalf("rotate: %v; SIGHUP: %v", moveErr, hupErr)
	}
	cycles := func(path string) (first, last uint64) {
		b, err := os.ReadFile(path)
		if err != nil {
			t.Fatalf("%s: %v", filepath.Base(path), err)
		}
		for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
			var rec agent.Record
			if err := json.Unmarshal([]byte(line), &rec); err != nil {
				t.Fatalf("%s: %v", filepath.Base(path), err)
			}
			if first == 0 {
				first = rec.Cycle
			}
			last = rec.Cycle
		}
		return first, last
	}
	_, rotatedLast := cycles(out.AuditLog + ".1")
	newFirst, newLast := cycles(out.AuditLog)
	t.Logf("rotated log: steps up to %d; new log: steps %d to %d", rotatedLast, newFirst, newLast)
	if newFirst != rotatedLast+1 || newLast < newFirst+3 {
		t.Errorf("the new log starts at step %d and ends at %d, after the rotated one's %d: want it to go on where that stopped", newFirst, newLast, rotatedLast)
	}
	if !strings.Contains(out.AgentLog(), "audit log reopened") || !strings.Contains(out.AgentLog(), "--on-exit restore") {
		t.Errorf("the agent's log lacks the reopen or the restore")
	}
	tl := out.Timeline["srv2"]
	if len(tl) != 2 || !tl[0].Drained || tl[0].At > hupAt || tl[1].Drained || tl[1].At < termAt {
		t.Errorf("srv2: want drained before the SIGHUP, readied at the SIGTERM: %v", tl)
	}
	if st := finalState(out, "srv2"); st.AdminState != 0 {
		t.Errorf("srv2 final %+v", st)
	}
}

// A persistent fault over ten minutes: the server is probed again and
// again (30 s cooldown, doubling) and never re-admitted. Ten minutes is
// too long for `make test`: run with HAPILOT_LONG=1.
func TestPersistentFaultTenMinutes(t *testing.T) {
	if os.Getenv("HAPILOT_LONG") == "" {
		t.Skip("ten minutes: set HAPILOT_LONG=1")
	}
	t.Parallel()
	out := run(t, scenario.Scenario{Servers: paperFleet(0, 0, 0.05, 0, 0, 0), Rate: 300, Duration: 10 * time.Minute, Policy: "rules"})
	t.Logf("srv3 timeline %v", out.Timeline["srv3"])
	if out.Flips["srv3"] != 1 || !finalState(out, "srv3").Drain() {
		t.Errorf("srv3: %d flips, final %+v", out.Flips["srv3"], finalState(out, "srv3"))
	}
	if len(out.DrainedAt) != 1 {
		t.Errorf("drained %v", out.DrainedAt)
	}
}

// logCommands logs every command an agent sent, with its step's time.
func logCommands(t *testing.T, run string, audit []byte) {
	for _, line := range strings.Split(strings.TrimSpace(string(audit)), "\n") {
		var rec agent.Record
		if json.Unmarshal([]byte(line), &rec) == nil && len(rec.Commands) > 0 {
			for _, c := range rec.Commands {
				t.Logf("%s: step %d %s: %s %s", run, rec.Cycle, rec.Time.Format("15:04:05.0"), c.Command, c.Error)
			}
		}
	}
}

// drainsComeBack checks that each server was drained before at, lost its
// drain want times to HAProxy reloads or restarts, each time applied again
// within the given time, and ends drained.
func drainsComeBack(t *testing.T, out *scenario.Outcome, at time.Duration, want int, within time.Duration, servers ...string) {
	t.Helper()
	for _, s := range servers {
		tl := out.Timeline[s]
		t.Logf("%s drained/undrained at: %v", s, tl)
		if len(tl) == 0 || tl[0].At > at {
			t.Fatalf("%s not drained before %v: %v", s, at, tl)
		}
		lost := 0
		for i, tr := range tl {
			if tr.Drained {
				continue
			}
			lost++
			if i+1 >= len(tl) || tl[i+1].At-tr.At > within {
				t.Errorf("%s: drain lost at %v not back within %v: %v", s, tr.At, within, tl)
			}
		}
		if lost != want || !finalState(out, s).Drain() {
			t.Errorf("%s: lost its drain %d times (want %d), final %+v: %v", s, lost, want, finalState(out, s), tl)
		}
	}
}
