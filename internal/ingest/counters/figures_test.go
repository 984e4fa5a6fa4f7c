package counters

import "testing"

// The stats path names its own metrics, each reading its counter.
func TestFigures(t *testing.T) {
	var p StatPoller
	p.Counters.Answers.Add(7)
	p.Counters.Reloads.Add(1)
	got := map[string]uint64{}
	for _, f := range p.Figures() {
		got[f.Metric] = f.V
	}
	if len(got) != 9 || got["hapilot_stats_answers_total"] != 7 || got["hapilot_stats_reloads_total"] != 1 {
		t.Fatalf("figures %v", got)
	}
}
