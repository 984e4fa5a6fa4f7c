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
	// model says. They are --policy rules itself, per-backend blocks and
	// all, fed the same observations (the policy's evidence hook is
	// theirs): with the model unreachable, --policy llm decides exactly as
	// --policy rules. Shadow mode's acting policy is the same one: both
	// read each observation once (the test takes one chunk per time).
	floor := rules.NewPerBackend(c.Rules)
	llmPol := llm.New(model, floor, c.Rules, cfg, log.With().Str("component", "llm").Logger())
	if c.Chosen() == config.PolicyShadow {
		sh := llm.NewShadow(llmPol, floor)
		sh.Notes = floor.Notes
		return sh, nil, nil
	}
	hooks := llmPol.Hooks()
	hooks.Notes = floor.Notes // the floor's zone servers, left serving
	if cfg.SkipCalibration {
		log.Warn().Str("model", cfg.Model).Msg("--skip-calibration: the model acts without a calibration record")
		v := calibrate.Skipped(cfg.Model)
		return hooks, &v, nil
	}
	llmPol.Admit = calibrate.Gate(model, cfg, log, emit)
	return hooks, nil, nil
}
