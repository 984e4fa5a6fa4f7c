// Package ollamafake is the stand-in Ollama server for tests and the
// benchmark: fast, and with emulated models that decide as a model
// should, which the tiny random models of internal/lab/modelserver
// cannot. It speaks Ollama's wire
// format (shared/ref/ollama-0.17/api.md) and, beyond the format, behaves
// as the real server (github.com/ollama/ollama v0.17.4) does where a
// client must cope, each behaviour read in that server's source:
//
//   - a model loads on its first request, taking LoadTime; a request
//     cancelled during the load aborts it, and the model stays unloaded
//     (server/sched.go waits with WaitUntilRunning(req.ctx));
//   - keep_alive (default 5m, negative: forever, 0: unload at once)
//     unloads an idle model, and a chat with no messages loads or unloads
//     one (done_reason "load" or "unload");
//   - a request whose num_ctx differs from the loaded runner's reloads it
//     (runner options differ: sched.go needsReload);
//   - num_ctx defaults to DefaultNumCtx (4096, as on GPUs under 23 GiB);
//     a prompt longer than min(num_ctx, the model's context) is cut from
//     its start, system prompt included, unless the request says
//     truncate:false, which makes it a 400 "the input length exceeds the
//     context length";
//   - num_predict bounds thinking and answer together: a thinking model
//     cut during its thinking answers "" with done_reason "length";
//   - a model that cannot think answers 400 `"m" does not support
//     thinking` to think:true; a think level on a model without harmony's
//     parser answers 400 `think value "low" is not supported for this
//     model`, after the load, as the real server checks it then; thinking
//     is on when think is omitted and the model can think;
//   - /api/show reports capabilities and the model's context length,
//     /api/ps what is loaded, with the context capped by the model's own
//     and the name tagged (":latest" when it has no tag); a load (a chat
//     with no messages) replies with no durations;
//   - a generation that repeats one token 31 times in a row is ended by
//     the server (llm/server.go, "token repeat limit"): the reply is 200
//     with what was generated, done false, no done_reason and no counts
//     (Reply.RepeatLimit).
//
// Each of these is checked against the real server, serving tiny random
// models, by internal/lab/modelserver's conformance test.
//
// What a model answers is decided by a Responder written in Go: an
// emulation, not a model, and labelled so wherever it is used.
package ollamafake

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"time"

	"github.com/ollama/ollama/api"
)

// Request is /api/chat's body as the fake reads it. Think is raw so that
// tests can tell an omitted field from false.
type Request struct {
	Model     string          `json:"model"`
	Messages  []Message       `json:"messages"`
	Stream    *bool           `json:"stream"`
	Format    json.RawMessage `json:"format"`
	Options   map[string]any  `json:"options"`
	Think     json.RawMessage `json:"think"`
	KeepAlive json.RawMessage `json:"keep_alive"`
	Truncate  *bool           `json:"truncate"`

	// Truncated is set by the fake when the prompt did not fit and was
	// cut from its start: the messages a Responder sees then lack the
	// system prompt, as the model's input would.
	Truncated bool `json:"-"`
}

// Message is one chat message.
type Message struct {
	Role     string `json:"role"`
	Content  string `json:"content"`
	Thinking string `json:"thinking,omitempty"`
}

// Reply is what a Responder answers.
type Reply struct {
	Content  string
	Thinking string // what it thinks when thinking is on
	// ThinkingTokens is how long it thinks, in tokens, when thinking is
	// on (0: as long as Thinking's text).
	ThinkingTokens int
	Delay          time.Duration // generation time (a slow model)
	// CompletionTokens overrides the count of answer tokens (0: from the
	// answer's text).
	CompletionTokens int
	Status           int // non-200: an error reply with Error as its text
	Error            string
	RawBody          *string // sent as is (a broken server), status 200
	// RepeatLimit ends the reply as Ollama's token repeat limit does:
	// Content as generated so far, done false, no done_reason, no counts.
	RepeatLimit bool
}

// Wait holds the reply for its Delay, as a slow model would; false when
// the request ended first (the client gave up), and nothing is answered.
func (r Reply) Wait(ctx context.Context) bool {
	if r.Delay <= 0 {
		return true
	}
	t := time.NewTimer(r.Delay)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}

// Responder decides the reply to one chat request.
type Responder func(req Request) Reply

// Server is the stand-in.
type Server struct {
	*httptest.Server
	Models map[string]string // name -> digest

	// The model's traits, as /api/show reports them.
	Thinking      bool // capability "thinking"
	ThinkLevels   bool // accepts "low"/"medium"/"high" (gpt-oss's harmony parser)
	ContextLength int  // the model's own context (model_info), default 32768
	// ModelInfo is more of model_info: a model's own GGUF metadata, such
	// as the prompt form it names (modelapi.PromptFormKey).
	ModelInfo map[string]any
	// The server's settings.
	DefaultNumCtx int           // num_ctx when a request sets none, default 4096
	LoadTime      time.Duration // a cold load
	Now           func() time.Time

	load    sync.Mutex // the scheduler: one load at a time
	mu      sync.Mutex
	respond Responder
	reqs    []Request
	runner  *runner // the loaded model, nil when none
	events  []string
}

