//go:build e2e && deb

package e2e

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
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
// agent stops with the fix in its message. Then the package is removed
// under the agent, started by hand and holding two drains: a removal
// whose undo fails (HAProxy's socket shut to the agent) stops with each
// server named and the package, the binary and the agent left in place;
// the next brings both servers back and leaves no agent running. It
// needs root (dpkg -i) and purges the package when done.
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
	for _, sub := range []string{"run", "state", "log", "home"} {
		p := filepath.Join(dir, sub)
		if err := os.Mkdir(p, 0o750); err != nil {
			t.Fatal(err)
		}
		if err := os.Chown(p, hapilot, haproxyGroup); err != nil {
			t.Fatal(err)
		}
	}
	// srv3 and srv5 fail: two drains for the removal to undo.
	backends, err := fleet.StartBackends(paperFleet(0, 0, 0.05, 0, 0.05, 0))
	if err != nil {
		t.Fatal(err)
	}
	defer fleet.CloseAll(backends)
	ports, err := haproxyproc.FreePorts(3)
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
			// The default state file, as the README's hand-started agent has
			// it: under its $HOME, which the removal reads from /proc.
			"--state-file", "auto", "--audit-log", filepath.Join(dir, "log", "audit.jsonl"),
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

	// As the unit runs it, started by hand: it steers HAProxy.
	agent := exec.Command("setpriv", agentArgs("hapilot")...)
	agent.Env = append(withoutEnv(os.Environ(), "HOME", "XDG_STATE_HOME", "STATE_DIRECTORY"), "HOME="+filepath.Join(dir, "home"))
	var log lockedBuilder
	agent.Stdout, agent.Stderr = &log, &log
	if err := agent.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() { // owned here: it ends when the agent does, which the defer waits for
		_ = agent.Wait()
		close(exited)
	}()
	defer func() {
		_ = agent.Process.Signal(os.Interrupt)
		<-exited
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
	// Load until both failing servers are drained (or a minute passes).
	faulty := map[string]bool{"srv3": true, "srv5": true}
	drained := func() (map[string]bool, error) {
		states, err := rt.ShowServersState(ctx)
		out := map[string]bool{}
		for _, s := range states {
			if s.Backend == fleet.BackendName {
				out[s.Server] = s.Drain()
			}
		}
		return out, err
	}
	loadUntilDrained := func() {
		lctx, stopLoad := context.WithTimeout(ctx, time.Minute)
		defer stopLoad()
		loaded := make(chan struct{})
		go func() { // owned here: stopLoad ends it, and loaded says so
			defer close(loaded)
			fleet.Load{Addr: fmt.Sprintf("127.0.0.1:%d", ports[0]), Rate: 300, Duration: time.Minute}.Run(lctx)
		}()
		defer func() { stopLoad(); <-loaded }()
		for lctx.Err() == nil {
			if d, err := drained(); err == nil && d["srv3"] && d["srv5"] {
				return
			}
			select {
			case <-lctx.Done():
			case <-time.After(200 * time.Millisecond): // polling HAProxy: it sends no event
			}
		}
	}
	loadUntilDrained()
	d, err := drained()
	if err != nil {
		t.Fatal(err)
	}
	for srv, on := range d {
		if on != faulty[srv] {
			t.Errorf("%s drained %v; only srv3 and srv5 fail", srv, on)
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
	if t.Failed() {
		return
	}

	// Removal while the agent holds srv3 and srv5, and cannot reach
	// HAProxy to bring them back: dpkg -r fails, naming both and the
	// command that undoes them; the package, its binary and the agent stay.
	sockInfo, err := os.Stat(opts.Socket())
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(opts.Socket(), 0o600); err != nil {
		t.Fatal(err)
	}
	out, err = exec.Command("dpkg", "-r", "hapilot").CombinedOutput()
	if err := os.Chmod(opts.Socket(), sockInfo.Mode().Perm()); err != nil {
		t.Fatal(err)
	}
	said := string(out)
	for _, want := range []string{"2 server(s) remain as the agent left them", fleet.BackendName + "/srv3  drained since", fleet.BackendName + "/srv5  drained since",
		"hapilot ctl --socket unix:" + filepath.Join(dir, "run", "ctl.sock") + " restore", "removal stopped"} {
		if !strings.Contains(said, want) {
			t.Errorf("dpkg -r with the undo failing: no %q in:\n%s", want, said)
		}
	}
	if err == nil {
		t.Errorf("dpkg -r went on although the undo failed:\n%s", said)
	}
	t.Logf("dpkg -r, the undo failing:\n%s", said)
	// (dpkg keeps the wish, deinstall, and the status, installed.)
	if st := must(t, "dpkg-query", "-W", "-f=${Status}", "hapilot"); !strings.HasSuffix(st, " ok installed") {
		t.Errorf("after a stopped removal the package is %q", st)
	}
	if _, err := os.Stat("/usr/bin/hapilot"); err != nil {
		t.Errorf("after a stopped removal: %v", err)
	}
	select {
	case <-exited:
		t.Fatalf("the agent stopped although its servers could not be brought back:\n%s", log.String())
	default:
	}
	if d, err := drained(); err != nil || !d["srv3"] || !d["srv5"] {
		t.Errorf("after a stopped removal: drained %v (%v)", d, err)
	}

	// With HAProxy reachable: both servers back, the agent gone, the
	// binary removed.
	out, err = exec.Command("dpkg", "-r", "hapilot").CombinedOutput()
	said = string(out)
	if err != nil {
		t.Fatalf("dpkg -r: %v\n%s", err, said)
	}
	for _, want := range []string{"2 server(s) brought back: " + fleet.BackendName + "/srv3, " + fleet.BackendName + "/srv5",
		fmt.Sprintf("agent pid %d", agent.Process.Pid), "stopped", "no server the agent changed remains changed"} {
		if !strings.Contains(said, want) {
			t.Errorf("dpkg -r: no %q in:\n%s", want, said)
		}
	}
	select {
	case <-exited:
	case <-time.After(10 * time.Second):
		t.Errorf("the agent runs on after removal")
	}
	if d, err := drained(); err != nil || d["srv3"] || d["srv5"] {
		t.Errorf("after removal: drained %v (%v)", d, err)
	}
	if _, err := os.Stat("/usr/bin/hapilot"); !os.IsNotExist(err) {
		t.Errorf("after removal /usr/bin/hapilot: %v", err)
	}
	t.Logf("dpkg -r:\n%s", said)
	if t.Failed() {
		return
	}

	// Again, the agent started as the README's "Running" shows it: as
	// root, no settings file, the default state file under $HOME, and
	// /etc/hapilot/keep-drains-on-remove created. The removal stops it,
	// leaves both drains, and lists them with HAProxy's own commands,
	// since no hapilot is left to undo them.
	must(t, "dpkg", "-i", deb)
	keep := "/etc/hapilot/keep-drains-on-remove"
	if err := os.WriteFile(keep, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.Remove(keep) })
	rootHome := filepath.Join(dir, "root-home")
	if err := os.Mkdir(rootHome, 0o700); err != nil {
		t.Fatal(err)
	}
	byHand := exec.Command("/usr/bin/hapilot", "run", "--haproxy-socket", opts.Socket(), "--interval", "1s",
		"--audit-log", filepath.Join(dir, "log", "by-hand.jsonl"), "--mode", "enforce",
		// Its own control socket and status port, apart from other tests'.
		"--control-socket", "unix:"+filepath.Join(dir, "run", "by-hand.sock"), "--status-listen", fmt.Sprintf("127.0.0.1:%d", ports[2]))
	byHand.Env = append(withoutEnv(os.Environ(), "HOME", "XDG_STATE_HOME", "STATE_DIRECTORY"), "HOME="+rootHome)
	var handLog lockedBuilder
	byHand.Stdout, byHand.Stderr = &handLog, &handLog
	if err := byHand.Start(); err != nil {
		t.Fatal(err)
	}
	handExited := make(chan struct{})
	go func() { // owned here: it ends when the agent does, which the defer waits for
		_ = byHand.Wait()
		close(handExited)
	}()
	defer func() {
		_ = byHand.Process.Signal(os.Interrupt)
		<-handExited
		if t.Failed() {
			t.Logf("the agent started by hand:\n%s", handLog.String())
		}
	}()
	loadUntilDrained()
	if d, err := drained(); err != nil || !d["srv3"] || !d["srv5"] {
		t.Fatalf("the agent started by hand drained %v (%v)", d, err)
	}
	out, err = exec.Command("dpkg", "-r", "hapilot").CombinedOutput()
	said = string(out)
	if err != nil {
		t.Fatalf("dpkg -r, keeping the drains: %v\n%s", err, said)
	}
	state := filepath.Join(rootHome, ".local", "state", "hapilot", "state.json")
	for _, want := range []string{"keep-drains-on-remove exists", fmt.Sprintf("agent pid %d: stopped", byHand.Process.Pid),
		"2 server(s) remain as the agent left them", "(" + fmt.Sprintf("agent pid %d", byHand.Process.Pid) + ")",
		"echo 'set server " + fleet.BackendName + "/srv3 state ready' | socat stdio " + opts.Socket(),
		"echo 'set server " + fleet.BackendName + "/srv5 state ready' | socat stdio " + opts.Socket()} {
		if !strings.Contains(said, want) {
			t.Errorf("dpkg -r, keeping the drains: no %q in:\n%s", want, said)
		}
	}
	if _, err := os.Stat(state); err != nil {
		t.Errorf("the agent's state file: %v", err)
	}
	select {
	case <-handExited:
	case <-time.After(10 * time.Second):
		t.Errorf("the agent started by hand runs on after removal")
	}
	if d, err := drained(); err != nil || !d["srv3"] || !d["srv5"] {
		t.Errorf("keep-drains-on-remove: drained %v (%v)", d, err)
	}
	t.Logf("dpkg -r, keeping the drains:\n%s", said)
}

// withoutEnv is env less the variables named.
func withoutEnv(env []string, names ...string) []string {
	var out []string
	for _, kv := range env {
		k, _, _ := strings.Cut(kv, "=")
		if !slices.Contains(names, k) {
			out = append(out, kv)
		}
	}
	return out
}

// lockedBuilder is a strings.Builder that the agent's output and the
// test's reads may share.
type lockedBuilder struct {
	mu sync.Mutex
	b  strings.Builder
}

func (l *lockedBuilder) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuilder) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
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
