package llm

import (
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/hapilot/hapilot/agent/policy/llm/modelapi"
	"github.com/hapilot/hapilot/agent/policy/llm/prompt"
	"github.com/hapilot/hapilot/agent/policy/rules"
	"github.com/hapilot/hapilot/internal/lab/ollamafake"
	"github.com/ollama/ollama/api"
	"github.com/rs/zerolog"
)

// The prompt form a model was trained on travels with it: a model whose
// GGUF names a form (modelapi.PromptFormKey, in /api/show's model_info)
// is called with it, prompt and system prompt, unless --llm-prompt says
// otherwise; a model that names none, or one hapilot does not know, gets
// the full form.
func TestThePromptFormTravelsWithTheModel(t *testing.T) {
	for _, tc := range []struct {
		name     string
		named    any // the model's metadata; nil: none
		flag     prompt.Style
		want     prompt.Style
		header   string
		systemOf prompt.Style
	}{
		{"the model names numbered", "numbered", "", prompt.Numbered, prompt.NumberedHeader, prompt.Numbered},
		{"--llm-prompt full overrides it", "numbered", prompt.Full, prompt.Full, prompt.Header, prompt.Full},
		{"--llm-prompt compact overrides it", "numbered", prompt.Compact, prompt.Compact, prompt.CompactHeader, prompt.Compact},
		{"the model names none", nil, "", prompt.Full, prompt.Header, prompt.Full},
		{"a form hapilot does not know", "haiku", "", prompt.Full, prompt.Header, prompt.Full},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fake := ollamafake.New(map[string]string{model: "sha256:fa4e"}, ollamafake.Capable)
			defer fake.Close()
			if tc.named != nil {
				fake.ModelInfo = map[string]any{modelapi.PromptFormKey: tc.named}
			}
			u, _ := url.Parse(fake.URL)
			cfg := DefaultConfig()
			cfg.Model, cfg.Prompt, cfg.Confirm, cfg.Gate = model, tc.flag, 1, GateAlways
			cfg.Deadline, cfg.LoadTimeout = 2*time.Second, 10*time.Second
			m := &Model{Server: &modelapi.Ollama{Client: api.NewClient(u, fake.Client())}, Config: cfg}
			p := New(m, rules.NewPolicy(rules.DefaultConfig()), rules.DefaultConfig(), cfg, zerolog.Nop())
			defer p.Close()
			p.Start()
			waitFor(t, func() bool { return p.PolicyStatus().(Status).State == LifeReady })
			if st := p.PolicyStatus().(Status); st.Prompt != tc.want {
				t.Fatalf("/status says prompt %q, want %q", st.Prompt, tc.want)
			}
			steps(t, p, grey(time.Unix(1000, 0)), 1)
			var chat *ollamafake.Request
			for _, r := range fake.Requests() {
				if len(r.Messages) == 2 && strings.Contains(r.Messages[1].Content, "backend ") {
					chat = &r
				}
			}
			if chat == nil {
				t.Fatalf("no call with a prompt: %+v", p.LastReport())
			}
			if !strings.Contains(chat.Messages[1].Content, "\n"+tc.header+"\n") {
				t.Fatalf("the prompt is not the %s form:\n%s", tc.want, chat.Messages[1].Content)
			}
			if chat.Messages[0].Content != tc.systemOf.SystemPrompt() {
				t.Fatalf("the system prompt is not the %s form's:\n%s", tc.systemOf, chat.Messages[0].Content)
			}
		})
	}
}
