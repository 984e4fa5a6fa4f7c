// Package rules is hapilot's default policy: drain a server whose 5xx rate
// has risen above what its backend calls degraded, on the evidence of a
// sequential test (sequential.go): a CUSUM of each server's errors against
// its own and its backend's healthy rate, run on every chunk of requests
// the loop reads, with a threshold set by the mean time between false
// drains an operator accepts (ARLDays).
//
// Latency: a server whose median answer time stands out from its peers'
// (latency.go), or whose share of slow answers has grown, whatever its
// median (tail.go, the same sequential test on slow answers), is drained
// too.
//
// Test, the windowed test below, is what the policy ran before; the LLM
// policy's checks still use it on one window (they need no state).
// It is conditional on the errors seen: if a server and its peers
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
	"sync"
	"time"

	"github.com/hapilot/hapilot/agent"
	"github.com/hapilot/hapilot/internal/lib/stats"
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
	// so that a few slow answers are never enough here: a grown share of
	// slow answers is the tail test's (TailRatio).
	LatencyRatio float64
	LatencyMinMs int
	// LatencyBaselineRatio: once a server's own latency baseline is
	// learned (latency.go), it is slow only if its median is also this
	// many times that baseline: a server that was always slower than its
	// peers is not degraded (0: the peer test alone, as before).
	LatencyBaselineRatio float64
	// TailRatio: the tail test (tail.go) counts an answer slow at this
	// many times the backend's p95 (and LatencyMinMs above it, scaled up
	// to a server's own median where higher), and drains a server whose
	// share of slow answers has grown, by a sequential test (0: off).
	// TailFloor is the least slow share it calls degraded, as Floor is
	// for 5xx.
	TailRatio float64
	TailFloor float64

	// The sequential test's settings (sequential.go). A server is
	// degraded when its error rate is above both Floor and DegradedRatio
	// times its backend's healthy median: a 5% server among 0.2% peers
	// is, a healthy server at 2x the median is not.
	Floor         float64
	DegradedRatio float64
	// ARLDays is the mean time between false drains the threshold is set
	// for, per server, in days of one-second chunks: h = ln(ARLDays·86400)
	// + ln(4).
	ARLDays float64
	// BaselineSpan is the time constant of each server's long baseline.
	BaselineSpan time.Duration

	// HealthyFloor and HealthyRatio bound the healthy region: a server
	// failing at most the larger of HealthyFloor and HealthyRatio times its
	// backend's healthy median is healthy, and the test's promise (at most
	// one false drain per ARLDays) holds for every such server, whatever
	// the fleet's spread. Between the healthy region and the degraded one
	// (Floor, DegradedRatio) lies the zone: a server there may be drained,
	// at most once a ZoneEvery, never cycled (regions.go).
	HealthyFloor float64
	HealthyRatio float64
	// MinDuration: a burst of errors shorter than this, however large and
	// however spread, never drains; degraded means sustained.
	MinDuration time.Duration
	// ZoneEvery is the least time between two drains of a server whose
	// evidence never showed it degraded (in the zone).
	ZoneEvery time.Duration
	// everyBurst: every burst shorter than MinDuration is forgiven, with
	// no tokens to run out of, and each on its own, however close the
	// next (the tail test's: a GC pause that comes back every minute is
	// the server's normal, not a flapping fault; tail.go).
	everyBurst bool

	// Blocks are the config's backend blocks that set a rules key
	// (blocks.go): the backends whose sequential test takes its own
	// floor, degraded ratio or ARL. Only NewPerBackend reads them;
	// Validate judges each as it judges the flags.
	Blocks *Blocks
}

// DefaultConfig is what `hapilot run` uses unless told otherwise.
func DefaultConfig() Config {
	return Config{Alpha: 1e-6, MinRequests: 100, MinErrors: 5, MinRatio: 2, LatencyRatio: 5, LatencyMinMs: 50, LatencyBaselineRatio: 3, TailRatio: 2, TailFloor: 0.002,
		Floor: 0.01, DegradedRatio: 6, ARLDays: 1000, BaselineSpan: 6 * time.Hour,
		HealthyFloor: 0.005, HealthyRatio: 3, MinDuration: 5 * time.Second, ZoneEvery: 24 * time.Hour}
}

// Policy is the rule policy. Its sequential test keeps state between
// calls: Decide and Evidence feed it the requests each server answered
// since the last call.
type Policy struct {
	Config Config

	// mu guards seq: Decide (the loop's step) and Evidence (its checks
	// between ticks) both advance the test.
	mu  sync.Mutex
	seq map[string]*seqBackend // by backend name
}