// runner is a loaded model.
type runner struct {
	model  string
	numCtx int
	until  time.Time // zero: kept loaded forever
}

// New starts a stand-in serving models (name -> digest) with respond.
func New(models map[string]string, respond Responder) *Server {
	s := &Server{Models: models, respond: respond, ContextLength: 32768, DefaultNumCtx: 4096, Now: time.Now}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /api/chat", s.chat)
	mux.HandleFunc("GET /api/tags", s.tags)
	mux.HandleFunc("POST /api/show", s.show)
	mux.HandleFunc("GET /api/ps", s.ps)
	mux.HandleFunc("GET /api/version", func(w http.ResponseWriter, _ *http.Request) {
		writeJSON(w, 200, map[string]string{"version": "0.17.4"})
	})
	s.Server = httptest.NewServer(mux)
	return s
}

// SetResponder swaps the behaviour.
func (s *Server) SetResponder(r Responder) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.respond = r
}

// Requests returns the chat requests received so far.
func (s *Server) Requests() []Request {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]Request(nil), s.reqs...)
}

// Events returns what the server logged: loads, aborted loads, unloads.
func (s *Server) Events() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.events...)
}

// Loaded reports whether model is loaded now, and with which num_ctx.
func (s *Server) Loaded(model string) (numCtx int, ok bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	r := s.current()
	if r == nil || r.model != model {
		return 0, false
	}
	return r.numCtx, true
}

// current is the runner still loaded, nil once keep_alive expired.
// Called with s.mu held.
func (s *Server) current() *runner {
	if s.runner != nil && !s.runner.until.IsZero() && !s.Now().Before(s.runner.until) {
		s.events = append(s.events, "unloaded "+s.runner.model+": keep_alive expired")
		s.runner = nil
	}
	return s.runner
}

func (s *Server) logf(format string, args ...any) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.events = append(s.events, fmt.Sprintf(format, args...))
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json; charset=utf-8")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

func writeError(w http.ResponseWriter, status int, msg string) {
	writeJSON(w, status, map[string]string{"error": msg})
}

// Tokens estimates a text's tokens as a tokenizer of about four bytes a
// token would count them.
func Tokens(text string) int { return (len(text) + 3) / 4 }

func (s *Server) tags(w http.ResponseWriter, _ *http.Request) {
	var out api.ListResponse
	for name, d := range s.Models {
		out.Models = append(out.Models, api.ListModelResponse{Name: tagged(name), Model: tagged(name), ModifiedAt: time.Unix(1700000000, 0).UTC(),
			Size: 2_600_000_000, Digest: d, Details: s.details()})
	}
	writeJSON(w, 200, out)
}

func (s *Server) details() api.ModelDetails {
	return api.ModelDetails{Format: "gguf", Family: "qwen3", Families: []string{"qwen3"}, ParameterSize: "4.0B", QuantizationLevel: "Q4_K_M"}
}

func (s *Server) show(w http.ResponseWriter, r *http.Request) {
	var req api.ShowRequest
	if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
		writeError(w, http.StatusBadRequest, err.Error())
		return
	}
	if req.Model == "" {
		//lint:ignore SA1019 the real server still reads the old field, as the stand-in must
		req.Model = req.Name
	}
	if _, ok := s.lookup(req.Model); !ok {
		writeError(w, http.StatusNotFound, fmt.Sprintf("model '%s' not found", req.Model))
		return
	}
	caps := []string{"completion"}
	if s.Thinking {
		caps = append(caps, "thinking")
	}
	info := map[string]any{"general.architecture": "qwen3", "general.parameter_count": 4_022_468_096, "qwen3.context_length": s.ContextLength}
	for k, v := range s.ModelInfo {
		info[k] = v
	}
	writeJSON(w, 200, map[string]any{
		"details":      s.details(),
		"model_info":   info,
		"capabilities": caps,
		"modified_at":  time.Unix(1700000000, 0).UTC(),
	})
}

func (s *Server) ps(w http.ResponseWriter, _ *http.Request) {
	s.mu.Lock()
	r := s.current()
	s.mu.Unlock()
	out := api.ProcessResponse{Models: []api.ProcessModelResponse{}}
	if r != nil {
		exp := r.until
		if exp.IsZero() {
			exp = time.Date(2318, 1, 1, 0, 0, 0, 0, time.UTC) // as Ollama shows "forever"
		}
		// The runner's context is num_ctx capped by the model's own
		// (llm/server.go: "requested context size too large for model").
		out.Models = append(out.Models, api.ProcessModelResponse{Name: tagged(r.model), Model: tagged(r.model), Size: 3_400_000_000,
			Digest: s.Models[r.model], Details: s.details(), ExpiresAt: exp, SizeVRAM: 3_400_000_000, ContextLength: min(r.numCtx, s.ContextLength)})
	}
	writeJSON(w, 200, out)
}

