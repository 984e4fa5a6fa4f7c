package rules

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/hapilot/hapilot/agent"
	"github.com/hapilot/hapilot/haproxy"
	"github.com/hapilot/hapilot/internal/lib/window"
)

// TestLatencyBaseline drives the rules' latency test through Evidence,
// one observation a second on an injected clock: a history of each
// server's window median, then the medians now; the servers condemned at
// the end are compared.
func TestLatencyBaseline(t *testing.T) {
	type phase struct {
		secs int
		p50  []int // each server's window median, ms
	}
	learn := int(LatencyLearn.Seconds()) + 100
	tests := []struct {
		name      string
		baseRatio float64 // LatencyBaselineRatio; -1: the default
		phases    []phase
		want      string
	}{
		{"cold start: a server 6x its peer is drained as before", -1,
			[]phase{{5, []int{10, 60}}}, "srv2"},
		{"cold start, just short of learned: still drained", -1,
			[]phase{{learn - 200, []int{10, 60}}, {5, []int{10, 60}}}, "srv2"},
		{"always 6x its peer, baseline learned: not drained", -1,
			[]phase{{learn, []int{10, 60}}, {5, []int{10, 60}}}, ""},
		{"always 3x its peer, now 6x: 2x its own baseline, not drained", -1,
			[]phase{{learn, []int{10, 30}}, {5, []int{10, 60}}}, ""},
		{"like its peer, then 5x it and its own baseline: drained", -1,
			[]phase{{learn, []int{10, 12}}, {5, []int{10, 60}}}, "srv2"},
		{"always 3x its peer, now 10x: 3.3x its own baseline, drained", -1,
			[]phase{{learn, []int{10, 30}}, {5, []int{10, 100}}}, "srv2"},
		{"slow for long after: a suspect median does not teach the baseline", -1,
			[]phase{{learn, []int{10, 12}}, {2 * learn, []int{10, 60}}}, "srv2"},
		{"fleet-wide slowdown, 10x: nothing", -1,
			[]phase{{learn, []int{10, 12, 11}}, {5, []int{100, 120, 110}}}, ""},
		{"one of three 10x slower than its learned self and its peers: drained", -1,
			[]phase{{learn, []int{10, 12, 11}}, {5, []int{10, 120, 11}}}, "srv2"},
		{"always 60x its peer (kept serving), baseline would be learned: still drained", -1,
			[]phase{{learn, []int{10, 600}}, {5, []int{10, 600}}}, "srv2"},
		{"ratio 0: the peers alone, as before", 0,
			[]phase{{learn, []int{10, 60}}, {5, []int{10, 60}}}, "srv2"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := DefaultConfig()
			if tt.baseRatio >= 0 {
				cfg.LatencyBaselineRatio = tt.baseRatio
			}
			p := New(cfg)
			at := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
			var got []agent.Key
			for _, ph := range tt.phases {
				b := agent.BackendView{Name: "app"}
				for i, ms := range ph.p50 {
					b.Servers = append(b.Servers, slowServer(fmt.Sprintf("srv%d", i+1), 300, ms))
				}
				for range ph.secs {
					at = at.Add(time.Second)
					got = p.Evidence(agent.Observation{Time: at, Backends: []agent.BackendView{b}})
				}
			}
			var names []string
			for _, k := range got {
				names = append(names, k.Server)
			}
			slices.Sort(names)
			if strings.Join(names, ",") != tt.want {
				t.Errorf("condemned %v, want %q", names, tt.want)
			}
		})
	}
}

// TestLatencyBaselineLevel: the baseline is the geometric mean of the
// medians it was taught, weighted by time, and stays unlearned (0) short
// of LatencyLearn.
func TestLatencyBaselineLevel(t *testing.T) {
	tests := []struct {
		name  string
		secs  [2]int // seconds at 10 ms, then at 40 ms
		lo, h float64
	}{
		{"not yet learned", [2]int{100, 100}, 0, 0},
		{"one level", [2]int{int(LatencyLearn.Seconds()), 0}, 9.9, 10.1},
		{"half at each: the geometric mean", [2]int{int(LatencyLearn.Seconds()) / 2, int(LatencyLearn.Seconds()) / 2}, 19.5, 20.5},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var s SeqServer
			span := DefaultConfig().BaselineSpan.Seconds()
			for k, ms := range []float64{10, 40} {
				for range tt.secs[k] {
					s.lat.add(logMs(ms), 1, span)
				}
			}
			if got := s.LatencyBaseline(); got < tt.lo || got > tt.h {
				t.Errorf("baseline %.2f ms, want %g to %g", got, tt.lo, tt.h)
			}
		})
	}
}

