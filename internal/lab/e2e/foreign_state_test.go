//go:build e2e

package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/hapilot/hapilot/agent"
	"github.com/hapilot/hapilot/agent/loop"
	"github.com/hapilot/hapilot/haproxy"
	"github.com/hapilot/hapilot/internal/lab/fleet"
	"github.com/hapilot/hapilot/internal/lab/haproxyproc"
	"github.com/hapilot/hapilot/internal/lab/labtest"
	"github.com/rs/zerolog"
)

// Two HAProxies with the same backend and server names, one state file
// (what the per-user `--state-file auto` gives two `hapilot run`s). The
// first agent drains the faulty srv3 on the first HAProxy and stops; the
// second, on the second HAProxy, whose srv3 is healthy, reads the file:
// it drains nothing there, lists srv3 as not taken up ("made on another
// HAProxy"), and keeps the first agent's record in the file. Before, the
// second agent drained its srv3 at its first step, "lost to a reload".
func TestStateFileOfAnotherHAProxyNotReapplied(t *testing.T) {
	t.Parallel()
	labtest.RequireHAProxy(t)
	root := t.TempDir()
	state := filepath.Join(root, "state.json")
	backends, err := fleet.StartBackends(paperFleet(0, 0, 0.05, 0, 0, 0))
	if err != nil {
		t.Fatal(err)
	}
	defer fleet.CloseAll(backends)
	addr := fleet.Addrs(backends)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()

	// site starts an HAProxy in its own folder: backend app, srv1..srv6 on
	// the same backends, so the same names.
	type site struct {
		h    handConfig
		port int
		rt   *haproxy.Client
	}
	start := func(name string) site {
		dir := filepath.Join(root, name)
		if err := os.Mkdir(dir, 0o700); err != nil {
			t.Fatal(err)
		}
		ports, err := haproxyproc.FreePorts(1)
		if err != nil {
			t.Fatal(err)
		}
		h := newHandConfig(t, dir)
		var b strings.Builder
		b.WriteString(h.head(ports[0], ""))
		b.WriteString("    default_backend app\n\nbackend app\n")
		for i, a := range addr {
			fmt.Fprintf(&b, "    server %s %s\n", fleet.ServerName(i), a)
		}
		b.WriteString("\n" + h.agents)
		hp, err := haproxyproc.Start(ctx, dir, b.String(), h.socket)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(hp.Stop)
		rt, err := haproxy.New(h.socket)
		if err != nil {
			t.Fatal(err)
		}
		return site{h: h, port: ports[0], rt: rt}
	}
	srv3 := agent.Key{Backend: "app", Server: "srv3"}
	srv3State := func(s site) haproxy.ServerState {
		states, err := s.rt.ShowServersState(ctx)
		if err != nil {
			t.Fatal(err)
		}
		for _, st := range states {
			if st.Backend == "app" && st.Server == "srv3" {
				return st
			}
		}
		t.Fatal("no app/srv3")
		return haproxy.ServerState{}
	}

	// The first agent, under load, drains srv3 on the first HAProxy.
	a := start("a")
	actx, stopA := context.WithCancel(ctx)
	first := startAgent(t, actx, zerolog.Nop(), a.h.agentArgs("--policy", "rules", "--readmit", "off", "--state-file", state))
	loadCtx, stopLoad := context.WithCancel(ctx)
	go fleet.Load{Addr: fmt.Sprintf("127.0.0.1:%d", a.port), Rate: 300, Duration: 60 * time.Second}.Run(loadCtx)
	for deadline := time.Now().Add(45 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		if _, ok := first.Loop.View().Status().Changes[srv3]; ok {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the first agent did not drain srv3 within 45 s")
		}
	}
	stopLoad()
	stopA()
	if !srv3State(a).Drain() {
		t.Fatal("srv3 is not drained on the first HAProxy")
	}

	// The second agent, on the second HAProxy, with the same file.
	b := start("b")
	second := startAgent(t, ctx, zerolog.Nop(), b.h.agentArgs("--policy", "rules", "--readmit", "off", "--state-file", state))
	var st loop.Status
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		if st = second.Loop.View().Status(); st.Cycle >= 3 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the second agent ran %d steps in 30 s", st.Cycle)
		}
	}
	if s := srv3State(b); s.Drain() || s.Maint() {
		t.Fatalf("the second agent drained its healthy srv3: %s", s.Label())
	}
	if len(st.Changes) != 0 {
		t.Fatalf("the second agent holds %v", st.Changes)
	}
	if st.StateFile == nil || len(st.StateFile.NotReapplied) != 1 || st.StateFile.NotReapplied[0].Server != srv3 ||
		!strings.Contains(st.StateFile.NotReapplied[0].Why, "made on another HAProxy (unix:"+a.h.socket) {
		b, _ := json.Marshal(st.StateFile)
		t.Fatalf("not re-applied: %s", b)
	}
	var file struct{ Changes map[string]agent.Change }
	if raw, err := os.ReadFile(state); err != nil || json.Unmarshal(raw, &file) != nil {
		t.Fatalf("state file: %v", err)
	}
	if c, ok := file.Changes["app/srv3"]; !ok || !strings.Contains(string(c.Site), a.h.socket) {
		t.Fatalf("the first agent's change is gone from the file: %+v", file.Changes)
	}
	t.Logf("not re-applied: %s", st.StateFile.NotReapplied[0].Why)
}