// lookup finds a model by its name, with or without ":latest", as the
// real server does; it returns the name Models knows it by.
func (s *Server) lookup(name string) (string, bool) {
	if _, ok := s.Models[name]; ok {
		return name, true
	}
	if base, ok := strings.CutSuffix(name, ":latest"); ok {
		if _, ok := s.Models[base]; ok {
			return base, true
		}
	}
	if _, ok := s.Models[name+":latest"]; ok {
		return name + ":latest", true
	}
	return "", false
}

// tagged is a model's name as /api/ps and /api/tags list it: with its
// tag, ":latest" when it was named without one.
func tagged(name string) string {
	if i := strings.LastIndex(name, ":"); i >= 0 && !strings.Contains(name[i:], "/") {
		return name
	}
	return name + ":latest"
}

// think reads the request's think field: on, and a level when it is one.
func (req Request) think(canThink bool) (on bool, level string) {
	if len(req.Think) == 0 {
		return canThink, "" // omitted: the server turns thinking on
	}
	var v api.ThinkValue
	if err := json.Unmarshal(req.Think, &v); err != nil {
		return false, ""
	}
	if v.IsString() {
		return true, v.String()
	}
	return v.Bool(), ""
}

func optInt(opts map[string]any, name string, def int) int {
	if v, ok := opts[name].(float64); ok {
		return int(v)
	}
	return def
}

func (s *Server) chat(w http.ResponseWriter, r *http.Request) {
	var req Request
	if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
		writeError(w, http.StatusBadRequest, err.Error())
		return
	}
	s.mu.Lock()
	s.reqs = append(s.reqs, req)
	respond := s.respond
	s.mu.Unlock()
	model, ok := s.lookup(req.Model)
	if !ok {
		writeError(w, http.StatusNotFound, fmt.Sprintf("model %q not found, try pulling it first", req.Model))
		return
	}
	thinkOn, level := req.think(s.Thinking)
	if !s.Thinking && thinkOn {
		writeError(w, http.StatusBadRequest, fmt.Sprintf("%q does not support thinking", req.Model))
		return
	}
	keep := api.Duration{Duration: 5 * time.Minute}
	if len(req.KeepAlive) > 0 {
		if err := keep.UnmarshalJSON(req.KeepAlive); err != nil {
			writeError(w, http.StatusBadRequest, err.Error())
			return
		}
	}
	if len(req.Messages) == 0 && len(req.KeepAlive) > 0 && keep.Duration == 0 {
		s.unload(model)
		writeJSON(w, 200, api.ChatResponse{Model: req.Model, CreatedAt: time.Now().UTC(), Message: api.Message{Role: "assistant"}, Done: true, DoneReason: "unload"})
		return
	}
	start := time.Now()
	numCtx := optInt(req.Options, "num_ctx", s.DefaultNumCtx)
	if !s.schedule(r.Context(), model, numCtx) {
		return // the client went away during the load: nobody to answer
	}
	loaded := time.Since(start)
	defer s.keepAlive(model, keep.Duration)
	if len(req.Messages) == 0 {
		// No metrics: the real server's load reply has no durations
		// (server/routes.go), so a client times the load itself.
		writeJSON(w, 200, api.ChatResponse{Model: req.Model, CreatedAt: time.Now().UTC(), Message: api.Message{Role: "assistant"},
			Done: true, DoneReason: "load"})
		return
	}
	if level != "" && !s.ThinkLevels {
		writeError(w, http.StatusBadRequest, fmt.Sprintf("think value %q is not supported for this model", level))
		return
	}
	promptTokens, ok := s.fit(&req, numCtx)
	if !ok {
		writeError(w, http.StatusBadRequest, "the input length exceeds the context length")
		return
	}
	rep := respond(req)
	if !rep.Wait(r.Context()) {
		return
	}
	if rep.Status != 0 && rep.Status != 200 {
		writeError(w, rep.Status, rep.Error)
		return
	}
	if rep.RawBody != nil {
		w.WriteHeader(200)
		_, _ = w.Write([]byte(*rep.RawBody))
		return
	}
	if rep.RepeatLimit {
		writeJSON(w, 200, api.ChatResponse{Model: req.Model, CreatedAt: time.Now().UTC(), Message: api.Message{Role: "assistant", Content: rep.Content}})
		return
	}
	msg, evalCount, reason := generate(rep, thinkOn, optInt(req.Options, "num_predict", -1))
	total := time.Since(start)
	writeJSON(w, 200, api.ChatResponse{
		Model: req.Model, CreatedAt: time.Now().UTC(), Message: msg, Done: true, DoneReason: reason,
		Metrics: api.Metrics{TotalDuration: total, LoadDuration: loaded, PromptEvalCount: promptTokens,
			PromptEvalDuration: (total - loaded) / 3, EvalCount: evalCount, EvalDuration: (total - loaded) / 2},
	})
}

