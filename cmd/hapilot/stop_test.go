package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/hapilot/hapilot/agent"
	"github.com/hapilot/hapilot/agent/loop"
	"github.com/hapilot/hapilot/cmd/hapilot/ctl"
	"github.com/rs/zerolog"
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

// The stopper stops an agent only once its undo worked: a failed restore
// over the control socket leaves the process running and names each
// server it holds with the commands that undo it; an agent with neither a
// control socket nor a state file is left running with the reason. A
// process of `sleep` stands for each agent, so that a SIGTERM shows.
func TestStopperStopsOnlyWhatItUndid(t *testing.T) {
	held := []loop.Holding{{Server: agent.Key{Backend: "app", Server: "srv3"}, Change: agent.Change{Phase: agent.PhaseDrained, At: time.Unix(1700000000, 0)}}}
	for _, tc := range []struct {
		name      string
		restoreOK bool
		control   bool
		stopped   bool
		says      []string
	}{
		{"restored", true, true, true, []string{"asked over", "1 server(s) brought back: app/srv3", "stopped", "no server the agent changed remains changed"}},
		{"restore failed", false, true, false, []string{"its restore failed: failed: read server states", "1 server(s) remain as the agent left them",
			"app/srv3  drained since 2023-11-14T22:13:20Z", "hapilot ctl --socket unix:", "echo 'set server app/srv3 state ready' | socat stdio /run/haproxy/admin.sock"}},
		{"nothing to undo it", false, false, false, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			proc := exec.Command("sleep", "60")
			if err := proc.Start(); err != nil {
				t.Fatal(err)
			}
			exited := make(chan struct{})
			go func() { _ = proc.Wait(); close(exited) }() // owned here: the kill below ends it
			defer func() { _ = proc.Process.Kill(); <-exited }()
			c, err := parse("run", []string{"--control-socket", "off", "--state-file", "off"}, io.Discard)
			if err != nil {
				t.Fatal(err)
			}
			a := agentProc{PID: proc.Process.Pid, Args: []string{"--haproxy-socket", "/run/haproxy/admin.sock"}, Config: c}
			if tc.control {
				a.Control = ctlServer(t, map[ctl.Command]ctl.Answer{
					ctl.Restore: restoreAnswer(t, tc.restoreOK, held),
					ctl.List:    {OK: true, Result: mustJSON(t, held)},
				})
			}
			var out bytes.Buffer
			s := &stopper{out: &out, log: zerolog.Nop(), wait: 5 * time.Second, hold: time.Minute, handled: map[string]bool{}}
			err = s.run(context.Background(), []agentProc{a}, nil)
			if (err == nil) != tc.stopped {
				t.Errorf("err %v\n%s", err, out.String())
			}
			// run returns once a stopped agent is gone (a zombie here, our
			// child): no wait is needed to tell.
			st, _ := os.ReadFile(fmt.Sprintf("/proc/%d/stat", proc.Process.Pid))
			if gone := len(st) == 0 || isZombie(string(st)); gone != tc.stopped {
				t.Errorf("agent gone %v, want %v:\n%s", gone, tc.stopped, out.String())
			}
			for _, w := range tc.says {
				if !strings.Contains(out.String(), w) {
					t.Errorf("no %q in:\n%s", w, out.String())
				}
			}
			if !tc.control && (err == nil || !strings.Contains(err.Error(), "answers on no control socket and keeps no state file")) {
				t.Errorf("err %v", err)
			}
		})
	}
}

func restoreAnswer(t *testing.T, ok bool, held []loop.Holding) ctl.Answer {
	if !ok {
		return ctl.Answer{Error: "failed: read server states: permission denied"}
	}
	rs := []loop.Released{{Server: held[0].Server, Was: held[0].Change}}
	return ctl.Answer{OK: true, Message: "1 server(s) brought back", Result: mustJSON(t, rs)}
}

func mustJSON(t *testing.T, v any) json.RawMessage {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// ctlServer answers each command with its canned answer over a unix
// socket, and returns the socket's path.
func ctlServer(t *testing.T, answers map[ctl.Command]ctl.Answer) string {
	t.Helper()
	sock := filepath.Join(t.TempDir(), "ctl.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() { // owned by the test: Cleanup closes ln, which ends it
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			req, _ := ctl.ReadRequest(bufio.NewReader(c))
			b, _ := json.Marshal(answers[req.Command])
			_, _ = c.Write(append(b, '\n'))
			c.Close()
		}
	}()
	return sock
}
