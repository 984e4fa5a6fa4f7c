package dataset

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/hapilot/hapilot/agent"
	"github.com/hapilot/hapilot/agent/policy/llm/modelapi"
	"github.com/hapilot/hapilot/agent/policy/llm/prompt"
	"github.com/hapilot/hapilot/internal/lab/modelserver"
	"github.com/ollama/ollama/tokenizer"
)

// Recipe is everything `make model` draws from a seed: the examples, the
// vocabulary, the initial weights' shape, and the penalty.
type Recipe struct {
	Seed     uint64
	Examples int // examples drawn (the penalty set repeats some of them)
	VocabFit int // examples the vocabulary is fitted on
	// Vocab is how many tokens the vocabulary holds; at most the base
	// tokens and the characters the texts use (0 does), there are no
	// merges: one token a character.
	Vocab int
	Spec  modelserver.Spec
	// Prompt is the prompt's style the examples are rendered in.
	Prompt prompt.Style
	// Pack, when set, is llama-finetune's -c: the training text is laid
	// out in units of Pack/2 tokens (its stride), each of whole examples
	// and filled out with newlines, so that no chunk it trains on cuts an
	// example: an answer cut from its prompt teaches nothing.
	Pack int
	// Penalty is how many times an example that flags a healthy server
	// appears in the penalty set: the cost of draining a healthy server,
	// against a missed fault's 1.
	Penalty int
	// Draw: how situations are drawn beyond the seed (frozen ones, and
	// maxconn outside overload).
	Draw
}

// Draw is how situations are drawn beyond the seed.
type Draw struct {
	// Frozen: one calibration-style situation in Frozen runs with its
	// plans never taking effect (0: none), so that a history line saying
	// "not in force" comes before the same action again.
	Frozen int
	// Unlimited: outside overload situations every backend has a maxconn,
	// at an ordinary load, but one in Unlimited; 0 gives none of them one
	// (the fifth attempt's data: its model read any util figure as
	// overload). The sixth and seventh attempts drew 3, and the committed
	// models trained on the seventh's data.
	Unlimited int
	// SlowBelow: one latency situation in SlowBelow draws its slowdown
	// at 2.5 to 5 times its peers', below the rules' peer test (a median
	// 5 times its peers'), which the candidates' looser test (a p95 over
	// twice the median) flags and only a model can judge; 0 draws every
	// slowdown at 2.5 to 25 times, as the committed hapilot-tiny's data
	// did (about one in nine below 5).
	SlowBelow int
}

// DefaultRecipe is hapilot-bench dataset's defaults, small and quick to
// draw; internal/lab/models/recipe.env sets hapilot-tiny's.
func DefaultRecipe() Recipe {
	return Recipe{Seed: 1, Examples: 3000, VocabFit: 300, Vocab: 768, Penalty: 3, Draw: Draw{Frozen: 8}, Prompt: prompt.Compact, Pack: 1024,
		Spec: modelserver.Spec{Layers: 2, Width: 64, Heads: 4, FF: 192, ContextLength: 3072, Train: true}}
}

// Stats is what Build wrote, for the recipe's log.
type Stats struct {
	Recipe   Recipe         `json:"recipe"`
	Examples int            `json:"examples"`
	Kinds    map[string]int `json:"kinds"`
	Actions  map[string]int `json:"actions"`
	// AfterHistory: the answers of the examples whose prompt holds a
	// history line ("you: step 1: drain ..."), by action. A model that
	// sees history mostly before no_op learns to stop at it.
	AfterHistory    map[string]int `json:"after_history"`
	Suspicious      int            `json:"suspicious"`
	Tokens          int            `json:"tokens"`
	PenaltyExamples int            `json:"penalty_examples"`
	PenaltyTokens   int            `json:"penalty_tokens"`
	// PenaltySuspicious: examples of the penalty set that flag a healthy
	// server (Suspicious counts them in train.txt).
	PenaltySuspicious int `json:"penalty_suspicious"`
	MaxTokens         int `json:"max_example_tokens"`
	// Blocks: how many units of Recipe.Pack/2 tokens train.txt holds;
	// PenaltyBlocks, train-penalty.txt (the same budget, or one short
	// where the tokens ran out first).
	Blocks        int `json:"blocks,omitempty"`
	PenaltyBlocks int `json:"penalty_blocks,omitempty"`
	// TooLong: examples left out of both sets, longer than a unit.
	TooLong      int     `json:"too_long,omitempty"`
	MeanTokens   float64 `json:"mean_example_tokens"`
	AnswerTokens float64 `json:"mean_answer_tokens"`
}

