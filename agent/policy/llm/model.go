// Package llm is the policy that asks a language model what to do above
// the rules, and the protections a real model needs: its life cycle
// (inspected, warmed in the background, kept resident), a context sized
// to the prompt with truncation refused, thinking given its own budget, a
// deadline that never aborts a load, two-step confirmation, calls only
// when the windows show something the rules cannot decide (the rules'
// suspects), drains only where the windows agree, and a gate (Admit)
// that keeps an uncalibrated model from acting; shadow mode beside it.
//
// Its parts of their own: modelapi (the Ollama and OpenAI-compatible
// clients), prompt (the prompt's forms, the reply's schema and parser),
// calibrate (the calibration, its record and the gate's check) and
// calibrate/fixtures (the calibration's situations).
package llm

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/hapilot/hapilot/agent"
	"github.com/hapilot/hapilot/agent/policy/llm/modelapi"
	"github.com/hapilot/hapilot/agent/policy/llm/prompt"
)

// Call is what one model call cost and returned, for the audit log.
type Call struct {
	Think            modelapi.Think `json:"think"`
	NumCtx           int            `json:"num_ctx"`
	NumPredict       int            `json:"num_predict"`
	PromptTokens     int            `json:"prompt_tokens"`
	CompletionTokens int            `json:"completion_tokens"`
	DoneReason       string         `json:"done_reason,omitempty"`
	TotalMs          float64        `json:"total_ms"`
	LoadMs           float64        `json:"load_ms"`
	WallMs           float64        `json:"wall_ms"`
	// Thinking is the model's reasoning, cut to maxThinking bytes.
	Thinking string `json:"thinking,omitempty"`
	Raw      string `json:"raw,omitempty"` // kept when the reply was invalid
	Error    string `json:"error,omitempty"`
	// Schema is the form the reply schema was sent in when the server
	// refused the full one (OpenAI API); SchemaNote says why, on the call
	// that stepped down.
	Schema     string `json:"schema,omitempty"`
	SchemaNote string `json:"schema_note,omitempty"`
}

// maxThinking bounds the reasoning kept in an audit record.
const maxThinking = 2000

// Model calls one model on its server. Its exported fields are set
// before its first call and not changed after; the policy's step, its
// life cycle, a call running past its step and /status use it at once.
type Model struct {
	Server modelapi.Server
	Config Config
	// SystemPrompt, when set, replaces the embedded system prompt of the
	// model's form (System).
	SystemPrompt string

	mu sync.Mutex // guards numCtx, promptTokens, scale, sampled, noThinkLevels, info; taken last
	// numCtx is the context in force. It only grows, and in powers of
	// two: Ollama reloads the model whenever num_ctx changes.
	numCtx int
	// promptTokens is the largest prompt measured (prompt_eval_count).
	promptTokens int
	// scale is the largest ratio yet of a prompt's measured tokens to
	// estimateTokens' guess (1 until a tokenizer proves finer): every
	// later estimate is scaled by it.
	scale float64
	// sampled: Measure has measured the tokenizer.
	sampled bool
	// noThinkLevels: the model answered 400 to a think level, so "on" is
	// sent instead from now on.
	noThinkLevels bool
	info          modelapi.Info
}

// Inspect asks the server about the model: capabilities, the model's
// own context length and size (Server.Inspect).
func (m *Model) Inspect(ctx context.Context) (modelapi.Info, error) {
	info, err := m.Server.Inspect(ctx, m.Config.Model)
	if err != nil {
		return info, err
	}
	m.mu.Lock()
	m.info = info
	m.mu.Unlock()
	return info, nil
}

// Form is the prompt form the model is called with: Config.Prompt when
// given (--llm-prompt), else the form the model names in its metadata
// (Info.PromptForm, known once Inspect has run), else full. A model
// trained on one form thus travels with it.
func (m *Model) Form() prompt.Style {
	if m.Config.Prompt != "" {
		return m.Config.Prompt
	}
	m.mu.Lock()
	named := prompt.Style(m.info.PromptForm)
	m.mu.Unlock()
	if slices.Contains(prompt.Styles, named) {
		return named
	}
	return prompt.Full
}

// System is the system prompt calls send: SystemPrompt, or the embedded
// one of the model's Form.
func (m *Model) System() string {
	if m.SystemPrompt != "" {
		return m.SystemPrompt
	}
	return m.Form().SystemPrompt()
}

