package loop

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/hapilot/hapilot/agent"
	"github.com/hapilot/hapilot/agent/ledger"
	"github.com/hapilot/hapilot/haproxy"
	"github.com/hapilot/hapilot/internal/lab/fakes"
	"github.com/hapilot/hapilot/internal/lib/safefile"
	"github.com/rs/zerolog"
)

const nobody = 65534

// genuineState is a state file the agent wrote: s2 drained by it.
func genuineState(t *testing.T, dir string) []byte {
	t.Helper()
	file := filepath.Join(dir, "genuine.json")
	rt := fakes.NewRuntime("s1", "s2", "s3", "s4")
	l, _, pol, _ := newLoop(rt)
	l.StateFile = file
	pol.plans = []agent.Plan{{drain("s2")}}
	l.Step(context.Background())
	b, err := os.ReadFile(file)
	if err != nil || !strings.Contains(string(b), "app/s2") {
		t.Fatalf("state file %s: %v", b, err)
	}
	return b
}

func owned(t *testing.T, path string) (uid, gid uint32, perm os.FileMode) {
	t.Helper()
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	st := fi.Sys().(*syscall.Stat_t)
	return st.Uid, st.Gid, fi.Mode().Perm()
}

// A state file a stranger may have written is refused, by the agent's
// start and by `hapilot restore`, with the file, its owner or mode, and
// the fix; one the agent's user, root or its folder's owner wrote is
// read. Before, a forged file (mode 0666, or owned by nobody) naming a
// healthy s2 as the agent's drain had the agent drain it again at start,
// and restore ready an operator's drained server.
func TestUntrustedStateFileRefused(t *testing.T) {
	content := genuineState(t, t.TempDir())
	root := os.Geteuid() == 0
	tests := []struct {
		name      string
		needRoot  bool
		mode      os.FileMode
		owner     int // -1: the test's own user
		dirOwner  int
		dirMode   os.FileMode
		want      []string // in the error; none: trusted
		wantNoErr bool
	}{
		{name: "mode 0666", mode: 0o666, owner: -1, dirOwner: -1, dirMode: 0o700, want: []string{"mode 0666", "chmod 644", "drain or ready any server"}},
		{name: "group-writable 0660", mode: 0o660, owner: -1, dirOwner: -1, dirMode: 0o700, want: []string{"mode 0660", "chmod 640"}},
		{name: "in a folder anyone may write", mode: 0o640, owner: -1, dirOwner: -1, dirMode: 0o777, want: []string{"of mode 0777", "chmod g-w,o-w"}},
		{name: "owned by nobody", needRoot: true, mode: 0o644, owner: nobody, dirOwner: -1, dirMode: 0o700,
			want: []string{"owned by uid 65534", "not by this process's user (uid 0), root, or the owner of", "chown 0"}},
		{name: "the agent's own, 0640", mode: 0o640, owner: -1, dirOwner: -1, dirMode: 0o700, wantNoErr: true},
		{name: "in a sticky folder (/tmp)", mode: 0o600, owner: -1, dirOwner: -1, dirMode: 0o777 | os.ModeSticky, wantNoErr: true},
		// The service's file, read by root's `hapilot restore`: its
		// folder's owner could replace it anyway.
		{name: "owned by its folder's owner", needRoot: true, mode: 0o640, owner: nobody, dirOwner: nobody, dirMode: 0o750, wantNoErr: true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if tc.needRoot && !root {
				t.Skip("needs root to give the file to another user")
			}
			dir := filepath.Join(t.TempDir(), "state")
			if err := os.Mkdir(dir, 0o700); err != nil {
				t.Fatal(err)
			}
			file := filepath.Join(dir, "state.json")
			if err := os.WriteFile(file, content, 0o600); err != nil {
				t.Fatal(err)
			}
			for _, err := range []error{os.Chmod(file, tc.mode), os.Chmod(dir, tc.dirMode), os.Lchown(file, tc.owner, -1), os.Lchown(dir, tc.dirOwner, -1)} {
				if err != nil {
					t.Fatal(err)
				}
			}
			// The agent's start: s2 is ready, as after a reload that lost
			// the drain the file names.
			rt := fakes.NewRuntime("s1", "s2", "s3", "s4")
			l, _, _, _ := newLoop(rt)
			l.StateFile = file
			err := l.OpenState()
			if tc.wantNoErr {
				if err != nil {
					t.Fatalf("a trusted file refused: %v", err)
				}
				if _, ok := l.View().Ledger()[agent.Key{Backend: "app", Server: "s2"}]; !ok {
					t.Fatalf("the trusted file's change was not read: %v", l.View().Ledger())
				}
				return
			}
			if err == nil || !errors.Is(err, safefile.ErrUntrusted) || !strings.Contains(err.Error(), file) {
				t.Fatalf("err %v", err)
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("%q does not say %q", err, w)
				}
			}
			// Offline restore refuses it too, and sends nothing: the
			// operator's drain of s2 stands.
			rt.Set("s2", func(s *haproxy.ServerState) { s.AdminState = haproxy.AdminForcedDrain })
			if _, err := RestoreFromState(context.Background(), file, []agent.Runtime{rt}, time.Hour, time.Unix(2000, 0), zerolog.Nop()); !errors.Is(err, safefile.ErrUntrusted) {
				t.Fatalf("restore: %v", err)
			}
			if cmds := rt.TakeCommands(); len(cmds) != 0 {
				t.Fatalf("restore sent %q", cmds)
			}
			// A loop never told to open the state file first reads it at
			// its first step: the forged file is kept aside, nothing
			// drained, and the warning says so.
			l2, _, _, _ := newLoop(rt)
			l2.StateFile = file
			l2.Step(context.Background())
			if cmds := rt.TakeCommands(); len(cmds) != 0 {
				t.Fatalf("the first step sent %q", cmds)
			}
			if w := l2.View().StateWarning(); !strings.Contains(w, "could not be read at start") || !strings.Contains(w, "kept as") {
				t.Fatalf("warning %q", w)
			}
		})
	}
}

