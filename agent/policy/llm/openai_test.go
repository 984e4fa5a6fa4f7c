package llm

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hapilot/hapilot/agent"
	"github.com/hapilot/hapilot/agent/policy/llm/modelapi"
	"github.com/hapilot/hapilot/agent/policy/llm/prompt"
	"github.com/hapilot/hapilot/agent/policy/rules"
	"github.com/hapilot/hapilot/internal/lab/ollamafake"
	"github.com/rs/zerolog"
)

// oaiFake is an OpenAI-compatible stand-in: llama-server's /health and
// /props when set, /v1/models, and /v1/chat/completions answered by an
// emulated model (an ollamafake.Responder), with usage counted as the
// Ollama stand-in counts (four bytes a token). Unset parts answer 404,
// as a server without them does.
type oaiFake struct {
	*httptest.Server
	respond ollamafake.Responder
	key     string // the API key required, "" for none

	loading atomic.Bool // /health answers 503
	health  bool        // the server has /health
	props   map[string]any
	models  []map[string]any
	// refuse, when set, refuses a chat request's response_format with
	// llama-server's 400 "Failed to initialize samplers".
	refuse func(rf map[string]any) bool
	// fail, when set, answers a chat request with its status and body
	// (status 0: answer normally).
	fail func(n int) (int, string)

	mu    sync.Mutex
	reqs  []map[string]any
	auths []string
}

func newOAIFake(t *testing.T, respond ollamafake.Responder, setup func(*oaiFake)) *oaiFake {
	t.Helper()
	f := &oaiFake{respond: respond}
	if setup != nil {
		setup(f)
	}
	f.Server = httptest.NewServer(http.HandlerFunc(f.serve))
	t.Cleanup(f.Close)
	return f
}

// llamaServer sets f up as llama-server serving one model of context nctx.
func llamaServer(nctx int) func(*oaiFake) {
	return func(f *oaiFake) {
		f.health = true
		f.props = map[string]any{"default_generation_settings": map[string]any{"n_ctx": nctx}, "model_path": "/models/tiny.gguf", "build_info": "b11669-0000000"}
		f.models = []map[string]any{{"id": "/models/tiny.gguf", "owned_by": "llamacpp", "meta": map[string]any{"n_params": 1200000, "size": 469000, "n_ctx_train": 32768}}}
	}
}

func (f *oaiFake) requests() []map[string]any {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]map[string]any(nil), f.reqs...)
}

