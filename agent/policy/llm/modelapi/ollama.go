package modelapi

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/ollama/ollama/api"
)

// Ollama is Ollama's native API, through Ollama's own client: /api/show
// for the model's capabilities and context, /api/ps for residence, a chat
// without messages for a load, num_ctx, keep_alive, an explicit think and
// truncate false on every call.
type Ollama struct {
	Client *api.Client
}

// SizesContext: num_ctx is sent with every call.
func (*Ollama) SizesContext() bool { return true }

// Inspect asks /api/version and /api/show: capabilities, the model's own
// context length and size, and the prompt form it names (PromptFormKey).
func (o *Ollama) Inspect(ctx context.Context, model string) (Info, error) {
	info := Info{API: APIOllama}
	v, err := o.Client.Version(ctx)
	if err != nil {
		return info, fmt.Errorf("llm: ollama version: %w", err)
	}
	info.Version = v
	show, err := o.Client.Show(ctx, &api.ShowRequest{Model: model})
	if err != nil {
		return info, fmt.Errorf("llm: show %s: %w", model, err)
	}
	for _, c := range show.Capabilities {
		info.Capabilities = append(info.Capabilities, string(c))
	}
	info.PromptForm, _ = show.ModelInfo[PromptFormKey].(string)
	for k, v := range show.ModelInfo {
		if strings.HasSuffix(k, ".context_length") {
			if f, ok := v.(float64); ok {
				info.ContextLength = int(f)
			}
		}
	}
	info.ParameterSize, info.Quantization = show.Details.ParameterSize, show.Details.QuantizationLevel
	if list, err := o.Client.List(ctx); err == nil {
		for _, mod := range list.Models {
			if sameModel(mod.Name, model) {
				info.Size = mod.Size
			}
		}
	}
	return info, nil
}

func sameModel(listed, name string) bool {
	return listed == name || listed == name+":latest"
}

// Warm loads the model without asking it anything (a chat with no
// messages), with the context and keep_alive the calls will use. A load
// cancelled half way is aborted by Ollama.
func (o *Ollama) Warm(ctx context.Context, req Request) (time.Duration, error) {
	stream := false
	r := &api.ChatRequest{Model: req.Model, Stream: &stream, KeepAlive: &api.Duration{Duration: req.KeepAlive},
		Options: runnerOptions(req, map[string]any{"num_ctx": req.NumCtx})}
	// The load's reply carries no durations (checked against Ollama
	// 0.17.4 by the lab's conformance test): the call is timed here.
	start := time.Now()
	if err := o.Client.Chat(ctx, r, func(api.ChatResponse) error { return nil }); err != nil {
		return 0, fmt.Errorf("llm: load %s: %w", req.Model, err)
	}
	return time.Since(start), nil
}

// Loaded asks /api/ps whether the model is resident.
func (o *Ollama) Loaded(ctx context.Context, model string) (bool, error) {
	ps, err := o.Client.ListRunning(ctx)
	if err != nil {
		return false, fmt.Errorf("llm: ps: %w", err)
	}
	for _, r := range ps.Models {
		if sameModel(r.Name, model) || sameModel(r.Model, model) {
			return true, nil
		}
	}
	return false, nil
}

func thinkValue(mode Think) *api.ThinkValue {
	switch mode {
	case ThinkOn:
		return &api.ThinkValue{Value: true}
	case ThinkLow, ThinkMedium, ThinkHigh:
		return &api.ThinkValue{Value: string(mode)}
	}
	return &api.ThinkValue{Value: false}
}

// Chat sends one /api/chat, not streamed, with truncation refused: a
// prompt that does not fit is an error, never silently cut from its start.
func (o *Ollama) Chat(ctx context.Context, req Request) (Reply, error) {
	stream, whole := false, false
	r := &api.ChatRequest{
		Model:     req.Model,
		Messages:  []api.Message{{Role: "system", Content: req.System}, {Role: "user", Content: req.User}},
		Stream:    &stream,
		Format:    req.Schema,
		KeepAlive: &api.Duration{Duration: req.KeepAlive},
		Think:     thinkValue(req.Think),
		Truncate:  &whole,
		Options:   runnerOptions(req, map[string]any{"temperature": 0, "seed": req.Seed, "num_predict": req.NumPredict, "num_ctx": req.NumCtx}),
	}
	var resp api.ChatResponse
	got := false
	err := o.Client.Chat(ctx, r, func(c api.ChatResponse) error {
		resp, got = c, true
		return nil
	})
	if err != nil {
		var se api.StatusError
		if errors.As(err, &se) && se.StatusCode == 400 {
			switch msg := se.ErrorMessage; {
			case strings.Contains(msg, "does not support thinking"):
				err = &ServerError{Kind: ErrThinkUnsupported, Err: err}
			case strings.Contains(msg, "think value"):
				err = &ServerError{Kind: ErrThinkLevel, Err: err}
			case strings.Contains(msg, "exceeds") && strings.Contains(msg, "context length"):
				err = &ServerError{Kind: ErrContextOverflow, Err: err}
			}
		}
		return Reply{}, err
	}
	if !got {
		return Reply{}, errors.New("empty response")
	}
	return Reply{Content: resp.Message.Content, Thinking: resp.Message.Thinking,
		PromptTokens: resp.PromptEvalCount, CompletionTokens: resp.EvalCount, DoneReason: resp.DoneReason,
		Unfinished: !resp.Done, Total: resp.TotalDuration, Load: resp.LoadDuration}, nil
}

// Digest returns the model's digest as Ollama lists it.
func (o *Ollama) Digest(ctx context.Context, model string) (string, error) {
	list, err := o.Client.List(ctx)
	if err != nil {
		return "", fmt.Errorf("llm: list models: %w", err)
	}
	for _, mod := range list.Models {
		if mod.Name == model || mod.Model == model || mod.Name == model+":latest" {
			return mod.Digest, nil
		}
	}
	return "", fmt.Errorf("llm: model %q is not on the Ollama server", model)
}

// runnerOptions adds to opts what loads the runner the same way on every
// request, the warm-up's included: a change of num_thread, as of num_ctx,
// makes Ollama load the model again.
func runnerOptions(req Request, opts map[string]any) map[string]any {
	if req.NumThread > 0 {
		opts["num_thread"] = req.NumThread
	}
	return opts
}
