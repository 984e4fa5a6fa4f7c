package modelserver

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"

	"github.com/ollama/ollama/fs/ggml"
	"github.com/ollama/ollama/fs/gguf"
)

// A trained GGUF as llama-finetune writes it (every key llama.cpp knows,
// llama.pooling_type among them, which makes Ollama refuse to chat) is
// written again with the spec's keys and the trained weights.
func TestWriteTrained(t *testing.T) {
	dir := t.TempDir()
	spec := Spec{Width: 16, FF: 32, Train: true, Seed: 3}
	other := spec
	other.Seed = 4 // "trained": other values, the same shapes
	raw := filepath.Join(dir, "raw.gguf")
	if err := writeGGUF(raw, other, nil); err != nil {
		t.Fatal(err)
	}
	// Add the key llama-finetune writes, keeping the tensors.
	f, _ := os.Open(raw)
	g, err := ggml.Decode(f, -1)
	f.Close()
	if err != nil {
		t.Fatal(err)
	}
	kv := g.KV()
	kv["llama.pooling_type"] = uint32(0)
	trained := filepath.Join(dir, "trained.gguf")
	src, _ := gguf.Open(raw)
	var ts []*ggml.Tensor
	for _, ti := range g.Tensors().Items() {
		_, r, err := src.TensorReader(ti.Name)
		if err != nil {
			t.Fatal(err)
		}
		ts = append(ts, &ggml.Tensor{Name: ti.Name, Kind: 0, Shape: ti.Shape, WriterTo: readerTo{r}})
	}
	out, _ := os.Create(trained)
	if err := ggml.WriteGGUF(out, kv, ts); err != nil {
		t.Fatal(err)
	}
	out.Close()
	src.Close()

	served := filepath.Join(dir, "served.gguf")
	if err := WriteTrained(served, spec, trained); err != nil {
		t.Fatal(err)
	}
	s, err := gguf.Open(served)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if s.KeyValue("pooling_type").Valid() {
		t.Fatal("the served GGUF keeps llama.pooling_type: Ollama takes it for an embedding model")
	}
	want, _ := os.ReadFile(raw)
	fresh := filepath.Join(dir, "fresh.gguf")
	if err := WriteGGUF(fresh, spec); err != nil {
		t.Fatal(err)
	}
	initial, _ := os.ReadFile(fresh)
	info := s.TensorInfo("token_embd.weight")
	_, r, _ := s.TensorReader("token_embd.weight")
	buf := make([]byte, info.NumBytes())
	if _, err := r.Read(buf); err != nil {
		t.Fatal(err)
	}
	if !bytes.Contains(want, buf) || bytes.Contains(initial, buf) {
		t.Fatal("the served GGUF does not hold the trained weights")
	}
}