func writeBody(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

func (f *oaiFake) serve(w http.ResponseWriter, r *http.Request) {
	f.mu.Lock()
	f.auths = append(f.auths, r.Header.Get("Authorization"))
	f.mu.Unlock()
	if f.key != "" && r.Header.Get("Authorization") != "Bearer "+f.key {
		writeBody(w, 401, map[string]any{"error": map[string]any{"message": "Invalid API Key", "type": "authentication_error"}})
		return
	}
	switch {
	case r.URL.Path == "/health" && f.health:
		if f.loading.Load() {
			writeBody(w, 503, map[string]any{"error": map[string]any{"code": 503, "message": "Loading model", "type": "unavailable_error"}})
			return
		}
		writeBody(w, 200, map[string]any{"status": "ok"})
	case r.URL.Path == "/props" && f.props != nil:
		writeBody(w, 200, f.props)
	case r.URL.Path == "/v1/models" && f.models != nil:
		var data []map[string]any
		for _, m := range f.models {
			e := map[string]any{"object": "model", "created": time.Now().UnixNano()} // the time of the request, as llama-server's
			for k, v := range m {
				e[k] = v
			}
			data = append(data, e)
		}
		writeBody(w, 200, map[string]any{"object": "list", "data": data})
	case r.URL.Path == "/v1/chat/completions" && r.Method == http.MethodPost:
		f.chat(w, r)
	default:
		http.NotFound(w, r)
	}
}

func (f *oaiFake) chat(w http.ResponseWriter, r *http.Request) {
	var body map[string]any
	if err := json.NewDecoder(r.Body).Decode(&body); err != nil {
		writeBody(w, 400, map[string]any{"error": map[string]any{"message": err.Error()}})
		return
	}
	f.mu.Lock()
	f.reqs = append(f.reqs, body)
	n := len(f.reqs)
	f.mu.Unlock()
	if f.fail != nil {
		if status, text := f.fail(n); status != 0 {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(status)
			_, _ = w.Write([]byte(text))
			return
		}
	}
	rf, _ := body["response_format"].(map[string]any)
	if f.refuse != nil && rf != nil && f.refuse(rf) {
		writeBody(w, 400, map[string]any{"error": map[string]any{"code": 400, "message": "Failed to initialize samplers: failed to parse grammar", "type": "invalid_request_error"}})
		return
	}
	req := ollamafake.Request{Model: body["model"].(string)}
	promptTokens := 0
	msgs, _ := body["messages"].([]any)
	for _, m := range msgs {
		mm := m.(map[string]any)
		req.Messages = append(req.Messages, ollamafake.Message{Role: mm["role"].(string), Content: mm["content"].(string)})
		promptTokens += ollamafake.Tokens(mm["content"].(string)) + 4
	}
	rep := f.respond(req)
	if rep.Status != 0 && rep.Status != 200 {
		writeBody(w, rep.Status, map[string]any{"error": map[string]any{"message": rep.Error}})
		return
	}
	if !rep.Wait(r.Context()) {
		return
	}
	tokens := ollamafake.Tokens(rep.Content)
	if rep.CompletionTokens > 0 {
		tokens = rep.CompletionTokens
	}
	var finish any = "stop"
	if max, _ := body["max_tokens"].(float64); max > 0 && tokens > int(max) {
		rep.Content, tokens, finish = rep.Content[:int(max)*4], int(max), "length"
	}
	usage := map[string]any{"prompt_tokens": promptTokens, "completion_tokens": tokens, "total_tokens": promptTokens + tokens}
	if rep.RepeatLimit {
		finish, usage = nil, map[string]any{"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0}
	}
	writeBody(w, 200, map[string]any{"id": "chatcmpl-1", "object": "chat.completion", "model": req.Model,
		"choices": []any{map[string]any{"index": 0, "finish_reason": finish, "message": map[string]any{"role": "assistant", "content": rep.Content}}},
		"usage":   usage, "timings": map[string]any{"prompt_ms": 3.5, "predicted_ms": 10.0}})
}

// keyFile writes an API key of mode perm.
func keyFile(t *testing.T, key string, perm os.FileMode) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "llm.key")
	if err := os.WriteFile(path, []byte(key+"\n"), perm); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(path, perm); err != nil {
		t.Fatal(err)
	}
	return path
}

// newOpenAIPolicy is newPolicy through the OpenAI API, built as the
// daemon builds it (Config.Server), with an API key.
func newOpenAIPolicy(t *testing.T, respond ollamafake.Responder, setup func(*oaiFake), mod func(*Config)) (*Policy, *oaiFake) {
	t.Helper()
	f := newOAIFake(t, respond, func(f *oaiFake) {
		f.key = "sk-test"
		llamaServer(8192)(f)
		if setup != nil {
			setup(f)
		}
	})
	cfg := DefaultConfig()
	cfg.Model, cfg.API, cfg.URL, cfg.KeyFile = "tiny", modelapi.APIOpenAI, f.URL+"/v1", keyFile(t, "sk-test", 0o600)
	cfg.Deadline, cfg.LoadTimeout = 2*time.Second, 10*time.Second
	if mod != nil {
		mod(&cfg)
	}
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	m, err := NewModel(cfg)
	if err != nil {
		t.Fatal(err)
	}
	modelapi.Unwrap(m.Server).(*modelapi.OpenAI).PollEvery = time.Millisecond
	p := New(m, rules.NewPolicy(rules.DefaultConfig()), rules.DefaultConfig(), cfg, zerolog.Nop())
	t.Cleanup(p.Close)
	return p, f
}

