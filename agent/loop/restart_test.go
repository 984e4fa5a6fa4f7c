package loop

import (
	"context"
	"os"
	"path/filepath"
	"reflect"
	"testing"

	"github.com/hapilot/hapilot/agent"
	"github.com/hapilot/hapilot/haproxy"
	"github.com/hapilot/hapilot/internal/lab/fakes"
)

// A reload (new HAProxy process, servers back at their configured state)
// loses the agent's drain: the next step applies it again, outside the
// per-step drain count, and the audit says so.
func TestReloadLostDrainIsReapplied(t *testing.T) {
	rt := fakes.NewRuntime("s1", "s2", "s3", "s4", "s5", "s6")
	l, _, pol, _ := newLoop(rt)
	pol.plans = []agent.Plan{{drain("s3")}, {drain("s6")}}
	l.Step(context.Background())
	l.Step(context.Background())
	rt.TakeCommands()
	rt.Reload()
	pol.plans = []agent.Plan{{drain("s1")}} // and the policy wants one more
	rec := l.Step(context.Background())
	got := rt.TakeCommands()
	want := []string{"set server app/s3 state drain", "set server app/s6 state drain"}
	if !reflect.DeepEqual(got[:2], want) && !reflect.DeepEqual(got[:2], []string{want[1], want[0]}) {
		t.Fatalf("after reload: %q (verdicts %+v)", got, rec.Verdicts)
	}
	// s1 would leave 3 of 6 serving: the floor allows it, the count too
	// (restores do not count).
	if len(got) != 3 || got[2] != "set server app/s1 state drain" {
		t.Fatalf("commands %q", got)
	}
	if n := len(l.View().Ledger()); n != 3 {
		t.Fatalf("ledger %v", l.View().Ledger())
	}
	// A further step with nothing lost sends nothing.
	l.Step(context.Background())
	if got := rt.TakeCommands(); len(got) != 0 {
		t.Fatalf("steady state sent %q", got)
	}
}

// Without a reload, a drain that comes back ready was undone by someone:
// it is theirs now, and never re-applied.
func TestUndoneDrainIsNotReapplied(t *testing.T) {
	rt := fakes.NewRuntime("s1", "s2", "s3")
	l, _, pol, _ := newLoop(rt)
	pol.plans = []agent.Plan{{drain("s2")}}
	l.Step(context.Background())
	rt.TakeCommands()
	rt.Set("s2", func(s *haproxy.ServerState) { s.AdminState = 0 })
	l.Step(context.Background())
	if got := rt.TakeCommands(); len(got) != 0 || len(l.View().Ledger()) != 0 {
		t.Fatalf("commands %q, ledger %v", got, l.View().Ledger())
	}
}

// The state file carries the agent's changes across its own restarts: a
// new agent takes its drains back without a command, drops one the
// operator undid while it was down, and re-applies one a reload lost.
func TestStateFileAcrossAgentRestarts(t *testing.T) {
	file := filepath.Join(t.TempDir(), "state.json")
	rt := fakes.NewRuntime("s1", "s2", "s3", "s4", "s5", "s6")
	first, _, pol, _ := newLoop(rt)
	first.StateFile = file
	pol.plans = []agent.Plan{{drain("s2")}, {drain("s4")}}
	first.Step(context.Background())
	first.Step(context.Background())
	rt.TakeCommands()
	if _, err := os.Stat(file); err != nil {
		t.Fatal(err)
	}

	// The agent dies; a new one starts on the same state file.
	second, _, _, _ := newLoop(rt)
	second.StateFile = file
	rec := second.Step(context.Background())
	if got := rt.TakeCommands(); len(got) != 0 {
		t.Fatalf("restart sent %q", got)
	}
	owners := map[string]agent.Owner{}
	for _, s := range rec.Servers {
		owners[s.Server] = s.Owner
	}
	if owners["s2"] != agent.OwnerAgent || owners["s4"] != agent.OwnerAgent {
		t.Fatalf("owners after restart %v", owners)
	}

	// Down again: the operator readies s2, then HAProxy reloads.
	rt.Set("s2", func(s *haproxy.ServerState) { s.AdminState = 0 })
	third, _, _, _ := newLoop(rt)
	third.StateFile = file
	third.Step(context.Background())
	if got := rt.TakeCommands(); len(got) != 0 || len(third.View().Ledger()) != 1 {
		t.Fatalf("operator's ready: commands %q, ledger %v", got, third.View().Ledger())
	}
	rt.Reload()
	third.Step(context.Background())
	if got := rt.TakeCommands(); !reflect.DeepEqual(got, []string{"set server app/s4 state drain"}) {
		t.Fatalf("after reload: %q", got)
	}
}

func TestUndoRestoresEverything(t *testing.T) {
	rt := fakes.NewRuntime("s1", "s2", "s3", "s4")
	l, _, pol, _ := newLoop(rt)
	rt.Set("s4", func(s *haproxy.ServerState) { s.AdminState = haproxy.AdminForcedMaint })
	pol.plans = []agent.Plan{{drain("s2"), {Kind: agent.SetWeight, Backend: "app", Server: "s1", Weight: 5}}}
	l.Step(context.Background())
	rt.TakeCommands()
	l.Control().Undo(context.Background())
	got := rt.TakeCommands()
	want := []string{"set weight app/s1 10", "set server app/s2 state ready"}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("undo sent %q, want %q", got, want)
	}
	st, _ := rt.ShowServersState(context.Background())
	if st[3].AdminState != haproxy.AdminForcedMaint || len(l.View().Ledger()) != 0 {
		t.Fatalf("operator's maint %+v, ledger %v", st[3], l.View().Ledger())
	}
}

// In observe mode --on-exit restore sends nothing either: the drains an
// earlier enforce run left stay, for the operator's own restore.
func TestUndoInObserveModeSendsNothing(t *testing.T) {
	rt := fakes.NewRuntime("s1", "s2", "s3", "s4")
	l, _, pol, _ := newLoop(rt)
	pol.plans = []agent.Plan{{drain("s2")}}
	l.Step(context.Background())
	rt.TakeCommands()
	l.Mode = agent.ModeObserve
	if res := l.Control().Undo(context.Background()); res != nil || rt.TakeCommands() != nil || len(l.View().Ledger()) != 1 {
		t.Fatalf("undo in observe mode: %v, ledger %v", res, l.View().Ledger())
	}
}
