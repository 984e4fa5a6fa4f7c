package ollamafake

import (
	"context"
	"errors"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ollama/ollama/api"
)

// Every behaviour below is exercised through Ollama's own client, as the
// agent meets it.

func client(t *testing.T, s *Server) *api.Client {
	t.Helper()
	u, err := url.Parse(s.URL)
	if err != nil {
		t.Fatal(err)
	}
	return api.NewClient(u, &http.Client{})
}

func chat(ctx context.Context, c *api.Client, req *api.ChatRequest) (api.ChatResponse, error) {
	stream := false
	req.Stream = &stream
	var out api.ChatResponse
	err := c.Chat(ctx, req, func(r api.ChatResponse) error { out = r; return nil })
	return out, err
}

func statusOf(err error) (int, string) {
	var se api.StatusError
	if errors.As(err, &se) {
		return se.StatusCode, se.ErrorMessage
	}
	return 0, ""
}

// clock is a settable time for keep_alive.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) now() time.Time      { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *clock) add(d time.Duration) { c.mu.Lock(); defer c.mu.Unlock(); c.t = c.t.Add(d) }

func user(text string) []api.Message { return []api.Message{{Role: "user", Content: text}} }

func TestColdLoadAbortedByACancelledRequest(t *testing.T) {
	s := New(map[string]string{"m": "sha256:1"}, Fixed(Answer()))
	defer s.Close()
	s.LoadTime = 300 * time.Millisecond
	c := client(t, s)
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if _, err := chat(ctx, c, &api.ChatRequest{Model: "m", Messages: user("hi")}); err == nil {
		t.Fatal("a call cut during the load succeeded")
	}
	// Wait for the server to see the client go: it says so in its events.
	for deadline := time.Now().Add(5 * time.Second); !strings.Contains(strings.Join(s.Events(), "\n"), "aborting load"); time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("no aborted load within 5 s: events %q", s.Events())
		}
	}
	if _, ok := s.Loaded("m"); ok {
		t.Fatal("the model loaded although its request was cancelled")
	}
	if ev := strings.Join(s.Events(), "\n"); !strings.Contains(ev, "aborting load") {
		t.Fatalf("events %q", ev)
	}
	// A load request that nobody cancels: no messages, done_reason "load",
	// and no durations in the reply, as the real server's (a client times
	// the load itself).
	start := time.Now()
	r, err := chat(context.Background(), c, &api.ChatRequest{Model: "m"})
	if took := time.Since(start); err != nil || r.DoneReason != "load" || took < 250*time.Millisecond || r.LoadDuration != 0 || r.TotalDuration != 0 {
		t.Fatalf("warm-up %+v %v (took %v)", r, err, took)
	}
	// Warm now: a call answers without the load.
	r, err = chat(context.Background(), c, &api.ChatRequest{Model: "m", Messages: user("hi")})
	if err != nil || r.LoadDuration > 100*time.Millisecond {
		t.Fatalf("warm call %+v %v", r.Metrics, err)
	}
}

func TestKeepAliveUnloadsAnIdleModel(t *testing.T) {
	clk := &clock{t: time.Unix(1000, 0)}
	s := New(map[string]string{"m": "sha256:1"}, Fixed(Answer()))
	defer s.Close()
	s.Now = clk.now
	c := client(t, s)
	for _, tc := range []struct {
		keep       *api.Duration
		idle       time.Duration
		stillThere bool
	}{
		{nil, 4 * time.Minute, true}, // the default: 5 minutes
		{nil, 6 * time.Minute, false},
		{&api.Duration{Duration: time.Minute}, 2 * time.Minute, false},
		{&api.Duration{Duration: -1}, 24 * time.Hour, true},
	} {
		if _, err := chat(context.Background(), c, &api.ChatRequest{Model: "m", Messages: user("hi"), KeepAlive: tc.keep}); err != nil {
			t.Fatal(err)
		}
		clk.add(tc.idle)
		if _, ok := s.Loaded("m"); ok != tc.stillThere {
			t.Errorf("keep_alive %v, idle %v: loaded %v", tc.keep, tc.idle, ok)
		}
	}
	// keep_alive 0 with no messages unloads.
	r, err := chat(context.Background(), c, &api.ChatRequest{Model: "m", KeepAlive: &api.Duration{Duration: 0}})
	if _, ok := s.Loaded("m"); err != nil || r.DoneReason != "unload" || ok {
		t.Fatalf("unload %+v %v loaded %v", r, err, ok)
	}
}

