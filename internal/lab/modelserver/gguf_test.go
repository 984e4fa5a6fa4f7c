package modelserver

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ollama/ollama/fs/ggml"
)

// The GGUF reads back with Ollama's own decoder: its keys, its shape,
// its size, and the same bytes for the same seed.
func TestWriteGGUF(t *testing.T) {
	dir := t.TempDir()
	a, b := filepath.Join(dir, "a.gguf"), filepath.Join(dir, "b.gguf")
	for _, p := range []string{a, b} {
		if err := WriteGGUF(p, Spec{ContextLength: 32768, Seed: 7}); err != nil {
			t.Fatal(err)
		}
	}
	f, err := os.Open(a)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	g, err := ggml.Decode(f, -1)
	if err != nil {
		t.Fatal(err)
	}
	kv := g.KV()
	if kv.Architecture() != "llama" || kv.ContextLength() != 32768 || kv.BlockCount() != 2 || kv.EmbeddingLength() != 64 {
		t.Errorf("kv: arch %s, context %d, blocks %d, width %d", kv.Architecture(), kv.ContextLength(), kv.BlockCount(), kv.EmbeddingLength())
	}
	if toks := kv.Strings("tokenizer.ggml.tokens"); len(toks) != Vocab || toks[firstByte] != "<0x00>" || toks[3] != "<|im_start|>" {
		t.Errorf("tokens: %d, %q", len(toks), toks[:min(len(toks), 6)])
	}
	// 2 blocks of 4x64x64 + 3x64x128 floats, embeddings and output of
	// 64 x Vocab, norms: about 470 KB.
	st, _ := f.Stat()
	if st.Size() < 400_000 || st.Size() > 500_000 {
		t.Errorf("size %d", st.Size())
	}
	ab, _ := os.ReadFile(a)
	bb, _ := os.ReadFile(b)
	if !bytes.Equal(ab, bb) {
		t.Error("two files of the same seed differ")
	}
	if err := WriteGGUF(filepath.Join(dir, "c.gguf"), Spec{Seed: 8}); err != nil {
		t.Fatal(err)
	}
	if cb, _ := os.ReadFile(filepath.Join(dir, "c.gguf")); bytes.Equal(ab[len(ab)-1000:], cb[len(cb)-1000:]) {
		t.Error("another seed wrote the same weights")
	}
}

func TestModelfile(t *testing.T) {
	dir := t.TempDir()
	gguf, err := Model{Name: "think", Thinking: true}.Write(dir)
	if err != nil || filepath.Base(gguf) != "think.gguf" {
		t.Fatal(gguf, err)
	}
	mf, _ := os.ReadFile(filepath.Join(dir, "Modelfile"))
	for _, want := range []string{"FROM ./think.gguf\n", "TEMPLATE \"\"\"", "{{ .Thinking }}", "PARAMETER stop \"<|im_end|>\""} {
		if !strings.Contains(string(mf), want) {
			t.Errorf("Modelfile lacks %q:\n%s", want, mf)
		}
	}
}

// Without the servers, a test that needs them skips, or fails under
// HAPILOT_REQUIRE_MODELSERVERS with the make target's name.
func TestMissingServers(t *testing.T) {
	t.Setenv("HAPILOT_OLLAMA_BIN", filepath.Join(t.TempDir(), "none"))
	t.Setenv("HAPILOT_LLAMA_DIR", t.TempDir())
	if _, err := OllamaBinary(); err == nil || !strings.Contains(err.Error(), "make modelservers") {
		t.Errorf("ollama: %v", err)
	}
	if _, err := LlamaDir(); err == nil || !strings.Contains(err.Error(), "make modelservers") {
		t.Errorf("llama: %v", err)
	}
}

// SetMeta stamps a written model as writing it with the key would have:
// the same bytes, and every other key and tensor as they were. Ollama's
// decoder, which /api/show reads model_info with, finds the key.
func TestSetMeta(t *testing.T) {
	dir := t.TempDir()
	spec := Spec{Width: 16, FF: 32, Seed: 5}
	stamped, direct := filepath.Join(dir, "stamped.gguf"), filepath.Join(dir, "direct.gguf")
	if err := WriteGGUF(stamped, spec); err != nil {
		t.Fatal(err)
	}
	before, _ := os.ReadFile(stamped)
	meta := map[string]string{"general.hapilot.prompt_form": "numbered"}
	if err := SetMeta(stamped, meta); err != nil {
		t.Fatal(err)
	}
	spec.Meta = meta
	if err := WriteGGUF(direct, spec); err != nil {
		t.Fatal(err)
	}
	a, _ := os.ReadFile(stamped)
	b, _ := os.ReadFile(direct)
	if !bytes.Equal(a, b) {
		t.Fatalf("stamped (%d bytes) differs from written with the key (%d bytes)", len(a), len(b))
	}
	if bytes.Equal(a, before) || !bytes.Equal(a[len(a)-1000:], before[len(before)-1000:]) {
		t.Fatal("the stamp changed nothing, or changed the weights")
	}
	f, err := os.Open(stamped)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	g, err := ggml.Decode(f, 0)
	if err != nil {
		t.Fatal(err)
	}
	if got := g.KV().String("general.hapilot.prompt_form"); got != "numbered" {
		t.Fatalf("the decoder reads %q", got)
	}
}
