package fakesocket

import (
	"context"
	"errors"
	"fmt"
	"math"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/hapilot/hapilot/haproxy"
	"github.com/hapilot/hapilot/internal/lab/haproxyproc"
	"github.com/hapilot/hapilot/internal/lab/labtest"
)

func start(t *testing.T, cfg Config) (*Server, *haproxy.Client) {
	t.Helper()
	f, err := Start(filepath.Join(t.TempDir(), "admin.sock"), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	c, err := haproxy.New("unix:" + f.Path())
	if err != nil {
		t.Fatal(err)
	}
	return f, c
}

func ctx(t *testing.T) context.Context {
	c, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return c
}

// waitFor polls cond until it holds, or fails t after a minute: the
// simulation's ticks are the clock's, so a busy machine only slows it.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for end := time.Now().Add(time.Minute); !cond(); time.Sleep(20 * time.Millisecond) {
		if time.Now().After(end) {
			t.Fatalf("timed out waiting for %s", what)
		}
	}
}

func stats(t *testing.T, c *haproxy.Client) map[string]haproxy.ServerStat {
	t.Helper()
	cx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	rows, err := c.ServerStats(cx)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]haproxy.ServerStat{}
	for _, r := range rows {
		out[r.Backend+"/"+r.Server] = r
	}
	return out
}

func states(t *testing.T, c *haproxy.Client) map[string]haproxy.ServerState {
	t.Helper()
	cx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	rows, err := c.ShowServersState(cx)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]haproxy.ServerState{}
	for _, r := range rows {
		out[r.Backend+"/"+r.Server] = r
	}
	return out
}

// The agent's own client reads every reply: the level, show info, show
// stat and show servers state; its set commands take effect, a drained or
// weight-0 server gets no new traffic, and every command is recorded.
func TestAgentClientReadsEveryReply(t *testing.T) {
	f, c := start(t, Config{Backends: 2, Servers: 3, Rate: 200, Median: 0.002, Sigma: 0.3, Seed: 7,
		Fault: &Fault{Rate: 1, From: 0}, Tick: 20 * time.Millisecond})
	if err := c.Preflight(ctx(t)); err != nil {
		t.Fatalf("preflight: %v", err)
	}
	info, err := c.ShowInfo(ctx(t))
	if err != nil {
		t.Fatal(err)
	}
	if v, ok := haproxy.ParseVersion(info.Version); !ok || v != (haproxy.Version{Major: 2, Minor: 6}) || info.Pid == 0 || info.StartTime != f.start.Unix() {
		t.Fatalf("show info: %+v", info)
	}

	st := states(t, c)
	if len(st) != 6 {
		t.Fatalf("show servers state: %d servers, want 6: %+v", len(st), st)
	}
	for k, s := range st {
		if !s.Serving() || s.Weight != 10 || s.Initial != 10 || s.Addr != "127.0.0.1" || s.Port != 9 {
			t.Errorf("%s: %+v", k, s)
		}
	}

	// Every server answers; the faulty one (rate 1) fails every request,
	// the healthy ones few; each row's counters add up as HAProxy's do.
	waitFor(t, "every server's traffic", func() bool {
		for _, s := range stats(t, c) {
			if s.Counters.ReqTot < 200 {
				return false
			}
		}
		return true
	})
	truth := map[string]Truth{}
	for _, tr := range f.Truths() {
		truth[tr.Backend+"/"+tr.Server] = tr
	}
	rows := stats(t, c)
	if len(rows) != 6 {
		t.Fatalf("show stat: %d server rows, want 6", len(rows))
	}
	for k, s := range rows {
		cn := s.Counters
		if s.Algo != "roundrobin" || s.TCP || s.Backup || cn.Stot != cn.ReqTot || cn.Hrsp[1]+cn.Hrsp[4] != cn.ReqTot || s.RespTimeMs != 9 {
			t.Errorf("%s: %+v", k, s)
		}
		if truth[k].Faulty != (cn.Hrsp[4] == cn.ReqTot) {
			t.Errorf("%s: faulty %v, %d of %d failed", k, truth[k].Faulty, cn.Hrsp[4], cn.ReqTot)
		}
	}

	// A drain stops the server's traffic while its peers' goes on; ready
	// brings it back. Weight 0 stops it too.
	for _, step := range []struct {
		name string
		set  func() error
		want string
	}{
		{"drain", func() error { return c.SetServerState(ctx(t), "be00", "s0", haproxy.StateDrain) }, "drain"},
		{"maint", func() error { return c.SetServerState(ctx(t), "be00", "s0", haproxy.StateMaint) }, "maint"},
		{"weight 0", func() error {
			if err := c.SetServerState(ctx(t), "be00", "s0", haproxy.StateReady); err != nil {
				return err
			}
			return c.SetWeight(ctx(t), "be00", "s0", 0)
		}, "weight0"},
	} {
		if err := step.set(); err != nil {
			t.Fatalf("%s: %v", step.name, err)
		}
		if got := states(t, c)["be00/s0"].Label(); got != step.want {
			t.Fatalf("%s: state %q, want %q", step.name, got, step.want)
		}
		// Each command and each simulation step hold the fleet's lock:
		// once the command is answered, the server takes nothing more.
		before := stats(t, c)
		waitFor(t, step.name+": peers' traffic", func() bool {
			return stats(t, c)["be00/s1"].Counters.ReqTot > before["be00/s1"].Counters.ReqTot+300
		})
		if got := stats(t, c)["be00/s0"].Counters.ReqTot; got != before["be00/s0"].Counters.ReqTot {
			t.Errorf("%s: be00/s0 took %d requests while out of service", step.name, got-before["be00/s0"].Counters.ReqTot)
		}
	}
	if err := c.SetWeight(ctx(t), "be00", "s0", 10); err != nil {
		t.Fatal(err)
	}
	before := stats(t, c)["be00/s0"].Counters.ReqTot
	waitFor(t, "be00/s0's traffic back", func() bool { return stats(t, c)["be00/s0"].Counters.ReqTot > before+100 })
	if w, err := c.Run(ctx(t), "get weight be00/s0"); err != nil || strings.TrimSpace(w) != "10 (initial 10)" {
		t.Fatalf("get weight: %q %v", w, err)
	}

	// Failures come back marked as HAProxy marks them.
	for _, tc := range []struct {
		name string
		call func() error
		want string
	}{
		{"no such server", func() error { return c.SetServerState(ctx(t), "be00", "nosuch", haproxy.StateDrain) }, "No such server."},
		{"no such backend", func() error { return c.SetWeight(ctx(t), "nob", "s0", 1) }, "No such backend."},
	} {
		var ce *haproxy.CommandError
		if err := tc.call(); !errors.As(err, &ce) || ce.Severity != 3 || ce.Reply != tc.want {
			t.Errorf("%s: %v, want [3]: %s", tc.name, err, tc.want)
		}
	}
	if r, err := c.Run(ctx(t), "set weight be00/s0 300"); err != nil || !strings.HasPrefix(r, "[3]: Absolute weight") {
		t.Errorf("weight 300: %q %v", r, err)
	}

	var sent []string
	for _, cmd := range f.Commands() {
		sent = append(sent, cmd.Text)
	}
	for _, want := range []string{"show cli level", "show info", "show stat", "show servers state", "set server be00/s0 state drain",
		"set server be00/s0 state maint", "set server be00/s0 state ready", "set weight be00/s0 0", "set weight be00/s0 10", "set server be00/nosuch state drain"} {
		if !slices.Contains(sent, want) {
			t.Errorf("command %q not recorded: %q", want, sent)
		}
	}
}