// Warm loads the model without asking it anything, with the context and
// keep_alive the calls will use, so the first real call finds it
// resident. ctx must not be a step's: a load cancelled half way is
// aborted by Ollama.
func (m *Model) Warm(ctx context.Context, promptTokens int) (time.Duration, error) {
	return m.Server.Warm(ctx, modelapi.Request{Model: m.Config.Model, KeepAlive: m.Config.KeepAlive, NumThread: m.Config.NumThread,
		NumCtx: m.contextFor(promptTokens, m.numPredict(modelapi.ThinkOff))})
}

// maxSample bounds Measure's sample: at one token a byte, the finest a
// tokenizer of ASCII text gets, it and the system prompt fit the 2048
// tokens every context has, with the chat template's own.
const maxSample = 1000

// Measure asks the model for one token about sample (the system prompt
// and a slice of a real prompt) right after a load, so that the
// estimate's scale is this model's tokenizer's before the first step.
// Without it, a tokenizer finer than estimateTokens' guess (a byte a
// token, say) overflows the first large prompt, and that step is lost to
// the floor. It measures once per Model; its tokens and time are no
// step's. It is sent at the context in force, so Ollama does not reload.
func (m *Model) Measure(ctx context.Context, sample string) error {
	if len(sample) > maxSample {
		sample = sample[:maxSample]
	}
	m.mu.Lock()
	done, numCtx := m.sampled, m.numCtx
	m.mu.Unlock()
	if done {
		return nil
	}
	raw := estimateTokens(m.System()) + estimateTokens(sample)
	resp, err := m.Server.Chat(ctx, modelapi.Request{Model: m.Config.Model, System: m.System(), User: sample,
		NumPredict: 1, NumCtx: numCtx, NumThread: m.Config.NumThread, Seed: m.Config.Seed, KeepAlive: m.Config.KeepAlive})
	if err != nil {
		if errors.Is(err, modelapi.ErrContextOverflow) {
			m.overflowed(raw, numCtx, 1, modelapi.ReportedPromptTokens(err))
		}
		return fmt.Errorf("llm: measure %s's tokenizer: %w", m.Config.Model, err)
	}
	if resp.PromptTokens == 0 {
		return fmt.Errorf("llm: measure %s's tokenizer: the server reported no prompt tokens", m.Config.Model)
	}
	m.measured(raw, resp.PromptTokens)
	m.mu.Lock()
	m.sampled = true
	m.mu.Unlock()
	return nil
}

// contextInForce is num_ctx as the last call or load sent it (0 before
// any).
func (m *Model) contextInForce() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.numCtx
}

// Loaded asks the server whether the model is resident and ready.
func (m *Model) Loaded(ctx context.Context) (bool, error) {
	return m.Server.Loaded(ctx, m.Config.Model)
}

// numPredict is the completion cap for a call: the answer's budget, plus
// thinking's own when thinking is on, since Ollama bounds both together.
// Config does not change after the model is built: no lock.
func (m *Model) numPredict(think modelapi.Think) int {
	if think == modelapi.ThinkOff {
		return m.Config.NumPredict
	}
	return m.Config.NumPredict + m.Config.ThinkBudget
}

// contextFor sizes num_ctx for a prompt of promptTokens (estimated, or
// the largest measured if larger) plus the completion: a quarter of
// headroom, a power of two of at least 2048, capped by the model's own
// context. Fixed by Config.NumCtx when set, and by the server when it
// keeps its own (Server.SizesContext; its context when known). It never shrinks, so the model is
// reloaded only when a prompt outgrows it, or one overflows it.
func (m *Model) contextFor(promptTokens, numPredict int) int {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.Config.NumCtx > 0 {
		return m.Config.NumCtx
	}
	if !m.Server.SizesContext() {
		return m.info.ContextLength
	}
	need := float64(max(promptTokens, m.promptTokens)+numPredict) * 1.25
	n := max(2048, 1<<int(math.Ceil(math.Log2(need))))
	if m.info.ContextLength > 0 {
		n = min(n, m.info.ContextLength)
	}
	m.numCtx = max(m.numCtx, n)
	return m.numCtx
}

