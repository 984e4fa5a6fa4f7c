//go:build modelserver

package modelserver

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/ollama/ollama/api"

	"github.com/hapilot/hapilot/internal/lab/ollamafake"
)

// The stand-in (internal/lab/ollamafake) claims, in its package comment
// and in docs/explanation/llm.md, to behave as Ollama 0.17.4 does where a client must
// cope. Each case below runs one claim through Ollama's own client
// against the stand-in and against the real server, built from the same
// module, serving tiny random models, and both must give the observation
// the claim predicts.
//
// The models: "tiny" (context 2048, ChatTemplate), "think" (the same
// weights, ThinkingTemplate: Ollama reports "thinking" for it), "tiny32k"
// (context 32768). Each has a stand-in of its own with the same traits.

// cannotShow lists what the claims hold that a tiny random model on this
// machine cannot show, and why: none of it is skipped in silence.
var cannotShow = []struct{ claim, why string }{
	{"a 3-8B model takes 5-60 s to load, so a call must never cut a load",
		"a tiny model loads in about 0.3 s; the abort itself is shown (a request cut once the server logs the load began), the long load is not"},
	{"num_ctx defaults to 32768 under 47 GiB of VRAM and 262144 above",
		"no GPU here: only the 4096 of the smallest tier is shown (\"default num_ctx\")"},
	{"a think level (low, medium, high) is accepted by gpt-oss",
		"Ollama takes a level only with the harmony parser (model family gptoss); a tiny llama is not one, so only the refusal is shown"},
	{"a thinking model thinks, then answers within num_predict",
		"a random model never writes the closing </think>: everything it says is thinking, so only the cut (empty content, done_reason length) is shown"},
	{"done_reason \"stop\" when a model ends its answer",
		"a random model ends one only by chance (it drew its end of text within 2 tokens once in CI); it is shown where a format's grammar ends the reply"},
	{"the reply is a plan a model reasoned out",
		"the weights are random: replies are schema-valid nonsense, which is what calibration refuses"},
}

// target is one server speaking Ollama's API, with a client per model.
type target struct {
	name    string
	clients map[string]*api.Client
	// aborted counts the loads aborted so far, read in the server's log
	// (abortedLoads).
	aborted func() int
	// started counts the loads begun so far ("starting runner").
	started func() int
}

func (tg target) c(model string) *api.Client { return tg.clients[model] }

func chat(ctx context.Context, c *api.Client, req *api.ChatRequest) (api.ChatResponse, error) {
	stream := false
	req.Stream = &stream
	var out api.ChatResponse
	err := c.Chat(ctx, req, func(r api.ChatResponse) error { out = r; return nil })
	return out, err
}

func user(text string) []api.Message { return []api.Message{{Role: "user", Content: text}} }

// abortedLoads counts the loads Ollama gave up because their request
// went. It says so in one of two ways, by where the load was: "aborting
// load" while it waits for the runner to report ready, "Load failed" with
// the context's error while it still fits and allocates the model.
func abortedLoads(log string) int {
	n := 0
	for _, line := range strings.Split(log, "\n") {
		if strings.Contains(line, "aborting load") ||
			strings.Contains(line, `"Load failed"`) && strings.Contains(line, "context canceled") {
			n++
		}
	}
	return n
}

// errText is an error as the client saw it: status and message.
func errText(err error) string {
	if err == nil {
		return "nil"
	}
	var se api.StatusError
	if errors.As(err, &se) {
		return fmt.Sprintf("%d %s", se.StatusCode, se.ErrorMessage)
	}
	if errors.Is(err, context.DeadlineExceeded) {
		return "deadline exceeded"
	}
	if errors.Is(err, context.Canceled) {
		return "context canceled"
	}
	return err.Error()
}

// loaded is /api/ps in short: "name ctx=N expires=..." per model.
func loaded(t *testing.T, ctx context.Context, c *api.Client) string {
	t.Helper()
	ps, err := c.ListRunning(ctx)
	if err != nil {
		t.Fatalf("ps: %v", err)
	}
	var out []string
	for _, m := range ps.Models {
		exp := "forever"
		if d := time.Until(m.ExpiresAt); d < 100*365*24*time.Hour {
			exp = d.Round(time.Minute).String()
		}
		out = append(out, fmt.Sprintf("%s ctx=%d expires=%s", m.Name, m.ContextLength, exp))
	}
	slices.Sort(out)
	return "[" + strings.Join(out, ", ") + "]"
}

