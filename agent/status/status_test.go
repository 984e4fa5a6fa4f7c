package status

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/hapilot/hapilot/agent"
	"github.com/hapilot/hapilot/agent/guard"
	"github.com/hapilot/hapilot/agent/ledger"
	"github.com/hapilot/hapilot/agent/loop"
	"github.com/hapilot/hapilot/internal/lab/fakes"
	"github.com/hapilot/hapilot/internal/lib/netx"
	"github.com/hapilot/hapilot/internal/lib/promtext"
	"github.com/rs/zerolog"
	"github.com/valyala/fasthttp"
)

// drainOnce proposes draining one server.
type drainOnce struct{ server string }

func (drainOnce) Name() string { return "drain-once" }

func (d drainOnce) Decide(context.Context, agent.Observation) (agent.Plan, error) {
	return agent.Plan{{Kind: agent.Drain, Backend: "app", Server: d.server}}, nil
}

func TestStatusAndMetricsEndpoints(t *testing.T) {
	rt := fakes.NewRuntime("s1", "s2", "s3")
	l := &loop.Loop{Clock: fakes.NewClock(time.Unix(1000, 0)), Settings: agent.Settings{Interval: time.Second}, Policy: agent.PolicyOf(drainOnce{"s2"}),
		Guard: guard.DefaultGuardrails(), Runtimes: []agent.Runtime{rt}, Windows: fakes.NewWindows(), Log: zerolog.Nop()}
	l.Step(context.Background())
	s := &Server{Loop: l, Extra: []func(io.Writer){func(w io.Writer) { promtext.Counter(w, "hapilot_extra_total", "x", 7) }}}
	do := func(method, path string) (int, string) {
		var ctx fasthttp.RequestCtx
		ctx.Request.Header.SetMethod(method)
		ctx.Request.SetRequestURI(path)
		s.Handler(&ctx)
		return ctx.Response.StatusCode(), string(ctx.Response.Body())
	}
	code, body := do("GET", "/status")
	var st loop.Status
	if code != 200 || json.Unmarshal([]byte(body), &st) != nil || st.Cycle != 1 || len(st.Backends) != 1 || len(st.Decisions) != 1 || st.Changes[agent.Key{Backend: "app", Server: "s2"}].Phase != agent.PhaseDrained {
		t.Fatalf("status %d %s", code, body)
	}
	code, body = do("GET", "/metrics")
	for _, m := range []string{"hapilot_cycles_total 1", "hapilot_actions_applied_total 1", "hapilot_actions_refused_total 0", "hapilot_cycle_duration_seconds_count 1", "hapilot_extra_total 7"} {
		if code != 200 || !strings.Contains(body, m+"\n") {
			t.Fatalf("metrics lack %q:\n%s", m, body)
		}
	}
	for _, m := range []string{`hapilot_mode{mode="enforce"} 1`, `hapilot_mode{mode="observe"} 0`,
		`hapilot_held{backend="app",server="s2",phase="drained"} 1`, `hapilot_would_actions_total{kind="drain"} 0`,
		`hapilot_step_duration_seconds_bucket{le="+Inf"} 1`, "hapilot_last_step_success_timestamp_seconds 1000"} {
		if !strings.Contains(body, m+"\n") {
			t.Fatalf("metrics lack %q:\n%s", m, body)
		}
	}
	if code, _ := do("POST", "/status"); code != fasthttp.StatusMethodNotAllowed {
		t.Fatalf("POST answered %d", code)
	}
	if code, _ := do("GET", "/admin"); code != 404 {
		t.Fatalf("unknown path answered %d", code)
	}
}

// The server answers a request with a big body without reading it: the
// status endpoints are read-only, and 500 POSTs of 4 MB once took the agent
// to 1.8 GB.
func TestBigBodiesAreNotRead(t *testing.T) {
	rt := fakes.NewRuntime("s1", "s2")
	l := &loop.Loop{Clock: fakes.NewClock(time.Unix(1000, 0)), Settings: agent.Settings{Interval: time.Second}, Policy: agent.PolicyOf(drainOnce{"s2"}),
		Guard: guard.DefaultGuardrails(), Runtimes: []agent.Runtime{rt}, Windows: fakes.NewWindows(), Log: zerolog.Nop()}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- (&Server{Loop: l}).Serve(ctx, ln) }()
	defer func() { cancel(); <-done }()
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	fmt.Fprintf(c, "POST /status HTTP/1.1\r\nHost: x\r\nContent-Length: 4000000\r\n\r\n0123456789")
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	reply, err := bufio.NewReader(c).ReadString('\n')
	if err != nil || !strings.Contains(reply, " 4") {
		t.Fatalf("reply %q, %v: the server waited for the body", reply, err)
	}
}

