//go:build e2e

package e2e

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hapilot/hapilot/haproxy"
	"github.com/hapilot/hapilot/internal/lab/fleet"
	"github.com/hapilot/hapilot/internal/lab/labtest"
	"github.com/hapilot/hapilot/internal/lab/logbuf"
	"github.com/hapilot/hapilot/internal/lab/scenario"
	"github.com/rs/zerolog"
)

// stockGlobal is Debian's own haproxy.cfg: the installed package's when
// there is one, else the copy in testdata (Debian 12's haproxy
// 2.6.12-1+deb12u4, as it installs it). Its global section chroots to
// /var/lib/haproxy and drops to user and group haproxy, which need root
// to do; the test skips where it cannot run them.
func stockGlobal(t *testing.T) string {
	t.Helper()
	labtest.RequireHAProxy(t)
	if os.Geteuid() != 0 {
		t.Skip("HAProxy's stock global section chroots and changes user: that needs root")
	}
	if _, err := user.Lookup("haproxy"); err != nil {
		t.Skip("no user haproxy (Debian's haproxy package makes it)")
	}
	cfg, err := os.ReadFile("/etc/haproxy/haproxy.cfg")
	if err != nil {
		if cfg, err = os.ReadFile("testdata/debian-haproxy.cfg"); err != nil {
			t.Fatal(err)
		}
	}
	g := strings.Join(fleet.GlobalLines(string(cfg)), "\n")
	for _, want := range []string{"chroot /var/lib/haproxy", "user haproxy", "group haproxy"} {
		if !strings.Contains(g, want) {
			t.Fatalf("the stock global section lacks %q:\n%s", want, g)
		}
	}
	if err := os.MkdirAll("/var/lib/haproxy", 0o755); err != nil {
		t.Fatal(err)
	}
	return string(cfg)
}

// defaultName serialises the tests that listen at the README's own
// abns@hapilot-spoe: an abstract name is one per machine (per network
// namespace), so they take turns.
var defaultName sync.Mutex

// runLogged is run with the agent's log kept, for the tests that read
// what it said.
func runLogged(t *testing.T, s scenario.Scenario) (*scenario.Outcome, *logbuf.Buffer) {
	t.Helper()
	s.Dir = t.TempDir()
	if s.Interval == 0 {
		s.Interval = time.Second
	}
	log := &logbuf.Buffer{}
	s.Log = zerolog.New(log).With().Timestamp().Logger()
	ctx, cancel := context.WithTimeout(context.Background(), s.Duration+2*time.Minute)
	defer cancel()
	out, err := s.Run(ctx)
	if err != nil {
		t.Fatalf("scenario: %v\nagent log:\n%s", err, tail(log.String(), 4000))
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("haproxy output:\n%s", out.HAProxy.Log())
			t.Logf("agent log:\n%s", tail(log.String(), 6000))
		}
	})
	t.Logf("%d requests, %d 5xx, drained at %v, flips %v", out.Load.Scheduled, out.Load.Err5xx, out.DrainedAt, out.Flips)
	return out, log
}

// paperFaultDrained checks that srv3 and srv6, and no other server, were
// drained, each once.
func paperFaultDrained(t *testing.T, out *scenario.Outcome, within time.Duration) {
	t.Helper()
	for _, s := range []string{"srv3", "srv6"} {
		at, ok := out.DrainedAt[s]
		if !ok || at > within {
			t.Errorf("%s drained at %v (drained: %v), want within %v", s, at, ok, within)
		}
	}
	for s := range out.DrainedAt {
		if s != "srv3" && s != "srv6" {
			t.Errorf("healthy %s drained", s)
		}
	}
}

