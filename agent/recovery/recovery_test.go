package recovery

import (
	"context"
	"net"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/hapilot/hapilot/agent"
	"github.com/hapilot/hapilot/haproxy"
	"github.com/hapilot/hapilot/internal/lab/fleet"
	"github.com/hapilot/hapilot/internal/lib/window"
	"github.com/rs/zerolog"
)

func TestBurstSize(t *testing.T) {
	c := DefaultConfig()
	for rate, want := range map[float64]int{0: 20, 0.05: 180, 0.2: 42, 0.5: 20, 0.005: 1000, 1: 20} {
		if got := c.BurstSize(rate); got != want {
			t.Errorf("BurstSize(%v) = %d, want %d", rate, got, want)
		}
	}
}

type harness struct {
	t   *testing.T
	r   *Readmitter
	now time.Time
	obs agent.Observation
}

// newHarness: one backend of three servers; srv2 was drained by the agent
// at t0 for a 5% error rate and answers on addr.
func newHarness(t *testing.T, addr string, initial int, probe bool) *harness {
	host, port, _ := net.SplitHostPort(addr)
	p, _ := strconv.Atoi(port)
	h := &harness{t: t, now: time.Unix(10000, 0)}
	cfg := DefaultConfig()
	cfg.Mode, cfg.Rate = ModeCanary, 2000
	if probe {
		cfg.Mode = ModeProbe
	}
	h.r = New(cfg, nil, zerolog.Nop())
	t.Cleanup(h.r.Close)
	h.r.Now = func() time.Time { return h.now }
	b := agent.BackendView{Name: "app"}
	for _, name := range []string{"srv1", "srv2", "srv3"} {
		v := agent.ServerView{Backend: "app", Server: name, Owner: agent.OwnerNone,
			State:  haproxy.ServerState{Backend: "app", Server: name, OpState: haproxy.OpRunning, Weight: initial, Initial: initial, Addr: "127.0.0.1", Port: 1},
			Window: window.Stats{Requests: 600}, Recent: window.Stats{Requests: 100, P95Ms: 12}}
		if name == "srv2" {
			v.State.Addr, v.State.Port = host, p
			v.State.AdminState = haproxy.AdminForcedDrain
			v.Owner = agent.OwnerAgent
			v.Changed = &agent.Change{Phase: agent.PhaseDrained, At: h.now, ErrorRate: 0.05}
			v.Window = window.Stats{Requests: 600, Err5xx: 30}
		}
		b.Servers = append(b.Servers, v)
	}
	h.obs = agent.Observation{Backends: []agent.BackendView{b}}
	return h
}

func (h *harness) srv2() *agent.ServerView { return &h.obs.Backends[0].Servers[1] }

func (h *harness) plan(at time.Duration) agent.Plan {
	h.now = time.Unix(10000, 0).Add(at)
	h.obs.Time = h.now
	return h.r.Plan(context.Background(), h.obs)
}

// waitBurst blocks until srv2's probe burst has ended, without sleeping.
func (h *harness) waitBurst() {
	h.r.mu.Lock()
	st := h.r.servers[srv2]
	h.r.mu.Unlock()
	if st == nil || st.probe != probing {
		h.t.Fatalf("no burst running: %+v", st)
	}
	res := <-st.result
	st.result <- res
}

func TestPersistentFaultStaysDrained(t *testing.T) {
	b, err := fleet.StartBackend(fleet.BackendConfig{ErrorRate: 0.05, Seed: 3})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	h := newHarness(t, b.Addr, 1, true)
	if p := h.plan(10 * time.Second); len(p) != 0 {
		t.Fatalf("acted during the cooldown: %v", p)
	}
	h.plan(34 * time.Second) // past 30 s ± 10%: the burst starts
	h.waitBurst()
	if p := h.plan(35 * time.Second); len(p) != 0 {
		t.Fatalf("re-admitted a failing server: %v", p)
	}
	st := h.r.servers[srv2]
	if st.cooldown != time.Minute || st.probe != waiting || b.Served() == 0 {
		t.Fatalf("after a failed burst: %+v, %d probes served", st, b.Served())
	}
	// The next burst waits for the doubled cooldown.
	if p := h.plan(80 * time.Second); len(p) != 0 || st.probe != waiting {
		t.Fatalf("probed again too soon: %v %v", p, st.probe)
	}
}