// The request is OpenAI's, as every compatible server reads it: the
// nested json_schema, an explicit temperature and seed, max_tokens, the
// key; no Ollama options. The reply's usage is the call's tokens, and the
// grey zone is the model's after confirmation, as through Ollama.
func TestOpenAIRequestAndReply(t *testing.T) {
	p, f := newOpenAIPolicy(t, ollamafake.Capable, nil, nil)
	obs := grey(time.Unix(1000, 0))
	if first := steps(t, p, obs, 1); len(first) != 0 {
		t.Fatalf("acted on the first proposal: %v", first)
	}
	second := steps(t, p, obs, 1)
	if len(second) != 1 || second[0].Kind != agent.Drain || second[0].Server != "srv4" {
		t.Fatalf("second step %v (report %+v)", second, p.Report())
	}
	req := f.requests()[0]
	rf := req["response_format"].(map[string]any)
	js := rf["json_schema"].(map[string]any)
	if rf["type"] != "json_schema" || js["name"] != "plan" || js["strict"] != true || js["schema"] == nil {
		t.Fatalf("response_format %v", rf)
	}
	if req["temperature"] != 0.0 || req["seed"] != 42.0 || req["max_tokens"] != 256.0 || req["stream"] != false || req["model"] != "tiny" {
		t.Fatalf("request %v", req)
	}
	for _, k := range []string{"options", "keep_alive", "num_ctx", "think", "format"} {
		if _, ok := req[k]; ok {
			t.Errorf("an Ollama field %q was sent", k)
		}
	}
	msgs := req["messages"].([]any)
	if len(msgs) != 2 || msgs[0].(map[string]any)["role"] != "system" || !strings.Contains(msgs[1].(map[string]any)["content"].(string), "srv4 ready none 1 1 ") {
		t.Fatalf("messages %v", msgs)
	}
	for _, a := range f.auths {
		if a != "Bearer sk-test" {
			t.Fatalf("a request without the key: %q", a)
		}
	}
	c := p.Report().(Report).Call
	if c == nil || c.PromptTokens < 100 || c.CompletionTokens == 0 || c.DoneReason != "stop" || c.TotalMs != 13.5 || c.NumCtx != 0 || c.Schema != "" {
		t.Fatalf("call %+v", c)
	}
}

// Readiness as llama-server tells it: /health 503 while it loads the
// model is "loading", and /props' n_ctx is the context; a server that
// reloads is waited for again by the watch.
func TestOpenAIReadinessFromHealth(t *testing.T) {
	p, f := newOpenAIPolicy(t, ollamafake.Capable, func(f *oaiFake) { f.loading.Store(true) }, nil)
	p.WatchEvery = time.Millisecond
	p.Start()
	waitFor(t, func() bool { return p.PolicyStatus().(Status).State == LifeLoading })
	steps(t, p, grey(time.Unix(1000, 0)), 1)
	if r := p.Report().(Report); r.Called || !strings.Contains(r.Fallback, "loading") {
		t.Fatalf("while loading: %+v", r)
	}
	f.loading.Store(false)
	waitFor(t, func() bool { return p.PolicyStatus().(Status).State == LifeReady })
	st := p.PolicyStatus().(Status)
	if st.Info.ContextLength != 8192 || st.Info.API != modelapi.APIOpenAI || st.Info.Server != "llama-server b11669-0000000" {
		t.Fatalf("status %+v", st)
	}
	steps(t, p, grey(time.Unix(1001, 0)), 1)
	if r := p.Report().(Report); !r.Called || r.Call.NumCtx != 8192 {
		t.Fatalf("ready: %+v", r)
	}
	// The server restarts and loads again: the watch sees /health 503
	// and waits for it.
	f.loading.Store(true)
	waitFor(t, func() bool { return p.PolicyStatus().(Status).State == LifeLoading })
	f.loading.Store(false)
	waitFor(t, func() bool { p.cmu.Lock(); defer p.cmu.Unlock(); return p.counters.loads == 2 })
}

// What each kind of server says of the model, and when it is missing.
func TestOpenAIInspect(t *testing.T) {
	tests := []struct {
		name    string
		setup   func(*oaiFake)
		model   string
		ctxLen  int
		server  string
		err     string
		loading bool
	}{
		{"llama-server", llamaServer(4096), "tiny", 4096, "llama-server b11669-0000000", "", false},
		{"llama-server, any model name", llamaServer(4096), "whatever", 4096, "llama-server b11669-0000000", "", false},
		{"llama-server loading", func(f *oaiFake) { llamaServer(4096)(f); f.loading.Store(true) }, "tiny", 0, "", "loading the model", true},
		{"vLLM", func(f *oaiFake) {
			f.health = true
			f.models = []map[string]any{{"id": "Qwen/Qwen3-8B", "owned_by": "vllm", "max_model_len": 40960}}
		}, "Qwen/Qwen3-8B", 40960, "vllm", "", false},
		{"vLLM, another model", func(f *oaiFake) {
			f.health = true
			f.models = []map[string]any{{"id": "Qwen/Qwen3-8B", "owned_by": "vllm", "max_model_len": 40960}}
		}, "llama3", 0, "", `"llama3" is not on the server`, false},
		{"Ollama /v1", func(f *oaiFake) { f.models = []map[string]any{{"id": "tiny:latest", "owned_by": "library"}} }, "tiny", 0, "library", "", false},
		{"Ollama /v1, missing", func(f *oaiFake) { f.models = []map[string]any{{"id": "tiny:latest", "owned_by": "library"}} }, "qwen3", 0, "", "it lists tiny:latest", false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f := newOAIFake(t, ollamafake.Capable, tc.setup)
			info, err := modelapi.NewOpenAI(f.URL, &http.Client{}).Inspect(context.Background(), tc.model)
			if (err != nil) != (tc.err != "") || (err != nil && !strings.Contains(err.Error(), tc.err)) || errors.Is(err, modelapi.ErrLoading) != tc.loading {
				t.Fatalf("error %v, want %q", err, tc.err)
			}
			if err == nil && (info.ContextLength != tc.ctxLen || info.Server != tc.server || info.API != modelapi.APIOpenAI) {
				t.Fatalf("info %+v", info)
			}
		})
	}
}

