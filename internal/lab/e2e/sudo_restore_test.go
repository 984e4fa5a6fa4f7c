//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/hapilot/hapilot/agent"
	"github.com/hapilot/hapilot/agent/ledger"
	"github.com/hapilot/hapilot/haproxy"
	"github.com/hapilot/hapilot/internal/lab/haproxyproc"
	"github.com/hapilot/hapilot/internal/lab/labtest"
	"github.com/rs/zerolog"
)

// `sudo hapilot restore`, as the runbook says, on the service's state
// file (its user's, in its user's folder, as /var/lib/hapilot is): the
// binary, run as root, readies the agent's drain on a real HAProxy and
// leaves the file its owner's, so the service's user still reads it.
// Before, the file became root:root 0640; the service's next start could
// not read it, kept it aside and forgot the operator's holds.
func TestRootRestoreLeavesTheStateFileToTheService(t *testing.T) {
	t.Parallel()
	labtest.RequireHAProxy(t)
	if os.Geteuid() != 0 {
		t.Skip("needs root, as sudo hapilot restore has")
	}
	if _, err := exec.LookPath("setpriv"); err != nil {
		t.Skip("needs setpriv, to read the file as the service's user")
	}
	const nobody = 65534
	base, err := os.MkdirTemp("", "hapilot-sudo-restore-")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(base)
	hpDir, lib := filepath.Join(base, "haproxy"), filepath.Join(base, "lib")
	bin := filepath.Join(base, "hapilot") // where the service's user may run it
	for _, err := range []error{os.Chmod(base, 0o755), os.Mkdir(hpDir, 0o755), os.Mkdir(lib, 0o750), os.Chown(lib, nobody, nobody)} {
		if err != nil {
			t.Fatal(err)
		}
	}
	if out, err := exec.Command("cp", agentBinary, bin).CombinedOutput(); err != nil {
		t.Fatalf("cp: %v %s", err, out)
	}
	// An admin socket anyone may use: the test's stand-in for the
	// service's group access, so that both runs reach HAProxy.
	sock := filepath.Join(hpDir, "admin.sock")
	cfg := fmt.Sprintf("global\n    stats socket %s mode 666 level admin\n\ndefaults\n    mode http\n    timeout connect 2s\n    timeout client 30s\n    timeout server 30s\n\n"+
		"backend app\n    server srv1 127.0.0.1:1\n    server srv2 127.0.0.1:2\n", sock)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	hp, err := haproxyproc.Start(ctx, hpDir, cfg, sock)
	if err != nil {
		t.Fatal(err)
	}
	defer hp.Stop()
	rt, err := haproxy.New(sock)
	if err != nil {
		t.Fatal(err)
	}
	// The service's state: srv2 drained by the agent, its ledger's file
	// its user's.
	if err := rt.SetServerState(ctx, "app", "srv2", haproxy.StateDrain); err != nil {
		t.Fatal(err)
	}
	state := filepath.Join(lib, "state.json")
	ledger.New(state, zerolog.Nop()).Drain(agent.Key{Backend: "app", Server: "srv2"}, time.Now(), "5xx", 0.05, 0, 0, false, false)
	if err := os.Chown(state, nobody, nobody); err != nil {
		t.Fatal(err)
	}
	restore := func(as ...string) (string, error) {
		args := append(as, bin, "restore", "--state-file", state, "--haproxy-socket", sock,
			"--control-socket", "unix:"+filepath.Join(base, "ctl.sock"), "--log-format", "json")
		out, err := exec.CommandContext(ctx, args[0], args[1:]...).CombinedOutput()
		return string(out), err
	}

	out, err := restore("env") // root, as sudo runs it
	if err != nil || !strings.Contains(out, "app/srv2: restored") {
		t.Fatalf("sudo hapilot restore: %v\n%s", err, out)
	}
	states, err := rt.ShowServersState(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range states {
		if s.Server == "srv2" && (s.Drain() || s.Maint()) {
			t.Fatalf("srv2 still %s", s.Label())
		}
	}
	fi, err := os.Stat(state)
	if err != nil {
		t.Fatal(err)
	}
	if st := fi.Sys().(*syscall.Stat_t); st.Uid != nobody || st.Gid != nobody || fi.Mode().Perm() != 0o640 {
		t.Fatalf("after sudo restore the state file is %d:%d %04o, want %d:%d 0640", st.Uid, st.Gid, fi.Mode().Perm(), nobody, nobody)
	}
	// The service's user reads it: nothing kept aside, the release's
	// hold in it.
	out, err = restore("setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups")
	if err != nil || strings.Contains(out, "could not be read") || !strings.Contains(out, "0 server(s) in the state file") {
		t.Fatalf("as the service's user: %v\n%s", err, out)
	}
	if l := ledger.New(state, zerolog.Nop()); l.OverriddenUntil(agent.Key{Backend: "app", Server: "srv2"}).IsZero() {
		t.Fatal("the operator's hold is not in the state file")
	}
}
