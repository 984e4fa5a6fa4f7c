package loop

import (
	"context"
	"errors"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/hapilot/hapilot/agent"
	"github.com/hapilot/hapilot/haproxy"
	"github.com/hapilot/hapilot/internal/lab/fakes"
	"github.com/rs/zerolog"
)

// In observe mode, and on a paused backend, a vetted action is recorded
// as a would-action with its reason, and no command reaches HAProxy; a
// refusal stays a refusal. Enforce sends it.
func TestHeldBackActions(t *testing.T) {
	ctx := context.Background()
	tests := []struct {
		name     string
		mode     agent.Mode
		pause    string // backend to pause, "" none
		wantCmds []string
		wantWhy  string // a word of the would's reason; "" for none
	}{
		{"enforce sends", agent.ModeEnforce, "", []string{"set server app/s2 state drain"}, ""},
		{"zero mode enforces", "", "", []string{"set server app/s2 state drain"}, ""},
		{"observe holds back", agent.ModeObserve, "", nil, "observe mode"},
		{"pause of every backend", agent.ModeEnforce, agent.AllBackends, nil, "every backend"},
		{"pause of its backend", agent.ModeEnforce, "app", nil, "backend app"},
		// No backend other in HAProxy: the pause is refused, and holds nothing.
		{"pause of an unknown backend", agent.ModeEnforce, "other", []string{"set server app/s2 state drain"}, ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			rt := fakes.NewRuntime("s1", "s2", "s3", "s4")
			l, _, pol, _ := newLoop(rt)
			l.Mode = tc.mode
			if tc.pause != "" {
				_, err := l.Control().Pause(ctx, tc.pause, 0, "test")
				if (err != nil) != (tc.pause == "other") || (err != nil && !errors.Is(err, agent.ErrRefused)) {
					t.Fatalf("pause %s: %v", tc.pause, err)
				}
			}
			// s1's drain is refused (the drain cap): a refusal, never a would.
			pol.plans = []agent.Plan{{drain("s2"), drain("s1")}, {drain("s2"), drain("s1")}}
			rec := l.Step(ctx)
			if got := rt.TakeCommands(); !reflect.DeepEqual(got, tc.wantCmds) {
				t.Fatalf("commands %q, want %q", got, tc.wantCmds)
			}
			m := l.View().Metrics()
			if tc.wantWhy == "" {
				if len(rec.Would) != 0 || len(l.View().Ledger()) != 1 || m.Applied != 1 {
					t.Fatalf("would %+v, ledger %v, applied %d", rec.Would, l.View().Ledger(), m.Applied)
				}
				return
			}
			if len(rec.Would) != 1 || rec.Would[0].Kind != agent.WouldDrain || rec.Would[0].Action.Server != "s2" || !strings.Contains(rec.Would[0].Why, tc.wantWhy) {
				t.Fatalf("would %+v, want a would-drain of s2 for %q", rec.Would, tc.wantWhy)
			}
			if len(l.View().Ledger()) != 0 || m.Applied != 0 || m.Refused != 1 || m.RefusedBy[agent.RefusedDrainCap] != 1 {
				t.Fatalf("ledger %v, counters %+v", l.View().Ledger(), m)
			}
			st := l.View().Status()
			if d := st.Decisions[0]; d.Would == "" || d.WouldKind != agent.WouldDrain {
				t.Fatalf("status decision %+v", d)
			}
			// The same would-action a second step is counted once.
			l.Step(ctx)
			if rt.TakeCommands() != nil || l.View().Metrics().Would[agent.WouldDrain] != 1 {
				t.Fatalf("second step: would %v", l.View().Metrics().Would)
			}
		})
	}
}