// A server that refuses a schema construct gets a simpler form at once,
// in the same call; the model keeps it, and the log says so once.
func TestOpenAISchemaFallback(t *testing.T) {
	hasEnum := func(rf map[string]any) bool {
		b, _ := json.Marshal(rf)
		return strings.Contains(string(b), `"enum"`)
	}
	tests := []struct {
		name   string
		refuse func(map[string]any) bool
		form   string // the form in force after the first call
		first  int    // requests the first call made
	}{
		{"accepted", nil, "", 1},
		{"enum refused", hasEnum, "json_schema without enum and required", 2},
		{"every json_schema refused", func(rf map[string]any) bool { return rf["type"] == "json_schema" }, "json_object", 4},
		{"every response_format refused", func(map[string]any) bool { return true }, "no response_format", 5},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var log bytes.Buffer
			p, f := newOpenAIPolicy(t, ollamafake.Capable, func(f *oaiFake) { f.refuse = tc.refuse }, func(c *Config) { c.Gate = GateAlways })
			p.Log = zerolog.New(&log)
			obs := grey(time.Unix(1000, 0))
			steps(t, p, obs, 1)
			r := p.Report().(Report)
			if !r.Called || r.Fallback != "" || r.Call.Schema != tc.form || (r.Call.SchemaNote != "") != (tc.form != "") || len(f.requests()) != tc.first {
				t.Fatalf("first call: %+v (%d requests)", r.Call, len(f.requests()))
			}
			last := f.requests()[len(f.requests())-1]
			if rf := asMap(last["response_format"]); tc.refuse != nil && rf != nil && tc.refuse(rf) {
				t.Fatalf("the accepted request was a refused form: %v", last["response_format"])
			}
			second := steps(t, p, obs, 1)
			r = p.Report().(Report)
			if len(second) != 1 || second[0].Server != "srv4" || r.Call.Schema != tc.form || r.Call.SchemaNote != "" || len(f.requests()) != tc.first+1 {
				t.Fatalf("second call: %v %+v (%d requests)", second, r.Call, len(f.requests()))
			}
			want := 0
			if tc.form != "" {
				want = 1
			}
			if n := strings.Count(log.String(), `"message":"the server refused the reply schema`); n != want {
				t.Fatalf("%d warnings, want %d:\n%s", n, want, log.String())
			}
		})
	}
}

func asMap(v any) map[string]any { m, _ := v.(map[string]any); return m }

