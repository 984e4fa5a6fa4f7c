//go:build modelserver

package modelserver

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/ollama/ollama/api"
)

// BenchmarkOllamaThreads times a schema-bound reply of 256 tokens from
// the tiny model at num_thread 1 and at Ollama's default (every physical
// core), on a resident model with its prompt cached: on a small machine
// that the load generator, HAProxy and the backends share, the default's
// spinning workers wait on each other. Run it with
//
//	make modelservers && HAPILOT_REQUIRE_MODELSERVERS=1 go test -tags modelserver -run '^$' -bench OllamaThreads -benchtime 3x ./internal/lab/modelserver/
func BenchmarkOllamaThreads(b *testing.B) {
	o := OllamaT(b, Model{Name: "tiny", Spec: Spec{ContextLength: 32768, Seed: 7}})
	prompt := strings.Repeat("srv1 ready none 1 1 30.0 12 1800 2 0.11 0.05 1.00 300 0.00 9 13 -\n", 30)
	schema := `{"type":"object","properties":{"actions":{"type":"array","maxItems":3,"items":{"type":"object","properties":{"reason":{"type":"string","maxLength":80},"action":{"type":"string","enum":["drain","ready","set_weight","no_op"]}},"required":["reason","action"]}}},"required":["actions"]}`
	for _, threads := range []int{1, 0} {
		name := fmt.Sprintf("num_thread=%d", threads)
		if threads == 0 {
			name = "num_thread=default"
		}
		b.Run(name, func(b *testing.B) {
			chat := func() api.ChatResponse {
				stream := false
				opts := map[string]any{"num_ctx": 8192, "num_predict": 256, "temperature": 0, "seed": 1}
				if threads > 0 {
					opts["num_thread"] = threads
				}
				req := &api.ChatRequest{Model: "tiny", Stream: &stream, Format: []byte(schema), Options: opts, KeepAlive: &api.Duration{Duration: -1},
					Messages: []api.Message{{Role: "system", Content: "You decide."}, {Role: "user", Content: prompt}}}
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
				defer cancel()
				var last api.ChatResponse
				if err := o.Client().Chat(ctx, req, func(r api.ChatResponse) error { last = r; return nil }); err != nil {
					b.Fatal(err)
				}
				return last
			}
			chat() // loads the runner with these threads, and caches the prompt
			b.ResetTimer()
			var tokens int
			var eval time.Duration
			for i := 0; i < b.N; i++ {
				r := chat()
				tokens, eval = tokens+r.EvalCount, eval+r.EvalDuration
			}
			b.ReportMetric(float64(tokens)/eval.Seconds(), "tokens/s")
			b.ReportMetric(float64(tokens)/float64(b.N), "tokens/reply")
		})
	}
}
