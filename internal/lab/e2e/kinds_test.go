//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"net"
	"os/exec"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hapilot/hapilot/haproxy"
	"github.com/hapilot/hapilot/internal/lab/fleet"
	"github.com/hapilot/hapilot/internal/lab/haproxyproc"
	"github.com/hapilot/hapilot/internal/lab/labtest"
	"github.com/rs/zerolog"
)

// agentCheck is a stand-in for the agent HAProxy's agent-check asks: it
// answers every check with the word it holds ("ready", "drain", "50%").
type agentCheck struct {
	ln   net.Listener
	word atomic.Pointer[string]
	wg   sync.WaitGroup
}

func startAgentCheck(t *testing.T, word string) *agentCheck {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	a := &agentCheck{ln: ln}
	a.word.Store(&word)
	a.wg.Add(1)
	go func() {
		defer a.wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			fmt.Fprintf(c, "%s\n", *a.word.Load())
			c.Close()
		}
	}()
	t.Cleanup(func() { ln.Close(); a.wg.Wait() })
	return a
}

func (a *agentCheck) port() int       { return a.ln.Addr().(*net.TCPAddr).Port }
func (a *agentCheck) say(word string) { a.word.Store(&word) }

// The server kinds real configs hold, in one real HAProxy with the
// README's stanza, under the agent at its defaults (docs/reference/server-kinds.md):
//   - app: srv1, srv6, srv7 healthy; srv3 fails 5% (drained); srv2 fails 5%
//     under HAProxy's agent-check, which later answers "drain" (left alone:
//     the agent neither drains it nor reads the check's drain as an
//     operator's); srv4 has weight 0 and srv5 the operator's maint (both
//     untouched); bk1, a backup failing 20%, is neither judged nor floor
//     capacity;
//   - hashed: balance uri, its servers left alone, h1 failing 5% included;
//   - opted: balance uri, named in --hash-backends, so governed;
//   - hapilot-agents: mode tcp, left alone.
//
// `hapilot check --live` prints the same verdicts, with their reasons.
func TestServerKinds(t *testing.T) {
	t.Parallel()
	labtest.RequireHAProxy(t)
	dir := t.TempDir()
	cfgs := paperFleet(0, 0.05, 0.05, 0, 0, 0, 0, 0.20, 0.05, 0, 0, 0, 0)
	backends, err := fleet.StartBackends(cfgs)
	if err != nil {
		t.Fatal(err)
	}
	defer fleet.CloseAll(backends)
	addr := fleet.Addrs(backends)
	ac := startAgentCheck(t, "ready")
	ports, err := haproxyproc.FreePorts(2)
	if err != nil {
		t.Fatal(err)
	}
	h := newHandConfig(t, dir)
	socket := h.socket
	var b strings.Builder
	b.WriteString(h.head(ports[0], ""))
	fmt.Fprintf(&b, `    use_backend hashed if { path_beg /h }
    use_backend opted if { path_beg /o }
    default_backend app

backend app
    server srv1 %s
    server srv2 %s agent-check agent-addr 127.0.0.1 agent-port %d agent-inter 300ms
    server srv3 %s
    server srv4 %s weight 0
    server srv5 %s
    server srv6 %s
    server srv7 %s
    server bk1 %s backup

backend hashed
    balance uri
    server h1 %s
    server h2 %s
    server h3 %s

backend opted
    balance uri
    server o1 %s
    server o2 %s

%s`, addr[0], addr[1], ac.port(), addr[2], addr[3], addr[4], addr[5], addr[6], addr[7], addr[8], addr[9], addr[10], addr[11], addr[12], h.agents)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	hp, err := haproxyproc.Start(ctx, dir, b.String(), socket)
	if err != nil {
		t.Fatal(err)
	}
	defer hp.Stop()
	rt, err := haproxy.New(socket)
	if err != nil {
		t.Fatal(err)
	}
	if err := rt.SetServerState(ctx, "app", "srv5", haproxy.StateMaint); err != nil {
		t.Fatal(err)
	}

	d := startAgent(t, ctx, zerolog.Nop(), h.agentArgs("--status-listen", fmt.Sprintf("127.0.0.1:%d", ports[1]), "--hash-backends", "opted",
		// Re-admission's probes could bring srv3 back by chance within the
		// run; what is tested here is which servers the agent judges.
		"--readmit", "off"))

	// The load: the app backend, the hashed one (one URI: balance uri sends
	// it all to one server) and the opted one.
	var wg sync.WaitGroup
	for path, rate := range map[string]float64{"/": 300, "/h": 60, "/o": 30} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			fleet.Load{Addr: fmt.Sprintf("127.0.0.1:%d", ports[0]), Path: path, Rate: rate, Duration: 40 * time.Second}.Run(ctx)
		}()
	}
	// Half way, the agent-check says drain: HAProxy drains srv2 on its word.
	time.AfterFunc(20*time.Second, func() { ac.say("drain") })

	// check --live against this HAProxy, while the agent runs (it reads
	// the running agent's /status for the telemetry), once srv3 is the
	// agent's drain.
	for deadline := time.Now().Add(30 * time.Second); len(d.Loop.View().Status().Changes) == 0; time.Sleep(100 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the agent drained nothing within 30 s")
		}
	}
	live, lerr := exec.CommandContext(ctx, agentBinary, "check", "--live", "--haproxy-socket", socket, "--spoe-listen", "unix:"+h.spoeAddr,
		"--status-listen", fmt.Sprintf("127.0.0.1:%d", ports[1]), "--hash-backends", "opted").CombinedOutput()
	wg.Wait()

	states, err := rt.ShowServersState(ctx)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]haproxy.ServerState{}
	for _, s := range states {
		got[s.Backend+"/"+s.Server] = s
	}
	st := d.Loop.View().Status()
	t.Logf("changes %v", st.Changes)
	t.Logf("left alone %v", st.LeftAlone)
	t.Logf("check --live (%v):\n%s", lerr, live)
	for name, want := range map[string]string{
		"app/srv3": "drain", "app/srv1": "ready", "app/srv6": "ready", "app/srv7": "ready",
		"app/srv2": "drain", // the agent-check's word, not the agent's
		"app/srv5": "maint", "app/bk1": "ready", "hashed/h1": "ready", "hashed/h2": "ready", "hashed/h3": "ready",
	} {
		if l := got[name].Label(); l != want {
			t.Errorf("%s: %s, want %s", name, l, want)
		}
	}
	if w := got["app/srv4"]; w.Weight != 0 || w.Drain() || w.Maint() {
		t.Errorf("app/srv4 (weight 0): %+v", w)
	}
	for k := range st.Changes {
		if k.String() != "app/srv3" {
			t.Errorf("the agent changed %s; only app/srv3 is its to drain", k)
		}
	}
	for name, want := range map[string]string{
		"app/srv2": "agent-check", "app/bk1": "backup", "hashed/h1": "balance uri", "hashed/h2": "--hash-backends",
		"hapilot-agents/agent1": "not mode http",
	} {
		found := false
		for k, why := range st.LeftAlone {
			if k.String() == name {
				found = strings.Contains(why, want)
			}
		}
		if !found {
			t.Errorf("%s not left alone for %q: %v", name, want, st.LeftAlone)
		}
	}
	for k := range st.LeftAlone {
		if k.Backend == "opted" || k.String() == "app/srv3" {
			t.Errorf("%s left alone: %v", k, st.LeftAlone)
		}
	}
	if lerr != nil {
		t.Errorf("check --live failed: %v", lerr)
	}
	for _, want := range []string{"level admin", "backend app: governs 4 [srv1 srv3 (changed by the running agent) srv6 srv7]", "srv2 (HAProxy's agent-check", "bk1 (backup server",
		"srv4 (configured weight 0", "srv5 (in maintenance", "backend hashed: governs 0", "backend opted: governs 2", "not mode http", "ok: the agent can act"} {
		if !strings.Contains(string(live), want) {
			t.Errorf("check --live lacks %q", want)
		}
	}
}