// Build writes into dir: init.gguf (the initial weights with the fitted
// vocabulary), examples.jsonl (every example as token ids, for train.py),
// train.txt (every example once) and train-penalty.txt (the same
// examples, those that flag a healthy server Penalty times, shuffled and
// cut to train.txt's token count: the same data and budget) for
// llama-finetune, vocab.json and stats.json. Progress goes to log.
func Build(dir string, r Recipe, newPolicy NewPolicy, log io.Writer) (*Stats, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	fmt.Fprintf(log, "dataset: drawing %d examples (seed %d)\n", r.Examples, r.Seed)
	ex, err := Generate(r.Seed, r.Examples, r.Prompt, r.Draw, newPolicy)
	if err != nil {
		return nil, err
	}
	var fit []string
	for _, e := range ex[:min(r.VocabFit, len(ex))] {
		fit = append(fit, e.Text())
	}
	fmt.Fprintf(log, "dataset: fitting a %d-token vocabulary on %d examples\n", r.Vocab, len(fit))
	v := FitVocab(fit, r.Vocab)
	tok := v.Tokenizer()
	st := &Stats{Recipe: r, Examples: len(ex), Kinds: map[string]int{}, Actions: map[string]int{}, AfterHistory: map[string]int{}}
	counts := make([]int, len(ex))
	answers := 0
	for i, e := range ex {
		counts[i] = v.Count(tok, e.Text())
		answers += v.Count(tok, e.Answer)
		st.Tokens += counts[i]
		st.MaxTokens = max(st.MaxTokens, counts[i])
		st.Kinds[string(e.Kind)]++
		st.Actions[e.Action()]++
		if e.HasHistory() {
			st.AfterHistory[e.Action()]++
		}
		if e.Suspicious {
			st.Suspicious++
		}
	}
	st.MeanTokens = float64(st.Tokens) / float64(len(ex))
	st.AnswerTokens = float64(answers) / float64(len(ex))
	if st.MaxTokens > r.Spec.ContextLength {
		return nil, fmt.Errorf("dataset: an example of %d tokens exceeds the model's context %d", st.MaxTokens, r.Spec.ContextLength)
	}
	pk := packer{size: r.Pack}
	var plain strings.Builder
	for i, e := range ex {
		if pk.tooLong(counts[i]) {
			st.TooLong++
			continue
		}
		pk.add(&plain, e.Text(), counts[i])
	}
	pk.close(&plain)
	st.Blocks = pk.blocks
	// The penalty set: the same examples, each suspicious one Penalty
	// times, in a shuffled order, cut at train.txt's token count.
	var order []int
	for i, e := range ex {
		n := 1
		if e.Suspicious {
			n = max(1, r.Penalty)
		}
		for range n {
			order = append(order, i)
		}
	}
	rng := rand.New(rand.NewPCG(r.Seed, 0x70656e616c7479))
	rng.Shuffle(len(order), func(i, j int) { order[i], order[j] = order[j], order[i] })
	var pen strings.Builder
	pp := packer{size: r.Pack}
	for _, i := range order {
		if pp.tooLong(counts[i]) {
			continue
		}
		if st.PenaltyTokens+counts[i] > st.Tokens || (r.Pack > 0 && pp.wouldOpen(counts[i]) && pp.blocks >= st.Blocks) {
			break
		}
		pp.add(&pen, ex[i].Text(), counts[i])
		st.PenaltyTokens += counts[i]
		st.PenaltyExamples++
		if ex[i].Suspicious {
			st.PenaltySuspicious++
		}
	}
	pp.close(&pen)
	st.PenaltyBlocks = pp.blocks
	spec := r.Spec
	spec.Vocabulary = &modelserver.Vocabulary{Tokens: v.Tokens, Types: v.Types, Scores: v.Scores}
	if err := modelserver.WriteGGUF(filepath.Join(dir, "init.gguf"), spec); err != nil {
		return nil, err
	}
	for name, text := range map[string]string{"train.txt": plain.String(), "train-penalty.txt": pen.String()} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(text), 0o644); err != nil {
			return nil, err
		}
	}
	if err := writeTokens(filepath.Join(dir, "examples.jsonl"), ex, tok); err != nil {
		return nil, err
	}
	vb, _ := json.Marshal(v)
	if err := os.WriteFile(filepath.Join(dir, "vocab.json"), vb, 0o644); err != nil {
		return nil, err
	}
	b, _ := json.MarshalIndent(st, "", "  ")
	if err := os.WriteFile(filepath.Join(dir, "stats.json"), append(b, '\n'), 0o644); err != nil {
		return nil, err
	}
	fmt.Fprintf(log, "dataset: %d examples, %d tokens (mean %.0f, max %d, answers %.1f); penalty set %d examples, %d tokens\n",
		st.Examples, st.Tokens, st.MeanTokens, st.MaxTokens, st.AnswerTokens, st.PenaltyExamples, st.PenaltyTokens)
	if r.Pack > 0 {
		fmt.Fprintf(log, "dataset: %d units of %d tokens (llama-finetune's stride at -c %d); %d examples longer than a unit left out\n", st.Blocks, r.Pack/2, r.Pack, st.TooLong)
	}
	return st, nil
}

