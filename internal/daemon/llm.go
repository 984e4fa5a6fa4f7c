package daemon

import (
	"context"
	"fmt"

	"github.com/hapilot/hapilot/agent"
	"github.com/hapilot/hapilot/agent/policy/llm"
	"github.com/hapilot/hapilot/agent/policy/llm/calibrate"
	"github.com/hapilot/hapilot/agent/policy/rules"
	"github.com/hapilot/hapilot/internal/config"
	"github.com/rs/zerolog"
)

// newLLMPolicy builds --policy llm (or --policy shadow). It makes no
// network call: a model without a passing calibration record for its
// digest is found out when the policy starts and the model server
// answers (llm.Policy.Admit); until the record passes, and for good if
// it does not, the rules' floor acts alone, and /status and the log say
// why.
func newLLMPolicy(c config.Config, log zerolog.Logger) (agent.Policy, error) {
	cfg := c.LLM.Resolved()
	model, err := llm.NewModel(cfg)
	if err != nil {
		return agent.Policy{}, err
	}
	// The rules are the model's floor: their drains apply whatever the
	// model says. --fallback none (and --unprotected) leaves the model
	// alone, for research.
	var floor agent.Decider = rules.New(c.Rules)
	if cfg.Fallback == llm.FallbackNone {
		floor = nil
	}
	if cfg.Unprotected {
		log.Warn().Msg("--unprotected: the model acts without hapilot's protections (research runs only)")
	}
	pol := llm.New(model, floor, c.Rules, cfg, log.With().Str("component", "llm").Logger())
	if c.Chosen() == config.PolicyShadow {
		return llm.NewShadow(pol, rules.NewPolicy(c.Rules)), nil
	}
	if cfg.SkipCalibration || cfg.Unprotected {
		log.Warn().Str("model", cfg.Model).Msg("--skip-calibration: the model acts without a calibration record")
		return pol.Hooks(), nil
	}
	pol.Admit = func(ctx context.Context) error {
		sc, err := calibrate.Admit(ctx, model, cfg.CalibrationDir)
		if err != nil {
			return fmt.Errorf("%w (run `hapilot calibrate --model %s`, or --skip-calibration)", err, cfg.Model)
		}
		log.Info().Str("model", cfg.Model).Str("digest", sc.Key.Digest).Float64("precision", sc.Precision).Float64("recall", sc.Recall).
			Msg("calibrated model may act")
		return nil
	}
	return pol.Hooks(), nil
}
