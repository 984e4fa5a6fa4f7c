//go:build e2e && deb

package e2e

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/hapilot/hapilot/examples"
	"github.com/hapilot/hapilot/haproxy"
	"github.com/hapilot/hapilot/internal/lab/fleet"
	"github.com/hapilot/hapilot/internal/lab/haproxyproc"
	"github.com/hapilot/hapilot/internal/lab/labtest"
	"github.com/hapilot/hapilot/internal/lab/scenario"
)

// TestDebianPackage installs the package `make deb` built (HAPILOT_DEB)
// on this machine, checks what it installed, and runs the installed agent
// with the installed settings, as the unit runs it (user hapilot, group
// haproxy), against a real HAProxy whose admin socket is `mode 660 group
// haproxy`, as Debian's is: the agent steers it. Run as another user, the
// agent stops with the fix in its message. It needs root (dpkg -i) and
// purges the package when done.
func TestDebianPackage(t *testing.T) {
	deb := os.Getenv("HAPILOT_DEB")
	if deb == "" {
		t.Skip("HAPILOT_DEB names the package: make test-deb")
	}
	if os.Geteuid() != 0 {
		t.Fatal("dpkg -i needs root")
	}
	labtest.RequireHAProxy(t)
	must(t, "dpkg", "-i", deb)
	t.Cleanup(func() { _ = exec.Command("dpkg", "--purge", "hapilot").Run() })

	if out := must(t, "/usr/bin/hapilot", "check", "--config", "/etc/hapilot/hapilot.conf"); !strings.HasPrefix(out, "ok:") {
		t.Errorf("check: %s", out)
	}
	if out := must(t, "dpkg-query", "-W", "-f=${Conffiles}", "hapilot"); !strings.Contains(out, "/etc/hapilot/hapilot.conf") || !strings.Contains(out, "/etc/logrotate.d/hapilot") {
		t.Errorf("conffiles: %q", out)
	}
	if _, err := exec.LookPath("logrotate"); err == nil {
		// -d reads the file and says what it would do, rotating nothing.
		if out, err := exec.Command("logrotate", "-d", "/etc/logrotate.d/hapilot").CombinedOutput(); err != nil || strings.Contains(string(out), "error") {
			t.Errorf("logrotate -d: %v\n%s", err, out)
		}
	} else {
		t.Log("no logrotate here: /etc/logrotate.d/hapilot is not checked")
	}
	for _, f := range []string{"/lib/systemd/system/hapilot.service", "/etc/logrotate.d/hapilot", "/usr/share/doc/hapilot/examples/haproxy.cfg",
		"/usr/share/doc/hapilot/examples/hapilot-spoe.conf", "/usr/share/doc/hapilot/examples/hapilot.lua"} {
		if _, err := os.Stat(f); err != nil {
			t.Errorf("installed: %v", err)
		}
	}
	if out := must(t, "id", "-nG", "hapilot"); !strings.Contains(" "+out+" ", " haproxy ") {
		t.Errorf("user hapilot is in %q, not in group haproxy", out)
	}
	if _, err := exec.LookPath("systemd-analyze"); err == nil {
		// verify names the unit's problems and exits non-zero on any.
		if out, err := exec.Command("systemd-analyze", "verify", "/lib/systemd/system/hapilot.service").CombinedOutput(); err != nil || len(strings.TrimSpace(string(out))) > 0 {
			t.Errorf("systemd-analyze verify: %v\n%s", err, out)
		}
	} else {
		t.Log("no systemd-analyze here: the unit is not verified")
	}

	// The directories systemd makes for the unit, under a folder both
	// HAProxy and the agent's user may enter.
	dir := t.TempDir()
	for d := dir; d != "/" && d != os.TempDir(); d = filepath.Dir(d) {
		must(t, "chmod", "0755", d)
	}
	hapilot, haproxyGroup := lookup(t)
	for _, sub := range []string{"run", "state", "log"} {
		p := filepath.Join(dir, sub)
		if err := os.Mkdir(p, 0o750); err != nil {
			t.Fatal(err)
		}
		if err := os.Chown(p, hapilot, haproxyGroup); err != nil {
			t.Fatal(err)
		}
	}
	backends, err := fleet.StartBackends(paperFleet(0, 0, 0.05, 0, 0, 0))
	if err != nil {
		t.Fatal(err)
	}
	defer fleet.CloseAll(backends)
	ports, err := haproxyproc.FreePorts(2)
	if err != nil {
		t.Fatal(err)
	}
	// HAProxy as Debian's own package sets it up beside ours: its stock
	// haproxy.cfg's global section (chroot /var/lib/haproxy, user and group
	// haproxy), the admin socket in a folder like Debian's /run/haproxy
	// (tmpfiles.d: 2775 haproxy:haproxy, so the socket HAProxy makes as root
	// is group haproxy), and the README's stanza word for word: HAProxy
	// reaches the agent at abns@hapilot-spoe from inside its chroot, and
	// the agent listens there with the package's settings.
	stock, err := os.ReadFile("/etc/haproxy/haproxy.cfg")
	if err != nil {
		t.Fatalf("Debian's haproxy package's config: %v", err)
	}
	hpDir := filepath.Join(dir, "haproxy")
	if err := os.Mkdir(hpDir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(hpDir, 0, haproxyGroup); err != nil {
		t.Fatal(err)
	}
	must(t, "chmod", "2775", hpDir)
	opts := fleet.HAProxyOptions{Dir: hpDir, FrontendPort: ports[0], Servers: fleet.Addrs(backends), AgentAddr: examples.AgentAddr, StockGlobal: string(stock)}
	cfg, err := fleet.HAProxyConfig(opts)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	hp, err := haproxyproc.Start(ctx, dir, cfg, opts.Socket())
	if err != nil {
		t.Fatal(err)
	}
	defer hp.Stop()

	agentArgs := func(as string) []string {
		return []string{"--reuid=" + as, "--regid=haproxy", "--init-groups", "/usr/bin/hapilot", "run",
			"--config", "/etc/hapilot/hapilot.conf", "--haproxy-socket", opts.Socket(),
			"--status-listen", fmt.Sprintf("127.0.0.1:%d", ports[1]), "--interval", "1s",
			"--state-file", filepath.Join(dir, "state", "state.json"), "--audit-log", filepath.Join(dir, "log", "audit.jsonl"),
			// The package ships observe; this is the step docs/howto/install.md
			// shows after a week of watching.
			"--mode", "enforce", "--control-socket", "unix:" + filepath.Join(dir, "run", "ctl.sock")}
	}

	// As a user outside group haproxy: stopped, with the fix.
	out, err := exec.CommandContext(ctx, "setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups", "/usr/bin/hapilot", "run",
		"--config", "/etc/hapilot/hapilot.conf", "--haproxy-socket", opts.Socket(), "--spoe-listen", "off", "--status-listen", "off",
		"--state-file=", "--audit-log=", "--control-socket", "off").CombinedOutput()
	if err == nil || !strings.Contains(string(out), "permission denied on HAProxy's socket") || !strings.Contains(string(out), "run hapilot in group haproxy") {
		t.Errorf("as nobody: %v\n%s", err, out)
	}

	// As the unit runs it: it steers HAProxy.
	agent := exec.Command("setpriv", agentArgs("hapilot")...)
	var log strings.Builder
	agent.Stdout, agent.Stderr = &log, &log
	if err := agent.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		_ = agent.Process.Signal(os.Interrupt)
		_ = agent.Wait()
		if t.Failed() {
			t.Logf("agent log:\n%s", log.String())
		}
	}()
	rt, err := haproxy.New(opts.Socket())
	if err != nil {
		t.Fatal(err)
	}
	if err := scenario.WaitAgentUp(ctx, rt); err != nil {
		t.Fatalf("%v\nhaproxy: %s", err, hp.Log())
	}
	fleet.Load{Addr: fmt.Sprintf("127.0.0.1:%d", ports[0]), Rate: 300, Duration: 20 * time.Second}.Run(ctx)
	states, err := rt.ShowServersState(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range states {
		if s.Backend == fleet.BackendName && s.Drain() != (s.Server == "srv3") {
			t.Errorf("%s drained %v; only srv3 fails", s.Server, s.Drain())
		}
	}
	// The agent saw the traffic through SPOE, and no server was silent.
	st := getJSON(t, fmt.Sprintf("http://127.0.0.1:%d/status", ports[1]))
	if ingest, _ := st["ingest"].(map[string]any); ingest == nil || ingest["spoe_frames"] == nil || ingest["spoe_frames"].(float64) == 0 {
		t.Errorf("SPOE carried nothing: /status ingest %v", st["ingest"])
	}
	if m := getText(t, fmt.Sprintf("http://127.0.0.1:%d/metrics", ports[1])); !strings.Contains(m, "hapilot_telemetry_silent_servers 0") {
		t.Errorf("/metrics: silent servers:\n%s", m)
	}
	if fi, err := os.Stat(filepath.Join(dir, "log", "audit.jsonl")); err != nil || fi.Size() == 0 {
		t.Errorf("audit log: %v", err)
	}
}

func must(t *testing.T, name string, args ...string) string {
	t.Helper()
	out, err := exec.Command(name, args...).CombinedOutput()
	if err != nil {
		t.Fatalf("%s %v: %v\n%s", name, args, err, out)
	}
	return strings.TrimSpace(string(out))
}

func lookup(t *testing.T) (uid, gid int) {
	t.Helper()
	u, err := user.Lookup("hapilot")
	if err != nil {
		t.Fatal(err)
	}
	g, err := user.LookupGroup("haproxy")
	if err != nil {
		t.Fatal(err)
	}
	uid, _ = strconv.Atoi(u.Uid)
	gid, _ = strconv.Atoi(g.Gid)
	return uid, gid
}
