package bench

import (
	"fmt"

	"github.com/hapilot/hapilot/agent"
	"github.com/hapilot/hapilot/agent/policy/llm"
	"github.com/hapilot/hapilot/cmd/hapilot/config"
	"github.com/hapilot/hapilot/cmd/hapilot/daemon"
	"github.com/rs/zerolog"
)

// StudyLoop builds the agent of `hapilot run --policy llm` as the study's
// loop ran its model: without any of hapilot's fixes, to measure what
// they buy. The agent has no switch for this (no research flag ships in
// it), so the lab builds it around the agent's parts:
//   - no calibration gate: the policy has no Admit;
//   - no rules' floor: the model alone acts, and a failed call does nothing;
//   - no evidence check on the model's drains and cuts;
//   - every proposal runs at once (Confirm 1), no hold before readying;
//   - the model is asked every step (GateAlways) and never switched
//     out of thinking (ThinkRetry 0);
//   - no deadline: each step waits for the model however long it takes
//     (the loop's NoStepBudget), and the cadence slips instead.
//
// The guardrails, the audit and the runtime are the agent's own.
func StudyLoop(c config.Config, log zerolog.Logger) (*daemon.Daemon, error) {
	if c.Chosen() != config.PolicyLLM {
		return nil, fmt.Errorf("the study's loop runs --policy llm, not %s", c.Chosen())
	}
	d, err := daemon.NewWith(c, log, daemon.Options{Policy: studyPolicy})
	if err != nil {
		return nil, err
	}
	d.Loop.NoStepBudget = true
	return d, nil
}

// studyPolicy is the LLM policy with its protections off.
func studyPolicy(c config.Config, log zerolog.Logger) (agent.Policy, error) {
	cfg := c.LLM
	cfg.Confirm, cfg.Gate, cfg.Deadline, cfg.MinHold, cfg.ThinkRetry = 1, llm.GateAlways, 0, 0, 0
	m, err := llm.NewModel(cfg)
	if err != nil {
		return agent.Policy{}, err
	}
	log.Warn().Msg("the study's loop: the model acts without hapilot's protections (the lab's runs only)")
	p := llm.New(m, agent.Policy{}, c.Rules, cfg, log.With().Str("component", "llm").Logger())
	p.NoEvidenceCheck = true
	return p.Hooks(), nil
}