func TestContextTruncationAndTruncateFalse(t *testing.T) {
	var seen Request
	s := New(map[string]string{"m": "sha256:1"}, func(r Request) Reply { seen = r; return Reply{Content: Answer()} })
	defer s.Close()
	c := client(t, s)
	long := strings.Repeat("srv1 ready none 1 ", 1200) // about 5,400 tokens: past the default 4096
	msgs := []api.Message{{Role: "system", Content: "You are hapilot's policy."}, {Role: "user", Content: long}}
	r, err := chat(context.Background(), c, &api.ChatRequest{Model: "m", Messages: msgs})
	if err != nil || !seen.Truncated || seen.Messages[0].Role == "system" || r.PromptEvalCount != 4096 {
		t.Fatalf("default: %v, truncated %v, first %q, prompt tokens %d", err, seen.Truncated, seen.Messages[0].Role, r.PromptEvalCount)
	}
	no := false
	_, err = chat(context.Background(), c, &api.ChatRequest{Model: "m", Messages: msgs, Truncate: &no})
	if code, msg := statusOf(err); code != 400 || msg != "the input length exceeds the context length" {
		t.Fatalf("truncate:false: %v", err)
	}
	// A num_ctx that fits the prompt: no cut; a different num_ctx reloads.
	r, err = chat(context.Background(), c, &api.ChatRequest{Model: "m", Messages: msgs, Truncate: &no, Options: map[string]any{"num_ctx": 8192}})
	if err != nil || seen.Truncated || r.PromptEvalCount < 5000 {
		t.Fatalf("num_ctx 8192: %v truncated %v tokens %d", err, seen.Truncated, r.PromptEvalCount)
	}
	if ev := strings.Join(s.Events(), "\n"); !strings.Contains(ev, "reloading m: num_ctx 8192, was 4096") {
		t.Fatalf("events %q", ev)
	}
	// The model's own context caps num_ctx.
	s.ContextLength = 4096
	_, err = chat(context.Background(), c, &api.ChatRequest{Model: "m", Messages: msgs, Truncate: &no, Options: map[string]any{"num_ctx": 8192}})
	if code, _ := statusOf(err); code != 400 {
		t.Fatalf("past the model's context: %v", err)
	}
}

func TestNumPredictBoundsThinkingAndAnswer(t *testing.T) {
	s := New(map[string]string{"m": "sha256:1"}, func(Request) Reply {
		return Reply{Content: Answer(Action{Action: "no_op", Backend: "-", Server: "-", Reason: "fine"}), Thinking: "hmm", ThinkingTokens: 600}
	})
	defer s.Close()
	s.Thinking = true
	c := client(t, s)
	on := &api.ThinkValue{Value: true}
	r, err := chat(context.Background(), c, &api.ChatRequest{Model: "m", Messages: user("x"), Think: on, Options: map[string]any{"num_predict": 256}})
	if err != nil || r.Message.Content != "" || r.DoneReason != "length" || r.EvalCount != 256 {
		t.Fatalf("cut while thinking: %q %q %d %v", r.Message.Content, r.DoneReason, r.EvalCount, err)
	}
	r, err = chat(context.Background(), c, &api.ChatRequest{Model: "m", Messages: user("x"), Think: on, Options: map[string]any{"num_predict": 1024}})
	if err != nil || r.Message.Content == "" || r.Message.Thinking != "hmm" || r.DoneReason != "stop" {
		t.Fatalf("room to think: %+v %v", r.Message, err)
	}
	// Omitted think on a thinking model: thinking is on.
	r, err = chat(context.Background(), c, &api.ChatRequest{Model: "m", Messages: user("x"), Options: map[string]any{"num_predict": 256}})
	if err != nil || r.DoneReason != "length" {
		t.Fatalf("think omitted: %q %v", r.DoneReason, err)
	}
	off := &api.ThinkValue{Value: false}
	r, err = chat(context.Background(), c, &api.ChatRequest{Model: "m", Messages: user("x"), Think: off, Options: map[string]any{"num_predict": 256}})
	if err != nil || r.DoneReason != "stop" || r.Message.Thinking != "" {
		t.Fatalf("think off: %+v %v", r.Message, err)
	}
}

