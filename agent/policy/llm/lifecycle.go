package llm

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/hapilot/hapilot/internal/lib/wait"

	"github.com/hapilot/hapilot/agent"
	"github.com/hapilot/hapilot/agent/policy/llm/calibrate/fixtures"
	"github.com/hapilot/hapilot/agent/policy/llm/modelapi"
	"github.com/hapilot/hapilot/agent/policy/llm/prompt"
)

// Start inspects the model and loads it in the background, in requests
// no step cancels; until it is loaded, steps leave the decisions to the
// rules' floor and /status says "loading". Close stops it.
func (p *Policy) Start() {
	p.setLife(LifeInspecting, nil)
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		p.run(p.ctx)
	}()
}

func (p *Policy) run(ctx context.Context) {
	backoff := time.Second
	for ctx.Err() == nil {
		if err := p.bringUp(ctx); err != nil {
			if ctx.Err() != nil {
				return
			}
			p.setLife(LifeUnreachable, err)
			p.Log.Warn().Err(err).Dur("retry_in", backoff).Msg("the model is not usable yet; the rules act meanwhile")
			if !wait.Sleep(ctx, backoff) {
				return
			}
			backoff = min(2*backoff, 30*time.Second)
			continue
		}
		backoff = time.Second
		p.watch(ctx)
	}
}

// bringUp inspects the model and loads it.
func (p *Policy) bringUp(ctx context.Context) error {
	p.setLife(LifeInspecting, nil)
	info, err := p.inspect(ctx)
	if errors.Is(err, modelapi.ErrLoading) {
		// The server answers and loads the model (llama-server's /health
		// 503): wait for it as for a load, then ask again.
		p.setLife(LifeLoading, nil)
		p.Log.Info().Str("model", p.Config.Model).Msg("the server is loading the model: waiting for it")
		lctx, cancel := context.WithTimeout(ctx, p.Config.LoadTimeout)
		_, err = p.Model.Warm(lctx, 2048)
		cancel()
		if err != nil {
			return err
		}
		info, err = p.inspect(ctx)
	}
	if err != nil {
		return err
	}
	p.lmu.Lock()
	p.life.info = info
	p.lmu.Unlock()
	if p.Config.Prompt == "" && info.PromptForm != "" {
		p.Log.Info().Str("model", p.Config.Model).Str("named", info.PromptForm).Str("prompt", string(p.Model.Form())).
			Msg("the model names its prompt form: calls use it (--llm-prompt overrides)")
	}
	if p.Admit != nil {
		actx, cancel := context.WithTimeout(ctx, 10*time.Second)
		err := p.Admit(actx)
		cancel()
		if err != nil {
			p.setLife(LifeRefused, err)
			p.Log.Error().Err(err).Msg("the model may not act: the rules act alone")
			<-ctx.Done() // refused for good: only a restart with a new record lets it act
			return ctx.Err()
		}
		p.lmu.Lock()
		p.life.admitted = true
		p.lmu.Unlock()
	}
	if p.Config.Think != modelapi.ThinkOff && !info.CanThink() {
		p.mu.Lock()
		p.think = modelapi.ThinkOff
		p.mu.Unlock()
		p.Log.Warn().Str("model", p.Config.Model).Msg("the model cannot think (no \"thinking\" capability): thinking off")
	}
	return p.load(ctx)
}

func (p *Policy) inspect(ctx context.Context) (modelapi.Info, error) {
	ictx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	return p.Model.Inspect(ictx)
}

// load warms the model, under LoadTimeout and the policy's life only.
func (p *Policy) load(ctx context.Context) error {
	p.setLife(LifeLoading, nil)
	lctx, cancel := context.WithTimeout(ctx, p.Config.LoadTimeout)
	defer cancel()
	took, err := p.Model.Warm(lctx, 2048)
	if err != nil {
		return err
	}
	p.count(func(c *counters) { c.loads++ })
	if err := p.Model.Measure(lctx, TokenSample(p.Now())); err != nil {
		p.Log.Warn().Err(err).Msg("prompts are sized by the estimate alone until a call measures one")
	}
	p.setLife(LifeReady, nil)
	p.Log.Info().Str("model", p.Config.Model).Dur("load", took).Msg("the model is loaded: it decides from the next step")
	return nil
}

// watch loads the model again whenever it is found unloaded, until ctx
// ends or the server cannot be reached.
func (p *Policy) watch(ctx context.Context) {
	for wait.Sleep(ctx, p.WatchEvery) {
		wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		loaded, err := p.Model.Loaded(wctx)
		cancel()
		if err != nil {
			p.setLife(LifeUnreachable, err)
			return
		}
		if !loaded {
			p.Log.Warn().Str("model", p.Config.Model).Msg("the model was unloaded: loading it again")
			if err := p.load(ctx); err != nil {
				p.setLife(LifeUnreachable, err)
				return
			}
		}
	}
}

