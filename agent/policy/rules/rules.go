// Package rules is hapilot's default policy: drain a server whose 5xx rate
// is significantly above its peers' in the same backend.
//
// The test is conditional on the errors seen: if a server and its peers
// (the better half of the other serving servers, by error rate) failed at
// the same rate, each of their x+y errors would have landed on the server
// with probability n/(n+m), its share of the requests. The server is an outlier when P(X >= x) under that binomial is
// below Alpha divided by the number of servers tested (Bonferroni). This
// needs no fixed error threshold, works for two servers as for hundreds,
// and is blind to fleet-wide failures by construction: when every server
// fails alike, no server's share of the errors departs from its share of
// the requests. Minimum volumes and a minimum ratio keep a handful of
// unlucky errors from ever being enough.
package rules

import (
	"context"
	"errors"
	"fmt"
	"math"
	"sort"

	"github.com/hapilot/hapilot/agent"
	"github.com/hapilot/hapilot/internal/stats"
)

// Config tunes the test.
type Config struct {
	// Alpha is the family-wise false-drain probability per backend per
	// step. Steps repeat every interval, so it is small.
	Alpha float64
	// MinRequests is the fewest requests a server, and its peers
	// together, must have in the window before it is judged.
	MinRequests uint64
	// MinErrors is the fewest 5xx a server must have to be drained.
	MinErrors uint64
	// MinRatio is how many times its peers' error rate a server's must
	// reach, however significant.
	MinRatio float64
	// LatencyRatio: a server whose median answer time is at least this
	// many times the median of its serving peers' medians, and at least
	// LatencyMinMs above it, is drained too (0: errors only). Medians,
	// not tails, so that a few slow answers are never enough.
	LatencyRatio float64
	LatencyMinMs int
}

// DefaultConfig is what `hapilot run` uses unless told otherwise.
func DefaultConfig() Config {
	return Config{Alpha: 1e-6, MinRequests: 100, MinErrors: 5, MinRatio: 2, LatencyRatio: 5, LatencyMinMs: 50}
}

// Policy is the rule policy.
type Policy struct{ Config Config }

// New returns a rule policy with cfg.
func New(cfg Config) *Policy { return &Policy{Config: cfg} }

// NewPolicy is the rules as the loop runs them: their decision, their
// needs and their evidence test, which lets the loop step as soon as
// the windows condemn a server.
func NewPolicy(cfg Config) agent.Policy {
	p := New(cfg)
	return agent.Policy{Decider: p, Needs: p.Needs(), Evidence: p.Evidence}
}

func (*Policy) Name() string { return "rules" }

// Needs: the rule test bounds false drains per backend and step at Alpha
// whatever N, so several significant outliers may go in one step: up to
// N/3 (the study's faulty share), floor and capacity permitting. One a
// step would take three steps to isolate the study's three faulty
// servers at N=9.
func (*Policy) Needs() agent.Needs { return agent.Needs{DrainsPer: 3} }

// Validate checks the settings an operator may give.
func (c Config) Validate() error {
	var errs []error
	for name, v := range map[string]float64{"rules-alpha": c.Alpha, "rules-min-ratio": c.MinRatio, "rules-latency-ratio": c.LatencyRatio} {
		if math.IsNaN(v) || math.IsInf(v, 0) {
			errs = append(errs, fmt.Errorf("%s %v is not a finite number", name, v))
		}
	}
	if c.Alpha <= 0 || c.Alpha >= 1 {
		errs = append(errs, fmt.Errorf("rules-alpha %v outside (0, 1)", c.Alpha))
	}
	if c.MinRatio < 1 {
		errs = append(errs, fmt.Errorf("rules-min-ratio %v below 1", c.MinRatio))
	}
	if c.LatencyRatio < 0 || c.LatencyMinMs < 0 {
		errs = append(errs, fmt.Errorf("rules-latency-ratio and rules-latency-min-ms must not be negative"))
	}
	return errors.Join(errs...)
}

// Finding is the test's result for one server.
type Finding struct {
	Server         string
	N, X           uint64 // the server's requests and 5xx
	PeerN, PeerX   uint64
	P              float64
	Rate, PeerRate float64
	Outlier        bool
}