// The live page is served whole from the binary; with a token, every
// endpoint asks for it, by header or by query.
func TestPageSeriesAndToken(t *testing.T) {
	rt := fakes.NewRuntime("s1", "s2", "s3")
	l := &loop.Loop{Clock: fakes.NewClock(time.Unix(1000, 0)), Settings: agent.Settings{Interval: time.Second}, Policy: agent.PolicyOf(drainOnce{"s2"}),
		Guard: guard.DefaultGuardrails(), Runtimes: []agent.Runtime{rt}, Windows: fakes.NewWindows(), Log: zerolog.Nop()}
	l.Step(context.Background())
	s := &Server{Loop: l, Series: func(n int) any { return []int{n} }, Ingest: func() map[string]uint64 { return map[string]uint64{"events": 3} }}
	do := func(path, auth string) (int, string, *fasthttp.ResponseHeader) {
		var ctx fasthttp.RequestCtx
		ctx.Request.Header.SetMethod("GET")
		ctx.Request.SetRequestURI(path)
		if auth != "" {
			ctx.Request.Header.Set("Authorization", auth)
		}
		s.Handler(&ctx)
		return ctx.Response.StatusCode(), string(ctx.Response.Body()), &ctx.Response.Header
	}
	code, body, h := do("/", "")
	if code != 200 || !strings.Contains(body, "<title>hapilot</title>") || !strings.Contains(string(h.Peek("Content-Security-Policy")), "default-src 'self'") {
		t.Fatalf("page %d %.80s", code, body)
	}
	// No asset from elsewhere: the page works offline. (The SVG namespace
	// is a name, not a fetch.)
	rest := strings.ReplaceAll(body, "http://www.w3.org/2000/svg", "")
	for _, ref := range []string{"http://", "https://", "src=", "<link rel=\"stylesheet"} {
		if strings.Contains(rest, ref) {
			t.Errorf("page refers to %q", ref)
		}
	}
	if code, body, _ := do("/series", ""); code != 200 || strings.TrimSpace(body) != "[60]" {
		t.Fatalf("series %d %s", code, body)
	}
	if code, body, _ := do("/status", ""); code != 200 || !strings.Contains(body, `"events": 3`) || !strings.Contains(body, `"candidates": []`) {
		t.Fatalf("status %d %s", code, body)
	}
	s.Token = "s3cret"
	for _, path := range []string{"/", "/status", "/series", "/metrics"} {
		if code, _, _ := do(path, ""); code != fasthttp.StatusUnauthorized {
			t.Errorf("%s without the token: %d", path, code)
		}
		if code, _, _ := do(path, "Bearer wrong"); code != fasthttp.StatusUnauthorized {
			t.Errorf("%s with a wrong token: %d", path, code)
		}
		if code, _, _ := do(path, "Bearer s3cret"); code != 200 {
			t.Errorf("%s with the token: %d", path, code)
		}
		if code, _, _ := do(path+"?token=s3cret", ""); code != 200 {
			t.Errorf("%s?token=: %d", path, code)
		}
	}
}

// In fleet mode, /status carries the fleet's state under "fleet".
func TestStatusShowsTheFleet(t *testing.T) {
	rt := fakes.NewRuntime("s1")
	l := &loop.Loop{Clock: fakes.NewClock(time.Unix(1000, 0)), Settings: agent.Settings{Interval: time.Second}, Policy: agent.PolicyOf(drainOnce{"s1"}),
		Guard: guard.DefaultGuardrails(), Runtimes: []agent.Runtime{rt}, Windows: fakes.NewWindows(), Log: zerolog.Nop()}
	for _, tc := range []struct {
		name  string
		fleet func() any
		want  bool
	}{
		{"fleet off", nil, false},
		{"fleet on", func() any { return map[string]any{"name": "edge-1", "alone": true} }, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := &Server{Loop: l, Fleet: tc.fleet}
			var ctx fasthttp.RequestCtx
			ctx.Request.Header.SetMethod("GET")
			ctx.Request.SetRequestURI("/status")
			s.Handler(&ctx)
			var st struct {
				Fleet map[string]any `json:"fleet"`
			}
			if err := json.Unmarshal(ctx.Response.Body(), &st); err != nil {
				t.Fatal(err)
			}
			if got := st.Fleet != nil; got != tc.want || (tc.want && st.Fleet["name"] != "edge-1") {
				t.Fatalf("fleet %v, want present %v", st.Fleet, tc.want)
			}
		})
	}
}