// seqBackend is the sequential test's state for one backend.
type seqBackend struct {
	q       *Sequential
	servers map[string]*SeqServer
	// last: each server's total counts at the last read, whose
	// difference with the next read is the next chunk.
	last  map[string]Counts
	at    time.Time
	found map[string]bool // what the last chunk condemned
	slow  []SlowServer    // what the latency test found on the last chunk
	tail  *tailBackend    // the tail test (tail.go); nil when off
	// per-call scratch, kept to spare the allocations
	srv     []*SeqServer
	in      []Counts
	serving []bool
	idx     []int
}

// New returns a rule policy with cfg.
func New(cfg Config) *Policy { return &Policy{Config: cfg} }

// NewPolicy is the rules as the loop runs them: their decision, their
// needs and their evidence test, which lets the loop step as soon as
// the windows condemn a server.
func NewPolicy(cfg Config) agent.Policy {
	p := New(cfg)
	return agent.Policy{Decider: p, Needs: p.Needs(), Evidence: p.Evidence, Notes: p.Notes}
}

func (*Policy) Name() string { return "rules" }

// Needs: the rule test bounds false drains per backend and step at Alpha
// whatever N, so several significant outliers may go in one step: up to
// N/3 (the study's faulty share), floor and capacity permitting. One a
// step would take three steps to isolate the study's three faulty
// servers at N=9.
func (*Policy) Needs() agent.Needs { return agent.Needs{DrainsPer: 3} }

// Validate checks the settings an operator may give: the flags', then
// each backend block's over them.
func (c Config) Validate() error {
	if err := c.validate(); err != nil {
		return err
	}
	return c.Blocks.validate(c)
}

