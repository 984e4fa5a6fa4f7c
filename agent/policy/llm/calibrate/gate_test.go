package calibrate

import (
	"context"
	"strings"
	"testing"

	"github.com/hapilot/hapilot/agent"
	"github.com/hapilot/hapilot/internal/lab/ollamafake"
	"github.com/rs/zerolog"
)

// The gate lets a model act only with a passing record for its digest
// that holds for the running settings, and writes each verdict down: a
// refusal with the command that lifts it.
func TestGate(t *testing.T) {
	for _, tc := range []struct {
		name   string
		record func(m *Scorecard) // nil: no record
		want   string             // in the refusal; "" admits
		mayAct string
	}{
		{"no record", nil, "no calibration record for digest sha256:fa4e", "false"},
		{"a failed record", func(sc *Scorecard) { sc.Passed, sc.Why = false, "recall 0.40 below 0.80" }, "failed calibration: recall 0.40 below 0.80", "false"},
		{"a stale record", func(sc *Scorecard) { sc.Passed = true; sc.Key.Think = "on" }, "stale calibration record", "false"},
		{"a passing record", func(sc *Scorecard) { sc.Passed, sc.Precision, sc.Recall = true, 1, 0.9 }, "", "true"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := fakeModel(t, ollamafake.Capable, nil)
			cfg := m.Config
			cfg.CalibrationDir = t.TempDir()
			if tc.record != nil {
				sc := &Scorecard{Key: keyFor("sha256:fa4e", m)}
				tc.record(sc)
				if _, err := sc.Save(cfg.CalibrationDir); err != nil {
					t.Fatal(err)
				}
			}
			var got []agent.Event
			err := Gate(m, cfg, zerolog.Nop(), func(ev agent.Event) { got = append(got, ev) })(context.Background())
			switch {
			case tc.want == "" && err != nil:
				t.Fatalf("refused: %v", err)
			case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), "run `hapilot calibrate --model fake-capable:latest`")):
				t.Fatalf("error %v, want %q and the command", err, tc.want)
			}
			if len(got) != 1 || got[0].Type != agent.EventCalibration || got[0].Detail["may_act"] != tc.mayAct || got[0].Detail["model"] != "fake-capable:latest" {
				t.Fatalf("verdicts %+v", got)
			}
			if tc.want == "" && (got[0].Detail["digest"] != "sha256:fa4e" || got[0].Detail["recall"] != "0.90") {
				t.Fatalf("admitted without its figures: %+v", got[0])
			}
		})
	}
	if v := Skipped("m"); v.Type != agent.EventCalibration || v.Detail["may_act"] != "true" || !strings.Contains(v.Reason, "--skip-calibration") {
		t.Fatalf("skipped: %+v", v)
	}
}
