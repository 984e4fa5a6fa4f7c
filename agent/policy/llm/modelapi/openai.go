package modelapi

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"path"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/hapilot/hapilot/internal/lib/wait"
)

// OpenAI is the OpenAI-compatible API that llama-server, vLLM, SGLang,
// LM Studio and Ollama's /v1 serve: POST /v1/chat/completions with the
// reply schema in OpenAI's nested response_format, an explicit
// temperature and seed, and max_tokens. Readiness comes from what the
// server offers: llama-server's /health (503 while it loads the model)
// and /props (its context, n_ctx); /v1/models elsewhere, where a model
// listed is a model ready. The server keeps its own context: num_ctx and
// keep_alive are not sent.
type OpenAI struct {
	Base string // the server's base URL, without /v1
	HTTP *http.Client
	// PollEvery is how often Warm asks /health while the server loads.
	PollEvery time.Duration

	mu sync.Mutex // guards rung
	// rung is the schema form in force for each model, an index into
	// schemaLadder: it only moves down, when the server refuses a form.
	rung map[string]int
}

// NewOpenAI is the client of the server at base (its /v1 suffix, if
// any, dropped); client carries the API key, and no timeout.
func NewOpenAI(base string, client *http.Client) *OpenAI {
	base = strings.TrimSuffix(strings.TrimRight(base, "/"), "/v1")
	return &OpenAI{Base: base, HTTP: client, PollEvery: 500 * time.Millisecond, rung: map[string]int{}}
}

// A schemaForm is one way of sending the reply schema. schemaLadder
// lists them from the whole schema down: a server that refuses one (a
// grammar it cannot build) gets the next, and the model keeps that one.
// Whatever the form, the reply meets the same strict ParseReply; the
// ladder trades what the grammar enforces for a server that accepts it.
// Adjust it here as real servers show what they refuse.
type schemaForm struct {
	Name string
	// Drop removes these keywords wherever they appear in the schema.
	Drop []string
	// Format, when set, replaces json_schema: "json_object" asks for any
	// JSON object; "none" sends no response_format at all.
	Format string
}

var schemaLadder = []schemaForm{
	{Name: "json_schema"},
	// llama-server b11669 once refused enum with required ("Failed to
	// initialize samplers").
	{Name: "json_schema without enum and required", Drop: []string{"enum", "required"}},
	{Name: "json_schema of plain types", Drop: []string{"enum", "required", "maxLength", "maxItems", "minimum", "maximum"}},
	{Name: "json_object", Format: "json_object"},
	{Name: "no response_format", Format: "none"},
}

// schemaRefusals are the words of a server's error about a schema it
// cannot turn into a grammar (lower case).
var schemaRefusals = []string{"failed to initialize samplers", "grammar", "json_schema", "response_format", "schema"}

// responseFormat is the request's response_format for schema in form f,
// nil for none.
func (f schemaForm) responseFormat(schema json.RawMessage) (any, error) {
	if schema == nil { // a request for no form at all (Model.Measure)
		return nil, nil
	}
	switch f.Format {
	case "none":
		return nil, nil
	case "json_object":
		return map[string]any{"type": "json_object"}, nil
	}
	b := schema // as written: properties in their order, the reason first
	if len(f.Drop) > 0 {
		var s any
		if err := json.Unmarshal(schema, &s); err != nil {
			return nil, fmt.Errorf("the reply schema: %w", err)
		}
		var err error
		if b, err = json.Marshal(dropKeywords(s, f.Drop, false)); err != nil {
			return nil, err
		}
	}
	return map[string]any{"type": "json_schema", "json_schema": map[string]any{"name": "plan", "schema": json.RawMessage(b), "strict": true}}, nil
}

