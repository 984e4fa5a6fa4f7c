package rules

import (
	"fmt"
	"math"
	"time"

	"github.com/hapilot/hapilot/agent"
)

// The latency test with a memory: the windowed ratio test (Slow) alone
// drained healthy servers whose answer times simply differ. Among two
// servers whose medians are each 20 ms × lognormal(σ 0.5), about one
// fleet in 43 has one 5× its peer's, and it was drained every time it
// came back (docs/explanation/detection.md, slow faults). So each server
// keeps a baseline of its own median answer time, as the error test
// keeps one of its error rate, and once that baseline is learned a
// server is slow only if it is slow against its peers (Slow) AND clearly
// slower than it has been: a server that was always slower than its
// peer is not degraded, a server that slows down is. A fleet-wide
// slowdown still drains nothing: the peers' median moves too, and the
// peer test is still required.

// LatencyLearn is how much judged time a baseline needs before it
// counts: ten windows of 60 s, so that it averages over more than one
// window's sampling noise and one bad minute does not make it. Until
// then the server is judged as before (the peer test alone): the e2e
// tests and an agent that starts while a fault is present drain it as
// they did.
const LatencyLearn = 10 * time.Minute

// alwaysSlow is how many times the peer test's ratio makes a server slow
// whatever its history: at the defaults, a median 50× its peers'. A
// baseline learns from whatever a server serves before it is learned, so
// a server already slow when the agent starts, and kept serving (observe
// mode, a guardrail's refusal), would otherwise become its own normal
// after LatencyLearn. Healthy servers differ, but not by this much: two
// servers whose medians are each lognormal(σ 0.5) around the same value
// are 50× apart in about one pair in 31 million
// (docs/explanation/detection.md).
const alwaysSlow = 10

// latBaseline is one server's latency baseline: exponentially weighted
// (time constant BaselineSpan) sums of the log of its window median, per
// second judged: w of the seconds, m of the logs, q of their squares.
// secs counts the seconds judged, for LatencyLearn.
type latBaseline struct {
	w, m, q, secs float64
}

func (b *latBaseline) learned() bool { return b.secs >= LatencyLearn.Seconds() }

// mean and sd of the log of the window median, the baseline's level and
// its spread.
func (b *latBaseline) mean() float64 { return b.m / b.w }
func (b *latBaseline) sd() float64 {
	mu := b.mean()
	return math.Sqrt(max(0, b.q/b.w-mu*mu))
}

// add weighs one check's log median in over dt seconds.
func (b *latBaseline) add(x, dt, span float64) {
	d := math.Exp(-dt / span)
	b.w = b.w*d + dt
	b.m = b.m*d + dt*x
	b.q = b.q*d + dt*x*x
	b.secs += dt
}

// LatencyBaseline is a server's learned median answer time in ms (0
// until LatencyLearn of history), for reasons and tests.
func (s *SeqServer) LatencyBaseline() float64 {
	if !s.lat.learned() {
		return 0
	}
	return math.Exp(s.lat.mean())
}

// slowMargin is how far above its baseline's log a server's log median
// must be to be slow: ln(LatencyBaselineRatio), or four of the
// baseline's own standard deviations where the server's median wanders
// more than that (a diurnal swing, a cache that warms).
func (c Config) slowMargin(b *latBaseline) float64 {
	return max(math.Log(c.LatencyBaselineRatio), 4*b.sd())
}

// SlowBaseline is the latency test the rules drain on: srv[i] is the
// state of b.Servers[i], dt the seconds since the last call. It returns
// the servers Slow finds, less those whose baseline is learned and that
// are not clearly slower than it, and it teaches each judged server's
// baseline its median now, unless that median is suspect: more than
// half the margin (in logs) above a learned baseline. So a fault does not
// teach the baseline that it is normal, and a slow drift is learned only
// while it stays under √LatencyBaselineRatio× a step. Before a baseline
// is learned every judged second teaches it: its server is then judged
// as before, and a server drained at once for being slow from the start
// teaches little, as it serves little.
func (p *Policy) SlowBaseline(b agent.BackendView, srv []*SeqServer, dt float64) []SlowServer {
	c := p.Config
	peer := p.Slow(b)
	if c.LatencyRatio <= 0 {
		return nil
	}
	// One check teaches at most the window it reads (60 s at the
	// agent's defaults): after a pause of the loop, one median must not
	// weigh as if it had been seen every second.
	dt = min(max(dt, 0), 60)
	span := c.baselineSpan()
	flagged := make(map[string]int, len(peer))
	for k, s := range peer {
		flagged[s.Server] = k
	}
	var out []SlowServer
	for i, s := range b.Servers {
		if i >= len(srv) || srv[i] == nil || !c.latencyJudged(s) {
			continue
		}
		bl := &srv[i].lat
		x := logMs(float64(s.Window.P50Ms))
		k, slow := flagged[s.Server]
		if slow && peer[k].Ratio >= alwaysSlow*c.LatencyRatio {
			// Slow whatever its history, and not learned from.
			out = append(out, peer[k])
			continue
		}
		if !bl.learned() || c.LatencyBaselineRatio <= 0 {
			if slow {
				out = append(out, peer[k])
			}
			bl.add(x, dt, span)
			continue
		}
		mu, margin := bl.mean(), c.slowMargin(bl)
		if slow && x >= mu+margin {
			out = append(out, SlowServer{Server: s.Server, Reason: fmt.Sprintf("%s, and %.1f× its own baseline %.0f ms (degraded from %.1f×)",
				peer[k].Reason, math.Exp(x-mu), math.Exp(mu), math.Exp(margin))})
		}
		c.teach(bl, x, dt, span)
	}
	return out
}

func logMs(ms float64) float64 { return math.Log(max(ms, 1)) }

// latencyJudged: a server's window median is judged (and teaches its
// baseline) when it serves and its window holds half MinRequests timed
// answers. Untimed ones (failures with no answer: a hang's 504, a
// refused connection) are in no quantile: a window of them alone reads a
// median of 0, which no peer may be judged against.
func (c Config) latencyJudged(s agent.ServerView) bool {
	return s.Serving() && s.Window.Requests-min(s.Window.Untimed, s.Window.Requests) >= max(c.MinRequests/2, 1)
}

// baselineSpan is the baselines' time constant in seconds.
func (c Config) baselineSpan() float64 {
	if c.BaselineSpan > 0 {
		return c.BaselineSpan.Seconds()
	}
	return DefaultConfig().BaselineSpan.Seconds()
}

// departed: a log median x is more than half the margin above the
// learned baseline bl, the line above which a median is suspect and does
// not teach it.
func (c Config) departed(bl *latBaseline, x float64) bool {
	return x >= bl.mean()+c.slowMargin(bl)/2
}

// teach weighs a log median x in over dt seconds: every one until the
// baseline is learned, then only those that have not departed from it.
func (c Config) teach(bl *latBaseline, x, dt, span float64) {
	if !bl.learned() || !c.departed(bl, x) {
		bl.add(x, dt, span)
	}
}
