package daemon

import (
	"context"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"strings"
	"time"

	"github.com/hapilot/hapilot/agent"
	"github.com/hapilot/hapilot/agent/llm"
	"github.com/hapilot/hapilot/agent/rules"
	"github.com/hapilot/hapilot/internal/config"
	"github.com/ollama/ollama/api"
	"github.com/rs/zerolog"
)

// OllamaClient is the client for --ollama-host, or $OLLAMA_HOST as
// Ollama's own client reads it. Its HTTP client has no timeout of its
// own: every call carries a deadline.
func OllamaClient(host string) (*api.Client, error) {
	if host == "" {
		return api.ClientFromEnvironment()
	}
	if !strings.Contains(host, "://") {
		host = "http://" + host
	}
	u, err := url.Parse(host)
	if err != nil || u.Host == "" {
		return nil, fmt.Errorf("ollama-host %q: not a URL", host)
	}
	return api.NewClient(u, &http.Client{}), nil
}

// NewModel builds the model client from the settings.
func NewModel(c config.Config) (*llm.Model, error) {
	client, err := OllamaClient(c.LLM.OllamaHost)
	if err != nil {
		return nil, err
	}
	mc := llm.DefaultModelConfig()
	mc.Model, mc.Think, mc.NumPredict, mc.TokenBudget = c.LLM.Model, c.LLM.Think, c.LLM.NumPredict, c.LLM.TokenBudget
	if c.LLM.SystemPrompt != "" {
		b, err := os.ReadFile(c.LLM.SystemPrompt)
		if err != nil {
			return nil, fmt.Errorf("system prompt: %w", err)
		}
		mc.SystemPrompt = string(b)
	}
	return &llm.Model{Client: client, Config: mc}, nil
}

// newLLMPolicy builds --policy llm (or --shadow). A model without a
// passing calibration record for its digest does not act: the rules do,
// and the log says why.
func newLLMPolicy(c config.Config, log zerolog.Logger) (agent.Policy, error) {
	model, err := NewModel(c)
	if err != nil {
		return nil, err
	}
	var fallback agent.Policy = rules.New(c.Rules)
	if c.LLM.Fallback == "none" {
		fallback = agent.Static{}
	}
	cfg := llm.DefaultConfig()
	cfg.Deadline, cfg.Confirm, cfg.MinHold, cfg.Gate = c.LLMDeadline(), c.LLM.Confirm, c.LLM.MinHold, c.LLM.Gate
	if c.LLM.Unprotected {
		// The study's loop: every proposal runs at once, the model is
		// asked every step and waited for, thinking is never switched off.
		cfg = llm.Config{Confirm: 1, Gate: "always", NoEvidence: true}
		fallback = agent.Static{}
		log.Warn().Msg("--unprotected: the model acts without hapilot's protections (research runs only)")
	}
	pol := llm.New(model, fallback, cfg, log.With().Str("component", "llm").Logger())
	if c.LLM.Shadow {
		return &llm.Shadow{Model: pol, Acting: rules.New(c.Rules)}, nil
	}
	if c.LLM.SkipCalibration || c.LLM.Unprotected {
		log.Warn().Str("model", c.LLM.Model).Msg("--skip-calibration: the model acts without a calibration record")
		return pol, nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	refuse := func(why string) (agent.Policy, error) {
		log.Error().Str("model", c.LLM.Model).Str("why", why).
			Msg("the model may not act: the rules policy acts instead (run `hapilot calibrate --model " + c.LLM.Model + "`, or --skip-calibration)")
		return rules.New(c.Rules), nil
	}
	digest, err := model.Digest(ctx)
	if err != nil {
		return refuse(err.Error())
	}
	sc, err := llm.Load(c.LLM.CalibrationDir, digest)
	if err != nil {
		return refuse(fmt.Sprintf("no calibration record for digest %s: %v", digest, err))
	}
	if !sc.Passed {
		return refuse("failed calibration: " + sc.Why)
	}
	log.Info().Str("model", c.LLM.Model).Str("digest", digest).Float64("precision", sc.Precision).Float64("recall", sc.Recall).
		Msg("calibrated model may act")
	return pol, nil
}
