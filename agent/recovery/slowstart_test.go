package recovery

import (
	"bytes"
	"context"
	"reflect"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/hapilot/hapilot/agent"
	"github.com/hapilot/hapilot/agent/guard"
	"github.com/hapilot/hapilot/agent/loop"
	"github.com/hapilot/hapilot/haproxy"
	"github.com/hapilot/hapilot/internal/lab/fakes"
	"github.com/hapilot/hapilot/internal/lib/window"
	"github.com/rs/zerolog"
)

// traffic is the windows of a backend whose servers take requests in
// proportion to their weight: each step, 100 requests per unit of
// weight, 5% of them 5xx on a faulty server and 0.2% on the others.
type traffic struct {
	mu     sync.Mutex
	stats  map[string]*window.Stats
	faulty map[string]bool
}

func (w *traffic) Snapshot(time.Duration) []window.Stats {
	w.mu.Lock()
	defer w.mu.Unlock()
	var out []window.Stats
	for _, s := range w.stats {
		out = append(out, *s)
	}
	return out
}

// serve adds one step of traffic to every serving server of rt, and
// returns the 5xx srv2 served.
func (w *traffic) serve(rt *fakes.Runtime) uint64 {
	w.mu.Lock()
	defer w.mu.Unlock()
	var srv2 uint64
	for name, s := range w.stats {
		st := rt.State(name)
		if !st.Serving() {
			continue
		}
		n := uint64(100 * st.Weight)
		x := n / 500
		if w.faulty[name] {
			x = n / 20
		}
		s.Requests += n
		s.Err5xx += x
		s.TotalRequests, s.TotalErr5xx = s.Requests, s.Err5xx
		if name == "srv2" {
			srv2 += x
		}
	}
	return srv2
}

// drainOnce drains srv2 at its first call, as a policy that found it.
type drainOnce struct{ done bool }

func (d *drainOnce) Name() string { return "drain-once" }
func (d *drainOnce) Decide(context.Context, agent.Observation) (agent.Plan, error) {
	if d.done {
		return nil, nil
	}
	d.done = true
	return agent.Plan{{Kind: agent.Drain, Backend: "app", Server: "srv2", Reason: "test: 5% 5xx"}}, nil
}

// TestSlowStart runs the loop with recovery in slow-start mode on a
// recording fake runtime, a step every 10 s of an injected clock: srv2 is
// drained at the first step, and its probes and its live traffic say
// what each case wants. It checks the exact commands, and the 5xx srv2
// served to clients while it ramped against the test's bound.
func TestSlowStart(t *testing.T) {
	tests := []struct {
		name string
		// probesPass: the bursts are clean; liveFaulty: client traffic
		// still fails at 5% after the re-admission.
		probesPass, liveFaulty bool
		// operator, when set, acts on srv2 just after its ready.
		operator func(*haproxy.ServerState)
		mode     agent.Mode
		want     []string
		// wantWeight and wantOwner: srv2 at the end.
		wantWeight int
		wantAdmin  int
	}{
		{name: "healed: ramps 4, 8, 16 on healthy verdicts", probesPass: true,
			want: []string{"set server app/srv2 state drain", "set weight app/srv2 4", "set server app/srv2 state ready",
				"set weight app/srv2 8", "set weight app/srv2 16"},
			wantWeight: 16},
		// Each ready is followed by a drain at the next step; the second
		// try waits the doubled cooldown, the third would wait 120 s.
		{name: "probes pass, clients still fail: back to drain at once", probesPass: true, liveFaulty: true,
			want: []string{"set server app/srv2 state drain", "set weight app/srv2 4", "set server app/srv2 state ready", "set server app/srv2 state drain",
				"set server app/srv2 state ready", "set server app/srv2 state drain"},
			wantWeight: 4, wantAdmin: haproxy.AdminForcedDrain},
		{name: "probes fail: stays drained, never flipped", probesPass: false, liveFaulty: true,
			want:       []string{"set server app/srv2 state drain"},
			wantWeight: 16, wantAdmin: haproxy.AdminForcedDrain},
		{name: "the operator sets a weight during the ramp: left to them", probesPass: true,
			operator:   func(s *haproxy.ServerState) { s.Weight = 5 },
			want:       []string{"set server app/srv2 state drain", "set weight app/srv2 4", "set server app/srv2 state ready"},
			wantWeight: 5},
		{name: "observe mode: nothing is sent", probesPass: true, mode: agent.ModeObserve,
			want: []string{}, wantWeight: 16},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			rt := fakes.NewRuntime("srv1", "srv2", "srv3")
			for _, name := range []string{"srv1", "srv2", "srv3"} {
				rt.Set(name, func(s *haproxy.ServerState) { s.Weight, s.Initial, s.Addr, s.Port = 16, 16, "10.0.0.2", 80 })
			}
			w := &traffic{stats: map[string]*window.Stats{}, faulty: map[string]bool{"srv2": true}}
			for _, name := range []string{"srv1", "srv2", "srv3"} {
				w.stats[name] = &window.Stats{Backend: "app", Server: name}
			}
			w.serve(rt) // the minute before: srv2 at 5%
			clk := fakes.NewClock(time.Unix(1000, 0))
			cfg := DefaultConfig()
			cfg.Mode = ModeSlowStart
			r := New(cfg, nil, zerolog.Nop())
			t.Cleanup(r.Close)
			r.Now, r.Prober = clk.Now, func(_ agent.ServerView, n int) BurstResult {
				if tc.probesPass {
					return BurstResult{Sent: n}
				}
				return BurstResult{Sent: 3, Failed: 1}
			}
			r.Seed(1)
			mode := agent.ModeEnforce
			if tc.mode != "" {
				mode = tc.mode
			}
			l := &loop.Loop{Clock: clk, Settings: agent.Settings{Interval: 10 * time.Second, Mode: mode, OperatorHold: time.Hour},
				Policy: agent.PolicyOf(&drainOnce{}), Guard: guard.DefaultGuardrails(), Runtimes: []agent.Runtime{rt},
				Windows: w, Recovery: r, Audit: &bytes.Buffer{}, Log: zerolog.Nop()}
			got := []string{}
			var paid uint64 // srv2's 5xx to clients after the drain
			ramps := 0
			for step := range 20 {
				l.Step(context.Background())
				cmds := rt.TakeCommands()
				got = append(got, cmds...)
				if slices.Contains(cmds, "set server app/srv2 state ready") {
					ramps++
					if tc.operator != nil {
						rt.Set("srv2", tc.operator)
					}
				}
				if step == 3 {
					w.mu.Lock()
					w.faulty["srv2"] = tc.liveFaulty // healed, or not, while drained
					w.mu.Unlock()
				}
				if x := w.serve(rt); step > 0 {
					paid += x
				}
				clk.Advance(10 * time.Second)
			}
			if !reflect.DeepEqual(got, tc.want) {
				t.Fatalf("commands %q, want %q", got, tc.want)
			}
			if st := rt.State("srv2"); st.Weight != tc.wantWeight || st.AdminState != tc.wantAdmin {
				t.Fatalf("srv2 ends %s at weight %d, want admin %d weight %d", st.Label(), st.Weight, tc.wantAdmin, tc.wantWeight)
			}
			if tc.liveFaulty && tc.probesPass {
				// One stage at weight 4 of 16: chunks of 400 requests.
				test, err := cfg.RampTest(0.05, 0.002)
				if err != nil {
					t.Fatal(err)
				}
				if bound := float64(ramps) * test.ErrorBound(0.05, 400); float64(paid) > bound || paid == 0 {
					t.Fatalf("srv2 paid %d 5xx in %d ramps, bound %.1f", paid, ramps, bound)
				}
			}
		})
	}
}

