package dataset

import (
	"fmt"
	"sort"
	"strings"

	"github.com/ollama/ollama/fs/gguf"
	"github.com/ollama/ollama/tokenizer"
)

// Vocab is a SentencePiece ("llama") vocabulary fitted to the prompts:
// <unk>, <s>, </s>, the 256 byte tokens, the characters the text uses,
// then one token per merge, scored by its rank so that a SentencePiece
// tokenizer (llama.cpp's, which trains, and Ollama's, which serves) takes
// the earliest merges first. There are no ChatML control tokens: the
// template's markers are plain text, tokenized alike by llama-finetune
// (which reads its text file without special tokens) and by Ollama.
type Vocab struct {
	Tokens []string
	Types  []int32
	Scores []float32
}

// Token types as GGUF's tokenizer.ggml.token_type counts them.
const (
	typeNormal  = 1
	typeUnknown = 2
	typeControl = 3
	typeByte    = 6
)

const space = "▁" // SentencePiece's space

// FitVocab learns merges by byte-pair encoding over texts until the
// vocabulary holds size tokens. No merge holds a digit: a figure is one
// token a digit wherever it stands, so that 0.47 and 0.44 share their
// first tokens and a model compares them digit by digit. Merges across
// fields of frequent rows ("▁0.0▁-▁2", "2▁ready▁none▁8▁8") had made the same
// figure a different token in each context. A newline ends a token but never starts
// or sits inside one (each text is split after its newlines before
// counting), so that no token spans the end of a prompt and the start of
// its answer, or an answer's last newline (where the Modelfile stops)
// and the next example: the model meets at serving the tokens it met in
// training there. A newline may end one, so that the prompt's last token
// is "<|im_start|>assistant\n", which is followed by nothing but answers:
// a first model whose newlines were tokens of their own answered every
// prompt with one more newline (a newline is followed by one oftener than
// by anything else).
func FitVocab(texts []string, size int) Vocab {
	v := Vocab{Tokens: []string{"<unk>", "<s>", "</s>"}, Types: []int32{typeUnknown, typeControl, typeControl}, Scores: []float32{0, 0, 0}}
	for b := range 256 {
		v.Tokens = append(v.Tokens, fmt.Sprintf("<0x%02X>", b))
		v.Types = append(v.Types, typeByte)
		v.Scores = append(v.Scores, 0)
	}
	ids := map[string]int32{}
	var strs []string
	sym := func(s string) int32 {
		if id, ok := ids[s]; ok {
			return id
		}
		ids[s] = int32(len(strs))
		strs = append(strs, s)
		return ids[s]
	}
	var seqs [][]int32
	for _, t := range texts {
		for _, line := range strings.SplitAfter(strings.ReplaceAll(t, " ", space), "\n") {
			var seq []int32
			for _, r := range line {
				seq = append(seq, sym(string(r)))
			}
			if len(seq) > 1 {
				seqs = append(seqs, seq)
			}
		}
	}
	chars := append([]string(nil), strs...)
	sort.Strings(chars)
	for _, c := range chars {
		v.Tokens = append(v.Tokens, c)
		v.Types = append(v.Types, typeNormal)
		v.Scores = append(v.Scores, 0)
	}
	inVocab := map[string]bool{}
	for _, t := range v.Tokens {
		inVocab[t] = true
	}
	for rank := 1; len(v.Tokens) < size; rank++ {
		counts := map[uint64]int{}
		for _, s := range seqs {
			for i := 0; i+1 < len(s); i++ {
				counts[uint64(s[i])<<32|uint64(s[i+1])]++
			}
		}
		var best uint64
		most := 1
		for k, n := range counts {
			if m := strs[int32(k>>32)] + strs[int32(k&0xffffffff)]; (n > most || n == most && k < best) && !controlLike(m) && !strings.ContainsAny(m, "0123456789") {
				best, most = k, n
			}
		}
		if most < 2 {
			break
		}
		a, b := int32(best>>32), int32(best&0xffffffff)
		merged := strs[a] + strs[b]
		m := sym(merged)
		for i, s := range seqs {
			out := s[:0]
			for j := 0; j < len(s); j++ {
				if j+1 < len(s) && s[j] == a && s[j+1] == b {
					out = append(out, m)
					j++
					continue
				}
				out = append(out, s[j])
			}
			seqs[i] = out
		}
		if !inVocab[merged] {
			inVocab[merged] = true
			v.Tokens = append(v.Tokens, merged)
			v.Types = append(v.Types, typeNormal)
			v.Scores = append(v.Scores, -float32(rank))
		}
	}
	return v
}

// controlLike: llama.cpp takes a token that looks like "<...>" for a
// control token whatever its type ("control-looking token ... its type
// will be overridden"), and neither reads it from text nor writes it
// back; such merges are never made, so that "<|im_end|>" stays text.
func controlLike(s string) bool {
	return strings.HasPrefix(s, "<") && strings.HasSuffix(s, ">")
}

// Tokenizer is Ollama's own SentencePiece tokenizer over v, as the
// server will run it: no BOS (the GGUF says add_bos_token false, so
// that llama-finetune, which adds one only at the start of its whole
// text, and Ollama, at the start of each prompt, agree).
func (v Vocab) Tokenizer() tokenizer.SentencePiece {
	return tokenizer.NewSentencePiece(&tokenizer.Vocabulary{Values: v.Tokens, Types: v.Types, Scores: v.Scores,
		BOS: []int32{1}, EOS: []int32{2}})
}

// Count is how many tokens text takes under v.
func (v Vocab) Count(tok tokenizer.SentencePiece, text string) int {
	ids, err := tok.Encode(text, false)
	if err != nil {
		return 0
	}
	return len(ids)
}

// ReadVocab reads the vocabulary of a GGUF written with one.
func ReadVocab(path string) (Vocab, error) {
	f, err := gguf.Open(path)
	if err != nil {
		return Vocab{}, fmt.Errorf("dataset: %w", err)
	}
	defer f.Close()
	v := Vocab{Tokens: f.KeyValue("tokenizer.ggml.tokens").Strings()}
	for _, t := range f.KeyValue("tokenizer.ggml.token_type").Ints() {
		v.Types = append(v.Types, int32(t))
	}
	for _, s := range f.KeyValue("tokenizer.ggml.scores").Floats() {
		v.Scores = append(v.Scores, float32(s))
	}
	if len(v.Tokens) == 0 || len(v.Types) != len(v.Tokens) || len(v.Scores) != len(v.Tokens) {
		return Vocab{}, fmt.Errorf("dataset: %s: %d tokens, %d types, %d scores", path, len(v.Tokens), len(v.Types), len(v.Scores))
	}
	return v, nil
}
