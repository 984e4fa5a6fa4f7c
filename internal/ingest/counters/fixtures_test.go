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

// The captures of real HAProxy 2.6 in front of each fault kind (from
// internal/lab/fleet's TestFaultsInHAProxysCounters), read through a
// runtime socket: each failure of srv1 reaches its window once, in its
// class, whichever columns HAProxy counted it in. Before, the stats path
// read only hrsp_* and wretr: a hang, garbage, a reset and a refused
// connection reached no window at all.
func TestStatPollerCountsEveryFailureOnce(t *testing.T) {
	col := func(name string) func(t *testing.T, csv string) uint64 {
		return func(t *testing.T, csv string) uint64 { return column(t, csv, name) }
	}
	unanswered := func(t *testing.T, csv string) uint64 { return column(t, csv, "stot") - column(t, csv, "req_tot") }
	tests := []struct {
		capture string
		// class is where srv1's failures belong; n reads how many from the
		// capture (its own count of them).
		class window.Fail
		n     func(t *testing.T, csv string) uint64
		// seen: the class is one a per-response path reports, so that
		// the retries mode leaves it out beside one (Unseen).
		seen bool
	}{
		{"500", window.FailAnswer, col("hrsp_5xx"), true},
		{"hang", window.FailProxy, col("eresp"), true},
		{"garbage", window.FailProxy, col("eresp"), true},
		{"reset", window.FailAbort, col("srv_abrt"), false},
		// eresp holds each reset twice here: the unanswered attempts bound it.
		{"reset-close", window.FailProxy, unanswered, true},
		{"refuse", window.FailRetry, col("wredis"), false},
		// wretr and wredis both hold each retried 500.
		{"500-retry-on", window.FailRetry, col("wretr"), false},
		{"slow", window.FailAnswer, col("hrsp_5xx"), true},
	}
	for _, tt := range tests {
		for _, mode := range []StatMode{StatCounts, StatRetries} {
			t.Run(tt.capture+"/"+string(mode), func(t *testing.T) {
				raw, err := os.ReadFile("../../../haproxy/testdata/show-stat-2.6-fault-" + tt.capture + ".csv")
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
				want := tt.n(t, csv)
				if mode == StatRetries && tt.seen {
					want = 0 // the per-response path reports it
				}
				answers := column(t, csv, "req_tot")
				if mode == StatRetries {
					answers = 0
				}
				for _, f := range append([]window.Fail{window.FailAnswer}, window.Fails...) {
					w := uint64(0)
					if f == tt.class {
						w = want
					}
					if got.Failed(f) != w {
						t.Errorf("%v: %d, want %d (window %+v)", f, got.Failed(f), w, got)
					}
				}
				if tt.class != window.FailAnswer && got.Requests != answers+want {
					t.Errorf("requests %d, want %d answers and %d failures", got.Requests, answers, want)
				}
			})
		}
	}
}