// validate checks c's own settings, not its blocks'.
func (c Config) validate() error {
	var errs []error
	for name, v := range map[string]float64{"rules-alpha": c.Alpha, "rules-min-ratio": c.MinRatio, "rules-latency-ratio": c.LatencyRatio, "rules-latency-baseline-ratio": c.LatencyBaselineRatio} {
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
	if c.LatencyBaselineRatio != 0 && !(c.LatencyBaselineRatio >= 1) {
		errs = append(errs, fmt.Errorf("rules-latency-baseline-ratio %v: 0 (off) or at least 1", c.LatencyBaselineRatio))
	}
	if c.TailRatio != 0 && !(c.TailRatio >= 1 && !math.IsInf(c.TailRatio, 0)) {
		errs = append(errs, fmt.Errorf("rules-tail-ratio %v: 0 (off) or at least 1", c.TailRatio))
	}
	if c.TailRatio != 0 && !(c.TailFloor > 0 && c.TailFloor < maxP1) {
		errs = append(errs, fmt.Errorf("tail floor %v outside (0, %v)", c.TailFloor, maxP1))
	}
	if !(c.Floor > 0 && c.Floor < maxP1) {
		errs = append(errs, fmt.Errorf("rules-floor %v outside (0, %v)", c.Floor, maxP1))
	}
	if !(c.DegradedRatio >= 1 && !math.IsInf(c.DegradedRatio, 0)) {
		errs = append(errs, fmt.Errorf("rules-degraded-ratio %v below 1 or not finite", c.DegradedRatio))
	}
	if !(c.ARLDays >= 1.0/24 && c.ARLDays <= 1e9) {
		errs = append(errs, fmt.Errorf("rules-arl-days %v outside [1/24, 1e9]", c.ARLDays))
	}
	// The zone between the healthy and the degraded regions keeps the
	// test's hypotheses apart: p0 is at most half of p1.
	if !(c.HealthyFloor > 0) {
		errs = append(errs, fmt.Errorf("rules-healthy-floor %v: above 0", c.HealthyFloor))
	} else if !(c.Floor >= 2*c.HealthyFloor) {
		errs = append(errs, fmt.Errorf("rules-floor %v: at least twice rules-healthy-floor %v", c.Floor, c.HealthyFloor))
	}
	if !(c.HealthyRatio >= 1) {
		errs = append(errs, fmt.Errorf("rules-healthy-ratio %v: at least 1", c.HealthyRatio))
	} else if !(c.DegradedRatio >= 2*c.HealthyRatio) {
		errs = append(errs, fmt.Errorf("rules-degraded-ratio %v: at least twice rules-healthy-ratio %v", c.DegradedRatio, c.HealthyRatio))
	}
	if c.MinDuration < 0 || c.MinDuration > time.Duration(maxWindow-1)*time.Second {
		errs = append(errs, fmt.Errorf("rules-min-duration %v outside [0, %v]", c.MinDuration, time.Duration(maxWindow-1)*time.Second))
	}
	if c.ZoneEvery < 0 {
		errs = append(errs, fmt.Errorf("rules-zone-every %v is negative", c.ZoneEvery))
	}
	if c.BaselineSpan < time.Minute {
		errs = append(errs, fmt.Errorf("rules-baseline-span %v under a minute", c.BaselineSpan))
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
	// Threshold is the p-value under which the server is an outlier:
	// Alpha over the serving servers (Bonferroni's correction).
	Threshold float64
	Outlier   bool
}

// The names of the tests whose figures an action carries (agent.TestFigures).
const (
	SequentialTest = "sequential"
	WindowedTest   = "windowed"
	LatencyTest    = "latency"
)

// windowedFigures is f's verdict as the action carries it: the p-value
// is the statistic, under the corrected alpha.
func (p *Policy) windowedFigures(f Finding) *agent.TestFigures {
	pv := f.P
	return &agent.TestFigures{Name: WindowedTest, Statistic: f.P, Threshold: f.Threshold, PValue: &pv, Rate: f.Rate, Baseline: f.PeerRate}
}

// latencyFigures is s's verdict: its median over its peers', against
// LatencyRatio.
func (p *Policy) latencyFigures(s SlowServer) *agent.TestFigures {
	return &agent.TestFigures{Name: LatencyTest, Statistic: s.Ratio, Threshold: p.Config.LatencyRatio}
}

// Decide proposes a drain for every server the sequential test condemns,
// strongest evidence first, then every latency outlier; the guardrails
// decide how many run. It stops at the step's deadline.
func (p *Policy) Decide(ctx context.Context, obs agent.Observation) (agent.Plan, error) {
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("rules: stopped before deciding: %w", err)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.advance(obs)
	var plan agent.Plan
	for _, b := range obs.Backends {
		sb := p.seq[b.Name]
		type cand struct {
			name string
			s    *SeqServer
		}
		var cands []cand
		for _, s := range b.Servers {
			if sb != nil && sb.found[s.Server] {
				cands = append(cands, cand{s.Server, sb.servers[s.Server]})
			}
		}
		sort.SliceStable(cands, func(i, j int) bool { return cands[i].s.Max() > cands[j].s.Max() })
		planned := map[string]bool{}
		for _, c := range cands {
			planned[c.name] = true
			n, x := c.s.RunCounts()
			region := "degraded"
			if c.s.Zone {
				region = fmt.Sprintf("in the zone between healthy %.2f%% and degraded (not shown above it): drained at most once a %v", 100*sb.q.HealthyMax(), p.Config.ZoneEvery)
			}
			plan = append(plan, agent.Action{
				Kind: agent.Drain, Backend: b.Name, Server: c.name,
				Reason: fmt.Sprintf("5xx CUSUM at h %.1f: %.2f%% (%d/%d) over its evidence's %d checks, judged against %.3f%%, degraded from %.2f%%; %s%s",
					sb.q.H(), 100*float64(x)/float64(max(n, 1)), x, n, counted(c.s), 100*c.s.P0(), 100*sb.q.P1Min(), region, burstsLeftOut(c.s)),
				Test: &agent.TestFigures{Name: SequentialTest, Statistic: c.s.Max(), Threshold: sb.q.H(),
					Rate: float64(x) / float64(max(n, 1)), Baseline: c.s.P0()},
			})
		}
		if sb != nil && sb.tail != nil {
			for _, s := range b.Servers {
				if _, ok := sb.tail.found[s.Server]; ok && !planned[s.Server] {
					planned[s.Server] = true
					plan = append(plan, sb.tail.drain(b.Name, s.Server))
				}
			}
		}
		if sb != nil {
			for _, s := range sb.slow {
				if !planned[s.Server] {
					reason := s.Reason
					if sb.tail != nil && sb.tail.meanOnly[s.Server] {
						reason += meanNote
					}
					plan = append(plan, agent.Action{Kind: agent.Drain, Backend: b.Name, Server: s.Server, Reason: reason, Test: p.latencyFigures(s)})
				}
			}
		}
	}
	return plan, nil
}

// Notes are the zone servers the test leaves serving: each condemned
// again within ZoneEvery of its one drain in the zone, and why.
func (p *Policy) Notes() map[agent.Key]string {
	p.mu.Lock()
	defer p.mu.Unlock()
	var out map[agent.Key]string
	for name, sb := range p.seq {
		for server, s := range sb.servers {
			if !s.Left {
				continue
			}
			if out == nil {
				out = map[agent.Key]string{}
			}
			n, x := s.RunCounts()
			out[agent.Key{Backend: name, Server: server}] = fmt.Sprintf(
				"in the zone: %.2f%% (%d/%d) over its evidence's %d checks, above healthy %.2f%% but not shown above degraded %.2f%%; "+
					"drained in the zone, or before its backend's healthy median was known, %s ago and left serving until %s have passed since, or its evidence shows it degraded, or the operator drains it%s",
				100*float64(x)/float64(max(n, 1)), x, n, counted(s), 100*sb.q.HealthyMax(), 100*sb.q.P1Min(),
				time.Duration(sb.q.clock-s.zoneAt)*time.Second, p.Config.ZoneEvery, burstsLeftOut(s))
		}
	}
	return out
}

// Windowed is the rules as they decided before the sequential test: the
// windowed test (Test) on each observation, no state. No decision of the
// agent's rests on it now (the LLM policy's floor is the sequential
// rules); the soak runs it for comparison (hapilot-bench soak --windowed).
type Windowed struct{ *Policy }

// NewWindowed returns the windowed rules under cfg.
func NewWindowed(cfg Config) *Windowed { return &Windowed{New(cfg)} }

// Decide proposes a drain for every outlier of the windowed test, most
// significant first, then every latency outlier.
func (w *Windowed) Decide(ctx context.Context, obs agent.Observation) (agent.Plan, error) {
	p := w.Policy
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
				Test: p.windowedFigures(f),
			})
		}
		for _, s := range p.Slow(b) {
			if !planned[s.Server] {
				plan = append(plan, agent.Action{Kind: agent.Drain, Backend: b.Name, Server: s.Server, Reason: s.Reason, Test: p.latencyFigures(s)})
			}
		}
	}
	return plan, nil
}