// Every way a server says a reply is unusable, or a prompt too large,
// becomes the same error as through Ollama.
func TestOpenAIErrors(t *testing.T) {
	tests := []struct {
		name    string
		respond ollamafake.Responder
		fail    func(int) (int, string)
		want    error
		text    string
		tokens  int // the prompt's tokens the server said (-1: any)
	}{
		{"finish_reason length", func(ollamafake.Request) ollamafake.Reply {
			return ollamafake.Reply{Content: `{"actions":[{"reason":"` + strings.Repeat("x", 2000) + `"}]}`}
		}, nil, modelapi.ErrCutShort, "cut at num_predict in the answer (256 tokens)", -1},
		{"no finish_reason (a repeat limit)", func(ollamafake.Request) ollamafake.Reply {
			return ollamafake.Reply{Content: `{"actions":[{"reason":"lllllll`, RepeatLimit: true}
		}, nil, modelapi.ErrUnfinished, "with no done reason", 0},
		{"llama-server overflow", ollamafake.Capable, func(int) (int, string) {
			return 400, `{"error":{"code":400,"message":"the request exceeds the available context size, try increasing it","type":"exceed_context_size_error","n_prompt_tokens":5000,"n_ctx":4096}}`
		}, modelapi.ErrContextOverflow, "exceed_context_size_error", 5000},
		{"Ollama /v1 overflow", ollamafake.Capable, func(int) (int, string) {
			return 400, `{"error":{"message":"the input length exceeds the context length","type":"api_error","param":null,"code":null}}`
		}, modelapi.ErrContextOverflow, "exceeds the context length", 0},
		{"vLLM overflow", ollamafake.Capable, func(int) (int, string) {
			return 400, `{"object":"error","message":"This model's maximum context length is 4096 tokens. However, you requested 5000 tokens.","type":"BadRequestError","param":null,"code":400}`
		}, modelapi.ErrContextOverflow, "maximum context length", 0},
		{"a server error", ollamafake.Capable, func(int) (int, string) { return 500, `{"error":"boom"}` }, nil, "500 boom", 0},
		{"not JSON", ollamafake.Capable, func(int) (int, string) { return 200, `<html>` }, nil, "not the reply expected", 0},
		{"no choices", ollamafake.Capable, func(int) (int, string) { return 200, `{"choices":[]}` }, nil, "no choices", 0},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			p, _ := newOpenAIPolicy(t, tc.respond, func(f *oaiFake) { f.fail = tc.fail }, nil)
			if _, err := p.Model.Inspect(context.Background()); err != nil {
				t.Fatal(err)
			}
			_, call, err := p.Model.Ask(context.Background(), "prompt", prompt.Schema(nil, nil, 1, 256), modelapi.ThinkOff)
			if err == nil || (tc.want != nil && !errors.Is(err, tc.want)) || !strings.Contains(call.Error, tc.text) {
				t.Fatalf("error %v, call %+v", err, call)
			}
			if tc.tokens >= 0 && p.Model.promptTokens != tc.tokens {
				t.Fatalf("measured prompt %d, want %d", p.Model.promptTokens, tc.tokens)
			}
		})
	}
}

// The calibration key's digest through the OpenAI API: stable across
// requests (llama-server's "created" is the time of the request), and
// another when the model's file or entry differs.
func TestOpenAIDigest(t *testing.T) {
	digest := func(setup func(*oaiFake), model string) (string, error) {
		f := newOAIFake(t, ollamafake.Capable, setup)
		return modelapi.NewOpenAI(f.URL, &http.Client{}).Digest(context.Background(), model)
	}
	a, err := digest(llamaServer(4096), "tiny")
	b, err2 := digest(llamaServer(4096), "tiny")
	if err != nil || err2 != nil || a != b || !strings.HasPrefix(a, "openai:") {
		t.Fatalf("%q %v, %q %v", a, err, b, err2)
	}
	other, _ := digest(func(f *oaiFake) { llamaServer(4096)(f); f.props["model_path"] = "/models/other.gguf" }, "tiny")
	bigger, _ := digest(func(f *oaiFake) { llamaServer(4096)(f); f.models[0]["meta"] = map[string]any{"size": 1} }, "tiny")
	renamed, _ := digest(llamaServer(4096), "tiny2")
	if other == a || bigger == a || renamed == a {
		t.Fatalf("the same digest for another model: %s %s %s %s", a, other, bigger, renamed)
	}
	if _, err := digest(func(f *oaiFake) { f.models = []map[string]any{{"id": "x"}} }, "tiny"); err == nil {
		t.Fatal("a digest for a model the server does not list")
	}
}