func TestHealedServerComesBackThroughACanary(t *testing.T) {
	b, err := fleet.StartBackend(fleet.BackendConfig{})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	h := newHarness(t, b.Addr, 8, true)
	h.plan(34 * time.Second)
	h.waitBurst()
	p := h.plan(35 * time.Second)
	if len(p) != 1 || p[0].Kind != agent.SetWeight || p[0].Weight != 2 {
		t.Fatalf("want canary weight 2 first: %v", p)
	}
	if got := b.Served(); got != 180 {
		t.Fatalf("burst of %d probes, want 180 for a 5%% fault", got)
	}
	h.srv2().State.Weight = 2
	p = h.plan(36 * time.Second)
	if len(p) != 1 || p[0].Kind != agent.Ready {
		t.Fatalf("want ready: %v", p)
	}
	// Back in rotation at weight 2, the agent's weight.
	s := h.srv2()
	s.State.AdminState, s.Changed = 0, &agent.Change{Phase: agent.PhaseCanary, Weight: 2, At: h.now}
	s.Recent = window.Stats{Requests: 20}
	if p := h.plan(40 * time.Second); len(p) != 0 {
		t.Fatalf("promoted too early: %v", p)
	}
	s.Recent = window.Stats{Requests: 120, P95Ms: 13}
	p = h.plan(47 * time.Second)
	if len(p) != 1 || p[0].Kind != agent.SetWeight || p[0].Weight != 8 {
		t.Fatalf("want full weight: %v", p)
	}
}

// A drain that sends the backend's p99 past 2.5x its level before the
// drain, in every step for 20 s, is undone to a reduced weight, with a
// hold on draining it again.
func TestTailGuardRevertsToReducedWeight(t *testing.T) {
	h := newHarness(t, "127.0.0.1:1", 8, false)
	s := h.srv2()
	s.Changed.BaselineP99Ms = 15
	h.setPeersP99(60)
	for _, at := range []time.Duration{5, 6, 10, 15, 20, 24} {
		if p := h.plan(at * time.Second); len(p) != 0 {
			t.Fatalf("acted at %v s, before 20 s over the guard: %v", at, p)
		}
	}
	p := h.plan(25 * time.Second)
	if len(p) != 1 || p[0].Kind != agent.SetWeight || p[0].Weight != 2 || !strings.Contains(p[0].Reason, "for 20s") {
		t.Fatalf("want a reduced weight first: %v", p)
	}
	s.State.Weight = 2
	p = h.plan(26 * time.Second)
	if len(p) != 1 || p[0].Kind != agent.Ready || p[0].NoDrainFor != 10*time.Minute {
		t.Fatalf("want ready with a hold: %v", p)
	}
	// Below the guard, nothing happens.
	h2 := newHarness(t, "127.0.0.1:1", 8, false)
	h2.srv2().Changed.BaselineP99Ms = 15
	h2.setPeersP99(30)
	for at := 5; at <= 25; at++ { // the canary ramp starts at 30 s
		if p := h2.plan(time.Duration(at) * time.Second); len(p) != 0 {
			t.Fatalf("p99 at 2x, %d s: %v", at, p)
		}
	}
}