// Decide proposes a drain for every outlier, most significant first; the
// guardrails decide how many run. It stops at the step's deadline.
func (p *Policy) Decide(ctx context.Context, obs agent.Observation) (agent.Plan, error) {
	var plan agent.Plan
	for _, b := range obs.Backends {
		if err := ctx.Err(); err != nil {
			return nil, fmt.Errorf("rules: stopped at backend %s: %w", b.Name, err)
		}
		findings := p.Test(b)
		sort.SliceStable(findings, func(i, j int) bool { return findings[i].P < findings[j].P })
		planned := map[string]bool{}
		for _, f := range findings {
			if !f.Outlier {
				continue
			}
			planned[f.Server] = true
			plan = append(plan, agent.Action{
				Kind: agent.Drain, Backend: b.Name, Server: f.Server,
				Reason: fmt.Sprintf("5xx %.2f%% (%d/%d) vs peers %.2f%% (%d/%d), p=%.2g",
					100*f.Rate, f.X, f.N, 100*f.PeerRate, f.PeerX, f.PeerN, f.P),
			})
		}
		for _, s := range p.Slow(b) {
			if !planned[s.Server] {
				plan = append(plan, agent.Action{Kind: agent.Drain, Backend: b.Name, Server: s.Server, Reason: s.Reason})
			}
		}
	}
	return plan, nil
}

// Evidence lists the servers Decide would drain now:
// the same test, without the plan. The loop calls it between steps.
func (p *Policy) Evidence(obs agent.Observation) []agent.Key {
	var out []agent.Key
	for _, b := range obs.Backends {
		found := map[string]bool{}
		for _, f := range p.Test(b) {
			if f.Outlier {
				found[f.Server] = true
			}
		}
		for _, s := range p.Slow(b) {
			found[s.Server] = true
		}
		for _, s := range b.Servers {
			if found[s.Server] {
				out = append(out, s.Key())
			}
		}
	}
	return out
}

// Test runs the outlier test on every serving server of a backend. A
// server is compared with the better half of the others (those with the
// lowest error rates, ties included), so that a second faulty server among its peers
// does not mask the first.
func (p *Policy) Test(b agent.BackendView) []Finding {
	var serving []agent.ServerView
	for _, s := range b.Servers {
		if s.Serving() {
			serving = append(serving, s)
		}
	}
	if len(serving) < 2 {
		return nil // nobody to compare with
	}
	sort.SliceStable(serving, func(i, j int) bool { return serving[i].Window.ErrorRate() < serving[j].Window.ErrorRate() })
	c := p.Config
	threshold := c.Alpha / float64(len(serving))
	half := len(serving) / 2 // of the len-1 others, rounded up
	out := make([]Finding, 0, len(serving))
	for i, s := range serving {
		f := Finding{Server: s.Server, N: s.Window.Requests, X: s.Window.Err5xx, P: 1}
		// The others are in ascending order of error rate; the peers are
		// the first half of them, and any that tie with the last taken.
		others := 0
		var cut float64
		for j, peer := range serving {
			if j == i {
				continue
			}
			r := peer.Window.ErrorRate()
			if others >= half && r > cut {
				break
			}
			cut = r
			others++
			f.PeerN += peer.Window.Requests
			f.PeerX += peer.Window.Err5xx
		}
		if f.N > 0 {
			f.Rate = float64(f.X) / float64(f.N)
		}
		if f.PeerN > 0 {
			f.PeerRate = float64(f.PeerX) / float64(f.PeerN)
		}
		if f.N >= c.MinRequests && f.PeerN >= c.MinRequests && f.X >= c.MinErrors {
			share := float64(f.N) / float64(f.N+f.PeerN)
			f.P = stats.BinomialUpperTail(f.X+f.PeerX, f.X, share)
			f.Outlier = f.P < threshold && f.Rate >= c.MinRatio*f.PeerRate
		}
		out = append(out, f)
	}
	return out
}

// SlowServer is a latency outlier.
type SlowServer struct {
	Server string
	Reason string
}

// Slow finds the serving servers whose median answer time departs from
// their peers' by LatencyRatio and LatencyMinMs, each judged on at least
// half MinRequests answers, against at least one such peer.
func (p *Policy) Slow(b agent.BackendView) []SlowServer {
	c := p.Config
	if c.LatencyRatio <= 0 {
		return nil
	}
	enough := func(s agent.ServerView) bool { return s.Serving() && s.Window.Requests >= max(c.MinRequests/2, 1) }
	var out []SlowServer
	for _, s := range b.Servers {
		if !enough(s) {
			continue
		}
		var peers []int
		for _, q := range b.Servers {
			if q.Server != s.Server && enough(q) {
				peers = append(peers, q.Window.P50Ms)
			}
		}
		if len(peers) == 0 {
			continue
		}
		sort.Ints(peers)
		med := peers[len(peers)/2]
		if float64(s.Window.P50Ms) >= c.LatencyRatio*float64(max(med, 1)) && s.Window.P50Ms-med >= c.LatencyMinMs {
			out = append(out, SlowServer{Server: s.Server,
				Reason: fmt.Sprintf("median answer %d ms vs peers' %d ms (%d answers)", s.Window.P50Ms, med, s.Window.Requests)})
		}
	}
	return out
}