func (p *Policy) setLife(state Life, err error) {
	p.lmu.Lock()
	defer p.lmu.Unlock()
	p.life.err = ""
	if err != nil {
		p.life.err = err.Error()
	}
	if p.life.state != state {
		p.life.since = p.Now()
		if len(p.life.history) == maxLifeHistory {
			p.life.history = append(p.life.history[:0], p.life.history[1:]...)
		}
		p.life.history = append(p.life.history, LifeChange{State: state, At: p.life.since, Error: p.life.err})
	}
	p.life.state = state
}

// unusable says why the model cannot be asked this step, "" when it can.
// Before Start the model is asked as it is: a cold first call then loads
// it in the background.
func (p *Policy) unusable() string {
	p.lmu.Lock()
	defer p.lmu.Unlock()
	switch p.life.state {
	case LifeReady:
		return ""
	case LifeUnknown:
		if p.Admit != nil {
			return "the model's calibration record is not checked yet"
		}
		return ""
	case LifeUnreachable:
		return fmt.Sprintf("the model is unreachable (%s) for %v", p.life.err, p.Now().Sub(p.life.since).Round(time.Second))
	case LifeRefused:
		return "the model may not act: " + p.life.err
	}
	return fmt.Sprintf("the model is %s for %v", p.life.state, p.Now().Sub(p.life.since).Round(time.Second))
}

// Status is what /status shows of the model.
type Status struct {
	Model  string         `json:"model"`
	State  Life           `json:"state"`
	For    string         `json:"for"` // how long in that state, "loading 14s"
	Error  string         `json:"error,omitempty"`
	Info   modelapi.Info  `json:"info"`
	NumCtx int            `json:"num_ctx,omitempty"`
	Think  modelapi.Think `json:"think"`
	// Prompt is the prompt form in force (Model.Form).
	Prompt    prompt.Style `json:"prompt"`
	InFlightS float64      `json:"call_in_flight_s,omitempty"`
	// Calibration is the gate's verdict: "passed", "refused" (the reason
	// in Error), "pending" until Ollama answers, or "not required"
	// (--skip-calibration, or no Admit: the lab's study loop).
	Calibration string `json:"calibration"`
	// History is the last changes of State, oldest first.
	History []LifeChange `json:"history"`
	// What the model cost so far, as /metrics counts it.
	Calls            uint64 `json:"calls"`
	Fallbacks        uint64 `json:"fallbacks"`
	PromptTokens     uint64 `json:"prompt_tokens"`
	CompletionTokens uint64 `json:"completion_tokens"`
}

// PolicyStatus implements agent.StatusReporter; it never waits for a
// call.
func (p *Policy) PolicyStatus() any {
	p.lmu.Lock()
	life := p.life
	life.history = append([]LifeChange{}, life.history...) // setLife shifts it in place
	p.lmu.Unlock()
	st := Status{Model: p.Config.Model, State: life.state, Error: life.err, Info: life.info, Think: p.Config.Think, Prompt: p.Model.Form(),
		History: life.history}
	if !life.since.IsZero() {
		st.For = fmt.Sprintf("%s %v", life.state, p.Now().Sub(life.since).Round(time.Second))
	}
	st.NumCtx = p.Model.contextInForce()
	p.fmu.Lock()
	if p.inflight != nil {
		st.InFlightS = p.Now().Sub(p.inflight.started).Seconds()
	}
	p.fmu.Unlock()
	switch {
	case p.Admit == nil:
		st.Calibration = "not required"
	case life.state == LifeRefused:
		st.Calibration = "refused"
	case life.admitted:
		st.Calibration = "passed"
	default:
		st.Calibration = "pending"
	}
	p.cmu.Lock()
	st.Calls, st.Fallbacks, st.PromptTokens, st.CompletionTokens = p.counters.calls, p.counters.fallbacks, p.counters.promptTokens, p.counters.completionTokens
	p.cmu.Unlock()
	return st
}

// TokenSample is the start of a prompt as the policy writes one, about
// the calibration's largest fleet, cut at a row to maxSample bytes:
// Measure's sample, with names and numbers as the real prompts have
// them.
func TokenSample(now time.Time) string {
	var largest agent.Observation
	size := func(o agent.Observation) (n int) {
		for _, b := range o.Backends {
			n += len(b.Servers)
		}
		return n
	}
	for _, seq := range fixtures.Sequences(now) {
		for _, st := range seq.Steps {
			if size(st.Obs) > size(largest) {
				largest = st.Obs
			}
		}
	}
	only := map[string]bool{}
	for _, b := range largest.Backends {
		only[b.Name] = true
	}
	text := prompt.Render(prompt.Input{Obs: largest, Only: only, MaxShown: 12})
	if len(text) > maxSample {
		text = text[:strings.LastIndexByte(text[:maxSample], '\n')+1]
	}
	return text
}
