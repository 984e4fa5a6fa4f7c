//go:build modelserver

package dataset

import (
	"context"
	"encoding/json"
	"github.com/hapilot/hapilot/internal/lab/llmprompts"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/hapilot/hapilot/internal/lab/modelserver"
)

// python is the interpreter make model runs train.py with: Debian's, where
// python3-torch installs PyTorch.
const python = "/usr/bin/python3"

// The training pipeline end to end on a small dataset: train.py trains a
// model on the answer tokens for one epoch, Finish writes it servable, and
// the real llama-server, given each held-out prompt's token ids, answers
// greedily what PyTorch answers, token for token (check.py), for at least
// 8 of 10 (two float32 sums in another order can swap a near tie). A slip
// in train.py's GGUF (a tensor transposed, RoPE on the wrong pairs) serves
// other answers than the ones it trained, and fails here.
func TestTrainPyServesWhatItTrained(t *testing.T) {
	modelserver.RequireLlama(t)
	requireTorch(t)
	r := DefaultRecipe()
	r.Examples, r.VocabFit, r.Vocab = 200, 60, 400
	dir := t.TempDir()
	if _, err := Build(dir, r, llmprompts.New, io.Discard); err != nil {
		t.Fatal(err)
	}
	models := filepath.Join("..", "models")
	trained := filepath.Join(dir, "trained.gguf")
	run := func(script string, args ...string) string {
		t.Helper()
		cmd := exec.Command(python, append([]string{filepath.Join(models, script)}, args...)...)
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("%s: %v\n%s", script, err, out)
		}
		t.Logf("%s:\n%s", script, out)
		return string(out)
	}
	run("train.py", "--work", dir, "--out", trained, "--epochs", "2", "--val", "0.1", "--threads", "1")
	servable := filepath.Join(dir, "served.gguf")
	if err := Finish(dir, trained, servable); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	s, err := modelserver.StartLlamaServer(ctx, servable, 2048)
	if err != nil {
		t.Fatalf("start llama-server: %v", err)
	}
	defer s.Stop()
	out := run("check.py", "--work", dir, "--gguf", trained, "--server", s.URL, "--n", "10", "--min", "0.8")
	if !strings.Contains(out, " of 10 held-out answers the same") {
		t.Fatalf("check.py did not compare 10 answers:\n%s", out)
	}
	if _, err := os.Stat(trained + ".tmp"); err == nil {
		t.Fatalf("train.py left %s.tmp behind", trained)
	}
}

func requireTorch(t *testing.T) {
	t.Helper()
	if out, err := exec.Command(python, "-c", "import torch").CombinedOutput(); err != nil {
		err = &exec.Error{Name: python + " -c 'import torch'", Err: err}
		if modelserver.Required() {
			t.Fatalf("%v: %s; apt-get install python3-torch libopenblas0-pthread", err, out)
		}
		t.Skipf("%v: %s (HAPILOT_REQUIRE_MODELSERVERS=1 makes this a failure)", err, out)
	}
}

// train.py's loss weighs each example's answer tokens, and only those:
// 1, the penalty where it flags a healthy server, the history weight
// where it acts after a history line, their product where both. The two
// models of a recipe differ by the penalty alone, so a slip here would
// change what the with-and-without comparison measures.
func TestTrainPyWeighsTheAnswer(t *testing.T) {
	requireTorch(t)
	const script = `
import json, sys
sys.path.insert(0, sys.argv[1])
import train
ex = [{"ids": [1, 5, 6, 7, 8], "answer_at": 3},
      {"ids": [1, 5, 6, 7, 8], "answer_at": 3, "suspicious": True},
      {"ids": [1, 5, 6, 7, 8], "answer_at": 3, "acts_after_history": True},
      {"ids": [1, 5, 6, 7], "answer_at": 2, "suspicious": True, "acts_after_history": True}]
_, _, wt = train.tensors_of(ex, range(len(ex)), 3.0, 2.0)
print(json.dumps(wt.tolist()))
`
	out, err := exec.Command(python, "-B", "-c", script, filepath.Join("..", "models")).CombinedOutput()
	if err != nil {
		t.Fatalf("train.tensors_of: %v\n%s", err, out)
	}
	var got [][]float64
	if err := json.Unmarshal(out, &got); err != nil {
		t.Fatalf("train.tensors_of printed %q: %v", out, err)
	}
	// Position p predicts token p+1: an answer from token 3 of 5 is
	// predicted at positions 2 and 3; the fourth example's, from token 2
	// of 4, at 1 and 2, and its position 3 is padding.
	want := [][]float64{{0, 0, 1, 1}, {0, 0, 3, 3}, {0, 0, 2, 2}, {0, 6, 6, 0}}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("weights %v, want %v", got, want)
	}
}
