package bench

import (
	"flag"
	"io"
	"path/filepath"
	"testing"

	"github.com/hapilot/hapilot/agent/policy/llm"
	"github.com/hapilot/hapilot/cmd/hapilot/config"
	"github.com/hapilot/hapilot/cmd/hapilot/daemon"
	"github.com/rs/zerolog"
)

// The study's loop is built by the lab from the agent's parts, with every
// protection off; the same settings through daemon.New keep them all on.
func TestStudyLoop(t *testing.T) {
	parse := func(args ...string) config.Config {
		fs := flag.NewFlagSet("t", flag.ContinueOnError)
		fs.SetOutput(io.Discard)
		c := config.Register(fs)
		dir := t.TempDir()
		own := []string{"--state-file", filepath.Join(dir, "state.json"), "--control-socket", "unix:" + filepath.Join(dir, "ctl.sock"),
			"--spoe-listen", "127.0.0.1:0", "--status-listen", "off", "--haproxy-socket", filepath.Join(dir, "missing.sock")}
		if err := config.Parse(fs, append(own, args...)); err != nil {
			t.Fatal(err)
		}
		return *c
	}
	if _, err := StudyLoop(parse("--policy", "rules"), zerolog.Nop()); err == nil {
		t.Fatal("built the study's loop around the rules")
	}
	model := []string{"--policy", "llm", "--model", "m", "--ollama-host", "127.0.0.1:1"}
	tests := []struct {
		name  string
		build func(config.Config, zerolog.Logger) (*daemon.Daemon, error)
		study bool
	}{
		{"hapilot run", daemon.New, false},
		{"the study's loop", StudyLoop, true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			d, err := tc.build(parse(model...), zerolog.Nop())
			if err != nil {
				t.Fatal(err)
			}
			defer d.Close()
			p, ok := d.Loop.Policy.Decider.(*llm.Policy)
			if !ok {
				t.Fatalf("policy %T, want *llm.Policy", d.Loop.Policy.Decider)
			}
			unguarded := map[string]bool{
				"no step budget":    d.Loop.NoStepBudget,
				"no floor":          p.Floor.Decider == nil,
				"no evidence check": p.NoEvidenceCheck,
				"no calibration":    p.Admit == nil,
				"confirm 1":         p.Config.Confirm == 1,
				"gate always":       p.Config.Gate == llm.GateAlways,
				"no hold":           p.Config.MinHold == 0,
				"thinking kept":     p.Config.ThinkRetry == 0,
			}
			for what, is := range unguarded {
				if is != tc.study {
					t.Errorf("%s: %v, want %v", what, is, tc.study)
				}
			}
		})
	}
}
