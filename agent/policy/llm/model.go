// Package llm is the policy that asks a language model, through Ollama,
// what to do above the rules; and the protections a real model needs:
// its life cycle (inspected, warmed in the background, kept resident),
// a context sized to the prompt with truncation refused, thinking given
// its own budget, a deadline that never aborts a load, two-step
// confirmation, calls only when the windows show something the rules
// cannot decide, and a calibration gate.
package llm

import (
	"context"
	_ "embed"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"strings"
	"sync"
	"time"

	"github.com/hapilot/hapilot/agent"
	"github.com/ollama/ollama/api"
)

//go:embed system-prompt.txt
var DefaultSystemPrompt string

// Call is what one model call cost and returned, for the audit log.
type Call struct {
	Think            Think   `json:"think"`
	NumCtx           int     `json:"num_ctx"`
	NumPredict       int     `json:"num_predict"`
	PromptTokens     int     `json:"prompt_tokens"`
	CompletionTokens int     `json:"completion_tokens"`
	DoneReason       string  `json:"done_reason,omitempty"`
	TotalMs          float64 `json:"total_ms"`
	LoadMs           float64 `json:"load_ms"`
	WallMs           float64 `json:"wall_ms"`
	// Thinking is the model's reasoning, cut to MaxThinking bytes.
	Thinking string `json:"thinking,omitempty"`
	Raw      string `json:"raw,omitempty"` // kept when the reply was invalid
	Error    string `json:"error,omitempty"`
}

// MaxThinking bounds the reasoning kept in an audit record.
const MaxThinking = 2000

// Info is what the agent learned of the model and its server at start.
type Info struct {
	Version       string   `json:"ollama_version,omitempty"`
	Capabilities  []string `json:"capabilities,omitempty"`
	ContextLength int      `json:"context_length,omitempty"` // the model's own
	ParameterSize string   `json:"parameter_size,omitempty"`
	Quantization  string   `json:"quantization,omitempty"`
	Size          int64    `json:"size_bytes,omitempty"`
}

// CanThink reports the "thinking" capability.
func (i Info) CanThink() bool {
	for _, c := range i.Capabilities {
		if c == "thinking" {
			return true
		}
	}
	return false
}

// Model calls one Ollama model.
type Model struct {
	Client       *api.Client
	Config       Config
	SystemPrompt string

	mu sync.Mutex
	// numCtx is the context in force. It only grows, and in powers of
	// two: Ollama reloads the model whenever num_ctx changes.
	numCtx int
	// promptTokens is the largest prompt measured (prompt_eval_count).
	promptTokens int
	// noThinkLevels: the model answered 400 to a think level, so "on" is
	// sent instead from now on.
	noThinkLevels bool
	info          Info
}

// Errors a call can end with; each is an invalid or failed call, never
// an action.
var (
	ErrThinkUnsupported = errors.New("model does not support thinking")
	ErrContextOverflow  = errors.New("the prompt does not fit the model's context")
	ErrCutShort         = errors.New("the reply was cut at num_predict")
)

// Inspect asks /api/version and /api/show: capabilities, the model's own
// context length and size.
func (m *Model) Inspect(ctx context.Context) (Info, error) {
	var info Info
	v, err := m.Client.Version(ctx)
	if err != nil {
		return info, fmt.Errorf("llm: ollama version: %w", err)
	}
	info.Version = v
	show, err := m.Client.Show(ctx, &api.ShowRequest{Model: m.Config.Model})
	if err != nil {
		return info, fmt.Errorf("llm: show %s: %w", m.Config.Model, err)
	}
	for _, c := range show.Capabilities {
		info.Capabilities = append(info.Capabilities, string(c))
	}
	for k, v := range show.ModelInfo {
		if strings.HasSuffix(k, ".context_length") {
			if f, ok := v.(float64); ok {
				info.ContextLength = int(f)
			}
		}
	}
	info.ParameterSize, info.Quantization = show.Details.ParameterSize, show.Details.QuantizationLevel
	if list, err := m.Client.List(ctx); err == nil {
		for _, mod := range list.Models {
			if sameModel(mod.Name, m.Config.Model) {
				info.Size = mod.Size
			}
		}
	}
	m.mu.Lock()
	m.info = info
	m.mu.Unlock()
	return info, nil
}

func sameModel(listed, name string) bool {
	return listed == name || listed == name+":latest"
}

// keepAlive is the keep_alive sent with every request.
func (m *Model) keepAlive() *api.Duration {
	return &api.Duration{Duration: m.Config.KeepAlive}
}

