package main

import (
	"flag"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/hapilot/hapilot/agent/policy/llm"
	"github.com/hapilot/hapilot/agent/policy/llm/modelapi"
	"github.com/hapilot/hapilot/agent/policy/llm/prompt"
	"github.com/hapilot/hapilot/agent/policy/rules"
	"github.com/hapilot/hapilot/internal/lab/ollamafake"
	"github.com/hapilot/hapilot/internal/lab/soak"
)

// policyFlags are soak's --policy and what the LLM policy needs (issue
// 44): the soak's days through the agent path (internal/lab/soak's
// agent.go), the rules or the model behind their floor.
type policyFlags struct {
	policy, path, model, host, think, form string
	interval                               time.Duration
	seed                                   uint64
	unprotected                            bool
	// what ran, for the table's head line
	emulated bool
}

func (pf *policyFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&pf.policy, "policy", "rules", "rules|llm: the rules alone, or the LLM policy behind the rules' floor (the agent path, guardrails included)")
	fs.StringVar(&pf.path, "path", "", "direct|agent: the rules' sequential test fed directly (fast; every condemnation counts, an upper bound), "+
		"or through the agent path: the loop's cadence (evidence checks every second, steps every --interval and at once on new evidence), the policy's Decide and the guardrails; "+
		"default direct for --policy rules, agent for llm (the only path it has)")
	fs.StringVar(&pf.model, "model", "", "--policy llm: an emulated profile of the Ollama stand-in ("+strings.Join(ollamafake.Emulations, "|")+
		"; Go code, not a model), or with --ollama-host a model there")
	fs.StringVar(&pf.host, "ollama-host", "", "--policy llm: a real Ollama serving --model (default: --model is an emulated profile served in-process)")
	fs.StringVar(&pf.think, "think", "off", "--policy llm: the model's thinking (as hapilot run's --think)")
	fs.StringVar(&pf.form, "llm-prompt", "", "--policy llm: the prompt's form (full|compact|numbered; default the form the model names, else full)")
	fs.DurationVar(&pf.interval, "interval", 10*time.Second, "the agent path: the loop's step (whole seconds)")
	fs.BoolVar(&pf.unprotected, "unprotected", false, "--policy llm: without the protections the study's loop lacked (the model asked every step, its proposals run at once, its drains need no support from the windows; the floor and the guardrails stay): what they keep out")
	fs.Uint64Var(&pf.seed, "model-seed", 1, "--policy llm: the emulated profile's coin flips, and the model's sampling seed")
}

// agent builds the agent path's policy, nil for the direct path, and
// what stops an emulated model's server.
func (pf *policyFlags) agent(rc rules.Config, fs *flag.FlagSet) (*soak.AgentPolicy, func(), error) {
	noop := func() {}
	var llmOnly []string
	fs.Visit(func(f *flag.Flag) {
		switch f.Name {
		case "model", "ollama-host", "think", "llm-prompt", "model-seed", "unprotected":
			llmOnly = append(llmOnly, "--"+f.Name)
		}
	})
	if pf.path != "" && pf.path != "direct" && pf.path != "agent" {
		return nil, noop, fmt.Errorf("--path %q: want direct or agent", pf.path)
	}
	if pf.interval < time.Second || pf.interval%time.Second != 0 || pf.interval > time.Hour {
		return nil, noop, fmt.Errorf("--interval %v: whole seconds, from 1s to 1h", pf.interval)
	}
	switch pf.policy {
	case "rules":
		if len(llmOnly) > 0 {
			return nil, noop, fmt.Errorf("%s: for --policy llm", strings.Join(llmOnly, ", "))
		}
		if pf.path != "agent" {
			return nil, noop, nil
		}
		return soak.RulesAgent(rc, pf.interval), noop, nil
	case "llm":
	default:
		return nil, noop, fmt.Errorf("--policy %q: want rules or llm", pf.policy)
	}
	if pf.path == "direct" {
		return nil, noop, fmt.Errorf("--policy llm runs on the agent path only: the model decides on observations, which the direct path does not build")
	}
	if pf.model == "" {
		return nil, noop, fmt.Errorf("--policy llm needs --model: an emulated profile (%s), or a model on --ollama-host", strings.Join(ollamafake.Emulations, "|"))
	}
	cfg := llm.DefaultConfig()
	cfg.Model, cfg.Host, cfg.Seed = pf.model, pf.host, int(pf.seed)
	if err := cfg.Think.Set(pf.think); err != nil {
		return nil, noop, err
	}
	if pf.form != "" {
		if !slices.Contains(prompt.Styles, prompt.Style(pf.form)) {
			return nil, noop, fmt.Errorf("--llm-prompt %q: want %v", pf.form, prompt.Styles)
		}
		cfg.Prompt = prompt.Style(pf.form)
	}
	stop := noop
	if pf.host == "" {
		if !slices.Contains(ollamafake.Emulations, pf.model) {
			return nil, noop, fmt.Errorf("--model %q: not an emulated profile (%s); give --ollama-host for a real model", pf.model, strings.Join(ollamafake.Emulations, "|"))
		}
		host, model, s, err := soak.Emulated(pf.model, pf.seed, pf.interval)
		if err != nil {
			return nil, noop, err
		}
		cfg.Host, cfg.Model, stop, pf.emulated = host, model, s, true
		if pf.model == "thinker" || pf.model == "slow-thinker" {
			cfg.Think = modelapi.ThinkOn // the study's reasoning mode, as the bench runs them
		}
	}
	a, err := soak.LLMAgent(rc, cfg, pf.interval, pf.unprotected)
	if err != nil {
		stop()
		return nil, noop, err
	}
	return a, stop, nil
}

// describe is the agent path's policy in the table's head line.
func (pf *policyFlags) describe() string {
	if pf.policy == "rules" {
		return fmt.Sprintf("--policy rules through the agent path (steps every %v, guardrails)", pf.interval)
	}
	what := "the model " + pf.model + " on " + pf.host
	if pf.emulated {
		what = "the EMULATED profile " + pf.model + " (Go code behind the Ollama stand-in, not a model)"
	}
	prot := "its protections"
	if pf.unprotected {
		prot = "WITHOUT its protections (--unprotected: asked every step, no confirmation, no support check)"
	}
	return fmt.Sprintf("--policy llm: %s behind the rules' floor, %s, steps every %v, guardrails, no calibration gate", what, prot, pf.interval)
}