// Room is how many prompt tokens fit the largest context the model has,
// with its completion; 0 when the model's context is unknown.
func (m *Model) Room(think modelapi.Think) int {
	m.mu.Lock()
	defer m.mu.Unlock()
	limit := m.info.ContextLength
	if m.Config.NumCtx > 0 {
		limit = m.Config.NumCtx
	}
	if limit == 0 {
		return 0
	}
	return limit - m.numPredict(think)
}

// estimateTokens guesses a text's tokens on the high side, before any
// measurement, splitting it as the pre-tokenizers of Qwen and Llama 3 do:
// a token per digit, since they split numbers into single digits (Llama
// 3 into runs of three) and the prompt's tables are mostly numbers; a
// token per four letters of a word, which takes the space or punctuation
// before it; and a token per other byte (a space before a number, the
// dot in 1.17, a newline, non-ASCII). Prose comes out near three bytes a
// token, a table of numbers near one and a half.
func estimateTokens(text string) int {
	isLetter := func(c byte) bool { c |= 0x20; return c >= 'a' && c <= 'z' }
	n, letters := 0, 0
	for i := 0; i < len(text); i++ {
		c := text[i]
		if isLetter(c) {
			letters++
			continue
		}
		n += (letters + 3) / 4
		letters = 0
		if c != '\n' && c != '\r' && (c < '0' || c > '9') && i+1 < len(text) && isLetter(text[i+1]) {
			continue // it goes with the word after it
		}
		n++
	}
	return n + (letters+3)/4
}

// maxScale bounds how far measurements may raise the estimate: a
// tokenizer of single bytes is three times estimateTokens' guess of
// prose, plus the chat template's own tokens.
const maxScale = 4.0

// maxGrownCtx bounds num_ctx grown after an overflow when the model's own
// context is unknown.
const maxGrownCtx = 1 << 17

// EstimatePrompt is the system prompt's and prompt's tokens on the high
// side: estimateTokens, scaled by the finest tokenizer this model has
// shown (measured counts, and prompts that overflowed).
func (m *Model) EstimatePrompt(text string) int {
	raw := estimateTokens(m.System()) + estimateTokens(text)
	m.mu.Lock()
	defer m.mu.Unlock()
	return int(math.Ceil(float64(raw) * max(m.scale, 1)))
}

// measured learns from a prompt of raw estimated tokens that measured
// tokens.
func (m *Model) measured(raw, tokens int) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.promptTokens = max(m.promptTokens, tokens)
	m.rescale(raw, tokens)
}

// rescale raises the estimate's scale for a prompt of raw estimated
// tokens that had tokens. m.mu is held.
func (m *Model) rescale(raw, tokens int) {
	if raw > 0 && tokens > raw {
		m.scale = min(maxScale, max(m.scale, float64(tokens)/float64(raw)))
	}
}

// overflowed learns from a prompt of raw estimated tokens that did not
// fit numCtx: it had at least numCtx-numPredict tokens (or as many as the
// server reported), so the estimate's scale grows to match, and num_ctx
// doubles before the next call, up to the model's own context. No
// prompt_eval_count comes back from a failed call: without this, nothing
// would grow. A fixed context (Config.NumCtx, or the server's own) does
// not grow; the policy shows fewer servers instead.
func (m *Model) overflowed(raw, numCtx, numPredict, reported int) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.promptTokens = max(m.promptTokens, reported)
	least := reported
	if least == 0 {
		least = numCtx - numPredict
	}
	m.rescale(raw, least)
	if m.Config.NumCtx > 0 || !m.Server.SizesContext() || numCtx <= 0 {
		return
	}
	limit := maxGrownCtx
	if m.info.ContextLength > 0 {
		limit = m.info.ContextLength
	}
	m.numCtx = max(m.numCtx, min(2*numCtx, limit))
}

// sendThink is the think mode to send: a level the model refused goes as
// plain thinking.
func (m *Model) sendThink(mode modelapi.Think) modelapi.Think {
	switch mode {
	case modelapi.ThinkLow, modelapi.ThinkMedium, modelapi.ThinkHigh:
		m.mu.Lock()
		defer m.mu.Unlock()
		if m.noThinkLevels {
			return modelapi.ThinkOn
		}
	}
	return mode
}

