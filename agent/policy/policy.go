// Package policy holds the baseline policy; the ones that act live side
// by side beneath it:
//
//	rules      the default: a binomial outlier test on 5xx, and a latency test
//	llm        a model through Ollama, under hapilot's protections (and --shadow)
//	luapolicy  an operator's decide(obs) in a Lua sandbox
//
// Every policy implements agent.Policy and may declare what it needs of
// the loop through agent.NeedsDeclarer; the guardrails vet whatever any
// of them proposes.
package policy

import (
	"context"

	"github.com/hapilot/hapilot/agent"
)

// Static is the policy that never acts: the baseline of every comparison.
type Static struct{}

func (Static) Name() string { return "static" }

func (Static) Decide(context.Context, agent.Observation) (agent.Plan, error) { return nil, nil }
