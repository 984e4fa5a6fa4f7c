package calibrate

import (
	"context"
	"fmt"
	"time"

	"github.com/hapilot/hapilot/agent"
	"github.com/hapilot/hapilot/agent/policy/llm"
	"github.com/rs/zerolog"
)

// verdict is a calibration verdict as the event log and the webhook
// carry it (docs/reference/events.md, calibration).
func verdict(model string, mayAct bool, why string, detail map[string]string) agent.Event {
	detail["model"], detail["may_act"] = model, fmt.Sprint(mayAct)
	return agent.Event{Type: agent.EventCalibration, Time: time.Now(), Reason: why, Detail: detail}
}

// Skipped is the verdict of --skip-calibration: the model acts without a
// record, which the agent logs and writes down.
func Skipped(model string) agent.Event {
	return verdict(model, true, "--skip-calibration: the model acts without a calibration record", map[string]string{})
}

// Gate is the LLM policy's Admit under the calibration gate: once the
// model server answers, the model may act only with a passing record for
// its digest in cfg.CalibrationDir that holds for the running settings
// (Admit). Each verdict goes to emit, a refusal with the command that
// lifts it; until the gate passes, and for good if it does not, the
// rules' floor acts alone.
func Gate(model *llm.Model, cfg llm.Config, log zerolog.Logger, emit func(agent.Event)) func(context.Context) error {
	return func(ctx context.Context) error {
		sc, err := Admit(ctx, model, cfg.CalibrationDir)
		if err != nil {
			err = fmt.Errorf("%w (run `hapilot calibrate --model %s`, or --skip-calibration)", err, cfg.Model)
			emit(verdict(cfg.Model, false, err.Error(), map[string]string{}))
			return err
		}
		log.Info().Str("model", cfg.Model).Str("digest", sc.Key.Digest).Float64("precision", sc.Precision).Float64("recall", sc.Recall).
			Msg("calibrated model may act")
		emit(verdict(cfg.Model, true, "calibrated model may act", map[string]string{"digest": sc.Key.Digest,
			"precision": fmt.Sprintf("%.2f", sc.Precision), "recall": fmt.Sprintf("%.2f", sc.Recall)}))
		return nil
	}
}
