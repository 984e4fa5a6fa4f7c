package daemon

import (
	"bufio"
	"context"
	"net"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"
)

func TestTelemetryAdvice(t *testing.T) {
	for _, tc := range []struct {
		version, path string
		want          []string // substrings of the advice; nil: none
	}{
		// Full SPOE on the rewritten SPOE names the cheap path that
		// detects as fast.
		{"3.2.26-1", "spoe", []string{"SPOE (examples/haproxy.cfg) costs HAProxy 3.2 about 1.80x", "HAProxy's counters alone (no stanza: --spoe-listen off) costs 1.02x", "0.5 s after it"}},
		{"3.1.0", "spoe", []string{"HAProxy 3.1"}},
		{"3.3-dev4", "spoe", []string{"HAProxy 3.3"}},
		// Before 3.1 SPOE stays under the bar: nothing to say.
		{"2.6.12-1+deb12u4", "spoe", nil},
		{"3.0.11-1+deb13u4", "spoe", nil},
		// The cheap paths themselves, and paths or versions it does not know.
		{"3.2.26-1", "spoe-sampled", nil}, // 1.14x: under the bar

		{"3.2.26-1", "ring", nil},
		{"3.2.26-1", "stats", nil},
		{"3.2.26-1", "carrier-pigeon", nil},
		{"", "spoe", nil},
		{"unknown", "spoe", nil},
	} {
		got := TelemetryAdvice(tc.version, tc.path)
		if tc.want == nil {
			if got != "" {
				t.Errorf("%s on %q: advice %q, want none", tc.path, tc.version, got)
			}
			continue
		}
		for _, w := range tc.want {
			if !strings.Contains(got, w) {
				t.Errorf("%s on %q: advice %q lacks %q", tc.path, tc.version, got, w)
			}
		}
	}
}

// Every path named is cheaper than the bar it is advised for, and the
// thresholds keep today's 2.6 SPOE unadvised: the table and the bars
// agree with docs/lab/telemetry-cost.md.
func TestPathCostsAgreeWithTheBars(t *testing.T) {
	for _, p := range pathCosts {
		if p.before31 <= 0 || p.v31 <= 0 || p.isolated <= 0 || p.how == "" {
			t.Errorf("%+v: incomplete", p)
		}
	}
	if pathCosts[0].name != "spoe" || pathCosts[0].before31 > AdviseAbove || pathCosts[0].v31 <= AdviseAbove {
		t.Errorf("SPOE's figures %+v: want under %.2f before 3.1 and over it from 3.1", pathCosts[0], AdviseAbove)
	}
}

func TestSPOEPath(t *testing.T) {
	for _, tc := range []struct {
		events, sampled uint64
		want            string
	}{
		{0, 0, ""},
		{10, 0, "spoe"},
		{10, 1, "spoe-sampled"},
	} {
		if got := spoePath(tc.events, tc.sampled); got != tc.want {
			t.Errorf("spoePath(%d, %d) = %q, want %q", tc.events, tc.sampled, got, tc.want)
		}
	}
}

// fakeRuntime answers the runtime commands the agent sends at start and
// in its steps: an admin level, `show info` of the given version, and an
// empty reply to anything else.
func fakeRuntime(t *testing.T, version string) string {
	t.Helper()
	return fakeRuntimeAt(t, version, "admin")
}

// fakeRuntimeAt is fakeRuntime with the CLI level it reports.
func fakeRuntimeAt(t *testing.T, version, level string) string {
	t.Helper()
	sock := filepath.Join(t.TempDir(), "admin.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
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
					reply += level + "\n"
				case strings.Contains(line, "show stat"):
					reply += "# pxname,svname,bck,algo,mode\napp,srv1,0,,http\napp,BACKEND,0,roundrobin,http\n"
				case strings.Contains(line, "show servers state"):
					reply += "1\n# be_id be_name srv_id srv_name srv_addr srv_op_state srv_admin_state srv_uweight srv_iweight srv_port\n1 app 1 srv1 127.0.0.1 2 0 1 1 80\n"
				case strings.Contains(line, "show info"):
					reply += "Name: HAProxy\nVersion: " + version + "\nPid: 7\nStart_time_sec: 1700000000\n"
				}
				c.Write([]byte(reply + "\n"))
			}(conn)
		}
	}()
	return sock
}

// The running agent gives the advice once SPOE messages arrive from an
// HAProxy whose version makes them dear: in /status's warnings (and so
// the live page), and not before.
func TestAgentAdvisesOnTheRunningVersion(t *testing.T) {
	for _, tc := range []struct {
		version string
		advised bool
	}{
		{"3.2.26-1", true},
		{"2.6.12-1+deb12u4", false},
	} {
		t.Run(tc.version, func(t *testing.T) {
			c := parseConfig(t, []string{"--spoe-listen", "127.0.0.1:0", "--status-listen", "off",
				"--haproxy-socket", fakeRuntime(t, tc.version), "--interval", "1h", "--stats-poll", "0"})
			d, err := New(*c, zerolog.Nop())
			if err != nil {
				t.Fatal(err)
			}
			d.adviceEvery = 10 * time.Millisecond
			serve(t, d)
			hasAdvice := func() bool {
				for _, w := range d.Warnings() {
					if strings.HasPrefix(w, "telemetry: ") {
						return true
					}
				}
				return false
			}
			// No message yet: nothing to advise on, whatever the version.
			if a := d.adviceNow(context.Background()); a != "" || hasAdvice() {
				t.Fatalf("advice before any SPOE message: %q %q", a, d.Warnings())
			}
			d.SPOE.Counters.Events.Add(1) // as a NOTIFY frame would
			deadline := time.Now().Add(2 * time.Second)
			for !hasAdvice() && time.Now().Before(deadline) {
				time.Sleep(10 * time.Millisecond)
			}
			if hasAdvice() != tc.advised {
				t.Fatalf("advised %v, want %v: %q", hasAdvice(), tc.advised, d.Warnings())
			}
		})
	}
}