// Debian's stock global section (chroot /var/lib/haproxy, user and group
// haproxy) with each example's stanza word for word: the README's SPOE
// (server agent1 abns@hapilot-spoe, the agent at its defaults), the Lua
// companion, the log lines and the ring, each at the abstract name its
// example gives. HAProxy reaches the agent from inside its chroot, as its
// own user; the path carries the responses, nothing is silent, and the
// paper fault is drained and no healthy server.
func TestStockDebianConfig(t *testing.T) {
	t.Parallel()
	global := stockGlobal(t)
	for _, tc := range []struct{ telemetry, path string }{
		{"stock", "spoe"}, {"stock-lua", "lua"}, {"stock-syslog", "syslog"}, {"stock-ring", "syslog"},
	} {
		t.Run(tc.telemetry, func(t *testing.T) {
			t.Parallel()
			if tc.telemetry == "stock" {
				defaultName.Lock()
				defer defaultName.Unlock()
			}
			var delivered uint64
			var silent int
			var mu sync.Mutex
			out, _ := runLogged(t, scenario.Scenario{
				Servers: paperFleet(0, 0, 0.05, 0, 0, 0.05), Rate: 300, Duration: 30 * time.Second, Policy: "rules",
				Telemetry: tc.telemetry, StockGlobal: global,
				At: map[time.Duration]func(*scenario.Env){29 * time.Second: func(env *scenario.Env) {
					mu.Lock()
					defer mu.Unlock()
					switch tc.path {
					case "spoe":
						delivered = env.Daemon.SPOE.Counters.Events.Load()
					case "lua":
						delivered = env.Daemon.Lua.Counters.Events.Load()
					case "syslog":
						delivered = env.Daemon.Syslog.Counters.Events.Load()
					}
					silent = len(env.Daemon.Silence().Silent)
				}},
			})
			mu.Lock()
			defer mu.Unlock()
			if want := uint64(out.Load.Scheduled) / 2; delivered < want {
				t.Errorf("%s delivered %d responses of %d: HAProxy did not reach the agent from its chroot", tc.path, delivered, out.Load.Scheduled)
			}
			if silent != 0 {
				t.Errorf("%d servers silent with the stanza in place", silent)
			}
			paperFaultDrained(t, out, coldDrain)
		})
	}
}

// The README's old stanza (a unix@ path outside the chroot) under Debian's
// stock global section: HAProxy never reaches the agent. Within 10 s of the
// traffic the agent says so at error level, naming SPOE and the chroot,
// shows it on /status and /metrics, and still drains the paper fault from
// HAProxy's counters, and no healthy server.
func TestSilentSPOEIsNoticed(t *testing.T) {
	t.Parallel()
	global := stockGlobal(t)
	type seen struct {
		logged, status, metric bool
		at                     time.Duration
	}
	var mu sync.Mutex
	var first seen
	logs := &logbuf.Buffer{}
	check := func(at time.Duration) func(*scenario.Env) {
		return func(env *scenario.Env) {
			mu.Lock()
			defer mu.Unlock()
			if first.logged && first.status && first.metric {
				return
			}
			st := getJSON(t, "http://"+env.Daemon.StatusAddr()+"/status")
			ws, _ := json.Marshal(st["warnings"])
			metrics := getText(t, "http://"+env.Daemon.StatusAddr()+"/metrics")
			first = seen{
				logged: strings.Contains(logs.String(), `"level":"error"`),
				status: strings.Contains(string(ws), "telemetry silent") && strings.Contains(string(ws), "chroot"),
				metric: strings.Contains(metrics, "hapilot_telemetry_silent_servers 6"),
				at:     at,
			}
		}
	}
	hooks := map[time.Duration]func(*scenario.Env){}
	for at := 2 * time.Second; at <= 10*time.Second; at += 2 * time.Second {
		hooks[at] = check(at)
	}
	s := scenario.Scenario{
		Servers: paperFleet(0, 0, 0.05, 0, 0, 0.05), Rate: 300, Duration: 45 * time.Second, Policy: "rules",
		Telemetry: "spoe-unix", StockGlobal: global, AgentUnreachable: true, StatusListen: "127.0.0.1:0",
		At: hooks, Dir: t.TempDir(), Interval: time.Second,
	}
	s.Log = zerolog.New(logs).With().Timestamp().Logger()
	ctx, cancel := context.WithTimeout(context.Background(), s.Duration+2*time.Minute)
	defer cancel()
	out, err := s.Run(ctx)
	if err != nil {
		t.Fatalf("scenario: %v", err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("haproxy output:\n%s", tail(out.HAProxy.Log(), 3000))
			t.Logf("agent log:\n%s", tail(logs.String(), 6000))
		}
	})
	t.Logf("%d requests, %d 5xx, drained at %v; silence seen by %v: %+v", out.Load.Scheduled, out.Load.Err5xx, out.DrainedAt, first.at, first)
	mu.Lock()
	defer mu.Unlock()
	if !first.logged || !first.status || !first.metric {
		t.Errorf("within 10 s of the traffic: logged %v, on /status %v, metric %v", first.logged, first.status, first.metric)
	}
	var line string
	for _, l := range strings.Split(logs.String(), "\n") {
		if strings.Contains(l, `"level":"error"`) && strings.Contains(l, "telemetry silent") {
			line = l
			break
		}
	}
	for _, want := range []string{"SPOE at unix:", "chroot", "abns@hapilot-spoe", "app/srv1"} {
		if !strings.Contains(line, want) {
			t.Errorf("the error line lacks %q: %s", want, line)
		}
	}
	paperFaultDrained(t, out, 8*time.Second+coldDrain)
}

