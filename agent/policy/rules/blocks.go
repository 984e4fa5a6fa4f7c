package rules

import (
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/hapilot/hapilot/agent/guard"
)

// Override is what one backend block of the config sets of the
// sequential test (`--backend PATTERN.rules-floor=0.05`): a nil field
// leaves the flag's value. It is the rules' own value, not the agent's
// guardrails', so that the one Config.Validate judges it as it judges
// the flags: a value a flag refuses, a block refuses too, and the reverse.
type Override struct {
	Floor         *float64 `json:"rules_floor,omitempty"`
	DegradedRatio *float64 `json:"rules_degraded_ratio,omitempty"`
	ARLDays       *float64 `json:"rules_arl_days,omitempty"`
}

// OverrideKeys are the keys a backend block may set of the rules, named
// as their flags are.
var OverrideKeys = []string{"rules-floor", "rules-degraded-ratio", "rules-arl-days"}

// IsOverrideKey reports whether key is one of OverrideKeys.
func IsOverrideKey(key string) bool {
	for _, k := range OverrideKeys {
		if k == key {
			return true
		}
	}
	return false
}

// Set reads one key's value. It parses only: what range a value may take
// is Config.Validate's to say, for a block as for a flag.
func (o *Override) Set(key, value string) error {
	f, err := strconv.ParseFloat(strings.TrimSpace(value), 64)
	if err != nil {
		return fmt.Errorf("%s %q: want a number", key, value)
	}
	switch key {
	case "rules-floor":
		o.Floor = &f
	case "rules-degraded-ratio":
		o.DegradedRatio = &f
	case "rules-arl-days":
		o.ARLDays = &f
	default:
		return fmt.Errorf("unknown rules key %q (keys: %s)", key, strings.Join(OverrideKeys, ", "))
	}
	return nil
}

// Over is c with o's settings in place of c's.
func (o Override) Over(c Config) Config {
	if o.Floor != nil {
		c.Floor = *o.Floor
	}
	if o.DegradedRatio != nil {
		c.DegradedRatio = *o.DegradedRatio
	}
	if o.ARLDays != nil {
		c.ARLDays = *o.ARLDays
	}
	return c
}

// merge lays later's set fields over o's.
func (o Override) merge(later Override) Override {
	if later.Floor != nil {
		o.Floor = later.Floor
	}
	if later.DegradedRatio != nil {
		o.DegradedRatio = later.DegradedRatio
	}
	if later.ARLDays != nil {
		o.ARLDays = later.ARLDays
	}
	return o
}

// Block is one backend block's rules settings.
type Block struct {
	// Pattern is the block's backend name or glob, matched as the
	// agent's own blocks are (agent.MatchBackend).
	Pattern string `json:"pattern"`
	Override
}

// Blocks are the config's backend blocks that set a rules key, in the
// config's order: a backend takes every block its name matches, later
// over earlier, as with the agent's keys (agent.Scope).
type Blocks struct {
	list  []Block
	index map[string]int // by pattern: a config of many blocks is read in linear time
}

// Set applies one block's key.
func (bs *Blocks) Set(pattern, key, value string) error {
	i, ok := bs.index[pattern]
	if !ok {
		if bs.index == nil {
			bs.index = map[string]int{}
		}
		i = len(bs.list)
		bs.index[pattern] = i
		bs.list = append(bs.list, Block{Pattern: pattern})
	}
	return bs.list[i].Set(key, value)
}

// Len is how many blocks set a rules key.
func (bs *Blocks) Len() int {
	if bs == nil {
		return 0
	}
	return len(bs.list)
}

// List is the blocks, in the config's order.
func (bs *Blocks) List() []Block {
	if bs == nil {
		return nil
	}
	return append([]Block(nil), bs.list...)
}

// For is what the blocks matching backend set, merged later over
// earlier.
func (bs *Blocks) For(backend string) Override {
	var out Override
	if bs == nil {
		return out
	}
	for _, b := range bs.list {
		if guard.MatchBackend(b.Pattern, backend) {
			out = out.merge(b.Override)
		}
	}
	return out
}

// validate judges each block by the flags' own check over base (the
// flags' settings, valid: Config.Validate reports base's errors alone,
// since every block would repeat them).
func (bs *Blocks) validate(base Config) error {
	if bs == nil {
		return nil
	}
	var errs []error
	for _, b := range bs.list {
		if err := b.Over(base).validate(); err != nil {
			errs = append(errs, fmt.Errorf("backend %s: %w", b.Pattern, err))
		}
	}
	return errors.Join(errs...)
}