// A pause for a duration ends by itself (the clock is the test's); one
// without ends at resume; either survives a restart with the state file.
func TestPauseForAndSurvivesRestart(t *testing.T) {
	ctx := context.Background()
	file := filepath.Join(t.TempDir(), "state.json")
	rt := fakes.NewRuntime("s1", "s2", "s3", "s4")
	l, clk, pol, _ := newLoop(rt)
	l.StateFile = file
	if _, err := l.Control().Pause(ctx, "app", 2*time.Minute, "test"); err != nil {
		t.Fatal(err)
	}
	pol.plans = []agent.Plan{{drain("s2")}}
	if rec := l.Step(ctx); len(rec.Would) != 1 || rt.TakeCommands() != nil {
		t.Fatalf("paused step: would %+v", rec.Would)
	}

	// A new agent on the same state file is paused too.
	l2, _, pol2, _ := newLoop(rt)
	l2.Clock, l2.StateFile = clk, file
	if p := l2.View().Pauses(); len(p) != 1 || p[0].Backend != "app" {
		t.Fatalf("pauses after restart %+v", p)
	}
	pol2.plans = []agent.Plan{{drain("s2")}, {drain("s2")}}
	if rec := l2.Step(ctx); len(rec.Would) != 1 || rt.TakeCommands() != nil {
		t.Fatalf("restarted, paused: would %+v", rec.Would)
	}
	clk.Advance(2 * time.Minute)
	if rec := l2.Step(ctx); len(rec.Would) != 0 {
		t.Fatalf("after the pause: would %+v", rec.Would)
	}
	if got := rt.TakeCommands(); !reflect.DeepEqual(got, []string{"set server app/s2 state drain"}) {
		t.Fatalf("after the pause: commands %q", got)
	}
	if p := l2.View().Pauses(); len(p) != 0 {
		t.Fatalf("expired pause still listed: %+v", p)
	}

	if _, err := l2.Control().Pause(ctx, agent.AllBackends, 0, "test"); err != nil {
		t.Fatal(err)
	}
	if ended := l2.Control().Resume("", "test"); len(ended) != 1 || ended[0].Backend != agent.AllBackends {
		t.Fatalf("resume ended %+v", ended)
	}
}

// release brings the agent's drain back now and leaves the server to
// the operator: the policy's next drain of it is refused with the
// operator's reason. Anything not the agent's is refused with a reason.
func TestRelease(t *testing.T) {
	ctx := context.Background()
	rt := fakes.NewRuntime("s1", "s2", "s3", "s4")
	rt.Set("s4", func(s *haproxy.ServerState) { s.AdminState = haproxy.AdminForcedMaint })
	l, clk, pol, _ := newLoop(rt)
	pol.plans = []agent.Plan{{drain("s2")}, {drain("s2")}}
	l.Step(ctx)
	rt.TakeCommands()

	for _, tc := range []struct {
		server, why string
	}{{"s4", "not the agent's change (owner operator"}, {"s1", "not the agent's change (owner none"}, {"s9", "no server app/s9"}} {
		_, err := l.Control().Release(ctx, agent.Key{Backend: "app", Server: tc.server}, "test")
		if !errors.Is(err, agent.ErrRefused) || !strings.Contains(err.Error(), tc.why) {
			t.Errorf("release %s: %v, want refused for %q", tc.server, err, tc.why)
		}
	}
	if got := rt.TakeCommands(); got != nil {
		t.Fatalf("refused releases sent %q", got)
	}

	r, err := l.Control().Release(ctx, agent.Key{Backend: "app", Server: "s2"}, "test")
	if err != nil || r.Was.Phase != agent.PhaseDrained || !r.Until.Equal(clk.Now().Add(agent.DefaultOperatorHold)) {
		t.Fatalf("release: %+v, %v", r, err)
	}
	if got := rt.TakeCommands(); !reflect.DeepEqual(got, []string{"set server app/s2 state ready"}) {
		t.Fatalf("release sent %q", got)
	}
	rec := l.Step(ctx)
	if got := rt.TakeCommands(); got != nil || len(rec.Verdicts) != 1 || rec.Verdicts[0].Code != agent.RefusedOperator {
		t.Fatalf("after release: commands %q, verdicts %+v", got, rec.Verdicts)
	}
}

// restore releases every server the agent changed, drained or cut; the
// offline restore does the same from the state file alone, and leaves a
// server someone changed since as it is.
func TestRestore(t *testing.T) {
	ctx := context.Background()
	for _, offline := range []bool{false, true} {
		name := "ctl"
		if offline {
			name = "offline"
		}
		t.Run(name, func(t *testing.T) {
			file := filepath.Join(t.TempDir(), "state.json")
			rt := fakes.NewRuntime("s1", "s2", "s3", "s4", "s5", "s6")
			l, clk, pol, _ := newLoop(rt)
			l.StateFile = file
			pol.plans = []agent.Plan{{drain("s2"), {Kind: agent.SetWeight, Backend: "app", Server: "s5", Weight: 5}}, {drain("s3")}}
			l.Step(ctx)
			l.Step(ctx)
			rt.TakeCommands()
			if len(l.View().Ledger()) != 3 {
				t.Fatalf("ledger %v", l.View().Ledger())
			}
			// The operator readies s3 behind the agent's back.
			rt.Set("s3", func(s *haproxy.ServerState) { s.AdminState = 0 })
			var got []Released
			var err error
			if offline {
				got, err = RestoreFromState(ctx, file, []agent.Runtime{rt}, time.Hour, clk.Now(), zerolog.Nop())
			} else {
				got, err = l.Control().Restore(ctx, "test")
			}
			if err != nil {
				t.Fatal(err)
			}
			cmds := rt.TakeCommands()
			want := []string{"set server app/s2 state ready", "set weight app/s5 10"}
			if !reflect.DeepEqual(cmds, want) {
				t.Fatalf("commands %q, want %q (%+v)", cmds, want, got)
			}
			if offline {
				if len(got) != 3 || !strings.Contains(got[1].Error, "no longer the agent's change") {
					t.Fatalf("offline restore %+v", got)
				}
				l2, _, _, _ := newLoop(rt)
				l2.StateFile = file
				if len(l2.View().Ledger()) != 0 {
					t.Fatalf("state file after offline restore holds %v", l2.View().Ledger())
				}
			} else if len(got) != 2 || len(l.View().Ledger()) != 0 {
				t.Fatalf("restore %+v, ledger %v", got, l.View().Ledger())
			}
		})
	}
}

