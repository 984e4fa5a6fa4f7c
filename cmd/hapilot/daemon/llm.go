package daemon

import (
	"github.com/hapilot/hapilot/agent"
	"github.com/hapilot/hapilot/agent/policy/llm"
	"github.com/hapilot/hapilot/agent/policy/llm/calibrate"
	"github.com/hapilot/hapilot/agent/policy/rules"
	"github.com/hapilot/hapilot/cmd/hapilot/config"
	"github.com/rs/zerolog"
)

// newLLMPolicy builds --policy llm (or --policy shadow). It makes no
// network call: a model without a passing calibration record for its
// digest is found out when the policy starts and the model server
// answers (llm.Policy.Admit); until the record passes, and for good if
// it does not, the rules' floor acts alone, and /status and the log say
// why.
//
// The calibration verdict is an event: returned at once for
// --skip-calibration, else given to emit when the policy's start reads
// the record.
func newLLMPolicy(c config.Config, log zerolog.Logger, emit func(agent.Event)) (pol agent.Policy, verdict *agent.Event, err error) {
	cfg := c.LLM
	model, err := llm.NewModel(cfg)
	if err != nil {
		return agent.Policy{}, nil, err
	}
	// The rules are the model's floor: their drains apply whatever the
	// model says.
	llmPol := llm.New(model, rules.NewWindowed(c.Rules), c.Rules, cfg, log.With().Str("component", "llm").Logger())
	if c.Chosen() == config.PolicyShadow {
		return llm.NewShadow(llmPol, rules.NewPolicy(c.Rules)), nil, nil
	}
	if cfg.SkipCalibration {
		log.Warn().Str("model", cfg.Model).Msg("--skip-calibration: the model acts without a calibration record")
		v := calibrate.Skipped(cfg.Model)
		return llmPol.Hooks(), &v, nil
	}
	llmPol.Admit = calibrate.Gate(model, cfg, log, emit)
	return llmPol.Hooks(), nil, nil
}
