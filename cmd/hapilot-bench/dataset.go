package main

import (
	"context"
	"flag"
	"fmt"
	"github.com/hapilot/hapilot/internal/lab/llmprompts"
	"io"

	"github.com/hapilot/hapilot/internal/lab/dataset"
)

// cmdDataset writes the training text and initial weights of hapilot's
// own policy model (internal/lab/models): `make model` trains from them.
func cmdDataset(_ context.Context, args []string, stdout, stderr io.Writer) error {
	r := dataset.DefaultRecipe()
	fs := flag.NewFlagSet("hapilot-bench dataset", flag.ContinueOnError)
	fs.SetOutput(stderr)
	out := fs.String("out", "bin/model", "directory for init.gguf, train.txt, train-penalty.txt, examples.jsonl, vocab.json and stats.json")
	fs.Uint64Var(&r.Seed, "seed", r.Seed, "seed of the simulated situations and of the initial weights")
	fs.IntVar(&r.Examples, "examples", r.Examples, "examples to draw")
	fs.IntVar(&r.Vocab, "vocab", r.Vocab, "tokens in the fitted vocabulary (0: one a character, no merges)")
	fs.Var(&r.Prompt, "prompt", "the prompt's style the examples are rendered in: full | compact | numbered (hapilot run --llm-prompt)")
	fs.IntVar(&r.Pack, "pack", r.Pack, "lay the training text out in blocks of this many tokens, llama-finetune's -c, each of whole examples (0: one after another)")
	fs.IntVar(&r.Spec.Width, "width", r.Spec.Width, "embedding width")
	fs.IntVar(&r.Spec.Layers, "layers", r.Spec.Layers, "blocks")
	fs.IntVar(&r.Spec.FF, "ff", r.Spec.FF, "feed-forward length")
	fs.IntVar(&r.Spec.Heads, "heads", r.Spec.Heads, "attention heads")
	fs.IntVar(&r.Penalty, "penalty", r.Penalty, "times an example that flags a healthy server appears in the penalty set")
	fs.IntVar(&r.Frozen, "frozen", r.Frozen, "one calibration-style situation in this many runs with its plans never taking effect (0: none)")
	fs.IntVar(&r.Unlimited, "unlimited", r.Unlimited, "outside overload situations every backend has a maxconn at an ordinary load but one in this many (0: none has one)")
	fs.IntVar(&r.SlowBelow, "slow-below", r.SlowBelow, "one latency situation in this many draws its slowdown below the rules' peer test, at 2.5 to 5 times (0: every one at 2.5 to 25 times)")
	trained := fs.String("trained", "", "finish: the GGUF train.py or llama-finetune trained from --out's dataset, to be written servable as --gguf")
	servable := fs.String("gguf", "", "finish: the servable GGUF to write from --trained")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	if *trained != "" || *servable != "" {
		if *trained == "" || *servable == "" {
			return fmt.Errorf("--trained and --gguf go together")
		}
		return dataset.Finish(*out, *trained, *servable)
	}
	r.Spec.Seed = r.Seed
	_, err := dataset.Build(*out, r, llmprompts.New, stdout)
	return err
}
