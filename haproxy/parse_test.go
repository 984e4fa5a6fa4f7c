package haproxy

import (
	"bufio"
	"context"
	"net"
	"os"
	"strings"
	"sync/atomic"
	"testing"
)

// parseServersState reads a whole reply of `show servers state`, as the
// client reads it from the socket.
func parseServersState(reply string) ([]ServerState, error) {
	return readServersState(context.Background(), bufio.NewReader(strings.NewReader(reply)), DefaultMaxRows)
}

// parseServerStats reads a whole reply of `show stat`, as the client
// reads it from the socket.
func parseServerStats(reply string) ([]ServerStat, error) {
	return readServerStats(context.Background(), bufio.NewReader(strings.NewReader(reply)), DefaultMaxRows)
}

func TestParseServersState(t *testing.T) {
	const header = "# be_id be_name srv_id srv_name srv_addr srv_op_state srv_admin_state srv_uweight srv_iweight srv_time_since_last_change srv_check_status srv_check_result srv_check_health srv_check_state srv_agent_state bk_f_forced_id srv_f_forced_id srv_fqdn srv_port srvrecord srv_use_ssl srv_check_port srv_check_addr srv_agent_addr srv_agent_port\n"
	tests := []struct {
		name, reply, err string
		want             int
	}{
		{"ok", "1\n" + header + "2 app 1 s1 127.0.0.1 2 8 10 10 1 1 0 2 0 0 0 0 - 9 - 0 0 - - 0\n\n", "", 1},
		{"empty backend list", "1\n" + header + "\n", "", 0},
		{"version 2", "2\n" + header, "unsupported format version", 0},
		{"no header", "1\n2 app 1 s1\n", "no header", 0},
		{"short line", "1\n" + header + "2 app 1 s1 127.0.0.1 2 8\n", "fields", 0},
		{"bad number", "1\n" + header + "2 app 1 s1 127.0.0.1 x 8 10 10 1 1 0 2 0 0 0 0 - 9 - 0 0 - - 0\n", "srv_op_state", 0},
		{"missing column", "1\n# be_name srv_name\napp s1\n", "header lacks", 0},
		{"nothing", "", "want a version", 0},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := parseServersState(tc.reply)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("err %v, want %q", err, tc.err)
				}
				return
			}
			if err != nil || len(got) != tc.want {
				t.Fatalf("got %+v, %v", got, err)
			}
		})
	}
}

func TestParseStatByHeader(t *testing.T) {
	// Columns in an unusual order: parsing must follow the header.
	reply := "# svname,pxname,status,slim,algo,\nBACKEND,app,UP,,leastconn,\ns1,app,DRAIN,10,,\n\n"
	stats, err := parseServerStats(reply)
	if err != nil || len(stats) != 1 || stats[0].Backend != "app" || stats[0].Server != "s1" || stats[0].MaxConn != 10 || stats[0].Algo != "leastconn" {
		t.Fatalf("%+v %v", stats, err)
	}
	if _, err := parseServerStats("pxname,svname\n"); err == nil {
		t.Fatal("accepted a reply without header")
	}
	if _, err := parseServerStats("# a,b,c\n1,2\n"); err == nil {
		t.Fatal("accepted a short row")
	}
}

func TestFailureMarker(t *testing.T) {
	tests := []struct {
		reply string
		sev   int
	}{
		{"[3]: No such server.\n", 3}, {"\n", -2}, {"10 (initial 10)\n", -2}, {"[x]: no\n", -2},
	}
	for _, tc := range tests {
		err := failure("cmd", tc.reply)
		ce, _ := err.(*CommandError)
		switch {
		case tc.sev == -2 && err != nil:
			t.Errorf("%q: unexpected error %v", tc.reply, err)
		case tc.sev >= 0 && (ce == nil || ce.Severity != tc.sev):
			t.Errorf("%q: got %v", tc.reply, err)
		}
	}
}

