package rules

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"

	"github.com/hapilot/hapilot/agent"
)

// NewPerBackend is the rules policy as `--policy rules` runs it: with
// each backend's own sequential-test settings (floor, degraded ratio,
// ARL) from cfg.Blocks, the config's backend blocks. Without a block it
// is NewPolicy(cfg) itself.
func NewPerBackend(cfg Config) agent.Policy {
	blocks := cfg.Blocks
	cfg.Blocks = nil // each policy below judges with its own settings
	root := NewPolicy(cfg)
	if blocks.Len() == 0 {
		return root
	}
	pb := &PerBackend{base: cfg, blocks: blocks, byKey: map[overrideKey]agent.Policy{keyOf(cfg): root}}
	p := root
	p.Decider = pb
	p.Notes = pb.Notes
	if root.Evidence != nil {
		p.Evidence = pb.Evidence
	}
	return p
}

// PerBackend is the rules policy with each backend's own settings: one
// rules policy per distinct setting, each deciding the backends that
// take it. A backend always goes to the same one, so the state a policy
// keeps per backend (the sequential test's) stays whole.
type PerBackend struct {
	base   Config
	blocks *Blocks
	// byKey is filled as backends appear, by the loop's goroutine:
	// Decide and Evidence both run on it (agent.Loop.Run); mu guards it
	// for Notes, which /status reads from its own goroutine.
	mu    sync.Mutex
	byKey map[overrideKey]agent.Policy
}

// Notes gathers every policy's notes (the zone servers left serving).
func (pb *PerBackend) Notes() map[agent.Key]string {
	pb.mu.Lock()
	pols := make([]agent.Policy, 0, len(pb.byKey))
	for _, pol := range pb.byKey {
		pols = append(pols, pol)
	}
	pb.mu.Unlock()
	var out map[agent.Key]string
	for _, pol := range pols {
		if pol.Notes == nil {
			continue
		}
		for k, v := range pol.Notes() {
			if out == nil {
				out = map[agent.Key]string{}
			}
			out[k] = v
		}
	}
	return out
}

// overrideKey is the settings a block may change: backends that agree on
// them share one policy.
type overrideKey struct{ floor, ratio, arl float64 }

func keyOf(c Config) overrideKey { return overrideKey{c.Floor, c.DegradedRatio, c.ARLDays} }

// Name says what decides: the rules, with backends' own settings.
func (*PerBackend) Name() string { return "rules per backend" }

// split groups obs's backends by the policy that decides them.
func (pb *PerBackend) split(obs agent.Observation) ([]agent.Policy, []agent.Observation) {
	groups := map[overrideKey]int{}
	var pols []agent.Policy
	var parts []agent.Observation
	for _, b := range obs.Backends {
		cfg := pb.blocks.For(b.Name).Over(pb.base)
		k := keyOf(cfg)
		i, ok := groups[k]
		if !ok {
			pb.mu.Lock()
			p, ok := pb.byKey[k]
			if !ok {
				p = NewPolicy(cfg)
				pb.byKey[k] = p
			}
			pb.mu.Unlock()
			i = len(pols)
			groups[k] = i
			pols = append(pols, p)
			part := obs
			part.Backends = nil
			parts = append(parts, part)
		}
		parts[i].Backends = append(parts[i].Backends, b)
	}
	return pols, parts
}

// Decide asks each backend's rules policy about its backends.
func (pb *PerBackend) Decide(ctx context.Context, obs agent.Observation) (agent.Plan, error) {
	var plan agent.Plan
	var errs []error
	pols, parts := pb.split(obs)
	for i, pol := range pols {
		p, err := pol.Decide(ctx, parts[i])
		if err != nil {
			errs = append(errs, fmt.Errorf("backends %s: %w", names(parts[i]), err))
		}
		plan = append(plan, p...)
	}
	return plan, errors.Join(errs...)
}

// Evidence runs each backend's rules policy's test on its backends.
func (pb *PerBackend) Evidence(obs agent.Observation) []agent.Key {
	var out []agent.Key
	pols, parts := pb.split(obs)
	for i, pol := range pols {
		out = append(out, pol.Evidence(parts[i])...)
	}
	return out
}

func names(obs agent.Observation) string {
	n := make([]string, len(obs.Backends))
	for i, b := range obs.Backends {
		n[i] = b.Name
	}
	return strings.Join(n, ",")
}
