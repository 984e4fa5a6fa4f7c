package soak

import (
	"context"
	"fmt"
	"time"

	"github.com/hapilot/hapilot/agent"
	"github.com/hapilot/hapilot/agent/policy/llm"
	"github.com/hapilot/hapilot/agent/policy/rules"
	"github.com/hapilot/hapilot/internal/lab/ollamafake"
	"github.com/rs/zerolog"
)

// RulesAgent is --policy rules as the daemon builds it
// (rules.NewPerBackend), run through the agent path: the loop's cadence
// and the guardrails, which the direct path leaves out.
func RulesAgent(rc rules.Config, interval time.Duration) *AgentPolicy {
	return &AgentPolicy{Name: "rules", Interval: interval, New: func() (agent.Policy, func(), error) {
		return rules.NewPerBackend(rc), nil, nil
	}}
}

// LLMAgent is --policy llm as the daemon builds it (cmd/hapilot/daemon's
// newLLMPolicy): the model behind the rules' floor, --policy rules
// itself fed every observation through the policy's evidence hook. One
// model client serves every fleet; it is inspected, loaded and measured
// once, as the policy's start does. No calibration gate: the soak runs
// as --skip-calibration does, so that what the model decides is what is
// measured.
//
// unprotected takes off the protections the study's loop lacked, as
// internal/lab/bench.StudyLoop does (the floor and the guardrails stay):
// every step asks the model (GateAlways), every proposal runs at once
// (Confirm 1, no hold), and its drains need no support from the windows.
// It shows what the protections keep out, and that the soak counts it.
func LLMAgent(rc rules.Config, cfg llm.Config, interval time.Duration, unprotected bool) (*AgentPolicy, error) {
	if unprotected {
		cfg.Confirm, cfg.Gate, cfg.MinHold = 1, llm.GateAlways, 0
	}
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	m, err := llm.NewModel(cfg)
	if err != nil {
		return nil, fmt.Errorf("soak: the model: %w", err)
	}
	// Once, as the policy's start does (its bringUp and load): the model
	// is there, names the prompt form it was trained on (the committed
	// models do), is loaded and its tokenizer measured, so that the first
	// calls do not pay for the load.
	ctx, cancel := context.WithTimeout(context.Background(), cfg.LoadTimeout)
	defer cancel()
	if _, err := m.Inspect(ctx); err != nil {
		return nil, fmt.Errorf("soak: the model %s: %w", cfg.Model, err)
	}
	if _, err := m.Warm(ctx, 2048); err != nil {
		return nil, fmt.Errorf("soak: loading the model %s: %w", cfg.Model, err)
	}
	if err := m.Measure(ctx, llm.TokenSample(time.Now())); err != nil {
		return nil, fmt.Errorf("soak: measuring the model %s's tokenizer: %w", cfg.Model, err)
	}
	name := "llm"
	if unprotected {
		name = "llm unprotected"
	}
	return &AgentPolicy{Name: name, Interval: interval, New: func() (agent.Policy, func(), error) {
		floor := rules.NewPerBackend(rc)
		p := llm.New(m, floor, rc, cfg, zerolog.Nop())
		p.NoEvidenceCheck = unprotected
		hooks := p.Hooks()
		return hooks, p.Close, nil
	}}, nil
}

// Emulated serves the named emulated profile (ollamafake.Emulations)
// from an in-process stand-in of Ollama: Go code that emulates a model's
// judgement, not a model. It returns the stand-in's address, the model's
// name there, and what stops it. interval scales the profiles whose
// delays are in steps (the slow ones): the simulated clock stands still
// during a call, so their delays cost wall time only.
func Emulated(name string, seed uint64, interval time.Duration) (host, model string, stop func(), err error) {
	respond, err := ollamafake.Emulation(name, seed, interval)
	if err != nil {
		return "", "", nil, err
	}
	model = "emulated-" + name
	fake := ollamafake.New(map[string]string{model: "sha256:emulated-" + name}, respond)
	ollamafake.Traits(name, interval)(fake)
	return fake.URL, model, fake.Close, nil
}
