package guard

import (
	"fmt"
	"reflect"
	"testing"

	"github.com/hapilot/hapilot/agent"
	"github.com/hapilot/hapilot/haproxy"
)

func TestGuardrails(t *testing.T) {
	six := obsOf(sv("s1"), sv("s2"), sv("s3"), sv("s4"), sv("s5"), sv("s6"))
	tests := []struct {
		name    string
		obs     *agent.Observation
		plan    agent.Plan
		accept  []bool
		code    agent.Refusal // the last refusal's code
		applied int           // weight applied by the last accepted set_weight
	}{
		{"one drain", six, agent.Plan{drain("s3")}, []bool{true}, "", 0},
		{"second drain refused", six, agent.Plan{drain("s3"), drain("s6")}, []bool{true, false}, agent.RefusedDrainCap, 0},
		{"max 3 actions", six, agent.Plan{
			{Kind: agent.SetWeight, Backend: "app", Server: "s1", Weight: 90}, {Kind: agent.SetWeight, Backend: "app", Server: "s2", Weight: 90},
			{Kind: agent.SetWeight, Backend: "app", Server: "s4", Weight: 90}, {Kind: agent.SetWeight, Backend: "app", Server: "s5", Weight: 90}},
			[]bool{true, true, true, false}, agent.RefusedActionCap, 0},
		{"unknown server", six, agent.Plan{drain("s9")}, []bool{false}, agent.RefusedUnknownServer, 0},
		{"unknown backend", six, agent.Plan{{Kind: agent.Drain, Backend: "nope", Server: "s1"}}, []bool{false}, agent.RefusedUnknownServer, 0},
		{"operator maint untouched", obsOf(sv("s1"), sv("s2", operatorMaint), sv("s3")), agent.Plan{{Kind: agent.Ready, Backend: "app", Server: "s2"}}, []bool{false}, agent.RefusedOperator, 0},
		{"operator maint not drained", obsOf(sv("s1"), sv("s2", operatorMaint), sv("s3")), agent.Plan{drain("s2")}, []bool{false}, agent.RefusedOperator, 0},
		{"recovery readies what the agent drained", obsOf(sv("s1"), sv("s2", drainedByAgent)), agent.Plan{{Kind: agent.Ready, Backend: "app", Server: "s2", Origin: agent.OriginRecovery}}, []bool{true}, "", 0},
		{"a policy's ready of a drained server waits for probes", obsOf(sv("s1"), sv("s2", drainedByAgent)), agent.Plan{{Kind: agent.Ready, Backend: "app", Server: "s2"}}, []bool{false}, agent.RefusedNeedsProbe, 0},
		{"ready a server nobody drained", obsOf(sv("s1"), sv("s2")), agent.Plan{{Kind: agent.Ready, Backend: "app", Server: "s2"}}, []bool{false}, agent.RefusedNotAgents, 0},
		{"floor of 2 servers", obsOf(sv("s1"), sv("s2", drainedByAgent)), agent.Plan{drain("s1")}, []bool{false}, agent.RefusedFloor, 0},
		{"floor of 3 servers", obsOf(sv("s1"), sv("s2"), sv("s3", drainedByAgent)), agent.Plan{drain("s1")}, []bool{false}, agent.RefusedFloor, 0},
		{"3 servers: one drain fits", obsOf(sv("s1"), sv("s2"), sv("s3")), agent.Plan{drain("s1")}, []bool{true}, "", 0},
		{"weight 0 counts against the floor", obsOf(sv("s1", func(v *agent.ServerView) { v.State.Weight = 30; v.State.Initial = 30 }), sv("s2", drainedByAgent)), agent.Plan{{Kind: agent.SetWeight, Backend: "app", Server: "s1", Weight: 0}}, []bool{false}, agent.RefusedFloor, 0},
		{"weight step clamped", six, agent.Plan{{Kind: agent.SetWeight, Backend: "app", Server: "s1", Weight: 10}}, []bool{true}, "", 50},
		{"a raise stops at the configured weight", obsOf(sv("s1", func(v *agent.ServerView) {
			v.State.Weight = 60
			v.Owner = agent.OwnerAgent
			v.Changed = &agent.Change{Phase: agent.PhaseCut, Weight: 60}
		}), sv("s2")), agent.Plan{{Kind: agent.SetWeight, Backend: "app", Server: "s1", Weight: 999}}, []bool{true}, "", 100},
		{"no raise past the configured weight", six, agent.Plan{{Kind: agent.SetWeight, Backend: "app", Server: "s1", Weight: 101}}, []bool{false}, agent.RefusedAboveConfig, 0},
		{"weight unchanged", six, agent.Plan{{Kind: agent.SetWeight, Backend: "app", Server: "s1", Weight: 100}}, []bool{false}, agent.RefusedNoChange, 0},
		{"one action per server", six, agent.Plan{drain("s1"), {Kind: agent.SetWeight, Backend: "app", Server: "s1", Weight: 90}}, []bool{true, false}, agent.RefusedTouched, 0},
		{"already drained", obsOf(sv("s1"), sv("s2"), sv("s3", drainedByAgent)), agent.Plan{drain("s3")}, []bool{false}, agent.RefusedNoChange, 0},
		{"unknown kind", six, agent.Plan{{Kind: "reboot", Backend: "app", Server: "s1"}}, []bool{false}, agent.RefusedUnknownKind, 0},
	}
	g := DefaultGuardrails()
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			vs := g.Vet(tc.obs, tc.plan)
			var got []bool
			var lastCode agent.Refusal
			lastWeight := 0
			for _, v := range vs {
				got = append(got, v.Accepted)
				if !v.Accepted {
					lastCode = v.Code
					if v.Reason == "" {
						t.Errorf("refusal without a reason: %+v", v)
					}
				} else if v.Applied.Kind == agent.SetWeight {
					lastWeight = v.Applied.Weight
				}
			}
			if !reflect.DeepEqual(got, tc.accept) {
				t.Fatalf("accepted %v, want %v (%+v)", got, tc.accept, vs)
			}
			if lastCode != tc.code {
				t.Fatalf("refused with %q, want %q (%+v)", lastCode, tc.code, vs)
			}
			if tc.applied != 0 && lastWeight != tc.applied {
				t.Fatalf("applied weight %d, want %d", lastWeight, tc.applied)
			}
		})
	}
}

