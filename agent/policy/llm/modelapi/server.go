// Package modelapi is hapilot's client of a model server: Ollama's
// native API and the OpenAI-compatible one, behind one Server interface,
// with the errors every server's own are mapped onto. It knows nothing of
// the agent: a Request is a system prompt, a user prompt and a JSON
// schema, a Reply is text and counts.
package modelapi

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"strings"
	"time"

	"github.com/hapilot/hapilot/internal/lib/enum"
	"github.com/hapilot/hapilot/internal/lib/safefile"
	"github.com/ollama/ollama/api"
	"github.com/ollama/ollama/envconfig"
)

// Server is a model server's API as Model uses it. Ollama speaks
// Ollama's native API; OpenAI speaks the OpenAI-compatible one that
// llama-server, vLLM, SGLang, LM Studio and Ollama itself serve. Every
// call carries its context's deadline: no client has a timeout of its
// own. A server maps its own errors onto ErrContextOverflow,
// ErrThinkUnsupported and ErrLoading, so that Model and the policy treat
// every server alike.
type Server interface {
	// Inspect says what the server knows of the model: its version, the
	// model's capabilities and context length. ErrLoading: the server is
	// still loading the model, and Warm waits for it.
	Inspect(ctx context.Context, model string) (Info, error)
	// Loaded reports whether the model is resident and ready to answer.
	Loaded(ctx context.Context, model string) (bool, error)
	// Warm makes the model ready with the context and keep_alive the
	// calls will use (req has no messages), and says how long the load
	// took when the server says so. ctx must not be a step's.
	Warm(ctx context.Context, req Request) (time.Duration, error)
	// Chat asks one question under req.Schema.
	Chat(ctx context.Context, req Request) (Reply, error)
	// Digest identifies the model's weights, for its calibration record.
	Digest(ctx context.Context, model string) (string, error)
	// SizesContext: the client sets the context (Ollama's num_ctx); false
	// when the server keeps its own (an OpenAI server's n_ctx), which
	// Inspect reports as Info.ContextLength where the server says it.
	SizesContext() bool
}

// Request is one call to the model, in the terms of no API in
// particular; a Server sends what its API takes of it.
type Request struct {
	Model        string
	System, User string          // empty in a warm-up
	Schema       json.RawMessage // the reply's JSON schema
	Think        Think           // as it is to be sent: Model resolves refused levels
	NumPredict   int             // the completion's cap, thinking included
	NumCtx       int             // Ollama's num_ctx; an OpenAI server keeps its own
	NumThread    int             // Ollama's num_thread, 0 for its default
	Seed         int
	KeepAlive    time.Duration // Ollama's keep_alive
}

// Reply is what a call returned.
type Reply struct {
	Content, Thinking              string
	PromptTokens, CompletionTokens int
	// DoneReason is "stop" or "length" (OpenAI's finish_reason).
	DoneReason string
	// Unfinished: the server ended the reply without saying why (Ollama's
	// token repeat limit answers 200 with done false and no counts).
	Unfinished  bool
	Total, Load time.Duration
	// Schema is the form the reply's schema was sent in, "" for the full
	// schema; Stepped says why this call stepped down to it, once.
	Schema, Stepped string
}

// ErrLoading: the server answers, and is loading the model
// (llama-server's /health 503).
var ErrLoading = errors.New("the server is loading the model")

// ErrThinkLevel: the model refused a think level (Ollama's 400 "think
// value ... is not supported"); the caller retries with thinking on.
var ErrThinkLevel = errors.New("think level refused")

// ServerError is a server's error marked with the kind its caller treats
// it as: errors.Is finds both the Kind and the server's own Err, and its
// text is the server's.
type ServerError struct {
	Kind, Err error
	// PromptTokens is the prompt's size when the server says it
	// (llama-server's n_prompt_tokens), 0 otherwise.
	PromptTokens int
}

func (c *ServerError) Error() string   { return c.Err.Error() }
func (c *ServerError) Unwrap() []error { return []error{c.Kind, c.Err} }

// ReportedPromptTokens is the prompt's size a server's error reports, 0
// when it says none.
func ReportedPromptTokens(err error) int {
	if se := (*ServerError)(nil); errors.As(err, &se) {
		return se.PromptTokens
	}
	return 0
}

// API is the model server's API.
type API string

const (
	APIOllama API = "ollama" // Ollama's native /api
	APIOpenAI API = "openai" // OpenAI's /v1/chat/completions
)

// APIs lists the APIs.
var APIs = []API{APIOllama, APIOpenAI}

func (a *API) String() string { return string(*a) }

// Set implements flag.Value.
func (a *API) Set(s string) (err error) { *a, err = enum.Parse("llm-api", s, APIs...); return err }

// ReadAPIKey reads the model server's API key from path, a file only its
// owner may read, as the fleet key is: a key others can read, or one a
// stranger owns, is refused (safefile.Trust).
func ReadAPIKey(path string) (string, error) {
	fi, err := os.Stat(path)
	if err != nil {
		return "", fmt.Errorf("llm-key-file: %w", err)
	}
	if err := safefile.Trust("llm-key-file", path, fi, 0o077, "the API key must be readable by its owner only"); err != nil {
		return "", err
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return "", fmt.Errorf("llm-key-file: %w", err)
	}
	key := strings.TrimSpace(string(b))
	if key == "" || strings.ContainsAny(key, "\r\n") {
		return "", fmt.Errorf("llm-key-file %s: want one line holding the key", path)
	}
	return key, nil
}

