package daemon

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/hapilot/hapilot/agent"
	"github.com/hapilot/hapilot/agent/policy/llm"
	"github.com/hapilot/hapilot/agent/policy/rules"
	"github.com/hapilot/hapilot/internal/config"
	"github.com/rs/zerolog"
)

// newLLMPolicy builds --policy llm (or --policy shadow). A model without
// a passing calibration record for its digest does not act: the rules
// do, and the log says why.
func newLLMPolicy(c config.Config, log zerolog.Logger) (agent.Policy, error) {
	cfg := c.LLM.Resolved()
	model, err := llm.NewModel(cfg)
	if err != nil {
		return agent.Policy{}, err
	}
	// The rules are the model's floor: their drains apply whatever the
	// model says. --fallback none (and --unprotected) leaves the model
	// alone, for research.
	var floor agent.Decider = rules.NewWindowed(c.Rules)
	if cfg.Fallback == llm.FallbackNone {
		floor = nil
	}
	if cfg.Unprotected {
		log.Warn().Msg("--unprotected: the model acts without hapilot's protections (research runs only)")
	}
	pol := llm.New(model, floor, cfg, log.With().Str("component", "llm").Logger())
	if c.Chosen() == config.PolicyShadow {
		return llm.NewShadow(pol, rules.NewPolicy(c.Rules)), nil
	}
	if cfg.SkipCalibration || cfg.Unprotected {
		log.Warn().Str("model", cfg.Model).Msg("--skip-calibration: the model acts without a calibration record")
		return pol.Hooks(), nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	refuse := func(why string) (agent.Policy, error) {
		log.Error().Str("model", cfg.Model).Str("why", why).
			Msg("the model may not act: the rules policy acts instead (run `hapilot calibrate --model " + cfg.Model + "`, or --skip-calibration)")
		return rules.NewPolicy(c.Rules), nil
	}
	digest, err := model.Digest(ctx)
	if err != nil {
		// The model server does not answer yet: the policy starts with the rules
		// alone, and checks the record once it answers.
		log.Warn().Err(err).Str("model", cfg.Model).Msg("the model server does not answer: the rules act alone until it does and the model's calibration record is checked")
		pol.Admit = func(ctx context.Context) error { return admit(ctx, model, cfg.CalibrationDir) }
		return pol.Hooks(), nil
	}
	if err := checkRecord(model, cfg.CalibrationDir, digest); err != nil {
		return refuse(err.Error())
	}
	sc, _ := llm.Load(cfg.CalibrationDir, digest)
	log.Info().Str("model", cfg.Model).Str("digest", digest).Float64("precision", sc.Precision).Float64("recall", sc.Recall).
		Msg("calibrated model may act")
	return pol.Hooks(), nil
}

// admit checks the model's calibration record once the model server answers.
func admit(ctx context.Context, model *llm.Model, dir string) error {
	digest, err := model.Digest(ctx)
	if err != nil {
		return err
	}
	return checkRecord(model, dir, digest)
}

// checkRecord says why the model may not act, nil when its record for
// digest passed and holds for the running settings.
func checkRecord(model *llm.Model, dir, digest string) error {
	sc, err := llm.Load(dir, digest)
	if err != nil {
		return fmt.Errorf("no calibration record for digest %s: %v", digest, err)
	}
	if stale := sc.Key.Stale(llm.KeyFor(digest, model)); stale != "" {
		return errors.New("stale calibration record: " + stale)
	}
	if !sc.Passed {
		return errors.New("failed calibration: " + sc.Why)
	}
	return nil
}