// TestLatencyBaselinePause: checks far apart (the loop paused) teach a
// baseline no more than a window each, so two checks ten minutes apart
// do not make it learned.
func TestLatencyBaselinePause(t *testing.T) {
	tests := []struct {
		name        string
		checks      int
		every       time.Duration
		wantLearned bool
	}{
		{"two checks ten minutes apart: not learned", 2, 10 * time.Minute, false},
		{"ten checks a minute apart: learned", 11, time.Minute, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := New(DefaultConfig())
			at := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
			b := agent.BackendView{Name: "app", Servers: []agent.ServerView{slowServer("srv1", 300, 10), slowServer("srv2", 300, 60)}}
			for range tt.checks {
				at = at.Add(tt.every)
				p.Evidence(agent.Observation{Time: at, Backends: []agent.BackendView{b}})
			}
			learned := p.seq["app"].servers["srv2"].LatencyBaseline() > 0
			if learned != tt.wantLearned {
				t.Errorf("learned %v, want %v", learned, tt.wantLearned)
			}
		})
	}
}

// TestOwnLatency: a server always slower than its peers is, once its
// baseline is learned, no slower than its own usual; one that slows down
// to 3× its usual has departed from it; before ten minutes of history
// every server has (it is judged against its peers alone, as the rules
// judge it then); a drained server keeps its baseline, a removed one
// loses it.
func TestOwnLatency(t *testing.T) {
	o := NewOwnLatency(DefaultConfig())
	t0 := time.Unix(1_700_000_000, 0)
	obs := func(sec int, slowP50 int, drained bool) agent.Observation {
		b := agent.BackendView{Name: "app"}
		for i, p50 := range []int{5, 5, 12, slowP50} {
			s := agent.ServerView{Backend: "app", Server: fmt.Sprintf("s%d", i),
				State:  haproxy.ServerState{OpState: haproxy.OpRunning, Weight: 1},
				Window: window.Stats{Requests: 2000, P50Ms: p50, P95Ms: 2 * p50}}
			if drained && i == 3 {
				s.State.AdminState = haproxy.AdminForcedDrain
			}
			b.Servers = append(b.Servers, s)
		}
		return agent.Observation{Time: t0.Add(time.Duration(sec) * time.Second), Backends: []agent.BackendView{b}}
	}
	always := agent.Key{Backend: "app", Server: "s2"}
	slows := agent.Key{Backend: "app", Server: "s3"}
	sec := 0
	for ; sec < 9*60; sec++ {
		o.Observe(obs(sec, 5, false))
	}
	if !o.Departed(always, 12) || o.usual(always) != 0 {
		t.Fatalf("9 minutes in: a baseline counted (usual %.1f ms)", o.usual(always))
	}
	for ; sec < 11*60; sec++ {
		o.Observe(obs(sec, 5, false))
	}
	if u := o.usual(always); u < 11.9 || u > 12.1 {
		t.Fatalf("the always-slower server's usual %.2f ms, want 12", u)
	}
	if o.Departed(always, 12) || o.Departed(always, 20) {
		t.Error("a server at 12 and 20 ms against its usual 12 ms read as departed from it")
	}
	// s3 slows to 15 ms, 3× its usual: departed, and its baseline does not
	// learn the fault (still departed a day of it later).
	for ; sec < 11*60+86400; sec += 10 {
		o.Observe(obs(sec, 15, false))
	}
	if !o.Departed(slows, 15) {
		t.Errorf("a server at 15 ms against its usual 5 ms (now %.1f ms) not departed", o.usual(slows))
	}
	if o.Departed(slows, 7) {
		t.Error("7 ms against a usual 5 ms read as departed (under √3×)")
	}
	// drained: no longer judged, its baseline kept
	o.Observe(obs(sec+10, 15, true))
	if o.usual(slows) == 0 {
		t.Error("a drained server lost its baseline")
	}
	o.Observe(agent.Observation{Time: t0.Add(time.Duration(sec+20) * time.Second)})
	if o.usual(slows) != 0 {
		t.Error("a server no observation holds kept its baseline")
	}
}
