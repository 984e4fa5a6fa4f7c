package logs

import (
	"testing"

	"github.com/hapilot/hapilot/internal/lib/promtext"
)

// Each log path names its own metrics under its path's name.
func TestFigures(t *testing.T) {
	var l LineServer
	var s SyslogServer
	l.Counters.Events.Add(3)
	s.Counters.Batches.Add(4)
	for _, tc := range []struct {
		name   string
		figs   map[string]uint64
		metric string
		want   uint64
	}{
		{"lua", figures(l.Figures()), "hapilot_lua_events_total", 3},
		{"syslog", figures(s.Figures()), "hapilot_syslog_batches_total", 4},
	} {
		if len(tc.figs) != 3 || tc.figs[tc.metric] != tc.want {
			t.Errorf("%s: figures %v, want %s %d", tc.name, tc.figs, tc.metric, tc.want)
		}
	}
}

func figures(fs []promtext.Figure) map[string]uint64 {
	m := map[string]uint64{}
	for _, f := range fs {
		m[f.Metric] = f.V
	}
	return m
}