func TestDrainCapScalesWithFleet(t *testing.T) {
	var servers []agent.ServerView
	var plan agent.Plan
	for i := 0; i < 24; i++ {
		name := fmt.Sprintf("s%d", i)
		servers = append(servers, sv(name))
		if i < 4 {
			plan = append(plan, drain(name))
		}
	}
	g := DefaultGuardrails()
	count := func() int {
		n := 0
		for _, v := range g.Vet(obsOf(servers...), plan) {
			if v.Accepted {
				n++
			}
		}
		return n
	}
	if n := count(); n != 1 {
		t.Fatalf("without DrainsPer: %d drains", n)
	}
	g.DrainsPer = 10
	if n := count(); n != 2 { // 24 servers / 10
		t.Fatalf("with DrainsPer 10: %d drains", n)
	}
}

func TestFloor(t *testing.T) {
	g := DefaultGuardrails()
	for n, want := range map[int]int{0: 1, 1: 1, 2: 1, 3: 2, 6: 3, 9: 5} {
		if got := g.Floor(n); got != want {
			t.Errorf("Floor(%d) = %d, want %d", n, got, want)
		}
	}
	g.MinServing = 4
	if g.Floor(9) != 4 {
		t.Error("MinServing ignored")
	}
}

func obsOf(servers ...agent.ServerView) *agent.Observation {
	return &agent.Observation{Backends: []agent.BackendView{{Name: "app", Servers: servers}}}
}

func sv(name string, mod ...func(*agent.ServerView)) agent.ServerView {
	v := agent.ServerView{Backend: "app", Server: name, Owner: agent.OwnerNone,
		State: haproxy.ServerState{Backend: "app", Server: name, OpState: haproxy.OpRunning, Weight: 100, Initial: 100}}
	for _, m := range mod {
		m(&v)
	}
	return v
}

func drainedByAgent(v *agent.ServerView) {
	v.State.AdminState = haproxy.AdminForcedDrain
	v.Owner = agent.OwnerAgent
	v.Changed = &agent.Change{Phase: agent.PhaseDrained}
}

func operatorMaint(v *agent.ServerView) {
	v.State.AdminState = haproxy.AdminForcedMaint
	v.Owner = agent.OwnerOperator
}

func drain(s string) agent.Action { return agent.Action{Kind: agent.Drain, Backend: "app", Server: s} }
