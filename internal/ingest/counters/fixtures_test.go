package counters

import (
	"bufio"
	"context"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hapilot/hapilot/haproxy"
	"github.com/hapilot/hapilot/internal/lib/window"
	"github.com/rs/zerolog"
)

// runtimeSocket answers `show info` and `show stat` on a unix socket as
// HAProxy's runtime socket does, `show stat` with *stat's CSV of the
// moment.
func runtimeSocket(t *testing.T, stat *atomic.Pointer[string]) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "admin.sock")
	ln, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	t.Cleanup(func() { ln.Close(); <-done })
	go func() {
		defer close(done)
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			func() {
				defer c.Close()
				cmd, err := bufio.NewReader(c).ReadString('\n')
				if err != nil {
					return
				}
				reply := "Name: HAProxy\nVersion: 2.6.12\nPid: 7\nStart_time_sec: 1000\n\n"
				if strings.Contains(cmd, "show stat") {
					reply = *stat.Load()
				}
				c.Write([]byte("\n" + reply))
			}()
		}
	}()
	return "unix:" + path
}

// zeroed is a `show stat` CSV with every server row's numbers at 0: the
// moment before the capture's traffic.
func zeroed(csv string) string {
	lines := strings.Split(csv, "\n")
	for i, l := range lines[1:] {
		f := strings.Split(l, ",")
		if len(f) < 3 || f[1] == "FRONTEND" || f[1] == "BACKEND" {
			continue
		}
		for j := 2; j < len(f); j++ {
			if _, err := strconv.ParseInt(f[j], 10, 64); err == nil {
				f[j] = "0"
			}
		}
		lines[i+1] = strings.Join(f, ",")
	}
	return strings.Join(lines, "\n")
}

// column reads one column of app/srv1's row.
func column(t *testing.T, csv, name string) uint64 {
	t.Helper()
	lines := strings.Split(csv, "\n")
	header := strings.Split(strings.TrimPrefix(lines[0], "# "), ",")
	for _, l := range lines[1:] {
		if f := strings.Split(l, ","); len(f) > 1 && f[0] == "app" && f[1] == "srv1" {
			for i, h := range header {
				if h == name {
					v, err := strconv.ParseUint(f[i], 10, 64)
					if err != nil {
						t.Fatalf("%s: %v", name, err)
					}
					return v
				}
			}
		}
	}
	t.Fatalf("no %s for app/srv1", name)
	return 0
}

// The captures of real HAProxy 2.6, 3.0 and 3.2 in front of each fault
// kind (from internal/lab/fleet's TestFaultsInHAProxysCounters), read
// through a runtime socket: each failure of srv1 reaches its window once,
// in its class, whichever columns HAProxy counted it in, and however many
// times (2.6 and 3.0 count a reset twice in eresp, 3.2 garbage too; a
// retry-on retry is in wretr and wredis). Before, the stats path read
// only hrsp_* and wretr: a hang, garbage, a reset and a refused
// connection reached no window at all.
func TestStatPollerCountsEveryFailureOnce(t *testing.T) {
	type want = map[window.Fail]uint64
	tests := []struct {
		capture string
		// want reads the failures of each class from the capture.
		want func(c func(string) uint64) want
	}{
		{"500", func(c func(string) uint64) want { return want{window.FailAnswer: c("hrsp_5xx")} }},
		{"hang", func(c func(string) uint64) want { return want{window.FailProxy: c("stot") - c("req_tot")} }},
		{"garbage", func(c func(string) uint64) want { return want{window.FailProxy: c("stot") - c("req_tot")} }},
		{"reset", func(c func(string) uint64) want {
			return want{window.FailAbort: c("srv_abrt"), window.FailProxy: c("stot") - c("req_tot") - c("srv_abrt")}
		}},
		{"reset-close", func(c func(string) uint64) want {
			return want{window.FailAbort: c("srv_abrt"), window.FailProxy: c("stot") - c("req_tot") - c("srv_abrt")}
		}},
		{"refuse", func(c func(string) uint64) want { return want{window.FailRetry: c("wredis")} }},
		{"500-retry-on", func(c func(string) uint64) want { return want{window.FailRetry: c("wretr")} }},
		{"slow", func(c func(string) uint64) want { return want{} }},
	}
	for _, version := range []string{"2.6", "3.0", "3.2"} {
		for _, tt := range tests {
			for _, mode := range []StatMode{StatCounts, StatRetries} {
				t.Run(version+"/"+tt.capture+"/"+string(mode), func(t *testing.T) {
					raw, err := os.ReadFile("../../../haproxy/testdata/show-stat-" + version + "-fault-" + tt.capture + ".csv")
					if err != nil {
						t.Fatal(err)
					}
					csv := string(raw)
					var stat atomic.Pointer[string]
					base := zeroed(csv)
					stat.Store(&base)
					src, err := haproxy.New(runtimeSocket(t, &stat))
					if err != nil {
						t.Fatal(err)
					}
					now := time.Unix(20_000, 0)
					store := window.New(time.Minute, 16, func() time.Time { return now })
					p := &StatPoller{Sources: []StatSource{src}, Sink: store, Mode: mode, Log: zerolog.New(zerolog.NewTestWriter(t)), Now: func() time.Time { return now }}
					if mode == StatRetries {
						p.Unseen = []window.Fail{window.FailRetry, window.FailAbort} // beside the Lua companion or logs
					}
					p.Poll(context.Background())
					now = now.Add(4 * time.Second)
					stat.Store(&csv)
					p.Poll(context.Background())
					var got window.Stats
					for _, st := range store.Snapshot(0) {
						if st.Server == "srv1" {
							got = st
						}
					}
					w := tt.want(func(name string) uint64 { return column(t, csv, name) })
					answers := column(t, csv, "req_tot")
					if mode == StatRetries {
						// The per-response path reports the answers and
						// HAProxy's own 5xx; the stats path the rest.
						answers, w[window.FailAnswer], w[window.FailProxy] = 0, 0, 0
					}
					var failures uint64
					for _, f := range append([]window.Fail{window.FailAnswer}, window.Fails...) {
						if got.Failed(f) != w[f] {
							t.Errorf("%v: %d, want %d (window %+v)", f, got.Failed(f), w[f], got)
						}
						if f != window.FailAnswer {
							failures += w[f]
						}
					}
					if got.Requests != answers+failures {
						t.Errorf("requests %d, want %d answers and %d failures", got.Requests, answers, failures)
					}
				})
			}
		}
	}
}