// Ask sends one prompt under schema and returns the model's plan. think
// is the mode for this call. A think level the model does not take is
// retried at once as plain thinking, and remembered. Every way a reply
// can be unusable is an error: the Call then says why and keeps the raw
// text.
func (m *Model) Ask(ctx context.Context, text string, schema json.RawMessage, think modelapi.Think) (agent.Plan, Call, error) {
	plan, call, err := m.ask(ctx, text, schema, think)
	if errors.Is(err, modelapi.ErrThinkLevel) {
		m.mu.Lock()
		m.noThinkLevels = true
		m.mu.Unlock()
		plan, call, err = m.ask(ctx, text, schema, think)
		call.Error = strings.TrimPrefix(call.Error+"; ", "; ") + "think level refused: sent as on"
	}
	return plan, call, err
}

func (m *Model) ask(ctx context.Context, text string, schema json.RawMessage, think modelapi.Think) (agent.Plan, Call, error) {
	c := m.Config
	call := Call{Think: think, NumPredict: m.numPredict(think)}
	raw := estimateTokens(m.System()) + estimateTokens(text)
	call.NumCtx = m.contextFor(m.EstimatePrompt(text), call.NumPredict)
	req := modelapi.Request{Model: c.Model, System: m.System(), User: text, Schema: schema, Think: m.sendThink(think),
		NumPredict: call.NumPredict, NumCtx: call.NumCtx, NumThread: c.NumThread, Seed: c.Seed, KeepAlive: c.KeepAlive}
	start := time.Now()
	resp, err := m.Server.Chat(ctx, req)
	call.WallMs = float64(time.Since(start)) / 1e6
	call.Schema, call.SchemaNote = resp.Schema, resp.Stepped
	if err != nil {
		switch {
		case errors.Is(err, modelapi.ErrThinkUnsupported):
			err = fmt.Errorf("%w: %v", modelapi.ErrThinkUnsupported, err)
		case errors.Is(err, modelapi.ErrContextOverflow):
			m.overflowed(raw, call.NumCtx, call.NumPredict, modelapi.ReportedPromptTokens(err))
			err = fmt.Errorf("%w (num_ctx %d): %v", modelapi.ErrContextOverflow, call.NumCtx, err)
		}
		call.Error = err.Error()
		return nil, call, fmt.Errorf("llm: chat with %s: %w", c.Model, err)
	}
	call.PromptTokens, call.CompletionTokens, call.DoneReason = resp.PromptTokens, resp.CompletionTokens, resp.DoneReason
	call.TotalMs, call.LoadMs = float64(resp.Total)/1e6, float64(resp.Load)/1e6
	call.Thinking = truncate(resp.Thinking, maxThinking)
	m.measured(raw, resp.PromptTokens)
	if resp.DoneReason == "length" {
		where := "in the answer"
		if resp.Content == "" {
			where = "while thinking"
		}
		call.Raw, call.Error = truncate(resp.Content, 2000), fmt.Sprintf("%v %s (%d tokens)", modelapi.ErrCutShort, where, resp.CompletionTokens)
		return nil, call, fmt.Errorf("llm: %w %s: %d tokens", modelapi.ErrCutShort, where, resp.CompletionTokens)
	}
	if resp.Unfinished {
		// Ollama's token repeat limit: 200, done false, no counts.
		call.Raw, call.Error = truncate(resp.Content, 2000), fmt.Sprintf("%v, with no done reason, after %d bytes", modelapi.ErrUnfinished, len(resp.Content))
		return nil, call, fmt.Errorf("llm: %w, with no done reason", modelapi.ErrUnfinished)
	}
	plan, err := prompt.ParseReply(resp.Content)
	if err != nil {
		call.Raw, call.Error = truncate(resp.Content, 2000), err.Error()
		return nil, call, fmt.Errorf("llm: invalid reply from %s: %w", c.Model, err)
	}
	return plan, call, nil
}

func truncate(s string, n int) string {
	if len(s) > n {
		return strings.ToValidUTF8(s[:n], "") + "..."
	}
	return s
}

// Digest identifies the model's weights, part of the key of its
// calibration record: Ollama's digest, or what an OpenAI server says of
// the model, hashed (OpenAI.Digest).
func (m *Model) Digest(ctx context.Context) (string, error) {
	return m.Server.Digest(ctx, m.Config.Model)
}
