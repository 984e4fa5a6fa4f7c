package llm

import (
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/hapilot/hapilot/agent/policy/llm/modelapi"
	"github.com/hapilot/hapilot/agent/policy/llm/prompt"
	"github.com/hapilot/hapilot/internal/lib/enum"
)

// Gate is when the model is asked.
type Gate string

const (
	// GateAnomaly: only when the windows show a candidate, or a proposal
	// awaits confirmation.
	GateAnomaly Gate = "anomaly"
	// GateAlways: every step.
	GateAlways Gate = "always"
)

// Gates lists the gates.
var Gates = []Gate{GateAnomaly, GateAlways}

func (g *Gate) String() string { return string(*g) }

// Set implements flag.Value.
func (g *Gate) Set(s string) (err error) { *g, err = enum.Parse("llm-gate", s, Gates...); return err }

// Config is every setting of --policy llm and --shadow: how the model is
// called, the protections around it, and whether it may act.
type Config struct {
	Model string
	// API is the model server's: Ollama's native API, or the
	// OpenAI-compatible one that llama-server, vLLM, SGLang, LM Studio and
	// Ollama's /v1 serve.
	API modelapi.API
	// URL is the server's base URL; an OpenAI server's may end in /v1.
	// The OpenAI API needs it; the native API reads Host, then
	// $OLLAMA_HOST, without it.
	URL string
	// Host is Ollama's address (--ollama-host, the native API's alias of
	// URL); "" reads $OLLAMA_HOST, as Ollama's own client does.
	Host string
	// KeyFile holds an API key, sent as "Authorization: Bearer" with
	// every request; a file others may read is refused.
	KeyFile    string
	Think      modelapi.Think
	NumPredict int // the answer's token cap per call
	// ThinkBudget is thinking's own token budget, added to NumPredict when
	// thinking is on: Ollama's num_predict bounds both together.
	ThinkBudget int
	// NumCtx fixes the context; 0 sizes it from the measured prompt, with
	// headroom, capped by the model's own context.
	NumCtx int
	// NumThread is Ollama's num_thread: the threads the model's runner
	// computes on; 0 leaves Ollama's default, every physical core. On a
	// node that HAProxy shares, fewer threads than cores keep ggml's
	// spinning workers from fighting HAProxy and each other for them.
	NumThread int
	Seed      int
	// KeepAlive keeps the model resident between calls, which come only
	// on anomalies; negative: for good.
	KeepAlive time.Duration
	// LoadTimeout bounds a call or a load in the background: a step waits
	// for a call only until its deadline, but never cancels it, since
	// Ollama aborts a load whose request ends.
	LoadTimeout time.Duration
	// TokenBudget: a thinking call that spends more completion tokens
	// than this, is cut at its cap, or overruns the deadline switches
	// thinking off for ThinkRetry steps (0: never).
	TokenBudget int
	ThinkRetry  int
	// SystemPromptFile replaces the embedded system prompt.
	SystemPromptFile string
	// Prompt is the prompt's form: full, or compact or numbered for small
	// models (each with its own embedded system prompt); "" is the form
	// the model names (Model.Form), else full.
	Prompt prompt.Style
	// MaxShown is how many servers per backend the prompt lists in full;
	// the rest are summed in one line.
	MaxShown int

	// Deadline, when set, bounds each model call tighter than the step's
	// own budget (agent.Settings.PolicyBudget), which bounds it anyway;
	// past it the step falls back on the rules' floor alone. 0: the
	// step's budget alone.
	Deadline time.Duration
	// Confirm is how many consecutive steps must propose an action
	// before it runs.
	Confirm int
	// MinHold: readying a server the agent drained less than this long
	// ago needs the windows to show it healthy, not only the model's word.
	MinHold time.Duration
	Gate    Gate

	// SkipCalibration lets a model act without a passing record.
	SkipCalibration bool
	CalibrationDir  string
}

// DefaultConfig has the defaults of `hapilot run --policy llm`.
func DefaultConfig() Config {
	return Config{API: modelapi.APIOllama, Think: modelapi.ThinkOff, NumPredict: 256, ThinkBudget: 1024, Seed: 42, KeepAlive: -1, LoadTimeout: 5 * time.Minute,
		TokenBudget: 768, ThinkRetry: 30,
		MaxShown: 12, Confirm: 2, MinHold: time.Minute, Gate: GateAnomaly,
		CalibrationDir: "/var/lib/hapilot"}
}

