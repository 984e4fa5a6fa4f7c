package loop

import (
	"context"
	"path/filepath"
	"reflect"
	"testing"
	"time"

	"github.com/hapilot/hapilot/agent"
	"github.com/hapilot/hapilot/agent/ledger"
	"github.com/hapilot/hapilot/haproxy"
	"github.com/hapilot/hapilot/internal/lab/fakes"
	"github.com/rs/zerolog"
)

// undoRecovery is a recovery that readies one server: the tail guard's
// undo of a weight cut.
type undoRecovery struct{ k agent.Key }

func (r undoRecovery) Plan(context.Context, agent.Observation) agent.Plan {
	return agent.Plan{{Kind: agent.Ready, Backend: r.k.Backend, Server: r.k.Server, Reason: "tail-latency guard", Origin: agent.OriginRecovery}}
}
func (undoRecovery) RequestProbe(agent.Key) {}

// Every undo sends the same commands for the same server, and leaves it
// at its configured state with no change of the agent's on record: here
// s2 drained with recovery's canary weight staged (2 of 10), and s5 cut
// to 2. Before, --on-exit restore sent only `state ready` to s2, left it
// at 2 of 10 and recorded a canary, while ctl restore also sent `set
// weight 10`.
func TestEveryUndoSendsTheSameCommands(t *testing.T) {
	ctx := context.Background()
	// setup: the agent drains s2 and cuts s5, then recovery stages s2's
	// canary weight (as its SetWeight on a drained server does: the
	// drain stays the change in force).
	setup := func(t *testing.T) (*Loop, *fakes.Runtime, string, *fakes.Clock) {
		file := filepath.Join(t.TempDir(), "state.json")
		rt := fakes.NewRuntime("s1", "s2", "s3", "s4", "s5", "s6")
		l, clk, pol, _ := newLoop(rt)
		l.StateFile = file
		pol.plans = []agent.Plan{{drain("s2"), {Kind: agent.SetWeight, Backend: "app", Server: "s5", Weight: 2}}}
		l.Step(ctx)
		rt.Set("s2", func(s *haproxy.ServerState) { s.Weight = 2 })
		l.theLedger().Cut(key("app", "s2"), 2, 10, clk.Now(), "re-admission: canary weight before ready", 0)
		if got := rt.TakeCommands(); len(got) != 2 {
			t.Fatalf("setup commands %q", got)
		}
		if c := l.View().Ledger(); c[key("app", "s2")].Phase != agent.PhaseDrained || c[key("app", "s5")].Phase != agent.PhaseCut {
			t.Fatalf("setup ledger %v", c)
		}
		return l, rt, file, clk
	}
	s2 := []string{"set server app/s2 state ready", "set weight app/s2 10"}
	s5 := []string{"set weight app/s5 10"}
	for _, tc := range []struct {
		path string
		undo func(t *testing.T, l *Loop, rt *fakes.Runtime, file string, clk *fakes.Clock)
		want []string
	}{
		{"--on-exit restore", func(t *testing.T, l *Loop, _ *fakes.Runtime, _ string, _ *fakes.Clock) { l.Control().Undo(ctx) }, append(s2, s5...)},
		{"ctl restore", func(t *testing.T, l *Loop, _ *fakes.Runtime, _ string, _ *fakes.Clock) {
			if _, err := l.Control().Restore(ctx, "test"); err != nil {
				t.Fatal(err)
			}
		}, append(s2, s5...)},
		{"ctl release", func(t *testing.T, l *Loop, _ *fakes.Runtime, _ string, _ *fakes.Clock) {
			for _, s := range []string{"s2", "s5"} {
				if _, err := l.Control().Release(ctx, key("app", s), "test"); err != nil {
					t.Fatal(err)
				}
			}
		}, append(s2, s5...)},
		{"hapilot restore", func(t *testing.T, _ *Loop, rt *fakes.Runtime, file string, clk *fakes.Clock) {
			if _, err := RestoreFromState(ctx, file, []agent.Runtime{rt}, time.Hour, clk.Now(), zerolog.Nop()); err != nil {
				t.Fatal(err)
			}
		}, append(s2, s5...)},
		// Recovery's undo of a weight cut (the tail guard's ready); its
		// re-admission of a drained server is not an undo: it readies at
		// the weight it staged, and ramps from there.
		{"recovery's undo of a cut", func(t *testing.T, l *Loop, _ *fakes.Runtime, _ string, _ *fakes.Clock) {
			l.Recovery = undoRecovery{key("app", "s5")}
			l.Step(ctx)
		}, s5},
	} {
		t.Run(tc.path, func(t *testing.T) {
			l, rt, file, clk := setup(t)
			tc.undo(t, l, rt, file, clk)
			if got := rt.TakeCommands(); !reflect.DeepEqual(got, tc.want) {
				t.Fatalf("commands %q, want %q", got, tc.want)
			}
			states, _ := rt.ShowServersState(ctx)
			for _, s := range states {
				undone := s.Server == "s5" || len(tc.want) > 1
				if undone && (s.AdminState != 0 || s.Weight != s.Initial) {
					t.Errorf("%s left at admin %d, weight %d of %d", s.Server, s.AdminState, s.Weight, s.Initial)
				}
			}
			if _, ok := ledger.New(file, zerolog.Nop()).Changes()[key("app", "s5")]; ok {
				t.Errorf("s5's cut still on record: %v", ledger.New(file, zerolog.Nop()).Changes())
			}
			if c, ok := ledger.New(file, zerolog.Nop()).Changes()[key("app", "s2")]; ok && len(tc.want) > 1 {
				t.Errorf("s2 still on record after its undo: %+v", c)
			}
		})
	}
}
