package calibrate

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/hapilot/hapilot/agent/policy/llm"
	"github.com/hapilot/hapilot/agent/policy/llm/modelapi"
	"github.com/hapilot/hapilot/agent/policy/llm/prompt"
	"github.com/hapilot/hapilot/agent/policy/rules"
	"github.com/hapilot/hapilot/internal/lab/ollamafake"
)

// fakeModel is a model served by the Ollama stand-in with respond,
// built as the daemon builds one.
func fakeModel(t *testing.T, respond ollamafake.Responder, mod func(*llm.Config)) *llm.Model {
	t.Helper()
	fake := ollamafake.New(map[string]string{"fake-capable:latest": "sha256:fa4e"}, respond)
	t.Cleanup(fake.Close)
	cfg := llm.DefaultConfig()
	cfg.Model, cfg.Host = "fake-capable:latest", fake.URL
	cfg.Deadline, cfg.LoadTimeout = 2*time.Second, 10*time.Second
	if mod != nil {
		mod(&cfg)
	}
	m, err := llm.NewModel(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

func TestCalibration(t *testing.T) {
	tests := []struct {
		name    string
		respond ollamafake.Responder
		mod     func(*llm.Config)
		pass    bool
		why     string
	}{
		{"capable", ollamafake.Capable, nil, true, ""},
		{"trigger-happy", ollamafake.TriggerHappy, nil, false, "harmful"},
		{"garbage", ollamafake.Fixed("no"), nil, false, "valid replies"},
		{"always drains the top row", func(req ollamafake.Request) ollamafake.Reply {
			rows := ollamafake.ParsePrompt(req)
			if len(rows) == 0 {
				return ollamafake.Reply{Content: ollamafake.Answer()}
			}
			return ollamafake.Reply{Content: ollamafake.Answer(ollamafake.Action{Action: "drain", Backend: rows[0].Backend, Server: rows[0].Server, Reason: "top"})}
		}, nil, false, "harmful"},
		{"too slow for the deadline", func(req ollamafake.Request) ollamafake.Reply {
			r := ollamafake.Capable(req)
			r.Delay = 60 * time.Millisecond
			return r
		}, func(c *llm.Config) { c.Deadline = 30 * time.Millisecond }, false, "step deadline"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			m := fakeModel(t, tc.respond, tc.mod)
			sc, err := RunModel(context.Background(), m, rules.DefaultConfig(), m.Config.CallBudget(8*time.Second), time.Unix(5000, 0))
			if err != nil {
				t.Fatal(err)
			}
			var out strings.Builder
			sc.Print(&out)
			t.Logf("\n%s", out.String())
			if len(sc.Steps) < 12 || sc.Passed != tc.pass || !strings.Contains(sc.Why, tc.why) || sc.Key.Digest != "sha256:fa4e" {
				t.Fatalf("passed %v (%s), %d steps", sc.Passed, sc.Why, len(sc.Steps))
			}
			dir := t.TempDir()
			if _, err := sc.Save(dir); err != nil {
				t.Fatal(err)
			}
			back, err := Load(dir, sc.Key.Digest)
			if err != nil || back.Passed != sc.Passed || back.Key != sc.Key {
				t.Fatalf("record %+v %v", back, err)
			}
		})
	}
}

// A record is keyed by digest, think mode and a hash of the prompt,
// schema and options; a stale one says what changed.
func TestCalibrationKey(t *testing.T) {
	m := fakeModel(t, ollamafake.Capable, nil)
	k := keyFor("sha256:1", m)
	if k.Stale(keyFor("sha256:1", m)) != "" {
		t.Fatal("a key is stale against itself")
	}
	other := func(f func(*llm.Model)) *llm.Model {
		o := &llm.Model{Config: m.Config, SystemPrompt: m.SystemPrompt}
		f(o)
		return o
	}
	if s := k.Stale(keyFor("sha256:1", other(func(m *llm.Model) { m.Config.Think = modelapi.ThinkOn }))); !strings.Contains(s, "think mode (off, now on)") {
		t.Fatalf("think: %q", s)
	}
	if s := k.Stale(keyFor("sha256:1", other(func(m *llm.Model) { m.SystemPrompt += "\nBe bold." }))); !strings.Contains(s, "the prompt") {
		t.Fatalf("prompt: %q", s)
	}
	if s := k.Stale(keyFor("sha256:2", other(func(m *llm.Model) { m.Config.NumPredict = 64 }))); !strings.Contains(s, "digest") || !strings.Contains(s, "call options") {
		t.Fatalf("digest and options: %q", s)
	}
}

// A model that names its prompt form in its metadata is calibrated with
// it without --llm-prompt, and its record holds for a run given the same
// form explicitly, and not for one given another.
func TestCalibrationUsesTheModelsForm(t *testing.T) {
	fake := ollamafake.New(map[string]string{"fake-capable:latest": "sha256:fa4e"}, ollamafake.Capable)
	defer fake.Close()
	fake.ModelInfo = map[string]any{modelapi.PromptFormKey: "numbered"}
	build := func(form prompt.Style) *llm.Model {
		cfg := llm.DefaultConfig()
		cfg.Model, cfg.Host, cfg.Prompt = "fake-capable:latest", fake.URL, form
		cfg.Deadline, cfg.LoadTimeout = 2*time.Second, 10*time.Second
		m, err := llm.NewModel(cfg)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := m.Inspect(context.Background()); err != nil {
			t.Fatal(err)
		}
		return m
	}
	m := build("")
	sc, err := RunModel(context.Background(), m, rules.DefaultConfig(), m.Config.CallBudget(8*time.Second), time.Unix(5000, 0))
	if err != nil {
		t.Fatal(err)
	}
	// The stand-in's capable model answers with names, not the numbered
	// form's references, so it fails: what it was called with is the test.
	if sc.Form != prompt.Numbered {
		t.Fatalf("calibrated with prompt %q", sc.Form)
	}
	for _, tc := range []struct {
		form  prompt.Style
		stale bool
	}{{"", false}, {prompt.Numbered, false}, {prompt.Full, true}, {prompt.Compact, true}} {
		if s := sc.Key.Stale(keyFor(sc.Key.Digest, build(tc.form))); (s != "") != tc.stale {
			t.Errorf("--llm-prompt %q: stale %q, want stale %v", tc.form, s, tc.stale)
		}
	}
}

// A record calibrated on the windowed test's prompts (prompt version 2:
// its candidates and their p-values) is stale once the candidates and
// their figures are the sequential test's: the gate refuses it until the
// model is calibrated again, in every form.
func TestWindowedTestsRecordsAreStale(t *testing.T) {
	m := fakeModel(t, ollamafake.Capable, nil)
	for _, style := range prompt.Styles {
		o := &llm.Model{Config: m.Config}
		o.Config.Prompt = style
		o.SystemPrompt = style.SystemPrompt()
		old := keyFor("sha256:1", o)
		switch style {
		case prompt.Compact:
			old.PromptHash = hash("2", "compact", prompt.CompactHeader, o.System())
		case prompt.Numbered:
			old.PromptHash = hash("2", "numbered", prompt.NumberedHeader, o.System())
		default:
			old.PromptHash = hash("2", prompt.Header, o.System())
		}
		if s := old.Stale(keyFor("sha256:1", o)); !strings.Contains(s, "the prompt") {
			t.Errorf("%s: a record of the windowed test's prompts is not stale: %q", style, s)
		}
	}
}
