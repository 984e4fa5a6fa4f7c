package daemon

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/hapilot/hapilot/agent"
	"github.com/hapilot/hapilot/agent/policy/rules"
)

// scopedRules is the rules policy with each backend's own sequential-test
// settings (floor, degraded ratio, ARL) from the config's backend blocks: one rules policy per
// distinct setting, each deciding the backends that take it. A backend
// always goes to the same one, so any state a policy keeps per backend
// stays whole. Without such a block it is the rules policy itself.
func scopedRules(base rules.Config, blocks *rules.Blocks) agent.Policy {
	type key struct{ floor, ratio, arl float64 }
	cfgOf := func(backend string) (key, rules.Config) {
		c := blocks.For(backend).Over(base)
		return key{c.Floor, c.DegradedRatio, c.ARLDays}, c
	}
	root := rules.NewPolicy(base)
	if blocks.Len() == 0 {
		return root
	}
	baseKey := key{base.Floor, base.DegradedRatio, base.ARLDays}
	// Filled as backends appear, by the loop's goroutine only: Decide
	// and Evidence both run on it (agent.Loop.Run).
	byKey := map[key]agent.Policy{baseKey: root}
	var mu sync.Mutex // byKey: Notes reads it from /status's goroutine
	split := func(obs agent.Observation) ([]agent.Policy, []agent.Observation) {
		groups := map[key]int{}
		var pols []agent.Policy
		var parts []agent.Observation
		for _, b := range obs.Backends {
			k, cfg := cfgOf(b.Name)
			i, ok := groups[k]
			if !ok {
				mu.Lock()
				p, ok := byKey[k]
				if !ok {
					p = rules.NewPolicy(cfg)
					byKey[k] = p
				}
				mu.Unlock()
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
	p := root
	p.Decider = scopedDecider{split: split}
	p.Notes = func() map[agent.Key]string {
		mu.Lock()
		pols := make([]agent.Policy, 0, len(byKey))
		for _, pol := range byKey {
			pols = append(pols, pol)
		}
		mu.Unlock()
		var out map[agent.Key]string
		for _, pol := range pols {
			for k, v := range pol.Notes() {
				if out == nil {
					out = map[agent.Key]string{}
				}
				out[k] = v
			}
		}
		return out
	}
	if root.Evidence != nil {
		p.Evidence = func(obs agent.Observation) []agent.Key {
			var out []agent.Key
			pols, parts := split(obs)
			for i, pol := range pols {
				out = append(out, pol.Evidence(parts[i])...)
			}
			return out
		}
	}
	return p
}

// scopedDecider asks each backend's rules policy about its backends.
type scopedDecider struct {
	split func(agent.Observation) ([]agent.Policy, []agent.Observation)
}

func (scopedDecider) Name() string { return "rules" }

func (d scopedDecider) Decide(ctx context.Context, obs agent.Observation) (agent.Plan, error) {
	var plan agent.Plan
	var errs []error
	pols, parts := d.split(obs)
	for i, pol := range pols {
		p, err := pol.Decide(ctx, parts[i])
		if err != nil {
			errs = append(errs, fmt.Errorf("backends %s: %w", names(parts[i]), err))
		}
		plan = append(plan, p...)
	}
	return plan, errors.Join(errs...)
}

func names(obs agent.Observation) string {
	s := ""
	for i, b := range obs.Backends {
		if i > 0 {
			s += ","
		}
		s += b.Name
	}
	return s
}