// schedule makes sure model runs with numCtx, loading it when it is not
// loaded or runs with another context. A load takes LoadTime and is
// aborted when the request that waits for it ends first. It reports
// whether the model is ready for this request.
func (s *Server) schedule(ctx context.Context, model string, numCtx int) bool {
	s.load.Lock()
	defer s.load.Unlock()
	s.mu.Lock()
	r := s.current()
	s.mu.Unlock()
	if r != nil && r.model == model && r.numCtx == numCtx {
		return true
	}
	if r != nil {
		s.logf("reloading %s: num_ctx %d, was %d", model, numCtx, r.numCtx)
	}
	// Ollama logs "starting runner" when a load begins; a client that
	// wants to cut a load waits for this line, not for a fixed time.
	s.logf("starting runner for %s", model)
	t := time.NewTimer(s.LoadTime)
	defer t.Stop()
	select {
	case <-t.C:
	case <-ctx.Done():
		s.mu.Lock()
		s.runner = nil
		s.events = append(s.events, "client connection closed before server finished loading, aborting load")
		s.mu.Unlock()
		return false
	}
	s.mu.Lock()
	s.runner = &runner{model: model, numCtx: numCtx}
	s.events = append(s.events, fmt.Sprintf("loaded %s with num_ctx %d", model, numCtx))
	s.mu.Unlock()
	return true
}

// keepAlive starts the idle timer after a request: negative keeps the
// model loaded, 0 unloads it now.
func (s *Server) keepAlive(model string, d time.Duration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.runner == nil || s.runner.model != model {
		return
	}
	switch {
	case d == 0:
		s.runner = nil
		s.events = append(s.events, "unloaded "+model+": keep_alive 0")
	case d < 0 || d > 100*365*24*time.Hour: // -1 arrives as MaxInt64
		s.runner.until = time.Time{}
	default:
		s.runner.until = s.Now().Add(d)
	}
}

func (s *Server) unload(model string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.runner != nil && s.runner.model == model {
		s.runner = nil
		s.events = append(s.events, "unloaded "+model+": asked to")
	}
}

// fit checks the prompt against the context: min(num_ctx, the model's
// own). A prompt that does not fit is an error with truncate:false, and
// otherwise loses its start, system prompt first, as the runner keeps
// only the tokens that fit.
func (s *Server) fit(req *Request, numCtx int) (tokens int, ok bool) {
	ctxLen := min(numCtx, s.ContextLength)
	for _, m := range req.Messages {
		tokens += Tokens(m.Content) + 4 // the template's tokens around a message
	}
	if tokens <= ctxLen {
		return tokens, true
	}
	if req.Truncate != nil && !*req.Truncate {
		return tokens, false
	}
	drop := (tokens - ctxLen) * 4 // bytes to lose from the start
	var kept []Message
	for _, m := range req.Messages {
		switch {
		case drop >= len(m.Content)+16:
			drop -= len(m.Content) + 16
		case drop > 0:
			m.Content = m.Content[min(drop, len(m.Content)):]
			drop = 0
			kept = append(kept, m)
		default:
			kept = append(kept, m)
		}
	}
	req.Messages, req.Truncated = kept, true
	return ctxLen, true
}

// generate applies num_predict, which bounds thinking and answer
// together: cut while thinking, the answer is empty.
func generate(rep Reply, thinkOn bool, numPredict int) (api.Message, int, string) {
	msg := api.Message{Role: "assistant", Content: rep.Content}
	answer := Tokens(rep.Content)
	if rep.CompletionTokens > 0 {
		answer = rep.CompletionTokens
	}
	thinking := 0
	if thinkOn {
		msg.Thinking = rep.Thinking
		if msg.Thinking == "" {
			msg.Thinking = "Let me compare each server with its peers."
		}
		thinking = rep.ThinkingTokens
		if thinking == 0 {
			thinking = Tokens(msg.Thinking)
		}
	}
	if numPredict < 0 || thinking+answer <= numPredict {
		return msg, thinking + answer, "stop"
	}
	if thinking >= numPredict {
		msg.Thinking = clip(msg.Thinking, numPredict*4)
		msg.Content = ""
		return msg, numPredict, "length"
	}
	msg.Content = clip(msg.Content, (numPredict-thinking)*4)
	return msg, numPredict, "length"
}

func clip(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return strings.ToValidUTF8(s[:n], "")
}
