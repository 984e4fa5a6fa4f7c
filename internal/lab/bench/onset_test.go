package bench

import (
	"testing"
	"time"

	"github.com/hapilot/hapilot/internal/lab/scenario"
)

// The time to detect is timed from the fault's onset, and a change
// before the onset (a healthy-time drain) does not count as detection.
func TestFirstChangeFromOnset(t *testing.T) {
	changes := map[string][]scenario.StateChange{
		"srv3": {{At: 0, State: "ready"}, {At: 12 * time.Second, State: "drain"}, {At: 40 * time.Second, State: "drain"}},
		"srv6": {{At: 0, State: "ready"}, {At: 35 * time.Second, State: "drain"}},
	}
	for _, tc := range []struct {
		name  string
		onset time.Duration
		want  float64 // -1: none
	}{
		{"from the start", 0, 12},
		{"onset at 30 s: the drain at 12 s was before it", 30 * time.Second, 5},
		{"onset after every change", time.Minute, -1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := firstChange(changes, []string{"srv3", "srv6"}, tc.onset)
			switch {
			case tc.want < 0 && got != nil:
				t.Errorf("detected at %v, want never", *got)
			case tc.want >= 0 && (got == nil || *got != tc.want):
				t.Errorf("detected at %v, want %v", got, tc.want)
			}
		})
	}
	for _, s := range Scenarios {
		if s.Name == "paper-late" && (s.OnsetStep == nil || s.OnsetStep(60) != 30) {
			t.Errorf("paper-late's faults must begin half way")
		}
	}
}
