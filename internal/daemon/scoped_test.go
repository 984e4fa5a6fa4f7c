package daemon

import (
	"context"
	"testing"

	"github.com/hapilot/hapilot/agent"
	"github.com/hapilot/hapilot/agent/policy/rules"
	"github.com/hapilot/hapilot/haproxy"
	"github.com/hapilot/hapilot/internal/window"
)

// One server of four failing 6% against peers at 1%: a ratio of 6. A
// backend whose block asks a minimum ratio of 8 keeps it; the same
// figures under the global ratio drain it.
func TestScopedRulesRatio(t *testing.T) {
	backend := func(name string) agent.BackendView {
		b := agent.BackendView{Name: name}
		for i, errs := range []uint64{60, 10, 10, 10} {
			s := string(rune('a' + i))
			st := window.Stats{Backend: name, Server: s, Requests: 1000, Err5xx: errs}
			b.Servers = append(b.Servers, agent.ServerView{Backend: name, Server: s, Owner: agent.OwnerNone, Window: st, Recent: st,
				State: haproxy.ServerState{Backend: name, Server: s, OpState: haproxy.OpRunning, Weight: 1, Initial: 1}})
		}
		return b
	}
	obs := agent.Observation{Backends: []agent.BackendView{backend("loose"), backend("strict")}}
	var scope agent.Scope
	if err := scope.Set("strict.rules-min-ratio=8"); err != nil {
		t.Fatal(err)
	}
	base := rules.DefaultConfig()
	base.MinErrors, base.MinRequests = 5, 100
	for _, tc := range []struct {
		name  string
		scope agent.Scope
		want  map[string]bool
	}{
		{"no block: both", nil, map[string]bool{"loose": true, "strict": true}},
		{"strict's own ratio", scope, map[string]bool{"loose": true}},
	} {
		pol := scopedRules(base, tc.scope)
		plan, err := pol.Decide(context.Background(), obs)
		if err != nil {
			t.Fatal(err)
		}
		got := map[string]bool{}
		for _, a := range plan {
			if a.Kind == agent.Drain && a.Server == "a" {
				got[a.Backend] = true
			}
		}
		ev := map[string]bool{}
		for _, k := range pol.Evidence(obs) {
			ev[k.Backend] = true
		}
		if len(got) != len(tc.want) || len(ev) != len(tc.want) {
			t.Fatalf("%s: drains %v, evidence %v, want %v (plan %+v)", tc.name, got, ev, tc.want, plan)
		}
		for b := range tc.want {
			if !got[b] || !ev[b] {
				t.Fatalf("%s: drains %v, evidence %v, want %v", tc.name, got, ev, tc.want)
			}
		}
	}
}