// While the state file cannot be written (here its folder does not
// exist), /status says it is unsaved and since when, and /metrics counts
// it.
func TestUnsavedStateShown(t *testing.T) {
	rt := fakes.NewRuntime("s1", "s2", "s3")
	l := &loop.Loop{Clock: fakes.NewClock(time.Unix(1000, 0)), Settings: agent.Settings{Interval: time.Second, StateFile: t.TempDir() + "/gone/state.json"},
		Policy: agent.PolicyOf(drainOnce{"s2"}), Guard: guard.DefaultGuardrails(), Runtimes: []agent.Runtime{rt}, Windows: fakes.NewWindows(), Log: zerolog.Nop()}
	l.Step(context.Background())
	s := &Server{Loop: l}
	get := func(path string) string {
		var ctx fasthttp.RequestCtx
		ctx.Request.Header.SetMethod("GET")
		ctx.Request.SetRequestURI(path)
		s.Handler(&ctx)
		return string(ctx.Response.Body())
	}
	var st struct {
		StateFile *ledger.SaveStatus `json:"state_file"`
	}
	if err := json.Unmarshal([]byte(get("/status")), &st); err != nil || st.StateFile == nil || st.StateFile.Saved ||
		!st.StateFile.UnsavedSince.Equal(time.Unix(1000, 0)) || !strings.Contains(st.StateFile.Error, "no such file") {
		t.Fatalf("status state_file %+v, %v", st.StateFile, err)
	}
	m := get("/metrics")
	for _, want := range []string{"hapilot_state_unsaved 1\n", "hapilot_state_failed_writes_total 1\n"} {
		if !strings.Contains(m, want) {
			t.Fatalf("metrics lack %q:\n%s", want, m)
		}
	}
}

// serveCapped runs s behind a listener capped as the daemon caps it, and
// returns its address.
func serveCapped(t *testing.T, s *Server, max int, life time.Duration) string {
	t.Helper()
	addr, _ := serveCappedLn(t, s, max, life)
	return addr
}

// serveCappedLn is serveCapped with the capped listener, whose counts a
// test waits on.
func serveCappedLn(t *testing.T, s *Server, max int, life time.Duration) (string, *netx.Listener) {
	t.Helper()
	raw, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ln := netx.Limit(raw, max, zerolog.Nop())
	ln.MaxLife = life
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Serve(ctx, ln) }()
	t.Cleanup(func() { cancel(); <-done })
	return raw.Addr().String(), ln
}

// get sends one GET on c and reads the reply's status line.
func get(c net.Conn, r *bufio.Reader, path, token string) (string, error) {
	auth := ""
	if token != "" {
		auth = "Authorization: Bearer " + token + "\r\n"
	}
	if _, err := fmt.Fprintf(c, "GET %s HTTP/1.1\r\nHost: x\r\n%s\r\n", path, auth); err != nil {
		return "", err
	}
	_ = c.SetReadDeadline(time.Now().Add(2 * time.Second))
	var resp fasthttp.Response
	if err := resp.Read(r); err != nil {
		return "", err
	}
	return fmt.Sprint(resp.StatusCode()), nil
}

func testLoop() *loop.Loop {
	return &loop.Loop{Clock: fakes.NewClock(time.Unix(1000, 0)), Settings: agent.Settings{Interval: time.Second}, Policy: agent.PolicyOf(drainOnce{"s1"}),
		Guard: guard.DefaultGuardrails(), Runtimes: []agent.Runtime{fakes.NewRuntime("s1")}, Windows: fakes.NewWindows(), Log: zerolog.Nop()}
}

