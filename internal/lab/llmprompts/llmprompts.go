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
	"github.com/hapilot/hapilot/agent/policy/llm/modelapi"
	"github.com/hapilot/hapilot/agent/policy/llm/prompt"
	"github.com/hapilot/hapilot/agent/policy/rules"
	"github.com/rs/zerolog"
)

// New is a dataset.NewPolicy: the LLM policy at its defaults with the
// rules' windowed floor, in the prompt form style, asking server. With
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
	return llm.New(m, rules.NewWindowed(rules.DefaultConfig()), rules.DefaultConfig(), cfg, zerolog.Nop())
}
