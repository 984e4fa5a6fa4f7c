// Package modelserver runs real model servers for the lab's tests: Ollama
// built from the module that go.mod pins (build-ollama.sh), llama.cpp's
// llama-server from Debian sid (fetch-llama.sh), and tiny llama models
// with random weights written here in Go with Ollama's own GGUF writer.
// A random model answers nonsense; what it shows is the servers' side:
// loads, unloads, contexts, limits, errors and what each server accepts.
//
// The agent never links this package (cmd/hapilot's deps_test.go).
package modelserver

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/ollama/ollama/fs/ggml"
	"github.com/ollama/ollama/fs/gguf"
)

// Spec is a tiny llama model: its shape, its own context length and the
// seed of its random weights.
type Spec struct {
	Layers        int    // blocks (default 2)
	Width         int    // embedding length (default 64)
	Heads         int    // attention heads, as many for K and V (default 4)
	FF            int    // feed-forward length (default 2 x Width)
	ContextLength int    // llama.context_length (default 2048)
	Seed          uint64 // the weights' seed
	// SpacePrefix sets tokenizer.ggml.add_space_prefix, SPM's default,
	// which llama-server's JSON-schema grammars trip on (see WriteGGUF);
	// only a test that shows it sets it.
	SpacePrefix bool
	// Vocabulary, when set, replaces the byte tokenizer with a fitted one
	// (internal/lab/dataset.FitVocab), and the model adds no BOS: the
	// trained model's training text and its prompts then tokenize alike.
	Vocabulary *Vocabulary
	// Train: weights drawn for training rather than for a random model's
	// nonsense: small output logits, and the residual projections scaled
	// down by depth, so that the first steps of training are stable.
	Train bool
	// Meta is more string keys for the GGUF's metadata: the prompt form
	// the model is trained on (modelapi.PromptFormKey), which the agent
	// reads through Ollama's /api/show. Keys outside general., tokenizer.
	// and adapter. go under the architecture's name (Ollama's writer). Not
	// in stats.json: Finish sets it from the recipe.
	Meta map[string]string `json:"-"`
}

// Vocabulary is a SentencePiece vocabulary: its tokens, their GGUF types
// (1 normal, 2 unknown, 3 control, 6 byte) and scores (higher merges
// first). Ids 0, 1 and 2 are <unk>, <s> and </s>.
type Vocabulary struct {
	Tokens []string
	Types  []int32
	Scores []float32
}

func (s Spec) withDefaults() Spec {
	if s.Layers == 0 {
		s.Layers = 2
	}
	if s.Width == 0 {
		s.Width = 64
	}
	if s.Heads == 0 {
		s.Heads = 4
	}
	if s.FF == 0 {
		s.FF = 2 * s.Width
	}
	if s.ContextLength == 0 {
		s.ContextLength = 2048
	}
	return s
}

// Vocab is the tokenizer's size: <unk>, <s>, </s>, ChatML's
// <|im_start|> and <|im_end|> (control tokens, as in a real ChatML
// model), and the 256 byte tokens <0x00>..<0xFF>. Every other text is
// one token a byte (plus BOS).
const Vocab = firstByte + 256

// firstByte is the id of <0x00>.
const firstByte = 5

// WriteGGUF writes spec as a llama-architecture GGUF of F32 tensors to
// path, with a SentencePiece ("llama") tokenizer of byte tokens and
// ChatML's two control tokens.
func WriteGGUF(path string, spec Spec) error {
	return writeGGUF(path, spec, nil)
}

// WriteTrained writes spec's GGUF to path, as WriteGGUF does, with the
// tensors' values read from trained: a GGUF of spec's tensors, as
// train.py writes it (the tensors alone) or llama-finetune from spec's
// own. llama-finetune's file cannot be served as it is: it writes
// every key llama.cpp knows, llama.pooling_type among them, and Ollama
// takes a model with that key for an embedding model ("does not support
// chat"). The keys are spec's again; the weights are the trained ones.
func WriteTrained(path string, spec Spec, trained string) error {
	f, err := gguf.Open(trained)
	if err != nil {
		return fmt.Errorf("read %s: %w", trained, err)
	}
	defer f.Close()
	return writeGGUF(path, spec, func(t *ggml.Tensor) error {
		info, r, err := f.TensorReader(t.Name)
		if err != nil {
			return fmt.Errorf("%s: %w", trained, err)
		}
		if info.Type != gguf.TensorTypeF32 || !slices.Equal(info.Shape, t.Shape) {
			return fmt.Errorf("%s: tensor %s is %v %v, want F32 %v", trained, t.Name, info.Type, info.Shape, t.Shape)
		}
		t.WriterTo = readerTo{r}
		return nil
	})
}

