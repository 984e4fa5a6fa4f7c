package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"net"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/hapilot/hapilot/agent"
	"github.com/hapilot/hapilot/agent/guard"
	"github.com/hapilot/hapilot/agent/loop"
	"github.com/hapilot/hapilot/cmd/hapilot/ctl"
	"github.com/hapilot/hapilot/cmd/hapilot/daemon"
)

// fakeAgent answers each control command with the agent's own types,
// as the daemon does, over a unix socket.
func fakeAgent(t *testing.T, results map[ctl.Command]any) string {
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
			req, err := ctl.ReadRequest(bufio.NewReader(c))
			a := ctl.Answer{OK: err == nil, Message: "message of " + string(req.Command)}
			if r, ok := results[req.Command]; ok {
				a.Result, _ = json.Marshal(r)
			}
			b, _ := json.Marshal(a)
			_, _ = c.Write(append(b, '\n'))
			c.Close()
		}
	}()
	return "unix:" + sock
}

// ctl prints tables by default and, with -o json before or after the
// command, the message and the result as indented JSON, as it always did.
func TestCtlPrintsTablesAndJSON(t *testing.T) {
	at := time.Date(2026, 12, 4, 10, 0, 0, 0, time.UTC)
	srv3 := agent.Key{Backend: "app", Server: "srv3"}
	holding := []loop.Holding{{Server: srv3, Change: agent.Change{Phase: agent.PhaseDrained, At: at, Reason: "5xx 4.9%"}}}
	results := map[ctl.Command]any{
		ctl.List: holding,
		ctl.Status: daemon.CtlStatus{Mode: agent.ModeEnforce, Policy: "rules", Interval: "10s", Cycle: 42, Observed: at,
			Pauses:    []agent.Pause{{Backend: "app", Since: at, By: "ctl uid 0 pid 1"}},
			Backends:  []guard.BackendScope{{Backend: "app", InScope: true, Action: guard.ActionDrain, Drains: 1}},
			Holding:   holding,
			Inventory: []loop.Held{{Server: srv3, State: "drain", Weight: 1, Holder: loop.HeldByAgent, Since: at, Reason: "5xx 4.9%"}}},
		ctl.Restore: []loop.Released{{Server: srv3, Was: holding[0].Change, Until: at.Add(30 * time.Minute)}},
	}
	sock := fakeAgent(t, results)
	for _, tc := range []struct {
		name string
		args []string
		want []string // lines, each in the output, spaces squeezed
	}{
		{"list", []string{"list"}, []string{"HELD BY THE AGENT PHASE WEIGHT SINCE REASON", "app/srv3 drained - 2026-12-04T10:00:00Z 5xx 4.9%"}},
		{"status", []string{"status"}, []string{"mode: enforce", "cycle: 42", "PAUSED BACKEND SINCE UNTIL BY", "app 2026-12-04T10:00:00Z - ctl uid 0 pid 1",
			"app/srv3 drained - 2026-12-04T10:00:00Z 5xx 4.9%", "BACKEND IN SCOPE ACTION MIN SERVING MAX DRAINED DRAINS/HOUR BLOCKS", "app yes drain - - 1 -",
			"FOUND HELD AT START STATE WEIGHT HOLDER SINCE REASON", "app/srv3 drain 1 agent 2026-12-04T10:00:00Z 5xx 4.9%"}},
		{"restore", []string{"restore"}, []string{"SERVER WAS NOW", "app/srv3 drained since 2026-12-04T10:00:00Z back until 2026-12-04T10:30:00Z the operator's"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var out, errb bytes.Buffer
			if code := run(append([]string{"ctl", "--socket", sock}, tc.args...), &out, &errb); code != 0 {
				t.Fatalf("code %d: %s", code, errb.String())
			}
			var squeezed []string
			for _, l := range strings.Split(out.String(), "\n") {
				squeezed = append(squeezed, strings.Join(strings.Fields(l), " "))
			}
			got := strings.Join(squeezed, "\n")
			for _, w := range append(tc.want, "message of "+tc.args[0]) {
				if !strings.Contains(got, w) {
					t.Errorf("no line %q in:\n%s", w, out.String())
				}
			}
			if strings.Contains(out.String(), "{") {
				t.Errorf("JSON in the table:\n%s", out.String())
			}
			// -o json, before or after the command: what ctl printed before tables.
			b, _ := json.Marshal(results[ctl.Command(tc.args[0])])
			var v any
			_ = json.Unmarshal(b, &v)
			indented, _ := json.MarshalIndent(v, "", "  ")
			want := "message of " + tc.args[0] + "\n" + string(indented) + "\n"
			for _, args := range [][]string{append([]string{"-o", "json"}, tc.args...), append(append([]string{}, tc.args...), "-o=json")} {
				var js bytes.Buffer
				if code := run(append([]string{"ctl", "--socket", sock}, args...), &js, &errb); code != 0 {
					t.Fatalf("%v: code %d: %s", args, code, errb.String())
				}
				if js.String() != want {
					t.Errorf("%v:\n%s\nwant\n%s", args, js.String(), want)
				}
			}
		})
	}
	var out, errb bytes.Buffer
	if code := run([]string{"ctl", "--socket", sock, "-o", "yaml", "list"}, &out, &errb); code == 0 || !strings.Contains(errb.String(), `"yaml": want table or json`) {
		t.Errorf("-o yaml: code %d, %s", code, errb.String())
	}
}
