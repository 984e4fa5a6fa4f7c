// Package policy holds the baseline policy; the ones that act live side
// by side beneath it:
//
//	rules      the default: a binomial outlier test on 5xx, and a latency test
//	llm        a model through Ollama, under hapilot's protections (and --shadow)
//	luapolicy  an operator's decide(obs) in a Lua sandbox
//
// Each one's constructor returns an agent.Policy: its decision together
// with its hooks (needs, evidence test, report, status, metrics, life
// cycle). The guardrails vet whatever any of them proposes.
package policy

import (
	"context"

	"github.com/hapilot/hapilot/agent"
)

// Static is the policy that never acts: the baseline of every comparison.
type Static struct{}

func (Static) Name() string { return "static" }

func (Static) Decide(context.Context, agent.Observation) (agent.Plan, error) { return nil, nil }

// NewStatic is the baseline as the loop runs it: no hooks.
func NewStatic() agent.Policy { return agent.PolicyOf(Static{}) }
