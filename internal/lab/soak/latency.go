package soak

import (
	"fmt"
	"math"
	"math/rand/v2"
	"slices"

	"github.com/hapilot/hapilot/agent"
	"github.com/hapilot/hapilot/agent/policy/rules"
	"github.com/hapilot/hapilot/haproxy"
)

// Latency is the answer-time model: each request's time is lognormal
// around its server's median, MedianMs × lognormal(Hetero) (servers
// differ), with a per-request log-sd Sigma.
type Latency struct {
	MedianMs, Sigma, Hetero float64
}

func (l Latency) validate() error {
	if l == (Latency{}) {
		return nil
	}
	if !(l.MedianMs > 0 && l.MedianMs <= 1e5) || !(l.Sigma > 0 && l.Sigma <= 3) || !(l.Hetero >= 0 && l.Hetero <= 2) {
		return fmt.Errorf("latency %+v: median in (0, 1e5] ms, sigma in (0, 3], hetero in [0, 2]", l)
	}
	return nil
}

func (l Latency) String() string {
	s := fmt.Sprintf("%gms:%g", l.MedianMs, l.Sigma)
	if l.Hetero > 0 {
		s += fmt.Sprintf(" σ%g", l.Hetero)
	}
	return s
}

// latencySpan is the window the latency test reads: the agent's
// lookback, 60 s at its defaults (Loop.refreshed's long window).
const latencySpan = 60

// latencySecond is one server's answers in one second: how many, their
// log-median's sampling deviation times that count, and whether they
// came from the slow fault.
type latencySecond struct {
	n, nd float64
	slow  bool
}

// latencies keeps each server's last latencySpan seconds of answers and
// gives the window's median the way the window store's histogram would,
// without drawing every request: 864 million server-seconds at hundreds
// of requests each would take hours.
//
// The window's median is computed from two groups, the server's normal
// answers and its slow ones. Within a group, the sample median of n
// lognormal answers deviates from the true one, in logs, by about
// N(0, σ²π/(2n)), and the median of several seconds' answers by the
// request-weighted mean of their deviations (the Bahadur representation:
// the sample median is linear in the empirical distribution). Each
// second's deviation times its count is drawn as N(0, nσ²π/2) and summed
// in a ring. Where both groups are in the window, the median solves
// n₁Φ((L−μ₁)/σ) + n₂Φ((L−μ₂)/σ) = (n₁+n₂)/2 for L. The window store's
// histogram bins (12.5% wide) are left out: the test's 5× ratio is far
// coarser.
type latencies struct {
	c    Cell
	rng  *rand.Rand
	pol  *rules.Policy
	mu   []float64 // each server's log-median, ms
	ring [][latencySpan]latencySecond
	pos  []int
	// per server, the window's sums for the normal [0] and slow [1]
	// answers
	n, nd [][2]float64
	// the tail test (rules' tail.go), a Sequential of its own on each
	// server's answers and slow answers a second; tin its chunk, tailIdx
	// what it condemns. The answers over each server's threshold are
	// drawn from the model: the normal ones' share over it, and the slow
	// tail's answers where their time is over it.
	tq      *rules.Sequential
	tsrv    []*rules.SeqServer
	tin     []rules.Counts
	tailIdx []int
	// stall: each server's run of stall seconds (rules'
	// Sequential.StallCounts), as the agent keeps it.
	stall []int
	// pending: each server's answers and slow tail of this second, for
	// the thresholds, which need every server's median first.
	pending []tailPending
	scratch []float64
}

type tailPending struct {
	n    uint64
	slow bool
	tail float64
}

func newLatencies(c Cell, rng *rand.Rand) *latencies {
	n := c.Servers
	l := &latencies{c: c, rng: rng, pol: rules.New(c.Config), mu: make([]float64, n),
		ring: make([][latencySpan]latencySecond, n), pos: make([]int, n), n: make([][2]float64, n), nd: make([][2]float64, n)}
	for i := range n {
		l.mu[i] = math.Log(c.Latency.MedianMs) + c.Latency.Hetero*rng.NormFloat64()
	}
	if c.Config.TailRatio > 0 {
		l.tq = rules.NewSequential(c.Config.TailConfig())
		l.tsrv, l.tin, l.pending, l.stall = make([]*rules.SeqServer, n), make([]rules.Counts, n), make([]tailPending, n), make([]int, n)
		for i := range l.tsrv {
			l.tsrv[i] = &rules.SeqServer{}
		}
	}
	return l
}

// p95Ratio is the body's p95 over its median: e^(1.645σ).
func (l Latency) p95Ratio() float64 { return math.Exp(1.6448536 * l.Sigma) }

// healthyTail is the share of a healthy server's answers the tail test
// counts slow among identical servers: over the threshold its median and
// p95 make.
func (l Latency) healthyTail(cfg rules.Config) float64 {
	m := int(math.Ceil(l.MedianMs))
	t := cfg.TailThreshold(m, m, int(math.Ceil(l.MedianMs*l.p95Ratio())))
	return 1 - normCDF(math.Log(t/l.MedianMs)/l.Sigma)
}

// tailSecond notes server i's answers of one second for the tail test:
// n, whether the whole-median slow fault is on, and the slow tail's share.
func (l *latencies) tailSecond(i int, n uint64, slow bool, tail float64) {
	if l.tq != nil {
		l.pending[i] = tailPending{n: n, slow: slow, tail: tail}
	}
}