// TokenExample is one line of examples.jsonl: an example as token ids
// under the fitted vocabulary, for a trainer that takes its loss on the
// answer alone (train.py): Ids[AnswerAt:] is the answer and the newline
// the Modelfile stops at, Ids[:AnswerAt] the prompt Ollama sends.
type TokenExample struct {
	Ids        []int32 `json:"ids"`
	AnswerAt   int     `json:"answer_at"`
	Suspicious bool    `json:"suspicious,omitempty"`
	// ActsAfterHistory: the prompt holds a history line and the answer
	// acts. train.py's --history weighs these: in the sixth attempt's
	// data 117 of 902 examples after a history line acted, and its model
	// answered no_op after one in calibration.
	ActsAfterHistory bool `json:"acts_after_history,omitempty"`
	Kind             Kind `json:"kind"`
}

// writeTokens writes every example to path as a TokenExample. The prompt
// and the answer are tokenized apart, as the server sees them (it
// tokenizes the prompt and then generates), and together, as a trainer
// reads them; they must agree, or the trainer would learn an answer that
// starts with tokens the server never has in front of it.
func writeTokens(path string, ex []Example, tok tokenizer.SentencePiece) error {
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	for i, e := range ex {
		prompt, err := tok.Encode(e.Prompt(), false)
		if err != nil {
			return fmt.Errorf("dataset: example %d: %w", i, err)
		}
		whole, err := tok.Encode(e.Text(), false)
		if err != nil {
			return fmt.Errorf("dataset: example %d: %w", i, err)
		}
		if len(whole) <= len(prompt) || !slices.Equal(whole[:len(prompt)], prompt) {
			return fmt.Errorf("dataset: example %d: its prompt tokenizes differently alone (%d tokens) and before its answer", i, len(prompt))
		}
		if err := enc.Encode(TokenExample{Ids: whole, AnswerAt: len(prompt), Suspicious: e.Suspicious,
			ActsAfterHistory: e.HasHistory() && e.Acts(), Kind: e.Kind}); err != nil {
			return err
		}
	}
	if err := os.WriteFile(path, b.Bytes(), 0o644); err != nil {
		return fmt.Errorf("dataset: %w", err)
	}
	return nil
}

// packer lays examples out in units of size/2 tokens: llama-finetune
// cuts its text into chunks of -c tokens at a stride of half that, so a
// chunk is two units, and with every unit of whole examples no chunk cuts
// one. An example longer than a unit fits none. size 0 writes the
// examples one after another.
type packer struct {
	size, used, blocks int
}

func (p *packer) unit() int { return p.size / 2 }

// tooLong: an example of n tokens fits no unit.
func (p *packer) tooLong(n int) bool { return p.size > 0 && n > p.unit() }

// wouldOpen: an example of n tokens would start a new unit.
func (p *packer) wouldOpen(n int) bool { return p.size > 0 && (p.used == 0 || p.used+n > p.unit()) }

func (p *packer) add(b *strings.Builder, text string, n int) {
	if p.size > 0 {
		if p.used > 0 && p.used+n > p.unit() {
			p.close(b)
		}
		if p.used == 0 {
			p.blocks++
		}
		p.used += n
	}
	b.WriteString(text)
}

// close fills the open unit with newlines, one token each (the
// vocabulary has "\n" as a token of its own, and no token holds one but
// at its end).
func (p *packer) close(b *strings.Builder) {
	if p.size > 0 && p.used > 0 {
		b.WriteString(strings.Repeat("\n", p.unit()-p.used))
		p.used = 0
	}
}

// Finish writes the servable GGUF out from trained, the GGUF train.py
// or llama-finetune trained from dir's dataset: the recipe's keys,
// prompt form and vocabulary (dir's stats.json and vocab.json) with the
// trained weights (modelserver.WriteTrained says why).
func Finish(dir, trained, out string) error {
	var st Stats
	var v Vocab
	for name, into := range map[string]any{"stats.json": &st, "vocab.json": &v} {
		b, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil {
			return fmt.Errorf("dataset: %w", err)
		}
		if err := json.Unmarshal(b, into); err != nil {
			return fmt.Errorf("dataset: %s: %w", name, err)
		}
	}
	spec := st.Recipe.Spec
	spec.Vocabulary = &modelserver.Vocabulary{Tokens: v.Tokens, Types: v.Types, Scores: v.Scores}
	// The model names the prompt form it is trained on, so that the
	// agent calls it with that form without --llm-prompt.
	// And its own name (the file's), not the generator's default.
	spec.Meta = map[string]string{modelapi.PromptFormKey: string(st.Recipe.Prompt),
		"general.name": strings.TrimSuffix(filepath.Base(out), ".gguf")}
	return modelserver.WriteTrained(out, spec, trained)
}

// Action is the verb of the example's answer.
func (e Example) Action() string {
	var r struct {
		Actions []answer `json:"actions"`
	}
	if json.Unmarshal([]byte(e.Answer), &r) != nil || len(r.Actions) == 0 {
		return noAction
	}
	return r.Actions[0].Action
}

// Acts tells whether the answer changes a server (a drain, a cut, a
// ready), not no_op or nothing.
func (e Example) Acts() bool {
	a := e.Action()
	return a != agent.VerbNoOp && a != noAction
}

// noAction is Action's answer for a reply with no action (or no JSON).
const noAction = "none"
