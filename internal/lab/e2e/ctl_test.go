//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/hapilot/hapilot/agent"
	"github.com/hapilot/hapilot/agent/ledger"
	"github.com/hapilot/hapilot/cmd/hapilot/ctl"
	"github.com/hapilot/hapilot/internal/lab/haproxyproc"
	"github.com/rs/zerolog"
)

// ctlHAProxy starts a real HAProxy with the backends app and web and
// extra more (b000, b001, ...), each one server, and the agent on it in
// observe mode with web out of scope; it returns the control socket and
// the state file once the agent's first step has read HAProxy.
func ctlHAProxy(t *testing.T, ctx context.Context, extra int, args ...string) (sock, state string) {
	t.Helper()
	dir := t.TempDir()
	socket := filepath.Join(dir, "admin.sock")
	var b strings.Builder
	fmt.Fprintf(&b, "global\n    stats socket %s mode 600 level admin\n\ndefaults\n    mode http\n    timeout connect 2s\n    timeout client 30s\n    timeout server 30s\n\n", socket)
	names := []string{"app", "web"}
	for i := 0; i < extra; i++ {
		names = append(names, fmt.Sprintf("b%03d", i))
	}
	for _, n := range names {
		fmt.Fprintf(&b, "backend %s\n    server s1 127.0.0.1:9\n    server s2 127.0.0.1:9\n\n", n)
	}
	hp, err := haproxyproc.Start(ctx, dir, b.String(), socket)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(hp.Stop)
	sock, state = filepath.Join(dir, "ctl.sock"), filepath.Join(dir, "state.json")
	dm := startAgent(t, ctx, zerolog.Nop(), append([]string{"--haproxy-socket", socket, "--spoe-listen", "off", "--status-listen", "off",
		"--interval", "1s", "--mode", "observe", "--state-file", state, "--control-socket", "unix:" + sock, "--backend", "web.enabled=false"}, args...))
	for deadline := time.Now().Add(20 * time.Second); dm.Loop.View().Status().Observed.IsZero(); time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the agent's first step never read HAProxy")
		}
	}
	return sock, state
}

// `ctl pause` takes only a backend the agent governs in HAProxy: a typo
// (ap for app) is refused with a non-zero rc and the names it could have
// meant, an out-of-scope backend is refused, and the pauses held are
// bounded (ledger.MaxPauses), so the state file and `ctl status` stay
// readable whatever is asked.
func TestCtlPauseOnlyWhatTheAgentGoverns(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	sock, state := ctlHAProxy(t, ctx, ledger.MaxPauses)

	// Through the binary: the operator's rc.
	out, err := exec.CommandContext(ctx, agentBinary, "ctl", "--socket", "unix:"+sock, "pause", "ap").CombinedOutput()
	if code := exitCode(err); code == 0 || !strings.Contains(string(out), "no backend ap among the") || !strings.Contains(string(out), "app") {
		t.Fatalf("ctl pause ap: rc %d, %s", code, out)
	}
	pause := func(backend string) ctl.Answer {
		a, err := ctl.Do(ctx, sock, ctl.Request{Command: ctl.Pause, Backend: backend})
		if err != nil {
			t.Fatalf("pause %q: %v", backend, err)
		}
		return a
	}
	if a := pause("web"); a.OK || !strings.Contains(a.Error, "backend web is out of scope") {
		t.Fatalf("pause web: %+v", a)
	}
	if a := pause("app"); !a.OK {
		t.Fatalf("pause app: %+v", a)
	}
	if a := pause("app"); !a.OK { // the same pause again replaces it
		t.Fatalf("pause app again: %+v", a)
	}
	// app holds one pause; b000.. fill the rest, and the next is refused.
	for i := 0; i < ledger.MaxPauses-1; i++ {
		if a := pause(fmt.Sprintf("b%03d", i)); !a.OK {
			t.Fatalf("pause %d: %+v", i, a)
		}
	}
	last := fmt.Sprintf("b%03d", ledger.MaxPauses-1)
	if a := pause(last); a.OK || !strings.Contains(a.Error, fmt.Sprintf("%d backends' pauses held", ledger.MaxPauses)) {
		t.Fatalf("pause past the bound: %+v", a)
	}
	// Pausing every backend, the safe side, is never refused.
	if a := pause(agent.AllBackends); !a.OK {
		t.Fatalf("pause of every backend past the bound: %+v", a)
	}
	if a, err := ctl.Do(ctx, sock, ctl.Request{Command: ctl.Resume, Backend: "b000"}); err != nil || !a.OK {
		t.Fatalf("resume: %+v %v", a, err)
	}
	if a := pause(last); !a.OK {
		t.Fatalf("pause after a resume: %+v", a)
	}
	a, err := ctl.Do(ctx, sock, ctl.Request{Command: ctl.Status})
	if err != nil || !a.OK || strings.Count(string(a.Result), `"by":"ctl uid`) != ledger.MaxPauses+1 {
		t.Fatalf("status: %v, %.300s", err, a.Result)
	}
	// The state file is written by its own goroutine: wait for the last
	// pause, then look for the refused ones.
	var b []byte
	for deadline := time.Now().Add(10 * time.Second); !strings.Contains(string(b), `"`+last+`"`); time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("state file: %v\n%.500s", err, b)
		}
		b, err = os.ReadFile(state)
	}
	if strings.Contains(string(b), `"ap"`) || strings.Contains(string(b), `"web"`) || !strings.Contains(string(b), `"app"`) {
		t.Fatalf("state file:\n%.500s", b)
	}
}

func exitCode(err error) int {
	if ee, ok := err.(*exec.ExitError); ok {
		return ee.ExitCode()
	}
	if err != nil {
		return -1
	}
	return 0
}
