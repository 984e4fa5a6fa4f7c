package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// findAgents reads a /proc tree: only `run` processes of the binary
// (deleted or not) count, and each one's control socket and state file
// are read as it read them, from its arguments, its --config file, its
// environment and its working directory.
func TestFindAgentsReadsEachAgentsSettings(t *testing.T) {
	proc := t.TempDir()
	bin := "/usr/bin/hapilot"
	cwd := t.TempDir()
	if err := os.WriteFile(filepath.Join(cwd, "agent.conf"), []byte("control-socket unix:/run/other/ctl.sock\nstate-file state.json\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	mk := func(pid, exe string, argv []string, env ...string) {
		d := filepath.Join(proc, pid)
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.Symlink(exe, filepath.Join(d, "exe")); err != nil {
			t.Fatal(err)
		}
		if err := os.Symlink(cwd, filepath.Join(d, "cwd")); err != nil {
			t.Fatal(err)
		}
		must := func(err error) {
			if err != nil {
				t.Fatal(err)
			}
		}
		must(os.WriteFile(filepath.Join(d, "cmdline"), []byte(strings.Join(argv, "\x00")+"\x00"), 0o644))
		must(os.WriteFile(filepath.Join(d, "environ"), []byte(strings.Join(env, "\x00")+"\x00"), 0o644))
	}
	// As the README starts it: defaults, the state file under $HOME.
	mk("100", bin, []string{"hapilot", "run", "--haproxy-socket", "/run/haproxy/admin.sock"}, "HOME=/home/op")
	// As the unit does: systemd's STATE_DIRECTORY.
	mk("200", bin+" (deleted)", []string{"/usr/bin/hapilot", "run", "--state-file", "auto", "--control-socket", "off"}, "STATE_DIRECTORY=/var/lib/hapilot")
	// A relative --config from its own folder.
	mk("300", bin, []string{"hapilot", "run", "--config", "agent.conf"})
	mk("400", bin, []string{"hapilot", "ctl", "list"})                // not an agent
	mk("500", "/usr/local/bin/hapilot", []string{"hapilot", "run"})   // another binary
	mk("600", bin, []string{"hapilot", "run"})                        // this process
	mk("700", bin, []string{"hapilot", "run", "--no-such-flag", "1"}) // settings that no longer parse
	got, err := findAgents(proc, bin, 600)
	if err != nil {
		t.Fatal(err)
	}
	type view struct {
		pid            int
		control, state string
		bad            bool
	}
	want := []view{
		{100, "/run/hapilot/ctl.sock", "/home/op/.local/state/hapilot/state.json", false},
		{200, "", "/var/lib/hapilot/state.json", false},
		{300, "/run/other/ctl.sock", filepath.Join(cwd, "state.json"), false},
		{700, "", "", true},
	}
	if len(got) != len(want) {
		t.Fatalf("found %d agents, want %d: %+v", len(got), len(want), got)
	}
	for i, w := range want {
		g := view{got[i].PID, got[i].Control, got[i].State, got[i].Err != nil}
		if g != w {
			t.Errorf("agent %d: got %+v, want %+v (err %v)", i, g, w, got[i].Err)
		}
	}
}