// The simulation, driven by an injected clock: each server answers its
// share of the backend's rate as a Poisson count, fails at its own rate,
// and the faulty server switches at its time.
func TestSimulationRates(t *testing.T) {
	const secs = 2000
	f, _ := start(t, Config{Backends: 3, Servers: 9, Rate: 30, Median: 0.01, Sigma: 0.3, Seed: 11,
		Fault: &Fault{Rate: 0.2, From: (secs + 1) * time.Second}, Tick: time.Hour})
	f.advance(f.start.Add(secs * time.Second)) // fault not yet on
	var rates []float64
	for _, tr := range f.Truths() {
		mean := 30.0 * secs
		if d := math.Abs(float64(tr.Requests) - mean); d > 5*math.Sqrt(mean) {
			t.Errorf("%s/%s: %d requests in %d s at 30 req/s", tr.Backend, tr.Server, tr.Requests, secs)
		}
		exp := tr.HealthyRate * float64(tr.Requests)
		if d := math.Abs(float64(tr.Fails) - exp); d > 5*math.Sqrt(exp)+1 {
			t.Errorf("%s/%s: %d fails, want about %.0f (healthy rate %.4f)", tr.Backend, tr.Server, tr.Fails, exp, tr.HealthyRate)
		}
		rates = append(rates, tr.HealthyRate)
	}
	slices.Sort(rates)
	if med := rates[len(rates)/2]; med < 0.01*math.Exp(-0.3) || med > 0.01*math.Exp(0.3) {
		t.Errorf("median healthy rate %.4f, want near 0.01", med)
	}
	if rates[0] == rates[len(rates)-1] {
		t.Error("σ 0.3 gave every server the same rate")
	}

	before := map[string]Truth{}
	for _, tr := range f.Truths() {
		before[tr.Backend+"/"+tr.Server] = tr
	}
	f.advance(f.start.Add(2 * secs * time.Second)) // fault on
	faulty := 0
	for _, tr := range f.Truths() {
		if !tr.Faulty {
			continue
		}
		faulty++
		b := before[tr.Backend+"/"+tr.Server]
		if frac := float64(tr.Fails-b.Fails) / float64(tr.Requests-b.Requests); frac < 0.18 || frac > 0.22 {
			t.Errorf("%s/%s: faulty at %.3f, want 0.2", tr.Backend, tr.Server, frac)
		}
	}
	if faulty != 3 {
		t.Errorf("%d faulty servers, want one per backend (3)", faulty)
	}
}

