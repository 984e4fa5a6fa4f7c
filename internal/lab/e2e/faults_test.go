//go:build e2e

package e2e

import (
	"encoding/json"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hapilot/hapilot/internal/lab/fleet"
	"github.com/hapilot/hapilot/internal/lab/labtest"
	"github.com/hapilot/hapilot/internal/lab/scenario"
)

// faultFleet is six servers answering 500 on 0.2% of requests, of which
// srv3 also fails 5% of its requests in the fault's way.
func faultFleet(f fleet.Fault) []fleet.BackendConfig {
	servers := paperFleet(0.002, 0.002, 0.05, 0.002, 0.002, 0.002)
	if f != fleet.Fault500 {
		servers[2].Fault = f
	}
	return servers
}

// faultRun is one fault on one telemetry path, issue 42's setup.
type faultRun struct {
	path  string
	fault fleet.Fault
	// close: the client sends each request on its own connection.
	close bool
}

func (r faultRun) name() string {
	n := r.path + "-" + string(r.fault)
	if r.close {
		n += "-close"
	}
	return n
}

// drainsFaulty runs r: srv3 of six fails 5% of its requests in r's way
// behind HAProxy's option http-server-close, retries 3, option
// redispatch and timeout server 2s, 300 req/s for 40 s; srv3 is drained
// within 30 s and no other server is.
//
// Beside the Lua companion or the logs, the stats path's blind-path check
// must find nothing: those stanzas report HAProxy's own 5xx themselves.
func drainsFaulty(t *testing.T, r faultRun) {
	var mu sync.Mutex
	var blind []string
	look := func(env *scenario.Env) {
		mu.Lock()
		defer mu.Unlock()
		for _, k := range env.Daemon.Blindness().Blind {
			blind = append(blind, k.Server)
		}
	}
	out := run(t, scenario.Scenario{Servers: faultFleet(r.fault), Rate: 300, Duration: 40 * time.Second, Policy: "rules",
		Name: r.name(), Telemetry: r.path, Redispatch: true, NoKeepAlive: r.close, AgentArgs: noTailGuard,
		At: map[time.Duration]func(*scenario.Env){10 * time.Second: look, 20 * time.Second: look, 39 * time.Second: look}})
	mu.Lock()
	defer mu.Unlock()
	if len(blind) > 0 {
		t.Errorf("the paths found blind to HAProxy's own 5xx of %v", blind)
	}
	at, ok := out.DrainedAt["srv3"]
	t.Logf("%s: srv3 drained at %v (%v); client: %d 5xx, %d failed", r.name(), at, ok, out.Load.Err5xx, out.Load.Failed)
	if !ok || at > 30*time.Second {
		t.Errorf("srv3 drained at %v (%v), want within 30 s", at, ok)
	}
	for s := range out.DrainedAt {
		if s != "srv3" {
			t.Errorf("healthy %s drained", s)
		}
	}
}

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

// The Lua companion's stanza as it was (http-response), in front of a
// server that hangs on 5% of its requests: the agent finds the path
// blind to HAProxy's own 504s, says so on /status and in its log, and
// judges the server from HAProxy's counters meanwhile, so that it is
// drained. Before, /status said nothing and the server was never drained.
func TestBlindLuaStanzaIsNoticed(t *testing.T) {
	var mu sync.Mutex
	var warned string
	var unseen string
	hooks := map[time.Duration]func(*scenario.Env){}
	for at := 5 * time.Second; at <= 35*time.Second; at += 5 * time.Second {
		hooks[at] = func(env *scenario.Env) {
			st := getJSON(t, "http://"+env.Daemon.StatusAddr()+"/status")
			ws, _ := json.Marshal(st["warnings"])
			mu.Lock()
			defer mu.Unlock()
			if u, _ := st["unseen"].(string); u != "" {
				unseen = u
			}
			if warned == "" && strings.Contains(string(ws), "telemetry blind") {
				warned = string(ws)
			}
		}
	}
	out := run(t, scenario.Scenario{Servers: faultFleet(fleet.FaultHang), Rate: 300, Duration: 40 * time.Second, Policy: "rules",
		Name: "lua-old-stanza", Telemetry: "lua", Redispatch: true, AgentArgs: noTailGuard, StatusListen: "127.0.0.1:0", At: hooks,
		EditHAProxy: func(cfg string) string {
			old := strings.ReplaceAll(cfg, "http-after-response set-var", "http-response set-var")
			if old == cfg {
				t.Fatal("no http-after-response rule in the Lua stanza")
			}
			return old
		}})
	mu.Lock()
	defer mu.Unlock()
	t.Logf("/status unseen: %s", unseen)
	if !strings.Contains(warned, "app/srv3") || !strings.Contains(warned, "http-after-response") {
		t.Errorf("no blind-path warning naming app/srv3 and the fix on /status: %q", warned)
	}
	if !strings.Contains(unseen, "retried") || strings.Contains(unseen, "HAProxy's own") {
		t.Errorf("/status unseen %q: want the retries and aborts, not HAProxy's own 5xx, which the Lua stanza should see", unseen)
	}
	if at, ok := out.DrainedAt["srv3"]; !ok || at > 35*time.Second {
		t.Errorf("srv3 drained at %v (%v), want within 35 s", at, ok)
	}
	for s := range out.DrainedAt {
		if s != "srv3" {
			t.Errorf("healthy %s drained", s)
		}
	}
}

// `hapilot-bench demo --fault hang`, as a reader runs it: the table's
// rules row finds both faulty servers, and no healthy one is drained.
func TestDemoFault(t *testing.T) {
	labtest.RequireHAProxy(t)
	cmd := exec.Command(benchBinary, "demo", "--fault", "hang", "--duration", "25s")
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
