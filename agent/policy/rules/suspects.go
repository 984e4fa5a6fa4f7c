package rules

import (
	"fmt"
	"sort"

	"github.com/hapilot/hapilot/agent"
)

// The suspects are what the windows show and the rules cannot decide
// alone: the servers a policy above the rules (the LLM policy) is asked
// about. They are found with the operator's Config, so that raising
// --rules-min-ratio or --rules-min-requests raises what a model's drain
// must show too.

// LooseAlpha is the loose test's family-wise significance: suspicious,
// not yet significant at the rules' own Alpha.
const LooseAlpha = 0.05

// Thresholds of the signals that are not the error test's. The rules'
// latency test compares medians (LatencyRatio); a suspect is flagged on
// its tail, well before that: a p95 over SuspectLatencyRatio times the
// serving servers' median p95, plus SuspectLatencyMinMs.
const (
	SuspectLatencyRatio = 2
	SuspectLatencyMinMs = 5
	// SuspectBusy is the share of its maxconn a server must keep busy to
	// be flagged for overload.
	SuspectBusy = 0.8
)

// Loose is the operator's test relaxed to find the grey zone: Alpha
// LooseAlpha (or the rules' own, if looser), half the volumes, and a
// ratio halfway from 1 to MinRatio. At the defaults this is the loose
// test the LLM policy has always used (0.05, 50 requests, 3 errors,
// ratio 1.5).
func (c Config) Loose() Config {
	return Config{Alpha: max(LooseAlpha, c.Alpha), MinRequests: c.MinRequests / 2, MinErrors: (c.MinErrors + 1) / 2,
		MinRatio: 1 + (c.MinRatio-1)/2}
}

// Signal is what makes the windows flag a server as a suspect.
type Signal string

const (
	SignalErrors   Signal = "errors"   // the loose test, short of the strict one
	SignalLatency  Signal = "latency"  // p95 over SuspectLatencyRatio times the serving servers' median
	SignalOverload Signal = "overload" // SuspectBusy of its maxconn busy
)

// Suspect is why the windows flag a server: every signal that does, and
// the first one's figures, which a prompt shows.
type Suspect struct {
	Why     string
	Signals []Signal
}

// Only says whether sig is the one signal that flags the server.
func (s Suspect) Only(sig Signal) bool { return len(s.Signals) == 1 && s.Signals[0] == sig }

// Suspects maps a server to why it should be looked at: errors in the
// grey zone (the Loose test flags it), latency, or overload. Servers in
// decided (those the rules act on this step) are the rules' already.
func (c Config) Suspects(obs agent.Observation, decided map[agent.Key]bool) map[agent.Key]Suspect {
	loose := New(c.Loose())
	enough := loose.Config.MinRequests
	out := map[agent.Key]Suspect{}
	add := func(k agent.Key, sig Signal, why string) {
		if decided[k] {
			return
		}
		s, seen := out[k]
		if !seen {
			s.Why = why
		}
		s.Signals = append(s.Signals, sig)
		out[k] = s
	}
	for _, b := range obs.Backends {
		for _, f := range loose.Test(b) {
			if f.Outlier {
				add(agent.Key{Backend: b.Name, Server: f.Server}, SignalErrors, fmt.Sprintf("errors %.2f%% vs peers %.2f%%, p=%.2g", 100*f.Rate, 100*f.PeerRate, f.P))
			}
		}
		var p95 []int
		for _, s := range b.Servers {
			if s.Serving() && s.Window.Requests >= enough {
				p95 = append(p95, s.Window.P95Ms)
			}
		}
		for _, s := range b.Servers {
			k := s.Key()
			if len(p95) >= 2 && s.Serving() && s.Window.Requests >= enough && s.Window.P95Ms > SuspectLatencyRatio*median(p95)+SuspectLatencyMinMs {
				add(k, SignalLatency, fmt.Sprintf("latency: p95 %d ms vs the median %d ms", s.Window.P95Ms, median(p95)))
			}
			if u := s.Busy(s.Recent.RatePerSec); u >= SuspectBusy && s.Serving() {
				add(k, SignalOverload, fmt.Sprintf("overload: %.0f%% of maxconn %d busy", 100*u, s.MaxConn))
			}
		}
	}
	return out
}

func median(v []int) int {
	c := append([]int(nil), v...)
	sort.Ints(c)
	return c[len(c)/2]
}

// FleetWide says why s's errors do not set it apart from its backend, or
// "" when they do. The Loose test compares a server with the better half
// of its peers, so that a second fault does not mask the first; but
// where every server fails alike, the better half of a few peers is a
// low draw, and any server looks worse than it. Against all its serving
// peers together but those in apart (another fault, which would mask
// it), a faulty server must still fail MinRatio times as often, as a
// fault among healthy peers does by far. One that fails like the rest is
// not the fault, and draining it cannot help.
func (c Config) FleetWide(b *agent.BackendView, s *agent.ServerView, apart map[agent.Key]bool) string {
	if b == nil || s == nil {
		return "" // the guardrails refuse an unknown server
	}
	var peerN, peerX uint64
	for _, v := range b.Servers {
		if v.Server != s.Server && v.Serving() && !apart[v.Key()] {
			peerN += v.Window.Requests
			peerX += v.Window.Err5xx
		}
	}
	if peerN == 0 || s.Window.Requests == 0 {
		return "" // no peer left with traffic: the loose test's comparison stands
	}
	rate := s.Window.ErrorRate()
	peers := float64(peerX) / float64(peerN)
	if rate >= c.MinRatio*peers {
		return ""
	}
	return fmt.Sprintf("errors %.2f%% (%d/%d) against %.2f%% (%d/%d) for its unflagged serving peers together, under %gx theirs: the backend fails alike",
		100*rate, s.Window.Err5xx, s.Window.Requests, 100*peers, peerX, peerN, c.MinRatio)
}
