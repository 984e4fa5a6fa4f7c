package loop

import (
	"bytes"
	"context"
	"encoding/json"
	"reflect"
	"testing"
	"time"

	"github.com/hapilot/hapilot/agent"
	"github.com/hapilot/hapilot/internal/lab/fakes"
)

// evidenced drains whatever its test finds among the serving servers; the
// test is a function of the clock, standing for evidence that arrives.
type evidenced struct {
	find  func(now time.Time) []string // server names found at now
	clock agent.Clock
	steps []time.Time
	stop  func(now time.Time) // called at each check, to end the run
}

func (e *evidenced) Name() string { return "evidenced" }

func (e *evidenced) Evidence(obs agent.Observation) []agent.Key {
	if e.stop != nil {
		e.stop(e.clock.Now())
	}
	found := map[string]bool{}
	for _, s := range e.find(e.clock.Now()) {
		found[s] = true
	}
	var out []agent.Key
	for _, b := range obs.Backends {
		for _, s := range b.Servers {
			if found[s.Server] && s.Serving() {
				out = append(out, key(b.Name, s.Server))
			}
		}
	}
	return out
}

func (e *evidenced) Decide(_ context.Context, obs agent.Observation) (agent.Plan, error) {
	e.steps = append(e.steps, e.clock.Now())
	var plan agent.Plan
	for _, k := range e.Evidence(obs) {
		for _, b := range obs.Backends {
			for _, s := range b.Servers {
				if key(b.Name, s.Server) == k {
					plan = append(plan, agent.Action{Kind: agent.Drain, Backend: b.Name, Server: s.Server, Reason: "found"})
				}
			}
		}
	}
	return plan, nil
}

func TestEvidenceTriggersAStepBetweenTicks(t *testing.T) {
	tests := []struct {
		name string
		// found is what the test finds, by offset from the start.
		found func(at time.Duration) []string
		want  []time.Duration // when Decide ran
		// triggered is the servers each triggered step named, in order.
		triggered [][]string
		drained   []string
	}{
		{
			name:      "a server found at 3 s is drained at 3 s, not at 10 s",
			found:     func(at time.Duration) []string { return when(at >= 3*time.Second, "s2") },
			want:      []time.Duration{0, 3 * time.Second, 10 * time.Second, 20 * time.Second},
			triggered: [][]string{{"app/s2"}},
			drained:   []string{"s2"},
		},
		{
			name:  "a server the guard refuses triggers once, not every second",
			found: func(at time.Duration) []string { return when(at >= 2*time.Second, "s1", "s2", "s3") },
			// Of four servers the floor keeps two; the third stays found
			// and refused, and triggers nothing more.
			want:      []time.Duration{0, 2 * time.Second, 10 * time.Second, 20 * time.Second},
			triggered: [][]string{{"app/s1", "app/s2", "app/s3"}},
			drained:   []string{"s1", "s2"},
		},
		{
			name: "at most MaxTriggered steps between two ticks",
			found: func(at time.Duration) []string {
				// a new server every second from 1 s on
				var out []string
				for i := 1; i <= int(at/time.Second) && i <= 4; i++ {
					out = append(out, []string{"s1", "s2", "s3", "s4"}[i-1])
				}
				return out
			},
			want:      []time.Duration{0, 1 * time.Second, 2 * time.Second, 3 * time.Second, 10 * time.Second, 20 * time.Second},
			triggered: [][]string{{"app/s1"}, {"app/s2"}, {"app/s3"}},
			drained:   []string{"s1", "s2"},
		},
		{
			name:  "nothing found: the ticks alone",
			found: func(time.Duration) []string { return nil },
			want:  []time.Duration{0, 10 * time.Second, 20 * time.Second},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rt := fakes.NewRuntime("s1", "s2", "s3", "s4")
			l, clk, _, audit := newLoop(rt)
			l.Guard.MaxDrains = 4
			start := clk.Now()
			pol := &evidenced{clock: clk, find: func(now time.Time) []string { return tt.found(now.Sub(start)) }}
			runEvidenced(t, l, pol, pol, start, 25*time.Second)
			var got []time.Duration
			for _, at := range pol.steps {
				if d := at.Sub(start); d <= 20*time.Second {
					got = append(got, d)
				}
			}
			if !reflect.DeepEqual(got, tt.want) {
				t.Errorf("steps at %v, want %v", got, tt.want)
			}
			var trig [][]string
			for _, r := range records(t, audit) {
				if len(r.TriggeredBy) > 0 {
					var names []string
					for _, k := range r.TriggeredBy {
						names = append(names, k.String())
					}
					trig = append(trig, names)
				}
			}
			if len(trig) != len(tt.triggered) || (len(trig) > 0 && !reflect.DeepEqual(trig, tt.triggered)) {
				t.Errorf("triggered by %v, want %v", trig, tt.triggered)
			}
			var drained []string
			for _, s := range []string{"s1", "s2", "s3", "s4"} {
				if rt.State(s).Drain() {
					drained = append(drained, s)
				}
			}
			if !reflect.DeepEqual(drained, tt.drained) {
				t.Errorf("drained %v, want %v", drained, tt.drained)
			}
			if m := l.View().Metrics(); m.Triggered != uint64(len(tt.triggered)) {
				t.Errorf("metrics count %d triggered steps, want %d", m.Triggered, len(tt.triggered))
			}
		})
	}
}

