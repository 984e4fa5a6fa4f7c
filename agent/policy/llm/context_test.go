package llm

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"strings"
	"testing"
	"time"
	"unicode"

	"github.com/hapilot/hapilot/agent"
	"github.com/hapilot/hapilot/agent/policy/llm/calibrate/fixtures"
	"github.com/hapilot/hapilot/agent/policy/llm/modelapi"
	"github.com/hapilot/hapilot/agent/policy/llm/prompt"
)

// scripted is a Server whose prompt has need tokens: a call whose num_ctx
// does not hold them and the completion overflows, as Ollama's 400 does.
type scripted struct {
	info  modelapi.Info
	need  int
	sizes bool
	ctxs  []int // num_ctx of each call
}

func (s *scripted) Inspect(context.Context, string) (modelapi.Info, error)        { return s.info, nil }
func (s *scripted) Loaded(context.Context, string) (bool, error)                  { return true, nil }
func (s *scripted) Warm(context.Context, modelapi.Request) (time.Duration, error) { return 0, nil }
func (s *scripted) Digest(context.Context, string) (string, error)                { return "sha256:1", nil }
func (s *scripted) SizesContext() bool                                            { return s.sizes }

func (s *scripted) Chat(_ context.Context, req modelapi.Request) (modelapi.Reply, error) {
	s.ctxs = append(s.ctxs, req.NumCtx)
	if req.NumCtx < s.need+req.NumPredict {
		return modelapi.Reply{}, &modelapi.ServerError{Kind: modelapi.ErrContextOverflow, Err: errors.New("400 the input length exceeds the context length")}
	}
	return modelapi.Reply{Content: `{"actions":[]}`, DoneReason: "stop", PromptTokens: s.need}, nil
}

// num_ctx grows after an overflow, which returns no prompt_eval_count:
// it doubles before the next call, up to the model's own context, and
// never shrinks; a context fixed by --num-ctx or by the server does not
// move.
func TestContextGrowsAfterOverflow(t *testing.T) {
	text := strings.Repeat("x", 3000) // estimated 1000 tokens
	tests := []struct {
		name   string
		server *scripted
		numCtx int
		want   []int
	}{
		{"grows until it fits", &scripted{info: modelapi.Info{ContextLength: 32768}, need: 9000, sizes: true}, 0, []int{2048, 4096, 8192, 16384, 16384}},
		{"capped by the model's own", &scripted{info: modelapi.Info{ContextLength: 6000}, need: 9000, sizes: true}, 0, []int{2048, 4096, 6000, 6000, 6000}},
		{"the model's own unknown", &scripted{need: 9000, sizes: true}, 0, []int{2048, 4096, 8192, 16384, 16384}},
		{"fixed by --num-ctx", &scripted{info: modelapi.Info{ContextLength: 32768}, need: 9000, sizes: true}, 4096, []int{4096, 4096, 4096, 4096, 4096}},
		{"the server's own", &scripted{info: modelapi.Info{ContextLength: 8192}, need: 9000}, 0, []int{8192, 8192, 8192, 8192, 8192}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cfg := DefaultConfig()
			cfg.Model, cfg.NumCtx = "m", tc.numCtx
			m := &Model{Server: tc.server, Config: cfg}
			if _, err := m.Inspect(context.Background()); err != nil {
				t.Fatal(err)
			}
			for range tc.want {
				_, call, err := m.Ask(context.Background(), text, prompt.Schema(nil, nil, 1, 256), modelapi.ThinkOff)
				if err != nil && (!errors.Is(err, modelapi.ErrContextOverflow) || !strings.Contains(call.Error, fmt.Sprintf("(num_ctx %d)", call.NumCtx))) {
					t.Fatalf("error %v, call %+v", err, call)
				}
			}
			if fmt.Sprint(tc.server.ctxs) != fmt.Sprint(tc.want) {
				t.Fatalf("num_ctx %v, want %v", tc.server.ctxs, tc.want)
			}
		})
	}
}