// The API key: read from a file only its owner may read, sent with every
// request; the settings are checked together.
func TestOpenAISettings(t *testing.T) {
	good := keyFile(t, "sk-1", 0o600)
	tests := []struct {
		name string
		mod  func(*Config)
		err  string
	}{
		{"openai with a URL and a key", func(c *Config) { c.API, c.URL, c.KeyFile = modelapi.APIOpenAI, "http://127.0.0.1:8080", good }, ""},
		{"ollama by --llm-url", func(c *Config) { c.URL = "127.0.0.1:11434" }, ""},
		{"ollama by both, alike", func(c *Config) { c.URL, c.Host = "127.0.0.1:11434", "127.0.0.1:11434" }, ""},
		{"openai without a URL", func(c *Config) { c.API = modelapi.APIOpenAI }, "needs --llm-url"},
		{"openai with --ollama-host", func(c *Config) { c.API, c.Host = modelapi.APIOpenAI, "127.0.0.1:8080" }, "native API's address"},
		{"both, unlike", func(c *Config) { c.URL, c.Host = "a:1", "b:2" }, "differ"},
		{"not a URL", func(c *Config) { c.API, c.URL = modelapi.APIOpenAI, "ftp://x" }, "not an http(s) URL"},
		{"an unknown API", func(c *Config) { c.API = "grpc" }, "llm-api"},
		{"a key others may read", func(c *Config) { c.KeyFile = keyFile(t, "sk-1", 0o640) }, "mode 0640"},
		{"an empty key", func(c *Config) { c.KeyFile = keyFile(t, "", 0o600) }, "one line"},
		{"no key file", func(c *Config) { c.KeyFile = "/nonexistent/key" }, "llm-key-file"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c := DefaultConfig()
			c.Model = "m"
			tc.mod(&c)
			err := c.Validate()
			if (err != nil) != (tc.err != "") || (err != nil && !strings.Contains(err.Error(), tc.err)) {
				t.Fatalf("error %v, want %q", err, tc.err)
			}
		})
	}
	// The key goes to the native API too.
	f := newOAIFake(t, ollamafake.Capable, func(f *oaiFake) { f.key = "sk-1" })
	c := DefaultConfig()
	c.Model, c.URL, c.KeyFile = "m", f.URL, good
	s, err := modelapi.Dial(c.API, c.URL, c.Host, c.KeyFile)
	if err != nil {
		t.Fatal(err)
	}
	_, _ = s.Loaded(context.Background(), "m")
	if len(f.auths) == 0 || f.auths[0] != "Bearer sk-1" {
		t.Fatalf("the native API sent %q", f.auths)
	}
}

// The guards hold through the OpenAI API as through Ollama: the floor
// drains a clear fault without a call, and hostile replies lead to no
// unsafe action.
func TestOpenAIGuards(t *testing.T) {
	tests := []struct {
		name    string
		respond ollamafake.Responder
	}{
		{"drain every server", func(ollamafake.Request) ollamafake.Reply {
			var acts []ollamafake.Action
			for i := 1; i <= 6; i++ {
				acts = append(acts, ollamafake.Action{Action: "drain", Backend: "app", Server: "srv" + string(rune('0'+i)), Reason: "all bad"})
			}
			return ollamafake.Reply{Content: ollamafake.Answer(acts...)}
		}},
		{"weight raise", ollamafake.Fixed(`{"actions":[{"action":"set_weight","backend":"app","server":"srv1","weight":51,"reason":"more"}]}`)},
		{"prose", ollamafake.Fixed(`I would drain srv1.`)},
		{"HTTP 500", func(ollamafake.Request) ollamafake.Reply { return ollamafake.Reply{Status: 500, Error: "boom"} }},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			p, _ := newOpenAIPolicy(t, tc.respond, nil, func(c *Config) { c.Gate = GateAlways })
			for _, a := range steps(t, p, fleet(time.Unix(1000, 0), 6, "srv3"), 5) {
				if a.Kind != agent.Drain || a.Server != "srv3" {
					t.Fatalf("unsafe action %+v (report %+v)", a, p.Report())
				}
			}
		})
	}
	p, f := newOpenAIPolicy(t, ollamafake.Capable, nil, nil)
	if got := steps(t, p, fleet(time.Unix(1000, 0), 6, "srv3"), 1); len(got) != 1 || got[0].Server != "srv3" || len(f.requests()) != 0 {
		t.Fatalf("the floor: %v, %d calls", got, len(f.requests()))
	}
}

// Calibration and shadow mode run unchanged through the OpenAI API.
func TestOpenAIShadow(t *testing.T) {
	p, _ := newOpenAIPolicy(t, ollamafake.TriggerHappy, nil, func(c *Config) { c.Confirm = 1 })
	s := &shadow{Model: p, Acting: p.Floor} // as the daemon builds it
	if plan, err := s.Decide(context.Background(), feed(p, grey(time.Unix(1000, 0)))); err != nil || len(plan) != 0 {
		t.Fatalf("acting plan %v %v", plan, err)
	}
	if r := s.Report().(shadowReport); !r.Compared || !r.Disagreement || len(r.OnlyModel) != 1 {
		t.Fatalf("report %+v", r)
	}
}