// tailStep runs the tail test on the second noted: each server's
// threshold from its window median and the backend's (the lower median
// of the judged servers' medians and p95s, the p95 a body's ratio above
// its median), its slow answers drawn from the model.
func (l *latencies) tailStep(dt float64, serving []bool, view *agent.BackendView) []int {
	cfg := l.c.Config
	judged := func(i int) bool {
		// the window's answers over its span: its rate, as the agent's
		// window reads it once three seconds are in
		return serving[i] && float64(view.Servers[i].Window.Requests) >= rules.TailMinRate*latencySpan
	}
	l.scratch = l.scratch[:0]
	for i := range l.tsrv {
		if judged(i) {
			l.scratch = append(l.scratch, float64(view.Servers[i].Window.P50Ms))
		}
	}
	slices.Sort(l.scratch)
	p50b := 0
	if len(l.scratch) > 0 {
		p50b = int(l.scratch[(len(l.scratch)-1)/2])
	}
	p95b := int(math.Ceil(float64(p50b) * l.c.Latency.p95Ratio()))
	for i, p := range l.pending {
		l.tin[i] = rules.Counts{}
		if !judged(i) || len(l.scratch) == 0 || p.n == 0 {
			l.stall[i] = 0
			continue
		}
		// The threshold itself: the windows' tallies count the part of
		// its quarter octave above it (the interpolation's error left
		// out, as the histogram's bins are for the median).
		from := cfg.TailThreshold(view.Servers[i].Window.P50Ms, p50b, p95b)
		nt := binomial(l.rng, p.n, p.tail)
		mu := l.mu[i]
		if p.slow {
			mu += math.Log(l.c.Slow)
		}
		x := binomial(l.rng, p.n-nt, 1-normCDF((math.Log(from)-mu)/l.c.Latency.Sigma))
		if l.c.tailMs() >= from {
			x += nt
		}
		l.tin[i] = l.tq.StallCounts(rules.Counts{N: p.n, X: x}, &l.stall[i])
	}
	l.tailIdx = l.tq.Step(dt, l.tsrv, l.tin, serving, l.tailIdx)
	return l.tailIdx
}

// second adds server i's answers of one second: n of them, slow or not.
func (l *latencies) second(i int, n uint64, slow bool) {
	old := &l.ring[i][l.pos[i]]
	g := 0
	if old.slow {
		g = 1
	}
	l.n[i][g] -= old.n
	l.nd[i][g] -= old.nd
	v := latencySecond{n: float64(n), slow: slow}
	if n > 0 {
		v.nd = math.Sqrt(v.n*math.Pi/2) * l.c.Latency.Sigma * l.rng.NormFloat64()
	}
	g = 0
	if slow {
		g = 1
	}
	l.n[i][g] += v.n
	l.nd[i][g] += v.nd
	*old = v
	l.pos[i] = (l.pos[i] + 1) % latencySpan
}

// p50 is server i's window median in whole ms (the histogram's reads are
// whole ms) and the window's answers.
func (l *latencies) p50(i int) (int, uint64) {
	n, nd := l.n[i], l.nd[i]
	total := n[0] + n[1]
	if total < 0.5 {
		return 0, 0
	}
	var loc [2]float64
	for g := range loc {
		loc[g] = l.mu[i]
		if g == 1 {
			loc[g] += math.Log(l.c.Slow)
		}
		if n[g] > 0.5 {
			loc[g] += nd[g] / n[g]
		}
	}
	var ln float64
	switch {
	case n[1] < 0.5:
		ln = loc[0]
	case n[0] < 0.5:
		ln = loc[1]
	default:
		sd := l.c.Latency.Sigma
		lo, hi := min(loc[0], loc[1])-6*sd, max(loc[0], loc[1])+6*sd
		for range 50 {
			mid := (lo + hi) / 2
			below := n[0]*normCDF((mid-loc[0])/sd) + n[1]*normCDF((mid-loc[1])/sd)
			if below < total/2 {
				lo = mid
			} else {
				hi = mid
			}
		}
		ln = (lo + hi) / 2
	}
	return int(math.Ceil(math.Exp(ln))), uint64(math.Round(total))
}

// answerMs draws one answer time of server i in whole ms, for the agent
// path's window store: lognormal around its median (times Cell.Slow while
// the slow fault is on), or the slow tail's time with probability tail.
func (l *latencies) answerMs(i int, slow bool, tail float64) int {
	if tail > 0 && l.rng.Float64() < tail {
		return int(math.Ceil(l.c.tailMs()))
	}
	mu := l.mu[i]
	if slow {
		mu += math.Log(l.c.Slow)
	}
	return int(math.Ceil(math.Exp(mu + l.c.Latency.Sigma*l.rng.NormFloat64())))
}

func normCDF(z float64) float64 { return 0.5 * math.Erfc(-z/math.Sqrt2) }

// slow adds to idx (the sequential test's condemned) the servers the
// rules' latency test condemns now, as Policy.Evidence does: against
// their peers and, once learned, their own baselines (kept in the same
// SeqServer as the agent keeps them).
func (f *fleet) slow(idx []int) []int {
	for i := range f.srv {
		v := &f.view.Servers[i]
		v.Window.P50Ms, v.Window.Requests = f.lat.p50(i)
		v.State.AdminState = 0
		if !f.serving[i] {
			v.State.AdminState = haproxy.AdminForcedDrain // not judged
		}
	}
	for _, s := range f.lat.pol.SlowBaseline(f.view, f.srv, 1) {
		for j := range f.view.Servers {
			if f.view.Servers[j].Server == s.Server && !slices.Contains(idx, j) {
				idx = append(idx, j)
			}
		}
	}
	if f.lat.tq != nil {
		for _, j := range f.lat.tailStep(1, f.serving, &f.view) {
			if !slices.Contains(idx, j) {
				idx = append(idx, j)
			}
		}
	}
	return idx
}
