package logs

import (
	"context"
	"fmt"
	"io"
	"net"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hapilot/hapilot/internal/lib/netx"
	"github.com/hapilot/hapilot/internal/lib/window"
	"github.com/rs/zerolog"
)

type recorder struct {
	mu     sync.Mutex
	events []string
}

func (r *recorder) Record(ev window.Event) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.events = append(r.events, show(ev))
}

// show prints an event as the tests expect it: "backend/server status tr",
// then " xN" when it stands for N > 1 responses.
func show(ev window.Event) string {
	s := fmt.Sprintf("%s/%s %d %d", ev.Backend, ev.Server, ev.Status, ev.ResponseMs)
	if ev.Count > 1 {
		s += fmt.Sprintf(" x%d", ev.Count)
	}
	return s
}

func (r *recorder) list() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.events...)
}

func TestParseLogLine(t *testing.T) {
	tests := []struct {
		line, want string
		err        bool
	}{
		{"<134>Nov 30 00:00:00 haproxy[123]: hapilot app srv1 200 12", "app/srv1 200 12", false},
		{"<134>1 2026-11-30T00:00:00Z host haproxy 123 - - hapilot app srv2 503 -1", "app/srv2 503 -1", false},
		{"hapilot app srv1 500 7", "app/srv1 500 7", false},
		{"<134>Nov 30 00:00:00 haproxy[123]: 127.0.0.1:5000 GET /", "", true},
		{"hapilot app srv1 OK 7", "", true},
		{"hapilot app srv1 200", "", true},
		{"hapilot app srv1 200 12 extra", "", true},
		{"hapilot app srv1 42 12", "", true},
		{"hapilot app srv1 200 12 3", "app/srv1 200 12 x3", false},
		{"hapilot app srv1 200 12 1", "app/srv1 200 12", false},
		{"hapilot app srv1 200 12 0", "", true},
		{"hapilot app srv1 200 12 -2", "", true},
		{"hapilot app srv1 200 12 1048577", "", true}, // over window.MaxCount
		{"hapilot app srv1 200 12 3 4", "", true},
	}
	for _, tc := range tests {
		ev, err := ParseLogLine([]byte(tc.line))
		if (err != nil) != tc.err {
			t.Errorf("%q: err %v", tc.line, err)
			continue
		}
		if got := show(ev); !tc.err && got != tc.want {
			t.Errorf("%q: %s, want %s", tc.line, got, tc.want)
		}
	}
}

func TestLineServer(t *testing.T) {
	rec := &recorder{}
	s := &LineServer{Sink: rec, Log: zerolog.Nop(), MaxLine: 64}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Serve(ctx, ln) }()
	send := func(payload string) {
		c, err := net.Dial("tcp", ln.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		c.Write([]byte(payload))
		c.Close()
	}
	send("app srv1 200 12\napp srv2 500 3\napp srv4 200 2 40\n") // the last line stands for 40 responses
	send("garbage\napp - 503 -1\napp srv3 200 " + string(make([]byte, 100)) + "\napp srv1 404 1\napp srv1 500 1 0\napp <NOSRV> 503 -1 5\n")
	send("app srv1 200 5") // no final newline: cut short
	deadline := time.Now().Add(5 * time.Second)
	for s.Counters.Batches.Load() < 3 || len(rec.list())+int(s.Counters.Errors.Load()+s.Counters.NoServer.Load()) < 14 {
		if time.Now().After(deadline) {
			t.Fatalf("counters: batches %d events %d errors %d", s.Counters.Batches.Load(), s.Counters.Events.Load(), s.Counters.Errors.Load())
		}
		time.Sleep(5 * time.Millisecond)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	got := rec.list()
	sort.Strings(got) // connections are served concurrently
	if strings.Join(got, ",") != "app/srv1 200 12,app/srv1 404 1,app/srv2 500 3,app/srv4 200 2 x40" {
		t.Fatalf("events %v", got)
	}
	if s.Counters.Events.Load() != 43 {
		t.Fatalf("events counted %d, want 43 (3 lines of one response, 1 of 40)", s.Counters.Events.Load())
	}
	if s.Counters.Errors.Load() != 4 || s.Counters.NoServer.Load() != 6 {
		t.Fatalf("errors %d (garbage, long line, count 0, cut line), no server %d (1, and a line of 5)", s.Counters.Errors.Load(), s.Counters.NoServer.Load())
	}
}

func TestSyslogServer(t *testing.T) {
	for _, addr := range []string{"udp://127.0.0.1:0", "unixgram://" + filepath.Join(t.TempDir(), "log.sock")} {
		t.Run(addr, func(t *testing.T) {
			rec := &recorder{}
			s := &SyslogServer{Sink: rec, Log: zerolog.Nop()}
			a, err := netx.ParseAddress("syslog-listen", addr, netx.UDP, netx.Unixgram)
			if err != nil {
				t.Fatal(err)
			}
			pc, err := netx.ListenPacketAddress(a)
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan error, 1)
			go func() { done <- s.Serve(ctx, pc) }()
			c, err := net.Dial(pc.LocalAddr().Network(), pc.LocalAddr().String())
			if err != nil {
				t.Fatal(err)
			}
			for _, m := range []string{"<134>Nov 30 00:00:00 haproxy[1]: hapilot app srv1 500 9", "not ours", "<134>Nov 30 00:00:00 haproxy[1]: hapilot app <NOSRV> 503 -1"} {
				c.Write([]byte(m))
			}
			c.Close()
			deadline := time.Now().Add(5 * time.Second)
			for s.Counters.Batches.Load() < 3 {
				if time.Now().After(deadline) {
					t.Fatalf("datagrams %d", s.Counters.Batches.Load())
				}
				time.Sleep(5 * time.Millisecond)
			}
			cancel()
			if err := <-done; err != nil {
				t.Fatal(err)
			}
			if got := rec.list(); len(got) != 1 || got[0] != "app/srv1 500 9" || s.Counters.Errors.Load() != 1 || s.Counters.NoServer.Load() != 1 {
				t.Fatalf("events %v, errors %d, no server %d", got, s.Counters.Errors.Load(), s.Counters.NoServer.Load())
			}
		})
	}
	if _, err := netx.ListenPacketAddress(netx.Address{Network: netx.TCP, Addr: "x:1"}); err == nil {
		t.Fatal("a datagram listener accepted tcp://")
	}
}