func TestThinkErrors(t *testing.T) {
	s := New(map[string]string{"m": "sha256:1"}, Fixed(Answer()))
	defer s.Close()
	c := client(t, s)
	_, err := chat(context.Background(), c, &api.ChatRequest{Model: "m", Messages: user("x"), Think: &api.ThinkValue{Value: true}})
	if code, msg := statusOf(err); code != 400 || msg != `"m" does not support thinking` {
		t.Fatalf("think on a model without it: %v", err)
	}
	s.Thinking = true
	s.LoadTime = 100 * time.Millisecond
	began := time.Now()
	_, err = chat(context.Background(), c, &api.ChatRequest{Model: "m", Messages: user("x"), Think: &api.ThinkValue{Value: "low"}})
	if code, msg := statusOf(err); code != 400 || msg != `think value "low" is not supported for this model` || time.Since(began) < 100*time.Millisecond {
		t.Fatalf("think level: %v after %v (the real server checks it after the load)", err, time.Since(began))
	}
	s.ThinkLevels = true
	if _, err := chat(context.Background(), c, &api.ChatRequest{Model: "m", Messages: user("x"), Think: &api.ThinkValue{Value: "low"}}); err != nil {
		t.Fatalf("think level on a harmony model: %v", err)
	}
}

func TestShowAndPs(t *testing.T) {
	s := New(map[string]string{"m": "sha256:1"}, Fixed(Answer()))
	defer s.Close()
	s.Thinking, s.ContextLength = true, 40960
	c := client(t, s)
	show, err := c.Show(context.Background(), &api.ShowRequest{Model: "m"})
	if err != nil || len(show.Capabilities) != 2 || show.Capabilities[1] != "thinking" || show.ModelInfo["qwen3.context_length"] != float64(40960) {
		t.Fatalf("show %+v %v", show, err)
	}
	if _, err := c.Show(context.Background(), &api.ShowRequest{Model: "absent"}); err == nil {
		t.Fatal("show of an absent model")
	}
	ps, err := c.ListRunning(context.Background())
	if err != nil || len(ps.Models) != 0 {
		t.Fatalf("ps before a load %+v %v", ps, err)
	}
	if _, err := chat(context.Background(), c, &api.ChatRequest{Model: "m", KeepAlive: &api.Duration{Duration: -1}}); err != nil {
		t.Fatal(err)
	}
	ps, err = c.ListRunning(context.Background())
	if err != nil || len(ps.Models) != 1 || ps.Models[0].ContextLength != 4096 || ps.Models[0].ExpiresAt.Year() < 2300 {
		t.Fatalf("ps after a load %+v %v", ps, err)
	}
	v, err := c.Version(context.Background())
	if err != nil || v != "0.17.4" {
		t.Fatalf("version %q %v", v, err)
	}
}

// A reply ended by Ollama's token repeat limit: 200, done false, no
// done_reason, no counts, the content generated so far.
func TestRepeatLimit(t *testing.T) {
	s := New(map[string]string{"m": "sha256:1"}, func(Request) Reply { return Reply{Content: `{"reason":"lllll`, RepeatLimit: true} })
	defer s.Close()
	r, err := chat(context.Background(), client(t, s), &api.ChatRequest{Model: "m", Messages: user("hi")})
	if err != nil || r.Done || r.DoneReason != "" || r.EvalCount != 0 || r.Message.Content != `{"reason":"lllll` {
		t.Fatalf("%+v %v", r, err)
	}
}
