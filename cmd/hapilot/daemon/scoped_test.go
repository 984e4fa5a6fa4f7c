package daemon

import (
	"context"
	"testing"
	"time"

	"github.com/hapilot/hapilot/agent"
	"github.com/hapilot/hapilot/agent/policy/rules"
	"github.com/hapilot/hapilot/haproxy"
	"github.com/hapilot/hapilot/internal/lib/window"
)

// One server of four failing 8% against peers at 1%, 1,000 requests a
// second each, for a minute. Under the global degraded ratio (6: 6%
// against a 1% median) the sequential test drains it; a backend whose
// block sets rules-degraded-ratio 20 (degraded only from 20%) keeps it.
// Each backend keeps its own test's state across the steps.
func TestScopedRulesRatio(t *testing.T) {
	at := time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)
	obsAt := func(sec uint64) agent.Observation {
		obs := agent.Observation{Time: at.Add(time.Duration(sec) * time.Second)}
		for _, name := range []string{"loose", "strict"} {
			b := agent.BackendView{Name: name}
			for i, perMille := range []uint64{80, 10, 10, 10} {
				s := string(rune('a' + i))
				st := window.Stats{Backend: name, Server: s, Requests: 60_000, Err5xx: 60 * perMille,
					TotalRequests: 1000 * sec, TotalErr5xx: perMille * sec}
				b.Servers = append(b.Servers, agent.ServerView{Backend: name, Server: s, Owner: agent.OwnerNone, Window: st, Recent: st,
					State: haproxy.ServerState{Backend: name, Server: s, OpState: haproxy.OpRunning, Weight: 1, Initial: 1}})
			}
			obs.Backends = append(obs.Backends, b)
		}
		return obs
	}
	var blocks rules.Blocks
	if err := blocks.Set("strict", "rules-degraded-ratio", "20"); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name  string
		scope *rules.Blocks
		want  map[string]bool
	}{
		{"no block: both", nil, map[string]bool{"loose": true, "strict": true}},
		{"strict's own ratio", &blocks, map[string]bool{"loose": true}},
	} {
		pol := scopedRules(rules.DefaultConfig(), tc.scope)
		got, ev := map[string]bool{}, map[string]bool{}
		for sec := uint64(0); sec <= 60; sec++ {
			plan, err := pol.Decide(context.Background(), obsAt(sec))
			if err != nil {
				t.Fatal(err)
			}
			for _, a := range plan {
				if a.Kind == agent.Drain && a.Server == "a" {
					got[a.Backend] = true
				}
			}
			for _, k := range pol.Evidence(obsAt(sec)) {
				ev[k.Backend] = true
			}
		}
		if len(got) != len(tc.want) || len(ev) != len(tc.want) {
			t.Fatalf("%s: drains %v, evidence %v, want %v", tc.name, got, ev, tc.want)
		}
		for b := range tc.want {
			if !got[b] || !ev[b] {
				t.Fatalf("%s: drains %v, evidence %v, want %v", tc.name, got, ev, tc.want)
			}
		}
	}
}
