package modelserver

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// Required reports whether a missing server fails a test rather than
// skipping it: HAPILOT_REQUIRE_MODELSERVERS is set (make test-llm sets
// it), so that CI can never pass by skipping.
func Required() bool { return os.Getenv("HAPILOT_REQUIRE_MODELSERVERS") != "" }

func missing(t testing.TB, err error) {
	t.Helper()
	if Required() {
		t.Fatalf("%v; run make modelservers", err)
	}
	t.Skipf("%v (HAPILOT_REQUIRE_MODELSERVERS=1 makes this a failure)", err)
}

// RequireOllama skips t where no Ollama binary is built (fails it where
// Required), and returns the binary.
func RequireOllama(t testing.TB) string {
	t.Helper()
	b, err := OllamaBinary()
	if err != nil {
		missing(t, err)
	}
	return b
}

// RequireLlama skips t where llama-server is not fetched (fails it where
// Required), and returns its folder.
func RequireLlama(t testing.TB) string {
	t.Helper()
	d, err := LlamaDir()
	if err != nil {
		missing(t, err)
	}
	return d
}

// OllamaT starts Ollama for t in t.TempDir() and imports models. It is
// stopped at the test's end, and its log printed only if the test
// failed. The server and its version are logged.
func OllamaT(t testing.TB, models ...Model) *Ollama {
	t.Helper()
	RequireOllama(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	o, err := StartOllama(ctx, t.TempDir())
	if err != nil {
		t.Fatalf("start ollama: %v", err)
	}
	t.Cleanup(func() {
		o.Stop()
		if t.Failed() {
			t.Logf("%s log:\n%s", o, o.Log())
		}
	})
	t.Logf("against %s", o)
	for _, m := range models {
		start := time.Now()
		if err := o.Create(ctx, m); err != nil {
			t.Fatal(err)
		}
		t.Logf("imported %s (%+v, thinking template %v) in %s", m.Name, m.Spec.withDefaults(), m.Thinking, time.Since(start).Round(time.Millisecond))
	}
	return o
}

// LlamaServerT writes spec's GGUF in t.TempDir() and serves it with
// llama-server -c nctx for t; stopped at the end, its log printed only
// if t failed. The server and its version are logged.
func LlamaServerT(t testing.TB, spec Spec, nctx int, extra ...string) *LlamaServer {
	t.Helper()
	RequireLlama(t)
	gguf := filepath.Join(t.TempDir(), "tiny.gguf")
	if err := WriteGGUF(gguf, spec); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	s, err := StartLlamaServer(ctx, gguf, nctx, extra...)
	if err != nil {
		t.Fatalf("start llama-server: %v", err)
	}
	t.Cleanup(func() {
		s.Stop()
		if t.Failed() {
			t.Logf("%s log:\n%s", s, s.Log())
		}
	})
	t.Logf("against %s", s)
	return s
}
