package loop

import (
	"testing"

	"github.com/hapilot/hapilot/agent"
	"github.com/hapilot/hapilot/agent/merge"
	"github.com/hapilot/hapilot/haproxy"
	"github.com/hapilot/hapilot/internal/lib/window"
)

// The places kept from step to step give each server the figures a
// lookup by name gives, as servers and series come, go and move.
func TestViewPlacesFollowServersAndSeries(t *testing.T) {
	srv := func(names ...string) []haproxy.ServerState {
		var out []haproxy.ServerState
		for _, n := range names {
			out = append(out, haproxy.ServerState{Backend: "be", Server: n})
		}
		return out
	}
	series := func(names ...string) []window.Stats {
		var out []window.Stats
		for i, n := range names {
			out = append(out, window.Stats{Backend: "be", Server: n, Requests: uint64(100 + i), Err5xx: uint64(i)})
		}
		return out
	}
	steps := []struct {
		name    string
		servers []haproxy.ServerState
		long    []window.Stats
		recent  []window.Stats
	}{
		{"first", srv("c", "a", "b"), series("a", "b", "c"), series("a", "b", "c")},
		{"same again", srv("c", "a", "b"), series("a", "b", "c"), series("a", "b", "c")},
		{"a series moves", srv("c", "a", "b"), series("b", "a", "c"), series("b", "a", "c")},
		{"a server without a series", srv("c", "a", "b", "d"), series("a", "b", "c"), series("a", "b", "c")},
		{"its series comes", srv("c", "a", "b", "d"), series("a", "b", "c", "d"), series("a", "b", "c", "d")},
		{"a server goes", srv("c", "b", "d"), series("b", "c", "d"), series("b", "c", "d")},
		{"one goes, another comes", srv("c", "b", "e"), series("b", "c", "e"), series("b", "c", "e")},
		{"a series of no server", srv("c", "b"), series("b", "c", "x"), series("b", "c", "x")},
		{"recent apart from long", srv("c", "b"), series("b", "c"), series("c")},
	}
	var p viewPlaces
	for _, st := range steps {
		w := &windowsRead{long: st.long, recent: st.recent}
		if len(w.recent) != len(w.long) {
			w.recentAt = index(w.recent)
		}
		long, recent := map[agent.Key]window.Stats{}, map[agent.Key]window.Stats{}
		for _, s := range st.long {
			long[key(s.Backend, s.Server)] = s
		}
		for _, s := range st.recent {
			recent[key(s.Backend, s.Server)] = s
		}
		entries := make([]*merge.Server, len(st.servers))
		for i, s := range st.servers {
			entries[i] = &merge.Server{State: s}
		}
		places := p.of(entries, w)
		for i, s := range st.servers {
			got := agent.ServerView{Backend: s.Backend, Server: s.Server}
			want := got
			w.setAt(&got, places[i])
			want.SetWindows(long, recent)
			if got.Window != want.Window || got.Recent != want.Recent {
				t.Errorf("%s: %s got %+v / %+v, want %+v / %+v", st.name, s.Server, got.Window, got.Recent, want.Window, want.Recent)
			}
		}
	}
}