// An overflow teaches the estimate too: the next prompt's estimate is at
// least what did not fit, so the policy shows fewer servers in time.
func TestOverflowRaisesTheEstimate(t *testing.T) {
	cfg := DefaultConfig()
	cfg.Model = "m"
	m := &Model{Server: &scripted{info: modelapi.Info{ContextLength: 32768}, need: 9000, sizes: true}, Config: cfg}
	text := strings.Repeat("x", 3000)
	before := m.EstimatePrompt(text)
	_, _, _ = m.Ask(context.Background(), text, prompt.Schema(nil, nil, 1, 256), modelapi.ThinkOff)
	if after := m.EstimatePrompt(text); after < 2048-256 || after <= before {
		t.Fatalf("estimate %d, then %d after an overflow at num_ctx 2048", before, after)
	}
}

// pretoken is Qwen2's pre-tokenizer (Llama 3's, with numbers split into
// single digits instead of runs of three), less its one look-ahead.
var pretoken = regexp.MustCompile(`(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\pL\pN]?\pL+|\pN| ?[^\s\pL\pN]+[\r\n]*|\s*[\r\n]+|\s+`)

// fineTokens counts a text's tokens as such a tokenizer would at the
// finest: a token per digit, per four letters of a word, per two
// characters of punctuation, and per run of whitespace.
func fineTokens(text string) int {
	n := 0
	for _, piece := range pretoken.FindAllString(text, -1) {
		letters, digits := 0, 0
		for _, r := range piece {
			switch {
			case unicode.IsLetter(r):
				letters++
			case unicode.IsDigit(r):
				digits++
			}
		}
		switch {
		case letters > 0:
			n += (letters + 3) / 4
		case digits > 0:
			n += digits
		case strings.TrimSpace(piece) == "":
			n++
		default:
			n += (len(strings.TrimSpace(piece)) + 1) / 2
		}
	}
	return n
}

func TestEstimateTokens(t *testing.T) {
	tests := []struct {
		text string
		want int
	}{
		{"", 0},
		{"1234567890", 10},
		{"abcdef", 2},
		{"abcdefghi", 3},
		{"the rules' floor", 1 + 2 + 1 + 2}, // "the", " rules", "'", " floor"
		{"srv4 ready 600 7 1.17\n", 1 + 1 + 2 + 1 + 3 + 1 + 1 + 1 + 4 + 1},
	}
	for _, tc := range tests {
		if got := estimateTokens(tc.text); got != tc.want {
			t.Errorf("estimateTokens(%q) = %d, want %d", tc.text, got, tc.want)
		}
	}
}

// The estimate holds for the prompts the agent writes, tables of digits
// (the calibration's, two backends of 14 servers among them), against a
// tokenizer that splits numbers into digits: it was three bytes a token,
// which such a table needs fewer than (the 2,985-token prompt
// overflowed a num_ctx sized from it).
func TestEstimateHoldsForDigitTables(t *testing.T) {
	largest, big := 0, ""
	for _, seq := range fixtures.Sequences(time.Unix(5000, 0)) {
		for i, st := range seq.Steps {
			in := prompt.Input{Obs: st.Obs, MaxShown: 12, Confirm: 2, DrainsPer: 3, Candidates: map[agent.Key]string{}}
			for _, b := range st.Obs.Backends {
				for _, s := range b.Servers {
					in.Candidates[s.Key()] = "errors 1.00% vs peers 0.10%, p=2e-04"
				}
			}
			p := prompt.Render(in)
			if fine := fineTokens(p); fine > largest {
				largest, big = fine, p
			}
			if est, fine := estimateTokens(p), fineTokens(p); est < fine {
				t.Errorf("%s, step %d: estimated %d tokens, a digit-splitting tokenizer counts %d (%d bytes)", seq.Name, i+1, est, fine, len(p))
			}
		}
	}
	if est, fine := estimateTokens(prompt.DefaultSystemPrompt), fineTokens(prompt.DefaultSystemPrompt); est < fine {
		t.Errorf("the system prompt: estimated %d, counted %d", est, fine)
	}
	if largest > 0 {
		t.Logf("the largest prompt: %d bytes, %d tokens counted, estimated %d (three bytes a token: %d)", len(big), largest, estimateTokens(big), (len(big)+2)/3)
	}
	if (len(big)+2)/3 >= largest {
		t.Errorf("three bytes a token holds here too: the reference tokenizer is not fine enough to test the estimate")
	}
}