// bearer adds the API key to every request, whichever API.
type bearer struct {
	key  string
	next http.RoundTripper
}

func (b bearer) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("Authorization", "Bearer "+b.key)
	return b.next.RoundTrip(r)
}

// httpClient is the client of a model server: no timeout of its own
// (every call carries its deadline), the key when there is one.
func httpClient(key string) *http.Client {
	if key == "" {
		return &http.Client{}
	}
	return &http.Client{Transport: bearer{key: key, next: http.DefaultTransport}}
}

// Errors a call can end with; each is an invalid or failed call, never
// an action. A Server maps its own onto the first two; the caller's
// checks of a reply end with the last two.
var (
	ErrThinkUnsupported = errors.New("model does not support thinking")
	ErrContextOverflow  = errors.New("the prompt does not fit the model's context")
	ErrCutShort         = errors.New("the reply was cut at num_predict")
	ErrUnfinished       = errors.New("the server ended the reply unfinished")
)

// Info is what the agent learned of the model and its server at start.
type Info struct {
	API     API    `json:"api,omitempty"`
	Version string `json:"ollama_version,omitempty"`
	// Server is what an OpenAI-compatible server says it is, as far as it
	// says ("llama-server b11669", or the model's owner as /v1/models
	// lists it).
	Server        string   `json:"server,omitempty"`
	Capabilities  []string `json:"capabilities,omitempty"`
	ContextLength int      `json:"context_length,omitempty"` // the model's own
	ParameterSize string   `json:"parameter_size,omitempty"`
	Quantization  string   `json:"quantization,omitempty"`
	Size          int64    `json:"size_bytes,omitempty"`
	// PromptForm is the prompt form the model names in its GGUF metadata
	// (PromptFormKey), as a model trained on one form does; "" when it
	// names none.
	PromptForm string `json:"prompt_form,omitempty"`
}

// PromptFormKey is the GGUF metadata key in which a model trained on one
// prompt form names it; Ollama's /api/show lists it in model_info. Under
// general., because Ollama's GGUF writer puts any key outside general.,
// tokenizer. and adapter. under the architecture's name.
const PromptFormKey = "general.hapilot.prompt_form"

// CanThink reports the "thinking" capability.
func (i Info) CanThink() bool {
	for _, c := range i.Capabilities {
		if c == "thinking" {
			return true
		}
	}
	return false
}

// Think is how the model is asked to think; it is sent explicitly on
// every call, since Ollama turns thinking on when the field is omitted.
type Think string

const (
	ThinkOff    Think = "off"
	ThinkOn     Think = "on"
	ThinkLow    Think = "low"
	ThinkMedium Think = "medium"
	ThinkHigh   Think = "high"
)

// Thinks lists the think modes.
var Thinks = []Think{ThinkOff, ThinkOn, ThinkLow, ThinkMedium, ThinkHigh}

func (t *Think) String() string { return string(*t) }

// Set implements flag.Value.
func (t *Think) Set(s string) (err error) { *t, err = enum.Parse("think", s, Thinks...); return err }

// serverURL parses a server's address; a bare host:port is http.
func ParseURL(flag, host string) (*url.URL, error) {
	if !strings.Contains(host, "://") {
		host = "http://" + host
	}
	u, err := url.Parse(host)
	if err != nil || u.Host == "" || (u.Scheme != "http" && u.Scheme != "https") {
		return nil, fmt.Errorf("%s %q: not an http(s) URL", flag, host)
	}
	return u, nil
}

// Dial returns the client of the model server that speaks a at base
// (--llm-url) or host (--ollama-host, the native API's alias; neither:
// $OLLAMA_HOST), with the API key in keyFile if any. Its HTTP client has
// no timeout of its own: every call carries a deadline. No error it
// returns carries the key, an Authorization header or the URL's
// password, and none is longer than MaxErrorText.
func Dial(a API, base, host, keyFile string) (Server, error) {
	key := ""
	if keyFile != "" {
		var err error
		if key, err = ReadAPIKey(keyFile); err != nil {
			return nil, err
		}
	}
	addr, flag := base, "llm-url"
	if addr == "" {
		addr, flag = host, "ollama-host"
	}
	var u *url.URL
	if addr == "" && a != APIOpenAI {
		u = envconfig.Host() // $OLLAMA_HOST, as Ollama's own client reads it
	} else {
		var err error
		if u, err = ParseURL(flag, addr); err != nil {
			return nil, err
		}
	}
	var s Server = &Ollama{Client: api.NewClient(u, httpClient(key))}
	if a == APIOpenAI {
		s = NewOpenAI(u.String(), httpClient(key))
	}
	// Every error the client returns is scrubbed of the key: a server
	// may echo the Authorization header in its error body.
	return &redacting{Server: s, secrets: newSecrets(key, u)}, nil
}