// After a restart (SIGKILL: nothing ran at exit) the state file keeps the
// agent's drains its own, and the first step lists every server out of
// rotation with who holds it: the agent, the operator it saw, or unknown.
func TestInventoryAfterRestart(t *testing.T) {
	ctx := context.Background()
	file := filepath.Join(t.TempDir(), "state.json")
	rt := fakes.NewRuntime("s1", "s2", "s3", "s4", "s5", "s6")
	rt.Set("s5", func(s *haproxy.ServerState) { s.AdminState = haproxy.AdminForcedMaint }) // the operator's, seen
	l, _, pol, _ := newLoop(rt)
	l.StateFile = file
	pol.plans = []agent.Plan{{drain("s2")}}
	l.Step(ctx)
	rt.TakeCommands()
	// While no agent runs, someone drains s6.
	rt.Set("s6", func(s *haproxy.ServerState) { s.AdminState = haproxy.AdminForcedDrain })

	l2, _, _, _ := newLoop(rt)
	l2.StateFile = file
	l2.Step(ctx)
	got := map[string]Holder{}
	for _, h := range l2.View().Status().Inventory {
		got[h.Server.Server] = h.Holder
	}
	want := map[string]Holder{"s2": HeldByAgent, "s5": HeldByOperator, "s6": HeldByUnknown}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("inventory %v, want %v", got, want)
	}
	if c, ok := l2.View().Ledger()[agent.Key{Backend: "app", Server: "s2"}]; !ok || c.Phase != agent.PhaseDrained {
		t.Fatalf("the restarted agent does not own its drain: %v", l2.View().Ledger())
	}
}

// probing is a Recovery that knows one server's probes.
type probing struct{ at time.Time }

func (probing) Plan(context.Context, agent.Observation) agent.Plan { return nil }
func (probing) RequestProbe(agent.Key)                             {}
func (p probing) Probe(k agent.Key) (agent.ProbeStatus, bool) {
	return agent.ProbeStatus{Next: p.at, LastBurst: "3 of 20 failed", FailedBursts: 1, Drains: 1}, k.Server == "s2"
}

// explain gives the server's last view, whether the test finds it, the
// recent decisions on it and recovery's next probe; an unknown server is
// refused with the reason.
func TestExplain(t *testing.T) {
	ctx := context.Background()
	rt := fakes.NewRuntime("s1", "s2", "s3", "s4")
	l, clk, pol, _ := newLoop(rt)
	if _, err := l.Control().Explain(agent.Key{Backend: "app", Server: "s2"}); !errors.Is(err, agent.ErrRefused) || !strings.Contains(err.Error(), "no step has read HAProxy yet") {
		t.Fatalf("before a step: %v", err)
	}
	l.Recovery = probing{at: clk.Now().Add(time.Minute)}
	pol.plans = []agent.Plan{{drain("s2"), drain("s1")}}
	l.Step(ctx)
	e, err := l.Control().Explain(agent.Key{Backend: "app", Server: "s2"})
	if err != nil || e.View == nil || e.Change == nil || e.Change.Phase != agent.PhaseDrained || e.Serving != 4 || e.Servers != 4 || len(e.Decisions) != 1 ||
		e.Probe == nil || !e.Probe.Next.Equal(clk.Now().Add(time.Minute)) {
		t.Fatalf("explain s2: %+v, %v", e, err)
	}
	if e, err := l.Control().Explain(agent.Key{Backend: "app", Server: "s1"}); err != nil || len(e.Decisions) != 1 || e.Decisions[0].Code != agent.RefusedDrainCap || e.Probe != nil {
		t.Fatalf("explain s1: %+v, %v", e, err)
	}
	if _, err := l.Control().Explain(agent.Key{Backend: "app", Server: "s9"}); !errors.Is(err, agent.ErrRefused) {
		t.Fatalf("explain s9: %v", err)
	}
}