// bytewise is a Server whose tokenizer gives a token a byte, the finest
// there is (the lab's random models have one), with a chat template of
// 30 tokens; a call whose num_ctx does not hold its prompt overflows.
type bytewise struct {
	scripted
	overflows int
}

func (s *bytewise) Chat(_ context.Context, req modelapi.Request) (modelapi.Reply, error) {
	s.ctxs = append(s.ctxs, req.NumCtx)
	need := len(req.System) + len(req.User) + 30
	if req.NumCtx < need+req.NumPredict {
		s.overflows++
		return modelapi.Reply{}, &modelapi.ServerError{Kind: modelapi.ErrContextOverflow, Err: errors.New("400 the input length exceeds the context length")}
	}
	return modelapi.Reply{Content: `{"actions":[]}`, DoneReason: "stop", PromptTokens: need}, nil
}

// Measure learns the tokenizer after the load, so that the first large
// prompt fits: without it, a byte tokenizer overflows the first call of
// some fleet sizes (where the estimate, with its headroom, stays under a
// power of two that the bytes pass), and that step is lost.
func TestMeasureSizesTheFirstPrompt(t *testing.T) {
	now := time.Unix(1_700_000_000, 0)
	sample, sampled := TokenSample(now), false
	for _, seq := range fixtures.Sequences(now) {
		for _, st := range seq.Steps {
			only := map[string]bool{}
			for _, b := range st.Obs.Backends {
				only[b.Name] = true
			}
			sampled = sampled || strings.HasPrefix(prompt.Render(prompt.Input{Obs: st.Obs, Only: only, MaxShown: 12}), sample)
		}
	}
	if len(sample) == 0 || len(sample) > maxSample || !sampled {
		t.Fatalf("sample of %d bytes is not the start of a calibration prompt", len(sample))
	}
	firstCall := func(text string, measure bool) (Call, error) {
		srv := &bytewise{scripted: scripted{info: modelapi.Info{ContextLength: 32768}, sizes: true}}
		cfg := DefaultConfig()
		cfg.Model = "m"
		m := &Model{Server: srv, Config: cfg, SystemPrompt: prompt.DefaultSystemPrompt}
		if _, err := m.Inspect(context.Background()); err != nil {
			t.Fatal(err)
		}
		if _, err := m.Warm(context.Background(), 2048); err != nil {
			t.Fatal(err)
		}
		if measure {
			if err := m.Measure(context.Background(), sample); err != nil || srv.overflows != 0 {
				t.Fatalf("measure: %v, num_ctx %v", err, srv.ctxs)
			}
		}
		_, call, err := m.Ask(context.Background(), text, prompt.Schema(nil, nil, 1, 256), modelapi.ThinkOff)
		return call, err
	}
	lost := 0
	for servers := 3; servers <= 120; servers += 3 {
		// servers in backends of up to 14, all shown.
		var obs agent.Observation
		only := map[string]bool{}
		for i := 0; i*14 < servers; i++ {
			name := fmt.Sprintf("edge-%d", i)
			obs.Backends = append(obs.Backends, fixtures.Backend(now, name, fixtures.Healthy(fmt.Sprintf("e%d-", i), min(14, servers-i*14), 1+i*17)))
			only[name] = true
		}
		text := prompt.Render(prompt.Input{Obs: obs, Only: only, MaxShown: 14})
		if call, err := firstCall(text, true); err != nil {
			t.Errorf("%d servers, measured: the first prompt of %d bytes: %v (num_ctx %d)", servers, len(text), err, call.NumCtx)
		}
		if _, err := firstCall(text, false); errors.Is(err, modelapi.ErrContextOverflow) {
			lost++
		}
	}
	if lost == 0 {
		t.Fatal("unmeasured, no first prompt overflowed: the case shows nothing")
	}
	t.Logf("unmeasured, %d of 40 fleet sizes lose their first step to an overflow", lost)
}
