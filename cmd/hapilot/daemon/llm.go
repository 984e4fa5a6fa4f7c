package daemon

import (
	"context"
	"fmt"
	"time"

	"github.com/hapilot/hapilot/agent"
	"github.com/hapilot/hapilot/agent/policy/llm"
	"github.com/hapilot/hapilot/agent/policy/llm/calibrate"
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
	calibration := func(mayAct bool, why string, detail map[string]string) *agent.Event {
		detail["model"], detail["may_act"] = cfg.Model, fmt.Sprint(mayAct)
		return &agent.Event{Type: agent.EventCalibration, Time: time.Now(), Reason: why, Detail: detail}
	}
	// The rules are the model's floor: their drains apply whatever the
	// model says. They are --policy rules itself, per-backend blocks and
	// all, fed the same observations (the policy's evidence hook is
	// theirs): with the model unreachable, --policy llm decides exactly as
	// --policy rules. Shadow mode's acting policy is the same one: both
	// read each observation once (the test takes one chunk per time).
	floor := scopedRules(c.Rules, &c.RulesBlocks)
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
		return hooks, calibration(true, "--skip-calibration: the model acts without a calibration record", map[string]string{}), nil
	}
	llmPol.Admit = func(ctx context.Context) error {
		sc, err := calibrate.Admit(ctx, model, cfg.CalibrationDir)
		if err != nil {
			err = fmt.Errorf("%w (run `hapilot calibrate --model %s`, or --skip-calibration)", err, cfg.Model)
			emit(*calibration(false, err.Error(), map[string]string{}))
			return err
		}
		log.Info().Str("model", cfg.Model).Str("digest", sc.Key.Digest).Float64("precision", sc.Precision).Float64("recall", sc.Recall).
			Msg("calibrated model may act")
		emit(*calibration(true, "calibrated model may act", map[string]string{"digest": sc.Key.Digest,
			"precision": fmt.Sprintf("%.2f", sc.Precision), "recall": fmt.Sprintf("%.2f", sc.Recall)}))
		return nil
	}
	return hooks, nil, nil
}
