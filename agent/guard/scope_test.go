package guard

import (
	"reflect"
	"strings"
	"testing"

	"github.com/hapilot/hapilot/agent"
	"github.com/hapilot/hapilot/haproxy"
)

func TestScopeSet(t *testing.T) {
	tests := []struct {
		in  string
		err string // "" for none
	}{
		{"app.enabled=false", ""},
		{"api.v2.max-drained=25%", ""}, // a name with dots: the key is after the last
		{"api-*.leave-alone=srv1,db*", ""},
		{"app.action=maint", ""},
		{"app.rules-arl-days=10000", `unknown key "rules-arl-days"`}, // the rules' own (rules.Blocks)
		{"app.frobnicate=1", `unknown key "frobnicate"`},
		{"app.enabled", "want PATTERN.KEY=VALUE"},
		{"enabled=true", "want PATTERN.KEY=VALUE"},
		{"app.max-drained=150%", "want a count"},
		{"app.action=kill", "want drain or maint"},
		{"app.min-serving=-1", "negative"},
		{"[.enabled=true", "pattern"},
	}
	for _, tc := range tests {
		var s Scope
		err := s.Set(tc.in)
		if (tc.err == "") != (err == nil) || (err != nil && !strings.Contains(err.Error(), tc.err)) {
			t.Errorf("Set(%q) = %v, want %q", tc.in, err, tc.err)
		}
	}
	s := scopeOf(t, "api-*.max-drained=2", "api-*.action=maint", "api-eu.max-drained=1", "api.v2.enabled=false")
	eu := s.For("api-eu")
	if *eu.MaxDrained != (Cap{N: 1}) || !eu.Maint() || eu.Pattern != "api-*,api-eu" || !eu.InScope() {
		t.Errorf("api-eu: %+v", eu)
	}
	if s.For("api.v2").InScope() || !s.For("web").InScope() {
		t.Error("scope of api.v2 or web")
	}
	// A name's own block and the globs merge in the config's order,
	// whichever comes first.
	for _, tc := range []struct {
		lines  []string
		want   int
		blocks string
	}{
		{[]string{"app.max-drained=1", "a*.max-drained=2", "*.max-drained=3", "web.max-drained=4"}, 3, "app,a*,*"},
		{[]string{"*.max-drained=3", "app.max-drained=1", "a*.max-drained=2"}, 2, "*,app,a*"},
		{[]string{"a*.max-drained=2", "*.max-drained=3", "app.max-drained=1", "app.action=maint"}, 1, "a*,*,app"},
	} {
		got := scopeOf(t, tc.lines...).For("app")
		if got.MaxDrained == nil || got.MaxDrained.N != tc.want || got.Pattern != tc.blocks {
			t.Errorf("%v: %+v, want max-drained %d from %s", tc.lines, got, tc.want, tc.blocks)
		}
	}
}

// The scope's guards, each refusal with its code and reason.
func TestScopeGuards(t *testing.T) {
	two := func() *agent.Observation {
		return &agent.Observation{Backends: []agent.BackendView{
			{Name: "app", Servers: []agent.ServerView{sv("s1"), sv("s2"), sv("s3"), sv("s4"), sv("s5", drainedByAgent), sv("s6")}},
			{Name: "web", Servers: []agent.ServerView{{Backend: "web", Server: "w1", Owner: agent.OwnerNone, State: haproxy.ServerState{Backend: "web", Server: "w1", OpState: haproxy.OpRunning, Weight: 1, Initial: 1}},
				{Backend: "web", Server: "w2", Owner: agent.OwnerNone, State: haproxy.ServerState{Backend: "web", Server: "w2", OpState: haproxy.OpRunning, Weight: 1, Initial: 1}}}},
		}}
	}
	tests := []struct {
		name   string
		scope  []string
		global Cap
		perH   int
		hour   map[string]int
		plan   agent.Plan
		accept []bool
		code   agent.Refusal // of the last refusal
	}{
		{"in scope", nil, Cap{}, 0, nil, agent.Plan{drain("s2")}, []bool{true}, ""},
		{"out of scope", []string{"app.enabled=false"}, Cap{}, 0, nil, agent.Plan{drain("s2")}, []bool{false}, agent.RefusedOutOfScope},
		{"out of scope by glob", []string{"a*.enabled=false"}, Cap{}, 0, nil, agent.Plan{drain("s2")}, []bool{false}, agent.RefusedOutOfScope},
		{"out of scope: recovery's ready still passes", []string{"app.enabled=false"}, Cap{}, 0, nil,
			agent.Plan{{Kind: agent.Ready, Backend: "app", Server: "s5", Origin: agent.OriginRecovery}}, []bool{true}, ""},
		{"left alone", []string{"app.leave-alone=s1,s2"}, Cap{}, 0, nil, agent.Plan{drain("s2")}, []bool{false}, agent.RefusedLeftAlone},
		{"left alone: others not", []string{"app.leave-alone=s1"}, Cap{}, 0, nil, agent.Plan{drain("s2")}, []bool{true}, ""},
		{"max-drained 1 with one held", []string{"app.max-drained=1"}, Cap{}, 0, nil, agent.Plan{drain("s2")}, []bool{false}, agent.RefusedMaxDrained},
		{"max-drained 2", []string{"app.max-drained=2"}, Cap{}, 0, nil, agent.Plan{drain("s2")}, []bool{true}, ""},
		{"max-drained 34% of 6 is 2", []string{"app.max-drained=34%"}, Cap{}, 0, nil, agent.Plan{drain("s2")}, []bool{true}, ""},
		{"max-drained 20% of 6 is 1", []string{"app.max-drained=20%"}, Cap{}, 0, nil, agent.Plan{drain("s2")}, []bool{false}, agent.RefusedMaxDrained},
		{"global max-drained 1", nil, Cap{N: 1}, 0, nil, agent.Plan{drain("s2")}, []bool{false}, agent.RefusedMaxDrained},
		{"rate cap reached", nil, Cap{}, 2, map[string]int{"app": 2}, agent.Plan{drain("s2")}, []bool{false}, agent.RefusedRateCap},
		{"rate cap not reached", nil, Cap{}, 2, map[string]int{"app": 1}, agent.Plan{drain("s2")}, []bool{true}, ""},
		{"per-backend floor", []string{"app.min-serving=5"}, Cap{}, 0, nil, agent.Plan{drain("s2")}, []bool{false}, agent.RefusedFloor},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			g := DefaultGuardrails()
			g.Scope, g.MaxDrained, g.DrainsPerHour = scopeOf(t, tc.scope...), tc.global, tc.perH
			obs := two()
			obs.DrainsLastHour = tc.hour
			vs := g.Vet(obs, tc.plan)
			var got []bool
			var code agent.Refusal
			for _, v := range vs {
				got = append(got, v.Accepted)
				if !v.Accepted {
					code = v.Code
					if v.Reason == "" {
						t.Errorf("refusal without a reason: %+v", v)
					}
				}
			}
			if !reflect.DeepEqual(got, tc.accept) || code != tc.code {
				t.Fatalf("accepted %v code %q, want %v %q (%+v)", got, code, tc.accept, tc.code, vs)
			}
		})
	}
}

func scopeOf(t *testing.T, lines ...string) Scope {
	t.Helper()
	var s Scope
	for _, l := range lines {
		if err := s.Set(l); err != nil {
			t.Fatal(err)
		}
	}
	return s
}