// A drained server's share goes to its peers: the backend's load stays
// Rate×Servers.
func TestDrainSharesTheLoad(t *testing.T) {
	f, c := start(t, Config{Backends: 1, Servers: 4, Rate: 50, Median: 0.001, Seed: 3, Tick: time.Hour})
	if err := c.SetServerState(ctx(t), "be00", "s3", haproxy.StateDrain); err != nil {
		t.Fatal(err)
	}
	f.advance(f.start.Add(1000 * time.Second))
	for _, tr := range f.Truths() {
		want := 200.0 / 3 * 1000
		if tr.Server == "s3" {
			want = 0
		}
		if d := math.Abs(float64(tr.Requests) - want); d > 5*math.Sqrt(want)+0.5 {
			t.Errorf("%s: %d requests, want about %.0f", tr.Server, tr.Requests, want)
		}
	}
}

// The fake's replies have the columns of Debian's HAProxy 2.6, read from
// a live one: a column the agent reads cannot be missing or misnamed.
func TestHeadersMatchRealHAProxy(t *testing.T) {
	ports, err := haproxyproc.FreePorts(1)
	if err != nil {
		t.Fatal(err)
	}
	var sock string
	labtest.StartT(t, func(dir string) (string, string) {
		sock = filepath.Join(dir, "admin.sock")
		return fmt.Sprintf(`global
    stats socket %s level admin
defaults
    mode http
    timeout connect 1s
    timeout client 5s
    timeout server 5s
backend be00
    server s0 127.0.0.1:9 weight 10
frontend fe
    bind 127.0.0.1:%d
    default_backend be00
`, sock, ports[0]), sock
	})
	real, err := haproxy.New("unix:" + sock)
	if err != nil {
		t.Fatal(err)
	}
	_, fake := start(t, Config{Backends: 1, Servers: 1, Rate: 1, Median: 0.002, Seed: 1})
	for _, cmd := range []string{"show stat", "show servers state"} {
		header := func(c *haproxy.Client) string {
			r, err := c.Run(ctx(t), cmd)
			if err != nil {
				t.Fatal(err)
			}
			for l := range strings.SplitSeq(r, "\n") {
				if strings.HasPrefix(l, "# ") {
					return l
				}
			}
			t.Fatalf("%s: no header in %q", cmd, r)
			return ""
		}
		if h, want := header(fake), header(real); h != want {
			t.Errorf("%s: header\n%s\nwant (HAProxy %s)\n%s", cmd, h, haproxyproc.Binary(), want)
		}
	}
	for _, cmd := range []string{"show cli level", "set server be00/s0 state drain", "set weight be00/s0 5", "set weight be00/nosuch 5", "set server nob/s0 state drain", "get weight be00/s0"} {
		want, err := real.Run(ctx(t), cmd)
		if err != nil {
			t.Fatal(err)
		}
		if got, err := fake.Run(ctx(t), cmd); err != nil || got != want {
			t.Errorf("%s: %q, %v; HAProxy answers %q", cmd, got, err, want)
		}
	}
}

// The seed draws the fleet: the same seed gives the same healthy rates,
// another seed others; a fault draws its servers apart, leaving the
// healthy rates as they were.
func TestSeedDrawsTheFleet(t *testing.T) {
	rates := func(seed uint64, fault *Fault) []float64 {
		f, _ := start(t, Config{Backends: 10, Servers: 9, Rate: 1, Median: 0.002, Sigma: 0.3, Seed: seed, Fault: fault, Tick: time.Hour})
		var out []float64
		for _, tr := range f.Truths() {
			out = append(out, tr.HealthyRate)
		}
		return out
	}
	a, b := rates(41, nil), rates(7, nil)
	if !slices.Equal(a, rates(41, &Fault{Rate: 0.05})) {
		t.Error("a fault changed the healthy rates of the same seed")
	}
	same := 0
	for i := range a {
		if a[i] == b[i] {
			same++
		}
	}
	if same > 0 {
		t.Errorf("seeds 41 and 7 gave %d servers the same rate", same)
	}
	t.Logf("seed 41: %.4f%%..%.4f%%; seed 7: %.4f%%..%.4f%%", 100*slices.Min(a), 100*slices.Max(a), 100*slices.Min(b), 100*slices.Max(b))
}