func TestParseInfo(t *testing.T) {
	info, err := parseInfo("Name: HAProxy\nVersion: 2.6.12\nPid: 42\nUptime_sec: 3\nStart_time_sec: 1795995855\nnode: lb1\n\n")
	if err != nil || info.Instance() != "42@1795995855" || info.Version != "2.6.12" || info.Node != "lb1" {
		t.Fatalf("%+v %v", info, err)
	}
	for _, bad := range []string{"", "Pid: x\nStart_time_sec: 1\n", "Pid: 1\n"} {
		if _, err := parseInfo(bad); err == nil {
			t.Errorf("accepted %q", bad)
		}
	}
}

// FuzzParseServersState: the runtime-reply parser never panics.
func FuzzParseServersState(f *testing.F) {
	f.Add("1\n# be_id be_name srv_id srv_name srv_addr srv_op_state srv_admin_state srv_uweight srv_iweight srv_port\n2 app 1 s1 127.0.0.1 2 8 10 10 9\n")
	f.Add("1\n# \n\n")
	f.Fuzz(func(t *testing.T, s string) {
		_, _ = parseServersState(s)
		_, _ = parseServerStats(s)
		_, _ = parseInfo(s)
		_ = failure("cmd", s)
	})
}

// Weights from the socket are bounded to HAProxy's 0..256 as they are
// read: a weight of 2^40 once hung the capacity check's loop.
func TestParseServersStateBoundsNumbers(t *testing.T) {
	const header = "# be_id be_name srv_id srv_name srv_addr srv_op_state srv_admin_state srv_uweight srv_iweight srv_port\n"
	got, err := parseServersState("1\n" + header + "2 app 1 s1 127.0.0.1 2 0 1099511627776 -5 99999\n")
	if err != nil || len(got) != 1 || got[0].Weight != 256 || got[0].Initial != 0 || got[0].Port != 65535 {
		t.Fatalf("%+v %v", got, err)
	}
}

// A reply over MaxReply is refused once, not fetched again.
func TestTooLongReplyIsNotRetried(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	var conns atomic.Int32
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			conns.Add(1)
			go func() {
				defer c.Close()
				_, _ = bufio.NewReader(c).ReadString('\n')
				_, _ = c.Write([]byte("\n" + strings.Repeat("x", 2048)))
			}()
		}
	}()
	c, err := New(ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	c.MaxReply = 1024
	if _, err := c.Run(context.Background(), "show stat"); err == nil || !strings.Contains(err.Error(), "reply too long") {
		t.Fatalf("err %v", err)
	}
	if n := conns.Load(); n != 1 {
		t.Fatalf("%d connections: the long reply was fetched again", n)
	}
}

// TestServerStatsCounters reads a reply HAProxy 2.6 gave behind
// `retry-on 500 502 503 504`, `retries 2`, `option redispatch 1`, after
// 20 requests: srv1 answered only 500s, all retried on srv2, so its
// answers are counted nowhere but in wretr and wredis.
func TestServerStatsCounters(t *testing.T) {
	raw, err := os.ReadFile("testdata/show-stat-2.6-retries.csv")
	if err != nil {
		t.Fatal(err)
	}
	stats, err := parseServerStats(string(raw))
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]StatCounters{}
	for _, s := range stats {
		got[s.Backend+"/"+s.Server] = s.Counters
	}
	if len(got) != 2 {
		t.Fatalf("server rows %v, want app/srv1 and app/srv2 only", got)
	}
	tests := []struct {
		server                       string
		reqTot, ok2xx, wretr, wredis int64
	}{
		{"app/srv1", 0, 0, 20, 20},
		{"app/srv2", 20, 20, 0, 0},
	}
	for _, tt := range tests {
		c := got[tt.server]
		if c.ReqTot != tt.reqTot || c.Hrsp[1] != tt.ok2xx || c.Wretr != tt.wretr || c.Wredis != tt.wredis {
			t.Errorf("%s: req_tot %d 2xx %d wretr %d wredis %d, want %d %d %d %d", tt.server,
				c.ReqTot, c.Hrsp[1], c.Wretr, c.Wredis, tt.reqTot, tt.ok2xx, tt.wretr, tt.wredis)
		}
	}
}