// The guard acts on a p99 that stays over it for TailFor, in two steps
// at least: a step back under it starts the count again, and TailFor 0
// is the second step over it.
func TestTailGuardWaitsForTailFor(t *testing.T) {
	cases := []struct {
		name    string
		tailFor time.Duration
		p99     map[int]int // step's p99 by second; others 60 ms
		steps   []int
		fireAt  int // 0: never
	}{
		{name: "over every step", tailFor: 10 * time.Second, steps: []int{5, 7, 9, 11, 13, 15, 17}, fireAt: 15},
		{name: "a step under restarts the count", tailFor: 10 * time.Second, p99: map[int]int{9: 20},
			steps: []int{5, 7, 9, 11, 13, 15, 17, 19, 21, 23}, fireAt: 21},
		{name: "one slow step at the 10 s pace", tailFor: 10 * time.Second, p99: map[int]int{20: 20, 30: 20},
			steps: []int{10, 20, 30}, fireAt: 0},
		{name: "two steps at the 10 s pace", tailFor: 10 * time.Second, steps: []int{10, 20}, fireAt: 20},
		{name: "TailFor 0: the second step", tailFor: 0, steps: []int{5, 6, 7}, fireAt: 6},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			h := newHarness(t, "127.0.0.1:1", 8, false)
			h.r.Config.TailFor = c.tailFor
			h.r.Config.Cooldown = time.Hour // no canary ramp meanwhile
			h.srv2().Changed.BaselineP99Ms = 15
			fired := 0
			for _, at := range c.steps {
				p99, ok := c.p99[at]
				if !ok {
					p99 = 60
				}
				h.setPeersP99(p99)
				p := h.plan(time.Duration(at) * time.Second)
				if len(p) > 0 && fired == 0 {
					if p[0].Kind != agent.SetWeight || !strings.Contains(p[0].Reason, "tail-latency guard") {
						t.Fatalf("at %d s: want a reduced weight: %v", at, p)
					}
					fired = at
				}
			}
			if fired != c.fireAt {
				t.Errorf("fired at %d s, want %d", fired, c.fireAt)
			}
		})
	}
}

// setPeersP99 gives srv2's serving peers a recent window of 500
// requests with the given p99.
func (h *harness) setPeersP99(ms int) {
	for i := range h.obs.Backends[0].Servers {
		if v := &h.obs.Backends[0].Servers[i]; v.Server != "srv2" {
			v.Recent = window.Stats{Requests: 500, P99Ms: ms}
		}
	}
}

func TestCanaryStaysAtReducedWeightWhileFailing(t *testing.T) {
	h := newHarness(t, "127.0.0.1:1", 8, false) // probing off: the canary is the test
	p := h.plan(34 * time.Second)
	if len(p) != 1 || p[0].Kind != agent.SetWeight || p[0].Weight != 2 {
		t.Fatalf("want canary weight: %v", p)
	}
	s := h.srv2()
	s.State.Weight = 2
	if p := h.plan(35 * time.Second); len(p) != 1 || p[0].Kind != agent.Ready {
		t.Fatalf("want ready: %v", p)
	}
	s.State.AdminState, s.Changed = 0, &agent.Change{Phase: agent.PhaseCanary, Weight: 2, At: h.now}
	s.Recent = window.Stats{Requests: 200, Err5xx: 10}
	if p := h.plan(60 * time.Second); len(p) != 0 {
		t.Fatalf("promoted a failing canary: %v", p)
	}
}

// Drained again after a re-admission: the cooldown doubles.
func TestRedrainDoublesCooldown(t *testing.T) {
	h := newHarness(t, "127.0.0.1:1", 1, false)
	if p := h.plan(34 * time.Second); len(p) != 1 || p[0].Kind != agent.Ready {
		t.Fatalf("want ready (weight 1: no canary): %v", p)
	}
	s := h.srv2()
	s.State.AdminState, s.Owner, s.Changed = 0, agent.OwnerNone, nil
	h.plan(40 * time.Second)
	// Drained again at 50 s.
	s.State.AdminState, s.Owner = haproxy.AdminForcedDrain, agent.OwnerAgent
	s.Changed = &agent.Change{Phase: agent.PhaseDrained, At: time.Unix(10000, 0).Add(50 * time.Second), ErrorRate: 0.05}
	if p := h.plan(90 * time.Second); len(p) != 0 {
		t.Fatalf("re-admitted after 40 s: the cooldown should be 60 s: %v", p)
	}
	if p := h.plan(50*time.Second + 67*time.Second); len(p) != 1 {
		t.Fatalf("not re-admitted after the doubled cooldown: %v (%+v)", p, h.r.servers[srv2])
	}
}

