//go:build e2e

package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hapilot/hapilot/internal/lab/fleet"
	"github.com/hapilot/hapilot/internal/lab/haproxyproc"
	"github.com/hapilot/hapilot/internal/lab/labtest"
	"github.com/hapilot/hapilot/internal/lab/logbuf"
	"github.com/rs/zerolog"
)

// The LLM API key never leaves the agent. An OpenAI-compatible server
// answers 401 with a body echoing the Authorization header it got: first
// on /health (the model is unreachable: /status shows why), then only on
// chats, once the model is ready and traffic gives it a candidate (the
// step falls back: an event, a webhook POST). The server's words reach
// the log, /status, the audit log's fallback event and the webhook's
// POST; the key reaches none. Before, it was in all four, verbatim.
func TestLLMKeyNeverLeavesTheAgent(t *testing.T) {
	t.Parallel()
	labtest.RequireHAProxy(t)
	const key = "sk-e2e-NEVER-LEAVES-7f3a9c"
	dir := t.TempDir()
	keyFile := filepath.Join(dir, "llm.key")
	if err := os.WriteFile(keyFile, []byte(key+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}

	var mu sync.Mutex
	var sentKey bool // the server got the key: the echo the test guards against happened
	healthRefused := true
	const echo = "invalid key; you sent Authorization"
	model := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		mu.Lock()
		refuse := healthRefused
		mu.Unlock()
		switch {
		case r.URL.Path == "/health" && !refuse:
			_, _ = io.WriteString(w, `{"status":"ok"}`)
		case r.URL.Path == "/props":
			_, _ = io.WriteString(w, `{"default_generation_settings":{"n_ctx":8192},"model_path":"/m/tiny.gguf","build_info":"b1"}`)
		case r.URL.Path == "/v1/models":
			_, _ = io.WriteString(w, `{"data":[{"id":"/m/tiny.gguf","owned_by":"llamacpp"}]}`)
		default:
			auth := r.Header.Get("Authorization")
			mu.Lock()
			sentKey = sentKey || strings.Contains(auth, key)
			mu.Unlock()
			w.WriteHeader(http.StatusUnauthorized)
			b, _ := json.Marshal(map[string]any{"error": map[string]any{"message": echo + ": " + auth, "type": "invalid_request_error"}})
			_, _ = w.Write(b)
		}
	}))
	defer model.Close()

	hooks := make(chan string, 64)
	hook := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		hooks <- string(b)
	}))
	defer hook.Close()

	backends, err := fleet.StartBackends(paperFleet(0, 0, 0.05, 0, 0, 0))
	if err != nil {
		t.Fatal(err)
	}
	defer fleet.CloseAll(backends)
	addr := fleet.Addrs(backends)
	ports, err := haproxyproc.FreePorts(2)
	if err != nil {
		t.Fatal(err)
	}
	h := newHandConfig(t, dir)
	var b strings.Builder
	b.WriteString(h.head(ports[0], ""))
	b.WriteString("    default_backend app\n\nbackend app\n")
	for i, a := range addr {
		fmt.Fprintf(&b, "    server %s %s\n", fleet.ServerName(i), a)
	}
	b.WriteString("\n" + h.agents)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	hp, err := haproxyproc.Start(ctx, dir, b.String(), h.socket)
	if err != nil {
		t.Fatal(err)
	}
	defer hp.Stop()

	var logs logbuf.Buffer
	audit := filepath.Join(dir, "audit.jsonl")
	statusAddr := fmt.Sprintf("127.0.0.1:%d", ports[1])
	startAgent(t, ctx, zerolog.New(&logs), h.agentArgs("--policy", "llm", "--llm-api", "openai", "--llm-url", model.URL,
		"--llm-key-file", keyFile, "--model", "tiny", "--skip-calibration", "--status-listen", statusAddr,
		"--audit-log", audit, "--notify-webhook", hook.URL, "--readmit", "off"))
	get := func(path string) string {
		resp, err := http.Get("http://" + statusAddr + path)
		if err != nil {
			return ""
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return string(b)
	}
	status := func() string { return get("/status") }
	// Unreachable: /status says why, in the model's life.
	var st string
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		if st = status(); strings.Contains(st, echo) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("/status never showed the server's refusal:\n%s\n%s", st, tail(logs.String(), 3000))
		}
	}
	mu.Lock()
	healthRefused = false
	mu.Unlock()
	// The model is ready before any traffic (no candidate: no step asks
	// it, none falls back): the first step that asks it is the first
	// fallback, so its event carries the server's 401.
	for deadline := time.Now().Add(30 * time.Second); !strings.Contains(status(), `"state": "ready"`); time.Sleep(100 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the model never got ready:\n%s\n%s", status(), tail(logs.String(), 3000))
		}
	}
	go fleet.Load{Addr: fmt.Sprintf("127.0.0.1:%d", ports[0]), Rate: 200, Duration: 60 * time.Second}.Run(ctx)

	var fallback string
	for fallback == "" {
		select {
		case body := <-hooks:
			if strings.Contains(body, `"type":"fallback"`) {
				fallback = body
			}
		case <-time.After(60 * time.Second):
			t.Fatalf("no fallback event reached the webhook in 60 s:\n%s", tail(logs.String(), 3000))
		}
	}
	metrics := get("/metrics")
	if !strings.Contains(metrics, "hapilot_llm_fallbacks_total") {
		t.Fatalf("/metrics has no LLM counters:\n%s", tail(metrics, 2000))
	}
	if strings.Contains(metrics, key) {
		t.Error("the key is in /metrics")
	}
	cancel() // stop load; the audit log and the log are read as they are
	events, err := os.ReadFile(audit)
	if err != nil {
		t.Fatal(err)
	}
	var fallbackEvent string
	for _, l := range strings.Split(string(events), "\n") {
		if strings.Contains(l, `"type":"fallback"`) {
			fallbackEvent = l
		}
	}
	mu.Lock()
	if !sentKey {
		t.Fatal("the model server never got the key: nothing was echoed")
	}
	mu.Unlock()
	for surface, text := range map[string]string{"the log": logs.String(), "/status": st, "the audit log's fallback event": fallbackEvent,
		"the webhook's POST": fallback} {
		if !strings.Contains(text, echo) {
			t.Errorf("%s does not show the server's refusal, so it proves nothing:\n%s", surface, tail(text, 2000))
		}
		if strings.Contains(text, key) || strings.Contains(text, key[:10]) {
			t.Errorf("the key is in %s:\n%s", surface, tail(text, 2000))
		}
	}
	t.Logf("the webhook's POST: %s", fallback)
}