func getText(t *testing.T, url string) string {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Errorf("GET %s: %v", url, err)
		return ""
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return string(b)
}

func getJSON(t *testing.T, url string) map[string]any {
	t.Helper()
	var m map[string]any
	if err := json.Unmarshal([]byte(getText(t, url)), &m); err != nil {
		t.Errorf("GET %s: %v", url, err)
	}
	return m
}

// `hapilot check --live` against Debian's stock global section, with no
// agent running: with the README's stanza and the default listener it
// sees the traffic and passes; with the old stanza's unix@ path (out of
// the chrooted HAProxy's reach) it names the silence and the chroot and
// fails; on a socket at level operator it fails naming the level.
func TestCheckLive(t *testing.T) {
	t.Parallel()
	global := stockGlobal(t)
	for _, tc := range []struct {
		name      string
		telemetry string
		args      func(dir string) []string
		ok        bool
		want      []string
	}{
		{"stock", "stock", func(string) []string { return nil }, true,
			[]string{"level admin", "backend app: governs 6", "hapilot-agents: governs 0", "0 silent", "ok: the agent can act"}},
		{"unix path in a chroot", "spoe-unix", func(dir string) []string { return []string{"--spoe-listen", "unix:" + filepath.Join(dir, "spoe.sock")} }, false,
			[]string{"PROBLEM: telemetry silent", "app/srv1", "chroot", "abns@hapilot-spoe", "not ok"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.telemetry == "stock" {
				defaultName.Lock()
				defer defaultName.Unlock()
			}
			var out []byte
			var err error
			dir := t.TempDir()
			s := scenario.Scenario{
				Servers: paperFleet(0, 0, 0.05, 0, 0, 0.05), Rate: 300, Duration: 15 * time.Second,
				Telemetry: tc.telemetry, StockGlobal: global, Dir: dir, Log: zerolog.Nop(),
				At: map[time.Duration]func(*scenario.Env){time.Second: func(env *scenario.Env) {
					args := append([]string{"check", "--live", "--haproxy-socket", env.HAProxy.Socket, "--status-listen", "off"}, tc.args(dir)...)
					out, err = exec.Command(agentBinary, args...).CombinedOutput()
				}},
			}
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			if _, rerr := s.Run(ctx); rerr != nil {
				t.Fatal(rerr)
			}
			t.Logf("check --live: %v\n%s", err, out)
			if (err == nil) != tc.ok {
				t.Errorf("exit: %v, want ok %v", err, tc.ok)
			}
			for _, w := range tc.want {
				if !strings.Contains(string(out), w) {
					t.Errorf("output lacks %q", w)
				}
			}
		})
	}
}

