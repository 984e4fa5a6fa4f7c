// Package llm is the policy that asks a language model, through Ollama's
// /api/chat, what to do; and the protections the study found it needs:
// a deadline with a fallback, two-cycle confirmation, a hold on undoing
// recent drains, calls only when the windows show a candidate, thinking
// switched off when it overruns, and a calibration gate.
package llm

import (
	"context"
	_ "embed"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/hapilot/hapilot/agent"
	"github.com/hapilot/hapilot/haproxy"
	"github.com/ollama/ollama/api"
)

//go:embed system-prompt.txt
var DefaultSystemPrompt string

// Call is what one model call cost and returned, for the audit log.
type Call struct {
	Think            Think   `json:"think"`
	PromptTokens     int     `json:"prompt_tokens"`
	CompletionTokens int     `json:"completion_tokens"`
	TotalMs          float64 `json:"total_ms"`
	LoadMs           float64 `json:"load_ms"`
	WallMs           float64 `json:"wall_ms"`
	Raw              string  `json:"raw,omitempty"` // kept when the reply was invalid
	Error            string  `json:"error,omitempty"`
}

// Model calls one Ollama model.
type Model struct {
	Client       *api.Client
	Config       Config
	SystemPrompt string
}

// ErrThinkUnsupported is Ollama's 400 for a model that cannot think.
var ErrThinkUnsupported = errors.New("model does not support thinking")

// schema constrains the reply through Ollama's `format`.
var schema = json.RawMessage(`{
  "type": "object",
  "properties": {
    "actions": {
      "type": "array",
      "maxItems": 8,
      "items": {
        "type": "object",
        "properties": {
          "action": {"type": "string", "enum": ["drain", "ready", "set_weight", "no_op"]},
          "backend": {"type": "string"},
          "server": {"type": "string"},
          "weight": {"type": "integer", "minimum": 0, "maximum": 256},
          "reason": {"type": "string", "maxLength": 200}
        },
        "required": ["action", "backend", "server", "reason"]
      }
    }
  },
  "required": ["actions"]
}`)

func thinkValue(mode Think) *api.ThinkValue {
	switch mode {
	case ThinkOn:
		return &api.ThinkValue{Value: true}
	case ThinkLow, ThinkMedium, ThinkHigh:
		return &api.ThinkValue{Value: string(mode)}
	}
	return &api.ThinkValue{Value: false}
}

// Ask sends one observation and returns the model's plan. think is the
// mode for this call. An invalid reply is an error; the Call then keeps
// the raw text.
func (m *Model) Ask(ctx context.Context, prompt string, think Think) (agent.Plan, Call, error) {
	c := m.Config
	call := Call{Think: think}
	stream := false
	keep := api.Duration{Duration: c.KeepAlive}
	req := &api.ChatRequest{
		Model: c.Model,
		Messages: []api.Message{
			{Role: "system", Content: m.SystemPrompt},
			{Role: "user", Content: prompt},
		},
		Stream:    &stream,
		Format:    schema,
		KeepAlive: &keep,
		Think:     thinkValue(think),
		Options:   map[string]any{"temperature": 0, "seed": c.Seed, "num_predict": c.NumPredict},
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
		if errors.As(err, &se) && se.StatusCode == 400 && strings.Contains(se.ErrorMessage, "does not support thinking") {
			err = fmt.Errorf("%w: %v", ErrThinkUnsupported, err)
		}
		call.Error = err.Error()
		return nil, call, fmt.Errorf("llm: chat with %s: %w", c.Model, err)
	}
	if !got {
		call.Error = "empty response"
		return nil, call, fmt.Errorf("llm: chat with %s: empty response", c.Model)
	}
	call.PromptTokens, call.CompletionTokens = resp.PromptEvalCount, resp.EvalCount
	call.TotalMs, call.LoadMs = float64(resp.TotalDuration)/1e6, float64(resp.LoadDuration)/1e6
	plan, err := ParseReply(resp.Message.Content)
	if err != nil {
		call.Raw, call.Error = truncate(resp.Message.Content, 2000), err.Error()
		return nil, call, fmt.Errorf("llm: invalid reply from %s: %w", c.Model, err)
	}
	return plan, call, nil
}

type replyAction struct {
	Action  string `json:"action"`
	Backend string `json:"backend"`
	Server  string `json:"server"`
	Weight  *int   `json:"weight"`
	Reason  string `json:"reason"`
}

// ParseReply validates a reply strictly: one JSON object with an
// "actions" list, every action well formed, nothing else. Any fault
// rejects the whole reply.
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
		if a.Action == "no_op" {
			continue
		}
		if err := haproxy.ValidName(a.Backend); err != nil {
			return nil, fmt.Errorf("action %d: backend: %w", i, err)
		}
		if err := haproxy.ValidName(a.Server); err != nil {
			return nil, fmt.Errorf("action %d: server: %w", i, err)
		}
		act := agent.Action{Backend: a.Backend, Server: a.Server, Reason: "model: " + truncate(a.Reason, 200)}
		switch a.Action {
		case "drain":
			act.Kind = agent.Drain
		case "ready":
			act.Kind = agent.Ready
		case "set_weight":
			if a.Weight == nil || *a.Weight < 0 || *a.Weight > 256 {
				return nil, fmt.Errorf("action %d: set_weight needs a weight in [0, 256]", i)
			}
			act.Kind, act.Weight = agent.SetWeight, *a.Weight
		default:
			return nil, fmt.Errorf("action %d: unknown action %q", i, a.Action)
		}
		if a.Weight != nil && act.Kind != agent.SetWeight {
			return nil, fmt.Errorf("action %d: weight given with %s", i, a.Action)
		}
		plan = append(plan, act)
	}
	return plan, nil
}

func truncate(s string, n int) string {
	if len(s) > n {
		return s[:n] + "..."
	}
	return s
}

// Digest returns the model's digest as Ollama lists it, the key of its
// calibration record.
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
