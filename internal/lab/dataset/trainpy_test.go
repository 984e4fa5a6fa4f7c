//go:build modelserver

package dataset

import (
	"context"
	"io"
	"os"
	"os/exec"
	"path/filepath"
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
	if out, err := exec.Command(python, "-c", "import torch").CombinedOutput(); err != nil {
		err = &exec.Error{Name: python + " -c 'import torch'", Err: err}
		if modelserver.Required() {
			t.Fatalf("%v: %s; apt-get install python3-torch libopenblas0-pthread", err, out)
		}
		t.Skipf("%v: %s (HAPILOT_REQUIRE_MODELSERVERS=1 makes this a failure)", err, out)
	}
	r := DefaultRecipe()
	r.Examples, r.VocabFit, r.Vocab = 200, 60, 400
	dir := t.TempDir()
	if _, err := Build(dir, r, io.Discard); err != nil {
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