// A scraper with the token is answered at once while every place of the
// listener is held by connections without it: ones that took a 401 and
// stayed open (keep-alive, renewed by each request), or ones that never
// finished a request. The 401 closes its connection, and at the cap the
// connection that never proved itself is evicted.
func TestScraperAnsweredWhileConnectionsAreHeld(t *testing.T) {
	const max = 64
	for _, tc := range []struct {
		name string
		hold func(c net.Conn, r *bufio.Reader) error
	}{
		{"after a 401 each", func(c net.Conn, r *bufio.Reader) error {
			code, err := get(c, r, "/status", "")
			if err == nil && code != "401" {
				err = fmt.Errorf("answered %s without the token", code)
			}
			return err
		}},
		{"half a request each", func(c net.Conn, _ *bufio.Reader) error {
			_, err := fmt.Fprintf(c, "GET /status HTTP/1.1\r\nHost:")
			return err
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			addr := serveCapped(t, &Server{Loop: testLoop(), Token: "s3cret"}, max, MaxConnLife)
			for i := 0; i < max; i++ {
				c, err := net.Dial("tcp", addr)
				if err != nil {
					t.Fatal(err)
				}
				defer c.Close()
				if err := tc.hold(c, bufio.NewReader(c)); err != nil {
					t.Fatal(err)
				}
			}
			c, err := net.Dial("tcp", addr)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			start := time.Now()
			if code, err := get(c, bufio.NewReader(c), "/metrics", "s3cret"); err != nil || code != "200" {
				t.Fatalf("the scraper got %q %v after %v, with %d connections held %s", code, err, time.Since(start), max, tc.name)
			}
		})
	}
}

// A scraper's connection, once its token has been seen, keeps its place
// while strangers fill the listener: they evict one another.
func TestScraperKeepsItsConnectionUnderAFlood(t *testing.T) {
	const max = 8
	addr, ln := serveCappedLn(t, &Server{Loop: testLoop(), Token: "s3cret"}, max, MaxConnLife)
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	r := bufio.NewReader(c)
	if code, err := get(c, r, "/metrics", "s3cret"); err != nil || code != "200" {
		t.Fatalf("first scrape: %q %v", code, err)
	}
	for i := 0; i < 4*max; i++ {
		s, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
	}
	// Every stranger accepted: each one past the cap evicted another (or
	// the scraper, which the next request would find).
	accepted := uint64(4*max + 1) // the strangers and the scraper
	for deadline := time.Now().Add(5 * time.Second); ln.Evicted.Load() < accepted-uint64(max); time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%d evictions after 5 s: the strangers were not all accepted", ln.Evicted.Load())
		}
	}
	if code, err := get(c, r, "/metrics", "s3cret"); err != nil || code != "200" {
		t.Fatalf("the scraper's connection was evicted by strangers: %q %v", code, err)
	}
}

// A connection's whole life is bounded: requests that keep renewing the
// idle timeout do not keep it open past its life.
func TestConnectionLifeIsBounded(t *testing.T) {
	addr := serveCapped(t, &Server{Loop: testLoop()}, 8, 300*time.Millisecond)
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	r := bufio.NewReader(c)
	start := time.Now()
	for time.Since(start) < 3*time.Second {
		if _, err := get(c, r, "/metrics", ""); err != nil {
			return // closed by the agent, past its life
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatal("a connection making a request every 50 ms was still open after 3 s (life 300ms)")
}

// In observe mode and while paused, /metrics says so, counts the
// would-actions by kind and the refusals by code.
func TestObserveAndPauseMetrics(t *testing.T) {
	rt := fakes.NewRuntime("s1", "s2", "s3")
	l := &loop.Loop{Clock: fakes.NewClock(time.Unix(1000, 0)), Settings: agent.Settings{Interval: time.Second, Mode: agent.ModeObserve},
		Policy: agent.PolicyOf(drainOnce{"s2"}), Guard: guard.DefaultGuardrails(), Runtimes: []agent.Runtime{rt}, Windows: fakes.NewWindows(), Log: zerolog.Nop()}
	if _, err := l.Control().Pause(context.Background(), "app", time.Minute, "test"); err != nil {
		t.Fatal(err)
	}
	l.Step(context.Background())
	var b strings.Builder
	WriteLoopMetrics(&b, l)
	for _, m := range []string{`hapilot_mode{mode="observe"} 1`, `hapilot_paused{backend="app"} 1`, `hapilot_would_actions_total{kind="drain"} 1`,
		`hapilot_would_action{backend="app",server="s2",kind="drain"} 1`, "hapilot_actions_applied_total 0"} {
		if !strings.Contains(b.String(), m+"\n") {
			t.Fatalf("metrics lack %q:\n%s", m, b.String())
		}
	}
	if strings.Contains(b.String(), "hapilot_held{") {
		t.Fatalf("observe mode holds a server:\n%s", b.String())
	}
}