// `sudo hapilot restore` rewrites the service's state file: it keeps its
// owner, group and mode, so the service's next start, as its own user,
// still reads it. Before, the file became root:root 0640, the next start
// could not read it, kept it aside, and forgot the operator's holds.
func TestRestoreKeepsTheStateFilesOwner(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root, as sudo hapilot restore has")
	}
	dir := filepath.Join(t.TempDir(), "lib")
	if err := os.Mkdir(dir, 0o750); err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(dir, "state.json")
	if err := os.WriteFile(file, genuineState(t, t.TempDir()), 0o640); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{dir, file} {
		if err := os.Chown(p, nobody, nobody); err != nil {
			t.Fatal(err)
		}
	}
	rt := fakes.NewRuntime("s1", "s2", "s3", "s4")
	rt.Set("s2", func(s *haproxy.ServerState) { s.AdminState = haproxy.AdminForcedDrain })
	got, err := RestoreFromState(context.Background(), file, []agent.Runtime{rt}, time.Hour, time.Unix(2000, 0), zerolog.Nop())
	if err != nil || len(got) != 1 || got[0].Error != "" {
		t.Fatalf("restore %+v: %v", got, err)
	}
	if cmds := rt.TakeCommands(); len(cmds) != 1 || cmds[0] != "set server app/s2 state ready" {
		t.Fatalf("commands %q", cmds)
	}
	if uid, gid, perm := owned(t, file); uid != nobody || gid != nobody || perm != 0o640 {
		t.Fatalf("after restore the state file is %d:%d %04o, want %d:%d 0640", uid, gid, perm, nobody, nobody)
	}
	// The release's hold is in it, for the service's next start.
	if l := ledger.New(file, zerolog.Nop()); l.OverriddenUntil(agent.Key{Backend: "app", Server: "s2"}).IsZero() {
		t.Fatal("the operator's hold is not in the state file")
	}
}