// unloadAll unloads every model and waits until /api/ps shows none.
func unloadAll(t *testing.T, ctx context.Context, tg target) {
	t.Helper()
	for model, c := range tg.clients {
		if _, err := chat(ctx, c, &api.ChatRequest{Model: model, KeepAlive: &api.Duration{}}); err != nil {
			t.Fatalf("unload %s: %v", model, err)
		}
	}
	deadline := time.Now().Add(10 * time.Second)
	for _, c := range tg.clients {
		for loaded(t, ctx, c) != "[]" {
			if time.Now().After(deadline) {
				t.Fatalf("still loaded: %s", loaded(t, ctx, c))
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
}

// waitUnloaded polls /api/ps for up to 3 s until it is empty, and
// returns what it shows then.
func waitUnloaded(t *testing.T, ctx context.Context, c *api.Client) string {
	t.Helper()
	deadline := time.Now().Add(3 * time.Second)
	for {
		ps := loaded(t, ctx, c)
		if ps == "[]" || time.Now().After(deadline) {
			return ps
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// reloaded says whether a reply's call loaded the model: a warm runner
// answers with a load_duration of a few milliseconds, a load takes
// hundreds.
var conformance = []struct {
	name  string
	claim string // what docs/explanation/llm.md or the stand-in's comment says
	run   func(t *testing.T, ctx context.Context, tg target) string
	want  string
}{
	{"show", "/api/show reports capabilities and the model's own context length",
		func(t *testing.T, ctx context.Context, tg target) string {
			var out []string
			for _, m := range []string{"tiny", "think", "tiny32k"} {
				caps, n, err := ShowInfo(ctx, tg.c(m), m)
				if err != nil {
					t.Fatal(err)
				}
				out = append(out, fmt.Sprintf("%s %v %d", m, caps, n))
			}
			return strings.Join(out, "; ")
		},
		"tiny [completion] 2048; think [completion thinking] 2048; tiny32k [completion] 32768"},
	{"ps before and after a load", "a chat with no messages loads the model (done_reason load, no durations); /api/ps lists it, its context capped by the model's own",
		func(t *testing.T, ctx context.Context, tg target) string {
			before := loaded(t, ctx, tg.c("tiny"))
			start := time.Now()
			r, err := chat(ctx, tg.c("tiny"), &api.ChatRequest{Model: "tiny"})
			if err != nil {
				t.Fatal(err)
			}
			t.Logf("%s: the load took %v", tg.name, time.Since(start))
			return fmt.Sprintf("before=%s reply=%s durations=%v/%v after=%s", before, r.DoneReason, r.TotalDuration, r.LoadDuration, loaded(t, ctx, tg.c("tiny")))
		},
		"before=[] reply=load durations=0s/0s after=[tiny:latest ctx=2048 expires=5m0s]"},
	{"default num_ctx", "num_ctx defaults to 4096 (no GPU, or under 23 GiB)",
		func(t *testing.T, ctx context.Context, tg target) string {
			if _, err := chat(ctx, tg.c("tiny32k"), &api.ChatRequest{Model: "tiny32k", Messages: user("hi"), Options: map[string]any{"num_predict": 1}}); err != nil {
				t.Fatal(err)
			}
			return loaded(t, ctx, tg.c("tiny32k"))
		},
		"[tiny32k:latest ctx=4096 expires=5m0s]"},
	{"a load cut by a cancelled request", "a request cancelled during the load aborts it, and the model stays unloaded",
		func(t *testing.T, ctx context.Context, tg target) string {
			// The request is cut once the server logs that the load began,
			// not after a fixed time: a tiny model loads in under 100 ms
			// on a fast machine, which is how CI once saw the call answer.
			before, began := tg.aborted(), tg.started()
			cctx, cancel := context.WithCancel(ctx)
			done := make(chan error, 1)
			go func() {
				_, err := chat(cctx, tg.c("tiny"), &api.ChatRequest{Model: "tiny", Messages: user("hi")})
				done <- err
			}()
			for deadline := time.Now().Add(10 * time.Second); tg.started() == began; time.Sleep(time.Millisecond) {
				if time.Now().After(deadline) {
					cancel()
					t.Fatalf("%s: no load began in 10 s", tg.name)
				}
			}
			cancel()
			err := <-done
			// The server logs the abort once it sees the client go.
			for deadline := time.Now().Add(5 * time.Second); tg.aborted() == before && time.Now().Before(deadline); {
				time.Sleep(10 * time.Millisecond)
			}
			ps := waitUnloaded(t, ctx, tg.c("tiny"))
			return fmt.Sprintf("err=%s aborted=%d ps=%s", errText(err), tg.aborted()-before, ps)
		},
		"err=context canceled aborted=1 ps=[]"},
	{"keep_alive -1 and 0", "keep_alive -1 keeps the model loaded forever; 0 with no messages unloads it (done_reason unload)",
		func(t *testing.T, ctx context.Context, tg target) string {
			if _, err := chat(ctx, tg.c("tiny"), &api.ChatRequest{Model: "tiny", KeepAlive: &api.Duration{Duration: -1}}); err != nil {
				t.Fatal(err)
			}
			forever := loaded(t, ctx, tg.c("tiny"))
			r, err := chat(ctx, tg.c("tiny"), &api.ChatRequest{Model: "tiny", KeepAlive: &api.Duration{}})
			if err != nil {
				t.Fatal(err)
			}
			return fmt.Sprintf("%s then %s %s", forever, r.DoneReason, waitUnloaded(t, ctx, tg.c("tiny")))
		},
		"[tiny:latest ctx=2048 expires=forever] then unload []"},
	{"keep_alive 0 on a call", "a call with keep_alive 0 answers, then the model is unloaded",
		func(t *testing.T, ctx context.Context, tg target) string {
			r, err := chat(ctx, tg.c("tiny"), &api.ChatRequest{Model: "tiny", Messages: user("hi"), KeepAlive: &api.Duration{},
				Options: map[string]any{"num_predict": 2}})
			if err != nil {
				t.Fatal(err)
			}
			// An answer ends at num_predict ("length") or where the
			// random model samples its end of text ("stop"): the claim is
			// the answer and the unload, not which of the two. Ollama's
			// sampling drew "stop" within 2 tokens once in CI.
			answered := "no answer: " + r.DoneReason
			if r.Done && (r.DoneReason == "length" || r.DoneReason == "stop") {
				answered = "answered"
			}
			return fmt.Sprintf("%s %s", answered, waitUnloaded(t, ctx, tg.c("tiny")))
		},
		"answered []"},
	{"a num_ctx change reloads", "a request whose num_ctx differs from the loaded runner's reloads it",
		func(t *testing.T, ctx context.Context, tg target) string {
			var out []string
			for _, n := range []int{1024, 512, 512} {
				_, err := chat(ctx, tg.c("tiny"), &api.ChatRequest{Model: "tiny", Messages: user("hi"), Options: map[string]any{"num_ctx": n, "num_predict": 2}})
				if err != nil {
					t.Fatal(err)
				}
				// The runner in /api/ps takes the new context: a reload. Its
				// load_duration is no proof either way, since a tiny model
				// reloads in well under 100 ms at times.
				out = append(out, fmt.Sprintf("num_ctx %d: %s", n, loaded(t, ctx, tg.c("tiny"))))
			}
			return strings.Join(out, "; ")
		},
		"num_ctx 1024: [tiny:latest ctx=1024 expires=5m0s]; num_ctx 512: [tiny:latest ctx=512 expires=5m0s]; num_ctx 512: [tiny:latest ctx=512 expires=5m0s]"},
	{"truncate:false with an overlong prompt", "a prompt longer than num_ctx is an error with truncate:false",
		func(t *testing.T, ctx context.Context, tg target) string {
			no := false
			_, err := chat(ctx, tg.c("tiny"), &api.ChatRequest{Model: "tiny", Truncate: &no,
				Messages: []api.Message{{Role: "system", Content: strings.Repeat("s", 500)}, {Role: "user", Content: strings.Repeat("x ", 2000)}},
				Options:  map[string]any{"num_ctx": 512, "num_predict": 2}})
			if err == nil {
				return "no error"
			}
			return errText(err)
		},
		"400 the input length exceeds the context length"},
	{"an overlong prompt is cut", "without truncate:false, a prompt longer than num_ctx is cut from its start to fit",
		func(t *testing.T, ctx context.Context, tg target) string {
			r, err := chat(ctx, tg.c("tiny"), &api.ChatRequest{Model: "tiny",
				Messages: []api.Message{{Role: "system", Content: strings.Repeat("s", 500)}, {Role: "user", Content: strings.Repeat("x ", 2000)}},
				Options:  map[string]any{"num_ctx": 512, "num_predict": 2}})
			if err != nil {
				return errText(err)
			}
			return fmt.Sprintf("%s prompt_eval_count=%d", r.DoneReason, r.PromptEvalCount)
		},
		"length prompt_eval_count=512"},
	{"num_predict and done_reason", "num_predict caps the answer: done_reason length, eval_count = num_predict",
		func(t *testing.T, ctx context.Context, tg target) string {
			r, err := chat(ctx, tg.c("tiny"), &api.ChatRequest{Model: "tiny", Messages: user("hi"), Options: map[string]any{"num_predict": 8, "temperature": 0, "seed": 1}})
			if err != nil {
				t.Fatal(err)
			}
			return fmt.Sprintf("%s eval_count=%d", r.DoneReason, r.EvalCount)
		},
		"length eval_count=8"},
	{"a format's end stops the reply", "done_reason stop when the reply ends before num_predict",
		func(t *testing.T, ctx context.Context, tg target) string {
			r, err := chat(ctx, tg.c("tiny"), &api.ChatRequest{Model: "tiny", Messages: user("hi"), Format: []byte(`{"type":"string","enum":["none"]}`),
				Options: map[string]any{"num_predict": 64, "temperature": 0, "seed": 1}})
			if err != nil {
				t.Fatal(err)
			}
			// The grammar lets whitespace follow the value, and a random
			// model writes some: the value is what is compared.
			return fmt.Sprintf("%s %s", r.DoneReason, strings.TrimSpace(r.Message.Content))
		},
		`stop "none"`},
	{"the token repeat limit", "a generation repeating one token 31 times is ended: 200, done false, no done_reason, no counts",
		func(t *testing.T, ctx context.Context, tg target) string {
			// The random model writes "llll..." in the reason of this plan.
			schema, _ := json.Marshal(agentLike(0, 0, false, 1))
			r, err := chat(ctx, tg.c("tiny"), &api.ChatRequest{Model: "tiny", Messages: user("Plan for backend app."), Format: schema,
				Options: map[string]any{"num_ctx": 4096, "num_predict": 1024, "temperature": 0, "seed": 1}})
			if err != nil {
				return errText(err)
			}
			return fmt.Sprintf("done=%v done_reason=%q eval_count=%d content ends in 30 l=%v", r.Done, r.DoneReason, r.EvalCount,
				strings.HasSuffix(r.Message.Content, strings.Repeat("l", 30)))
		},
		`done=false done_reason="" eval_count=0 content ends in 30 l=true`},
	{"think on a model without thinking", `think true or a level on a model that cannot think: 400 "m" does not support thinking`,
		func(t *testing.T, ctx context.Context, tg target) string {
			var out []string
			for _, v := range []any{true, "low"} {
				_, err := chat(ctx, tg.c("tiny"), &api.ChatRequest{Model: "tiny", Messages: user("hi"), Think: &api.ThinkValue{Value: v}})
				out = append(out, fmt.Sprintf("%v: %s", v, errText(err)))
			}
			return strings.Join(out, "; ") + " ps=" + loaded(t, ctx, tg.c("tiny"))
		},
		`true: 400 "tiny" does not support thinking; low: 400 "tiny" does not support thinking ps=[]`},
	{"a think level", `a think level on a thinking model other than gpt-oss: 400 think value "low" is not supported for this model, after the load`,
		func(t *testing.T, ctx context.Context, tg target) string {
			_, err := chat(ctx, tg.c("think"), &api.ChatRequest{Model: "think", Messages: user("hi"), Think: &api.ThinkValue{Value: "low"}})
			return errText(err) + " ps=" + loaded(t, ctx, tg.c("think"))
		},
		`400 think value "low" is not supported for this model ps=[think:latest ctx=2048 expires=5m0s]`},
	{"thinking on when think is omitted", "a thinking model thinks when think is omitted; num_predict bounds thinking and answer together",
		func(t *testing.T, ctx context.Context, tg target) string {
			r, err := chat(ctx, tg.c("think"), &api.ChatRequest{Model: "think", Messages: user("hi"), Options: map[string]any{"num_predict": 8, "temperature": 0, "seed": 1}})
			if err != nil {
				t.Fatal(err)
			}
			return fmt.Sprintf("%s eval_count=%d content=%q thinking=%v", r.DoneReason, r.EvalCount, r.Message.Content, r.Message.Thinking != "")
		},
		`length eval_count=8 content="" thinking=true`},
	{"thinking with a format", "with a format, a thinking model cut while thinking answers an empty content",
		func(t *testing.T, ctx context.Context, tg target) string {
			r, err := chat(ctx, tg.c("think"), &api.ChatRequest{Model: "think", Messages: user("hi"), Think: &api.ThinkValue{Value: true},
				Format: []byte(`{"type":"string","enum":["none"]}`), Options: map[string]any{"num_predict": 8, "temperature": 0, "seed": 1}})
			if err != nil {
				t.Fatal(err)
			}
			return fmt.Sprintf("%s eval_count=%d content=%q thinking=%v", r.DoneReason, r.EvalCount, r.Message.Content, r.Message.Thinking != "")
		},
		`length eval_count=8 content="" thinking=true`},
	{"think false on a thinking model", "think false turns thinking off",
		func(t *testing.T, ctx context.Context, tg target) string {
			r, err := chat(ctx, tg.c("think"), &api.ChatRequest{Model: "think", Messages: user("hi"), Think: &api.ThinkValue{Value: false},
				Options: map[string]any{"num_predict": 8, "temperature": 0, "seed": 1}})
			if err != nil {
				t.Fatal(err)
			}
			return fmt.Sprintf("%s eval_count=%d content=%v thinking=%q", r.DoneReason, r.EvalCount, r.Message.Content != "", r.Message.Thinking)
		},
		`length eval_count=8 content=true thinking=""`},
}

// standIn is the stand-in's responder for a random model: an answer that
// never ends by itself (so num_predict cuts it), a short one where a
// format's grammar would end it, and long thinking.
func standIn(req ollamafake.Request) ollamafake.Reply {
	if strings.Contains(string(req.Format), `"minItems"`) { // what makes the random model repeat itself
		return ollamafake.Reply{Content: `{"actions":[{"reason":"` + strings.Repeat("l", 31), RepeatLimit: true}
	}
	if len(req.Format) > 0 {
		return ollamafake.Reply{Content: `"none"`, CompletionTokens: 3, ThinkingTokens: 1000}
	}
	return ollamafake.Reply{Content: strings.Repeat("x", 4000), ThinkingTokens: 1000}
}

func TestConformance(t *testing.T) {
	for _, c := range cannotShow {
		t.Logf("cannot show with a tiny model: %s: %s", c.claim, c.why)
	}
	ollama := OllamaT(t,
		Model{Name: "tiny", Spec: Spec{ContextLength: 2048, Seed: 1}},
		Model{Name: "think", Spec: Spec{ContextLength: 2048, Seed: 1}, Thinking: true},
		Model{Name: "tiny32k", Spec: Spec{ContextLength: 32768, Seed: 1}},
	)
	live := target{name: ollama.String(), clients: map[string]*api.Client{},
		aborted: func() int { return abortedLoads(ollama.Log()) },
		started: func() int { return strings.Count(ollama.Log(), "starting runner") },
	}
	fake := target{name: "the stand-in (ollamafake)", clients: map[string]*api.Client{}}
	var fakes []*ollamafake.Server
	for _, m := range []struct {
		name     string
		ctx      int
		thinking bool
	}{{"tiny", 2048, false}, {"think", 2048, true}, {"tiny32k", 32768, false}} {
		live.clients[m.name] = ollama.Client()
		s := ollamafake.New(map[string]string{m.name: "sha256:" + m.name}, standIn)
		s.ContextLength, s.Thinking, s.LoadTime = m.ctx, m.thinking, 300*time.Millisecond
		t.Cleanup(s.Close)
		fakes = append(fakes, s)
		u, _ := url.Parse(s.URL)
		fake.clients[m.name] = api.NewClient(u, s.Client())
	}
	countFakes := func(line string) func() int {
		return func() int {
			n := 0
			for _, s := range fakes {
				n += strings.Count(strings.Join(s.Events(), "\n"), line)
			}
			return n
		}
	}
	fake.aborted, fake.started = countFakes("aborting load"), countFakes("starting runner")
	for _, tc := range conformance {
		t.Run(tc.name, func(t *testing.T) {
			got := map[string]string{}
			for _, tg := range []target{fake, live} {
				ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
				unloadAll(t, ctx, tg)
				got[tg.name] = tc.run(t, ctx, tg)
				cancel()
				t.Logf("%s: %s", tg.name, got[tg.name])
			}
			for _, tg := range []target{fake, live} {
				if got[tg.name] != tc.want {
					t.Errorf("%s breaks the claim %q:\n got %s\nwant %s", tg.name, tc.claim, got[tg.name], tc.want)
				}
			}
		})
	}
}
