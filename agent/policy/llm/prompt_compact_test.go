package llm

import (
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/hapilot/hapilot/agent"
	"github.com/hapilot/hapilot/agent/policy/llm/calibrate/fixtures"
	"github.com/hapilot/hapilot/agent/policy/llm/prompt"
)

var update = flag.Bool("update", false, "rewrite testdata/*.golden")

// The compact and numbered prompts of TestPromptRows' situation, as
// golden files: the rows that decide, notes in a few words, the history,
// and in the numbered form each row's and backend's reference.
func TestCompactPromptGolden(t *testing.T) {
	for _, style := range []prompt.Style{prompt.Compact, prompt.Numbered} {
		t.Run(string(style), func(t *testing.T) {
			in := rowsInput()
			in.Style = style
			got := prompt.Render(in)
			path := filepath.Join("testdata", "prompt-"+string(style)+".golden")
			if *update {
				if err := os.WriteFile(path, []byte(got), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			want, err := os.ReadFile(path)
			if err != nil {
				t.Fatalf("%v (go test ./agent/policy/llm -run CompactPromptGolden -update writes it)", err)
			}
			if got != string(want) {
				t.Errorf("%s prompt:\n%s\nwant:\n%s", style, got, want)
			}
		})
	}
}

// Over every calibration step, the compact prompt names each server the
// full one flags or the agent holds, shows at most CompactShown unflagged
// rows a backend, and is at most half as long as the full one with its
// system prompt.
func TestCompactPromptKeepsWhatDecides(t *testing.T) {
	var full, compact int
	for _, seq := range fixtures.Sequences(time.Unix(5000, 0)) {
		for i, st := range seq.Steps {
			cands := map[agent.Key]string{}
			for key := range st.Expected {
				if _, ks, ok := strings.Cut(key, " "); ok {
					if b, s, ok := strings.Cut(ks, "/"); ok {
						cands[agent.Key{Backend: b, Server: s}] = "errors"
					}
				}
			}
			in := prompt.Input{Obs: st.Obs, Candidates: cands, MaxShown: 12, Only: map[string]bool{}}
			for _, b := range st.Obs.Backends {
				in.Only[b.Name] = true
			}
			f := prompt.Render(in)
			in.Style = prompt.Compact
			c := prompt.Render(in)
			full += len(prompt.DefaultSystemPrompt) + len(f)
			compact += len(prompt.CompactSystemPrompt) + len(c)
			for _, b := range st.Obs.Backends {
				rows := 0
				for _, s := range b.Servers {
					_, flagged := cands[s.Key()]
					shown := strings.Contains(c, "\n"+s.Server+" ")
					if (flagged || s.Owner == agent.OwnerAgent) && !shown {
						t.Errorf("%s, step %d: %s/%s missing from the compact prompt:\n%s", seq.Name, i+1, b.Name, s.Server, c)
					}
					if shown && !flagged && s.Owner != agent.OwnerAgent {
						rows++
					}
				}
				if rows > prompt.CompactShown {
					t.Errorf("%s, step %d: %d unflagged rows of %s shown", seq.Name, i+1, rows, b.Name)
				}
			}
		}
	}
	t.Logf("calibration's prompts with their system prompt: full %d bytes, compact %d (%.0f%%)", full, compact, 100*float64(compact)/float64(full))
	if 2*compact > full {
		t.Errorf("compact prompts are %d bytes against the full ones' %d: want at most half", compact, full)
	}
}
