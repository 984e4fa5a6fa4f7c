package spoe

import "testing"

// The SPOE path names its own metrics, each reading its counter.
func TestFigures(t *testing.T) {
	var s Server
	s.Counters.Events.Add(5)
	s.Counters.Frames.Add(2)
	got := map[string]uint64{}
	for _, f := range s.Figures() {
		got[f.Metric] = f.V
	}
	if len(got) != 6 || got["hapilot_events_total"] != 5 || got["hapilot_spoe_frames_total"] != 2 || got["hapilot_ingest_errors_total"] != 0 {
		t.Fatalf("figures %v", got)
	}
}
