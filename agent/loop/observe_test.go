package loop

import (
	"context"
	"testing"

	"github.com/hapilot/hapilot/agent"
	"github.com/hapilot/hapilot/haproxy"
	"github.com/hapilot/hapilot/internal/lab/fakes"
)

// observe only reads: what it finds that the loop must record (here an
// operator's undo of the agent's drain of s2, and s4 found in the
// operator's maint) changes the ledger only when settle applies it, as
// the step does. Before, observe wrote the ledger as it read.
func TestObserveOnlyReads(t *testing.T) {
	ctx := context.Background()
	rt := fakes.NewRuntime("s1", "s2", "s3", "s4")
	l, clk, pol, _ := newLoop(rt)
	l.OperatorHold = agent.DefaultOperatorHold
	pol.plans = []agent.Plan{{drain("s2")}}
	l.Step(ctx)
	rt.TakeCommands()
	rt.Set("s2", func(s *haproxy.ServerState) { s.AdminState = 0 })                        // the operator's undo
	rt.Set("s4", func(s *haproxy.ServerState) { s.AdminState = haproxy.AdminForcedMaint }) // the operator's maint
	lg := l.theLedger()
	obs, _, f, err := l.observe(ctx, clk.Now(), 2)
	if err != nil {
		t.Fatal(err)
	}
	if _, v := obs.Find("app", "s2"); v == nil || v.Owner != agent.OwnerOperator || v.OperatorUntil.IsZero() {
		t.Fatalf("observe's word on s2: %+v", v)
	}
	if _, ok := lg.Changes()[key("app", "s2")]; !ok {
		t.Fatal("observe dropped s2's change from the ledger")
	}
	if !lg.OverriddenUntil(key("app", "s2")).IsZero() || lg.SeenOperator(key("app", "s4")) {
		t.Fatal("observe recorded the operator's servers")
	}
	l.settle(f)
	if _, ok := lg.Changes()[key("app", "s2")]; ok {
		t.Fatal("settle kept s2's change, which the operator undid")
	}
	if lg.OverriddenUntil(key("app", "s2")).IsZero() || !lg.SeenOperator(key("app", "s4")) {
		t.Fatal("settle did not record the operator's servers")
	}
}