// Validate checks the settings together.
func (c Config) Validate() error {
	var errs []error
	if c.Model == "" {
		errs = append(errs, errors.New("llm: --model is required"))
	}
	if _, err := enum.Parse("think", string(c.Think), modelapi.Thinks...); err != nil {
		errs = append(errs, err)
	}
	if _, err := enum.Parse("llm-gate", string(c.Gate), Gates...); err != nil {
		errs = append(errs, err)
	}
	if _, err := enum.Parse("llm-prompt", string(c.Prompt), prompt.Styles...); err != nil && c.Prompt != "" { // "": the model's
		errs = append(errs, err)
	}
	if c.Confirm < 1 {
		errs = append(errs, fmt.Errorf("confirm %d: at least 1", c.Confirm))
	}
	if c.NumPredict < 1 {
		errs = append(errs, fmt.Errorf("num-predict %d: at least 1", c.NumPredict))
	}
	if c.ThinkBudget < 0 || c.NumCtx < 0 || (c.NumCtx > 0 && c.NumCtx < 2048) {
		errs = append(errs, fmt.Errorf("think-budget must not be negative, and num-ctx is 0 (sized) or at least 2048"))
	}
	if c.NumThread < 0 || c.NumThread > 1024 {
		errs = append(errs, fmt.Errorf("num-thread %d: 0 (the server's default) to 1024", c.NumThread))
	}
	if c.NumThread > 0 && c.API == modelapi.APIOpenAI {
		errs = append(errs, errors.New("--num-thread is Ollama's num_thread, sent with the native API: an OpenAI-compatible server sets its threads when it starts (llama-server -t)"))
	}
	if c.LoadTimeout < time.Second {
		errs = append(errs, fmt.Errorf("llm-load-timeout %v: at least 1s", c.LoadTimeout))
	}
	if c.Deadline < 0 || c.MinHold < 0 {
		errs = append(errs, errors.New("llm-deadline and min-hold must not be negative"))
	}
	if _, err := enum.Parse("llm-api", string(c.API), modelapi.APIs...); err != nil && c.API != "" { // "": ollama
		errs = append(errs, err)
	}
	switch {
	case c.API == modelapi.APIOpenAI && c.Host != "":
		errs = append(errs, errors.New("--ollama-host is the native API's address: give --llm-url with --llm-api openai"))
	case c.API == modelapi.APIOpenAI && c.URL == "":
		errs = append(errs, errors.New("--llm-api openai needs --llm-url, the server's base URL (http://127.0.0.1:8080 for llama-server)"))
	case c.URL != "" && c.Host != "" && c.URL != c.Host:
		errs = append(errs, fmt.Errorf("--llm-url %q and its alias --ollama-host %q differ: give one", c.URL, c.Host))
	}
	for _, a := range []struct{ flag, v string }{{"llm-url", c.URL}, {"ollama-host", c.Host}} {
		if a.v != "" {
			if _, err := modelapi.ParseURL(a.flag, a.v); err != nil {
				errs = append(errs, err)
			}
		}
	}
	if c.KeyFile != "" {
		if _, err := modelapi.ReadAPIKey(c.KeyFile); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// NewModel builds the model client from c, with the system prompt from
// SystemPromptFile, or else the embedded one of the model's form.
func NewModel(c Config) (*Model, error) {
	server, err := modelapi.Dial(c.API, c.URL, c.Host, c.KeyFile)
	if err != nil {
		return nil, err
	}
	m := &Model{Server: server, Config: c}
	if c.SystemPromptFile != "" {
		b, err := os.ReadFile(c.SystemPromptFile)
		if err != nil {
			return nil, fmt.Errorf("system prompt: %w", err)
		}
		m.SystemPrompt = string(b)
	}
	return m, nil
}

// CallBudget is how long a call may take in a step whose policy budget
// is step: the step's, or Deadline where that is tighter. Calibration
// judges a model's p95 against it.
func (c Config) CallBudget(step time.Duration) time.Duration {
	if c.Deadline > 0 && c.Deadline < step {
		return c.Deadline
	}
	return step
}