// runEvidenced runs l, dec deciding and e's test its evidence, at a 10 s
// interval with a check every second, until until after start.
func runEvidenced(t *testing.T, l *Loop, dec agent.Decider, e *evidenced, start time.Time, until time.Duration) {
	t.Helper()
	l.Policy, l.Interval, l.EvidenceCheck = agent.Policy{Decider: dec, Evidence: e.Evidence}, 10*time.Second, time.Second
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	e.stop = func(now time.Time) {
		if now.Sub(start) >= until {
			cancel()
		}
	}
	if err := l.Run(ctx); err != nil {
		t.Fatal(err)
	}
}

func records(t *testing.T, audit *bytes.Buffer) []agent.Record {
	t.Helper()
	var out []agent.Record
	for _, line := range bytes.Split(bytes.TrimSpace(audit.Bytes()), []byte("\n")) {
		var r agent.Record
		if err := json.Unmarshal(line, &r); err != nil {
			t.Fatalf("audit line %q: %v", line, err)
		}
		out = append(out, r)
	}
	return out
}

func when(cond bool, servers ...string) []string {
	if cond {
		return servers
	}
	return nil
}

// deadlines records, for each Decide, when it ran and its context's
// deadline, deciding as evidenced does.
type deadlines struct {
	*evidenced
	at, by []time.Time
}

func (d *deadlines) Decide(ctx context.Context, obs agent.Observation) (agent.Plan, error) {
	by, _ := ctx.Deadline()
	d.at, d.by = append(d.at, d.clock.Now()), append(d.by, by)
	return d.evidenced.Decide(ctx, obs)
}

// TestPolicyLeavesTheCommandsTime: a step between ticks must end by the
// next tick, and its policy's call ends early enough to leave the
// commands their share of what is left, as a step on its tick leaves
// them a tenth of the interval. Before, the call of a step between ticks
// could run to the tick itself: a model answering slowly left the
// floor's drain no time to be sent (TestRealOllamaRandomModelUnderTheGuards,
// `runtime socket unreachable: … i/o timeout`).
func TestPolicyLeavesTheCommandsTime(t *testing.T) {
	rt := fakes.NewRuntime("s1", "s2", "s3", "s4")
	l, clk, _, _ := newLoop(rt)
	start := clk.Now()
	pol := &deadlines{evidenced: &evidenced{clock: clk, find: func(now time.Time) []string {
		return when(now.Sub(start) >= 7*time.Second, "s2")
	}}}
	runEvidenced(t, l, pol, pol.evidenced, start, 15*time.Second)
	// The tick at 0 s, the step the evidence at 7 s triggers, the tick at 10 s.
	want := []struct{ at, by time.Duration }{
		{0, 8 * time.Second},                              // 0.8 of the interval, as ever
		{7 * time.Second, 10*time.Second - time.Second/3}, // the tick, less a ninth of the 3 s left
		{10 * time.Second, 18 * time.Second},
	}
	if len(pol.at) < len(want) {
		t.Fatalf("decided at %v, want %d steps", pol.at, len(want))
	}
	for i, w := range want {
		at, by := pol.at[i].Sub(start), pol.by[i].Sub(start)
		if at != w.at || by != w.by {
			t.Errorf("step %d: decided at %v with a deadline at %v, want at %v by %v", i, at, by, w.at, w.by)
		}
	}
	if !rt.State("s2").Drain() {
		t.Errorf("s2 not drained")
	}
}