// A server drained for slowness (no errors) is probed as any other: a
// burst whose answers are still far slower than the peers' fails, so the
// server is not let back to be drained again; one as fast as its peers
// passes.
//
// A server drained for a slow tail (5% of its answers at 200 ms, its
// median its peers') is let back only by a burst without an answer at or
// over the drain's slow answer time (Change.SlowMs). Judged on the median
// alone, as every burst was before, it came back while still slow (the
// last row), and the tail test drained it again seconds later (e2e:
// TestSlowTailDrained's server, drained at 23.5 s, back at 56.5 s,
// drained at 63.6 s).
func TestSlowServerStaysDrainedWhileSlow(t *testing.T) {
	for _, tc := range []struct {
		name      string
		backend   fleet.BackendConfig
		errorRate float64 // the drain's Change.ErrorRate
		slowMs    int     // the drain's Change.SlowMs
		slowMean  bool    // the drain's Change.SlowMean
		p50Ms     int     // its window's median when drained
		back      bool
		burst     string // what the failed burst's record says
	}{
		{"still 8x slower", fleet.BackendConfig{Latency: 100 * time.Millisecond}, 0, 0, false, 180, false, "probes failed"},
		{"as fast as its peers", fleet.BackendConfig{}, 0, 0, false, 180, true, ""},
		{"tail: still slow on 5%", slowTail(0.05), 0.05, 64, false, 12, false, "slow tail, an answer at 64 ms or more fails a probe (1 did)"},
		{"tail: healed", slowTail(0), 0.05, 64, false, 12, true, ""},
		{"tail: still slow, judged on the median alone", slowTail(0.05), 0.05, 0, false, 12, true, ""},
		// The stats path's drain (a mean): 348 probes, for the 2.6% of
		// answers at the 2 s timeout that lift a 12 ms body's mean to 64
		// ms. Sized on the share of checks whose mean was slow (84%),
		// the burst was 20 probes, which this tail (seed 3) passes: its first
		// slow answer is the 73rd.
		{"mean: still slow on 5%", slowTail(0.05), 0, 64, true, 12, false, "slow mean, an answer at 64 ms or more fails a probe (1 did), 348 probes for the 2.6% of answers"},
		{"mean: healed", slowTail(0), 0, 64, true, 12, true, ""},
		{"mean: still slow, the burst sized on the slow checks' share", slowTail(0.05), 0.84, 64, false, 12, true, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b, err := fleet.StartBackend(tc.backend)
			if err != nil {
				t.Fatal(err)
			}
			defer b.Close()
			h := newHarness(t, b.Addr, 8, true)
			for i := range h.obs.Backends[0].Servers {
				h.obs.Backends[0].Servers[i].Window.P50Ms = 12
			}
			s := h.srv2()
			s.Changed.ErrorRate, s.Changed.SlowMs, s.Changed.SlowMean, s.Window = tc.errorRate, tc.slowMs, tc.slowMean, window.Stats{Requests: 600, P50Ms: tc.p50Ms}
			h.plan(34 * time.Second)
			h.waitBurst()
			p := h.plan(35 * time.Second)
			st := h.r.servers[srv2]
			if got := len(p) == 1 && p[0].Kind == agent.SetWeight; got != tc.back {
				t.Fatalf("plan %v (%s), want re-admission %v", p, st.lastBurst, tc.back)
			}
			if !tc.back && (st.probe != waiting || st.cooldown != time.Minute || !strings.Contains(st.lastBurst, tc.burst)) {
				t.Fatalf("a slow burst must count as failed, and say so (%q): %+v (%s)", tc.burst, st, st.lastBurst)
			}
		})
	}
}

// slowTail is a server answering share of its requests after 200 ms, the
// rest at once; its draws from a fixed seed.
func slowTail(share float64) fleet.BackendConfig {
	return fleet.BackendConfig{ErrorRate: share, Fault: fleet.FaultSlow, SlowFor: 200 * time.Millisecond, Seed: 3}
}