// Warm loads the model without asking it anything (a chat with no
// messages), with the context and keep_alive the calls will use, so the
// first real call finds it resident. ctx must not be a step's: a load
// cancelled half way is aborted by Ollama.
func (m *Model) Warm(ctx context.Context, promptTokens int) (time.Duration, error) {
	stream := false
	req := &api.ChatRequest{Model: m.Config.Model, Stream: &stream, KeepAlive: m.keepAlive(),
		Options: map[string]any{"num_ctx": m.contextFor(promptTokens, m.numPredict(ThinkOff))}}
	var resp api.ChatResponse
	if err := m.Client.Chat(ctx, req, func(r api.ChatResponse) error { resp = r; return nil }); err != nil {
		return 0, fmt.Errorf("llm: load %s: %w", m.Config.Model, err)
	}
	return resp.LoadDuration, nil
}

// Loaded asks /api/ps whether the model is resident.
func (m *Model) Loaded(ctx context.Context) (bool, error) {
	ps, err := m.Client.ListRunning(ctx)
	if err != nil {
		return false, fmt.Errorf("llm: ps: %w", err)
	}
	for _, r := range ps.Models {
		if sameModel(r.Name, m.Config.Model) || sameModel(r.Model, m.Config.Model) {
			return true, nil
		}
	}
	return false, nil
}

// numPredict is the completion cap for a call: the answer's budget, plus
// thinking's own when thinking is on, since Ollama bounds both together.
// Config does not change after the model is built: no lock.
func (m *Model) numPredict(think Think) int {
	if think == ThinkOff {
		return m.Config.NumPredict
	}
	return m.Config.NumPredict + m.Config.ThinkBudget
}

