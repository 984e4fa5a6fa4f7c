package telemetry

import (
	"strings"
	"testing"
	"time"

	"github.com/hapilot/hapilot/internal/ingest/counters"
	"github.com/hapilot/hapilot/internal/ingest/spoe"
	"github.com/hapilot/hapilot/internal/lib/window"
)

// While no path has recorded a response, the warning names each path
// and the fix; a response from any path ends it.
func TestNoResponse(t *testing.T) {
	for _, tc := range []struct {
		name    string
		spoeAt  string
		counts  bool
		want    []string
		respond func(p *Paths)
	}{
		{"SPOE", "127.0.0.1:9", false, []string{"no response reported by HAProxy in 30s, through SPOE at 127.0.0.1:9", "holds the stanza"},
			func(p *Paths) { p.SPOE.Counters.Events.Add(1) }},
		{"counters only", "off", true, []string{"HAProxy's counters through /run/haproxy/admin.sock", "check that the backends take traffic"},
			func(p *Paths) { p.Stats.Counters.Answers.Add(1) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := &Paths{SPOEAt: addr(t, tc.spoeAt), SPOE: &spoe.Server{}, Sockets: []string{"/run/haproxy/admin.sock"}}
			if tc.counts {
				p.Stats = &counters.StatPoller{Mode: counters.StatCounts}
			}
			p.Cover(window.New(time.Minute, 16, nil))
			w := p.NoResponse(30 * time.Second)
			for _, s := range tc.want {
				if !strings.Contains(w, s) {
					t.Errorf("warning %q lacks %q", w, s)
				}
			}
			tc.respond(p)
			if w := p.NoResponse(30 * time.Second); w != "" {
				t.Errorf("still warned after a response: %q", w)
			}
		})
	}
}