type readerTo struct{ r io.Reader }

func (r readerTo) WriteTo(w io.Writer) (int64, error) { return io.Copy(w, r.r) }

func writeGGUF(path string, spec Spec, values func(*ggml.Tensor) error) error {
	s := spec.withDefaults()
	if s.Width%s.Heads != 0 {
		return fmt.Errorf("width %d is not a multiple of %d heads", s.Width, s.Heads)
	}
	tokens := []string{"<unk>", "<s>", "</s>", "<|im_start|>", "<|im_end|>"}
	types := []int32{2, 3, 3, 3, 3} // unknown, then control
	for b := range 256 {
		tokens = append(tokens, fmt.Sprintf("<0x%02X>", b))
		types = append(types, 6) // byte
	}
	scores := make([]float32, len(tokens))
	if v := s.Vocabulary; v != nil {
		if len(v.Types) != len(v.Tokens) || len(v.Scores) != len(v.Tokens) || len(v.Tokens) < 3 {
			return fmt.Errorf("vocabulary: %d tokens, %d types, %d scores", len(v.Tokens), len(v.Types), len(v.Scores))
		}
		tokens, types, scores = v.Tokens, v.Types, v.Scores
	}
	vocab := uint64(len(tokens))
	kv := ggml.KV{
		"general.architecture":                   "llama",
		"general.name":                           "hapilot-tiny",
		"general.file_type":                      uint32(0), // all F32
		"llama.block_count":                      uint32(s.Layers),
		"llama.context_length":                   uint32(s.ContextLength),
		"llama.embedding_length":                 uint32(s.Width),
		"llama.feed_forward_length":              uint32(s.FF),
		"llama.attention.head_count":             uint32(s.Heads),
		"llama.attention.head_count_kv":          uint32(s.Heads),
		"llama.attention.layer_norm_rms_epsilon": float32(1e-5),
		"llama.rope.dimension_count":             uint32(s.Width / s.Heads),
		"llama.rope.freq_base":                   float32(10000),
		"tokenizer.ggml.model":                   "llama",
		"tokenizer.ggml.tokens":                  tokens,
		"tokenizer.ggml.token_type":              types,
		"tokenizer.ggml.scores":                  scores,
		"tokenizer.ggml.unknown_token_id":        uint32(0),
		"tokenizer.ggml.bos_token_id":            uint32(1),
		"tokenizer.ggml.eos_token_id":            uint32(2),
		"tokenizer.ggml.add_bos_token":           s.Vocabulary == nil,
		"tokenizer.ggml.add_eos_token":           false,
		// No "▁" before the text after a special token: with it (SPM's
		// default), llama-server b11669 tokenised its generation prompt
		// as "<|im_start|>▁assistant" and its JSON-schema grammar, which
		// starts with "<|im_start|>assistant", refused it: every
		// response_format json_schema failed with "Failed to initialize
		// samplers". A real ChatML model's tokenizer adds no such prefix.
		"tokenizer.ggml.add_space_prefix": s.SpacePrefix,
		// For llama-server, which reads the template from the GGUF;
		// Ollama takes the Modelfile's TEMPLATE instead.
		"tokenizer.chat_template": ChatMLJinja,
	}
	for k, v := range s.Meta {
		kv[k] = v
	}
	seed := s.Seed
	next := func() uint64 { seed++; return seed }
	w, ff := uint64(s.Width), uint64(s.FF)
	// A random model's scales; for training, uniform weights of the
	// variance 1/fan_in (sqrt(3/fan_in) bounds), the residual projections
	// down by sqrt(2 x layers), and output logits near zero.
	embScale, outScale, inScale, resScale, downScale := float32(0.5), float32(0.5), float32(0.1), float32(0.1), float32(0.1)
	if s.Train {
		embScale, outScale = 0.1, 0.02
		inScale = float32(math.Sqrt(3 / float64(w)))
		resScale = inScale / float32(math.Sqrt(2*float64(s.Layers)))
		downScale = float32(math.Sqrt(3/float64(ff))) / float32(math.Sqrt(2*float64(s.Layers)))
	}
	mask := func(i uint64) bool { return false }
	if s.Vocabulary == nil {
		// The rows of the bytes 0x80-0xFF are zero: their logit is 0, below
		// the best of the other tokens' random logits, so that a greedy
		// (temperature 0) reply is ASCII, valid UTF-8, as a real model's
		// is. Random bytes made invalid UTF-8 that llama-server's reply
		// parser refused ("does not match the expected peg-native format").
		mask = func(i uint64) bool { return i/w >= firstByte+0x80 }
	}
	ts := []*ggml.Tensor{
		randomTensor("token_embd.weight", next(), embScale, w, vocab),
		maskedTensor("output.weight", next(), outScale, mask, w, vocab),
		onesTensor("output_norm.weight", w),
	}
	for i := range s.Layers {
		p := fmt.Sprintf("blk.%d.", i)
		ts = append(ts,
			onesTensor(p+"attn_norm.weight", w),
			onesTensor(p+"ffn_norm.weight", w),
			randomTensor(p+"attn_q.weight", next(), inScale, w, w),
			randomTensor(p+"attn_k.weight", next(), inScale, w, w),
			randomTensor(p+"attn_v.weight", next(), inScale, w, w),
			randomTensor(p+"attn_output.weight", next(), resScale, w, w),
			randomTensor(p+"ffn_gate.weight", next(), inScale, w, ff),
			randomTensor(p+"ffn_up.weight", next(), inScale, w, ff),
			randomTensor(p+"ffn_down.weight", next(), downScale, ff, w),
		)
	}
	if values != nil {
		for _, t := range ts {
			if err := values(t); err != nil {
				return err
			}
		}
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if err := ggml.WriteGGUF(f, kv, ts); err != nil {
		f.Close()
		return fmt.Errorf("write %s: %w", path, err)
	}
	return f.Close()
}

// f32s writes n float32 values, drawn from a source that start makes
// anew for each write, so that a file is the same for the same seed.
type f32s struct {
	n     uint64
	start func() func(i uint64) float32
}

func (t f32s) WriteTo(w io.Writer) (int64, error) {
	next := t.start()
	buf := make([]byte, 0, 4096)
	var total int64
	for i := range t.n {
		buf = binary.LittleEndian.AppendUint32(buf, math.Float32bits(next(i)))
		if len(buf) == cap(buf) || i == t.n-1 {
			n, err := w.Write(buf)
			total += int64(n)
			if err != nil {
				return total, err
			}
			buf = buf[:0]
		}
	}
	return total, nil
}

// randomTensor is uniform in [-scale, scale), shape (ne0, ne1) as ggml
// counts it.
func randomTensor(name string, seed uint64, scale float32, shape ...uint64) *ggml.Tensor {
	return maskedTensor(name, seed, scale, nil, shape...)
}

// maskedTensor is randomTensor with the values where zero(i) holds set
// to 0.
func maskedTensor(name string, seed uint64, scale float32, zero func(i uint64) bool, shape ...uint64) *ggml.Tensor {
	n := uint64(1)
	for _, d := range shape {
		n *= d
	}
	return &ggml.Tensor{Name: name, Kind: 0, Shape: shape, WriterTo: f32s{n: n, start: func() func(uint64) float32 {
		r := rand.New(rand.NewPCG(seed, 0x6861706c696c6f74))
		return func(i uint64) float32 {
			v := (2*r.Float32() - 1) * scale
			if zero != nil && zero(i) {
				return 0
			}
			return v
		}
	}}}
}

func onesTensor(name string, n uint64) *ggml.Tensor {
	return &ggml.Tensor{Name: name, Kind: 0, Shape: []uint64{n}, WriterTo: f32s{n: n, start: func() func(uint64) float32 {
		return func(uint64) float32 { return 1 }
	}}}
}

// ChatTemplate is a ChatML-like TEMPLATE over .Messages. It holds no
// .Thinking, so Ollama reports no "thinking" capability for it.
const ChatTemplate = `{{- range .Messages }}<|im_start|>{{ .Role }}
{{ .Content }}<|im_end|>
{{ end }}<|im_start|>assistant
`

// ThinkingTemplate is ChatTemplate with a thinking block. Ollama 0.17.4
// (server/images.go, Capabilities) reports "thinking" for a model whose
// template names .Thinking inside a range over .Messages
// (thinking.InferTags), and takes the text around it as the tags:
// "<think>" and "</think>". The prompt ends with "<think>" when thinking
// is on, so everything a random model says is thinking: it never writes
// "</think>".
const ThinkingTemplate = `{{- range .Messages }}<|im_start|>{{ .Role }}
{{ if .Thinking }}<think>{{ .Thinking }}</think>{{ end }}{{ .Content }}<|im_end|>
{{ end }}<|im_start|>assistant
{{ if and .IsThinkSet .Think }}<think>{{ end }}`

// ChatMLJinja is ChatTemplate in Jinja, as llama-server reads it from
// the GGUF's tokenizer.chat_template.
const ChatMLJinja = "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}{% endfor %}" +
	"{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"

// Model is one tiny model to import into Ollama.
type Model struct {
	Name     string
	Spec     Spec
	Thinking bool // use ThinkingTemplate
	// Threads, when set, is the Modelfile's PARAMETER num_thread: the
	// model's default, for requests that cannot carry options (Ollama's
	// /v1).
	Threads int
}

// Write writes dir/NAME.gguf and dir/Modelfile (FROM ./NAME.gguf and the
// template), and returns the GGUF's path.
func (m Model) Write(dir string) (string, error) {
	gguf := filepath.Join(dir, m.Name+".gguf")
	if err := WriteGGUF(gguf, m.Spec); err != nil {
		return "", err
	}
	mf := filepath.Join(dir, "Modelfile")
	if err := WriteModelfile(mf, "./"+m.Name+".gguf", m.Thinking); err != nil || m.Threads == 0 {
		return gguf, err
	}
	f, err := os.OpenFile(mf, os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		return gguf, err
	}
	_, err = fmt.Fprintf(f, "PARAMETER num_thread %d\n", m.Threads)
	return gguf, errors.Join(err, f.Close())
}

// WriteModelfile writes an Ollama Modelfile at path: FROM from, the chat
// (or thinking) template, and <|im_end|> as a stop.
func WriteModelfile(path, from string, thinking bool) error {
	tmpl := ChatTemplate
	if thinking {
		tmpl = ThinkingTemplate
	}
	if strings.Contains(tmpl, `"""`) {
		return fmt.Errorf("template holds a triple quote")
	}
	mf := fmt.Sprintf("FROM %s\nTEMPLATE \"\"\"%s\"\"\"\nPARAMETER stop \"<|im_end|>\"\n", from, tmpl)
	return os.WriteFile(path, []byte(mf), 0o644)
}

// SetMeta writes meta's keys into the metadata of the GGUF at path, in
// place: every other key and every tensor's bytes stay as they are (the
// file is decoded with Ollama's reader and written again with its
// writer, which orders keys and tensors as it did; TestSetMeta checks the
// result is the file written with the key in the first place). It stamps a trained
// model's prompt form without training it again.
func SetMeta(path string, meta map[string]string) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	g, err := ggml.Decode(f, -1)
	if err != nil {
		return fmt.Errorf("read %s: %w", path, err)
	}
	// Ollama's decoder adds keys it derives (general.parameter_count):
	// the file's own are what its raw reader lists.
	raw, err := gguf.Open(path)
	if err != nil {
		return fmt.Errorf("read %s: %w", path, err)
	}
	own := map[string]bool{}
	for _, kv := range raw.KeyValues() {
		own[kv.Key] = true
	}
	raw.Close()
	kv := g.KV()
	for k := range kv {
		if !own[k] {
			delete(kv, k)
		}
	}
	for k, v := range meta {
		kv[k] = v
	}
	ts := g.Tensors()
	var out []*ggml.Tensor
	for _, t := range ts.Items() {
		r := io.NewSectionReader(f, int64(ts.Offset+t.Offset), int64(t.Size()))
		out = append(out, &ggml.Tensor{Name: t.Name, Kind: t.Kind, Shape: t.Shape, WriterTo: readerTo{r}})
	}
	tmp := path + ".tmp"
	w, err := os.Create(tmp)
	if err != nil {
		return err
	}
	if err := ggml.WriteGGUF(w, kv, out); err != nil {
		w.Close()
		os.Remove(tmp)
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err := w.Close(); err != nil {
		os.Remove(tmp)
		return err
	}
	return os.Rename(tmp, path)
}