// HAProxy as Debian's unit runs it: master-worker (haproxy -Ws) with the
// stock global section and the README's stanza. The admin socket reaches
// the worker, and `systemctl reload haproxy` (SIGUSR2 to the master, a new
// worker) is a reload to the agent: the drains it lost are applied again
// within 5 s, and no healthy server is drained.
func TestMasterWorkerReload(t *testing.T) {
	t.Parallel()
	global := stockGlobal(t)
	defaultName.Lock()
	defer defaultName.Unlock()
	reloadAt := coldDrain // once both drains are in
	var events reloads
	out, log := runLogged(t, scenario.Scenario{
		Servers: paperFleet(0, 0, 0.05, 0, 0, 0.05), Rate: 300, Duration: reloadAt + 12*time.Second, Policy: "rules",
		Telemetry: "stock", StockGlobal: global, MasterWorker: true, AgentArgs: noTailGuard,
		At: map[time.Duration]func(*scenario.Env){
			reloadAt: events.do("reload", func(env *scenario.Env) error { return env.HAProxy.Reload(context.Background()) }),
		},
	})
	reloaded := events.all(t, 1)
	if !strings.Contains(out.HAProxy.Log(), "Reloading HAProxy") {
		t.Errorf("the master did not reload:\n%s", out.HAProxy.Log())
	}
	drainsComeBack(t, out, reloadAt, reloaded, 5*time.Second, false, "srv3", "srv6")
	if len(out.DrainedAt) != 2 {
		t.Errorf("drained %v", out.DrainedAt)
	}
	if !strings.Contains(log.String(), "HAProxy reloaded or restarted") {
		t.Errorf("the agent did not see a reload")
	}
}

// A path that goes silent later: SPOE carries the traffic, then the
// agents' backend goes down (its server in maint: the nbsrv guard skips
// SPOE, as when HAProxy reloads without the stanza). The agent says so
// at error level with that cause, and a fault that starts afterwards is
// still drained, from HAProxy's counters, and no healthy server.
func TestSPOEGoesSilentLater(t *testing.T) {
	t.Parallel()
	labtest.RequireHAProxy(t)
	silentAt, faultAt := 8*time.Second, 14*time.Second
	out, log := runLogged(t, scenario.Scenario{
		Servers: paperFleet(0, 0, 0, 0, 0, 0), Rate: 300, Duration: faultAt + coldDrain + 5*time.Second, Policy: "rules",
		At: map[time.Duration]func(*scenario.Env){
			silentAt: func(env *scenario.Env) {
				rt, err := haproxy.New(env.HAProxy.Socket)
				if err == nil {
					err = rt.SetServerState(context.Background(), "hapilot-agents", "agent1", haproxy.StateMaint)
				}
				if err != nil {
					t.Errorf("agents' server to maint: %v", err)
				}
			},
			faultAt: func(env *scenario.Env) { env.Backends[2].SetErrorRate(0.05) },
		},
	})
	var line string
	for _, l := range strings.Split(log.String(), "\n") {
		if strings.Contains(l, `"level":"error"`) && strings.Contains(l, "telemetry silent") {
			line = l
			break
		}
	}
	if !strings.Contains(line, "SPOE delivered messages before and none now") {
		t.Errorf("no error line with the cause: %q", line)
	}
	at, ok := out.DrainedAt["srv3"]
	if !ok || at < faultAt || at > faultAt+coldDrain {
		t.Errorf("srv3 drained at %v (%v), want within %v of the fault at %v", at, ok, coldDrain, faultAt)
	}
	for s := range out.DrainedAt {
		if s != "srv3" {
			t.Errorf("healthy %s drained", s)
		}
	}
}