// contextFor sizes num_ctx for a prompt of promptTokens (estimated, or
// the largest measured if larger) plus the completion: a quarter of
// headroom, a power of two of at least 2048, capped by the model's own
// context. Fixed by Config.NumCtx when set. It never shrinks, so the
// model is reloaded only when a prompt outgrows it.
func (m *Model) contextFor(promptTokens, numPredict int) int {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.Config.NumCtx > 0 {
		return m.Config.NumCtx
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
func (m *Model) Room(think Think) int {
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

// EstimateTokens guesses a text's tokens on the high side (three bytes
// a token), before any measurement.
func EstimateTokens(text string) int { return (len(text) + 2) / 3 }

func (m *Model) thinkValue(mode Think) *api.ThinkValue {
	switch mode {
	case ThinkOn:
		return &api.ThinkValue{Value: true}
	case ThinkLow, ThinkMedium, ThinkHigh:
		m.mu.Lock()
		defer m.mu.Unlock()
		if m.noThinkLevels {
			return &api.ThinkValue{Value: true}
		}
		return &api.ThinkValue{Value: string(mode)}
	}
	return &api.ThinkValue{Value: false}
}

// Ask sends one prompt under schema and returns the model's plan. think
// is the mode for this call. A think level the model does not take is
// retried at once as plain thinking, and remembered. Every way a reply
// can be unusable is an error: the Call then says why and keeps the raw
// text.
func (m *Model) Ask(ctx context.Context, prompt string, schema json.RawMessage, think Think) (agent.Plan, Call, error) {
	plan, call, err := m.ask(ctx, prompt, schema, think)
	var se api.StatusError
	if errors.As(err, &se) && se.StatusCode == 400 && strings.Contains(se.ErrorMessage, "think value") {
		m.mu.Lock()
		m.noThinkLevels = true
		m.mu.Unlock()
		plan, call, err = m.ask(ctx, prompt, schema, think)
		call.Error = strings.TrimPrefix(call.Error+"; ", "; ") + "think level refused: sent as on"
	}
	return plan, call, err
}

func (m *Model) ask(ctx context.Context, prompt string, schema json.RawMessage, think Think) (agent.Plan, Call, error) {
	c := m.Config
	call := Call{Think: think, NumPredict: m.numPredict(think)}
	call.NumCtx = m.contextFor(EstimateTokens(m.SystemPrompt)+EstimateTokens(prompt), call.NumPredict)
	stream, whole := false, false
	req := &api.ChatRequest{
		Model:     c.Model,
		Messages:  []api.Message{{Role: "system", Content: m.SystemPrompt}, {Role: "user", Content: prompt}},
		Stream:    &stream,
		Format:    schema,
		KeepAlive: m.keepAlive(),
		Think:     m.thinkValue(think),
		Truncate:  &whole, // a prompt that does not fit is an error, never silently cut
		Options:   map[string]any{"temperature": 0, "seed": c.Seed, "num_predict": call.NumPredict, "num_ctx": call.NumCtx},
	}
	start := time.Now()
	var resp api.ChatResponse
	got := false
	err := m.Client.Chat(ctx, req, func(r api.ChatResponse) error {
		resp, got = r, true
		return nil
	})
	call.WallMs = float64(time.Since(start)) / 1e6
	if err != nil {
		var se api.StatusError
		if errors.As(err, &se) && se.StatusCode == 400 {
			switch {
			case strings.Contains(se.ErrorMessage, "does not support thinking"):
				err = fmt.Errorf("%w: %v", ErrThinkUnsupported, err)
			case strings.Contains(se.ErrorMessage, "exceeds the context length"):
				err = fmt.Errorf("%w (num_ctx %d): %v", ErrContextOverflow, call.NumCtx, err)
			}
		}
		call.Error = err.Error()
		return nil, call, fmt.Errorf("llm: chat with %s: %w", c.Model, err)
	}
	if !got {
		call.Error = "empty response"
		return nil, call, fmt.Errorf("llm: chat with %s: empty response", c.Model)
	}
	call.PromptTokens, call.CompletionTokens, call.DoneReason = resp.PromptEvalCount, resp.EvalCount, resp.DoneReason
	call.TotalMs, call.LoadMs = float64(resp.TotalDuration)/1e6, float64(resp.LoadDuration)/1e6
	call.Thinking = truncate(resp.Message.Thinking, MaxThinking)
	m.mu.Lock()
	m.promptTokens = max(m.promptTokens, resp.PromptEvalCount)
	m.mu.Unlock()
	if resp.DoneReason == "length" {
		where := "in the answer"
		if resp.Message.Content == "" {
			where = "while thinking"
		}
		call.Raw, call.Error = truncate(resp.Message.Content, 2000), fmt.Sprintf("%v %s (%d tokens)", ErrCutShort, where, resp.EvalCount)
		return nil, call, fmt.Errorf("llm: %w %s: %d tokens", ErrCutShort, where, resp.EvalCount)
	}
	plan, err := ParseReply(resp.Message.Content)
	if err != nil {
		call.Raw, call.Error = truncate(resp.Message.Content, 2000), err.Error()
		return nil, call, fmt.Errorf("llm: invalid reply from %s: %w", c.Model, err)
	}
	return plan, call, nil
}

type replyAction struct {
	Reason  string `json:"reason"`
	Action  string `json:"action"`
	Backend string `json:"backend"`
	Server  string `json:"server"`
	Weight  *int   `json:"weight"`
}

// ParseReply validates a reply strictly: one JSON object with an
// "actions" list, every action well formed, nothing else. Any fault
// rejects the whole reply. A weight given with drain or ready, which the
// schema allows, is ignored.
func ParseReply(content string) (agent.Plan, error) {
	dec := json.NewDecoder(strings.NewReader(content))
	dec.DisallowUnknownFields()
	var r struct {
		Actions *[]replyAction `json:"actions"`
	}
	if err := dec.Decode(&r); err != nil {
		return nil, fmt.Errorf("not the reply schema: %w", err)
	}
	if dec.More() {
		return nil, errors.New("text after the JSON object")
	}
	if r.Actions == nil {
		return nil, errors.New(`no "actions" list`)
	}
	if len(*r.Actions) > 8 {
		return nil, fmt.Errorf("%d actions, at most 8", len(*r.Actions))
	}
	plan := agent.Plan{}
	for i, a := range *r.Actions {
		act, ok, err := agent.ParseAction(a.Action, a.Backend, a.Server, a.Weight, "model", a.Reason)
		if err != nil {
			return nil, fmt.Errorf("action %d: %w", i, err)
		}
		if ok {
			plan = append(plan, act)
		}
	}
	return plan, nil
}

func truncate(s string, n int) string {
	if len(s) > n {
		return strings.ToValidUTF8(s[:n], "") + "..."
	}
	return s
}

// Digest returns the model's digest as Ollama lists it, part of the key
// of its calibration record.
func (m *Model) Digest(ctx context.Context) (string, error) {
	list, err := m.Client.List(ctx)
	if err != nil {
		return "", fmt.Errorf("llm: list models: %w", err)
	}
	name := m.Config.Model
	for _, mod := range list.Models {
		if mod.Name == name || mod.Model == name || mod.Name == name+":latest" {
			return mod.Digest, nil
		}
	}
	return "", fmt.Errorf("llm: model %q is not on the Ollama server", name)
}
