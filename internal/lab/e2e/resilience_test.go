//go:build e2e

package e2e

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
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
	var events reloads
	out := run(t, scenario.Scenario{Servers: paperFleet(0, 0, 0.05, 0, 0, 0.05), Rate: 300, Duration: restartAt + 12*time.Second, Policy: "rules",
		Interval: 10 * time.Second, AgentArgs: noTailGuard,
		At: map[time.Duration]func(*scenario.Env){
			reloadAt:  events.do("reload", func(env *scenario.Env) error { return env.HAProxy.Reload(context.Background()) }),
			restartAt: events.do("restart", func(env *scenario.Env) error { return env.HAProxy.Restart(context.Background()) }),
		}})
	drainsComeBack(t, out, reloadAt, events.all(t, 2), 1500*time.Millisecond, true, "srv3", "srv6")
	if len(out.DrainedAt) != 2 {
		t.Errorf("drained %v", out.DrainedAt)
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

// reloads records HAProxy's reloads and restarts in a scenario, by the
// wall clock the agent's audit log keeps.
type reloads struct {
	mu     sync.Mutex
	events []reload
}

// reload is one reload or restart: from the call to the new process
// answering on the socket.
type reload struct {
	name         string
	began, ready time.Time
	err          error
}

// do is a scenario action that runs f as the named reload and records it.
func (r *reloads) do(name string, f func(*scenario.Env) error) func(*scenario.Env) {
	return func(env *scenario.Env) {
		began := time.Now()
		err := f(env)
		r.mu.Lock()
		defer r.mu.Unlock()
		r.events = append(r.events, reload{name: name, began: began, ready: time.Now(), err: err})
	}
}

// all returns the recorded reloads, failing the test unless want of them
// ran and each succeeded.
func (r *reloads) all(t *testing.T, want int) []reload {
	t.Helper()
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.events) != want {
		t.Fatalf("%d reloads ran, want %d", len(r.events), want)
	}
	for _, e := range r.events {
		if e.err != nil {
			t.Fatalf("%s: %v", e.name, e.err)
		}
	}
	return append([]reload(nil), r.events...)
}

// drainsComeBack checks that each server was drained before at, had its
// drain applied again after each reload or restart, within the given time
// of the new process answering (in a step the reload woke, if woken), and
// ends drained. The re-application is read from the agent's audit log:
// the outcome's watch polls every 100 ms and can miss a drain lost and put
// back between two polls (seen in CI on HAProxy 3.0 after a restart, whose
// new worker both the watch and the agent wait on). The losses the watch
// did see must each be back within the same time.
func drainsComeBack(t *testing.T, out *scenario.Outcome, at time.Duration, events []reload, within time.Duration, woken bool, servers ...string) {
	t.Helper()
	recs := auditRecords(t, out.AuditLog)
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
		if lost > len(events) || !finalState(out, s).Drain() {
			t.Errorf("%s: lost its drain %d times in %d reloads, final %+v: %v", s, lost, len(events), finalState(out, s), tl)
		}
		cmd, err := haproxy.SetStateCommand(fleet.BackendName, s, haproxy.StateDrain)
		if err != nil {
			t.Fatal(err)
		}
		sent := func(c agent.CommandResult) bool { return c.Command == cmd && c.Error == "" }
		for _, e := range events {
			var back *agent.Record
			for i, rec := range recs {
				if !rec.Time.Before(e.began) && !rec.Time.After(e.ready.Add(within)) && (!woken || rec.Woken != "") &&
					slices.ContainsFunc(rec.Commands, sent) {
					back = &recs[i]
				}
			}
			if back == nil {
				step := "step"
				if woken {
					step = "woken step"
				}
				t.Errorf("%s: no %q in a %s after the %s, within %v of the new process answering at %s", s, cmd, step, e.name,
					within, e.ready.Format("15:04:05.000"))
				if audit, err := os.ReadFile(out.AuditLog); err == nil {
					logCommands(t, "agent", audit)
				}
				continue
			}
			t.Logf("%s: drain back after the %s at %s (%v after the new process answered, woken %q)", s, e.name,
				back.Time.Format("15:04:05.000"), back.Time.Sub(e.ready).Round(time.Millisecond), back.Woken)
		}
	}
}