// dropKeywords removes keywords from a decoded schema, except among a
// "properties" object's keys, which are names.
func dropKeywords(v any, drop []string, names bool) any {
	switch t := v.(type) {
	case map[string]any:
		out := map[string]any{}
		for k, x := range t {
			if !names && contains(drop, k) {
				continue
			}
			out[k] = dropKeywords(x, drop, !names && k == "properties")
		}
		return out
	case []any:
		out := make([]any, len(t))
		for i, x := range t {
			out[i] = dropKeywords(x, drop, false)
		}
		return out
	}
	return v
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// apiError is a server's error reply.
type apiError struct {
	Status        int
	Message, Type string
	// llama-server's exceed_context_size_error says the sizes.
	PromptTokens, NCtx int
}

func (e *apiError) Error() string {
	s := fmt.Sprintf("%d %s", e.Status, e.Message)
	if e.Type != "" {
		s += " (" + e.Type + ")"
	}
	return s
}

// parseError reads an error body: OpenAI's {"error": {...}}, a bare
// {"error": "..."}, or vLLM's flat {"message", "type"}.
func parseError(status int, body []byte) *apiError {
	e := &apiError{Status: status}
	type fields struct {
		Message      string `json:"message"`
		Type         string `json:"type"`
		NPromptToken int    `json:"n_prompt_tokens"`
		NCtx         int    `json:"n_ctx"`
	}
	var env struct {
		Error json.RawMessage `json:"error"`
		fields
	}
	var f fields
	if json.Unmarshal(body, &env) == nil {
		f = env.fields
		var text string
		switch {
		case json.Unmarshal(env.Error, &f) == nil && f.Message != "":
		case json.Unmarshal(env.Error, &text) == nil && text != "":
			f.Message = text
		}
	}
	if f.Message == "" {
		// Whole: the client's redaction scrubs the key before it cuts
		// the text (MaxErrorText), so no part of a key survives a cut.
		f.Message = strings.TrimSpace(string(body))
	}
	if f.Message == "" {
		f.Message = http.StatusText(status)
	}
	e.Message, e.Type, e.PromptTokens, e.NCtx = f.Message, f.Type, f.NPromptToken, f.NCtx
	return e
}

// overflow: the prompt does not fit the server's context. llama-server:
// 400 exceed_context_size_error, "the request exceeds the available
// context size"; Ollama's /v1: "the input length exceeds the context
// length"; vLLM: "This model's maximum context length is N tokens".
func (e *apiError) overflow() bool {
	if e.Status != http.StatusBadRequest && e.Status != http.StatusRequestEntityTooLarge {
		return false
	}
	m := strings.ToLower(e.Message)
	return e.Type == "exceed_context_size_error" || strings.Contains(m, "context size") ||
		strings.Contains(m, "context length") || strings.Contains(m, "context window")
}

// schemaRefused: the server cannot build a grammar from the schema (400
// or 500, as llama-server answered "Failed to initialize samplers").
func (e *apiError) schemaRefused() bool {
	if e.Status != http.StatusBadRequest && e.Status != http.StatusInternalServerError && e.Status != http.StatusUnprocessableEntity {
		return false
	}
	m := strings.ToLower(e.Message)
	for _, w := range schemaRefusals {
		if strings.Contains(m, w) {
			return true
		}
	}
	return false
}

// do sends one request; the reply's body comes back whatever its status,
// decoded into out when it is 200 and out is set.
func (o *OpenAI) do(ctx context.Context, method, p string, body, out any) (int, []byte, error) {
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return 0, nil, err
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, o.Base+p, rd)
	if err != nil {
		return 0, nil, err
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	req.Header.Set("Accept", "application/json")
	resp, err := o.HTTP.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(io.LimitReader(resp.Body, 8<<20))
	if err != nil {
		return resp.StatusCode, raw, fmt.Errorf("%s %s: %w", method, p, err)
	}
	if resp.StatusCode == http.StatusOK && out != nil {
		if err := json.Unmarshal(raw, out); err != nil {
			return resp.StatusCode, raw, fmt.Errorf("%s %s: not the reply expected: %w", method, p, err)
		}
	}
	return resp.StatusCode, raw, nil
}

type health int

const (
	healthNone health = iota // the server has no /health
	healthReady
	healthLoading
)

// health asks /health: llama-server's (503 while loading), vLLM's and
// SGLang's. A server without one (Ollama, LM Studio) answers 404.
func (o *OpenAI) health(ctx context.Context) (health, error) {
	status, body, err := o.do(ctx, http.MethodGet, "/health", nil, nil)
	switch {
	case err != nil:
		return healthNone, fmt.Errorf("llm: %s/health: %w", o.Base, err)
	case status == http.StatusOK:
		return healthReady, nil
	case status == http.StatusServiceUnavailable:
		return healthLoading, nil
	case status == http.StatusUnauthorized || status == http.StatusForbidden:
		return healthNone, fmt.Errorf("llm: %s/health: %v: check --llm-key-file", o.Base, parseError(status, body))
	}
	return healthNone, nil
}

// props is the part of llama-server's /props read here.
type props struct {
	NCtx                      int `json:"n_ctx"`
	DefaultGenerationSettings struct {
		NCtx int `json:"n_ctx"`
	} `json:"default_generation_settings"`
	ModelPath string `json:"model_path"`
	BuildInfo string `json:"build_info"`
}

func (p props) nCtx() int {
	if n := p.DefaultGenerationSettings.NCtx; n > 0 {
		return n
	}
	return p.NCtx
}

// props reads llama-server's /props; ok is false on a server without it.
func (o *OpenAI) props(ctx context.Context) (p props, ok bool, err error) {
	status, _, err := o.do(ctx, http.MethodGet, "/props", nil, &p)
	if err != nil && status == 0 {
		return p, false, fmt.Errorf("llm: %s/props: %w", o.Base, err)
	}
	return p, err == nil && status == http.StatusOK, nil
}

// listed is one model of /v1/models: vLLM adds max_model_len,
// llama-server adds meta (n_params, size, n_ctx_train...).
type listed struct {
	ID          string          `json:"id"`
	OwnedBy     string          `json:"owned_by"`
	MaxModelLen int             `json:"max_model_len"`
	Meta        json.RawMessage `json:"meta"`
}

func (o *OpenAI) models(ctx context.Context) ([]listed, error) {
	var list struct {
		Data []listed `json:"data"`
	}
	status, body, err := o.do(ctx, http.MethodGet, "/v1/models", nil, &list)
	if err != nil {
		return nil, fmt.Errorf("llm: %s/v1/models: %w", o.Base, err)
	}
	if status != http.StatusOK {
		return nil, fmt.Errorf("llm: %s/v1/models: %v", o.Base, parseError(status, body))
	}
	return list.Data, nil
}

// pick finds model among those listed: by id, by Ollama's ":latest", or
// by llama-server's file name; single, when the server serves one model
// whatever it is called (llama-server, which lists its file's path).
func pick(list []listed, model string, single bool) (listed, bool) {
	for _, l := range list {
		if l.ID == model || l.ID == model+":latest" || strings.TrimSuffix(path.Base(l.ID), ".gguf") == model {
			return l, true
		}
	}
	if single && len(list) == 1 {
		return list[0], true
	}
	return listed{}, false
}

func names(list []listed) string {
	var n []string
	for _, l := range list {
		n = append(n, l.ID)
	}
	return strings.Join(n, ", ")
}

// Inspect learns the server's context: llama-server's /props n_ctx, or
// vLLM's max_model_len in /v1/models; a server that says neither (Ollama's
// /v1) leaves it unknown, and Config.NumCtx may say it. ErrLoading while
// /health answers 503. The capabilities are unknown: thinking is off.
func (o *OpenAI) Inspect(ctx context.Context, model string) (Info, error) {
	info := Info{API: APIOpenAI}
	h, err := o.health(ctx)
	if err != nil {
		return info, err
	}
	if h == healthLoading {
		return info, fmt.Errorf("llm: %s: %w", o.Base, ErrLoading)
	}
	p, llama, err := o.props(ctx)
	if err != nil {
		return info, err
	}
	if llama {
		info.ContextLength, info.Server = p.nCtx(), strings.TrimSpace("llama-server "+p.BuildInfo)
	}
	list, err := o.models(ctx)
	if err != nil && h == healthNone {
		return info, err
	}
	l, found := pick(list, model, llama)
	if !found && err == nil && !llama {
		return info, fmt.Errorf("llm: model %q is not on the server at %s (it lists %s)", model, o.Base, names(list))
	}
	if found {
		if info.ContextLength == 0 {
			info.ContextLength = l.MaxModelLen
		}
		if info.Server == "" {
			info.Server = l.OwnedBy
		}
		var meta struct {
			Params int64 `json:"n_params"`
			Size   int64 `json:"size"`
		}
		if json.Unmarshal(l.Meta, &meta) == nil {
			info.Size = meta.Size
			if meta.Params > 0 {
				info.ParameterSize = fmt.Sprintf("%.2fB", float64(meta.Params)/1e9)
			}
		}
	}
	return info, nil
}

// SizesContext: the server keeps its own context.
func (*OpenAI) SizesContext() bool { return false }

// Loaded: /health is 200, or, on a server without one, /v1/models lists
// the model (a server that loads on demand, as Ollama does, loads it on
// the next call).
func (o *OpenAI) Loaded(ctx context.Context, model string) (bool, error) {
	h, err := o.health(ctx)
	if err != nil || h != healthNone {
		return h == healthReady, err
	}
	list, err := o.models(ctx)
	if err != nil {
		return false, err
	}
	_, found := pick(list, model, false)
	return found, nil
}

// Warm waits, under ctx, until /health says the model is loaded; on a
// server without /health it asks for one token, which loads the model
// where the server loads on demand (Ollama's /v1). The wait is the load
// time it returns.
func (o *OpenAI) Warm(ctx context.Context, req Request) (time.Duration, error) {
	start := time.Now()
	for {
		h, err := o.health(ctx)
		if err != nil {
			return 0, fmt.Errorf("llm: load %s: %w", req.Model, err)
		}
		switch h {
		case healthReady:
			return time.Since(start), nil
		case healthLoading:
			if !wait.Sleep(ctx, o.PollEvery) {
				return 0, fmt.Errorf("llm: load %s: the server was still loading it: %w", req.Model, ctx.Err())
			}
			continue
		}
		body := chatBody{Model: req.Model, Messages: []message{{Role: "user", Content: "."}}, MaxTokens: 1, Seed: req.Seed}
		status, raw, err := o.do(ctx, http.MethodPost, "/v1/chat/completions", body, nil)
		if err == nil && status != http.StatusOK {
			err = parseError(status, raw)
		}
		if err != nil {
			return 0, fmt.Errorf("llm: load %s: %w", req.Model, err)
		}
		return time.Since(start), nil
	}
}

type message struct {
	Role    string `json:"role"`
	Content string `json:"content"`
}

// chatBody is a /v1/chat/completions request. Temperature and seed are
// always sent: Ollama's /v1 defaults the temperature to 1 when omitted.
type chatBody struct {
	Model           string    `json:"model"`
	Messages        []message `json:"messages"`
	Stream          bool      `json:"stream"`
	Temperature     float64   `json:"temperature"`
	Seed            int       `json:"seed"`
	MaxTokens       int       `json:"max_tokens"`
	ResponseFormat  any       `json:"response_format,omitempty"`
	ReasoningEffort string    `json:"reasoning_effort,omitempty"`
}

type completion struct {
	Choices []struct {
		FinishReason *string `json:"finish_reason"`
		Message      struct {
			Content          *string `json:"content"`
			ReasoningContent string  `json:"reasoning_content"` // llama-server, vLLM
			Reasoning        string  `json:"reasoning"`         // Ollama
		} `json:"message"`
	} `json:"choices"`
	Usage *struct {
		PromptTokens     int `json:"prompt_tokens"`
		CompletionTokens int `json:"completion_tokens"`
	} `json:"usage"`
	// Timings are llama-server's.
	Timings *struct {
		PromptMs    float64 `json:"prompt_ms"`
		PredictedMs float64 `json:"predicted_ms"`
	} `json:"timings"`
}

// Chat sends one /v1/chat/completions, not streamed, under the schema
// form in force for the model. A schema the server refuses is sent again
// at once in the next form down the ladder, which the model keeps; the
// Reply says so on that call.
func (o *OpenAI) Chat(ctx context.Context, req Request) (Reply, error) {
	o.mu.Lock()
	rung := o.rung[req.Model]
	o.mu.Unlock()
	var reply Reply
	for {
		form := schemaLadder[rung]
		if rung > 0 {
			reply.Schema = form.Name
		}
		rf, err := form.responseFormat(req.Schema)
		if err != nil {
			return reply, err
		}
		body := chatBody{Model: req.Model, Messages: []message{{Role: "system", Content: req.System}, {Role: "user", Content: req.User}},
			Temperature: 0, Seed: req.Seed, MaxTokens: req.NumPredict, ResponseFormat: rf}
		switch req.Think {
		case ThinkLow, ThinkMedium, ThinkHigh:
			body.ReasoningEffort = string(req.Think)
		}
		var c completion
		status, raw, err := o.do(ctx, http.MethodPost, "/v1/chat/completions", body, &c)
		if err != nil {
			return reply, err
		}
		if status != http.StatusOK {
			e := parseError(status, raw)
			switch {
			case e.overflow():
				return reply, &ServerError{Kind: ErrContextOverflow, Err: e, PromptTokens: e.PromptTokens}
			case e.schemaRefused() && rung+1 < len(schemaLadder):
				rung++
				o.mu.Lock()
				if o.rung[req.Model] < rung {
					o.rung[req.Model] = rung
				}
				o.mu.Unlock()
				if reply.Stepped != "" {
					reply.Stepped += "; then "
				}
				reply.Stepped += fmt.Sprintf("the server refused the reply schema as %s (%v): %s from now on", form.Name, e, schemaLadder[rung].Name)
				continue
			}
			return reply, e
		}
		if len(c.Choices) == 0 {
			return reply, errors.New("no choices in the reply")
		}
		ch := c.Choices[0]
		if ch.Message.Content != nil {
			reply.Content = *ch.Message.Content
		}
		reply.Thinking = ch.Message.ReasoningContent + ch.Message.Reasoning
		if ch.FinishReason == nil || *ch.FinishReason == "" {
			// Ollama's token repeat limit: finish_reason null, usage 0.
			reply.Unfinished = true
		} else {
			reply.DoneReason = *ch.FinishReason
		}
		if c.Usage != nil {
			reply.PromptTokens, reply.CompletionTokens = c.Usage.PromptTokens, c.Usage.CompletionTokens
		}
		if c.Timings != nil {
			reply.Total = time.Duration((c.Timings.PromptMs + c.Timings.PredictedMs) * float64(time.Millisecond))
		}
		return reply, nil
	}
}

// Digest stands for the model's weights, which no OpenAI-compatible
// server hashes for its clients: "openai:" and a hash of the model's
// name, llama-server's model_path (/props), and the model's entry in
// /v1/models (its id, owner, max_model_len and llama-server's meta: the
// parameters, size, vocabulary and trained context), without "created",
// which llama-server and vLLM set to the time of the request. A model
// replaced by another of the same file, name and size keeps its record:
// for Ollama, whose native API gives the real digest, use --llm-api
// ollama.
func (o *OpenAI) Digest(ctx context.Context, model string) (string, error) {
	p, llama, err := o.props(ctx)
	if err != nil {
		return "", err
	}
	parts := []string{"model=" + model}
	if llama {
		parts = append(parts, "model_path="+p.ModelPath)
	}
	list, err := o.models(ctx)
	if err != nil && !llama {
		return "", err
	}
	if l, found := pick(list, model, llama); found {
		meta := ""
		var m map[string]any
		if json.Unmarshal(l.Meta, &m) == nil && m != nil {
			b, _ := json.Marshal(m) // keys sorted
			meta = string(b)
		}
		parts = append(parts, "id="+l.ID, "owned_by="+l.OwnedBy, fmt.Sprintf("max_model_len=%d", l.MaxModelLen), "meta="+meta)
	} else if !llama {
		return "", fmt.Errorf("llm: model %q is not on the server at %s (it lists %s)", model, o.Base, names(list))
	}
	sort.Strings(parts[1:])
	return "openai:" + hash(parts...), nil
}

func truncate(s string, n int) string {
	if len(s) > n {
		return strings.ToValidUTF8(s[:n], "") + "..."
	}
	return s
}

// hash is the digest's hash of its parts, as the calibration record's key
// hashes its own: a changed part changes it.
func hash(parts ...string) string {
	h := sha256.New()
	for _, p := range parts {
		fmt.Fprintf(h, "%d:%s;", len(p), p)
	}
	return hex.EncodeToString(h.Sum(nil))[:16]
}
