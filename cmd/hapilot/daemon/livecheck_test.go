package daemon

import (
	"bufio"
	"context"
	"net"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/hapilot/hapilot/agent"
	"github.com/hapilot/hapilot/agent/ledger"
	"github.com/rs/zerolog"
)

// check --live fails when the agent could not act (no HAProxy answers, a
// level below admin) or could not see (every path off), each named.
func TestLiveCheckProblems(t *testing.T) {
	for _, tc := range []struct {
		name string
		args func(t *testing.T) []string
		want string // in a problem; "" for none
	}{
		{"admin, counters alone", func(t *testing.T) []string {
			return []string{"--haproxy-socket", fakeRuntimeAt(t, "2.6.12", "admin"), "--spoe-listen", "off"}
		}, ""},
		{"level operator", func(t *testing.T) []string {
			return []string{"--haproxy-socket", fakeRuntimeAt(t, "2.6.12", "operator"), "--spoe-listen", "off"}
		}, `answers at level "operator"`},
		{"nothing answers", func(t *testing.T) []string {
			return []string{"--haproxy-socket", filepath.Join(t.TempDir(), "none.sock"), "--spoe-listen", "off"}
		}, "no HAProxy answered"},
		{"blind", func(t *testing.T) []string {
			return []string{"--haproxy-socket", fakeRuntimeAt(t, "2.6.12", "admin"), "--spoe-listen", "off", "--stats-poll", "0"}
		}, "the agent would be blind"},
		// SPOE sees the answers HAProxy passes on, and nothing of its
		// own 5xx, its retries or the aborts: with the stats path off,
		// the check says so.
		{"SPOE without the stats path", func(t *testing.T) []string {
			return []string{"--haproxy-socket", fakeRuntimeAt(t, "2.6.12", "admin"), "--spoe-listen", "127.0.0.1:0", "--stats-poll", "0"}
		}, "telemetry blind: the per-response paths cannot see HAProxy's own 502/503/504"},
		{"the logs without the stats path", func(t *testing.T) []string {
			return []string{"--haproxy-socket", fakeRuntimeAt(t, "2.6.12", "admin"), "--spoe-listen", "off", "--syslog-listen", "udp://127.0.0.1:0", "--stats-poll", "0"}
		}, "telemetry blind: the per-response paths cannot see the attempts HAProxy retried"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := parseConfig(t, append(tc.args(t), "--status-listen", "off"))
			r := LiveCheck(context.Background(), *c, 100*time.Millisecond)
			got := strings.Join(r.Problems, "\n")
			if (tc.want == "") != (got == "") || !strings.Contains(got, tc.want) {
				t.Errorf("problems %q, want %q\nreport:\n%s", got, tc.want, strings.Join(r.Lines, "\n"))
			}
		})
	}
}

// check --live with the agent stopped: a drain its state file records is
// the agent's (with how to undo it), not "drained by someone"; a drain the
// file does not record is still someone's.
func TestLiveCheckNamesTheStoppedAgentsDrains(t *testing.T) {
	dir := t.TempDir()
	state := filepath.Join(dir, "state.json")
	ledger := ledger.New(state, zerolog.Nop())
	ledger.Drain(agent.Key{Backend: "app", Server: "srv1"}, time.Unix(1700000100, 0), "5xx", 0.05, 0, 0, false, false)
	if st := ledger.Flush(); !st.Saved {
		t.Fatalf("state file: %+v", st)
	}
	sock := drainedRuntimeAt(t)
	for _, tc := range []struct {
		name, stateFile, want, wantNot string
	}{
		{"its state file", state, "srv1 (drained by the agent since 2023-11-14T22:15:00Z, per its state file " + state, "drained by someone"},
		{"no state file", "off", "srv1 (drained by someone", "by the agent"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := parseConfig(t, []string{"--haproxy-socket", sock, "--spoe-listen", "off", "--status-listen", "off", "--state-file", tc.stateFile})
			r := LiveCheck(context.Background(), *c, 100*time.Millisecond)
			report := strings.Join(r.Lines, "\n")
			if !strings.Contains(report, tc.want) || strings.Contains(report, tc.wantNot) {
				t.Errorf("want %q and no %q in:\n%s", tc.want, tc.wantNot, report)
			}
		})
	}
}

// drainedRuntimeAt is fakeRuntimeAt (HAProxy 2.6.12, level admin) with
// app/srv1 drained (srv_admin_state 8) and app/srv2 ready.
func drainedRuntimeAt(t *testing.T) string {
	t.Helper()
	sock := filepath.Join(t.TempDir(), "admin.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() { // owned by the test: Cleanup closes ln, which ends it
		for {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			go func(c net.Conn) {
				defer c.Close()
				line, _ := bufio.NewReader(c).ReadString('\n')
				reply := "\n"
				switch {
				case strings.Contains(line, "show cli level"):
					reply += "admin\n"
				case strings.Contains(line, "show stat"):
					reply += "# pxname,svname,bck,algo,mode\napp,srv1,0,,http\napp,srv2,0,,http\napp,BACKEND,0,roundrobin,http\n"
				case strings.Contains(line, "show servers state"):
					reply += "1\n# be_id be_name srv_id srv_name srv_addr srv_op_state srv_admin_state srv_uweight srv_iweight srv_port\n" +
						"1 app 1 srv1 127.0.0.1 2 8 1 1 80\n1 app 2 srv2 127.0.0.1 2 0 1 1 80\n"
				case strings.Contains(line, "show info"):
					reply += "Name: HAProxy\nVersion: 2.6.12\nPid: 7\nStart_time_sec: 1700000000\n"
				}
				_, _ = c.Write([]byte(reply + "\n"))
			}(conn)
		}
	}()
	return sock
}