// oc frames msg as RFC 6587 octet counting.
func oc(msg string) string { return fmt.Sprintf("%d %s", len(msg), msg) }

// The TCP stream an HAProxy ring forwards: octet-counted frames (what
// log-proto octet-count sends) and LF-ended lines; a broken count drops
// the connection, counted, and the next connection is served.
func TestSyslogStream(t *testing.T) {
	tests := []struct {
		name   string
		stream string
		events []string
		errors uint64
	}{
		{"octet-counted", oc("hapilot app srv1 500 9") + oc("<134>1 - - - hapilot app srv2 200 12"), []string{"app/srv1 500 9", "app/srv2 200 12"}, 0},
		{"frame split across writes", oc("hapilot app srv3 200 1")[:5] + "|" + oc("hapilot app srv3 200 1")[5:] + oc("hapilot app srv3 503 7")[:1] + "|" + oc("hapilot app srv3 503 7")[1:],
			[]string{"app/srv3 200 1", "app/srv3 503 7"}, 0},
		{"LF-ended lines", "hapilot app srv1 200 3\nnot ours\nhapilot app <NOSRV> 503 -1\n", []string{"app/srv1 200 3"}, 1},
		{"count too large", "99999999 hapilot", nil, 1},
		{"count not a number", "12x4 hapilot app srv1 200 3", nil, 1},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			rec := &recorder{}
			s := &SyslogServer{Sink: rec, Log: zerolog.Nop()}
			ln, err := netx.ListenAddress(netx.Address{Network: netx.TCP, Addr: "127.0.0.1:0"})
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan error, 1)
			go func() { done <- s.ServeStream(ctx, ln) }()
			c, err := net.Dial("tcp", ln.Addr().String())
			if err != nil {
				t.Fatal(err)
			}
			for _, part := range strings.Split(tc.stream, "|") {
				c.Write([]byte(part))
				time.Sleep(10 * time.Millisecond)
			}
			c.Close()
			// A second connection still works.
			c2, err := net.Dial("tcp", ln.Addr().String())
			if err != nil {
				t.Fatal(err)
			}
			c2.Write([]byte(oc("hapilot app srv9 200 5")))
			c2.Close()
			want := append(append([]string(nil), tc.events...), "app/srv9 200 5")
			deadline := time.Now().Add(5 * time.Second)
			for len(rec.list()) < len(want) && time.Now().Before(deadline) {
				time.Sleep(5 * time.Millisecond)
			}
			cancel()
			if err := <-done; err != nil {
				t.Fatal(err)
			}
			got := rec.list()
			sort.Strings(got)
			sort.Strings(want)
			if strings.Join(got, ";") != strings.Join(want, ";") || s.Counters.Errors.Load() != tc.errors {
				t.Fatalf("events %v (want %v), errors %d (want %d)", got, want, s.Counters.Errors.Load(), tc.errors)
			}
		})
	}
	if _, err := netx.ListenAddress(netx.Address{Network: netx.UDP, Addr: "127.0.0.1:0"}); err == nil {
		t.Fatal("a stream listener accepted udp://")
	}
}

// A stream that begins a frame and stops is closed by the agent: 5,000
// half-sent 60 KB frames once held 600 MB.
func TestHalfSentFrameIsClosed(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := &SyslogServer{Sink: window.New(time.Minute, 16, nil), Log: zerolog.Nop(), FrameTimeout: 100 * time.Millisecond}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.ServeStream(ctx, ln) }()
	defer func() { cancel(); <-done }()
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := c.Write([]byte("60000 <134>hapilot app s1 200 5")); err != nil {
		t.Fatal(err)
	}
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := io.ReadAll(c); err != nil {
		t.Fatalf("the half-sent frame's connection was not closed by the agent: %v", err)
	}
}