// The failure columns, from the captures of a real HAProxy 2.6 in front
// of each fault kind (internal/lab/fleet TestFaultsInHAProxysCounters):
// srv1's econ, eresp, srv_abrt, stot, wretr and wredis are read.
func TestServerStatsFailureColumns(t *testing.T) {
	tests := []struct {
		capture string
		want    func(c StatCounters) bool
	}{
		{"hang", func(c StatCounters) bool { return c.Eresp > 0 && c.SrvAbrt == 0 && c.Stot-c.ReqTot == c.Eresp }},
		{"reset", func(c StatCounters) bool { return c.Eresp > 0 && c.SrvAbrt == c.Eresp && c.Stot-c.ReqTot == c.Eresp }},
		{"refuse", func(c StatCounters) bool {
			return c.Wredis > 0 && c.Wretr == 0 && c.Econ == 0 && c.Stot-c.ReqTot == c.Wredis
		}},
		{"500-retry-on", func(c StatCounters) bool { return c.Wretr > 0 && c.Wredis == c.Wretr && c.Stot-c.ReqTot == c.Wretr }},
	}
	for _, tt := range tests {
		raw, err := os.ReadFile("testdata/show-stat-2.6-fault-" + tt.capture + ".csv")
		if err != nil {
			t.Fatal(err)
		}
		stats, err := parseServerStats(string(raw))
		if err != nil {
			t.Fatal(err)
		}
		for _, s := range stats {
			if s.Server == "srv1" && !tt.want(s.Counters) {
				t.Errorf("%s: srv1 %+v", tt.capture, s.Counters)
			}
		}
	}
}

// The kinds of server a real HAProxy 2.6 reports (testdata: its `show
// stat` of a config with a backup server, an agent-check and every
// balance algorithm): bck, agent_rise set, and each server given its
// backend's algo from the BACKEND row.
func TestServerStatsKinds(t *testing.T) {
	raw, err := os.ReadFile("testdata/show-stat-2.6-kinds.csv")
	if err != nil {
		t.Fatal(err)
	}
	streamed, err := readServerStats(context.Background(), bufio.NewReader(strings.NewReader(string(raw))), DefaultMaxRows)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]struct {
		backup, agent, hashed, tcp bool
		algo                       string
	}{
		"b_rr/s1": {algo: "roundrobin"}, "b_rr/s2": {backup: true, algo: "roundrobin"},
		"b_uri/s1": {hashed: true, algo: "uri"}, "b_src/s1": {hashed: true, algo: "source"},
		"b_hdr/s1": {agent: true, hashed: true, algo: "hdr"}, "b_hash/s1": {hashed: true, algo: "hash"},
		"b_urlp/s1": {hashed: true, algo: "url_param"}, "b_rdp/s1": {hashed: true, tcp: true, algo: "rdp-cookie"},
		"b_lc/s1": {algo: "leastconn"}, "b_rand/s1": {algo: "unknown"}, "b_first/s1": {algo: "first"},
	}
	for name, stats := range map[string][]ServerStat{"streamed": streamed} {
		if len(stats) != len(want) {
			t.Errorf("%s: %d servers, want %d", name, len(stats), len(want))
		}
		for _, s := range stats {
			w, ok := want[s.Backend+"/"+s.Server]
			if !ok || s.Backup != w.backup || s.AgentCheck != w.agent || s.Hashed() != w.hashed || s.TCP != w.tcp || s.Algo != w.algo {
				t.Errorf("%s: %s/%s backup %v agent %v hashed %v algo %q, want %+v", name, s.Backend, s.Server, s.Backup, s.AgentCheck, s.Hashed(), s.Algo, w)
			}
		}
	}
}
