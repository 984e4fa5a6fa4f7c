package rules

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/hapilot/hapilot/agent"
	"github.com/hapilot/hapilot/haproxy"
	"github.com/hapilot/hapilot/internal/lib/window"
)

// One server of four failing 8% against peers at 1%, 1,000 requests a
// second each, for a minute. Under the global degraded ratio (6: 6%
// against a 1% median) the sequential test drains it; a backend whose
// block sets rules-degraded-ratio 20 (degraded only from 20%) keeps it.
// Each backend keeps its own test's state across the steps.
func TestPerBackendRatio(t *testing.T) {
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
	var blocks Blocks
	if err := blocks.Set("strict", "rules-degraded-ratio", "20"); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name  string
		scope *Blocks
		want  map[string]bool
	}{
		{"no block: both", nil, map[string]bool{"loose": true, "strict": true}},
		{"strict's own ratio", &blocks, map[string]bool{"loose": true}},
	} {
		pol := NewPerBackend(withBlocks(tc.scope))
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

func withBlocks(b *Blocks) Config {
	c := DefaultConfig()
	c.Blocks = b
	return c
}

// Config.Validate judges each backend block as it judges the flags,
// and reports a bad flag once, not once per block.
func TestValidateJudgesTheBlocks(t *testing.T) {
	block := func(key, value string) *Blocks {
		var b Blocks
		if err := b.Set("app", key, value); err != nil {
			t.Fatal(err)
		}
		return &b
	}
	for _, tc := range []struct {
		name   string
		floor  float64 // the flag's
		blocks *Blocks
		want   string // in the error; "" for none
	}{
		{"no block", 0.01, nil, ""},
		{"a good block", 0.01, block("rules-floor", "0.05"), ""},
		{"a block's floor no flag may take", 0.01, block("rules-floor", "0.7"), "backend app: rules-floor 0.7 outside"},
		{"a block's ratio below 1", 0.01, block("rules-degraded-ratio", "0.5"), "backend app: rules-degraded-ratio 0.5"},
		{"a bad flag, said once", 0.7, block("rules-arl-days", "10"), "rules-floor 0.7 outside"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := withBlocks(tc.blocks)
			c.Floor = tc.floor
			err := c.Validate()
			switch {
			case tc.want == "" && err != nil:
				t.Fatalf("refused: %v", err)
			case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
				t.Fatalf("error %v, want %q", err, tc.want)
			case err != nil && strings.Count(err.Error(), "rules-floor 0.7") > 1:
				t.Fatalf("the flag's error repeated per block: %v", err)
			}
		})
	}
}

// The policy says what decides: the rules alone, or with backends' own
// settings.
func TestPerBackendName(t *testing.T) {
	var b Blocks
	if err := b.Set("strict", "rules-degraded-ratio", "20"); err != nil {
		t.Fatal(err)
	}
	if n := NewPerBackend(withBlocks(nil)).Name(); n != "rules" {
		t.Errorf("no block: %q", n)
	}
	if n := NewPerBackend(withBlocks(&b)).Name(); n != "rules per backend" {
		t.Errorf("with a block: %q", n)
	}
}
