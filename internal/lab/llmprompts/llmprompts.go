// Package llmprompts builds, for the training dataset, the LLM policy
// whose prompts become examples: the agent's own policy, as production or
// calibration runs it, around the dataset's recording model server. It
// binds internal/lab/dataset (a simulator and its labels) to
// agent/policy/llm, so that the dataset itself knows nothing of how the
// policy decides. It does not import the dataset, so that the dataset's
// own tests may use it.
package llmprompts

import (
	"context"

	"github.com/hapilot/hapilot/agent"
	"github.com/hapilot/hapilot/agent/policy/llm"
	"github.com/hapilot/hapilot/agent/policy/llm/calibrate/fixtures"
	"github.com/hapilot/hapilot/agent/policy/llm/modelapi"
	"github.com/hapilot/hapilot/agent/policy/llm/prompt"
	"github.com/hapilot/hapilot/agent/policy/rules"
	"github.com/rs/zerolog"
)

// New is a dataset.NewPolicy: the LLM policy at its defaults with the
// rules' floor (their sequential test, as --policy rules runs it), in the prompt form style, asking server. With
// production false every step is asked, with no confirmation, deadline or
// hold, as calibration asks.
func New(server modelapi.Server, style prompt.Style, production bool) interface {
	Decide(context.Context, agent.Observation) (agent.Plan, error)
	Close()
} {
	cfg := llm.DefaultConfig()
	cfg.Model = "dataset"
	if style != "" {
		cfg.Prompt = style
	}
	if !production {
		cfg.Confirm, cfg.Gate, cfg.Deadline, cfg.MinHold = 1, llm.GateAlways, 0, 0
	}
	m := &llm.Model{Server: server, Config: cfg, SystemPrompt: cfg.Prompt.SystemPrompt()}
	return &fed{Policy: llm.New(m, rules.NewPolicy(rules.DefaultConfig()), rules.DefaultConfig(), cfg, zerolog.Nop())}
}

// fed is the policy fed as the agent's loop feeds it: the simulator's
// observations show windows, and the rules' floor (a sequential test)
// reads each one a second at a time through the evidence hook, as
// calibration does (fixtures.Timeline).
type fed struct {
	*llm.Policy
	tl fixtures.Timeline
}

func (f *fed) Decide(ctx context.Context, obs agent.Observation) (agent.Plan, error) {
	return f.Policy.Decide(ctx, f.tl.Feed(obs, f.Policy.Hooks().Evidence))
}
