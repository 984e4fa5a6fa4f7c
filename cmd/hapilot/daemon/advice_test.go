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
			d.Paths.AdviceEvery = 10 * time.Millisecond
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
			if a := d.Paths.AdviceNow(context.Background()); a != "" || hasAdvice() {
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
