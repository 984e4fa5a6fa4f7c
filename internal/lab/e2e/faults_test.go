//go:build e2e

package e2e

import (
	"encoding/json"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hapilot/hapilot/internal/lab/fleet"
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

// The Lua companion's stanza as it was (http-response), in front of a
// server that hangs on 5% of its requests: the agent finds the path
// blind to HAProxy's own 504s, says so on /status and in its log, and
// judges the server from HAProxy's counters meanwhile, so that it is
// drained. Before, /status said nothing and the server was never drained.
func TestBlindLuaStanzaIsNoticed(t *testing.T) {
	t.Parallel()
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