// Two drained servers whose cooldowns end in the same step probe at once,
// each with its own burst; Close stops bursts still running and waits for
// them, so that none outlives the agent. Run with -race.
func TestTwoBurstsInOneStepAndClose(t *testing.T) {
	slow, err := fleet.StartBackend(fleet.BackendConfig{Latency: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer slow.Close()
	h := newHarness(t, slow.Addr, 1, true)
	h.r.Config.Rate = 20 // 20 probes at 20/s: a burst lasts about a second
	s3 := &h.obs.Backends[0].Servers[2]
	*s3 = *h.srv2()
	s3.Server, s3.State.Server = "srv3", "srv3"
	s3.Changed = &agent.Change{Phase: agent.PhaseDrained, At: h.now, ErrorRate: 0.05}
	h.plan(34 * time.Second)
	h.r.mu.Lock()
	running := 0
	for _, st := range h.r.servers {
		if st.probe == probing {
			running++
		}
	}
	h.r.mu.Unlock()
	if running != 2 {
		t.Fatalf("%d bursts running, want 2", running)
	}
	for deadline := time.Now().Add(5 * time.Second); slow.Served() < 2 && time.Now().Before(deadline); {
		time.Sleep(10 * time.Millisecond) // wait for the bursts to be under way
	}
	began := time.Now()
	done := make(chan struct{})
	go func() { h.r.Close(); close(done) }()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("Close did not stop the bursts")
	}
	t.Logf("Close took %v", time.Since(began))
	if n := slow.Served(); n == 0 || n >= uint64(2*h.r.Config.BurstSize(0.05)) {
		t.Fatalf("%d probes served: the bursts should have started and been cut short", n)
	}
}

// The tail guard covers weight cuts: a cut that leaves the backend's p99
// far above its level before, for 20 s, goes back to the configured
// weight with a hold on draining.
func TestTailGuardUndoesAWeightCut(t *testing.T) {
	h := newHarness(t, "127.0.0.1:1", 8, false)
	s := h.srv2()
	s.State.AdminState, s.State.Weight = 0, 2
	s.Changed = &agent.Change{Phase: agent.PhaseCut, Weight: 2, At: h.now, BaselineP99Ms: 15}
	h.r.Config.CanaryFor = time.Minute // its clean traffic would restore it at 10 s
	for i := range h.obs.Backends[0].Servers {
		h.obs.Backends[0].Servers[i].Recent = window.Stats{Requests: 500, P99Ms: 60}
	}
	if p := h.plan(5 * time.Second); len(p) != 0 {
		t.Fatalf("acted on one step over the guard: %v", p)
	}
	if p := h.plan(15 * time.Second); len(p) != 0 {
		t.Fatalf("acted after 10 s over the guard: %v", p)
	}
	p := h.plan(25 * time.Second)
	if len(p) != 1 || p[0].Kind != agent.Ready || p[0].NoDrainFor != 10*time.Minute || !strings.Contains(p[0].Reason, "weight cut") {
		t.Fatalf("want the cut undone with a hold: %v", p)
	}
}

// A policy's ready becomes a request to probe: it ends the first cooldown
// early, never the backoff of a failed burst.
func TestRequestProbeShortensOnlyTheFirstCooldown(t *testing.T) {
	h := newHarness(t, "127.0.0.1:1", 1, false)
	h.plan(5 * time.Second) // the drain is seen: cooldown until ~30 s
	h.r.RequestProbe(srv2)
	if p := h.plan(6 * time.Second); len(p) != 1 || p[0].Kind != agent.Ready || p[0].Origin != agent.OriginRecovery {
		t.Fatalf("want a re-admission at once after a request (probing off): %v", p)
	}
	st := h.r.servers[srv2]
	st.failed, st.probe, st.next = 1, waiting, h.now.Add(time.Minute)
	h.r.RequestProbe(srv2)
	if p := h.plan(7 * time.Second); len(p) != 0 {
		t.Fatalf("a request cut a failed burst's backoff: %v", p)
	}
}

// srv2 is the server most tests drain.
var srv2 = agent.Key{Backend: "app", Server: "srv2"}