// Evidence lists the servers Decide would drain now: the same test,
// without the plan. The loop calls it between steps, about every second,
// and each call feeds the sequential test the requests since the last.
func (p *Policy) Evidence(obs agent.Observation) []agent.Key {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.advance(obs)
	var out []agent.Key
	for _, b := range obs.Backends {
		sb := p.seq[b.Name]
		found := map[string]bool{}
		if sb != nil {
			for _, s := range sb.slow {
				found[s.Server] = true
			}
			if sb.tail != nil {
				for s := range sb.tail.found {
					found[s] = true
				}
			}
		}
		for _, s := range b.Servers {
			if found[s.Server] || (sb != nil && sb.found[s.Server]) {
				out = append(out, s.Key())
			}
		}
	}
	return out
}

// advance feeds every backend's sequential test the chunk of requests
// since the last call: the difference of the windows' running totals.
// Two calls on an observation of the same time (a step's Decide and its
// Evidence) feed one chunk. The caller must hold p.mu.
func (p *Policy) advance(obs agent.Observation) {
	if p.seq == nil {
		p.seq = map[string]*seqBackend{}
	}
	present := make(map[string]bool, len(obs.Backends))
	for _, b := range obs.Backends {
		present[b.Name] = true
		sb := p.seq[b.Name]
		if sb == nil {
			sb = &seqBackend{q: NewSequential(p.Config), servers: map[string]*SeqServer{}, last: map[string]Counts{}}
			p.seq[b.Name] = sb
		}
		if !obs.Time.IsZero() && obs.Time.Equal(sb.at) {
			continue // this observation's chunk is in already
		}
		dt := 1.0
		if !sb.at.IsZero() && obs.Time.After(sb.at) {
			dt = obs.Time.Sub(sb.at).Seconds()
		}
		sb.at = obs.Time
		sb.srv, sb.in, sb.serving = sb.srv[:0], sb.in[:0], sb.serving[:0]
		seen := make(map[string]bool, len(b.Servers))
		for _, s := range b.Servers {
			seen[s.Server] = true
			st := sb.servers[s.Server]
			if st == nil {
				st = &SeqServer{}
				sb.servers[s.Server] = st
			}
			tot := Counts{N: s.Window.TotalRequests, X: s.Window.TotalErr5xx}
			var chunk Counts
			// The first read of a server only sets its mark: the totals
			// before it may span any time. A total that went back (the
			// series was forgotten and made again) does the same.
			if last, ok := sb.last[s.Server]; ok && tot.N >= last.N && tot.X >= last.X {
				chunk = Counts{N: tot.N - last.N, X: tot.X - last.X}
				chunk.X = min(chunk.X, chunk.N)
			}
			sb.last[s.Server] = tot
			sb.srv = append(sb.srv, st)
			sb.in = append(sb.in, chunk)
			sb.serving = append(sb.serving, s.Serving())
		}
		for name := range sb.servers {
			if !seen[name] {
				delete(sb.servers, name)
				delete(sb.last, name)
			}
		}
		sb.idx = sb.q.Step(dt, sb.srv, sb.in, sb.serving, sb.idx)
		sb.slow = p.SlowBaseline(b, sb.srv, dt)
		if p.Config.TailRatio > 0 {
			if sb.tail == nil {
				sb.tail = newTailBackend(p.Config)
			}
			sb.tail.step(p.Config, b, dt, sb.servers)
		}
		sb.found = make(map[string]bool, len(sb.idx))
		for _, i := range sb.idx {
			sb.found[b.Servers[i].Server] = true
		}
	}
	for name := range p.seq {
		if !present[name] {
			delete(p.seq, name)
		}
	}
}

