package loop

import (
	"context"
	"reflect"
	"testing"
	"time"

	"github.com/hapilot/hapilot/agent"
	"github.com/hapilot/hapilot/agent/guard"
	"github.com/hapilot/hapilot/internal/lab/fakes"
)

func scopeOf(t *testing.T, lines ...string) guard.Scope {
	t.Helper()
	var s guard.Scope
	for _, l := range lines {
		if err := s.Set(l); err != nil {
			t.Fatal(err)
		}
	}
	return s
}

// A backend whose action is maint is drained with maint, its change
// still the agent's the next step, and readied back; the rate cap
// counts the loop's own drains over the hour.
func TestMaintActionAndRateCap(t *testing.T) {
	ctx := context.Background()
	rt := fakes.NewRuntime("s1", "s2", "s3", "s4", "s5", "s6")
	l, clk, pol, _ := newLoop(rt)
	l.Guard.Scope = scopeOf(t, "app.action=maint")
	l.Guard.DrainsPerHour = 1
	l.Guard.MinServing = 1
	pol.plans = []agent.Plan{{drain("s2")}, {drain("s3")}, nil, {drain("s3")}}
	l.Step(ctx)
	if got := rt.TakeCommands(); !reflect.DeepEqual(got, []string{"set server app/s2 state maint"}) {
		t.Fatalf("commands %q", got)
	}
	rec := l.Step(ctx)
	if got := rt.TakeCommands(); got != nil || rec.Verdicts[0].Code != agent.RefusedRateCap {
		t.Fatalf("second drain within the hour: %q %+v", got, rec.Verdicts)
	}
	if c := l.View().Ledger()[agent.Key{Backend: "app", Server: "s2"}]; c.Phase != agent.PhaseDrained || !c.Maint {
		t.Fatalf("the maint is not the agent's: %v", l.View().Ledger())
	}
	clk.Advance(time.Hour)
	l.Step(ctx)
	if _, err := l.Control().Release(ctx, agent.Key{Backend: "app", Server: "s2"}, "test"); err != nil {
		t.Fatal(err)
	}
	l.Step(ctx)
	if got := rt.TakeCommands(); !reflect.DeepEqual(got, []string{"set server app/s2 state ready", "set server app/s3 state maint"}) {
		t.Fatalf("after the hour: %q", got)
	}
	sc := l.View().Status().Scope
	if len(sc) != 1 || sc[0].Action != guard.ActionMaint || sc[0].Rates == nil || sc[0].Rates.Used != 0 {
		t.Fatalf("scope %+v", sc)
	}
}