// TestFailedBurstKeepsTheDrainsCooldown: in slow-start mode a failed
// burst waits the drain's cooldown again; in probe mode it doubles it.
func TestFailedBurstKeepsTheDrainsCooldown(t *testing.T) {
	for _, tc := range []struct {
		mode Mode
		want time.Duration
	}{{ModeSlowStart, 30 * time.Second}, {ModeProbe, time.Minute}} {
		h := newHarness(t, "127.0.0.1:1", 8, true)
		h.r.Config.Mode = tc.mode
		h.r.Prober = func(agent.ServerView, int) BurstResult { return BurstResult{Sent: 2, Failed: 1} }
		h.plan(34 * time.Second) // the burst runs inline
		if p := h.plan(44 * time.Second); len(p) != 0 {
			t.Fatalf("%s: re-admitted after a failed burst: %v", tc.mode, p)
		}
		if st := h.r.servers[srv2]; st.cooldown != tc.want || st.probe != waiting || st.failed != 1 {
			t.Fatalf("%s: after a failed burst: cooldown %v, want %v (%+v)", tc.mode, st.cooldown, tc.want, st)
		}
	}
}

// TestRampAfterTheTailHold: a server the tail guard brought back is not
// judged while held, and its test then starts from the counts at the end
// of the hold: its errors before are not held against it.
func TestRampAfterTheTailHold(t *testing.T) {
	h := newHarness(t, "127.0.0.1:1", 16, true)
	h.r.Config.Mode = ModeSlowStart
	s := h.srv2()
	s.State.AdminState, s.State.Weight = 0, 4
	s.Changed = &agent.Change{Phase: agent.PhaseCanary, Weight: 4, At: h.now}
	s.NoDrainUntil = h.now.Add(10 * time.Minute)
	s.Window.TotalRequests, s.Window.TotalErr5xx = 2000, 100 // 5% before and during the hold
	if p := h.plan(5 * time.Minute); len(p) != 0 {
		t.Fatalf("acted during the tail guard's hold: %v", p)
	}
	s.Window.TotalRequests, s.Window.TotalErr5xx = 4000, 200
	if p := h.plan(10*time.Minute - time.Second); len(p) != 0 {
		t.Fatalf("acted during the tail guard's hold: %v", p)
	}
	// 1,000 clean requests since the hold ended: "healthy" against the
	// 1% floor, recovery having no drained rate of its own for it.
	s.Window.TotalRequests = 5000
	p := h.plan(10*time.Minute + 10*time.Second)
	if len(p) != 1 || p[0].Kind != agent.SetWeight || p[0].Weight != 8 {
		t.Fatalf("want weight 8 on the traffic since the hold: %v", p)
	}
}