// Test runs the windowed outlier test on every serving server of a
// backend, on its window alone (no state): what the policy ran before the
// sequential test, and what the LLM policy's checks run still. A
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
		f := Finding{Server: s.Server, N: s.Window.Requests, X: s.Window.Err5xx, P: 1, Threshold: threshold}
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
	// Ratio is the server's median over its peers' median.
	Ratio float64
}

// Slow finds the serving servers whose median answer time departs from
// their peers' by LatencyRatio and LatencyMinMs, each judged on at least
// half MinRequests timed answers (latencyJudged), against at least one
// such peer; with the tail test on, not the stats path's servers, whose
// mean it judges (statsOnly).
func (p *Policy) Slow(b agent.BackendView) []SlowServer {
	c := p.Config
	if c.LatencyRatio <= 0 {
		return nil
	}
	enough := c.latencyJudged
	// Every judged server's median, sorted once: a server's peers are
	// all of them but itself, whose median is read off this list (not a
	// sort per server: that was quadratic in the backend's size).
	var all []int
	for _, s := range b.Servers {
		if enough(s) {
			all = append(all, s.Window.P50Ms)
		}
	}
	if len(all) < 2 {
		return nil
	}
	sort.Ints(all)
	var out []SlowServer
	for _, s := range b.Servers {
		if !enough(s) || c.TailRatio > 0 && statsOnly(s) {
			continue
		}
		// The others are all without one copy of s's value, at index
		// self; their median is at (len(all)-1)/2 of them.
		self, mid := sort.SearchInts(all, s.Window.P50Ms), (len(all)-1)/2
		med := all[mid]
		if self <= mid {
			med = all[mid+1]
		}
		if float64(s.Window.P50Ms) >= c.LatencyRatio*float64(max(med, 1)) && s.Window.P50Ms-med >= c.LatencyMinMs {
			out = append(out, SlowServer{Server: s.Server, Ratio: float64(s.Window.P50Ms) / float64(max(med, 1)),
				Reason: fmt.Sprintf("median answer %d ms vs peers' %d ms (%d answers)", s.Window.P50Ms, med, s.Window.Requests)})
		}
	}
	return out
}

// statsOnly says every answer of the server's series came from the stats
// path (HAProxy's counters, a mean's time: Counted). With the tail test
// on, such a server's mean is judged there each check against the median
// test's threshold, and not here: its window median is the median of
// recent means, which step where a tail fills them
// (haproxy.RecentMean), one server a few seconds before its peers in a
// fleet-wide change, and would read 5× theirs meanwhile. It still
// counts among the peers.
func statsOnly(s agent.ServerView) bool {
	return s.Window.TotalRequests > 0 && s.Window.TotalCounted >= s.Window.TotalRequests
}

// counted is how many of the evidence's checks its counts cover: those a
// burst's cut touched are left out (RunCounts).
func counted(s *SeqServer) int { return s.run - s.runCut() }

// burstsLeftOut is the reason's last words where the evidence held a
// burst: its checks, left out of the counts quoted. After the figures, so
// that the LLM policy's prompt, which quotes them, reads as before.
func burstsLeftOut(s *SeqServer) string {
	cut := s.runCut()
	switch cut {
	case 0:
		return ""
	case 1:
		return "; 1 more check of its evidence, which the minimum duration cut as a burst's, is left out of those counts"
	}
	return fmt.Sprintf("; %d more checks of its evidence, which the minimum duration cut as a burst's, are left out of those counts", cut)
}
